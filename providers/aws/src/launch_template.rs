//! Launch templates named by what they hold: one per distinct image, user data, security groups,
//! instance profile, disks, metadata options, network interfaces (EFA-only ones, IPv4 prefixes,
//! connection tracking), CPU options, placement group and partition, and tags, named `karpenter.k8s.aws/<hash>` as
//! Karpenter names them, so a template is created once and every later launch (and a Karpenter
//! running beside Joist) reuses it. Templates known to exist are remembered for [`TEMPLATE_TTL`];
//! after that EC2 is asked again, so one deleted by hand is created anew.
//!
//! Failures: an API error names its operation. Two launches racing to create the same template
//! both succeed (EC2's "already exists" means the other one won).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use aws_sdk_ec2::types::{
    CapacityReservationPreference, CapacityReservationTarget, ConnectionTrackingSpecificationRequest, Filter,
    LaunchTemplateBlockDeviceMappingRequest, LaunchTemplateCapacityReservationSpecificationRequest,
    LaunchTemplateCpuOptionsRequest, LaunchTemplateEbsBlockDeviceRequest, LaunchTemplateHttpTokensState,
    LaunchTemplateIamInstanceProfileSpecificationRequest, LaunchTemplateInstanceMarketOptionsRequest,
    LaunchTemplateInstanceMetadataEndpointState, LaunchTemplateInstanceMetadataOptionsRequest,
    LaunchTemplateInstanceMetadataProtocolIpv6, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest,
    LaunchTemplatePlacementRequest, LaunchTemplatesMonitoringRequest, MarketType,
    NestedVirtualizationSpecification, RequestLaunchTemplateData, ResourceType, Tag, TagSpecification,
    VolumeType as Ec2VolumeType,
};
use base64::Engine;
use joist_messages::apis::ec2nodeclass::{
    BlockDeviceMapping, ConnectionTracking, HttpTokens, InterfaceType, MetadataOptions, NetworkInterface,
    ReservationType, Toggle, VolumeType,
};
use serde::Serialize;
use tokio::time::Instant;

use crate::{clients::AwsClients, error::AwsError, offerings};

/// The prefix of every template name Karpenter (and Joist) creates.
pub const NAME_PREFIX: &str = "karpenter.k8s.aws/";
/// The tag naming the cluster a template belongs to.
pub const CLUSTER_TAG: &str = "karpenter.k8s.aws/cluster";
/// How long a template known to exist is not asked about again.
pub const TEMPLATE_TTL: Duration = Duration::from_secs(60);

/// What a template holds; its [`name`](Self::name) is a hash of all of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateInput {
    /// The image.
    pub image_id: String,
    /// The user data, as rendered (sent base64-encoded).
    pub user_data: String,
    /// The security groups.
    pub security_group_ids: Vec<String>,
    /// The instance profile's name.
    pub instance_profile: String,
    /// Instance metadata options.
    pub metadata: MetadataOptions,
    /// Disks.
    pub block_devices: Vec<BlockDeviceMapping>,
    /// CloudWatch detailed monitoring.
    pub detailed_monitoring: bool,
    /// Whether instances get a public IPv4 address; `None` leaves it to the subnet.
    pub associate_public_ip: Option<bool>,
    /// The class's network interfaces (none: one primary interface).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_interfaces: Vec<NetworkInterface>,
    /// IPv4 prefixes for each interface with addresses (prefix delegation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_prefix_count: Option<i32>,
    /// Connection tracking timeouts of each interface with addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_tracking: Option<ConnectionTracking>,
    /// Nested virtualization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nested_virtualization: Option<Toggle>,
    /// Which capacity reservations its instances may run in.
    pub capacity_reservation: ReservationTarget,
    /// The placement group its instances launch into, by id, and the partition when one is asked
    /// for (otherwise EC2 picks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementTarget>,
    /// Tags on the template itself (the cluster's, so it can be found and cleaned up).
    pub tags: BTreeMap<String, String>,
}

/// Which capacity reservations a template's instances may run in, as Karpenter's templates say
/// with its reserved capacity on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationTarget {
    /// Not said: EC2's default, any open reservation that matches (reserved capacity off).
    Unspecified,
    /// None (`none`): an on-demand or spot instance never takes an open reservation's room, which
    /// Joist counts for the nodes it launches into it.
    None,
    /// Only the reservation `id` (`capacity-reservations-only`), bought as its kind requires: a
    /// capacity block or an interruptible reservation is also a market type of its own.
    Only {
        /// The reservation.
        id: String,
        /// An ODCR or a capacity block.
        kind: ReservationType,
        /// Whether EC2 may take the capacity back.
        interruptible: bool,
    },
}

/// A placement group and partition a template launches into.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PlacementTarget {
    /// The group's id (`pg-…`): the id, not the name, as Karpenter's templates say it.
    pub group_id: String,
    /// The partition, for a partition group when the claim asks for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
}

impl PlacementTarget {
    fn placement(&self) -> LaunchTemplatePlacementRequest {
        LaunchTemplatePlacementRequest::builder()
            .group_id(&self.group_id)
            .set_partition_number(self.partition.and_then(|p| i32::try_from(p).ok()))
            .build()
    }
}

impl ReservationTarget {
    fn specification(&self) -> Option<LaunchTemplateCapacityReservationSpecificationRequest> {
        let specification = LaunchTemplateCapacityReservationSpecificationRequest::builder();
        let specification = match self {
            ReservationTarget::Unspecified => return None,
            ReservationTarget::None => {
                specification.capacity_reservation_preference(CapacityReservationPreference::None)
            }
            ReservationTarget::Only { id, .. } => specification
                .capacity_reservation_preference(CapacityReservationPreference::CapacityReservationsOnly)
                .capacity_reservation_target(
                    CapacityReservationTarget::builder()
                        .capacity_reservation_id(id)
                        .build(),
                ),
        };
        Some(specification.build())
    }

    fn market(&self) -> Option<LaunchTemplateInstanceMarketOptionsRequest> {
        let market = match self {
            ReservationTarget::Only {
                kind: ReservationType::CapacityBlock,
                ..
            } => MarketType::CapacityBlock,
            ReservationTarget::Only {
                interruptible: true, ..
            } => MarketType::InterruptibleCapacityReservation,
            _ => return None,
        };
        Some(
            LaunchTemplateInstanceMarketOptionsRequest::builder()
                .market_type(market)
                .build(),
        )
    }
}

impl TemplateInput {
    /// `karpenter.k8s.aws/<16 hex digits>`: the first 64 bits of a SHA-256 of everything the
    /// template holds, so equal inputs share a template and any change makes a new one.
    pub fn name(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        format!("{NAME_PREFIX}{}", crate::short_hash(&canonical))
    }

    fn data(&self) -> RequestLaunchTemplateData {
        let metadata = &self.metadata;
        let mut data = RequestLaunchTemplateData::builder()
            .image_id(&self.image_id)
            .user_data(base64::engine::general_purpose::STANDARD.encode(&self.user_data))
            .iam_instance_profile(
                LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                    .name(&self.instance_profile)
                    .build(),
            )
            .metadata_options(
                LaunchTemplateInstanceMetadataOptionsRequest::builder()
                    .http_endpoint(match metadata.http_endpoint {
                        Toggle::Enabled => LaunchTemplateInstanceMetadataEndpointState::Enabled,
                        Toggle::Disabled => LaunchTemplateInstanceMetadataEndpointState::Disabled,
                    })
                    .http_protocol_ipv6(match metadata.http_protocol_ipv6 {
                        Toggle::Enabled => LaunchTemplateInstanceMetadataProtocolIpv6::Enabled,
                        Toggle::Disabled => LaunchTemplateInstanceMetadataProtocolIpv6::Disabled,
                    })
                    .http_put_response_hop_limit(
                        i32::try_from(metadata.http_put_response_hop_limit).unwrap_or(1),
                    )
                    .http_tokens(match metadata.http_tokens {
                        HttpTokens::Required => LaunchTemplateHttpTokensState::Required,
                        HttpTokens::Optional => LaunchTemplateHttpTokensState::Optional,
                    })
                    .build(),
            )
            .monitoring(
                LaunchTemplatesMonitoringRequest::builder()
                    .enabled(self.detailed_monitoring)
                    .build(),
            )
            .set_block_device_mappings(Some(self.block_devices.iter().map(block_device).collect()))
            .set_capacity_reservation_specification(self.capacity_reservation.specification())
            .set_instance_market_options(self.capacity_reservation.market())
            .set_placement(self.placement.as_ref().map(PlacementTarget::placement));
        let interfaces = self.interfaces();
        data = if interfaces.is_empty() {
            data.set_security_group_ids(Some(self.security_group_ids.clone()))
        } else {
            // The interfaces carry the security groups when they are given.
            data.set_network_interfaces(Some(interfaces))
        };
        if let Some(nested) = self.nested_virtualization {
            data = data.cpu_options(
                LaunchTemplateCpuOptionsRequest::builder()
                    .nested_virtualization(match nested {
                        Toggle::Enabled => NestedVirtualizationSpecification::Enabled,
                        Toggle::Disabled => NestedVirtualizationSpecification::Disabled,
                    })
                    .build(),
            );
        }
        data.build()
    }

    /// The interface specifications: the class's interfaces, or a primary one when a public
    /// address, prefixes or connection tracking are asked for, or none (the subnet's defaults).
    /// EFA-only interfaces have no IP address, so no public address, prefixes or tracking.
    fn interfaces(&self) -> Vec<LaunchTemplateInstanceNetworkInterfaceSpecificationRequest> {
        let primary = NetworkInterface {
            network_card_index: 0,
            device_index: 0,
            interface_type: InterfaceType::Interface,
        };
        let wanted: Vec<&NetworkInterface> = if !self.network_interfaces.is_empty() {
            self.network_interfaces.iter().collect()
        } else if self.associate_public_ip.is_some()
            || self.ip_prefix_count.is_some()
            || self.connection_tracking.is_some()
        {
            vec![&primary]
        } else {
            Vec::new()
        };
        let tracking = self.connection_tracking.as_ref().map(|t| {
            ConnectionTrackingSpecificationRequest::builder()
                .set_tcp_established_timeout(t.tcp_established_timeout)
                .set_udp_stream_timeout(t.udp_stream_timeout)
                .set_udp_timeout(t.udp_timeout)
                .build()
        });
        wanted
            .into_iter()
            .map(|interface| {
                let addressed = interface.interface_type == InterfaceType::Interface;
                let spec = LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                    .network_card_index(interface.network_card_index)
                    .device_index(interface.device_index)
                    .set_groups(Some(self.security_group_ids.clone()));
                let spec = match interface.interface_type {
                    // EC2's own name for the regular type is `interface`, the default: left unset.
                    InterfaceType::Interface => spec,
                    InterfaceType::EfaOnly => spec.interface_type("efa-only"),
                };
                if addressed {
                    spec.set_associate_public_ip_address(self.associate_public_ip)
                        .set_ipv4_prefix_count(self.ip_prefix_count)
                        .set_connection_tracking_specification(tracking.clone())
                        .build()
                } else {
                    spec.build()
                }
            })
            .collect()
    }
}

fn block_device(mapping: &BlockDeviceMapping) -> LaunchTemplateBlockDeviceMappingRequest {
    let ebs = mapping.ebs.as_ref().map(|ebs| {
        LaunchTemplateEbsBlockDeviceRequest::builder()
            .set_delete_on_termination(ebs.delete_on_termination)
            .set_encrypted(ebs.encrypted)
            .set_iops(ebs.iops.and_then(|v| i32::try_from(v).ok()))
            .set_kms_key_id(ebs.kms_key_id.clone())
            .set_snapshot_id(ebs.snapshot_id.clone())
            .set_throughput(ebs.throughput.and_then(|v| i32::try_from(v).ok()))
            .set_volume_initialization_rate(ebs.volume_initialization_rate)
            .set_volume_size(ebs.volume_size.as_deref().and_then(volume_size_gib))
            .set_volume_type(ebs.volume_type.map(volume_type))
            .build()
    });
    LaunchTemplateBlockDeviceMappingRequest::builder()
        .set_device_name(mapping.device_name.clone())
        .set_ebs(ebs)
        .build()
}

fn volume_type(volume_type: VolumeType) -> Ec2VolumeType {
    match volume_type {
        VolumeType::Standard => Ec2VolumeType::Standard,
        VolumeType::Io1 => Ec2VolumeType::Io1,
        VolumeType::Io2 => Ec2VolumeType::Io2,
        VolumeType::Gp2 => Ec2VolumeType::Gp2,
        VolumeType::Sc1 => Ec2VolumeType::Sc1,
        VolumeType::St1 => Ec2VolumeType::St1,
        VolumeType::Gp3 => Ec2VolumeType::Gp3,
    }
}

/// An EBS size (`20Gi`, `1Ti`, `100G`, `2T`) in the GiB EC2 takes, rounded up.
fn volume_size_gib(size: &str) -> Option<i32> {
    let bytes = u64::try_from(offerings::volume_bytes(size)?).ok()?;
    i32::try_from(bytes.div_ceil(1 << 30)).ok()
}

/// The launch templates this process knows exist (see the module docs). Cheap to share.
#[derive(Debug, Default)]
pub struct LaunchTemplates {
    known: Mutex<HashMap<String, Instant>>,
}

impl LaunchTemplates {
    /// The name of the template holding `input`, creating it first if EC2 has none.
    pub async fn ensure(&self, clients: &AwsClients, input: &TemplateInput) -> Result<String, AwsError> {
        let name = input.name();
        if self.is_known(&name) {
            return Ok(name);
        }
        if !exists(clients, &name).await? {
            create(clients, &name, input).await?;
            tracing::info!(launch_template = %name, image = %input.image_id, "created launch template");
        }
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), Instant::now());
        Ok(name)
    }

    /// Forgets `name`, so the next launch asks EC2 again (after a launch said it is missing).
    pub fn forget(&self, name: &str) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    fn is_known(&self, name: &str) -> bool {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|_, seen| seen.elapsed() < TEMPLATE_TTL);
        known.contains_key(name)
    }
}

async fn exists(clients: &AwsClients, name: &str) -> Result<bool, AwsError> {
    let found = clients
        .ec2
        .describe_launch_templates()
        .filters(
            Filter::builder()
                .name("launch-template-name")
                .values(name)
                .build(),
        )
        .send()
        .await
        .map_err(|e| AwsError::api("DescribeLaunchTemplates", e.into_service_error()))?;
    Ok(!found.launch_templates().is_empty())
}

async fn create(clients: &AwsClients, name: &str, input: &TemplateInput) -> Result<(), AwsError> {
    let tags = TagSpecification::builder()
        .resource_type(ResourceType::LaunchTemplate)
        .set_tags(Some(
            input
                .tags
                .iter()
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect(),
        ))
        .build();
    match clients
        .ec2
        .create_launch_template()
        .launch_template_name(name)
        .launch_template_data(input.data())
        .tag_specifications(tags)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(error) => {
            let error = AwsError::api("CreateLaunchTemplate", error.into_service_error());
            if error.code() == Some("InvalidLaunchTemplateName.AlreadyExistsException") {
                Ok(())
            } else {
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> TemplateInput {
        TemplateInput {
            capacity_reservation: ReservationTarget::None,
            placement: None,
            image_id: "ami-0123".into(),
            user_data: "#!/bin/bash\n".into(),
            security_group_ids: vec!["sg-1".into()],
            instance_profile: "KarpenterNodeInstanceProfile".into(),
            metadata: MetadataOptions::default(),
            block_devices: Vec::new(),
            detailed_monitoring: false,
            associate_public_ip: None,
            network_interfaces: Vec::new(),
            ip_prefix_count: None,
            connection_tracking: None,
            nested_virtualization: None,
            tags: BTreeMap::from([(CLUSTER_TAG.to_owned(), "demo".to_owned())]),
        }
    }

    #[test]
    fn efa_only_interfaces_get_no_addresses_and_the_others_get_prefixes_and_tracking() {
        let interface = |card, device, interface_type| NetworkInterface {
            network_card_index: card,
            device_index: device,
            interface_type,
        };
        let template = TemplateInput {
            network_interfaces: vec![
                interface(0, 0, InterfaceType::Interface),
                interface(1, 0, InterfaceType::EfaOnly),
            ],
            ip_prefix_count: Some(2),
            associate_public_ip: Some(false),
            connection_tracking: Some(ConnectionTracking {
                tcp_established_timeout: Some(3600),
                udp_stream_timeout: None,
                udp_timeout: Some(30),
            }),
            ..input()
        };
        let specs = template.interfaces();
        assert_eq!(specs.len(), 2);
        let (primary, efa) = (&specs[0], &specs[1]);
        assert_eq!(
            (primary.network_card_index(), primary.device_index()),
            (Some(0), Some(0))
        );
        assert_eq!(primary.ipv4_prefix_count(), Some(2));
        assert_eq!(primary.associate_public_ip_address(), Some(false));
        let tracking = primary.connection_tracking_specification();
        assert_eq!(tracking.and_then(|t| t.tcp_established_timeout()), Some(3600));
        assert_eq!(
            (efa.network_card_index(), efa.interface_type()),
            (Some(1), Some("efa-only"))
        );
        assert_eq!(efa.ipv4_prefix_count(), None);
        assert_eq!(efa.associate_public_ip_address(), None);
        assert!(efa.connection_tracking_specification().is_none());
        assert_eq!(
            efa.groups(),
            ["sg-1"],
            "every interface carries the security groups"
        );
        assert!(
            input().interfaces().is_empty(),
            "nothing asked: the subnet's defaults"
        );
    }

    #[test]
    fn templates_keep_launches_out_of_open_reservations_and_target_their_own() {
        let none = input().data();
        let preference = |data: &RequestLaunchTemplateData| {
            data.capacity_reservation_specification()
                .and_then(|s| s.capacity_reservation_preference())
                .cloned()
        };
        assert_eq!(preference(&none), Some(CapacityReservationPreference::None));
        assert!(none.instance_market_options().is_none());
        let unspecified = TemplateInput {
            capacity_reservation: ReservationTarget::Unspecified,
            ..input()
        };
        assert_eq!(
            preference(&unspecified.data()),
            None,
            "reserved capacity off: EC2's default"
        );
        let target = |kind, interruptible| TemplateInput {
            capacity_reservation: ReservationTarget::Only {
                id: "cr-1".into(),
                kind,
                interruptible,
            },
            ..input()
        };
        let block = target(ReservationType::CapacityBlock, false).data();
        assert_eq!(
            preference(&block),
            Some(CapacityReservationPreference::CapacityReservationsOnly)
        );
        assert_eq!(
            block
                .capacity_reservation_specification()
                .and_then(|s| s.capacity_reservation_target())
                .and_then(|t| t.capacity_reservation_id()),
            Some("cr-1")
        );
        let market = |data: &RequestLaunchTemplateData| {
            data.instance_market_options()
                .and_then(|m| m.market_type())
                .cloned()
        };
        assert_eq!(market(&block), Some(MarketType::CapacityBlock));
        assert_eq!(
            market(&target(ReservationType::Default, true).data()),
            Some(MarketType::InterruptibleCapacityReservation)
        );
        assert_eq!(market(&target(ReservationType::Default, false).data()), None);
        assert_ne!(
            target(ReservationType::Default, false).name(),
            input().name(),
            "one template per reservation"
        );
    }

    #[test]
    fn a_placement_groups_template_names_the_group_by_id_and_the_partition_asked_for() {
        let placed = |partition| TemplateInput {
            placement: Some(PlacementTarget {
                group_id: "pg-1".into(),
                partition,
            }),
            ..input()
        };
        let data = placed(Some(2)).data();
        let placement = data.placement();
        assert_eq!(placement.and_then(|p| p.group_id()), Some("pg-1"));
        assert_eq!(placement.and_then(|p| p.group_name()), None);
        assert_eq!(placement.and_then(|p| p.partition_number()), Some(2));
        let unpinned = placed(None).data();
        assert_eq!(unpinned.placement().and_then(|p| p.partition_number()), None);
        assert_eq!(input().data().placement(), None, "no group, no placement");
        let names: std::collections::BTreeSet<String> = [
            placed(Some(1)).name(),
            placed(Some(2)).name(),
            placed(None).name(),
            input().name(),
        ]
        .into_iter()
        .collect();
        assert_eq!(names.len(), 4, "one template per group and partition");
    }

    #[test]
    fn names_are_stable_hashes_of_everything_the_template_holds() {
        let name = input().name();
        assert!(name.starts_with(NAME_PREFIX), "{name}");
        assert_eq!(name.len(), NAME_PREFIX.len() + 16);
        assert_eq!(name, input().name(), "equal inputs share a template");
        let mut other = input();
        other.image_id = "ami-0456".into();
        assert_ne!(name, other.name(), "a new image makes a new template");
        // Fields a class leaves unset are not hashed: the templates of classes that use none of
        // the networking and CPU options keep the names they had before those options existed.
        // (Every template says how it treats capacity reservations since Joist offers them.)
        assert_eq!(name, "karpenter.k8s.aws/64070e84f1010756");
        let mut prefixed = input();
        prefixed.ip_prefix_count = Some(1);
        assert_ne!(name, prefixed.name());
    }

    #[test]
    fn volume_sizes_convert_to_whole_gib() {
        assert_eq!(volume_size_gib("20Gi"), Some(20));
        assert_eq!(volume_size_gib("1Ti"), Some(1024));
        assert_eq!(volume_size_gib("100G"), Some(94));
        assert_eq!(volume_size_gib("20"), None);
    }
}

//! Launch templates named by what they hold: one per distinct image, user data, security groups,
//! instance profile, disks, metadata options and tags, named `karpenter.k8s.aws/<hash>` as
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
    Filter, LaunchTemplateBlockDeviceMappingRequest, LaunchTemplateEbsBlockDeviceRequest,
    LaunchTemplateHttpTokensState, LaunchTemplateIamInstanceProfileSpecificationRequest,
    LaunchTemplateInstanceMetadataEndpointState, LaunchTemplateInstanceMetadataOptionsRequest,
    LaunchTemplateInstanceMetadataProtocolIpv6, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest,
    LaunchTemplatesMonitoringRequest, RequestLaunchTemplateData, ResourceType, Tag, TagSpecification,
    VolumeType as Ec2VolumeType,
};
use base64::Engine;
use joist_messages::apis::ec2nodeclass::{
    BlockDeviceMapping, HttpTokens, MetadataOptions, Toggle, VolumeType,
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
    /// Tags on the template itself (the cluster's, so it can be found and cleaned up).
    pub tags: BTreeMap<String, String>,
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
            .set_block_device_mappings(Some(self.block_devices.iter().map(block_device).collect()));
        data = match self.associate_public_ip {
            // A network interface carries the security groups when it is given.
            Some(public) => data.network_interfaces(
                LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                    .device_index(0)
                    .associate_public_ip_address(public)
                    .set_groups(Some(self.security_group_ids.clone()))
                    .build(),
            ),
            None => data.set_security_group_ids(Some(self.security_group_ids.clone())),
        };
        data.build()
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
            image_id: "ami-0123".into(),
            user_data: "#!/bin/bash\n".into(),
            security_group_ids: vec!["sg-1".into()],
            instance_profile: "KarpenterNodeInstanceProfile".into(),
            metadata: MetadataOptions::default(),
            block_devices: Vec::new(),
            detailed_monitoring: false,
            associate_public_ip: None,
            tags: BTreeMap::from([(CLUSTER_TAG.to_owned(), "demo".to_owned())]),
        }
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
    }

    #[test]
    fn volume_sizes_convert_to_whole_gib() {
        assert_eq!(volume_size_gib("20Gi"), Some(20));
        assert_eq!(volume_size_gib("1Ti"), Some(1024));
        assert_eq!(volume_size_gib("100G"), Some(94));
        assert_eq!(volume_size_gib("20"), None);
    }
}

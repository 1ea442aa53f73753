//! The instance types an EC2NodeClass can launch, as the scheduler sees them: the catalog read from
//! EC2 ([`crate::catalog`]) limited to the zones of the class's subnets, each type with a spot and an
//! on-demand offering per zone priced from the last known prices ([`crate::pricing::Prices`]), and
//! its capacity computed with the class's kubelet and disk settings. Pure: no API calls.
//!
//! Dropped, as Karpenter drops them: types with no on-demand price (nothing to order them by), types
//! none of the class's AMIs serves (an arm64 type when only x86_64 images resolved, a GPU type with
//! only standard images), and types offered in none of the class's zones. A zone with no spot price
//! yet has no spot offering there.

use std::collections::{BTreeMap, BTreeSet};

use joist_messages::{
    apis::{
        EC2NodeClass,
        ec2nodeclass::{AmiFamily, BlockDevice, BlockDeviceMapping, ResolvedAmi, VolumeType},
    },
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        requirements::Requirements,
        shape::{CapacitySettings, Ec2Shape},
    },
};

use joist_provider::capacity_reservation;

use crate::pricing::Prices;

/// What EC2 sells in the region: shapes by name, and the zones each is offered in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    /// Instance type → shape.
    pub shapes: BTreeMap<String, Ec2Shape>,
    /// Instance type → zones.
    pub zones: BTreeMap<String, BTreeSet<String>>,
}

/// The class's AMIs as requirement sets, in status order; AMIs whose requirements do not parse are
/// left out (they can serve no type).
pub fn ami_requirements(amis: &[ResolvedAmi]) -> Vec<(&ResolvedAmi, Requirements)> {
    amis.iter()
        .filter_map(|ami| {
            let requirements = ami
                .requirements
                .iter()
                .map(|r| r.to_requirement())
                .collect::<Result<Requirements, _>>()
                .ok()?;
            Some((ami, requirements))
        })
        .collect()
}

/// The first of `amis` that serves `instance_type`: its requirements hold for the type, and every
/// label an AMI needs to exist (a GPU count, say) the type has.
pub fn ami_for<'a>(
    amis: &'a [(&'a ResolvedAmi, Requirements)],
    instance_type: &InstanceType,
) -> Option<&'a ResolvedAmi> {
    amis.iter()
        .find(|(_, requirements)| {
            instance_type
                .requirements
                .compatible(requirements, |_| false)
                .is_ok()
        })
        .map(|(ami, _)| *ami)
}

/// The disks a class's nodes get: its own mappings, else the family's defaults (a 20 GiB gp3
/// root volume; Bottlerocket adds it as a data volume beside a 4 GiB OS volume).
pub fn block_devices(class: &EC2NodeClass, family: AmiFamily) -> Vec<BlockDeviceMapping> {
    if !class.spec.block_device_mappings.is_empty() {
        return class.spec.block_device_mappings.clone();
    }
    let volume = |device: &str, size: &str, root_volume: bool| BlockDeviceMapping {
        device_name: Some(device.to_owned()),
        ebs: Some(BlockDevice {
            encrypted: Some(true),
            volume_size: Some(size.to_owned()),
            volume_type: Some(VolumeType::Gp3),
            ..BlockDevice::default()
        }),
        root_volume,
    };
    match family {
        AmiFamily::Bottlerocket => vec![
            volume("/dev/xvda", "4Gi", false),
            volume("/dev/xvdb", "20Gi", true),
        ],
        AmiFamily::Custom => Vec::new(),
        _ => vec![volume("/dev/xvda", "20Gi", true)],
    }
}

/// Bytes of an EBS size written as the CRD allows (`20Gi`, `1Ti`, `100G`, `2T`); `None` for any
/// other form.
pub(crate) fn volume_bytes(size: &str) -> Option<i64> {
    let digits = size.bytes().take_while(u8::is_ascii_digit).count();
    let value: i64 = size[..digits].parse().ok()?;
    let unit: i64 = match &size[digits..] {
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    value.checked_mul(unit)
}

/// The capacity settings of `class`'s nodes: `base` (the controller's overhead and reserved ENIs)
/// with the class's `maxPods`, `podsPerCore` and root volume.
pub fn capacity_settings(
    class: &EC2NodeClass,
    family: AmiFamily,
    base: CapacitySettings,
) -> CapacitySettings {
    let kubelet = class.spec.kubelet.as_ref();
    let root = block_devices(class, family)
        .iter()
        .find(|m| m.root_volume)
        .and_then(|m| m.ebs.as_ref()?.volume_size.as_deref())
        .and_then(volume_bytes);
    CapacitySettings {
        max_pods: kubelet.and_then(|k| k.max_pods).map(i64::from),
        pods_per_core: kubelet.and_then(|k| k.pods_per_core).map(i64::from),
        root_volume_bytes: root.unwrap_or(base.root_volume_bytes),
        ..base
    }
}

/// The instance types `class` can launch (see the module docs).
pub fn instance_types(
    catalog: &Catalog,
    prices: &Prices,
    region: &str,
    class: &EC2NodeClass,
    (settings, room): (&CapacitySettings, &capacity_reservation::Availability),
) -> Vec<InstanceType> {
    let Some(status) = &class.status else {
        return Vec::new();
    };
    let class_zones: BTreeSet<&str> = status.subnets.iter().map(|s| s.zone.as_str()).collect();
    let amis = ami_requirements(&status.amis);
    let interfaces = &class.spec.network_interfaces;
    catalog
        .shapes
        .values()
        .filter(|shape| shape.supports(interfaces))
        .filter_map(|shape| {
            let on_demand = prices.on_demand(&shape.name)?;
            let zones: Vec<&str> = catalog
                .zones
                .get(&shape.name)?
                .iter()
                .map(String::as_str)
                .filter(|zone| class_zones.contains(zone))
                .collect();
            let mut offerings: Vec<Offering> = zones
                .iter()
                .flat_map(|zone| {
                    let spot = prices
                        .spot(&shape.name, zone)
                        .map(|price| (CapacityType::Spot, price));
                    spot.into_iter().chain([(CapacityType::OnDemand, on_demand)]).map(
                        |(capacity_type, price)| Offering {
                            zone: (*zone).to_owned(),
                            capacity_type,
                            price,
                            available: true,
                            reservation: None,
                        },
                    )
                })
                .collect();
            if offerings.is_empty() {
                return None;
            }
            offerings.extend(capacity_reservation::reserved_offerings(
                &shape.name,
                Some(on_demand),
                &zones,
                status,
                room,
            ));
            let instance_type = shape.instance_type(region, offerings, settings);
            ami_for(&amis, &instance_type).is_some().then_some(instance_type)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use joist_messages::{
        apis::{
            EC2NodeClassStatus, common::NodeSelectorRequirementWithMinValues, ec2nodeclass::ResolvedSubnet,
        },
        labels::ARCH,
        model::{quantity::Quantity, requirements::Operator, resources::names},
    };

    use super::*;

    fn shape(name: &str, arch: &str) -> Ec2Shape {
        Ec2Shape {
            name: name.into(),
            vcpus: 2,
            memory_mib: 8192,
            arch: arch.into(),
            hypervisor: "nitro".into(),
            cpu_manufacturer: String::new(),
            clock_mhz: 0,
            max_enis: 3,
            ipv4_per_eni: 10,
            network_bandwidth_mbps: 0,
            ebs_bandwidth_mbps: 0,
            local_nvme_gb: 0,
            bare_metal: false,
            encryption_in_transit: false,
            gpu: None,
            network_cards: 1,
            efa_interfaces: 0,
        }
    }

    fn class(amis: &[&str]) -> EC2NodeClass {
        let mut class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1",
            "kind": "EC2NodeClass",
            "metadata": {"name": "default"},
            "spec": {
                "role": "KarpenterNodeRole",
                "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "subnetSelectorTerms": [{"id": "subnet-a"}],
                "securityGroupSelectorTerms": [{"id": "sg-1"}]
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        class.status = Some(EC2NodeClassStatus {
            subnets: vec![ResolvedSubnet {
                id: "subnet-a".into(),
                zone: "us-west-2a".into(),
                zone_id: None,
            }],
            amis: amis
                .iter()
                .map(|arch| ResolvedAmi {
                    id: format!("ami-{arch}"),
                    name: None,
                    deprecated: false,
                    requirements: vec![NodeSelectorRequirementWithMinValues {
                        key: ARCH.into(),
                        operator: Operator::In,
                        values: vec![(*arch).into()],
                        min_values: None,
                    }],
                })
                .collect(),
            ..EC2NodeClassStatus::default()
        });
        class
    }

    fn catalog() -> Catalog {
        let zones = |z: &[&str]| z.iter().map(|z| (*z).to_owned()).collect();
        Catalog {
            shapes: [
                shape("m5.large", "amd64"),
                shape("m6g.large", "arm64"),
                shape("x9.large", "amd64"),
            ]
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect(),
            zones: BTreeMap::from([
                ("m5.large".to_owned(), zones(&["us-west-2a", "us-west-2b"])),
                ("m6g.large".to_owned(), zones(&["us-west-2a"])),
                ("x9.large".to_owned(), zones(&["us-west-2a"])),
            ]),
        }
    }

    #[test]
    fn types_are_offered_in_the_class_zones_at_known_prices_and_only_with_an_image() {
        let prices = Prices::new(BTreeMap::from([
            ("m5.large".to_owned(), 0.096),
            ("m6g.large".to_owned(), 0.077),
        ]));
        let types = instance_types(
            &catalog(),
            &prices,
            "us-west-2",
            &class(&["amd64"]),
            (
                &CapacitySettings::default(),
                &capacity_reservation::Availability::default(),
            ),
        );
        let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["m5.large"], "m6g has no arm64 image, x9 no price");
        let offerings: Vec<(CapacityType, &str, f64)> = types[0]
            .offerings
            .iter()
            .map(|o| (o.capacity_type, o.zone.as_str(), o.price))
            .collect();
        assert_eq!(
            offerings,
            [
                (CapacityType::Spot, "us-west-2a", 0.096),
                (CapacityType::OnDemand, "us-west-2a", 0.096)
            ],
            "only the class's zone; spot at on-demand until spot prices arrive"
        );
        assert_eq!(types[0].capacity.get(names::PODS), Quantity::from_units(29));

        let both = instance_types(
            &catalog(),
            &prices,
            "us-west-2",
            &class(&["amd64", "arm64"]),
            (
                &CapacitySettings::default(),
                &capacity_reservation::Availability::default(),
            ),
        );
        assert_eq!(both.len(), 2);
    }

    #[test]
    fn the_class_sets_max_pods_and_the_root_volume() {
        let mut class = class(&["amd64"]);
        class.spec.kubelet = Some(joist_messages::apis::ec2nodeclass::KubeletConfiguration {
            max_pods: Some(17),
            ..Default::default()
        });
        let settings = capacity_settings(&class, AmiFamily::AL2023, CapacitySettings::default());
        assert_eq!(settings.max_pods, Some(17));
        assert_eq!(settings.root_volume_bytes, 20 << 30);
        let bottlerocket = block_devices(&class, AmiFamily::Bottlerocket);
        assert_eq!(bottlerocket.len(), 2);
        assert_eq!(volume_bytes("1Ti"), Some(1 << 40));
    }
}

//! An EC2 instance shape (what DescribeInstanceTypes reports) turned into the [`InstanceType`] the
//! scheduler sees: capacity and overhead by Karpenter's AWS formulas ([`super::capacity`]) and every
//! well-known `karpenter.k8s.aws/*` label as a requirement.
//!
//! Shared by every EC2-shaped catalog (the AWS provider's, read from the wire, and the simulated
//! cloud's, read from committed data), so both describe a type identically. Pure; nothing fails.

use serde::{Deserialize, Serialize};

use super::{
    capacity::{self, DEFAULT_ROOT_VOLUME_BYTES, DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE, MIB, bytes},
    instance_type::{InstanceType, Offering, offered_zones_and_capacity_types},
    quantity::Quantity,
    requirements::{Operator, Requirement, Requirements},
    resources::{Resources, names},
};
use crate::{
    apis::ec2nodeclass::{InterfaceType, NetworkInterface},
    labels::{ARCH, CAPACITY_TYPE, INSTANCE_TYPE, OS, REGION, ZONE, aws},
};

/// The GPUs of an instance type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Model, lower case (`t4`, `a10g`).
    pub name: String,
    /// Maker, lower case (`nvidia`, `amd`).
    pub manufacturer: String,
    /// How many.
    pub count: i64,
    /// Memory of each, in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: i64,
}

/// One EC2 instance type's hardware (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ec2Shape {
    /// `m5.large`.
    pub name: String,
    /// Default vCPUs.
    pub vcpus: i64,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: i64,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// `nitro`, `xen`, or empty for bare metal.
    pub hypervisor: String,
    /// `intel`, `amd`, `aws`, or empty.
    pub cpu_manufacturer: String,
    /// Sustained clock speed in MHz, 0 when unknown.
    pub clock_mhz: i64,
    /// Network interfaces on the default card.
    pub max_enis: i64,
    /// IPv4 addresses per interface.
    pub ipv4_per_eni: i64,
    /// Baseline network bandwidth in Mbps, 0 when unknown.
    pub network_bandwidth_mbps: i64,
    /// Maximum EBS bandwidth in Mbps, 0 when unknown.
    pub ebs_bandwidth_mbps: i64,
    /// Local NVMe storage in GB, 0 when none.
    pub local_nvme_gb: i64,
    /// A bare-metal size.
    pub bare_metal: bool,
    /// Supports encryption in transit.
    pub encryption_in_transit: bool,
    /// GPUs, if any.
    pub gpu: Option<Gpu>,
    /// Network cards (interfaces can be spread over them); 1 for most types.
    #[serde(default = "one_card")]
    pub network_cards: i64,
    /// EFA interfaces it can carry, 0 when EFA is not supported.
    #[serde(default)]
    pub efa_interfaces: i64,
}

fn one_card() -> i64 {
    1
}

/// Node settings that change capacity and overhead (Karpenter's `VM_MEMORY_OVERHEAD_PERCENT`,
/// `RESERVED_ENIS`, the kubelet's `maxPods` and `podsPerCore`, the root volume).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacitySettings {
    /// Memory the hypervisor keeps, in parts per thousand.
    pub vm_memory_overhead_permille: i64,
    /// ENIs kept for other uses than pods.
    pub reserved_enis: i64,
    /// The kubelet's `maxPods`, when set.
    pub max_pods: Option<i64>,
    /// The kubelet's `podsPerCore`, when set.
    pub pods_per_core: Option<i64>,
    /// Bytes of the root volume.
    pub root_volume_bytes: i64,
}

impl Default for CapacitySettings {
    fn default() -> Self {
        Self {
            vm_memory_overhead_permille: DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE,
            reserved_enis: 0,
            max_pods: None,
            pods_per_core: None,
            root_volume_bytes: DEFAULT_ROOT_VOLUME_BYTES,
        }
    }
}

impl Ec2Shape {
    /// Whether the type can carry `interfaces` (an EC2NodeClass's `networkInterfaces`): each on a
    /// network card it has, and its `efa-only` ones within its EFA interfaces. No interfaces asks
    /// for nothing.
    pub fn supports(&self, interfaces: &[NetworkInterface]) -> bool {
        let efa = interfaces
            .iter()
            .filter(|i| i.interface_type == InterfaceType::EfaOnly)
            .count();
        interfaces
            .iter()
            .all(|i| i64::from(i.network_card_index) < self.network_cards)
            && i64::try_from(efa).is_ok_and(|efa| efa <= self.efa_interfaces)
    }

    /// The family (`m5` of `m5.large`).
    pub fn family(&self) -> &str {
        self.name
            .split_once('.')
            .map_or(self.name.as_str(), |(family, _)| family)
    }

    /// The size (`large` of `m5.large`).
    pub fn size(&self) -> &str {
        self.name.split_once('.').map_or("", |(_, size)| size)
    }

    /// The category: the family's letters before its generation (`m`, `g`, `inf`).
    pub fn category(&self) -> &str {
        let family = self.family();
        let end = family.find(|c: char| c.is_ascii_digit()).unwrap_or(family.len());
        &family[..end]
    }

    /// The generation: the digits after the category (`5` of `m5d`), empty when there are none.
    pub fn generation(&self) -> &str {
        let rest = &self.family()[self.category().len()..];
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        &rest[..end]
    }

    /// The pod limit under `settings` (ENI-limited, as the EKS AMIs with the VPC CNI do).
    pub fn max_pods(&self, settings: &CapacitySettings) -> i64 {
        let eni_limited =
            capacity::eni_limited_pods(self.max_enis, self.ipv4_per_eni, settings.reserved_enis);
        capacity::max_pods(
            settings.max_pods,
            Some(eni_limited),
            settings.pods_per_core,
            self.vcpus,
        )
    }

    /// The machine's resources as its node reports them.
    pub fn capacity(&self, settings: &CapacitySettings) -> Resources {
        let memory = capacity::vm_memory_mib(self.memory_mib, settings.vm_memory_overhead_permille) * MIB;
        let mut resources = Resources::new()
            .with(names::CPU, Quantity::from_units(self.vcpus))
            .with(names::MEMORY, bytes(memory))
            .with(names::PODS, Quantity::from_units(self.max_pods(settings)))
            .with(names::EPHEMERAL_STORAGE, bytes(settings.root_volume_bytes));
        if let Some(gpu) = &self.gpu {
            let resource = match gpu.manufacturer.as_str() {
                "nvidia" => Some(names::NVIDIA_GPU),
                "amd" => Some("amd.com/gpu"),
                _ => None,
            };
            if let Some(resource) = resource {
                resources.set(resource, Quantity::from_units(gpu.count));
            }
        }
        if self.efa_interfaces > 0 {
            resources.set(names::EFA, Quantity::from_units(self.efa_interfaces));
        }
        resources
    }

    /// The scheduler's view of this shape in `region`, bought through `offerings`.
    pub fn instance_type(
        &self,
        region: &str,
        offerings: Vec<Offering>,
        settings: &CapacitySettings,
    ) -> InstanceType {
        let mut requirements: Requirements = self
            .labels()
            .into_iter()
            .filter_map(|(key, value)| Requirement::new(key, Operator::In, [value]).ok())
            .collect();
        let (zones, capacity_types) = offered_zones_and_capacity_types(&offerings);
        for (key, values) in [
            (ZONE, zones),
            (CAPACITY_TYPE, capacity_types),
            (REGION, vec![region]),
        ] {
            if let Ok(requirement) = Requirement::new(key, Operator::In, values) {
                requirements.add(requirement);
            }
        }
        let pods = self.max_pods(settings);
        InstanceType {
            name: self.name.clone(),
            requirements,
            offerings,
            capacity: self.capacity(settings),
            overhead: capacity::default_overhead(self.vcpus, pods, settings.root_volume_bytes),
        }
    }

    /// The labels a node of this shape carries, zone and capacity type aside.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = vec![
            (INSTANCE_TYPE, self.name.clone()),
            (ARCH, self.arch.clone()),
            (OS, "linux".to_owned()),
            (aws::INSTANCE_CATEGORY, self.category().to_owned()),
            (aws::INSTANCE_FAMILY, self.family().to_owned()),
            (aws::INSTANCE_SIZE, self.size().to_owned()),
            (aws::INSTANCE_CPU, self.vcpus.to_string()),
            (aws::INSTANCE_MEMORY, self.memory_mib.to_string()),
            (
                aws::INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED,
                self.encryption_in_transit.to_string(),
            ),
        ];
        let optional = [
            (aws::INSTANCE_GENERATION, self.generation().to_owned()),
            (aws::INSTANCE_HYPERVISOR, self.hypervisor.clone()),
            (aws::INSTANCE_CPU_MANUFACTURER, self.cpu_manufacturer.clone()),
            (
                aws::INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ,
                positive(self.clock_mhz),
            ),
            (
                aws::INSTANCE_NETWORK_BANDWIDTH,
                positive(self.network_bandwidth_mbps),
            ),
            (aws::INSTANCE_EBS_BANDWIDTH, positive(self.ebs_bandwidth_mbps)),
            (aws::INSTANCE_LOCAL_NVME, positive(self.local_nvme_gb)),
        ];
        labels.extend(optional.into_iter().filter(|(_, value)| !value.is_empty()));
        if let Some(gpu) = &self.gpu {
            labels.extend([
                (aws::INSTANCE_GPU_NAME, gpu.name.clone()),
                (aws::INSTANCE_GPU_MANUFACTURER, gpu.manufacturer.clone()),
                (aws::INSTANCE_GPU_COUNT, gpu.count.to_string()),
                (aws::INSTANCE_GPU_MEMORY, gpu.memory_mib.to_string()),
            ]);
        }
        labels
    }
}

/// A positive figure as a label value; empty (no label) otherwise.
fn positive(value: i64) -> String {
    if value > 0 {
        value.to_string()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::instance_type::CapacityType;

    fn m5_large() -> Ec2Shape {
        Ec2Shape {
            name: "m5.large".into(),
            vcpus: 2,
            memory_mib: 8192,
            arch: "amd64".into(),
            hypervisor: "nitro".into(),
            cpu_manufacturer: "intel".into(),
            clock_mhz: 3100,
            max_enis: 3,
            ipv4_per_eni: 10,
            network_bandwidth_mbps: 750,
            ebs_bandwidth_mbps: 4750,
            local_nvme_gb: 0,
            bare_metal: false,
            encryption_in_transit: false,
            gpu: None,
            network_cards: 1,
            efa_interfaces: 0,
        }
    }

    #[test]
    fn interfaces_must_fit_the_types_network_cards_and_efa() {
        use crate::apis::ec2nodeclass::{InterfaceType::*, NetworkInterface};
        let interface = |card, device, interface_type| NetworkInterface {
            network_card_index: card,
            device_index: device,
            interface_type,
        };
        let plain = m5_large();
        let trainer = Ec2Shape {
            network_cards: 4,
            efa_interfaces: 4,
            ..m5_large()
        };
        assert!(plain.supports(&[]));
        assert!(plain.supports(&[interface(0, 0, Interface)]));
        let efa = [interface(0, 0, Interface), interface(1, 0, EfaOnly)];
        assert!(!plain.supports(&efa), "one card and no EFA");
        assert!(trainer.supports(&efa));
        let too_many: Vec<_> = (0..5).map(|card| interface(card, 1, EfaOnly)).collect();
        assert!(!trainer.supports(&too_many), "five EFA interfaces, four cards");
        // Pods ask for EFA devices as an extended resource, as Karpenter advertises it.
        let capacity = trainer.capacity(&CapacitySettings::default());
        assert_eq!(capacity.get(names::EFA), Quantity::from_units(4));
        assert!(
            plain
                .capacity(&CapacitySettings::default())
                .get(names::EFA)
                .is_zero()
        );
    }

    #[test]
    fn m5_large_has_eks_figures_and_labels() {
        let shape = m5_large();
        let offering = Offering {
            zone: "us-west-2a".into(),
            capacity_type: CapacityType::Spot,
            price: 0.04,
            available: true,
            reservation: None,
        };
        let it = shape.instance_type("us-west-2", vec![offering], &CapacitySettings::default());
        assert_eq!(it.capacity.get(names::PODS), Quantity::from_units(29));
        assert_eq!(it.allocatable().get(names::CPU), Quantity::from_millis(1930));
        assert_eq!(
            it.allocatable().get(names::MEMORY),
            bytes((8192 - 615 - 574 - 100) * MIB),
            "7.5 % VM overhead, 11 × 29 + 255 MiB kube-reserved, 100 MiB eviction"
        );
        let label = |key: &str| it.requirements.get(key).map(|r| r.values().collect::<Vec<_>>());
        assert_eq!(label(aws::INSTANCE_FAMILY), Some(vec!["m5"]));
        assert_eq!(label(aws::INSTANCE_GENERATION), Some(vec!["5"]));
        assert_eq!(label(aws::INSTANCE_CATEGORY), Some(vec!["m"]));
        assert_eq!(label(ZONE), Some(vec!["us-west-2a"]));
        assert_eq!(label(CAPACITY_TYPE), Some(vec!["spot"]));
        assert_eq!(label(aws::INSTANCE_LOCAL_NVME), None, "no local disk, no label");
    }

    #[test]
    fn families_split_into_category_and_generation() {
        let mut shape = m5_large();
        for (name, category, generation) in [
            ("g4dn.xlarge", "g", "4"),
            ("inf2.xlarge", "inf", "2"),
            ("m7gd.large", "m", "7"),
        ] {
            shape.name = name.into();
            assert_eq!(
                (shape.category(), shape.generation()),
                (category, generation),
                "{name}"
            );
        }
    }

    #[test]
    fn nvidia_gpus_become_an_extended_resource() {
        let mut shape = m5_large();
        shape.gpu = Some(Gpu {
            name: "t4".into(),
            manufacturer: "nvidia".into(),
            count: 1,
            memory_mib: 16384,
        });
        let capacity = shape.capacity(&CapacitySettings::default());
        assert_eq!(capacity.get(names::NVIDIA_GPU), Quantity::from_units(1));
    }
}

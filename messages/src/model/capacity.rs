//! Node capacity and overhead of an EC2 instance, computed as Karpenter's AWS provider does.
//!
//! One place for the formulas every catalog needs (the AWS provider's, the simulated cloud's and the
//! benchmark's): memory left after the hypervisor's share, ENI-limited pod density, and the
//! kube-reserved and eviction defaults of the EKS AMIs. Pure integer arithmetic; nothing fails.

use crate::model::{
    instance_type::Overhead,
    quantity::Quantity,
    resources::{Resources, names},
};

/// Bytes in a mebibyte.
pub const MIB: i64 = 1 << 20;
/// Bytes in a gibibyte.
pub const GIB: i64 = 1 << 30;

/// Karpenter's default `VM_MEMORY_OVERHEAD_PERCENT`, as parts per thousand (7.5 %).
pub const DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE: i64 = 75;

/// Pods on a node whose AMI does not limit them by ENIs.
pub const DEFAULT_MAX_PODS: i64 = 110;

/// The root volume Karpenter gives a node when the EC2NodeClass names none: 20 GiB.
pub const DEFAULT_ROOT_VOLUME_BYTES: i64 = 20 * GIB;

/// A quantity of `n` bytes.
pub fn bytes(n: i64) -> Quantity {
    Quantity::from_units(n)
}

/// Memory the kubelet sees: the instance's memory less the hypervisor's share, rounded up in the
/// hypervisor's favour (`overhead_permille` of 1,000).
pub fn vm_memory_mib(memory_mib: i64, overhead_permille: i64) -> i64 {
    memory_mib - ceil_div(memory_mib * overhead_permille, 1000)
}

/// Pods the VPC CNI can address: one IP per ENI is the ENI's own, and two host-network pods (the
/// CNI and kube-proxy) need none. `reserved_enis` are kept for other uses.
pub fn eni_limited_pods(max_enis: i64, ipv4_per_eni: i64, reserved_enis: i64) -> i64 {
    let usable = (max_enis - reserved_enis).max(0);
    usable * (ipv4_per_eni - 1).max(0) + 2
}

/// The pod limit: `maxPods` when set, else `eni_limited` (or [`DEFAULT_MAX_PODS`] when the AMI does
/// not limit by ENIs), capped at `podsPerCore × vCPUs` when that is set.
pub fn max_pods(
    max_pods: Option<i64>,
    eni_limited: Option<i64>,
    pods_per_core: Option<i64>,
    vcpus: i64,
) -> i64 {
    let pods = max_pods.or(eni_limited).unwrap_or(DEFAULT_MAX_PODS);
    match pods_per_core {
        Some(per_core) if per_core > 0 => pods.min(per_core * vcpus),
        _ => pods,
    }
}

/// Default kube-reserved cpu in millicores: 6 % of the first core, 1 % of the second, 0.5 % of the
/// third and fourth, 0.25 % of every other, rounded up.
pub fn kube_reserved_cpu_millis(vcpus: i64) -> i64 {
    let first = if vcpus >= 1 { 60 } else { 0 };
    let second = if vcpus >= 2 { 10 } else { 0 };
    let third_and_fourth = 5 * (vcpus.min(4) - 2).max(0);
    let rest_halves = 5 * (vcpus - 4).max(0);
    first + second + third_and_fourth + ceil_div(rest_halves, 2)
}

/// Default kube-reserved memory in MiB: 11 MiB per pod plus 255 MiB.
pub fn kube_reserved_memory_mib(pods: i64) -> i64 {
    11 * pods + 255
}

/// The overhead Karpenter assumes for an EKS node with no kubelet overrides: kube-reserved cpu and
/// memory for its size and pod limit plus 1 GiB of ephemeral storage, and hard eviction at 100 MiB
/// of memory and 10 % of the root volume.
pub fn default_overhead(vcpus: i64, pods: i64, root_volume_bytes: i64) -> Overhead {
    Overhead {
        kube_reserved: Resources::new()
            .with(names::CPU, Quantity::from_millis(kube_reserved_cpu_millis(vcpus)))
            .with(names::MEMORY, bytes(kube_reserved_memory_mib(pods) * MIB))
            .with(names::EPHEMERAL_STORAGE, bytes(GIB)),
        system_reserved: Resources::new(),
        eviction_threshold: Resources::new()
            .with(names::MEMORY, bytes(100 * MIB))
            .with(names::EPHEMERAL_STORAGE, bytes(ceil_div(root_volume_bytes, 10))),
    }
}

/// `n / d` rounded up, for non-negative `n` and positive `d`.
fn ceil_div(n: i64, d: i64) -> i64 {
    (n + d - 1) / d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type's shape and the figures it must get: pods as in EKS's `eni-max-pods.txt`; memory as
    /// capacity − 7.5 % − kube-reserved − 100 MiB, worked by hand.
    struct Known {
        name: &'static str,
        vcpus: i64,
        mib: i64,
        enis: i64,
        ipv4_per_eni: i64,
        pods: i64,
        reserved_cpu_millis: i64,
        allocatable_mib: i64,
    }

    const KNOWN: [Known; 4] = [
        Known {
            name: "t3.micro",
            vcpus: 2,
            mib: 1024,
            enis: 2,
            ipv4_per_eni: 2,
            pods: 4,
            reserved_cpu_millis: 70,
            allocatable_mib: 1024 - 77 - 299 - 100,
        },
        Known {
            name: "m5.large",
            vcpus: 2,
            mib: 8192,
            enis: 3,
            ipv4_per_eni: 10,
            pods: 29,
            reserved_cpu_millis: 70,
            allocatable_mib: 8192 - 615 - 574 - 100,
        },
        Known {
            name: "m5.xlarge",
            vcpus: 4,
            mib: 16384,
            enis: 4,
            ipv4_per_eni: 15,
            pods: 58,
            reserved_cpu_millis: 80,
            allocatable_mib: 16384 - 1229 - 893 - 100,
        },
        Known {
            name: "m5.24xlarge",
            vcpus: 96,
            mib: 393216,
            enis: 15,
            ipv4_per_eni: 50,
            pods: 737,
            reserved_cpu_millis: 310,
            allocatable_mib: 393216 - 29492 - 8362 - 100,
        },
    ];

    #[test]
    fn known_types_get_the_published_pods_and_reservations() {
        for k in KNOWN {
            let eni_limited = eni_limited_pods(k.enis, k.ipv4_per_eni, 0);
            let limit = max_pods(None, Some(eni_limited), None, k.vcpus);
            assert_eq!(limit, k.pods, "{} pods", k.name);
            assert_eq!(
                kube_reserved_cpu_millis(k.vcpus),
                k.reserved_cpu_millis,
                "{} cpu",
                k.name
            );
            let overhead = default_overhead(k.vcpus, limit, DEFAULT_ROOT_VOLUME_BYTES).total();
            let memory = vm_memory_mib(k.mib, DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE) * MIB
                - overhead.get(names::MEMORY).millis() / 1000;
            assert_eq!(memory, k.allocatable_mib * MIB, "{} allocatable memory", k.name);
        }
    }

    #[test]
    fn settings_override_the_eni_limit() {
        assert_eq!(max_pods(Some(50), Some(29), None, 2), 50, "maxPods wins");
        assert_eq!(max_pods(None, None, None, 2), DEFAULT_MAX_PODS, "no ENI limit");
        assert_eq!(max_pods(None, Some(737), Some(4), 96), 384, "podsPerCore caps");
        assert_eq!(eni_limited_pods(3, 10, 1), 20, "a reserved ENI takes its IPs");
        assert_eq!(eni_limited_pods(1, 10, 2), 2, "never below the host-network pods");
    }

    #[test]
    fn odd_core_counts_round_the_reservation_up() {
        assert_eq!(kube_reserved_cpu_millis(1), 60);
        assert_eq!(kube_reserved_cpu_millis(5), 83, "80 + 2.5 rounds up");
        assert_eq!(kube_reserved_cpu_millis(0), 0);
    }
}

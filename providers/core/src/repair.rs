//! Node repair policies (Karpenter's `NodeRepair` feature gate): which Node conditions say an
//! instance is broken, and how long each may hold before the node is replaced. A provider names
//! its policies through [`CloudProvider::repair_policies`](crate::CloudProvider::repair_policies);
//! the NodeClaim actors apply them.

use std::time::Duration;

/// One condition a provider treats as a broken node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairPolicy {
    /// The Node condition's type (`Ready`).
    pub condition: &'static str,
    /// The status that means broken (`False`, `Unknown`).
    pub status: &'static str,
    /// How long the condition may hold, from its last transition, before the node is repaired.
    pub toleration: Duration,
}

const fn policy(condition: &'static str, status: &'static str, minutes: u64) -> RepairPolicy {
    RepairPolicy {
        condition,
        status,
        toleration: Duration::from_secs(minutes * 60),
    }
}

/// EC2's policies: the kubelet's `Ready` and the conditions the EKS node monitoring agent
/// publishes. A failed accelerator is repaired sooner than the rest.
pub const EC2_REPAIR_POLICIES: &[RepairPolicy] = &[
    policy("Ready", "False", 30),
    policy("Ready", "Unknown", 30),
    policy("AcceleratedHardwareReady", "False", 10),
    policy("StorageReady", "False", 30),
    policy("NetworkingReady", "False", 30),
    policy("KernelReady", "False", 30),
    policy("ContainerRuntimeReady", "False", 30),
];

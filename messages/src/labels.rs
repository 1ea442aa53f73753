//! Well-known labels, annotations, taints, finalizers and tags, with Karpenter's exact spellings.
//!
//! These strings are the compatibility contract with Karpenter: Joist writes and reads the same keys
//! Karpenter does, so nodes launched by either controller can be adopted by the other. Also here:
//! the rules for which label keys a NodePool may set ([`restricted_label_reason`]) and the
//! normalization of legacy aliases ([`normalize_label_key`]).

/// The API group of NodePool and NodeClaim.
pub const KARPENTER_GROUP: &str = "karpenter.sh";
/// The API group of EC2NodeClass.
pub const AWS_GROUP: &str = "karpenter.k8s.aws";

/// The NodePool a node belongs to.
pub const NODEPOOL: &str = "karpenter.sh/nodepool";
/// `spot`, `on-demand` or `reserved`.
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Set to `true` once the node registered.
pub const REGISTERED: &str = "karpenter.sh/registered";
/// Set to `true` once the node initialized.
pub const INITIALIZED: &str = "karpenter.sh/initialized";
/// The provider manages the node's taints.
pub const DO_NOT_SYNC_TAINTS: &str = "karpenter.sh/do-not-sync-taints";
/// The EC2NodeClass a node was launched from.
pub const EC2_NODE_CLASS: &str = "karpenter.k8s.aws/ec2nodeclass";

/// Zone.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Region.
pub const REGION: &str = "topology.kubernetes.io/region";
/// Instance type.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// CPU architecture (`amd64`, `arm64`).
pub const ARCH: &str = "kubernetes.io/arch";
/// Operating system.
pub const OS: &str = "kubernetes.io/os";
/// Windows build.
pub const WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";
/// Hostname (restricted: never set by a NodePool).
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Excludes a draining node from external load balancers.
pub const EXCLUDE_FROM_EXTERNAL_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Capacity type values.
pub mod capacity_type {
    /// Spot capacity.
    pub const SPOT: &str = "spot";
    /// On-demand capacity.
    pub const ON_DEMAND: &str = "on-demand";
    /// Reserved capacity (capacity reservations).
    pub const RESERVED: &str = "reserved";
}

/// AWS instance-type labels (`karpenter.k8s.aws/instance-*` and friends).
pub mod aws {
    /// Instance category (`c`, `m`, `r`, …).
    pub const INSTANCE_CATEGORY: &str = "karpenter.k8s.aws/instance-category";
    /// Instance family (`m5`).
    pub const INSTANCE_FAMILY: &str = "karpenter.k8s.aws/instance-family";
    /// Instance generation (`5`).
    pub const INSTANCE_GENERATION: &str = "karpenter.k8s.aws/instance-generation";
    /// Instance size (`xlarge`).
    pub const INSTANCE_SIZE: &str = "karpenter.k8s.aws/instance-size";
    /// vCPU count.
    pub const INSTANCE_CPU: &str = "karpenter.k8s.aws/instance-cpu";
    /// CPU manufacturer.
    pub const INSTANCE_CPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-cpu-manufacturer";
    /// Sustained clock speed in MHz.
    pub const INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ: &str =
        "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz";
    /// Memory in MiB.
    pub const INSTANCE_MEMORY: &str = "karpenter.k8s.aws/instance-memory";
    /// EBS bandwidth in Mbps.
    pub const INSTANCE_EBS_BANDWIDTH: &str = "karpenter.k8s.aws/instance-ebs-bandwidth";
    /// Network bandwidth in Mbps.
    pub const INSTANCE_NETWORK_BANDWIDTH: &str = "karpenter.k8s.aws/instance-network-bandwidth";
    /// Local NVMe storage in GB.
    pub const INSTANCE_LOCAL_NVME: &str = "karpenter.k8s.aws/instance-local-nvme";
    /// Hypervisor (`nitro`, `xen`, or empty for metal).
    pub const INSTANCE_HYPERVISOR: &str = "karpenter.k8s.aws/instance-hypervisor";
    /// Encryption in transit support.
    pub const INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED: &str =
        "karpenter.k8s.aws/instance-encryption-in-transit-supported";
    /// Flex capability.
    pub const INSTANCE_CAPABILITY_FLEX: &str = "karpenter.k8s.aws/instance-capability-flex";
    /// GPU name.
    pub const INSTANCE_GPU_NAME: &str = "karpenter.k8s.aws/instance-gpu-name";
    /// GPU manufacturer.
    pub const INSTANCE_GPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-gpu-manufacturer";
    /// GPU count.
    pub const INSTANCE_GPU_COUNT: &str = "karpenter.k8s.aws/instance-gpu-count";
    /// GPU memory in MiB.
    pub const INSTANCE_GPU_MEMORY: &str = "karpenter.k8s.aws/instance-gpu-memory";
    /// Accelerator name.
    pub const INSTANCE_ACCELERATOR_NAME: &str = "karpenter.k8s.aws/instance-accelerator-name";
    /// Accelerator manufacturer.
    pub const INSTANCE_ACCELERATOR_MANUFACTURER: &str = "karpenter.k8s.aws/instance-accelerator-manufacturer";
    /// Accelerator count.
    pub const INSTANCE_ACCELERATOR_COUNT: &str = "karpenter.k8s.aws/instance-accelerator-count";
    /// Tenancy (`default`, `dedicated`).
    pub const INSTANCE_TENANCY: &str = "karpenter.k8s.aws/instance-tenancy";
    /// Nitro sandbox support.
    pub const NITRO_SANDBOX: &str = "karpenter.k8s.aws/nitro-sandbox";
    /// Zone id (`usw2-az1`).
    pub const ZONE_ID: &str = "topology.k8s.aws/zone-id";
    /// Capacity reservation id.
    pub const CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
    /// Capacity reservation type.
    pub const CAPACITY_RESERVATION_TYPE: &str = "karpenter.k8s.aws/capacity-reservation-type";
    /// Whether the capacity reservation is interruptible.
    pub const CAPACITY_RESERVATION_INTERRUPTIBLE: &str =
        "karpenter.k8s.aws/capacity-reservation-interruptible";
    /// Placement group id.
    pub const PLACEMENT_GROUP_ID: &str = "karpenter.k8s.aws/placement-group-id";
    /// Placement group partition.
    pub const PLACEMENT_GROUP_PARTITION: &str = "karpenter.k8s.aws/placement-group-partition";

    /// Every AWS well-known label a NodePool may require.
    pub const WELL_KNOWN: &[&str] = &[
        INSTANCE_CATEGORY,
        INSTANCE_FAMILY,
        INSTANCE_GENERATION,
        INSTANCE_SIZE,
        INSTANCE_CPU,
        INSTANCE_CPU_MANUFACTURER,
        INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ,
        INSTANCE_MEMORY,
        INSTANCE_EBS_BANDWIDTH,
        INSTANCE_NETWORK_BANDWIDTH,
        INSTANCE_LOCAL_NVME,
        INSTANCE_HYPERVISOR,
        INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED,
        INSTANCE_CAPABILITY_FLEX,
        INSTANCE_GPU_NAME,
        INSTANCE_GPU_MANUFACTURER,
        INSTANCE_GPU_COUNT,
        INSTANCE_GPU_MEMORY,
        INSTANCE_ACCELERATOR_NAME,
        INSTANCE_ACCELERATOR_MANUFACTURER,
        INSTANCE_ACCELERATOR_COUNT,
        INSTANCE_TENANCY,
        NITRO_SANDBOX,
        ZONE_ID,
        CAPACITY_RESERVATION_ID,
        CAPACITY_RESERVATION_TYPE,
        CAPACITY_RESERVATION_INTERRUPTIBLE,
        PLACEMENT_GROUP_ID,
        PLACEMENT_GROUP_PARTITION,
        super::EC2_NODE_CLASS,
    ];
}

/// Core well-known labels: cloud providers fill them in, so requirements on them need no definition.
pub const WELL_KNOWN: &[&str] = &[
    NODEPOOL,
    ZONE,
    REGION,
    INSTANCE_TYPE,
    ARCH,
    OS,
    CAPACITY_TYPE,
    WINDOWS_BUILD,
];

/// True for a core or AWS well-known label.
pub fn is_well_known(key: &str) -> bool {
    WELL_KNOWN.contains(&key) || aws::WELL_KNOWN.contains(&key)
}

/// Legacy label keys and the keys they mean today (the EBS CSI driver's zone key among them, as
/// Karpenter's AWS provider reads it: volumes it provisioned name their zone by it).
const LEGACY_ALIASES: &[(&str, &str)] = &[
    ("topology.ebs.csi.aws.com/zone", ZONE),
    ("failure-domain.beta.kubernetes.io/zone", ZONE),
    ("failure-domain.beta.kubernetes.io/region", REGION),
    ("beta.kubernetes.io/arch", ARCH),
    ("beta.kubernetes.io/os", OS),
    ("beta.kubernetes.io/instance-type", INSTANCE_TYPE),
];

/// Maps legacy aliases (`beta.kubernetes.io/arch`, …) to today's key; other keys are unchanged.
pub fn normalize_label_key(key: &str) -> &str {
    LEGACY_ALIASES
        .iter()
        .find(|(legacy, _)| *legacy == key)
        .map_or(key, |(_, current)| current)
}

/// Annotations.
pub mod annotations {
    /// `"true"` (or, on pods, a duration) blocks voluntary disruption of a pod or node.
    pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
    /// Hash of a NodePool's template, for drift.
    pub const NODEPOOL_HASH: &str = "karpenter.sh/nodepool-hash";
    /// Version of the NodePool hash algorithm.
    pub const NODEPOOL_HASH_VERSION: &str = "karpenter.sh/nodepool-hash-version";
    /// The terminationGracePeriod deadline of a deleting NodeClaim.
    pub const NODECLAIM_TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";
    /// `"true"` when a NodeOverlay changed the price of an offering the launch chooses among: the
    /// cloud must launch by that price, not its own.
    pub const PRICE_OVERLAY_APPLIED: &str = "karpenter.sh/price-overlay-applied";
    /// Set when minValues was relaxed for a launch.
    pub const NODECLAIM_MIN_VALUES_RELAXED: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
    /// Hash of an EC2NodeClass, for drift.
    pub const EC2NODECLASS_HASH: &str = "karpenter.k8s.aws/ec2nodeclass-hash";
    /// Version of the EC2NodeClass hash algorithm.
    pub const EC2NODECLASS_HASH_VERSION: &str = "karpenter.k8s.aws/ec2nodeclass-hash-version";
    /// The instance has been tagged with its NodeClaim.
    pub const TAGGED: &str = "karpenter.k8s.aws/tagged";
    /// The instance profile Karpenter created for a role.
    pub const INSTANCE_PROFILE_NAME: &str = "karpenter.k8s.aws/instance-profile-name";
    /// A pod's deletion cost, which feeds disruption cost.
    pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
}

/// Taint keys.
pub mod taints {
    /// `NoSchedule` on a node being disrupted or terminated.
    pub const DISRUPTED: &str = "karpenter.sh/disrupted";
    /// `PreferNoSchedule` on a node an emptiness or consolidation decision takes, while the
    /// decision waits for its validation: kube-scheduler places pods elsewhere first, so the
    /// pods of the commands before it do not land there. Joist's own; Karpenter has none.
    pub const DISRUPTION_CANDIDATE: &str = "joist.dev/disruption-candidate";
    /// The taints the disruption planner marks a Node with; a crash may leave either behind.
    pub const DISRUPTION_MARKS: &[&str] = &[DISRUPTED, DISRUPTION_CANDIDATE];
    /// `NoExecute` from boot until the node registers.
    pub const UNREGISTERED: &str = "karpenter.sh/unregistered";
    /// Ephemeral taints that do not block initialization.
    pub const EPHEMERAL: &[&str] = &[
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    ];
}

/// The finalizer on Nodes, NodeClaims and EC2NodeClasses.
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";

/// EC2 tags Karpenter puts on instances; forbidden in `EC2NodeClass.spec.tags`.
pub mod tags {
    /// Prefix of `kubernetes.io/cluster/<name>=owned`.
    pub const CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
    /// The EKS cluster name.
    pub const EKS_CLUSTER_NAME: &str = "eks:eks-cluster-name";
    /// The NodePool.
    pub const NODEPOOL: &str = super::NODEPOOL;
    /// The NodeClaim.
    pub const NODECLAIM: &str = "karpenter.sh/nodeclaim";
    /// The EC2NodeClass.
    pub const EC2_NODE_CLASS: &str = super::EC2_NODE_CLASS;
}

/// The part of a label key before the `/`, or the whole key when there is none (as the CRDs'
/// CEL `find("^([^/]+)")` reads it).
fn domain(key: &str) -> &str {
    key.split_once('/').map_or(key, |(d, _)| d)
}

/// Why a NodePool may not use `key` as a template label or requirement key.
///
/// Mirrors Karpenter's rules: `kubernetes.io`, `k8s.io` and `karpenter.sh` domains are reserved
/// except for the well-known keys (and `node.kubernetes.io`, `node-restriction.kubernetes.io`,
/// `kops.k8s.io` sub-domains); `karpenter.sh/nodepool` and `kubernetes.io/hostname` never.
pub fn restricted_label_reason(key: &str) -> Option<String> {
    if key == NODEPOOL || key == HOSTNAME {
        return Some(format!("label {key:?} is restricted"));
    }
    let domain = domain(key);
    let kubernetes_exceptions = [
        "beta.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "failure-domain.beta.kubernetes.io/zone",
        ZONE,
        REGION,
        ARCH,
        OS,
        WINDOWS_BUILD,
    ];
    if domain.ends_with("kubernetes.io")
        && !kubernetes_exceptions.contains(&key)
        && !domain.ends_with("node.kubernetes.io")
        && !domain.ends_with("node-restriction.kubernetes.io")
    {
        return Some("label domain \"kubernetes.io\" is restricted".to_string());
    }
    if domain.ends_with("k8s.io") && !domain.ends_with("kops.k8s.io") {
        return Some("label domain \"k8s.io\" is restricted".to_string());
    }
    if domain.ends_with(KARPENTER_GROUP) && key != CAPACITY_TYPE {
        return Some("label domain \"karpenter.sh\" is restricted".to_string());
    }
    None
}

/// Whether Joist writes a label for a requirement on `key` onto NodeClaims and Nodes (Karpenter's
/// `!IsRestrictedNodeLabel`): not a well-known label (the cloud provider sets those from the
/// instance), not in a restricted domain, and not in the AWS provider's own domain.
pub fn is_injectable(key: &str) -> bool {
    !is_well_known(key) && restricted_label_reason(key).is_none() && !domain(key).ends_with(AWS_GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_keys_are_injected_and_provider_keys_are_not() {
        assert!(is_injectable("company.com/team"));
        assert!(is_injectable("node.kubernetes.io/role"));
        for key in [
            ZONE,
            INSTANCE_TYPE,
            CAPACITY_TYPE,
            NODEPOOL,
            HOSTNAME,
            EC2_NODE_CLASS,
            aws::INSTANCE_FAMILY,
        ] {
            assert!(!is_injectable(key), "{key}");
        }
    }

    #[test]
    fn restricted_domains_follow_karpenter() {
        assert!(restricted_label_reason("karpenter.sh/nodepool").is_some());
        assert!(restricted_label_reason("kubernetes.io/hostname").is_some());
        assert!(restricted_label_reason("karpenter.sh/custom").is_some());
        assert!(restricted_label_reason("example.k8s.io/x").is_some());
        assert!(restricted_label_reason("kubernetes.io/custom").is_some());
        assert!(restricted_label_reason("karpenter.sh/capacity-type").is_none());
        assert!(restricted_label_reason("node.kubernetes.io/instance-type").is_none());
        assert!(restricted_label_reason("node.kubernetes.io/role").is_none());
        assert!(restricted_label_reason("kops.k8s.io/instancegroup").is_none());
        assert!(restricted_label_reason("topology.kubernetes.io/zone").is_none());
        assert!(restricted_label_reason("karpenter.k8s.aws/instance-family").is_none());
        assert!(restricted_label_reason("team").is_none());
        assert!(
            restricted_label_reason("kubernetes.io").is_some(),
            "a bare key is its own domain"
        );
        assert!(restricted_label_reason("foo.k8s.io").is_some());
        assert!(restricted_label_reason("karpenter.sh").is_some());
    }

    #[test]
    fn legacy_aliases_normalize() {
        assert_eq!(
            normalize_label_key("failure-domain.beta.kubernetes.io/zone"),
            ZONE
        );
        assert_eq!(normalize_label_key("team"), "team");
    }
}

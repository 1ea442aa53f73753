//! `karpenter.k8s.aws/v1` EC2NodeClass: how to launch EC2 instances (AMIs, subnets, security
//! groups, IAM, user data, kubelet, disks, instance metadata).
//!
//! The classic v1 surface of fact sheet §1.5. `kubelet` is an open map: the fields Karpenter
//! interprets are typed, the rest are kept verbatim. Defaults: `metadataOptions` as Karpenter
//! (`httpEndpoint: enabled`, `httpProtocolIPv6: disabled`, `httpPutResponseHopLimit: 1`,
//! `httpTokens: required`). Rules live as CEL on the CRD and in [`Validate::validate`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    duration::Duration,
    validation::{Validate, Violation, Violations},
};
use crate::{
    conditions::{self, ConditionType},
    labels::tags,
    model::quantity::Quantity,
};

/// AMI alias families and whether they accept a pinned version.
pub const ALIAS_FAMILIES: &[(&str, AmiFamily)] = &[
    ("al2", AmiFamily::AL2),
    ("al2023", AmiFamily::AL2023),
    ("bottlerocket", AmiFamily::Bottlerocket),
    ("windows2019", AmiFamily::Windows2019),
    ("windows2022", AmiFamily::Windows2022),
    ("windows2025", AmiFamily::Windows2025),
];

/// EC2NodeClassSpec: how to launch EC2 instances for NodePools that reference this class.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "karpenter.k8s.aws",
    version = "v1",
    kind = "EC2NodeClass",
    plural = "ec2nodeclasses",
    status = "EC2NodeClassStatus",
    category = "karpenter",
    shortname = "ec2nc",
    shortname = "ec2ncs",
    derive = "PartialEq",
    doc = "EC2NodeClass is the Schema for the EC2NodeClass API",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role", priority = "1")
)]
#[x_kube(
    validation = Rule::new("(has(self.role) && !has(self.instanceProfile)) || (!has(self.role) && has(self.instanceProfile))")
        .message("must specify exactly one of ['role', 'instanceProfile']"),
    validation = Rule::new("has(self.amiFamily) || self.amiSelectorTerms.exists(x, has(x.alias))")
        .message("amiFamily must be specified if amiSelectorTerms does not contain an alias"),
    validation = Rule::new("!has(self.amiFamily) || self.amiFamily == 'Custom' || !self.amiSelectorTerms.exists(x, has(x.alias)) || self.amiSelectorTerms.exists(x, has(x.alias) && x.alias.find('^[^@]+').lowerAscii() == self.amiFamily.lowerAscii())")
        .message("amiFamily must be 'Custom' or match the family of the alias")
)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassSpec {
    /// Subnets to launch into (terms are ORed).
    #[schemars(length(min = 1, max = 30))]
    #[x_kube(
        validation = Rule::new("self.all(x, has(x.tags) || has(x.id))")
            .message("expected at least one, got none, ['tags', 'id']"),
        validation = Rule::new("!self.exists(x, has(x.id) && has(x.tags))")
            .message("'id' is mutually exclusive, cannot be set with a combination of other fields in subnetSelectorTerms")
    )]
    pub subnet_selector_terms: Vec<SubnetSelectorTerm>,
    /// Security groups to attach (terms are ORed).
    #[schemars(length(min = 1, max = 30))]
    #[x_kube(
        validation = Rule::new("self.all(x, has(x.tags) || has(x.id) || has(x.name))")
            .message("expected at least one, got none, ['tags', 'id', 'name']"),
        validation = Rule::new("!self.exists(x, has(x.id) && (has(x.tags) || has(x.name)))")
            .message("'id' is mutually exclusive, cannot be set with a combination of other fields in securityGroupSelectorTerms"),
        validation = Rule::new("!self.exists(x, has(x.name) && (has(x.tags) || has(x.id)))")
            .message("'name' is mutually exclusive, cannot be set with a combination of other fields in securityGroupSelectorTerms")
    )]
    pub security_group_selector_terms: Vec<SecurityGroupSelectorTerm>,
    /// Capacity reservations that back `reserved` offerings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 30))]
    #[x_kube(
        validation = Rule::new("self.all(x, has(x.tags) || has(x.id))")
            .message("expected at least one, got none, ['tags', 'id']"),
        validation = Rule::new("!self.exists(x, has(x.id) && (has(x.tags) || has(x.ownerID)))")
            .message("'id' is mutually exclusive, cannot be set with a combination of other fields in capacityReservationSelectorTerms")
    )]
    pub capacity_reservation_selector_terms: Vec<CapacityReservationSelectorTerm>,
    /// A placement group to launch into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("has(self.name) || has(self.id)")
            .message("placementGroupSelector needs one of ['name', 'id']"),
        validation = Rule::new("!(has(self.name) && has(self.id))")
            .message("placementGroupSelector takes 'name' or 'id', not both")
    )]
    pub placement_group_selector: Option<PlacementGroupSelector>,
    /// Overrides the subnet's public-IP setting.
    #[serde(
        default,
        rename = "associatePublicIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub associate_public_ip_address: Option<bool>,
    /// AMIs to boot (terms are ORed; an alias must stand alone).
    #[schemars(length(min = 1, max = 30))]
    #[x_kube(
        validation = Rule::new("self.all(x, has(x.tags) || has(x.id) || has(x.name) || has(x.alias) || has(x.ssmParameter))")
            .message("expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']"),
        validation = Rule::new("!self.exists(x, has(x.id) && (has(x.alias) || has(x.tags) || has(x.name) || has(x.owner)))")
            .message("'id' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms"),
        validation = Rule::new("!self.exists(x, has(x.alias) && (has(x.id) || has(x.tags) || has(x.name) || has(x.owner)))")
            .message("'alias' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms"),
        validation = Rule::new("!(self.exists(x, has(x.alias)) && self.size() != 1)")
            .message("'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms")
    )]
    pub ami_selector_terms: Vec<AmiSelectorTerm>,
    /// The AMI family: user-data format and default disks. Required unless an alias is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ami_family: Option<AmiFamily>,
    /// User data merged with the generated bootstrap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// IAM role for an instance profile Joist manages (exclusive with `instanceProfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("role cannot be empty"))]
    pub role: Option<String>,
    /// An existing instance profile (exclusive with `role`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("instanceProfile cannot be empty"))]
    pub instance_profile: Option<String>,
    /// Tags for instances, volumes and launch templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(
        validation = Rule::new("self.all(k, k != '')").message("empty tag keys aren't supported"),
        validation = Rule::new("self.all(k, k != 'eks:eks-cluster-name')")
            .message("tag contains a restricted tag matching eks:eks-cluster-name"),
        validation = Rule::new("self.all(k, !k.startsWith('kubernetes.io/cluster'))")
            .message("tag contains a restricted tag matching kubernetes.io/cluster/"),
        validation = Rule::new("self.all(k, k != 'karpenter.sh/nodepool')")
            .message("tag contains a restricted tag matching karpenter.sh/nodepool"),
        validation = Rule::new("self.all(k, k != 'karpenter.sh/nodeclaim')")
            .message("tag contains a restricted tag matching karpenter.sh/nodeclaim"),
        validation = Rule::new("self.all(k, k != 'karpenter.k8s.aws/ec2nodeclass')")
            .message("tag contains a restricted tag matching karpenter.k8s.aws/ec2nodeclass")
    )]
    pub tags: BTreeMap<String, String>,
    /// Kubelet configuration (an open map; see [`KubeletConfiguration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "kubelet_schema")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new("self.filter(x, has(x.rootVolume) ? x.rootVolume == true : false).size() <= 1")
        .message("must have only one blockDeviceMappings with rootVolume"))]
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// How local NVMe instance storage is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_store_policy: Option<InstanceStorePolicy>,
    /// CloudWatch detailed monitoring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detailed_monitoring: Option<bool>,
    /// Instance metadata service options.
    #[serde(default)]
    pub metadata_options: MetadataOptions,
    /// The CreateFleet `Context` (reserved capacity for some accounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The network interfaces to launch with (EFA-only ones included). When set, it must hold the
    /// primary interface: `interface` at network card 0, device 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 150))]
    #[x_kube(
        validation = Rule::new("self.size() == 0 || self.exists(i, i.networkCardIndex == 0 && i.deviceIndex == 0 && i.interfaceType == 'interface')")
            .message("networkInterfaces needs the primary interface: interfaceType 'interface' at networkCardIndex 0, deviceIndex 0"),
        validation = Rule::new("self.all(i, self.filter(j, j.networkCardIndex == i.networkCardIndex && j.deviceIndex == i.deviceIndex).size() == 1 && (i.interfaceType != 'efa-only' || self.filter(j, j.networkCardIndex == i.networkCardIndex && j.interfaceType == 'efa-only').size() == 1))")
            .message("networkInterfaces may not repeat a (networkCardIndex, deviceIndex) pair, nor put two efa-only interfaces on one network card")
    )]
    pub network_interfaces: Vec<NetworkInterface>,
    /// How many IPv4 /28 prefixes to assign to the primary interface (prefix delegation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ip_prefix_count: Option<i32>,
    /// CPU options of the instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_options: Option<CpuOptions>,
    /// Connection tracking timeouts of the primary interface, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("has(self.tcpEstablishedTimeout) || has(self.udpStreamTimeout) || has(self.udpTimeout)")
        .message("connectionTracking needs at least one of tcpEstablishedTimeout, udpStreamTimeout, udpTimeout"))]
    pub connection_tracking: Option<ConnectionTracking>,
}

/// A network interface to launch with.
#[derive(JsonSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// The network card it is on.
    #[schemars(range(min = 0))]
    pub network_card_index: i32,
    /// Its device index on that card.
    #[schemars(range(min = 0))]
    pub device_index: i32,
    /// A regular interface, or an EFA interface without an IP address.
    pub interface_type: InterfaceType,
}

/// The kinds of [`NetworkInterface`].
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterfaceType {
    /// An ENA interface with IP addresses (`interface`).
    Interface,
    /// An EFA interface with no IP address (`efa-only`).
    EfaOnly,
}

/// CPU options.
#[derive(JsonSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuOptions {
    /// Whether the instances may run nested virtual machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_virtualization: Option<Toggle>,
}

/// Connection tracking timeouts, in seconds.
#[derive(JsonSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionTracking {
    /// Idle TCP connections that are established (60 to 432,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 432_000))]
    pub tcp_established_timeout: Option<i32>,
    /// Idle UDP flows that saw traffic both ways (60 to 180).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 180))]
    pub udp_stream_timeout: Option<i32>,
    /// Idle UDP flows that saw traffic one way or one request-response (30 to 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 60))]
    pub udp_timeout: Option<i32>,
}

/// Tags a selector term matches: at most 20, no empty keys or values (`*` matches any value).
fn selector_tags_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 20,
        "additionalProperties": {"type": "string"},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k != '' && self[k] != '')",
            "message": "empty tag keys or values aren't supported",
        }],
    })
}

/// A subnet selector term: tags (value `*` matches any) or an id.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubnetSelectorTerm {
    /// Tags the subnet has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "selector_tags_schema")]
    pub tags: BTreeMap<String, String>,
    /// The subnet id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "subnet-[0-9a-z]+"))]
    pub id: Option<String>,
}

/// A security group selector term: tags, an id, or a name.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecurityGroupSelectorTerm {
    /// Tags the security group has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "selector_tags_schema")]
    pub tags: BTreeMap<String, String>,
    /// The security group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "sg-[0-9a-z]+"))]
    pub id: Option<String>,
    /// The security group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An AMI selector term: an alias alone, an id alone, or tags/name/owner/ssmParameter together.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AmiSelectorTerm {
    /// `family@version`, e.g. `al2023@latest` or `al2023@v20240625`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 30))]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-zA-Z0-9]+@.+$')")
            .message("'alias' is improperly formatted, must match the format 'family@version'"),
        validation = Rule::new("self.find('^[^@]+') in ['al2','al2023','bottlerocket','windows2019','windows2022','windows2025']")
            .message("family is not supported, must be one of the following: 'al2', 'al2023', 'bottlerocket', 'windows2019', 'windows2022', 'windows2025'"),
        validation = Rule::new("self.find('^[^@]+') in ['windows2019','windows2022','windows2025'] ? self.find('[^@]+$') == 'latest' : true")
            .message("windows families may only specify version 'latest'")
    )]
    pub alias: Option<String>,
    /// Tags the AMI has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "selector_tags_schema")]
    pub tags: BTreeMap<String, String>,
    /// The AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "ami-[0-9a-z]+"))]
    pub id: Option<String>,
    /// The AMI name (wildcards allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The AMI owner (account id, `self` or `amazon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// An SSM parameter holding the AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm_parameter: Option<String>,
}

/// A capacity reservation selector term.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservationSelectorTerm {
    /// Tags the reservation has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "selector_tags_schema")]
    pub tags: BTreeMap<String, String>,
    /// The reservation id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^cr-[0-9a-z]+$"))]
    pub id: Option<String>,
    /// The owning account.
    #[serde(default, rename = "ownerID", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[0-9]{12}$"))]
    pub owner_id: Option<String>,
    /// `open` or `targeted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_match_criteria: Option<InstanceMatchCriteria>,
}

/// How a capacity reservation matches instances.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceMatchCriteria {
    /// Any matching instance uses the reservation.
    Open,
    /// Only instances that target the reservation.
    Targeted,
}

/// A placement group, by name or id.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlacementGroupSelector {
    /// The placement group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub name: Option<String>,
    /// The placement group id (`pg-…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^pg-[0-9a-z]+$"))]
    pub id: Option<String>,
}

impl EC2NodeClassSpec {
    /// The kubelet fields Joist keeps but this class's nodes will not get: those it does not
    /// interpret, on AL2 and Bottlerocket, whose user data takes a fixed set of settings (only
    /// nodeadm, on AL2023, takes a whole KubeletConfiguration). Karpenter's CRD prunes them all.
    pub fn kubelet_fields_not_passed(&self) -> Vec<&str> {
        match (&self.kubelet, self.user_data_family()) {
            (Some(kubelet), AmiFamily::AL2 | AmiFamily::Bottlerocket) => {
                kubelet.other.keys().map(String::as_str).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The family whose user data the nodes get: `amiFamily` when set, else its alias's family
    /// for Linux aliases, else `Custom` (the CRD requires one of the two, so `Custom` only covers
    /// Windows aliases, which launches refuse).
    pub fn user_data_family(&self) -> AmiFamily {
        let alias = self
            .ami_selector_terms
            .iter()
            .find_map(|term| term.alias.as_deref()?.split_once('@'));
        match (self.ami_family, alias) {
            (Some(family), _) => family,
            (None, Some(("al2023", _))) => AmiFamily::AL2023,
            (None, Some(("bottlerocket", _))) => AmiFamily::Bottlerocket,
            (None, Some(("al2", _))) => AmiFamily::AL2,
            (None, _) => AmiFamily::Custom,
        }
    }
}

/// AMI families.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AmiFamily {
    /// Amazon Linux 2.
    AL2,
    /// Amazon Linux 2023 (nodeadm).
    AL2023,
    /// Bottlerocket (TOML settings).
    Bottlerocket,
    /// User data passed through unchanged.
    Custom,
    /// Windows Server 2019.
    Windows2019,
    /// Windows Server 2022.
    Windows2022,
    /// Windows Server 2025.
    Windows2025,
}

/// How instance-store volumes are used.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceStorePolicy {
    /// Stripe all NVMe instance stores into one RAID0 array used for ephemeral storage.
    RAID0,
}

/// Keys accepted in `systemReserved` and `kubeReserved`.
const RESERVED_KEYS: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];
/// Keys accepted in `evictionHard`, `evictionSoft` and `evictionSoftGracePeriod`.
const EVICTION_KEYS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// Kubelet configuration: the fields Karpenter interprets, plus any others kept verbatim.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// Cluster DNS server addresses.
    #[serde(default, rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    /// Maximum pods per node (overrides the ENI-limited default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_pods: Option<i32>,
    /// Maximum pods per vCPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pods_per_core: Option<i32>,
    /// Resources reserved for the OS (`cpu`, `memory`, `ephemeral-storage`, `pid`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, String>,
    /// Resources reserved for Kubernetes daemons (`cpu`, `memory`, `ephemeral-storage`, `pid`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, String>,
    /// Hard eviction thresholds (quantity or percentage).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds (quantity or percentage).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    /// Grace periods for the soft thresholds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Maximum pod grace period on soft eviction, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i32>,
    /// Disk usage above which image GC always runs (percent).
    #[serde(
        default,
        rename = "imageGCHighThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk usage below which image GC never runs (percent).
    #[serde(
        default,
        rename = "imageGCLowThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// CPU CFS quota enforcement for containers with CPU limits.
    #[serde(default, rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    /// Any other KubeletConfiguration field, passed through.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// The kubelet schema: typed known fields, unknown ones preserved, Karpenter's cross-field rules.
fn kubelet_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <KubeletConfiguration as JsonSchema>::json_schema(generator);
    schema.remove("additionalProperties");
    schema.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    let keys = |list: &[&str]| {
        list.iter()
            .map(|k| format!("x == '{k}'"))
            .collect::<Vec<_>>()
            .join(" || ")
    };
    let rule = |rule: String, message: &str| serde_json::json!({"rule": rule, "message": message});
    let reserved = format!("self.all(x, {})", keys(RESERVED_KEYS));
    let eviction = format!("self.all(x, {})", keys(EVICTION_KEYS));
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for (field, rule_text, list) in [
            ("systemReserved", &reserved, RESERVED_KEYS),
            ("kubeReserved", &reserved, RESERVED_KEYS),
            ("evictionHard", &eviction, EVICTION_KEYS),
            ("evictionSoft", &eviction, EVICTION_KEYS),
            ("evictionSoftGracePeriod", &eviction, EVICTION_KEYS),
        ] {
            if let Some(prop) = props.get_mut(field).and_then(|p| p.as_object_mut()) {
                let message = format!("valid keys for {field} are {list:?}");
                prop.insert(
                    "x-kubernetes-validations".into(),
                    serde_json::json!([rule(rule_text.clone(), &message)]),
                );
            }
        }
    }
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            rule("has(self.imageGCHighThresholdPercent) && has(self.imageGCLowThresholdPercent) ? self.imageGCHighThresholdPercent > self.imageGCLowThresholdPercent : true".into(),
                "imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent"),
            rule("has(self.evictionSoft) && self.evictionSoft.size() > 0 ? (has(self.evictionSoftGracePeriod) && self.evictionSoft.all(e, e in self.evictionSoftGracePeriod)) : true".into(),
                "evictionSoft OwnerKey does not have a matching evictionSoftGracePeriod"),
            rule("has(self.evictionSoftGracePeriod) && self.evictionSoftGracePeriod.size() > 0 ? (has(self.evictionSoft) && self.evictionSoftGracePeriod.all(e, e in self.evictionSoft)) : true".into(),
                "evictionSoftGracePeriod OwnerKey does not have a matching evictionSoft"),
        ]),
    );
    schema
}

/// One disk.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceMapping {
    /// The device name (`/dev/xvda`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The EBS volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("has(self.snapshotID) || has(self.volumeSize)")
        .message("snapshotID or volumeSize must be defined"))]
    pub ebs: Option<BlockDevice>,
    /// This volume is the root volume (at most one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub root_volume: bool,
}

/// Pattern of an EBS volume size (Gi/G/Ti/T within EBS's limits).
const VOLUME_SIZE_PATTERN: &str = "^((?:[1-9][0-9]{0,3}|[1-4][0-9]{4}|[5][0-8][0-9]{3}|59000)Gi|(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|[6][0-3][0-9]{3}|64000)G|([1-9]||[1-5][0-7]|58)Ti|([1-9]||[1-5][0-9]|6[0-3]|64)T)$";

/// An EBS volume.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockDevice {
    /// Delete the volume when the instance terminates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// Encrypt the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
    /// Provisioned IOPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<i64>,
    /// KMS key for encryption.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// Snapshot to create the volume from.
    #[serde(default, rename = "snapshotID", skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Throughput in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i64>,
    /// Volume initialization rate in MiB/s (100..=300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 300))]
    pub volume_initialization_rate: Option<i32>,
    /// Size (`20Gi`, `1Ti`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = VOLUME_SIZE_PATTERN))]
    pub volume_size: Option<String>,
    /// Volume type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<VolumeType>,
}

/// EBS volume types.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum VolumeType {
    Standard,
    Io1,
    Io2,
    Gp2,
    Sc1,
    St1,
    Gp3,
}

/// `enabled` or `disabled`.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Toggle {
    /// On.
    Enabled,
    /// Off.
    Disabled,
}

/// Whether IMDSv2 session tokens are required.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpTokens {
    /// IMDSv2 only.
    Required,
    /// IMDSv1 allowed.
    Optional,
}

/// Instance metadata service options (Karpenter's defaults per field).
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    /// The metadata endpoint.
    #[serde(default = "enabled")]
    pub http_endpoint: Toggle,
    /// The IPv6 metadata endpoint.
    #[serde(default = "disabled", rename = "httpProtocolIPv6")]
    pub http_protocol_ipv6: Toggle,
    /// Hops a metadata response may travel (1 keeps it off pod networks).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub http_put_response_hop_limit: i64,
    /// IMDSv2 session tokens.
    #[serde(default = "required")]
    pub http_tokens: HttpTokens,
}

fn enabled() -> Toggle {
    Toggle::Enabled
}
fn disabled() -> Toggle {
    Toggle::Disabled
}
fn one() -> i64 {
    1
}
fn required() -> HttpTokens {
    HttpTokens::Required
}

impl Default for MetadataOptions {
    fn default() -> Self {
        MetadataOptions {
            http_endpoint: enabled(),
            http_protocol_ipv6: disabled(),
            http_put_response_hop_limit: one(),
            http_tokens: required(),
        }
    }
}

/// The observed state of an EC2NodeClass.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassStatus {
    /// Resolved subnets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<ResolvedSubnet>,
    /// Resolved security groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<ResolvedSecurityGroup>,
    /// Resolved AMIs, each with the requirements of the instance types it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub amis: Vec<ResolvedAmi>,
    /// The instance profile in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// Capacity reservations found by `capacityReservationSelectorTerms`, sorted by id: each
    /// becomes a `reserved` offering of its instance type in its zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_reservations: Vec<CapacityReservation>,
    /// `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`, `InstanceProfileReady`,
    /// `CapacityReservationsReady`, `ValidationSucceeded`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::common::required_reason_conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// A capacity reservation, as Karpenter records it in the status.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservation {
    /// Its id.
    pub id: String,
    /// The zone it is in.
    pub availability_zone: String,
    /// The instance type it reserves.
    pub instance_type: String,
    /// The account that owns it.
    #[serde(rename = "ownerID")]
    pub owner_id: String,
    /// `open` or `targeted`.
    pub instance_match_criteria: InstanceMatchCriteria,
    /// When it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Whether EC2 may interrupt it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruptible: Option<bool>,
    /// `default` or `capacity-block`.
    #[serde(default)]
    pub reservation_type: ReservationType,
    /// `active` or `expiring`.
    #[serde(default)]
    pub state: ReservationState,
}

/// The kinds of capacity reservation.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationType {
    /// An on-demand capacity reservation.
    #[default]
    Default,
    /// A capacity block.
    CapacityBlock,
}

impl ReservationType {
    /// The `karpenter.k8s.aws/capacity-reservation-type` value.
    pub const fn label(self) -> &'static str {
        match self {
            ReservationType::Default => "default",
            ReservationType::CapacityBlock => "capacity-block",
        }
    }
}

/// Where a capacity reservation is in its life.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationState {
    /// In use.
    #[default]
    Active,
    /// About to end.
    Expiring,
}

/// An AMI's requirements in the status: node selector requirements (`key`, `operator`, `values`).
fn ami_requirements_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["key", "operator"],
            "properties": {
                "key": {"type": "string"},
                "operator": {"type": "string"},
                "values": {"type": "array", "items": {"type": "string"}},
            },
        },
    })
}

/// A resolved subnet.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedSubnet {
    /// Subnet id.
    pub id: String,
    /// Zone name.
    pub zone: String,
    /// Zone id.
    #[serde(default, rename = "zoneID", skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<String>,
}

/// A resolved security group.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedSecurityGroup {
    /// Security group id.
    pub id: String,
    /// Security group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A resolved AMI.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedAmi {
    /// AMI id.
    pub id: String,
    /// AMI name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The AMI is deprecated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deprecated: bool,
    /// Requirements of the instance types this AMI serves (arch, GPU, …); the schema is a plain
    /// node selector requirement's, as Karpenter's (no `minValues`).
    #[schemars(schema_with = "ami_requirements_schema")]
    pub requirements: Vec<super::common::NodeSelectorRequirementWithMinValues>,
}

impl AmiSelectorTerm {
    fn has_other_than_alias(&self) -> bool {
        !self.tags.is_empty() || self.id.is_some() || self.name.is_some() || self.owner.is_some()
    }
}

/// Checks tag maps of selector terms: no empty keys or values, at most 20.
/// The exclusivity rules the CRD's CEL judges by presence (`has(x.tags)`), broken by a selector
/// term that writes `tags: {}` beside a field exclusive with it. The typed terms cannot tell an
/// empty map from none (the rules on them see only tags with entries), so these are read from
/// the document as written ([`Validate::validate_written`]), with the CRD's messages.
fn empty_tags_beside_exclusive_fields(document: &Value) -> Vec<Violation> {
    const EXCLUSIVE: [(&str, &[&str]); 4] = [
        ("subnetSelectorTerms", &["id"]),
        ("securityGroupSelectorTerms", &["id", "name"]),
        ("capacityReservationSelectorTerms", &["id"]),
        ("amiSelectorTerms", &["alias", "id"]),
    ];
    let mut out = Violations::default();
    for (list, fields) in EXCLUSIVE {
        let terms = document
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for (i, term) in terms.iter().enumerate() {
            let empty_tags = term
                .get("tags")
                .and_then(Value::as_object)
                .is_some_and(serde_json::Map::is_empty);
            let Some(field) = fields.iter().find(|field| term.get(**field).is_some()) else {
                continue;
            };
            if empty_tags {
                out.push(
                    format!("spec.{list}[{i}].{field}"),
                    format!(
                        "'{field}' is mutually exclusive, cannot be set with a combination of other fields in {list}"
                    ),
                );
            }
        }
    }
    out.into_vec()
}

fn validate_selector_tags(out: &mut Violations, at: &str, tags: &BTreeMap<String, String>) {
    if tags.len() > 20 {
        out.push(format!("{at}.tags"), "at most 20 tags are allowed");
    }
    for (key, value) in tags {
        if key.is_empty() || value.is_empty() {
            out.push(
                format!("{at}.tags[{key}]"),
                "empty tag keys or values aren't supported",
            );
        }
    }
}

fn validate_prefixed_id(out: &mut Violations, at: &str, id: Option<&str>, prefix: &str) {
    if let Some(id) = id {
        let ok = id.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        });
        if !ok {
            out.push(
                format!("{at}.id"),
                format!("{id:?} is not a valid id (expected {prefix}…)"),
            );
        }
    }
}

/// The rules of `networkInterfaces`, `connectionTracking` and `placementGroupSelector` (the
/// bounds and enums are the schema's).
fn validate_network(out: &mut Violations, spec: &EC2NodeClassSpec) {
    let interfaces = &spec.network_interfaces;
    let primary = |i: &&NetworkInterface| {
        i.network_card_index == 0 && i.device_index == 0 && i.interface_type == InterfaceType::Interface
    };
    if !interfaces.is_empty() && !interfaces.iter().any(|i| primary(&i)) {
        out.push(
            "spec.networkInterfaces",
            "networkInterfaces needs the primary interface: interfaceType 'interface' at networkCardIndex 0, deviceIndex 0",
        );
    }
    for (n, interface) in interfaces.iter().enumerate() {
        let card = interface.network_card_index;
        let earlier = &interfaces[..n];
        if earlier
            .iter()
            .any(|i| i.network_card_index == card && i.device_index == interface.device_index)
        {
            out.push(
                format!("spec.networkInterfaces[{n}]"),
                format!(
                    "network card {card}, device {} is used twice",
                    interface.device_index
                ),
            );
        }
        let efa =
            |i: &NetworkInterface| i.network_card_index == card && i.interface_type == InterfaceType::EfaOnly;
        if efa(interface) && earlier.iter().any(efa) {
            out.push(
                format!("spec.networkInterfaces[{n}]"),
                format!("network card {card} has a second efa-only interface: at most one per card"),
            );
        }
    }
    if let Some(tracking) = &spec.connection_tracking
        && tracking.tcp_established_timeout.is_none()
        && tracking.udp_stream_timeout.is_none()
        && tracking.udp_timeout.is_none()
    {
        out.push(
            "spec.connectionTracking",
            "at least one of tcpEstablishedTimeout, udpStreamTimeout, udpTimeout must be set",
        );
    }
    if let Some(group) = &spec.placement_group_selector {
        match (&group.name, &group.id) {
            (None, None) => out.push(
                "spec.placementGroupSelector",
                "expected one of ['name', 'id'], got none",
            ),
            (Some(_), Some(_)) => out.push(
                "spec.placementGroupSelector",
                "'name' and 'id' are mutually exclusive",
            ),
            _ => {}
        }
    }
}

impl EC2NodeClass {
    /// Whether the class can launch: its `Ready` condition is `True` (it has been resolved, and
    /// resolved well). The one answer the launch, the NodePool's `NodeClassReady` and drift share.
    pub fn is_ready(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|status| conditions::is_true(&status.conditions, ConditionType::Ready))
    }
}

impl Validate for EC2NodeClass {
    fn validate_written(document: &Value) -> Vec<Violation> {
        empty_tags_beside_exclusive_fields(document)
    }

    fn validate(&self) -> Vec<Violation> {
        let mut out = Violations::default();
        out.require_name(self.metadata.name.as_deref(), "EC2NodeClass");
        let spec = &self.spec;
        validate_subnets(&mut out, &spec.subnet_selector_terms);
        validate_security_groups(&mut out, &spec.security_group_selector_terms);
        validate_amis(&mut out, spec);
        for (i, term) in spec.capacity_reservation_selector_terms.iter().enumerate() {
            let at = format!("spec.capacityReservationSelectorTerms[{i}]");
            if term.tags.is_empty() && term.id.is_none() {
                out.push(&at, "expected at least one, got none, ['tags', 'id']");
            }
            if term.id.is_some() && (!term.tags.is_empty() || term.owner_id.is_some()) {
                out.push(
                    format!("{at}.id"),
                    "'id' is mutually exclusive with 'tags' and 'ownerID'",
                );
            }
            validate_selector_tags(&mut out, &at, &term.tags);
            validate_prefixed_id(&mut out, &at, term.id.as_deref(), "cr-");
            if let Some(owner) = &term.owner_id
                && !(owner.len() == 12 && owner.bytes().all(|b| b.is_ascii_digit()))
            {
                out.push(
                    format!("{at}.ownerID"),
                    format!("{owner:?} is not a 12-digit account id"),
                );
            }
        }
        validate_network(&mut out, spec);
        match (&spec.role, &spec.instance_profile) {
            (Some(_), Some(_)) => out.push(
                "spec.role",
                "role and instanceProfile are mutually exclusive: specify exactly one",
            ),
            (None, None) => out.push(
                "spec.role",
                "must specify exactly one of ['role', 'instanceProfile']",
            ),
            (Some(role), None) if role.is_empty() => out.push("spec.role", "role cannot be empty"),
            (None, Some(profile)) if profile.is_empty() => {
                out.push("spec.instanceProfile", "instanceProfile cannot be empty")
            }
            _ => {}
        }
        for key in spec.tags.keys() {
            let restricted = key == tags::EKS_CLUSTER_NAME
                || key.starts_with(tags::CLUSTER_PREFIX.trim_end_matches('/'))
                || key == tags::NODEPOOL
                || key == tags::NODECLAIM
                || key == tags::EC2_NODE_CLASS;
            if key.is_empty() {
                out.push("spec.tags", "empty tag keys aren't supported");
            } else if restricted {
                out.push(
                    format!("spec.tags[{key}]"),
                    format!("tag {key:?} is set by Joist and restricted"),
                );
            }
        }
        if let Some(kubelet) = &spec.kubelet {
            validate_kubelet(&mut out, kubelet);
        }
        validate_block_devices(&mut out, &spec.block_device_mappings);
        if !(1..=64).contains(&spec.metadata_options.http_put_response_hop_limit) {
            out.push(
                "spec.metadataOptions.httpPutResponseHopLimit",
                format!(
                    "must be between 1 and 64, got {}",
                    spec.metadata_options.http_put_response_hop_limit
                ),
            );
        }
        out.into_vec()
    }
}

fn validate_subnets(out: &mut Violations, terms: &[SubnetSelectorTerm]) {
    let path = "spec.subnetSelectorTerms";
    if terms.is_empty() {
        out.push(path, "subnetSelectorTerms cannot be empty");
    }
    if terms.len() > 30 {
        out.push(path, "at most 30 terms are allowed");
    }
    for (i, term) in terms.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if term.tags.is_empty() && term.id.is_none() {
            out.push(
                &at,
                "a subnet selector term must set tags or id: expected at least one, got none, ['tags', 'id']",
            );
        }
        if term.id.is_some() && !term.tags.is_empty() {
            out.push(
                format!("{at}.id"),
                "'id' is mutually exclusive, cannot be set with 'tags'",
            );
        }
        validate_selector_tags(out, &at, &term.tags);
        validate_prefixed_id(out, &at, term.id.as_deref(), "subnet-");
    }
}

fn validate_security_groups(out: &mut Violations, terms: &[SecurityGroupSelectorTerm]) {
    let path = "spec.securityGroupSelectorTerms";
    if terms.is_empty() {
        out.push(path, "securityGroupSelectorTerms cannot be empty");
    }
    if terms.len() > 30 {
        out.push(path, "at most 30 terms are allowed");
    }
    for (i, term) in terms.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let set = [!term.tags.is_empty(), term.id.is_some(), term.name.is_some()];
        match set.iter().filter(|s| **s).count() {
            0 => out.push(&at, "a security group selector term must set tags, id or name: expected at least one, got none, ['tags', 'id', 'name']"),
            1 => {}
            _ => out.push(&at, "'id' and 'name' are mutually exclusive with each other and with 'tags'"),
        }
        validate_selector_tags(out, &at, &term.tags);
        validate_prefixed_id(out, &at, term.id.as_deref(), "sg-");
    }
}

fn validate_amis(out: &mut Violations, spec: &EC2NodeClassSpec) {
    let path = "spec.amiSelectorTerms";
    let terms = &spec.ami_selector_terms;
    if terms.is_empty() {
        out.push(path, "amiSelectorTerms cannot be empty");
    }
    if terms.len() > 30 {
        out.push(path, "at most 30 terms are allowed");
    }
    let alias_family = terms
        .iter()
        .find_map(|t| t.alias.as_deref())
        .and_then(|a| a.split_once('@'))
        .map(|(f, _)| f);
    if terms.iter().any(|t| t.alias.is_some()) && terms.len() > 1 {
        out.push(
            path,
            "'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms",
        );
    }
    for (i, term) in terms.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let any = term.alias.is_some() || term.has_other_than_alias() || term.ssm_parameter.is_some();
        if !any {
            out.push(
                &at,
                "expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']",
            );
        }
        if term.alias.is_some() && term.has_other_than_alias() {
            out.push(
                format!("{at}.alias"),
                "'alias' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            );
        }
        if term.id.is_some() && (!term.tags.is_empty() || term.name.is_some() || term.owner.is_some()) {
            out.push(
                format!("{at}.id"),
                "'id' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            );
        }
        if let Some(alias) = &term.alias {
            match alias.split_once('@') {
                Some((family, version)) if !family.is_empty() && !version.is_empty() => {
                    match ALIAS_FAMILIES.iter().find(|(name, _)| *name == family) {
                        None => out.push(
                            format!("{at}.alias"),
                            format!("family {family:?} is not supported, must be one of al2, al2023, bottlerocket, windows2019, windows2022, windows2025"),
                        ),
                        Some(_) if family.starts_with("windows") && version != "latest" => {
                            out.push(format!("{at}.alias"), "windows families may only specify version 'latest'")
                        }
                        Some(_) => {}
                    }
                }
                _ => out.push(
                    format!("{at}.alias"),
                    format!("{alias:?} is improperly formatted, must match the format 'family@version'"),
                ),
            }
        }
        validate_selector_tags(out, &at, &term.tags);
        validate_prefixed_id(out, &at, term.id.as_deref(), "ami-");
    }
    match (spec.ami_family, alias_family) {
        (None, None) => out.push(
            "spec.amiFamily",
            "amiFamily must be specified if amiSelectorTerms does not contain an alias",
        ),
        (Some(family), Some(alias)) if family != AmiFamily::Custom => {
            let matches = ALIAS_FAMILIES
                .iter()
                .any(|(name, f)| *name == alias && *f == family);
            if !matches {
                out.push(
                    "spec.amiFamily",
                    format!("amiFamily {family:?} must be 'Custom' or match the alias family {alias:?}"),
                );
            }
        }
        _ => {}
    }
}

fn validate_kubelet(out: &mut Violations, kubelet: &KubeletConfiguration) {
    let path = "spec.kubelet";
    for (field, map) in [
        ("systemReserved", &kubelet.system_reserved),
        ("kubeReserved", &kubelet.kube_reserved),
    ] {
        for (key, value) in map {
            let at = format!("{path}.{field}[{key}]");
            if !RESERVED_KEYS.contains(&key.as_str()) {
                out.push(&at, format!("valid keys for {field} are {RESERVED_KEYS:?}"));
            }
            if let Err(e) = value.parse::<Quantity>() {
                out.push(&at, e.to_string());
            }
        }
    }
    for (field, map) in [
        ("evictionHard", &kubelet.eviction_hard),
        ("evictionSoft", &kubelet.eviction_soft),
    ] {
        for (key, value) in map {
            let at = format!("{path}.{field}[{key}]");
            if !EVICTION_KEYS.contains(&key.as_str()) {
                out.push(&at, format!("valid keys for {field} are {EVICTION_KEYS:?}"));
            }
            let percent_ok = value
                .strip_suffix('%')
                .is_some_and(|p| p.parse::<f64>().is_ok_and(|p| (0.0..=100.0).contains(&p)));
            if !percent_ok && value.parse::<Quantity>().is_err() {
                out.push(
                    &at,
                    format!("{value:?} is neither a percentage (0-100%) nor a quantity"),
                );
            }
        }
    }
    for (key, value) in &kubelet.eviction_soft_grace_period {
        let at = format!("{path}.evictionSoftGracePeriod[{key}]");
        if let Err(e) = value.parse::<Duration>() {
            out.push(&at, e.to_string());
        }
        if !kubelet.eviction_soft.contains_key(key) {
            out.push(
                &at,
                "evictionSoftGracePeriod OwnerKey does not have a matching evictionSoft",
            );
        }
    }
    for key in kubelet.eviction_soft.keys() {
        if !kubelet.eviction_soft_grace_period.contains_key(key) {
            out.push(
                format!("{path}.evictionSoft[{key}]"),
                "evictionSoft OwnerKey does not have a matching evictionSoftGracePeriod",
            );
        }
    }
    if let (Some(high), Some(low)) = (
        kubelet.image_gc_high_threshold_percent,
        kubelet.image_gc_low_threshold_percent,
    ) && high <= low
    {
        out.push(
            format!("{path}.imageGCHighThresholdPercent"),
            "imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent",
        );
    }
    for (field, value) in [
        (
            "imageGCHighThresholdPercent",
            kubelet.image_gc_high_threshold_percent,
        ),
        (
            "imageGCLowThresholdPercent",
            kubelet.image_gc_low_threshold_percent,
        ),
    ] {
        if let Some(v) = value
            && !(0..=100).contains(&v)
        {
            out.push(
                format!("{path}.{field}"),
                format!("must be between 0 and 100, got {v}"),
            );
        }
    }
    for (field, value) in [
        ("maxPods", kubelet.max_pods),
        ("podsPerCore", kubelet.pods_per_core),
    ] {
        if let Some(v) = value
            && v < 0
        {
            out.push(
                format!("{path}.{field}"),
                format!("must not be negative, got {v}"),
            );
        }
    }
}

fn validate_block_devices(out: &mut Violations, mappings: &[BlockDeviceMapping]) {
    let path = "spec.blockDeviceMappings";
    if mappings.iter().filter(|m| m.root_volume).count() > 1 {
        out.push(path, "must have only one blockDeviceMappings with rootVolume");
    }
    for (i, mapping) in mappings.iter().enumerate() {
        let Some(ebs) = &mapping.ebs else { continue };
        let at = format!("{path}[{i}].ebs");
        if ebs.snapshot_id.is_none() && ebs.volume_size.is_none() {
            out.push(&at, "snapshotID or volumeSize must be defined");
        }
        if let Some(size) = &ebs.volume_size {
            let ok = size.parse::<Quantity>().is_ok_and(|q| q.millis() > 0)
                && ["Gi", "G", "Ti", "T"].iter().any(|unit| size.ends_with(unit));
            if !ok {
                out.push(
                    format!("{at}.volumeSize"),
                    format!("{size:?} must be a size in Gi, G, Ti or T (e.g. 20Gi)"),
                );
            }
        }
        if let Some(rate) = ebs.volume_initialization_rate
            && !(100..=300).contains(&rate)
        {
            out.push(
                format!("{at}.volumeInitializationRate"),
                format!("must be between 100 and 300, got {rate}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_written_empty_count_as_set_beside_a_field_exclusive_with_them() {
        let class = serde_json::json!({"spec": {
            "amiSelectorTerms": [{"alias": "al2023@latest", "tags": {}}],
            "subnetSelectorTerms": [{"tags": {}}, {"id": "subnet-1", "tags": {"a": "b"}}],
            "securityGroupSelectorTerms": [{"name": "web", "tags": {}}],
        }});
        let fields: Vec<String> = empty_tags_beside_exclusive_fields(&class)
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.securityGroupSelectorTerms[0].name",
                "spec.amiSelectorTerms[0].alias"
            ],
            "tags that are set and not empty are the typed rules' to judge"
        );
    }

    fn spec(alias: &str) -> EC2NodeClassSpec {
        serde_json::from_value(serde_json::json!({
            "role": "r",
            "amiSelectorTerms": [{"alias": alias}],
            "subnetSelectorTerms": [{"id": "subnet-1"}],
            "securityGroupSelectorTerms": [{"id": "sg-1"}],
            "kubelet": {"maxPods": 50, "serializeImagePulls": false},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_al2023_nodes_get_kubelet_fields_joist_does_not_interpret() {
        assert_eq!(
            spec("bottlerocket@latest").kubelet_fields_not_passed(),
            ["serializeImagePulls"]
        );
        assert_eq!(
            spec("al2@latest").kubelet_fields_not_passed(),
            ["serializeImagePulls"]
        );
        assert!(spec("al2023@latest").kubelet_fields_not_passed().is_empty());
    }
}

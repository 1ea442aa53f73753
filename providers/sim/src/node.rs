//! The Node a booted instance registers, as the kubelet on an EKS AMI would write it from the user
//! data Karpenter renders: the NodeClaim's labels and taints, the instance's well-known labels, the
//! `karpenter.sh/unregistered:NoExecute` boot taint, and its capacity and allocatable resources.

use std::collections::BTreeMap;

use joist_messages::{labels::HOSTNAME, model::resources::Resources};
use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus, NodeSystemInfo, Taint},
    apimachinery::pkg::{api::resource::Quantity as KubeQuantity, apis::meta::v1::ObjectMeta},
};

/// The taint every node boots with until Joist registers it.
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

/// The Node name of the `ordinal`-th instance in the network `10.network.0.0/16`, in EC2's private
/// DNS form.
pub fn node_name(ordinal: u64, region: &str, network: u8) -> String {
    format!(
        "ip-10-{network}-{}-{}.{region}.compute.internal",
        ordinal / 250,
        ordinal % 250 + 4
    )
}

/// What a node registers with.
pub struct Registration<'a> {
    /// Its name.
    pub name: &'a str,
    /// `aws:///zone/i-…`.
    pub provider_id: &'a str,
    /// All its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The NodeClaim's taints and startup taints.
    pub taints: &'a [Taint],
    /// Capacity.
    pub capacity: &'a Resources,
    /// Allocatable.
    pub allocatable: &'a Resources,
    /// CPU architecture label value.
    pub arch: &'a str,
}

impl Registration<'_> {
    /// The Node object.
    pub fn node(&self) -> Node {
        let mut labels = self.labels.clone();
        labels.insert(HOSTNAME.to_owned(), self.name.to_owned());
        let mut taints = vec![Taint {
            key: UNREGISTERED_TAINT.to_owned(),
            effect: "NoExecute".to_owned(),
            value: None,
            time_added: None,
        }];
        taints.extend(self.taints.iter().cloned());
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.to_owned()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(self.provider_id.to_owned()),
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(quantities(self.capacity)),
                allocatable: Some(quantities(self.allocatable)),
                node_info: Some(NodeSystemInfo {
                    architecture: self.arch.to_owned(),
                    kubelet_version: "v1.35.0-eks".to_owned(),
                    operating_system: "linux".to_owned(),
                    os_image: "Amazon Linux 2023".to_owned(),
                    container_runtime_version: "containerd://2.0.0".to_owned(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

fn quantities(resources: &Resources) -> BTreeMap<String, KubeQuantity> {
    resources
        .iter()
        .map(|(name, amount)| (name.to_owned(), KubeQuantity(amount.to_string())))
        .collect()
}

//! What the read model keeps of each reflected object: what some controller reads, not every field
//! the API server holds (pods are read into a projection of their own,
//! [`CachedPod`](joist_messages::cached_pod::CachedPod), trimmed by its `trim`). Trimming happens as a watch event arrives, before the reflector stores
//! it, so no full copy is ever kept. It cannot fail; a field no controller reads is simply absent
//! from the cache (writes are merge patches of the fields they change, so nothing trimmed here is
//! ever written back).

use joist_messages::apis::NodeClaim;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::Resource;

/// Any object: managedFields are the API server's bookkeeping, which no controller reads (as
/// Karpenter's cache strips them).
pub fn trim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// A NodeClaim: its choices are dropped ([`drop_choices`]). Until the launch, only the launch reads
/// them, and it reads the claim from the API server; after it, the claim's labels say what it
/// became.
pub fn trim_claim(claim: &mut NodeClaim) {
    trim(claim);
    drop_choices(claim);
}

/// A node: of its status, only its capacity, allocatable and conditions. The images a kubelet
/// reports (up to 50, each with its names), its addresses and its system's description are read by
/// no controller.
pub fn trim_node(node: &mut Node) {
    trim(node);
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            capacity: status.capacity.take(),
            allocatable: status.allocatable.take(),
            conditions: status.conditions.take(),
            ..NodeStatus::default()
        };
    }
}

/// Drops a NodeClaim's requirements of more than one value: the price-ordered instance types (up
/// to 600, most of a claim's size) and the other choices its launch makes. Only one-value
/// requirements feed the scheduling view of a claim whose node is not registered yet. With 10,000
/// claims created faster than they launched, those lists were the largest share of the
/// controller's heap.
fn drop_choices(claim: &mut NodeClaim) {
    claim.spec.requirements.retain(|r| r.values.len() <= 1);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(provider_id: Option<&str>) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "managedFields": [{"manager": "joist", "operation": "Update"}]},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "c5.large"]},
                    {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "Exists"}
                ]
            },
            "status": provider_id.map(|id| json!({"providerID": id})),
        }))
        .expect("a valid NodeClaim")
    }

    #[test]
    fn a_node_keeps_its_capacity_allocatable_and_conditions() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"providerID": "aws:///us-west-2a/i-0123", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "2"}, "allocatable": {"cpu": "1930m"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "images": [{"names": ["registry.example/app:1"], "sizeBytes": 1000}],
                "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "containerd://2.0",
                             "kernelVersion": "6.1", "kubeProxyVersion": "", "kubeletVersion": "v1.35.0",
                             "machineID": "", "operatingSystem": "linux", "osImage": "Amazon Linux 2023",
                             "systemUUID": ""}
            }
        }))
        .expect("a valid Node");
        trim_node(&mut node);
        assert_eq!(
            serde_json::to_value(&node).expect("a node serializes"),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n", "labels": {"karpenter.sh/nodepool": "default"}},
                "spec": {"providerID": "aws:///us-west-2a/i-0123", "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {
                    "capacity": {"cpu": "2"}, "allocatable": {"cpu": "1930m"},
                    "conditions": [{"type": "Ready", "status": "True"}]
                }
            })
        );
    }

    fn keys(claim: &NodeClaim) -> Vec<&str> {
        claim.spec.requirements.iter().map(|r| r.key.as_str()).collect()
    }

    #[test]
    fn a_claim_keeps_only_its_one_value_requirements_launched_or_not() {
        for provider_id in [Some("aws:///us-west-2a/i-0123"), Some(""), None] {
            let mut kept = claim(provider_id);
            trim_claim(&mut kept);
            assert_eq!(
                keys(&kept),
                ["karpenter.sh/nodepool", "karpenter.sh/capacity-type"]
            );
            assert!(kept.metadata.managed_fields.is_none());
        }
    }
}

//! What the read model keeps of each reflected object: what some controller reads, not every field
//! the API server holds. Trimming happens as a watch event arrives, before the reflector stores
//! it, so no full copy is ever kept. It cannot fail; a field no controller reads is simply absent
//! from the cache (writes are merge patches of the fields they change, so nothing trimmed here is
//! ever written back).

use joist_messages::apis::NodeClaim;
use k8s_openapi::api::core::v1::{Container, Node, NodeStatus, Pod, PodStatus};
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

/// A pod: what scheduling, draining and the metrics read of it. Of each container, its name,
/// resources, ports and restart policy (a sidecar's); of its volumes, those that claim a volume (a
/// drain waits for their attachments); no ephemeral containers (they request nothing); of its
/// status, the phase, conditions, nomination and start. The rest (images, commands, environments,
/// probes, mounts, the service account's projected volume, the containers' statuses, the
/// addresses) was about a quarter of a cached pod at 10,000 nodes; most of what is left is the
/// room k8s-openapi's types keep inline for every optional field (docs/performance.md).
pub fn trim_pod(pod: &mut Pod) {
    trim(pod);
    if let Some(spec) = pod.spec.as_mut() {
        let init = spec.init_containers.iter_mut().flatten();
        for container in spec.containers.iter_mut().chain(init) {
            *container = Container {
                name: std::mem::take(&mut container.name),
                resources: container.resources.take(),
                ports: container.ports.take(),
                restart_policy: container.restart_policy.take(),
                ..Container::default()
            };
        }
        spec.ephemeral_containers = None;
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
        }
    }
    if let Some(status) = pod.status.as_mut() {
        *status = PodStatus {
            phase: status.phase.take(),
            conditions: status.conditions.take(),
            nominated_node_name: status.nominated_node_name.take(),
            start_time: status.start_time.take(),
            ..PodStatus::default()
        };
    }
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
    fn a_pod_keeps_what_scheduling_draining_and_metrics_read() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {
                "containers": [{
                    "name": "app", "image": "registry.example/app:1", "command": ["/app"],
                    "env": [{"name": "MODE", "value": "serve"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"requests": {"cpu": "1"}},
                    "ports": [{"containerPort": 8080, "hostPort": 8080}]
                }],
                "initContainers": [{"name": "proxy", "image": "proxy:2", "restartPolicy": "Always",
                                    "resources": {"requests": {"memory": "64Mi"}}}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
                ],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "terminationGracePeriodSeconds": 60
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "nominatedNodeName": "n",
                "startTime": "2026-11-27T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "app:1", "imageID": "", "ready": true, "restartCount": 0}]
            }
        }))
        .expect("a valid Pod");
        trim_pod(&mut pod);
        let kept = serde_json::to_value(&pod).expect("a pod serializes");
        assert_eq!(
            kept,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                "spec": {
                    "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}},
                                    "ports": [{"containerPort": 8080, "hostPort": 8080}]}],
                    "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                                        "resources": {"requests": {"memory": "64Mi"}}}],
                    "volumes": [
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
                    ],
                    "tolerations": [{"key": "gpu", "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 60
                },
                "status": {
                    "phase": "Running", "nominatedNodeName": "n", "startTime": "2026-11-27T00:00:00Z",
                    "conditions": [{"type": "Ready", "status": "True"}]
                }
            })
        );
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

//! What a pod is to an autoscaler, read from its object alone: a DaemonSet's, a static pod's
//! mirror, finished. One answer each, for the provisioner, the drain, the disruption planner and
//! the metrics alike.

use k8s_openapi::api::core::v1::Pod;

/// The annotation the kubelet puts on the mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether a DaemonSet owns the pod, as Karpenter's `IsOwnedByDaemonSet` decides it: an owner
/// reference of kind `DaemonSet` in `apps/v1`, controller or not.
pub fn owned_by_daemon_set(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "DaemonSet" && owner.api_version == "apps/v1")
}

/// Whether the pod is a static pod's mirror, which the kubelet creates and the API cannot evict.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(MIRROR_ANNOTATION))
}

/// Whether the pod has finished (`Succeeded` or `Failed`) and holds no resources.
pub fn finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(metadata: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({"metadata": metadata, "status": {"phase": phase}}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_daemon_sets_pod_is_one_whether_or_not_its_reference_is_the_controller() {
        let owned = |controller: bool, api_version: &str| {
            pod(
                json!({"ownerReferences": [{"apiVersion": api_version, "kind": "DaemonSet", "name": "agent",
                                            "uid": "u", "controller": controller}]}),
                "Running",
            )
        };
        assert!(owned_by_daemon_set(&owned(true, "apps/v1")));
        assert!(owned_by_daemon_set(&owned(false, "apps/v1")));
        assert!(!owned_by_daemon_set(&owned(true, "extensions/v1beta1")));
        assert!(!owned_by_daemon_set(&pod(json!({}), "Running")));
    }

    #[test]
    fn mirrors_and_finished_pods_are_told_by_their_annotation_and_phase() {
        assert!(is_mirror(&pod(
            json!({"annotations": {MIRROR_ANNOTATION: "x"}}),
            "Running"
        )));
        assert!(!is_mirror(&pod(json!({}), "Running")));
        assert!(finished(&pod(json!({}), "Succeeded")) && finished(&pod(json!({}), "Failed")));
        assert!(!finished(&pod(json!({}), "Running")));
    }
}

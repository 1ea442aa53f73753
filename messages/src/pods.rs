//! What a pod is to an autoscaler, read from its object alone: a DaemonSet's, a static pod's
//! mirror, finished, protected from disruption. One answer each, for the provisioner, the drain, the disruption planner and
//! the metrics alike.

use kube::ResourceExt;

use crate::{
    apis::duration::Duration as KarpenterDuration, cached_pod::CachedPod, labels::annotations::DO_NOT_DISRUPT,
};

/// The annotation the kubelet puts on the mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether a DaemonSet owns the pod, as Karpenter's `IsOwnedByDaemonSet` decides it: an owner
/// reference of kind `DaemonSet` in `apps/v1`, controller or not.
pub fn owned_by_daemon_set(pod: &CachedPod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "DaemonSet" && owner.api_version == "apps/v1")
}

/// Whether the pod is a static pod's mirror, which the kubelet creates and the API cannot evict.
pub fn is_mirror(pod: &CachedPod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(MIRROR_ANNOTATION))
}

/// Whether the pod has finished (`Succeeded` or `Failed`) and holds no resources.
pub fn finished(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
}

/// Whether a pod's `karpenter.sh/do-not-disrupt` protects it now: `"true"`, or a duration that
/// has not passed since the pod started (an invalid value protects nothing, as in Karpenter).
pub fn do_not_disrupt(pod: &CachedPod, now_seconds: i64) -> bool {
    let Some(value) = pod.annotations().get(DO_NOT_DISRUPT) else {
        return false;
    };
    if value == "true" {
        return true;
    }
    let Ok(protection) = value.parse::<KarpenterDuration>() else {
        return false;
    };
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now_seconds, |t| t.0.as_second());
    now_seconds - started < i64::try_from(protection.as_std().as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(metadata: serde_json::Value, phase: &str) -> CachedPod {
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

    #[test]
    fn do_not_disrupt_protects_for_true_or_until_its_duration_has_passed_since_start() {
        let annotated = |value: &str| {
            serde_json::from_value::<CachedPod>(json!({
                "metadata": {"annotations": {DO_NOT_DISRUPT: value}},
                "status": {"phase": "Running", "startTime": "1970-01-01T00:16:40Z"},
            }))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let started = 1_000;
        assert!(do_not_disrupt(&annotated("true"), started + 1_000_000));
        assert!(do_not_disrupt(&annotated("10m"), started + 599));
        assert!(!do_not_disrupt(&annotated("10m"), started + 600));
        assert!(
            !do_not_disrupt(&annotated("yes please"), started),
            "an invalid value protects nothing"
        );
        assert!(!do_not_disrupt(&pod(json!({}), "Running"), started));
    }
}

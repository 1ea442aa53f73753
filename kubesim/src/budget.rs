//! PodDisruptionBudgets: how many of a budget's pods may be disrupted now, and the Eviction API
//! that spends it.
//!
//! A budget's expected pods are the pods its selector matches (kube-controller-manager reads the
//! owning controller's scale for percentages; kubesim counts pods, which agrees once a workload has
//! all its replicas). A pod is healthy when it is Ready and not being deleted. An eviction that would
//! leave fewer healthy pods than the budget needs is refused with 429; a pod covered by two budgets
//! cannot be evicted (500), as in Kubernetes.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as KubeSelector;
use serde_json::{Value, json};

use crate::object::text;
use crate::{
    conditions,
    error::ApiError,
    object::Pointer,
    resources::GroupResource,
    selector::label_selector_matches,
    store::{DeleteOptions, ObjectKey, Store},
};

/// What a budget allows right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Pods the selector matches.
    pub expected: i64,
    /// Of those, Ready and not being deleted.
    pub healthy: i64,
    /// Healthy pods the budget requires.
    pub desired: i64,
}

impl Budget {
    /// Disruptions allowed now (never negative).
    pub fn allowed(&self) -> i64 {
        (self.healthy - self.desired).max(0)
    }
}

/// The budget of `pdb` over the pods of its namespace.
pub fn evaluate(pdb: &Value, pods: &[Arc<Value>]) -> Budget {
    let matching: Vec<&Arc<Value>> = pods.iter().filter(|pod| covers(pdb, pod)).collect();
    let expected = i64::try_from(matching.len()).unwrap_or(i64::MAX);
    let healthy = i64::try_from(matching.iter().filter(|pod| is_healthy(pod)).count()).unwrap_or(i64::MAX);
    let spec = &pdb["spec"];
    let desired = match (spec.get("minAvailable"), spec.get("maxUnavailable")) {
        (Some(min), _) => scaled(min, expected),
        (None, Some(max)) => expected - scaled(max, expected),
        (None, None) => 1,
    };
    Budget {
        expected,
        healthy,
        desired,
    }
}

/// An int-or-percent against a total (percentages round up, as Kubernetes rounds them).
fn scaled(value: &Value, total: i64) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(text) => match text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(percent) => (percent * total + 99) / 100,
            None => text.parse().unwrap_or(0),
        },
        _ => 0,
    }
}

/// Whether the budget's selector matches the pod (an absent selector matches nothing in policy/v1
/// only when it is null; an empty one matches every pod of the namespace).
pub fn covers(pdb: &Value, pod: &Value) -> bool {
    if pdb.at("/metadata/namespace") != pod.at("/metadata/namespace") {
        return false;
    }
    let Some(selector) = pdb.at("/spec/selector") else {
        return false;
    };
    let Ok(selector) = serde_json::from_value::<KubeSelector>(selector.clone()) else {
        return false;
    };
    label_selector_matches(&selector, &crate::object::labels(pod))
}

fn is_healthy(pod: &Value) -> bool {
    pod.at("/metadata/deletionTimestamp").is_none() && conditions::status(pod, "Ready") == Some("True")
}

/// The status the disruption controller writes for a budget.
pub fn status(pdb: &Value, budget: Budget, now: &str) -> Value {
    let mut with_status = json!({"status": pdb.get("status").cloned().unwrap_or_else(|| json!({}))});
    let allowed = budget.allowed();
    let (state, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    conditions::set(&mut with_status, "DisruptionAllowed", state, reason, "", now);
    let mut status = with_status["status"].take();
    status["currentHealthy"] = json!(budget.healthy);
    status["desiredHealthy"] = json!(budget.desired);
    status["expectedPods"] = json!(budget.expected);
    status["disruptionsAllowed"] = json!(allowed);
    status["observedGeneration"] = pdb.at("/metadata/generation").cloned().unwrap_or(json!(1));
    status
}

/// Evicts a pod: deletes it if no budget forbids it.
pub fn evict(store: &Store, key: &ObjectKey, options: &DeleteOptions) -> Result<(), ApiError> {
    let _guard = store.eviction_guard();
    let pods = GroupResource::new("", "pods");
    let pod = store.get(&pods, key)?;
    let phase = text(&pod, "/status/phase");
    let ignores_budgets = matches!(phase, "Succeeded" | "Failed" | "Pending")
        || pod.at("/metadata/deletionTimestamp").is_some();
    if !ignores_budgets {
        let budgets = store
            .list(
                &GroupResource::new("policy", "poddisruptionbudgets"),
                Some(&key.namespace),
                None,
                None,
                |pdb| covers(pdb, &pod),
            )
            .items;
        if budgets.len() > 1 {
            return Err(ApiError::Internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".to_owned(),
            ));
        }
        if let Some(pdb) = budgets.first() {
            let namespace_pods = store
                .list(&pods, Some(&key.namespace), None, None, |_| true)
                .items;
            let budget = evaluate(pdb, &namespace_pods);
            let evictable = if is_healthy(&pod) {
                budget.allowed() > 0
            } else {
                budget.healthy >= budget.desired
            };
            if !evictable {
                let name = text(pdb, "/metadata/name");
                return Err(ApiError::TooManyRequests(format!(
                    "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget {name} needs {} \
                     healthy pods and has {} currently",
                    budget.desired, budget.healthy
                )));
            }
        }
    }
    store.delete(&pods, key, options)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
    }

    #[test]
    fn min_available_and_max_unavailable_give_the_disruptions_kubernetes_allows() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", true), pod("d", false)];
        let pdb = |spec: Value| json!({"metadata": {"namespace": "default"}, "spec": spec});
        let min_two = evaluate(
            &pdb(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})),
            &pods,
        );
        assert_eq!((min_two.expected, min_two.healthy, min_two.allowed()), (4, 3, 1));
        let half = evaluate(
            &pdb(json!({"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "web"}}})),
            &pods,
        );
        assert_eq!((half.desired, half.allowed()), (2, 1));
        let other = evaluate(
            &pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}})),
            &pods,
        );
        assert_eq!((other.expected, other.allowed()), (0, 0));
    }
}

//! Status conditions as Kubernetes components write them: one entry per `type`, with
//! `lastTransitionTime` moved only when the status changes.

use serde_json::{Value, json};

use crate::object::Pointer;

/// Sets condition `kind` on `object.status.conditions`. Returns whether anything changed.
pub fn set(object: &mut Value, kind: &str, status: &str, reason: &str, message: &str, now: &str) -> bool {
    if !object.get("status").is_some_and(Value::is_object) {
        object["status"] = json!({});
    }
    if !object["status"].get("conditions").is_some_and(Value::is_array) {
        object["status"]["conditions"] = json!([]);
    }
    let Some(conditions) = object["status"]["conditions"].as_array_mut() else {
        return false;
    };
    let mut condition = json!({"type": kind, "status": status, "lastTransitionTime": now});
    if !reason.is_empty() {
        condition["reason"] = json!(reason);
    }
    if !message.is_empty() {
        condition["message"] = json!(message);
    }
    match conditions.iter_mut().find(|c| c["type"] == kind) {
        Some(existing) => {
            if says(existing, status, reason, message) {
                return false;
            }
            if existing["status"] == status {
                condition["lastTransitionTime"] = existing["lastTransitionTime"].clone();
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
    true
}

/// Whether `object`'s condition `kind` already says `status`, `reason` and `message`: [`set`]
/// would change nothing.
pub fn holds(object: &Value, kind: &str, status: &str, reason: &str, message: &str) -> bool {
    (object.at("/status/conditions"))
        .and_then(Value::as_array)
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == kind))
        .is_some_and(|existing| says(existing, status, reason, message))
}

/// Whether the condition `existing` says `status`, `reason` and `message` (an empty reason or
/// message: none).
fn says(existing: &Value, status: &str, reason: &str, message: &str) -> bool {
    let field = |name: &str, wanted: &str| match existing.get(name) {
        Some(value) => !wanted.is_empty() && *value == *wanted,
        None => wanted.is_empty(),
    };
    existing["status"] == status && field("reason", reason) && field("message", message)
}

/// The status (`True`, `False`, `Unknown`) of condition `kind`, if present.
pub fn status<'a>(object: &'a Value, kind: &str) -> Option<&'a str> {
    object
        .at("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?
        .get("status")?
        .as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut pod = json!({});
        assert!(set(&mut pod, "Ready", "False", "", "", "t1"));
        assert!(!set(&mut pod, "Ready", "False", "", "", "t2"));
        assert!(set(&mut pod, "Ready", "False", "Why", "", "t3"));
        assert_eq!(pod["status"]["conditions"][0]["lastTransitionTime"], "t1");
        assert!(set(&mut pod, "Ready", "True", "", "", "t4"));
        assert_eq!(pod["status"]["conditions"][0]["lastTransitionTime"], "t4");
        assert_eq!(status(&pod, "Ready"), Some("True"));
        assert_eq!(pod["status"]["conditions"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_condition_holds_only_when_setting_it_again_would_change_nothing() {
        let mut pod = json!({});
        assert!(!holds(
            &pod,
            "PodScheduled",
            "False",
            "Unschedulable",
            "0/1 nodes"
        ));
        set(
            &mut pod,
            "PodScheduled",
            "False",
            "Unschedulable",
            "0/1 nodes",
            "t1",
        );
        for (status, reason, message) in [
            ("False", "Unschedulable", "0/1 nodes"),
            ("True", "Unschedulable", "0/1 nodes"),
            ("False", "", "0/1 nodes"),
            ("False", "Unschedulable", "0/2 nodes"),
            ("False", "Unschedulable", ""),
        ] {
            let mut again = pod.clone();
            let changes = set(&mut again, "PodScheduled", status, reason, message, "t2");
            assert_eq!(
                holds(&pod, "PodScheduled", status, reason, message),
                !changes,
                "{status} {reason:?} {message:?}"
            );
        }
    }
}

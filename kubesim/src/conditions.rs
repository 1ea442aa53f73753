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
            if existing["status"] == status
                && existing.get("reason") == condition.get("reason")
                && existing.get("message") == condition.get("message")
            {
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
}

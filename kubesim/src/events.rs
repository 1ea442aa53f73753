//! Kubernetes Events (core/v1) recorded by kubesim's components, as `kubectl describe` and
//! `kubectl get events` show them. Recording never fails the action it reports: a rejected Event is
//! logged and dropped.

use serde_json::{Value, json};

use crate::{resources::GroupResource, store::Store};

/// Records an Event about `object` (in its namespace, or `default` for cluster-scoped objects).
pub fn record(store: &Store, object: &Value, kind: &str, reason: &str, message: &str, component: &str) {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or_default();
    let namespace = metadata["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let now = store.clock().now_rfc3339();
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": format!("{name}.{}", store.random_suffix()), "namespace": namespace},
        "involvedObject": {
            "apiVersion": object["apiVersion"], "kind": object["kind"], "name": name,
            "namespace": metadata["namespace"], "uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"],
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    if let Err(error) = store.create(&GroupResource::new("", "events"), namespace, event, false) {
        tracing::warn!(%error, reason, object = name, "kubesim: cannot record an event");
    }
}

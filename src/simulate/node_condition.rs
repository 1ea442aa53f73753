//! The scenario step `nodeCondition`: Nodes turn unhealthy (or recover) the way a failing kubelet
//! or the node monitoring agent would show it, by a condition on the Node's status, written
//! straight into kubesim's store as those agents write through the API.

use std::collections::BTreeMap;

use joist_kubesim::{
    Store, conditions,
    resources::GroupResource,
    store::{ObjectKey, Part},
};
use serde_json::Value;

/// Sets condition `type_` to `status` on the first `count` Nodes by name that carry every label of
/// `node_selector` and do not show that status yet (fewer when fewer match). A Node deleted
/// meanwhile is passed over.
pub fn set(store: &Store, node_selector: &BTreeMap<String, String>, count: usize, type_: &str, status: &str) {
    let nodes = GroupResource::new("", "nodes");
    let matching = |node: &Value| {
        node_selector
            .iter()
            .all(|(key, value)| node["metadata"]["labels"][key] == value.as_str())
            && conditions::status(node, type_) != Some(status)
    };
    let chosen = store.list(&nodes, None, None, Some(count), matching).items;
    let now = store.clock().now_rfc3339();
    let reason = format!("Scenario{type_}{status}");
    let message = format!("a scenario step set {type_}={status}");
    for node in chosen {
        let _ = store.modify(&nodes, &ObjectKey::of(&node), Part::Status, false, |current| {
            let mut next = current.clone();
            conditions::set(&mut next, type_, status, &reason, &message, &now);
            Ok(next)
        });
    }
}

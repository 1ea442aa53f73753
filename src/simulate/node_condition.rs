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
/// `node_selector` and do not show that status yet; returns their names (fewer when fewer match).
pub fn set(
    store: &Store,
    node_selector: &BTreeMap<String, String>,
    count: usize,
    type_: &str,
    status: &str,
) -> Vec<String> {
    let nodes = GroupResource::new("", "nodes");
    let matching = |node: &Value| {
        node_selector
            .iter()
            .all(|(key, value)| node["metadata"]["labels"][key] == value.as_str())
            && shown(node, type_) != Some(status)
    };
    let chosen = store.list(&nodes, None, None, Some(count), matching).items;
    let now = store.clock().now_rfc3339();
    let reason = format!("Scenario{type_}{status}");
    let message = format!("a scenario step set {type_}={status}");
    let mut names = Vec::with_capacity(chosen.len());
    for node in chosen {
        let key = ObjectKey::of(&node);
        let written = store.modify(&nodes, &key, Part::Status, false, |current| {
            let mut next = current.clone();
            conditions::set(&mut next, type_, status, &reason, &message, &now);
            Ok(next)
        });
        if written.is_ok() {
            names.push(key.name);
        }
    }
    names
}

/// The status of condition `type_` on `node`, if it has one.
fn shown<'a>(node: &'a Value, type_: &str) -> Option<&'a str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?["status"]
        .as_str()
}

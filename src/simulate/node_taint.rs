//! The scenario step `taintNodes`: for a while, every Node that becomes Ready gets a taint, as a
//! foreign controller (a security agent, a CNI health check) would add one after launch. It is
//! Karpenter's runaway-scale-up chaos case: pods the taint evicts or repels must not make Joist
//! launch node after node. Written straight into kubesim's store, as such a controller writes
//! through the API; a Node deleted meanwhile is passed over.

use std::{sync::Arc, time::Duration};

use joist_kubesim::{
    Store, conditions,
    resources::GroupResource,
    store::{ObjectKey, Part},
};
use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};
use tokio::time::Instant;

/// How often the tainting controller looks for Ready Nodes without the taint.
const RESYNC: Duration = Duration::from_secs(1);

/// Taints every Ready Node with `taint` until `duration` has passed; the taint stays on the Nodes
/// it was put on.
pub fn taint_ready_nodes(store: Arc<Store>, taint: Taint, duration: Duration) {
    let until = Instant::now() + duration;
    tokio::spawn(async move {
        while Instant::now() < until {
            taint_once(&store, &taint);
            tokio::time::sleep(RESYNC).await;
        }
    });
}

fn taint_once(store: &Store, taint: &Taint) {
    let nodes = GroupResource::new("", "nodes");
    let untainted =
        |node: &Value| conditions::status(node, "Ready") == Some("True") && !has_taint(node, &taint.key);
    let chosen = store.list(&nodes, None, None, None, untainted).items;
    let entry = json!({"key": taint.key, "value": taint.value, "effect": taint.effect});
    for node in chosen {
        let _ = store.modify(&nodes, &ObjectKey::of(&node), Part::Main, false, |current| {
            let mut next = current.clone();
            if !has_taint(&next, &taint.key) {
                match next["spec"]["taints"].as_array_mut() {
                    Some(taints) => taints.push(entry.clone()),
                    None => next["spec"]["taints"] = json!([entry]),
                }
            }
            Ok(next)
        });
    }
}

fn has_taint(node: &Value, key: &str) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|taints| taints.iter().any(|t| t["key"] == key))
}

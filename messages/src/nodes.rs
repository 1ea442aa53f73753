//! What a Node is to an autoscaler, read from its object alone: what it can hold, and which of
//! its taints only come and go while it starts. One answer each, for the simulation, the
//! lifecycle and the metrics alike.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, Taint},
    apimachinery::pkg::api::resource::Quantity as KubeQuantity,
};

use crate::{
    labels::taints,
    model::{quantity::Quantity, resources::Resources},
};

/// Whether a taint comes and goes while a node starts (the kubelet's and the cloud's, and the
/// boot taint): such taints never make a node unfit for the simulation or block initialization.
pub fn is_ephemeral(taint: &Taint) -> bool {
    taint.key == taints::UNREGISTERED || taints::EPHEMERAL.contains(&taint.key.as_str())
}

/// A Kubernetes resource list as [`Resources`]; amounts that do not parse are skipped.
pub fn resources_of(list: &BTreeMap<String, KubeQuantity>) -> Resources {
    list.iter()
        .filter_map(|(name, q)| Some((name.clone(), q.0.parse::<Quantity>().ok()?)))
        .collect()
}

/// What a Node says it can hold (its `status.allocatable`; empty when it says nothing).
pub fn node_allocatable(node: &Node) -> Resources {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(resources_of)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(allocatable: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn allocatable_keeps_what_parses_and_skips_the_rest() {
        let resources = node_allocatable(&node(json!({"cpu": "3920m", "memory": "lots", "pods": "110"})));
        let names: Vec<&str> = resources.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["cpu", "pods"], "an unparsable amount is skipped");
        assert_eq!(
            resources.get("cpu"),
            "3920m".parse().unwrap_or_else(|e| panic!("{e:?}"))
        );
        assert!(
            node_allocatable(&serde_json::from_value(json!({})).unwrap_or_else(|e| panic!("{e}"))).is_empty()
        );
    }

    #[test]
    fn only_start_up_taints_are_ephemeral() {
        let taint = |key: &str| Taint {
            key: key.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        assert!(is_ephemeral(&taint(taints::UNREGISTERED)));
        assert!(is_ephemeral(&taint("node.kubernetes.io/not-ready")));
        assert!(!is_ephemeral(&taint("dedicated")));
    }
}

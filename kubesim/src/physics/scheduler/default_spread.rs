//! The PodTopologySpread plugin's `defaultConstraints`, as kube-scheduler applies them when its
//! configuration sets them: a pod that declares no spread constraints of its own is spread by the
//! defaults, each carrying the selector deduced for the pod from the Services of its namespace
//! that select it and from its controller (a ReplicaSet, StatefulSet or ReplicationController, the
//! same object its owner reference names). A pod nothing selects is not spread. The deduction
//! itself is the shared vocabulary's ([`joist_messages::scheduler_config`]); what is read, and
//! when, is kubesim's. Nothing here fails: an object that is missing contributes nothing.

use std::collections::BTreeMap;

use joist_messages::scheduler_config::{
    OwnerSelector, SchedulerConfig, deduces_from_owner, default_selector,
};
use k8s_openapi::{
    api::core::v1::TopologySpreadConstraint, apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use serde_json::Value;

use crate::{
    object::{Pointer, labels, text},
    resources::GroupResource,
    store::{ObjectKey, Store},
};

/// The default constraints for `pod` under `config`; none for a pod nothing selects.
pub(super) fn defaults_for(
    config: &SchedulerConfig,
    store: &Store,
    pod: &Value,
) -> Vec<TopologySpreadConstraint> {
    let namespace = text(pod, "/metadata/namespace");
    let services = store.list(
        &GroupResource::new("", "services"),
        Some(namespace),
        None,
        None,
        |_| true,
    );
    // A Service without a selector selects no pod.
    let selectors: Vec<BTreeMap<String, String>> = (services.items.iter())
        .filter_map(|service| serde_json::from_value(service.at("/spec/selector")?.clone()).ok())
        .collect();
    let owner = owner_selector(store, namespace, pod);
    default_selector(&labels(pod), &selectors, owner.as_ref())
        .map(|selector| config.constraints_for(&selector))
        .unwrap_or_default()
}

/// What the pod's controller contributes, when it is of a kind kube-scheduler reads and is the
/// object its owner reference names.
fn owner_selector(store: &Store, namespace: &str, pod: &Value) -> Option<OwnerSelector> {
    let owner = (pod.at("/metadata/ownerReferences")?.as_array()?.iter())
        .find(|owner| owner.get("controller").and_then(Value::as_bool) == Some(true))?;
    let (api_version, kind) = (text(owner, "/apiVersion"), text(owner, "/kind"));
    if !deduces_from_owner(api_version, kind) {
        return None;
    }
    let resource = match kind {
        "ReplicaSet" => GroupResource::new("apps", "replicasets"),
        "StatefulSet" => GroupResource::new("apps", "statefulsets"),
        _ => GroupResource::new("", "replicationcontrollers"),
    };
    let controller = store
        .get(&resource, &ObjectKey::new(namespace, text(owner, "/name")))
        .ok()?;
    if text(&controller, "/metadata/uid") != text(owner, "/uid") {
        return None;
    }
    let selector = controller.at("/spec/selector")?.clone();
    if kind == "ReplicationController" {
        let labels: BTreeMap<String, String> = serde_json::from_value(selector).ok()?;
        (!labels.is_empty()).then_some(OwnerSelector::Labels(labels))
    } else {
        serde_json::from_value::<LabelSelector>(selector)
            .ok()
            .map(OwnerSelector::Selector)
    }
}

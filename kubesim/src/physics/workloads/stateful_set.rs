//! The StatefulSet controller: pods named `<set>-<ordinal>`, each with the claims of the set's
//! `volumeClaimTemplates` (`<template>-<set>-<ordinal>`), made before the pod and kept when it
//! goes, so a pod made again (evicted, its node drained) gets the same volumes, and with them
//! their zone. `OrderedReady` (the default) makes one pod at a time, each once the ones before it
//! are Ready, and removes the highest ordinal first, one at a time; `Parallel` makes and removes
//! them all at once.
//!
//! Left out, each visible to a user: rolling updates of a changed template (pods keep the
//! template they were made with), `persistentVolumeClaimRetentionPolicy` (claims are always
//! retained), `minReadySeconds` and `ordinals.start`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Kind, OwnedPod, Workloads, pod_from_template, replicas, write_status};
use crate::{
    error::ApiError,
    object::{Pointer, text},
    resources::GroupResource,
    store::{DeleteOptions, ObjectKey, Store},
};

impl Workloads {
    pub(super) fn stateful_set(&mut self, store: &Store, set: &Value) -> Result<(), ApiError> {
        let key = ObjectKey::of(set);
        let desired = usize::try_from(replicas(set)).unwrap_or(0);
        let parallel = text(set, "/spec/podManagementPolicy") == "Parallel";
        let prefix = format!("{}-", key.name);
        let by_ordinal: BTreeMap<usize, (&ObjectKey, &OwnedPod)> = self
            .owned(set)
            .into_iter()
            .flat_map(|owned| owned.pods.iter())
            .filter_map(|(key, pod)| Some((key.name.strip_prefix(&prefix)?.parse().ok()?, (key, pod))))
            .collect();
        let deleting = |(_, pod): &(&ObjectKey, &OwnedPod)| pod.deleting;
        let ready = |(_, pod): &(&ObjectKey, &OwnedPod)| !pod.deleting && pod.ready;
        let pods = GroupResource::new("", "pods");
        for ordinal in 0..desired {
            match by_ordinal.get(&ordinal) {
                Some(pod) if parallel || ready(pod) => {}
                // OrderedReady: the next pod waits for this one.
                Some(_) => break,
                None => {
                    create_claims(store, set, ordinal)?;
                    store.create(&pods, &key.namespace, pod_of(set, ordinal), false)?;
                    if !parallel {
                        break;
                    }
                }
            }
        }
        let excess = by_ordinal.range(desired..).rev().map(|(_, pod)| pod);
        if parallel {
            for pod in excess.filter(|p| !deleting(p)) {
                store.delete(&pods, pod.0, &DeleteOptions::default())?;
            }
        } else if let Some(highest) = excess.clone().next()
            && !excess.clone().any(&deleting)
        {
            store.delete(&pods, highest.0, &DeleteOptions::default())?;
        }
        let live = by_ordinal.values().filter(|p| !deleting(p)).count();
        let ready_count = by_ordinal.values().filter(|p| ready(p)).count();
        let mut next = set.clone();
        next["status"]["replicas"] = json!(live);
        next["status"]["currentReplicas"] = json!(live);
        next["status"]["updatedReplicas"] = json!(live);
        next["status"]["readyReplicas"] = json!(ready_count);
        next["status"]["availableReplicas"] = json!(ready_count);
        next["status"]["observedGeneration"] = set.at("/metadata/generation").cloned().unwrap_or(json!(1));
        write_status(store, &Kind::StatefulSet.resource(), set, next)
    }
}

/// The claim of `template` for the pod of `ordinal`.
fn claim_name(set: &Value, template: &Value, ordinal: usize) -> String {
    format!(
        "{}-{}-{ordinal}",
        text(template, "/metadata/name"),
        text(set, "/metadata/name")
    )
}

fn claim_templates(set: &Value) -> impl Iterator<Item = &Value> {
    set.at("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Makes the claims of the pod of `ordinal` that do not exist yet.
fn create_claims(store: &Store, set: &Value, ordinal: usize) -> Result<(), ApiError> {
    let namespace = text(set, "/metadata/namespace");
    let claims = GroupResource::new("", "persistentvolumeclaims");
    for template in claim_templates(set) {
        let name = claim_name(set, template, ordinal);
        if store.get(&claims, &ObjectKey::new(namespace, &name)).is_ok() {
            continue;
        }
        let mut metadata = template.get("metadata").cloned().unwrap_or_else(|| json!({}));
        metadata["name"] = json!(name);
        metadata["namespace"] = json!(namespace);
        let claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
        });
        store.create(&claims, namespace, claim, false)?;
    }
    Ok(())
}

/// The pod of `ordinal`: the template, named and labelled for its place, its claims mounted.
fn pod_of(set: &Value, ordinal: usize) -> Value {
    let set_name = text(set, "/metadata/name");
    let name = format!("{set_name}-{ordinal}");
    let mut pod = pod_from_template(set, "");
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = json!(name);
    pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] = json!(ordinal.to_string());
    pod["spec"]["hostname"] = json!(name);
    if let Some(service) = set.at("/spec/serviceName").filter(|s| !s.is_null()) {
        pod["spec"]["subdomain"] = service.clone();
    }
    let mut volumes: Vec<Value> = pod
        .at("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for template in claim_templates(set) {
        let volume = text(template, "/metadata/name");
        volumes.retain(|v| text(v, "/name") != volume);
        volumes.push(json!({
            "name": volume,
            "persistentVolumeClaim": {"claimName": claim_name(set, template, ordinal)},
        }));
    }
    if !volumes.is_empty() {
        pod["spec"]["volumes"] = json!(volumes);
    }
    pod
}

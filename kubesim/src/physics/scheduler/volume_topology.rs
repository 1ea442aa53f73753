//! kube-scheduler's VolumeBinding and VolumeZone filters, as far as kubesim's volumes go: a pod
//! whose claim is bound goes only where its PersistentVolume's node affinity allows; one whose
//! claim still waits for its first consumer only where the claim's StorageClass's allowed
//! topologies allow (the volume is then provisioned in that node's zone, [`crate::physics::volumes`]).
//!
//! A claim, volume or StorageClass that does not exist keeps the pod pending with
//! kube-scheduler's message for it (`persistentvolumeclaim "data" not found`). Ephemeral volumes
//! are not modelled: their claims are never made here.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, TopologySelectorTerm};
use serde_json::Value;

use super::filter::{NodeInfo, Refusal, parse, term_matches};
use crate::physics::volumes::claim_names;
use crate::{
    object::{Pointer, text},
    resources::GroupResource,
    store::{ObjectKey, Store},
};

/// Where one of a pod's claims lets it go.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum VolumeNeed {
    /// Bound: the volume's node affinity terms (ORed).
    Bound(Vec<NodeSelectorTerm>),
    /// To be provisioned for its first consumer: the class's allowed topologies (ORed).
    Provisioned(Vec<TopologySelectorTerm>),
}

/// What `pod`'s claims ask of a node, or kube-scheduler's message when one cannot be looked up.
pub(super) fn volume_needs(store: &Store, pod: &Value) -> Result<Vec<VolumeNeed>, String> {
    let namespace = text(pod, "/metadata/namespace");
    let mut needs = Vec::new();
    for name in claim_names(pod) {
        let claim = store
            .get(
                &GroupResource::new("", "persistentvolumeclaims"),
                &ObjectKey::new(namespace, name),
            )
            .map_err(|_| format!("persistentvolumeclaim \"{name}\" not found"))?;
        let volume = text(&claim, "/spec/volumeName");
        if !volume.is_empty() {
            let pv = store
                .get(
                    &GroupResource::new("", "persistentvolumes"),
                    &ObjectKey::new("", volume),
                )
                .map_err(|_| format!("persistentvolume \"{volume}\" not found"))?;
            let affinity = pv.at("/spec/nodeAffinity/required").cloned();
            let terms: Vec<NodeSelectorTerm> = affinity
                .map(|required| parse(&required, "nodeSelectorTerms"))
                .unwrap_or_default();
            if !terms.is_empty() {
                needs.push(VolumeNeed::Bound(terms));
            }
            continue;
        }
        let class = text(&claim, "/spec/storageClassName");
        if class.is_empty() {
            continue;
        }
        let class_object = store
            .get(
                &GroupResource::new("storage.k8s.io", "storageclasses"),
                &ObjectKey::new("", class),
            )
            .map_err(|_| format!("storageclass.storage.k8s.io \"{class}\" not found"))?;
        let allowed: Vec<TopologySelectorTerm> = parse(&class_object, "allowedTopologies");
        if !allowed.is_empty() {
            needs.push(VolumeNeed::Provisioned(allowed));
        }
    }
    Ok(needs)
}

/// Why `node` cannot take a pod with these volume needs, if it cannot.
pub(super) fn refusal(needs: &[VolumeNeed], node: &NodeInfo) -> Option<Refusal> {
    needs.iter().find_map(|need| match need {
        VolumeNeed::Bound(terms) => {
            (!terms.iter().any(|t| term_matches(t, node))).then_some(Refusal::VolumeNodeAffinity)
        }
        VolumeNeed::Provisioned(terms) => {
            (!terms.iter().any(|t| topology_matches(t, node))).then_some(Refusal::VolumeBinding)
        }
    })
}

/// Whether the node's labels meet every expression of an allowed-topology term.
fn topology_matches(term: &TopologySelectorTerm, node: &NodeInfo) -> bool {
    term.match_label_expressions
        .iter()
        .flatten()
        .all(|e| node.labels.get(&e.key).is_some_and(|v| e.values.contains(v)))
}

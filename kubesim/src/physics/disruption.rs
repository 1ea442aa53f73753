//! The disruption controller: keeps every PodDisruptionBudget's status (expected, healthy and
//! desired pods, disruptions allowed, the `DisruptionAllowed` condition) in step with its pods.

use std::{collections::BTreeSet, sync::Arc};

use serde_json::Value;

use super::{Informer, wait};
use crate::{
    budget,
    resources::GroupResource,
    store::{ObjectKey, Part, Store},
};

/// Runs the controller until aborted.
pub async fn run(store: Arc<Store>) {
    let mut changes = store.subscribe();
    let mut budgets = Informer::new("policy", "poddisruptionbudgets");
    let mut pods = Informer::new("", "pods");
    loop {
        let mut namespaces = BTreeSet::new();
        for change in budgets.changes(&store).chain(pods.changes(&store)) {
            namespaces.insert(ObjectKey::of(&change.object).namespace);
        }
        for namespace in namespaces {
            refresh(&store, &namespace);
        }
        if !wait(&mut changes, None).await {
            return;
        }
    }
}

/// Recomputes the status of the budgets in one namespace.
fn refresh(store: &Store, namespace: &str) {
    let resource = GroupResource::new("policy", "poddisruptionbudgets");
    let pdbs = store.list(&resource, Some(namespace), None, None, |_| true).items;
    if pdbs.is_empty() {
        return;
    }
    let pods = store
        .list(
            &GroupResource::new("", "pods"),
            Some(namespace),
            None,
            None,
            |_| true,
        )
        .items;
    let now = store.clock().now_rfc3339();
    for pdb in pdbs {
        let status = budget::status(&pdb, budget::evaluate(&pdb, &pods), &now);
        if pdb.get("status") == Some(&status) {
            continue;
        }
        let mut next: Value = (*pdb).clone();
        next["status"] = status;
        if let Err(error) = store.update(&resource, &ObjectKey::of(&pdb), Part::Status, next, false) {
            tracing::debug!(%error, pdb = %ObjectKey::of(&pdb).name, "kubesim disruption controller: status not written");
        }
    }
}

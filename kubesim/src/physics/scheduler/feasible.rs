//! Which nodes a kind of pod might still fit, so that pods alike do not each look at every node.
//!
//! Pods with the same scheduling inputs (namespace, labels and spec: the pods of one ReplicaSet)
//! get the same answer from a node until something changes that answer. A [`Class`] keeps, for
//! one such kind, the nodes known to refuse it (with the reason, counted for kube-scheduler's
//! message) and the rest, still `open`. The scheduler looks only at open nodes; a node moves back
//! to open when it, or what is bound to it, changes. Changes that can open many nodes at once (a
//! pod leaving a topology domain, a node relabelled) drop the classes they could affect, and the
//! next pod of those kinds looks at every node again. The answers are the ones a scan of every
//! node gives: the same nodes refused, for the same reasons, and the same feasible nodes in the
//! same order.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::Write,
};

use super::filter::{NodeInfo, PodNeeds, Refusal};
use crate::object::Pointer;

/// Kinds of pods kept at once; beyond it every class is dropped and rebuilt when next needed.
const MAX_CLASSES: usize = 64;

/// What is known of one kind of pod against the nodes.
pub(super) struct Class {
    /// Nodes not known to refuse the kind.
    pub(super) open: BTreeSet<String>,
    refused: HashMap<String, Refusal>,
    /// Refused nodes per reason.
    counts: HashMap<Refusal, usize>,
    /// Where the kind may go depends on other pods (required pod affinity or anti-affinity,
    /// `DoNotSchedule` spread): a pod leaving may open many nodes.
    depends_on_pods: bool,
    /// A pod arriving may open nodes (required pod affinity, `DoNotSchedule` spread).
    opened_by_arrivals: bool,
}

impl Class {
    fn new(needs: &PodNeeds, nodes: &BTreeMap<String, NodeInfo>) -> Self {
        Self {
            open: nodes.keys().cloned().collect(),
            refused: HashMap::new(),
            counts: HashMap::new(),
            depends_on_pods: needs.depends_on_pods(),
            opened_by_arrivals: needs.required_pod_terms().any(|(_, anti)| !anti)
                || needs
                    .spread
                    .iter()
                    .any(|c| c.when_unsatisfiable == "DoNotSchedule"),
        }
    }

    /// Records that `node` refuses the kind.
    pub(super) fn refuse(&mut self, node: String, refusal: Refusal) {
        self.open.remove(&node);
        *self.counts.entry(refusal.clone()).or_default() += 1;
        if let Some(before) = self.refused.insert(node, refusal) {
            self.uncount(&before);
        }
    }

    /// Looks at `node` again.
    fn reopen(&mut self, node: &str) {
        if let Some(refusal) = self.refused.remove(node) {
            self.uncount(&refusal);
        }
        self.open.insert(node.to_owned());
    }

    fn forget(&mut self, node: &str) {
        if let Some(refusal) = self.refused.remove(node) {
            self.uncount(&refusal);
        }
        self.open.remove(node);
    }

    fn uncount(&mut self, refusal: &Refusal) {
        if let Some(count) = self.counts.get_mut(refusal) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(refusal);
            }
        }
    }

    /// Refused nodes per reason, in kube-scheduler's words.
    pub(super) fn reasons(&self) -> BTreeMap<String, usize> {
        let mut reasons = BTreeMap::new();
        for (refusal, count) in &self.counts {
            *reasons.entry(refusal.to_string()).or_default() += count;
        }
        reasons
    }
}

/// The classes known, by key (see [`key`]).
#[derive(Default)]
pub(super) struct Classes {
    by_key: HashMap<Vec<u8>, Class>,
}

impl Classes {
    /// The class of `key`, built over `nodes` (all open) when not known.
    pub(super) fn of(
        &mut self,
        key: Vec<u8>,
        needs: &PodNeeds,
        nodes: &BTreeMap<String, NodeInfo>,
    ) -> &mut Class {
        if self.by_key.len() >= MAX_CLASSES && !self.by_key.contains_key(&key) {
            self.by_key.clear();
        }
        self.by_key.entry(key).or_insert_with(|| Class::new(needs, nodes))
    }

    /// A node appeared or changed without new labels: every kind looks at it again.
    pub(super) fn node_changed(&mut self, node: &str) {
        for class in self.by_key.values_mut() {
            class.reopen(node);
        }
    }

    /// A node's labels changed: the domains of what runs on it changed too.
    pub(super) fn node_relabelled(&mut self, node: &str) {
        self.by_key.retain(|_, class| !class.depends_on_pods);
        self.node_changed(node);
    }

    /// A node is gone.
    pub(super) fn node_removed(&mut self, node: &str) {
        self.by_key.retain(|_, class| !class.depends_on_pods);
        for class in self.by_key.values_mut() {
            class.forget(node);
        }
    }

    /// A pod was bound to `node`: the node's reasons may change, and kinds placed next to
    /// pods may fit where they did not.
    pub(super) fn pod_arrived(&mut self, node: &str) {
        self.by_key.retain(|_, class| !class.opened_by_arrivals);
        self.node_changed(node);
    }

    /// The domains bound pods' anti-affinity keeps pods out of changed: the kinds it kept off a
    /// node may fit anywhere in a domain it left.
    pub(super) fn held_off_changed(&mut self) {
        self.by_key
            .retain(|_, class| !class.counts.contains_key(&Refusal::ExistingAntiAffinity));
    }

    /// A pod left `node`: room there, and for kinds placed by pods, maybe anywhere.
    pub(super) fn pod_left(&mut self, node: &str) {
        self.by_key.retain(|_, class| !class.depends_on_pods);
        self.node_changed(node);
    }
}

/// The class key of a pending pod: what the filters read of it (its volumes' topology comes
/// from the cluster, so a claim bound since makes another kind), as JSON written straight into
/// the key (a pod's spec is kilobytes, and every attempt makes its key).
pub(super) fn key(pod: &serde_json::Value, needs: &PodNeeds) -> Vec<u8> {
    let mut key = Vec::with_capacity(4096);
    for pointer in ["/metadata/namespace", "/metadata/labels", "/spec"] {
        if let Some(part) = pod.at(pointer) {
            // Writing JSON into a Vec fails only if the value cannot be serialized, and a
            // parsed Value always can.
            let _ = serde_json::to_writer(&mut key, part);
        }
        key.push(b'\n');
    }
    let _ = write!(key, "{:?}", needs.volumes);
    key
}

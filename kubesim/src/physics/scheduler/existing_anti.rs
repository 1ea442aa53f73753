//! The required anti-affinity terms of bound pods. kube-scheduler keeps a pod out of the topology
//! domain of every bound pod whose required anti-affinity term selects it, so anti-affinity holds
//! both ways even when only one side states it.
//!
//! Terms are kept by namespace and term, each with the pods holding it and the domains those are
//! in, counted as pods are bound and unbound; a pending pod asks about the distinct terms, not
//! about every bound pod. When nodes' labels change, or a node that pods were bound to appears or
//! goes, every term's domains are counted again from its holders when next asked for.
//!
//! Failure modes: none; a holder bound to a node the scheduler has not seen yet is in no domain
//! until the node appears.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::PodAffinityTerm;

use super::{
    domains::{TermDomains, TermKey},
    filter::{AffinityDomains, Bound, NodeInfo, selects},
};
use crate::store::ObjectKey;

/// The bound pods' required anti-affinity terms (see the module docs).
#[derive(Default)]
pub(super) struct ExistingAnti {
    terms: HashMap<TermKey, Held>,
    /// Nodes changed since the domains were counted.
    stale: bool,
}

/// One term, as the pods of one namespace hold it.
struct Held {
    term: PodAffinityTerm,
    namespace: String,
    /// The pods holding it, with the node each is bound to.
    holders: HashMap<ObjectKey, String>,
    /// Holders per domain of the term's topology key.
    domains: HashMap<String, usize>,
}

impl ExistingAnti {
    /// `bound` (the pod `key`) was bound: its terms hold its node's domains.
    pub(super) fn bind(&mut self, key: &ObjectKey, bound: &Bound, nodes: &BTreeMap<String, NodeInfo>) {
        for term in &bound.anti_terms {
            let held = self
                .terms
                .entry(TermDomains::key(term, &bound.namespace))
                .or_insert_with(|| Held {
                    term: term.clone(),
                    namespace: bound.namespace.clone(),
                    holders: HashMap::new(),
                    domains: HashMap::new(),
                });
            held.holders.insert(key.clone(), bound.node.clone());
            held.count(&bound.node, nodes, 1);
        }
    }

    /// `bound` (the pod `key`) left; whether it held a term, so that domains it kept pods out of
    /// may take them now.
    pub(super) fn unbind(
        &mut self,
        key: &ObjectKey,
        bound: &Bound,
        nodes: &BTreeMap<String, NodeInfo>,
    ) -> bool {
        for term in &bound.anti_terms {
            let term_key = TermDomains::key(term, &bound.namespace);
            let Some(held) = self.terms.get_mut(&term_key) else {
                continue;
            };
            if let Some(node) = held.holders.remove(key) {
                held.count(&node, nodes, -1);
            }
            if held.holders.is_empty() {
                self.terms.remove(&term_key);
            }
        }
        !bound.anti_terms.is_empty()
    }

    /// Nodes' labels changed, or a node pods were bound to appeared or went.
    pub(super) fn nodes_changed(&mut self) {
        self.stale = true;
    }

    /// Whether any bound pod holds a term.
    pub(super) fn any(&self) -> bool {
        !self.terms.is_empty()
    }

    /// The terms that select a pod in `namespace` with `labels`, as the filters read them.
    pub(super) fn against<'a>(
        &'a mut self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        nodes: &BTreeMap<String, NodeInfo>,
    ) -> Vec<AffinityDomains<'a>> {
        if std::mem::take(&mut self.stale) {
            for held in self.terms.values_mut() {
                held.domains.clear();
                for node in held.holders.values() {
                    count(&mut held.domains, &held.term.topology_key, node, nodes, 1);
                }
            }
        }
        self.terms
            .values()
            .filter(|held| selects(&held.term, &held.namespace, namespace, labels))
            .map(|held| AffinityDomains {
                key: held.term.topology_key.clone(),
                domains: &held.domains,
                anti: true,
                first_of_its_kind: false,
            })
            .collect()
    }
}

impl Held {
    fn count(&mut self, node: &str, nodes: &BTreeMap<String, NodeInfo>, sign: isize) {
        count(&mut self.domains, &self.term.topology_key, node, nodes, sign);
    }
}

/// Counts a holder on `node` in (`sign` 1) or out of (-1) its domain of `key` in `domains`; a node
/// not seen, or without the label, is in no domain.
fn count(
    domains: &mut HashMap<String, usize>,
    key: &str,
    node: &str,
    nodes: &BTreeMap<String, NodeInfo>,
    sign: isize,
) {
    let Some(domain) = nodes.get(node).and_then(|n| n.labels.get(key)) else {
        return;
    };
    let holders = domains.entry(domain.clone()).or_default();
    *holders = holders.saturating_add_signed(sign);
}

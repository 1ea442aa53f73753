//! The topology domains that hold the pods a required pod (anti-)affinity term selects, kept as
//! pods are bound and unbound, so that a pod's term is not answered by looking at every pod.
//!
//! An entry is made the first time a term is asked about (from every bound pod the term
//! selects) and then counted up and down as pods come and go. When a node's labels change, or a
//! node that pods are bound to appears or goes, every entry is dropped: the domains of pods
//! already bound changed.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::PodAffinityTerm;

use super::filter::{Bound, NodeInfo, term_selects};

/// One term's domains, for pods of one namespace.
struct Entry {
    term: PodAffinityTerm,
    namespace: String,
    /// Selected pods per domain.
    pods: HashMap<String, usize>,
    /// Selected pods, in any domain or none.
    selected: usize,
}

/// A term of a pod's namespace, as the entries' key: the namespace and the term in JSON.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct TermKey(String, String);

/// The entries, by namespace and term.
#[derive(Default)]
pub(super) struct TermDomains {
    entries: HashMap<TermKey, Entry>,
}

/// An entry made while the pods it counts were borrowed, to be [`TermDomains::insert`]ed.
pub(super) struct Fresh(Entry);

/// A term's domains as the filters read them.
pub(super) struct Domains<'a> {
    /// Selected pods per domain.
    pub(super) pods: &'a HashMap<String, usize>,
    /// Whether any pod is selected at all.
    pub(super) any: bool,
}

impl TermDomains {
    /// Whether the term of `key` has its entry.
    pub(super) fn has(&self, key: &TermKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The key of `term` of a pod in `namespace`, made once per pod for every lookup.
    pub(super) fn key(term: &PodAffinityTerm, namespace: &str) -> TermKey {
        TermKey(
            namespace.to_owned(),
            serde_json::to_string(term).unwrap_or_default(),
        )
    }

    /// A new entry for `term` of a pod in `namespace`, from the bound pods it selects.
    pub(super) fn fresh(
        term: &PodAffinityTerm,
        namespace: &str,
        nodes: &BTreeMap<String, NodeInfo>,
        selected: Vec<&Bound>,
    ) -> Fresh {
        let mut entry = Entry {
            term: term.clone(),
            namespace: namespace.to_owned(),
            pods: HashMap::new(),
            selected: 0,
        };
        for bound in selected {
            entry.count(bound, nodes, 1);
        }
        Fresh(entry)
    }

    /// Keeps a [`fresh`](Self::fresh) entry.
    pub(super) fn insert(&mut self, key: TermKey, Fresh(entry): Fresh) {
        self.entries.insert(key, entry);
    }

    /// The domains of a term [`insert`](Self::insert)ed before.
    pub(super) fn get(&self, key: &TermKey) -> Option<Domains<'_>> {
        let entry = self.entries.get(key)?;
        Some(Domains {
            pods: &entry.pods,
            any: entry.selected > 0,
        })
    }

    /// A pod was bound (`sign` 1) or unbound (-1).
    pub(super) fn count(&mut self, bound: &Bound, nodes: &BTreeMap<String, NodeInfo>, sign: isize) {
        for entry in self.entries.values_mut() {
            if term_selects(&entry.term, &entry.namespace, bound) {
                entry.count(bound, nodes, sign);
            }
        }
    }

    /// The domains of bound pods changed: every entry is made again when next asked for.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}

impl Entry {
    fn count(&mut self, bound: &Bound, nodes: &BTreeMap<String, NodeInfo>, sign: isize) {
        self.selected = self.selected.saturating_add_signed(sign);
        let domain = nodes
            .get(&bound.node)
            .and_then(|node| node.labels.get(&self.term.topology_key));
        if let Some(domain) = domain {
            let pods = self.pods.entry(domain.clone()).or_default();
            *pods = pods.saturating_add_signed(sign);
        }
    }
}

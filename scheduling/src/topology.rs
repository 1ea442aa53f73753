//! Topology: domains, the pod groups counted per domain, and the rules pods must keep.
//!
//! A *group* counts, per domain of one topology key, the pods a selector picks in some namespaces
//! (spread constraints and affinity terms), or, for an anti-affinity term, the pods that carry it
//! (an *inverse* group: pods the term selects must stay out of those domains, the symmetry
//! kube-scheduler enforces). Groups are built once per solve from every pending and existing pod,
//! deduplicated, and counted from the pods already bound.
//!
//! Domains of a key are the values the NodePools' instance types and the existing nodes can have;
//! hostname domains are nodes themselves, so their counts live with each node or claim.
//! A [`Check`] is one rule of one scheduling class against one group: spread (`count + self − min
//! ≤ maxSkew`, with `min` over the eligible domains, taken as zero below `minDomains` and always for
//! hostnames, where a new node is a new empty domain), affinity (a domain with a count, or any
//! domain when nothing matches yet and the pod selects itself), or anti-affinity (a domain with
//! none).

use std::collections::{BTreeMap, HashMap};

use joist_messages::{labels::HOSTNAME, model::requirements::Requirements};
use k8s_openapi::api::core::v1::Taint;

use crate::{
    catalog::PoolPlan,
    input::ExistingNode,
    pod::Constraints,
    terms::{AffinityTerm, Namespaces, selects},
};

/// How a group counts and how undecided claims are recorded in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum GroupKind {
    /// Pods the selector picks; recorded once the domain is known.
    Selected,
    /// Pods the selector picks, for anti-affinity; recorded in every domain a claim may still take.
    AntiSelected,
    /// Pods that carry the anti-affinity term (the selector names whom they repel).
    Carriers,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupId {
    kind: GroupKind,
    key: usize,
    selector: Option<Requirements>,
    namespaces: Namespaces,
}

/// Counts per domain for one selector (see the module docs).
#[derive(Debug)]
pub(crate) struct Group {
    /// How it counts.
    pub kind: GroupKind,
    /// Position in [`Topology::keys`].
    pub key: usize,
    selector: Option<Requirements>,
    namespaces: Namespaces,
    /// Per domain of the key (unused for hostname keys).
    pub counts: Vec<u32>,
    /// The pods recorded in any domain.
    pub recorded: u32,
}

/// The domains of one topology key.
#[derive(Debug)]
pub(crate) struct TopologyKey {
    /// The label key.
    pub name: String,
    /// True for `kubernetes.io/hostname`.
    pub hostname: bool,
    /// Domain values, numbered by position.
    pub domains: Vec<String>,
    index: HashMap<String, u32>,
    /// Per domain, the taint sets (by position in [`Topology::taint_sets`]) of capacity there.
    sources: Vec<Vec<usize>>,
}

impl TopologyKey {
    /// The number of `value`, if it is a domain.
    pub(crate) fn domain(&self, value: &str) -> Option<u32> {
        self.index.get(value).copied()
    }

    fn add(&mut self, value: &str, source: usize) {
        let next = self.domains.len() as u32;
        let d = *self.index.entry(value.to_string()).or_insert(next);
        if d == next {
            self.domains.push(value.to_string());
            self.sources.push(Vec::new());
        }
        let sources = &mut self.sources[d as usize];
        if !sources.contains(&source) {
            sources.push(source);
        }
    }
}

/// What a check demands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rule {
    /// Topology spread.
    Spread {
        /// `maxSkew`.
        max_skew: u32,
        /// `minDomains`.
        min_domains: Option<u32>,
        /// Domains that count towards the minimum.
        eligible: Vec<u32>,
    },
    /// Pod affinity.
    Affinity,
    /// Pod anti-affinity (own term, or the symmetric rule of another pod's term).
    Anti,
}

/// One rule of a scheduling class against one group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Check {
    /// Position in [`Topology::groups`].
    pub group: usize,
    /// The rule.
    pub rule: Rule,
    /// True when the class's own pods are counted by the group.
    pub self_selects: bool,
}

/// Where a node or claim stands on a check's topology key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Domain {
    /// In this domain.
    Value(u32),
    /// A node without the label.
    Absent,
    /// A hostname domain holding this many counted pods.
    Host(u32),
}

/// All groups and domains of one solve (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Topology {
    /// Topology keys.
    pub keys: Vec<TopologyKey>,
    key_index: HashMap<String, usize>,
    /// Groups.
    pub groups: Vec<Group>,
    group_index: HashMap<GroupId, usize>,
    /// Taints of each capacity source: NodePools first, then existing nodes.
    taint_sets: Vec<Vec<Taint>>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

/// Every group's counts at one moment: per domain, and in all.
#[derive(Debug)]
pub(crate) struct Counts(Vec<(Vec<u32>, u32)>);

/// The affinity terms a class enforces: required ones plus preferred ones not yet relaxed.
pub(crate) fn enforced<'a>(
    required: &'a [AffinityTerm],
    preferred: &'a [(i32, AffinityTerm)],
) -> impl Iterator<Item = &'a AffinityTerm> {
    required.iter().chain(preferred.iter().map(|(_, t)| t))
}

impl Topology {
    /// Builds the groups of `pending` pods' terms and existing pods' anti-affinity, and the domains
    /// of their keys from `pools` and `nodes`.
    pub(crate) fn new<'a>(
        pending: impl Iterator<Item = &'a Constraints>,
        existing: impl Iterator<Item = &'a Constraints>,
        pools: &[PoolPlan],
        catalog: &[std::sync::Arc<joist_messages::model::instance_type::InstanceType>],
        nodes: &[ExistingNode],
        namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Self {
        let mut topology = Topology {
            namespaces: namespaces.clone(),
            ..Topology::default()
        };
        for c in pending {
            for s in &c.spread {
                let key = topology.key(&s.topology_key);
                topology.group(
                    GroupKind::Selected,
                    key,
                    &s.selector,
                    &Namespaces::only(&c.namespace),
                );
            }
            for t in enforced(&c.pod_affinity, &c.preferred_pod_affinity) {
                let key = topology.key(&t.topology_key);
                topology.group(GroupKind::Selected, key, &t.selector, &t.namespaces);
            }
            for t in enforced(&c.pod_anti_affinity, &c.preferred_pod_anti_affinity) {
                let key = topology.key(&t.topology_key);
                topology.group(GroupKind::AntiSelected, key, &t.selector, &t.namespaces);
                topology.group(GroupKind::Carriers, key, &t.selector, &t.namespaces);
            }
        }
        for c in existing {
            for t in &c.pod_anti_affinity {
                let key = topology.key(&t.topology_key);
                topology.group(GroupKind::Carriers, key, &t.selector, &t.namespaces);
            }
        }
        topology.taint_sets = pools
            .iter()
            .map(|p| p.taints.clone())
            .chain(nodes.iter().map(|n| n.taints.clone()))
            .collect();
        for key in &mut topology.keys {
            if key.hostname {
                continue;
            }
            for (source, pool) in pools.iter().enumerate() {
                for value in pool.domains(&key.name, catalog) {
                    key.add(&value, source);
                }
            }
            for (i, node) in nodes.iter().enumerate() {
                if let Some(value) = node.labels.get(&key.name) {
                    key.add(value, pools.len() + i);
                }
            }
        }
        for group in &mut topology.groups {
            group.counts = vec![0; topology.keys[group.key].domains.len()];
        }
        topology
    }

    fn key(&mut self, name: &str) -> usize {
        if let Some(&k) = self.key_index.get(name) {
            return k;
        }
        self.keys.push(TopologyKey {
            name: name.to_string(),
            hostname: name == HOSTNAME,
            domains: Vec::new(),
            index: HashMap::new(),
            sources: Vec::new(),
        });
        self.key_index.insert(name.to_string(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    fn group(
        &mut self,
        kind: GroupKind,
        key: usize,
        selector: &Option<Requirements>,
        namespaces: &Namespaces,
    ) -> usize {
        let id = GroupId {
            kind,
            key,
            selector: selector.clone(),
            namespaces: namespaces.clone(),
        };
        if let Some(&g) = self.group_index.get(&id) {
            return g;
        }
        self.groups.push(Group {
            kind,
            key,
            selector: id.selector.clone(),
            namespaces: id.namespaces.clone(),
            counts: Vec::new(),
            recorded: 0,
        });
        self.group_index.insert(id, self.groups.len() - 1);
        self.groups.len() - 1
    }

    fn lookup(
        &self,
        kind: GroupKind,
        key: &str,
        selector: &Option<Requirements>,
        namespaces: &Namespaces,
    ) -> Option<usize> {
        let id = GroupId {
            kind,
            key: *self.key_index.get(key)?,
            selector: selector.clone(),
            namespaces: namespaces.clone(),
        };
        self.group_index.get(&id).copied()
    }

    fn picks(&self, group: &Group, c: &Constraints) -> bool {
        group
            .namespaces
            .contains(&c.namespace, self.namespaces.get(&c.namespace))
            && selects(group.selector.as_ref(), &c.labels)
    }

    /// The groups a pod with constraints `c` is counted in.
    pub(crate) fn counted_in(&self, c: &Constraints) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.kind != GroupKind::Carriers && self.picks(g, c))
            .map(|(i, _)| i)
            .collect();
        for t in enforced(&c.pod_anti_affinity, &c.preferred_pod_anti_affinity) {
            if let Some(g) = self.lookup(GroupKind::Carriers, &t.topology_key, &t.selector, &t.namespaces) {
                out.push(g);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The checks a class with constraints `c` and enforced node requirements `node_reqs` must
    /// pass. Terms whose group was not built (which `new` prevents) are skipped.
    pub(crate) fn checks(&self, c: &Constraints, node_reqs: &Requirements) -> Vec<Check> {
        let mut out = Vec::new();
        let mut push = |group: Option<usize>, rule: Rule| {
            if let Some(group) = group {
                let self_selects = self.picks(&self.groups[group], c);
                out.push(Check {
                    group,
                    rule,
                    self_selects,
                });
            }
        };
        for s in &c.spread {
            let group = self.lookup(
                GroupKind::Selected,
                &s.topology_key,
                &s.selector,
                &Namespaces::only(&c.namespace),
            );
            let eligible = group.map_or_else(Vec::new, |g| {
                let key = &self.keys[self.groups[g].key];
                (0..key.domains.len() as u32)
                    .filter(|&d| {
                        let value = &key.domains[d as usize];
                        let affinity_ok =
                            !s.honor_node_affinity || node_reqs.get(&key.name).is_none_or(|r| r.has(value));
                        let taints_ok = !s.honor_node_taints
                            || key.sources[d as usize].iter().any(|&src| {
                                self.taint_sets[src]
                                    .iter()
                                    .filter(|t| t.effect != crate::taints::PREFER_NO_SCHEDULE)
                                    .all(|t| c.tolerations.iter().any(|tol| tol.tolerates(t)))
                            });
                        affinity_ok && taints_ok
                    })
                    .collect()
            });
            push(
                group,
                Rule::Spread {
                    max_skew: s.max_skew,
                    min_domains: s.min_domains,
                    eligible,
                },
            );
        }
        for t in enforced(&c.pod_affinity, &c.preferred_pod_affinity) {
            push(
                self.lookup(GroupKind::Selected, &t.topology_key, &t.selector, &t.namespaces),
                Rule::Affinity,
            );
        }
        for t in enforced(&c.pod_anti_affinity, &c.preferred_pod_anti_affinity) {
            push(
                self.lookup(
                    GroupKind::AntiSelected,
                    &t.topology_key,
                    &t.selector,
                    &t.namespaces,
                ),
                Rule::Anti,
            );
        }
        let carriers: Vec<usize> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.kind == GroupKind::Carriers && self.picks(g, c))
            .map(|(i, _)| i)
            .collect();
        for g in carriers {
            push(Some(g), Rule::Anti);
        }
        out
    }

    /// The smallest count over a spread check's eligible domains (zero below `minDomains`).
    fn min_count(&self, group: &Group, min_domains: Option<u32>, eligible: &[u32]) -> u32 {
        if min_domains.is_some_and(|m| (eligible.len() as u32) < m) {
            return 0;
        }
        eligible
            .iter()
            .map(|&d| group.counts[d as usize])
            .min()
            .unwrap_or(0)
    }

    /// True when `check` allows a pod in `domain`.
    pub(crate) fn allows(&self, check: &Check, domain: Domain) -> bool {
        let group = &self.groups[check.group];
        let own = u32::from(check.self_selects);
        match (&check.rule, domain) {
            (Rule::Spread { max_skew, .. }, Domain::Host(count)) => count + own <= *max_skew,
            (
                Rule::Spread {
                    max_skew,
                    min_domains,
                    eligible,
                },
                Domain::Value(d),
            ) => group.counts[d as usize] + own <= self.min_count(group, *min_domains, eligible) + max_skew,
            (Rule::Spread { .. } | Rule::Affinity, Domain::Absent) => false,
            (Rule::Affinity, Domain::Host(count)) => count > 0 || (group.recorded == 0 && check.self_selects),
            (Rule::Affinity, Domain::Value(d)) => {
                group.counts[d as usize] > 0 || (group.recorded == 0 && check.self_selects)
            }
            (Rule::Anti, Domain::Host(count)) => count == 0,
            (Rule::Anti, Domain::Value(d)) => group.counts[d as usize] == 0,
            (Rule::Anti, Domain::Absent) => true,
        }
    }

    /// True when a failed `check` can never pass on the same node or claim again (counts only
    /// grow, and hostname spread compares against a minimum of zero).
    pub(crate) fn failure_is_permanent(check: &Check, domain: Domain) -> bool {
        matches!(
            (&check.rule, domain),
            (Rule::Anti, _) | (_, Domain::Absent) | (Rule::Spread { .. }, Domain::Host(_))
        )
    }

    /// The count a spread check compares in `domain`, for ordering choices (lower first).
    pub(crate) fn preference(&self, check: &Check, d: u32) -> (u32, u32) {
        let count = self.groups[check.group].counts[d as usize];
        match check.rule {
            Rule::Spread { .. } | Rule::Anti => (count, d),
            Rule::Affinity => (u32::from(count == 0), d),
        }
    }

    /// Counts one pod in domain `d` of `group`.
    pub(crate) fn record(&mut self, group: usize, d: u32) {
        let g = &mut self.groups[group];
        g.counts[d as usize] += 1;
        g.recorded += 1;
    }

    /// Counts one pod in a hostname group (the node or claim keeps the per-host count).
    pub(crate) fn record_host(&mut self, group: usize) {
        self.groups[group].recorded += 1;
    }

    /// Takes back one pod counted in domain `d` of `group`.
    pub(crate) fn unrecord(&mut self, group: usize, d: u32) {
        let g = &mut self.groups[group];
        g.counts[d as usize] -= 1;
        g.recorded -= 1;
    }

    /// Takes back `n` pods counted in a hostname group.
    pub(crate) fn unrecord_host(&mut self, group: usize, n: u32) {
        self.groups[group].recorded -= n;
    }

    /// Every group's counts, to [`Self::restore`] later.
    pub(crate) fn counts(&self) -> Counts {
        Counts(
            self.groups
                .iter()
                .map(|g| (g.counts.clone(), g.recorded))
                .collect(),
        )
    }

    /// Puts back counts taken by [`Self::counts`].
    pub(crate) fn restore(&mut self, counts: &Counts) {
        for (group, (per_domain, recorded)) in self.groups.iter_mut().zip(&counts.0) {
            group.counts.copy_from_slice(per_domain);
            group.recorded = *recorded;
        }
    }

    /// A check, described for people.
    pub(crate) fn describe(&self, check: &Check) -> String {
        let group = &self.groups[check.group];
        let key = &self.keys[group.key].name;
        let selector = group
            .selector
            .as_ref()
            .map_or_else(|| "no pods".to_string(), |s| format!("pods {{{s}}}"));
        match (&check.rule, group.kind) {
            (Rule::Spread { max_skew, .. }, _) => {
                format!("topology spread on {key} (maxSkew {max_skew}) over {selector}")
            }
            (Rule::Affinity, _) => format!("pod affinity on {key} to {selector}"),
            (Rule::Anti, GroupKind::Carriers) => {
                format!("anti-affinity of pods already placed, on {key} against {selector}")
            }
            (Rule::Anti, _) => format!("pod anti-affinity on {key} against {selector}"),
        }
    }
}

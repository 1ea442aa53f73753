//! Scheduling classes: pods that differ only in size share one, prepared once.
//!
//! A class holds the constraints as the solver enforces them at one relaxation level: the first
//! required node-affinity term narrowed by the heaviest preferred one and by the first of its
//! volumes' topology alternatives, every preferred pod
//! (anti-)affinity term and `ScheduleAnyway` spread treated as required. [`relax`] removes one
//! preference in Karpenter's order; each relaxed form is its own class, memoized.

use joist_messages::model::requirements::Requirements;

use crate::{
    pod::Constraints,
    taints::{PREFER_NO_SCHEDULE, Toleration},
    topology::{Check, Topology},
};

/// One scheduling class (see the module docs).
#[derive(Debug)]
pub(crate) struct Class {
    /// The constraints at this relaxation level.
    pub constraints: Constraints,
    /// The node requirements enforced now.
    pub node_reqs: Requirements,
    /// Topology rules.
    pub checks: Vec<Check>,
    /// The non-hostname topology keys the checks use (positions in `Topology::keys`).
    pub keys: Vec<usize>,
    /// The groups its pods are counted in.
    pub counted_in: Vec<usize>,
    /// The next relaxation level, once computed (`Some(None)`: nothing left to relax).
    pub relaxed: Option<Option<usize>>,
    /// Nodes and claims (by position, as a bit set) that rejected this class for good.
    pub rejected: Vec<u64>,
}

impl Class {
    /// Prepares `constraints` against `topology`.
    pub(crate) fn new(constraints: Constraints, topology: &Topology) -> Self {
        let mut node_reqs = constraints.node_requirements.first().cloned().unwrap_or_default();
        if let Some((_, preferred)) = constraints.preferred_node_requirements.first() {
            node_reqs.add_all(preferred);
        }
        let checks = topology.checks(&constraints, &node_reqs);
        // The volumes narrow the node after the spread's domains were chosen by node affinity
        // alone, as kube-scheduler counts them.
        if let Some(volumes) = constraints.volume_requirements.first() {
            node_reqs.add_all(volumes);
        }
        let mut keys: Vec<usize> = checks
            .iter()
            .map(|c| topology.groups[c.group].key)
            .filter(|&k| !topology.keys[k].hostname)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        Class {
            counted_in: topology.counted_in(&constraints),
            constraints,
            node_reqs,
            checks,
            keys,
            relaxed: None,
            rejected: Vec::new(),
        }
    }
}

/// Drops every preference (Karpenter's `PREFERENCE_POLICY=Ignore`).
pub(crate) fn without_preferences(mut c: Constraints) -> Constraints {
    c.preferred_node_requirements.clear();
    c.preferred_pod_affinity.clear();
    c.preferred_pod_anti_affinity.clear();
    c.spread.retain(|s| s.hard);
    c
}

/// The next relaxation of `c`, in Karpenter's order: try the next of several volume topology
/// alternatives (Karpenter tries each in turn), drop the first of several required
/// node-affinity terms, then the heaviest preferred pod affinity, then anti-affinity, then the
/// heaviest preferred node affinity, then a `ScheduleAnyway` spread constraint, and last tolerate
/// `PreferNoSchedule` taints when some NodePool has one. `None` when nothing is left.
pub(crate) fn relax(c: &Constraints, prefer_no_schedule_pools: bool) -> Option<Constraints> {
    let mut out = c.clone();
    if out.volume_requirements.len() > 1 {
        out.volume_requirements.remove(0);
    } else if out.node_requirements.len() > 1 {
        out.node_requirements.remove(0);
    } else if !out.preferred_pod_affinity.is_empty() {
        out.preferred_pod_affinity.remove(0);
    } else if !out.preferred_pod_anti_affinity.is_empty() {
        out.preferred_pod_anti_affinity.remove(0);
    } else if !out.preferred_node_requirements.is_empty() {
        out.preferred_node_requirements.remove(0);
    } else if let Some(i) = out.spread.iter().position(|s| !s.hard) {
        out.spread.remove(i);
    } else {
        let toleration = Toleration::all_with_effect(PREFER_NO_SCHEDULE);
        if !prefer_no_schedule_pools || out.tolerations.contains(&toleration) {
            return None;
        }
        out.tolerations.push(toleration);
        out.tolerations.sort();
    }
    Some(out)
}

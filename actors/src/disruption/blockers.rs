//! Why a node a disruption pass judged stays, in the vocabulary Karpenter's disruption metrics
//! proposal gives the `blocker` label (kubernetes-sigs/karpenter #3288): the reason on
//! `karpenter_voluntary_disruption_candidates_remaining{nodepool,blocker}`, on the
//! `Unconsolidatable` and `DisruptionBlocked` events.
//!
//! Only the blockers Joist can produce are here: not `timeout` (its searches run to the end),
//! `static_replica_excess` or `static_node_limit` (a static NodePool's nodes are never
//! candidates), nor the health gates (none stops consolidation). A node the pass did not get to judge (drift took
//! the pass, or a command before it took the room its refusal may only reflect) has no blocker
//! and is not counted; neither is a node no graceful method may take at all (do-not-disrupt, a
//! PodDisruptionBudget), which is no candidate, as in Karpenter.

use std::{collections::BTreeMap, fmt};

use joist_scheduling::consolidation::Refusal;

/// Why a candidate stays (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Blocker {
    /// Its NodePool's disruption budget has no room left for it.
    Budget,
    /// Its NodePool does not consolidate it: `consolidateAfter: Never`, or `WhenEmpty` with pods
    /// on it, or spot-to-spot consolidation with its feature gate off.
    ConsolidationDisabled,
    /// A CapacityBuffer's virtual pods hold room on it.
    BufferPods,
    /// It changed within its NodePool's `consolidateAfter`, or it waits while pods leave other
    /// nodes of its NodePool.
    NotConsolidatable,
    /// Its pods would not all fit elsewhere, even on one new node.
    NoFeasibleSchedule,
    /// The cheapest replacement would cost as much or more (or too few cheaper spot types).
    SameOrMoreExpensiveReplacement,
    /// The cheaper instance types would not meet its requirements' `minValues`.
    MinValues,
    /// The `Balanced` score refused the move: it disrupts more than it saves.
    Score,
    /// A provisioning pass counted on it for pending pods.
    Nominated,
    /// A command took it, and the cluster changed before the command's validation.
    ValidationChurn,
    /// A command took it, and the budgets no longer allowed the command at its validation.
    ValidationBudget,
}

impl Blocker {
    /// Every blocker, in label order.
    pub const ALL: [Blocker; 11] = [
        Blocker::Budget,
        Blocker::ConsolidationDisabled,
        Blocker::BufferPods,
        Blocker::NotConsolidatable,
        Blocker::NoFeasibleSchedule,
        Blocker::SameOrMoreExpensiveReplacement,
        Blocker::MinValues,
        Blocker::Score,
        Blocker::Nominated,
        Blocker::ValidationChurn,
        Blocker::ValidationBudget,
    ];

    /// The `blocker` label's value.
    pub fn label(self) -> &'static str {
        match self {
            Blocker::Budget => "budget",
            Blocker::ConsolidationDisabled => "consolidation_disabled",
            Blocker::BufferPods => "buffer_pods",
            Blocker::NotConsolidatable => "not_consolidatable",
            Blocker::NoFeasibleSchedule => "no_feasible_schedule",
            Blocker::SameOrMoreExpensiveReplacement => "same_or_more_expensive_replacement",
            Blocker::MinValues => "min_values",
            Blocker::Score => "score",
            Blocker::Nominated => "nominated",
            Blocker::ValidationChurn => "validation_churn",
            Blocker::ValidationBudget => "validation_budget",
        }
    }

    /// What it means, in a few words (`joist explain`).
    pub fn describe(self) -> &'static str {
        match self {
            Blocker::Budget => "its NodePool's disruption budget has no room left for it",
            Blocker::ConsolidationDisabled => {
                "its NodePool does not consolidate it (consolidateAfter Never, WhenEmpty with pods, or spot-to-spot off)"
            }
            Blocker::BufferPods => "a CapacityBuffer's pods hold room on it",
            Blocker::NotConsolidatable => {
                "it changed within the NodePool's consolidateAfter, or it waits while pods leave other nodes of its NodePool"
            }
            Blocker::NoFeasibleSchedule => "its pods would not all fit elsewhere, even on one new node",
            Blocker::SameOrMoreExpensiveReplacement => "the cheapest replacement would not be cheaper",
            Blocker::MinValues => "the cheaper instance types would not meet its requirements' minValues",
            Blocker::Score => "the Balanced score refused the move: it disrupts more than it saves",
            Blocker::Nominated => "a provisioning pass counted on it for pending pods",
            Blocker::ValidationChurn => "the cluster changed before the decision to disrupt it was validated",
            Blocker::ValidationBudget => {
                "the budgets no longer allowed the decision to disrupt it when it was validated"
            }
        }
    }

    /// The blocker behind a consolidation simulation's refusal.
    pub fn of_refusal(refusal: &Refusal) -> Self {
        match refusal {
            Refusal::PodDoesNotFit { .. } | Refusal::MoreThanOneNode { .. } => Blocker::NoFeasibleSchedule,
            Refusal::NotCheaper { .. } => Blocker::SameOrMoreExpensiveReplacement,
            Refusal::MinValues { .. } => Blocker::MinValues,
            Refusal::SpotToSpot { enabled: false, .. } => Blocker::ConsolidationDisabled,
            Refusal::SpotToSpot { enabled: true, .. } => Blocker::SameOrMoreExpensiveReplacement,
        }
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The blocker of each candidate a pass judged, by NodeClaim name, with its NodePool. A later
/// verdict on the same candidate (single-node consolidation after the multi-node search) replaces
/// an earlier one.
#[derive(Debug, Default)]
pub struct Verdicts(BTreeMap<String, (String, Blocker)>);

impl Verdicts {
    /// Records that the node of the NodeClaim `claim`, of the NodePool `pool`, stays for
    /// `blocker`.
    pub fn hold(&mut self, claim: String, pool: String, blocker: Blocker) {
        self.0.insert(claim, (pool, blocker));
    }

    /// Takes in `later`'s verdicts, which replace these.
    pub fn extend(&mut self, later: Verdicts) {
        self.0.extend(later.0);
    }

    /// The blocker that keeps the node of the NodeClaim `claim`, if the pass judged it so.
    pub fn of(&self, claim: &str) -> Option<Blocker> {
        self.0.get(claim).map(|(_, blocker)| *blocker)
    }

    /// Forgets the verdict on the NodeClaim `claim` (a command took it after all).
    pub fn release(&mut self, claim: &str) {
        self.0.remove(claim);
    }

    /// How many nodes each NodePool keeps for each blocker.
    pub fn counts(&self) -> BTreeMap<&str, BTreeMap<Blocker, i64>> {
        let mut counts: BTreeMap<&str, BTreeMap<Blocker, i64>> = BTreeMap::new();
        for (pool, blocker) in self.0.values() {
            *counts.entry(pool).or_default().entry(*blocker).or_default() += 1;
        }
        counts
    }
}

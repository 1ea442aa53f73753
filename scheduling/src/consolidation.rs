//! The consolidation search (DESIGN.md §3): can these nodes go, and what would replace them?
//!
//! As Karpenter decides it: the candidates' reschedulable pods (the caller leaves out DaemonSet
//! pods and pods that are finishing) are simulated with the provisioning solver, every constraint
//! it knows included, against the cluster without the candidates plus whatever the NodePools can
//! launch. When every pod fits on the remaining nodes, the candidates can be **deleted**. When they
//! need exactly one new node that is strictly cheaper than the candidates together, they can be
//! **replaced** by it, its instance types narrowed to the ones cheaper than what they replace.
//! Consolidation never turns nodes into more nodes: needing two new nodes is a refusal. Spot nodes
//! are replaced by spot nodes only with [`Settings::spot_to_spot`] (Karpenter's
//! `SpotToSpotConsolidation` gate), and then only when at least [`SPOT_TO_SPOT_MIN_TYPES`] cheaper
//! spot types exist, of which the cheapest that many are kept (more when the replacement's
//! `minValues` need them), so one spot node is not replaced over and over. Under the `Strict`
//! minValues policy, the cheaper types must still meet the replacement's `minValues`, as
//! Karpenter's do.
//!
//! A [`Search`] borrows the caller's [`Input`] (the base, built once per pass) and its candidates,
//! sets the solver up over them once, and simulates each set of candidates as a change to that
//! set-up: their nodes left out, their pods placed, every change undone after. So the cost of a
//! question grows with the pods it moves, not with the cluster. Failures are values
//! ([`Refusal`]), written for people, as Karpenter's `Unconsolidatable` events are.

use std::{collections::BTreeSet, fmt, sync::Arc};

use joist_messages::{
    labels::{CAPACITY_TYPE, ZONE},
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        requirements::{Operator, Requirement, Requirements},
        resources::Resources,
    },
};

use crate::{
    input::{ExistingNode, Input, MinValuesPolicy},
    pod::PodInfo,
    solution::{NewClaim, Solution},
    solver::Simulator,
};

/// Spot replacements need at least this many cheaper spot types, and keep that many.
pub const SPOT_TO_SPOT_MIN_TYPES: usize = 15;

/// The most candidates a multi-node search looks at when the first two cannot go together
/// (Karpenter's limit for every multi-node search).
pub const PAST_A_PAIR: usize = 100;

/// A node consolidation may remove.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its position in `Input::nodes`.
    pub node: usize,
    /// What it costs per hour.
    pub price: f64,
    /// Its capacity type.
    pub capacity_type: CapacityType,
    /// The pods that must find another place.
    pub pods: Vec<Arc<PodInfo>>,
    /// What it holds of its NodePool's limits (`None` for a node of no NodePool).
    pub held: Option<Held>,
}

/// What a node holds of its NodePool's limits: its capacity and one node. A simulation of the node
/// leaving gives them back to the pool, as Karpenter counts only nodes not marked for deletion, so
/// a pool at its limits can still replace a node (a drift, a cheaper type).
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The NodePool's name.
    pub pool: String,
    /// The node's capacity.
    pub capacity: Resources,
}

/// What consolidation may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// Karpenter's `SpotToSpotConsolidation` feature gate.
    pub spot_to_spot: bool,
}

/// A way to remove the candidates.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Every pod fits on the remaining nodes.
    Delete,
    /// Every pod fits on the remaining nodes and one new, cheaper node.
    Replace(Replacement),
    /// Every pod fits on the remaining nodes and these new nodes, whatever they cost (how drifted
    /// nodes are replaced: they must go, cheaper or not).
    Relaunch(Vec<NewClaim>),
}

/// The node that replaces the candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct Replacement {
    /// The NodeClaim to launch, instance types cheaper than the candidates only.
    pub claim: NewClaim,
    /// The cheapest price it may launch at, per hour.
    pub price: f64,
}

impl Decision {
    /// The hourly cost of what the decision launches.
    pub fn launch_price(&self) -> f64 {
        match self {
            Decision::Delete => 0.0,
            Decision::Replace(replacement) => replacement.price,
            Decision::Relaunch(claims) => claims.iter().map(|c| c.price).sum(),
        }
    }
}

/// Why the candidates cannot go.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A pod fits nowhere, not even on new capacity.
    PodDoesNotFit {
        /// The pod's name.
        pod: String,
        /// Why, per NodePool.
        reason: String,
    },
    /// The pods need more than one new node.
    MoreThanOneNode {
        /// How many.
        nodes: usize,
    },
    /// The cheapest replacement is not cheaper.
    NotCheaper {
        /// The replacement's price.
        replacement: f64,
        /// The candidates' price.
        current: f64,
    },
    /// The cheaper instance types no longer meet a `minValues` of the replacement's requirements
    /// (with the `Strict` policy).
    MinValues {
        /// The requirement's key.
        key: String,
        /// The values it needs.
        needed: u32,
        /// The values the cheaper types have.
        found: usize,
    },
    /// Spot would be replaced by spot, which the feature gate forbids or too few types allow.
    SpotToSpot {
        /// How many cheaper spot types there are.
        cheaper_types: usize,
        /// Whether the gate is on.
        enabled: bool,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::PodDoesNotFit { pod, reason } => write!(f, "pod {pod} would not fit: {reason}"),
            Refusal::MoreThanOneNode { nodes } => {
                write!(
                    f,
                    "its pods would need {nodes} new nodes, and consolidation launches at most one"
                )
            }
            Refusal::NotCheaper { replacement, current } => write!(
                f,
                "the cheapest replacement (${replacement:.4}/h) is not cheaper than ${current:.4}/h"
            ),
            Refusal::MinValues { key, needed, found } => write!(
                f,
                "the cheaper instance types offer {found} of the {needed} values of {key} its minValues needs"
            ),
            Refusal::SpotToSpot { enabled: false, .. } => {
                f.write_str("spot-to-spot consolidation is disabled (feature gate SpotToSpotConsolidation)")
            }
            Refusal::SpotToSpot { cheaper_types, .. } => write!(
                f,
                "spot-to-spot replacement needs {SPOT_TO_SPOT_MIN_TYPES} cheaper spot types, found {cheaper_types}"
            ),
        }
    }
}

/// The consolidation search over one cluster and its candidates: set up once (see
/// [`Simulator`]), then asked about any set of the candidates.
pub struct Search<'a> {
    candidates: &'a [Candidate],
    /// Where each candidate's pods start among the simulator's pods.
    first_pod: Vec<usize>,
    simulator: Simulator<'a>,
    base: &'a Input,
    settings: Settings,
}

impl<'a> Search<'a> {
    /// Sets the search up over `base` (its `pods` must be empty) and `candidates` (their `node`s
    /// positions into `base.nodes`, distinct).
    pub fn new(base: &'a Input, candidates: &'a [Candidate], settings: Settings) -> Self {
        let mut first_pod = Vec::with_capacity(candidates.len());
        let mut pending = Vec::new();
        for candidate in candidates {
            first_pod.push(pending.len());
            pending.extend(candidate.pods.iter().map(|pod| &**pod));
        }
        Search {
            candidates,
            first_pod,
            simulator: Simulator::new(base, pending),
            base,
            settings,
        }
    }

    /// Closes the nodes at `nodes` (positions in the base) to every placement of this search: no
    /// pod moves onto them, though they stay and their pods keep counting (nodes inside their
    /// `consolidateAfter` window).
    pub fn close(&mut self, nodes: &[usize]) {
        self.simulator.close(nodes);
    }

    /// Where the pods of the candidates at `which` would go if those nodes had to leave whatever
    /// it costs (drift): the remaining nodes, then as many new nodes as they need. `Delete` when
    /// no new node is needed.
    pub fn relocate(&mut self, which: &[usize]) -> Result<Decision, Refusal> {
        self.relocation(which).map(|(decision, _)| decision)
    }

    /// [`Search::relocate`], with the simulation's solution (its pods the candidates' pods in the
    /// order of `which`): where on the remaining nodes the pods were counted.
    pub fn relocation(&mut self, which: &[usize]) -> Result<(Decision, Solution), Refusal> {
        let solution = self.place(which)?;
        let decision = if solution.claims.is_empty() {
            Decision::Delete
        } else {
            Decision::Relaunch(solution.claims.clone())
        };
        Ok((decision, solution))
    }

    /// Decides whether the candidates at positions `which` can go (see the module docs).
    pub fn consolidate(&mut self, which: &[usize]) -> Result<Decision, Refusal> {
        self.simulate(which).map(|(decision, _)| decision)
    }

    /// The largest prefix of `order` (positions of candidates, at least two) whose candidates can
    /// go together, over all of them: how many, and how. As Karpenter's multi-node consolidation,
    /// it takes a prefix that can go to mean every shorter one can; it finds the size by doubling
    /// from two until a prefix cannot go, then by binary search between the last two sizes. So
    /// its questions grow with the answer, not with the candidates: when only a few nodes can go,
    /// no question moves the pods of half the cluster. When the first two cannot go, more may
    /// (two nodes' pods may need a node as dear as both, three fill a cheaper one): it searches the
    /// sizes above two, up to [`PAST_A_PAIR`], from the middle, as Karpenter's search does.
    pub fn largest_prefix(&mut self, order: &[usize]) -> Option<(usize, Decision)> {
        self.largest_accepted_prefix(order, |_, _| true)
    }

    /// [`largest_prefix`](Self::largest_prefix), where a prefix whose outcome `accept` (given
    /// the prefix and the decision) refuses counts as one that cannot go, as Karpenter's search
    /// treats a move its Balanced score rejects.
    pub fn largest_accepted_prefix(
        &mut self,
        order: &[usize],
        accept: impl Fn(&[usize], &Decision) -> bool,
    ) -> Option<(usize, Decision)> {
        let ask = |search: &mut Self, size: usize| {
            let prefix = &order[..size];
            search
                .consolidate(prefix)
                .ok()
                .filter(|decision| accept(prefix, decision))
        };
        let mut best = None;
        let mut size = 2;
        let mut high = order.len();
        while size <= high {
            match ask(self, size) {
                Some(decision) => {
                    best = Some((size, decision));
                    if size == high {
                        return best;
                    }
                    size = (size * 2).min(high);
                }
                None => {
                    high = size - 1;
                    break;
                }
            }
        }
        let mut low = match &best {
            Some((found, _)) => found + 1,
            None => {
                high = order.len().min(PAST_A_PAIR);
                3
            }
        };
        while low <= high {
            let middle = (low + high) / 2;
            match ask(self, middle) {
                Some(decision) => {
                    best = Some((middle, decision));
                    low = middle + 1;
                }
                None => high = middle - 1,
            }
        }
        best
    }

    /// Simulates the candidates at `which` leaving and judges the outcome; with the simulation's
    /// solution, whose pods are the candidates' pods in the order of `which`.
    pub fn simulate(&mut self, which: &[usize]) -> Result<(Decision, Solution), Refusal> {
        let solution = self.place(which)?;
        let current: f64 = which.iter().map(|&c| self.candidates[c].price).sum();
        let decision = match solution.claims.as_slice() {
            [] => Decision::Delete,
            [claim] => {
                let all_spot = which
                    .iter()
                    .all(|&c| self.candidates[c].capacity_type == CapacityType::Spot);
                Decision::Replace(replacement(
                    self.base,
                    claim.clone(),
                    current,
                    all_spot,
                    self.settings,
                )?)
            }
            claims => return Err(Refusal::MoreThanOneNode { nodes: claims.len() }),
        };
        Ok((decision, solution))
    }
}

impl Search<'_> {
    /// Places the pods of the candidates at `which` on the cluster without them, their NodePools'
    /// limits given back what they hold (the solution's pods in the order of `which`); a pod that
    /// fits nowhere is a refusal.
    fn place(&mut self, which: &[usize]) -> Result<Solution, Refusal> {
        let pods: Vec<usize> = which
            .iter()
            .flat_map(|&c| self.first_pod[c]..self.first_pod[c] + self.candidates[c].pods.len())
            .collect();
        let nodes: Vec<usize> = which.iter().map(|&c| self.candidates[c].node).collect();
        let held: Vec<&Held> = which
            .iter()
            .filter_map(|&c| self.candidates[c].held.as_ref())
            .collect();
        let solution = self.simulator.place(&pods, &nodes, &held);
        if let Some(unschedulable) = solution.unschedulable.first() {
            return Err(Refusal::PodDoesNotFit {
                pod: self.simulator.pod(pods[unschedulable.pod]).name.clone(),
                reason: unschedulable.to_string(),
            });
        }
        Ok(solution)
    }
}

/// Simulates the candidates at `which` leaving and carries out the decision on the base
/// ([`carry_out`]). `Err` when the candidates cannot go after all.
pub fn apply(
    base: &mut Input,
    candidates: &[Candidate],
    which: &[usize],
    settings: Settings,
    name: &str,
) -> Result<Decision, Refusal> {
    let (decision, solution) = Search::new(base, candidates, settings).simulate(which)?;
    carry_out(base, candidates, which, &decision, &solution, name);
    Ok(decision)
}

/// Carries out a decision on the base, as if the cluster had followed it: the candidates at
/// `which` leave, their pods go where the simulation (`solution`, from [`Search::simulate`]) put
/// them, and a replacement joins as a node of its cheapest type in the zone of its cheapest
/// offering (named `name`).
pub fn carry_out(
    base: &mut Input,
    candidates: &[Candidate],
    which: &[usize],
    decision: &Decision,
    solution: &Solution,
    name: &str,
) {
    let mut pods: Vec<Option<Arc<PodInfo>>> = which
        .iter()
        .flat_map(|&c| candidates[c].pods.iter().cloned().map(Some))
        .collect();
    for placement in &solution.placements {
        if let Some(pod) = pods[placement.pod].take() {
            base.nodes[placement.node].pods.push(pod);
        }
    }
    if let Decision::Replace(replacement) = decision
        && let Some(&first) = replacement.claim.instance_types.first()
        && let it = &base.instance_types[first]
        && let Some(offering) = cheapest_offering(it, &replacement.claim.requirements)
    {
        let moved = replacement
            .claim
            .pods
            .iter()
            .filter_map(|&p| pods.get_mut(p)?.take());
        let node = ExistingNode::launched(
            name,
            &replacement.claim.requirements,
            it,
            offering,
            moved.collect(),
        );
        base.nodes.push(node);
    }
    let mut gone: Vec<usize> = which.iter().map(|&c| candidates[c].node).collect();
    gone.sort_unstable_by(|a, b| b.cmp(a));
    gone.dedup();
    for position in gone {
        base.nodes.remove(position);
    }
}

/// The cheapest available offering of `it` that `requirements` allow (capacity type and zone).
fn cheapest_offering<'a>(it: &'a InstanceType, requirements: &Requirements) -> Option<&'a Offering> {
    it.offerings
        .iter()
        .filter(|o| {
            o.available
                && requirements
                    .get(CAPACITY_TYPE)
                    .is_none_or(|r| r.has(o.capacity_type.label()))
                && requirements.get(ZONE).is_none_or(|r| r.has(&o.zone))
        })
        .min_by(|a, b| a.price.total_cmp(&b.price))
}

/// The replacement for a claim the simulation opened: its instance types cut to those cheaper
/// than `current`, pinned to the capacity type of the cheapest, spot-to-spot rules applied.
fn replacement(
    base: &Input,
    mut claim: NewClaim,
    current: f64,
    all_spot: bool,
    settings: Settings,
) -> Result<Replacement, Refusal> {
    let offer = |i: usize| {
        cheapest_offering(&base.instance_types[i], &claim.requirements).map(|o| (o.price, o.capacity_type))
    };
    let Some((cheapest, capacity_type)) = claim.instance_types.first().and_then(|&i| offer(i)) else {
        return Err(Refusal::NotCheaper {
            replacement: claim.price,
            current,
        });
    };
    if cheapest >= current {
        return Err(Refusal::NotCheaper {
            replacement: cheapest,
            current,
        });
    }
    let mut cheaper: Vec<usize> = claim
        .instance_types
        .iter()
        .copied()
        .filter(|&i| offer(i).is_some_and(|(price, ct)| price < current && ct == capacity_type))
        .collect();
    let strict = base.options.min_values == MinValuesPolicy::Strict;
    if strict && let Some(refusal) = min_values_shortfall(base, &claim.requirements, &cheaper) {
        return Err(refusal);
    }
    if all_spot && capacity_type == CapacityType::Spot {
        if !settings.spot_to_spot || cheaper.len() < SPOT_TO_SPOT_MIN_TYPES {
            return Err(Refusal::SpotToSpot {
                cheaper_types: cheaper.len(),
                enabled: settings.spot_to_spot,
            });
        }
        // The cheapest fifteen, or as many more as the minValues need.
        let keep = (SPOT_TO_SPOT_MIN_TYPES..cheaper.len())
            .find(|&n| !strict || min_values_shortfall(base, &claim.requirements, &cheaper[..n]).is_none())
            .unwrap_or(cheaper.len());
        cheaper.truncate(keep);
    }
    if let Ok(pinned) = Requirement::new(CAPACITY_TYPE, Operator::In, [capacity_type.label()]) {
        claim.requirements.add(pinned);
    }
    claim.instance_types = cheaper;
    claim.price = cheapest;
    Ok(Replacement {
        claim,
        price: cheapest,
    })
}

/// The first `minValues` of `requirements` that the instance types `types` (positions in the
/// catalog of `base`) do not meet, as a refusal: Karpenter keeps a replacement's cheaper types
/// only while they still do. The values counted are every value each type has for the key, as
/// Karpenter's `SatisfiesMinValues` counts them (the solver's own check works over its compiled
/// pool view instead, before any price cut).
fn min_values_shortfall(base: &Input, requirements: &Requirements, types: &[usize]) -> Option<Refusal> {
    requirements.iter().find_map(|wanted| {
        let needed = wanted.min_values()?;
        let found: BTreeSet<&str> = types
            .iter()
            .filter_map(|&t| base.instance_types[t].requirements.get(wanted.key()))
            .filter(|offered| offered.operator() == Operator::In)
            .flat_map(|offered| offered.values())
            .collect();
        (found.len() < needed as usize).then(|| Refusal::MinValues {
            key: wanted.key().to_owned(),
            needed,
            found: found.len(),
        })
    })
}

#[cfg(test)]
mod tests;

//! Karpenter's graceful disruption methods, tried in its order, first success wins, except that
//! consolidation (3 and 4) is also decided beside an emptiness command:
//!
//! 1. **Emptiness** (reason `Empty`): every consolidatable candidate with no pod to move, of a
//!    NodePool whose `consolidateAfter` is not `Never`, as many as each pool's budget allows, in
//!    one command; in a pool that consolidates underused nodes, not while the pool waits for the
//!    nodes making room (`waits_for_pool`): decided alone, its 15 s validation would hold up the
//!    consolidation the wait is for by as much. Consolidation beside it takes none of its nodes,
//!    moves no pod onto them, and has its pools' budgets less the nodes it empties (Karpenter
//!    decides emptiness alone, and so waits a second 15 s validation before the first
//!    consolidation after a scale-down).
//! 2. **Drift** (reason `Drifted`): drifted candidates, consolidatable or not, whatever the
//!    consolidation policy, longest drifted first; those with no pod to move first, as many as
//!    budgets allow, in one command; otherwise one command per candidate whose pods fit on the
//!    other nodes and as many new nodes as they need, at any price (the new nodes are launched and
//!    initialized before the drifted one is drained), as many commands as budgets allow in one
//!    pass (Karpenter decides one a pass). Each command's candidate, and the nodes its pods were counted onto, are closed to
//!    the ones after it, so no two count on the same room. A drifted candidate blocked only by its
//!    pods takes part when its NodeClaim has a `terminationGracePeriod`.
//! 3. **Multi-node consolidation** (reason `Underutilized`): the largest prefix of the candidates
//!    (by savings ratio, within budgets) that can be deleted or replaced by one cheaper node,
//!    found by binary search over **all** candidates (Karpenter stops at 100); then the same
//!    search again over the candidates no command before took or counted on, while each finds a
//!    command, at most [`MULTI_NODE_COMMANDS`] a pass (Karpenter decides one command a pass).
//! 4. **Single-node consolidation**, beside it in the same pass: every other candidate that can
//!    be deleted or replaced by a cheaper node, each its own command, as many as budgets allow
//!    (Karpenter decides one command a pass, multi-node or single-node, and so waits its 15 s
//!    validation once per node). As with drift, each command's node and the nodes it counted on
//!    are closed to the ones after it; in a pool with limits, only one command a pass launches a
//!    replacement, as each was judged against the limits alone.
//!
//! Only NodePools with `consolidationPolicy: WhenEmptyOrUnderutilized` or `Balanced` take part in
//! 3 and 4; a move that takes nodes of a `Balanced` pool must also pass its score
//! ([`balanced`]): a multi-node prefix it refuses counts as one that cannot go, a single node
//! whose outright deletion could not pass is not simulated, and one whose move it refuses is
//! skipped without an event (Karpenter's rejections are too many to report). No pod is moved
//! onto a node still inside its `consolidateAfter` window, nor by any method onto a node a
//! command in flight holds. Each decision is pure over the pass's candidates, budgets and base
//! problem; refusals are kept so the planner can tell users why a node stays
//! (`Unconsolidatable`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use joist_messages::{
    apis::nodepool::{ConsolidationPolicy, DisruptionReason},
    conditions::ConditionType,
};
use joist_scheduling::{
    Input, Solution,
    consolidation::{self, Decision, Refusal, Search, Settings},
};
use kube::ResourceExt;

use super::{
    blockers::{Blocker, Verdicts},
    candidates::Candidate,
};
use crate::{
    decide::{
        balanced::{self, MovePart, PoolTotals, Score},
        lifecycle::transitioned_at,
    },
    state::read_model::ReadModel,
};

/// A disruption method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Empty nodes.
    Emptiness,
    /// Drifted nodes.
    Drift,
    /// Several nodes at once.
    MultiNode,
    /// One node.
    SingleNode,
}

impl Method {
    /// The method's name in logs, events and reports.
    pub fn name(self) -> &'static str {
        match self {
            Method::Emptiness => "emptiness",
            Method::Drift => "drift",
            Method::MultiNode => "multi-node consolidation",
            Method::SingleNode => "single-node consolidation",
        }
    }

    /// Karpenter's `consolidation_type` metric label (empty for drift, which is no
    /// consolidation).
    pub fn consolidation_type(self) -> &'static str {
        match self {
            Method::Drift => "",
            Method::Emptiness => "empty",
            Method::MultiNode => "multi",
            Method::SingleNode => "single",
        }
    }
}

/// What the planner decided.
#[derive(Debug, Clone)]
pub struct Command {
    /// How.
    pub method: Method,
    /// Why, as budgets and conditions name it.
    pub reason: DisruptionReason,
    /// The nodes to remove.
    pub candidates: Vec<Candidate>,
    /// Delete them, or replace them by new nodes.
    pub decision: Decision,
    /// The Nodes their pods were counted onto, besides the new ones.
    pub onto: Vec<String>,
    /// The `Balanced` score of a consolidation, for each Balanced NodePool it takes nodes of.
    pub scores: BTreeMap<String, Score>,
}

impl Command {
    /// What the command saves per hour.
    pub fn savings(&self) -> f64 {
        self.candidates.iter().map(|c| c.price).sum::<f64>() - self.decision.launch_price()
    }

    /// The candidates' NodeClaim names.
    pub fn claim_names(&self) -> Vec<String> {
        self.candidates.iter().map(|c| c.claim.name_any()).collect()
    }
}

/// A consolidation the `Balanced` score refused: its candidates, and the score of each Balanced
/// NodePool it would take nodes of.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The nodes it would have removed.
    pub candidates: Vec<Candidate>,
    /// Each Balanced pool's score.
    pub scores: BTreeMap<String, Score>,
}

/// What a planning pass decided.
#[derive(Debug, Default)]
pub struct Plan {
    /// The commands to carry out.
    pub commands: Vec<Command>,
    /// Why candidates single-node consolidation looked at could not go.
    pub refusals: Vec<(Candidate, Refusal)>,
    /// The moves the `Balanced` score refused: every single-node move, and a multi-node search's
    /// last refused prefix when it found nothing.
    pub rejections: Vec<Rejection>,
    /// Why each consolidation candidate the pass judged and left stays.
    pub verdicts: Verdicts,
    /// Why the command being validated no longer holds, when it does not.
    pub invalidated: Option<Invalidated>,
}

/// The base problem of a pass, and where each candidate's node stands in it.
pub struct Base<'a> {
    /// The cluster as watched (each pod's scheduling view is kept there).
    pub read: &'a ReadModel,
    /// The cluster, without pods.
    pub input: &'a Input,
    /// Node positions in `input.nodes`, by Node name.
    pub positions: BTreeMap<String, usize>,
    /// Positions of the nodes inside their `consolidateAfter` window: consolidation moves no pod
    /// onto them.
    pub settling: Vec<usize>,
    /// Positions of the nodes commands in flight hold: no method moves a pod onto them.
    pub held: Vec<usize>,
    /// What consolidation may do.
    pub settings: Settings,
    /// The denominators of each `Balanced` NodePool's score.
    pub balanced: BTreeMap<String, PoolTotals>,
}

/// The commands of the first method that finds something to do (see the module docs); with
/// them, why candidates single-node consolidation looked at could not go, and what the `Balanced`
/// score refused.
pub fn plan(
    candidates: &[Candidate],
    eventual: &[Candidate],
    base: &Base<'_>,
    allowed: impl Fn(&str, DisruptionReason) -> u32,
) -> Plan {
    let empty = emptiness(candidates, &allowed);
    if empty.is_none() {
        let mut drifted: Vec<&Candidate> = candidates.iter().chain(eventual).filter(|c| c.drifted).collect();
        // Longest drifted first, as Karpenter orders drift's candidates.
        drifted.sort_by_key(|c| transitioned_at(&c.claim, ConditionType::Drifted));
        let commands = drift(&drifted, base, &allowed);
        if !commands.is_empty() {
            return Plan {
                commands,
                ..Plan::default()
            };
        }
    }
    let consolidations = consolidation(candidates, base, &allowed, empty.as_ref());
    let mut commands: Vec<Command> = empty.into_iter().collect();
    // After an emptiness command, the search had its nodes closed: a refusal may be only that.
    let refusals = if commands.is_empty() {
        consolidations.refusals
    } else {
        Vec::new()
    };
    commands.extend(consolidations.commands);
    Plan {
        commands,
        refusals,
        rejections: consolidations.rejections,
        verdicts: consolidations.verdicts,
        invalidated: None,
    }
}

/// Multi-node and single-node consolidation of `candidates`, beside `emptied` (this pass's
/// emptiness command, whose nodes they neither take nor count on, and whose nodes count against
/// their pools' budgets); with why candidates single-node consolidation looked at could not go,
/// and what the `Balanced` score refused.
fn consolidation(
    candidates: &[Candidate],
    base: &Base<'_>,
    allowed: &impl Fn(&str, DisruptionReason) -> u32,
    emptied: Option<&Command>,
) -> Plan {
    let emptied = emptied.map_or(&[][..], |command| &command.candidates[..]);
    let emptied_names: BTreeSet<String> = emptied.iter().map(|c| c.claim.name_any()).collect();
    let mut verdicts = Verdicts::default();
    for candidate in candidates
        .iter()
        .filter(|c| !emptied_names.contains(&c.claim.name_any()))
    {
        if let Some(blocker) = candidate.consolidation_blocker() {
            candidate.held_by(&mut verdicts, blocker);
        } else if candidate.pods.is_empty() {
            // Emptiness takes every empty one its budget has room for.
            candidate.held_by(&mut verdicts, Blocker::Budget);
        }
    }
    let consolidatable: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.consolidatable && !c.waits_for_pool && underutilized_policy(c))
        .filter(|c| !emptied_names.contains(&c.claim.name_any()))
        .collect();
    // One search for both consolidation methods: its set-up costs the cluster, a question only
    // what it moves.
    let prepared: Vec<consolidation::Candidate> =
        consolidatable.iter().filter_map(|c| prepare(c, base)).collect();
    let slot: BTreeMap<usize, usize> = prepared.iter().enumerate().map(|(i, p)| (p.node, i)).collect();
    let position = |c: &Candidate| slot.get(base.positions.get(&c.node_name())?).copied();
    let mut search = search(Method::MultiNode, base, &prepared);
    let leaving: Vec<usize> = emptied
        .iter()
        .filter_map(|c| base.positions.get(&c.node_name()).copied())
        .collect();
    search.close(&leaving);
    // Each pool's room for underutilized nodes, less the nodes this pass empties in it.
    let room_left = |pool: &str| {
        let emptied_here = emptied.iter().filter(|c| c.pool.name_any() == pool).count();
        allowed(pool, DisruptionReason::Underutilized)
            .saturating_sub(u32::try_from(emptied_here).unwrap_or(u32::MAX))
    };
    let mut room = Room::new(room_left);
    let mut commands = Vec::new();
    let mut rejections = Vec::new();
    // Multi-node consolidation, again over the candidates left open while each search finds a
    // command; a search only when every candidate within budgets is in the base. Only the first
    // search's refusal is kept: a later one's may be only that the earlier commands took the room.
    let mut closed: BTreeSet<String> = BTreeSet::new();
    let mut replacing: BTreeSet<String> = BTreeSet::new();
    let mut taken_in: BTreeMap<String, u32> = BTreeMap::new();
    while commands.len() < MULTI_NODE_COMMANDS {
        let open: Vec<&Candidate> = consolidatable
            .iter()
            .copied()
            .filter(|c| !closed.contains(&c.node_name()))
            .collect();
        let within = within_budgets(&open, |pool| {
            room_left(pool).saturating_sub(taken_in.get(pool).copied().unwrap_or(0))
        });
        let order: Option<Vec<usize>> = within.iter().map(|c| position(c)).collect();
        let mut later_refusals = Vec::new();
        let refused = if commands.is_empty() {
            &mut rejections
        } else {
            &mut later_refusals
        };
        let Some(command) = order
            .filter(|order| commands.is_empty() || order.len() > 1)
            .and_then(|order| multi_node(&within, &order, base, &mut search, refused))
        else {
            break;
        };
        // Each replacement was judged against its pool's limits alone: in a pool with limits,
        // one a pass.
        if limited_replacement(&command).is_some_and(|pool| !replacing.insert(pool)) {
            break;
        }
        for candidate in &command.candidates {
            room.take(candidate);
            *taken_in.entry(candidate.pool.name_any()).or_default() += 1;
            closed.insert(candidate.node_name());
        }
        closed.extend(command.onto.iter().cloned());
        commands.push(command);
    }
    // Then one node at a time beside it, each with room for itself alone in its pool's budget.
    let taken: BTreeSet<String> = commands.iter().flat_map(Command::claim_names).collect();
    let each = consolidatable
        .into_iter()
        .filter(|c| !taken.contains(&c.claim.name_any()))
        .filter_map(|c| Some((c, position(c)?)));
    let mut singles = each_alone(
        (Method::SingleNode, DisruptionReason::Underutilized),
        base,
        &mut search,
        each,
        &mut room,
    );
    (singles.commands).retain(|c| limited_replacement(c).is_none_or(|pool| replacing.insert(pool)));
    // After a multi-node command, the search had its nodes closed: a refusal may be only that.
    let refusals = if commands.is_empty() {
        singles.refusals
    } else {
        for (candidate, _) in &singles.refusals {
            singles.verdicts.release(&candidate.claim.name_any());
        }
        Vec::new()
    };
    commands.extend(singles.commands);
    rejections.extend(singles.rejections);
    verdicts.extend(singles.verdicts);
    for command in &commands {
        for claim in command.claim_names() {
            verdicts.release(&claim);
        }
    }
    Plan {
        commands,
        refusals,
        rejections,
        verdicts,
        invalidated: None,
    }
}

/// The most multi-node commands one pass decides (Karpenter decides one command a pass).
const MULTI_NODE_COMMANDS: usize = 10;

/// The pool of `command`'s replacement, when it launches one in a pool with limits.
fn limited_replacement(command: &Command) -> Option<String> {
    let pool = &command.candidates.first()?.pool;
    (matches!(command.decision, Decision::Replace(_)) && !pool.spec.limits.is_empty())
        .then(|| pool.name_any())
}

fn underutilized_policy(candidate: &Candidate) -> bool {
    candidate.pool.spec.disruption.consolidation_policy != ConsolidationPolicy::WhenEmpty
}

/// Empty consolidatable candidates, within each pool's `Empty` budget.
fn emptiness(candidates: &[Candidate], allowed: &impl Fn(&str, DisruptionReason) -> u32) -> Option<Command> {
    let empty: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.consolidatable && c.pods.is_empty())
        .filter(|c| !(c.waits_for_pool && underutilized_policy(c)))
        .collect();
    delete_empty(Method::Emptiness, DisruptionReason::Empty, &empty, allowed)
}

/// Drifted candidates: the empty ones budgets allow, in one command; else one command for each
/// that can be relocated, as many as budgets allow.
fn drift(
    drifted: &[&Candidate],
    base: &Base<'_>,
    allowed: &impl Fn(&str, DisruptionReason) -> u32,
) -> Vec<Command> {
    let empty: Vec<&Candidate> = drifted.iter().copied().filter(|c| c.pods.is_empty()).collect();
    if let Some(command) = delete_empty(Method::Drift, DisruptionReason::Drifted, &empty, allowed) {
        return vec![command];
    }
    let (known, prepared): (Vec<&Candidate>, Vec<consolidation::Candidate>) = drifted
        .iter()
        .filter_map(|c| Some((*c, prepare(c, base)?)))
        .unzip();
    let mut search = search(Method::Drift, base, &prepared);
    let mut room = Room::new(|pool| allowed(pool, DisruptionReason::Drifted));
    let each = known.into_iter().enumerate().map(|(position, c)| (c, position));
    let Plan {
        commands, refusals, ..
    } = each_alone(
        (Method::Drift, DisruptionReason::Drifted),
        base,
        &mut search,
        each,
        &mut room,
    );
    for (candidate, refusal) in refusals {
        tracing::info!(
            nodeclaim = candidate.claim.name_any(),
            %refusal,
            "drifted node cannot be replaced yet"
        );
    }
    commands
}

/// The names of the nodes at `positions` in the base.
fn node_names(base: &Base<'_>, positions: &[usize]) -> Vec<String> {
    positions
        .iter()
        .map(|&p| base.input.nodes[p].name.clone())
        .collect()
}

/// One command of `method` deleting the candidates of `empty` (they have no pod to move) that
/// their pools' budgets for `reason` leave room for; `None` when there is none.
fn delete_empty(
    method: Method,
    reason: DisruptionReason,
    empty: &[&Candidate],
    allowed: &impl Fn(&str, DisruptionReason) -> u32,
) -> Option<Command> {
    let chosen = within_budgets(empty, |pool| allowed(pool, reason));
    (!chosen.is_empty()).then(|| Command {
        method,
        reason,
        candidates: chosen.into_iter().cloned().collect(),
        decision: Decision::Delete,
        onto: Vec::new(),
        scores: BTreeMap::new(),
    })
}

/// A search over `prepared` for `method`: no pod moves onto a node a command in flight holds;
/// consolidation moves none onto a node still settling either, while drift, which must go whatever
/// it costs, may.
fn search<'a>(method: Method, base: &'a Base<'_>, prepared: &'a [consolidation::Candidate]) -> Search<'a> {
    let mut search = Search::new(base.input, prepared, base.settings);
    search.close(&base.held);
    if method != Method::Drift {
        search.close(&base.settling);
    }
    search
}

/// What `method` makes of removing the candidates at `which`: drift relocates their pods onto as
/// many new nodes as they need, consolidation only onto fewer, cheaper ones. With the decision,
/// the positions of the remaining nodes the pods were counted onto.
fn answer(
    method: Method,
    search: &mut Search<'_>,
    which: &[usize],
) -> Result<(Decision, Vec<usize>), Refusal> {
    let (decision, solution) = match method {
        Method::Drift => search.relocation(which)?,
        _ => search.simulate(which)?,
    };
    let mut onto: Vec<usize> = solution.placements.iter().map(|p| p.node).collect();
    onto.sort_unstable();
    onto.dedup();
    Ok((decision, onto))
}

/// The candidates, in order, that their pools' budgets leave room for.
fn within_budgets<'a>(candidates: &[&'a Candidate], allowed: impl Fn(&str) -> u32) -> Vec<&'a Candidate> {
    let mut room = Room::new(allowed);
    candidates.iter().copied().filter(|c| room.take(c)).collect()
}

/// What each NodePool's budget leaves for the commands of one pass, counted down as they take it.
struct Room<F> {
    left: BTreeMap<String, u32>,
    allowed: F,
}

impl<F: Fn(&str) -> u32> Room<F> {
    /// Room as `allowed` gives it per pool.
    fn new(allowed: F) -> Self {
        Self {
            left: BTreeMap::new(),
            allowed,
        }
    }

    /// What is left in `candidate`'s pool.
    fn left(&mut self, candidate: &Candidate) -> &mut u32 {
        let allowed = &self.allowed;
        self.left
            .entry(candidate.pool.name_any())
            .or_insert_with_key(|pool| allowed(pool))
    }

    /// Whether `candidate`'s pool has room for it; if so, it is taken.
    fn take(&mut self, candidate: &Candidate) -> bool {
        let left = self.left(candidate);
        let fits = *left > 0;
        if fits {
            *left -= 1;
        }
        fits
    }
}

/// A candidate in the search's terms, or `None` when its node is not in the base or one of its
/// pods cannot be simulated (such a node is blocked before it gets here).
fn prepare(candidate: &Candidate, base: &Base<'_>) -> Option<consolidation::Candidate> {
    Some(consolidation::Candidate {
        node: *base.positions.get(&candidate.node_name())?,
        price: candidate.price,
        capacity_type: candidate.capacity_type,
        pods: candidate
            .pods
            .iter()
            .map(|p| base.read.pod_info(p))
            .collect::<Result<_, _>>()
            .ok()?,
        held: base
            .read
            .claim_usage(&candidate.claim.name_any())
            .map(|(pool, capacity)| consolidation::Held { pool, capacity }),
    })
}

/// What removing `candidate` alone would come to, as single-node consolidation simulates it,
/// budgets and the `Balanced` score aside: the decision, and the simulation's solution (its pods
/// are the candidate's, in order). `None` when its node is not in the base or a pod of it cannot
/// be simulated.
pub fn removal(candidate: &Candidate, base: &Base<'_>) -> Option<Result<(Decision, Solution), Refusal>> {
    let prepared = [prepare(candidate, base)?];
    Some(search(Method::SingleNode, base, &prepared).simulate(&[0]))
}

/// All of `candidates` in the search's terms, or `None` when one's node is not in the base.
fn prepare_all(candidates: &[&Candidate], base: &Base<'_>) -> Option<Vec<consolidation::Candidate>> {
    candidates.iter().map(|c| prepare(c, base)).collect()
}

/// Simulates removing `candidates` from the base, as `method` would.
fn simulate(
    method: Method,
    candidates: &[&Candidate],
    base: &Base<'_>,
) -> Option<Result<(Decision, Vec<usize>), Refusal>> {
    let prepared = prepare_all(candidates, base)?;
    let all: Vec<usize> = (0..prepared.len()).collect();
    Some(answer(method, &mut search(method, base, &prepared), &all))
}

/// The largest prefix of at least two candidates that consolidates (binary search over all);
/// `order` holds their positions in the search. When there is none and the `Balanced` score
/// refused a prefix, the last one it refused goes to `rejections`.
fn multi_node(
    candidates: &[&Candidate],
    order: &[usize],
    base: &Base<'_>,
    search: &mut Search<'_>,
    rejections: &mut Vec<Rejection>,
) -> Option<Command> {
    let refused = std::cell::RefCell::new(None);
    let best = search.largest_accepted_prefix(order, |prefix, decision| {
        let (approved, scores) = balanced_score(&candidates[..prefix.len()], decision, base);
        if !approved {
            refused.replace(Some(Rejection {
                candidates: candidates[..prefix.len()].iter().map(|c| (*c).clone()).collect(),
                scores,
            }));
        }
        approved
    });
    if best.is_none() {
        rejections.extend(refused.into_inner());
    }
    tracing::info!(
        searched = candidates.len(),
        found = best.as_ref().map_or(0, |(count, _)| *count),
        "multi-node consolidation"
    );
    let (count, _) = best?;
    // Asked once more for where the pods went, which the binary search does not keep.
    let (decision, onto) = answer(Method::MultiNode, search, &order[..count]).ok()?;
    // Closed to the single-node commands beside it, as they are to one another.
    let mut closed = onto.clone();
    closed.extend(
        candidates[..count]
            .iter()
            .filter_map(|c| base.positions.get(&c.node_name())),
    );
    search.close(&closed);
    let (_, scores) = balanced_score(&candidates[..count], &decision, base);
    Some(Command {
        method: Method::MultiNode,
        reason: DisruptionReason::Underutilized,
        candidates: candidates[..count].iter().map(|c| (*c).clone()).collect(),
        decision,
        onto: node_names(base, &onto),
        scores,
    })
}

/// The candidate as a part of a move in the `Balanced` score.
fn move_part(candidate: &Candidate) -> MovePart<'_> {
    let balanced = candidate.pool.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced;
    MovePart {
        balanced_pool: balanced.then(|| candidate.pool.metadata.name.as_deref().unwrap_or_default()),
        price: candidate.price,
        disruption: candidate.reschedule_cost,
    }
}

/// Whether every `Balanced` pool among `candidates` approves removing them as `decision` says,
/// and each one's score.
fn balanced_score(
    candidates: &[&Candidate],
    decision: &Decision,
    base: &Base<'_>,
) -> (bool, BTreeMap<String, Score>) {
    let parts: Vec<MovePart<'_>> = candidates.iter().map(|c| move_part(c)).collect();
    let savings = candidates.iter().map(|c| c.price).sum::<f64>() - decision.launch_price();
    balanced::judge_move(&parts, savings, &base.balanced)
}

/// Of `candidates` (each with its position in `search`), every one that `method` can remove
/// alone and `room` leaves room for, each as its own command for `reason`. The pods a command
/// counted on stay where they are until it is done: its node and the nodes it counted on are
/// closed to the candidates after it, so no two count on the same room. With the commands, the
/// refusals of the candidates looked at before the first (after it, a refusal may only mean that
/// an earlier command took the room), and the single-node moves the `Balanced` score refused.
fn each_alone<'c, F: Fn(&str) -> u32>(
    (method, reason): (Method, DisruptionReason),
    base: &Base<'_>,
    search: &mut Search<'_>,
    candidates: impl IntoIterator<Item = (&'c Candidate, usize)>,
    room: &mut Room<F>,
) -> Plan {
    let mut commands = Vec::new();
    let mut refusals = Vec::new();
    let mut rejections = Vec::new();
    let mut verdicts = Verdicts::default();
    let consolidating = method == Method::SingleNode;
    for (candidate, position) in candidates {
        if *room.left(candidate) == 0 {
            candidate.held_by(&mut verdicts, Blocker::Budget);
            continue;
        }
        // Not even deleting it outright would pass its pool's Balanced score.
        if consolidating && !balanced::can_pass(move_part(candidate), &base.balanced) {
            candidate.held_by(&mut verdicts, Blocker::Score);
            continue;
        }
        match answer(method, search, &[position]) {
            Ok((decision, onto)) => {
                let (approved, scores) = if consolidating {
                    balanced_score(&[candidate], &decision, base)
                } else {
                    (true, BTreeMap::new())
                };
                if !approved {
                    candidate.held_by(&mut verdicts, Blocker::Score);
                    rejections.push(Rejection {
                        candidates: vec![candidate.clone()],
                        scores,
                    });
                    continue;
                }
                *room.left(candidate) -= 1;
                let mut closed = onto.clone();
                closed.extend(base.positions.get(&candidate.node_name()));
                search.close(&closed);
                commands.push(Command {
                    method,
                    reason,
                    candidates: vec![candidate.clone()],
                    decision,
                    onto: node_names(base, &onto),
                    scores,
                });
            }
            Err(refusal) => {
                if commands.is_empty() {
                    candidate.held_by(&mut verdicts, Blocker::of_refusal(&refusal));
                    refusals.push((candidate.clone(), refusal));
                }
            }
        }
    }
    Plan {
        commands,
        refusals,
        rejections,
        verdicts,
        invalidated: None,
    }
}

/// Why a command's validation abandoned it; [`Invalidated::label`] gives it in Karpenter's words
/// (`ConsolidationRejected`), its `Display` in the log's.
#[derive(Debug, Clone, PartialEq)]
pub enum Invalidated {
    /// The budgets no longer allow it.
    Budget,
    /// The simulation now refuses to move its pods at all (a pod fits nowhere, more than one new
    /// node, no cheaper replacement, ...).
    Unschedulable(Refusal),
    /// A deletion whose pods no longer fit on the nodes left: it would now need a replacement.
    NeedsReplacement,
    /// The `Balanced` score refuses it now.
    Score,
    /// A candidate is gone, changed within `consolidateAfter`, or no longer empty.
    Churn,
    /// A candidate's node is no longer in the simulation (cordoned, gone).
    NodeGone,
}

impl Invalidated {
    /// Karpenter's reason (`budget`, `scheduling`, `churn`).
    pub fn label(&self) -> &'static str {
        match self {
            Invalidated::Budget => "budget",
            Invalidated::Unschedulable(_) | Invalidated::NeedsReplacement | Invalidated::Score => {
                "scheduling"
            }
            Invalidated::Churn | Invalidated::NodeGone => "churn",
        }
    }

    /// The blocker that keeps its candidates.
    pub fn blocker(&self) -> Blocker {
        match self {
            Invalidated::Budget => Blocker::ValidationBudget,
            Invalidated::Unschedulable(_)
            | Invalidated::NeedsReplacement
            | Invalidated::Score
            | Invalidated::Churn
            | Invalidated::NodeGone => Blocker::ValidationChurn,
        }
    }
}

impl fmt::Display for Invalidated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalidated::Budget => f.write_str("the budgets no longer allow it"),
            Invalidated::Unschedulable(refusal) => write!(f, "its pods no longer leave: {refusal}"),
            Invalidated::NeedsReplacement => {
                f.write_str("its pods no longer fit on the nodes left: the deletion would now need a replacement")
            }
            Invalidated::Score => f.write_str("the Balanced score refuses it now"),
            Invalidated::Churn => {
                f.write_str("a candidate is gone, had a pod arrive or leave within consolidateAfter, or is no longer empty")
            }
            Invalidated::NodeGone => f.write_str("a candidate's node is no longer schedulable or is gone"),
        }
    }
}

/// Whether `previous`, an emptiness or consolidation command (drift is not validated), still
/// holds over this pass's `candidates`: every one of its candidates is still a consolidatable
/// candidate, within budgets, and the simulation gives the same kind of outcome, or a deletion
/// where it replaced. The command as it stands now, or why not.
///
/// A replacement whose pods now fit on the nodes left goes on as a deletion: nodes whose
/// `consolidateAfter` window ended meanwhile take pods again, and so do the nodes of a command
/// decided beside it and abandoned. Karpenter abandons such a command and finds the deletion at
/// its next pass; with many commands decided side by side, each counting on the others' nodes
/// staying closed, abandoning them would abandon most of a pass, and the next pass would decide
/// them the same way again.
///
/// A multi-node command that no longer holds goes on with the largest prefix of its candidates
/// that does ([`holding_prefix`]), as emptiness goes on with its nodes still empty.
///
/// Emptiness goes on with those of its candidates still empty, as many as the budgets allow, as
/// Karpenter's emptiness validation does, and is abandoned only when none is left: each empty
/// node is a decision of its own, and one that took a pod (kube-scheduler puts pods spread over
/// hostnames onto empty nodes first) says nothing of the others.
pub fn revalidate(
    previous: &Command,
    candidates: &[Candidate],
    base: &Base<'_>,
    allowed: impl Fn(&str, DisruptionReason) -> u32,
) -> Result<Command, Invalidated> {
    let now = |old: &Candidate| {
        candidates
            .iter()
            .find(|c| c.claim.name_any() == old.claim.name_any() && c.consolidatable)
    };
    if previous.method == Method::Emptiness {
        let still_empty: Vec<&Candidate> = previous
            .candidates
            .iter()
            .filter_map(now)
            .filter(|c| c.pods.is_empty())
            .collect();
        if still_empty.is_empty() {
            return Err(Invalidated::Churn);
        }
        let current = within_budgets(&still_empty, |pool| allowed(pool, previous.reason));
        if current.is_empty() {
            return Err(Invalidated::Budget);
        }
        return approved(previous, current, Decision::Delete, &[], base);
    }
    let current: Vec<&Candidate> = previous
        .candidates
        .iter()
        .map(now)
        .collect::<Option<_>>()
        .ok_or(Invalidated::Churn)?;
    if within_budgets(&current, |pool| allowed(pool, previous.reason)).len() != current.len() {
        return Err(Invalidated::Budget);
    }
    let whole = match simulate(previous.method, &current, base) {
        Some(Ok((decision, onto))) => approved(previous, current.clone(), decision, &onto, base),
        Some(Err(refusal)) => Err(Invalidated::Unschedulable(refusal)),
        None => return Err(Invalidated::NodeGone),
    };
    match whole {
        Err(invalidated) if previous.method == Method::MultiNode => {
            holding_prefix(previous, &current, base).ok_or(invalidated)
        }
        whole => whole,
    }
}

/// The largest prefix (at least two) of a multi-node command's `current` candidates that still
/// holds when the whole command no longer does, found as the decision found it. In 15 s the pods
/// evicted by the commands in flight may have filled part of the room it counted on; the nodes
/// first in its order save the most, and taking them now beats abandoning all of them and
/// deciding them again a pass later, when more evicted pods have landed.
fn holding_prefix(previous: &Command, current: &[&Candidate], base: &Base<'_>) -> Option<Command> {
    let prepared = prepare_all(current, base)?;
    let order: Vec<usize> = (0..prepared.len()).collect();
    let mut search = search(Method::MultiNode, base, &prepared);
    let (count, _) = search.largest_accepted_prefix(&order, |prefix, decision| {
        still_holds(&previous.decision, decision)
            && balanced_score(&current[..prefix.len()], decision, base).0
    })?;
    let (decision, onto) = answer(Method::MultiNode, &mut search, &order[..count]).ok()?;
    approved(previous, current[..count].to_vec(), decision, &onto, base).ok()
}

/// Whether a command decided `was` holds when its simulation now gives `now`: the same kind of
/// outcome, or a deletion where it replaced (see [`revalidate`]).
fn still_holds(was: &Decision, now: &Decision) -> bool {
    matches!(
        (was, now),
        (Decision::Delete | Decision::Replace(_), Decision::Delete)
            | (Decision::Replace(_), Decision::Replace(_))
    )
}

/// `previous` as revalidated: `decision` for `current` (its candidates as they stand now), moving
/// pods onto the nodes at `onto`, when the decision is the same kind as before or a deletion where
/// it replaced, and the `Balanced` score approves it.
fn approved(
    previous: &Command,
    current: Vec<&Candidate>,
    decision: Decision,
    onto: &[usize],
    base: &Base<'_>,
) -> Result<Command, Invalidated> {
    if !still_holds(&previous.decision, &decision) {
        return Err(Invalidated::NeedsReplacement);
    }
    let (approved, scores) = balanced_score(&current, &decision, base);
    if !approved {
        return Err(Invalidated::Score);
    }
    Ok(Command {
        method: previous.method,
        reason: previous.reason,
        candidates: current.into_iter().cloned().collect(),
        decision,
        onto: node_names(base, onto),
        scores,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use joist_messages::{
        apis::{NodeClaim, NodePool},
        model::instance_type::CapacityType,
    };
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_767_225_600;

    fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An empty candidate of pool `p` whose claim `name` drifted `ago` seconds ago.
    fn drifted(name: &str, ago: i64) -> Candidate {
        candidate(name, Some(ago))
    }

    /// An empty consolidatable candidate of pool `p` whose claim is `name`.
    fn empty(name: &str) -> Candidate {
        candidate(name, None)
    }

    /// An empty candidate of pool `p` whose claim `name` was initialized two hours ago: drifted
    /// `drifted_ago` seconds ago when given, consolidatable otherwise.
    fn candidate(name: &str, drifted_ago: Option<i64>) -> Candidate {
        let condition = |type_: &str, at: i64| {
            json!({"type": type_, "status": "True", "reason": type_, "message": "",
                   "lastTransitionTime": joist_messages::time::rfc3339(at)})
        };
        let mut conditions = vec![condition("Initialized", NOW - 7200)];
        conditions.extend(drifted_ago.map(|ago| condition("Drifted", NOW - ago)));
        let claim: NodeClaim = object(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}},
            "status": {"conditions": conditions},
        }));
        let pool: NodePool = object(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [],
            }}},
        }));
        Candidate {
            claim: Arc::new(claim),
            node: Arc::new(object(json!({"metadata": {"name": format!("{name}-node")}}))),
            pool: Arc::new(pool),
            price: 0.1,
            capacity_type: CapacityType::OnDemand,
            pods: Vec::new(),
            reschedule_cost: 1.0,
            consolidatable: drifted_ago.is_none(),
            waits_for_pool: false,
            drifted: drifted_ago.is_some(),
        }
    }

    /// `candidate` with one pod that must move.
    fn with_a_pod(candidate: Candidate) -> Candidate {
        let pod: k8s_openapi::api::core::v1::Pod = object(
            json!({"metadata": {"name": "web-1", "namespace": "default"}, "spec": {"containers": []}}),
        );
        Candidate {
            pods: vec![Arc::new(pod.into())],
            ..candidate
        }
    }

    /// A base with nothing in it: what a pass without nodes or Balanced pools starts from.
    fn bare<'a>(read: &'a ReadModel, input: &'a Input) -> Base<'a> {
        Base {
            read,
            input,
            positions: BTreeMap::new(),
            settling: Vec::new(),
            held: Vec::new(),
            settings: Settings::default(),
            balanced: BTreeMap::new(),
        }
    }

    /// The emptiness command deciding `names` (all empty).
    fn emptying(names: &[&str]) -> Command {
        let candidates: Vec<Candidate> = names.iter().map(|n| empty(n)).collect();
        emptiness(&candidates, &|_, _| 100).unwrap_or_else(|| panic!("no emptiness command"))
    }

    #[test]
    fn emptiness_goes_on_at_validation_with_the_nodes_still_empty() {
        let (read, _writers) = ReadModel::new();
        let input = Input::default();
        let base = bare(&read, &input);
        let previous = emptying(&["a", "b", "c", "d"]);
        // Since the decision: `b` took a pod, `d` is gone.
        let now = [empty("a"), with_a_pod(empty("b")), empty("c")];
        let kept = revalidate(&previous, &now, &base, |_, _| 100).map(|c| c.claim_names());
        assert_eq!(kept, Ok(vec!["a".to_owned(), "c".to_owned()]));
        let within_one = revalidate(&previous, &now, &base, |_, _| 1).map(|c| c.claim_names());
        assert_eq!(
            within_one,
            Ok(vec!["a".to_owned()]),
            "as many as the budget allows"
        );
    }

    #[test]
    fn emptiness_is_abandoned_at_validation_only_when_no_node_is_left() {
        let (read, _writers) = ReadModel::new();
        let input = Input::default();
        let base = bare(&read, &input);
        let previous = emptying(&["a", "b"]);
        let taken = [with_a_pod(empty("a")), with_a_pod(empty("b"))];
        let abandoned = revalidate(&previous, &taken, &base, |_, _| 100).map(|c| c.claim_names());
        assert_eq!(abandoned, Err(Invalidated::Churn));
        let closed = revalidate(&previous, &[empty("a")], &base, |_, _| 0).map(|c| c.claim_names());
        assert_eq!(closed, Err(Invalidated::Budget));
    }

    #[test]
    fn a_replacement_goes_on_as_a_deletion_but_a_deletion_never_turns_into_a_launch() {
        let replace = Decision::Replace(consolidation::Replacement {
            claim: joist_scheduling::NewClaim {
                node_pool: 0,
                requirements: Default::default(),
                instance_types: vec![0],
                price: 0.05,
                requests: Default::default(),
                pods: vec![0],
            },
            price: 0.05,
        });
        assert!(still_holds(&Decision::Delete, &Decision::Delete));
        assert!(still_holds(&replace, &replace));
        assert!(
            still_holds(&replace, &Decision::Delete),
            "its pods now fit on the nodes left: nothing to launch"
        );
        assert!(
            !still_holds(&Decision::Delete, &replace),
            "a deletion that now needs a new node is decided again, not launched unvalidated"
        );
    }

    #[test]
    fn drift_takes_the_longest_drifted_node_first() {
        let (read, _writers) = ReadModel::new();
        let input = Input::default();
        let base = bare(&read, &input);
        // In the order the candidates are ranked for consolidation, the recent one comes first.
        let candidates = [drifted("recent", 60), drifted("old", 3600)];
        let taken: Vec<Vec<String>> = (plan(&candidates, &[], &base, |_, _| 1).commands.iter())
            .map(Command::claim_names)
            .collect();
        assert_eq!(
            taken,
            [["old"]],
            "one node a budget of one allows: the one drifted first"
        );
    }
}

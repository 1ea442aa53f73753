//! The DisruptionPlanner (DESIGN.md §3): removes empty nodes, replaces drifted ones and
//! consolidates underused ones, to Karpenter's semantics and safety rules.
//!
//! Every [`PASS_INTERVAL`] (and on [`PlanNow`]), once the read model is synced, a pass:
//!
//! 1. builds the cluster problem once ([`crate::problem`]), the candidates and the nodes they may
//!    not be disrupted for ([`candidates`]), and each NodePool's budget ([`budgets`]);
//! 2. marks every NodeClaim's `Drifted` condition ([`drift`]), which the next pass acts on;
//! 3. tries the methods in Karpenter's order ([`methods`]), unless nothing they depend on changed
//!    since a pass that found nothing ([`memo`]); a node that cannot go is told why
//!    (`Unconsolidatable`), a blocked one too (`DisruptionBlocked`);
//! 4. for emptiness and consolidation (not drift, as Karpenter), waits [`VALIDATION_DELAY`] (once
//!    for all the pass's commands) and decides each again over fresh state, the ones validated
//!    before it already in flight and the ones after it still holding what they were decided
//!    with: the same candidates must still be candidates, within budgets,
//!    with the same outcome (or a deletion where it replaced: [`methods::revalidate`]), or nothing
//!    happens. Meanwhile the candidates' Nodes carry a `PreferNoSchedule` taint
//!    ([`orchestrate::steer_away`]), removed from those the validation leaves out;
//! 5. starts each command ([`orchestrate`]: taint, launch and wait for the replacements, delete; a
//!    failure rolls it back) and goes on at once: commands run side by side, each holding its
//!    candidates and the room it counted on ([`in_flight`]) until it is done, and the budgets,
//!    which count what is in flight, bound how many.
//!
//! One pass runs at a time; passes asked for meanwhile fold into one more, and a pass that started
//! commands asks for another at once (the budgets may allow more). The first pass removes the
//! `karpenter.sh/disrupted` and candidates' taints a crash left on nodes whose NodeClaims are not
//! being deleted.
//! Failures of a pass are logged; the next pass starts from the cluster again.

pub mod blockers;
pub mod candidates;
pub mod drift;
pub mod in_flight;
pub mod methods;
pub mod orchestrate;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use actix::prelude::*;
use joist_messages::{
    apis::{NodeClaim, NodePool, nodepool::DisruptionReason},
    conditions::{ConditionStatus, ConditionType, ConditionUpdate, is_true},
    labels::NODEPOOL,
};
use joist_scheduling::{
    Input,
    consolidation::{Decision, Settings},
};
use kube::ResourceExt;

use self::{
    blockers::{Blocker, Verdicts},
    candidates::{Candidate, Collected, PoolTypes},
    in_flight::{Held, Holding, InFlight, Ticket},
    methods::{Base, Command, Invalidated, Method, Plan, Rejection},
};
use crate::{
    decide::budgets,
    decide::claim_template,
    decide::fold::Fold,
    decide::lifecycle::{is_disrupted, node_ready},
    decide::memo::{Fingerprint, Memo},
    decide::offered::Offered,
    effects::faults::Step,
    effects::kube_ops,
    effects::metrics::{
        ConsolidationTypeLabels, MoveLabels, PoolBlockerLabels, PoolReasonLabels, ReasonLabels,
    },
    problem::{self, LeftOut, Problem},
    shared::Shared,
    state::{read_model::ReadModel, snapshot},
};

/// How often the planner looks for something to do (Karpenter's idle requeue).
pub const PASS_INTERVAL: Duration = Duration::from_secs(10);

/// How long a decision waits before it is checked against fresh state and carried out.
pub const VALIDATION_DELAY: Duration = Duration::from_secs(15);

/// Requests for a pass queued before senders see `Full` (one queued is as good as many).
pub const PLANNER_MAILBOX: usize = 8;

/// Look for something to do now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct PlanNow;

/// See the module docs.
pub struct DisruptionPlanner {
    shared: Shared,
    fold: Fold,
    cleaned: bool,
    memo: SharedMemo,
    checks: drift::SharedChecks,
    in_flight: InFlight,
}

/// The memo, shared with the pass that runs (one at a time).
type SharedMemo = Arc<Mutex<Memo>>;

fn lock(memo: &SharedMemo) -> MutexGuard<'_, Memo> {
    memo.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DisruptionPlanner {
    /// A planner over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            fold: Fold::default(),
            cleaned: false,
            memo: SharedMemo::default(),
            checks: drift::SharedChecks::default(),
            in_flight: InFlight::default(),
        }
    }

    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.fold.start() {
            self.run(ctx);
        }
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        let shared = self.shared.clone();
        let clean = !std::mem::replace(&mut self.cleaned, true);
        let memo = self.memo.clone();
        let checks = self.checks.clone();
        let in_flight = self.in_flight.clone();
        ctx.spawn(pass(shared, clean, memo, checks, in_flight).into_actor(self).map(
            |started, planner, ctx| {
                if !started.is_empty() {
                    // Budgets may allow more: look again at once.
                    planner.fold.start();
                }
                for (planned, ticket) in started {
                    planner.start(planned, ticket, ctx);
                }
                if planner.fold.finish() {
                    planner.run(ctx);
                }
            },
        ));
    }

    /// Carries out `planned`, in flight under `ticket`, beside the commands in flight. Its end
    /// asks for no pass of its own: the next periodic one sees the budget it freed, where a pass
    /// per end would cost a look at the whole cluster per disrupted node.
    fn start(&mut self, planned: Planned, ticket: Ticket, ctx: &mut Context<Self>) {
        let shared = self.shared.clone();
        ctx.spawn(async move { orchestrate::run(&shared, planned, &ticket).await }.into_actor(self));
    }
}

impl Actor for DisruptionPlanner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(PLANNER_MAILBOX);
        ctx.run_interval(PASS_INTERVAL, |planner, ctx| planner.kick(ctx));
    }
}

impl Handler<PlanNow> for DisruptionPlanner {
    type Result = ();

    fn handle(&mut self, _msg: PlanNow, ctx: &mut Self::Context) {
        let _span = tracing::debug_span!("disruption_planner.plan_now").entered();
        self.kick(ctx);
    }
}

/// A decision ready to run: the command, and the NodeClaims that replace its candidates.
pub struct Planned {
    /// The command.
    pub command: Command,
    /// The replacements to create (none when the command deletes).
    pub replacements: Vec<NodeClaim>,
}

/// One pass (see the module docs): the commands to start, each already in flight.
async fn pass(
    shared: Shared,
    clean: bool,
    memo: SharedMemo,
    checks: drift::SharedChecks,
    in_flight: InFlight,
) -> Vec<(Planned, Ticket)> {
    shared.read.synced().await;
    if clean {
        orchestrate::remove_stale_taints(&shared).await;
    }
    let started = tokio::time::Instant::now();
    let decided = decide(&shared, None, &memo, Some(&checks), &in_flight).await;
    let seconds = started.elapsed().as_secs_f64();
    shared.metrics.reconciled("disruption", "success", seconds);
    let (now, to_validate): (Vec<Planned>, Vec<Planned>) = decided
        .into_iter()
        .partition(|planned| planned.command.method == Method::Drift);
    let mut started = Vec::new();
    for planned in now {
        tracing::info!(
            method = planned.command.method.name(),
            candidates = ?planned.command.claim_names(),
            "disruption decided"
        );
        let ticket = hold(&in_flight, &planned.command);
        started.push((planned, ticket));
    }
    if to_validate.is_empty() {
        return started;
    }
    for planned in &to_validate {
        let command = &planned.command;
        tracing::info!(
            method = command.method.name(),
            candidates = ?command.claim_names(),
            savings_per_hour = command.savings(),
            "disruption decided; validating in {}s",
            VALIDATION_DELAY.as_secs()
        );
    }
    // Meanwhile kube-scheduler places pods elsewhere first: the evicted pods of the commands
    // before these would otherwise land on their nodes, the emptiest first.
    for candidate in to_validate.iter().flat_map(|p| &p.command.candidates) {
        orchestrate::steer_away(&shared, &candidate.node_name()).await;
    }
    shared.settings.faults.reach(Step::DisruptionSteered).await;
    // One wait for the pass's commands, then each decided again in turn
    // ([`InFlight::validate_in_turn`]): no two count on the same room, and none takes the nodes or
    // the room of a command decided beside it.
    let (shared, memo, in_flight) = (&shared, &memo, &in_flight);
    let validated = in_flight
        .validate_in_turn(
            to_validate,
            |p| held(&p.command),
            VALIDATION_DELAY,
            |planned| async move {
                let validated = validate(shared, &planned.command, memo, in_flight).await;
                let kept = validated
                    .as_ref()
                    .map(|v| v.command.claim_names())
                    .unwrap_or_default();
                for candidate in &planned.command.candidates {
                    if !kept.contains(&candidate.claim.name_any()) {
                        orchestrate::stop_steering(shared, &candidate.node_name()).await;
                    }
                }
                validated
            },
        )
        .await;
    started.extend(validated);
    started
}

/// Puts `command` in flight: what it holds stays out of later decisions until the ticket drops.
fn hold(in_flight: &InFlight, command: &Command) -> Ticket {
    in_flight.start(held(command))
}

/// What `command` holds from its start: its candidates and the nodes it counted on.
fn held(command: &Command) -> Held {
    Held {
        candidates: command.claim_names(),
        onto: command.onto.clone(),
        replacements: Vec::new(),
    }
}

/// Decides `previous` again, after [`VALIDATION_DELAY`]: the command as it stands now, or `None`
/// when it no longer holds.
async fn validate(
    shared: &Shared,
    previous: &Command,
    memo: &SharedMemo,
    in_flight: &InFlight,
) -> Option<Planned> {
    match decide(shared, Some(previous), memo, None, in_flight).await.pop() {
        Some(validated) => {
            if matches!(previous.decision, Decision::Replace(_))
                && matches!(validated.command.decision, Decision::Delete)
            {
                tracing::info!(
                    candidates = ?previous.claim_names(),
                    "the replacement is not needed any more: its pods now fit on the nodes left"
                );
            }
            let kept = validated.command.claim_names();
            if kept.len() < previous.candidates.len() {
                let left_out: Vec<String> = previous
                    .claim_names()
                    .into_iter()
                    .filter(|name| !kept.contains(name))
                    .collect();
                tracing::info!(
                    candidates = ?left_out,
                    "left out of the disruption: no longer empty, past the budget, or their pods no longer fit beside the nodes kept"
                );
            }
            Some(validated)
        }
        None => {
            tracing::info!(
                candidates = ?previous.claim_names(),
                "disruption abandoned: the cluster changed and the decision no longer holds"
            );
            shared
                .metrics
                .disruption_failed_validations
                .get_or_create(&ConsolidationTypeLabels {
                    consolidation_type: previous.method.consolidation_type().to_owned(),
                })
                .inc();
            None
        }
    }
}

/// Decides what to do now, beside the commands `in_flight`; with `previous`, only whether that
/// command still holds (same candidates, within budgets, same kind of outcome), and with what
/// replacements. With `checks`, marks drift first.
async fn decide(
    shared: &Shared,
    previous: Option<&Command>,
    memo: &SharedMemo,
    checks: Option<&drift::SharedChecks>,
    in_flight: &InFlight,
) -> Vec<Planned> {
    let read = &shared.read;
    // Counted before anything is read: a watch event that lands while the pass reads (the echo of
    // its own drift marks, pods deleted meanwhile) must make the next pass look again, not be taken
    // for part of what this one saw. So is what is in flight.
    let changes = read.changes();
    let generation = in_flight.generation();
    let holding = in_flight.holding();
    let now = shared.clock.now_seconds();
    let initialized = |c: &NodeClaim| {
        c.status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, ConditionType::Initialized))
    };
    if !read.node_claims().iter().any(|c| initialized(c)) {
        // Nothing could be a candidate: spare the catalog and the simulation.
        return Vec::new();
    }
    // The nodes and their pods come after the candidates, once there is something to simulate.
    let Judged {
        mut input,
        pools,
        collected,
        ..
    } = judge(shared, now).await;
    if previous.is_none() {
        for (claim, consolidatable) in &collected.stale_conditions {
            write_consolidatable(shared, claim, *consolidatable).await;
        }
        for b in &collected.blocked {
            let message = match b.blocker {
                Some(blocker) => format!("Cannot disrupt Node: {} (blocker: {blocker})", b.reason),
                None => format!("Cannot disrupt Node: {}", b.reason),
            };
            shared
                .events
                .normal(b.candidate.node.as_ref(), "DisruptionBlocked", &message);
        }
    }
    // After the writes above, which carry the versions the pass read: drift's own writes would
    // make them stale. What drift marks, the next pass acts on.
    if let Some(checks) = checks {
        drift::mark(shared, &pool_types(&pools, &input), checks).await;
    }
    let Collected {
        mut candidates,
        mut eventual,
        settling,
        balanced_totals,
        blocked,
        ..
    } = collected;
    let mut verdicts = Verdicts::default();
    for b in &blocked {
        if let Some(blocker) = b.blocker {
            b.candidate.held_by(&mut verdicts, blocker);
        }
    }
    let held_nodes = held_nodes(read, &holding);
    let free = |c: &Candidate| {
        let claim = c.claim.name_any();
        !holding.candidates.contains(&claim)
            && !holding.replacements.contains(&claim)
            && !held_nodes.contains(&c.node_name())
    };
    candidates.retain(free);
    eventual.retain(free);
    let budgets = Budgets::of(shared, pools.clone(), &holding, now);
    let allowed = |pool: &str, reason: DisruptionReason| budgets.allowed(pool, reason);
    let fingerprint = Fingerprint {
        changes,
        in_flight: generation,
        candidates: candidates
            .iter()
            .map(|c| (c.claim.name_any(), c.consolidatable, c.waits_for_pool))
            .collect(),
        allowances: pools
            .iter()
            .map(|p| {
                let name = p.name_any();
                let empty = allowed(&name, DisruptionReason::Empty);
                let underutilized = allowed(&name, DisruptionReason::Underutilized);
                let drifted = allowed(&name, DisruptionReason::Drifted);
                (name, empty, underutilized, drifted)
            })
            .collect(),
    };
    if previous.is_none() {
        count_pass(shared, &candidates, &eventual, &fingerprint.allowances);
        if lock(memo).still_idle(&fingerprint) {
            return Vec::new();
        }
        if candidates.is_empty() && eventual.is_empty() {
            // Nothing to simulate: a cluster still filling up spends no pass on its pods.
            report_blockers(shared, &pools, &verdicts);
            lock(memo).idle(fingerprint);
            return Vec::new();
        }
    }
    let (positions, settling, held) = place_nodes(shared, &mut input, &settling, &held_nodes);
    let settings = Settings {
        spot_to_spot: shared.settings.spot_to_spot_consolidation,
    };
    // The search runs off the actors' thread (where the settings put the provisioner's solve):
    // at 10,000 nodes it takes seconds, during which nothing else would run.
    let started = tokio::time::Instant::now();
    let validating = previous;
    let planning = previous.is_none();
    let previous = previous.cloned();
    let read = read.clone();
    let simulated = shared.settings.solver.run(move || {
        let base = Base {
            read: &read,
            input: &input,
            positions,
            settling,
            held,
            settings,
            balanced: balanced_totals,
        };
        let allowed = |pool: &str, reason: DisruptionReason| budgets.allowed(pool, reason);
        let outcome = match &previous {
            None => methods::plan(&candidates, &eventual, &base, allowed),
            Some(previous) => match methods::revalidate(previous, &candidates, &base, allowed) {
                Ok(command) => Plan {
                    commands: vec![command],
                    ..Plan::default()
                },
                Err(invalidated) => Plan {
                    invalidated: Some(invalidated),
                    ..Plan::default()
                },
            },
        };
        (outcome, input)
    });
    let Some((
        Plan {
            commands,
            refusals,
            rejections,
            verdicts: judged,
            invalidated,
        },
        input,
    )) = simulated.await
    else {
        return Vec::new();
    };
    if planning {
        let reason = commands.first().map_or(UNDERUTILIZED, |c| reason_label(c.reason));
        shared
            .metrics
            .disruption_evaluation_duration
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
        for (candidate, refusal) in &refusals {
            let blocker = Blocker::of_refusal(refusal);
            shared.events.normal(
                candidate.claim.as_ref(),
                "Unconsolidatable",
                &format!("{refusal} (blocker: {blocker})"),
            );
        }
        report_moves(shared, &commands, &rejections);
        verdicts.extend(judged);
        report_blockers(shared, &pools, &verdicts);
        if commands.is_empty() {
            lock(memo).idle(fingerprint);
        } else {
            lock(memo).forget();
        }
    } else if let (Some(abandoned), Some(invalidated)) = (validating, invalidated) {
        report_invalidated(shared, abandoned, &invalidated);
    }
    commands
        .into_iter()
        .filter_map(|command| {
            let new_claims = match &command.decision {
                Decision::Delete => Vec::new(),
                Decision::Replace(replacement) => vec![&replacement.claim],
                Decision::Relaunch(claims) => claims.iter().collect(),
            };
            let replacements = new_claims
                .into_iter()
                .map(|claim| {
                    let pool = pools.get(claim.node_pool)?;
                    Some(claim_template::node_claim(pool, claim, &input.instance_types))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Planned {
                command,
                replacements,
            })
        })
        .collect()
}

/// What a pass starts from: the cluster problem (no nodes yet, no pods), its NodePools in the
/// same order, and every candidate and blocked node.
pub struct Judged {
    /// The problem.
    pub input: Input,
    /// The NodePools, by position in `input.node_pools`.
    pub pools: Vec<Arc<NodePool>>,
    /// The candidates and the blocked nodes.
    pub collected: Collected,
    /// The NodePools left out of the problem, with why.
    pub left_out: Vec<LeftOut>,
}

/// Builds the problem and collects the candidates as of `now` (epoch seconds); reads only.
pub async fn judge(shared: &Shared, now: i64) -> Judged {
    let Problem {
        input,
        pools,
        left_out,
    } = problem::cluster(shared, Vec::new()).await;
    let collected = candidates::collect(
        &shared.read,
        (&shared.buffers, &shared.freeing),
        &pool_types(&pools, &input),
        now,
    );
    Judged {
        input,
        pools,
        collected,
        left_out,
    }
}

/// Each of `pools`' instance types in `input`, by NodePool name.
pub fn pool_types<'a>(pools: &[Arc<NodePool>], input: &'a Input) -> PoolTypes<'a> {
    pools
        .iter()
        .zip(&input.node_pools)
        .map(|(pool, pool_input)| {
            let range = match (
                pool_input.instance_types.first(),
                pool_input.instance_types.last(),
            ) {
                (Some(&first), Some(&last)) => first..last + 1,
                _ => 0..0,
            };
            (pool.name_any(), Offered::new(&input.instance_types[range]))
        })
        .collect()
}

/// Puts the pass's nodes into `input` (the initialized ones, a CapacityBuffer's room on them kept
/// taken: no consolidation moves pods into it) and says where each stands: positions by Node
/// name, and the positions of the `settling` nodes and of the `held` ones.
pub fn place_nodes(
    shared: &Shared,
    input: &mut Input,
    settling: &[String],
    held: &BTreeSet<String>,
) -> (BTreeMap<String, usize>, Vec<usize>, Vec<usize>) {
    input.nodes = snapshot::existing_nodes(&shared.read);
    input.nodes.retain(|n| n.initialized);
    for node in &mut input.nodes {
        node.pods.extend(shared.buffers.held_on(&node.name));
    }
    let positions: BTreeMap<String, usize> = input
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let at = |names: &mut dyn Iterator<Item = &String>| -> Vec<usize> {
        names.filter_map(|n| positions.get(n).copied()).collect()
    };
    let settling = at(&mut settling.iter());
    let held = at(&mut held.iter());
    (positions, settling, held)
}

/// Counts each consolidation command, and each move the `Balanced` score refused, in every
/// NodePool it takes nodes of; for a Balanced pool observes its score, and for an approved move
/// records Karpenter's `ConsolidationApproved` (on the node and its NodeClaim for one node, on the
/// NodePool for several). A refused move gets no event, as in Karpenter: there are too many.
fn report_moves(shared: &Shared, commands: &[Command], rejections: &[Rejection]) {
    let approved = commands
        .iter()
        .filter(|c| matches!(c.method, Method::MultiNode | Method::SingleNode))
        .map(|c| (&c.candidates, &c.scores, true));
    let refused = rejections.iter().map(|r| (&r.candidates, &r.scores, false));
    for (candidates, scores, approved) in approved.chain(refused) {
        let pools: BTreeMap<String, &Arc<NodePool>> =
            candidates.iter().map(|c| (c.pool.name_any(), &c.pool)).collect();
        for (name, pool) in pools {
            let score = scores.get(&name);
            let decision = |approved: bool| if approved { "approved" } else { "rejected" }.to_owned();
            let labels = |decision: String| MoveLabels {
                decision,
                nodepool: name.clone(),
                policy: format!("{:?}", pool.spec.disruption.consolidation_policy),
            };
            shared
                .metrics
                .consolidation_moves
                .get_or_create(&labels(decision(approved)))
                .inc();
            let Some(score) = score else {
                continue;
            };
            shared
                .metrics
                .consolidation_score
                .get_or_create(&labels(decision(score.approved())))
                .observe(score.value());
            if !approved {
                continue;
            }
            let message = score.message();
            match candidates.as_slice() {
                [one] => {
                    shared
                        .events
                        .normal(one.node.as_ref(), "ConsolidationApproved", &message);
                    shared
                        .events
                        .normal(one.claim.as_ref(), "ConsolidationApproved", &message);
                }
                _ => shared
                    .events
                    .normal(pool.as_ref(), "ConsolidationApproved", &message),
            }
        }
    }
}

/// What each NodePool's budgets allow now, less what is already disrupting.
pub struct Budgets {
    pools: Vec<Arc<NodePool>>,
    /// Per NodePool: its nodes, and those disrupting ([`budget_counts`]).
    counts: BTreeMap<String, (u32, u32)>,
    now: i64,
}

impl Budgets {
    /// The budgets of `pools` at `now`, counting what `holding` holds as disrupting.
    pub fn of(shared: &Shared, pools: Vec<Arc<NodePool>>, holding: &Holding, now: i64) -> Self {
        Self {
            counts: budget_counts(shared, holding),
            pools,
            now,
        }
    }

    /// Disruptions `pool` allows for `reason` (none for a NodePool not in this pass).
    pub fn allowed(&self, pool: &str, reason: DisruptionReason) -> u32 {
        self.allowed_at(pool, reason, self.now)
    }

    /// Disruptions `pool` would allow for `reason` at `at` (epoch seconds), the nodes and those
    /// disrupting as they are now.
    pub fn allowed_at(&self, pool: &str, reason: DisruptionReason, at: i64) -> u32 {
        let Some(found) = self.pools.iter().find(|p| p.name_any() == pool) else {
            return 0;
        };
        let (nodes, disrupting) = self.counts.get(pool).copied().unwrap_or((0, 0));
        budgets::allowed(found, reason, nodes, disrupting, at)
    }
}

/// The Nodes the commands in flight hold: their candidates', those they counted pods onto, and
/// their replacements' (once registered).
fn held_nodes(read: &ReadModel, holding: &Holding) -> BTreeSet<String> {
    let node_of = |claim: &String| read.node_claim(claim)?.status.as_ref()?.node_name.clone();
    holding
        .candidates
        .iter()
        .chain(&holding.replacements)
        .filter_map(node_of)
        .chain(holding.onto.iter().cloned())
        .collect()
}

const EMPTY: &str = "empty";
const UNDERUTILIZED: &str = "underutilized";
const DRIFTED: &str = "drifted";

/// The metric label of a disruption reason.
pub(crate) fn reason_label(reason: DisruptionReason) -> &'static str {
    match reason {
        DisruptionReason::Empty => EMPTY,
        DisruptionReason::Underutilized => UNDERUTILIZED,
        DisruptionReason::Drifted => DRIFTED,
    }
}

/// Sets the gauges of a pass: nodes eligible for each reason, and the disruptions each NodePool's
/// budgets allow.
fn count_pass(
    shared: &Shared,
    candidates: &[Candidate],
    eventual: &[Candidate],
    allowances: &[(String, u32, u32, u32)],
) {
    let metrics = &shared.metrics;
    let empty = candidates.iter().filter(|c| c.pods.is_empty()).count();
    let underutilized = candidates.iter().filter(|c| c.consolidatable).count();
    let drifted = candidates.iter().chain(eventual).filter(|c| c.drifted).count();
    for (reason, count) in [(EMPTY, empty), (UNDERUTILIZED, underutilized), (DRIFTED, drifted)] {
        metrics
            .disruption_eligible_nodes
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    for (pool, empty, underutilized, drifted) in allowances {
        for (reason, allowed) in [(EMPTY, empty), (UNDERUTILIZED, underutilized), (DRIFTED, drifted)] {
            metrics
                .nodepools_allowed_disruptions
                .get_or_create(&PoolReasonLabels {
                    nodepool: pool.clone(),
                    reason: reason.to_owned(),
                })
                .set(i64::from(*allowed));
        }
    }
}

/// Sets `karpenter_voluntary_disruption_candidates_remaining` for every NodePool and blocker from
/// this pass's `verdicts` (zero where none: a blocker gone since the last pass must not linger).
fn report_blockers(shared: &Shared, pools: &[Arc<NodePool>], verdicts: &Verdicts) {
    let counts = verdicts.counts();
    for pool in pools {
        let name = pool.name_any();
        let of_pool = counts.get(name.as_str());
        for blocker in Blocker::ALL {
            shared
                .metrics
                .disruption_candidates_remaining
                .get_or_create(&PoolBlockerLabels {
                    nodepool: name.clone(),
                    blocker: blocker.label().to_owned(),
                })
                .set(of_pool.and_then(|c| c.get(&blocker)).copied().unwrap_or(0));
        }
    }
}

/// Tells each candidate of `abandoned`, a command its validation found `invalidated`, why it
/// stays: Karpenter's `ConsolidationRejected` on its Node and NodeClaim, with the blocker; and
/// counts it under that blocker on `karpenter_voluntary_disruption_candidates_remaining` until
/// the next pass sets the gauge anew. That pass is never skipped as idle: a pass that decided
/// anything forgets its fingerprint (`memo.forget()`), so the next one judges and reports.
fn report_invalidated(shared: &Shared, abandoned: &Command, invalidated: &Invalidated) {
    tracing::info!(
        candidates = ?abandoned.claim_names(),
        reason = invalidated.label(),
        "validation refused the decision: {invalidated}"
    );
    let blocker = invalidated.blocker();
    let decision = match abandoned.decision {
        Decision::Delete => "delete",
        Decision::Replace(_) | Decision::Relaunch(_) => "replace",
    };
    let savings = abandoned.savings();
    let nodes = abandoned.candidates.len();
    for candidate in &abandoned.candidates {
        let command = match nodes {
            1 => format!("{decision}: [{}]", candidate.node_name()),
            _ => format!(
                "{decision}: [{}] (part of {nodes}-node consolidation)",
                candidate.node_name()
            ),
        };
        let message = format!(
            "Consolidation rejected: {command}, reason: {} (savings: ${savings:.2}) (blocker: {blocker})",
            invalidated.label()
        );
        (shared.events).normal(candidate.node.as_ref(), "ConsolidationRejected", &message);
        (shared.events).normal(candidate.claim.as_ref(), "ConsolidationRejected", &message);
        shared
            .metrics
            .disruption_candidates_remaining
            .get_or_create(&PoolBlockerLabels {
                nodepool: candidate.pool.name_any(),
                blocker: blocker.label().to_owned(),
            })
            .inc();
    }
}

/// Per NodePool: its initialized nodes not being deleted, and those already being disrupted
/// (deleting, tainted `karpenter.sh/disrupted`, candidates of a command in flight) or NotReady.
fn budget_counts(shared: &Shared, holding: &Holding) -> BTreeMap<String, (u32, u32)> {
    let read = &shared.read;
    let claims = read.node_claims();
    let mut counts: HashMap<&str, (u32, u32)> = HashMap::new();
    for claim in &claims {
        let Some(pool) = claim.labels().get(NODEPOOL) else {
            continue;
        };
        let Some(status) = claim
            .status
            .as_ref()
            .filter(|s| is_true(&s.conditions, ConditionType::Initialized))
        else {
            continue;
        };
        let node = status
            .provider_id
            .as_deref()
            .and_then(|p| read.node_for_provider(p));
        let deleting = claim.metadata.deletion_timestamp.is_some();
        let disrupted = holding.candidates.contains(&claim.name_any())
            || node.as_ref().is_some_and(|n| is_disrupted(n) || !node_ready(n));
        let entry = counts.entry(pool).or_default();
        if !deleting {
            entry.0 += 1;
        }
        if deleting || disrupted {
            entry.1 += 1;
        }
    }
    counts
        .into_iter()
        .map(|(pool, counted)| (pool.to_owned(), counted))
        .collect()
}

/// Sets a NodeClaim's `Consolidatable` condition; a write that loses a race is left to the next
/// pass.
async fn write_consolidatable(shared: &Shared, claim: &NodeClaim, consolidatable: bool) {
    let update = if consolidatable {
        ConditionUpdate::holds(ConditionType::Consolidatable)
    } else {
        ConditionUpdate::new(
            ConditionType::Consolidatable,
            ConditionStatus::False,
            "NotConsolidatable",
        )
        .with_message("consolidateAfter has not passed since the node last changed")
    };
    let body = kube_ops::claim_conditions_patch(&shared.clock, claim, &[update], serde_json::json!({}));
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    if let Err(error) = kube_ops::patch_status_body(&api, &claim.name_any(), body).await {
        tracing::debug!(nodeclaim = claim.name_any(), %error, "writing Consolidatable failed; next pass");
    }
}

//! The Provisioner: one scheduling simulation per closed batch window, over a snapshot of the read
//! model, and its outcome sent on: NodeClaims to create to their NodePool actors, and a
//! `FailedScheduling` event, naming why, to every pod that fits nowhere.
//!
//! The pods simulated are the pending ones and, after them, the pods of nodes whose NodeClaims are
//! being deleted (Karpenter's `pending + deletingNodePods`): an expiring or interrupted node's pods
//! get one right-sized replacement at once, before its drain evicts them, and once it is counted
//! (in flight or registered) the next pass places them there rather than launching again. Only
//! pending pods are told why they fit nowhere. The nodes a simulation put pods on are nominated
//! for them ([`crate::decide::timing::nomination_window`]): disruption leaves them alone until
//! the pods get there. Each real pod placed on a node is told so with Karpenter's `Nominated`
//! event ([`crate::effects::nominations`]): the pods of a new NodeClaim once it is created.
//!
//! A pending pod planned for a NodeClaim still launching stays on it while it fits there
//! ([`crate::state::planned`]): the pass counts it on that node, as bound, and simulates only the
//! pods not planned for yet.
//!
//! With the `CapacityBuffer` gate on, the CapacityBuffers' virtual pods come last
//! ([`crate::state::buffers`]): they get nodes as pending pods do (the solver orders them among
//! the real pods by size, as Karpenter's does), are told nothing, and the existing nodes they land
//! on are recorded (not nominated) for disruption to keep.
//!
//! Capacity reservations are counted strictly: a pod whose claim could launch into a
//! reservation that earlier claims of the batch already fill waits, with no event, for the next
//! batch ([`joist_scheduling::ReservedOfferingMode::Strict`]).
//!
//! One simulation runs at a time; a batch that arrives meanwhile is folded into one more run. A
//! run ends when its NodeClaims are created (or their creates failed), as Karpenter's provisioner
//! waits for its creates: the next run then counts every claim this one asked for.
//! NodePools are used when Ready and not being deleted; a NodePool whose instance types cannot be
//! listed is skipped for this run and logged. When NodePools are split between replicas
//! ([`crate::state::replica_shards`]), a replica simulates only its own NodePools and the pending pods
//! that belong to them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use actix::prelude::*;
use joist_messages::{apis::NodePool, cached_pod::CachedPod, model::instance_type::InstanceType};
use joist_scheduling::{Input, Reason, ReservedOfferingMode, Solution, pod::PodInfo, solve};
use kube::ResourceExt;

use crate::{
    decide::{fold::Fold, timing::nomination_window},
    effects::{metrics::ControllerLabels, nominations::Target},
    problem::{self, Problem},
    protocol::{LaunchPlan, ProvisionBatch},
    shared::Shared,
    state::{
        buffers::{BufferKey, Provisioned},
        snapshot,
    },
};

/// Batches queued before the Batcher sees `Full` and keeps its window.
pub const PROVISIONER_MAILBOX: usize = 16;

/// See the module docs.
pub struct Provisioner {
    shared: Shared,
    fold: Fold,
}

impl Provisioner {
    /// A provisioner over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            fold: Fold::default(),
        }
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        let shared = self.shared.clone();
        ctx.spawn(provision(shared).into_actor(self).map(|(), provisioner, ctx| {
            if provisioner.fold.finish() {
                provisioner.run(ctx);
            }
        }));
    }
}

impl Actor for Provisioner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(PROVISIONER_MAILBOX);
    }
}

impl Handler<ProvisionBatch> for Provisioner {
    type Result = ();

    fn handle(&mut self, msg: ProvisionBatch, ctx: &mut Self::Context) {
        let _span = tracing::debug_span!("provisioner.batch", pods = msg.pods).entered();
        if self.fold.start() {
            self.run(ctx);
        }
    }
}

/// Tells a pod, with a `FailedScheduling` event, why Joist cannot place it.
fn failed_scheduling(shared: &Shared, pod: &CachedPod, message: &str) {
    shared.events.warn(pod, "FailedScheduling", message);
}

/// One pass: snapshot, simulate, hand out the results.
async fn provision(shared: Shared) {
    let read = &shared.read;
    read.synced().await;
    let mut pass = prepare(&shared).await;
    if shared.settings.acts_cluster_wide() {
        for (pod, why) in &pass.ignored {
            let message = format!("Failed to schedule pod, ignoring it: {why}");
            failed_scheduling(&shared, pod, &message);
        }
    }
    let (input, solution, seconds) = match solve_pass(&shared, &mut pass).await {
        Solved::Nothing => {
            nominate(&shared, pass.held.nodes.iter().map(String::as_str));
            keep_planned(&shared, &pass, None);
            read.provisioned_for(&pass.leaving);
            return;
        }
        Solved::Stopped => return,
        Solved::Solution(solved, seconds) => {
            let (input, solution) = *solved;
            (input, solution, seconds)
        }
    };
    shared
        .metrics
        .scheduling_duration
        .get_or_create(&ControllerLabels {
            controller: "provisioner".to_owned(),
        })
        .observe(seconds);
    shared.metrics.reconciled("provisioner", "success", seconds);
    let waiting = pass.waiting;
    tracing::info!(
        pods = waiting,
        held = pass.held.plans.len(),
        leaving = pass.simulated - waiting,
        buffered = pass.buffers.len(),
        placed = solution.placements.len(),
        new_nodes = solution.claims.len(),
        unschedulable = solution.unschedulable.len(),
        "scheduling simulation"
    );
    remember(&shared, &pass, &input, &solution);
    tell_nominated(&shared, &input, &solution, &pass.pods);
    dispatch(
        &shared,
        input,
        (&pass.pools, &pass.paused),
        (std::mem::take(&mut pass.pods), waiting),
        solution,
    )
    .await;
    read.provisioned_for(&pass.leaving);
}

/// What a provisioning pass would leave in memory, done without acting (`joist explain`): the
/// nodes it would nominate for pods, and the nodes that would hold CapacityBuffers' pods.
pub async fn rehearse(shared: &Shared) {
    let mut pass = prepare(shared).await;
    if let Solved::Solution(solved, _) = solve_pass(shared, &mut pass).await {
        let (input, solution) = &*solved;
        remember(shared, &pass, input, solution);
    }
}

/// What one pass simulates.
struct Pass {
    /// The problem, its pods included (taken by [`solve_pass`]).
    input: Input,
    /// The NodePools of the problem, by position.
    pools: Vec<Arc<NodePool>>,
    /// NodePools left out because their launches are paused, with why.
    paused: Vec<String>,
    /// Pending pods kept on the launching nodes planned for them, counted there as bound.
    held: snapshot::Held,
    /// The real pods simulated, pending ones first.
    pods: Vec<Arc<CachedPod>>,
    /// How many of `pods` are pending (the rest are on nodes being deleted).
    waiting: usize,
    /// How many real pods were simulated.
    simulated: usize,
    /// The buffer of each virtual pod simulated after the real ones.
    buffers: Vec<BufferKey>,
    /// Pending pods that cannot be simulated, with why.
    ignored: Vec<(Arc<CachedPod>, String)>,
    /// The NodeClaims being deleted whose pods were simulated.
    leaving: Vec<String>,
}

/// What came of a pass's simulation.
enum Solved {
    /// Nothing to simulate: no pod waits and no buffer wants room.
    Nothing,
    /// The solver stopped before answering (the process is ending).
    Stopped,
    /// The problem, its solution, and the seconds the solve took.
    Solution(Box<(Input, Solution)>, f64),
}

/// Snapshots the cluster: its pending pods, then the pods of nodes being deleted, then the
/// CapacityBuffers' virtual pods.
async fn prepare(shared: &Shared) -> Pass {
    let read = &shared.read;
    let Problem {
        mut input,
        pools,
        left_out,
    } = problem::cluster(shared, snapshot::existing_nodes(read)).await;
    let paused = (left_out.iter().filter(|l| l.is_paused()))
        .map(ToString::to_string)
        .collect();
    let snapshot::Pending {
        pods: mut pending,
        ignored,
    } = read.with_pending_pods(|pods| snapshot::pending(pods));
    if let Some(shards) = &shared.settings.replica_shards {
        pending = shards.owned_pending(read, pending);
    }
    let held =
        (shared.planned).with(|plans| snapshot::hold_planned(read, plans, &mut input.nodes, &mut pending));
    let waiting = pending.len();
    let leaving = read.leaving_pods();
    let leaving_views = leaving.pods.iter().map(|pod| (pod.clone(), read.pod_info(pod)));
    pending.extend(snapshot::pending(leaving_views).pods);
    let simulated = pending.len();
    let (pods, mut infos): (Vec<Arc<CachedPod>>, Vec<Arc<PodInfo>>) = pending.into_iter().unzip();
    let (buffers, buffer_infos): (Vec<BufferKey>, Vec<Arc<PodInfo>>) =
        buffer_pods(shared).into_iter().unzip();
    infos.extend(buffer_infos);
    input.pods = infos;
    input.options.reserved_offerings = ReservedOfferingMode::Strict;
    Pass {
        input,
        pools,
        paused,
        held,
        pods,
        waiting,
        simulated,
        buffers,
        ignored,
        leaving: leaving.claims,
    }
}

/// Solves the pass's problem off the actors' thread; with nothing to simulate, no buffer holds
/// room.
async fn solve_pass(shared: &Shared, pass: &mut Pass) -> Solved {
    if pass.input.pods.is_empty() {
        shared.buffers.placed(HashMap::new(), BTreeMap::new());
        return Solved::Nothing;
    }
    let input = std::mem::take(&mut pass.input);
    let started = tokio::time::Instant::now();
    let solved = shared.settings.solver.run(move || {
        let solution = solve(&input);
        (input, solution)
    });
    match solved.await {
        Some(solved) => Solved::Solution(Box::new(solved), started.elapsed().as_secs_f64()),
        None => Solved::Stopped,
    }
}

/// Remembers what the pass counted on: the nodes its real pods go to, or are held on, are
/// nominated, the nodes its buffers' virtual pods go to hold them, and its pending pods stay
/// planned for the launching nodes it put or held them on.
fn remember(shared: &Shared, pass: &Pass, input: &Input, solution: &Solution) {
    let placed = (solution.placements.iter())
        .filter(|placement| placement.pod < pass.simulated)
        .filter_map(|placement| input.nodes.get(placement.node))
        .map(|node| node.name.as_str());
    nominate(shared, placed.chain(pass.held.nodes.iter().map(String::as_str)));
    record_buffers(shared, input, solution, (pass.simulated, &pass.buffers));
    keep_planned(shared, pass, Some((input, solution)));
}

/// Replaces the plans of the last pass with this one's: the pods it held, and the pending pods its
/// `solved` problem put on a launching node (the pods of the NodeClaims it creates are planned
/// for them once created, [`crate::claim_creation`]).
fn keep_planned(shared: &Shared, pass: &Pass, solved: Option<(&Input, &Solution)>) {
    let mut plans = pass.held.plans.clone();
    if let Some((input, solution)) = solved {
        let mut claims: HashMap<usize, Option<String>> = HashMap::new();
        for placement in solution.placements.iter().filter(|p| p.pod < pass.waiting) {
            let Some(node) = input.nodes.get(placement.node).filter(|node| !node.initialized) else {
                continue;
            };
            let claim = claims
                .entry(placement.node)
                .or_insert_with(|| snapshot::claim_of_node(&shared.read, &node.name));
            if let Some(claim) = claim {
                plans.insert(input.pods[placement.pod].uid.clone(), claim.clone());
            }
        }
    }
    shared.planned.replace(plans);
}

/// The CapacityBuffers' virtual pods this replica simulates (with the gate on), each with its
/// buffer; a pod that cannot be simulated is logged and left out.
fn buffer_pods(shared: &Shared) -> Vec<(BufferKey, Arc<PodInfo>)> {
    if !shared.settings.capacity_buffer {
        return Vec::new();
    }
    let read = &shared.read;
    let mut keys = HashMap::new();
    let mut pods = Vec::new();
    for (key, pod) in shared.buffers.pods() {
        match read.fresh_pod_info(&pod) {
            Ok(info) => {
                keys.insert(info.uid.clone(), key);
                pods.push((pod, Arc::new(info)));
            }
            Err(error) => tracing::debug!(pod = pod.name_any(), %error, "a buffer's pod cannot be simulated"),
        }
    }
    if let Some(shards) = &shared.settings.replica_shards {
        pods = shards.owned_pending(read, pods);
    }
    pods.into_iter()
        .filter_map(|(_, info)| Some((keys.remove(&info.uid)?, info)))
        .collect()
}

/// Records where the simulation put the buffers' virtual pods (the pods from `first` on, of
/// `buffers` in order): the existing nodes holding them, and each buffer's outcome.
fn record_buffers(
    shared: &Shared,
    input: &Input,
    solution: &Solution,
    (first, buffers): (usize, &[BufferKey]),
) {
    let buffer_of = |pod: usize| pod.checked_sub(first).and_then(|i| buffers.get(i));
    let mut held: HashMap<String, Vec<Arc<PodInfo>>> = HashMap::new();
    let mut provisioned: BTreeMap<BufferKey, Provisioned> = buffers
        .iter()
        .map(|key| (key.clone(), Provisioned::NeedsNodes))
        .collect();
    // Each buffer's pods not yet placed on a node there is.
    let mut unplaced: BTreeMap<&BufferKey, usize> = BTreeMap::new();
    for key in buffers {
        *unplaced.entry(key).or_default() += 1;
    }
    for placement in &solution.placements {
        let (Some(key), Some(node)) = (buffer_of(placement.pod), input.nodes.get(placement.node)) else {
            continue;
        };
        held.entry(node.name.clone())
            .or_default()
            .push(input.pods[placement.pod].clone());
        if let Some(left) = unplaced.get_mut(key) {
            *left -= 1;
        }
    }
    for (key, left) in unplaced {
        if left == 0 {
            provisioned.insert(key.clone(), Provisioned::Fits);
        }
    }
    shared.buffers.placed(held, provisioned);
}

/// Nominates the existing and in-flight `nodes` a pass counted on for real pods (it put them
/// there, or held them there): until the pods get there, disruption must not take the room away.
fn nominate<'a>(shared: &Shared, nodes: impl Iterator<Item = &'a str>) {
    let nodes: BTreeSet<&str> = nodes.collect();
    let now = shared.clock.now_seconds();
    let window = nomination_window(shared.settings.batch_max).as_secs();
    let until = now.saturating_add(i64::try_from(window).unwrap_or(i64::MAX));
    shared
        .read
        .nominate(nodes.into_iter().map(str::to_owned), now, until);
}

/// Tells each real pod (of `pods`, the simulation's first) the existing or launching node the
/// simulation put it on (`Nominated`: its NodeClaim, and its Node once registered), as
/// Karpenter does, until the rate of nominations allows no more.
fn tell_nominated(shared: &Shared, input: &Input, solution: &Solution, pods: &[Arc<CachedPod>]) {
    let read = &shared.read;
    // Each node's NodeClaim and Node, worked out once: (claim, node) by the node's position.
    let mut targets: HashMap<usize, (Option<String>, Option<String>)> = HashMap::new();
    for placement in &solution.placements {
        if !shared.events.can_nominate() {
            return;
        }
        let (Some(pod), Some(node)) = (pods.get(placement.pod), input.nodes.get(placement.node)) else {
            continue;
        };
        let (claim, node) = targets.entry(placement.node).or_insert_with(|| {
            // Still launching, it goes by its NodeClaim's name alone.
            let registered = read.node(&node.name).map(|_| node.name.clone());
            (snapshot::claim_of_node(read, &node.name), registered)
        });
        let target = Target {
            claim: claim.as_deref(),
            node: node.as_deref(),
        };
        shared.events.nominated(pod.as_ref(), target);
    }
}

/// Sends the claims to their NodePools and tells unschedulable pending pods (the first
/// `waiting` of the simulation's real pods, `simulated`) why.
async fn dispatch(
    shared: &Shared,
    input: Input,
    (pools, paused): (&[Arc<NodePool>], &[String]),
    (simulated, waiting): (Vec<Arc<CachedPod>>, usize),
    solution: Solution,
) {
    let mut plans: BTreeMap<usize, Vec<_>> = BTreeMap::new();
    for claim in solution.claims {
        plans.entry(claim.node_pool).or_default().push(claim);
    }
    let instance_types: Arc<[Arc<InstanceType>]> = input.instance_types.into();
    let pods: Arc<[Arc<CachedPod>]> = simulated.into();
    for (position, claims) in plans {
        let pool = pools[position].clone();
        let name = pool.name_any();
        let Some(actor) = shared.directory.node_pools.get(&name).map(|a| a.clone()) else {
            tracing::warn!(
                nodepool = name,
                "no actor for the nodepool; its claims wait for the next batch"
            );
            continue;
        };
        let plan = LaunchPlan {
            pool,
            claims,
            instance_types: instance_types.clone(),
            pods: pods.clone(),
        };
        // No timeout: the next pass must count every claim of this plan, and one still being
        // created is in no read model yet (a timed-out wait let a 10,000-claim plan be planned
        // again). Each create is bounded by the client's own timeouts.
        if let Err(error) = actor.launch.send(plan).await {
            tracing::warn!(nodepool = name, %error, "the nodepool actor did not take its launch plan");
        }
    }
    let pending = &pods[..waiting];
    let paused: String = paused.iter().map(|why| format!("; {why}")).collect();
    for unschedulable in &solution.unschedulable {
        let Some(pod) = pending.get(unschedulable.pod) else {
            continue;
        };
        if unschedulable
            .reasons
            .iter()
            .any(|(_, why)| *why == Reason::ReservedCapacity)
        {
            tracing::info!(
                pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                "deferring the scheduling decision: limited reserved offering capacity"
            );
            continue;
        }
        let message = format!("Failed to schedule pod, {unschedulable}{paused}");
        failed_scheduling(shared, pod, &message);
    }
}

//! What a NodeClaim actor does next, decided without I/O: [`decide`] maps what the actor knows
//! ([`Facts`] from the read model and the cloud, its [`Memory`]) to a [`Plan`] of [`Action`]s for
//! the executor and when to look again; [`after_launch`] and [`after_evictions`] map the outcomes
//! of the two actions whose results steer the next move. Every rule of the module docs of
//! [`crate::lifecycle`] is here, and unit-tested here.

use std::{fmt, sync::Arc, time::Duration};

use joist_messages::{
    apis::NodeClaim,
    cached_pod::CachedPod,
    conditions::{self, ClaimDeletion, ConditionStatus, ConditionType, ConditionUpdate, has_status, is_true},
    labels::{
        TERMINATION_FINALIZER,
        annotations::{NODECLAIM_TERMINATION_TIMESTAMP, TAGGED},
    },
    model::{
        quantity::Quantity,
        resources::{Resources, names},
    },
    nodes::{is_ephemeral, node_allocatable},
    pods::{do_not_disrupt, finished, is_mirror, owned_by_daemon_set},
};
use joist_provider::{CloudError, Launch, OfferingKey};
use joist_scheduling::{pod::effective_requests, taints::Toleration};
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Condition};
use kube::ResourceExt;
use tokio::time::Instant;

use super::{
    repair::{BLOCKED_RETRY, Repair},
    timing::{
        EVICTION_WAVE_GAP, INITIALIZATION_TIMEOUT, LAUNCH_TIMEOUT, MINIMUM_DRAIN_TIME, PROVISIONING_WAIT,
        REGISTRATION_TIMEOUT, doubling_backoff,
    },
};

/// A stretch of a NodeClaim's life, one span each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Creation until the instance is launched.
    Launch,
    /// Launch until the Node registered.
    Registration,
    /// Registration until the Node is Ready and its startup taints are gone.
    Initialization,
    /// Deletion until the instance is terminated and the finalizer released.
    Termination,
}

impl Phase {
    /// The span name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Launch => "nodeclaim.launch",
            Self::Registration => "nodeclaim.registration",
            Self::Initialization => "nodeclaim.initialization",
            Self::Termination => "nodeclaim.termination",
        }
    }
}

/// How long the read model may lag the API: a finished phase missing from it, or a claim's pool or
/// class not in it yet, is waited for this long before the actor acts on what it sees.
pub const READ_MODEL_LAG: Duration = Duration::from_secs(30);

/// How soon a launch that failed in a way a retry may fix is first tried again; the wait doubles
/// with each failure in a row, up to [`LAUNCH_RETRY_MAX`], so a throttling cloud is not pressed.
pub const LAUNCH_RETRY: Duration = Duration::from_secs(10);

/// The longest wait between failed launches (the launch timeout still ends the claim at 5 minutes).
pub const LAUNCH_RETRY_MAX: Duration = Duration::from_secs(80);

/// How soon a drain looks again while pods are leaving.
pub const DRAIN_POLL: Duration = Duration::from_secs(1);

/// How soon a terminated instance is looked up again (and terminated again) until the cloud
/// reports it gone, as Karpenter requeues.
pub const INSTANCE_TERMINATION_POLL: Duration = Duration::from_secs(5);

/// How soon a terminating claim looks again while volumes are detaching from its node.
pub const VOLUME_POLL: Duration = Duration::from_secs(1);

/// How soon a drain first tries again when a PodDisruptionBudget refused an eviction (429); the
/// wait doubles with each refusal in a row, up to [`BLOCKED_EVICTION_MAX`] (Karpenter's backoff).
pub const BLOCKED_EVICTION_RETRY: Duration = Duration::from_millis(100);

/// The longest wait between refused evictions.
pub const BLOCKED_EVICTION_MAX: Duration = Duration::from_secs(10);

/// What the actor remembers between steps (lost on restart, rebuilt from the cluster).
#[derive(Debug, Default, Clone)]
pub struct Memory {
    /// The instance launched for the claim: a status write that failed is retried with it
    /// instead of launching a second instance.
    pub launched: Option<Launch>,
    /// A phase this actor just finished, and when, while the read model does not show it yet: a
    /// step taken on that stale view would write the same thing again.
    pub finished: Option<(Phase, Instant)>,
    /// When draining began.
    pub drain_started: Option<Instant>,
    /// When the drain began evicting, and the pod sizes its evictions are ordered by.
    pub eviction_waves: Option<Waves>,
    /// Eviction rounds in a row that a PodDisruptionBudget refused.
    pub refused_evictions: u32,
    /// Launches in a row that failed in a way a retry may fix: the next one first looks for an
    /// instance the failed ones may have started.
    pub failed_launches: u32,
    /// When the next launch may be tried, after a failed one: changes to the claim (its own
    /// `LaunchFailed` condition among them) do not cut the wait short.
    pub launch_retry_at: Option<Instant>,
    /// Since when a registered claim's Node has not been seen.
    pub node_missing_since: Option<Instant>,
}

/// What the actor knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The claim, as the read model has it.
    pub claim: &'a NodeClaim,
    /// The Node registered with the claim's provider ID, if any.
    pub node: Option<&'a Node>,
    /// The pods bound to that Node, once the claim is being deleted (only a drain reads them).
    pub pods: &'a [Arc<CachedPod>],
    /// The pods leaving every node being drained, this one's included, read only when a drain
    /// begins evicting ([`largest_first`]).
    pub leaving: Leaving<'a>,
    /// Whether the claim is being deleted and no provisioning pass has counted those pods yet.
    pub awaiting_provisioning: bool,
    /// Whether the claim's NodePool and node class are in the read model.
    pub pool_and_class_known: bool,
    /// Whether the claim's instance still exists: asked of the cloud only while the claim is being
    /// deleted (`None` otherwise, or when there is no instance to ask about).
    pub instance_exists: Option<bool>,
    /// The VolumeAttachments on the claim's Node that hold its termination (those of volumes no
    /// pod that stays on the node uses), once the claim is being deleted.
    pub volume_attachments: &'a [String],
    /// What node repair makes of the claim's Node ([`Repair::Healthy`] when the gate is off).
    pub repair: &'a Repair,
    /// The clock, in epoch seconds (for the claim's timestamps).
    pub now_seconds: i64,
    /// The monotonic time (for the memory's instants).
    pub now: Instant,
}

/// Reads the pods leaving every node being drained; the read model's scan runs only when a drain
/// takes its snapshot of their sizes, once per drain.
#[derive(Clone, Copy)]
pub struct Leaving<'a>(pub &'a dyn Fn() -> Vec<Arc<CachedPod>>);

impl fmt::Debug for Leaving<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Leaving(..)")
    }
}

/// One thing the executor does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Launch an instance for the claim.
    Launch,
    /// Remember the launch, then write it onto the claim: labels, provider ID, image, capacity,
    /// `Launched=True`.
    RecordLaunch(Box<Launch>),
    /// Tell the Catalog these offerings are out of capacity.
    MarkUnavailable(Vec<OfferingKey>),
    /// Set `Launched=Unknown` with the cloud's message (the launch is retried).
    LaunchFailed(String),
    /// Mark the claim's `DisruptionReason` as `Expired`, then delete it (forceful: no budget
    /// applies).
    Expire,
    /// Mark the claim's `DisruptionReason` as `Unhealthy`, stamp its termination deadline, then
    /// delete it (node repair: forceful, and with a deadline of now nothing waits for a drain).
    Repair {
        /// The broken Node condition (`Ready`).
        condition: String,
        /// Why, for the event and the log.
        message: String,
        /// The termination deadline (epoch seconds).
        deadline: i64,
    },
    /// Warn on the Node that its repair is blocked (`NodeRepairBlocked`).
    RepairBlocked(String),
    /// Set these conditions of the claim in one write.
    ClaimConditions(Vec<ConditionUpdate>),
    /// Annotate the claim with its `terminationGracePeriod` deadline (epoch seconds).
    StampDeadline(i64),
    /// Delete these pods now with this grace period: waiting for their eviction would overrun
    /// the claim's `terminationGracePeriod` (`TerminationGracePeriodExpiring`).
    DeletePods {
        /// The pods.
        pods: Vec<PodRef>,
        /// Seconds left before the deadline.
        grace_seconds: i64,
    },
    /// Delete the claim, with an event giving the reason.
    DeleteClaim {
        /// Karpenter's reason.
        reason: ClaimDeletion,
        /// Why, for the event and the log.
        message: String,
    },
    /// Copy the claim's labels, finalizer and ownership onto the Node, remove the
    /// `karpenter.sh/unregistered` taint, and mark the claim `Registered`.
    Register,
    /// Label the Node initialized and mark the claim `Initialized` and `Ready`.
    Initialize,
    /// Name the instance after its Node, then annotate the claim `karpenter.k8s.aws/tagged`.
    NameInstance {
        /// The instance.
        provider_id: String,
        /// The Node's name.
        node_name: String,
    },
    /// Taint the Node `karpenter.sh/disrupted:NoSchedule` and exclude it from load balancers.
    Taint,
    /// Evict these pods through the Eviction API (each with its UID as a precondition).
    Evict(Vec<PodRef>),
    /// Terminate the instance.
    TerminateInstance(String),
    /// Remove Joist's finalizer from the Node, then delete it unless it is already being deleted.
    ReleaseNode,
    /// Remove Joist's finalizer from the claim: the claim is gone.
    ReleaseClaim,
}

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID: the eviction is refused if the name now belongs to another pod.
    pub uid: String,
}

/// When to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// When something changes.
    OnChange,
    /// After this long (or sooner, on a change).
    After(Duration),
    /// The claim is gone: the actor stops.
    Gone,
}

impl Next {
    /// This, but no later than `left` from now.
    pub fn sooner(self, left: Duration) -> Self {
        match self {
            Next::OnChange => Next::After(left),
            Next::After(wait) => Next::After(wait.min(left)),
            Next::Gone => Next::Gone,
        }
    }
}

/// Actions in order, then when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What to do, in order; the executor stops at the first that fails.
    pub actions: Vec<Action>,
    /// When to look again once they are done.
    pub next: Next,
}

impl Plan {
    fn wait(next: Next) -> Self {
        Self {
            actions: Vec::new(),
            next,
        }
    }

    fn act(actions: Vec<Action>, next: Next) -> Self {
        Self { actions, next }
    }

    fn delete(reason: ClaimDeletion, message: &str) -> Self {
        Self::act(
            vec![Action::DeleteClaim {
                reason,
                message: message.to_owned(),
            }],
            Next::OnChange,
        )
    }
}

/// Whether the claim already shows that `phase` finished.
pub fn shows(claim: &NodeClaim, phase: Phase) -> bool {
    let conditions = claim
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    match phase {
        Phase::Launch => is_true(conditions, ConditionType::Launched),
        Phase::Registration => is_true(conditions, ConditionType::Registered),
        Phase::Initialization => is_true(conditions, ConditionType::Initialized),
        Phase::Termination => released(claim),
    }
}

/// Whether Joist has let the claim go: its termination finalizer is gone, so its termination is
/// finished (or was never Joist's to do).
pub fn released(claim: &NodeClaim) -> bool {
    !claim.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
}

/// The claim's provider ID: from its status, or from a launch not yet written there.
pub fn provider_id(claim: &NodeClaim, memory: &Memory) -> Option<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .or_else(|| Some(memory.launched.as_ref()?.instance.provider_id.clone()))
}

/// The next step for the claim (see the module docs of [`crate::lifecycle`]). `memory.finished`
/// is cleared once the read model shows the phase or the lag is over.
pub fn decide(facts: &Facts<'_>, memory: &mut Memory) -> Plan {
    let claim = facts.claim;
    if let Some((phase, at)) = memory.finished {
        let waited = facts.now.saturating_duration_since(at);
        if !shows(claim, phase) && waited < READ_MODEL_LAG {
            return Plan::wait(Next::After(READ_MODEL_LAG - waited));
        }
        memory.finished = None;
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return terminate(facts, memory);
    }
    let expires_in = expires_in(claim, facts.now_seconds);
    if expires_in.is_some_and(|left| left.is_zero()) {
        return Plan::act(vec![Action::Expire], Next::OnChange);
    }
    let mut plan = live(facts, memory);
    if let Some(left) = expires_in {
        plan.next = plan.next.sooner(left);
    }
    plan
}

/// How long until the claim expires (`expireAfter` since its creation), if it ever does.
pub fn expires_in(claim: &NodeClaim, now_seconds: i64) -> Option<Duration> {
    let lifetime = claim.spec.expire_after.as_ref()?.duration()?.as_std();
    let age = since(now_seconds, created_at(claim));
    Some(lifetime.saturating_sub(age))
}

/// The next step of a claim that is not being deleted and has not expired.
fn live(facts: &Facts<'_>, memory: &mut Memory) -> Plan {
    let claim = facts.claim;
    let status = claim.status.clone().unwrap_or_default();
    let launched = is_true(&status.conditions, ConditionType::Launched) && status.provider_id.is_some();
    if !launched {
        if let Some(launch) = &memory.launched {
            return Plan::act(
                vec![Action::RecordLaunch(Box::new(launch.clone()))],
                Next::OnChange,
            );
        }
        let age = since(facts.now_seconds, created_at(claim));
        if age >= LAUNCH_TIMEOUT {
            return Plan::delete(
                ClaimDeletion::LaunchTimeout,
                "the instance was not launched in time",
            );
        }
        if !facts.pool_and_class_known {
            // Watches of different kinds arrive in any order: a claim seen before its pool or
            // class gets the read model's lag before it is judged.
            if age < READ_MODEL_LAG {
                return Plan::wait(Next::After(READ_MODEL_LAG - age));
            }
            return Plan::delete(
                ClaimDeletion::NodeClassNotReady,
                "its nodepool or node class does not exist",
            );
        }
        let backing_off = memory
            .launch_retry_at
            .map(|at| at.saturating_duration_since(facts.now))
            .filter(|left| !left.is_zero());
        if let Some(left) = backing_off {
            return Plan::wait(Next::After(left));
        }
        return Plan::act(vec![Action::Launch], Next::OnChange);
    }
    memory.launched = None;
    let registered = is_true(&status.conditions, ConditionType::Registered);
    let Some(node) = facts.node else {
        if registered {
            // Watches of different kinds arrive in any order: a registered claim whose Node is
            // not seen yet (its event behind the claim's) gets the read model's lag first.
            let missing = *memory.node_missing_since.get_or_insert(facts.now);
            let waited = facts.now.saturating_duration_since(missing);
            if waited < READ_MODEL_LAG {
                return Plan::wait(Next::After(READ_MODEL_LAG - waited));
            }
            return Plan::delete(ClaimDeletion::NodeDeleted, "its node is gone");
        }
        let left = time_left(
            REGISTRATION_TIMEOUT,
            facts.now_seconds,
            since_condition(claim, ConditionType::Launched),
        );
        if left.is_zero() {
            return Plan::delete(
                ClaimDeletion::RegistrationTimeout,
                "the node did not register in time",
            );
        }
        return Plan::wait(Next::After(left));
    };
    memory.node_missing_since = None;
    if node.metadata.deletion_timestamp.is_some() {
        return Plan::delete(ClaimDeletion::NodeDeleted, "its node is being deleted");
    }
    if !registered {
        return Plan::act(vec![Action::Register], Next::OnChange);
    }
    let mut next = Next::OnChange;
    let mut actions = Vec::new();
    // A node whose kubelet never reported Ready holds its pods' capacity in flight forever:
    // it gets as long as registration did (startup taints and device plugins are not timed).
    if !is_true(&status.conditions, ConditionType::Initialized) && !node_ready(node) {
        let left = time_left(
            INITIALIZATION_TIMEOUT,
            facts.now_seconds,
            since_condition(claim, ConditionType::Registered),
        );
        if left.is_zero() {
            return Plan::delete(
                ClaimDeletion::InitializationTimeout,
                "the node did not become Ready in time",
            );
        }
        next = Next::After(left);
    }
    match facts.repair {
        Repair::Healthy => {}
        Repair::Tolerated(left) => next = next.sooner(*left),
        Repair::Due { condition, message } => {
            let repair = Action::Repair {
                condition: condition.clone(),
                message: message.clone(),
                deadline: facts.now_seconds,
            };
            return Plan::act(vec![repair], Next::OnChange);
        }
        Repair::Blocked { message } => {
            actions.push(Action::RepairBlocked(message.clone()));
            next = next.sooner(BLOCKED_RETRY);
        }
    }
    if !is_true(&status.conditions, ConditionType::Initialized) && initialized(claim, node) {
        actions.push(Action::Initialize);
    }
    if claim.annotations().get(TAGGED).is_none_or(|v| v != "true")
        && let Some(provider_id) = status.provider_id
    {
        actions.push(Action::NameInstance {
            provider_id,
            node_name: node.name_any(),
        });
    }
    Plan::act(actions, next)
}

/// The claim's `status.lastPodEventTime`, in epoch seconds.
pub fn last_pod_event(claim: &NodeClaim) -> Option<i64> {
    Some(claim.status.as_ref()?.last_pod_event_time.as_ref()?.0.as_second())
}

/// What follows a launch attempt: a launch is recorded; a capacity error marks the offerings and
/// deletes the claim (its pods are simulated again without them); an unready node class deletes
/// it; any other error sets `Launched=Unknown` and retries.
pub fn after_launch(outcome: Result<Launch, CloudError>, memory: &mut Memory, now: Instant) -> Plan {
    match outcome {
        Ok(launch) => {
            memory.failed_launches = 0;
            memory.launch_retry_at = None;
            let mut actions = Vec::new();
            if !launch.unavailable.is_empty() {
                actions.push(Action::MarkUnavailable(launch.unavailable.clone()));
            }
            actions.push(Action::RecordLaunch(Box::new(launch)));
            Plan::act(actions, Next::OnChange)
        }
        Err(CloudError::InsufficientCapacity { offerings, message }) => Plan::act(
            vec![
                Action::MarkUnavailable(offerings),
                Action::DeleteClaim {
                    reason: ClaimDeletion::InsufficientCapacity,
                    message,
                },
            ],
            Next::OnChange,
        ),
        Err(error @ CloudError::NodeClassNotReady { .. }) => {
            Plan::delete(ClaimDeletion::NodeClassNotReady, &error.to_string())
        }
        Err(error) => {
            memory.failed_launches = memory.failed_launches.saturating_add(1);
            let wait = doubling_backoff(LAUNCH_RETRY, memory.failed_launches, LAUNCH_RETRY_MAX);
            memory.launch_retry_at = Some(now + wait);
            Plan::act(vec![Action::LaunchFailed(error.to_string())], Next::After(wait))
        }
    }
}

/// When a drain looks again after evicting: soon while pods just leave, after a doubling wait
/// while a PodDisruptionBudget keeps refusing one.
pub fn after_evictions(blocked: bool, memory: &mut Memory) -> Next {
    if !blocked {
        memory.refused_evictions = 0;
        return Next::After(DRAIN_POLL);
    }
    memory.refused_evictions = memory.refused_evictions.saturating_add(1);
    Next::After(doubling_backoff(
        BLOCKED_EVICTION_RETRY,
        memory.refused_evictions,
        BLOCKED_EVICTION_MAX,
    ))
}

/// The termination steps, in Karpenter's order: drain while the instance runs, terminate it until
/// the cloud reports it gone (an instance shutting down still runs the node's pods and holds its
/// volumes), then release the Node (finalizer, then delete) and the claim.
fn terminate(facts: &Facts<'_>, memory: &mut Memory) -> Plan {
    let claim = facts.claim;
    if released(claim) {
        return Plan::wait(Next::OnChange);
    }
    let mut actions = Vec::new();
    if let Some(provider_id) = provider_id(claim, memory) {
        let exists = facts.instance_exists.unwrap_or(true);
        if let (Some(node), true) = (facts.node, exists)
            && let Some(plan) = drain(facts, node, memory)
        {
            return plan;
        }
        if exists {
            let volumes = match volumes_detached(facts) {
                Ok(condition) => condition,
                Err(wait) => return wait,
            };
            let missing = missing_conditions(
                claim,
                vec![
                    ConditionUpdate::holds(ConditionType::Drained),
                    volumes,
                    ConditionUpdate::holds(ConditionType::InstanceTerminating),
                ],
            );
            if !missing.is_empty() {
                // Written alone: the writes after it carry the claim's version.
                return Plan::act(vec![Action::ClaimConditions(missing)], Next::OnChange);
            }
            return Plan::act(
                vec![Action::TerminateInstance(provider_id)],
                Next::After(INSTANCE_TERMINATION_POLL),
            );
        }
        if facts.node.is_some() {
            actions.push(Action::ReleaseNode);
        }
    }
    actions.push(Action::ReleaseClaim);
    Plan::act(actions, Next::OnChange)
}

/// The `VolumesDetached` condition once the instance may go: True when no VolumeAttachment holds
/// it, False once the `terminationGracePeriod` is over; until then, the plan that waits.
fn volumes_detached(facts: &Facts<'_>) -> Result<ConditionUpdate, Plan> {
    if facts.volume_attachments.is_empty() {
        return Ok(ConditionUpdate::holds(ConditionType::VolumesDetached));
    }
    if termination_deadline(facts.claim).is_some_and(|d| facts.now_seconds >= d) {
        return Ok(ConditionUpdate::new(
            ConditionType::VolumesDetached,
            ConditionStatus::False,
            "TerminationGracePeriodElapsed",
        ));
    }
    let awaiting = ConditionUpdate::new(
        ConditionType::VolumesDetached,
        ConditionStatus::Unknown,
        "AwaitingVolumeDetachment",
    );
    let missing = missing_conditions(
        facts.claim,
        vec![ConditionUpdate::holds(ConditionType::Drained), awaiting],
    );
    let actions = if missing.is_empty() {
        Vec::new()
    } else {
        vec![Action::ClaimConditions(missing)]
    };
    Err(Plan::act(actions, Next::After(VOLUME_POLL)))
}

/// The drain of `node`, in Karpenter's tiers: `None` once it is done (no pod left waiting, and
/// the minimum drain time since tainting over), or once the claim's `terminationGracePeriod`
/// deadline has passed (what is left goes with the instance).
///
/// Evictions wait, at most [`PROVISIONING_WAIT`] from the taint, until a provisioning pass has
/// counted the node's pods: their replacement is then on its way, one right-sized node rather than
/// one per evicted pod.
///
/// Pods wait for the drain unless they are mirror pods, finished, stuck terminating, or tolerate
/// `karpenter.sh/disrupted:NoSchedule`. Only the first tier with a pod left is evicted: non-critical
/// pods, then non-critical DaemonSet pods, then critical pods, then critical DaemonSet pods
/// (critical: `system-cluster-critical` or `system-node-critical`). Pods with an active
/// `karpenter.sh/do-not-disrupt` are not evicted: they hold the drain until the deadline. Pods
/// whose own grace period would overrun the deadline are deleted at once, with the time left as
/// their grace period, whatever their tier.
fn drain(facts: &Facts<'_>, node: &Node, memory: &mut Memory) -> Option<Plan> {
    let claim = facts.claim;
    let deadline = termination_deadline(claim);
    if deadline.is_some_and(|d| facts.now_seconds >= d) {
        return None;
    }
    let mut actions = Vec::new();
    let draining = missing_conditions(
        claim,
        vec![ConditionUpdate::new(
            ConditionType::Drained,
            ConditionStatus::Unknown,
            "Draining",
        )],
    );
    if !draining.is_empty() && !claim_conditions(claim).is_some_and(|c| is_true(c, ConditionType::Drained)) {
        actions.push(Action::ClaimConditions(draining));
    }
    if let Some(deadline) = deadline
        && !claim.annotations().contains_key(NODECLAIM_TERMINATION_TIMESTAMP)
    {
        actions.push(Action::StampDeadline(deadline));
    }
    if !is_disrupted(node) {
        actions.push(Action::Taint);
    }
    let started = *memory.drain_started.get_or_insert(facts.now);
    let waiting: Vec<&Arc<CachedPod>> = facts
        .pods
        .iter()
        .filter(|p| waits_for_drain(p, facts.now_seconds))
        .collect();
    let mut expiring = Vec::new();
    if let Some(deadline) = deadline {
        let left = deadline - facts.now_seconds;
        expiring = waiting
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && grace_seconds(p) > left)
            .map(|p| pod_ref(p))
            .collect();
        if !expiring.is_empty() {
            actions.push(Action::DeletePods {
                pods: expiring.clone(),
                grace_seconds: left,
            });
        }
    }
    let provisioning =
        facts.awaiting_provisioning && facts.now.saturating_duration_since(started) < PROVISIONING_WAIT;
    if let Some(first) = waiting.iter().map(|p| tier(p)).min() {
        if provisioning {
            return Some(Plan::act(actions, Next::After(DRAIN_POLL)));
        }
        let evictable: Vec<&Arc<CachedPod>> = waiting
            .iter()
            .copied()
            .filter(|p| {
                tier(p) == first
                    && p.metadata.deletion_timestamp.is_none()
                    && !do_not_disrupt(p, facts.now_seconds)
                    && !expiring.contains(&pod_ref(p))
            })
            .collect();
        let leaving = || {
            let mut leaving = (facts.leaving.0)();
            leaving.retain(|p| tier(p) == first);
            leaving
        };
        match largest_first((&evictable, leaving), facts.now, &mut memory.eviction_waves) {
            Wave::Now(evict) if !evict.is_empty() => actions.push(Action::Evict(evict)),
            Wave::Now(_) => {}
            Wave::After(wait) => return Some(Plan::act(actions, Next::After(wait))),
        }
        // Pods shutting down still run on the instance: it is not terminated under them.
        return Some(Plan::act(actions, Next::After(DRAIN_POLL)));
    }
    let drained_for = facts.now.saturating_duration_since(started);
    (drained_for < MINIMUM_DRAIN_TIME || !actions.is_empty()).then(|| {
        Plan::act(
            actions,
            Next::After(MINIMUM_DRAIN_TIME.saturating_sub(drained_for).max(DRAIN_POLL)),
        )
    })
}

/// When a drain began evicting, and the sizes it orders its evictions by ([`largest_first`]).
#[derive(Debug, Clone)]
pub struct Waves {
    /// The drain's first evictions.
    pub first: Instant,
    /// The distinct sizes of the pods leaving every node being drained then, largest first.
    pub sizes: Vec<PodSize>,
}

/// A pod's requested CPU and memory ([`size`]).
type PodSize = (Quantity, Quantity);

/// What [`largest_first`] evicts.
enum Wave {
    /// These pods, now.
    Now(Vec<PodRef>),
    /// Nothing before this long.
    After(Duration),
}

/// Of the pods a drain may evict (`pods`), the ones it evicts now: for the first
/// [`MINIMUM_DRAIN_TIME`] of its evictions, a size at a time, largest first (requested CPU, then
/// memory, the order the scheduling simulation packs pods in), the sizes ranked among the pods
/// `leaving` every node being drained when it began and each rank [`EVICTION_WAVE_GAP`] after the
/// one before; after that, all of them. Evicted together, small pods reach kube-scheduler beside
/// large ones and may take the room only the large ones fit in, leaving a large pod pending and a
/// node launched for it; ranked on each node alone, a node of small pods drained beside nodes of
/// large ones (a multi-node command) would evict its pods with theirs. A pod whose eviction is
/// refused holds no other.
fn largest_first(
    (pods, leaving): (&[&Arc<CachedPod>], impl FnOnce() -> Vec<Arc<CachedPod>>),
    now: Instant,
    waves: &mut Option<Waves>,
) -> Wave {
    if pods.is_empty() {
        return Wave::Now(Vec::new());
    }
    let sized: Vec<(PodSize, &Arc<CachedPod>)> = pods.iter().map(|p| (size(p), *p)).collect();
    let waves = waves.get_or_insert_with(|| {
        let mut sizes: Vec<PodSize> = sized
            .iter()
            .map(|(size, _)| *size)
            .chain(leaving().iter().map(|p| size(p)))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        Waves { first: now, sizes }
    });
    let since = now.saturating_duration_since(waves.first);
    let rank = |size: &PodSize| waves.sizes.iter().take_while(|s| *s > size).count();
    let wave = if since >= MINIMUM_DRAIN_TIME {
        usize::MAX
    } else {
        usize::try_from(since.as_millis() / EVICTION_WAVE_GAP.as_millis()).unwrap_or(usize::MAX)
    };
    let evict: Vec<PodRef> = sized
        .iter()
        .filter(|(size, _)| rank(size) <= wave)
        .map(|(_, p)| pod_ref(p))
        .collect();
    if evict.is_empty() {
        let next_wave = EVICTION_WAVE_GAP * u32::try_from(wave.saturating_add(1)).unwrap_or(u32::MAX);
        return Wave::After(next_wave.min(MINIMUM_DRAIN_TIME).saturating_sub(since));
    }
    Wave::Now(evict)
}

/// A pod's requested CPU and memory, as the scheduling simulation orders pods (nothing when its
/// requests cannot be read: the simulation could not place it either).
fn size(pod: &CachedPod) -> PodSize {
    pod.spec
        .as_ref()
        .and_then(|spec| effective_requests(&pod.name_any(), spec).ok())
        .map(|requests| (requests.get(names::CPU), requests.get(names::MEMORY)))
        .unwrap_or_default()
}

/// Of `wanted`, the conditions the claim does not show at their status yet.
fn missing_conditions(claim: &NodeClaim, wanted: Vec<ConditionUpdate>) -> Vec<ConditionUpdate> {
    let shown = claim_conditions(claim).unwrap_or_default();
    wanted
        .into_iter()
        .filter(|update| !has_status(shown, update.type_, update.status))
        .collect()
}

fn claim_conditions(claim: &NodeClaim) -> Option<&[Condition]> {
    claim.status.as_ref().map(|s| s.conditions.as_slice())
}

/// The claim's `terminationGracePeriod` deadline in epoch seconds: its annotation, or its deletion
/// time plus the grace period; `None` without a grace period.
pub fn termination_deadline(claim: &NodeClaim) -> Option<i64> {
    if let Some(stamped) = claim
        .annotations()
        .get(NODECLAIM_TERMINATION_TIMESTAMP)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    {
        return Some(stamped.as_second());
    }
    let grace = claim.spec.termination_grace_period?.as_std();
    let deleted = claim.metadata.deletion_timestamp.as_ref()?.0.as_second();
    Some(deleted.saturating_add(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX)))
}

/// A pod's own `terminationGracePeriodSeconds` (30 when unset, as in Kubernetes).
fn grace_seconds(pod: &CachedPod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

/// Whether the node's drain waits for the pod at `now_seconds` (see [`drain`]).
pub fn waits_for_drain(pod: &CachedPod, now_seconds: i64) -> bool {
    !is_mirror(pod) && !finished(pod) && !stuck_terminating(pod, now_seconds) && !tolerates_disrupted(pod)
}

/// How long past its `deletionTimestamp` (its delete plus its grace period) a pod still holds a
/// drain, as Karpenter's: a pod on a node whose kubelet is gone never finishes terminating.
pub const STUCK_TERMINATING_AFTER: i64 = 60;

/// Whether the pod is more than [`STUCK_TERMINATING_AFTER`] past its `deletionTimestamp`.
fn stuck_terminating(pod: &CachedPod, now_seconds: i64) -> bool {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|t| now_seconds > t.0.as_second() + STUCK_TERMINATING_AFTER)
}

fn tolerates_disrupted(pod: &CachedPod) -> bool {
    let taint = disrupted_taint();
    pod.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| Toleration::from(t).tolerates(&taint))
}

/// The order a drain takes pods in, as the kubelet's graceful node shutdown does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainTier {
    /// Pods that are neither critical nor DaemonSet pods: first.
    NonCritical,
    /// DaemonSet pods that are not critical.
    NonCriticalDaemon,
    /// Pods of `system-cluster-critical` or `system-node-critical` priority.
    Critical,
    /// Critical DaemonSet pods: last.
    CriticalDaemon,
}

impl DrainTier {
    /// The tier's name, for reports (`non-critical`, `critical-daemon` …).
    pub fn name(self) -> &'static str {
        match self {
            Self::NonCritical => "non-critical",
            Self::NonCriticalDaemon => "non-critical-daemon",
            Self::Critical => "critical",
            Self::CriticalDaemon => "critical-daemon",
        }
    }
}

/// The pod's drain tier.
pub fn tier(pod: &CachedPod) -> DrainTier {
    let critical = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        .is_some_and(|c| c == "system-cluster-critical" || c == "system-node-critical");
    match (critical, owned_by_daemon_set(pod)) {
        (false, false) => DrainTier::NonCritical,
        (false, true) => DrainTier::NonCriticalDaemon,
        (true, false) => DrainTier::Critical,
        (true, true) => DrainTier::CriticalDaemon,
    }
}

/// Whether the node carries `karpenter.sh/disrupted` (it is being drained, or a disruption is
/// about to drain it).
pub fn is_disrupted(node: &Node) -> bool {
    node_taints(node)
        .iter()
        .any(|t| t.key == joist_messages::labels::taints::DISRUPTED)
}

/// The `karpenter.sh/disrupted:NoSchedule` taint.
pub fn disrupted_taint() -> k8s_openapi::api::core::v1::Taint {
    k8s_openapi::api::core::v1::Taint {
        key: joist_messages::labels::taints::DISRUPTED.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

fn pod_ref(pod: &CachedPod) -> PodRef {
    PodRef {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
    }
}

/// Pods a drain waits for: everything but DaemonSet pods, mirror pods (the kubelet owns them;
/// the API cannot evict them) and pods that already finished.
pub fn drainable(pod: &CachedPod) -> bool {
    !owned_by_daemon_set(pod) && !is_mirror(pod) && !finished(pod)
}

/// Whether the node is ready to take the claim's pods: `Ready`, no startup or ephemeral taint
/// left, and every extended resource the claim's capacity promises (`nvidia.com/gpu` …) registered
/// by its device plugin (non-zero in the Node's allocatable).
pub fn initialized(claim: &NodeClaim, node: &Node) -> bool {
    let ready = node_ready(node);
    let starting = node_taints(node).iter().any(|t| {
        is_ephemeral(t)
            || claim
                .spec
                .startup_taints
                .iter()
                .any(|s| s.key == t.key && s.effect == t.effect)
    });
    ready && !starting && extended_resources_registered(claim, node)
}

/// Whether the Node's kubelet reports `Ready=True`.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn extended_resources_registered(claim: &NodeClaim, node: &Node) -> bool {
    let Some(capacity) = claim.status.as_ref().map(|s| Resources::from(&s.capacity)) else {
        return true;
    };
    let allocatable = node_allocatable(node);
    capacity
        .iter()
        .filter(|(name, q)| is_extended(name) && *q > Quantity::ZERO)
        .all(|(name, _)| allocatable.get(name) > Quantity::ZERO)
}

/// A resource a device plugin advertises (anything but the kubelet's own, hugepages included).
fn is_extended(name: &str) -> bool {
    !matches!(name, "cpu" | "memory" | "pods" | "ephemeral-storage") && !name.starts_with("hugepages-")
}

/// The Node's taints.
pub fn node_taints(node: &Node) -> &[k8s_openapi::api::core::v1::Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn since(now_seconds: i64, epoch_seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(now_seconds - epoch_seconds).unwrap_or(0))
}

/// What is left of `timeout` counted from `from` (epoch seconds) at `now_seconds`; zero once it
/// has run out.
pub fn time_left(timeout: Duration, now_seconds: i64, from: i64) -> Duration {
    timeout.saturating_sub(since(now_seconds, from))
}

/// When the claim's condition `type_` last changed, or, before it has, when the claim was
/// created (epoch seconds).
pub fn since_condition(claim: &NodeClaim, type_: ConditionType) -> i64 {
    transitioned_at(claim, type_).unwrap_or_else(|| created_at(claim))
}

/// When the claim's condition `type_` last changed, in epoch seconds.
pub fn transitioned_at(claim: &NodeClaim, type_: ConditionType) -> Option<i64> {
    let condition = conditions::find(&claim.status.as_ref()?.conditions, type_)?;
    Some(condition.last_transition_time.0.as_second())
}

/// When the claim was created, in epoch seconds.
pub fn created_at(claim: &NodeClaim) -> i64 {
    claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

#[cfg(test)]
mod tests {
    use joist_messages::{cached_pod::CachedPodSpec, labels::taints::DISRUPTED};
    use joist_provider::{Instance, InstanceState};
    use serde_json::{Value, json};

    use super::*;

    const NOW: i64 = 1_767_225_600;

    fn at(seconds_ago: i64) -> String {
        joist_messages::time::rfc3339(NOW - seconds_ago)
    }

    fn claim(created_ago: i64, conditions: &[(&str, &str, i64)], extra_status: Value) -> NodeClaim {
        let conditions: Vec<Value> = conditions
            .iter()
            .map(|(type_, status, ago)| {
                json!({"type": type_, "status": status, "reason": type_, "message": "",
                       "lastTransitionTime": at(*ago)})
            })
            .collect();
        let mut status = json!({"conditions": conditions});
        if let (Some(status), Some(extra)) = (status.as_object_mut(), extra_status.as_object()) {
            status.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "uid": "claim-uid", "creationTimestamp": at(created_ago),
                         "finalizers": [TERMINATION_FINALIZER], "labels": {"karpenter.sh/nodepool": "p"}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                     "startupTaints": [{"key": "agent.io/starting", "effect": "NoSchedule"}]},
            "status": status,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn launched(created_ago: i64, launched_ago: i64) -> NodeClaim {
        claim(
            created_ago,
            &[("Launched", "True", launched_ago)],
            json!({"providerID": "aws:///zone-a/i-1"}),
        )
    }

    /// A launched claim (provider ID set) created `created_ago` seconds ago with `conditions`.
    fn claim_with(created_ago: i64, conditions: &[(&str, &str, i64)]) -> NodeClaim {
        claim(
            created_ago,
            conditions,
            json!({"providerID": "aws:///zone-a/i-1"}),
        )
    }

    fn registered(extra_status: Value) -> NodeClaim {
        let mut status = json!({"providerID": "aws:///zone-a/i-1"});
        if let (Some(s), Some(extra)) = (status.as_object_mut(), extra_status.as_object()) {
            s.extend(extra.clone());
        }
        claim(
            600,
            &[("Launched", "True", 590), ("Registered", "True", 500)],
            status,
        )
    }

    /// A claim being deleted whose drain has begun (`Drained=Unknown` shown).
    fn draining(claim: NodeClaim) -> NodeClaim {
        with_conditions(deleting(claim), &[(ConditionType::Drained.as_str(), "Unknown")])
    }

    fn with_conditions(mut claim: NodeClaim, conditions: &[(&str, &str)]) -> NodeClaim {
        if let Some(status) = claim.status.as_mut() {
            for (type_, value) in conditions {
                status.conditions.push(
                    serde_json::from_value(json!({"type": type_, "status": value, "reason": type_,
                        "message": "", "lastTransitionTime": at(1)}))
                    .unwrap_or_else(|e| panic!("{e}")),
                );
            }
        }
        claim
    }

    fn deleting(mut claim: NodeClaim) -> NodeClaim {
        claim.metadata.deletion_timestamp = Some(kube_ops_time(NOW - 1));
        claim
    }

    fn kube_ops_time(seconds: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(seconds).unwrap_or_default(),
        )
    }

    fn node(ready: bool, taints: Value, allocatable: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "resourceVersion": "7"},
            "spec": {"providerID": "aws:///zone-a/i-1", "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                       "allocatable": allocatable},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn pod(name: &str, extra_metadata: Value) -> Arc<CachedPod> {
        let mut metadata = json!({"name": name, "namespace": "default", "uid": format!("{name}-uid")});
        if let (Some(m), Some(extra)) = (metadata.as_object_mut(), extra_metadata.as_object()) {
            m.extend(extra.clone());
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": metadata, "spec": {"nodeName": "n", "containers": []},
                "status": {"phase": "Running"},
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    struct Case<'a> {
        claim: &'a NodeClaim,
        node: Option<&'a Node>,
        pods: &'a [Arc<CachedPod>],
        leaving: &'a [Arc<CachedPod>],
        awaiting_provisioning: bool,
        known: bool,
        exists: Option<bool>,
        volumes: &'a [String],
        repair: Repair,
        now: Instant,
    }

    impl<'a> Case<'a> {
        fn new(claim: &'a NodeClaim) -> Self {
            Self {
                claim,
                node: None,
                pods: &[],
                leaving: &[],
                awaiting_provisioning: false,
                known: true,
                exists: None,
                volumes: &[],
                repair: Repair::Healthy,
                now: Instant::now(),
            }
        }

        fn decide(&self, memory: &mut Memory) -> Plan {
            let leaving = || self.leaving.to_vec();
            let facts = Facts {
                claim: self.claim,
                node: self.node,
                pods: self.pods,
                leaving: Leaving(&leaving),
                awaiting_provisioning: self.awaiting_provisioning,
                pool_and_class_known: self.known,
                instance_exists: self.exists,
                volume_attachments: self.volumes,
                repair: &self.repair,
                now_seconds: NOW,
                now: self.now,
            };
            decide(&facts, memory)
        }
    }

    fn deleted_with(plan: &Plan) -> Option<&'static str> {
        plan.actions.iter().find_map(|a| match a {
            Action::DeleteClaim { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
    }

    #[test]
    fn a_new_claim_launches_and_one_never_launched_times_out() {
        let fresh = claim(10, &[], json!({}));
        assert_eq!(
            Case::new(&fresh).decide(&mut Memory::default()).actions,
            [Action::Launch]
        );
        let stale = claim(301, &[("Launched", "Unknown", 200)], json!({}));
        let plan = Case::new(&stale).decide(&mut Memory::default());
        assert_eq!(deleted_with(&plan), Some("LaunchTimeout"), "{plan:?}");
    }

    #[test]
    fn a_missing_pool_or_class_waits_for_the_read_model_then_deletes() {
        let young = claim(10, &[], json!({}));
        let mut case = Case::new(&young);
        case.known = false;
        let plan = case.decide(&mut Memory::default());
        assert_eq!(plan, Plan::wait(Next::After(Duration::from_secs(20))));
        let old = claim(40, &[], json!({}));
        let mut case = Case::new(&old);
        case.known = false;
        assert_eq!(
            deleted_with(&case.decide(&mut Memory::default())),
            Some("NodeClassNotReady")
        );
        let refused = after_launch(
            Err(CloudError::NodeClassNotReady {
                node_class: "d".into(),
                reason: "its Ready condition is not True".into(),
            }),
            &mut Memory::default(),
            Instant::now(),
        );
        assert_eq!(deleted_with(&refused), Some("NodeClassNotReady"));
    }

    fn a_launch(unavailable: Vec<OfferingKey>) -> Launch {
        Launch {
            instance: Instance {
                provider_id: "aws:///zone-a/i-1".into(),
                instance_type: "m5.large".into(),
                zone: "zone-a".into(),
                capacity_type: joist_messages::model::instance_type::CapacityType::OnDemand,
                reservation: None,
                image_id: "ami-1".into(),
                price: 0.096,
                state: InstanceState::Pending,
                launched_at: NOW,
                tags: Default::default(),
            },
            capacity: Resources::new(),
            allocatable: Resources::new(),
            labels: Default::default(),
            unavailable,
        }
    }

    #[test]
    fn launch_outcomes_record_mark_delete_or_retry() {
        let offering = OfferingKey {
            instance_type: "c5.large".into(),
            zone: "zone-a".into(),
            capacity_type: joist_messages::model::instance_type::CapacityType::OnDemand,
            placement_group: None,
        };
        let memory = &mut Memory::default();
        let now = Instant::now();
        let ok = after_launch(Ok(a_launch(vec![offering.clone()])), memory, now);
        assert!(matches!(
            ok.actions.as_slice(),
            [Action::MarkUnavailable(_), Action::RecordLaunch(_)]
        ));
        let ice = after_launch(
            Err(CloudError::InsufficientCapacity {
                offerings: vec![offering],
                message: "no capacity".into(),
            }),
            memory,
            now,
        );
        assert!(matches!(ice.actions[0], Action::MarkUnavailable(_)));
        assert_eq!(deleted_with(&ice), Some("InsufficientCapacityError"));
        let throttled = || {
            Err(CloudError::Transient {
                message: "throttled".into(),
            })
        };
        let transient = after_launch(throttled(), memory, now);
        assert!(matches!(transient.actions.as_slice(), [Action::LaunchFailed(_)]));
        assert_eq!(transient.next, Next::After(LAUNCH_RETRY));
        // Failures in a row back off, up to the cap.
        let waits: Vec<Next> = (0..4)
            .map(|_| after_launch(throttled(), memory, now).next)
            .collect();
        let secs = |s| Next::After(Duration::from_secs(s));
        assert_eq!(waits, [secs(20), secs(40), secs(80), secs(80)]);
        // A change to the claim meanwhile (its own LaunchFailed condition) does not cut the wait
        // short; once it is over the claim launches again.
        let young = claim(10, &[], json!({}));
        let mut case = Case::new(&young);
        case.now = now + Duration::from_secs(30);
        assert_eq!(
            case.decide(memory),
            Plan::wait(Next::After(Duration::from_secs(50)))
        );
        case.now = now + Duration::from_secs(80);
        assert!(matches!(case.decide(memory).actions.as_slice(), [Action::Launch]));
        // A launch that works ends the backoff.
        let _ = after_launch(Ok(a_launch(Vec::new())), memory, now);
        assert_eq!((memory.failed_launches, memory.launch_retry_at), (0, None));
    }

    #[test]
    fn a_launch_whose_status_write_failed_is_recorded_not_repeated() {
        let fresh = claim(10, &[], json!({}));
        let mut memory = Memory {
            launched: Some(a_launch(Vec::new())),
            ..Memory::default()
        };
        let plan = Case::new(&fresh).decide(&mut memory);
        assert!(
            matches!(plan.actions.as_slice(), [Action::RecordLaunch(_)]),
            "{plan:?}"
        );
    }

    #[test]
    fn an_instance_that_never_registers_times_out_after_fifteen_minutes() {
        let waiting = launched(700, 600);
        let plan = Case::new(&waiting).decide(&mut Memory::default());
        assert_eq!(plan, Plan::wait(Next::After(Duration::from_secs(300))));
        let late = launched(1000, 901);
        assert_eq!(
            deleted_with(&Case::new(&late).decide(&mut Memory::default())),
            Some("RegistrationTimeout")
        );
    }

    #[test]
    fn a_registered_claim_whose_node_went_away_is_deleted_once_the_watches_had_time_to_show_it() {
        let claim = registered(json!({}));
        let mut memory = Memory::default();
        let case = Case::new(&claim);
        assert_eq!(case.decide(&mut memory), Plan::wait(Next::After(READ_MODEL_LAG)));
        memory.node_missing_since = case.now.checked_sub(READ_MODEL_LAG);
        assert_eq!(deleted_with(&case.decide(&mut memory)), Some("NodeDeleted"));
    }

    #[test]
    fn a_node_registers_then_initializes_once_ready_untainted_and_its_devices_registered() {
        let unregistered = launched(100, 90);
        let node_starting = node(
            false,
            json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]),
            json!({}),
        );
        let mut case = Case::new(&unregistered);
        case.node = Some(&node_starting);
        assert_eq!(case.decide(&mut Memory::default()).actions, [Action::Register]);

        let gpu = registered(json!({"capacity": {"cpu": "8", "nvidia.com/gpu": "1"}}));
        let startup = node(
            true,
            json!([{"key": "agent.io/starting", "effect": "NoSchedule"}]),
            json!({"nvidia.com/gpu": "1"}),
        );
        let no_plugin = node(true, json!([]), json!({"cpu": "8", "nvidia.com/gpu": "0"}));
        let ready = node(true, json!([]), json!({"cpu": "8", "nvidia.com/gpu": "1"}));
        for (node, initializes) in [(&startup, false), (&no_plugin, false), (&ready, true)] {
            let mut case = Case::new(&gpu);
            case.node = Some(node);
            let plan = case.decide(&mut Memory::default());
            assert_eq!(
                plan.actions.contains(&Action::Initialize),
                initializes,
                "{node:?}: {plan:?}"
            );
        }
    }

    #[test]
    fn a_registered_instance_is_named_after_its_node_once() {
        let mut claim = registered(json!({}));
        let node = node(true, json!([]), json!({}));
        let named = Action::NameInstance {
            provider_id: "aws:///zone-a/i-1".into(),
            node_name: "n".into(),
        };
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        assert!(case.decide(&mut Memory::default()).actions.contains(&named));
        claim.metadata.annotations = Some([(TAGGED.to_owned(), "true".to_owned())].into());
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        assert!(
            !case.decide(&mut Memory::default()).actions.contains(&named),
            "tagged already"
        );
    }

    #[test]
    fn a_phase_just_finished_is_not_repeated_while_the_read_model_lags() {
        let unregistered = launched(100, 90);
        let node = node(true, json!([]), json!({}));
        let now = Instant::now();
        let mut memory = Memory {
            finished: Some((Phase::Registration, now)),
            ..Memory::default()
        };
        let mut case = Case::new(&unregistered);
        case.node = Some(&node);
        case.now = now + Duration::from_secs(10);
        assert_eq!(
            case.decide(&mut memory),
            Plan::wait(Next::After(Duration::from_secs(20)))
        );
        case.now = now + READ_MODEL_LAG;
        assert_eq!(
            case.decide(&mut memory).actions,
            [Action::Register],
            "the lag is over: act on what is seen"
        );
        assert!(memory.finished.is_none());
    }

    fn tainted() -> Node {
        node(
            true,
            json!([{"key": DISRUPTED, "effect": "NoSchedule"}]),
            json!({}),
        )
    }

    #[test]
    fn a_drain_taints_then_evicts_every_pod_but_daemons_and_mirrors() {
        let claim = deleting(registered(json!({})));
        let untainted = node(true, json!([]), json!({}));
        let pods = [
            pod("web", json!({})),
            pod(
                "daemon",
                json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d"}]}),
            ),
            pod(
                "static",
                json!({"annotations": {joist_messages::pods::MIRROR_ANNOTATION: "x"}}),
            ),
        ];
        let mut case = Case::new(&claim);
        case.node = Some(&untainted);
        case.pods = &pods;
        case.exists = Some(true);
        let plan = case.decide(&mut Memory::default());
        assert_eq!(
            plan.actions,
            [
                Action::ClaimConditions(vec![ConditionUpdate::new(
                    ConditionType::Drained,
                    ConditionStatus::Unknown,
                    "Draining"
                )]),
                Action::Taint,
                Action::Evict(vec![PodRef {
                    namespace: "default".into(),
                    name: "web".into(),
                    uid: "web-uid".into()
                }])
            ]
        );
        let memory = &mut Memory::default();
        let waits: Vec<Next> = (0..9).map(|_| after_evictions(true, memory)).collect();
        let millis = |ms| Next::After(Duration::from_millis(ms));
        assert_eq!(
            waits,
            [
                millis(100),
                millis(200),
                millis(400),
                millis(800),
                millis(1600),
                millis(3200),
                millis(6400),
                millis(10_000),
                millis(10_000)
            ],
            "a PDB's 429s back off, doubling to 10 s"
        );
        assert_eq!(after_evictions(false, memory), Next::After(DRAIN_POLL));
        assert_eq!(
            after_evictions(true, memory),
            millis(100),
            "a fresh start once one went"
        );
    }

    #[test]
    fn pods_shutting_down_keep_the_instance_running() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let leaving = [pod("slow", json!({"deletionTimestamp": at(-60)}))];
        let now = Instant::now();
        let mut memory = Memory {
            drain_started: Some(now - Duration::from_secs(60)),
            ..Memory::default()
        };
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.pods = &leaving;
        case.exists = Some(true);
        case.now = now;
        let plan = case.decide(&mut memory);
        assert_eq!(
            plan,
            Plan::wait(Next::After(DRAIN_POLL)),
            "no eviction again, no termination"
        );
    }

    /// The conditions of a claim whose instance is being terminated.
    const TERMINATING: [(&str, &str); 3] = [
        (ConditionType::Drained.as_str(), "True"),
        (ConditionType::VolumesDetached.as_str(), "True"),
        (ConditionType::InstanceTerminating.as_str(), "True"),
    ];

    #[test]
    fn the_instance_waits_for_volumes_to_detach_until_the_grace_period_ends() {
        let drained = with_conditions(
            draining(registered(json!({}))),
            &[(ConditionType::Drained.as_str(), "True")],
        );
        let node = tainted();
        let volumes = ["csi-pvc-1-n".to_owned()];
        let mut case = Case::new(&drained);
        case.node = Some(&node);
        case.exists = Some(true);
        case.volumes = &volumes;
        let memory = &mut Memory {
            drain_started: Some(Instant::now() - Duration::from_secs(60)),
            ..Memory::default()
        };
        assert_eq!(
            case.decide(memory),
            Plan::act(
                vec![Action::ClaimConditions(vec![ConditionUpdate::new(
                    ConditionType::VolumesDetached,
                    ConditionStatus::Unknown,
                    "AwaitingVolumeDetachment"
                )])],
                Next::After(VOLUME_POLL)
            ),
            "attached: the instance stays"
        );
        // Past the grace period the volumes are left to the instance's end.
        let late = with_conditions(
            with_grace_period(draining(registered(json!({}))), 600, 601),
            &[(ConditionType::Drained.as_str(), "True")],
        );
        let mut case = Case::new(&late);
        case.node = Some(&node);
        case.exists = Some(true);
        case.volumes = &volumes;
        assert_eq!(
            case.decide(memory).actions,
            [Action::ClaimConditions(vec![
                ConditionUpdate::new(
                    ConditionType::VolumesDetached,
                    ConditionStatus::False,
                    "TerminationGracePeriodElapsed"
                ),
                ConditionUpdate::holds(ConditionType::InstanceTerminating)
            ])]
        );
    }

    #[test]
    fn termination_waits_the_minimum_drain_then_releases_in_order() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let now = Instant::now();
        let mut memory = Memory {
            drain_started: Some(now - Duration::from_secs(2)),
            ..Memory::default()
        };
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.now = now;
        assert_eq!(
            case.decide(&mut memory),
            Plan::wait(Next::After(Duration::from_secs(3)))
        );
        case.now = now + Duration::from_secs(3);
        assert_eq!(
            case.decide(&mut memory).actions,
            [Action::ClaimConditions(vec![
                ConditionUpdate::holds(ConditionType::Drained),
                ConditionUpdate::holds(ConditionType::VolumesDetached),
                ConditionUpdate::holds(ConditionType::InstanceTerminating)
            ])],
            "drained: the conditions say so before the instance goes"
        );
        let claim = with_conditions(claim, &TERMINATING);
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.now = now + Duration::from_secs(3);
        assert_eq!(
            case.decide(&mut memory),
            Plan::act(
                vec![Action::TerminateInstance("aws:///zone-a/i-1".into())],
                Next::After(INSTANCE_TERMINATION_POLL)
            ),
            "the instance goes first; nothing is released while the cloud still reports it"
        );
        assert_eq!(
            case.decide(&mut memory).actions,
            [Action::TerminateInstance("aws:///zone-a/i-1".into())],
            "an instance still shutting down is terminated again"
        );
        case.exists = Some(false);
        assert_eq!(
            case.decide(&mut memory).actions,
            [Action::ReleaseNode, Action::ReleaseClaim],
            "once it is gone, the node's finalizer goes, then the claim's"
        );
    }

    fn evicted(plan: &Plan) -> Vec<String> {
        plan.actions
            .iter()
            .find_map(|a| match a {
                Action::Evict(pods) => Some(pods.iter().map(|p| p.name.clone()).collect()),
                _ => None,
            })
            .unwrap_or_default()
    }

    fn daemon() -> Value {
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d"}])
    }

    fn with_spec(pod: Arc<CachedPod>, change: impl FnOnce(&mut CachedPodSpec)) -> Arc<CachedPod> {
        let mut pod = Arc::unwrap_or_clone(pod);
        change(pod.spec.get_or_insert_default());
        Arc::new(pod)
    }

    #[test]
    fn a_drain_goes_tier_by_tier_and_critical_daemons_leave_last() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let critical =
            |spec: &mut CachedPodSpec| spec.priority_class_name = Some("system-node-critical".into());
        let web = pod("web", json!({}));
        let agent = pod("agent", json!({"ownerReferences": daemon()}));
        let dns = with_spec(pod("dns", json!({})), critical);
        let cni = with_spec(pod("cni", json!({"ownerReferences": daemon()})), critical);
        let tolerant = with_spec(pod("logs", json!({"ownerReferences": daemon()})), |spec| {
            spec.tolerations = serde_json::from_value(json!([{"operator": "Exists"}])).ok()
        });
        let mut all = vec![cni.clone(), dns.clone(), agent.clone(), web, tolerant];
        let mut order = Vec::new();
        while !all.is_empty() {
            let mut case = Case::new(&claim);
            case.node = Some(&node);
            case.exists = Some(true);
            case.pods = &all;
            let names = evicted(&case.decide(&mut Memory::default()));
            if names.is_empty() {
                break;
            }
            order.push(names.join(","));
            all.retain(|p| !names.contains(&p.name_any()));
        }
        assert_eq!(
            order,
            ["web", "agent", "dns", "cni"],
            "one tier at a time; a pod tolerating the disrupted taint is not drained"
        );
    }

    #[test]
    fn a_drain_evicts_the_largest_pods_first_then_a_size_every_wave_gap_then_the_rest() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let requesting = |name: &str, cpu: &str, memory: &str| {
            with_spec(pod(name, json!({})), |spec| {
                spec.containers = serde_json::from_value(json!([{"name": "app", "resources": {
                    "requests": {"cpu": cpu, "memory": memory}}}]))
                .unwrap_or_else(|e| panic!("{e}"));
            })
        };
        let pods = [
            requesting("small", "900m", "3100Mi"),
            requesting("large", "3500m", "28Gi"),
            requesting("large-2", "3500m", "28Gi"),
            requesting("medium", "3500m", "8Gi"),
            requesting("tiny", "100m", "100Mi"),
        ];
        let start = Instant::now();
        let mut memory = Memory::default();
        let mut left = pods.to_vec();
        let mut at = |seconds: u64, left: &mut Vec<Arc<CachedPod>>| {
            let mut case = Case::new(&claim);
            case.node = Some(&node);
            case.exists = Some(true);
            case.now = start + Duration::from_secs(seconds);
            case.pods = left;
            let plan = case.decide(&mut memory);
            let names = evicted(&plan);
            left.retain(|p| !names.contains(&p.name_any()));
            (names.join(","), plan.next)
        };
        assert_eq!(
            at(0, &mut left),
            ("large,large-2".to_owned(), Next::After(DRAIN_POLL)),
            "the largest pods go first: their replacements reach kube-scheduler before the small ones"
        );
        assert_eq!(
            at(1, &mut left),
            (String::new(), Next::After(EVICTION_WAVE_GAP - DRAIN_POLL)),
            "the next size waits a wave gap, whatever wakes the drain"
        );
        assert_eq!(
            at(2, &mut left).0,
            "medium",
            "then the next size (CPU before memory)"
        );
        assert_eq!(at(4, &mut left).0, "small");
        assert_eq!(
            at(5, &mut left).0,
            "tiny",
            "past the minimum drain time what is left goes at once"
        );
        let mut memory = Memory::default();
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.now = start;
        let same = [requesting("a", "1", "1Gi"), requesting("b", "1", "1Gi")];
        case.pods = &same;
        assert_eq!(
            evicted(&case.decide(&mut memory)),
            ["a", "b"],
            "pods of one size go together"
        );
        // A node of small pods drained beside a node of large ones (one multi-node command).
        let small = [requesting("small", "900m", "3100Mi")];
        let beside = [requesting("large", "3500m", "28Gi"), small[0].clone()];
        let mut memory = Memory::default();
        case.pods = &small;
        case.leaving = &beside;
        let plan = case.decide(&mut memory);
        assert_eq!(
            (evicted(&plan), plan.next),
            (Vec::<String>::new(), Next::After(EVICTION_WAVE_GAP)),
            "its pods wait for the larger ones drained elsewhere"
        );
        case.now = start + EVICTION_WAVE_GAP;
        case.leaving = &[];
        assert_eq!(
            evicted(&case.decide(&mut memory)),
            ["small"],
            "then go a wave gap later"
        );
    }

    #[test]
    fn a_do_not_disrupt_pod_is_not_evicted_and_holds_the_drain() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let pods = [pod(
            "batch",
            json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
        )];
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.pods = &pods;
        let plan = case.decide(&mut Memory::default());
        assert_eq!(plan, Plan::wait(Next::After(DRAIN_POLL)), "waits, evicts nothing");
    }

    #[test]
    fn a_pod_stuck_terminating_holds_the_drain_only_for_a_minute() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let now = Instant::now();
        // The kubelet is gone: the pod's deletionTimestamp (its delete plus its grace) passes and
        // the pod stays.
        let terminating = |past_deadline: i64| [pod("web", json!({"deletionTimestamp": at(past_deadline)}))];
        let memory = || Memory {
            drain_started: Some(now - MINIMUM_DRAIN_TIME),
            ..Memory::default()
        };
        let pods = terminating(STUCK_TERMINATING_AFTER);
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.now = now;
        case.pods = &pods;
        assert_eq!(
            case.decide(&mut memory()),
            Plan::wait(Next::After(DRAIN_POLL)),
            "a minute past its deadline, the pod may still be shutting down: the drain waits"
        );
        let pods = terminating(STUCK_TERMINATING_AFTER + 1);
        case.pods = &pods;
        assert_eq!(
            case.decide(&mut memory()).actions,
            [Action::ClaimConditions(vec![
                ConditionUpdate::holds(ConditionType::Drained),
                ConditionUpdate::holds(ConditionType::VolumesDetached),
                ConditionUpdate::holds(ConditionType::InstanceTerminating)
            ])],
            "past that, the pod no longer holds the drain"
        );
    }

    #[test]
    fn a_drain_evicts_once_provisioning_counted_its_pods_or_after_half_a_minute() {
        let claim = draining(registered(json!({})));
        let node = tainted();
        let now = Instant::now();
        let pods = [pod("web", json!({}))];
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.now = now;
        case.pods = &pods;
        case.awaiting_provisioning = true;
        let evicts = |plan: Plan| plan.actions.iter().any(|a| matches!(a, Action::Evict(_)));
        let tainted_ago = |ago: Duration| Memory {
            drain_started: Some(now - ago),
            ..Memory::default()
        };
        assert!(
            !evicts(case.decide(&mut tainted_ago(Duration::from_secs(10)))),
            "the pods' replacement is not counted yet: no eviction"
        );
        assert!(
            evicts(case.decide(&mut tainted_ago(PROVISIONING_WAIT))),
            "a provisioner that never counts them holds the drain no longer"
        );
        case.awaiting_provisioning = false;
        assert!(
            evicts(case.decide(&mut tainted_ago(Duration::ZERO))),
            "counted: the drain goes on"
        );
    }

    fn with_grace_period(mut claim: NodeClaim, seconds: u64, deleted_ago: i64) -> NodeClaim {
        claim.spec.termination_grace_period =
            Some(format!("{seconds}s").parse().unwrap_or_else(|e| panic!("{e:?}")));
        claim.metadata.deletion_timestamp = Some(kube_ops_time(NOW - deleted_ago));
        claim
    }

    #[test]
    fn pods_that_would_overrun_the_grace_period_are_deleted_and_the_deadline_ends_the_drain() {
        let node = tainted();
        let pods = [pod("guarded", json!({}))];
        // 600 s of grace, deleted 590 s ago: 10 s left, less than the pod's own 30 s.
        let claim = with_grace_period(draining(registered(json!({}))), 600, 590);
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.exists = Some(true);
        case.pods = &pods;
        let plan = case.decide(&mut Memory::default());
        assert!(
            plan.actions.contains(&Action::StampDeadline(NOW + 10)),
            "{plan:?}"
        );
        assert!(
            plan.actions.iter().any(|a| matches!(a,
                Action::DeletePods { pods, grace_seconds: 10 } if pods[0].name == "guarded")),
            "{plan:?}"
        );
        assert!(evicted(&plan).is_empty(), "deleted, not evicted");
        // Deleted 100 s ago: 500 s left, the pod is evicted as usual.
        let early = with_grace_period(draining(registered(json!({}))), 600, 100);
        let mut case = Case::new(&early);
        case.node = Some(&node);
        case.exists = Some(true);
        case.pods = &pods;
        assert_eq!(evicted(&case.decide(&mut Memory::default())), ["guarded"]);
        // Past the deadline: whatever is left goes with the instance.
        let late = with_conditions(
            with_grace_period(draining(registered(json!({}))), 600, 601),
            &TERMINATING,
        );
        let mut case = Case::new(&late);
        case.node = Some(&node);
        case.exists = Some(true);
        case.pods = &pods;
        assert_eq!(
            case.decide(&mut Memory::default()).actions[0],
            Action::TerminateInstance("aws:///zone-a/i-1".into())
        );
    }

    #[test]
    fn a_claim_expires_at_creation_plus_expire_after_and_wakes_for_it() {
        let mut young = registered(json!({}));
        young.spec.expire_after = Some("700s".parse().unwrap_or_else(|e| panic!("{e:?}")));
        let node = node(true, json!([]), json!({}));
        let mut case = Case::new(&young);
        case.node = Some(&node);
        let plan = case.decide(&mut Memory::default());
        assert_eq!(
            plan.next,
            Next::After(Duration::from_secs(100)),
            "created 600 s ago: wakes when 700 s are up"
        );
        let mut old = registered(json!({}));
        old.spec.expire_after = Some("600s".parse().unwrap_or_else(|e| panic!("{e:?}")));
        let mut case = Case::new(&old);
        case.node = Some(&node);
        assert_eq!(case.decide(&mut Memory::default()).actions, [Action::Expire]);
        let mut never = registered(json!({}));
        never.spec.expire_after = Some("Never".parse().unwrap_or_else(|e| panic!("{e:?}")));
        let mut case = Case::new(&never);
        case.node = Some(&node);
        assert_ne!(case.decide(&mut Memory::default()).actions, [Action::Expire]);
    }

    #[test]
    fn a_node_that_never_turns_ready_ends_its_claim_at_the_initialization_timeout() {
        let claim = registered(json!({}));
        let not_ready = node(false, json!([]), json!({}));
        let mut case = Case::new(&claim);
        case.node = Some(&not_ready);
        let plan = case.decide(&mut Memory::default());
        assert_eq!(deleted_with(&plan), None);
        assert_eq!(
            plan.next,
            Next::After(Duration::from_secs(400)),
            "registered 500 s ago: wakes when 15 minutes are up"
        );
        let late = claim_with(1000, &[("Launched", "True", 990), ("Registered", "True", 900)]);
        let mut case = Case::new(&late);
        case.node = Some(&not_ready);
        assert_eq!(
            deleted_with(&case.decide(&mut Memory::default())),
            Some("InitializationTimeout")
        );
        // A Ready node still waiting on its startup taint is not timed.
        let ready = node(
            true,
            json!([{"key": "agent.io/starting", "effect": "NoSchedule"}]),
            json!({}),
        );
        case.node = Some(&ready);
        assert_eq!(deleted_with(&case.decide(&mut Memory::default())), None);
    }

    #[test]
    fn a_node_broken_for_too_long_is_repaired_at_once_unless_blocked() {
        let claim = claim_with(
            600,
            &[
                ("Launched", "True", 590),
                ("Registered", "True", 500),
                ("Initialized", "True", 490),
            ],
        );
        let node = node(false, json!([]), json!({}));
        let mut case = Case::new(&claim);
        case.node = Some(&node);
        case.repair = Repair::Tolerated(Duration::from_secs(600));
        let plan = case.decide(&mut Memory::default());
        assert!(!plan.actions.iter().any(|a| matches!(a, Action::Repair { .. })));
        assert_eq!(
            plan.next,
            Next::After(Duration::from_secs(600)),
            "wakes when the toleration ends"
        );
        case.repair = Repair::Due {
            condition: "Ready".into(),
            message: "broken".into(),
        };
        assert_eq!(
            case.decide(&mut Memory::default()).actions,
            [Action::Repair {
                condition: "Ready".into(),
                message: "broken".into(),
                deadline: NOW,
            }],
            "a deadline of now skips the drain"
        );
        case.repair = Repair::Blocked {
            message: "too many".into(),
        };
        let plan = case.decide(&mut Memory::default());
        assert!(plan.actions.contains(&Action::RepairBlocked("too many".into())));
        assert_eq!(plan.next, Next::After(BLOCKED_RETRY));
    }
}

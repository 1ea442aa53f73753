//! Fault points: the named steps where a crash costs the most, and a way to crash the controllers
//! there, for the fault-injection suite (`joist bench chaos`).
//!
//! Each [`Step`] is a moment between two writes that must both happen: an instance launched whose
//! NodeClaim does not say so yet, a node tainted for a disruption whose replacement is not asked
//! for yet, a NodeClaim released whose instance still runs. The controllers call
//! [`FaultPoints::reach`] there. In production the points are [`FaultPoints::none`] and cost one
//! branch. A simulation arms one step ([`FaultPoints::crash_at`]): when the controllers reach it
//! for the chosen time, the process is considered dead from then on. The future that reached it
//! never resumes, every later fault point never returns, and [`FaultPoints::gate`] makes every
//! call to the cloud or the interruption queue, before or after it is sent, never answer (kubesim's
//! `Cluster::client_with` does the same for the API server). A new set of controllers started
//! from the cluster and the cloud alone must then finish the job.
//!
//! Failure modes: none of its own; a crash is what it injects.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
};

use joist_provider::{
    CloudFuture,
    interruption::{InterruptionQueue, QueueMessage},
};
use tokio::sync::Notify;

/// The named steps a crash can stop the controllers at, in the order a node's life meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// A NodePool actor created a NodeClaim (nothing launched yet).
    ClaimCreated,
    /// CreateFleet returned an instance; the NodeClaim's status does not name it yet.
    InstanceLaunched,
    /// The NodeClaim's status names its instance (`Launched`).
    LaunchRecorded,
    /// The Node was given the NodeClaim's labels, finalizer and owner (`Registered`).
    NodeRegistered,
    /// The NodeClaim is `Initialized`.
    NodeInitialized,
    /// A deleting NodeClaim's Node was tainted `karpenter.sh/disrupted` for termination; its pods
    /// are not evicted yet and its instance still runs.
    TerminationTainted,
    /// One round of evictions was sent for a deleting NodeClaim's Node.
    PodsEvicted,
    /// The instance was terminated; the Node and the NodeClaim still hold their finalizers.
    InstanceTerminated,
    /// The Node's finalizer was removed; the NodeClaim still holds its own.
    NodeReleased,
    /// An emptiness or consolidation decision tainted its candidates as candidates; its validation
    /// has not run.
    DisruptionSteered,
    /// A disruption command tainted its candidates; no replacement is asked for yet.
    DisruptionMarked,
    /// A disruption command's replacement NodeClaims were created; none is initialized yet.
    ReplacementCreated,
    /// A disruption command's replacements are initialized; its candidates are not deleted yet.
    ReplacementInitialized,
    /// An interruption message's NodeClaim was deleted; the message is not deleted from the queue.
    InterruptionActed,
}

impl Step {
    /// Every step, in order.
    pub const ALL: [Step; 14] = [
        Step::ClaimCreated,
        Step::InstanceLaunched,
        Step::LaunchRecorded,
        Step::NodeRegistered,
        Step::NodeInitialized,
        Step::TerminationTainted,
        Step::PodsEvicted,
        Step::InstanceTerminated,
        Step::NodeReleased,
        Step::DisruptionSteered,
        Step::DisruptionMarked,
        Step::ReplacementCreated,
        Step::ReplacementInitialized,
        Step::InterruptionActed,
    ];

    /// The step's name in tables and timelines (`instance-launched`).
    pub fn name(self) -> &'static str {
        match self {
            Step::ClaimCreated => "claim-created",
            Step::InstanceLaunched => "instance-launched",
            Step::LaunchRecorded => "launch-recorded",
            Step::NodeRegistered => "node-registered",
            Step::NodeInitialized => "node-initialized",
            Step::TerminationTainted => "termination-tainted",
            Step::PodsEvicted => "pods-evicted",
            Step::InstanceTerminated => "instance-terminated",
            Step::NodeReleased => "node-released",
            Step::DisruptionSteered => "disruption-steered",
            Step::DisruptionMarked => "disruption-marked",
            Step::ReplacementCreated => "replacement-created",
            Step::ReplacementInitialized => "replacement-initialized",
            Step::InterruptionActed => "interruption-acted",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the controllers crash, if anywhere (see the module docs).
#[derive(Clone, Default)]
pub struct FaultPoints(Option<Arc<Armed>>);

/// A crash waiting at one step.
struct Armed {
    step: Step,
    /// Which time the step is reached that crashes (1: the first).
    nth: u32,
    reached: AtomicU32,
    down: AtomicBool,
    crashed: Notify,
}

impl fmt::Debug for FaultPoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("FaultPoints(none)"),
            Some(armed) => write!(f, "FaultPoints(crash at {} #{})", armed.step, armed.nth),
        }
    }
}

impl FaultPoints {
    /// No fault point ever fires: production.
    pub fn none() -> Self {
        Self(None)
    }

    /// Crashes the controllers the `nth` time (from 1) they reach `step`.
    pub fn crash_at(step: Step, nth: u32) -> Self {
        Self(Some(Arc::new(Armed {
            step,
            nth: nth.max(1),
            reached: AtomicU32::new(0),
            down: AtomicBool::new(false),
            crashed: Notify::new(),
        })))
    }

    /// The step a crash waits at, if any.
    pub fn armed(&self) -> Option<Step> {
        self.0.as_ref().map(|armed| armed.step)
    }

    /// Marks `step` reached. Returns at once unless this is the armed crash, or the controllers
    /// already crashed: then it never returns.
    pub async fn reach(&self, step: Step) {
        let Some(armed) = &self.0 else { return };
        if !armed.down.load(Ordering::SeqCst) {
            if armed.step != step || armed.reached.fetch_add(1, Ordering::SeqCst) + 1 != armed.nth {
                return;
            }
            tracing::warn!(step = step.name(), "crashing the controllers at a fault point");
            armed.down.store(true, Ordering::SeqCst);
            armed.crashed.notify_waiters();
        }
        std::future::pending::<()>().await;
    }

    /// Whether the controllers have crashed.
    pub fn is_down(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|armed| armed.down.load(Ordering::SeqCst))
    }

    /// Waits until the controllers crash (forever when nothing is armed).
    pub async fn crashed(&self) {
        let Some(armed) = &self.0 else {
            return std::future::pending().await;
        };
        loop {
            let notified = armed.crashed.notified();
            if armed.down.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Runs `call` unless the controllers are down; a call answered after they went down never
    /// returns either (the reply is lost with the process).
    pub async fn gate<T>(&self, call: impl Future<Output = T>) -> T {
        if self.is_down() {
            std::future::pending::<()>().await;
        }
        let answer = call.await;
        if self.is_down() {
            std::future::pending::<()>().await;
        }
        answer
    }
}

/// An interruption queue whose calls stop answering once `faults` crash (the cloud's are gated by
/// [`crate::effects::cloud_calls::GuardedCloud`]).
#[derive(Debug)]
pub struct GatedQueue {
    faults: FaultPoints,
    inner: Arc<dyn InterruptionQueue>,
}

impl GatedQueue {
    /// `inner`, gated by `faults`.
    pub fn new(inner: Arc<dyn InterruptionQueue>, faults: FaultPoints) -> Self {
        Self { faults, inner }
    }
}

impl InterruptionQueue for GatedQueue {
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>> {
        Box::pin(self.faults.gate(self.inner.receive()))
    }

    fn delete<'a>(&'a self, receipt: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(self.faults.gate(self.inner.delete(receipt)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_armed_step_never_returns_and_nothing_after_it_does() {
        let faults = FaultPoints::crash_at(Step::InstanceLaunched, 2);
        faults.reach(Step::ClaimCreated).await;
        faults.reach(Step::InstanceLaunched).await;
        assert!(!faults.is_down(), "the first time is not the armed one");
        let second = tokio::time::timeout(Duration::from_secs(60), faults.reach(Step::InstanceLaunched));
        assert!(second.await.is_err(), "the armed step returned");
        assert!(faults.is_down());
        tokio::time::timeout(Duration::from_secs(1), faults.crashed())
            .await
            .expect("the crash was not announced");
        let after = tokio::time::timeout(Duration::from_secs(60), faults.reach(Step::ClaimCreated));
        assert!(after.await.is_err(), "a dead process went on");
        let call = tokio::time::timeout(Duration::from_secs(60), faults.gate(async { 1 }));
        assert!(call.await.is_err(), "a dead process made a call");
    }

    #[tokio::test]
    async fn unarmed_points_cost_nothing_and_never_crash() {
        let faults = FaultPoints::none();
        for step in Step::ALL {
            faults.reach(step).await;
        }
        assert_eq!(faults.gate(async { 7 }).await, 7);
        assert!(!faults.is_down());
    }
}

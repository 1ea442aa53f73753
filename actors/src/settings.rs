//! Controller settings, named as Karpenter names them (`BATCH_IDLE_DURATION`, `BATCH_MAX_DURATION`
//! …), with Karpenter's defaults.

use std::{sync::Arc, time::Duration};

use joist_messages::scheduler_config::SchedulerConfig;
use joist_provider::interruption::InterruptionQueue;

use crate::{effects::faults::FaultPoints, state::replica_shards::ReplicaShards};

/// Where the scheduling simulation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SolverMode {
    /// On the Provisioner's own arbiter: deterministic, for simulations on virtual time.
    Inline,
    /// On tokio's blocking pool, so arbiters keep serving their mailboxes (production).
    Pool,
}

impl SolverMode {
    /// Runs `work` where this mode says; `None` when it panicked on the pool (logged).
    pub async fn run<T: Send + 'static>(self, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        match self {
            SolverMode::Inline => Some(work()),
            SolverMode::Pool => match tokio::task::spawn_blocking(work).await {
                Ok(done) => Some(done),
                Err(error) => {
                    tracing::error!(%error, "a simulation panicked");
                    None
                }
            },
        }
    }
}

/// How the controllers behave.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `BATCH_IDLE_DURATION`: a batch closes when no pending pod arrives for this long.
    pub batch_idle: Duration,
    /// `BATCH_MAX_DURATION`: a batch closes this long after it opened, however busy.
    pub batch_max: Duration,
    /// Where the simulation runs.
    pub solver: SolverMode,
    /// Arbiters the NodePool actors are sharded over; 0 keeps them on the current one.
    pub shards: usize,
    /// The seed of the jitter of the watches' backoff after an error; `None`: random (production).
    /// Simulations pass theirs, so that a relist comes at the same moment in every run of a seed.
    pub watch_jitter_seed: Option<u64>,
    /// How often the garbage collector compares the cloud with the cluster.
    pub garbage_collection: Duration,
    /// Karpenter's `ReservedCapacity` feature gate: the reserved offerings of capacity
    /// reservations are launched into (on by default, as in Karpenter).
    pub reserved_capacity: bool,
    /// Karpenter's `SpotToSpotConsolidation` feature gate: spot nodes may be replaced by spot.
    pub spot_to_spot_consolidation: bool,
    /// Karpenter's `NodeRepair` feature gate: nodes the cloud's repair policies call broken for
    /// long enough are replaced.
    pub node_repair: bool,
    /// Karpenter's `StaticCapacity` feature gate: NodePools with `replicas` keep that many nodes.
    pub static_capacity: bool,
    /// Karpenter's `NodeOverlay` feature gate: NodeOverlays change the catalog's prices and
    /// extended resources.
    pub node_overlay: bool,
    /// Karpenter's `CapacityBuffer` feature gate: CapacityBuffers' virtual pods are provisioned
    /// for, and the nodes holding them kept ([`crate::capacity_buffers`]).
    pub capacity_buffer: bool,
    /// The interruption queue to read (`INTERRUPTION_QUEUE`); none: interruptions are not read.
    pub interruption_queue: Option<Arc<dyn InterruptionQueue>>,
    /// Where the controllers crash: nowhere but in the fault-injection suite.
    pub faults: FaultPoints,
    /// The shards this replica holds when NodePools are split between replicas (`REPLICA_SHARDS`);
    /// none: it acts for every NodePool.
    pub replica_shards: Option<ReplicaShards>,
    /// The cluster's kube-scheduler settings the simulation mirrors (`SCHEDULER_CONFIG`); none:
    /// pods are spread only as they ask.
    pub scheduler_config: Option<Arc<SchedulerConfig>>,
}

impl Settings {
    /// Whether the controllers act for the NodePool `pool`: always, unless NodePools are split
    /// between replicas and its shard is another's.
    pub fn acts_for_pool(&self, pool: &str) -> bool {
        self.replica_shards
            .as_ref()
            .is_none_or(|shards| shards.holds_pool(pool))
    }

    /// Whether the controllers run the cluster-wide jobs: always, unless NodePools are split
    /// between replicas and shard 0 is another's.
    pub fn acts_cluster_wide(&self) -> bool {
        self.replica_shards
            .as_ref()
            .is_none_or(ReplicaShards::holds_first)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            solver: SolverMode::Pool,
            shards: 0,
            watch_jitter_seed: None,
            garbage_collection: Duration::from_secs(120),
            reserved_capacity: true,
            spot_to_spot_consolidation: false,
            node_repair: false,
            static_capacity: false,
            node_overlay: false,
            capacity_buffer: false,
            interruption_queue: None,
            faults: FaultPoints::none(),
            replica_shards: None,
            scheduler_config: None,
        }
    }
}

/// How long an actor waits for another actor's answer before it gives up on this step.
pub const ACTOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

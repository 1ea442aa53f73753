//! Joist's controllers as actix actors (see DESIGN.md §3): [`cluster_state::ClusterState`] fills
//! the [`read_model::ReadModel`] from watches and pokes the others; the [`batcher::Batcher`] turns
//! pending pods into batch windows; the [`provisioner::Provisioner`] simulates scheduling for each
//! window; one [`node_pool::NodePoolActor`] per NodePool creates NodeClaims within its limits and
//! keeps its status; one [`node_claim::NodeClaimActor`] per NodeClaim runs its
//! [`lifecycle`]; the [`catalog::Catalog`] lists instance types and remembers offerings out of
//! capacity; the [`garbage::GarbageCollector`] terminates instances no NodeClaim accounts for; the
//! [`disruption::DisruptionPlanner`] removes empty nodes and consolidates underused ones; the
//! [`interruption::InterruptionActor`] acts on the cloud's interruption warnings, the
//! [`instance_status::InstanceStatusActor`] on its failed instance status checks; the
//! [`capacity_reservations::CapacityReservationActor`] demotes nodes whose reservation is gone and
//! drains expiring capacity blocks; the [`capacity_buffers::CapacityBufferActor`] turns
//! CapacityBuffers into virtual pods for the provisioner; the [`pod_events::PodEventRecorder`]
//! records each NodeClaim's last pod event.
//! Every node's life is one OpenTelemetry trace ([`node_trace`]); what happens is counted in
//! Karpenter's Prometheus [`metrics`].
//!
//! Every actor's mailbox is bounded by a named constant. Per-object actors are supervised: one
//! that fails is restarted from the read model without touching the others.

pub mod decide;
pub mod effects;
pub mod state;

pub mod batcher;
pub mod capacity_buffers;
pub mod capacity_reservations;
pub mod catalog;
pub mod claim_creation;
pub mod cluster_state;
pub mod disruption;
pub mod explain;
pub mod garbage;
pub mod instance_status;
pub mod interruption;
pub mod lifecycle;
pub mod node_claim;
pub mod node_class;
pub mod node_pool;
pub mod overlay;
pub mod pod_events;
pub mod problem;
pub mod protocol;
pub mod provisioner;
pub mod settings;
pub mod shared;
pub mod static_capacity;

use std::sync::Arc;

use actix::prelude::*;
use joist_messages::time::Clock;
use joist_provider::{CloudProvider, interruption::InterruptionQueue};

use crate::{
    batcher::Batcher,
    capacity_buffers::CapacityBufferActor,
    capacity_reservations::CapacityReservationActor,
    catalog::Catalog,
    cluster_state::ClusterState,
    disruption::DisruptionPlanner,
    effects::cloud_calls::GuardedCloud,
    effects::events::Events,
    effects::faults::GatedQueue,
    effects::metrics::Metrics,
    effects::node_trace::NodeTracer,
    garbage::GarbageCollector,
    instance_status::InstanceStatusActor,
    interruption::InterruptionActor,
    pod_events::PodEventRecorder,
    provisioner::Provisioner,
    settings::Settings,
    shared::{CatalogHandle, Shared},
    state::read_model::{ReadModel, Writers},
};

/// The running controllers. Dropping it does not stop them; stop the actix system instead.
pub struct Controllers {
    /// What the controllers see.
    pub shared: Shared,
    /// The cluster state actor.
    pub cluster_state: Addr<ClusterState>,
    /// The batcher.
    pub batcher: Addr<Batcher>,
    /// The provisioner.
    pub provisioner: Addr<Provisioner>,
    /// The garbage collector.
    pub garbage_collector: Addr<GarbageCollector>,
    /// The writer of NodeClaims' `status.lastPodEventTime`.
    pub pod_events: Addr<PodEventRecorder>,
    /// The disruption planner.
    pub disruption_planner: Addr<DisruptionPlanner>,
    /// The interruption actor, when a queue is configured.
    pub interruption: Option<Addr<InterruptionActor>>,
    /// The poller of the cloud's instance status checks.
    pub instance_status: Addr<InstanceStatusActor>,
    /// The demotion and expiry of reserved nodes.
    pub capacity_reservations: Addr<CapacityReservationActor>,
    /// The CapacityBuffers' resolution (idle with the gate off).
    pub capacity_buffers: Addr<CapacityBufferActor>,
}

/// What `joist explain` reads: the read model, filled by a [`ClusterState`] that only observes,
/// and the catalog; no controller runs, and nothing is written that the caller's `client` would
/// let through (give it one that refuses writes). The read model is ready once
/// `shared.read.synced()` is.
pub fn observe(
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    settings: Settings,
    clock: Clock,
) -> Shared {
    let (shared, writers) = shared(client, cloud, settings, clock, NodeTracer::disabled());
    ClusterState::observing(shared.clone(), writers).start();
    shared
}

/// What every actor is given, with the catalog started, and the read model's writers.
fn shared(
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    settings: Settings,
    clock: Clock,
    node_tracer: NodeTracer,
) -> (Shared, Writers) {
    let (read, writers) = ReadModel::mirroring(settings.scheduler_config.clone());
    let catalog = Catalog::new(cloud.clone(), settings.reserved_capacity).start();
    let catalog = CatalogHandle {
        instance_types: catalog.clone().recipient(),
        unavailable: catalog.recipient(),
    };
    let metrics = Metrics::for_shards(read.clone(), settings.replica_shards.clone());
    let shared = Shared {
        events: Events::start(client.clone(), clock, metrics.clone()),
        client,
        cloud,
        metrics,
        read,
        settings: Arc::new(settings),
        clock,
        directory: Arc::default(),
        catalog,
        node_tracer,
        started_at: clock.now_seconds(),
        breakers: Arc::default(),
        registration_health: Arc::default(),
        buffers: Arc::default(),
        freeing: Arc::default(),
        planned: Arc::default(),
    };
    (shared, writers)
}

/// Starts every controller on the current actix system, talking to the cluster through `client`
/// and to the cloud through `cloud` (every call under a deadline, see [`cloud_calls`]; with a fault
/// point armed in `settings.faults`, the cloud and the interruption queue go silent at the crash). NodePool actors are spread over `settings.shards` new
/// arbiters (none: the current one). Each node's lifecycle is traced to `node_tracer`.
pub fn start(
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    settings: Settings,
    clock: Clock,
    node_tracer: NodeTracer,
) -> Controllers {
    let mut settings = settings;
    let cloud: Arc<dyn CloudProvider> = Arc::new(GuardedCloud::new(cloud, settings.faults.clone(), clock));
    if settings.faults.armed().is_some() {
        settings.interruption_queue = settings.interruption_queue.map(|queue| {
            Arc::new(GatedQueue::new(queue, settings.faults.clone())) as Arc<dyn InterruptionQueue>
        });
    }
    let shards: Vec<ArbiterHandle> = (0..settings.shards).map(|_| Arbiter::new().handle()).collect();
    let (shared, writers) = shared(client, cloud, settings, clock, node_tracer);
    let provisioner = Provisioner::new(shared.clone()).start();
    let batcher = Batcher::new(
        &shared.settings,
        provisioner.clone().recipient(),
        shared.metrics.clone(),
    )
    .start();
    let garbage_collector = GarbageCollector::new(shared.clone()).start();
    let pod_events = PodEventRecorder::new(shared.clone()).start();
    let disruption_planner = DisruptionPlanner::new(shared.clone()).start();
    let interruption = shared
        .settings
        .interruption_queue
        .clone()
        .map(|queue| InterruptionActor::new(shared.clone(), queue).start());
    let instance_status = InstanceStatusActor::new(shared.clone()).start();
    let capacity_reservations = CapacityReservationActor::new(shared.clone()).start();
    let capacity_buffers = CapacityBufferActor::new(shared.clone(), provisioner.clone().recipient()).start();
    let cluster_state = ClusterState::new(shared.clone(), writers, batcher.clone(), shards).start();
    Controllers {
        shared,
        cluster_state,
        batcher,
        provisioner,
        garbage_collector,
        pod_events,
        disruption_planner,
        interruption,
        instance_status,
        capacity_reservations,
        capacity_buffers,
    }
}

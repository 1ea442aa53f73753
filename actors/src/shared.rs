//! What every actor is given: the Kubernetes client, the cloud, the read model, the settings, the
//! clock, the directory of per-object actors, where node traces go, the event recorder and the
//! metrics.

use std::sync::Arc;

use actix::Recipient;
use dashmap::DashMap;
use joist_messages::time::Clock;
use joist_provider::CloudProvider;

use crate::{
    disruption::candidates::Freeing,
    effects::events::Events,
    effects::metrics::Metrics,
    effects::node_trace::NodeTracer,
    protocol::{GetInstanceTypes, LaunchPlan, MarkUnavailable, Reconcile},
    settings::Settings,
    state::breaker::Breakers,
    state::read_model::ReadModel,
    state::{buffers::Buffers, planned::Planned, registration_health::RegistrationHealth},
};

/// The per-object actors, by object name, each reached through the messages it accepts.
#[derive(Default)]
pub struct Directory {
    /// One actor per NodePool.
    pub node_pools: DashMap<String, NodePoolHandle>,
    /// One actor per NodeClaim, which only ever needs a poke.
    pub node_claims: DashMap<String, Recipient<Reconcile>>,
}

/// A NodePool actor as the others reach it.
#[derive(Clone)]
pub struct NodePoolHandle {
    /// Look at the pool again (status, static size).
    pub reconcile: Recipient<Reconcile>,
    /// Create the NodeClaims a provisioning pass planned for the pool.
    pub launch: Recipient<LaunchPlan>,
}

/// The Catalog actor as the others reach it.
#[derive(Clone)]
pub struct CatalogHandle {
    /// A NodePool's instance types.
    pub instance_types: Recipient<GetInstanceTypes>,
    /// Offerings that just ran out of capacity.
    pub unavailable: Recipient<MarkUnavailable>,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct Shared {
    /// The Kubernetes API.
    pub client: kube::Client,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// What the cluster looks like.
    pub read: ReadModel,
    /// Controller settings.
    pub settings: Arc<Settings>,
    /// Timestamps for conditions and events.
    pub clock: Clock,
    /// Per-object actors.
    pub directory: Arc<Directory>,
    /// The catalog actor.
    pub catalog: CatalogHandle,
    /// Where each node's lifecycle spans go.
    pub node_tracer: NodeTracer,
    /// Kubernetes Events, de-duplicated.
    pub events: Events,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// When these controllers started (clock seconds): a NodeClaim created before may have been
    /// launched by controllers that crashed before they could say so.
    pub started_at: i64,
    /// The NodePools' launch circuit breakers.
    pub breakers: Arc<Breakers>,
    /// The NodePools' recent registration outcomes, behind `NodeRegistrationHealthy`.
    pub registration_health: Arc<RegistrationHealth>,
    /// The CapacityBuffers' virtual pods, and the nodes holding them.
    pub buffers: Arc<Buffers>,
    /// Since when each NodePool has been making room, for consolidation's wait.
    pub freeing: Arc<Freeing>,
    /// The launching NodeClaim each waiting pod was planned for.
    pub planned: Arc<Planned>,
}

impl Shared {
    /// Asks `actor` (a `kind` actor) to reconcile; a full mailbox already holds a poke, so nothing
    /// is lost, and the coalescing is counted.
    pub fn poke(&self, actor: &Recipient<Reconcile>, kind: &str) {
        if actor.try_send(Reconcile).is_err() {
            self.metrics.found_full(kind);
        }
    }

    /// Asks the NodePool `name`'s actor, if it runs, to write its status again.
    pub fn poke_node_pool(&self, name: &str) {
        if let Some(actor) = self.directory.node_pools.get(name) {
            self.poke(&actor.reconcile, "nodepool");
        }
    }
}

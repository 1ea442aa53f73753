//! What every actor is given: the Kubernetes client, the cloud, the read model, the settings, the
//! clock, the directory of per-object actors, where node traces go, the event recorder and the
//! metrics.

use std::sync::Arc;

use actix::{Actor, Addr, Context, Handler};
use dashmap::DashMap;
use joist_messages::time::Clock;
use joist_provider::CloudProvider;

use crate::{
    catalog::Catalog, effects::events::Events, effects::metrics::Metrics, effects::node_trace::NodeTracer,
    effects::settings::Settings, node_claim::NodeClaimActor, node_pool::NodePoolActor, protocol::Reconcile,
    state::breaker::Breakers, state::read_model::ReadModel, state::registration_health::RegistrationHealth,
};

/// The addresses of the per-object actors, by object name.
#[derive(Default)]
pub struct Directory {
    /// One actor per NodePool.
    pub node_pools: DashMap<String, Addr<NodePoolActor>>,
    /// One actor per NodeClaim.
    pub node_claims: DashMap<String, Addr<NodeClaimActor>>,
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
    pub catalog: Addr<Catalog>,
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
}

impl Shared {
    /// Asks `actor` (a `kind` actor) to reconcile; a full mailbox already holds a poke, so nothing
    /// is lost, and the coalescing is counted.
    pub fn poke<A>(&self, actor: &Addr<A>, kind: &str)
    where
        A: Actor<Context = Context<A>> + Handler<Reconcile>,
    {
        if actor.try_send(Reconcile).is_err() {
            self.metrics.found_full(kind);
        }
    }

    /// Asks the NodePool `name`'s actor, if it runs, to write its status again.
    pub fn poke_node_pool(&self, name: &str) {
        if let Some(actor) = self.directory.node_pools.get(name) {
            self.poke(&actor, "nodepool");
        }
    }
}

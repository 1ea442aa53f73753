//! The messages the actors exchange. Payloads are plain data from `joist-messages`,
//! `joist-scheduling` and `joist-provider`; only the envelopes here know about actix.

use std::sync::Arc;

use actix::Message;
use joist_messages::{
    apis::{EC2NodeClass, NodePool},
    cached_pod::CachedPod,
    model::instance_type::InstanceType,
};
use joist_provider::{CloudError, OfferingKey};
use joist_scheduling::NewClaim;

use crate::state::read_model::PodKey;

/// A pod became provisionable (ClusterState → Batcher).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct PodPending {
    /// The pod.
    pub pod: PodKey,
}

/// A closed batch window (Batcher → Provisioner).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ProvisionBatch {
    /// How many pods triggered it, deduplicated.
    pub pods: usize,
}

/// NodeClaims to create for one NodePool (Provisioner → NodePool). Each claim becomes its NodeClaim
/// only as it is created, so a plan of 10,000 claims never holds 10,000 lists of up to 600
/// instance type names at once.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct LaunchPlan {
    /// The NodePool as the plan saw it, whose template the NodeClaims are built from.
    pub pool: Arc<NodePool>,
    /// The claims the simulation opened for the pool (named by `generateName` when created).
    pub claims: Vec<NewClaim>,
    /// The instance types the claims' positions index.
    pub instance_types: Arc<[Arc<InstanceType>]>,
    /// The real pods the claims' pod positions index, each told its claim once it is created (a
    /// position past the end is a CapacityBuffer's virtual pod, told nothing).
    pub pods: Arc<[Arc<CachedPod>]>,
}

/// Something an actor watches changed: look at the read model again.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Reconcile;

/// The instance types a NodePool can launch, offerings out of capacity marked unavailable
/// (anyone → Catalog).
#[derive(Debug, Message)]
#[rtype(result = "Result<Arc<Vec<Arc<InstanceType>>>, CloudError>")]
pub struct GetInstanceTypes {
    /// The NodePool.
    pub node_pool: Arc<NodePool>,
    /// Its node class.
    pub node_class: Arc<EC2NodeClass>,
}

/// Offerings that just ran out of capacity (NodeClaim → Catalog).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct MarkUnavailable {
    /// The offerings.
    pub offerings: Vec<OfferingKey>,
}

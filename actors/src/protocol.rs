//! The messages the actors exchange. Payloads are plain data from `joist-messages` and
//! `joist-provider`; only the envelopes here know about actix.

use std::sync::Arc;

use actix::Message;
use joist_messages::{
    apis::{EC2NodeClass, NodeClaim, NodePool},
    model::instance_type::InstanceType,
};
use joist_provider::{CloudError, OfferingKey};

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
    /// The pods that triggered it, deduplicated.
    pub pods: Vec<PodKey>,
}

/// NodeClaims to create for one NodePool (Provisioner → NodePool).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct LaunchPlan {
    /// The claims, named by `generateName`.
    pub claims: Vec<NodeClaim>,
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

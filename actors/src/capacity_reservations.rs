//! The CapacityReservation actor: every minute, the two duties of Karpenter's AWS capacity
//! reservation controllers (`capacitytype` and `expiration`).
//!
//! - **Demotion.** A NodeClaim labelled `reserved` whose instance the cloud now reports bought
//!   otherwise (its reservation was cancelled or ended, and EC2 runs it on as an on-demand
//!   instance) is labelled `on-demand` and loses its reservation labels, and so does its
//!   registered Node. Nothing is ever promoted the other way.
//! - **Expiry.** A NodeClaim in a capacity block that is expiring (from
//!   [`capacity_reservation::EXPIRY_LEAD_SECONDS`] before the block's end, as its node class's
//!   status lists it) is deleted, so its pods move before EC2 reclaims the instance.
//!
//! Failure modes: a cloud listing or a write that fails is logged and tried again at the next
//! poll. Only the replica acting cluster-wide (holding shard 0) polls; the cloud is not asked at
//! all while no NodeClaim is reserved.

use std::collections::{BTreeMap, HashMap};

use actix::prelude::*;
use joist_messages::{
    apis::{EC2NodeClass, NodeClaim},
    labels::{CAPACITY_TYPE, aws, capacity_type},
    model::instance_type::CapacityType,
};
use joist_provider::capacity_reservation::{self, POLL_INTERVAL};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::{effects::kube_ops, interruption::STANDBY_LOOK, shared::Shared};

/// The labels a demoted node loses.
const RESERVATION_LABELS: [&str; 3] = [
    aws::CAPACITY_RESERVATION_ID,
    aws::CAPACITY_RESERVATION_TYPE,
    aws::CAPACITY_RESERVATION_INTERRUPTIBLE,
];

/// See the module docs.
pub struct CapacityReservationActor {
    shared: Shared,
}

impl CapacityReservationActor {
    /// An actor over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

impl Actor for CapacityReservationActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.spawn(poll(self.shared.clone()).into_actor(self));
    }
}

async fn poll(shared: Shared) {
    shared.read.synced().await;
    loop {
        if !shared.settings.acts_cluster_wide() {
            tokio::time::sleep(STANDBY_LOOK).await;
            continue;
        }
        let reserved: Vec<_> = shared
            .read
            .node_claims()
            .into_iter()
            .filter(|claim| claim.metadata.deletion_timestamp.is_none() && is_reserved(claim))
            .collect();
        if !reserved.is_empty() {
            demote(&shared, &reserved).await;
            expire(&shared, &reserved).await;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn is_reserved(claim: &NodeClaim) -> bool {
    claim.labels().get(CAPACITY_TYPE).map(String::as_str) == Some(capacity_type::RESERVED)
}

/// The labels patch that makes a node on-demand.
fn demotion() -> Value {
    let mut labels: BTreeMap<&str, Value> =
        RESERVATION_LABELS.iter().map(|key| (*key, Value::Null)).collect();
    labels.insert(CAPACITY_TYPE, json!(capacity_type::ON_DEMAND));
    json!({"metadata": {"labels": labels}})
}

/// Demotes the `reserved` claims whose instances the cloud no longer reports reserved.
async fn demote(shared: &Shared, reserved: &[std::sync::Arc<NodeClaim>]) {
    let instances = match shared.cloud.list().await {
        Ok(instances) => instances,
        Err(error) => {
            tracing::warn!(%error, "listing instances to find demoted reservations failed; trying again in a minute");
            return;
        }
    };
    let bought: HashMap<&str, CapacityType> = instances
        .iter()
        .map(|i| (i.provider_id.as_str(), i.capacity_type))
        .collect();
    let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
    let nodes = kube_ops::cluster::<Node>(&shared.client);
    for claim in reserved {
        let Some(provider_id) = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) else {
            continue;
        };
        if bought
            .get(provider_id)
            .is_none_or(|c| *c == CapacityType::Reserved)
        {
            continue;
        }
        let name = claim.name_any();
        tracing::info!(
            nodeclaim = name,
            "demoting a reserved nodeclaim to on-demand: its reservation no longer holds it"
        );
        if let Err(error) = kube_ops::patch(&claims, &name, demotion()).await {
            tracing::warn!(nodeclaim = name, %error, "demoting the nodeclaim failed; trying again in a minute");
            continue;
        }
        let node = shared.read.node_for_provider(provider_id);
        if let Some(node) = node.filter(|n| n.metadata.deletion_timestamp.is_none())
            && let Err(error) = kube_ops::patch(&nodes, &node.name_any(), demotion()).await
        {
            tracing::warn!(node = node.name_any(), %error, "demoting the node failed; trying again in a minute");
        }
    }
}

/// Deletes the claims whose capacity block is expiring.
async fn expire(shared: &Shared, reserved: &[std::sync::Arc<NodeClaim>]) {
    let now = shared.clock.now_seconds();
    let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
    for claim in reserved {
        let Some(id) = claim.labels().get(aws::CAPACITY_RESERVATION_ID) else {
            continue;
        };
        let class = shared.read.node_class(&claim.spec.node_class_ref.name);
        if !class.as_deref().is_some_and(|class| expiring(class, id, now)) {
            continue;
        }
        let name = claim.name_any();
        tracing::info!(
            nodeclaim = name,
            reservation = id,
            "initiating delete for capacity block expiration"
        );
        if let Err(error) = kube_ops::delete(&claims, &name).await {
            tracing::warn!(nodeclaim = name, %error, "deleting an expiring capacity block's nodeclaim failed; trying again in a minute");
        }
    }
}

/// Whether `class` lists the reservation `id` as a capacity block expiring at `now`.
fn expiring(class: &EC2NodeClass, id: &str, now: i64) -> bool {
    class
        .status
        .iter()
        .flat_map(|s| &s.capacity_reservations)
        .filter(|r| r.id == id)
        .any(|r| {
            let end = r.end_time.as_ref().map(|t| t.0.as_second());
            capacity_reservation::state(r.reservation_type, end, now)
                == joist_messages::apis::ec2nodeclass::ReservationState::Expiring
        })
}

//! The Interruption actor (DESIGN.md §3): reads the cloud's interruption queue and acts before the
//! instance goes, as Karpenter's interruption controller does.
//!
//! It long-polls the queue ([`InterruptionQueue::receive`]: up to 10 messages, 20 s wait),
//! handles up to [`MESSAGES_IN_FLIGHT`] at once, maps each instance id to its NodeClaim through the
//! read model's index (when NodePools are split between replicas, only the holder of shard 0 reads
//! the queue, and finds another shard's claim through the API), and:
//!
//! - spot interruption, capacity-reservation interruption, stopping or terminating instance, AWS
//!   Health scheduled change: records Karpenter's event (`SpotInterrupted`, `InstanceStopping` …)
//!   and `TerminatingOnInterruption`, and deletes the NodeClaim, which drains the node while it
//!   still runs; the provisioner replaces the capacity at once. A spot interruption also marks the
//!   offering unavailable in the Catalog, so the replacement goes elsewhere, and a capacity
//!   reservation interruption counts the reservation full
//!   ([`joist_provider::CloudProvider::reservation_reclaimed`]);
//! - rebalance recommendation: records `SpotRebalanceRecommendation`, nothing more.
//!
//! Every message is deleted once handled: one for an unknown instance, one that asks for nothing,
//! and one that is not understood (logged) alike. One whose NodeClaim delete failed is not: the
//! queue gives it again after its visibility timeout, as Karpenter leaves it. A queue that fails
//! (a wrong name, throttling) is retried with backoff and logged; the other controllers never
//! notice. It takes no messages (its polling drives it), so it has no mailbox to bound.

use std::{sync::Arc, time::Duration};

use actix::prelude::*;
use futures::{StreamExt, stream};
use joist_messages::{
    apis::NodeClaim,
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, ZONE, annotations::NODECLAIM_TERMINATION_TIMESTAMP, aws},
    model::instance_type::CapacityType,
};
use joist_provider::{
    OfferingKey,
    interruption::{InterruptionQueue, Kind, Parsed, QueueMessage, parse},
};
use kube::ResourceExt;

use crate::{
    decide::timing::doubling_backoff, effects::cluster_claims::every_claim, effects::faults::Step,
    effects::kube_ops, effects::metrics::MessageLabels, protocol::MarkUnavailable, shared::Shared,
};

/// Queue messages handled at once.
pub const MESSAGES_IN_FLIGHT: usize = 10;

/// How often a replica that does not hold shard 0 looks whether it has come to hold it.
pub(crate) const STANDBY_LOOK: Duration = Duration::from_secs(1);

/// The longest wait between two attempts at a failing queue.
pub const MAX_QUEUE_BACKOFF: Duration = Duration::from_secs(60);

/// See the module docs.
pub struct InterruptionActor {
    shared: Shared,
    queue: Arc<dyn InterruptionQueue>,
}

impl InterruptionActor {
    /// An actor reading `queue`.
    pub fn new(shared: Shared, queue: Arc<dyn InterruptionQueue>) -> Self {
        Self { shared, queue }
    }
}

impl Actor for InterruptionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.spawn(poll(self.shared.clone(), self.queue.clone()).into_actor(self));
    }
}

/// The wait after `failures` failed receives in a row: 1 s, doubling, up to a minute.
pub fn queue_backoff(failures: u32) -> Duration {
    doubling_backoff(Duration::from_secs(1), failures, MAX_QUEUE_BACKOFF)
}

/// Reads the queue for as long as the actor lives.
async fn poll(shared: Shared, queue: Arc<dyn InterruptionQueue>) {
    shared.read.synced().await;
    let mut failures = 0;
    loop {
        if !shared.settings.acts_cluster_wide() {
            // Another replica holds shard 0 and reads the queue.
            tokio::time::sleep(STANDBY_LOOK).await;
            continue;
        }
        match queue.receive().await {
            Ok(messages) => {
                failures = 0;
                stream::iter(messages)
                    .for_each_concurrent(MESSAGES_IN_FLIGHT, |message| {
                        handle(&shared, queue.as_ref(), message)
                    })
                    .await;
            }
            Err(error) => {
                failures += 1;
                let wait = queue_backoff(failures);
                tracing::warn!(%error, failures, retry_in = ?wait, "receiving from the interruption queue failed");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Handles one message, then deletes it unless acting on it failed.
async fn handle(shared: &Shared, queue: &dyn InterruptionQueue, message: QueueMessage) {
    let metrics = &shared.metrics;
    let mut acted = true;
    let message_type = match parse(&message.body) {
        Parsed::Interruption(interruption) => {
            for instance in &interruption.instance_ids {
                if let Err(error) = act(shared, interruption.kind, instance).await {
                    tracing::warn!(instance, %error, "deleting an interrupted nodeclaim failed; the message will come back");
                    acted = false;
                }
            }
            if let Ok(sent) = interruption.time.parse::<jiff::Timestamp>() {
                let waited = shared.clock.now_system().duration_since(sent.into());
                metrics
                    .interruption_queue_duration
                    .observe(waited.unwrap_or_default().as_secs_f64());
            }
            interruption.kind.message_type()
        }
        Parsed::Ignored(why) => {
            tracing::debug!(why, "interruption message needs no action");
            NO_OP
        }
        Parsed::NotUnderstood(why) => {
            tracing::warn!(why, "dropping a message the interruption queue should not carry");
            NO_OP
        }
    };
    metrics
        .interruption_received
        .get_or_create(&MessageLabels {
            message_type: message_type.to_owned(),
        })
        .inc();
    if !acted {
        return;
    }
    match queue.delete(&message.receipt).await {
        Ok(()) => {
            metrics.interruption_deleted.inc();
        }
        Err(error) => tracing::warn!(%error, "deleting an interruption message failed; it will come back"),
    }
}

/// The `message_type` of a message that asks for nothing or is not understood (Karpenter's).
pub const NO_OP: &str = "no_op";

/// Karpenter's event for each kind: reason, message, whether a warning.
fn event(kind: Kind) -> (&'static str, &'static str, bool) {
    match kind {
        Kind::SpotInterrupted => ("SpotInterrupted", "Spot interruption warning was triggered", true),
        Kind::CapacityReservationInterrupted => (
            "CapacityReservationInstanceInterrupted",
            "Capacity reservation interruption warning was triggered",
            true,
        ),
        Kind::RebalanceRecommendation => (
            "SpotRebalanceRecommendation",
            "Spot rebalance recommendation was triggered",
            false,
        ),
        Kind::InstanceStopped => ("InstanceStopping", "Instance is stopping", true),
        Kind::InstanceTerminated => ("InstanceTerminating", "Instance is terminating", true),
        Kind::ScheduledChange | Kind::InstanceStatus | Kind::SystemStatus | Kind::EventStatus => (
            "InstanceUnhealthy",
            "An unhealthy warning was triggered for the instance",
            true,
        ),
    }
}

/// Acts on `instance` as `kind` asks (see the module docs): whether it has a NodeClaim; fails when
/// the claim could not be deleted. A [forceful](Kind::forceful) kind stamps the claim's termination
/// deadline at now first, so its node is not drained pod by pod.
pub(crate) async fn act(shared: &Shared, kind: Kind, instance: &str) -> Result<bool, kube::Error> {
    let Some(claim) = claim_of(shared, instance).await? else {
        tracing::debug!(
            instance,
            kind = kind.message_type(),
            "no NodeClaim for the instance"
        );
        return Ok(false);
    };
    let (reason, message, warning) = event(kind);
    record(shared, &claim, reason, message, warning);
    tracing::info!(
        nodeclaim = claim.name_any(),
        instance,
        kind = kind.message_type(),
        "interruption"
    );
    if !kind.drains() {
        return Ok(true);
    }
    if kind == Kind::SpotInterrupted
        && let Some(offering) = offering(&claim)
    {
        shared.catalog.unavailable.do_send(MarkUnavailable {
            offerings: vec![offering],
        });
    }
    if kind == Kind::CapacityReservationInterrupted
        && let Some(id) = claim.labels().get(aws::CAPACITY_RESERVATION_ID)
    {
        shared.cloud.reservation_reclaimed(id);
    }
    if kind.forceful() && !claim.annotations().contains_key(NODECLAIM_TERMINATION_TIMESTAMP) {
        let now = shared.clock.now_seconds();
        kube_ops::stamp_termination_deadline(&shared.client, &claim.name_any(), now).await?;
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(true);
    }
    record(
        shared,
        &claim,
        "TerminatingOnInterruption",
        "Interruption triggered termination for the NodeClaim",
        true,
    );
    let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
    kube_ops::delete(&claims, &claim.name_any()).await?;
    shared.metrics.disrupted(claim.as_ref(), kind.message_type());
    shared.settings.faults.reach(Step::InterruptionActed).await;
    Ok(true)
}

/// The NodeClaim of `instance`: from the read model, or, when NodePools are split between replicas
/// and the claim is another shard's, from the API.
async fn claim_of(shared: &Shared, instance: &str) -> Result<Option<Arc<NodeClaim>>, kube::Error> {
    let read = &shared.read;
    if let Some(claim) = read
        .claim_for_instance(instance)
        .and_then(|name| read.node_claim(&name))
    {
        return Ok(Some(claim));
    }
    if shared.settings.replica_shards.is_none() {
        return Ok(None);
    }
    let claims = every_claim(&shared.client).await?;
    let Some(summary) = claims.iter().find(|claim| claim.is_instance(instance)) else {
        return Ok(None);
    };
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    Ok(api.get_opt(&summary.name).await?.map(Arc::new))
}

fn record(shared: &Shared, claim: &NodeClaim, reason: &str, message: &str, warning: bool) {
    if warning {
        shared.events.warn(claim, reason, message);
    } else {
        shared.events.normal(claim, reason, message);
    }
}

/// The spot offering the claim runs on.
fn offering(claim: &NodeClaim) -> Option<OfferingKey> {
    let labels = claim.labels();
    Some(OfferingKey {
        instance_type: labels.get(INSTANCE_TYPE)?.clone(),
        zone: labels.get(ZONE)?.clone(),
        capacity_type: CapacityType::from_label(labels.get(CAPACITY_TYPE)?)?,
        placement_group: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_queue_is_retried_ever_more_slowly() {
        let waits: Vec<u64> = (1..=8).map(|n| queue_backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    }
}

//! The GarbageCollector: every [`Settings::garbage_collection`](crate::settings::Settings), the
//! cloud's instances are compared with the cluster's NodeClaims, both ways.
//!
//! - An instance no NodeClaim accounts for (a launch whose claim was lost, a claim deleted
//!   mid-launch) is terminated once it is older than [`ORPHAN_GRACE`], so Joist never leaks an
//!   instance. When NodePools are split between replicas only the holder of shard 0 does this, and
//!   it reads every NodeClaim from the API ([`every_claim`]), not its own shards' alone.
//! - A registered NodeClaim, not being deleted, whose instance the cloud no longer lists (terminated
//!   from the console, say) is deleted unless its Node is Ready, as Karpenter's NodeClaim garbage
//!   collection does: a Ready Node's kubelet is still running, whatever the cloud says, and a claim
//!   not registered yet is left to the launch and registration timeouts. The deletion goes through
//!   termination (drain, then the finalizer), counted in `karpenter_nodeclaims_disrupted_total`
//!   with reason `garbage_collected`. Each replica does this for the claims it reflects.
//!
//! Failures are logged and retried on the next round.
//!
//! It takes no messages (its timer drives it), so it has no mailbox to bound; a round that is
//! still running when the next tick comes runs beside it, and both only ever delete instances no
//! claim accounts for.

use std::collections::HashSet;

use actix::prelude::*;
use tracing::Instrument;

use joist_messages::{
    apis::NodeClaim,
    conditions::{ConditionType, is_true},
};
use joist_provider::Instance;
use kube::ResourceExt;

use crate::{
    decide::{lifecycle::node_ready, timing::ORPHAN_GRACE},
    effects::{cluster_claims::every_claim, kube_ops},
    shared::Shared,
};

/// See the module docs.
pub struct GarbageCollector {
    shared: Shared,
}

impl GarbageCollector {
    /// A collector over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

impl Actor for GarbageCollector {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.shared.settings.garbage_collection, |collector, ctx| {
            let shared = collector.shared.clone();
            let round = collect(shared).instrument(tracing::debug_span!("garbage_collector.round"));
            ctx.spawn(round.into_actor(collector));
        });
    }
}

/// One round (see the module docs).
async fn collect(shared: Shared) {
    shared.read.synced().await;
    let instances = match shared.cloud.list().await {
        Ok(instances) => instances,
        Err(error) => {
            tracing::warn!(%error, "listing instances failed");
            return;
        }
    };
    let running: HashSet<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
    delete_claims_without_instances(&shared, &running).await;
    if shared.settings.acts_cluster_wide() {
        terminate_orphans(&shared, instances).await;
    }
}

/// Deletes the registered claims whose instance is not among `running` and whose Node is not
/// Ready (see the module docs).
async fn delete_claims_without_instances(shared: &Shared, running: &HashSet<&str>) {
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    for claim in shared.read.node_claims() {
        let Some(provider_id) = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) else {
            continue;
        };
        let registered = claim
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, ConditionType::Registered));
        let node_ready = shared
            .read
            .node_for_provider(provider_id)
            .is_some_and(|n| node_ready(&n));
        if !registered
            || claim.metadata.deletion_timestamp.is_some()
            || running.contains(provider_id)
            || node_ready
        {
            continue;
        }
        let name = claim.name_any();
        match kube_ops::delete(&api, &name).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(
                    nodeclaim = name,
                    provider_id,
                    "deleting a nodeclaim whose instance is gone"
                );
                shared.metrics.disrupted(claim.as_ref(), "garbage_collected");
            }
            Err(error) => {
                tracing::warn!(nodeclaim = name, %error, "deleting a nodeclaim whose instance is gone failed")
            }
        }
    }
}

/// Terminates the instances of `instances` no NodeClaim accounts for (see the module docs).
async fn terminate_orphans(shared: &Shared, instances: Vec<Instance>) {
    let listed = match &shared.settings.replica_shards {
        None => None,
        Some(_) => match every_claim(&shared.client).await {
            Ok(claims) => Some(claims),
            Err(error) => {
                tracing::warn!(%error, "listing every nodeclaim failed");
                return;
            }
        },
    };
    // With every claim listed: the provider IDs they hold, and the names of those not launched yet.
    let listed = listed.as_ref().map(|claims| {
        let launched: HashSet<&str> = claims.iter().filter_map(|c| c.provider_id.as_deref()).collect();
        let unlaunched: HashSet<&str> = claims
            .iter()
            .filter(|c| c.provider_id.is_none())
            .map(|c| c.name.as_str())
            .collect();
        (launched, unlaunched)
    });
    let now = shared.clock.now_seconds();
    let grace = i64::try_from(ORPHAN_GRACE.as_secs()).unwrap_or(i64::MAX);
    for instance in instances {
        let named = instance.tags.get("karpenter.sh/nodeclaim");
        let accounted = match &listed {
            None => {
                shared.read.claim_for_provider(&instance.provider_id).is_some()
                    || named
                        .and_then(|name| shared.read.node_claim(name))
                        .is_some_and(|c| c.status.as_ref().and_then(|s| s.provider_id.as_ref()).is_none())
            }
            Some((launched, unlaunched)) => {
                launched.contains(instance.provider_id.as_str())
                    || named.is_some_and(|name| unlaunched.contains(name.as_str()))
            }
        };
        if accounted || now - instance.launched_at < grace {
            continue;
        }
        tracing::info!(
            provider_id = instance.provider_id,
            "terminating an instance no nodeclaim accounts for"
        );
        if let Err(error) = shared.cloud.delete(&instance.provider_id).await {
            tracing::warn!(provider_id = instance.provider_id, %error, "terminating a leaked instance failed");
        }
    }
}

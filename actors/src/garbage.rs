//! The GarbageCollector: every [`Settings::garbage_collection`](crate::settings::Settings), the
//! cloud's instances are compared with the cluster's NodeClaims. An instance no NodeClaim accounts
//! for (a launch whose claim was lost, a claim deleted mid-launch) is terminated once it is older
//! than [`ORPHAN_GRACE`], so Joist never leaks an instance. Failures are logged and retried on the
//! next round. When NodePools are split between replicas only the holder of shard 0 collects, and
//! it reads every NodeClaim from the API ([`every_claim`]), not its own shards' alone.
//!
//! It takes no messages (its timer drives it), so it has no mailbox to bound; a round that is
//! still running when the next tick comes runs beside it, and both only ever delete instances no
//! claim accounts for.

use std::collections::HashSet;

use actix::prelude::*;
use tracing::Instrument;

use crate::{decide::timing::ORPHAN_GRACE, effects::cluster_claims::every_claim, shared::Shared};

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
    if !shared.settings.acts_cluster_wide() {
        return;
    }
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
    let instances = match shared.cloud.list().await {
        Ok(instances) => instances,
        Err(error) => {
            tracing::warn!(%error, "listing instances failed");
            return;
        }
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

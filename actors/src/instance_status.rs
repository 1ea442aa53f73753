//! The InstanceStatus actor: asks the cloud every minute which instances its status checks find
//! broken ([`CloudProvider::impaired_instances`]: EC2's DescribeInstanceStatus) and replaces
//! them, as Karpenter's AWS provider does since v1.12, with or without an interruption queue.
//!
//! Each category that makes an instance unhealthy ([`unhealthy`]: an instance or system check
//! failed for two minutes, or a scheduled event) is handled as an interruption of its kind
//! ([`crate::interruption::act`]): an `InstanceUnhealthy` event, and the NodeClaim deleted; for a
//! failed instance or system check its termination deadline is stamped at now first, so the
//! broken node is not drained pod by pod. An instance no NodeClaim accounts for (another
//! cluster's, in the same account) is left alone. `karpenter_interruption_instance_status_unhealthy_total`
//! counts each instance and category once while it stays reported, and again if it comes back
//! after a poll that no longer reported it.
//!
//! Failure modes: a poll that fails is logged and tried again at the next interval; a cloud that
//! does not permit the query ([`CloudError::NotPermitted`]: the role lacks
//! `ec2:DescribeInstanceStatus`) is logged once as an error and not asked again until the
//! controller restarts; acting on one instance that fails (its NodeClaim delete) is logged and
//! tried again at the next poll. Only the replica that holds shard 0 polls, as it alone reads the
//! interruption queue.

use std::collections::BTreeSet;

use actix::prelude::*;
use futures::{StreamExt, stream};
use joist_provider::{
    CloudError,
    instance_status::{InstanceHealth, POLL_INTERVAL, StatusCategory, unhealthy},
};

use crate::{
    effects::metrics::CategoryLabels,
    interruption::{MESSAGES_IN_FLIGHT, STANDBY_LOOK, act},
    shared::Shared,
};

/// An instance and one category of its status that made it unhealthy.
type Finding = (String, StatusCategory);

/// See the module docs.
pub struct InstanceStatusActor {
    shared: Shared,
}

impl InstanceStatusActor {
    /// An actor asking `shared.cloud`.
    pub fn new(shared: Shared) -> Self {
        Self { shared }
    }
}

impl Actor for InstanceStatusActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.spawn(poll(self.shared.clone()).into_actor(self));
    }
}

/// Asks the cloud every [`POLL_INTERVAL`] for as long as the actor lives, or until the cloud
/// refuses the query.
async fn poll(shared: Shared) {
    shared.read.synced().await;
    let mut counted = BTreeSet::new();
    loop {
        if !shared.settings.acts_cluster_wide() {
            tokio::time::sleep(STANDBY_LOOK).await;
            continue;
        }
        match shared.cloud.impaired_instances().await {
            Ok(reported) => counted = handle(&shared, reported, &counted).await,
            Err(error @ CloudError::NotPermitted { .. }) => {
                tracing::error!(
                    %error,
                    "instance status checks are off: grant ec2:DescribeInstanceStatus to the controller's role and restart it"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "asking for the instances' status checks failed; asking again in a minute")
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Acts on every unhealthy category of every reported instance; returns what was found with a
/// NodeClaim, and counts what `counted` (the last poll's) did not hold.
async fn handle(
    shared: &Shared,
    reported: Vec<InstanceHealth>,
    counted: &BTreeSet<Finding>,
) -> BTreeSet<Finding> {
    let now = shared.clock.now_seconds();
    let findings: Vec<Finding> = reported
        .iter()
        .flat_map(|health| {
            unhealthy(health, now)
                .into_iter()
                .map(|category| (health.instance_id.clone(), category))
        })
        .collect();
    let acted: Vec<Option<Finding>> = stream::iter(findings)
        .map(|(instance, category)| async move {
            match act(shared, category.kind(), &instance).await {
                Ok(true) => Some((instance, category)),
                Ok(false) => None,
                Err(error) => {
                    tracing::warn!(instance, %error, "replacing an unhealthy instance's nodeclaim failed; trying again at the next poll");
                    // Its NodeClaim exists: it was found, and stays counted.
                    Some((instance, category))
                }
            }
        })
        .buffer_unordered(MESSAGES_IN_FLIGHT)
        .collect()
        .await;
    let found: BTreeSet<Finding> = acted.into_iter().flatten().collect();
    for (instance, category) in found.difference(counted) {
        tracing::info!(
            instance,
            category = category.label(),
            "detected an unhealthy instance owned by the cluster"
        );
        shared
            .metrics
            .instance_status_unhealthy
            .get_or_create(&CategoryLabels {
                category: category.label().to_owned(),
            })
            .inc();
    }
    found
}

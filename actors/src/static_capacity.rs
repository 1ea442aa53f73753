//! Static NodePools (`spec.replicas`, behind Karpenter's `StaticCapacity` feature gate): the
//! NodePool actor keeps exactly `replicas` NodeClaims for the pool, whether or not pods need them.
//!
//! - Too few (a new pool, `replicas` raised, a node expired or was interrupted): the missing
//!   NodeClaims are created from the template alone (its requirements, no pods, no requests), so
//!   the cloud launches the cheapest offering the template allows. `limits.nodes` caps them, with
//!   a `LimitsExceeded` event, as for any pool.
//! - Too many (`replicas` lowered): the surplus is deleted, NodeClaims not launched yet first, then
//!   empty nodes (DaemonSet pods only), then the nodes with the fewest pods, nodes running a
//!   `karpenter.sh/do-not-disrupt` pod last. Deletion drains through the usual termination
//!   (PodDisruptionBudgets and `terminationGracePeriod` hold); no disruption budget applies, as in
//!   Karpenter.
//! - Drifted (Karpenter's StaticDrift): while a node is `Drifted` and every other is Initialized,
//!   one more NodeClaim is created (within `limits.nodes`: a pool at its node limit is not
//!   replaced); once it is Initialized, the pool is one over and the drifted node goes first. One
//!   node at a time.
//!
//! Static pools never launch for pending pods (the Provisioner leaves them out) and their nodes are
//! not candidates for emptiness, consolidation or drift; expiry and repair still replace them.
//! Which NodeClaims go is decided in [`crate::decide::static_capacity`]. Creates and deletes that
//! fail are logged; the actor looks again every [`STATIC_REQUEUE`].

use std::{sync::Arc, time::Duration};

use joist_messages::apis::{NodeClaim, NodePool};
use joist_scheduling::NewClaim;
use kube::{Api, ResourceExt};

use crate::{
    claim_creation::create_claims,
    decide::static_capacity::{Plan, plan},
    effects::kube_ops,
    protocol::LaunchPlan,
    shared::Shared,
    state::snapshot,
};

/// How often a static pool is looked at without anything changing.
pub const STATIC_REQUEUE: Duration = Duration::from_secs(60);

/// Brings the static `pool`, which its actor found Ready, to its `replicas` (see the module
/// docs). Does nothing for a dynamic pool or one being deleted.
pub async fn reconcile(shared: &Shared, pool: &NodePool) {
    let Some(replicas) = pool.spec.replicas else {
        return;
    };
    if pool.metadata.deletion_timestamp.is_some() {
        return;
    }
    let name = pool.name_any();
    let claims = shared.read.node_claims_of(&name);
    let now = shared.clock.now_seconds();
    match plan(replicas, &claims, |node| shared.read.pods_on(node), now) {
        Plan::Hold => {}
        Plan::Create(count) => {
            let Ok(input) = snapshot::pool_input(&shared.read, pool, Vec::new()) else {
                return;
            };
            let template = NewClaim {
                node_pool: 0,
                requirements: input.requirements,
                instance_types: Vec::new(),
                price: 0.0,
                requests: Default::default(),
                pods: Vec::new(),
            };
            tracing::info!(
                nodepool = name,
                count,
                replicas,
                "creating nodeclaims for a static nodepool"
            );
            let plan = LaunchPlan {
                pool: Arc::new(pool.clone()),
                claims: vec![template; count],
                instance_types: Arc::new([]),
                pods: Arc::new([]),
            };
            create_claims(shared, plan).await;
        }
        Plan::Delete(surplus) => {
            tracing::info!(
                nodepool = name,
                count = surplus.len(),
                replicas,
                "removing nodeclaims of a static nodepool"
            );
            let api: Api<NodeClaim> = kube_ops::cluster(&shared.client);
            for claim in surplus {
                if let Err(error) = kube_ops::delete(&api, &claim).await {
                    tracing::warn!(nodepool = name, nodeclaim = claim, %error, "deleting a nodeclaim failed");
                }
            }
        }
    }
}

//! Creating the NodeClaims a pass planned for one NodePool, for the Provisioner's launch plans and a
//! static pool's missing replicas alike: the claims that still fit the pool's limits
//! ([`crate::decide::limits`]) are built from the pool's template ([`claim_template`]) and created
//! [`CLAIM_CREATES_IN_FLIGHT`] at a time, and each refused one gets a `LimitsExceeded` event on the
//! pool. The pods a created claim was planned for are told so (`Nominated`,
//! [`crate::effects::nominations`]) while the nominations' rate allows, and the next provisioning
//! pass keeps them on it ([`crate::state::planned`]). A create that fails is logged; its pods stay
//! pending and the next pass plans for them again.

use futures::{StreamExt, stream};
use joist_messages::apis::NodeClaim;
use kube::{Api, ResourceExt, api::PostParams};

use crate::{
    decide::{claim_template, limits},
    effects::faults::Step,
    effects::{kube_ops, nominations::Target},
    protocol::LaunchPlan,
    shared::Shared,
};

/// NodeClaim creates of one launch plan in flight at once.
pub const CLAIM_CREATES_IN_FLIGHT: usize = 16;

/// Creates the claims of `plan` that fit its NodePool's limits (see the module docs).
pub async fn create_claims(shared: &Shared, plan: LaunchPlan) {
    let name = plan.pool.name_any();
    let name = name.as_str();
    let Some(pool) = shared.read.node_pool(name) else {
        return;
    };
    let admission = limits::admit(&pool, shared.read.pool_usage(name), plan.claims);
    for exceeded in &admission.refused {
        let message = format!(
            "nodepool {name:?} would exceed its limits on {}",
            exceeded.join(", ")
        );
        shared.events.warn(pool.as_ref(), "LimitsExceeded", &message);
    }
    let api: Api<NodeClaim> = kube_ops::cluster(&shared.client);
    stream::iter(admission.accepted)
        .for_each_concurrent(CLAIM_CREATES_IN_FLIGHT, |claim| {
            let api = api.clone();
            let pods: Vec<_> = claim
                .pods
                .iter()
                .filter_map(|&p| plan.pods.get(p).cloned())
                .collect();
            let claim = claim_template::node_claim(&plan.pool, &claim, &plan.instance_types);
            async move {
                match api.create(&PostParams::default(), &claim).await {
                    Ok(created) => {
                        let created_name = created.name_any();
                        tracing::info!(nodepool = name, nodeclaim = created_name, "created nodeclaim");
                        let target = Target {
                            claim: Some(&created_name),
                            node: None,
                        };
                        // Nominations are rate limited across all pods: once none could be told,
                        // the rest of a claim's pods (hundreds on a large node) are not looked at.
                        for pod in pods.iter().take_while(|_| shared.events.can_nominate()) {
                            shared.events.nominated(pod.as_ref(), target);
                        }
                        shared.planned.record(
                            &created_name,
                            pods.iter().filter_map(|pod| pod.metadata.uid.as_deref()),
                        );
                        shared.read.record_created(created);
                        shared.metrics.created(name, "provisioned");
                        shared.settings.faults.reach(Step::ClaimCreated).await;
                    }
                    Err(error) => tracing::warn!(nodepool = name, %error, "creating a nodeclaim failed"),
                }
            }
        })
        .await;
}

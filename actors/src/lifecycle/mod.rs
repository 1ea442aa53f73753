//! What a NodeClaim actor does next, one step at a time, as Karpenter's lifecycle and termination
//! controllers do. Each step reads what it needs ([`decide::Facts`]), decides without I/O
//! ([`decide`]), and performs the plan ([`execute`]):
//!
//! - **launch**: the cloud creates an instance from the NodePool's instance types; capacity errors
//!   mark offerings unavailable and delete the claim (its pods are simulated again without them),
//!   an unready node class deletes it, other errors set `Launched=Unknown` and retry;
//! - **registration**: the Node with the claim's provider ID gets the claim's labels, Joist's
//!   finalizer and an owner reference, loses `karpenter.sh/unregistered`, and the claim turns
//!   `Registered`;
//! - **initialization**: once the Node is Ready with no startup or boot taints left and every
//!   extended resource of the claim registered, it is labelled `karpenter.sh/initialized` and the
//!   claim turns `Initialized` and `Ready`;
//! - **liveness**: not launched within [`LAUNCH_TIMEOUT`](crate::decide::timing::LAUNCH_TIMEOUT) or not
//!   registered within [`REGISTRATION_TIMEOUT`](crate::decide::timing::REGISTRATION_TIMEOUT) deletes the
//!   claim; so does its Node going away after registration;
//! - **termination** (the claim is being deleted): taint the Node `karpenter.sh/disrupted`, evict
//!   its pods through the Eviction API, largest first for the first seconds (a
//!   PodDisruptionBudget's 429 is retried), wait until every
//!   evicted pod is gone (pods shutting down still run on the instance) and at least
//!   [`MINIMUM_DRAIN_TIME`](crate::decide::timing::MINIMUM_DRAIN_TIME), wait until the volumes of the
//!   drained pods are detached (VolumeAttachments gone, or the `terminationGracePeriod` over),
//!   terminate the instance, then release the Node's and the claim's finalizers, in that order;
//! - **repair** (the `NodeRepair` gate): a Node broken for longer than the cloud's policy
//!   tolerates has its claim deleted at once ([`repair`]).
//!
//! Each finished phase is recorded as a span of the node's trace ([`crate::effects::node_trace`]).
//!
//! Kubernetes API and cloud errors are returned to the actor, which retries with backoff and, when
//! they persist, stops so its supervisor restarts it from the read model.

pub mod execute;

use std::{collections::HashSet, sync::Arc};

use joist_messages::{cached_pod::CachedPod, labels::NODEPOOL};
use joist_provider::CloudError;
use kube::ResourceExt;
use tokio::time::Instant;

use self::execute::{StepError, Target, execute};
use crate::{
    decide::{
        lifecycle::{Facts, Leaving, Memory, Next, decide, provider_id, waits_for_drain},
        repair::{self, Repair},
    },
    shared::Shared,
    state::read_model::ReadModel,
};

/// Takes the next step for the claim `name` (see the module docs).
pub async fn step(shared: &Shared, name: &str, memory: &mut Memory) -> Result<Next, StepError> {
    let read = &shared.read;
    // Karpenter's cluster-state sync gate: a claim listed before the Nodes are is not judged on a
    // node that merely has not been listed yet (a new leader deleted healthy claims as "node gone").
    read.synced().await;
    let Some(claim) = read.node_claim(name) else {
        return Ok(Next::Gone);
    };
    let provider_id = provider_id(&claim, memory);
    let node = provider_id.as_deref().and_then(|p| read.node_for_provider(p));
    // Only a drain looks at the node's pods, and only a claim being deleted drains.
    let pods = match (&claim.metadata.deletion_timestamp, &node) {
        (Some(_), Some(node)) => read.pods_on(&node.name_any()),
        _ => Vec::new(),
    };
    // Read once, when the drain ranks its pods' sizes among those of every node drained.
    let leaving = || read.leaving_pods().pods;
    let pool_known = claim
        .labels()
        .get(NODEPOOL)
        .is_some_and(|p| read.node_pool(p).is_some());
    let class_known = read.node_class(&claim.spec.node_class_ref.name).is_some();
    let instance_exists = match (&claim.metadata.deletion_timestamp, &provider_id) {
        (Some(_), Some(provider_id)) => match shared.cloud.get(provider_id).await {
            Ok(_) => Some(true),
            Err(CloudError::NodeClaimNotFound { .. }) => Some(false),
            Err(error) => return Err(error.into()),
        },
        _ => None,
    };
    let volume_attachments = match (&claim.metadata.deletion_timestamp, &node) {
        (Some(_), Some(node)) => blocking_volumes(read, &node.name_any(), &pods, shared.clock.now_seconds()),
        _ => Vec::new(),
    };
    let repair = match (&node, &claim.metadata.deletion_timestamp) {
        (Some(node), None) if shared.settings.node_repair => {
            // A claim of no NodePool is judged against the whole cluster, as Karpenter does.
            let peers = || match claim.labels().get(NODEPOOL) {
                Some(pool) => read.nodes_of_pool(pool),
                None => read.nodes(),
            };
            repair::assess(
                node,
                shared.cloud.repair_policies(),
                shared.clock.now_seconds(),
                peers,
            )
        }
        _ => Repair::Healthy,
    };
    let facts = Facts {
        claim: &claim,
        node: node.as_deref(),
        pods: &pods,
        leaving: Leaving(&leaving),
        awaiting_provisioning: read.awaiting_provisioning(&claim.name_any()),
        pool_and_class_known: pool_known && class_known,
        instance_exists,
        volume_attachments: &volume_attachments,
        repair: &repair,
        now_seconds: shared.clock.now_seconds(),
        now: Instant::now(),
    };
    let plan = decide(&facts, memory);
    let target = Target {
        claim: &claim,
        node: node.as_deref(),
    };
    execute(shared, &target, plan, memory).await
}

/// The VolumeAttachments on `node` that hold its termination, as Karpenter counts them: all but
/// those of volumes that pods staying on the node use (pods the drain does not wait for).
fn blocking_volumes(read: &ReadModel, node: &str, pods: &[Arc<CachedPod>], now_seconds: i64) -> Vec<String> {
    let attachments = read.volume_attachments_on(node);
    if attachments.is_empty() {
        return Vec::new();
    }
    let staying: HashSet<String> = pods
        .iter()
        .filter(|pod| !waits_for_drain(pod, now_seconds))
        .flat_map(|pod| {
            let namespace = pod.namespace().unwrap_or_default();
            let claims = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
            claims
                .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
                .filter_map(|claim| read.claimed_volume(&namespace, &claim))
                .collect::<Vec<_>>()
        })
        .collect();
    attachments
        .into_iter()
        .filter(|(_, volume)| !staying.contains(volume))
        .map(|(name, _)| name)
        .collect()
}

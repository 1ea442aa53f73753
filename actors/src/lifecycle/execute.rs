//! Performs a NodeClaim actor's [`Plan`]: the API writes, cloud calls and traces behind each
//! [`Action`], in order, stopping at the first that fails.
//!
//! Writes that change lists (the Node's taints, finalizers and owner references, the claim's
//! conditions) carry the `resourceVersion` the decision was made on, so a stale view is refused
//! with 409 instead of undoing another agent's change; a refused write makes the step look again
//! shortly ([`STALE_VIEW_RETRY`]) once the read model has caught up. Evictions carry the pod's UID.

use std::{collections::BTreeMap, time::Duration};

use futures::{StreamExt, stream};
use joist_messages::{
    apis::{NodeClaim, hash::ec2nodeclass_stamp},
    conditions::{self, ClaimDeletion, ConditionStatus, ConditionType, ConditionUpdate, is_true},
    labels::{
        CAPACITY_TYPE, EXCLUDE_FROM_EXTERNAL_LB, INITIALIZED, INSTANCE_TYPE, NODEPOOL, REGISTERED,
        TERMINATION_FINALIZER, ZONE,
        annotations::{PRICE_OVERLAY_APPLIED, TAGGED},
        taints,
    },
    time::system_time,
};
use joist_provider::{CloudError, Launch};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, EvictParams, Preconditions},
};
use opentelemetry::KeyValue;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    decide::lifecycle::{
        Action, Memory, Next, Phase, Plan, PodRef, after_evictions, after_launch, created_at,
        disrupted_taint, node_taints, since_condition,
    },
    effects::faults::Step,
    effects::kube_ops,
    effects::metrics::{Metrics, PoolLabels, snake_case},
    protocol::{GetInstanceTypes, MarkUnavailable},
    settings::ACTOR_REQUEST_TIMEOUT,
    shared::Shared,
    state::registration_health::Failure,
};

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A cloud call failed in a way a retry may fix.
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    /// The catalog actor did not answer in time.
    #[error("catalog: {0}")]
    Catalog(#[from] actix::MailboxError),
    /// A Node action was planned but the claim has no Node (a decision bug, never a cluster state).
    #[error("the plan acts on a node the claim does not have")]
    NoNode,
}

/// How soon a step looks again after a write was refused for a stale view (409).
pub const STALE_VIEW_RETRY: Duration = Duration::from_secs(1);

/// Evictions of one drain in flight at once.
pub const EVICTION_CONCURRENCY: usize = 32;

/// What the executor works on.
pub struct Target<'a> {
    /// The claim the plan was decided for.
    pub claim: &'a NodeClaim,
    /// Its Node, as the decision saw it.
    pub node: Option<&'a Node>,
}

/// Performs `plan` (see the module docs) and says when to look again.
pub async fn execute(
    shared: &Shared,
    target: &Target<'_>,
    plan: Plan,
    memory: &mut Memory,
) -> Result<Next, StepError> {
    match perform(shared, target, plan, memory).await {
        Err(StepError::Kube(kube::Error::Api(status))) if status.code == 409 => {
            tracing::debug!(nodeclaim = target.claim.name_any(), %status.message, "stale view; looking again");
            Ok(Next::After(STALE_VIEW_RETRY))
        }
        other => other,
    }
}

async fn perform(
    shared: &Shared,
    target: &Target<'_>,
    plan: Plan,
    memory: &mut Memory,
) -> Result<Next, StepError> {
    let mut next = plan.next;
    let faults = &shared.settings.faults;
    for action in plan.actions {
        let reached = fault_point(&action);
        match action {
            Action::Launch => {
                let outcome = launch(shared, target.claim, memory.failed_launches > 0).await?;
                if outcome.is_ok() {
                    faults.reach(Step::InstanceLaunched).await;
                }
                let plan = after_launch(outcome, memory, Instant::now());
                return Box::pin(perform(shared, target, plan, memory)).await;
            }
            Action::RecordLaunch(launch) => {
                memory.launched = Some((*launch).clone());
                record_launch(shared, target.claim, &launch).await?;
                memory.finished = Some((Phase::Launch, Instant::now()));
            }
            Action::MarkUnavailable(offerings) => {
                shared.catalog.unavailable.do_send(MarkUnavailable { offerings })
            }
            Action::LaunchFailed(message) => launch_failed(shared, target.claim, &message).await?,
            Action::DeleteClaim { reason, message } => {
                delete_claim(shared, target.claim, reason, &message).await?
            }
            Action::Expire => {
                let message = "the node reached its nodepool's expireAfter";
                force_delete(shared, target.claim, "Expired", message, None).await?;
            }
            Action::Repair {
                condition,
                message,
                deadline,
            } => {
                force_delete(shared, target.claim, "Unhealthy", &message, Some(deadline)).await?;
                shared.metrics.repaired(target.claim, &condition);
            }
            Action::RepairBlocked(message) => {
                shared.events.warn(node(target)?, "NodeRepairBlocked", &message);
            }
            Action::ClaimConditions(updates) => {
                let body = kube_ops::claim_conditions_patch(&shared.clock, target.claim, &updates, json!({}));
                write_claim_status(shared, target.claim, body).await?;
            }
            Action::StampDeadline(deadline) => stamp_deadline(shared, target.claim, deadline).await?,
            Action::DeletePods { pods, grace_seconds } => {
                delete_expiring(shared, target.claim, pods, grace_seconds).await?
            }
            Action::Register => {
                register(shared, target.claim, node(target)?).await?;
                // The claim's labels: the Node gets them only from the registration patch.
                let labels = Metrics::node_labels(target.claim);
                shared.metrics.nodes_created.get_or_create(&labels).inc();
                memory.finished = Some((Phase::Registration, Instant::now()));
            }
            Action::Initialize => {
                initialize(shared, target.claim, node(target)?).await?;
                memory.finished = Some((Phase::Initialization, Instant::now()));
            }
            Action::NameInstance {
                provider_id,
                node_name,
            } => name_instance(shared, target.claim, &provider_id, &node_name).await?,
            Action::Taint => taint(shared, node(target)?).await?,
            Action::Evict(pods) => next = after_evictions(evict(shared, pods).await?, memory),
            Action::TerminateInstance(provider_id) => {
                match shared.cloud.delete(&provider_id).await {
                    Ok(()) | Err(CloudError::NodeClaimNotFound { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                tracing::info!(
                    nodeclaim = target.claim.name_any(),
                    provider_id,
                    "terminated instance"
                );
            }
            Action::ReleaseNode => {
                let node = node(target)?;
                // The finalizer goes first: deleting first would change the node's resourceVersion
                // and make the finalizer's optimistic write fail.
                let nodes = kube_ops::cluster::<Node>(&shared.client);
                kube_ops::remove_finalizer(&nodes, node).await?;
                if node.metadata.deletion_timestamp.is_none() {
                    kube_ops::delete(&nodes, &node.name_any()).await?;
                }
                let labels = Metrics::node_labels(target.claim);
                shared.metrics.nodes_terminated.get_or_create(&labels).inc();
            }
            Action::ReleaseClaim => {
                let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
                kube_ops::remove_finalizer(&claims, target.claim).await?;
                memory.finished = Some((Phase::Termination, Instant::now()));
                count_termination(shared, target.claim);
                trace_release(shared, target.claim);
            }
        }
        if let Some(step) = reached {
            faults.reach(step).await;
        }
    }
    Ok(next)
}

/// The fault point an action passes once done (see [`crate::effects::faults`]).
fn fault_point(action: &Action) -> Option<Step> {
    match action {
        Action::RecordLaunch(_) => Some(Step::LaunchRecorded),
        Action::Register => Some(Step::NodeRegistered),
        Action::Initialize => Some(Step::NodeInitialized),
        Action::Taint => Some(Step::TerminationTainted),
        Action::Evict(_) => Some(Step::PodsEvicted),
        Action::TerminateInstance(_) => Some(Step::InstanceTerminated),
        Action::ReleaseNode => Some(Step::NodeReleased),
        _ => None,
    }
}

fn node<'a>(target: &Target<'a>) -> Result<&'a Node, StepError> {
    target.node.ok_or(StepError::NoNode)
}

/// Launches `claim`'s instance: its pool's instance types from the catalog, the claim as the API
/// server holds it, then the cloud's create; `failed_before` says an earlier launch of this actor
/// failed. A claim gone from the API server fails the step (404), and the next one finds it gone.
async fn launch(
    shared: &Shared,
    claim: &NodeClaim,
    failed_before: bool,
) -> Result<Result<Launch, CloudError>, StepError> {
    let pool = claim
        .labels()
        .get(NODEPOOL)
        .and_then(|p| shared.read.node_pool(p));
    let class = shared.read.node_class(&claim.spec.node_class_ref.name);
    let (Some(node_pool), Some(node_class)) = (pool, class) else {
        return Ok(Err(CloudError::NodeClassNotReady {
            node_class: claim.spec.node_class_ref.name.clone(),
            reason: "its nodepool or node class does not exist".to_owned(),
        }));
    };
    let types = shared
        .catalog
        .instance_types
        .send(GetInstanceTypes {
            node_pool: node_pool.clone(),
            node_class: node_class.clone(),
        })
        .timeout(ACTOR_REQUEST_TIMEOUT)
        .await??;
    // Overlaid prices decide the offering, as they decided the simulation; the annotation tells
    // the cloud to launch by them rather than by its own prices.
    let crate::overlay::Overlaid { types, repriced, .. } =
        crate::overlay::for_pool(shared, &node_pool, types);
    // The read model keeps no claim's choices (its instance types, zones, capacity types):
    // the launch reads them from the API server.
    let claim = &kube_ops::cluster::<NodeClaim>(&shared.client)
        .get(&claim.name_any())
        .await?;
    // A launch whose outcome is unknown (it failed: its reply may have been lost, or it timed
    // out; or the controllers that made it crashed) may have started an instance: adopt it
    // rather than start a second.
    if (failed_before || created_at(claim) < shared.started_at)
        && let Some(launch) = shared.cloud.find_launch(claim, &types).await?
    {
        tracing::info!(
            nodeclaim = claim.name_any(),
            provider_id = launch.instance.provider_id,
            "adopting the instance an earlier launch started"
        );
        return Ok(Ok(launch));
    }
    let mut claim = std::borrow::Cow::Borrowed(claim);
    if repriced {
        claim
            .to_mut()
            .annotations_mut()
            .insert(PRICE_OVERLAY_APPLIED.to_owned(), "true".to_owned());
    }
    Ok(shared.cloud.create(&claim, Some(&node_class), &types).await)
}

/// Records that `claim` finished `phase`, which began at the epoch second `since`.
fn trace_phase(shared: &Shared, claim: &NodeClaim, phase: Phase, since: i64, attributes: Vec<KeyValue>) {
    let now = shared.clock.now_system();
    shared
        .node_tracer
        .phase(claim, phase, system_time(since), now, attributes);
}

async fn write_claim_status(shared: &Shared, claim: &NodeClaim, body: Value) -> Result<(), StepError> {
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    kube_ops::patch_status_body(&api, &claim.name_any(), body).await?;
    Ok(())
}

async fn delete_claim(
    shared: &Shared,
    claim: &NodeClaim,
    reason: ClaimDeletion,
    why: &str,
) -> Result<(), StepError> {
    tracing::info!(nodeclaim = claim.name_any(), %reason, "deleting nodeclaim: {why}");
    shared.events.warn(claim, reason.as_str(), why);
    kube_ops::delete(&kube_ops::cluster::<NodeClaim>(&shared.client), &claim.name_any()).await?;
    shared.metrics.disrupted(claim, &snake_case(reason.as_str()));
    let Some(pool) = claim.labels().get(NODEPOOL) else {
        return Ok(());
    };
    if reason.is_failed_launch() {
        count_failed_launch(shared, pool, format!("{reason}: {why}"));
    }
    if let Some(failure) = registration_failure(claim, reason, why) {
        shared.registration_health.failed(pool, failure);
        // The watch pokes the pool for this change too, but may do so before the outcome is
        // recorded.
        shared.poke_node_pool(pool);
    }
    Ok(())
}

/// What a claim deleted for `reason` (`why`) tells its NodePool's registration health: a claim
/// that timed out before launching fails with its last launch attempt's reason and message, one
/// that launched but never registered with `RegistrationFailed`; other deletions tell nothing.
fn registration_failure(claim: &NodeClaim, reason: ClaimDeletion, why: &str) -> Option<Failure> {
    match reason {
        ClaimDeletion::RegistrationTimeout => Some(Failure::registration()),
        ClaimDeletion::LaunchTimeout => {
            let attempt = claim
                .status
                .as_ref()
                .and_then(|status| conditions::find(&status.conditions, ConditionType::Launched))
                .filter(|launched| launched.status != ConditionStatus::True.as_str());
            Some(attempt.map_or_else(
                || Failure {
                    reason: reason.as_str().to_owned(),
                    message: why.to_owned(),
                },
                |attempt| Failure {
                    reason: attempt.reason.clone(),
                    message: attempt.message.clone(),
                },
            ))
        }
        _ => None,
    }
}

/// Counts a failed launch against the NodePool `pool_name`, and says so on the NodePool when that
/// pauses its launches.
fn count_failed_launch(shared: &Shared, pool_name: &str, failure: String) {
    let Some(paused) = shared.breakers.failed(pool_name, failure) else {
        return;
    };
    tracing::warn!(nodepool = pool_name, %paused, "pausing the nodepool's launches");
    if let Some(pool) = shared.read.node_pool(pool_name) {
        shared
            .events
            .warn(pool.as_ref(), "LaunchesPaused", &paused.to_string());
    }
}

/// Counts a NodeClaim whose termination finished, and how long it took since its deletion.
fn count_termination(shared: &Shared, claim: &NodeClaim) {
    let labels = Metrics::claim_labels(claim);
    if let Some(deleted) = &claim.metadata.deletion_timestamp {
        let seconds = (shared.clock.now_seconds() - deleted.0.as_second()).max(0);
        shared
            .metrics
            .nodeclaims_termination_duration
            .get_or_create(&PoolLabels {
                nodepool: labels.nodepool.clone(),
            })
            .observe(seconds as f64);
        shared
            .metrics
            .nodes_termination
            .observe(&labels.nodepool, seconds as f64);
    }
    shared.metrics.nodeclaims_terminated.get_or_create(&labels).inc();
}

/// Annotates the claim with its termination deadline (epoch seconds).
async fn stamp_deadline(shared: &Shared, claim: &NodeClaim, deadline: i64) -> Result<(), StepError> {
    kube_ops::stamp_termination_deadline(&shared.client, &claim.name_any(), deadline).await?;
    Ok(())
}

/// Marks the claim's `DisruptionReason` with `reason` (`Expired`, `Unhealthy`), stamps its
/// termination `deadline` if it has one, then deletes it: the disruptions no budget holds back.
/// The status write goes first, as it carries the version the decision was made on.
async fn force_delete(
    shared: &Shared,
    claim: &NodeClaim,
    reason: &str,
    message: &str,
    deadline: Option<i64>,
) -> Result<(), StepError> {
    let update = ConditionUpdate::new(ConditionType::DisruptionReason, ConditionStatus::True, reason)
        .with_message(message);
    let body = kube_ops::claim_conditions_patch(&shared.clock, claim, &[update], json!({}));
    write_claim_status(shared, claim, body).await?;
    if let Some(deadline) = deadline {
        stamp_deadline(shared, claim, deadline).await?;
    }
    tracing::info!(
        nodeclaim = claim.name_any(),
        reason,
        "deleting nodeclaim: {message}"
    );
    shared.events.normal(claim, reason, message);
    kube_ops::delete(&kube_ops::cluster::<NodeClaim>(&shared.client), &claim.name_any()).await?;
    shared.metrics.disrupted(claim, &snake_case(reason));
    Ok(())
}

/// Deletes pods whose eviction would overrun the claim's `terminationGracePeriod`, each with the
/// time left as its grace period; a pod already gone (404) or replaced (409) is done.
async fn delete_expiring(
    shared: &Shared,
    claim: &NodeClaim,
    pods: Vec<PodRef>,
    grace_seconds: i64,
) -> Result<(), StepError> {
    for pod in pods {
        let api: Api<Pod> = kube_ops::namespaced(&shared.client, &pod.namespace);
        let grace = u32::try_from(grace_seconds.max(0)).unwrap_or(0);
        match api.delete(&pod.name, &same_pod(&pod, Some(grace))).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
        shared.events.normal(
            claim,
            "TerminationGracePeriodExpiring",
            &format!(
                "Deleted pod {}/{} with {grace_seconds}s of grace to meet the nodeclaim's terminationGracePeriod",
                pod.namespace, pod.name
            ),
        );
    }
    Ok(())
}

async fn launch_failed(shared: &Shared, claim: &NodeClaim, message: &str) -> Result<(), StepError> {
    tracing::warn!(nodeclaim = claim.name_any(), message, "launch failed; retrying");
    let body = kube_ops::claim_conditions_patch(
        &shared.clock,
        claim,
        &[
            ConditionUpdate::new(ConditionType::Launched, ConditionStatus::Unknown, "LaunchFailed")
                .with_message(message),
        ],
        json!({}),
    );
    write_claim_status(shared, claim, body).await
}

async fn record_launch(shared: &Shared, claim: &NodeClaim, launch: &Launch) -> Result<(), StepError> {
    let status = json!({
        "providerID": launch.instance.provider_id,
        "imageID": launch.instance.image_id,
        "capacity": launch.capacity,
        "allocatable": launch.allocatable,
    });
    let body = kube_ops::claim_conditions_patch(
        &shared.clock,
        claim,
        &[
            ConditionUpdate::holds(ConditionType::Launched),
            ConditionUpdate::new(
                ConditionType::Registered,
                ConditionStatus::Unknown,
                "AwaitingRegistration",
            ),
        ],
        status,
    );
    write_claim_status(shared, claim, body).await?;
    if let Some(pool) = claim.labels().get(NODEPOOL) {
        shared.breakers.succeeded(pool);
    }
    // Labels are a map: merging them needs no version. The claim's own labels win over the
    // cloud's, as in Karpenter. The node class's hash is stamped as the launch used it.
    let mut labels: BTreeMap<String, String> = launch.labels.clone();
    labels.extend(claim.labels().clone());
    let mut metadata = json!({"labels": labels});
    if let Some(class) = shared.read.node_class(&claim.spec.node_class_ref.name) {
        metadata["annotations"] = json!(BTreeMap::from(ec2nodeclass_stamp(&class)));
    }
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    kube_ops::patch(&api, &claim.name_any(), json!({"metadata": metadata})).await?;
    let instance = &launch.instance;
    let attributes = vec![
        KeyValue::new("host.type", instance.instance_type.clone()),
        KeyValue::new("cloud.availability_zone", instance.zone.clone()),
        KeyValue::new("joist.capacity_type", instance.capacity_type.to_string()),
        KeyValue::new("joist.provider_id", instance.provider_id.clone()),
        KeyValue::new("joist.price_per_hour", instance.price),
    ];
    trace_phase(shared, claim, Phase::Launch, created_at(claim), attributes);
    tracing::info!(
        nodeclaim = claim.name_any(),
        instance_type = launch.instance.instance_type,
        zone = launch.instance.zone,
        capacity_type = %launch.instance.capacity_type,
        "launched"
    );
    Ok(())
}

/// The Node patch registration writes: the claim's labels, Joist's finalizer, the claim as owner,
/// the taints without `karpenter.sh/unregistered`; valid only against the Node version it was
/// computed from.
pub fn registration_patch(claim: &NodeClaim, node: &Node) -> Value {
    let mut labels = claim.labels().clone();
    labels.insert(REGISTERED.to_owned(), "true".to_owned());
    let mut finalizers = node.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_owned());
    }
    let taints: Vec<&Taint> = node_taints(node)
        .iter()
        .filter(|t| t.key != taints::UNREGISTERED)
        .collect();
    let mut owners: Vec<Value> = node
        .owner_references()
        .iter()
        .filter(|o| o.kind != "NodeClaim")
        .map(|o| json!(o))
        .collect();
    owners.push(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim.name_any(),
        "uid": claim.uid().unwrap_or_default(), "blockOwnerDeletion": true,
    }));
    json!({
        "metadata": {
            "labels": labels, "finalizers": finalizers, "ownerReferences": owners,
            "resourceVersion": node.resource_version(),
        },
        "spec": {"taints": taints},
    })
}

async fn register(shared: &Shared, claim: &NodeClaim, node: &Node) -> Result<(), StepError> {
    let nodes = kube_ops::cluster::<Node>(&shared.client);
    kube_ops::patch(&nodes, &node.name_any(), registration_patch(claim, node)).await?;
    let body = kube_ops::claim_conditions_patch(
        &shared.clock,
        claim,
        &[
            ConditionUpdate::holds(ConditionType::Registered),
            ConditionUpdate::new(
                ConditionType::Initialized,
                ConditionStatus::Unknown,
                "AwaitingInitialization",
            ),
        ],
        json!({"nodeName": node.name_any()}),
    );
    write_claim_status(shared, claim, body).await?;
    if let Some(pool) = claim.labels().get(NODEPOOL) {
        shared.registration_health.registered(pool);
        shared.poke_node_pool(pool);
    }
    let launched = since_condition(claim, ConditionType::Launched);
    let attributes = vec![KeyValue::new("k8s.node.name", node.name_any())];
    trace_phase(shared, claim, Phase::Registration, launched, attributes);
    tracing::info!(nodeclaim = claim.name_any(), node = node.name_any(), "registered");
    Ok(())
}

async fn initialize(shared: &Shared, claim: &NodeClaim, node: &Node) -> Result<(), StepError> {
    let body = json!({"metadata": {"labels": {INITIALIZED: "true"}}});
    kube_ops::patch(&kube_ops::cluster::<Node>(&shared.client), &node.name_any(), body).await?;
    let body = kube_ops::claim_conditions_patch(
        &shared.clock,
        claim,
        &[
            ConditionUpdate::holds(ConditionType::Initialized),
            ConditionUpdate::holds(ConditionType::Ready),
        ],
        json!({}),
    );
    write_claim_status(shared, claim, body).await?;
    let registered = since_condition(claim, ConditionType::Registered);
    let attributes = vec![KeyValue::new("k8s.node.name", node.name_any())];
    trace_phase(shared, claim, Phase::Initialization, registered, attributes);
    tracing::info!(
        nodeclaim = claim.name_any(),
        node = node.name_any(),
        "initialized"
    );
    Ok(())
}

/// Names the instance after its Node and records on the claim that it is done (an instance
/// already gone needs no name).
async fn name_instance(
    shared: &Shared,
    claim: &NodeClaim,
    provider_id: &str,
    node_name: &str,
) -> Result<(), StepError> {
    match shared.cloud.name_instance(provider_id, node_name).await {
        Ok(()) | Err(CloudError::NodeClaimNotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    let body = json!({"metadata": {"annotations": {TAGGED: "true"}}});
    kube_ops::patch(
        &kube_ops::cluster::<NodeClaim>(&shared.client),
        &claim.name_any(),
        body,
    )
    .await?;
    Ok(())
}

/// Adds the `karpenter.sh/disrupted:NoSchedule` taint to the taints the Node has at the version the
/// decision saw, and the label that takes it out of load balancers.
async fn taint(shared: &Shared, node: &Node) -> Result<(), StepError> {
    let mut with_taint = node_taints(node).to_vec();
    with_taint.push(disrupted_taint());
    let body = json!({
        "metadata": {
            "labels": {EXCLUDE_FROM_EXTERNAL_LB: "karpenter"},
            "resourceVersion": node.resource_version(),
        },
        "spec": {"taints": with_taint},
    });
    kube_ops::patch(&kube_ops::cluster::<Node>(&shared.client), &node.name_any(), body).await?;
    Ok(())
}

/// Evicts `pods`, at most [`EVICTION_CONCURRENCY`] at once; whether a PodDisruptionBudget refused
/// any (429). A pod already gone (404) or replaced by another of the same name (409) is done.
async fn evict(shared: &Shared, pods: Vec<PodRef>) -> Result<bool, StepError> {
    let results: Vec<Result<bool, kube::Error>> = stream::iter(pods)
        .map(|pod| async move {
            let api: Api<Pod> = kube_ops::namespaced(&shared.client, &pod.namespace);
            let params = EvictParams {
                delete_options: Some(same_pod(&pod, None)),
                ..EvictParams::default()
            };
            match api.evict(&pod.name, &params).await {
                Ok(_) => Ok(false),
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
                Err(kube::Error::Api(status)) if status.code == 429 => Ok(true),
                Err(error) => Err(error),
            }
        })
        .buffer_unordered(EVICTION_CONCURRENCY)
        .collect()
        .await;
    let mut blocked = false;
    for result in results {
        blocked |= result?;
    }
    Ok(blocked)
}

/// Delete options that act only on the pod the decision saw (its UID), with its own grace period
/// unless `grace_seconds` is given.
fn same_pod(pod: &PodRef, grace_seconds: Option<u32>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: grace_seconds,
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// Records the termination phase and the claim's root span, now that it is released.
fn trace_release(shared: &Shared, claim: &NodeClaim) {
    let deleted = claim
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(|| created_at(claim), |t| t.0.as_second());
    trace_phase(shared, claim, Phase::Termination, deleted, Vec::new());
    let labels = claim.labels();
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let status = claim.status.clone().unwrap_or_default();
    let attributes = vec![
        KeyValue::new("joist.nodepool", label(NODEPOOL)),
        KeyValue::new("host.type", label(INSTANCE_TYPE)),
        KeyValue::new("cloud.availability_zone", label(ZONE)),
        KeyValue::new("joist.capacity_type", label(CAPACITY_TYPE)),
        KeyValue::new("joist.provider_id", status.provider_id.unwrap_or_default()),
        KeyValue::new("k8s.node.name", status.node_name.unwrap_or_default()),
        KeyValue::new(
            "joist.launched",
            is_true(&status.conditions, ConditionType::Launched),
        ),
    ];
    let now = shared.clock.now_system();
    shared
        .node_tracer
        .finish(claim, system_time(created_at(claim)), now, attributes);
}

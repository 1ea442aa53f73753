//! What a NodeClaim actor does next, one step at a time, as Karpenter's lifecycle and termination
//! controllers do:
//!
//! - **launch**: the cloud creates an instance from the NodePool's instance types; capacity errors
//!   mark offerings unavailable and delete the claim (its pods are simulated again without them),
//!   an unready node class deletes it, other errors set `Launched=Unknown` and retry;
//! - **registration**: the Node with the claim's provider ID gets the claim's labels, Joist's
//!   finalizer and an owner reference, loses `karpenter.sh/unregistered`, and the claim turns
//!   `Registered`;
//! - **initialization**: once the Node is Ready with no startup or boot taints left, it is labelled
//!   `karpenter.sh/initialized` and the claim turns `Initialized` and `Ready`;
//! - **liveness**: not launched within [`LAUNCH_TIMEOUT`] or not registered within
//!   [`REGISTRATION_TIMEOUT`] deletes the claim; so does its Node going away after registration;
//! - **termination** (the claim is being deleted): taint the Node `karpenter.sh/disrupted`, evict
//!   its pods through the Eviction API (a PodDisruptionBudget's 429 is retried), wait at least
//!   [`MINIMUM_DRAIN_TIME`], terminate the instance, then release the Node's and the claim's
//!   finalizers.
//!
//! Each finished phase is recorded as a span of the node's trace ([`crate::node_trace`]).
//!
//! Kubernetes API errors are returned to the actor, which retries and, when they persist, stops so
//! its supervisor restarts it from the read model.

use std::{collections::BTreeMap, time::Duration};

use joist_messages::{
    apis::NodeClaim,
    labels::{
        CAPACITY_TYPE, EXCLUDE_FROM_EXTERNAL_LB, INITIALIZED, INSTANCE_TYPE, NODEPOOL, REGISTERED,
        TERMINATION_FINALIZER, ZONE, taints,
    },
    time::system_time,
};
use joist_provider::{CloudError, Launch};
use k8s_openapi::{
    api::core::v1::{Node, Pod, Taint},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{Api, ResourceExt, api::EvictParams};
use opentelemetry::KeyValue;
use serde_json::json;
use tokio::time::Instant;

use crate::{
    kube_ops::{self, is_true, set_condition},
    node_trace::Phase,
    protocol::{GetInstanceTypes, MarkUnavailable},
    settings::{LAUNCH_TIMEOUT, MINIMUM_DRAIN_TIME, REGISTRATION_TIMEOUT},
    shared::Shared,
    snapshot::{finished, is_ephemeral},
};

/// What the actor remembers between steps (lost on restart, rebuilt from the cluster).
#[derive(Debug, Default, Clone)]
pub struct Memory {
    /// The instance launched for the claim: a status write that failed is retried with it
    /// instead of launching a second instance.
    pub launched: Option<Launch>,
    /// A phase this actor just finished, and when, while the read model does not show it yet: a
    /// step taken on that stale view would write the same thing again.
    pub finished: Option<(Phase, Instant)>,
    /// When draining began.
    pub drain_started: Option<Instant>,
}

/// How long the read model may lag the API: a finished phase missing from it, or a claim's pool or
/// class not in it yet, is waited for this long before the actor acts on what it sees.
pub const READ_MODEL_LAG: Duration = Duration::from_secs(30);

/// Whether the claim already shows that `phase` finished.
fn shows(claim: &NodeClaim, phase: Phase) -> bool {
    let conditions = claim
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    match phase {
        Phase::Launch => is_true(conditions, "Launched"),
        Phase::Registration => is_true(conditions, "Registered"),
        Phase::Initialization => is_true(conditions, "Initialized"),
        Phase::Termination => !claim.finalizers().iter().any(|f| f == TERMINATION_FINALIZER),
    }
}

/// When to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// When something changes.
    OnChange,
    /// After this long (or sooner, on a change).
    After(Duration),
    /// The claim is gone: the actor stops.
    Gone,
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A cloud call failed in a way a retry may fix.
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    /// The catalog actor did not answer.
    #[error("catalog: {0}")]
    Catalog(#[from] actix::MailboxError),
}

/// Takes the next step for the claim `name` (see the module docs).
pub async fn step(shared: &Shared, name: &str, memory: &mut Memory) -> Result<Next, StepError> {
    let Some(claim) = shared.read.node_claim(name) else {
        return Ok(Next::Gone);
    };
    if let Some((phase, at)) = memory.finished {
        if !shows(&claim, phase) && at.elapsed() < READ_MODEL_LAG {
            return Ok(Next::After(READ_MODEL_LAG - at.elapsed()));
        }
        memory.finished = None;
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return terminate(shared, &claim, memory).await;
    }
    let status = claim.status.clone().unwrap_or_default();
    let Some(provider_id) = status
        .provider_id
        .clone()
        .filter(|_| is_true(&status.conditions, "Launched"))
    else {
        if let Some(launch) = memory.launched.clone() {
            record_launch(shared, &claim, &launch).await?;
            memory.finished = Some((Phase::Launch, Instant::now()));
            return Ok(Next::OnChange);
        }
        let age = age(shared, &claim);
        if age >= LAUNCH_TIMEOUT {
            return delete_claim(
                shared,
                &claim,
                "LaunchTimeout",
                "the instance was not launched in time",
            )
            .await;
        }
        return launch(shared, &claim, memory).await;
    };
    memory.launched = None;
    let registered = is_true(&status.conditions, "Registered");
    let Some(node) = shared.read.node_for_provider(&provider_id) else {
        if registered {
            return delete_claim(shared, &claim, "NodeDeleted", "its node is gone").await;
        }
        let since_launch = since(shared, transitioned_at(&claim, "Launched").unwrap_or_default());
        if since_launch >= REGISTRATION_TIMEOUT {
            return delete_claim(
                shared,
                &claim,
                "RegistrationTimeout",
                "the node did not register in time",
            )
            .await;
        }
        return Ok(Next::After(REGISTRATION_TIMEOUT - since_launch));
    };
    if node.metadata.deletion_timestamp.is_some() {
        return delete_claim(shared, &claim, "NodeDeleted", "its node is being deleted").await;
    }
    if !registered {
        register(shared, &claim, &node).await?;
        memory.finished = Some((Phase::Registration, Instant::now()));
    } else if !is_true(&status.conditions, "Initialized") && initialize(shared, &claim, &node).await? {
        memory.finished = Some((Phase::Initialization, Instant::now()));
    }
    Ok(Next::OnChange)
}

fn age(shared: &Shared, claim: &NodeClaim) -> Duration {
    since(shared, created_at(claim))
}

fn since(shared: &Shared, epoch_seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(shared.clock.now_seconds() - epoch_seconds).unwrap_or(0))
}

/// When the claim's condition `type_` last changed, in epoch seconds.
fn transitioned_at(claim: &NodeClaim, type_: &str) -> Option<i64> {
    let condition = claim
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some(condition.last_transition_time.0.as_second())
}

fn created_at(claim: &NodeClaim) -> i64 {
    claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

/// Records that `claim` finished `phase`, which began at the epoch second `since`.
fn trace_phase(shared: &Shared, claim: &NodeClaim, phase: Phase, since: i64, attributes: Vec<KeyValue>) {
    let now = shared.clock.now_system();
    shared
        .node_tracer
        .phase(claim, phase, system_time(since), now, attributes);
}

/// The claim's conditions with `updates` (type, status, reason, message) applied.
fn claim_conditions(
    shared: &Shared,
    claim: &NodeClaim,
    updates: &[(&str, &str, &str, &str)],
) -> Vec<Condition> {
    let mut conditions = claim.status.clone().unwrap_or_default().conditions;
    for &update in updates {
        set_condition(&mut conditions, &shared.clock, claim.metadata.generation, update);
    }
    conditions
}

async fn delete_claim(
    shared: &Shared,
    claim: &NodeClaim,
    reason: &str,
    why: &str,
) -> Result<Next, StepError> {
    tracing::info!(nodeclaim = claim.name_any(), reason, "deleting nodeclaim: {why}");
    kube_ops::record_event(&shared.client, &shared.clock, claim, true, reason, why).await;
    kube_ops::delete(&kube_ops::cluster::<NodeClaim>(&shared.client), &claim.name_any()).await?;
    Ok(Next::OnChange)
}

async fn launch(shared: &Shared, claim: &NodeClaim, memory: &mut Memory) -> Result<Next, StepError> {
    let pool = claim
        .labels()
        .get(NODEPOOL)
        .and_then(|p| shared.read.node_pool(p));
    let class = shared.read.node_class(&claim.spec.node_class_ref.name);
    let (Some(node_pool), Some(node_class)) = (pool, class) else {
        // Watches of different kinds arrive in any order: a claim seen before its pool or class
        // gets the read model's lag before it is judged.
        let age = age(shared, claim);
        if age < READ_MODEL_LAG {
            return Ok(Next::After(READ_MODEL_LAG - age));
        }
        return delete_claim(
            shared,
            claim,
            "NodeClassNotReady",
            "its nodepool or node class does not exist",
        )
        .await;
    };
    let types = shared
        .catalog
        .send(GetInstanceTypes {
            node_pool,
            node_class,
        })
        .await??;
    match shared.cloud.create(claim, &types).await {
        Ok(launch) => {
            if !launch.unavailable.is_empty() {
                shared.catalog.do_send(MarkUnavailable {
                    offerings: launch.unavailable.clone(),
                });
            }
            memory.launched = Some(launch.clone());
            record_launch(shared, claim, &launch).await?;
            memory.finished = Some((Phase::Launch, Instant::now()));
            Ok(Next::OnChange)
        }
        Err(CloudError::InsufficientCapacity { offerings, message }) => {
            shared.catalog.do_send(MarkUnavailable { offerings });
            delete_claim(shared, claim, "InsufficientCapacityError", &message).await
        }
        Err(error @ CloudError::NodeClassNotReady { .. }) => {
            delete_claim(shared, claim, "NodeClassNotReady", &error.to_string()).await
        }
        Err(error) => {
            let message = error.to_string();
            let conditions = claim_conditions(
                shared,
                claim,
                &[("Launched", "Unknown", "LaunchFailed", &message)],
            );
            let api = kube_ops::cluster::<NodeClaim>(&shared.client);
            kube_ops::patch_status(&api, &claim.name_any(), json!({"conditions": conditions})).await?;
            Ok(Next::After(Duration::from_secs(10)))
        }
    }
}

async fn record_launch(shared: &Shared, claim: &NodeClaim, launch: &Launch) -> Result<(), StepError> {
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    let mut labels: BTreeMap<String, String> = launch.labels.clone();
    labels.extend(claim.labels().clone());
    kube_ops::patch(&api, &claim.name_any(), json!({"metadata": {"labels": labels}})).await?;
    let conditions = claim_conditions(
        shared,
        claim,
        &[
            ("Launched", "True", "Launched", ""),
            ("Registered", "Unknown", "AwaitingRegistration", ""),
        ],
    );
    let status = json!({
        "providerID": launch.instance.provider_id,
        "imageID": launch.instance.image_id,
        "capacity": launch.capacity,
        "allocatable": launch.allocatable,
        "conditions": conditions,
    });
    kube_ops::patch_status(&api, &claim.name_any(), status).await?;
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

async fn register(shared: &Shared, claim: &NodeClaim, node: &Node) -> Result<(), StepError> {
    let mut labels = claim.labels().clone();
    labels.insert(REGISTERED.to_owned(), "true".to_owned());
    let mut finalizers = node.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_owned());
    }
    let taints: Vec<&Taint> = taints(node)
        .iter()
        .filter(|t| t.key != taints::UNREGISTERED)
        .collect();
    let owner = json!([{
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim.name_any(),
        "uid": claim.uid().unwrap_or_default(), "blockOwnerDeletion": true,
    }]);
    let body = json!({
        "metadata": {"labels": labels, "finalizers": finalizers, "ownerReferences": owner},
        "spec": {"taints": taints},
    });
    kube_ops::patch(&kube_ops::cluster::<Node>(&shared.client), &node.name_any(), body).await?;
    let conditions = claim_conditions(
        shared,
        claim,
        &[
            ("Registered", "True", "Registered", ""),
            ("Initialized", "Unknown", "AwaitingInitialization", ""),
        ],
    );
    let status = json!({"nodeName": node.name_any(), "conditions": conditions});
    kube_ops::patch_status(
        &kube_ops::cluster::<NodeClaim>(&shared.client),
        &claim.name_any(),
        status,
    )
    .await?;
    let launched = transitioned_at(claim, "Launched").unwrap_or_else(|| created_at(claim));
    let attributes = vec![KeyValue::new("k8s.node.name", node.name_any())];
    trace_phase(shared, claim, Phase::Registration, launched, attributes);
    tracing::info!(nodeclaim = claim.name_any(), node = node.name_any(), "registered");
    Ok(())
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Marks the claim initialized once its node is; whether it did.
async fn initialize(shared: &Shared, claim: &NodeClaim, node: &Node) -> Result<bool, StepError> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let starting = taints(node).iter().any(|t| {
        is_ephemeral(t)
            || claim
                .spec
                .startup_taints
                .iter()
                .any(|s| s.key == t.key && s.effect == t.effect)
    });
    if !ready || starting {
        return Ok(false);
    }
    let body = json!({"metadata": {"labels": {INITIALIZED: "true"}}});
    kube_ops::patch(&kube_ops::cluster::<Node>(&shared.client), &node.name_any(), body).await?;
    let conditions = claim_conditions(
        shared,
        claim,
        &[
            ("Initialized", "True", "Initialized", ""),
            ("Ready", "True", "Ready", ""),
        ],
    );
    kube_ops::patch_status(
        &kube_ops::cluster::<NodeClaim>(&shared.client),
        &claim.name_any(),
        json!({"conditions": conditions}),
    )
    .await?;
    let registered = transitioned_at(claim, "Registered").unwrap_or_else(|| created_at(claim));
    let attributes = vec![KeyValue::new("k8s.node.name", node.name_any())];
    trace_phase(shared, claim, Phase::Initialization, registered, attributes);
    tracing::info!(
        nodeclaim = claim.name_any(),
        node = node.name_any(),
        "initialized"
    );
    Ok(true)
}

/// Pods a drain evicts: everything but DaemonSet pods and pods that already finished.
fn drainable(pod: &Pod) -> bool {
    let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
    !daemon && !finished(pod) && pod.metadata.deletion_timestamp.is_none()
}

async fn terminate(shared: &Shared, claim: &NodeClaim, memory: &mut Memory) -> Result<Next, StepError> {
    if !claim.finalizers().iter().any(|f| f == TERMINATION_FINALIZER) {
        return Ok(Next::OnChange);
    }
    let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
    let provider_id = claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .or_else(|| Some(memory.launched.as_ref()?.instance.provider_id.clone()));
    if let Some(provider_id) = provider_id {
        let node = shared.read.node_for_provider(&provider_id);
        let exists = match shared.cloud.get(&provider_id).await {
            Ok(_) => true,
            Err(CloudError::NodeClaimNotFound { .. }) => false,
            Err(error) => return Err(error.into()),
        };
        if let (Some(node), true) = (&node, exists)
            && let Some(wait) = drain(shared, node, memory).await?
        {
            return Ok(Next::After(wait));
        }
        if exists {
            match shared.cloud.delete(&provider_id).await {
                Ok(()) | Err(CloudError::NodeClaimNotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            tracing::info!(nodeclaim = claim.name_any(), provider_id, "terminated instance");
        }
        if let Some(node) = node {
            // The finalizer goes first: deleting first would change the node's resourceVersion
            // and make the finalizer's optimistic write fail.
            let nodes = kube_ops::cluster::<Node>(&shared.client);
            kube_ops::remove_finalizer(&nodes, node.as_ref()).await?;
            if node.metadata.deletion_timestamp.is_none() {
                kube_ops::delete(&nodes, &node.name_any()).await?;
            }
        }
    }
    kube_ops::remove_finalizer(&claims, claim).await?;
    memory.finished = Some((Phase::Termination, Instant::now()));
    trace_release(shared, claim);
    Ok(Next::OnChange)
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
        KeyValue::new("joist.launched", is_true(&status.conditions, "Launched")),
    ];
    let now = shared.clock.now_system();
    shared
        .node_tracer
        .finish(claim, system_time(created_at(claim)), now, attributes);
}

/// Taints and drains `node`; `Some(wait)` while pods remain or the minimum drain time runs.
async fn drain(shared: &Shared, node: &Node, memory: &mut Memory) -> Result<Option<Duration>, StepError> {
    let nodes = kube_ops::cluster::<Node>(&shared.client);
    if !taints(node).iter().any(|t| t.key == taints::DISRUPTED) {
        let mut with_taint = taints(node).to_vec();
        with_taint.push(Taint {
            key: taints::DISRUPTED.to_owned(),
            effect: "NoSchedule".to_owned(),
            value: None,
            time_added: None,
        });
        let body = json!({
            "metadata": {"labels": {EXCLUDE_FROM_EXTERNAL_LB: "karpenter"}},
            "spec": {"taints": with_taint},
        });
        kube_ops::patch(&nodes, &node.name_any(), body).await?;
    }
    let started = *memory.drain_started.get_or_insert_with(Instant::now);
    let pods: Vec<_> = shared
        .read
        .pods_on(&node.name_any())
        .into_iter()
        .filter(|p| drainable(p))
        .collect();
    let mut blocked = false;
    for pod in &pods {
        let api: Api<Pod> = kube_ops::namespaced(&shared.client, &pod.namespace().unwrap_or_default());
        match api.evict(&pod.name_any(), &EvictParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(kube::Error::Api(status)) if status.code == 429 => blocked = true,
            Err(error) => return Err(error.into()),
        }
    }
    if !pods.is_empty() {
        return Ok(Some(Duration::from_secs(if blocked { 5 } else { 1 })));
    }
    let drained_for = started.elapsed();
    Ok((drained_for < MINIMUM_DRAIN_TIME).then(|| MINIMUM_DRAIN_TIME - drained_for))
}

//! The CapacityBuffer actor (Karpenter's `CapacityBuffer` feature gate): every
//! [`RESOLVE_INTERVAL`], each CapacityBuffer's pod shape and count are resolved, its virtual pods
//! set for the provisioner ([`crate::state::buffers`]), a provisioning pass is asked for, and its
//! status is written as Karpenter writes it.
//!
//! - **Shape**: a `podTemplateRef` is a `PodTemplate` in the buffer's namespace; a `scalableRef`
//!   a Deployment, ReplicaSet or StatefulSet (group `apps`), whose template is the shape and whose
//!   `spec.replicas` (1 when unset) the base of `percentage`.
//! - **Count**: [`CapacityBufferSpec::pods`], with one virtual pod's requests for `limits`.
//! - **Status**: `replicas`, `podTemplateRef` and `podTemplateGeneration` (for a PodTemplate),
//!   `provisioningStrategy`, and `ReadyForProvisioning` (`Resolved`; or False with
//!   `PodTemplateNotFound`, `ScalableRefNotFound` or `ResolutionFailed`); and `Provisioning`, from
//!   the last provisioning pass: `FitsExistingCapacity` when every virtual pod found room on the
//!   nodes there are, `RequiresNewCapacity` when some needed a new node (or found none),
//!   `BufferEmpty` with no pods, `NotReadyForProvisioning` when unresolved. Written by the replica
//!   acting cluster-wide, only when it changed.
//!
//! Failure modes: a buffer whose source is missing holds no pods until it is found; one whose
//! source could not be read (an API error) keeps the pods and the status it had; a listing that fails keeps every
//! buffer's pods and is tried again at the next interval. Nothing runs with the gate off.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use actix::prelude::*;
use joist_messages::{
    apis::{
        CapacityBuffer, CapacityBufferStatus,
        capacitybuffer::{LocalObjectRef, SCALABLE_KINDS},
    },
    cached_pod::CachedPod,
    conditions::{ConditionStatus, ConditionType, ConditionUpdate},
};
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet, StatefulSet},
        core::v1::{Pod, PodTemplate, PodTemplateSpec},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, ResourceExt, api::ListParams};

use crate::{
    effects::kube_ops::{self, set_condition},
    protocol::ProvisionBatch,
    shared::Shared,
    state::buffers::{BufferKey, Provisioned},
};

/// How often every buffer is resolved again (Karpenter's requeue).
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(30);

/// The annotation that marks a virtual pod, with the buffer's name and namespace beside it.
const FAKE_POD: &str = "karpenter.sh/capacity-buffer-fake-pod";
const BUFFER_NAME: &str = "karpenter.sh/capacity-buffer-name";
const BUFFER_NAMESPACE: &str = "karpenter.sh/capacity-buffer-namespace";

/// See the module docs.
pub struct CapacityBufferActor {
    shared: Shared,
    provisioner: Recipient<ProvisionBatch>,
}

impl CapacityBufferActor {
    /// An actor over `shared`, asking `provisioner` for a pass after each resolution.
    pub fn new(shared: Shared, provisioner: Recipient<ProvisionBatch>) -> Self {
        Self { shared, provisioner }
    }
}

impl Actor for CapacityBufferActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.shared.settings.capacity_buffer {
            ctx.spawn(run(self.shared.clone(), self.provisioner.clone()).into_actor(self));
        }
    }
}

async fn run(shared: Shared, provisioner: Recipient<ProvisionBatch>) {
    shared.read.synced().await;
    loop {
        resolve_all(&shared, Statuses::Write).await;
        if provisioner.try_send(ProvisionBatch { pods: 0 }).is_err() {
            tracing::debug!("the provisioner's mailbox is full; its next pass counts the buffers");
        }
        tokio::time::sleep(RESOLVE_INTERVAL).await;
    }
}

/// What a buffer resolved to.
struct Resolved {
    template: PodTemplateSpec,
    pods: i32,
    /// The PodTemplate's name and generation, for a `podTemplateRef` buffer.
    pod_template: Option<(String, Option<i64>)>,
}

/// Why a buffer did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unresolved {
    /// Its PodTemplate does not exist.
    #[error("PodTemplate {0} not found")]
    PodTemplateNotFound(String),
    /// Its workload does not exist.
    #[error("{0} not found")]
    ScalableRefNotFound(String),
    /// Anything else: a kind Joist cannot read, a template that cannot be simulated.
    #[error("{0}")]
    ResolutionFailed(String),
    /// The API could not be asked: the buffer keeps the pods and the status it had.
    #[error("{0}")]
    Unreadable(String),
}

impl Unresolved {
    fn reason(&self) -> &'static str {
        match self {
            Self::PodTemplateNotFound(_) => "PodTemplateNotFound",
            Self::ScalableRefNotFound(_) => "ScalableRefNotFound",
            Self::ResolutionFailed(_) | Self::Unreadable(_) => "ResolutionFailed",
        }
    }
}

/// Whether a resolution writes the buffers' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statuses {
    /// Written, by the replica acting cluster-wide.
    Write,
    /// Left alone (`joist explain`, which only reads).
    Leave,
}

/// Resolves every buffer with the gate on and sets their virtual pods, writing their statuses
/// when `statuses` says so.
pub async fn resolve_all(shared: &Shared, statuses: Statuses) {
    if !shared.settings.capacity_buffer {
        return;
    }
    let api: Api<CapacityBuffer> = Api::all(shared.client.clone());
    let buffers = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => {
            tracing::warn!(%error, "listing capacity buffers failed; their pods stay as they were");
            return;
        }
    };
    let before = shared.buffers.pods_by_buffer();
    let outcomes = shared.buffers.provisioned();
    let mut pods = BTreeMap::new();
    for buffer in buffers.iter().filter(|b| b.metadata.deletion_timestamp.is_none()) {
        let key: BufferKey = (buffer.namespace().unwrap_or_default(), buffer.name_any());
        let resolved = resolve(shared, buffer).await;
        match &resolved {
            Ok(r) if r.pods > 0 => {
                pods.insert(key.clone(), virtual_pods(buffer, &r.template, r.pods));
            }
            Err(Unresolved::Unreadable(error)) => {
                tracing::warn!(buffer = %format!("{}/{}", key.0, key.1), %error, "reading the buffer's source failed; its pods stay");
                if let Some(kept) = before.get(&key) {
                    pods.insert(key.clone(), kept.clone());
                }
            }
            _ => {}
        }
        // A source that could not be read changes nothing the status says.
        let readable = !matches!(resolved, Err(Unresolved::Unreadable(_)));
        if readable && statuses == Statuses::Write && shared.settings.acts_cluster_wide() {
            let status = status(shared, buffer, &resolved, outcomes.get(&key).copied());
            write_status(shared, buffer, status).await;
        }
    }
    shared.buffers.set_pods(pods);
}

/// The buffer's shape and count (see the module docs).
async fn resolve(shared: &Shared, buffer: &CapacityBuffer) -> Result<Resolved, Unresolved> {
    let namespace = buffer.namespace().unwrap_or_default();
    let spec = &buffer.spec;
    let (template, scalable_replicas, pod_template) = match (&spec.pod_template_ref, &spec.scalable_ref) {
        (Some(LocalObjectRef { name }), _) => {
            let api: Api<PodTemplate> = kube_ops::namespaced(&shared.client, &namespace);
            let found = get(&api, name, || {
                Unresolved::PodTemplateNotFound(format!("{namespace}/{name}"))
            })
            .await?;
            let template = found.template.ok_or_else(|| {
                Unresolved::ResolutionFailed(format!("PodTemplate {namespace}/{name} has no template"))
            })?;
            (template, None, Some((name.clone(), found.metadata.generation)))
        }
        (None, Some(scalable)) => {
            let group = scalable.api_group.as_deref().unwrap_or_default();
            if !matches!(group, "" | "apps") || !SCALABLE_KINDS.contains(&scalable.kind.as_str()) {
                return Err(Unresolved::ResolutionFailed(format!(
                    "spec.scalableRef: {group}/{} is not a Deployment, ReplicaSet or StatefulSet of group apps",
                    scalable.kind
                )));
            }
            let missing = || {
                Unresolved::ScalableRefNotFound(format!("{} {namespace}/{}", scalable.kind, scalable.name))
            };
            let (template, replicas) = match scalable.kind.as_str() {
                "Deployment" => {
                    let api: Api<Deployment> = kube_ops::namespaced(&shared.client, &namespace);
                    let spec = get(&api, &scalable.name, missing).await?.spec.unwrap_or_default();
                    (spec.template, spec.replicas)
                }
                "ReplicaSet" => {
                    let api: Api<ReplicaSet> = kube_ops::namespaced(&shared.client, &namespace);
                    let spec = get(&api, &scalable.name, missing).await?.spec.unwrap_or_default();
                    (spec.template.unwrap_or_default(), spec.replicas)
                }
                _ => {
                    let api: Api<StatefulSet> = kube_ops::namespaced(&shared.client, &namespace);
                    let spec = get(&api, &scalable.name, missing).await?.spec.unwrap_or_default();
                    (spec.template, spec.replicas)
                }
            };
            (template, Some(replicas.unwrap_or(1)), None)
        }
        (None, None) => {
            return Err(Unresolved::ResolutionFailed(
                "spec: a buffer needs podTemplateRef or scalableRef".to_owned(),
            ));
        }
    };
    let probe = virtual_pods(buffer, &template, 1);
    let requests = match probe.first().map(|pod| shared.read.fresh_pod_info(pod)) {
        Some(Ok(info)) => info.requests,
        Some(Err(error)) => return Err(Unresolved::ResolutionFailed(format!("the pod template: {error}"))),
        None => Default::default(),
    };
    Ok(Resolved {
        pods: spec.pods(scalable_replicas, &requests),
        template,
        pod_template,
    })
}

/// `api`'s object `name`; `missing()` when there is none.
async fn get<K>(api: &Api<K>, name: &str, missing: impl FnOnce() -> Unresolved) -> Result<K, Unresolved>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(missing()),
        Err(error) => Err(Unresolved::Unreadable(error.to_string())),
    }
}

/// The buffer's `count` virtual pods of `template` (see [`crate::state::buffers`]).
fn virtual_pods(buffer: &CapacityBuffer, template: &PodTemplateSpec, count: i32) -> Vec<Arc<CachedPod>> {
    let name = buffer.name_any();
    let namespace = buffer.namespace().unwrap_or_default();
    let uid = buffer.uid().unwrap_or_else(|| format!("{namespace}/{name}"));
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.node_name = None;
    spec.priority = Some(i32::MIN);
    // A claim would tie the pod to a volume no one made (the projection keeps no mounts).
    if let Some(volumes) = &mut spec.volumes {
        volumes.retain(|v| v.persistent_volume_claim.is_none() && v.ephemeral.is_none());
    }
    let annotations = BTreeMap::from([
        (FAKE_POD.to_owned(), "true".to_owned()),
        (BUFFER_NAME.to_owned(), name.clone()),
        (BUFFER_NAMESPACE.to_owned(), namespace.clone()),
    ]);
    (1..=count)
        .map(|i| {
            let pod = Pod {
                metadata: ObjectMeta {
                    name: Some(format!("capacity-buffer-{name}-{i}")),
                    namespace: Some(namespace.clone()),
                    uid: Some(format!("{uid}-{i}")),
                    labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                    annotations: Some(annotations.clone()),
                    creation_timestamp: buffer.metadata.creation_timestamp.clone(),
                    ..ObjectMeta::default()
                },
                spec: Some(spec.clone()),
                status: None,
            };
            Arc::new(CachedPod::from(pod))
        })
        .collect()
}

/// The status `buffer` should show for `resolved` and the last pass's `provisioned` outcome.
fn status(
    shared: &Shared,
    buffer: &CapacityBuffer,
    resolved: &Result<Resolved, Unresolved>,
    provisioned: Option<Provisioned>,
) -> CapacityBufferStatus {
    let mut status = buffer.status.clone().unwrap_or_default();
    let generation = buffer.metadata.generation;
    let mut set = |update: ConditionUpdate| {
        set_condition(&mut status.conditions, &shared.clock, generation, &update);
    };
    let provisioning = |status: ConditionStatus, reason: &str, message: &str| {
        ConditionUpdate::new(ConditionType::Provisioning, status, reason).with_message(message)
    };
    match resolved {
        Ok(r) => {
            set(ConditionUpdate::new(
                ConditionType::ReadyForProvisioning,
                ConditionStatus::True,
                "Resolved",
            )
            .with_message("the buffer's pods are resolved"));
            let outcome = match provisioned {
                _ if r.pods == 0 => Some(provisioning(
                    ConditionStatus::False,
                    "BufferEmpty",
                    "the buffer holds no pods",
                )),
                Some(Provisioned::Fits) => Some(provisioning(
                    ConditionStatus::True,
                    "FitsExistingCapacity",
                    "every pod of the buffer fits on the nodes there are",
                )),
                Some(Provisioned::NeedsNodes) => Some(provisioning(
                    ConditionStatus::False,
                    "RequiresNewCapacity",
                    "some pods of the buffer need new nodes",
                )),
                // No pass has placed its pods yet: the condition stays as it was.
                None => None,
            };
            if let Some(outcome) = outcome {
                set(outcome);
            }
            status.replicas = Some(r.pods);
            status.pod_template_ref = r
                .pod_template
                .as_ref()
                .map(|(name, _)| LocalObjectRef { name: name.clone() });
            status.pod_template_generation = r.pod_template.as_ref().and_then(|(_, g)| *g);
        }
        Err(unresolved) => {
            let message = unresolved.to_string();
            set(ConditionUpdate::new(
                ConditionType::ReadyForProvisioning,
                ConditionStatus::False,
                unresolved.reason(),
            )
            .with_message(message.as_str()));
            set(provisioning(
                ConditionStatus::False,
                "NotReadyForProvisioning",
                "the buffer is not ready for provisioning",
            ));
        }
    }
    status.provisioning_strategy = buffer.spec.provisioning_strategy.clone();
    status
}

/// Writes `status` to `buffer` when it differs from what the buffer shows.
async fn write_status(shared: &Shared, buffer: &CapacityBuffer, status: CapacityBufferStatus) {
    if buffer.status.as_ref() == Some(&status) {
        return;
    }
    let namespace = buffer.namespace().unwrap_or_default();
    let api: Api<CapacityBuffer> = kube_ops::namespaced(&shared.client, &namespace);
    let body = serde_json::to_value(&status).unwrap_or_default();
    if let Err(error) = kube_ops::patch_status(&api, &buffer.name_any(), body).await {
        tracing::warn!(buffer = %format!("{namespace}/{}", buffer.name_any()), %error, "writing the buffer's status failed; next time");
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::apis::CapacityBufferSpec;
    use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaimVolumeSource, PodSpec, Volume};

    use super::*;

    #[test]
    fn virtual_pods_carry_the_templates_labels_and_no_volume_claim() {
        let mut buffer = CapacityBuffer::new("headroom", CapacityBufferSpec::default());
        buffer.metadata.namespace = Some("team".into());
        buffer.metadata.uid = Some("u".into());
        let claim = Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "data".into(),
                read_only: None,
            }),
            ..Volume::default()
        };
        let template = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("app".to_owned(), "worker".to_owned())])),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                node_name: Some("pinned".into()),
                volumes: Some(vec![claim]),
                containers: vec![Container {
                    name: "worker".into(),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        };
        let pods = virtual_pods(&buffer, &template, 2);
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            ["capacity-buffer-headroom-1", "capacity-buffer-headroom-2"]
        );
        let pod = &pods[0];
        assert_eq!(pod.namespace().as_deref(), Some("team"));
        assert_eq!(pod.uid().as_deref(), Some("u-1"));
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("worker"));
        assert_eq!(pod.annotations().get(FAKE_POD).map(String::as_str), Some("true"));
        let spec = pod.spec.as_ref().unwrap_or_else(|| panic!("a spec"));
        assert_eq!(spec.node_name, None, "placed by the simulation, not pinned");
        assert!(
            spec.volumes
                .iter()
                .flatten()
                .all(|v| v.persistent_volume_claim.is_none()),
            "a claim would tie the pod to a volume no one made"
        );
    }
}

//! A pod as Joist keeps it: the fields scheduling, draining, disruption and the metrics read, and
//! nothing else, read straight from the API server's JSON (unknown fields are skipped, never
//! built).
//!
//! k8s-openapi's `Pod` keeps room inline for every optional field of the API: about 2.4 KB for the
//! pod itself and 2.1 KB for each container before any of them is set. A controller reflecting
//! every pod of a 10,000-node cluster held some 9 KB per pod that way; [`CachedPod`] keeps the same
//! field names and shapes for what it keeps (but for a container's resource amounts, lists rather
//! than maps), so the code reading a pod reads it the same way, in a fraction of the room.
//!
//! It is only ever read, never written back: Joist changes pods through evictions and patches of
//! named fields, so nothing left out here can be lost. Deserializing cannot fail for a pod the API
//! server accepted; a malformed one fails as k8s-openapi's own types would on the fields kept.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{
        Affinity, Container, ContainerPort, EphemeralVolumeSource, PersistentVolumeClaimVolumeSource, Pod,
        PodCondition, PodSpec, PodStatus, ResourceRequirements, Toleration, TopologySpreadConstraint, Volume,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
};
use kube::Resource;
use serde::{Deserialize, Deserializer};

/// See the module docs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPod {
    /// The pod's metadata, whole (labels, annotations and owners are all read).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What scheduling and draining read of the spec.
    pub spec: Option<CachedPodSpec>,
    /// What the controllers read of the status.
    pub status: Option<CachedPodStatus>,
}

/// The part of a `PodSpec` Joist reads, with the API's field names.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// The node the pod is bound to.
    pub node_name: Option<String>,
    /// Node labels the pod requires.
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Node and pod (anti-)affinity.
    pub affinity: Option<Affinity>,
    /// Taints the pod tolerates.
    pub tolerations: Option<Vec<Toleration>>,
    /// How the pod's kind spreads over topology domains.
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// The app containers.
    #[serde(default)]
    pub containers: Vec<CachedContainer>,
    /// The init containers (sidecars among them).
    pub init_containers: Option<Vec<CachedContainer>>,
    /// What the runtime class adds to the pod's requests.
    pub overhead: Option<BTreeMap<String, Quantity>>,
    /// Pod-level requests and limits, which stand for the containers' in CPU, memory and huge pages.
    pub resources: Option<CachedResources>,
    /// The volumes that claim a PersistentVolume (a drain waits for their attachments); others
    /// are dropped when the pod is cached.
    pub volumes: Option<Vec<CachedVolume>>,
    /// How long the pod may take to stop once asked to.
    pub termination_grace_period_seconds: Option<i64>,
    /// The pod's priority, resolved from its class at admission.
    pub priority: Option<i32>,
    /// Its priority class (`system-node-critical` and `system-cluster-critical` pods drain last).
    pub priority_class_name: Option<String>,
}

/// The part of a container Joist reads: what it requests and the host ports it takes.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainer {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Its requests and limits.
    pub resources: Option<CachedResources>,
    /// Its ports (the host ports are what a node can hold once).
    pub ports: Option<Vec<ContainerPort>>,
    /// `Always` for an init container that runs alongside the app (a sidecar).
    pub restart_policy: Option<String>,
}

/// Resource amounts by name, in name order.
pub type Amounts = Box<[(String, Quantity)]>;

/// A container's requests and limits, as lists: a map of two entries costs a whole B-tree node
/// (half a kilobyte), a list only its entries.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedResources {
    /// Amounts requested, by resource name.
    #[serde(default, deserialize_with = "amounts")]
    pub requests: Option<Amounts>,
    /// Amounts the container may not exceed, by resource name.
    #[serde(default, deserialize_with = "amounts")]
    pub limits: Option<Amounts>,
}

/// A map of resource amounts, read into a list in the map's (name) order.
fn amounts<'de, D: Deserializer<'de>>(map: D) -> Result<Option<Amounts>, D::Error> {
    let map = Option::<BTreeMap<String, Quantity>>::deserialize(map)?;
    Ok(map.map(|map| map.into_iter().collect()))
}

/// A volume, by what claims a PersistentVolume.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedVolume {
    /// The volume's name in the pod.
    #[serde(default)]
    pub name: String,
    /// A claim by name.
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A claim made for the pod from a template (named `<pod>-<volume>`).
    pub ephemeral: Option<EphemeralVolumeSource>,
}

/// The part of a `PodStatus` Joist reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed`.
    pub phase: Option<String>,
    /// The conditions (only `PodScheduled` and `Ready` are kept; [`CachedPod::trim`]).
    pub conditions: Option<Vec<PodCondition>>,
    /// The node the scheduler nominated for a preempting pod.
    pub nominated_node_name: Option<String>,
    /// When the kubelet accepted the pod.
    pub start_time: Option<Time>,
}

/// The pod conditions some controller reads: whether it could be scheduled, and whether it is
/// ready.
const CONDITIONS_READ: [&str; 2] = ["PodScheduled", "Ready"];

impl CachedPod {
    /// Drops what no controller reads and the API server sends anyway: managedFields, the
    /// conditions other than `PodScheduled` and `Ready`, and the volumes that claim nothing.
    pub fn trim(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(conditions) = self.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.retain(|c| CONDITIONS_READ.contains(&c.type_.as_str()));
        }
        if let Some(volumes) = self.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
            volumes.retain(CachedVolume::claims);
        }
    }
}

impl CachedVolume {
    /// Whether the volume claims a PersistentVolume.
    pub fn claims(&self) -> bool {
        self.persistent_volume_claim.is_some() || self.ephemeral.is_some()
    }
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        let mut cached = Self {
            metadata: pod.metadata,
            spec: pod.spec.map(CachedPodSpec::from),
            status: pod.status.map(CachedPodStatus::from),
        };
        cached.trim();
        cached
    }
}

impl From<PodSpec> for CachedPodSpec {
    fn from(spec: PodSpec) -> Self {
        let containers = |list: Vec<Container>| list.into_iter().map(CachedContainer::from).collect();
        Self {
            node_name: spec.node_name,
            node_selector: spec.node_selector,
            affinity: spec.affinity,
            tolerations: spec.tolerations,
            topology_spread_constraints: spec.topology_spread_constraints,
            containers: containers(spec.containers),
            init_containers: spec.init_containers.map(containers),
            overhead: spec.overhead,
            resources: spec.resources.map(CachedResources::from),
            volumes: spec
                .volumes
                .map(|volumes| volumes.into_iter().map(CachedVolume::from).collect()),
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            priority: spec.priority,
            priority_class_name: spec.priority_class_name,
        }
    }
}

impl From<Container> for CachedContainer {
    fn from(container: Container) -> Self {
        Self {
            name: container.name,
            resources: container.resources.map(CachedResources::from),
            ports: container.ports,
            restart_policy: container.restart_policy,
        }
    }
}

impl From<ResourceRequirements> for CachedResources {
    fn from(resources: ResourceRequirements) -> Self {
        Self {
            requests: resources.requests.map(|map| map.into_iter().collect()),
            limits: resources.limits.map(|map| map.into_iter().collect()),
        }
    }
}

impl From<Volume> for CachedVolume {
    fn from(volume: Volume) -> Self {
        Self {
            name: volume.name,
            persistent_volume_claim: volume.persistent_volume_claim,
            ephemeral: volume.ephemeral,
        }
    }
}

impl From<PodStatus> for CachedPodStatus {
    fn from(status: PodStatus) -> Self {
        Self {
            phase: status.phase,
            conditions: status.conditions,
            nominated_node_name: status.nominated_node_name,
            start_time: status.start_time,
        }
    }
}

impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A pod as the API server sends it: images, commands, probes, a projected token volume,
    /// container statuses and every condition.
    fn full_pod() -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"karpenter.sh/do-not-disrupt": "true"},
                         "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {
                "nodeName": "n1",
                "containers": [{
                    "name": "app", "image": "registry.example/app:1", "command": ["/app"],
                    "env": [{"name": "MODE", "value": "serve"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi", "cpu": "2"}},
                    "ports": [{"containerPort": 8080, "hostPort": 8080}]
                }],
                "initContainers": [{"name": "proxy", "image": "proxy:2", "restartPolicy": "Always",
                                    "resources": {"requests": {"memory": "64Mi"}}}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
                ],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "terminationGracePeriodSeconds": 60,
                "priority": 1000,
                "priorityClassName": "high"
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "nominatedNodeName": "n",
                "startTime": "2026-11-27T00:00:00Z",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                               {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "app:1", "imageID": "", "ready": true, "restartCount": 0}]
            }
        })
    }

    fn cached(pod: Value) -> CachedPod {
        let mut pod: CachedPod = serde_json::from_value(pod).expect("a valid pod");
        pod.trim();
        pod
    }

    #[test]
    fn a_pod_keeps_what_scheduling_draining_and_metrics_read() {
        let pod = cached(full_pod());
        assert!(pod.metadata.managed_fields.is_none());
        assert_eq!(pod.metadata.annotations.as_ref().map(BTreeMap::len), Some(1));
        let spec = pod.spec.as_ref().expect("a spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let app = &spec.containers[0];
        assert_eq!(app.name, "app");
        let requests = app.resources.as_ref().and_then(|r| r.requests.as_deref());
        assert_eq!(requests, Some(&[("cpu".to_owned(), Quantity("1".into()))][..]));
        let limits: Vec<&str> = app
            .resources
            .iter()
            .flat_map(|r| r.limits.iter().flatten())
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(limits, ["cpu", "memory"]);
        assert_eq!(app.ports.as_ref().and_then(|p| p[0].host_port), Some(8080));
        let proxy = &spec.init_containers.as_ref().expect("init containers")[0];
        assert_eq!(proxy.restart_policy.as_deref(), Some("Always"));
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(
            volumes,
            ["data", "scratch"],
            "only volumes that claim one are kept"
        );
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
        assert_eq!(spec.termination_grace_period_seconds, Some(60));
        assert_eq!(
            (spec.priority, spec.priority_class_name.as_deref()),
            (Some(1000), Some("high"))
        );
        let status = pod.status.as_ref().expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.nominated_node_name.as_deref(), Some("n"));
        assert!(status.start_time.is_some());
        let conditions: Vec<&str> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(conditions, ["PodScheduled", "Ready"]);
    }

    #[test]
    fn a_pod_converted_from_k8s_openapis_type_is_the_one_read_from_json() {
        let pod: Pod = serde_json::from_value(full_pod()).expect("a valid pod");
        assert_eq!(
            format!("{:?}", CachedPod::from(pod)),
            format!("{:?}", cached(full_pod()))
        );
    }

    #[test]
    fn a_pod_is_listed_and_watched_at_the_pods_own_path() {
        let url = kube::core::Request::new(CachedPod::url_path(&(), Some("ns")))
            .list(&kube::core::params::ListParams::default())
            .map(|request| request.uri().to_string());
        assert_eq!(url.ok().as_deref(), Some("/api/v1/namespaces/ns/pods?"));
    }
}

//! Workload controllers: Deployment → ReplicaSet → Pods, DaemonSet (one pod per eligible node),
//! StatefulSet (pods with claims of their own, [`stateful_set`]) and Job (pods until
//! `completions` succeed). Garbage collection by owner is the store's.
//!
//! A Deployment whose template changes rolls its pods over to a new ReplicaSet by its strategy
//! ([`super::rollout`]). Simplifications, each visible to a user: a Job pod
//! succeeds only if its template carries the kubelet's `run-for` annotation, and failed pods are not
//! retried. ReplicaSets create or delete at most [`POD_WRITES_PER_TURN`] pods between two turns of
//! the runtime, all of them together: kube-controller-manager creates a burst's pods while
//! kube-scheduler places them beside it, and on kubesim's one thread short turns stand in for
//! that, so the scheduler marks each pod soon after its creation and a scale-up to 100,000
//! reaches watchers in steps they can follow.

mod stateful_set;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use serde_json::{Map, Value, json};

use super::{
    Informer,
    rollout::{Counts, Strategy},
    scheduler::node_accepts,
    wait,
};
use crate::object::text;
use crate::{
    conditions,
    object::Pointer,
    resources::GroupResource,
    store::{DeleteOptions, EventKind, ObjectKey, Part, Store},
};

/// Pods the ReplicaSets create or delete in one turn before the workload controllers yield (fewer
/// than kube-controller-manager's `burstReplicas`, 500 per sync: see the module docs).
const POD_WRITES_PER_TURN: usize = 100;

/// Tolerations the DaemonSet controller adds to every daemon pod, as Kubernetes does.
const DAEMON_TOLERATIONS: [(&str, &str); 6] = [
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

#[derive(Default)]
struct Workloads {
    /// Pods by the uid of their controller.
    pods_by_owner: HashMap<String, Owned>,
    /// ReplicaSets by the uid of their Deployment.
    sets_by_owner: HashMap<String, HashMap<ObjectKey, Arc<Value>>>,
    dirty: BTreeSet<(Kind, ObjectKey)>,
    daemonsets: BTreeSet<ObjectKey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Deployment,
    ReplicaSet,
    DaemonSet,
    StatefulSet,
    Job,
}

impl Kind {
    fn resource(self) -> GroupResource {
        match self {
            Self::Deployment => GroupResource::new("apps", "deployments"),
            Self::ReplicaSet => GroupResource::new("apps", "replicasets"),
            Self::DaemonSet => GroupResource::new("apps", "daemonsets"),
            Self::StatefulSet => GroupResource::new("apps", "statefulsets"),
            Self::Job => GroupResource::new("batch", "jobs"),
        }
    }

    fn of_owner(kind: &str) -> Option<Self> {
        match kind {
            "Deployment" => Some(Self::Deployment),
            "ReplicaSet" => Some(Self::ReplicaSet),
            "DaemonSet" => Some(Self::DaemonSet),
            "StatefulSet" => Some(Self::StatefulSet),
            "Job" => Some(Self::Job),
            _ => None,
        }
    }
}

/// The pods one controller owns, with the counts its status reports kept as pods change, so a
/// ReplicaSet of 100,000 pods is reconciled without reading them all on every pod update.
#[derive(Default)]
struct Owned {
    /// Every pod, those being deleted included (Recreate waits for them), in key order.
    pods: BTreeMap<ObjectKey, OwnedPod>,
    /// Pods not being deleted.
    live: usize,
    /// Live pods whose Ready condition is True.
    ready: usize,
}

/// What the workload controllers read of a pod they own (the pod itself stays in the store).
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnedPod {
    deleting: bool,
    ready: bool,
    /// `status.phase`, Pending when unset.
    phase: String,
    scheduled: bool,
    created: String,
    /// The node a daemon pod is pinned to.
    daemon_node: Option<String>,
}

impl OwnedPod {
    fn of(pod: &Value) -> Self {
        Self {
            deleting: pod.at("/metadata/deletionTimestamp").is_some(),
            ready: conditions::status(pod, "Ready") == Some("True"),
            phase: pod
                .at("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending")
                .to_owned(),
            scheduled: pod
                .at("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|node| !node.is_empty()),
            created: text(pod, "/metadata/creationTimestamp").to_owned(),
            daemon_node: daemon_node(pod),
        }
    }

    /// Which surplus pods a ReplicaSet deletes first: unscheduled, then pending, then not ready,
    /// then the newest.
    fn deletion_rank(&self) -> (bool, bool, bool, std::cmp::Reverse<&str>) {
        (
            self.scheduled,
            self.phase != "Pending",
            self.ready,
            std::cmp::Reverse(&self.created),
        )
    }
}

impl Owned {
    fn insert(&mut self, key: ObjectKey, pod: OwnedPod) {
        self.count(&pod, true);
        if let Some(old) = self.pods.insert(key, pod) {
            self.count(&old, false);
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some(old) = self.pods.remove(key) {
            self.count(&old, false);
        }
    }

    /// Adds a pod's share to the counts, or takes it away.
    fn count(&mut self, pod: &OwnedPod, add: bool) {
        if pod.deleting {
            return;
        }
        let ready = usize::from(pod.ready);
        if add {
            self.live += 1;
            self.ready += ready;
        } else {
            self.live -= 1;
            self.ready -= ready;
        }
    }

    /// The pods not being deleted, in key order.
    fn live_pods(&self) -> Vec<(&ObjectKey, &OwnedPod)> {
        self.pods.iter().filter(|(_, pod)| !pod.deleting).collect()
    }
}

/// Runs the workload controllers until aborted.
pub async fn run(store: Arc<Store>) {
    let mut changes = store.subscribe();
    let mut informers: Vec<(Kind, Informer)> = vec![
        (Kind::Deployment, Informer::new("apps", "deployments")),
        (Kind::ReplicaSet, Informer::new("apps", "replicasets")),
        (Kind::DaemonSet, Informer::new("apps", "daemonsets")),
        (Kind::StatefulSet, Informer::new("apps", "statefulsets")),
        (Kind::Job, Informer::new("batch", "jobs")),
    ];
    let mut pods = Informer::new("", "pods");
    let mut nodes = Informer::new("", "nodes");
    let mut workloads = Workloads::default();
    loop {
        for (kind, informer) in &mut informers {
            for change in informer.changes(&store) {
                workloads.observe(*kind, change.kind, &change.object);
            }
        }
        for change in pods.changes(&store) {
            workloads.observe_pod(change.kind, &change.object);
        }
        if !nodes.changes(&store).is_empty() {
            let daemonsets: Vec<ObjectKey> = workloads.daemonsets.iter().cloned().collect();
            workloads
                .dirty
                .extend(daemonsets.into_iter().map(|key| (Kind::DaemonSet, key)));
        }
        workloads.reconcile_dirty(&store);
        // Let the cluster see a turn's pods before the next (their events bring the set back).
        tokio::task::yield_now().await;
        if workloads.dirty.is_empty() && !wait(&mut changes, None).await {
            return;
        }
    }
}

/// The controller reference of an object: (kind, name, uid).
fn controller_of(object: &Value) -> Option<(&str, &str, &str)> {
    object
        .at("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|r| {
            let text = |field: &str| r.get(field).and_then(Value::as_str).unwrap_or_default();
            (text("kind"), text("name"), text("uid"))
        })
}

fn uid(object: &Value) -> String {
    text(object, "/metadata/uid").to_owned()
}

impl Workloads {
    fn observe(&mut self, kind: Kind, event: EventKind, object: &Arc<Value>) {
        let key = ObjectKey::of(object);
        if kind == Kind::DaemonSet {
            if event == EventKind::Deleted {
                self.daemonsets.remove(&key);
            } else {
                self.daemonsets.insert(key.clone());
            }
        }
        if kind == Kind::ReplicaSet
            && let Some((owner_kind, owner_name, owner_uid)) = controller_of(object)
        {
            let sets = self.sets_by_owner.entry(owner_uid.to_owned()).or_default();
            if event == EventKind::Deleted {
                sets.remove(&key);
            } else {
                sets.insert(key.clone(), object.clone());
            }
            if owner_kind == "Deployment" {
                self.dirty
                    .insert((Kind::Deployment, ObjectKey::new(&key.namespace, owner_name)));
            }
        }
        if event != EventKind::Deleted {
            self.dirty.insert((kind, key));
        }
    }

    fn observe_pod(&mut self, event: EventKind, pod: &Arc<Value>) {
        let Some((owner_kind, owner_name, owner_uid)) = controller_of(pod) else {
            return;
        };
        let key = ObjectKey::of(pod);
        // Looked up before it is added: nearly every pod's owner already has pods here.
        let owned = match self.pods_by_owner.get_mut(owner_uid) {
            Some(owned) => owned,
            None => self.pods_by_owner.entry(owner_uid.to_owned()).or_default(),
        };
        if let Some(kind) = Kind::of_owner(owner_kind) {
            self.dirty
                .insert((kind, ObjectKey::new(&key.namespace, owner_name)));
        }
        if event == EventKind::Deleted {
            owned.remove(&key);
        } else {
            owned.insert(key, OwnedPod::of(pod));
        }
    }

    /// Reconciles what changed, until the turn's pod writes are spent; the rest stays dirty.
    fn reconcile_dirty(&mut self, store: &Store) {
        let mut pod_writes = POD_WRITES_PER_TURN;
        while pod_writes > 0
            && let Some((kind, key)) = self.dirty.pop_first()
        {
            let Ok(object) = store.get(&kind.resource(), &key) else {
                continue;
            };
            if object.at("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let result = match kind {
                Kind::Deployment => self.deployment(store, &object),
                Kind::ReplicaSet => self.replica_set(store, &object, &mut pod_writes),
                Kind::DaemonSet => self.daemon_set(store, &object),
                Kind::StatefulSet => self.stateful_set(store, &object),
                Kind::Job => self.job(store, &object),
            };
            if let Err(error) = result {
                tracing::debug!(%error, ?kind, name = %key.name, "kubesim workloads: reconcile failed; retried on the next change");
            }
        }
    }

    /// The pods `owner` controls, if it has any.
    fn owned(&self, owner: &Value) -> Option<&Owned> {
        self.pods_by_owner.get(&uid(owner))
    }

    fn live_pods(&self, owner: &Value) -> Vec<(&ObjectKey, &OwnedPod)> {
        self.owned(owner).map(Owned::live_pods).unwrap_or_default()
    }

    fn deployment(&mut self, store: &Store, deployment: &Value) -> Result<(), crate::error::ApiError> {
        let key = ObjectKey::of(deployment);
        let template = deployment
            .at("/spec/template")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let hash = template_hash(&template);
        let desired = replicas(deployment);
        let current_name = format!("{}-{hash}", key.name);
        let sets: Vec<Arc<Value>> = self
            .sets_by_owner
            .get(&uid(deployment))
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        let resource = Kind::ReplicaSet.resource();
        let strategy = Strategy::of(deployment, desired);
        let counts = |set: &Value| Counts {
            replicas: replicas(set),
            // Pods shutting down count: Recreate waits for them.
            pods: self
                .owned(set)
                .map_or(0, |owned| i64::try_from(owned.pods.len()).unwrap_or(i64::MAX)),
            available: set
                .at("/status/availableReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0),
        };
        let current = sets.iter().find(|s| ObjectKey::of(s).name == current_name);
        let mut old: Vec<&Arc<Value>> = sets
            .iter()
            .filter(|s| ObjectKey::of(s).name != current_name)
            .collect();
        old.sort_by_key(|s| {
            (
                text(s, "/metadata/creationTimestamp").to_owned(),
                ObjectKey::of(s),
            )
        });
        let new_counts = current.map_or_else(Counts::default, |s| counts(s));
        let old_counts: Vec<Counts> = old.iter().map(|s| counts(s)).collect();
        let (new_target, old_targets) = strategy.targets(desired, new_counts, &old_counts);
        if current.is_none() {
            let mut template = template.clone();
            template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
            let mut selector = deployment
                .at("/spec/selector")
                .cloned()
                .unwrap_or_else(|| json!({}));
            selector["matchLabels"]["pod-template-hash"] = json!(hash);
            let set = json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": current_name, "namespace": key.namespace,
                    "labels": template["metadata"]["labels"].clone(),
                    "ownerReferences": [owner_reference(deployment)],
                },
                "spec": {"replicas": new_target, "selector": selector, "template": template},
            });
            store.create(&resource, &key.namespace, set, false)?;
        }
        let wanted = current
            .map(|s| (s, new_target))
            .into_iter()
            .chain(old.iter().copied().zip(old_targets));
        for (set, want) in wanted {
            if replicas(set) != want {
                store.modify(&resource, &ObjectKey::of(set), Part::Main, false, |current| {
                    let mut next = current.clone();
                    next["spec"]["replicas"] = json!(want);
                    Ok(next)
                })?;
            }
        }
        let total = |field: &str| {
            sets.iter()
                .map(|s| {
                    s.at(&format!("/status/{field}"))
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                })
                .sum::<i64>()
        };
        let updated = current
            .and_then(|s| s.at("/status/replicas")?.as_i64())
            .unwrap_or(0);
        let available = total("availableReplicas");
        let max_unavailable = strategy.max_unavailable(desired);
        let now = store.clock().now_rfc3339();
        let mut next = deployment.clone();
        next["status"]["replicas"] = json!(total("replicas"));
        next["status"]["readyReplicas"] = json!(total("readyReplicas"));
        next["status"]["availableReplicas"] = json!(available);
        next["status"]["updatedReplicas"] = json!(updated);
        next["status"]["unavailableReplicas"] = json!((desired - available).max(0));
        next["status"]["observedGeneration"] =
            deployment.at("/metadata/generation").cloned().unwrap_or(json!(1));
        let (state, reason) = if available >= desired - max_unavailable {
            ("True", "MinimumReplicasAvailable")
        } else {
            ("False", "MinimumReplicasUnavailable")
        };
        conditions::set(&mut next, "Available", state, reason, "", &now);
        let progress = if updated >= desired {
            "NewReplicaSetAvailable"
        } else {
            "ReplicaSetUpdated"
        };
        conditions::set(&mut next, "Progressing", "True", progress, "", &now);
        write_status(store, &Kind::Deployment.resource(), deployment, next)
    }

    /// Creates or deletes pods towards the set's replicas, `pod_writes` at most (taken from it).
    fn replica_set(
        &mut self,
        store: &Store,
        set: &Value,
        pod_writes: &mut usize,
    ) -> Result<(), crate::error::ApiError> {
        let key = ObjectKey::of(set);
        let (live, ready) = self.owned(set).map_or((0, 0), |owned| (owned.live, owned.ready));
        let desired = usize::try_from(replicas(set)).unwrap_or(0);
        let resource = GroupResource::new("", "pods");
        if live < desired {
            let creating = (desired - live).min(*pod_writes);
            *pod_writes -= creating;
            for _ in 0..creating {
                store.create(
                    &resource,
                    &key.namespace,
                    pod_from_template(set, &format!("{}-", key.name)),
                    false,
                )?;
            }
        } else if live > desired {
            let mut doomed = self.live_pods(set);
            doomed.sort_by_key(|(_, pod)| pod.deletion_rank());
            let deleting = (live - desired).min(*pod_writes);
            *pod_writes -= deleting;
            for (key, _) in doomed.iter().take(deleting) {
                store.delete(&resource, key, &DeleteOptions::default())?;
            }
        }
        let mut next = set.clone();
        next["status"]["replicas"] = json!(live);
        next["status"]["fullyLabeledReplicas"] = json!(live);
        next["status"]["readyReplicas"] = json!(ready);
        next["status"]["availableReplicas"] = json!(ready);
        next["status"]["observedGeneration"] = set.at("/metadata/generation").cloned().unwrap_or(json!(1));
        write_status(store, &Kind::ReplicaSet.resource(), set, next)
    }

    fn daemon_set(&mut self, store: &Store, daemonset: &Value) -> Result<(), crate::error::ApiError> {
        let key = ObjectKey::of(daemonset);
        let pods = self.live_pods(daemonset);
        let nodes = store
            .list(&GroupResource::new("", "nodes"), None, None, None, |_| true)
            .items;
        let template_pod = pod_from_template(daemonset, "");
        let resource = GroupResource::new("", "pods");
        let mut desired = 0;
        for node in nodes
            .iter()
            .filter(|n| n.at("/metadata/deletionTimestamp").is_none())
        {
            let node_name = ObjectKey::of(node).name;
            let mut pod = template_pod.clone();
            pin_to_node(&mut pod, &node_name);
            if !node_accepts(&pod, node) {
                continue;
            }
            desired += 1;
            let has_pod = pods
                .iter()
                .any(|(_, pod)| pod.daemon_node.as_deref() == Some(node_name.as_str()));
            if !has_pod {
                pod["metadata"]["generateName"] = json!(format!("{}-", key.name));
                store.create(&resource, &key.namespace, pod, false)?;
            }
        }
        let ready = self.owned(daemonset).map_or(0, |owned| owned.ready);
        let mut next = daemonset.clone();
        next["status"]["desiredNumberScheduled"] = json!(desired);
        next["status"]["currentNumberScheduled"] = json!(pods.len());
        next["status"]["updatedNumberScheduled"] = json!(pods.len());
        next["status"]["numberReady"] = json!(ready);
        next["status"]["numberAvailable"] = json!(ready);
        next["status"]["numberMisscheduled"] = json!(0);
        next["status"]["observedGeneration"] =
            daemonset.at("/metadata/generation").cloned().unwrap_or(json!(1));
        write_status(store, &Kind::DaemonSet.resource(), daemonset, next)
    }

    fn job(&mut self, store: &Store, job: &Value) -> Result<(), crate::error::ApiError> {
        let key = ObjectKey::of(job);
        let pods = self.live_pods(job);
        let succeeded = pods.iter().filter(|(_, pod)| pod.phase == "Succeeded").count();
        let failed = pods.iter().filter(|(_, pod)| pod.phase == "Failed").count();
        let active = pods.len() - succeeded - failed;
        let completions =
            usize::try_from(job.at("/spec/completions").and_then(Value::as_i64).unwrap_or(1)).unwrap_or(1);
        let parallelism =
            usize::try_from(job.at("/spec/parallelism").and_then(Value::as_i64).unwrap_or(1)).unwrap_or(1);
        let complete = succeeded >= completions;
        let wanted = if complete {
            0
        } else {
            parallelism.min(completions - succeeded)
        };
        for _ in active..wanted {
            store.create(
                &GroupResource::new("", "pods"),
                &key.namespace,
                pod_from_template(job, &format!("{}-", key.name)),
                false,
            )?;
        }
        let now = store.clock().now_rfc3339();
        let mut next = job.clone();
        next["status"]["active"] = json!(active.max(wanted));
        next["status"]["succeeded"] = json!(succeeded);
        next["status"]["failed"] = json!(failed);
        if next.at("/status/startTime").is_none() {
            next["status"]["startTime"] = json!(now);
        }
        if complete {
            next["status"]["active"] = json!(0);
            if conditions::set(
                &mut next,
                "Complete",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                &now,
            ) {
                conditions::set(
                    &mut next,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "",
                    &now,
                );
                next["status"]["completionTime"] = json!(now);
            }
        }
        write_status(store, &Kind::Job.resource(), job, next)
    }
}

fn write_status(
    store: &Store,
    resource: &GroupResource,
    before: &Value,
    next: Value,
) -> Result<(), crate::error::ApiError> {
    if before.get("status") == next.get("status") {
        return Ok(());
    }
    store
        .update(resource, &ObjectKey::of(before), Part::Status, next, false)
        .map(|_| ())
}

fn replicas(object: &Value) -> i64 {
    object.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
}

/// A short, stable hash of a pod template (the `pod-template-hash` label): a Deployment's current
/// ReplicaSet is `NAME-HASH` of its template as stored.
pub fn template_hash(template: &Value) -> String {
    let text = template.to_string();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|i| char::from(ALPHABET[usize::try_from((hash >> (i * 6)) % 27).unwrap_or(0)]))
        .collect()
}

fn owner_reference(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    })
}

/// A pod of a controller's template, named `prefix` + a random suffix. The template's parts are
/// copied once and moved in (`json!` would copy each through serde again).
fn pod_from_template(owner: &Value, prefix: &str) -> Value {
    let template = owner.at("/spec/template");
    let part = |name: &str| {
        template
            .and_then(|template| template.get(name))
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()))
    };
    let mut metadata = part("metadata");
    if !prefix.is_empty() {
        metadata["generateName"] = Value::from(prefix);
    }
    metadata["ownerReferences"] = Value::Array(vec![owner_reference(owner)]);
    let mut pod = Map::new();
    pod.insert("apiVersion".to_owned(), Value::from("v1"));
    pod.insert("kind".to_owned(), Value::from("Pod"));
    pod.insert("metadata".to_owned(), metadata);
    pod.insert("spec".to_owned(), part("spec"));
    Value::Object(pod)
}

/// Pins a daemon pod to its node (required node affinity on metadata.name) and adds the tolerations
/// daemon pods get.
fn pin_to_node(pod: &mut Value, node: &str) {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}],
    });
    let mut tolerations = pod
        .at("/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (key, effect) in DAEMON_TOLERATIONS {
        tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
    }
    pod["spec"]["tolerations"] = json!(tolerations);
}

/// The node a daemon pod is pinned to.
fn daemon_node(pod: &Value) -> Option<String> {
    pod.at("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

//! Kubelets and the node agents around them: a registered Node turns Ready after a delay (one whose
//! `Ready` turns False or Unknown later is broken and stays so until it is reported True); pods bound
//! to a Ready node start Running (Ready, with a pod IP) after a delay, and a pod annotated with
//! [`RUN_FOR_ANNOTATION`] succeeds once it has run that long; a node agent removes the startup taints
//! its NodeClaim declares once the node is Ready; the `node.kubernetes.io/not-ready` taint every
//! new Node gets is taken off once it is Ready (the node lifecycle controller's part); and the pods
//! of a deleted Node are deleted (pod garbage collection).
//!
//! The taint manager: a pod on a Node with a `NoExecute` taint it does not tolerate is deleted
//! gracefully, as kube-controller-manager evicts it. A toleration with `tolerationSeconds`
//! tolerates for good here (the built-in not-ready and unreachable ones among them), so a broken
//! node keeps its pods until something drains it.
//!
//! Graceful shutdown: a pod being deleted keeps running until its containers stop, which takes
//! the time its [`SHUTDOWN_AFTER_ANNOTATION`] says (none: at once), never past the end of its grace
//! period (the `deletionTimestamp`); then its kubelet deletes it for good.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::{
    Informer, WRITES_PER_TURN,
    scheduler::{parse, untolerated},
    wait,
};
use crate::object::text;
use crate::{
    conditions,
    object::Pointer,
    resources::GroupResource,
    store::{DeleteOptions, EventKind, NOT_READY_TAINT, ObjectKey, Store},
};

/// A pod annotation (`30s`, `5m`) after which the simulated containers exit successfully; pods
/// without it run until deleted.
pub const RUN_FOR_ANNOTATION: &str = "kubesim.joist.dev/run-for";

/// A pod annotation (`45s`, `2m`): how long the simulated containers take to exit after SIGTERM.
/// Pods without it stop at once; none outlives its grace period.
pub const SHUTDOWN_AFTER_ANNOTATION: &str = "kubesim.joist.dev/shutdown-after";

/// Timings of the simulated kubelets.
#[derive(Debug, Clone, Copy)]
pub struct KubeletSettings {
    /// From Node registration to `Ready=True`.
    pub node_ready_after: Duration,
    /// From binding (on a Ready node) to `Running`.
    pub pod_running_after: Duration,
    /// From `Ready=True` to the removal of the NodeClaim's startup taints.
    pub startup_taints_removed_after: Duration,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        Self {
            node_ready_after: Duration::from_secs(5),
            pod_running_after: Duration::from_secs(2),
            startup_taints_removed_after: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Action {
    NodeReady(String),
    StartPod(ObjectKey),
    FinishPod(ObjectKey),
    StopPod(ObjectKey),
    RemoveStartupTaints(String),
    /// The node lifecycle controller's part: a Ready node loses the not-ready taint at once.
    ClearNotReady(String),
}

/// A change a kubelet makes to an object, all of it but its metadata ([`Store::edit`]); false when
/// there is nothing to change.
type Edit = Box<dyn FnOnce(&mut Value) -> bool>;

#[derive(Default)]
struct Kubelets {
    ready_nodes: HashSet<String>,
    pods_by_node: HashMap<String, HashSet<ObjectKey>>,
    /// Pods bound to a node that is not Ready yet.
    waiting: HashMap<String, HashSet<ObjectKey>>,
    scheduled: HashSet<Action>,
    timers: BTreeMap<(Instant, u64), Action>,
    sequence: u64,
    pod_ips: u32,
    /// The (key, effect) startup taints of each launched NodeClaim, by its provider ID: a node's
    /// agent finds its own in one lookup, not in a scan of every claim.
    startup_taints: HashMap<String, Vec<(String, String)>>,
}

/// Runs the kubelets until aborted.
pub async fn run(store: Arc<Store>, settings: KubeletSettings) {
    let mut changes = store.subscribe();
    let mut nodes = Informer::new("", "nodes");
    let mut pods = Informer::new("", "pods");
    let mut claims = Informer::new("karpenter.sh", "nodeclaims");
    let mut kubelets = Kubelets::default();
    loop {
        for change in claims.changes_as(&store) {
            kubelets.observe_claim(change.kind, change.object);
        }
        for change in nodes.changes(&store) {
            kubelets.observe_node(&store, change.kind, &change.object, settings);
        }
        for change in pods.changes(&store) {
            kubelets.observe_pod(change.kind, &change.object, settings, store.clock().now_seconds());
        }
        if kubelets.fire_due(&store, WRITES_PER_TURN) {
            tokio::task::yield_now().await;
            continue;
        }
        let deadline = kubelets.timers.keys().next().map(|(at, _)| *at);
        if !wait(&mut changes, deadline).await {
            return;
        }
    }
}

impl Kubelets {
    fn schedule(&mut self, after: Duration, action: Action) {
        if self.scheduled.insert(action.clone()) {
            self.sequence += 1;
            self.timers
                .insert((Instant::now() + after, self.sequence), action);
        }
    }

    fn observe_node(&mut self, store: &Store, kind: EventKind, node: &Value, settings: KubeletSettings) {
        let name = ObjectKey::of(node).name;
        if kind == EventKind::Deleted {
            self.ready_nodes.remove(&name);
            self.waiting.remove(&name);
            let pods = GroupResource::new("", "pods");
            for pod in self.pods_by_node.remove(&name).unwrap_or_default() {
                if let Err(error) = store.delete(&pods, &pod, &DeleteOptions::immediate()) {
                    tracing::debug!(%error, pod = %pod.name, "kubesim pod gc: cannot delete");
                }
            }
            return;
        }
        self.evict_untolerated(store, &name, node);
        if conditions::status(node, "Ready") == Some("True") {
            if self.ready_nodes.insert(name.clone()) {
                for pod in self.waiting.remove(&name).unwrap_or_default() {
                    self.schedule(settings.pod_running_after, Action::StartPod(pod));
                }
            }
            let taints = node.at("/spec/taints").and_then(Value::as_array);
            if taints.is_some_and(|t| t.iter().any(|t| t["key"] == NOT_READY_TAINT)) {
                self.schedule(Duration::ZERO, Action::ClearNotReady(name.clone()));
            }
            if taints.is_some_and(|t| t.iter().any(|t| t["key"] != NOT_READY_TAINT)) {
                self.schedule(
                    settings.startup_taints_removed_after,
                    Action::RemoveStartupTaints(name),
                );
            }
        } else {
            self.ready_nodes.remove(&name);
            // A kubelet still booting has not reported yet; one that reports False or Unknown is
            // broken, and stays so until something reports it healthy again.
            let booting = conditions::status(node, "Ready").is_none();
            if booting && node.at("/metadata/deletionTimestamp").is_none() {
                self.schedule(settings.node_ready_after, Action::NodeReady(name));
            }
        }
    }

    fn observe_claim(&mut self, kind: EventKind, claim: ClaimTaints) {
        let Some(provider_id) = claim
            .status
            .and_then(|status| status.provider_id)
            .filter(|id| !id.is_empty())
        else {
            return;
        };
        let taints: Vec<(String, String)> = claim
            .spec
            .and_then(|spec| spec.startup_taints)
            .into_iter()
            .flatten()
            .filter_map(|taint| Some((taint.key?, taint.effect?)))
            .collect();
        if kind == EventKind::Deleted || taints.is_empty() {
            self.startup_taints.remove(&provider_id);
        } else {
            self.startup_taints.insert(provider_id, taints);
        }
    }

    /// The startup taints of the NodeClaim that launched `node` (matched by provider ID).
    fn startup_taints_of(&self, store: &Store, node: &str) -> Vec<(String, String)> {
        let Ok(node) = store.get(&GroupResource::new("", "nodes"), &ObjectKey::new("", node)) else {
            return Vec::new();
        };
        self.startup_taints
            .get(text(&node, "/spec/providerID"))
            .cloned()
            .unwrap_or_default()
    }

    /// The taint manager (see the module docs).
    fn evict_untolerated(&self, store: &Store, name: &str, node: &Value) {
        let taints: Vec<Taint> = parse(&node["spec"], "taints");
        if !taints.iter().any(|t| t.effect == "NoExecute") {
            return;
        }
        let Some(pods) = self.pods_by_node.get(name) else {
            return;
        };
        let resource = GroupResource::new("", "pods");
        for key in pods {
            let Ok(pod) = store.get(&resource, key) else {
                continue;
            };
            if pod.at("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let tolerations: Vec<Toleration> = parse(&pod["spec"], "tolerations");
            if untolerated(&taints, &tolerations, &["NoExecute"]).is_some()
                && let Err(error) = store.delete(&resource, key, &DeleteOptions::default())
            {
                tracing::debug!(%error, pod = %key.name, "kubesim taint manager: cannot evict");
            }
        }
    }

    fn observe_pod(&mut self, kind: EventKind, pod: &Value, settings: KubeletSettings, now_seconds: i64) {
        let key = ObjectKey::of(pod);
        let node = text(pod, "/spec/nodeName").to_owned();
        if node.is_empty() {
            return;
        }
        if kind == EventKind::Deleted {
            if let Some(pods) = self.pods_by_node.get_mut(&node) {
                pods.remove(&key);
            }
            return;
        }
        self.pods_by_node
            .entry(node.clone())
            .or_default()
            .insert(key.clone());
        if let Some(deadline) = pod.at("/metadata/deletionTimestamp").and_then(Value::as_str) {
            self.schedule(shutdown_time(pod, deadline, now_seconds), Action::StopPod(key));
            return;
        }
        let phase = pod
            .at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        match phase {
            "Pending" if self.ready_nodes.contains(&node) => {
                self.schedule(settings.pod_running_after, Action::StartPod(key))
            }
            "Pending" => {
                self.waiting.entry(node).or_default().insert(key);
            }
            "Running" => {
                let run_for = pod["metadata"]["annotations"][RUN_FOR_ANNOTATION]
                    .as_str()
                    .and_then(|text| text.parse::<joist_messages::apis::duration::Duration>().ok())
                    .map(joist_messages::apis::duration::Duration::as_std);
                if let Some(run_for) = run_for {
                    self.schedule(run_for, Action::FinishPod(key));
                }
            }
            _ => {}
        }
    }

    /// Fires at most `max` of the actions due; returns whether more are due.
    fn fire_due(&mut self, store: &Store, max: usize) -> bool {
        let now = Instant::now();
        for _ in 0..max {
            let Some(entry) = self.timers.first_entry().filter(|entry| entry.key().0 <= now) else {
                return false;
            };
            let action = entry.remove();
            self.scheduled.remove(&action);
            self.fire(store, &action);
        }
        self.timers
            .first_key_value()
            .is_some_and(|(&(at, _), _)| at <= now)
    }

    fn fire(&mut self, store: &Store, action: &Action) {
        let now = store.clock().now_rfc3339();
        let (resource, key, change): (GroupResource, ObjectKey, Edit) = match action {
            Action::NodeReady(name) => (
                GroupResource::new("", "nodes"),
                ObjectKey::new("", name),
                Box::new(move |node: &mut Value| {
                    let mut changed = conditions::set(
                        node,
                        "Ready",
                        "True",
                        "KubeletReady",
                        "kubelet is posting ready status",
                        &now,
                    );
                    for pressure in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
                        changed |= conditions::set(
                            node,
                            pressure,
                            "False",
                            &format!("KubeletHasNo{pressure}"),
                            "",
                            &now,
                        );
                    }
                    node["status"]["nodeInfo"]["kubeletVersion"] = json!("v1.35.0");
                    changed
                }),
            ),
            Action::StartPod(key) => {
                self.pod_ips += 1;
                let ip = format!(
                    "10.{}.{}.{}",
                    64 + (self.pod_ips >> 16) % 64,
                    (self.pod_ips >> 8) & 255,
                    self.pod_ips & 255
                );
                (
                    GroupResource::new("", "pods"),
                    key.clone(),
                    Box::new(move |pod: &mut Value| start(pod, &ip, &now)),
                )
            }
            Action::FinishPod(key) => (
                GroupResource::new("", "pods"),
                key.clone(),
                Box::new(move |pod: &mut Value| {
                    pod["status"]["phase"] = json!("Succeeded");
                    conditions::set(pod, "Ready", "False", "PodCompleted", "", &now);
                    conditions::set(pod, "ContainersReady", "False", "PodCompleted", "", &now);
                    true
                }),
            ),
            Action::StopPod(key) => {
                let pods = GroupResource::new("", "pods");
                if let Err(error) = store.delete(&pods, key, &DeleteOptions::immediate()) {
                    tracing::debug!(%error, pod = %key.name, "kubesim kubelet: stopped pod already gone");
                }
                return;
            }
            Action::ClearNotReady(name) => (
                GroupResource::new("", "nodes"),
                ObjectKey::new("", name),
                Box::new(|node: &mut Value| remove_taints(node, |t| t["key"] == NOT_READY_TAINT)),
            ),
            Action::RemoveStartupTaints(name) => {
                let startup = self.startup_taints_of(store, name);
                (
                    GroupResource::new("", "nodes"),
                    ObjectKey::new("", name),
                    Box::new(move |node: &mut Value| {
                        remove_taints(node, |t| {
                            startup.iter().any(|(k, e)| t["key"] == *k && t["effect"] == *e)
                        })
                    }),
                )
            }
        };
        let result = store.edit(&resource, &key, None, |metadata, object| {
            Ok(metadata.get("deletionTimestamp").is_none() && change(object))
        });
        if let Err(error) = result {
            tracing::debug!(%error, ?action, "kubesim kubelet: action skipped");
        }
    }
}

/// Removes the node's taints that `doomed` picks; false when there were none.
fn remove_taints(node: &mut Value, doomed: impl Fn(&Value) -> bool) -> bool {
    let Some(taints) = node.pointer_mut("/spec/taints").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = taints.len();
    taints.retain(|t| !doomed(t));
    taints.len() != before
}

/// How long from now a terminating pod's containers take to stop: its shutdown time, cut short by
/// its grace period's end (`deadline`, RFC 3339).
fn shutdown_time(pod: &Value, deadline: &str, now_seconds: i64) -> Duration {
    let left = joist_messages::time::parse_rfc3339(deadline).map_or(0, |d| d - now_seconds);
    let left = Duration::from_secs(u64::try_from(left).unwrap_or(0));
    pod["metadata"]["annotations"][SHUTDOWN_AFTER_ANNOTATION]
        .as_str()
        .and_then(|text| text.parse::<joist_messages::apis::duration::Duration>().ok())
        .map_or(Duration::ZERO, |d| d.as_std().min(left))
}

/// A pod's containers started: Running, Ready, with an IP.
fn start(pod: &mut Value, ip: &str, now: &str) -> bool {
    if pod.at("/status/phase").and_then(Value::as_str) != Some("Pending") {
        return false;
    }
    let containers: Vec<Value> = pod
        .at("/spec/containers")
        .and_then(Value::as_array)
        .map(|containers| {
            containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c["name"], "image": c["image"], "ready": true, "started": true, "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    pod["status"]["phase"] = json!("Running");
    pod["status"]["podIP"] = json!(ip);
    pod["status"]["podIPs"] = json!([{"ip": ip}]);
    pod["status"]["hostIP"] = json!("10.0.0.1");
    pod["status"]["startTime"] = json!(now);
    pod["status"]["containerStatuses"] = json!(containers);
    for condition in [
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodReadyToStartContainers",
    ] {
        conditions::set(pod, condition, "True", "", "", now);
    }
    true
}

/// What the kubelets read of a NodeClaim: the startup taints its node is registered with, by the
/// provider ID that names the node. Absent and null fields read as empty.
#[derive(Deserialize)]
struct ClaimTaints {
    spec: Option<ClaimTaintsSpec>,
    status: Option<ClaimTaintsStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimTaintsSpec {
    startup_taints: Option<Vec<StartupTaint>>,
}

#[derive(Deserialize)]
struct ClaimTaintsStatus {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
}

#[derive(Deserialize)]
struct StartupTaint {
    key: Option<String>,
    effect: Option<String>,
}

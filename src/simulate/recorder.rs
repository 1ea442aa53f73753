//! Watches the simulated cluster's storage and writes down, at the virtual time it happens, what a
//! user would look for: NodeClaims created, launched, registered, initialized and deleted; Nodes
//! joining and leaving and their conditions changing; NodePools' conditions changing; volumes
//! attaching and detaching; Joist's warnings; and per pod when it was created, became unschedulable
//! and ran. The summary's pending times and provisioning latency come from here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use joist_kubesim::{
    ApiError, Store, conditions,
    history::Reads,
    resources::GroupResource,
    store::{EventKind, Version, WatchCursor},
};
use joist_messages::{
    cached_pod::CachedPod,
    conditions::ConditionType,
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE},
};
use serde_json::Value;
use tokio::{task::JoinHandle, time::Instant};

use joist_actors::{decide::lifecycle::tier, effects::kube_ops::COMPONENT};

use super::report::{Entry, Recorded, label, round, text};

/// Per pod: created, first unschedulable, first running, gone (seconds since the start).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodTimes {
    /// When it was created.
    pub created: f64,
    /// When the scheduler first marked it unschedulable.
    pub unschedulable: Option<f64>,
    /// When it first ran.
    pub running: Option<f64>,
    /// When it was deleted or its containers ended (`Succeeded` or `Failed`).
    pub ended: Option<f64>,
}

#[derive(Default)]
struct Notes {
    timeline: Vec<Entry>,
    /// By `namespace/name`: looked up on every pod event, ordered once at the end.
    pods: HashMap<String, PodTimes>,
    /// The earliest pod that became unschedulable since the last NodeClaim was created.
    waiting_since: Option<f64>,
    max_pending_to_claim: Option<f64>,
    /// Disruption reasons by provider ID, while the claims carry them.
    disruption_reasons: BTreeMap<String, String>,
    /// The disruption decisions on the timeline and not rolled back, by message: each of a
    /// command's candidates carries its message, and the command is one entry however its
    /// candidates' changes interleave with other commands'.
    decided: BTreeSet<String>,
}

/// The resources the recorder follows.
#[derive(Clone, Copy)]
enum Watched {
    NodeClaims,
    Nodes,
    Pods,
    Events,
    VolumeAttachments,
    NodePools,
}

/// See the module docs.
pub struct Recorder {
    started: Instant,
    notes: Arc<Mutex<Notes>>,
    task: JoinHandle<()>,
}

fn condition_true(object: &Value, type_: ConditionType) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == type_.as_str() && c["status"] == "True")
    })
}

impl Notes {
    fn entry(&mut self, at: f64, event: &str, object: String, detail: String) {
        self.timeline.push(Entry {
            at_seconds: round(at, 3),
            event: event.to_owned(),
            object,
            detail,
        });
    }

    fn node_claim(&mut self, at: f64, kind: EventKind, object: &Value, previous: Option<&Value>) {
        let name = text(object, "/metadata/name");
        match kind {
            EventKind::Added => {
                let pool = label(object, NODEPOOL);
                self.entry(at, "nodeclaim-created", name, format!("nodepool {pool}"));
                if let Some(since) = self.waiting_since.take() {
                    let latency = round(at - since, 3);
                    self.max_pending_to_claim =
                        Some(self.max_pending_to_claim.map_or(latency, |m| m.max(latency)));
                }
            }
            EventKind::Modified => {
                let became = |type_: ConditionType| {
                    condition_true(object, type_) && !previous.is_some_and(|p| condition_true(p, type_))
                };
                if became(ConditionType::Launched) {
                    let detail = format!(
                        "{} {} in {}",
                        label(object, INSTANCE_TYPE),
                        label(object, CAPACITY_TYPE),
                        label(object, ZONE)
                    );
                    self.entry(at, "nodeclaim-launched", name.clone(), detail);
                }
                if became(ConditionType::Registered) {
                    self.entry(
                        at,
                        "nodeclaim-registered",
                        name.clone(),
                        text(object, "/status/nodeName"),
                    );
                }
                if became(ConditionType::Initialized) {
                    self.entry(
                        at,
                        "nodeclaim-initialized",
                        name.clone(),
                        text(object, "/status/nodeName"),
                    );
                }
                let deleting = |o: &Value| !o["metadata"]["deletionTimestamp"].is_null();
                let disruption = |o: &Value| {
                    o["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .find(|c| c["type"] == ConditionType::DisruptionReason.as_str())
                        .map(|c| (text(c, "/reason").to_owned(), text(c, "/message").to_owned()))
                };
                match (disruption(object), previous.and_then(disruption)) {
                    (Some((reason, message)), None) => {
                        self.disruption_reasons.insert(
                            text(object, "/status/providerID").to_owned(),
                            reason.to_lowercase(),
                        );
                        if self.decided.insert(message.clone()) {
                            self.entry(at, "disruption-decided", name.clone(), message);
                        }
                    }
                    (None, Some((_, message))) if !deleting(object) => {
                        self.disruption_reasons
                            .remove(&text(object, "/status/providerID"));
                        // The same command decided again is a new entry.
                        self.decided.remove(&message);
                        self.entry(at, "disruption-rolled-back", name.clone(), message);
                    }
                    _ => {}
                }
                if deleting(object) && !previous.is_some_and(deleting) {
                    self.entry(at, "nodeclaim-deleting", name, String::new());
                }
            }
            EventKind::Deleted => self.entry(at, "nodeclaim-deleted", name, String::new()),
        }
    }

    fn node(&mut self, at: f64, kind: EventKind, object: &Value, previous: Option<&Value>) {
        let name = text(object, "/metadata/name");
        match kind {
            EventKind::Added => self.entry(at, "node-joined", name, text(object, "/spec/providerID")),
            EventKind::Deleted => self.entry(at, "node-deleted", name, String::new()),
            EventKind::Modified => {
                for (type_, status, _) in changed_conditions(object, previous) {
                    self.entry(at, "node-condition", name.clone(), format!("{type_}={status}"));
                }
            }
        }
    }

    /// A NodePool's conditions changing status (`NodeRegistrationHealthy=False`), with why.
    fn node_pool(&mut self, at: f64, object: &Value, previous: Option<&Value>) {
        let name = format!("NodePool/{}", text(object, "/metadata/name"));
        for (type_, status, why) in changed_conditions(object, previous) {
            let detail = match why {
                "" => format!("{type_}={status}"),
                why => format!("{type_}={status}: {why}"),
            };
            self.entry(at, "nodepool-condition", name.clone(), detail);
        }
    }

    fn volume_attachment(&mut self, at: f64, kind: EventKind, attachment: &Value) {
        let event = match kind {
            EventKind::Added => "volume-attached",
            EventKind::Deleted => "volume-detached",
            EventKind::Modified => return,
        };
        let volume = text(attachment, "/spec/source/persistentVolumeName").to_owned();
        self.entry(at, event, volume, text(attachment, "/spec/nodeName").to_owned());
    }

    /// Joist's warnings, but for the scheduling failures the summary lists per pending pod, its
    /// deletions of pods to meet a `terminationGracePeriod`, and its `Balanced` approvals.
    fn event(&mut self, at: f64, event: &Value) {
        let entry = match (event["type"].as_str(), event["reason"].as_str()) {
            (_, Some("FailedScheduling")) => return,
            (_, Some("TerminationGracePeriodExpiring")) => "grace-period-expiring",
            (_, Some("ConsolidationApproved")) => "consolidation-approved",
            (Some("Warning"), _) => "warning",
            _ => return,
        };
        if event["source"]["component"] != COMPONENT {
            return;
        }
        let object = format!(
            "{}/{}",
            text(event, "/involvedObject/kind"),
            text(event, "/involvedObject/name")
        );
        let detail = format!("{}: {}", text(event, "/reason"), text(event, "/message"));
        self.entry(at, entry, object, detail);
    }

    /// Notes a change of anything but a pod ([`Notes::pod`]), with the version before it.
    fn note_change(
        &mut self,
        watched: Watched,
        at: f64,
        kind: EventKind,
        object: &Value,
        previous: Option<&Value>,
    ) {
        match watched {
            Watched::NodeClaims => self.node_claim(at, kind, object, previous),
            Watched::Nodes => self.node(at, kind, object, previous),
            Watched::Events if kind == EventKind::Added => self.event(at, object),
            Watched::VolumeAttachments => self.volume_attachment(at, kind, object),
            Watched::NodePools if kind == EventKind::Modified => self.node_pool(at, object, previous),
            Watched::Pods | Watched::Events | Watched::NodePools => {}
        }
    }

    /// Notes a pod's change; `previous` reads its version before, which is looked at only when
    /// the pod is terminating. Fails when that version does not parse.
    fn pod(
        &mut self,
        at: f64,
        kind: EventKind,
        object: &Value,
        previous: impl FnOnce() -> Result<Option<Arc<Value>>, ApiError>,
    ) -> Result<(), ApiError> {
        let key = format!(
            "{}/{}",
            text(object, "/metadata/namespace"),
            text(object, "/metadata/name")
        );
        let terminating = |o: &Value| !o["metadata"]["deletionTimestamp"].is_null();
        if kind == EventKind::Deleted {
            // Pods that shut down gracefully on a node: when their containers stopped. One
            // deleted at once from a node (a zero grace period) began and ended terminating now.
            let node = text(object, "/spec/nodeName");
            if terminating(object) {
                self.entry(at, "pod-terminated", key.clone(), node);
            } else if !node.is_empty() {
                let detail = format!("on {node} with a 0s grace period");
                self.entry(at, "pod-terminating", key.clone(), detail);
            }
            if let Some(times) = self.pods.get_mut(&key) {
                times.ended.get_or_insert(at);
            }
            return Ok(());
        }
        let newly_terminating =
            || -> Result<bool, ApiError> { Ok(!previous()?.as_deref().is_some_and(terminating)) };
        if terminating(object) && !text(object, "/spec/nodeName").is_empty() && newly_terminating()? {
            let grace = object["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0);
            // The drain tier it left in (when the node was being drained).
            let tier = serde_json::from_value::<CachedPod>(object.clone())
                .map(|pod| tier(&pod).name())
                .unwrap_or("unknown");
            let detail = format!(
                "on {} with a {grace}s grace period, drain tier {tier}",
                text(object, "/spec/nodeName")
            );
            self.entry(at, "pod-terminating", key.clone(), detail);
        }
        let unschedulable = object["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable"
            })
        });
        let phase = &object["status"]["phase"];
        let running = phase == "Running";
        let finished = phase == "Succeeded" || phase == "Failed";
        let times = self.pods.entry(key).or_insert(PodTimes {
            created: at,
            ..PodTimes::default()
        });
        let mut newly_unschedulable = false;
        if unschedulable && times.unschedulable.is_none() {
            times.unschedulable = Some(at);
            newly_unschedulable = true;
        }
        if running && times.running.is_none() {
            times.running = Some(at);
        }
        if finished {
            times.ended.get_or_insert(at);
        }
        if newly_unschedulable {
            self.waiting_since.get_or_insert(at);
        }
        Ok(())
    }
}

/// The conditions of `object` whose status differs from `previous`'s (type, status, and
/// `reason: message` when not True). One appearing for the first time is its controller's first
/// report, not news.
fn changed_conditions<'a>(
    object: &'a Value,
    previous: Option<&'a Value>,
) -> impl Iterator<Item = (&'a str, &'a str, &'a str)> {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(move |condition| {
            let field = |name: &str| condition[name].as_str().unwrap_or_default();
            let (type_, status) = (field("type"), field("status"));
            let before = conditions::status(previous?, type_)?;
            let why = if status == "True" { "" } else { field("message") };
            (before != status).then_some((type_, status, why))
        })
}

impl Recorder {
    /// Starts recording `store`; times count from `started`.
    pub fn start(store: Arc<Store>, started: Instant) -> Self {
        let notes = Arc::new(Mutex::new(Notes::default()));
        let shared = notes.clone();
        let task = tokio::spawn(async move {
            let mut cursors: Vec<(Watched, GroupResource, WatchCursor)> = [
                (
                    Watched::NodeClaims,
                    GroupResource::new("karpenter.sh", "nodeclaims"),
                ),
                (Watched::Nodes, GroupResource::new("", "nodes")),
                (Watched::Pods, GroupResource::new("", "pods")),
                (Watched::Events, GroupResource::new("", "events")),
                (
                    Watched::VolumeAttachments,
                    GroupResource::new("storage.k8s.io", "volumeattachments"),
                ),
                (
                    Watched::NodePools,
                    GroupResource::new("karpenter.sh", "nodepools"),
                ),
            ]
            .into_iter()
            .filter_map(|(watched, resource)| {
                let cursor = store.watch(&resource, None, Reads::Objects).ok()?;
                Some((watched, resource, cursor))
            })
            .collect();
            let mut changes = store.subscribe();
            while changes.changed().await.is_ok() {
                let at = started.elapsed().as_secs_f64();
                for (watched, resource, cursor) in &mut cursors {
                    let events = match store.poll(cursor, usize::MAX) {
                        Ok(events) => events,
                        Err(gone) => {
                            // What left the history is lost: say so in the report, follow on.
                            lock(&shared).entry(
                                at,
                                "recorder-behind",
                                resource.qualified(),
                                format!("{gone}: the figures that rest on these objects are incomplete"),
                            );
                            if let Ok(fresh) = store.watch(resource, None, Reads::Objects) {
                                *cursor = fresh;
                            }
                            continue;
                        }
                    };
                    let mut notes = lock(&shared);
                    // What the notes read of a NodeClaim is its metadata and status.
                    let read = match watched {
                        Watched::NodeClaims => Version::value_but_spec,
                        _ => Version::value,
                    };
                    for event in events {
                        let read_previous = || event.previous.as_ref().map(read).transpose();
                        let noted = read(&event.object).and_then(|object| {
                            if let Watched::Pods = watched {
                                // A pod's version before is read only when it matters: most are
                                // kept as JSON alone (see `Store::edit`).
                                return notes.pod(at, event.kind, &object, read_previous);
                            }
                            let previous = read_previous()?;
                            notes.note_change(*watched, at, event.kind, &object, previous.as_deref());
                            Ok(())
                        });
                        if noted.is_err() {
                            notes.entry(
                                at,
                                "recorder-behind",
                                resource.qualified(),
                                "a version kubesim kept does not parse: the figures that rest on it are incomplete"
                                    .to_owned(),
                            );
                        }
                    }
                }
            }
        });
        Self { started, notes, task }
    }

    /// Adds an entry for something the driver did.
    pub fn note(&self, event: &str, object: String, detail: String) {
        self.note_at(self.started.elapsed().as_secs_f64(), event, object, detail);
    }

    /// Adds an entry for something that happened `at` seconds into the run.
    pub fn note_at(&self, at: f64, event: &str, object: String, detail: String) {
        lock(&self.notes).entry(at, event, object, detail);
    }

    /// Stops recording and hands over what it saw.
    pub fn finish(self) -> Recorded {
        self.task.abort();
        let mut notes = lock(&self.notes);
        Recorded {
            timeline: std::mem::take(&mut notes.timeline),
            pods: std::mem::take(&mut notes.pods).into_iter().collect(),
            max_pending_to_claim: notes.max_pending_to_claim,
            disruption_reasons: std::mem::take(&mut notes.disruption_reasons),
        }
    }
}

fn lock(notes: &Mutex<Notes>) -> MutexGuard<'_, Notes> {
    notes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

//! The JSON report of a run (schema in docs/simulator.md): the scenario, a summary of what a user checks
//! (nodes launched and terminated, the nodes left with their prices, pods pending and running,
//! the longest a pod waited, cost), every instance launched with how and why it ended, the
//! counts of nodes and pods and the cost per hour over time, and the timeline of node lifecycle
//! events, steps and cloud events in virtual seconds. Every list is ordered and every figure
//! rounded, so one seed gives one report, byte for byte.

use std::collections::BTreeMap;

use joist_kubesim::{Store, resources::GroupResource};
use joist_messages::labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE, aws};
use joist_provider_sim::{CloudEvent, EndReason, InstanceRecord, SimCloud};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::recorder::PodTimes;

/// One timeline entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Seconds after the start.
    pub at_seconds: f64,
    /// What happened (`nodeclaim-created`, `instance-launched`, `step` …).
    pub event: String,
    /// What it happened to.
    pub object: String,
    /// Details.
    pub detail: String,
}

/// A node at the end of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalNode {
    /// Node name.
    pub name: String,
    /// `karpenter.sh/nodepool`.
    pub nodepool: String,
    /// Instance type.
    pub instance_type: String,
    /// Spot, on-demand or reserved.
    pub capacity_type: String,
    /// The capacity reservation it runs in (`karpenter.k8s.aws/capacity-reservation-id`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub capacity_reservation_id: String,
    /// Zone.
    pub zone: String,
    /// The placement group it runs in (`karpenter.k8s.aws/placement-group-id`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub placement_group_id: String,
    /// Its partition of that group (`karpenter.k8s.aws/placement-group-partition`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub placement_group_partition: String,
    /// Dollars per hour.
    pub price_per_hour: f64,
    /// Why it stays, as the disruption pass judges it at the end (`joist explain node`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stays: String,
}

/// A pod still pending at the end, and the last reason Joist gave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingPod {
    /// `namespace/name`.
    pub pod: String,
    /// The last `FailedScheduling` message from Joist, if any.
    pub reason: String,
}

/// The summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Instances launched.
    pub nodes_launched: usize,
    /// Instances that ended, by reason.
    pub nodes_terminated: BTreeMap<String, usize>,
    /// Nodes at the end.
    pub final_nodes: Vec<FinalNode>,
    /// Pods pending at the end.
    pub pods_pending_end: usize,
    /// Pods running at the end.
    pub pods_running_end: usize,
    /// The longest any pod waited from creation to running (or to the end).
    pub max_pod_pending_seconds: f64,
    /// The longest a pod created after the first interruption warning waited from creation to
    /// running (or to the end): how long the interrupted nodes' evicted pods went without a
    /// place. None without interruptions.
    pub max_pod_pending_after_interruption_seconds: Option<f64>,
    /// The longest from a pod becoming unschedulable to the NodeClaim created for it.
    pub max_pending_to_nodeclaim_seconds: Option<f64>,
    /// Pods pending at the end, with why.
    pub pending_pods: Vec<PendingPod>,
    /// Dollars per hour of the instances running at the end.
    pub cost_per_hour_end: f64,
    /// Dollars spent over the run.
    pub cost_total: f64,
    /// The CapacityBuffers at the end, with their status.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capacity_buffers: Vec<FinalBuffer>,
}

/// A CapacityBuffer at the end, as its status shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalBuffer {
    /// `namespace/name`.
    pub buffer: String,
    /// `status.replicas`: the pods room is kept for.
    pub replicas: Option<i64>,
    /// Each condition as `Type=Status (Reason)`.
    pub conditions: Vec<String>,
}

/// An instance the simulated cloud launched, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch {
    /// The Node it registered as.
    pub node: String,
    /// `karpenter.sh/nodepool`.
    pub nodepool: String,
    /// Instance type.
    pub instance_type: String,
    /// Spot or on-demand.
    pub capacity_type: String,
    /// Zone.
    pub zone: String,
    /// Dollars per hour.
    pub price_per_hour: f64,
    /// Seconds after the start it launched.
    pub launched_at_seconds: f64,
    /// Seconds after the start it ended, if it did.
    pub ended_at_seconds: Option<f64>,
    /// Why it ended: Karpenter's disruption reason (`empty`, `underutilized`, `drifted` …),
    /// `interrupted`, or `terminated` when nothing disrupted it (its NodeClaim was deleted).
    pub end_reason: Option<String>,
}

impl Launch {
    /// Dollars it cost from its launch to its end, or to `end` when it still runs.
    pub fn cost_until(&self, end: f64) -> f64 {
        self.price_per_hour * (self.ended_at_seconds.unwrap_or(end) - self.launched_at_seconds) / 3600.0
    }
}

/// The cluster at one moment; the series holds a sample where anything changed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds after the start.
    pub at_seconds: f64,
    /// Instances running.
    pub nodes: usize,
    /// Pods running.
    pub pods_running: usize,
    /// Pods waiting to run.
    pub pods_pending: usize,
    /// Dollars per hour of the instances running.
    pub cost_per_hour: f64,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The seed used.
    pub seed: u64,
    /// Seconds simulated.
    pub duration_seconds: f64,
    /// The summary.
    pub summary: Summary,
    /// Every instance launched, in launch order.
    pub instances: Vec<Launch>,
    /// Nodes, pods and cost over time.
    pub series: Vec<Sample>,
    /// What happened, in order.
    pub timeline: Vec<Entry>,
}

impl Report {
    /// Notes why each node at the end stays, from `stays` by Node name.
    pub fn note_standings(&mut self, stays: &BTreeMap<String, String>) {
        for node in &mut self.summary.final_nodes {
            if let Some(why) = stays.get(&node.name) {
                node.stays.clone_from(why);
            }
        }
    }

    /// Why the Node `name` stays at the end, when the report says.
    pub fn stays(&self, name: &str) -> Option<&str> {
        (self.summary.final_nodes.iter())
            .find(|n| n.name == name && !n.stays.is_empty())
            .map(|n| n.stays.as_str())
    }
}

/// `value` rounded to `places` decimals, so reports print the same figures on every run.
pub(super) fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

/// `seconds` as `4m05s`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    format!("{}m{:02}s", s / 60, s % 60)
}

/// The string at `pointer` in `object`, empty when absent.
pub(super) fn text(object: &Value, pointer: &str) -> String {
    joist_kubesim::object::text(object, pointer).to_owned()
}

/// The value of label `key` on `object`, empty when absent.
pub(super) fn label(object: &Value, key: &str) -> String {
    text(object, &format!("/metadata/labels/{}", key.replace('/', "~1")))
}

/// Every pod's name and phase, read without the rest of the pod.
pub(super) fn pod_phases(store: &Store) -> Vec<PodPhase> {
    store.list_as(&GroupResource::new("", "pods"))
}

/// What the report reads of a pod: its name and phase, and nothing it would parse for no use.
#[derive(Deserialize)]
pub(super) struct PodPhase {
    metadata: Named,
    #[serde(default)]
    status: Phase,
}

#[derive(Deserialize, Default)]
struct Phase {
    #[serde(default)]
    phase: String,
}

impl PodPhase {
    /// `status.phase`, empty when absent.
    pub(super) fn phase(&self) -> &str {
        &self.status.phase
    }
}

/// A namespaced object's name and its `resourceVersion`.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Named {
    namespace: String,
    name: String,
    resource_version: String,
}

impl Named {
    /// `namespace/name`.
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What the report reads of an Event: who reported what about which object, and when.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventReason {
    metadata: Named,
    #[serde(default)]
    involved_object: Named,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    source: EventSource,
}

#[derive(Deserialize, Default)]
struct EventSource {
    #[serde(default)]
    component: String,
}

/// What the recorder saw.
pub struct Recorded {
    /// Timeline entries.
    pub timeline: Vec<Entry>,
    /// Pod times.
    pub pods: BTreeMap<String, PodTimes>,
    /// Worst unschedulable → NodeClaim latency.
    pub max_pending_to_claim: Option<f64>,
    /// Karpenter's disruption reason (lower case), by the provider ID of the node it removed.
    pub disruption_reasons: BTreeMap<String, String>,
}

/// Builds the report at the end of a run lasting `end` seconds.
pub fn build(name: &str, seed: u64, end: f64, store: &Store, cloud: &SimCloud, recorded: Recorded) -> Report {
    let instances = cloud.books().instances();
    let launches: Vec<Launch> = instances
        .iter()
        .map(|record| launch(record, &recorded.disruption_reasons))
        .collect();
    let mut nodes_terminated = BTreeMap::new();
    let mut cost_total = 0.0;
    let mut cost_per_hour_end = 0.0;
    for launch in &launches {
        cost_total += launch.cost_until(end);
        match &launch.end_reason {
            Some(reason) => *nodes_terminated.entry(reason.clone()).or_insert(0) += 1,
            None => cost_per_hour_end += launch.price_per_hour,
        }
    }
    let series = series(&launches, &recorded.pods, end);
    let price_of = |provider_id: &str| {
        instances
            .iter()
            .find(|r| r.instance.provider_id == provider_id)
            .map_or(0.0, |r| r.instance.price)
    };
    // Only what the report keeps is held: kubesim parses each object as the list reads it.
    let list = |group: &str, resource: &str, keep: &dyn Fn(&Value) -> bool| {
        store
            .list(&GroupResource::new(group, resource), None, None, None, keep)
            .items
    };
    let final_nodes = list("", "nodes", &|_| true)
        .iter()
        .map(|node| FinalNode {
            name: text(node, "/metadata/name"),
            nodepool: label(node, NODEPOOL),
            instance_type: label(node, INSTANCE_TYPE),
            capacity_type: label(node, CAPACITY_TYPE),
            capacity_reservation_id: label(node, aws::CAPACITY_RESERVATION_ID),
            zone: label(node, ZONE),
            placement_group_id: label(node, aws::PLACEMENT_GROUP_ID),
            placement_group_partition: label(node, aws::PLACEMENT_GROUP_PARTITION),
            price_per_hour: price_of(&text(node, "/spec/providerID")),
            stays: String::new(),
        })
        .collect();
    let pods = pod_phases(store);
    // Joist's latest FailedScheduling message per pod, from one pass over the events.
    let mut reasons: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let events: Vec<EventReason> = store.list_as(&GroupResource::new("", "events"));
    for event in events {
        if event.reason != "FailedScheduling" || event.source.component != "joist" {
            continue;
        }
        let pod = event.involved_object.key();
        let revision = event.metadata.resource_version.parse::<u64>().unwrap_or(0);
        if reasons.get(&pod).is_none_or(|(seen, _)| *seen < revision) {
            reasons.insert(pod, (revision, event.message));
        }
    }
    let pending_pods: Vec<PendingPod> = pods
        .iter()
        .filter(|pod| pod.phase() == "Pending")
        .map(|pod| {
            let pod = pod.metadata.key();
            let reason = reasons
                .remove(&pod)
                .map(|(_, message)| message)
                .unwrap_or_default();
            PendingPod { pod, reason }
        })
        .collect();
    let max_pod_pending_seconds = recorded
        .pods
        .values()
        .map(|t| t.running.unwrap_or(end) - t.created)
        .fold(0.0, f64::max);
    let mut timeline = recorded.timeline;
    timeline.extend(
        cloud
            .books()
            .events()
            .into_iter()
            .map(|(at, event)| cloud_entry(at, event)),
    );
    timeline.sort_by(|a, b| a.at_seconds.total_cmp(&b.at_seconds));
    let first_warning = timeline
        .iter()
        .find(|e| e.event == "interruption-warning")
        .map(|e| e.at_seconds);
    let max_pod_pending_after_interruption_seconds = first_warning.map(|warned| {
        let waits = recorded.pods.values().filter(|t| t.created >= warned);
        round(
            waits
                .map(|t| t.running.unwrap_or(end) - t.created)
                .fold(0.0, f64::max),
            3,
        )
    });
    Report {
        scenario: name.to_owned(),
        seed,
        duration_seconds: round(end, 3),
        summary: Summary {
            nodes_launched: instances.len(),
            nodes_terminated,
            final_nodes,
            pods_pending_end: pending_pods.len(),
            pods_running_end: pods.iter().filter(|pod| pod.phase() == "Running").count(),
            max_pod_pending_seconds: round(max_pod_pending_seconds, 3),
            max_pod_pending_after_interruption_seconds,
            max_pending_to_nodeclaim_seconds: recorded.max_pending_to_claim,
            pending_pods,
            cost_per_hour_end: round(cost_per_hour_end, 4),
            cost_total: round(cost_total, 4),
            capacity_buffers: list("autoscaling.x-k8s.io", "capacitybuffers", &|_| true)
                .iter()
                .map(|buffer| final_buffer(buffer))
                .collect(),
        },
        instances: launches,
        series,
        timeline,
    }
}

fn final_buffer(buffer: &Value) -> FinalBuffer {
    let status = &buffer["status"];
    FinalBuffer {
        buffer: format!(
            "{}/{}",
            buffer["metadata"]["namespace"].as_str().unwrap_or_default(),
            buffer["metadata"]["name"].as_str().unwrap_or_default()
        ),
        replicas: status["replicas"].as_i64(),
        conditions: status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let field = |name: &str| c[name].as_str().unwrap_or_default().to_owned();
                format!("{}={} ({})", field("type"), field("status"), field("reason"))
            })
            .collect(),
    }
}

fn launch(record: &InstanceRecord, disruption_reasons: &BTreeMap<String, String>) -> Launch {
    let instance = &record.instance;
    let end_reason = record.end_reason.map(|reason| {
        let disrupted = disruption_reasons.get(&instance.provider_id);
        match (reason, disrupted) {
            (EndReason::Terminated, Some(reason)) => reason.clone(),
            (EndReason::Terminated, None) => "terminated".to_owned(),
            (EndReason::SpotInterruption, _) => "interrupted".to_owned(),
        }
    });
    Launch {
        node: record.node_name.clone(),
        nodepool: instance.tags.get(NODEPOOL).cloned().unwrap_or_default(),
        instance_type: instance.instance_type.clone(),
        capacity_type: instance.capacity_type.to_string(),
        zone: instance.zone.clone(),
        price_per_hour: instance.price,
        launched_at_seconds: round(record.launched, 3),
        ended_at_seconds: record.ended.map(|ended| round(ended, 3)),
        end_reason,
    }
}

/// How many samples at most the series holds over a run: enough for a chart, few enough for a
/// run of 100,000 pods.
const SERIES_POINTS: f64 = 400.0;

/// Nodes, pods and cost on a grid of at most [`SERIES_POINTS`] moments from the start to `end`,
/// keeping only the moments where something changed (and the last).
fn series(launches: &[Launch], pods: &BTreeMap<String, PodTimes>, end: f64) -> Vec<Sample> {
    // (time, nodes, running, pending, cost) deltas, swept in time order.
    let mut changes: Vec<(f64, i64, i64, i64, f64)> = Vec::with_capacity(2 * launches.len() + 3 * pods.len());
    for launch in launches {
        changes.push((launch.launched_at_seconds, 1, 0, 0, launch.price_per_hour));
        if let Some(ended) = launch.ended_at_seconds {
            changes.push((ended, -1, 0, 0, -launch.price_per_hour));
        }
    }
    for times in pods.values() {
        changes.push((times.created, 0, 0, 1, 0.0));
        match (times.running, times.ended) {
            (Some(running), ended) if ended.is_none_or(|ended| running <= ended) => {
                changes.push((running, 0, 1, -1, 0.0));
                changes.extend(ended.map(|ended| (ended, 0, -1, 0, 0.0)));
            }
            (_, ended) => changes.extend(ended.map(|ended| (ended, 0, 0, -1, 0.0))),
        }
    }
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let step = (end / SERIES_POINTS).max(1.0);
    let mut samples: Vec<Sample> = Vec::new();
    let (mut nodes, mut running, mut pending, mut cost) = (0i64, 0i64, 0i64, 0.0);
    let mut next = changes.iter().peekable();
    let mut at = 0.0;
    loop {
        while let Some((_, n, r, p, c)) = next.next_if(|change| change.0 <= at) {
            nodes += n;
            running += r;
            pending += p;
            cost += c;
        }
        let sample = Sample {
            at_seconds: round(at, 3),
            nodes: usize::try_from(nodes).unwrap_or_default(),
            pods_running: usize::try_from(running).unwrap_or_default(),
            pods_pending: usize::try_from(pending).unwrap_or_default(),
            cost_per_hour: round(cost, 4),
        };
        let changed = samples.last().is_none_or(|last| {
            (
                last.nodes,
                last.pods_running,
                last.pods_pending,
                last.cost_per_hour,
            ) != (
                sample.nodes,
                sample.pods_running,
                sample.pods_pending,
                sample.cost_per_hour,
            )
        });
        if changed || at >= end {
            samples.push(sample);
        }
        if at >= end {
            return samples;
        }
        at = (at + step).min(end);
    }
}

fn cloud_entry(at: f64, event: CloudEvent) -> Entry {
    let (event, object, detail) = match event {
        CloudEvent::Launched {
            instance,
            offering,
            price,
        } => ("instance-launched", instance, format!("{offering} at ${price}/h")),
        CloudEvent::InsufficientCapacity { offering } => {
            ("insufficient-capacity", offering.to_string(), String::new())
        }
        CloudEvent::InterruptionWarning { instance } => ("interruption-warning", instance, String::new()),
        CloudEvent::Impaired { instance, check } => ("instance-impaired", instance, check),
        CloudEvent::Ended { instance, reason } => ("instance-ended", instance, format!("{reason:?}")),
        CloudEvent::ImageReleased { family, image } => ("image-released", family, image),
    };
    Entry {
        at_seconds: round(at, 3),
        event: event.to_owned(),
        object,
        detail,
    }
}

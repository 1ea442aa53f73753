//! kube-scheduler, written independently of Joist's scheduling simulation (DESIGN.md §2): a pod that
//! fits a node is bound to it; one that fits none is marked `PodScheduled=False`, reason
//! `Unschedulable`, with kube-scheduler's message ("0/3 nodes are available: 3 Insufficient cpu.")
//! and a `FailedScheduling` event. That condition is what Joist reacts to.
//!
//! Filters: node readiness and `spec.unschedulable`, resource requests (cpu, memory, pods and any
//! other allocatable), nodeSelector, required node affinity, taints and tolerations, host ports,
//! `DoNotSchedule` topology spread, and required pod affinity and anti-affinity of the incoming pod.
//! Among the nodes that pass, the least allocated wins. Unschedulable pods are retried when nodes or
//! bound pods change, and every `retry` otherwise; as in kube-scheduler, a pod that failed waits out
//! its backoff first (1 s, doubling with each failed attempt, at most 10 s), so a cluster that
//! changes often does not retry every pending pod on every change. The queue is worked in chunks,
//! yielding between them, so watchers keep up with a burst of thousands of pods.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;

use joist_messages::model::{quantity::Quantity, resources::Resources};
use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm, Taint, Toleration,
    TopologySpreadConstraint,
};
use serde_json::{Value, json};

use super::{Change, Informer, wait};
use crate::object::text;
use crate::{
    api::bind,
    conditions, events,
    object::labels,
    resources::GroupResource,
    selector::label_selector_matches,
    store::{EventKind, ObjectKey, Part, Store},
};

/// Feasible nodes the scheduler compares before it stops looking (kube-scheduler samples nodes the
/// same way on large clusters).
const FEASIBLE_NODES_TO_SCORE: usize = 100;

/// kube-scheduler's backoff after a pod's first failed attempt, and its cap.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Pods scheduled (or found unschedulable) before the scheduler yields to the rest of the cluster.
const PODS_PER_CHUNK: usize = 1_000;

/// What the scheduler knows about a node.
struct NodeInfo {
    name: String,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    schedulable: bool,
    ready: bool,
    allocatable: Resources,
    requested: Resources,
    pods: i64,
    ports: HashSet<(String, i64)>,
}

/// What a pod asks of a node.
struct PodNeeds {
    requests: Resources,
    ports: Vec<(String, i64)>,
    node_selector: BTreeMap<String, String>,
    affinity: Affinity,
    tolerations: Vec<Toleration>,
    spread: Vec<TopologySpreadConstraint>,
}

/// A bound pod, as the scheduler accounts for it.
struct Bound {
    node: String,
    requests: Resources,
    ports: Vec<(String, i64)>,
    labels: BTreeMap<String, String>,
    namespace: String,
}

#[derive(Default)]
struct Scheduler {
    nodes: BTreeMap<String, NodeInfo>,
    bound: HashMap<ObjectKey, Bound>,
    /// Bound pods by namespace and each of their labels (`namespace`, key, value), so that an
    /// affinity term naming a label finds its pods without looking at every bound pod.
    by_label: HashMap<(String, String, String), HashSet<ObjectKey>>,
    active: VecDeque<ObjectKey>,
    queued: HashSet<ObjectKey>,
    unschedulable: BTreeSet<ObjectKey>,
    /// Failed attempts per pending pod, and when its backoff ends.
    attempts: HashMap<ObjectKey, (u32, Instant)>,
    /// Unschedulable pods whose place depends on other pods (required pod affinity or
    /// anti-affinity, topology spread): a pod being bound may let them in.
    placed_by_pods: BTreeSet<ObjectKey>,
    /// Whether a pod was bound since `placed_by_pods` was last released.
    pods_bound: bool,
    /// Pods a change released from `unschedulable` while still backing off, by when it ends.
    backing_off: BTreeSet<(Instant, ObjectKey)>,
    /// The node the last search stopped at.
    next_start: String,
}

/// Runs the scheduler until aborted.
pub async fn run(store: Arc<Store>, retry: Duration) {
    let mut changes = store.subscribe();
    let mut pods = Informer::new("", "pods");
    let mut nodes = Informer::new("", "nodes");
    let mut scheduler = Scheduler::default();
    let mut next_retry = Instant::now() + retry;
    loop {
        let node_changes = nodes.changes(&store);
        let pod_changes = pods.changes(&store);
        let mut cluster_changed = !node_changes.is_empty();
        for change in &node_changes {
            scheduler.observe_node(change);
        }
        for change in &pod_changes {
            cluster_changed |= scheduler.observe_pod(change);
        }
        let now = Instant::now();
        let pods_bound = std::mem::take(&mut scheduler.pods_bound);
        if cluster_changed || now >= next_retry {
            scheduler.retry_unschedulable(now);
            next_retry = now + retry;
        } else if pods_bound {
            scheduler.retry_placed_by_pods(now);
        }
        scheduler.end_backoffs(now);
        if scheduler.schedule_queue(&store, PODS_PER_CHUNK) {
            tokio::task::yield_now().await;
            continue;
        }
        let wake = scheduler
            .next_backoff_end()
            .map_or(next_retry, |end| end.min(next_retry));
        if !wait(&mut changes, Some(wake)).await {
            return;
        }
    }
}

impl Scheduler {
    fn observe_node(&mut self, change: &Change) {
        let name = change.key().name;
        if change.kind == EventKind::Deleted {
            self.nodes.remove(&name);
            return;
        }
        let previous = self.nodes.get(&name);
        let mut info = NodeInfo::of(&change.object);
        if let Some(previous) = previous {
            info.requested = previous.requested.clone();
            info.pods = previous.pods;
            info.ports = previous.ports.clone();
        }
        self.nodes.insert(name, info);
    }

    /// Accounts for a pod change; returns whether it freed room (so unschedulable pods may fit).
    fn observe_pod(&mut self, change: &Change) -> bool {
        let key = change.key();
        let pod = &change.object;
        let node = text(pod, "/spec/nodeName");
        let finished = matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        if change.kind == EventKind::Deleted || finished {
            self.queued.remove(&key);
            self.forget_failures(&key);
            return self.unbind(&key);
        }
        if !node.is_empty() {
            self.forget_failures(&key);
            if !self.bound.contains_key(&key) {
                let needs = PodNeeds::of(pod);
                self.account(key, node, &needs, pod);
            }
            return false;
        }
        let ours = pod
            .pointer("/spec/schedulerName")
            .and_then(Value::as_str)
            .is_none_or(|s| s == "default-scheduler");
        let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
        // A pod that failed waits for a change or its backoff, not for its own updates.
        let failed_before = self.attempts.contains_key(&key);
        if ours && !deleting && !failed_before && self.queued.insert(key.clone()) {
            self.active.push_back(key);
        }
        false
    }

    /// A pod that failed: it waits in `unschedulable` for a change, its backoff doubled.
    fn failed(&mut self, key: ObjectKey, needs: &PodNeeds, now: Instant) {
        if needs.depends_on_pods() {
            self.placed_by_pods.insert(key.clone());
        }
        let attempts = self.attempts.get(&key).map_or(1, |(count, _)| count + 1);
        let backoff = INITIAL_BACKOFF
            .saturating_mul(1 << attempts.saturating_sub(1).min(8))
            .min(MAX_BACKOFF);
        self.attempts.insert(key.clone(), (attempts, now + backoff));
        self.unschedulable.insert(key);
    }

    /// A pod bound, finished or gone: its failures no longer count.
    fn forget_failures(&mut self, key: &ObjectKey) {
        self.unschedulable.remove(key);
        self.placed_by_pods.remove(key);
        if let Some((_, end)) = self.attempts.remove(key) {
            self.backing_off.remove(&(end, key.clone()));
        }
    }

    fn enqueue(&mut self, key: ObjectKey) {
        if self.queued.insert(key.clone()) {
            self.active.push_back(key);
        }
    }

    fn account(&mut self, key: ObjectKey, node: &str, needs: &PodNeeds, pod: &Value) {
        self.pods_bound = true;
        if let Some(info) = self.nodes.get_mut(node) {
            info.requested.add(&needs.requests);
            info.pods += 1;
            info.ports.extend(needs.ports.iter().cloned());
        }
        let bound = Bound {
            node: node.to_owned(),
            requests: needs.requests.clone(),
            ports: needs.ports.clone(),
            labels: labels(pod),
            namespace: key.namespace.clone(),
        };
        for (label, value) in &bound.labels {
            let entry = (bound.namespace.clone(), label.clone(), value.clone());
            self.by_label.entry(entry).or_default().insert(key.clone());
        }
        if let Some(replaced) = self.bound.insert(key.clone(), bound) {
            self.unindex(&key, &replaced);
        }
    }

    /// Takes `key`'s `bound` labels out of the label index.
    fn unindex(&mut self, key: &ObjectKey, bound: &Bound) {
        for (label, value) in &bound.labels {
            let entry = (bound.namespace.clone(), label.clone(), value.clone());
            if let Some(pods) = self.by_label.get_mut(&entry) {
                pods.remove(key);
                if pods.is_empty() {
                    self.by_label.remove(&entry);
                }
            }
        }
    }

    fn unbind(&mut self, key: &ObjectKey) -> bool {
        let Some(bound) = self.bound.remove(key) else {
            return false;
        };
        self.unindex(key, &bound);
        if let Some(info) = self.nodes.get_mut(&bound.node) {
            info.requested.sub(&bound.requests);
            info.pods -= 1;
            for port in &bound.ports {
                info.ports.remove(port);
            }
        }
        true
    }

    /// Releases every unschedulable pod: to the queue when its backoff is over, else to wait it out.
    fn retry_unschedulable(&mut self, now: Instant) {
        self.placed_by_pods.clear();
        for key in std::mem::take(&mut self.unschedulable) {
            self.release(key, now);
        }
    }

    /// Releases the unschedulable pods a newly bound pod may let in.
    fn retry_placed_by_pods(&mut self, now: Instant) {
        for key in std::mem::take(&mut self.placed_by_pods) {
            if self.unschedulable.remove(&key) {
                self.release(key, now);
            }
        }
    }

    fn release(&mut self, key: ObjectKey, now: Instant) {
        match self.attempts.get(&key) {
            Some(&(_, end)) if end > now => {
                self.backing_off.insert((end, key));
            }
            _ => self.enqueue(key),
        }
    }

    /// Queues the released pods whose backoff is over.
    fn end_backoffs(&mut self, now: Instant) {
        while let Some(first) = self.backing_off.first() {
            if first.0 > now {
                break;
            }
            if let Some((_, key)) = self.backing_off.pop_first() {
                self.enqueue(key);
            }
        }
    }

    fn next_backoff_end(&self) -> Option<Instant> {
        self.backing_off.first().map(|(end, _)| *end)
    }

    /// Tries at most `chunk` queued pods; returns whether more are queued.
    fn schedule_queue(&mut self, store: &Store, chunk: usize) -> bool {
        let pods = GroupResource::new("", "pods");
        let now = Instant::now();
        for _ in 0..chunk {
            let Some(key) = self.active.pop_front() else {
                return false;
            };
            self.queued.remove(&key);
            let Ok(pod) = store.get(&pods, &key) else { continue };
            if pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
            {
                continue;
            }
            let needs = PodNeeds::of(&pod);
            match self.choose(&pod, &needs) {
                Ok(node) => match bind(store, &key, &node, false) {
                    Ok(()) => self.account(key, &node, &needs, &pod),
                    Err(error) => tracing::debug!(%error, pod = %key.name, "kubesim scheduler: bind failed"),
                },
                Err(message) => {
                    mark_unschedulable(store, &key, &pod, &message);
                    self.failed(key, &needs, now);
                }
            }
        }
        !self.active.is_empty()
    }

    /// The best feasible node, or kube-scheduler's message saying why there is none.
    fn choose(&mut self, pod: &Value, needs: &PodNeeds) -> Result<String, String> {
        if self.nodes.is_empty() {
            return Err("no nodes available to schedule pods".to_owned());
        }
        let namespace = pod
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let spread = self.spread_counts(namespace, needs);
        let affinity = self.affinity_domains(namespace, &labels(pod), needs);
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let count = self.nodes.len();
        // Start after the node the previous pod stopped at, as kube-scheduler does, so the sample of
        // feasible nodes moves around the cluster.
        let resume = std::mem::take(&mut self.next_start);
        let after = self
            .nodes
            .range::<String, _>((std::ops::Bound::Excluded(&resume), std::ops::Bound::Unbounded));
        let before = self.nodes.range::<String, _>(..=&resume);
        let mut best: Option<(f64, &str)> = None;
        let mut feasible = 0;
        let mut last = resume.clone();
        for (name, node) in after.chain(before) {
            last.clone_from(name);
            match filter(node, needs, &spread, &affinity) {
                Ok(()) => {
                    feasible += 1;
                    let score = node.score(&needs.requests);
                    if best.is_none_or(|(s, name)| score < s || (score == s && node.name.as_str() < name)) {
                        best = Some((score, &node.name));
                    }
                    if feasible == FEASIBLE_NODES_TO_SCORE {
                        break;
                    }
                }
                Err(reason) => *reasons.entry(reason).or_default() += 1,
            }
        }
        let best = best.map(|(_, name)| name.to_owned());
        self.next_start = last;
        best.ok_or_else(|| unschedulable_message(count, &reasons))
    }

    /// For each required pod (anti-)affinity term of the incoming pod, the domains holding pods it selects.
    fn affinity_domains(
        &self,
        namespace: &str,
        own_labels: &BTreeMap<String, String>,
        needs: &PodNeeds,
    ) -> Vec<AffinityDomains> {
        needs
            .required_pod_terms()
            .map(|(term, anti)| {
                let mut domains = HashSet::new();
                let mut matched_anywhere = false;
                for bound in self.selected(term, namespace) {
                    matched_anywhere = true;
                    if let Some(domain) = self
                        .nodes
                        .get(&bound.node)
                        .and_then(|n| n.labels.get(&term.topology_key))
                    {
                        domains.insert(domain.clone());
                    }
                }
                let first_of_its_kind = !anti && !matched_anywhere && selector_matches(term, own_labels);
                AffinityDomains {
                    key: term.topology_key.clone(),
                    domains,
                    anti,
                    first_of_its_kind,
                }
            })
            .collect()
    }

    /// The bound pods a required (anti-)affinity term of a pod in `namespace` selects: looked up
    /// by a label the term requires when it names one, else found among every bound pod.
    fn selected<'a>(&'a self, term: &'a PodAffinityTerm, namespace: &'a str) -> Vec<&'a Bound> {
        let required = term
            .label_selector
            .as_ref()
            .and_then(|selector| selector.match_labels.as_ref())
            .and_then(|labels| labels.iter().next());
        let Some((label, value)) = required else {
            return self
                .bound
                .values()
                .filter(|b| term_selects(term, namespace, b))
                .collect();
        };
        let namespaces: Vec<&str> = match &term.namespaces {
            Some(listed) if !listed.is_empty() => listed.iter().map(String::as_str).collect(),
            _ => vec![namespace],
        };
        namespaces
            .into_iter()
            .filter_map(|ns| self.by_label.get(&(ns.to_owned(), label.clone(), value.clone())))
            .flatten()
            .filter_map(|key| self.bound.get(key))
            .filter(|bound| term_selects(term, namespace, bound))
            .collect()
    }

    /// Matching pods per topology domain, for each `DoNotSchedule` spread constraint.
    fn spread_counts(&self, namespace: &str, needs: &PodNeeds) -> Vec<SpreadCounts> {
        needs
            .spread
            .iter()
            .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
            .map(|constraint| {
                let mut counts: BTreeMap<String, i64> = BTreeMap::new();
                for node in self.nodes.values() {
                    let eligible = needs
                        .node_selector
                        .iter()
                        .all(|(k, v)| node.labels.get(k) == Some(v))
                        && node_affinity_matches(&needs.affinity, node);
                    if let (true, Some(domain)) = (eligible, node.labels.get(&constraint.topology_key)) {
                        counts.entry(domain.clone()).or_default();
                    }
                }
                for bound in self.bound.values().filter(|b| b.namespace == namespace) {
                    let selected = constraint
                        .label_selector
                        .as_ref()
                        .is_some_and(|s| label_selector_matches(s, &bound.labels));
                    let domain = self
                        .nodes
                        .get(&bound.node)
                        .and_then(|n| n.labels.get(&constraint.topology_key));
                    if let (true, Some(domain)) = (selected, domain)
                        && let Some(count) = counts.get_mut(domain)
                    {
                        *count += 1;
                    }
                }
                SpreadCounts {
                    key: constraint.topology_key.clone(),
                    max_skew: i64::from(constraint.max_skew),
                    counts,
                }
            })
            .collect()
    }
}

/// Whether the pod may go to the node; the reason kube-scheduler gives when not.
fn filter(
    node: &NodeInfo,
    needs: &PodNeeds,
    spread: &[SpreadCounts],
    affinity: &[AffinityDomains],
) -> Result<(), String> {
    if !node.ready {
        return Err("node(s) had untolerated taint {node.kubernetes.io/not-ready: }".to_owned());
    }
    if !node.schedulable
        && !tolerated(
            &needs.tolerations,
            "node.kubernetes.io/unschedulable",
            "",
            "NoSchedule",
        )
    {
        return Err("node(s) were unschedulable".to_owned());
    }
    if !needs
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        || !node_affinity_matches(&needs.affinity, node)
    {
        return Err("node(s) didn't match Pod's node affinity/selector".to_owned());
    }
    if let Some(taint) = untolerated(&node.taints, &needs.tolerations, &["NoSchedule", "NoExecute"]) {
        return Err(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or_default()
        ));
    }
    // The first resource, by name, the node lacks once the pod is added (checked in place: this
    // runs for every candidate node).
    let pods = Quantity::from_units(node.pods + 1);
    let short = needs
        .requests
        .iter()
        .map(|(name, amount)| (name, node.requested.get(name).saturating_add(amount)))
        .chain(std::iter::once(("pods", pods)))
        .filter(|(name, total)| *total > node.allocatable.get(name))
        .map(|(name, _)| name)
        .min();
    if let Some(name) = short {
        return Err(if name == "pods" {
            "Too many pods".to_owned()
        } else {
            format!("Insufficient {name}")
        });
    }
    if needs.ports.iter().any(|port| node.ports.contains(port)) {
        return Err("node(s) didn't have free ports for the requested pod ports".to_owned());
    }
    if spread.iter().any(|counts| !counts.allows(node)) {
        return Err("node(s) didn't match pod topology spread constraints".to_owned());
    }
    if let Some(term) = affinity.iter().find(|term| !term.allows(node)) {
        let rules = if term.anti { "anti-affinity" } else { "affinity" };
        return Err(format!("node(s) didn't match pod {rules} rules"));
    }
    Ok(())
}

/// Whether a pod may run on a node at all: its node selector, required node affinity and
/// tolerations (what the DaemonSet controller checks before it creates a node's pod).
pub(super) fn node_accepts(pod: &Value, node: &Value) -> bool {
    let needs = PodNeeds::of(pod);
    let node = NodeInfo::of(node);
    needs
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        && node_affinity_matches(&needs.affinity, &node)
        && untolerated(&node.taints, &needs.tolerations, &["NoSchedule", "NoExecute"]).is_none()
}

/// Whether a pod-affinity term selects a bound pod.
fn term_selects(term: &PodAffinityTerm, namespace: &str, bound: &Bound) -> bool {
    let in_namespace = match &term.namespaces {
        Some(namespaces) if !namespaces.is_empty() => namespaces.contains(&bound.namespace),
        _ => bound.namespace == namespace,
    };
    in_namespace && selector_matches(term, &bound.labels)
}

/// For one required pod (anti-)affinity term: the domains that hold a selected pod.
struct AffinityDomains {
    key: String,
    domains: HashSet<String>,
    anti: bool,
    /// No pod matches anywhere and the incoming pod matches its own term: any domain will do.
    first_of_its_kind: bool,
}

impl AffinityDomains {
    fn allows(&self, node: &NodeInfo) -> bool {
        match node.labels.get(&self.key) {
            None => self.anti,
            Some(domain) if self.anti => !self.domains.contains(domain),
            Some(domain) => self.first_of_its_kind || self.domains.contains(domain),
        }
    }
}

/// Pods per domain for one spread constraint.
struct SpreadCounts {
    key: String,
    max_skew: i64,
    counts: BTreeMap<String, i64>,
}

impl SpreadCounts {
    fn allows(&self, node: &NodeInfo) -> bool {
        let Some(domain) = node.labels.get(&self.key) else {
            return false;
        };
        let min = self.counts.values().copied().min().unwrap_or(0);
        let here = self.counts.get(domain).copied().unwrap_or(0);
        here + 1 - min <= self.max_skew
    }
}

impl NodeInfo {
    /// A node with nothing on it yet.
    fn of(node: &Value) -> Self {
        Self {
            name: text(node, "/metadata/name").to_owned(),
            labels: labels(node),
            taints: parse(&node["spec"], "taints"),
            schedulable: node.pointer("/spec/unschedulable").and_then(Value::as_bool) != Some(true),
            ready: conditions::status(node, "Ready") == Some("True"),
            allocatable: resources(node.pointer("/status/allocatable")),
            requested: Resources::new(),
            pods: 0,
            ports: HashSet::new(),
        }
    }

    /// Fraction of cpu and memory in use after placing `requests` (lower is better).
    fn score(&self, requests: &Resources) -> f64 {
        let share = |name: &str| {
            let total = self.allocatable.get(name).millis() as f64;
            if total <= 0.0 {
                1.0
            } else {
                (self.requested.get(name).millis() as f64 + requests.get(name).millis() as f64) / total
            }
        };
        (share("cpu") + share("memory")) / 2.0
    }
}

impl PodNeeds {
    /// Whether where the pod may go depends on other pods: required pod (anti-)affinity, or a
    /// `DoNotSchedule` topology spread.
    fn depends_on_pods(&self) -> bool {
        self.required_pod_terms().next().is_some()
            || self
                .spread
                .iter()
                .any(|c| c.when_unsatisfiable == "DoNotSchedule")
    }

    /// The required pod affinity terms, then the anti-affinity ones (marked `true`).
    fn required_pod_terms(&self) -> impl Iterator<Item = (&PodAffinityTerm, bool)> {
        let affinity = self
            .affinity
            .pod_affinity
            .as_ref()
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        let anti = self
            .affinity
            .pod_anti_affinity
            .as_ref()
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        affinity
            .into_iter()
            .flatten()
            .map(|t| (t, false))
            .chain(anti.into_iter().flatten().map(|t| (t, true)))
    }

    fn of(pod: &Value) -> Self {
        let spec = pod.get("spec").cloned().unwrap_or_else(|| json!({}));
        let containers = |field: &str| {
            spec.get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let mut requests = Resources::new();
        for container in containers("containers") {
            requests.add(&resources(container.pointer("/resources/requests")));
        }
        for container in containers("initContainers") {
            requests.max(&resources(container.pointer("/resources/requests")));
        }
        requests.add(&resources(spec.get("overhead")));
        let ports = containers("containers")
            .iter()
            .flat_map(|c| {
                c.get("ports")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| {
                let port = p.get("hostPort")?.as_i64().filter(|p| *p > 0)?;
                Some((
                    p.get("protocol")
                        .and_then(Value::as_str)
                        .unwrap_or("TCP")
                        .to_owned(),
                    port,
                ))
            })
            .collect();
        Self {
            requests,
            ports,
            node_selector: parse(&spec, "nodeSelector"),
            affinity: parse(&spec, "affinity"),
            tolerations: parse(&spec, "tolerations"),
            spread: parse(&spec, "topologySpreadConstraints"),
        }
    }
}

/// A field of a pod spec as its Kubernetes type (absent or malformed: the default).
pub(super) fn parse<T: serde::de::DeserializeOwned + Default>(spec: &Value, field: &str) -> T {
    spec.get(field)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// A resource list (`{"cpu": "500m", …}`), skipping amounts that do not parse.
fn resources(list: Option<&Value>) -> Resources {
    list.and_then(Value::as_object)
        .map(|list| {
            list.iter()
                .filter_map(|(name, amount)| {
                    let text = match amount {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    Some((name.clone(), text.parse::<Quantity>().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a taint is tolerated by one of `tolerations`.
/// The first of `taints` with one of `effects` that `tolerations` do not tolerate.
pub(super) fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        effects.contains(&t.effect.as_str())
            && !tolerated(
                tolerations,
                &t.key,
                t.value.as_deref().unwrap_or_default(),
                &t.effect,
            )
    })
}

fn tolerated(tolerations: &[Toleration], key: &str, value: &str, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == effect);
        let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty() || k == key);
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == value
                    && t.key.as_deref().is_some_and(|k| !k.is_empty())
            }
        };
        effect_ok && key_ok && value_ok
    })
}

fn node_affinity_matches(affinity: &Affinity, node: &NodeInfo) -> bool {
    let Some(selector) = affinity
        .node_affinity
        .as_ref()
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&node.name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(v), Some(l)) if v > l)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(v), Some(l)) if v < l)
        }
        _ => false,
    }
}

fn selector_matches(term: &PodAffinityTerm, labels: &BTreeMap<String, String>) -> bool {
    term.label_selector
        .as_ref()
        .is_some_and(|s| label_selector_matches(s, labels))
}

/// kube-scheduler's message for a pod no node can take.
fn unschedulable_message(nodes: usize, reasons: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = reasons
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    format!(
        "0/{nodes} nodes are available: {}. preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling.",
        parts.join(", ")
    )
}

/// Sets `PodScheduled=False/Unschedulable` and records `FailedScheduling` when the message changed.
fn mark_unschedulable(store: &Store, key: &ObjectKey, pod: &Value, message: &str) {
    let now = store.clock().now_rfc3339();
    let mut next = pod.clone();
    if !conditions::set(&mut next, "PodScheduled", "False", "Unschedulable", message, &now) {
        return;
    }
    match store.update(&GroupResource::new("", "pods"), key, Part::Status, next, false) {
        Ok(updated) => events::record(
            store,
            &updated,
            "Warning",
            "FailedScheduling",
            message,
            "default-scheduler",
        ),
        Err(error) => {
            tracing::debug!(%error, pod = %key.name, "kubesim scheduler: cannot mark the pod unschedulable")
        }
    }
}

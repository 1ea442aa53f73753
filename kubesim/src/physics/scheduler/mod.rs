//! kube-scheduler, written independently of Joist's scheduling simulation (DESIGN.md §2): a pod that
//! fits a node is bound to it; one that fits none is marked `PodScheduled=False`, reason
//! `Unschedulable`, with kube-scheduler's message ("0/3 nodes are available: 3 Insufficient cpu.")
//! and a `FailedScheduling` event. That condition is what Joist reacts to.
//!
//! Filters: node readiness and `spec.unschedulable`, resource requests (cpu, memory, pods and any
//! other allocatable), nodeSelector, required node affinity, taints and tolerations, host ports,
//! where the pod's claims can be used ([`volume_topology`]), the volumes a node's CSINode lets
//! its driver attach (kubesim's one driver attaches every claim),
//! `DoNotSchedule` topology spread (the configuration's default constraints for pods that declare
//! none, [`default_spread`]), required pod affinity and anti-affinity of the incoming pod, and the
//! required anti-affinity of the bound pods that select it ([`existing_anti`]: anti-affinity holds
//! both ways, as in kube-scheduler).
//! Among the nodes that pass, one without a `PreferNoSchedule` taint the pod does not tolerate wins,
//! then the least allocated. Unschedulable pods are retried when nodes or
//! bound pods change, and every `retry` otherwise; as in kube-scheduler, a pod that failed waits out
//! its backoff first (1 s, doubling with each failed attempt, at most 10 s), so a cluster that
//! changes often does not retry every pending pod on every change. The queue is worked in chunks,
//! yielding between them, so watchers keep up with a burst of thousands of pods.
//!
//! On a large cluster no pod looks at every node or every pod: each kind of pending pod remembers
//! the nodes that refused it and why ([`feasible`]), and each required pod (anti-)affinity term the
//! domains of the pods it selects ([`domains`]), both kept as nodes and pods change. The answers
//! are those of a scan of every node; the filters themselves are in [`filter`].

mod default_spread;
mod domains;
mod existing_anti;
mod feasible;
mod filter;
mod volume_topology;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use joist_messages::scheduler_config::SchedulerConfig;
use k8s_openapi::api::core::v1::PodAffinityTerm;
use serde_json::Value;
use tokio::time::Instant;

pub(super) use self::filter::{node_accepts, parse, untolerated};
use self::{
    domains::{TermDomains, TermKey},
    existing_anti::ExistingAnti,
    feasible::Classes,
    filter::{
        AffinityDomains, Bound, NodeInfo, PodNeeds, SpreadCounts, filter, node_affinity_matches,
        selector_matches, term_selects,
    },
};

use super::{Change, Informer, WRITES_PER_TURN, wait};
use crate::object::text;
use crate::{
    api::bind,
    conditions, events,
    object::{Pointer, labels},
    resources::GroupResource,
    selector::label_selector_matches,
    store::{EventKind, ObjectKey, Store},
};

/// Feasible nodes the scheduler compares before it stops looking (kube-scheduler samples nodes the
/// same way on large clusters).
const FEASIBLE_NODES_TO_SCORE: usize = 100;

/// kube-scheduler's backoff after a pod's first failed attempt, and its cap.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

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
    /// What each kind of pending pod is known to fit, or not.
    classes: Classes,
    /// The domains of the pods each required pod (anti-)affinity term selects.
    term_domains: TermDomains,
    /// The bound pods' required anti-affinity terms, and the domains they keep pods out of.
    existing_anti: ExistingAnti,
    /// Nodes pods were bound to before the scheduler saw the node.
    unseen_nodes: HashSet<String>,
    /// The scheduler's Events, in series.
    events: events::Recorder,
    /// The configuration's default topology spread, when it sets one.
    config: Option<Arc<SchedulerConfig>>,
    /// Each node's volume attach limit, from its CSINode (which may come before the node).
    volume_limits: HashMap<String, usize>,
}

/// Runs the scheduler until aborted, spreading pods by `config`'s default constraints when it has
/// them.
pub async fn run(store: Arc<Store>, retry: Duration, config: Option<Arc<SchedulerConfig>>) {
    let mut changes = store.subscribe();
    let mut pods = Informer::new("", "pods");
    let mut nodes = Informer::new("", "nodes");
    let mut csi_nodes = Informer::new("storage.k8s.io", "csinodes");
    let mut scheduler = Scheduler {
        config: config.filter(|config| !config.default_constraints().is_empty()),
        ..Scheduler::default()
    };
    let mut next_retry = Instant::now() + retry;
    loop {
        let node_changes = nodes.changes(&store);
        let pod_changes = pods.changes(&store);
        let csi_changes = csi_nodes.changes(&store);
        let mut cluster_changed = !node_changes.is_empty() || !csi_changes.is_empty();
        for change in csi_changes {
            scheduler.observe_csi_node(&change);
        }
        for change in node_changes {
            scheduler.observe_node(&change);
        }
        for change in pod_changes {
            cluster_changed |= scheduler.observe_pod(&change);
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
        scheduler.events.sweep(&store);
        if scheduler.schedule_queue(&store, WRITES_PER_TURN) {
            tokio::task::yield_now().await;
            continue;
        }
        let wake = [scheduler.next_backoff_end(), scheduler.events.next_sweep()]
            .into_iter()
            .flatten()
            .fold(next_retry, Instant::min);
        if !wait(&mut changes, Some(wake)).await {
            return;
        }
    }
}

impl Scheduler {
    /// A CSINode: its node's attach limit for kubesim's CSI driver, which attaches every claim.
    fn observe_csi_node(&mut self, change: &Change) {
        let name = change.key().name;
        let limit = (change.kind != EventKind::Deleted)
            .then(|| {
                let drivers = change.object.at("/spec/drivers")?.as_array()?;
                let ours = drivers
                    .iter()
                    .find(|d| text(d, "/name") == crate::physics::volumes::DRIVER)?;
                usize::try_from(ours.at("/allocatable/count")?.as_u64()?).ok()
            })
            .flatten();
        match limit {
            Some(limit) => self.volume_limits.insert(name.clone(), limit),
            None => self.volume_limits.remove(&name),
        };
        if let Some(info) = self.nodes.get_mut(&name) {
            info.volume_limit = limit;
            self.classes.node_changed(&name);
        }
    }

    fn observe_node(&mut self, change: &Change) {
        let name = change.key().name;
        if change.kind == EventKind::Deleted {
            if self.nodes.remove(&name).is_some_and(|gone| gone.pods > 0) {
                self.pods_moved_domains();
            }
            self.classes.node_removed(&name);
            return;
        }
        let mut info = NodeInfo::of(&change.object);
        info.volume_limit = self.volume_limits.get(&name).copied();
        match self.nodes.get(&name) {
            Some(previous) => {
                info.requested = previous.requested.clone();
                info.pods = previous.pods;
                info.ports = previous.ports.clone();
                info.claims = previous.claims.clone();
                if previous.labels == info.labels {
                    self.classes.node_changed(&name);
                } else {
                    self.pods_moved_domains();
                    self.classes.node_relabelled(&name);
                }
            }
            None => {
                if self.unseen_nodes.remove(&name) {
                    self.pods_moved_domains();
                }
                self.classes.node_changed(&name);
            }
        }
        self.nodes.insert(name, info);
    }

    /// Bound pods are in other domains than counted (a node relabelled, or one they were bound to
    /// appeared or went): every count of domains is made again, and the kinds of pods the bound
    /// pods' anti-affinity kept off nodes look at every node again.
    fn pods_moved_domains(&mut self) {
        self.term_domains.clear();
        if self.existing_anti.any() {
            self.existing_anti.nodes_changed();
            self.classes.held_off_changed();
        }
    }

    /// Accounts for a pod change; returns whether it freed room (so unschedulable pods may fit).
    fn observe_pod(&mut self, change: &Change) -> bool {
        let key = change.key();
        let pod = &change.object;
        let node = text(pod, "/spec/nodeName");
        let finished = matches!(
            pod.at("/status/phase").and_then(Value::as_str),
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
                self.account(key, node, &needs, labels(pod));
            }
            return false;
        }
        let ours = pod
            .at("/spec/schedulerName")
            .and_then(Value::as_str)
            .is_none_or(|s| s == "default-scheduler");
        let deleting = pod.at("/metadata/deletionTimestamp").is_some();
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

    fn account(&mut self, key: ObjectKey, node: &str, needs: &PodNeeds, labels: BTreeMap<String, String>) {
        self.pods_bound = true;
        match self.nodes.get_mut(node) {
            Some(info) => {
                info.requested.add(&needs.requests);
                info.pods += 1;
                info.ports.extend(needs.ports.iter().cloned());
                for claim in &needs.claims {
                    *info.claims.entry(claim.clone()).or_default() += 1;
                }
            }
            None => {
                self.unseen_nodes.insert(node.to_owned());
            }
        }
        self.classes.pod_arrived(node);
        let bound = Bound {
            node: node.to_owned(),
            requests: needs.requests.clone(),
            ports: needs.ports.clone(),
            claims: needs.claims.clone(),
            labels,
            namespace: key.namespace.clone(),
            anti_terms: needs
                .required_pod_terms()
                .filter(|&(_, anti)| anti)
                .map(|(term, _)| term.clone())
                .collect(),
        };
        for (label, value) in &bound.labels {
            let entry = (bound.namespace.clone(), label.clone(), value.clone());
            self.by_label.entry(entry).or_default().insert(key.clone());
        }
        self.term_domains.count(&bound, &self.nodes, 1);
        if let Some(replaced) = self.bound.insert(key.clone(), bound) {
            self.unindex(&key, &replaced);
            self.term_domains.count(&replaced, &self.nodes, -1);
            if self.existing_anti.unbind(&key, &replaced, &self.nodes) {
                self.classes.held_off_changed();
            }
        }
        if let Some(bound) = self.bound.get(&key) {
            self.existing_anti.bind(&key, bound, &self.nodes);
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
        self.term_domains.count(&bound, &self.nodes, -1);
        if self.existing_anti.unbind(key, &bound, &self.nodes) {
            self.classes.held_off_changed();
        }
        self.classes.pod_left(&bound.node);
        if let Some(info) = self.nodes.get_mut(&bound.node) {
            info.requested.sub(&bound.requests);
            info.pods -= 1;
            for port in &bound.ports {
                info.ports.remove(port);
            }
            for claim in &bound.claims {
                if let Some(users) = info.claims.get_mut(claim) {
                    *users -= 1;
                    if *users == 0 {
                        info.claims.remove(claim);
                    }
                }
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
                .at("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
            {
                continue;
            }
            let mut needs = PodNeeds::of(&pod);
            if let Some(config) = self.config.as_ref().filter(|_| needs.spread.is_empty()) {
                needs.spread = default_spread::defaults_for(config, store, &pod);
            }
            let chosen = volume_topology::volume_needs(store, &pod).and_then(|volumes| {
                needs.volumes = volumes;
                self.choose(&pod, &needs)
            });
            // The pod is handed over to the write, which changes it in place when no one else
            // holds it ([`Store::edit`]).
            match chosen {
                Ok(node) => {
                    let labels = labels(&pod);
                    match bind(store, &key, Some(pod), &node, false) {
                        Ok(()) => self.account(key, &node, &needs, labels),
                        Err(error) => {
                            tracing::debug!(%error, pod = %key.name, "kubesim scheduler: bind failed")
                        }
                    }
                }
                Err(message) => {
                    mark_unschedulable(store, &mut self.events, &key, pod, &message);
                    self.failed(key, &needs, now);
                }
            }
        }
        !self.active.is_empty()
    }

    /// The best feasible node, or kube-scheduler's message saying why there is none. Only the
    /// nodes the pod's kind is not known to be refused by are looked at (see [`feasible`]).
    fn choose(&mut self, pod: &Value, needs: &PodNeeds) -> Result<String, String> {
        if self.nodes.is_empty() {
            return Err("no nodes available to schedule pods".to_owned());
        }
        let namespace = pod
            .at("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let spread = self.spread_counts(namespace, needs);
        let terms: Vec<(&PodAffinityTerm, bool, TermKey)> = needs
            .required_pod_terms()
            .map(|(term, anti)| (term, anti, TermDomains::key(term, namespace)))
            .collect();
        for (term, _, key) in &terms {
            if !self.term_domains.has(key) {
                let selected = self.selected(term, namespace);
                let fresh = TermDomains::fresh(term, namespace, &self.nodes, selected);
                self.term_domains.insert(key.clone(), fresh);
            }
        }
        let own_labels = labels(pod);
        let affinity: Vec<AffinityDomains<'_>> = terms
            .iter()
            .filter_map(|&(term, anti, ref key)| {
                let domains = self.term_domains.get(key)?;
                Some(AffinityDomains {
                    key: term.topology_key.clone(),
                    domains: domains.pods,
                    anti,
                    first_of_its_kind: !anti && !domains.any && selector_matches(term, &own_labels),
                })
            })
            .collect();
        let held_off = self.existing_anti.against(namespace, &own_labels, &self.nodes);
        let class_key = feasible::key(pod, needs);
        let class = self.classes.of(class_key, needs, &self.nodes);
        // Start after the node the previous pod stopped at, as kube-scheduler does, so the sample of
        // feasible nodes moves around the cluster.
        let resume = std::mem::take(&mut self.next_start);
        let after = class
            .open
            .range::<String, _>((std::ops::Bound::Excluded(&resume), std::ops::Bound::Unbounded));
        let before = class.open.range::<String, _>(..=&resume);
        let mut best: Option<((usize, f64), &str)> = None;
        let mut feasible = 0;
        let mut stopped_at = None;
        let mut refused = Vec::new();
        for name in after.chain(before) {
            let Some(node) = self.nodes.get(name) else {
                continue;
            };
            match filter(node, needs, &spread, &affinity, &held_off) {
                Ok(()) => {
                    feasible += 1;
                    let score = node.score(needs);
                    if best.is_none_or(|(s, name)| score < s || (score == s && node.name.as_str() < name)) {
                        best = Some((score, &node.name));
                    }
                    if feasible == FEASIBLE_NODES_TO_SCORE {
                        stopped_at = Some(name.clone());
                        break;
                    }
                }
                Err(refusal) => refused.push((name.clone(), refusal)),
            }
        }
        let best = best.map(|(_, name)| name.to_owned());
        // A search that went all the way round stops where a scan of every node would: at the
        // last node up to where it resumed.
        self.next_start = stopped_at
            .or_else(|| {
                self.nodes
                    .range::<String, _>(..=&resume)
                    .next_back()
                    .or_else(|| self.nodes.last_key_value())
                    .map(|(name, _)| name.clone())
            })
            .unwrap_or_default();
        for (name, refusal) in refused {
            class.refuse(name, refusal);
        }
        best.ok_or_else(|| unschedulable_message(self.nodes.len(), &class.reasons()))
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

/// Sets `PodScheduled=False/Unschedulable` and records `FailedScheduling` when the message changed
/// (a pod failing again for the same reason is left as it is). `pod` is handed over to the write.
fn mark_unschedulable(
    store: &Store,
    events: &mut events::Recorder,
    key: &ObjectKey,
    pod: Arc<Value>,
    message: &str,
) {
    let (kind, status, reason) = ("PodScheduled", "False", "Unschedulable");
    if conditions::holds(&pod, kind, status, reason, message) {
        return;
    }
    let now = store.clock().now_rfc3339();
    let written = store.edit(&GroupResource::new("", "pods"), key, Some(pod), |_, object| {
        Ok(conditions::set(object, kind, status, reason, message, &now))
    });
    match written {
        Ok(Some(updated)) => events.record(
            store,
            &updated,
            events::Report {
                kind: "Warning",
                reason: "FailedScheduling",
                message,
                component: "default-scheduler",
            },
        ),
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(%error, pod = %key.name, "kubesim scheduler: cannot mark the pod unschedulable")
        }
    }
}

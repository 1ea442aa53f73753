//! Which nodes the DisruptionPlanner may take, as Karpenter filters them: a managed NodeClaim that
//! is initialized and not being deleted, whose Node exists, is not being deleted or already
//! disrupted, and whose NodePool (a dynamic one: static pools keep their own size) and instance
//! type (with a price) are known.
//!
//! Graceful methods also skip a node annotated `karpenter.sh/do-not-disrupt: "true"`, a node a
//! provisioning pass nominated for pending pods (for the nomination window), or one running
//! a pod whose `karpenter.sh/do-not-disrupt` is active (`"true"`, or a duration not yet elapsed
//! since the pod started) or whose PodDisruptionBudget allows no eviction now (or that more than
//! one budget covers, which the Eviction API refuses): such a node is [`Blocked`], with why.
//!
//! A drifted node blocked only by its pods stays available to drift when its NodeClaim has a
//! `terminationGracePeriod` (Karpenter's eventual disruption class): the grace period bounds the
//! drain.
//!
//! Each candidate carries what the methods rank and budget by: its price, its pods that must move
//! (not DaemonSet or mirror pods, not pods finished or terminating), what moving them costs
//! (Karpenter v1.14's reschedule disruption cost: 1 plus their eviction costs above zero), and
//! whether it is consolidatable (`consolidateAfter` has passed since it initialized and since
//! a pod last arrived or left), which its NodeClaim's `Consolidatable` condition shows, and
//! whether consolidation (and emptiness, in a pool that consolidates underused nodes) leaves it
//! while other nodes of its NodePool make room (`waits_for_pool`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
};

use joist_messages::{
    apis::{NodeClaim, NodePool, nodepool::ConsolidationPolicy},
    cached_pod::CachedPod,
    conditions::{ConditionType, is_true},
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE, annotations::DO_NOT_DISRUPT},
    model::instance_type::CapacityType,
    pods::do_not_disrupt,
};
use joist_scheduling::terms::{label_selector, selects};
use k8s_openapi::api::{core::v1::Node, policy::v1::PodDisruptionBudget};
use kube::ResourceExt;

use super::blockers::{Blocker, Verdicts};
use crate::{
    decide::{
        balanced::{PoolTotals, node_disruption_cost},
        lifecycle::{self, drainable, is_disrupted, transitioned_at},
        offered::Offered,
    },
    state::{buffers::Buffers, read_model::ReadModel},
};

/// Why a NodeClaim is no candidate at all, for any method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Excluded {
    /// It has no status yet.
    NoStatus,
    /// It is being deleted.
    Deleting,
    /// It is not initialized yet.
    NotInitialized,
    /// It has no `karpenter.sh/nodepool` label.
    NoNodePool,
    /// Its NodePool is not in the cluster.
    UnknownNodePool,
    /// Its NodePool is static: it keeps its own size.
    Static,
    /// Its Node has not registered.
    NotRegistered,
    /// Its Node is being deleted.
    NodeDeleting,
    /// Its Node is tainted `karpenter.sh/disrupted`: a disruption has it already.
    NodeDisrupted,
    /// It lacks one of the labels a candidate is priced by.
    MissingLabel(&'static str),
    /// Its NodePool is left out of the pass (not Ready, paused, …: see [`crate::problem::Why`]).
    PoolLeftOut,
    /// Its offering is no longer sold to its NodePool.
    NotOffered,
}

impl fmt::Display for Excluded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Excluded::NoStatus => f.write_str("its NodeClaim has no status yet"),
            Excluded::Deleting => f.write_str("its NodeClaim is being deleted"),
            Excluded::NotInitialized => f.write_str("its NodeClaim is not initialized yet"),
            Excluded::NoNodePool => write!(f, "its NodeClaim has no {NODEPOOL} label"),
            Excluded::UnknownNodePool => f.write_str("its NodePool is not in the cluster"),
            Excluded::Static => f.write_str("its NodePool is static: it keeps its own size"),
            Excluded::NotRegistered => f.write_str("its node has not registered"),
            Excluded::NodeDeleting => f.write_str("its Node is being deleted"),
            Excluded::NodeDisrupted => {
                f.write_str("its Node is tainted karpenter.sh/disrupted: a disruption has it")
            }
            Excluded::MissingLabel(label) => write!(f, "its NodeClaim has no {label} label"),
            Excluded::PoolLeftOut => f.write_str("its NodePool is left out of the pass"),
            Excluded::NotOffered => f.write_str("its offering is no longer sold to its NodePool"),
        }
    }
}

/// A node the planner may disrupt.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its NodeClaim.
    pub claim: Arc<NodeClaim>,
    /// Its Node.
    pub node: Arc<Node>,
    /// Its NodePool.
    pub pool: Arc<NodePool>,
    /// What it costs per hour.
    pub price: f64,
    /// Its capacity type.
    pub capacity_type: CapacityType,
    /// The pods that must find another place.
    pub pods: Vec<Arc<CachedPod>>,
    /// What moving its pods costs, in the candidates' order and the `Balanced` score: 1, plus
    /// each pod's eviction cost above zero.
    pub reschedule_cost: f64,
    /// Whether `consolidateAfter` has passed since the node last changed.
    pub consolidatable: bool,
    /// Whether consolidation (and emptiness, unless its pool is `WhenEmpty`) leaves it for now,
    /// consolidatable as it is, while other nodes of its NodePool make room ([`waits_for_pool`]).
    pub waits_for_pool: bool,
    /// Whether its NodeClaim shows `Drifted=True`.
    pub drifted: bool,
}

impl Candidate {
    /// The Node's name.
    pub fn node_name(&self) -> String {
        self.node.name_any()
    }

    /// Karpenter's ordering key: savings per unit of disruption (higher first).
    pub fn savings_ratio(&self) -> f64 {
        self.price / self.reschedule_cost
    }

    /// Why consolidation leaves it out before simulating it, if it does: its pool's policy or
    /// `consolidateAfter`.
    pub fn consolidation_blocker(&self) -> Option<Blocker> {
        let disruption = &self.pool.spec.disruption;
        if disruption.consolidate_after.duration().is_none()
            || (disruption.consolidation_policy == ConsolidationPolicy::WhenEmpty && !self.pods.is_empty())
        {
            Some(Blocker::ConsolidationDisabled)
        } else if !self.consolidatable || self.waits_for_pool {
            Some(Blocker::NotConsolidatable)
        } else {
            None
        }
    }

    /// Records in `verdicts` that it stays for `blocker`.
    pub fn held_by(&self, verdicts: &mut Verdicts, blocker: Blocker) {
        verdicts.hold(self.claim.name_any(), self.pool.name_any(), blocker);
    }
}

/// A node graceful methods must leave alone, and why.
#[derive(Debug, Clone)]
pub struct Blocked {
    /// The candidate it would be.
    pub candidate: Candidate,
    /// Why, for the `DisruptionBlocked` event.
    pub reason: String,
    /// The blocker's name for why, when it has one (do-not-disrupt and PDBs have none: such a
    /// node is no candidate, as in Karpenter).
    pub blocker: Option<Blocker>,
}

impl Blocked {
    fn new(candidate: Candidate, (reason, blocker): (String, Option<Blocker>)) -> Self {
        Self {
            candidate,
            reason,
            blocker,
        }
    }
}

/// Each NodePool's instance types in this pass, by NodePool name.
pub type PoolTypes<'a> = BTreeMap<String, Offered<'a>>;

/// What [`collect`] found.
#[derive(Debug, Default)]
pub struct Collected {
    /// The candidates, highest savings ratio first.
    pub candidates: Vec<Candidate>,
    /// Nodes graceful methods must leave alone.
    pub blocked: Vec<Blocked>,
    /// Drifted candidates blocked only by their pods, whose NodeClaims have a
    /// `terminationGracePeriod`: drift (the eventual class) may still replace them, the grace
    /// period bounding how long their pods can hold the drain.
    pub eventual: Vec<Candidate>,
    /// Managed nodes still inside their `consolidateAfter` window: consolidation moves no pod
    /// onto them.
    pub settling: Vec<String>,
    /// NodeClaims whose `Consolidatable` condition no longer says what is true, with what is.
    pub stale_conditions: Vec<(Arc<NodeClaim>, bool)>,
    /// The cost and disruption of every node of each `Balanced` NodePool, candidate or not.
    pub balanced_totals: BTreeMap<String, PoolTotals>,
    /// The NodeClaims that are no candidates at all, with why.
    pub excluded: Vec<(Arc<NodeClaim>, Excluded)>,
}

/// Every candidate and every blocked node (see the module docs).
pub fn collect(
    read: &ReadModel,
    (buffers, freeing): (&Buffers, &Freeing),
    types: &PoolTypes<'_>,
    now_seconds: i64,
) -> Collected {
    let budgets = read.disruption_budgets();
    let mut collected = Collected::default();
    let mut freeing_pools = BTreeSet::new();
    for claim in read.node_claims() {
        let candidate = match candidate(read, types, &claim, now_seconds) {
            Ok(candidate) => candidate,
            Err(excluded) => {
                count_in_balanced_totals(read, types, &claim, &mut collected.balanced_totals);
                collected.excluded.push((claim, excluded));
                continue;
            }
        };
        if candidate.pool.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced {
            let totals = collected
                .balanced_totals
                .entry(candidate.pool.name_any())
                .or_default();
            totals.cost += candidate.price;
            totals.disruption += candidate.reschedule_cost;
        }
        if !candidate.consolidatable {
            collected.settling.push(candidate.node_name());
            if making_room(read, &candidate, now_seconds) {
                freeing_pools.insert(candidate.pool.name_any());
            }
        }
        let shown = claim
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, ConditionType::Consolidatable));
        if shown != candidate.consolidatable {
            collected
                .stale_conditions
                .push((claim.clone(), candidate.consolidatable));
        }
        if let Some(why) = node_blocker(read, buffers, &candidate, now_seconds)
            .or_else(|| unsimulated_pod(read, &candidate).map(|reason| (reason, None)))
        {
            collected.blocked.push(Blocked::new(candidate, why));
        } else if let Some(reason) = pod_blocker(&candidate, &budgets, now_seconds) {
            if candidate.drifted && claim.spec.termination_grace_period.is_some() {
                collected.eventual.push(candidate.clone());
            }
            collected.blocked.push(Blocked::new(candidate, (reason, None)));
        } else {
            collected.candidates.push(candidate);
        }
    }
    let freeing_since = freeing.update(&freeing_pools, now_seconds);
    for candidate in &mut collected.candidates {
        candidate.waits_for_pool = freeing_since
            .get(&candidate.pool.name_any())
            .is_some_and(|&since| waits_for_pool(candidate, since, now_seconds));
    }
    collected.candidates.sort_by(|a, b| {
        b.savings_ratio()
            .total_cmp(&a.savings_ratio())
            .then_with(|| a.claim.name_any().cmp(&b.claim.name_any()))
    });
    collected
}

/// Adds a claim that is no candidate (launching, initializing, being deleted) to its NodePool's
/// totals when the pool is `Balanced`: as in Karpenter, every node of the pool counts in the
/// denominators of the score, its price when it is offered and its disruption cost (one, and the
/// eviction costs of its pods when it has a node).
fn count_in_balanced_totals(
    read: &ReadModel,
    types: &PoolTypes<'_>,
    claim: &NodeClaim,
    totals: &mut BTreeMap<String, PoolTotals>,
) {
    let Some(pool_name) = claim.labels().get(NODEPOOL) else {
        return;
    };
    let balanced = read
        .node_pool(pool_name)
        .is_some_and(|pool| pool.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced);
    if !balanced {
        return;
    }
    let node = claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|id| read.node_for_provider(id));
    let pods = node.map(|node| pods_to_move(read, &node)).unwrap_or_default();
    let pool_totals = totals.entry(pool_name.clone()).or_default();
    pool_totals.cost += offered_price(types, pool_name, claim.labels()).unwrap_or(0.0);
    pool_totals.disruption += node_disruption_cost(pods.iter().map(|p| eviction_cost(p)));
}

/// The pods a disruption of `node` would move: drainable and not already leaving.
fn pods_to_move(read: &ReadModel, node: &Node) -> Vec<Arc<CachedPod>> {
    read.pods_on(&node.name_any())
        .into_iter()
        .filter(|p| drainable(p) && p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// The price of the offering a claim labelled `labels` of `pool` runs on, if its pool offers it.
fn offered_price(types: &PoolTypes<'_>, pool: &str, labels: &BTreeMap<String, String>) -> Option<f64> {
    let capacity_type = CapacityType::from_label(labels.get(CAPACITY_TYPE)?)?;
    let zone = labels.get(ZONE)?;
    types
        .get(pool)
        .and_then(|types| types.get(labels.get(INSTANCE_TYPE)?))
        .and_then(|it| {
            it.offerings
                .iter()
                .find(|o| &o.zone == zone && o.capacity_type == capacity_type)
        })
        .map(|o| o.price)
}

/// The candidate of `claim`, or why it is none.
fn candidate(
    read: &ReadModel,
    types: &PoolTypes<'_>,
    claim: &Arc<NodeClaim>,
    now_seconds: i64,
) -> Result<Candidate, Excluded> {
    let status = claim.status.as_ref().ok_or(Excluded::NoStatus)?;
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(Excluded::Deleting);
    }
    if !is_true(&status.conditions, ConditionType::Initialized) {
        return Err(Excluded::NotInitialized);
    }
    let labels = claim.labels();
    let pool_name = labels.get(NODEPOOL).ok_or(Excluded::NoNodePool)?;
    let pool = read.node_pool(pool_name).ok_or(Excluded::UnknownNodePool)?;
    // A static pool keeps its own size: its nodes are no candidates for any method.
    if crate::decide::static_capacity::is_static(&pool) {
        return Err(Excluded::Static);
    }
    let node = (status.provider_id.as_deref())
        .and_then(|id| read.node_for_provider(id))
        .ok_or(Excluded::NotRegistered)?;
    if node.metadata.deletion_timestamp.is_some() {
        return Err(Excluded::NodeDeleting);
    }
    if is_disrupted(&node) {
        return Err(Excluded::NodeDisrupted);
    }
    let capacity_type = (labels.get(CAPACITY_TYPE))
        .and_then(|label| CapacityType::from_label(label))
        .ok_or(Excluded::MissingLabel(CAPACITY_TYPE))?;
    for label in [INSTANCE_TYPE, ZONE] {
        if !labels.contains_key(label) {
            return Err(Excluded::MissingLabel(label));
        }
    }
    let drifted = is_true(&status.conditions, ConditionType::Drifted);
    let offered = offered_price(types, pool_name, labels);
    // A drifted node whose type is no longer offered must still be replaced: it is priced at
    // nothing, so no consolidation ever picks it.
    let price = match (offered, drifted) {
        (Some(price), _) => price,
        (None, true) => 0.0,
        (None, false) if types.contains_key(pool_name) => return Err(Excluded::NotOffered),
        (None, false) => return Err(Excluded::PoolLeftOut),
    };
    let pods = pods_to_move(read, &node);
    let reschedule_cost = node_disruption_cost(pods.iter().map(|p| eviction_cost(p)));
    let consolidatable = window_end(read, claim, &node, &pool).is_some_and(|end| now_seconds >= end);
    Ok(Candidate {
        claim: claim.clone(),
        node,
        pool,
        price,
        capacity_type,
        pods,
        reschedule_cost,
        consolidatable,
        waits_for_pool: false,
        drifted,
    })
}

/// Why every graceful method must leave the candidate's node alone, if it must, with the
/// blocker's name for it: its do-not-disrupt annotation, a provisioning pass that counted on it
/// for pods not yet there, or a CapacityBuffer's virtual pods on it (the room they keep is the
/// buffer's).
fn node_blocker(
    read: &ReadModel,
    buffers: &Buffers,
    candidate: &Candidate,
    now_seconds: i64,
) -> Option<(String, Option<Blocker>)> {
    if candidate
        .node
        .annotations()
        .get(DO_NOT_DISRUPT)
        .is_some_and(|v| v == "true")
    {
        return Some((format!("node has the {DO_NOT_DISRUPT} annotation"), None));
    }
    let nominated = read.nominated(&candidate.node_name(), now_seconds)
        || read.nominated(&candidate.claim.name_any(), now_seconds);
    if nominated {
        return Some((
            "node is nominated for a pending pod".to_owned(),
            Some(Blocker::Nominated),
        ));
    }
    let buffered = buffers.holds(&candidate.node_name()) || buffers.holds(&candidate.claim.name_any());
    buffered.then(|| ("node has buffer pods".to_owned(), Some(Blocker::BufferPods)))
}

/// Why a pod of the candidate cannot be simulated elsewhere (node affinity `matchFields`, a
/// malformed term), if one cannot: its node stays, rather than being judged without the pod.
fn unsimulated_pod(read: &ReadModel, candidate: &Candidate) -> Option<String> {
    candidate
        .pods
        .iter()
        .find_map(|pod| read.pod_info(pod).err())
        .map(|error| format!("{error}, so it cannot be simulated elsewhere"))
}

/// Which of the candidate's pods cannot be evicted now, if one cannot.
fn pod_blocker(
    candidate: &Candidate,
    budgets: &[Arc<PodDisruptionBudget>],
    now_seconds: i64,
) -> Option<String> {
    for pod in &candidate.pods {
        // Named only when it blocks: every node's pods are looked at on every pass.
        let name = || format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        if do_not_disrupt(pod, now_seconds) {
            return Some(format!("pod {} has the {DO_NOT_DISRUPT} annotation", name()));
        }
        let covering: Vec<&Arc<PodDisruptionBudget>> = budgets.iter().filter(|b| covers(b, pod)).collect();
        match covering.as_slice() {
            [] => {}
            [budget] => {
                let allowed = budget.status.as_ref().map_or(0, |s| s.disruptions_allowed);
                if allowed <= 0 {
                    return Some(format!(
                        "pdb {}/{} prevents pod evictions",
                        budget.namespace().unwrap_or_default(),
                        budget.name_any()
                    ));
                }
            }
            _ => return Some(format!("pod {} is covered by more than one pdb", name())),
        }
    }
    None
}

/// Whether `budget` selects `pod`.
pub fn covers(budget: &PodDisruptionBudget, pod: &CachedPod) -> bool {
    if budget.namespace() != pod.namespace() {
        return false;
    }
    let selector = budget.spec.as_ref().and_then(|s| s.selector.as_ref());
    label_selector("", "spec.selector", selector)
        .ok()
        .flatten()
        .is_some_and(|s| selects(Some(&s), pod.labels()))
}

/// Karpenter's per-pod eviction cost: `1 + deletion-cost/2^27 + priority/2^25`, within ±10.
pub fn eviction_cost(pod: &CachedPod) -> f64 {
    let deletion_cost = pod
        .annotations()
        .get("controller.kubernetes.io/pod-deletion-cost")
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let priority = pod.spec.as_ref().and_then(|s| s.priority).map_or(0.0, f64::from);
    (1.0 + deletion_cost / 2f64.powi(27) + priority / 2f64.powi(25)).clamp(-10.0, 10.0)
}

/// When the node's `consolidateAfter` window ends (epoch seconds): Karpenter's `Consolidatable`
/// holds from then on, `consolidateAfter` after it initialized and after a pod last arrived or
/// left (as the watch saw it, or as the claim's `status.lastPodEventTime` recorded it before a
/// restart); `None` under `consolidateAfter: Never`.
fn window_end(read: &ReadModel, claim: &NodeClaim, node: &Node, pool: &NodePool) -> Option<i64> {
    let initialized = transitioned_at(claim, ConditionType::Initialized).unwrap_or(0);
    let changed = read
        .last_pod_event(&node.name_any())
        .into_iter()
        .chain(lifecycle::last_pod_event(claim))
        .fold(initialized, i64::max);
    Some(changed.saturating_add(consolidate_after(pool)?))
}

/// The NodePool's `consolidateAfter` in seconds; `None` for `Never`.
fn consolidate_after(pool: &NodePool) -> Option<i64> {
    let after = pool.spec.disruption.consolidate_after.duration()?;
    Some(i64::try_from(after.as_std().as_secs()).unwrap_or(i64::MAX))
}

/// Whether pods left the settling node of `candidate` within its window: room is being made
/// there, which consolidation will want to see.
fn making_room(read: &ReadModel, candidate: &Candidate, now_seconds: i64) -> bool {
    let after = consolidate_after(&candidate.pool).unwrap_or(0);
    read.last_pod_departure(&candidate.node_name())
        .is_some_and(|left| now_seconds < left.saturating_add(after))
}

/// Whether a consolidatable `candidate`, in a NodePool making room `since` then (pods left some
/// of its nodes within their window), waits for those nodes to settle: for at most two
/// `consolidateAfter` from `since`. After a scale-down every node it touched settles within a
/// window or so of the others (the deletions themselves take a while); consolidation decided
/// while some still settle may move no pod onto them, so it takes the open nodes a few at a time,
/// and each move restarts the window of the nodes its pods land on. Waiting lets one decision see
/// them all; pods arriving (consolidation's own moves among them) make no one wait, and the bound,
/// counted from the start of the pool's making room, keeps a pool whose pods never stop leaving
/// consolidating.
fn waits_for_pool(candidate: &Candidate, since: i64, now_seconds: i64) -> bool {
    let Some(after) = consolidate_after(&candidate.pool) else {
        return false;
    };
    candidate.consolidatable && now_seconds < since.saturating_add(after.saturating_mul(2))
}

/// Since when each NodePool has been making room (pods left one of its nodes within that node's
/// `consolidateAfter` window), as the planner's passes saw it: kept from pass to pass while the
/// pool makes room, forgotten at the first pass that sees it no longer does (and on a restart,
/// when the next pass starts counting again).
#[derive(Debug, Default)]
pub struct Freeing(std::sync::Mutex<BTreeMap<String, i64>>);

impl Freeing {
    /// Notes that `pools`, and no others, are making room at `now_seconds`; since when each has
    /// been.
    pub fn update(&self, pools: &BTreeSet<String>, now_seconds: i64) -> BTreeMap<String, i64> {
        let mut since = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        since.retain(|pool, _| pools.contains(pool));
        for pool in pools {
            since.entry(pool.clone()).or_insert(now_seconds);
        }
        since.clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const NOW: i64 = 1_767_225_600;

    fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An initialized claim (an hour ago) whose status records a pod event `ago` seconds ago.
    fn claim(recorded_ago: Option<i64>) -> NodeClaim {
        let mut status = json!({"conditions": [{"type": "Initialized", "status": "True", "reason": "Initialized",
            "message": "", "lastTransitionTime": joist_messages::time::rfc3339(NOW - 3600)}]});
        if let Some(ago) = recorded_ago {
            status["lastPodEventTime"] = json!(joist_messages::time::rfc3339(NOW - ago));
        }
        object(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "c"},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}},
            "status": status,
        }))
    }

    #[test]
    fn a_pool_making_room_counts_from_the_first_pass_that_saw_it_until_one_that_does_not() {
        let freeing = Freeing::default();
        let pools = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        let since = |pairs: &[(&str, i64)]| {
            pairs
                .iter()
                .map(|(pool, at)| ((*pool).to_owned(), *at))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(freeing.update(&pools(&["a"]), 100), since(&[("a", 100)]));
        assert_eq!(
            freeing.update(&pools(&["a", "b"]), 110),
            since(&[("a", 100), ("b", 110)]),
            "a pool still making room keeps its start"
        );
        assert_eq!(
            freeing.update(&pools(&["b"]), 120),
            since(&[("b", 110)]),
            "one that no longer does is forgotten"
        );
        assert_eq!(
            freeing.update(&pools(&["a"]), 130),
            since(&[("a", 130)]),
            "and counts again from its next start"
        );
    }

    #[test]
    fn consolidate_after_counts_from_the_pod_event_a_claim_recorded_before_a_restart() {
        // A controller just started: its watch has seen no pod come or go.
        let (read, _writers) = ReadModel::new();
        let pool: NodePool = object(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"disruption": {"consolidateAfter": "5m"}, "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [],
            }}},
        }));
        let node: Node = object(json!({"metadata": {"name": "n"}}));
        let consolidatable =
            |claim: &NodeClaim| window_end(&read, claim, &node, &pool).is_some_and(|end| NOW >= end);
        assert!(consolidatable(&claim(None)));
        assert!(
            !consolidatable(&claim(Some(60))),
            "a pod left a minute before the restart: four minutes to go"
        );
        assert!(consolidatable(&claim(Some(300))));
    }

    #[test]
    fn every_node_of_a_balanced_pool_counts_in_its_totals_candidate_or_not() {
        use kube::runtime::watcher::Event;
        let (read, mut writers) = ReadModel::new();
        for (name, policy) in [("balanced", "Balanced"), ("other", "WhenEmptyOrUnderutilized")] {
            let pool: NodePool = object(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"disruption": {"consolidationPolicy": policy}, "template": {"spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                    "requirements": [],
                }}},
            }));
            writers.node_pools.apply_watcher_event(&Event::Apply(pool));
        }
        let launching = |pool: &str| -> NodeClaim {
            object(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": format!("{pool}-launching"), "labels": {NODEPOOL: pool}},
                "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}},
            }))
        };
        let mut totals = BTreeMap::new();
        let types = PoolTypes::new();
        for pool in ["balanced", "other"] {
            count_in_balanced_totals(&read, &types, &launching(pool), &mut totals);
        }
        assert_eq!(
            totals,
            BTreeMap::from([(
                "balanced".to_owned(),
                PoolTotals {
                    cost: 0.0,
                    disruption: 1.0
                }
            )]),
            "a node still launching is one node's disruption of its Balanced pool, and nothing of another"
        );
    }

    #[test]
    fn a_node_counted_on_for_pending_pods_is_no_candidate_for_the_nomination_window() {
        let (read, _writers) = ReadModel::new();
        let pool: NodePool = object(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [],
            }}},
        }));
        let candidate = Candidate {
            claim: Arc::new(claim(None)),
            node: Arc::new(object(json!({"metadata": {"name": "n"}}))),
            pool: Arc::new(pool),
            price: 0.1,
            capacity_type: CapacityType::OnDemand,
            pods: Vec::new(),
            reschedule_cost: 1.0,
            consolidatable: true,
            waits_for_pool: false,
            drifted: false,
        };
        assert_eq!(node_blocker(&read, &Buffers::default(), &candidate, NOW), None);
        let window = crate::decide::timing::nomination_window(std::time::Duration::from_secs(10));
        assert_eq!(window.as_secs(), 20, "Karpenter's: two batches of 10 s");
        read.nominate(["n".to_owned()], NOW, NOW + 20);
        assert_eq!(
            node_blocker(&read, &Buffers::default(), &candidate, NOW + 19),
            Some((
                "node is nominated for a pending pod".to_owned(),
                Some(Blocker::Nominated)
            ))
        );
        assert_eq!(
            node_blocker(&read, &Buffers::default(), &candidate, NOW + 20),
            None,
            "the window passed"
        );
        // Nominated while it was in flight, by its NodeClaim's name.
        read.nominate(["c".to_owned()], NOW + 20, NOW + 40);
        assert!(node_blocker(&read, &Buffers::default(), &candidate, NOW + 30).is_some());
    }
}

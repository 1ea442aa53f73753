//! `joist explain node NAME` (a Node or its NodeClaim): what the node is and when it was
//! launched and the pods it was launched for, where it stands in the disruption pass (not a candidate, and why; a candidate that
//! stays, with its blocker; or one the pass would disrupt now), a dry run of removing it alone
//! (where each pod would go, the replacement and its price, the saving), and what would hold
//! its removal (the NodePool's budgets, PodDisruptionBudgets, `karpenter.sh/do-not-disrupt`).
//!
//! The pass is the planner's own over the cluster as read, with nothing in flight: a command the
//! controller has in flight shows only by its taints and deletions. What the controller keeps in
//! memory and the pass reads is rehearsed first: the CapacityBuffers' pods and the nodes holding
//! them, and the nodes a provisioning pass would nominate for pending pods.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    sync::Arc,
};

use joist_messages::{
    apis::{NodeClaim, nodepool::DisruptionReason},
    cached_pod::CachedPod,
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE, annotations::DO_NOT_DISRUPT},
    pods::do_not_disrupt,
};
use joist_scheduling::{
    Input, Solution,
    consolidation::{Decision, Settings},
};
use k8s_openapi::api::core::v1::Event;
use kube::{Api, ResourceExt, api::ListParams};
use serde::Serialize;

use super::{ExplainError, utc};
use crate::{
    capacity_buffers::{self, Statuses},
    disruption::{
        self, Budgets, Judged,
        candidates::{Candidate, Collected, Excluded, covers},
        in_flight::Holding,
        methods::{self, Base, Plan},
    },
    effects::nominations,
    problem::LeftOut,
    provisioner,
    shared::Shared,
    state::read_model::ReadModel,
};

/// The replacement types an answer names, cheapest first.
const TYPES_SHOWN: usize = 5;

/// See the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct NodeAnswer {
    /// The Node (empty while its NodeClaim has none).
    pub node: String,
    /// Its NodeClaim, when it has one.
    pub nodeclaim: Option<String>,
    /// Its NodePool, when it has one.
    pub nodepool: Option<String>,
    /// Its instance type, capacity type and zone (its labels).
    pub instance_type: String,
    /// `on-demand`, `spot` or `reserved`.
    pub capacity_type: String,
    /// Its zone.
    pub zone: String,
    /// Its price per hour, when its offering is known.
    pub price_per_hour: Option<f64>,
    /// When its NodeClaim was created (RFC 3339).
    pub launched: Option<String>,
    /// The pods it was launched for, as the cluster still tells it.
    pub launched_for: LaunchedFor,
    /// The pods that would have to move (`namespace/name`).
    pub pods: Vec<String>,
    /// Where it stands in the disruption pass.
    pub standing: Standing,
    /// Removing it alone, simulated.
    pub removal: Option<Removal>,
    /// What would hold its removal now.
    pub holds: Vec<String>,
}

/// The pods a node was launched for, as the cluster still tells it: its NodeClaim's `Nominated`
/// events (kept for the API server's Event TTL, an hour by default, and rate limited across all
/// pods, so a large batch tells only some), and the pods on it that are older than it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LaunchedFor {
    /// Pods told by a `Nominated` event to schedule on its NodeClaim before it had a Node: it was
    /// launched for them, or counted on for them while it launched.
    pub nominated: Vec<String>,
    /// Pods on it now that existed before its NodeClaim was created: it was launched for them,
    /// or they moved to it since.
    pub older_pods_on_it: Vec<String>,
    /// Why the events could not be read, when they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_unreadable: Option<String>,
}

/// Where a node stands in the disruption pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Standing {
    /// Not a candidate at all.
    NotCandidate {
        /// Why.
        reason: String,
        /// Its blocker, when the vocabulary has one.
        blocker: Option<String>,
    },
    /// A candidate the pass leaves where it is.
    Stays {
        /// The blocker.
        blocker: Option<String>,
        /// Why, in words.
        reason: String,
    },
    /// A candidate the pass would disrupt now.
    Disrupted {
        /// The method (`emptiness`, `drift`, `multi-node`, `single-node`).
        method: String,
        /// What the command does with it.
        decision: String,
    },
}

/// Removing the node alone, as single-node consolidation simulates it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Removal {
    /// `delete`, `replace`, or `stays` when its pods could not all go.
    pub outcome: String,
    /// Where each pod would go.
    pub moves: Vec<Move>,
    /// The replacement, when one would be launched.
    pub replacement: Option<Replacement>,
    /// What the cluster would save per hour.
    pub saving_per_hour: Option<f64>,
    /// Why it could not go, when it could not.
    pub refusal: Option<String>,
}

/// Where one pod would go.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Move {
    /// The pod (`namespace/name`).
    pub pod: String,
    /// `node NAME`, or `the replacement`.
    pub to: String,
}

/// The node a removal would launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replacement {
    /// Its instance types, cheapest first (the first few).
    pub instance_types: Vec<String>,
    /// The cheapest it may launch at, per hour.
    pub price_per_hour: f64,
}

/// The answer for the Node, or NodeClaim, `name`.
pub async fn explain(shared: &Shared, name: &str) -> Result<NodeAnswer, ExplainError> {
    let read = &shared.read;
    let (node_name, claim) = locate(read, name)?;
    rehearse(shared).await;
    let now = shared.clock.now_seconds();
    let pass = Pass::of(shared, now).await;
    let (collected, budgets) = (&pass.collected, &pass.budgets);
    let base = pass.base(shared);
    let claim_name = claim.as_ref().map(|c| c.name_any()).unwrap_or_default();
    let candidate = candidate_of(collected, &claim_name);
    let standing = match candidate {
        Some(_) => standing(collected, &plan(collected, &base, budgets), &claim_name),
        None => Standing::NotCandidate {
            reason: why_excluded(
                claim.as_deref(),
                (collected.excluded.iter())
                    .find(|(c, _)| c.name_any() == claim_name)
                    .map(|(_, why)| why),
                &pass.left_out,
            ),
            blocker: None,
        },
    };
    let pods: Vec<Arc<CachedPod>> = match candidate {
        Some(c) => c.pods.clone(),
        None => read.pods_on(&node_name),
    };
    let launched_for = launched_for(shared, claim.as_deref(), &node_name).await;
    let node = read.node(&node_name);
    let label = |key: &str| {
        node.as_ref()
            .and_then(|n| n.labels().get(key).cloned())
            .or_else(|| claim.as_ref().and_then(|c| c.labels().get(key).cloned()))
            .unwrap_or_default()
    };
    Ok(NodeAnswer {
        node: node_name.clone(),
        nodeclaim: claim.as_ref().map(|c| c.name_any()),
        nodepool: claim.as_ref().and_then(|c| c.labels().get(NODEPOOL).cloned()),
        instance_type: label(INSTANCE_TYPE),
        capacity_type: label(CAPACITY_TYPE),
        zone: label(ZONE),
        price_per_hour: candidate.map(|c| c.price),
        launched: claim
            .as_ref()
            .and_then(|c| c.metadata.creation_timestamp.as_ref())
            .map(|t| utc(t.0.as_second())),
        launched_for,
        pods: pods.iter().map(|p| pod_key(p)).collect(),
        removal: candidate.and_then(|c| removal(c, &base)),
        holds: candidate.map_or_else(Vec::new, |c| holds(read, budgets, c, now)),
        standing,
    })
}

/// The pods the node `node_name` (of NodeClaim `claim`) was launched for: the pods whose
/// `Nominated` events name its NodeClaim before it had a Node, and the pods on it older than its
/// NodeClaim.
async fn launched_for(shared: &Shared, claim: Option<&NodeClaim>, node_name: &str) -> LaunchedFor {
    let Some(claim) = claim else {
        return LaunchedFor::default();
    };
    let launched = format!("nodeclaim/{}", claim.name_any());
    let older_pods_on_it: BTreeSet<String> = match &claim.metadata.creation_timestamp {
        Some(created) => shared
            .read
            .pods_on(node_name)
            .iter()
            .filter(|pod| {
                pod.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0 < created.0)
            })
            .map(|pod| pod_key(pod))
            .collect(),
        None => BTreeSet::new(),
    };
    let events: Api<Event> = Api::all(shared.client.clone());
    let listed = events
        .list(
            &ListParams::default().fields(&format!("reason={},involvedObject.kind=Pod", nominations::REASON)),
        )
        .await;
    let (nominated, events_unreadable) = match listed {
        Ok(listed) => {
            let nominated: BTreeSet<String> = listed
                .items
                .iter()
                .filter(|event| {
                    // Told before it had a Node: when it was launched, or while it launched.
                    let message = event.message.as_deref().unwrap_or_default();
                    let targets: Vec<&str> = nominations::targets(message).collect();
                    targets.contains(&launched.as_str()) && !targets.iter().any(|t| t.starts_with("node/"))
                })
                .map(|event| {
                    let pod = &event.involved_object;
                    format!(
                        "{}/{}",
                        pod.namespace.as_deref().unwrap_or_default(),
                        pod.name.as_deref().unwrap_or_default()
                    )
                })
                .collect();
            (nominated.into_iter().collect(), None)
        }
        Err(error) => (Vec::new(), Some(error.to_string())),
    };
    LaunchedFor {
        nominated,
        older_pods_on_it: older_pods_on_it.into_iter().collect(),
        events_unreadable,
    }
}

/// Where every managed node stands in one disruption pass over `shared`'s view, by Node name
/// (a NodeClaim without a Node yet is left out): what `explain node` says of each, without the
/// dry runs. For the controllers' own view, whose buffers and nominations are real.
pub async fn standings(shared: &Shared) -> BTreeMap<String, Standing> {
    let now = shared.clock.now_seconds();
    let pass = Pass::of(shared, now).await;
    let collected = &pass.collected;
    let plan = plan(collected, &pass.base(shared), &pass.budgets);
    let excluded: HashMap<String, &Excluded> = (collected.excluded.iter())
        .map(|(claim, why)| (claim.name_any(), why))
        .collect();
    shared
        .read
        .node_claims()
        .iter()
        .filter_map(|claim| {
            let node = claim.status.as_ref()?.node_name.clone()?;
            let name = claim.name_any();
            let standing = match candidate_of(collected, &name) {
                Some(_) => standing(collected, &plan, &name),
                None => Standing::NotCandidate {
                    reason: why_excluded(Some(claim), excluded.get(&name).copied(), &pass.left_out),
                    blocker: None,
                },
            };
            Some((node, standing))
        })
        .collect()
}

/// The disruption pass's problem with its nodes placed, its candidates and the budgets, with
/// nothing in flight.
struct Pass {
    input: Input,
    collected: Collected,
    left_out: Vec<LeftOut>,
    budgets: Budgets,
    positions: BTreeMap<String, usize>,
    settling: Vec<usize>,
}

impl Pass {
    /// The pass as of `now`.
    async fn of(shared: &Shared, now: i64) -> Self {
        let Judged {
            mut input,
            pools,
            collected,
            left_out,
        } = disruption::judge(shared, now).await;
        let budgets = Budgets::of(shared, pools, &Holding::default(), now);
        let (positions, settling, _) =
            disruption::place_nodes(shared, &mut input, &collected.settling, &BTreeSet::new());
        Self {
            input,
            collected,
            left_out,
            budgets,
            positions,
            settling,
        }
    }

    /// The base the methods simulate over.
    fn base<'a>(&'a self, shared: &'a Shared) -> Base<'a> {
        Base {
            read: &shared.read,
            input: &self.input,
            positions: self.positions.clone(),
            settling: self.settling.clone(),
            held: Vec::new(),
            settings: Settings {
                spot_to_spot: shared.settings.spot_to_spot_consolidation,
            },
            balanced: self.collected.balanced_totals.clone(),
        }
    }
}

/// The methods' plan over the pass.
fn plan(collected: &Collected, base: &Base<'_>, budgets: &Budgets) -> Plan {
    methods::plan(
        &collected.candidates,
        &collected.eventual,
        base,
        |pool: &str, reason| budgets.allowed(pool, reason),
    )
}

/// The NodeClaim `claim`'s candidate, blocked or not.
fn candidate_of<'a>(collected: &'a Collected, claim: &str) -> Option<&'a Candidate> {
    let is_it = |c: &&Candidate| c.claim.name_any() == claim;
    (collected.candidates.iter().chain(&collected.eventual))
        .find(is_it)
        .or_else(|| collected.blocked.iter().map(|b| &b.candidate).find(is_it))
}

/// Where the NodeClaim `claim`, a candidate, stands after `plan`.
fn standing(collected: &Collected, plan: &Plan, claim: &str) -> Standing {
    if let Some(blocked) = collected
        .blocked
        .iter()
        .find(|b| b.candidate.claim.name_any() == claim)
    {
        return Standing::NotCandidate {
            reason: blocked.reason.clone(),
            blocker: blocked.blocker.map(|b| b.label().to_owned()),
        };
    }
    judged(plan, claim)
}

/// Leaves in `shared` what the controller holds in memory and the pass reads: the
/// CapacityBuffers' virtual pods and the nodes holding them, and the nodes a provisioning pass
/// nominates for pending pods.
async fn rehearse(shared: &Shared) {
    capacity_buffers::resolve_all(shared, Statuses::Leave).await;
    provisioner::rehearse(shared).await;
}

/// The Node's name and its NodeClaim, for a Node or a NodeClaim called `name`.
fn locate(read: &ReadModel, name: &str) -> Result<(String, Option<Arc<NodeClaim>>), ExplainError> {
    if read.node(name).is_some() {
        return Ok((
            name.to_owned(),
            read.claim_for_node(name).and_then(|c| read.node_claim(&c)),
        ));
    }
    let claim = read.node_claim(name).ok_or_else(|| ExplainError::NotFound {
        kind: "node or nodeclaim",
        name: name.to_owned(),
    })?;
    let node = claim
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    Ok((node, Some(claim)))
}

/// Where the pass left the candidate of the NodeClaim `name`: disrupted by a command, or kept
/// for a blocker.
fn judged(plan: &Plan, name: &str) -> Standing {
    if let Some(command) = (plan.commands.iter()).find(|c| c.claim_names().iter().any(|c| c == name)) {
        return Standing::Disrupted {
            method: command.method.name().to_owned(),
            decision: decision(&command.decision),
        };
    }
    let refusal = plan
        .refusals
        .iter()
        .find(|(c, _)| c.claim.name_any() == name)
        .map(|(_, refusal)| refusal.to_string());
    let blocker = plan.verdicts.of(name);
    let reason = refusal.unwrap_or_else(|| match blocker {
        Some(blocker) => blocker.describe().to_owned(),
        None => "no disruption method chose it in this pass".to_owned(),
    });
    Standing::Stays {
        blocker: blocker.map(|b| b.label().to_owned()),
        reason,
    }
}

/// A decision in words.
fn decision(decision: &Decision) -> String {
    match decision {
        Decision::Delete => "delete: its pods fit on the other nodes".to_owned(),
        Decision::Replace(replacement) => {
            format!("replace with a node at ${:.4}/h", replacement.price)
        }
        Decision::Relaunch(claims) => format!("replace with {} new nodes", claims.len()),
    }
}

/// Why the NodeClaim `claim` (or a Node without one) is no candidate at all, as the pass found
/// (`excluded`), with why its NodePool was left out of the pass when it was.
fn why_excluded(claim: Option<&NodeClaim>, excluded: Option<&Excluded>, left_out: &[LeftOut]) -> String {
    let Some(claim) = claim else {
        return "the node has no NodeClaim: no NodePool manages it".to_owned();
    };
    let Some(excluded) = excluded else {
        return "the pass did not see its NodeClaim".to_owned();
    };
    let pool = claim.labels().get(NODEPOOL);
    match left_out.iter().find(|left| Some(&left.nodepool) == pool) {
        Some(left) if *excluded == Excluded::PoolLeftOut => format!("{excluded}: {left}"),
        _ => excluded.to_string(),
    }
}

/// Removing `candidate` alone, simulated; `None` when it is not in the simulation's base.
fn removal(candidate: &Candidate, base: &Base<'_>) -> Option<Removal> {
    let pods: Vec<String> = candidate.pods.iter().map(|p| pod_key(p)).collect();
    Some(match methods::removal(candidate, base)? {
        Ok((decision, solution)) => Removal {
            outcome: match decision {
                Decision::Delete => "delete",
                Decision::Replace(_) | Decision::Relaunch(_) => "replace",
            }
            .to_owned(),
            moves: moves(&pods, &solution, base),
            replacement: match &decision {
                Decision::Replace(r) => Some(Replacement {
                    instance_types: r
                        .claim
                        .instance_types
                        .iter()
                        .take(TYPES_SHOWN)
                        .map(|&t| base.input.instance_types[t].name.clone())
                        .collect(),
                    price_per_hour: r.price,
                }),
                _ => None,
            },
            saving_per_hour: Some(candidate.price - decision.launch_price()),
            refusal: None,
        },
        Err(refusal) => Removal {
            outcome: "stays".to_owned(),
            moves: Vec::new(),
            replacement: None,
            saving_per_hour: None,
            refusal: Some(refusal.to_string()),
        },
    })
}

/// Where each of `pods` goes in `solution` (its pods are the candidate's, in order).
fn moves(pods: &[String], solution: &Solution, base: &Base<'_>) -> Vec<Move> {
    let mut moves: Vec<Move> = solution
        .placements
        .iter()
        .map(|p| Move {
            pod: pods[p.pod].clone(),
            to: format!("node {}", base.input.nodes[p.node].name),
        })
        .chain(solution.claims.iter().flat_map(|c| &c.pods).map(|&p| Move {
            pod: pods[p].clone(),
            to: "the replacement".to_owned(),
        }))
        .collect();
    moves.sort_by(|a, b| a.pod.cmp(&b.pod));
    moves
}

/// What would hold `candidate`'s removal now: a budget allowing nothing for its reason, a
/// PodDisruptionBudget allowing no eviction of its pods, the do-not-disrupt annotation.
fn holds(read: &ReadModel, budgets: &Budgets, candidate: &Candidate, now: i64) -> Vec<String> {
    let pool = candidate.pool.name_any();
    let mut holds = Vec::new();
    let reason = if candidate.drifted {
        DisruptionReason::Drifted
    } else if candidate.pods.is_empty() {
        DisruptionReason::Empty
    } else {
        DisruptionReason::Underutilized
    };
    if budgets.allowed(&pool, reason) == 0 {
        holds.push(format!(
            "nodepool {pool}'s budgets allow no {reason:?} disruption now"
        ));
    }
    if candidate
        .node
        .annotations()
        .get(DO_NOT_DISRUPT)
        .is_some_and(|v| v == "true")
    {
        holds.push(format!("the node has {DO_NOT_DISRUPT}"));
    }
    let pdbs = read.disruption_budgets();
    for pod in &candidate.pods {
        if do_not_disrupt(pod, now) {
            holds.push(format!("pod {} has {DO_NOT_DISRUPT}", pod_key(pod)));
        }
        for pdb in pdbs.iter().filter(|b| covers(b, pod)) {
            let allowed = pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed);
            if allowed <= 0 {
                holds.push(format!(
                    "pdb {}/{} allows no eviction of pod {}",
                    pdb.namespace().unwrap_or_default(),
                    pdb.name_any(),
                    pod_key(pod)
                ));
            }
        }
    }
    holds
}

/// `namespace/name` of `pod`.
fn pod_key(pod: &CachedPod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

impl fmt::Display for NodeAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.node)?;
        if let Some(claim) = &self.nodeclaim {
            write!(f, " (nodeclaim {claim}")?;
            if let Some(pool) = &self.nodepool {
                write!(f, ", nodepool {pool}")?;
            }
            write!(f, ")")?;
        }
        writeln!(f)?;
        write!(
            f,
            "  {} {} in {}",
            self.instance_type, self.capacity_type, self.zone
        )?;
        if let Some(price) = self.price_per_hour {
            write!(f, " at ${price:.4}/h")?;
        }
        if let Some(launched) = &self.launched {
            write!(f, ", launched {launched}")?;
        }
        writeln!(f)?;
        writeln!(f, "{}", self.launched_for)?;
        writeln!(f, "  pods to move: {}", list(&self.pods))?;
        writeln!(f, "{}", self.standing)?;
        if let Some(removal) = &self.removal {
            writeln!(f, "removing it alone: {}", removal.outcome)?;
            if let Some(refusal) = &removal.refusal {
                writeln!(f, "  {refusal}")?;
            }
            for m in &removal.moves {
                writeln!(f, "  {} -> {}", m.pod, m.to)?;
            }
            if let Some(r) = &removal.replacement {
                writeln!(
                    f,
                    "  replacement: {} at ${:.4}/h",
                    r.instance_types.join(", "),
                    r.price_per_hour
                )?;
            }
            if let Some(saving) = removal.saving_per_hour {
                writeln!(f, "  saving: ${saving:.4}/h")?;
            }
        }
        if !self.holds.is_empty() {
            writeln!(f, "held by:")?;
            for hold in &self.holds {
                writeln!(f, "  {hold}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for LaunchedFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  launched for (Nominated events): ")?;
        match &self.events_unreadable {
            Some(why) => writeln!(f, "unknown, the events could not be read: {why}")?,
            None => writeln!(f, "{}", list(&self.nominated))?,
        }
        write!(f, "  pods on it older than it: {}", list(&self.older_pods_on_it))
    }
}

impl fmt::Display for Standing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (said, reason, blocker) = match self {
            Standing::NotCandidate { reason, blocker } => ("not a disruption candidate", reason, blocker),
            Standing::Stays { blocker, reason } => ("a candidate that stays", reason, blocker),
            Standing::Disrupted { method, decision } => {
                return write!(f, "the next disruption pass would take it ({method}): {decision}");
            }
        };
        write!(f, "{said}: {reason}")?;
        if let Some(blocker) = blocker {
            write!(f, " (blocker: {blocker})")?;
        }
        Ok(())
    }
}

/// `items` joined, or `none`.
fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

//! Carries out a disruption command, as Karpenter's orchestration queue does:
//!
//! 1. taint each candidate's Node `karpenter.sh/disrupted:NoSchedule` (nothing new lands there),
//!    in place of the `PreferNoSchedule` taint it carried while its decision waited for
//!    validation ([`steer_away`]), and set its NodeClaim's `DisruptionReason` condition;
//! 2. when the command replaces, create the replacement NodeClaims (`DisruptionLaunching`) and
//!    wait until every one is Initialized (`DisruptionWaitingReadiness`), at most
//!    [`REPLACEMENT_TIMEOUT`]; meanwhile the provisioner puts no other pending pod on them
//!    ([`ReadModel::reserve`]), so the candidates' pods find the room they were counted into;
//! 3. delete the candidates' NodeClaims (`DisruptionTerminating`): termination drains them
//!    through the Eviction API;
//! 4. hold what the command counted on (its [`Ticket`]) until the candidates' NodeClaims are gone,
//!    their pods moved, at most [`DRAIN_HOLD`]: the budgets count them as deleting meanwhile.
//!
//! A failure before step 3 (a write refused, the replacement deleted or not ready in time) rolls
//! back: the taints and conditions are removed and the candidates keep serving
//! (`DisruptionRolledBack`). Replacements already created are kept, as Karpenter's queue keeps
//! them: one that never turns Ready ends at its own initialization timeout, one that turns Ready
//! late serves pending pods or is consolidated away; deleting it at the rollback only launched
//! another at the next decision. Writes of the Node's taints carry its
//! `resourceVersion` and are retried on a fresh read when another agent got there first.

use std::time::Duration;

use joist_messages::{
    apis::NodeClaim,
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate, is_true},
    labels::{NODEPOOL, TERMINATION_FINALIZER, taints},
};
use joist_scheduling::consolidation::Decision;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{Api, ResourceExt, api::PostParams};
use serde_json::json;

use super::{Planned, candidates::Candidate, in_flight::Ticket, reason_label};
use crate::{
    decide::lifecycle::{disrupted_taint, node_taints},
    effects::faults::Step,
    effects::kube_ops,
    effects::metrics::DecisionLabels,
    shared::Shared,
    state::read_model::ReadModel,
};

/// How long a replacement may take to become Initialized before the command is rolled back.
pub const REPLACEMENT_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How often a replacement's readiness, or a deleted candidate's end, is looked at.
const READINESS_POLL: Duration = Duration::from_secs(1);

/// How long a command holds the room it counted on after deleting its candidates, waiting for
/// them to be gone.
pub const DRAIN_HOLD: Duration = Duration::from_secs(10 * 60);

/// Attempts at an optimistic write before giving up on it.
const WRITE_ATTEMPTS: usize = 3;

/// Why a command could not finish.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("node {0} changed under every attempt to taint it")]
    Contended(String),
    #[error("the replacement {0} went away before it was ready")]
    ReplacementGone(String),
    #[error("the replacement {0} was not ready within {1}s")]
    ReplacementTimeout(String, u64),
}

/// Runs `planned` (see the module docs), holding `ticket` until it is done.
pub async fn run(shared: &Shared, planned: Planned, ticket: &Ticket) {
    let Planned {
        command,
        replacements,
    } = planned;
    let how = match &command.decision {
        Decision::Delete => "Delete",
        Decision::Replace(_) | Decision::Relaunch(_) => "Replace",
    };
    let reason = format!("{:?}", command.reason);
    let label = format!("{reason}/{how}");
    let detail = describe(&command);
    let mut created = Vec::new();
    let mut reserved = Reserved {
        read: &shared.read,
        claims: Vec::new(),
    };
    let outcome = async {
        for candidate in &command.candidates {
            mark(shared, candidate, &reason, &detail).await?;
        }
        let faults = &shared.settings.faults;
        faults.reach(Step::DisruptionMarked).await;
        for replacement in &replacements {
            let name = launch(shared, replacement, &command.candidates, &label).await?;
            ticket.launched(name.clone());
            reserved.keep(&name);
            let pool = replacement.labels().get(NODEPOOL).cloned().unwrap_or_default();
            shared.metrics.created(&pool, reason_label(command.reason));
            created.push(name);
        }
        faults.reach(Step::ReplacementCreated).await;
        for name in &created {
            wait_until_initialized(shared, name, &command.candidates).await?;
        }
        faults.reach(Step::ReplacementInitialized).await;
        Ok::<(), Failure>(())
    }
    .await;
    if let Err(failure) = outcome {
        tracing::warn!(%failure, candidates = ?command.claim_names(), "disruption failed; rolling back");
        rollback(shared, &command.candidates, &failure.to_string()).await;
        return;
    }
    for candidate in &command.candidates {
        shared.events.normal(
            candidate.claim.as_ref(),
            "DisruptionTerminating",
            &format!("Disrupting NodeClaim: {label}; {detail}"),
        );
        let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
        if let Err(error) = kube_ops::delete(&claims, &candidate.claim.name_any()).await {
            tracing::warn!(nodeclaim = candidate.claim.name_any(), %error, "deleting a disrupted nodeclaim failed");
        }
    }
    // The candidates' pods are now the provisioner's to place, onto the replacements first.
    drop(reserved);
    count_decision(shared, &command, how);
    tracing::info!(method = command.method.name(), candidates = ?command.claim_names(), "disruption done");
    wait_until_gone(shared, &command.candidates).await;
}

/// The replacements a command launched, kept from the provisioner ([`ReadModel::reserve`]) until
/// it is dropped: once the candidates are deleted, at a rollback, or when the command ends any
/// other way.
struct Reserved<'a> {
    read: &'a ReadModel,
    claims: Vec<String>,
}

impl Reserved<'_> {
    fn keep(&mut self, claim: &str) {
        self.read.reserve(claim);
        self.claims.push(claim.to_owned());
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        for claim in &self.claims {
            self.read.release(claim);
        }
    }
}

/// Waits until the candidates' NodeClaims are gone, at most [`DRAIN_HOLD`].
async fn wait_until_gone(shared: &Shared, candidates: &[Candidate]) {
    let started = tokio::time::Instant::now();
    while started.elapsed() < DRAIN_HOLD
        && candidates
            .iter()
            .any(|c| shared.read.node_claim(&c.claim.name_any()).is_some())
    {
        tokio::time::sleep(READINESS_POLL).await;
    }
}

/// Counts a command carried out, and each NodeClaim it disrupted.
fn count_decision(shared: &Shared, command: &super::methods::Command, how: &str) {
    let reason = reason_label(command.reason);
    shared
        .metrics
        .disruption_decisions
        .get_or_create(&DecisionLabels {
            decision: how.to_lowercase(),
            reason: reason.to_owned(),
            consolidation_type: command.method.consolidation_type().to_owned(),
        })
        .inc();
    for candidate in &command.candidates {
        shared.metrics.disrupted(candidate.claim.as_ref(), reason);
    }
}

/// The command in words, for events and the report's timeline.
fn describe(command: &super::methods::Command) -> String {
    let replaced_by = match &command.decision {
        Decision::Delete => String::new(),
        Decision::Replace(r) => format!(" by one node from ${:.4}/h", r.price),
        Decision::Relaunch(claims) => format!(
            " by {} node{} from ${:.4}/h",
            claims.len(),
            if claims.len() == 1 { "" } else { "s" },
            command.decision.launch_price()
        ),
    };
    let savings = command.savings();
    let effect = if savings < 0.0 {
        format!("costing ${:.4}/h more", -savings)
    } else {
        format!("saving ${savings:.4}/h")
    };
    format!(
        "{} of {}{replaced_by}, {effect}",
        command.method.name(),
        command.claim_names().join(", "),
    )
}

/// Taints the candidate's Node and sets its claim's `DisruptionReason` condition (the reason,
/// and the command in words).
async fn mark(shared: &Shared, candidate: &Candidate, reason: &str, detail: &str) -> Result<(), Failure> {
    set_taint(shared, &candidate.node_name(), true).await?;
    set_reason(shared, &candidate.claim.name_any(), Some((reason, detail))).await
}

/// Adds the `karpenter.sh/disrupted:NoSchedule` taint, in place of the candidate's
/// ([`steer_away`]), or removes both.
async fn set_taint(shared: &Shared, node_name: &str, tainted: bool) -> Result<(), Failure> {
    let disrupted = tainted.then(disrupted_taint);
    edit_taints(shared, node_name, |current| {
        replacing(current, taints::DISRUPTION_MARKS, disrupted.clone())
    })
    .await
}

/// Taints the Node of a candidate a decision takes `joist.dev/disruption-candidate:PreferNoSchedule`
/// while the decision waits for its validation: kube-scheduler then places pods elsewhere when
/// they fit elsewhere, the evicted pods of the commands before it included, and the candidate stays
/// as the decision found it. A pod that fits nowhere else still lands there, and the validation
/// sees it. A Node already being disrupted is left as it is; a failed write only loses the
/// steering.
pub async fn steer_away(shared: &Shared, node_name: &str) {
    let steered = edit_taints(shared, node_name, |current| {
        if marked(current) {
            current.to_vec()
        } else {
            replacing(current, &[], Some(candidate_taint()))
        }
    })
    .await;
    if let Err(error) = steered {
        tracing::debug!(node = node_name, %error, "tainting a disruption candidate failed; it takes pods meanwhile");
    }
}

/// Removes [`steer_away`]'s taint from the Node of a candidate its validation left out; a failed
/// write is left to the clean-up at the next start.
pub async fn stop_steering(shared: &Shared, node_name: &str) {
    let released = edit_taints(shared, node_name, |current| {
        replacing(current, &[taints::DISRUPTION_CANDIDATE], None)
    })
    .await;
    if let Err(error) = released {
        tracing::warn!(node = node_name, %error, "removing a disruption candidate's taint failed; the next start cleans up");
    }
}

/// Whether `current` taints carry the planner's mark: `karpenter.sh/disrupted`, or a candidate's taint.
fn marked(current: &[Taint]) -> bool {
    current
        .iter()
        .any(|t| taints::DISRUPTION_MARKS.contains(&t.key.as_str()))
}

/// `current` without the taints of `keys`, and with `added`.
fn replacing(current: &[Taint], keys: &[&str], added: Option<Taint>) -> Vec<Taint> {
    current
        .iter()
        .filter(|t| !keys.contains(&t.key.as_str()))
        .cloned()
        .chain(added)
        .collect()
}

/// The taint of [`steer_away`].
fn candidate_taint() -> Taint {
    Taint {
        key: taints::DISRUPTION_CANDIDATE.to_owned(),
        effect: "PreferNoSchedule".to_owned(),
        ..Taint::default()
    }
}

/// Writes the Node's taints as `edit` makes them from the current ones, against a fresh read each
/// attempt; nothing when they are the same.
async fn edit_taints(
    shared: &Shared,
    node_name: &str,
    edit: impl Fn(&[Taint]) -> Vec<Taint>,
) -> Result<(), Failure> {
    let nodes = kube_ops::cluster::<Node>(&shared.client);
    for _ in 0..WRITE_ATTEMPTS {
        let Some(node) = nodes.get_opt(node_name).await? else {
            return Ok(());
        };
        let wanted = edit(node_taints(&node));
        if wanted == node_taints(&node) {
            return Ok(());
        }
        let body =
            json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": wanted}});
        match kube_ops::patch(&nodes, node_name, body).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(Failure::Contended(node_name.to_owned()))
}

/// Sets the claim's `DisruptionReason` condition (reason and message), or removes it.
async fn set_reason(shared: &Shared, claim_name: &str, reason: Option<(&str, &str)>) -> Result<(), Failure> {
    let claims = kube_ops::cluster::<NodeClaim>(&shared.client);
    for _ in 0..WRITE_ATTEMPTS {
        let Some(claim) = claims.get_opt(claim_name).await? else {
            return Ok(());
        };
        let body = match reason {
            Some((reason, message)) => {
                let update =
                    ConditionUpdate::new(ConditionType::DisruptionReason, ConditionStatus::True, reason)
                        .with_message(message);
                kube_ops::claim_conditions_patch(&shared.clock, &claim, &[update], json!({}))
            }
            None => kube_ops::claim_condition_removal_patch(&claim, ConditionType::DisruptionReason),
        };
        match kube_ops::patch_status_body(&claims, claim_name, body).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(Failure::Contended(claim_name.to_owned()))
}

/// Creates the replacement; its name.
async fn launch(
    shared: &Shared,
    replacement: &NodeClaim,
    candidates: &[Candidate],
    label: &str,
) -> Result<String, Failure> {
    let api: Api<NodeClaim> = kube_ops::cluster(&shared.client);
    let created = api.create(&PostParams::default(), replacement).await?;
    let name = created.name_any();
    shared.read.record_created(created);
    for candidate in candidates {
        shared.events.normal(
            candidate.claim.as_ref(),
            "DisruptionLaunching",
            &format!("Launching NodeClaim: {label}; replacement {name}"),
        );
    }
    tracing::info!(nodeclaim = name, "launched a replacement");
    Ok(name)
}

/// Waits until the replacement is Initialized; fails when it goes away or takes too long.
async fn wait_until_initialized(
    shared: &Shared,
    name: &str,
    candidates: &[Candidate],
) -> Result<(), Failure> {
    let started = tokio::time::Instant::now();
    let mut told = false;
    loop {
        match shared.read.node_claim(name) {
            Some(claim) if claim.metadata.deletion_timestamp.is_some() => {
                return Err(Failure::ReplacementGone(name.to_owned()));
            }
            Some(claim)
                if claim
                    .status
                    .as_ref()
                    .is_some_and(|s| is_true(&s.conditions, ConditionType::Initialized)) =>
            {
                return Ok(());
            }
            None if started.elapsed() > crate::decide::lifecycle::READ_MODEL_LAG => {
                return Err(Failure::ReplacementGone(name.to_owned()));
            }
            _ => {}
        }
        if started.elapsed() >= REPLACEMENT_TIMEOUT {
            return Err(Failure::ReplacementTimeout(
                name.to_owned(),
                REPLACEMENT_TIMEOUT.as_secs(),
            ));
        }
        if !told {
            told = true;
            for candidate in candidates {
                shared.events.normal(
                    candidate.claim.as_ref(),
                    "DisruptionWaitingReadiness",
                    "Waiting on readiness to continue disruption",
                );
            }
        }
        tokio::time::sleep(READINESS_POLL).await;
    }
}

/// Undoes a command that could not finish (see the module docs).
async fn rollback(shared: &Shared, candidates: &[Candidate], why: &str) {
    for candidate in candidates {
        let untainted = set_taint(shared, &candidate.node_name(), false).await;
        let cleared = set_reason(shared, &candidate.claim.name_any(), None).await;
        if let Err(error) = untainted.and(cleared) {
            tracing::warn!(nodeclaim = candidate.claim.name_any(), %error, "rolling back a disruption failed; the next start cleans up");
        }
        shared.events.warn(
            candidate.claim.as_ref(),
            "DisruptionRolledBack",
            &format!("Disruption rolled back: {why}"),
        );
    }
}

/// Removes `karpenter.sh/disrupted` and candidates' taints, and `DisruptionReason` conditions, a
/// crash left behind:
/// from every Node whose NodeClaim is not being deleted (no command is running at start).
pub async fn remove_stale_taints(shared: &Shared) {
    let read = &shared.read;
    for claim in read.node_claims() {
        if claim.metadata.deletion_timestamp.is_some()
            || !claim.finalizers().iter().any(|f| f == TERMINATION_FINALIZER)
        {
            continue;
        }
        let Some(node) = claim
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| read.node_for_provider(p))
        else {
            continue;
        };
        let stale_taint = marked(node_taints(&node));
        let stale_reason = claim
            .status
            .as_ref()
            .is_some_and(|s| conditions::find(&s.conditions, ConditionType::DisruptionReason).is_some());
        if !stale_taint && !stale_reason {
            continue;
        }
        tracing::info!(
            nodeclaim = claim.name_any(),
            "removing a disruption taint left by a crash"
        );
        let untainted = set_taint(shared, &node.name_any(), false).await;
        let cleared = set_reason(shared, &claim.name_any(), None).await;
        if let Err(error) = untainted.and(cleared) {
            tracing::warn!(nodeclaim = claim.name_any(), %error, "removing a stale disruption taint failed");
        }
    }
}

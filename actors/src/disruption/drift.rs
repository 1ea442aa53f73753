//! The DisruptionPlanner's drift pass: sets every launched NodeClaim's `Drifted` condition to
//! what holds now, as Karpenter's NodeClaim disruption controller does. The reasons judged from the
//! cluster alone are decided in [`crate::decide::drift`]; when none holds, the cloud is asked
//! whether the instance still matches what the class resolves to (`AMIDrift`, `SubnetDrift`,
//! `SecurityGroupDrift`), at most every [`CLOUD_CHECK_INTERVAL`] per claim, and at once when the
//! claim's class changed; the checks due run side by side, up to [`CLOUD_CHECKS_AT_ONCE`]. The
//! condition is removed once nothing drifts.
//!
//! Failures: a cloud check that fails keeps the condition as it was and is tried again on the next
//! pass; a write that loses a race is left to the next pass.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::StreamExt;
use joist_messages::{
    apis::{EC2NodeClass, NodeClaim},
    conditions::{ConditionStatus, ConditionType, ConditionUpdate, is_true},
    labels::NODEPOOL,
};
use kube::ResourceExt;
use serde_json::json;

use super::candidates::PoolTypes;
use crate::{
    decide::{
        drift::{
            INSTANCE_TYPE_NOT_FOUND, STATIC_REASONS, Wanted, instance_type_check_due, instance_type_gone,
            restamp, shown, static_drift,
        },
        offered::Offered,
    },
    effects::kube_ops,
    shared::Shared,
};

/// How often a claim's instance is compared with its node class by the cloud, when the class did
/// not change.
pub const CLOUD_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// When each claim's instance was last compared by the cloud, and the version of its class then;
/// when a look last found each claim's instance type in its NodePool's catalog.
#[derive(Debug, Default)]
pub struct CloudChecks {
    checked: HashMap<String, (i64, String)>,
    type_found: HashMap<String, i64>,
}

impl CloudChecks {
    fn due(&self, claim: &str, class_version: &str, now_seconds: i64) -> bool {
        let interval = i64::try_from(CLOUD_CHECK_INTERVAL.as_secs()).unwrap_or(i64::MAX);
        self.checked
            .get(claim)
            .is_none_or(|(at, version)| version != class_version || now_seconds - at >= interval)
    }
}

/// The cloud checks, shared with the pass that runs (one at a time).
pub type SharedChecks = Arc<Mutex<CloudChecks>>;

fn lock(checks: &SharedChecks) -> MutexGuard<'_, CloudChecks> {
    checks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many cloud drift checks are in flight at once: one coalesced DescribeInstances call's worth
/// on AWS.
pub const CLOUD_CHECKS_AT_ONCE: usize = 500;

/// A claim whose instance the cloud is asked about.
struct Ask {
    claim: Arc<NodeClaim>,
    class: Arc<EC2NodeClass>,
    version: String,
    /// The reason the claim shows now.
    shown: Option<String>,
}

/// Sets every launched claim's `Drifted` condition to what holds now (see the module docs). The
/// cloud checks due run side by side, so a class change that makes every claim's check due costs
/// a few coalesced calls, not one call after another per claim.
pub async fn mark(shared: &Shared, types: &PoolTypes<'_>, checks: &SharedChecks) {
    let read = &shared.read;
    let now = shared.clock.now_seconds();
    let claims = read.node_claims();
    let mut wanted: HashMap<(String, String), Wanted> = HashMap::new();
    let mut asks = Vec::new();
    for claim in claims.iter().filter(|c| launched(c)) {
        let Some(pool) = claim.labels().get(NODEPOOL).and_then(|p| read.node_pool(p)) else {
            continue;
        };
        let class_name = &claim.spec.node_class_ref.name;
        let class = read.node_class(class_name);
        let pool_name = pool.name_any();
        let types = types.get(&pool_name);
        let wanted = wanted
            .entry((pool_name, class_name.clone()))
            .or_insert_with(|| Wanted::of(&pool, class.as_deref()));
        let stamps = restamp(claim, wanted);
        if !stamps.is_empty() {
            write(shared, claim, Write::Annotations(stamps)).await;
            continue;
        }
        let shown = shown(claim);
        if let Some(reason) = static_drift(claim, wanted) {
            settle(shared, claim, shown.as_ref(), Some(reason.to_owned())).await;
            continue;
        }
        if let Some(types) = types
            && type_gone(&mut lock(checks), claim, types, now)
        {
            settle(
                shared,
                claim,
                shown.as_ref(),
                Some(INSTANCE_TYPE_NOT_FOUND.to_owned()),
            )
            .await;
            continue;
        }
        let version = class
            .as_ref()
            .and_then(|c| c.resource_version())
            .unwrap_or_default();
        // Only a Ready class says what its instances should be; until then, the last answer.
        match class.filter(|c| c.is_ready() && c.status.is_some()) {
            Some(class) if lock(checks).due(&claim.name_any(), &version, now) => asks.push(Ask {
                claim: claim.clone(),
                class,
                version,
                shown,
            }),
            _ => settle(shared, claim, shown.as_ref(), cloud_said(shown.as_ref())).await,
        }
    }
    let answers: Vec<_> = futures::stream::iter(asks)
        .map(|ask| async move {
            let answer = shared.cloud.is_drifted(&ask.claim, &ask.class).await;
            (ask, answer)
        })
        .buffer_unordered(CLOUD_CHECKS_AT_ONCE)
        .collect()
        .await;
    for (ask, answer) in answers {
        let name = ask.claim.name_any();
        let reason = match answer {
            Ok(drift) => {
                lock(checks).checked.insert(name, (now, ask.version));
                drift.map(|d| d.reason)
            }
            Err(error) => {
                tracing::debug!(nodeclaim = name, %error, "drift check failed; next pass");
                cloud_said(ask.shown.as_ref())
            }
        };
        settle(shared, &ask.claim, ask.shown.as_ref(), reason).await;
    }
    let alive: HashSet<String> = claims.iter().map(|c| c.name_any()).collect();
    let mut checks = lock(checks);
    checks.checked.retain(|name, _| alive.contains(name));
    checks.type_found.retain(|name, _| alive.contains(name));
}

/// Whether the claim's instance type is gone from `types`, looked for only when due (see
/// [`crate::decide::drift::instance_type_check_due`]); a look that finds it is remembered.
fn type_gone(checks: &mut CloudChecks, claim: &NodeClaim, types: &Offered<'_>, now: i64) -> bool {
    let name = claim.name_any();
    if !instance_type_check_due(claim, now, checks.type_found.get(&name).copied()) {
        return false;
    }
    let Some(gone) = instance_type_gone(claim, types) else {
        return false;
    };
    if !gone {
        checks.type_found.insert(name, now);
    }
    gone
}

/// The cloud's last answer, shown on the claim, which stands until the cloud is asked again.
fn cloud_said(shown: Option<&String>) -> Option<String> {
    shown.filter(|r| !STATIC_REASONS.contains(&r.as_str())).cloned()
}

/// Writes the claim's `Drifted` condition when `reason` is not what it shows.
async fn settle(shared: &Shared, claim: &Arc<NodeClaim>, shown: Option<&String>, reason: Option<String>) {
    if reason.as_ref() == shown {
        return;
    }
    if let Some(reason) = &reason {
        tracing::info!(nodeclaim = claim.name_any(), reason, "nodeclaim drifted");
    }
    write(shared, claim, Write::Condition(reason)).await;
}

/// Whether the claim has an instance to judge and is not being deleted.
fn launched(claim: &NodeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && claim
            .status
            .as_ref()
            .is_some_and(|s| s.provider_id.is_some() && is_true(&s.conditions, ConditionType::Launched))
}

enum Write {
    Annotations(BTreeMap<String, String>),
    Condition(Option<String>),
}

async fn write(shared: &Shared, claim: &Arc<NodeClaim>, write: Write) {
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    let name = claim.name_any();
    let result = match write {
        Write::Annotations(annotations) => {
            kube_ops::patch(&api, &name, json!({"metadata": {"annotations": annotations}})).await
        }
        Write::Condition(Some(reason)) => {
            let message = format!("the node no longer matches its nodepool or node class ({reason})");
            let update = ConditionUpdate::new(ConditionType::Drifted, ConditionStatus::True, reason)
                .with_message(message);
            let body = kube_ops::claim_conditions_patch(&shared.clock, claim, &[update], json!({}));
            kube_ops::patch_status_body(&api, &name, body).await
        }
        Write::Condition(None) => {
            let body = kube_ops::claim_condition_removal_patch(claim, ConditionType::Drifted);
            kube_ops::patch_status_body(&api, &name, body).await
        }
    };
    if let Err(error) = result {
        tracing::debug!(nodeclaim = name, %error, "writing drift failed; next pass");
    }
}

//! Drift: which NodeClaims no longer match what their NodePool and node class ask for, shown by
//! each claim's `Drifted` condition, as Karpenter's NodeClaim disruption controller judges it.
//!
//! A launched claim not being deleted has drifted, with the first reason that holds:
//!
//! - `NodePoolDrifted`: its `karpenter.sh/nodepool-hash` differs from its NodePool's hash now
//!   (template labels, annotations, taints, startup taints, `expireAfter`,
//!   `terminationGracePeriod`, `nodeClassRef`; see [`joist_messages::apis::hash`]);
//! - `RequirementsDrifted`: its labels no longer meet the NodePool's requirements;
//! - `NodeClassDrift`: its `karpenter.k8s.aws/ec2nodeclass-hash` differs from the class's now;
//! - `InstanceTypeNotFound`: the NodePool can no longer launch its instance type;
//! - the cloud's reason (`AMIDrift`, `SubnetDrift`, `SecurityGroupDrift`): its instance no longer
//!   matches what the class resolves to. The cloud is asked at most every
//!   [`CLOUD_CHECK_INTERVAL`] per claim, and at once when the claim's class changed.
//!
//! A hash stamped with another version (an older Joist, or Karpenter) is re-stamped with the
//! current one instead of drifting the node. The condition is removed once nothing drifts.
//!
//! What a NodePool and its class ask for now ([`Wanted`]: the hashes, the requirements) is worked
//! out once per pass for each pair, not once per claim.
//!
//! Failures: a cloud check that fails keeps the condition as it was and is tried again on the next
//! pass; a write that loses a race is left to the next pass.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use joist_messages::{
    apis::{
        EC2NodeClass, NodeClaim, NodePool,
        hash::{self, ec2nodeclass_hash, ec2nodeclass_hash_stamp, nodepool_hash, nodepool_hash_stamp},
    },
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate, is_true},
    labels::{
        INSTANCE_TYPE, NODEPOOL,
        annotations::{EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH, NODEPOOL_HASH_VERSION},
        is_well_known,
    },
    model::{
        instance_type::InstanceType,
        requirements::{Operator, Requirement, Requirements},
    },
};
use kube::ResourceExt;
use serde_json::json;

use super::candidates::PoolTypes;
use crate::{effects::kube_ops, shared::Shared};

/// How often a claim's instance is compared with its node class by the cloud, when the class did
/// not change.
pub const CLOUD_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The reasons judged from the cluster alone, in the order they are tried.
const STATIC_REASONS: [&str; 4] = [
    "NodePoolDrifted",
    "RequirementsDrifted",
    "NodeClassDrift",
    "InstanceTypeNotFound",
];

/// The hash annotations to write on `claim` because they were stamped with another version.
pub fn restamp(claim: &NodeClaim, wanted: &Wanted) -> BTreeMap<String, String> {
    let annotations = claim.annotations();
    let stale = |version_key: &str, version: &str| annotations.get(version_key).is_none_or(|v| v != version);
    let mut out = BTreeMap::new();
    if stale(NODEPOOL_HASH_VERSION, hash::NODEPOOL_HASH_VERSION) {
        out.extend(nodepool_hash_stamp(wanted.pool_hash.clone()));
    }
    if let Some(class_hash) = &wanted.class_hash
        && stale(EC2NODECLASS_HASH_VERSION, hash::EC2NODECLASS_HASH_VERSION)
    {
        out.extend(ec2nodeclass_hash_stamp(class_hash.clone()));
    }
    out
}

/// What a NodePool and a node class ask of their NodeClaims now.
#[derive(Debug)]
pub struct Wanted {
    pool_hash: String,
    /// `None` when a requirement cannot be read: the NodePool is reported invalid instead, and
    /// its requirements drift nothing.
    requirements: Option<Requirements>,
    class_hash: Option<String>,
}

impl Wanted {
    /// What `pool` and `class` ask for.
    pub fn of(pool: &NodePool, class: Option<&EC2NodeClass>) -> Self {
        Wanted {
            pool_hash: nodepool_hash(pool),
            requirements: pool
                .spec
                .template
                .spec
                .requirements
                .iter()
                .map(|r| r.to_requirement())
                .collect::<Result<Requirements, _>>()
                .ok(),
            class_hash: class.map(ec2nodeclass_hash),
        }
    }
}

/// Why `claim` drifted from what its pool and class ask for, judged from the cluster alone (see
/// the module docs); `types` are the instance types its NodePool can launch now, when known.
pub fn static_drift(
    claim: &NodeClaim,
    wanted: &Wanted,
    types: Option<&[Arc<InstanceType>]>,
) -> Option<&'static str> {
    let annotations = claim.annotations();
    let current = |key: &str, version_key: &str, version: &str| {
        annotations
            .get(version_key)
            .is_some_and(|v| v == version)
            .then(|| annotations.get(key))
            .flatten()
    };
    let [pool_drifted, requirements_drifted, class_drifted, type_gone] = STATIC_REASONS;
    if current(NODEPOOL_HASH, NODEPOOL_HASH_VERSION, hash::NODEPOOL_HASH_VERSION)
        .is_some_and(|h| *h != wanted.pool_hash)
    {
        return Some(pool_drifted);
    }
    if let Some(requirements) = &wanted.requirements
        && !meets(claim, requirements)
    {
        return Some(requirements_drifted);
    }
    if let Some(class_hash) = &wanted.class_hash
        && current(
            EC2NODECLASS_HASH,
            EC2NODECLASS_HASH_VERSION,
            hash::EC2NODECLASS_HASH_VERSION,
        )
        .is_some_and(|h| h != class_hash)
    {
        return Some(class_drifted);
    }
    let instance_type = claim.labels().get(INSTANCE_TYPE);
    if let (Some(types), Some(name)) = (types, instance_type)
        && !types.is_empty()
        && !types.iter().any(|it| &it.name == name)
    {
        return Some(type_gone);
    }
    None
}

/// Whether the claim's labels meet `requirements` (well-known labels the claim lacks are not held
/// against it).
fn meets(claim: &NodeClaim, requirements: &Requirements) -> bool {
    let labels: Requirements = claim
        .labels()
        .iter()
        .filter_map(|(key, value)| Requirement::new(key, Operator::In, [value.as_str()]).ok())
        .collect();
    labels.compatible(requirements, is_well_known).is_ok()
}

/// When each claim's instance was last compared by the cloud, and the version of its class then.
#[derive(Debug, Default)]
pub struct CloudChecks {
    checked: HashMap<String, (i64, String)>,
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

/// Sets every launched claim's `Drifted` condition to what holds now (see the module docs).
pub async fn mark(shared: &Shared, types: &PoolTypes<'_>, checks: &SharedChecks) {
    let read = &shared.read;
    let now = shared.clock.now_seconds();
    let claims = read.node_claims();
    let mut wanted: HashMap<(String, String), Wanted> = HashMap::new();
    for claim in claims.iter().filter(|c| launched(c)) {
        let Some(pool) = claim.labels().get(NODEPOOL).and_then(|p| read.node_pool(p)) else {
            continue;
        };
        let class_name = &claim.spec.node_class_ref.name;
        let class = read.node_class(class_name);
        let pool_name = pool.name_any();
        let types = types.get(&pool_name).copied();
        let wanted = wanted
            .entry((pool_name, class_name.clone()))
            .or_insert_with(|| Wanted::of(&pool, class.as_deref()));
        let stamps = restamp(claim, wanted);
        if !stamps.is_empty() {
            write(shared, claim, Write::Annotations(stamps)).await;
            continue;
        }
        let shown = shown(claim);
        // The cloud's last answer, which stands until it is asked again.
        let cloud_said = shown.clone().filter(|r| !STATIC_REASONS.contains(&r.as_str()));
        let reason = match static_drift(claim, wanted, types) {
            Some(reason) => Some(reason.to_owned()),
            None => {
                let name = claim.name_any();
                let version = class
                    .as_ref()
                    .and_then(|c| c.resource_version())
                    .unwrap_or_default();
                // Only a Ready class says what its instances should be; until then, the last answer.
                let resolved = class
                    .as_deref()
                    .filter(|c| c.is_ready())
                    .and_then(|c| c.status.as_ref());
                if let Some(status) = resolved
                    && lock(checks).due(&name, &version, now)
                {
                    match shared.cloud.is_drifted(claim, status).await {
                        Ok(drift) => {
                            lock(checks).checked.insert(name, (now, version));
                            drift.map(|d| d.reason)
                        }
                        Err(error) => {
                            tracing::debug!(nodeclaim = name, %error, "drift check failed; next pass");
                            cloud_said
                        }
                    }
                } else {
                    cloud_said
                }
            }
        };
        if reason == shown {
            continue;
        }
        if let Some(reason) = &reason {
            tracing::info!(nodeclaim = claim.name_any(), reason, "nodeclaim drifted");
        }
        write(shared, claim, Write::Condition(reason)).await;
    }
    let alive: HashSet<String> = claims.iter().map(|c| c.name_any()).collect();
    lock(checks).checked.retain(|name, _| alive.contains(name));
}

/// Whether the claim has an instance to judge and is not being deleted.
fn launched(claim: &NodeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && claim
            .status
            .as_ref()
            .is_some_and(|s| s.provider_id.is_some() && is_true(&s.conditions, ConditionType::Launched))
}

/// The reason the claim's `Drifted` condition shows, if it is true.
pub fn shown(claim: &NodeClaim) -> Option<String> {
    let status = claim.status.as_ref()?;
    conditions::find(&status.conditions, ConditionType::Drifted)
        .filter(|drifted| drifted.status == ConditionStatus::True.as_str())
        .map(|drifted| drifted.reason.clone())
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pool(labels: Value, capacity_types: &[&str]) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"metadata": {"labels": labels}, "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity_types}],
            }}},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn claim(annotations: Value) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "annotations": annotations, "labels": {
                "karpenter.sh/nodepool": "p", "karpenter.sh/capacity-type": "spot",
                "node.kubernetes.io/instance-type": "m5.large", "team": "a"}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn stamped(pool: &NodePool) -> NodeClaim {
        claim(json!({NODEPOOL_HASH: nodepool_hash(pool), NODEPOOL_HASH_VERSION: hash::NODEPOOL_HASH_VERSION}))
    }

    #[test]
    fn a_template_change_drifts_the_pool_hash_and_a_requirement_change_the_requirements() {
        let old = pool(json!({"team": "a"}), &["spot", "on-demand"]);
        let claim = stamped(&old);
        assert_eq!(static_drift(&claim, &Wanted::of(&old, None), None), None);
        let relabelled = pool(json!({"team": "b"}), &["spot", "on-demand"]);
        assert_eq!(
            static_drift(&claim, &Wanted::of(&relabelled, None), None),
            Some("NodePoolDrifted")
        );
        let on_demand_only = pool(json!({"team": "a"}), &["on-demand"]);
        assert_eq!(
            static_drift(&claim, &Wanted::of(&on_demand_only, None), None),
            Some("RequirementsDrifted")
        );
    }

    #[test]
    fn a_hash_of_another_version_is_restamped_not_drifted() {
        let pool = pool(json!({"team": "b"}), &["spot"]);
        let karpenters = claim(json!({NODEPOOL_HASH: "123", NODEPOOL_HASH_VERSION: "v3"}));
        assert_eq!(static_drift(&karpenters, &Wanted::of(&pool, None), None), None);
        let wanted = Wanted::of(&pool, None);
        let stamps = restamp(&karpenters, &wanted);
        assert_eq!(stamps.get(NODEPOOL_HASH), Some(&nodepool_hash(&pool)));
        assert!(restamp(&stamped(&pool), &wanted).is_empty());
    }

    #[test]
    fn an_instance_type_the_pool_no_longer_offers_drifts() {
        let pool = pool(json!({"team": "a"}), &["spot"]);
        let claim = stamped(&pool);
        let other = InstanceType {
            name: "c5.large".into(),
            requirements: Requirements::new(),
            offerings: Vec::new(),
            capacity: Default::default(),
            overhead: Default::default(),
        };
        assert_eq!(
            static_drift(&claim, &Wanted::of(&pool, None), Some(&[other.into()])),
            Some("InstanceTypeNotFound")
        );
        assert_eq!(
            static_drift(&claim, &Wanted::of(&pool, None), Some(&[])),
            None,
            "an empty catalog says nothing"
        );
    }
}

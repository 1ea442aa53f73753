//! Drift, decided from the cluster alone: which NodeClaims no longer match what their NodePool
//! and node class ask for, with the first reason that holds (Karpenter's order):
//!
//! - `NodePoolDrifted`: its `karpenter.sh/nodepool-hash` differs from its NodePool's hash now
//!   (template labels, annotations, taints, startup taints, `expireAfter`,
//!   `terminationGracePeriod`, `nodeClassRef`; see [`joist_messages::apis::hash`]);
//! - `RequirementsDrifted`: its labels no longer meet the NodePool's requirements;
//! - `NodeClassDrift`: its `karpenter.k8s.aws/ec2nodeclass-hash` differs from the class's now;
//! - `InstanceTypeNotFound`: the NodePool can no longer launch its instance type.
//!
//! A hash stamped with another version (an older Joist, or Karpenter) is re-stamped with the
//! current one ([`restamp`]) instead of drifting the node. What a NodePool and its class ask for
//! ([`Wanted`]) is worked out once per pair. The cloud's own reasons are asked for by the
//! DisruptionPlanner's drift pass (`crate::disruption::drift`). Nothing here fails: a requirement
//! that cannot be read drifts nothing (the NodePool is reported invalid instead).

use std::collections::BTreeMap;

use joist_messages::{
    apis::{
        EC2NodeClass, NodeClaim, NodePool,
        hash::{self, ec2nodeclass_hash, ec2nodeclass_hash_stamp, nodepool_hash, nodepool_hash_stamp},
    },
    conditions::{self, ConditionStatus, ConditionType},
    labels::{
        INSTANCE_TYPE,
        annotations::{EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH, NODEPOOL_HASH_VERSION},
        is_well_known,
    },
    model::requirements::Requirements,
};
use kube::ResourceExt;

use super::offered::Offered;

/// The reasons judged from the cluster alone, in the order they are tried.
pub const STATIC_REASONS: [&str; 4] = [
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
pub fn static_drift(claim: &NodeClaim, wanted: &Wanted, types: Option<&Offered<'_>>) -> Option<&'static str> {
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
        && types.get(name).is_none()
    {
        return Some(type_gone);
    }
    None
}

/// Whether the claim's labels meet `requirements` (well-known labels the claim lacks are not held
/// against it). Read label by label, with nothing built: every pass asks it of every claim.
fn meets(claim: &NodeClaim, requirements: &Requirements) -> bool {
    let labels = claim.labels();
    requirements.iter().all(|wanted| match labels.get(wanted.key()) {
        Some(value) => wanted.has(value),
        None => wanted.allows_absent() || is_well_known(wanted.key()),
    })
}

/// The reason the claim's `Drifted` condition shows, if it is true.
pub fn shown(claim: &NodeClaim) -> Option<String> {
    let status = claim.status.as_ref()?;
    conditions::find(&status.conditions, ConditionType::Drifted)
        .filter(|drifted| drifted.status == ConditionStatus::True.as_str())
        .map(|drifted| drifted.reason.clone())
}

#[cfg(test)]
mod tests {
    use joist_messages::model::instance_type::InstanceType;
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
            static_drift(
                &claim,
                &Wanted::of(&pool, None),
                Some(&Offered::new(&[other.into()]))
            ),
            Some("InstanceTypeNotFound")
        );
        assert_eq!(
            static_drift(&claim, &Wanted::of(&pool, None), Some(&Offered::default())),
            None,
            "an empty catalog says nothing"
        );
    }
}

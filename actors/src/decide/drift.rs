//! Drift, decided from the cluster alone: which NodeClaims no longer match what their NodePool
//! and node class ask for, with the first reason that holds (Karpenter's order):
//!
//! - `NodePoolDrifted`: its `karpenter.sh/nodepool-hash` differs from its NodePool's hash now
//!   (template labels, annotations, taints, startup taints, `expireAfter`,
//!   `terminationGracePeriod`, `nodeClassRef`; see [`joist_messages::apis::hash`]);
//! - `RequirementsDrifted`: its labels no longer meet the NodePool's requirements;
//! - `NodeClassDrift`: its `karpenter.k8s.aws/ec2nodeclass-hash` differs from the class's now;
//! - `InstanceTypeNotFound`: its instance type, or every offering of it in its zone and capacity
//!   type, is gone from the NodePool's catalog ([`instance_type_gone`]). As in Karpenter, this is
//!   first asked [`INSTANCE_TYPE_CHECK_AFTER`] after the claim's creation, and a check that found
//!   the type stands for [`INSTANCE_TYPE_CHECK_INTERVAL`]: the catalog is the cloud's, not the
//!   user's, so drift from it may lag.
//!
//! A hash stamped with another version (an older Joist, or Karpenter) is re-stamped with the
//! current one ([`restamp`]) instead of drifting the node. What a NodePool and its class ask for
//! ([`Wanted`]) is worked out once per pair. The cloud's own reasons are asked for by the
//! DisruptionPlanner's drift pass (`crate::disruption::drift`). Nothing here fails: a requirement
//! that cannot be read drifts nothing (the NodePool is reported invalid instead).

use std::{collections::BTreeMap, time::Duration};

use joist_messages::{
    apis::{
        EC2NodeClass, NodeClaim, NodePool,
        hash::{self, ec2nodeclass_hash, ec2nodeclass_hash_stamp, nodepool_hash, nodepool_hash_stamp},
    },
    conditions::{self, ConditionStatus, ConditionType},
    labels::{
        CAPACITY_TYPE, INSTANCE_TYPE, ZONE,
        annotations::{EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH, NODEPOOL_HASH_VERSION},
        is_well_known,
    },
    model::{instance_type::CapacityType, requirements::Requirements},
};
use kube::ResourceExt;

use super::offered::Offered;

/// The reasons judged from the cluster alone, in the order they are tried.
pub const STATIC_REASONS: [&str; 4] = [
    "NodePoolDrifted",
    "RequirementsDrifted",
    "NodeClassDrift",
    INSTANCE_TYPE_NOT_FOUND,
];

/// Karpenter's reason for a claim whose instance type is gone ([`instance_type_gone`]).
pub const INSTANCE_TYPE_NOT_FOUND: &str = "InstanceTypeNotFound";

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
/// the module docs), the instance type aside ([`instance_type_gone`]).
pub fn static_drift(claim: &NodeClaim, wanted: &Wanted) -> Option<&'static str> {
    let annotations = claim.annotations();
    let current = |key: &str, version_key: &str, version: &str| {
        annotations
            .get(version_key)
            .is_some_and(|v| v == version)
            .then(|| annotations.get(key))
            .flatten()
    };
    let [pool_drifted, requirements_drifted, class_drifted, _] = STATIC_REASONS;
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
    None
}

/// How long after a claim's creation its instance type is first looked for in the catalog.
pub const INSTANCE_TYPE_CHECK_AFTER: Duration = Duration::from_secs(60 * 60);

/// How long a look that found a claim's instance type stands before the next.
pub const INSTANCE_TYPE_CHECK_INTERVAL: Duration = Duration::from_secs(30 * 60);

/// Whether the claim's instance type is gone from `types`, the NodePool's catalog, as Karpenter
/// judges it: the claim has no instance-type label, its type is not listed, or no offering of it
/// (available or not) is in the claim's zone and capacity type; a `reserved` claim may also be on
/// an on-demand offering, since a reservation can demote it. `None` for an empty catalog (not
/// known yet): it says nothing.
pub fn instance_type_gone(claim: &NodeClaim, types: &Offered<'_>) -> Option<bool> {
    if types.is_empty() {
        return None;
    }
    let labels = claim.labels();
    let Some(instance_type) = labels.get(INSTANCE_TYPE).and_then(|name| types.get(name)) else {
        return Some(true);
    };
    let zone = labels.get(ZONE);
    let capacity = labels.get(CAPACITY_TYPE).map(String::as_str);
    let capacity_allows = |offered: CapacityType| match capacity {
        None => true,
        Some(label) if label == CapacityType::Reserved.label() => {
            matches!(offered, CapacityType::Reserved | CapacityType::OnDemand)
        }
        Some(label) => label == offered.label(),
    };
    let offered = (instance_type.offerings.iter())
        .any(|o| zone.is_none_or(|z| *z == o.zone) && capacity_allows(o.capacity_type));
    Some(!offered)
}

/// Whether the claim's instance type is to be looked for now, `now_seconds` being the time and
/// `found_at` when a look last found it.
pub fn instance_type_check_due(claim: &NodeClaim, now_seconds: i64, found_at: Option<i64>) -> bool {
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let created = (claim.metadata.creation_timestamp.as_ref()).map_or(now_seconds, |t| t.0.as_second());
    now_seconds - created > seconds(INSTANCE_TYPE_CHECK_AFTER)
        && found_at.is_none_or(|at| now_seconds - at >= seconds(INSTANCE_TYPE_CHECK_INTERVAL))
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
    use std::sync::Arc;

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
        assert_eq!(static_drift(&claim, &Wanted::of(&old, None)), None);
        let relabelled = pool(json!({"team": "b"}), &["spot", "on-demand"]);
        assert_eq!(
            static_drift(&claim, &Wanted::of(&relabelled, None)),
            Some("NodePoolDrifted")
        );
        let on_demand_only = pool(json!({"team": "a"}), &["on-demand"]);
        assert_eq!(
            static_drift(&claim, &Wanted::of(&on_demand_only, None)),
            Some("RequirementsDrifted")
        );
    }

    #[test]
    fn a_hash_of_another_version_is_restamped_not_drifted() {
        let pool = pool(json!({"team": "b"}), &["spot"]);
        let karpenters = claim(json!({NODEPOOL_HASH: "123", NODEPOOL_HASH_VERSION: "v3"}));
        assert_eq!(static_drift(&karpenters, &Wanted::of(&pool, None)), None);
        let wanted = Wanted::of(&pool, None);
        let stamps = restamp(&karpenters, &wanted);
        assert_eq!(stamps.get(NODEPOOL_HASH), Some(&nodepool_hash(&pool)));
        assert!(restamp(&stamped(&pool), &wanted).is_empty());
    }

    fn m5_large(offerings: &[(&str, CapacityType)]) -> InstanceType {
        InstanceType {
            name: "m5.large".into(),
            requirements: Requirements::new(),
            offerings: (offerings.iter())
                .map(
                    |(zone, capacity_type)| joist_messages::model::instance_type::Offering {
                        zone: (*zone).into(),
                        capacity_type: *capacity_type,
                        price: 0.1,
                        available: false,
                        reservation: None,
                    },
                )
                .collect(),
            capacity: Default::default(),
            overhead: Default::default(),
        }
    }

    fn in_zone(mut claim: NodeClaim, capacity_type: &str) -> NodeClaim {
        let labels = claim.labels_mut();
        labels.insert(ZONE.into(), "us-west-2a".into());
        labels.insert(CAPACITY_TYPE.into(), capacity_type.into());
        claim
    }

    #[test]
    fn an_instance_type_or_offering_gone_from_the_catalog_drifts_and_an_unavailable_one_does_not() {
        let pool = pool(json!({"team": "a"}), &["spot"]);
        let claim = in_zone(stamped(&pool), "spot");
        let offered = |types: Vec<InstanceType>| types.into_iter().map(Arc::new).collect::<Vec<_>>();
        let other = InstanceType {
            name: "c5.large".into(),
            ..m5_large(&[("us-west-2a", CapacityType::Spot)])
        };
        let catalog = offered(vec![other]);
        assert_eq!(
            instance_type_gone(&claim, &Offered::new(&catalog)),
            Some(true),
            "the type is gone"
        );
        let catalog = offered(vec![m5_large(&[
            ("us-west-2b", CapacityType::Spot),
            ("us-west-2a", CapacityType::OnDemand),
        ])]);
        assert_eq!(
            instance_type_gone(&claim, &Offered::new(&catalog)),
            Some(true),
            "no spot offering in its zone"
        );
        let catalog = offered(vec![m5_large(&[("us-west-2a", CapacityType::Spot)])]);
        assert_eq!(
            instance_type_gone(&claim, &Offered::new(&catalog)),
            Some(false),
            "offered, though unavailable now"
        );
        assert_eq!(
            instance_type_gone(&claim, &Offered::default()),
            None,
            "an empty catalog says nothing"
        );
        let mut unlabelled = claim.clone();
        unlabelled.labels_mut().remove(INSTANCE_TYPE);
        assert_eq!(
            instance_type_gone(&unlabelled, &Offered::new(&catalog)),
            Some(true),
            "no instance-type label"
        );
        let reserved = in_zone(stamped(&pool), "reserved");
        let catalog = offered(vec![m5_large(&[("us-west-2a", CapacityType::OnDemand)])]);
        assert_eq!(
            instance_type_gone(&reserved, &Offered::new(&catalog)),
            Some(false),
            "a reserved claim may be demoted to on-demand"
        );
    }

    #[test]
    fn the_instance_type_is_first_looked_for_an_hour_after_creation_then_every_half_hour_once_found() {
        let mut claim = claim(json!({}));
        claim.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(0).unwrap_or_else(|e| panic!("{e}")),
        ));
        assert!(
            !instance_type_check_due(&claim, 3_600, None),
            "not within the first hour"
        );
        assert!(instance_type_check_due(&claim, 3_601, None));
        assert!(
            !instance_type_check_due(&claim, 5_000, Some(4_000)),
            "a look that found it stands"
        );
        assert!(
            instance_type_check_due(&claim, 5_800, Some(4_000)),
            "for half an hour"
        );
    }
}

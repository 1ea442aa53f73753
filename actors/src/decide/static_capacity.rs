//! Static NodePools (`spec.replicas`), decided: what a static pool needs now ([`Plan`]) from its
//! NodeClaims and their pods. Too few: create the missing ones. Too many: the surplus goes in
//! Karpenter's order, NodeClaims not launched yet first, then empty nodes (DaemonSet pods only),
//! then the nodes with the fewest pods, nodes running a `karpenter.sh/do-not-disrupt` pod last.
//! Drifted (Karpenter's StaticDrift): while a node is `Drifted` and every other is Initialized, one
//! more; once it is Initialized, the pool is one over and the drifted node goes first. Nothing here
//! fails.

use std::sync::Arc;

use joist_messages::{
    apis::{NodeClaim, NodePool},
    cached_pod::CachedPod,
    conditions::{ConditionType, is_true},
    pods::{do_not_disrupt, owned_by_daemon_set},
};
use kube::ResourceExt;

use super::drift;

/// Whether `pool` is a static NodePool.
pub fn is_static(pool: &NodePool) -> bool {
    pool.spec.replicas.is_some()
}

/// What a static pool needs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// As many NodeClaims as it should have.
    Hold,
    /// This many more.
    Create(usize),
    /// These NodeClaims (by name) are surplus, in the order they go.
    Delete(Vec<String>),
}

/// The plan for a pool wanting `replicas` NodeClaims that has `claims`; `pods_on` gives the pods
/// on a node by name. Claims already being deleted are not counted.
pub fn plan(
    replicas: i64,
    claims: &[Arc<NodeClaim>],
    pods_on: impl Fn(&str) -> Vec<Arc<CachedPod>>,
    now_seconds: i64,
) -> Plan {
    let active: Vec<&Arc<NodeClaim>> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    let have = i64::try_from(active.len()).unwrap_or(i64::MAX);
    if have < replicas {
        return Plan::Create(usize::try_from(replicas - have).unwrap_or(0));
    }
    // What each NodeClaim is, its node's pods read once.
    let seen: Vec<Seen> = active
        .iter()
        .map(|claim| {
            let status = claim.status.as_ref();
            let pods = status
                .and_then(|s| s.node_name.as_deref())
                .map(&pods_on)
                .unwrap_or_default();
            Seen {
                protected: pods.iter().any(|p| do_not_disrupt(p, now_seconds)),
                current: drift::shown(claim).is_none(),
                launched: status.is_some_and(|s| s.provider_id.is_some()),
                workload: pods.iter().filter(|p| !owned_by_daemon_set(p)).count(),
                initialized: status.is_some_and(|s| is_true(&s.conditions, ConditionType::Initialized)),
                name: claim.name_any(),
            }
        })
        .collect();
    let settled = seen.iter().filter(|c| c.current).all(|c| c.initialized);
    if have == replicas {
        // A drifted node is replaced by surging one over, once nothing else is in flight; one
        // whose pods may not be disrupted is not (its replacement would push out another node).
        let replace = replicas > 0 && settled && seen.iter().any(|c| !c.current && !c.protected);
        return if replace { Plan::Create(1) } else { Plan::Hold };
    }
    if seen.iter().any(|c| !c.current) && !settled {
        // A replacement is still coming up: the drifted node stays until it is Initialized.
        return Plan::Hold;
    }
    // Order: drifted, not launched, then empty, then fewest pods; do-not-disrupt pods push a
    // node last (the field order of `Seen`).
    let mut ranked = seen;
    ranked.sort();
    let surplus = usize::try_from(have - replicas).unwrap_or(0);
    Plan::Delete(ranked.into_iter().take(surplus).map(|c| c.name).collect())
}

/// One NodeClaim as the plan ranks it: the fields in the order surplus goes (false first).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    /// Its node runs a pod that may not be disrupted.
    protected: bool,
    /// Not drifted.
    current: bool,
    /// It has an instance.
    launched: bool,
    /// Its pods but DaemonSet ones.
    workload: usize,
    /// Its name (unique, so the fields after it never order).
    name: String,
    /// Its node is Initialized.
    initialized: bool,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use joist_messages::apis::NodeClaimStatus;
    use serde_json::json;

    use super::*;

    fn claim(name: &str, node: Option<&str>) -> Arc<NodeClaim> {
        let mut claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        claim.status = node.map(|node| NodeClaimStatus {
            node_name: Some(node.to_owned()),
            provider_id: Some(format!("aws:///us-west-2a/i-{node}")),
            ..NodeClaimStatus::default()
        });
        Arc::new(claim)
    }

    fn pod(annotations: serde_json::Value, owner: &str) -> Arc<CachedPod> {
        let owners = if owner.is_empty() {
            json!([])
        } else {
            json!([{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "o"}])
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "default", "annotations": annotations, "ownerReferences": owners}
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn with_condition(claim: &Arc<NodeClaim>, type_: &str) -> Arc<NodeClaim> {
        let mut claim = (**claim).clone();
        let status = claim.status.get_or_insert_with(NodeClaimStatus::default);
        status.conditions.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: type_.to_owned(),
            status: "True".to_owned(),
            reason: type_.to_owned(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            observed_generation: None,
        });
        Arc::new(claim)
    }

    #[test]
    fn a_drifted_node_is_replaced_by_surging_one_and_goes_once_its_replacement_is_up() {
        let up = |name: &str| with_condition(&claim(name, Some(&format!("n-{name}"))), "Initialized");
        let old = with_condition(&up("old"), "Drifted");
        // Two of two, one drifted, the other up: one more.
        assert_eq!(
            plan(2, &[old.clone(), up("b")], |_| Vec::new(), 0),
            Plan::Create(1)
        );
        // The replacement is not up yet: nothing goes.
        let coming = claim("new", Some("n-new"));
        assert_eq!(
            plan(2, &[old.clone(), up("b"), coming], |_| Vec::new(), 0),
            Plan::Hold
        );
        // It is up: the drifted node goes, though an unlaunched or emptier one would otherwise.
        let pods = |node: &str| {
            if node == "n-old" {
                vec![pod(json!({}), "ReplicaSet")]
            } else {
                Vec::new()
            }
        };
        assert_eq!(
            plan(2, &[old.clone(), up("b"), up("new")], pods, 0),
            Plan::Delete(vec!["old".to_owned()])
        );
        // While another node is still coming up, no surge.
        assert_eq!(
            plan(2, &[old.clone(), claim("c", None)], |_| Vec::new(), 0),
            Plan::Hold
        );
        // A drifted node running a do-not-disrupt pod is not replaced.
        let guarded = |node: &str| {
            if node == "n-old" {
                vec![pod(json!({"karpenter.sh/do-not-disrupt": "true"}), "")]
            } else {
                Vec::new()
            }
        };
        assert_eq!(plan(2, &[old, up("b")], guarded, 0), Plan::Hold);
    }

    #[test]
    fn too_few_creates_the_difference_and_deleting_claims_do_not_count() {
        let mut going = (*claim("b", Some("n-b"))).clone();
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Default::default(),
        ));
        let claims = [claim("a", Some("n-a")), Arc::new(going)];
        assert_eq!(plan(3, &claims, |_| Vec::new(), 0), Plan::Create(2));
        assert_eq!(plan(1, &claims, |_| Vec::new(), 0), Plan::Hold);
        assert_eq!(plan(0, &[], |_| Vec::new(), 0), Plan::Hold);
    }

    #[test]
    fn surplus_goes_unlaunched_first_then_empty_then_fewest_pods_and_do_not_disrupt_last() {
        let claims = [
            claim("busy", Some("n-busy")),
            claim("guarded", Some("n-guarded")),
            claim("empty", Some("n-empty")),
            claim("unlaunched", None),
            claim("light", Some("n-light")),
        ];
        let pods: BTreeMap<&str, Vec<Arc<CachedPod>>> = BTreeMap::from([
            (
                "n-busy",
                vec![pod(json!({}), "ReplicaSet"), pod(json!({}), "ReplicaSet")],
            ),
            (
                "n-guarded",
                vec![pod(json!({"karpenter.sh/do-not-disrupt": "true"}), "")],
            ),
            ("n-empty", vec![pod(json!({}), "DaemonSet")]),
            ("n-light", vec![pod(json!({}), "ReplicaSet")]),
        ]);
        let pods_on = |node: &str| pods.get(node).cloned().unwrap_or_default();
        let order = ["unlaunched", "empty", "light", "busy", "guarded"];
        for keep in 0..5 {
            let Plan::Delete(gone) = plan(keep, &claims, pods_on, 0) else {
                panic!("keeping {keep} of 5 deletes");
            };
            assert_eq!(gone, order[..5 - keep as usize], "keeping {keep}");
        }
    }
}

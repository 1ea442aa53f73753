//! NodePool limits, decided: which of the NodeClaims a pass planned for a pool still fit its
//! `limits`, given what the pool holds now, claim by claim in the plan's order (a claim that does
//! not fit is refused, and the ones after it may still fit). Only the resources the limits name
//! are checked; `nodes` counts one per claim. Nothing here fails.

use joist_messages::{
    apis::NodePool,
    model::{
        quantity::Quantity,
        resources::{Resources, names::NODES},
    },
};
use joist_scheduling::NewClaim;

/// What [`admit`] decided.
#[derive(Debug, Default)]
pub struct Admission {
    /// The claims to create, in the plan's order.
    pub accepted: Vec<NewClaim>,
    /// For each claim refused, the limits it would have exceeded.
    pub refused: Vec<Vec<String>>,
}

/// The claims of `planned` that fit `pool`'s limits, the pool holding `used` now.
pub fn admit(pool: &NodePool, mut used: Resources, planned: Vec<NewClaim>) -> Admission {
    let limits = Resources::from(&pool.spec.limits);
    let mut admission = Admission::default();
    for claim in planned {
        let mut after = used.clone();
        after.add(&claim.requests);
        after.set(NODES, used.get(NODES).saturating_add(Quantity::from_units(1)));
        let exceeded: Vec<String> = pool
            .spec
            .limits
            .keys()
            .filter(|key| after.get(key) > limits.get(key))
            .cloned()
            .collect();
        if exceeded.is_empty() {
            admission.accepted.push(claim);
            used = after;
        } else {
            admission.refused.push(exceeded);
        }
    }
    admission
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(limits: serde_json::Value) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"limits": limits, "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                "requirements": [],
            }}},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A claim for the pod at position `pod`, requesting `cpu`.
    fn claim(pod: usize, cpu: &str) -> NewClaim {
        NewClaim {
            node_pool: 0,
            requirements: Default::default(),
            instance_types: Vec::new(),
            price: 0.0,
            requests: Resources::default().with("cpu", cpu.parse().unwrap_or_else(|e| panic!("{e:?}"))),
            pods: vec![pod],
        }
    }

    /// The pods of the claims admitted.
    fn admitted(admission: &Admission) -> Vec<usize> {
        admission.accepted.iter().flat_map(|c| c.pods.clone()).collect()
    }

    #[test]
    fn claims_are_admitted_in_order_while_they_fit_and_a_refused_one_does_not_block_the_rest() {
        let used = Resources::default().with("cpu", "6".parse().unwrap_or_else(|e| panic!("{e:?}")));
        let planned = vec![claim(0, "2"), claim(1, "4"), claim(2, "2")];
        let admission = admit(&pool(json!({"cpu": "10"})), used, planned);
        assert_eq!(admitted(&admission), [0, 2]);
        assert_eq!(admission.refused, [vec!["cpu".to_owned()]]);
    }

    #[test]
    fn a_node_limit_counts_one_per_claim_and_no_limits_admit_everything() {
        let planned = || vec![claim(0, "1"), claim(1, "1")];
        let admission = admit(&pool(json!({"nodes": "1"})), Resources::default(), planned());
        assert_eq!(admitted(&admission), [0]);
        assert_eq!(admission.refused, [vec!["nodes".to_owned()]]);
        assert_eq!(
            admitted(&admit(&pool(json!({})), Resources::default(), planned())).len(),
            2
        );
    }
}

//! Which NodePool a pending pod belongs to when NodePools are split between controllers: the
//! heaviest pool (then the first by name, the order the solver tries them in) that could ever take
//! it — it tolerates the pool's taints, and one of its required node terms and one of its volumes'
//! topology alternatives are compatible with the pool's requirements and labels. Capacity, limits and instance types are not looked at, so every
//! controller that sees the same NodePools gives a pod the same owner, whatever its own state.
//!
//! Pods of one kind (equal constraints) are decided once per call.

use std::collections::HashMap;

use joist_messages::{labels::is_well_known, model::requirements::Requirements};

use crate::{input::pool_order, pod::PodInfo, taints::first_untolerated};

/// For each pod, the position in `pools` of the pool it belongs to; `None` when no pool admits it.
pub fn owners<'a>(
    pools: &[crate::NodePoolInput],
    pods: impl IntoIterator<Item = &'a PodInfo>,
) -> Vec<Option<usize>> {
    let order = pool_order(pools);
    let requirements: Vec<Requirements> = pools.iter().map(|p| p.node_requirements()).collect();
    let mut decided = HashMap::new();
    pods.into_iter()
        .map(|pod| {
            *decided.entry(pod.kind()).or_insert_with(|| {
                order.iter().copied().find(|&i| {
                    let constraints = pod.constraints();
                    first_untolerated(&constraints.tolerations, &pools[i].taints).is_none()
                        && admits_terms(&requirements[i], &constraints.node_requirements)
                        && admits_terms(&requirements[i], &constraints.volume_requirements)
                })
            })
        })
        .collect()
}

/// Whether one of a pod's required node terms (none: any node) fits `pool`'s requirements.
fn admits_terms(pool: &Requirements, terms: &[Requirements]) -> bool {
    terms.is_empty()
        || terms
            .iter()
            .any(|term| pool.compatible(term, is_well_known).is_ok())
}

#[cfg(test)]
mod tests {
    use joist_messages::cached_pod::CachedPod;
    use k8s_openapi::api::core::v1::Taint;
    use serde_json::{Value, json};

    use super::*;
    use crate::NodePoolInput;

    fn pool(name: &str, weight: i32, taints: Vec<Taint>) -> NodePoolInput {
        NodePoolInput {
            name: name.to_owned(),
            weight,
            requirements: Requirements::default(),
            labels: [("team".to_owned(), name.to_owned())].into(),
            taints,
            remaining: None,
            instance_types: Vec::new(),
        }
    }

    /// A pod of one CPU whose spec adds `spec`.
    fn pod(name: &str, mut spec: Value) -> PodInfo {
        spec["containers"] = json!([{"name": "app", "resources": {"requests": {"cpu": "1"}}}]);
        let pod: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        PodInfo::from_pod(&pod).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Required node affinity: any one of `teams`, each its own term.
    fn teams(teams: &[&str]) -> Value {
        let terms: Vec<Value> = teams
            .iter()
            .map(|team| json!({"matchExpressions": [{"key": "team", "operator": "In", "values": [team]}]}))
            .collect();
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    }

    #[test]
    fn a_pod_belongs_to_the_heaviest_pool_it_could_go_to() {
        let gpu_taint = Taint {
            key: "gpu".to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        let pools = [
            pool("b", 10, Vec::new()),
            pool("a", 10, Vec::new()),
            pool("gpu", 50, vec![gpu_taint]),
            pool("c", 0, Vec::new()),
        ];
        let pods = [
            pod("anywhere", json!({})),
            pod("only-c", json!({"nodeSelector": {"team": "c"}})),
            pod("c-or-b", teams(&["c", "b"])),
            pod("nowhere", teams(&["z"])),
            pod(
                "gpu",
                json!({"tolerations": [{"key": "gpu", "operator": "Exists"}]}),
            ),
            pod("anywhere-again", json!({})),
        ];
        // The tainted pool is the heaviest, but only a pod that tolerates it goes there; of
        // equal weights, the first by name.
        assert_eq!(
            owners(&pools, &pods),
            [Some(1), Some(3), Some(0), None, Some(2), Some(1)]
        );
    }

    #[test]
    fn a_pod_belongs_to_a_pool_its_volumes_can_be_used_in() {
        use joist_messages::model::requirements::{Operator, Requirement};
        let team = |name: &str| {
            [Requirement::new("team", Operator::In, [name]).unwrap_or_else(|e| panic!("{e}"))]
                .into_iter()
                .collect::<Requirements>()
        };
        let pools = [pool("a", 10, Vec::new()), pool("b", 0, Vec::new())];
        let pods = [
            pod("free", json!({})),
            pod("volume-in-b", json!({})).with_volume_requirements(vec![team("b")]),
            pod("volume-nowhere", json!({})).with_volume_requirements(vec![team("z")]),
        ];
        assert_eq!(owners(&pools, &pods), [Some(0), Some(1), None]);
    }
}

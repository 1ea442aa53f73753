//! One scheduling problem from the read model, taken in Karpenter's order: nodes and in-flight
//! NodeClaims first, pending pods last, so a pod that lands on a node between the two reads is
//! counted twice (and undershoots) rather than not at all (and overshoots).
//!
//! Conversions that fail (a quantity that does not parse, a pod the simulation cannot model) leave
//! the object out and are reported, never fatal to the batch.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use joist_messages::{
    apis::{NodeClaim, NodePool},
    cached_pod::{CachedPod, CachedPodSpec},
    labels::{INITIALIZED, taints},
    model::{requirements::Requirements, resources::Resources},
    nodes::{is_ephemeral, node_allocatable},
    pods::finished,
};
use joist_scheduling::{ExistingNode, NodePoolInput, pod::PodInfo};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::{
    decide::lifecycle::is_disrupted,
    state::read_model::{ReadModel, Viewed},
};

/// The nodes the simulation may place pods on: registered Nodes that are not being deleted (nor
/// their NodeClaims), cordoned or drained, then NodeClaims still launching or booting.
pub fn existing_nodes(read: &ReadModel) -> Vec<ExistingNode> {
    let claims = read.node_claims();
    let mut nodes: Vec<ExistingNode> = read
        .nodes()
        .iter()
        .filter(|n| usable(n))
        .filter_map(|node| {
            let claim = node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|p| read.claim_for_provider(p))
                .and_then(|name| read.node_claim(&name));
            // A node whose NodeClaim is being deleted takes no pod, and its own pods are the
            // provisioner's to place (its drain taint may not be there yet); nor does a
            // disruption's replacement before its candidates' pods are simulated.
            if claim
                .as_ref()
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some() || read.reserved(&c.name_any()))
            {
                return None;
            }
            Some(existing_node(read, node, claim.as_deref()))
        })
        .collect();
    nodes.extend(
        claims
            .iter()
            .filter(|c| {
                c.metadata.deletion_timestamp.is_none()
                    && !registered(read, c)
                    && !read.reserved(&c.name_any())
            })
            .map(|c| in_flight(c)),
    );
    nodes
}

fn usable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    node.metadata.deletion_timestamp.is_none()
        && !spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && !is_disrupted(node)
}

fn registered(read: &ReadModel, claim: &NodeClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| read.node_for_provider(p).is_some())
}

fn existing_node(read: &ReadModel, node: &Node, claim: Option<&NodeClaim>) -> ExistingNode {
    let labels = node.labels().clone();
    let initialized = claim.is_none() || labels.get(INITIALIZED).is_some_and(|v| v == "true");
    // While a claimed node starts, its startup and boot taints are on their way out: schedule
    // against the taints it will keep, as Karpenter does.
    let taints = match claim {
        Some(claim) if !initialized => claim.spec.taints.clone(),
        _ => node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            // A disruption candidate's taint steers kube-scheduler; it is no constraint.
            .filter(|t| !is_ephemeral(t) && t.key != taints::DISRUPTION_CANDIDATE)
            .collect(),
    };
    let allocatable = node_allocatable(node);
    let pods = read
        .pods_on(&node.name_any())
        .iter()
        .filter(|p| !finished(p))
        .filter_map(|p| read.pod_info(p).ok())
        .collect();
    ExistingNode {
        name: node.name_any(),
        labels,
        taints,
        allocatable,
        pods,
        initialized,
        volume_limits: read.volume_limits(&node.name_any()),
    }
}

fn in_flight(claim: &NodeClaim) -> ExistingNode {
    let mut labels = claim.labels().clone();
    // Only a requirement of one value implies a label: the long list of instance types a claim
    // carries is not worth parsing here.
    for requirement in claim
        .spec
        .requirements
        .iter()
        .filter(|r| r.values.len() == 1)
        .filter_map(|r| r.to_requirement().ok())
    {
        if let Some((key, value)) = requirement.implied_label() {
            labels.insert(key.to_owned(), value.to_owned());
        }
    }
    let status = claim.status.as_ref();
    let allocatable = status
        .map(|s| Resources::from(&s.allocatable))
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| Resources::from(&claim.spec.resources.requests));
    ExistingNode {
        name: claim.name_any(),
        labels,
        taints: claim.spec.taints.clone(),
        allocatable,
        pods: Vec::new(),
        initialized: false,
        volume_limits: Default::default(),
    }
}

/// The NodeClaim of a node the simulation counts on: its own name while in flight, else the claim
/// of the registered Node.
pub fn claim_of_node(read: &ReadModel, node: &str) -> Option<String> {
    match read.node(node) {
        Some(_) => read.claim_for_node(node),
        None => Some(node.to_owned()),
    }
}

/// Pending pods kept on the launching nodes planned for them ([`crate::state::planned`]).
#[derive(Debug, Default)]
pub struct Held {
    /// Pod UID to the NodeClaim it stays planned for.
    pub plans: HashMap<String, String>,
    /// The nodes holding them, by the simulation's names.
    pub nodes: BTreeSet<String>,
}

/// Moves each of `pods` that `plans` (pod UID to claim name) planned for a NodeClaim whose node
/// has not initialized onto that node of `nodes`, as if bound there, while it fits beside the pods
/// already on it, and says what it held. A pod whose claim is gone or initialized, or that no
/// longer fits (kube-scheduler bound others there), stays in `pods` to be simulated.
pub fn hold_planned(
    read: &ReadModel,
    plans: &HashMap<String, String>,
    nodes: &mut [ExistingNode],
    pods: &mut Vec<(Arc<CachedPod>, Arc<PodInfo>)>,
) -> Held {
    let mut held = Held::default();
    if plans.is_empty() {
        return held;
    }
    // Each launching node by its claim's name, with the room left beside its pods.
    let mut launching: HashMap<String, (usize, Resources)> = HashMap::new();
    for (i, node) in nodes.iter().enumerate().filter(|(_, n)| !n.initialized) {
        let Some(claim) = claim_of_node(read, &node.name) else {
            continue;
        };
        let mut room = node.allocatable.clone();
        for pod in &node.pods {
            room.sub(&pod.requests);
        }
        launching.insert(claim, (i, room));
    }
    pods.retain(|(_, info)| {
        let Some((claim, (i, room))) = plans
            .get(&info.uid)
            .and_then(|claim| Some((claim, launching.get_mut(claim)?)))
        else {
            return true;
        };
        if !info.requests.fits(room) {
            return true;
        }
        room.sub(&info.requests);
        let node = &mut nodes[*i];
        node.pods.push(info.clone());
        held.nodes.insert(node.name.clone());
        held.plans.insert(info.uid.clone(), claim.clone());
        false
    });
    held
}

/// A NodePool as the simulation sees it, `instance_types` being its positions in the catalog.
pub fn pool_input(
    read: &ReadModel,
    pool: &NodePool,
    instance_types: Vec<usize>,
) -> Result<NodePoolInput, String> {
    let template = &pool.spec.template;
    let requirements = template
        .spec
        .requirements
        .iter()
        .map(|r| r.to_requirement())
        .collect::<Result<Requirements, _>>()
        .map_err(|e| {
            format!(
                "nodepool {:?} spec.template.spec.requirements: {e}",
                pool.name_any()
            )
        })?;
    let remaining = (!pool.spec.limits.is_empty()).then(|| {
        let used = read.pool_usage(&pool.name_any());
        pool.spec
            .limits
            .iter()
            .map(|(name, limit)| (name.clone(), limit.saturating_sub(used.get(name))))
            .collect()
    });
    Ok(NodePoolInput {
        name: pool.name_any(),
        weight: pool.spec.weight.unwrap_or(0),
        requirements,
        labels: template.metadata.labels.clone(),
        taints: template.spec.taints.clone(),
        remaining,
        instance_types,
    })
}

/// A DaemonSet's pod template as the pod it would run on every node.
pub fn daemon_pod(template: &k8s_openapi::api::core::v1::PodTemplateSpec, namespace: &str) -> CachedPod {
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.namespace = Some(namespace.to_owned());
    CachedPod {
        metadata,
        spec: template.spec.clone().map(CachedPodSpec::from),
        status: None,
    }
}

/// Namespace labels by name, for affinity namespace selectors.
pub fn namespace_labels(read: &ReadModel) -> BTreeMap<String, BTreeMap<String, String>> {
    read.namespaces()
        .iter()
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect()
}

/// Pending pods, sorted into the ones the simulation takes and the ones it cannot model.
#[derive(Default)]
pub struct Pending {
    /// Pods with their simulation form.
    pub pods: Vec<(Arc<CachedPod>, Arc<PodInfo>)>,
    /// Pods left out, with why.
    pub ignored: Vec<(Arc<CachedPod>, String)>,
}

/// Sorts pods with their views ([`ReadModel::pending_pods`], or [`ReadModel::pod_info`] of
/// each) into those the simulation takes and those it cannot model.
pub fn pending(views: impl IntoIterator<Item = Viewed>) -> Pending {
    let views = views.into_iter();
    let mut pending = Pending {
        pods: Vec::with_capacity(views.size_hint().0),
        ignored: Vec::new(),
    };
    for (pod, view) in views {
        match view {
            Ok(info) => pending.pods.push((pod, info)),
            Err(error) => pending.ignored.push((pod, error.to_string())),
        }
    }
    pending
}

#[cfg(test)]
mod tests {
    use joist_messages::{
        apis::EC2NodeClass,
        labels,
        model::{
            instance_type::{CapacityType, InstanceType, Offering},
            quantity::Quantity,
            requirements::{Operator, Requirement},
            resources::names,
        },
    };
    use joist_provider::launch;
    use joist_scheduling::NewClaim;

    use super::*;
    use crate::decide::claim_template;

    fn pool() -> NodePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "teams", "uid": "pool-uid"},
            "spec": {"template": {
                "metadata": {"labels": {"company.com/owner": "platform"}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": [
                        {"key": "company.com/team", "operator": "In", "values": ["a", "b"]},
                        {"key": "company.com/tier", "operator": "Exists"},
                        {"key": "company.com/generation", "operator": "Gt", "values": ["3"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                },
            }},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn c5_large() -> InstanceType {
        InstanceType {
            name: "c5.large".into(),
            requirements: [
                Requirement::new(labels::INSTANCE_TYPE, Operator::In, ["c5.large"])
                    .unwrap_or_else(|e| panic!("{e}")),
            ]
            .into_iter()
            .collect(),
            offerings: vec![Offering {
                zone: "us-west-2a".into(),
                capacity_type: CapacityType::OnDemand,
                price: 0.085,
                available: true,
                reservation: None,
            }],
            capacity: Resources::new().with(names::CPU, Quantity::from_units(2)),
            overhead: Default::default(),
        }
    }

    /// The labels the Node registers with: the instance's (as every provider writes them) under
    /// the claim's (which registration copies onto the Node).
    fn registered_labels(claim: &NodeClaim, it: &InstanceType) -> BTreeMap<String, String> {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
            "status": {"subnets": [{"id": "subnet-1", "zone": "us-west-2a", "zoneID": "usw2-az1"}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let mut labels = launch::node_labels(it, "us-west-2", "us-west-2a", "on-demand", &class);
        labels.extend(claim.labels().clone());
        labels
    }

    #[test]
    fn the_claim_in_flight_looks_like_the_node_that_registers() {
        let pool = pool();
        let input = pool_input_requirements(&pool);
        // The pods select team a: the simulation narrows the pool's requirement to it.
        let mut narrowed = input.clone();
        narrowed
            .add(Requirement::new("company.com/team", Operator::In, ["a"]).unwrap_or_else(|e| panic!("{e}")));
        let new = NewClaim {
            node_pool: 0,
            requirements: narrowed,
            instance_types: vec![0],
            price: 0.085,
            requests: Resources::new(),
            pods: vec![0],
        };
        let types = [c5_large().into()];
        let claim = claim_template::node_claim(&pool, &new, &types);
        let node = registered_labels(&claim, &types[0]);
        let flight = in_flight(&claim);
        for (key, value) in &flight.labels {
            assert_eq!(
                node.get(key),
                Some(value),
                "in flight {key}={value}; the node carries {node:?}"
            );
        }
        let requirements: Requirements = claim
            .spec
            .requirements
            .iter()
            .map(|r| r.to_requirement().unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert!(
            requirements.matches_labels(|key| node.get(key).map(String::as_str)),
            "the node's labels {node:?} must meet the claim's requirements {:?}",
            claim.spec.requirements
        );
        assert_eq!(node.get("company.com/team").map(String::as_str), Some("a"));
        assert_eq!(
            node.get("company.com/owner").map(String::as_str),
            Some("platform")
        );
        assert_eq!(
            node.get(labels::EC2_NODE_CLASS).map(String::as_str),
            Some("default")
        );
        assert_eq!(
            node.get(labels::aws::ZONE_ID).map(String::as_str),
            Some("usw2-az1")
        );
    }

    /// A pending pod `name` (UID `uid-NAME`) asking for `cpu`, with its simulation form.
    fn waiting(name: &str, cpu: &str) -> (Arc<CachedPod>, Arc<PodInfo>) {
        let pod: CachedPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let info = PodInfo::from_pod(&pod).unwrap_or_else(|e| panic!("{e}"));
        (Arc::new(pod), Arc::new(info))
    }

    /// A node named `name` with room for `cpu` CPUs and 110 pods, initialized or still launching.
    fn node(name: &str, cpu: i64, initialized: bool) -> ExistingNode {
        ExistingNode {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            allocatable: Resources::new()
                .with(names::CPU, Quantity::from_units(cpu))
                .with(names::PODS, Quantity::from_units(110)),
            pods: Vec::new(),
            initialized,
            volume_limits: BTreeMap::new(),
        }
    }

    #[test]
    fn pods_planned_for_a_launching_claim_stay_on_it_while_they_fit() {
        let (read, _writers) = ReadModel::new();
        let mut nodes = vec![node("ready", 8, true), node("launching", 4, false)];
        // kube-scheduler bound a pod there already.
        let (_, bound) = waiting("bound", "1");
        nodes[1].pods.push(bound);
        let mut pods = vec![
            waiting("a", "1500m"),
            waiting("b", "1500m"),
            // Planned there too, but the pod kube-scheduler bound left no room: simulated again.
            waiting("c", "1500m"),
            // Planned for a node that initialized: kube-scheduler is about to place it.
            waiting("d", "1"),
            // Planned for a claim that is gone.
            waiting("e", "1"),
            // Arrived since the last pass.
            waiting("f", "1"),
        ];
        let plans: HashMap<String, String> = [
            ("a", "launching"),
            ("b", "launching"),
            ("c", "launching"),
            ("d", "ready"),
            ("e", "deleted"),
        ]
        .into_iter()
        .map(|(pod, claim)| (format!("uid-{pod}"), claim.to_owned()))
        .collect();
        let held = hold_planned(&read, &plans, &mut nodes, &mut pods);
        let left: Vec<&str> = pods.iter().map(|(_, info)| info.name.as_str()).collect();
        assert_eq!(left, ["c", "d", "e", "f"]);
        let on_launching: Vec<&str> = nodes[1].pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(on_launching, ["bound", "a", "b"]);
        assert!(nodes[0].pods.is_empty());
        assert_eq!(held.nodes, BTreeSet::from(["launching".to_owned()]));
        let kept: BTreeMap<&str, &str> = (held.plans.iter())
            .map(|(pod, claim)| (pod.as_str(), claim.as_str()))
            .collect();
        assert_eq!(
            kept,
            BTreeMap::from([("uid-a", "launching"), ("uid-b", "launching")])
        );
    }

    fn pool_input_requirements(pool: &NodePool) -> Requirements {
        pool.spec
            .template
            .spec
            .requirements
            .iter()
            .map(|r| r.to_requirement().unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }
}

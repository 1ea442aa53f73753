//! The floor the control plane itself sets under a workload: what no node autoscaler can cut.
//!
//! The same Deployments, applied the same way, on a fresh control plane whose nodes were created
//! up front: two copies of each node a controller had at the end of its largest scale-out (labels,
//! capacity and allocatable, and KWOK's annotation so KWOK plays their kubelet), made Ready before
//! the first step. Two, because the scheduler spreads pods where a node autoscaler packs them: on
//! the controller's nodes alone, some of its large pods found no node with room left. A scale-out's floor is the seconds until every pod is Running
//! there: the Deployment controller creating the pods, the scheduler binding them, KWOK starting
//! them. A consolidation's floor is the NodePool's `consolidateAfter`; a drift has none. Nodes that
//! KWOK has not made Ready within two minutes stop the benchmark with the count.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::{
    Api,
    api::{ListParams, ObjectMeta, PostParams},
};

use super::{
    CONSOLIDATE_AFTER, Setup, TICK, Waited,
    observe::Observer,
    peers::ControlPlane,
    wait,
    workloads::{Phase, Workload},
};
use crate::commands::bench_controller::{BenchError, apply, client, failed_to};

/// How long KWOK may go without making another node created up front Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// The taint the node lifecycle controller keeps on a node until it is Ready.
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// How many copies of each node are created up front.
const COPIES: usize = 2;

/// The label that names a node's host.
const HOSTNAME: &str = "kubernetes.io/hostname";

/// Copies of `nodes` to create up front, [`COPIES`] of each: their labels and resources, under
/// short names of their own (`floor-7-2`, the second copy of the seventh node; a name is also the
/// hostname label's value, at most 63 bytes, and Karpenter's KWOK nodes have names of 62), managed
/// by KWOK.
pub fn up_front(nodes: &[Node]) -> Vec<Node> {
    let (key, value) = joist_provider_sim::kwok::KWOK_NODE;
    let copy = |(index, node): (usize, &Node), n: usize| {
        let name = format!("floor-{}-{n}", index + 1);
        let mut labels = node.metadata.labels.clone().unwrap_or_default();
        labels.insert(HOSTNAME.to_owned(), name.clone());
        let status = node.status.clone().unwrap_or_default();
        Node {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(labels),
                annotations: Some([(key.to_owned(), value.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                capacity: status.capacity,
                allocatable: status.allocatable,
                ..NodeStatus::default()
            }),
        }
    };
    nodes
        .iter()
        .enumerate()
        .flat_map(|node| (1..=COPIES).map(move |n| copy(node, n)))
        .collect()
}

/// Each step's floor for `workload` on `nodes` created up front, in seconds.
pub async fn measure(workload: &Workload, nodes: &[Node], setup: &Setup<'_>) -> Result<Vec<f64>, BenchError> {
    let cluster = ControlPlane::up(setup.scripts, &setup.dir.join("cluster"))?;
    let client = client(&cluster.kubeconfig).await?;
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), node)
            .await
            .map_err(failed_to(format!("creating the node {name} up front")))?;
    }
    ready(&api, nodes.len()).await?;
    let mut observer = Observer::new(&client, setup.prices.clone());
    let began = tokio::time::Instant::now();
    let mut floors = Vec::new();
    for (index, step) in workload.steps.iter().enumerate() {
        let manifests: Vec<String> = step.apps.iter().map(|app| app.manifest().to_string()).collect();
        let started = began.elapsed().as_secs_f64();
        apply(&client, &manifests.join("\n---\n")).await?;
        floors.push(match step.phase {
            Phase::ScaleOut => {
                let limits = (0.0, setup.deadline);
                match wait(step, &mut observer, (&began, started), limits, &mut || false).await? {
                    Waited::Ended(ended) => ended - started,
                    Waited::PastDeadline(_) | Waited::ControllerExited => {
                        return Err(BenchError::Script {
                            script: setup.scripts.join("kube-control-plane"),
                            message: format!(
                                "the pods of step {} did not all run on {} nodes created up front",
                                index + 1,
                                nodes.len()
                            ),
                        });
                    }
                }
            }
            Phase::ScaleDown => CONSOLIDATE_AFTER,
            Phase::Drift => 0.0,
        });
    }
    Ok(floors)
}

/// Waits until `count` nodes are Ready and untainted, for as long as more turn Ready at least
/// every `READY_WITHIN` (kube-controller-manager lifts the not-ready taints a few nodes a second,
/// so 1,500 nodes take minutes); fails when none has for that long.
async fn ready(api: &Api<Node>, count: usize) -> Result<(), BenchError> {
    let (mut ready, mut grew_at) = (0, tokio::time::Instant::now());
    loop {
        let nodes = api
            .list(&ListParams::default())
            .await
            .map_err(failed_to("listing the nodes created up front"))?;
        let now_ready = nodes.items.iter().filter(|node| is_ready(node)).count();
        if now_ready >= count {
            return Ok(());
        }
        if now_ready > ready {
            (ready, grew_at) = (now_ready, tokio::time::Instant::now());
        } else if grew_at.elapsed() > READY_WITHIN {
            return Err(BenchError::Script {
                script: "kwok".into(),
                message: format!(
                    "{ready} of {count} nodes created up front Ready, and no more for {}s",
                    READY_WITHIN.as_secs()
                ),
            });
        }
        tokio::time::sleep(TICK).await;
    }
}

/// Whether `node` is Ready and free of the not-ready taint.
fn is_ready(node: &Node) -> bool {
    let condition = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == NOT_READY));
    condition && !tainted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_created_up_front_twice_with_its_labels_and_resources_and_is_kwoks() {
        // A name as long as Karpenter's KWOK nodes get: with a suffix, no hostname label.
        let long = "kwok-default-mm9d2-gargoylesnapdragon-62-lsr99piuxk-1332384752";
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": long, "labels": {"kubernetes.io/hostname": long, "zone": "z"},
                         "annotations": {"karpenter.sh/nodepool-hash": "1"}, "uid": "u"},
            "spec": {"providerID": "kwok://n", "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "3900m"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("a node");
        let copies = up_front(&[node]);
        let names: Vec<_> = copies
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["floor-1-1", "floor-1-2"]);
        for (copy, name) in copies.iter().zip(&names) {
            let labels = copy.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels["kubernetes.io/hostname"], *name, "its own host");
            assert_eq!(labels["zone"], "z");
            assert_eq!(
                copy.metadata.annotations,
                Some([("kwok.x-k8s.io/node".to_owned(), "fake".to_owned())].into())
            );
            assert!(copy.metadata.uid.is_none() && copy.spec.is_none());
            let status = copy.status.clone().unwrap_or_default();
            assert_eq!(status.allocatable.unwrap_or_default()["cpu"].0, "3900m");
            assert!(status.conditions.is_none(), "KWOK writes the conditions");
            assert!(!is_ready(copy));
        }
    }
}

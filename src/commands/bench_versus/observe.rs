//! What `joist bench versus-karpenter` sees of a cluster while a controller works: once a second,
//! the suite's pods (label `testing/cluster=unspecified`) Running and Pending, the controller's
//! nodes (label `karpenter.sh/nodepool`), those being disrupted (deleting, or tainted
//! `karpenter.sh/disrupted`), and their cost per hour at the catalog's prices; and, from a watch of
//! the pods, every pod ever evicted through the Eviction API (the API server marks it with the
//! condition `DisruptionTarget`, reason `EvictionByEvictionAPI`). Reads are served from the API
//! server's cache (`resourceVersion=0`), so watching costs both controllers' runs alike and little.

use std::{
    collections::{BTreeSet, HashMap},
    path::Path,
    sync::{Arc, Mutex},
};

use futures::StreamExt as _;
use joist_messages::{labels, model::instance_type::CapacityType};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::ListParams,
    runtime::{WatchStreamExt as _, watcher},
};

use super::{super::bench_controller::BenchError, workloads::TEST_LABEL};
use crate::commands::bench_controller::failed_to;

/// The cluster at one moment, seconds after the workload began.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the workload's first step.
    pub at: f64,
    /// Nodes of the controller.
    pub nodes: usize,
    /// Nodes deleting or tainted for disruption.
    pub disrupting: usize,
    /// Pods Running (not deleting).
    pub running: usize,
    /// Pods Pending.
    pub pending: usize,
    /// Cost per hour of the nodes, in dollars.
    pub cost: f64,
}

/// On-demand and spot prices per instance type and zone, from the KWOK catalog.
pub struct Prices(HashMap<(String, CapacityType, String), f64>);

impl Prices {
    /// The prices of the catalog at `path`.
    pub fn read(path: &Path) -> Result<Self, BenchError> {
        let failed = |message: String| BenchError::Script {
            script: path.to_owned(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let types = joist_provider_sim::kwok::instance_types(&path.to_string_lossy(), &text)
            .map_err(|e| failed(e.to_string()))?;
        let mut prices = HashMap::new();
        for it in types {
            for offering in &it.offerings {
                let key = (it.name.clone(), offering.capacity_type, offering.zone.clone());
                prices.insert(key, offering.price);
            }
        }
        Ok(Self(prices))
    }

    /// The price per hour of `node`, by its instance type, capacity type and zone labels; 0 when
    /// the catalog does not sell it.
    fn of(&self, node: &Node) -> f64 {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
        let Some(capacity) = CapacityType::from_label(&label(labels::CAPACITY_TYPE)) else {
            return 0.0;
        };
        let key = (label(labels::INSTANCE_TYPE), capacity, label(labels::ZONE));
        self.0.get(&key).copied().unwrap_or(0.0)
    }
}

/// Looks at one cluster; see the module docs.
pub struct Observer {
    pods: Api<Pod>,
    nodes: Api<Node>,
    prices: Arc<Prices>,
    evicted: Arc<Mutex<BTreeSet<String>>>,
    watch: tokio::task::JoinHandle<()>,
    /// Every sample taken, in order.
    pub samples: Vec<Sample>,
    /// The controller's nodes at the last sample (kept once, not in every sample).
    pub nodes_now: Vec<Node>,
}

impl Observer {
    /// Starts watching `client`'s cluster for evictions.
    pub fn new(client: &kube::Client, prices: Arc<Prices>) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let evicted = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = evicted.clone();
        let config = watcher::Config::default().labels(&format!("{}={}", TEST_LABEL.0, TEST_LABEL.1));
        let stream = watcher(pods.clone(), config).default_backoff().applied_objects();
        let watch = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(pod) = event else { continue };
                if evicted_by_api(&pod) {
                    let uid = pod.metadata.uid.unwrap_or_default();
                    seen.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(uid);
                }
            }
        });
        Self {
            nodes: Api::all(client.clone()),
            pods,
            prices,
            evicted,
            watch,
            samples: Vec::new(),
            nodes_now: Vec::new(),
        }
    }

    /// The names of the controller's nodes at the last sample.
    pub fn names(&self) -> BTreeSet<String> {
        self.nodes_now
            .iter()
            .map(|node| node.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    /// Pods evicted through the Eviction API so far.
    pub fn evicted(&self) -> usize {
        self.evicted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Looks at the cluster now, `at` seconds into the workload, and keeps the sample.
    pub async fn sample(&mut self, at: f64) -> Result<&Sample, BenchError> {
        let cached = ListParams::default().match_any();
        let pods = self
            .pods
            .list(
                &cached
                    .clone()
                    .labels(&format!("{}={}", TEST_LABEL.0, TEST_LABEL.1)),
            )
            .await
            .map_err(failed_to("listing the workload's pods"))?;
        let nodes = self
            .nodes
            .list(&cached.labels(labels::NODEPOOL))
            .await
            .map_err(failed_to("listing the controller's nodes"))?;
        let mut sample = Sample {
            at,
            ..Sample::default()
        };
        for pod in &pods.items {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            match phase {
                "Running" if pod.metadata.deletion_timestamp.is_none() => sample.running += 1,
                "Pending" => sample.pending += 1,
                _ => {}
            }
        }
        for node in &nodes.items {
            sample.nodes += 1;
            sample.cost += self.prices.of(node);
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == labels::taints::DISRUPTED));
            if tainted || node.metadata.deletion_timestamp.is_some() {
                sample.disrupting += 1;
            }
        }
        self.nodes_now = nodes.items;
        self.samples.push(sample);
        Ok(self.samples.last().expect("just pushed"))
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Whether the API server marked `pod` as evicted through the Eviction API.
fn evicted_by_api(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("EvictionByEvictionAPI")
            })
        })
}

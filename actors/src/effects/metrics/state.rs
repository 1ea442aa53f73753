//! The gauges of what the cluster holds, read from the read model at each scrape, with
//! Karpenter's names and labels: cluster-state sync and node count, each node's allocatable and
//! its pods' and daemons' requests (labelled with the node's well-known labels, as Karpenter's
//! node metrics are), every pod's state, and each NodePool's usage and limits.
//!
//! When NodePools are split between replicas ([`ReplicaShards`]), a replica exports the NodePool
//! series of its own shards' NodePools only, and the node and pod series only on the holder of
//! shard 0, so that the replicas' series add up to the cluster's without counting anything twice.
//!
//! A scrape costs one pass over nodes, pods and NodePools, and writes each series as it is made;
//! nothing is kept between scrapes, so a deleted object's series disappears at once. A pod whose
//! requests do not parse counts as requesting nothing.

use std::{fmt, sync::LazyLock};

use joist_messages::{
    cached_pod::CachedPod,
    labels::{self, ARCH, CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE},
    model::resources::Resources,
    nodes::node_allocatable,
    pods::{finished, owned_by_daemon_set},
};
use joist_scheduling::pod::effective_requests;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet},
    metrics::MetricType,
};

use crate::state::{read_model::ReadModel, replica_shards::ReplicaShards};

/// A series' labels, built per scrape.
type Labels = Vec<(&'static str, String)>;

/// Every well-known label key, with its metric label name, worked out once.
static WELL_KNOWN_NAMES: LazyLock<Vec<(&'static str, String)>> = LazyLock::new(|| {
    labels::WELL_KNOWN
        .iter()
        .chain(labels::aws::WELL_KNOWN)
        .map(|key| (*key, label_name(key)))
        .collect()
});

/// See the module docs.
pub struct ClusterStateCollector {
    read: ReadModel,
    shards: Option<ReplicaShards>,
}

impl ClusterStateCollector {
    /// Reads `read` at each scrape, for the NodePools of `shards` (all when none).
    pub fn new(read: ReadModel, shards: Option<ReplicaShards>) -> Self {
        Self { read, shards }
    }
}

impl fmt::Debug for ClusterStateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterStateCollector").finish_non_exhaustive()
    }
}

impl Collector for ClusterStateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let build = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("goarch", std::env::consts::ARCH),
        ];
        family(
            &mut encoder,
            "karpenter_build_info",
            "1, labelled with Joist's version",
            std::iter::once((build, 1u8)),
        )?;
        let read = &self.read;
        let cluster_wide = self.shards.as_ref().is_none_or(ReplicaShards::holds_first);
        let nodes = if cluster_wide { read.nodes() } else { Vec::new() };
        let synced = u8::from(read.is_synced());
        single(
            &mut encoder,
            "karpenter_cluster_state_synced",
            "1 once the cluster state has its initial lists",
            synced,
        )?;
        single(
            &mut encoder,
            "karpenter_cluster_state_node_count",
            "Nodes in the cluster state",
            nodes.len(),
        )?;
        let rows: Vec<NodeRow<'_>> = nodes.iter().map(|node| NodeRow::of(read, node)).collect();
        let node_families: [(&str, &str, NodeAmounts); 3] = [
            (
                "karpenter_nodes_allocatable",
                "Node allocatable, by resource",
                |row| &row.allocatable,
            ),
            (
                "karpenter_nodes_total_pod_requests",
                "Requests of the non-daemon pods bound to the node, by resource",
                |row| &row.pod_requests,
            ),
            (
                "karpenter_nodes_total_daemon_requests",
                "Requests of the daemon pods bound to the node, by resource",
                |row| &row.daemon_requests,
            ),
        ];
        for (name, help, amounts) in node_families {
            let series = rows
                .iter()
                .flat_map(|row| by_resource(row.labels.as_slice(), amounts(row)));
            family(&mut encoder, name, help, series)?;
        }
        let pods = if cluster_wide { read.pods() } else { Vec::new() };
        family(
            &mut encoder,
            "karpenter_pods_state",
            "1 for each pod, labelled with its state",
            pods.iter().map(|pod| (pod_labels(read, pod), 1u8)),
        )?;
        let pools: Vec<(String, Resources, Resources)> = read
            .node_pools()
            .iter()
            .filter(|pool| {
                self.shards
                    .as_ref()
                    .is_none_or(|s| s.holds_pool(&pool.name_any()))
            })
            .map(|pool| {
                let name = pool.name_any();
                let usage = read.pool_usage(&name);
                (name, usage, Resources::from(&pool.spec.limits))
            })
            .collect();
        family(
            &mut encoder,
            "karpenter_nodepools_usage",
            "What a NodePool's nodes hold, by resource",
            pools
                .iter()
                .flat_map(|(name, usage, _)| by_resource([("nodepool", name.as_str())], usage)),
        )?;
        family(
            &mut encoder,
            "karpenter_nodepools_limit",
            "A NodePool's limits, by resource",
            pools
                .iter()
                .flat_map(|(name, _, limits)| by_resource([("nodepool", name.as_str())], limits)),
        )
    }
}

/// One gauge without labels.
fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl TryInto<i64>,
) -> fmt::Result {
    let value: i64 = value.try_into().unwrap_or(i64::MAX);
    encoder
        .encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&value)
}

/// One gauge family, each series encoded as it comes: a scrape holds no series but the one it
/// writes (building them all first took some 350 MB at 10,000 nodes).
fn family<S: EncodeLabelSet, V: Into<f64>>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (S, V)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        metric.encode_family(&labels)?.encode_gauge(&value.into())?;
    }
    Ok(())
}

/// A series' labels and its `resource_type`.
type WithResource<L> = (L, [(&'static str, String); 1]);

/// One series per resource in `amounts`: `labels` plus `resource_type`.
fn by_resource<'a, L: EncodeLabelSet + Clone + 'a>(
    labels: L,
    amounts: &'a Resources,
) -> impl Iterator<Item = (WithResource<L>, f64)> + 'a {
    amounts.iter().map(move |(name, amount)| {
        let resource = [("resource_type", resource_type(name))];
        ((labels.clone(), resource), amount.millis() as f64 / 1000.0)
    })
}

/// Which of a node's amounts a family reports.
type NodeAmounts = for<'r> fn(&'r NodeRow<'_>) -> &'r Resources;

/// What a scrape says of one node: its labels, read from the node in place, and its amounts.
struct NodeRow<'a> {
    labels: Vec<(&'static str, &'a str)>,
    allocatable: Resources,
    pod_requests: Resources,
    daemon_requests: Resources,
}

impl<'a> NodeRow<'a> {
    fn of(read: &ReadModel, node: &'a Node) -> Self {
        let (pod_requests, daemon_requests) = requests_on(read, &node.name_any());
        Self {
            labels: node_labels(node),
            allocatable: node_allocatable(node),
            pod_requests,
            daemon_requests,
        }
    }
}

/// Karpenter's `resource_type` value: the resource name lower-cased, `-` as `_`.
fn resource_type(name: &str) -> String {
    name.to_lowercase().replace('-', "_")
}

/// Karpenter's node labels: `node_name`, `managed`, and for every well-known label key the part
/// after `/`, snake-cased, with the node's value ("" when it has none).
fn node_labels(node: &Node) -> Vec<(&'static str, &str)> {
    let values = node.labels();
    let managed = if values.contains_key(NODEPOOL) {
        "true"
    } else {
        "false"
    };
    let mut labels = vec![
        ("node_name", node.metadata.name.as_deref().unwrap_or_default()),
        ("managed", managed),
    ];
    for (key, name) in WELL_KNOWN_NAMES.iter() {
        labels.push((name.as_str(), values.get(*key).map_or("", String::as_str)));
    }
    labels
}

/// `karpenter.k8s.aws/instance-cpu` → `instance_cpu`.
fn label_name(key: &str) -> String {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.to_lowercase().replace(['-', '.'], "_")
}

/// The requests of the running pods bound to `node`: non-daemon pods, then daemon pods.
fn requests_on(read: &ReadModel, node: &str) -> (Resources, Resources) {
    let mut pods = Resources::new();
    let mut daemons = Resources::new();
    for pod in read.pods_on(node).iter().filter(|p| !finished(p)) {
        let Some(requests) = pod
            .spec
            .as_ref()
            .and_then(|spec| effective_requests(&pod.name_any(), spec).ok())
        else {
            continue;
        };
        if owned_by_daemon_set(pod) {
            &mut daemons
        } else {
            &mut pods
        }
        .add(&requests);
    }
    (pods, daemons)
}

/// Karpenter's pod-state labels; node labels come from the node the pod is bound to.
fn pod_labels(read: &ReadModel, pod: &CachedPod) -> Labels {
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let node = (!node_name.is_empty()).then(|| read.node(&node_name)).flatten();
    let node_label = |key: &str| {
        node.as_ref()
            .and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let owner = pod
        .owner_references()
        .first()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .unwrap_or_default();
    vec![
        ("name", pod.name_any()),
        ("namespace", pod.namespace().unwrap_or_default()),
        ("owner", owner),
        ("node", node_name.clone()),
        ("scheduled", (!node_name.is_empty()).to_string()),
        ("nodepool", node_label(NODEPOOL)),
        ("zone", node_label(ZONE)),
        ("arch", node_label(ARCH)),
        ("capacity_type", node_label(CAPACITY_TYPE)),
        ("instance_type", node_label(INSTANCE_TYPE)),
        ("phase", status.and_then(|s| s.phase.clone()).unwrap_or_default()),
        ("ready", ready.to_string()),
        (
            "managed",
            node.is_some_and(|n| n.labels().contains_key(NODEPOOL))
                .to_string(),
        ),
    ]
}

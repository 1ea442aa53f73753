use joist_messages::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("test object")
}

/// The value of the sample of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .find(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

fn pod(name: &str, node: &str, cpu: &str, daemon: bool) -> CachedPod {
    let owner = if daemon {
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}])
    } else {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r", "controller": true}])
    };
    object(json!({
        "metadata": {"name": name, "namespace": "default", "ownerReferences": owner},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }))
}

/// A read model holding one managed node with a daemon and two other pods, and its NodePool.
fn cluster() -> (ReadModel, crate::state::read_model::Writers) {
    let (read, mut writers) = ReadModel::new();
    let node: Node = object(json!({
        "metadata": {"name": "ip-10-0-1-5", "labels": {
            "karpenter.sh/nodepool": "default", "topology.kubernetes.io/zone": "us-west-2a",
            "node.kubernetes.io/instance-type": "m7i.large", "kubernetes.io/arch": "amd64",
            "karpenter.sh/capacity-type": "spot", "karpenter.k8s.aws/instance-cpu": "2",
        }},
        "status": {"allocatable": {"cpu": "1930m", "memory": "7Gi", "pods": "29"}},
    }));
    writers.nodes.apply_watcher_event(&Event::Apply(node.clone()));
    read.observe_node(&node, false);
    for pod in [
        pod("agent-x", "ip-10-0-1-5", "100m", true),
        pod("web-a", "ip-10-0-1-5", "500m", false),
        pod("web-b", "ip-10-0-1-5", "250m", false),
    ] {
        writers.pods.apply_watcher_event(&Event::Apply(pod.clone()));
        read.observe_pod(&Arc::new(pod), false, 0);
    }
    let pool = object(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "default"},
        "spec": {"limits": {"cpu": "100"}, "template": {"spec": {"requirements": [],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}},
    }));
    writers.node_pools.apply_watcher_event(&Event::Apply(pool));
    (read, writers)
}

#[test]
fn node_gauges_carry_the_dashboards_labels_and_split_daemon_requests_from_the_rest() {
    let (read, _writers) = cluster();
    let text = Metrics::new(read).encode();
    let node = [
        ("node_name", "ip-10-0-1-5"),
        ("nodepool", "default"),
        ("zone", "us-west-2a"),
        ("arch", "amd64"),
        ("capacity_type", "spot"),
        ("instance_type", "m7i.large"),
        ("instance_cpu", "2"),
        ("managed", "true"),
    ];
    let cpu = [node.as_slice(), &[("resource_type", "cpu")]].concat();
    assert_eq!(sample(&text, "karpenter_nodes_allocatable", &cpu), Some(1.93));
    assert_eq!(
        sample(&text, "karpenter_nodes_total_pod_requests", &cpu),
        Some(0.75)
    );
    assert_eq!(
        sample(&text, "karpenter_nodes_total_daemon_requests", &cpu),
        Some(0.1)
    );
    assert_eq!(
        sample(
            &text,
            "karpenter_nodes_total_pod_requests",
            &[("node_name", "ip-10-0-1-5"), ("resource_type", "pods")]
        ),
        Some(2.0),
        "each pod takes one pod slot"
    );
    assert_eq!(
        sample(
            &text,
            "karpenter_nodes_allocatable",
            &[("resource_type", "memory")]
        ),
        Some(7.0 * 1024.0 * 1024.0 * 1024.0)
    );
    assert_eq!(
        sample(&text, "karpenter_cluster_state_node_count", &[]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "karpenter_cluster_state_synced", &[]),
        Some(0.0),
        "no store has had its initial list"
    );
}

#[test]
fn every_pod_has_a_state_series_with_its_nodes_labels() {
    let (read, _writers) = cluster();
    let text = Metrics::new(read).encode();
    let web = [
        ("name", "web-a"),
        ("namespace", "default"),
        ("owner", "ReplicaSet/web-1"),
        ("node", "ip-10-0-1-5"),
        ("scheduled", "true"),
        ("nodepool", "default"),
        ("capacity_type", "spot"),
        ("phase", "Running"),
        ("ready", "true"),
        ("managed", "true"),
    ];
    assert_eq!(sample(&text, "karpenter_pods_state", &web), Some(1.0));
    let states = text
        .lines()
        .filter(|l| l.starts_with("karpenter_pods_state{"))
        .count();
    assert_eq!(states, 3);
}

#[test]
fn nodepool_usage_and_limits_are_per_resource() {
    let (read, _writers) = cluster();
    let text = Metrics::new(read).encode();
    let cpu = [("nodepool", "default"), ("resource_type", "cpu")];
    assert_eq!(sample(&text, "karpenter_nodepools_limit", &cpu), Some(100.0));
    assert_eq!(
        sample(
            &text,
            "karpenter_nodepools_usage",
            &[("nodepool", "default"), ("resource_type", "nodes")]
        ),
        None,
        "a pool without NodeClaims holds nothing, and zero amounts have no series"
    );
}

#[test]
fn a_replica_exports_its_own_nodepools_and_only_the_holder_of_shard_0_the_nodes_and_pods() {
    use std::collections::BTreeSet;

    use crate::state::replica_shards::{ReplicaShards, shard_of};
    let (read, _writers) = cluster();
    let cpu = [("nodepool", "default"), ("resource_type", "cpu")];
    let node = [("node_name", "ip-10-0-1-5"), ("resource_type", "cpu")];
    let pool_shard = shard_of("default", 3);
    let other = (pool_shard + 1) % 3;
    let scrape = |held: BTreeSet<u32>| {
        let (_sender, receiver) = tokio::sync::watch::channel(held);
        Metrics::for_shards(read.clone(), Some(ReplicaShards::new(3, receiver))).encode()
    };
    let owner = scrape(BTreeSet::from([pool_shard]));
    assert_eq!(sample(&owner, "karpenter_nodepools_limit", &cpu), Some(100.0));
    let stranger = scrape(BTreeSet::from([other]));
    assert_eq!(sample(&stranger, "karpenter_nodepools_limit", &cpu), None);
    let (with_first, without_first) = if pool_shard == 0 {
        (owner, stranger)
    } else {
        (scrape(BTreeSet::from([0])), scrape(BTreeSet::from([pool_shard])))
    };
    assert_eq!(
        sample(&with_first, "karpenter_nodes_allocatable", &node),
        Some(1.93)
    );
    assert_eq!(sample(&without_first, "karpenter_nodes_allocatable", &node), None);
    assert_eq!(
        sample(&without_first, "karpenter_pods_state", &[("name", "web-a")]),
        None
    );
}

#[test]
fn recorded_events_are_counted_under_karpenters_names() {
    let (read, _writers) = ReadModel::new();
    let metrics = Metrics::new(read);
    metrics.created("default", "provisioned");
    metrics.created("default", "provisioned");
    metrics.interruption_deleted.inc();
    metrics.found_full("events");
    metrics
        .interruption_received
        .get_or_create(&MessageLabels {
            message_type: "spot_interrupted".to_owned(),
        })
        .inc();
    let text = metrics.encode();
    assert_eq!(
        sample(
            &text,
            "karpenter_nodeclaims_created_total",
            &[
                ("reason", "provisioned"),
                ("nodepool", "default"),
                ("min_values_relaxed", "false")
            ]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "karpenter_interruption_deleted_messages_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "joist_mailbox_full_total", &[("actor", "events")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "karpenter_interruption_received_messages_total",
            &[("message_type", "spot_interrupted")]
        ),
        Some(1.0)
    );
    for consolidation_type in ["empty", "single", "multi"] {
        assert_eq!(
            sample(
                &text,
                "karpenter_voluntary_disruption_failed_validations_total",
                &[("consolidation_type", consolidation_type)]
            ),
            Some(0.0),
            "started at zero"
        );
    }
    assert!(text.contains("# TYPE karpenter_interruption_message_queue_duration_seconds histogram"));
    assert!(text.contains("karpenter_build_info{version="));
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn the_prometheus_text_format_names_counter_families_by_their_samples() {
    let (read, _writers) = ReadModel::new();
    let metrics = Metrics::new(read);
    metrics.created("default", "provisioned");
    let text = metrics.encode_text();
    assert!(
        text.contains("# HELP karpenter_nodeclaims_created_total NodeClaims created.\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE karpenter_nodeclaims_created_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("# TYPE karpenter_nodeclaims_created counter"));
    assert!(!text.contains("# EOF"));
    assert!(text.contains("# TYPE karpenter_build_info gauge\n"));
    let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
    metrics.nodes_termination.observe("default", 12.0);
    let text = metrics.encode_text();
    assert_eq!(samples(&text), samples(&metrics.encode()), "the same samples");
    let summary = "karpenter_nodes_termination_duration_seconds";
    assert!(text.contains(&format!("# TYPE {summary} summary\n")), "{text}");
    assert!(
        !text.contains(&format!("# TYPE {summary}_count")),
        "part of the summary"
    );
    assert!(
        text.contains(&format!("{summary}_count{{nodepool=\"default\"}} 1")),
        "{text}"
    );
    assert!(
        text.contains(&format!("{summary}{{nodepool=\"default\",quantile=\"0.5\"}} 12")),
        "{text}"
    );
}

#[test]
fn reasons_are_snake_cased_as_karpenter_counts_them() {
    assert_eq!(snake_case("LaunchTimeout"), "launch_timeout");
    assert_eq!(snake_case("InsufficientCapacityError"), "insufficient_capacity");
    assert_eq!(snake_case("Underutilized"), "underutilized");
}

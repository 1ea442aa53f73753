//! Placement groups in whole runs: a class's `placementGroupSelector` resolved (and refused while
//! the group does not exist), pods spread over a partition group's partitions, a cluster group
//! kept in one zone without its capacity errors stopping launches outside it, a spread group's
//! limit of seven per zone, and nodes drifting when their group is made anew.

use std::collections::BTreeMap;

use super::{APART, NODE_CLASS, Report, deployment, entries, family, pool, run, scenario, terminated};

/// The node class `name`, launching into the placement group named `group`.
fn grouped_class(name: &str, group: &str) -> String {
    NODE_CLASS
        .replace("  name: default\n", &format!("  name: {name}\n"))
        .replace(
            "  role: KarpenterNodeRole-test\n",
            &format!("  role: KarpenterNodeRole-test\n  placementGroupSelector: {{name: {group}}}\n"),
        )
}

/// The c5 NodePool `name` of node class `class`, with extra requirements and spec fields.
fn c5_pool(name: &str, class: &str, requirements: &str, spec: &str) -> String {
    let requirements = if requirements.is_empty() {
        family(&["c5"])
    } else {
        format!("{}\n{requirements}", family(&["c5"]))
    };
    pool(name, &requirements, spec).replace(
        "kind: EC2NodeClass, name: default}",
        &format!("kind: EC2NodeClass, name: {class}}}"),
    )
}

/// A step creating placement group `name` with `strategy` (`partition, partitions: 3`).
fn create_group(at: &str, name: &str, strategy: &str) -> String {
    format!("{{at: {at}, createPlacementGroup: {{name: {name}, strategy: {strategy}}}}}")
}

/// Pod-spec lines putting pods on NodePool `pool`'s nodes.
fn on_pool(pool: &str) -> String {
    format!("      nodeSelector: {{karpenter.sh/nodepool: {pool}}}")
}

/// The final nodes of NodePool `pool`, as (zone, group id, partition).
fn nodes_of(report: &Report, pool: &str) -> Vec<(String, String, String)> {
    let mut nodes: Vec<_> = report
        .summary
        .final_nodes
        .iter()
        .filter(|n| n.nodepool == pool)
        .map(|n| {
            (
                n.zone.clone(),
                n.placement_group_id.clone(),
                n.placement_group_partition.clone(),
            )
        })
        .collect();
    nodes.sort();
    nodes
}

/// How many of `nodes` share each value `key` picks.
fn count_by(
    nodes: &[(String, String, String)],
    key: fn(&(String, String, String)) -> &str,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for node in nodes {
        *counts.entry(key(node).to_owned()).or_default() += 1;
    }
    counts
}

#[test]
fn pods_spread_over_a_partition_groups_partitions_get_a_node_in_each() {
    let spread = format!(
        "{APART}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: karpenter.k8s.aws/placement-group-partition
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {{matchLabels: {{app: web}}}}"
    );
    let manifests = c5_pool("default", "default", "", "")
        + &grouped_class("default", "kafka")
        + &deployment("web", 6, "1", &spread);
    let steps = format!("[{}]", create_group("0s", "kafka", "partition, partitions: 3"));
    let report = run(&scenario(&manifests, &steps, "4m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (6, 0), "{s:#?}");
    let nodes = nodes_of(&report, "default");
    assert!(
        nodes.iter().all(|(_, group, _)| group == "pg-0sim0001"),
        "every node is labelled with its group: {nodes:?}"
    );
    let partitions = count_by(&nodes, |n| &n.2);
    assert_eq!(
        partitions,
        BTreeMap::from([("1".into(), 2), ("2".into(), 2), ("3".into(), 2)]),
        "two nodes in each partition: {nodes:?}"
    );
}

#[test]
fn a_class_whose_placement_group_is_missing_launches_nothing_until_the_group_exists() {
    let manifests = c5_pool("default", "default", "", "")
        + &grouped_class("default", "hpc")
        + &deployment("web", 2, "1", APART);
    let steps = format!("[{}]", create_group("3m", "hpc", "cluster"));
    let report = run(&scenario(&manifests, &steps, "6m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    let warned = report.timeline.iter().any(|e| {
        e.event == "warning"
            && e.object == "EC2NodeClass/default"
            && e.detail == "PlacementGroupNotFound: spec.placementGroupSelector: placement group name \"hpc\" not found"
    });
    assert!(warned, "the class says why: {:#?}", report.timeline);
    let first_launch = entries(&report, "instance-launched")
        .map(|e| e.at_seconds)
        .next()
        .unwrap_or_default();
    assert!(
        (180.0..=250.0).contains(&first_launch),
        "nothing launches outside the group, and the group is picked up within a minute of its creation: first launch at {first_launch}s"
    );
    let nodes = nodes_of(&report, "default");
    let zones = count_by(&nodes, |n| &n.0);
    assert_eq!(
        zones.len(),
        1,
        "a cluster group's nodes share one zone: {nodes:?}"
    );
    assert!(
        nodes
            .iter()
            .all(|(_, group, partition)| group == "pg-0sim0001" && partition.is_empty())
    );
}

#[test]
fn a_cluster_group_keeps_to_its_zone_and_its_capacity_errors_stop_no_launch_outside_it() {
    let zone_b = "      nodeSelector: {karpenter.sh/nodepool: hpc, topology.kubernetes.io/zone: us-west-2b}";
    let manifests = c5_pool("hpc", "hpc", "", "")
        + &grouped_class("hpc", "hpc")
        + &c5_pool("default", "default", "", "")
        + NODE_CLASS
        + &deployment("first", 1, "1", zone_b);
    let web = format!("{APART}\n{}", on_pool("hpc"));
    let steps = format!(
        "[{}, {{at: 90s, apply: {:?}}}, {{at: 150s, apply: {:?}}}]",
        create_group("0s", "hpc", "cluster"),
        deployment("web", 3, "1", &web),
        deployment("other", 1, "1", &on_pool("default")),
    );
    let report = run(&scenario(&manifests, &steps, "6m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (5, 0), "{s:#?}");
    let group = nodes_of(&report, "hpc");
    assert_eq!(group.len(), 4, "{group:?}");
    assert!(
        group.iter().all(|(zone, _, _)| zone == "us-west-2b"),
        "the group's nodes follow its first into us-west-2b: {group:?}"
    );
    let refused: Vec<&str> = entries(&report, "insufficient-capacity")
        .map(|e| e.object.as_str())
        .collect();
    assert!(
        refused.iter().any(|o| o.ends_with("us-west-2a:pg-0sim0001")),
        "the cheaper zone was refused to the group: {refused:?}"
    );
    let outside = nodes_of(&report, "default");
    assert_eq!(
        outside.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
        ["us-west-2a"],
        "the group's capacity error is its own: a node outside the group still launches in us-west-2a"
    );
    assert!(
        outside.iter().all(|(_, group, _)| group.is_empty()),
        "{outside:?}"
    );
}

#[test]
fn a_spread_group_takes_seven_nodes_a_zone_and_the_rest_go_to_the_next() {
    let zones = "        - key: topology.kubernetes.io/zone\n          operator: In\n          values: [us-west-2a, us-west-2b]";
    let manifests = c5_pool("default", "default", zones, "")
        + &grouped_class("default", "apart")
        + &deployment("web", 9, "1", APART);
    let steps = format!("[{}]", create_group("0s", "apart", "spread"));
    let report = run(&scenario(&manifests, &steps, "5m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (9, 0), "{s:#?}");
    let nodes = nodes_of(&report, "default");
    assert_eq!(
        count_by(&nodes, |n| &n.0),
        BTreeMap::from([("us-west-2a".into(), 7), ("us-west-2b".into(), 2)]),
        "{nodes:?}"
    );
}

#[test]
fn nodes_drift_when_their_placement_group_is_made_anew_and_come_back_in_the_new_one() {
    let manifests = c5_pool("default", "default", "", "")
        + &grouped_class("default", "hpc")
        + &deployment("web", 2, "1", APART);
    let steps = format!(
        "[{}, {}]",
        create_group("0s", "hpc", "cluster"),
        create_group("3m", "hpc", "cluster")
    );
    let report = run(&scenario(&manifests, &steps, "15m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert_eq!(terminated(&report, "drifted"), 2, "{s:#?}");
    let nodes = nodes_of(&report, "default");
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(
        nodes.iter().all(|(_, group, _)| group == "pg-0sim0002"),
        "the replacements are in the new group: {nodes:?}"
    );
}

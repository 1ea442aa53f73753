//! The solver, one constraint at a time, then properties over random problems.

use std::{collections::BTreeMap, sync::Arc};

use joist_messages::{
    cached_pod::CachedPod,
    labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, ZONE},
    model::{
        quantity::Quantity,
        requirements::{Operator, Requirement, Requirements},
        resources::{Resources, names},
    },
};
use joist_scheduling::{
    ExistingNode, Input, NodePoolInput, Reason, Solution, pod::PodInfo, solve,
    workloads::karpenter_instance_types,
};
use k8s_openapi::api::core::v1::Taint;
use proptest::prelude::*;
use serde_json::{Value, json};

fn pod(name: &str, spec: Value) -> PodInfo {
    pod_with_labels(name, json!({}), spec)
}

fn pod_with_labels(name: &str, labels: Value, mut spec: Value) -> PodInfo {
    if spec.get("containers").is_none() {
        spec["containers"] =
            json!([{"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]);
    }
    let pod: CachedPod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    PodInfo::from_pod(&pod).unwrap_or_else(|e| panic!("{e}"))
}

fn sized(name: &str, cpu: &str, memory: &str, mut spec: Value) -> PodInfo {
    spec["containers"] = json!([{"name": "app", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]);
    pod(name, spec)
}

/// What is left of one NodePool limit.
fn limit(resource: &str, units: i64) -> BTreeMap<String, Quantity> {
    BTreeMap::from([(resource.to_string(), Quantity::from_units(units))])
}

fn pool(name: &str, types: usize) -> NodePoolInput {
    NodePoolInput {
        name: name.to_string(),
        weight: 0,
        requirements: Requirements::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        remaining: None,
        instance_types: (0..types).collect(),
    }
}

/// The fake catalog (cpu i+1, memory 2(i+1)Gi), one NodePool `default`, and `pods`.
fn problem(types: usize, pods: Vec<PodInfo>) -> Input {
    Input {
        instance_types: karpenter_instance_types(types),
        node_pools: vec![pool("default", types)],
        pods: pods.into_iter().map(Arc::new).collect(),
        ..Input::default()
    }
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_string(),
        value: Some("true".to_string()),
        effect: effect.to_string(),
        time_added: None,
    }
}

fn first_type<'a>(input: &'a Input, solution: &Solution, claim: usize) -> &'a str {
    &input.instance_types[solution.claims[claim].instance_types[0]].name
}

fn zone_of(solution: &Solution, claim: usize) -> Option<String> {
    let r = solution.claims[claim].requirements.get(ZONE)?;
    (r.len() == Some(1))
        .then(|| r.values().next().map(str::to_string))
        .flatten()
}

fn node(name: &str, cpu: i64, labels: &[(&str, &str)], pods: Vec<PodInfo>) -> ExistingNode {
    ExistingNode {
        name: name.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        taints: Vec::new(),
        allocatable: Resources::new()
            .with(names::CPU, Quantity::from_units(cpu))
            .with(names::MEMORY, Quantity::from_units(cpu * (4 << 30)))
            .with(names::PODS, Quantity::from_units(110)),
        pods: pods.into_iter().map(Arc::new).collect(),
        initialized: true,
        volume_limits: Default::default(),
    }
}

#[test]
fn a_pod_gets_the_cheapest_type_with_room_for_it_and_the_daemonsets() {
    let mut input = problem(8, vec![sized("web", "1500m", "1Gi", json!({}))]);
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 1);
    // fake-it-1 has 2 cpu, 1.9 allocatable after the 100m kube-reserved.
    assert_eq!(first_type(&input, &solution, 0), "fake-it-1");
    input.daemonsets = vec![sized("agent", "500m", "128Mi", json!({}))];
    let solution = solve(&input);
    assert_eq!(
        first_type(&input, &solution, 0),
        "fake-it-2",
        "1.5 + 0.5 daemonset cpu no longer fits 1.9"
    );
    let names: Vec<&str> = solution.claims[0]
        .instance_types
        .iter()
        .map(|&i| input.instance_types[i].name.as_str())
        .collect();
    assert_eq!(
        names.len(),
        6,
        "every larger type stays an option, cheapest first: {names:?}"
    );
}

#[test]
fn a_daemonset_adds_its_overhead_only_to_the_instance_types_it_would_run_on() {
    // Karpenter #2975: a daemonset pinned to larger types costs nothing on the smallest.
    let mut input = problem(8, vec![sized("web", "1500m", "1Gi", json!({}))]);
    let pinned =
        |instance_type: &str| json!({"nodeSelector": {"node.kubernetes.io/instance-type": instance_type}});
    input.daemonsets = vec![sized("agent", "500m", "128Mi", pinned("fake-it-2"))];
    let solution = solve(&input);
    assert_eq!(
        first_type(&input, &solution, 0),
        "fake-it-1",
        "the daemonset would not run on fake-it-1, so 1.5 cpu still fits its 1.9"
    );
    input.daemonsets = vec![sized("agent", "500m", "128Mi", pinned("fake-it-1"))];
    let solution = solve(&input);
    assert_eq!(
        first_type(&input, &solution, 0),
        "fake-it-2",
        "pinned to fake-it-1, it leaves 1.4 of its 1.9"
    );
}

#[test]
fn pods_share_a_node_until_it_is_cheaper_to_open_another() {
    let pods = (0..4)
        .map(|i| sized(&format!("p{i}"), "1", "1Gi", json!({})))
        .collect();
    let input = problem(2, pods);
    let solution = solve(&input);
    // Two types only (1 and 2 cpu): each node takes one pod of 1 cpu on 1.9 allocatable.
    assert_eq!(solution.claims.len(), 4);
    let input = problem(
        8,
        (0..4)
            .map(|i| sized(&format!("p{i}"), "1", "1Gi", json!({})))
            .collect(),
    );
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 1, "one 5-cpu node fits all four");
    assert_eq!(first_type(&input, &solution, 0), "fake-it-4");
}

#[test]
fn an_untolerated_taint_is_named_in_the_reason() {
    let mut input = problem(4, vec![pod("web", json!({}))]);
    input.node_pools[0].name = "gpu".to_string();
    input.node_pools[0].taints = vec![taint("nvidia.com/gpu", "NoSchedule")];
    let solution = solve(&input);
    assert!(solution.claims.is_empty());
    let failure = &solution.unschedulable[0];
    assert!(
        matches!(&failure.reasons[0], (pool, Reason::Taint { taint }) if pool == "gpu" && taint == "nvidia.com/gpu=true:NoSchedule")
    );
    let text = failure.to_string();
    assert!(
        text.contains("nodepool \"gpu\"") && text.contains("did not tolerate taint"),
        "{text}"
    );

    input.pods = vec![Arc::new(pod(
        "web",
        json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}),
    ))];
    assert_eq!(solve(&input).claims.len(), 1);
}

#[test]
fn node_selectors_narrow_the_claim_and_its_offerings() {
    let input = problem(
        4,
        vec![pod("web", json!({"nodeSelector": {ZONE: "test-zone-3"}}))],
    );
    let solution = solve(&input);
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-3"));
    let bad = problem(4, vec![pod("web", json!({"nodeSelector": {ZONE: "mars-1"}}))]);
    let solution = solve(&bad);
    assert!(
        matches!(
            &solution.unschedulable[0].reasons[0].1,
            Reason::NoInstanceType { .. } | Reason::Requirements(_)
        ),
        "{:?}",
        solution.unschedulable
    );
    let undefined = problem(4, vec![pod("web", json!({"nodeSelector": {"team": "a"}}))]);
    let solution = solve(&undefined);
    assert!(
        matches!(&solution.unschedulable[0].reasons[0].1, Reason::Requirements(_)),
        "a label the NodePool does not define cannot be required"
    );
}

#[test]
fn existing_nodes_are_used_before_new_ones_initialized_first() {
    let mut input = problem(4, vec![pod("web", json!({}))]);
    let mut starting = node("a-starting", 4, &[], Vec::new());
    starting.initialized = false;
    input.nodes = vec![starting, node("b-ready", 4, &[], Vec::new())];
    let solution = solve(&input);
    assert!(solution.claims.is_empty());
    assert_eq!(solution.placements.len(), 1);
    assert_eq!(input.nodes[solution.placements[0].node].name, "b-ready");
    // A full node is passed over.
    input.nodes = vec![node("full", 1, &[], vec![pod("old", json!({}))])];
    assert_eq!(solve(&input).claims.len(), 1);
}

#[test]
fn limits_count_the_largest_type_a_claim_may_launch() {
    let pods = (0..3).map(|i| sized(&format!("p{i}"), "3", "1Gi", json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": HOSTNAME, "labelSelector": {}}]}}}))).collect();
    let mut input = problem(8, pods);
    // The first claim may launch as anything from 4 to 8 cpu and holds 8; the second holds the 6
    // that are left; the third finds nothing small enough.
    input.node_pools[0].remaining = Some(limit(names::CPU, 14));
    let solution = solve(&input);
    let launched: i64 = solution
        .claims
        .iter()
        .map(|c| {
            let biggest = c
                .instance_types
                .iter()
                .take(60)
                .map(|&i| input.instance_types[i].capacity.get(names::CPU).millis())
                .max();
            biggest.unwrap_or(0)
        })
        .sum();
    assert_eq!(launched, 14_000);
    assert_eq!(solution.claims.len(), 2);
    assert_eq!(solution.unschedulable.len(), 1);
    assert!(
        solution.unschedulable.iter().all(
            |u| matches!(&u.reasons[0].1, Reason::Limits { resources } if resources == &["cpu".to_string()])
        ),
        "{:?}",
        solution.unschedulable
    );
    input.node_pools[0].remaining = Some(limit(names::NODES, 1));
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 1);
    assert!(solution.unschedulable.iter().all(
        |u| matches!(&u.reasons[0].1, Reason::Limits { resources } if resources == &["nodes".to_string()])
    ));
}

#[test]
fn a_claim_at_the_limit_takes_more_pods_by_giving_up_the_types_past_it() {
    // 100 types, priced by size. On-demand `a` opens a claim that may launch as the 60 cheapest
    // types that fit (2 to 61 cpu) and holds 61; spot `b` opens another that holds the other 61,
    // the rest of the limit. On-demand `c` then joins `a`: with both, the 2-cpu type no longer
    // fits, so the 60 cheapest that fit reach 62 cpu. The claim gives up the 62-cpu type rather
    // than turn `c` away.
    let on = |capacity_type: &str| json!({"nodeSelector": {CAPACITY_TYPE: capacity_type}});
    let pods = vec![
        sized("a", "1", "2Gi", on("on-demand")),
        sized("b", "1", "1Gi", on("spot")),
        sized("c", "1", "1Gi", on("on-demand")),
    ];
    let mut input = problem(100, pods);
    input.node_pools[0].remaining = Some(limit(names::CPU, 122));
    let solution = solve(&input);
    assert!(solution.unschedulable.is_empty(), "{:?}", solution.unschedulable);
    assert_eq!(solution.claims.len(), 2);
    let largest: Vec<Option<i64>> = solution
        .claims
        .iter()
        .map(|claim| {
            claim
                .instance_types
                .iter()
                .take(60)
                .map(|&i| input.instance_types[i].capacity.get(names::CPU).millis())
                .max()
        })
        .collect();
    assert_eq!(largest, [Some(61_000), Some(61_000)]);
}

#[test]
fn a_limit_used_up_exactly_leaves_nothing_to_launch() {
    for resource in [names::CPU, names::NODES] {
        let mut input = problem(4, vec![pod("web", json!({}))]);
        input.node_pools[0].remaining = Some(limit(resource, 0));
        let solution = solve(&input);
        assert!(solution.claims.is_empty(), "{resource}: {:?}", solution.claims);
        assert!(
            matches!(&solution.unschedulable[0].reasons[0].1, Reason::Limits { resources } if resources == &[resource.to_string()]),
            "{resource}: {:?}",
            solution.unschedulable
        );
    }
}

#[test]
fn heavier_node_pools_are_tried_first() {
    let mut input = problem(4, vec![pod("web", json!({}))]);
    let mut heavy = pool("heavy", 4);
    heavy.weight = 50;
    input.node_pools.push(heavy);
    let solution = solve(&input);
    assert_eq!(input.node_pools[solution.claims[0].node_pool].name, "heavy");
}

#[test]
fn hostname_anti_affinity_gives_each_pod_its_own_node() {
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let pods = (0..3)
        .map(|i| pod_with_labels(&format!("db{i}"), json!({"app": "db"}), anti.clone()))
        .collect();
    let mut input = problem(8, pods);
    input
        .pods
        .push(Arc::new(pod_with_labels("web", json!({"app": "web"}), json!({}))));
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 3, "the plain pod joins one of them");
    for claim in &solution.claims {
        let dbs = claim
            .pods
            .iter()
            .filter(|&&p| {
                input.pods[p]
                    .constraints()
                    .labels
                    .get("app")
                    .is_some_and(|a| a == "db")
            })
            .count();
        assert_eq!(dbs, 1);
    }
    // An existing pod with the same anti-affinity keeps new ones off its node (symmetry).
    let mut input = problem(
        8,
        vec![pod_with_labels("db-new", json!({"app": "db"}), json!({}))],
    );
    input.nodes = vec![node(
        "n1",
        8,
        &[(HOSTNAME, "n1")],
        vec![pod_with_labels("db-old", json!({"app": "other"}), anti)],
    )];
    let solution = solve(&input);
    assert!(solution.placements.is_empty(), "the running pod repels app=db");
    assert_eq!(solution.claims.len(), 1);
}

#[test]
fn open_claims_keep_room_for_pending_one_per_node_pods() {
    // Largest type: 4 cpu (3.9 allocatable). The two plain pods come first in the queue and
    // would fill one claim; the two one-per-node pods would then need a claim each.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let mut pods: Vec<PodInfo> = (0..2)
        .map(|i| sized(&format!("web{i}"), "1900m", "1Gi", json!({})))
        .collect();
    for i in 0..2 {
        let mut db = sized(&format!("db{i}"), "1", "1Gi", anti.clone());
        db.change_constraints(|c| {
            c.labels.insert("app".to_string(), "db".to_string());
        });
        pods.push(db);
    }
    let input = problem(4, pods);
    let solution = solve(&input);
    assert!(solution.unschedulable.is_empty());
    assert_eq!(solution.claims.len(), 2, "{:?}", solution.claims);
    for claim in &solution.claims {
        let names: Vec<&str> = claim.pods.iter().map(|&p| input.pods[p].name.as_str()).collect();
        assert_eq!(names.len(), 2, "one web and one db per node: {names:?}");
        assert!(names.iter().any(|n| n.starts_with("db")), "{names:?}");
    }
}

#[test]
fn a_pod_that_pins_its_node_joins_the_open_claim_holding_the_least() {
    // Two one-per-node pods open a claim each, db0 with 3 cpu and then db1 with 500m. A 500m pod
    // after them joins the oldest claim, db0's; with `karpenter.sh/do-not-disrupt: "true"` it
    // joins db1's, whose node stays small while the pod pins it.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let placed_beside = |do_not_disrupt: &str| {
        let mut pods: Vec<PodInfo> = [("db0", "3"), ("db1", "500m")]
            .into_iter()
            .map(|(name, cpu)| sized(name, cpu, "1Gi", anti.clone()))
            .collect();
        for db in &mut pods {
            db.change_constraints(|c| {
                c.labels.insert("app".to_string(), "db".to_string());
            });
        }
        let extra: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "extra", "namespace": "default", "uid": "extra",
                "annotations": {"karpenter.sh/do-not-disrupt": do_not_disrupt}},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        pods.push(PodInfo::from_pod(&extra).unwrap_or_else(|e| panic!("{e}")));
        let input = problem(8, pods);
        let solution = solve(&input);
        assert!(solution.unschedulable.is_empty());
        assert_eq!(solution.claims.len(), 2, "{:?}", solution.claims);
        let names = |claim: &joist_scheduling::NewClaim| -> Vec<String> {
            claim.pods.iter().map(|&p| input.pods[p].name.clone()).collect()
        };
        let with_extra = solution
            .claims
            .iter()
            .map(names)
            .find(|names| names.iter().any(|n| n == "extra"))
            .unwrap_or_else(|| panic!("extra is on no claim: {:?}", solution.claims));
        with_extra.into_iter().find(|n| n != "extra")
    };
    assert_eq!(placed_beside("false").as_deref(), Some("db0"), "the oldest claim");
    assert_eq!(
        placed_beside("true").as_deref(),
        Some("db1"),
        "the claim holding the least"
    );
}

#[test]
fn zonal_spread_keeps_max_skew() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let pods = (0..7)
        .map(|i| pod_with_labels(&format!("w{i}"), json!({"app": "web"}), spread.clone()))
        .collect();
    let input = problem(8, pods);
    let solution = solve(&input);
    assert!(solution.unschedulable.is_empty());
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for (i, claim) in solution.claims.iter().enumerate() {
        *per_zone
            .entry(zone_of(&solution, i).unwrap_or_default())
            .or_default() += claim.pods.len();
    }
    let counts: Vec<usize> = per_zone.values().copied().collect();
    assert_eq!(per_zone.len(), 3, "{per_zone:?}");
    assert!(
        counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1,
        "{per_zone:?}"
    );
}

#[test]
fn zonal_spread_counts_existing_pods() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let mut input = problem(8, vec![pod_with_labels("new", json!({"app": "web"}), spread)]);
    let running = |n: &str| pod_with_labels(n, json!({"app": "web"}), json!({}));
    input.nodes = vec![
        node("n1", 1, &[(ZONE, "test-zone-1")], vec![running("r1")]),
        node("n2", 1, &[(ZONE, "test-zone-2")], vec![running("r2")]),
    ];
    let solution = solve(&input);
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-3"));
}

#[test]
fn a_spread_replica_goes_back_to_a_node_the_skew_turned_away_before() {
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let pods = (0..4)
        .map(|i| pod_with_labels(&format!("w{i}"), json!({"app": "web"}), spread.clone()))
        .collect();
    let mut input = problem(8, pods);
    input.nodes = vec![
        node("n1", 4, &[(ZONE, "test-zone-1")], Vec::new()),
        node("n2", 4, &[(ZONE, "test-zone-2")], Vec::new()),
    ];
    let solution = solve(&input);
    // w0 to n1, w1 to n2, w2 to a new node in zone 3 (the skew turns both nodes away), and w3,
    // alike as it is, back to n1 now that every zone has one: not after w2, where the search
    // for it would start if it skipped the nodes that refused the pod before it.
    let on = |node: &str| {
        let mut pods: Vec<&str> = (solution.placements.iter())
            .filter(|p| input.nodes[p.node].name == node)
            .map(|p| input.pods[p.pod].name.as_str())
            .collect();
        pods.sort_unstable();
        pods
    };
    assert_eq!(on("n1"), ["w0", "w3"]);
    assert_eq!(on("n2"), ["w1"]);
    assert_eq!(solution.claims.len(), 1);
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-3"));
}

/// Node requirements `key In values`, one alternative.
fn only(key: &str, values: &[&str]) -> Requirements {
    [Requirement::new(key, Operator::In, values.iter().copied()).unwrap_or_else(|e| panic!("{e}"))]
        .into_iter()
        .collect()
}

#[test]
fn a_pods_volume_takes_it_to_the_volumes_zone_trying_each_alternative() {
    let in_zone_2 = pod("db", json!({})).with_volume_requirements(vec![only(ZONE, &["test-zone-2"])]);
    let solution = solve(&problem(8, vec![in_zone_2]));
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-2"));

    // A volume usable in a zone no instance type is offered in, or else in zone 3.
    let alternatives = vec![only(ZONE, &["elsewhere"]), only(ZONE, &["test-zone-3"])];
    let either = pod("db", json!({})).with_volume_requirements(alternatives);
    let solution = solve(&problem(8, vec![either]));
    assert!(solution.unschedulable.is_empty(), "{:?}", solution.unschedulable);
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-3"));
}

#[test]
fn a_volumes_zone_does_not_hide_the_other_zones_from_a_topology_spread() {
    // kube-scheduler counts every zone the pod's node affinity allows, whatever its volume's
    // zone: with one pod in zones 1 and 2 and none in 3, a second pod in zone 1 skews by 2.
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let running = |n: &str| pod_with_labels(n, json!({"app": "web"}), json!({}));
    let nodes = || {
        vec![
            node("n1", 1, &[(ZONE, "test-zone-1")], vec![running("r1")]),
            node("n2", 1, &[(ZONE, "test-zone-2")], vec![running("r2")]),
        ]
    };
    let new = |zone: &str| {
        pod_with_labels("new", json!({"app": "web"}), spread.clone())
            .with_volume_requirements(vec![only(ZONE, &[zone])])
    };
    let mut input = problem(8, vec![new("test-zone-1")]);
    input.nodes = nodes();
    let solution = solve(&input);
    assert!(solution.claims.is_empty(), "{:?}", solution.claims);
    assert_eq!(solution.unschedulable.len(), 1);

    let mut input = problem(8, vec![new("test-zone-3")]);
    input.nodes = nodes();
    assert_eq!(zone_of(&solve(&input), 0).as_deref(), Some("test-zone-3"));
}

#[test]
fn a_node_at_its_csi_attach_limit_takes_no_pod_with_a_new_volume() {
    use joist_scheduling::{pod::AttachedVolume, volumes::PodVolumes};
    let attaching = |name: &str, claim: &str| {
        pod(name, json!({})).with_volumes(PodVolumes {
            requirements: Vec::new(),
            attached: vec![AttachedVolume {
                driver: "ebs.csi.aws.com".into(),
                claim: format!("default/{claim}"),
            }],
        })
    };
    let full = || {
        let mut n = node(
            "n1",
            8,
            &[(ZONE, "test-zone-1")],
            vec![attaching("db-0", "data-0")],
        );
        n.volume_limits = [("ebs.csi.aws.com".to_owned(), 1)].into();
        n
    };
    // A second volume does not fit the one slot: a new node is launched for it.
    let mut input = problem(8, vec![attaching("db-1", "data-1")]);
    input.nodes = vec![full()];
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 1, "{solution:?}");
    // A pod sharing the attached claim takes no new slot; one without volumes is not limited.
    let mut input = problem(8, vec![attaching("reader", "data-0"), pod("web", json!({}))]);
    input.nodes = vec![full()];
    let solution = solve(&input);
    assert!(solution.claims.is_empty(), "{solution:?}");
    assert!(solution.unschedulable.is_empty(), "{solution:?}");
}

#[test]
fn pod_affinity_follows_running_pods_into_their_zone() {
    let affinity = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "cache"}}}]}}});
    let mut input = problem(8, vec![pod("web", affinity.clone())]);
    input.nodes = vec![node(
        "n1",
        1,
        &[(ZONE, "test-zone-2")],
        vec![pod_with_labels("c", json!({"app": "cache"}), json!({}))],
    )];
    let solution = solve(&input);
    assert_eq!(zone_of(&solution, 0).as_deref(), Some("test-zone-2"));
    // Nothing to follow and not selecting itself: no domain qualifies.
    let solution = solve(&problem(8, vec![pod("web", affinity)]));
    assert!(
        matches!(&solution.unschedulable[0].reasons[0].1, Reason::Topology { constraint } if constraint.contains("pod affinity"))
    );
}

#[test]
fn host_ports_conflict_per_node() {
    let ports = json!({"containers": [{"name": "app", "ports": [{"containerPort": 80, "hostPort": 8080}],
        "resources": {"requests": {"cpu": "100m"}}}]});
    let input = problem(8, vec![pod("a", ports.clone()), pod("b", ports.clone())]);
    assert_eq!(solve(&input).claims.len(), 2);
    let mut input = problem(8, vec![pod("a", ports.clone())]);
    input.daemonsets = vec![pod("proxy", ports)];
    let solution = solve(&input);
    assert!(matches!(
        &solution.unschedulable[0].reasons[0].1,
        Reason::HostPort { port: 8080 }
    ));
}

#[test]
fn preferences_are_relaxed_when_they_cannot_be_met() {
    let input = problem(
        4,
        vec![pod(
            "web",
            json!({"affinity": {"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["mars-1"]}]}},
                    {"weight": 1, "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["test-zone-2"]}]}}],
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": CAPACITY_TYPE, "operator": "In", "values": ["reserved"]}]},
                    {"matchExpressions": [{"key": CAPACITY_TYPE, "operator": "In", "values": ["spot"]}]}]}}}}),
        )],
    );
    let solution = solve(&input);
    assert!(solution.unschedulable.is_empty(), "{:?}", solution.unschedulable);
    let reqs = &solution.claims[0].requirements;
    assert_eq!(
        zone_of(&solution, 0).as_deref(),
        Some("test-zone-2"),
        "the lighter preference still holds"
    );
    assert!(
        reqs.get(CAPACITY_TYPE)
            .is_some_and(|r| r.has("spot") && !r.has("on-demand")),
        "second term: {reqs}"
    );

    let mut input = problem(4, vec![pod("web", json!({}))]);
    input.node_pools[0].taints = vec![taint("spare", "PreferNoSchedule")];
    assert_eq!(
        solve(&input).claims.len(),
        1,
        "PreferNoSchedule is tolerated as a last resort"
    );
}

#[test]
fn min_values_keep_enough_instance_types() {
    let mut input = problem(8, vec![sized("big", "6", "1Gi", json!({}))]);
    let exists = Requirement::new(INSTANCE_TYPE, Operator::Exists, Vec::<String>::new())
        .unwrap_or_else(|e| panic!("{e}"))
        .with_min_values(Some(3));
    input.node_pools[0].requirements.add(exists);
    let solution = solve(&input);
    // Only fake-it-6 and fake-it-7 have 6 cpu allocatable.
    assert!(
        matches!(&solution.unschedulable[0].reasons[0].1, Reason::MinValues { key, needed: 3, found: 2 } if key == INSTANCE_TYPE),
        "{:?}",
        solution.unschedulable
    );
    input.pods = vec![Arc::new(sized("small", "4", "1Gi", json!({})))];
    assert_eq!(
        solve(&input).claims[0].instance_types.len(),
        4,
        "fake-it-4 to fake-it-7"
    );
}

/// A random problem: pods of a few kinds on the fake catalog, some existing nodes, a cpu limit.
fn random_problem() -> impl Strategy<Value = Input> {
    let pod_kind = (0usize..5, 1usize..40, 0usize..6, 0usize..3);
    (proptest::collection::vec(pod_kind, 1..40), 0usize..3, prop::option::of(8i64..60)).prop_map(
        |(pods, nodes, limit)| {
            let pods = pods
                .into_iter()
                .enumerate()
                .map(|(i, (kind, cpu_tenths, memory, app))| {
                    let app = ["a", "b", "c"][app];
                    let spec = match kind {
                        1 => json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"spread": app}}}]}),
                        2 => json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"anti": app}}}]}}}),
                        3 => json!({"nodeSelector": {CAPACITY_TYPE: "spot"}}),
                        _ => json!({}),
                    };
                    let labels = match kind {
                        1 => json!({"spread": app}),
                        2 => json!({"anti": app}),
                        _ => json!({}),
                    };
                    let mut spec = spec;
                    spec["containers"] = json!([{"name": "app", "resources": {"requests": {
                        "cpu": format!("{}m", cpu_tenths * 100), "memory": format!("{}Mi", 128 << memory)}}}]);
                    pod_with_labels(&format!("p{i:02}"), labels, spec)
                })
                .collect();
            let mut input = problem(16, pods);
            input.nodes = (0..nodes)
                .map(|n| node(&format!("n{n}"), 2, &[(ZONE, "test-zone-1"), (HOSTNAME, &format!("n{n}"))], Vec::new()))
                .collect();
            input.node_pools[0].remaining = limit.map(|cpu| self::limit(names::CPU, cpu));
            input
        },
    )
}

fn labelled(input: &Input, pod: usize, key: &str) -> Option<String> {
    input.pods[pod].constraints().labels.get(key).cloned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_placement_breaks_a_hard_constraint(input in random_problem()) {
        let solution = solve(&input);
        let mut seen = vec![0u8; input.pods.len()];
        for p in solution.placements.iter().map(|p| p.pod)
            .chain(solution.claims.iter().flat_map(|c| c.pods.iter().copied()))
            .chain(solution.unschedulable.iter().map(|u| u.pod)) {
            seen[p] += 1;
        }
        prop_assert!(seen.iter().all(|&n| n == 1), "every pod is answered once: {:?}", seen);

        let mut reserved_cpu = 0;
        let mut zone_counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        for claim in &solution.claims {
            let zone = claim.requirements.get(ZONE).filter(|r| r.len() == Some(1)).and_then(|r| r.values().next().map(str::to_string));
            for &t in &claim.instance_types {
                let it = &input.instance_types[t];
                prop_assert!(claim.requests.fits(&it.allocatable()), "{} does not fit {}", claim.requests, it.name);
                prop_assert!(it.offerings.iter().any(|o| o.available && claim.requirements.get(ZONE).is_none_or(|r| r.has(&o.zone))));
            }
            reserved_cpu += claim.instance_types.iter().take(60).map(|&t| input.instance_types[t].capacity.get(names::CPU).millis()).max().unwrap_or(0);
            let mut anti = BTreeMap::new();
            for &p in &claim.pods {
                if let Some(app) = labelled(&input, p, "anti") {
                    *anti.entry(app).or_insert(0) += 1;
                }
                if let (Some(app), Some(zone)) = (labelled(&input, p, "spread"), &zone) {
                    *zone_counts.entry((app, zone.clone())).or_insert(0) += 1;
                }
                if input.pods[p].constraints().node_requirements[0].get(CAPACITY_TYPE).is_some() {
                    prop_assert!(claim.requirements.get(CAPACITY_TYPE).is_some_and(|r| !r.has("on-demand")));
                }
            }
            prop_assert!(anti.values().all(|&n| n == 1), "hostname anti-affinity broken: {:?}", anti);
        }
        if let Some(limit) = &input.node_pools[0].remaining {
            let cpu = limit.get(names::CPU).map_or(i64::MAX, |q| q.millis());
            prop_assert!(reserved_cpu <= cpu, "{} > limit", reserved_cpu);
        }
        for (n, node) in input.nodes.iter().enumerate() {
            let mut used = Resources::new();
            let mut anti = BTreeMap::new();
            for placement in solution.placements.iter().filter(|p| p.node == n) {
                used.add(&input.pods[placement.pod].requests);
                if let Some(app) = labelled(&input, placement.pod, "anti") {
                    *anti.entry(app).or_insert(0) += 1;
                }
                if let Some(app) = labelled(&input, placement.pod, "spread") {
                    *zone_counts.entry((app, "test-zone-1".to_string())).or_insert(0) += 1;
                }
            }
            prop_assert!(used.fits(&node.allocatable), "node {} overcommitted", node.name);
            prop_assert!(anti.values().all(|&n| n == 1));
        }
        for app in ["a", "b", "c"] {
            let counts: Vec<i64> = ["test-zone-1", "test-zone-2", "test-zone-3"].iter()
                .map(|z| zone_counts.get(&(app.to_string(), z.to_string())).copied().unwrap_or(0)).collect();
            let placed: i64 = counts.iter().sum();
            let spread_pods = (0..input.pods.len()).filter(|&p| labelled(&input, p, "spread").as_deref() == Some(app)).count() as i64;
            if placed == spread_pods {
                prop_assert!(counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1, "maxSkew broken for {}: {:?}", app, counts);
            }
        }
    }

    #[test]
    fn the_same_input_gives_the_same_answer(input in random_problem()) {
        prop_assert_eq!(solve(&input), solve(&input));
    }
}

#[test]
fn the_fragmented_benchmark_cluster_has_the_nodes_asked_for_and_nothing_left_to_place() {
    let cluster = joist_scheduling::workloads::fragmented_cluster(40, 0.6);
    assert_eq!(cluster.nodes.len(), 40);
    assert!(cluster.pods.is_empty());
    assert!(
        cluster.nodes.iter().any(|n| n.pods.is_empty()) && cluster.nodes.iter().any(|n| !n.pods.is_empty()),
        "some nodes keep pods and some lost them all"
    );
    let again = joist_scheduling::workloads::fragmented_cluster(40, 0.6);
    let names = |input: &Input| -> Vec<Vec<String>> {
        input
            .nodes
            .iter()
            .map(|n| n.pods.iter().map(|p| p.name.clone()).collect())
            .collect()
    };
    assert_eq!(
        names(&cluster),
        names(&again),
        "seeded: the same cluster every time"
    );
}

#[test]
fn with_many_pools_and_a_crowded_cluster_every_pending_pod_is_placed_or_given_a_reason() {
    let input = joist_scheduling::workloads::crowded_node_pools(20, 300);
    let solution = solve(&input);
    let on_claims: usize = solution.claims.iter().map(|c| c.pods.len()).sum();
    let accounted = solution.placements.len() + on_claims + solution.unschedulable.len();
    assert_eq!(accounted, input.pods.len());
    assert!(
        !solution.placements.is_empty(),
        "room on the running nodes is used"
    );
    assert!(
        solution
            .claims
            .iter()
            .any(|c| c.node_pool != input.node_pools.len() - 1),
        "team pods go to their teams' pools"
    );
}

/// `problem`'s catalog with a reservation `cr-a` of `fake-it-4` in `test-zone-2` that has room
/// for `room` instances, and `pods` one-per-node pods.
fn reserved_problem(room: u32, pods: usize, mode: joist_scheduling::ReservedOfferingMode) -> Input {
    use joist_messages::{
        apis::ec2nodeclass::ReservationType,
        model::instance_type::{CapacityType, OfferedReservation, Offering, Reservation},
    };
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}}]}}});
    let pods = (0..pods)
        .map(|i| pod_with_labels(&format!("db{i}"), json!({"app": "db"}), anti.clone()))
        .collect();
    let mut input = problem(8, pods);
    let it = Arc::make_mut(&mut input.instance_types[4]);
    it.add_offerings(vec![Offering {
        zone: "test-zone-2".into(),
        capacity_type: CapacityType::Reserved,
        price: it.offerings[0].price / 1e7,
        available: true,
        reservation: Some(OfferedReservation {
            reservation: Reservation {
                id: "cr-a".into(),
                kind: ReservationType::Default,
                interruptible: false,
            },
            capacity: room,
        }),
    }]);
    input.options.reserved_offerings = mode;
    input
}

fn holds_reservation(claim: &joist_scheduling::NewClaim) -> bool {
    claim
        .requirements
        .get(joist_messages::labels::aws::CAPACITY_RESERVATION_ID)
        .is_some_and(|r| r.values().eq(["cr-a"]))
        && claim
            .requirements
            .get(CAPACITY_TYPE)
            .is_some_and(|r| r.values().eq(["reserved"]))
}

#[test]
fn reserved_capacity_is_used_first_and_counted_down_then_strict_waits_and_fallback_buys() {
    use joist_scheduling::ReservedOfferingMode::{Fallback, Strict};
    let input = reserved_problem(2, 3, Strict);
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 2, "{solution:?}");
    for (i, claim) in solution.claims.iter().enumerate() {
        assert!(holds_reservation(claim), "claim {i}: {:?}", claim.requirements);
        assert_eq!(first_type(&input, &solution, i), "fake-it-4");
    }
    assert_eq!(
        solution.unschedulable.len(),
        1,
        "the third waits for the next batch"
    );
    assert!(
        solution.unschedulable[0]
            .reasons
            .iter()
            .all(|(_, reason)| *reason == Reason::ReservedCapacity)
    );

    let input = reserved_problem(2, 3, Fallback);
    let solution = solve(&input);
    assert_eq!(solution.claims.len(), 3);
    assert_eq!(solution.claims.iter().filter(|c| holds_reservation(c)).count(), 2);
    assert!(solution.unschedulable.is_empty());

    let input = reserved_problem(0, 1, Strict);
    let solution = solve(&input);
    assert_eq!(
        solution.claims.len(),
        1,
        "an empty reservation is no reason to wait"
    );
    assert!(!holds_reservation(&solution.claims[0]));
}

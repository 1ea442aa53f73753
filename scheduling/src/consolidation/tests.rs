use std::{collections::BTreeMap, sync::Arc};

use joist_messages::cached_pod::CachedPod;
use joist_messages::model::{
    quantity::Quantity,
    requirements::Requirements,
    resources::{Resources, names},
};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::{input::NodePoolInput, workloads::karpenter_instance_types};

fn pod(name: &str, cpu: &str, spec: Value) -> PodInfo {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]);
    let pod: CachedPod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"}},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    PodInfo::from_pod(&pod).unwrap_or_else(|e| panic!("{e}"))
}

fn node(name: &str, cpu: i64, pods: Vec<PodInfo>) -> ExistingNode {
    ExistingNode {
        name: name.to_owned(),
        labels: BTreeMap::from([
            (joist_messages::labels::HOSTNAME.to_owned(), name.to_owned()),
            (joist_messages::labels::ZONE.to_owned(), "test-zone-1".to_owned()),
        ]),
        taints: Vec::new(),
        allocatable: Resources::new()
            .with(names::CPU, Quantity::from_units(cpu))
            .with(names::MEMORY, Quantity::from_units(cpu * (2 << 30)))
            .with(names::PODS, Quantity::from_units(110)),
        pods: pods.into_iter().map(Arc::new).collect(),
        initialized: true,
        volume_limits: Default::default(),
    }
}

/// The fake catalog's on-demand price of a type with `cpu` CPUs.
fn price(cpu: i64) -> f64 {
    0.1 * cpu as f64 + 0.1 * (2 * cpu * (1 << 30)) as f64 / 1e9
}

fn on_demand_pool(types: usize) -> NodePoolInput {
    NodePoolInput {
        name: "default".to_owned(),
        weight: 0,
        requirements: [
            Requirement::new(CAPACITY_TYPE, Operator::In, ["on-demand"]).unwrap_or_else(|e| panic!("{e}"))
        ]
        .into_iter()
        .collect::<Requirements>(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        remaining: None,
        instance_types: (0..types).collect(),
    }
}

fn cluster(nodes: Vec<ExistingNode>) -> Input {
    Input {
        instance_types: karpenter_instance_types(16),
        node_pools: vec![on_demand_pool(16)],
        nodes,
        ..Input::default()
    }
}

fn candidate(input: &Input, position: usize, cpu: i64, capacity_type: CapacityType) -> Candidate {
    Candidate {
        node: position,
        price: price(cpu),
        capacity_type,
        pods: input.nodes[position].pods.clone(),
        held: None,
    }
}

/// Asks a search set up for exactly `candidates` about all of them together.
fn consolidate(input: &Input, candidates: &[&Candidate], settings: Settings) -> Result<Decision, Refusal> {
    let owned: Vec<Candidate> = candidates.iter().map(|&c| c.clone()).collect();
    let all: Vec<usize> = (0..owned.len()).collect();
    Search::new(input, &owned, settings).consolidate(&all)
}

#[test]
fn a_node_whose_pods_fit_elsewhere_is_deleted() {
    let input = cluster(vec![
        node("a", 8, vec![pod("a1", "1", json!({})), pod("a2", "1", json!({}))]),
        node("b", 8, vec![pod("b1", "1", json!({}))]),
    ]);
    let a = candidate(&input, 0, 8, CapacityType::OnDemand);
    let decision = consolidate(&input, &[&a], Settings::default());
    assert_eq!(decision, Ok(Decision::Delete));
}

#[test]
fn a_pod_tied_to_its_volumes_zone_is_moved_only_within_it() {
    let in_zone = |zone: &str| {
        let requirement = Requirement::new(joist_messages::labels::ZONE, Operator::In, [zone])
            .unwrap_or_else(|e| panic!("{e}"));
        pod("db", "1", json!({})).with_volume_requirements(vec![[requirement].into_iter().collect()])
    };
    let mut elsewhere = node("b", 8, vec![pod("b1", "1", json!({}))]);
    elsewhere
        .labels
        .insert(joist_messages::labels::ZONE.to_owned(), "test-zone-2".to_owned());
    // Room on b, but b is in the other zone: a cheaper node in test-zone-1 replaces a.
    let input = cluster(vec![
        node("a", 8, vec![in_zone("test-zone-1")]),
        elsewhere.clone(),
    ]);
    let a = candidate(&input, 0, 8, CapacityType::OnDemand);
    let Ok(Decision::Replace(replacement)) = consolidate(&input, &[&a], Settings::default()) else {
        panic!("expected a replacement in the volume's zone")
    };
    let zone = replacement.claim.requirements.get(joist_messages::labels::ZONE);
    assert!(
        zone.is_some_and(|z| z.len() == Some(1) && z.has("test-zone-1")),
        "{zone:?}"
    );
    // A volume in b's zone: its pod moves there and a goes.
    let input = cluster(vec![node("a", 8, vec![in_zone("test-zone-2")]), elsewhere]);
    let a = candidate(&input, 0, 8, CapacityType::OnDemand);
    assert_eq!(
        consolidate(&input, &[&a], Settings::default()),
        Ok(Decision::Delete)
    );
}

#[test]
fn an_oversized_node_is_replaced_by_a_cheaper_one_that_fits() {
    let input = cluster(vec![node(
        "big",
        16,
        vec![pod("p1", "1", json!({})), pod("p2", "1", json!({}))],
    )]);
    let big = candidate(&input, 0, 16, CapacityType::OnDemand);
    let Ok(Decision::Replace(replacement)) = consolidate(&input, &[&big], Settings::default()) else {
        panic!("expected a replacement")
    };
    assert!(
        replacement.price < price(16),
        "{} is not cheaper",
        replacement.price
    );
    assert!(
        replacement
            .claim
            .instance_types
            .iter()
            .all(|&i| input.instance_types[i]
                .offerings
                .iter()
                .any(|o| o.price < price(16))),
        "only types cheaper than the node are kept"
    );
    let pinned = replacement
        .claim
        .requirements
        .get(CAPACITY_TYPE)
        .map(|r| r.values().collect::<Vec<_>>());
    assert_eq!(pinned, Some(vec!["on-demand"]));
}

#[test]
fn a_replacement_whose_cheaper_types_miss_min_values_is_refused_under_the_strict_policy() {
    // Two 1-CPU pods fit the types of 3 to 16 CPUs (14 types); 13 of them are cheaper than the
    // 16-CPU node.
    let with_min_values = |needed: u32, policy: MinValuesPolicy| {
        let mut input = cluster(vec![node(
            "big",
            16,
            vec![pod("p1", "1", json!({})), pod("p2", "1", json!({}))],
        )]);
        let types = Requirement::new(joist_messages::labels::INSTANCE_TYPE, Operator::Exists, [""; 0])
            .unwrap_or_else(|e| panic!("{e}"))
            .with_min_values(Some(needed));
        input.node_pools[0].requirements.add(types);
        input.options.min_values = policy;
        let big = candidate(&input, 0, 16, CapacityType::OnDemand);
        consolidate(&input, &[&big], Settings::default())
    };
    assert_eq!(
        with_min_values(14, MinValuesPolicy::Strict),
        Err(Refusal::MinValues {
            key: joist_messages::labels::INSTANCE_TYPE.to_owned(),
            needed: 14,
            found: 13
        })
    );
    assert!(matches!(
        with_min_values(13, MinValuesPolicy::Strict),
        Ok(Decision::Replace(r)) if r.claim.instance_types.len() == 13
    ));
    assert!(
        matches!(
            with_min_values(14, MinValuesPolicy::BestEffort),
            Ok(Decision::Replace(_))
        ),
        "best effort launches with fewer values"
    );
}

#[test]
fn a_node_pool_at_its_limits_replaces_a_node_with_what_that_node_holds() {
    let mut input = cluster(vec![
        node("held", 16, vec![pod("a", "9", json!({}))]),
        node("unheld", 16, vec![pod("b", "9", json!({}))]),
    ]);
    // The pool is at its CPU limit: no new node fits unless what leaves gives its CPUs back.
    input.node_pools[0].remaining = Some(BTreeMap::from([(names::CPU.to_owned(), Quantity::from_units(0))]));
    let mut held = candidate(&input, 0, 16, CapacityType::OnDemand);
    held.held = Some(Held {
        pool: "default".to_owned(),
        capacity: Resources::new().with(names::CPU, Quantity::from_units(16)),
    });
    let unheld = candidate(&input, 1, 16, CapacityType::OnDemand);
    let candidates = [held, unheld];
    let mut search = Search::new(&input, &candidates, Settings::default());
    let refused =
        |decision: Result<Decision, Refusal>| matches!(decision, Err(Refusal::PodDoesNotFit { .. }));
    assert!(
        refused(search.consolidate(&[1])),
        "nothing given back, nothing launched"
    );
    assert!(
        matches!(search.consolidate(&[0]), Ok(Decision::Replace(_))),
        "16 CPUs given back make room for a smaller node"
    );
    assert!(
        refused(search.consolidate(&[1])),
        "what one question gave back is taken again after it"
    );
}

#[test]
fn the_smallest_node_that_fits_is_not_replaced_by_itself() {
    let input = cluster(vec![node("small", 2, vec![pod("p1", "1500m", json!({}))])]);
    let small = candidate(&input, 0, 2, CapacityType::OnDemand);
    let refusal = consolidate(&input, &[&small], Settings::default());
    assert!(matches!(refusal, Err(Refusal::NotCheaper { .. })), "{refusal:?}");
}

#[test]
fn three_nodes_merge_where_the_first_two_alone_save_nothing() {
    // One 1500m pod on each 2-CPU node: two of them need a 4-CPU node, as dear as both; three fit
    // a 5-CPU one, cheaper than three.
    let input = cluster(
        (0..3)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    2,
                    vec![pod(&format!("p{i}"), "1500m", json!({}))],
                )
            })
            .collect(),
    );
    let candidates: Vec<Candidate> = (0..3)
        .map(|i| candidate(&input, i, 2, CapacityType::OnDemand))
        .collect();
    let mut search = Search::new(&input, &candidates, Settings::default());
    assert!(search.consolidate(&[0, 1]).is_err(), "two save nothing");
    let found = search.largest_prefix(&[0, 1, 2]);
    assert!(
        matches!(found, Some((3, Decision::Replace(_)))),
        "three go onto one cheaper node: {found:?}"
    );
}

#[test]
fn consolidation_never_turns_nodes_into_more_nodes() {
    let apart = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    let input = cluster(vec![
        node("a", 4, vec![pod("a1", "1", apart.clone())]),
        node("b", 4, vec![pod("b1", "1", apart.clone())]),
    ]);
    let (a, b) = (
        candidate(&input, 0, 4, CapacityType::OnDemand),
        candidate(&input, 1, 4, CapacityType::OnDemand),
    );
    let refusal = consolidate(&input, &[&a, &b], Settings::default());
    assert_eq!(refusal, Err(Refusal::MoreThanOneNode { nodes: 2 }));
}

#[test]
fn a_drifted_node_is_relocated_onto_as_many_new_nodes_as_its_pods_need_whatever_they_cost() {
    let apart = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    let input = cluster(vec![
        node("small", 2, vec![pod("s1", "1500m", json!({}))]),
        node(
            "pair",
            4,
            vec![pod("w1", "1", apart.clone()), pod("w2", "1", apart.clone())],
        ),
    ]);
    let candidates = [
        candidate(&input, 0, 2, CapacityType::OnDemand),
        candidate(&input, 1, 4, CapacityType::OnDemand),
    ];
    let mut search = Search::new(&input, &candidates, Settings::default());
    let Ok(Decision::Relaunch(claims)) = search.relocate(&[0]) else {
        panic!("the smallest node is replaced even though nothing is cheaper")
    };
    assert_eq!(claims.len(), 1);
    let Ok(Decision::Relaunch(claims)) = search.relocate(&[1]) else {
        panic!("two pods kept apart need new nodes")
    };
    assert_eq!(claims.len(), 2, "pods kept apart get a new node each");
    assert!(
        search.consolidate(&[0]).is_err(),
        "consolidation still refuses what is not cheaper"
    );
}

#[test]
fn a_closed_node_takes_no_pod_but_keeps_its_own() {
    let input = cluster(vec![
        node("a", 8, vec![pod("a1", "1", json!({}))]),
        node("settling", 8, vec![pod("b1", "1", json!({}))]),
    ]);
    let candidates = [candidate(&input, 0, 8, CapacityType::OnDemand)];
    let mut search = Search::new(&input, &candidates, Settings::default());
    assert_eq!(search.consolidate(&[0]), Ok(Decision::Delete));
    search.close(&[1]);
    assert!(
        matches!(search.consolidate(&[0]), Ok(Decision::Replace(_))),
        "with the other node closed, the pod needs a new (smaller) node"
    );
    assert!(matches!(search.relocate(&[0]), Ok(Decision::Relaunch(_))));
}

/// Each placement starts with the nodes that refuse a class alone rejected; a node refused only
/// for what runs elsewhere in its zone must stay open to the next candidate.
#[test]
fn one_search_judges_each_candidate_by_its_own_absence() {
    let apart = |key: &str| {
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": key, "labelSelector": {"matchLabels": {"app": "web"}}}
        ]}}})
    };
    let in_zone = |mut node: ExistingNode, zone: &str| {
        node.labels
            .insert(joist_messages::labels::ZONE.to_owned(), zone.to_owned());
        node
    };
    let zonal = apart(joist_messages::labels::ZONE);
    let input = cluster(vec![
        in_zone(node("a", 8, vec![pod("a1", "1", zonal.clone())]), "zone-1"),
        in_zone(node("b", 8, vec![pod("b1", "1", zonal)]), "zone-2"),
        in_zone(node("c", 8, Vec::new()), "zone-1"),
    ]);
    let candidates = [
        candidate(&input, 0, 8, CapacityType::OnDemand),
        candidate(&input, 1, 8, CapacityType::OnDemand),
    ];
    let mut search = Search::new(&input, &candidates, Settings::default());
    assert!(
        !matches!(search.consolidate(&[1]), Ok(Decision::Delete)),
        "b1 has no node in a zone without a1"
    );
    assert_eq!(
        search.consolidate(&[0]),
        Ok(Decision::Delete),
        "without a, zone-1 holds no web pod: a1 goes to c"
    );

    let hostname = apart(joist_messages::labels::HOSTNAME);
    let input = cluster(vec![
        node("a", 8, vec![pod("a1", "1", hostname.clone())]),
        node("b", 8, vec![pod("b1", "1", hostname)]),
        node("c", 8, Vec::new()),
    ]);
    let candidates = [
        candidate(&input, 0, 8, CapacityType::OnDemand),
        candidate(&input, 1, 8, CapacityType::OnDemand),
    ];
    let mut search = Search::new(&input, &candidates, Settings::default());
    assert_eq!(search.consolidate(&[0]), Ok(Decision::Delete), "a1 goes to c");
    assert_eq!(
        search.consolidate(&[1]),
        Ok(Decision::Delete),
        "the last placement was undone: b1 goes to c too"
    );
}

#[test]
fn a_pod_that_fits_nowhere_keeps_its_node() {
    let input = cluster(vec![node("a", 64, vec![pod("huge", "40", json!({}))])]);
    let a = candidate(&input, 0, 64, CapacityType::OnDemand);
    let refusal = consolidate(&input, &[&a], Settings::default());
    assert!(
        matches!(&refusal, Err(Refusal::PodDoesNotFit { pod, .. }) if pod == "huge"),
        "{refusal:?}"
    );
}

#[test]
fn spot_is_replaced_by_spot_only_behind_the_gate_and_with_fifteen_cheaper_types() {
    let spot_pool = NodePoolInput {
        requirements: [
            Requirement::new(CAPACITY_TYPE, Operator::In, ["spot"]).unwrap_or_else(|e| panic!("{e}"))
        ]
        .into_iter()
        .collect(),
        ..on_demand_pool(32)
    };
    let input = Input {
        instance_types: karpenter_instance_types(32),
        node_pools: vec![spot_pool],
        nodes: vec![node("spot", 32, vec![pod("p", "1", json!({}))])],
        ..Input::default()
    };
    let spot = candidate(&input, 0, 32, CapacityType::Spot);
    let off = consolidate(&input, &[&spot], Settings::default());
    assert!(
        matches!(off, Err(Refusal::SpotToSpot { enabled: false, .. })),
        "{off:?}"
    );
    let on = consolidate(&input, &[&spot], Settings { spot_to_spot: true });
    let Ok(Decision::Replace(replacement)) = on else {
        panic!("expected a replacement: {on:?}")
    };
    assert_eq!(replacement.claim.instance_types.len(), SPOT_TO_SPOT_MIN_TYPES);

    // A minValues of twenty instance types keeps twenty.
    let mut wanting = input.clone();
    let types = Requirement::new(joist_messages::labels::INSTANCE_TYPE, Operator::Exists, [""; 0])
        .unwrap_or_else(|e| panic!("{e}"))
        .with_min_values(Some(20));
    wanting.node_pools[0].requirements.add(types);
    let on = consolidate(&wanting, &[&spot], Settings { spot_to_spot: true });
    let Ok(Decision::Replace(replacement)) = on else {
        panic!("expected a replacement: {on:?}")
    };
    assert_eq!(replacement.claim.instance_types.len(), 20);
}

fn random_cluster() -> impl Strategy<Value = (Vec<(i64, Vec<i64>)>, usize)> {
    // Nodes of 2..16 CPUs, each with pods of 100m..2 CPUs that fit it; one candidate.
    proptest::collection::vec(
        (2i64..=16).prop_flat_map(|cpu| (Just(cpu), proptest::collection::vec(1i64..=20, 0..6))),
        1..8,
    )
    .prop_flat_map(|nodes| {
        let count = nodes.len();
        (Just(nodes), 0..count)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_decision_never_raises_cost_nor_strands_a_pod((layout, chosen) in random_cluster()) {
        let nodes: Vec<ExistingNode> = layout
            .iter()
            .enumerate()
            .map(|(n, (cpu, pods))| {
                let mut left = cpu * 1000 - 200;
                let pods = pods
                    .iter()
                    .enumerate()
                    .filter_map(|(i, tenths)| {
                        let millis = tenths * 100;
                        (millis <= left).then(|| {
                            left -= millis;
                            pod(&format!("n{n}-p{i}"), &format!("{millis}m"), json!({}))
                        })
                    })
                    .collect();
                node(&format!("n{n}"), *cpu, pods)
            })
            .collect();
        let input = cluster(nodes);
        let c = candidate(&input, chosen, layout[chosen].0, CapacityType::OnDemand);
        let before = input.nodes.clone();
        let decision = consolidate(&input, &[&c], Settings::default());
        let cpu = |r: &Resources| r.get(names::CPU).millis();
        match decision {
            Ok(Decision::Delete) => {
                // Independently: the moved pods' CPU fits in what the other nodes have free, and
                // each pod fits some other node on its own.
                let free: Vec<i64> = before
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != chosen)
                    .map(|(_, n)| cpu(&n.allocatable) - n.pods.iter().map(|p| cpu(&p.requests)).sum::<i64>())
                    .collect();
                let moved: i64 = c.pods.iter().map(|p| cpu(&p.requests)).sum();
                prop_assert!(moved <= free.iter().sum::<i64>());
                for p in &c.pods {
                    prop_assert!(free.iter().any(|f| *f >= cpu(&p.requests)), "{} has no place", p.name);
                }
            }
            Ok(Decision::Replace(replacement)) => {
                prop_assert!(replacement.price < c.price, "{} ≥ {}", replacement.price, c.price);
                // The replacement holds what it was given (the rest may move to other nodes).
                let largest = replacement.claim.instance_types.iter().map(|&i| cpu(&input.instance_types[i].allocatable())).max();
                prop_assert!(largest.unwrap_or(0) >= cpu(&replacement.claim.requests));
            }
            Ok(Decision::Relaunch(_)) => prop_assert!(false, "consolidation never relaunches"),
            Err(_) => {}
        }
    }
}

#[test]
fn applying_a_decision_moves_the_pods_and_adds_the_replacement() {
    let mut input = cluster(vec![
        node("a", 8, vec![pod("a1", "1", json!({}))]),
        node("b", 8, vec![pod("b1", "1", json!({}))]),
    ]);
    let a = candidate(&input, 0, 8, CapacityType::OnDemand);
    assert_eq!(
        apply(&mut input, &[a], &[0], Settings::default(), "unused"),
        Ok(Decision::Delete)
    );
    let names: Vec<(&str, usize)> = input
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.pods.len()))
        .collect();
    assert_eq!(names, [("b", 2)], "a is gone, its pod on b");
    let b = candidate(&input, 0, 8, CapacityType::OnDemand);
    let Ok(Decision::Replace(_)) = apply(&mut input, &[b], &[0], Settings::default(), "small") else {
        panic!("two 1-CPU pods on an 8-CPU node are replaced by a smaller one")
    };
    assert_eq!(input.nodes.len(), 1);
    assert_eq!(
        (input.nodes[0].name.as_str(), input.nodes[0].pods.len()),
        ("small", 2)
    );
}

/// A pod of `tenths` × 100m CPU; some kinds spread or repel by hostname or zone, so answers depend
/// on topology counts the search must take away and put back.
fn shaped_pod(name: &str, tenths: i64, kind: usize) -> PodInfo {
    let term = |key: &str| json!({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": key});
    let spec = match kind {
        1 => json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term("kubernetes.io/hostname")]}}}),
        2 => {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]})
        }
        3 => json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term("topology.kubernetes.io/zone")]}}}),
        _ => json!({}),
    };
    pod(name, &format!("{}m", tenths * 100), spec)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn one_search_answers_every_question_as_a_fresh_one_would(
        layout in proptest::collection::vec(
            (2i64..=16, 0usize..3, proptest::collection::vec((1i64..=20, 0usize..5), 0..5)),
            2..9,
        ),
    ) {
        let zones = ["test-zone-1", "test-zone-2", "test-zone-3"];
        let nodes: Vec<ExistingNode> = layout
            .iter()
            .enumerate()
            .map(|(n, (cpu, zone, pods))| {
                let mut left = cpu * 1000 - 200;
                let pods = pods
                    .iter()
                    .enumerate()
                    .filter(|(_, (tenths, _))| {
                        let fits = tenths * 100 <= left;
                        if fits {
                            left -= tenths * 100;
                        }
                        fits
                    })
                    .map(|(i, (tenths, kind))| shaped_pod(&format!("n{n}-p{i}"), *tenths, *kind))
                    .collect();
                let mut node = node(&format!("n{n}"), *cpu, pods);
                node.labels.insert(joist_messages::labels::ZONE.to_owned(), zones[*zone].to_owned());
                node
            })
            .collect();
        let input = cluster(nodes);
        let candidates: Vec<Candidate> = layout
            .iter()
            .enumerate()
            .map(|(n, (cpu, _, _))| candidate(&input, n, *cpu, CapacityType::OnDemand))
            .collect();
        let questions: Vec<Vec<usize>> = (0..candidates.len())
            .map(|c| vec![c])
            .chain([vec![0, 1], (0..candidates.len()).rev().collect()])
            .collect();
        let mut shared = Search::new(&input, &candidates, Settings::default());
        for which in &questions {
            // Independently: the cluster without the nodes, their pods pending, solved from scratch.
            let kept: Vec<usize> = (0..input.nodes.len()).filter(|n| !which.contains(n)).collect();
            let reduced = Input {
                nodes: kept.iter().map(|&n| input.nodes[n].clone()).collect(),
                pods: which.iter().flat_map(|&c| candidates[c].pods.iter().cloned()).collect(),
                ..input.clone()
            };
            let mut expected = crate::solve(&reduced);
            for placement in &mut expected.placements {
                placement.node = kept[placement.node];
            }
            let solved = shared.simulate(which).map(|(_, solution)| solution);
            if let Ok(mut solution) = solved {
                solution.placements.sort_by_key(|p| p.pod);
                expected.placements.sort_by_key(|p| p.pod);
                prop_assert_eq!(solution, expected, "asked about {:?}", which);
            } else {
                prop_assert!(
                    !expected.unschedulable.is_empty() || expected.claims.len() != 1 || expected.claims[0].price >= which.iter().map(|&c| candidates[c].price).sum::<f64>(),
                    "refused {:?}, yet a solve from scratch finds a cheaper single replacement",
                    which
                );
            }
        }
    }
}

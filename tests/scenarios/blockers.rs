//! Why nodes stay, as the disruption pass counts them: `karpenter_voluntary_disruption_candidates_remaining`
//! by NodePool and blocker, for a pool whose budget allows nothing, one that never consolidates,
//! and one whose nodes changed within its `consolidateAfter`; and
//! the `ConsolidationRejected` events of a decision abandoned at its validation, for a budget or for
//! a change; an emptiness decision that goes on without the nodes that took a pod meanwhile; and a
//! multi-node decision that goes on with the nodes whose pods still fit.

use std::collections::BTreeMap;

use joist::simulate;
use joist_actors::{disruption::blockers::Blocker, effects::node_trace::NodeTracer};
use joist_messages::labels::taints;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::{Api, ResourceExt, api::ListParams};

use super::{
    APART, NODE_CLASS, deployment, entries, family, four_apart_scaled_to_two, pool, run, sample, scenario,
};

/// A pool whose budget allows nothing in the third minute: its decisions come at 3m.
const AFTER_THREE_MINUTES: &str = "    consolidateAfter: 30s\n    budgets: [{nodes: '100%'}, {nodes: '0', schedule: '2 * * * *', duration: 1m}]";

/// Each blocker's count for the NodePool `default` at the end of a run of four nodes (one `web`
/// pod each) scaled down to two pods at 2 min, under the pool's `disruption` fields.
fn remaining(disruption: &str) -> Vec<(&'static str, f64)> {
    let (manifests, steps) = four_apart_scaled_to_two(disruption);
    let scenario = scenario(&manifests, steps, "6m");
    let simulate::Simulated { report, metrics, .. } =
        simulate::run(&scenario, scenario.seed, NodeTracer::disabled(), None)
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.summary.final_nodes.len(),
        4,
        "every node stays: {:#?}",
        report.summary
    );
    Blocker::ALL
        .iter()
        .map(|blocker| blocker.label())
        .filter_map(|blocker| {
            let series = format!(
                "karpenter_voluntary_disruption_candidates_remaining{{nodepool=\"default\",blocker=\"{blocker}\"}}"
            );
            let count = sample(&metrics, &series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
            (count > 0.0).then_some((blocker, count))
        })
        .collect()
}

#[test]
fn each_node_that_stays_is_counted_under_the_blocker_that_holds_it() {
    assert_eq!(
        remaining("    consolidateAfter: 30s\n    budgets: [{nodes: '0'}]"),
        [("budget", 4.0)],
        "a budget of no nodes holds the two empty nodes and the two underused ones"
    );
    assert_eq!(
        remaining("    consolidateAfter: Never"),
        [("consolidation_disabled", 4.0)]
    );
    assert_eq!(
        remaining("    consolidateAfter: 1h"),
        [("not_consolidatable", 4.0)],
        "four minutes into an hour's wait"
    );
}

/// The nodes at the end of a run of four nodes (one `web` pod each) scaled down to two at
/// 2m15s under the pool's `disruption` fields, with more `manifests` and `steps`, until `until`,
/// and how many NodeClaims' `ConsolidationRejected` events gave each reason and blocker. Asserts
/// that no node still carries a disruption candidate's taint at the end.
fn abandoned(
    disruption: &str,
    manifests: &str,
    steps: &str,
    until: &str,
) -> (usize, BTreeMap<(String, String), usize>) {
    let manifests = four_apart_scaled_to_two(disruption).0 + manifests;
    let steps = format!(
        "[{{at: 2m15s, scale: {{kind: Deployment, namespace: default, name: web, replicas: 2}}}}{steps}]"
    );
    let scenario = scenario(&manifests, &steps, until);
    let (simulated, (messages, steered)) = simulate::run_then(
        &scenario,
        scenario.seed,
        (NodeTracer::disabled(), None),
        async |live: simulate::Live| {
            let events = Api::<Event>::all(live.client.clone())
                .list(
                    &ListParams::default()
                        .fields("reason=ConsolidationRejected,involvedObject.kind=NodeClaim"),
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let nodes = Api::<Node>::all(live.client.clone())
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let steered: Vec<String> = nodes
                .items
                .iter()
                .filter(|n| {
                    let taints = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_deref())
                        .unwrap_or_default();
                    taints.iter().any(|t| t.key == taints::DISRUPTION_CANDIDATE)
                })
                .map(ResourceExt::name_any)
                .collect();
            let messages: Vec<String> = events.items.into_iter().filter_map(|e| e.message).collect();
            (messages, steered)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        steered.is_empty(),
        "a candidate's taint outlived its validation on {steered:?}"
    );
    let mut blockers = BTreeMap::new();
    for message in messages {
        let reason = message
            .split_once(", reason: ")
            .and_then(|(_, r)| r.split_once(' '));
        let blocker = message
            .rsplit_once("(blocker: ")
            .and_then(|(_, b)| b.strip_suffix(')'));
        if let (Some((reason, _)), Some(blocker)) = (reason, blocker) {
            *blockers
                .entry((reason.to_owned(), blocker.to_owned()))
                .or_default() += 1;
        }
    }
    (simulated.report.summary.final_nodes.len(), blockers)
}

#[test]
fn a_decision_overtaken_before_its_validation_is_abandoned_under_a_validation_blocker() {
    // The two empty nodes are chosen at 2m45s or later, in an even minute: their validation, 15 s
    // on, falls in an odd minute, when a scheduled budget allows nothing.
    let (nodes, blockers) = abandoned(
        "    consolidateAfter: 30s\n    budgets: [{nodes: '100%'}, {nodes: '0', schedule: '1-59/2 * * * *', duration: 1m}]",
        "",
        "",
        "3m30s",
    );
    assert_eq!(nodes, 4, "nothing was removed");
    let twice = |reason: &str, blocker: &str| BTreeMap::from([((reason.to_owned(), blocker.to_owned()), 2)]);
    assert_eq!(blockers, twice("budget", "validation_budget"));
    // Chosen when a budget window closes at 3m, then a web pod lands on each of them at 3m05s,
    // before the validation at 3m15s.
    let (nodes, blockers) = abandoned(
        AFTER_THREE_MINUTES,
        "",
        ", {at: 3m05s, scale: {kind: Deployment, namespace: default, name: web, replicas: 4}}",
        "3m30s",
    );
    assert_eq!(nodes, 4, "nothing was removed");
    assert_eq!(blockers, twice("churn", "validation_churn"));
}

#[test]
fn an_emptiness_decision_goes_on_at_its_validation_with_the_nodes_still_empty() {
    // As above, but one web pod comes back at 3m05s: it lands on one of the two empty nodes, and
    // the other goes at the validation, as Karpenter's emptiness validation lets it.
    let (nodes, blockers) = abandoned(
        AFTER_THREE_MINUTES,
        "",
        ", {at: 3m05s, scale: {kind: Deployment, namespace: default, name: web, replicas: 3}}",
        "4m",
    );
    assert_eq!(
        nodes, 3,
        "the node still empty was removed, the one with the pod kept"
    );
    assert!(blockers.is_empty(), "nothing was rejected: {blockers:?}");
}

#[test]
fn a_pod_arriving_while_empty_nodes_wait_for_validation_goes_to_a_node_that_stays() {
    // A small pod comes at 3m05s, between the decision to remove the two empty nodes and its
    // validation. Least allocated, an empty node would take it and stay; their taint sends it
    // to a node with a web pod, and both empty nodes go.
    let (nodes, blockers) = abandoned(
        AFTER_THREE_MINUTES,
        &deployment("small", 0, "100m", ""),
        ", {at: 3m05s, scale: {kind: Deployment, namespace: default, name: small, replicas: 1}}",
        "4m",
    );
    assert_eq!(nodes, 2, "both empty nodes were removed");
    assert!(blockers.is_empty(), "nothing was rejected: {blockers:?}");
}

#[test]
fn a_multi_node_decision_goes_on_at_its_validation_with_the_nodes_whose_pods_still_fit() {
    // Four c5.xlarge nodes, each full with a `base` pod. A do-not-disrupt `keeper` pod lands on
    // one, then a `small` pod on each other; `base` goes at 2m15s. At 3m one decision moves the
    // three small pods onto the keeper's node; at 3m05s a `filler` pod takes most of that room
    // (the three candidates are tainted), leaving room for two. At the validation, two nodes go
    // with their pods moved; the third is not abandoned with them.
    let keeper = deployment("keeper", 0, "500m", "").replace(
        "metadata: {labels: {app: keeper}}",
        "metadata: {labels: {app: keeper}, annotations: {karpenter.sh/do-not-disrupt: \"true\"}}",
    );
    let apart = APART.replace("app: web", "app: base");
    let manifests = pool(
        "default",
        &family(&["c5"]),
        &format!("  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n{AFTER_THREE_MINUTES}"),
    ) + NODE_CLASS
        + &deployment("base", 4, "3", &apart)
        + &keeper
        + &deployment("small", 0, "500m", "")
        + &deployment("filler", 0, "2", "");
    let scale = |at: &str, name: &str, replicas: u32| {
        format!(
            "{{at: {at}, scale: {{kind: Deployment, namespace: default, name: {name}, replicas: {replicas}}}}}"
        )
    };
    let steps = format!(
        "[{}, {}, {}, {}]",
        scale("1m", "keeper", 1),
        scale("70s", "small", 3),
        scale("2m15s", "base", 0),
        scale("3m05s", "filler", 1)
    );
    let report = run(&scenario(&manifests, &steps, "6m"));
    let first = entries(&report, "disruption-decided")
        .next()
        .unwrap_or_else(|| panic!("nothing decided: {:#?}", report.summary));
    let claims = first
        .detail
        .strip_prefix("multi-node consolidation of ")
        .and_then(|rest| rest.split_once(", saving"))
        .map(|(claims, _)| claims.split(", ").count());
    assert_eq!(
        (first.at_seconds, claims),
        (195.0, Some(2)),
        "two of the three nodes go at the validation of 3m: {first:#?}"
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (5, 0), "{s:#?}");
}

//! Why nodes stay, as the disruption pass counts them: `karpenter_voluntary_disruption_candidates_remaining`
//! by NodePool and blocker, for a pool whose budget allows nothing, one that never consolidates,
//! and one whose nodes changed within its `consolidateAfter`.

use joist::simulate;
use joist_actors::effects::node_trace::NodeTracer;

use super::{four_apart_scaled_to_two, sample, scenario};

/// The blockers the gauge can carry, as `joist_actors::disruption::blockers` names them.
const BLOCKERS: [&str; 8] = [
    "budget",
    "consolidation_disabled",
    "buffer_pods",
    "not_consolidatable",
    "no_feasible_schedule",
    "same_or_more_expensive_replacement",
    "score",
    "nominated",
];

/// Each blocker's count for the NodePool `default` at the end of a run of four nodes (one `web`
/// pod each) scaled down to two pods at 2 min, under the pool's `disruption` fields.
fn remaining(disruption: &str) -> Vec<(&'static str, f64)> {
    let (manifests, steps) = four_apart_scaled_to_two(disruption);
    let scenario = scenario(&manifests, steps, "6m");
    let simulate::Simulated { report, metrics, .. } =
        simulate::run(&scenario, scenario.seed, NodeTracer::disabled(), &mut |_| {})
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.summary.final_nodes.len(),
        4,
        "every node stays: {:#?}",
        report.summary
    );
    BLOCKERS
        .iter()
        .filter_map(|blocker| {
            let series = format!(
                "karpenter_voluntary_disruption_candidates_remaining{{nodepool=\"default\",blocker=\"{blocker}\"}}"
            );
            let count = sample(&metrics, &series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
            (count > 0.0).then_some((*blocker, count))
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

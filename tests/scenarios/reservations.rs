//! Capacity reservations in whole runs, after Karpenter's own provisioning, consolidation and
//! drift cases: reserved capacity is bought first and counted down, a NodeClaim waits a batch
//! rather than buy on-demand while a reservation it could use is taken, on-demand nodes move into
//! a reservation added later, a cancelled reservation's nodes become on-demand, a deselected one's
//! drift, and a capacity block's nodes are drained 40 minutes before it ends.

use super::{APART, NODE_CLASS, Report, deployment, entries, family, pool, run, scenario, scenario_with};

/// The c5 NodePool `default` allowing on-demand and reserved capacity, consolidating after 30 s.
fn reserving_pool() -> String {
    pool(
        "default",
        &family(&["c5"]),
        "  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 30s",
    )
    .replace("values: [on-demand]", "values: [on-demand, reserved]")
}

/// The EC2NodeClass `default`, selecting the reservations tagged `team: ml`.
fn reserving_class() -> String {
    NODE_CLASS.replace(
        "  securityGroupSelectorTerms:",
        "  capacityReservationSelectorTerms: [{tags: {team: ml}}]\n  securityGroupSelectorTerms:",
    )
}

/// A step creating reservation `id` of `count` c5 instances of `size` in us-west-2a, tagged
/// `team: ml`, with extra fields.
fn reservation(at: &str, id: &str, size: &str, count: u32, extra: &str) -> String {
    format!(
        "{{at: {at}, createCapacityReservation: {{id: {id}, instanceType: c5.{size}, zone: us-west-2a, count: {count}, tags: {{team: ml}}{extra}}}}}"
    )
}

/// A step applying `manifest`.
fn apply(at: &str, manifest: &str) -> String {
    format!(
        "{{at: {at}, apply: \"{}\"}}",
        manifest.replace('\n', "\\n").replace('"', "\\\"")
    )
}

/// The final nodes as (capacity type, instance type, reservation id), sorted.
fn final_nodes(report: &Report) -> Vec<(String, String, String)> {
    let mut nodes: Vec<_> = report
        .summary
        .final_nodes
        .iter()
        .map(|n| {
            (
                n.capacity_type.clone(),
                n.instance_type.clone(),
                n.capacity_reservation_id.clone(),
            )
        })
        .collect();
    nodes.sort();
    nodes
}

fn node(capacity_type: &str, instance_type: &str, reservation: &str) -> (String, String, String) {
    (capacity_type.into(), instance_type.into(), reservation.into())
}

#[test]
fn reserved_capacity_is_bought_first_and_a_full_reservation_makes_the_rest_wait_a_batch() {
    let manifests = reserving_pool() + &reserving_class();
    // The reservation exists from the start; the pods come once the class lists it (every minute).
    let steps = format!(
        "[{}, {}]",
        reservation("0s", "cr-0ml", "xlarge", 2, ""),
        apply("2m", &deployment("web", 3, "1", APART))
    );
    let report = run(&scenario(&manifests, &steps, "6m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
    assert_eq!(
        final_nodes(&report),
        [
            node("on-demand", "c5.large", ""),
            node("reserved", "c5.xlarge", "cr-0ml"),
            node("reserved", "c5.xlarge", "cr-0ml"),
        ],
        "two pods take the near-free reserved c5.xlarge, the third the cheapest on-demand type: {:#?}",
        report.timeline
    );
    let launches: Vec<(f64, String)> = entries(&report, "instance-launched")
        .map(|e| (e.at_seconds, e.detail.clone()))
        .collect();
    assert!(
        launches[2].0 > launches[1].0,
        "the on-demand node comes a batch after the reserved ones: {launches:?}"
    );
    assert!(
        !report.timeline.iter().any(|e| e.event == "insufficient-capacity"),
        "the reservation is never asked for more than it holds: {:#?}",
        report.timeline
    );
}

#[test]
fn with_the_reserved_capacity_gate_off_a_reservation_is_not_offered() {
    let manifests = reserving_pool() + &reserving_class();
    let steps = format!(
        "[{}, {}]",
        reservation("0s", "cr-0ml", "xlarge", 2, ""),
        apply("2m", &deployment("web", 1, "1", ""))
    );
    let scenario = scenario_with(
        "{featureGates: {reservedCapacity: false}}",
        &manifests,
        &steps,
        "4m",
    );
    let report = run(&scenario);
    assert_eq!(
        final_nodes(&report),
        [node("on-demand", "c5.large", "")],
        "{:#?}",
        report.timeline
    );
}

#[test]
fn an_on_demand_node_moves_into_a_reservation_added_later() {
    let manifests = reserving_pool() + &reserving_class() + &deployment("web", 1, "1", "");
    let steps = format!("[{}]", reservation("2m", "cr-0late", "large", 1, ""));
    let report = run(&scenario(&manifests, &steps, "8m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (1, 0), "{s:#?}");
    assert_eq!(
        final_nodes(&report),
        [node("reserved", "c5.large", "cr-0late")],
        "consolidation replaces the on-demand c5.large by the same type reserved: {:#?}",
        report.timeline
    );
    assert_eq!(s.nodes_terminated.get("underutilized"), Some(&1), "{s:#?}");
}

#[test]
fn a_cancelled_reservation_demotes_its_nodes_and_a_deselected_one_drifts() {
    let manifests = reserving_pool() + &reserving_class();
    let start = format!(
        "{}, {}",
        reservation("0s", "cr-0gone", "large", 1, ""),
        apply("2m", &deployment("web", 1, "1", ""))
    );
    // Cancelled: the instance runs on, on-demand, and its node says so within a minute or two.
    let steps = format!("[{start}, {{at: 5m, cancelCapacityReservation: {{id: cr-0gone}}}}]");
    let report = run(&scenario(&manifests, &steps, "8m"));
    assert_eq!(
        final_nodes(&report),
        [node("on-demand", "c5.large", "")],
        "{:#?}",
        report.timeline
    );
    assert_eq!(report.summary.nodes_launched, 1, "{:#?}", report.summary);
    // Deselected: the class no longer selects the reservation, and the node drifts.
    let other_class = reserving_class().replace("{tags: {team: ml}}", "{tags: {team: other}}");
    let steps = format!("[{start}, {}]", apply("5m", &other_class));
    let report = run(&scenario(&manifests, &steps, "10m"));
    let s = &report.summary;
    assert_eq!(s.nodes_terminated.get("drifted"), Some(&1), "{s:#?}");
    assert_eq!(
        final_nodes(&report),
        [node("on-demand", "c5.large", "")],
        "{s:#?}"
    );
}

#[test]
fn a_capacity_blocks_nodes_are_drained_forty_minutes_before_it_ends() {
    let manifests = reserving_pool() + &reserving_class();
    let steps = format!(
        "[{}, {}]",
        reservation(
            "0s",
            "cr-0block",
            "large",
            1,
            ", type: capacity-block, endsAfter: 55m"
        ),
        apply("2m", &deployment("web", 1, "1", ""))
    );
    let report = run(&scenario(&manifests, &steps, "20m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (1, 0), "{s:#?}");
    assert_eq!(
        final_nodes(&report),
        [node("on-demand", "c5.large", "")],
        "{s:#?}"
    );
    let ended: Vec<f64> = entries(&report, "instance-ended").map(|e| e.at_seconds).collect();
    // The block ends at 55m; expiring from 15m, found by the minute's poll.
    assert!(
        ended.len() == 1 && (900.0..=1_030.0).contains(&ended[0]),
        "the block's node ended at {ended:?}: {:#?}",
        report.timeline
    );
}

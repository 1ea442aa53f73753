//! The crash suite: Joist's controllers crashed at every fault point of the chaos scenario and
//! started again from the cluster and the cloud alone leave no instance leaked, no NodeClaim
//! launched twice, no pod stranded and no node tainted; and the cloud-fault and runaway cases
//! stay within their bounds.

use joist::{
    commands::bench_chaos::{self, Totals},
    simulate::{self, Scenario},
};
use joist_actors::effects::faults::{FaultPoints, Step};

#[test]
fn a_crash_at_every_fault_point_loses_nothing_and_leaks_nothing() {
    let mut lines = Vec::new();
    let totals = bench_chaos::suite(false, &mut |line| {
        lines.push(line);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let table = lines.join("\n");
    assert_eq!(
        totals,
        Totals {
            steps: Step::ALL.len(),
            crashes: Step::ALL.len(),
            cases: 12,
            ..Totals::default()
        },
        "{table}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("steps 14 crashes 14 leaks 0 duplicates 0 stranded 0")
    );
}

#[test]
fn a_launch_whose_reply_was_lost_is_adopted_after_the_restart() {
    let scenario = Scenario::parse(bench_chaos::SCENARIO).unwrap_or_else(|e| panic!("{e}"));
    let (crashed, audit) = simulate::run_crashing(
        &scenario,
        scenario.seed,
        FaultPoints::crash_at(Step::InstanceLaunched, 1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let crash = audit.crash.as_ref().expect("the crash happened");
    assert!(crash.restarted_at.is_some());
    let events: Vec<&str> = crashed.report.timeline.iter().map(|e| e.event.as_str()).collect();
    assert!(
        events.contains(&"crash") && events.contains(&"restart"),
        "{events:?}"
    );
    // The same instances as a run without the crash: the first launch was adopted, not repeated.
    let clean =
        simulate::run(&scenario, scenario.seed, Default::default(), None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(crashed.report.instances.len(), clean.report.instances.len());
    assert!(audit.duplicates.is_empty(), "{:?}", audit.duplicates);
}

#[test]
fn while_every_offering_is_out_of_capacity_pods_wait_with_the_reason_and_the_pool_pauses() {
    let world = Scenario::parse(bench_chaos::SCENARIO).unwrap_or_else(|e| panic!("{e}"));
    let outage = world
        .with_steps(
            "outage",
            "[{at: 0s, unavailable: {for: 1h}},
              {at: 30s, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 4}}]",
            "8m",
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let simulated =
        simulate::run(&outage, outage.seed, Default::default(), None).unwrap_or_else(|e| panic!("{e}"));
    let summary = &simulated.report.summary;
    assert_eq!(summary.pods_pending_end, 4);
    assert!(
        summary
            .pending_pods
            .iter()
            .all(|p| p.reason.contains("launches paused") && p.reason.contains("InsufficientCapacityError")),
        "{:?}",
        summary.pending_pods
    );
    let paused = simulated
        .report
        .timeline
        .iter()
        .filter(|e| e.object == "NodePool/default" && e.detail.starts_with("LaunchesPaused"))
        .count();
    assert!(paused >= 1, "no LaunchesPaused warning on the NodePool");
    // Without the breaker every batch launched again: over a hundred attempts in these minutes.
    let attempts = simulated
        .calls
        .0
        .iter()
        .filter(|c| c.operation == joist_provider_sim::Operation::Create)
        .count();
    assert!(attempts <= 12, "{attempts} launch attempts");
}

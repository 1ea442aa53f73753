//! The crash suite: Joist's controllers crashed at every fault point of the chaos scenario and
//! started again from the cluster and the cloud alone leave no instance leaked, no NodeClaim
//! launched twice, no pod stranded and no node tainted.

use joist::{
    commands::bench_chaos::{self, Totals},
    simulate::{self, Scenario},
};
use joist_actors::faults::{FaultPoints, Step};

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
            ..Totals::default()
        },
        "{table}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("steps 13 crashes 13 leaks 0 duplicates 0 stranded 0")
    );
}

#[test]
fn a_launch_whose_reply_was_lost_is_adopted_after_the_restart() {
    let scenario = Scenario::parse(bench_chaos::SCENARIO).unwrap_or_else(|e| panic!("{e}"));
    let crashed = simulate::run_crashing(
        &scenario,
        scenario.seed,
        FaultPoints::crash_at(Step::InstanceLaunched, 1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let crash = crashed.audit.crash.as_ref().expect("the crash happened");
    assert!(crash.restarted_at.is_some());
    let events: Vec<&str> = crashed.report.timeline.iter().map(|e| e.event.as_str()).collect();
    assert!(
        events.contains(&"crash") && events.contains(&"restart"),
        "{events:?}"
    );
    // The same instances as a run without the crash: the first launch was adopted, not repeated.
    let clean = simulate::run(&scenario, scenario.seed, Default::default(), &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(crashed.report.instances.len(), clean.report.instances.len());
    assert!(
        crashed.audit.duplicates.is_empty(),
        "{:?}",
        crashed.audit.duplicates
    );
}

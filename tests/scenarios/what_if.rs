//! `joist what-if` held to the simulator itself: a snapshot taken at the end of a `joist
//! simulate` run, replayed with a change, ends on the same nodes at the same cost as the run
//! with that change made at the same moment, and its page draws both runs; the snapshot file
//! round-trips; nodes of a type the simulated cloud does not sell are named.

use joist::{
    simulate::{self, Live},
    snapshot::Snapshot,
};
use joist_actors::effects::node_trace::NodeTracer;

use super::{APART, NODE_CLASS, deployment, family, indent, pool, scenario};

/// Four one-CPU `web` pods apart, on the c5 family, consolidating after 30 s.
fn manifests() -> String {
    pool(
        "default",
        &family(&["c5"]),
        "  disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 30s}",
    ) + NODE_CLASS
        + &deployment("web", 4, "1", APART)
}

/// The change: the NodePool moved to the m5 family.
fn change() -> String {
    pool(
        "default",
        &family(&["m5"]),
        "  disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 30s}",
    )
}

/// Each final node's instance type, sorted, and the cost per hour at the end.
fn ending(report: &simulate::Report) -> (Vec<String>, f64) {
    let mut types: Vec<String> = (report.summary.final_nodes.iter())
        .map(|n| n.instance_type.clone())
        .collect();
    types.sort();
    (types, report.summary.cost_per_hour_end)
}

#[test]
fn a_change_replayed_on_a_snapshot_ends_as_the_change_made_in_the_run_itself() {
    let settled = scenario(&manifests(), "[]", "3m");
    let (_, snapshot) = simulate::run_then(
        &settled,
        settled.seed,
        (NodeTracer::disabled(), None),
        async |live: Live| Snapshot::take(&live.client).await,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let snapshot = snapshot.unwrap_or_else(|e| panic!("{e}"));
    let text = snapshot.to_yaml().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        Snapshot::parse(&text).ok().as_ref(),
        Some(&snapshot),
        "the file round-trips"
    );
    assert_eq!(snapshot.of_kind("Node").count(), 4);

    // The change made in the run itself, at the moment the snapshot was taken.
    let steps = format!("\n    - at: 3m\n      apply: |\n{}", indent(&indent(&change())));
    let direct = simulate::run(
        &scenario(&manifests(), &steps, "13m"),
        settled.seed,
        NodeTracer::disabled(),
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .report;

    let dir = std::env::temp_dir().join(format!("joist-what-if-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let (from, changed) = (dir.join("snapshot.yaml"), dir.join("m5.yaml"));
    std::fs::write(&from, &text).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&changed, change()).unwrap_or_else(|e| panic!("{e}"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_joist"))
        .arg("what-if")
        .arg("--from")
        .arg(&from)
        .arg(&changed)
        .args(["--for", "10m", "--html"])
        .arg(dir.join("what-if.html"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (types, cost) = ending(&direct);
    assert!(types.iter().all(|t| t.starts_with("m5.")), "{types:?}");
    assert!(
        printed.contains(&format!("cost after ${cost:.4}/h\n")),
        "the same cost as the run itself (${cost:.4}/h on {types:?}):\n{printed}"
    );
    let before = direct.summary.cost_per_hour_end;
    assert!(printed.contains("cost before $"), "{printed}");
    assert!(
        printed.contains(&format!("nodes at the end{:>26}{:>16}", 4, types.len())),
        "{printed} (before: ${before:.4}/h)"
    );
    let page = std::fs::read_to_string(dir.join("what-if.html")).unwrap_or_else(|e| panic!("{e}"));
    for chart in ["nodes", "pods-pending", "pods-running", "cost"] {
        assert!(
            page.contains(&format!("id=\"chart-{chart}\"")),
            "the {chart} chart"
        );
    }
    assert!(
        page.contains("without the change (dashed)") && page.contains("stroke-dasharray"),
        "both runs on each chart, the one without the change dashed"
    );

    // The same snapshot with its nodes of a type the simulated cloud does not sell (a KWOK
    // cluster's): the summary says so.
    let kwok = dir.join("kwok.yaml");
    std::fs::write(&kwok, text.replace("c5.large", "c-2x-amd64-linux")).unwrap_or_else(|e| panic!("{e}"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_joist"))
        .arg("what-if")
        .arg("--from")
        .arg(&kwok)
        .arg(&changed)
        .args(["--for", "1m"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("note: the simulated cloud does not sell c-2x-amd64-linux (4 nodes) in us-west-2"),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! `joist simulate SCENARIO.yaml [--report FILE.json] [--html FILE.html] [--metrics FILE]
//! [--snapshot FILE.yaml] [--seed N]`:
//! runs a scenario (see [`crate::simulate`]), shows progress on stderr when it is a terminal, prints
//! a summary (nodes grouped by NodePool and instance type, pending pods by reason), and writes the
//! JSON report, the HTML report, the final Prometheus exposition and the cluster's snapshot
//! ([`crate::snapshot`]) when asked. Node traces
//! are exported over OTLP when the environment asks for it ([`crate::telemetry`]), stamped with
//! virtual time.

use std::{
    collections::BTreeMap,
    io::{self, IsTerminal, Write},
    path::Path,
    process::ExitCode,
};

use super::CommandError;
use crate::{
    simulate::{
        self, Progress, Report, Scenario, html,
        report::{FinalNode, clock},
    },
    snapshot::Snapshot,
    telemetry::Telemetry,
};

/// The files a run writes at its end, when asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outputs<'a> {
    /// The JSON report.
    pub report: Option<&'a Path>,
    /// The HTML report.
    pub html: Option<&'a Path>,
    /// The controllers' Prometheus metrics.
    pub metrics: Option<&'a Path>,
    /// The cluster at the end ([`crate::snapshot`]).
    pub snapshot: Option<&'a Path>,
}

/// Runs the scenario at `path`.
pub fn run(
    path: &Path,
    outputs: Outputs<'_>,
    seed: Option<u64>,
    out: &mut dyn Write,
) -> Result<ExitCode, CommandError> {
    let text = std::fs::read_to_string(path).map_err(|source| CommandError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let scenario = Scenario::parse(&text).map_err(|e| CommandError::Simulate {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let seed = seed.unwrap_or(scenario.seed);
    let mut stderr = io::stderr();
    let show = stderr.is_terminal();
    let telemetry = Telemetry::from_env().map_err(|e| CommandError::Simulate {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let wall = std::time::SystemTime::now();
    let mut progress = |p: Progress| {
        let _ = write!(stderr, "\r{}", bar(&p));
        let _ = stderr.flush();
    };
    let ran = simulate::run_then(
        &scenario,
        seed,
        (
            telemetry.node_tracer(),
            show.then_some(&mut progress as &mut dyn FnMut(Progress)),
        ),
        async |live: simulate::Live| {
            let taken = match outputs.snapshot {
                Some(_) => Some(Snapshot::take(&live.client).await),
                None => None,
            };
            (standings(&live.controllers).await, taken)
        },
    )
    .map_err(|e| CommandError::Simulate {
        path: path.to_path_buf(),
        message: e.to_string(),
    });
    telemetry.shutdown();
    let (mut simulated, (stays, taken)) = ran?;
    // The command ends after the summary and the files: its world goes with the process.
    simulated.leave_world();
    let simulate::Simulated {
        mut report, metrics, ..
    } = simulated;
    report.note_standings(&stays);
    if show {
        let _ = writeln!(stderr);
    }
    let elapsed = wall.elapsed().map(|d| d.as_secs_f64()).unwrap_or_default();
    summarize(&report, elapsed, out).map_err(CommandError::stdout)?;
    write_output("report", outputs.report, out, || {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    })?;
    write_output("html report", outputs.html, out, || html::render(&report))?;
    write_output("metrics", outputs.metrics, out, || metrics)?;
    if let Some(taken) = taken {
        let snapshot = taken.map_err(|e| CommandError::Simulate {
            path: path.to_path_buf(),
            message: format!("cannot take the snapshot: {e}"),
        })?;
        let yaml = snapshot.to_yaml().map_err(|e| CommandError::Simulate {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        write_output("snapshot", outputs.snapshot, out, || yaml)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Why each node stays at the end, by Node name, as the controllers' disruption pass judges it.
pub async fn standings(controllers: &joist_actors::shared::Shared) -> BTreeMap<String, String> {
    joist_actors::explain::node::standings(controllers)
        .await
        .into_iter()
        .map(|(node, standing)| (node, standing.to_string()))
        .collect()
}

/// Writes `contents` to `path`, when asked for, and says where it went.
fn write_output(
    what: &str,
    path: Option<&Path>,
    out: &mut dyn Write,
    contents: impl FnOnce() -> String,
) -> Result<(), CommandError> {
    let Some(path) = path else { return Ok(()) };
    std::fs::write(path, contents()).map_err(|source| CommandError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    writeln!(out, "{what}: {}", path.display()).map_err(CommandError::stdout)
}

fn bar(p: &Progress) -> String {
    const WIDTH: usize = 30;
    let fraction = p.at.as_secs_f64() / p.until.as_secs_f64().max(1.0);
    let filled = ((fraction * WIDTH as f64) as usize).min(WIDTH);
    format!(
        "[{}{}] {:>5} / {}  nodes {:>3}  pending pods {:>4}",
        "#".repeat(filled),
        " ".repeat(WIDTH - filled),
        clock(p.at.as_secs_f64()),
        clock(p.until.as_secs_f64()),
        p.nodes,
        p.pending
    )
}

fn summarize(report: &Report, wall_seconds: f64, out: &mut dyn Write) -> io::Result<()> {
    let s = &report.summary;
    writeln!(
        out,
        "scenario {} (seed {}): {} simulated in {wall_seconds:.1}s",
        report.scenario,
        report.seed,
        clock(report.duration_seconds)
    )?;
    let terminated: usize = s.nodes_terminated.values().sum();
    writeln!(
        out,
        "nodes launched: {}, terminated: {terminated} {:?}",
        s.nodes_launched, s.nodes_terminated
    )?;
    writeln!(
        out,
        "pods running: {}, pending: {}",
        s.pods_running_end, s.pods_pending_end
    )?;
    writeln!(out, "longest pod wait: {}", clock(s.max_pod_pending_seconds))?;
    if let Some(latency) = s.max_pending_to_nodeclaim_seconds {
        writeln!(out, "longest unschedulable pod → nodeclaim: {latency:.3}s")?;
    }
    writeln!(
        out,
        "cost: ${:.4}/h at the end, ${:.4} in total",
        s.cost_per_hour_end, s.cost_total
    )?;
    writeln!(out, "nodes at the end: {}", s.final_nodes.len())?;
    for ((nodepool, instance_type, capacity_type), (count, per_hour)) in node_groups(&s.final_nodes) {
        writeln!(
            out,
            "  {nodepool:<16} {instance_type:<16} {capacity_type:<10} {count:>5} × ${:.4}/h",
            per_hour / count as f64
        )?;
    }
    for buffer in &s.capacity_buffers {
        let replicas = buffer.replicas.map_or_else(|| "-".to_owned(), |n| n.to_string());
        writeln!(
            out,
            "capacity buffer {}: room for {replicas} pods; {}",
            buffer.buffer,
            buffer.conditions.join(", ")
        )?;
    }
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for pod in &s.pending_pods {
        by_reason.entry(pod.reason.as_str()).or_default().push(&pod.pod);
    }
    for (reason, pods) in by_reason {
        let reason = if reason.is_empty() {
            "(no reason from Joist)"
        } else {
            reason
        };
        writeln!(out, "pending: {} {}", pod_list(&pods), reason)?;
    }
    Ok(())
}

/// Final nodes counted by (NodePool, instance type, capacity type), with their total $/h.
fn node_groups(nodes: &[FinalNode]) -> BTreeMap<(&str, &str, &str), (usize, f64)> {
    let mut groups: BTreeMap<(&str, &str, &str), (usize, f64)> = BTreeMap::new();
    for node in nodes {
        let group = groups
            .entry((&node.nodepool, &node.instance_type, &node.capacity_type))
            .or_default();
        group.0 += 1;
        group.1 += node.price_per_hour;
    }
    groups
}

/// One pod by name, a few by names, many by a count and the first names.
fn pod_list(pods: &[&str]) -> String {
    const NAMED: usize = 3;
    match pods {
        [one] => (*one).to_owned(),
        few if few.len() <= NAMED => few.join(", "),
        many => format!("{} pods ({}, …)", many.len(), many[..NAMED].join(", ")),
    }
}

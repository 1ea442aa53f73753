//! `joist simulate SCENARIO.yaml [--report FILE.json] [--metrics FILE] [--seed N]`: runs a
//! scenario (see [`crate::simulate`]), shows progress on stderr when it is a terminal, prints a
//! summary, and writes the JSON report and the final Prometheus exposition when asked. Node traces
//! are exported over OTLP when the environment asks for it ([`crate::telemetry`]), stamped with
//! virtual time.

use std::{
    io::{self, IsTerminal, Write},
    path::Path,
    process::ExitCode,
};

use super::CommandError;
use crate::{
    simulate::{self, Progress, Report, Scenario},
    telemetry::Telemetry,
};

/// Runs the scenario at `path`.
pub fn run(
    path: &Path,
    report_path: Option<&Path>,
    metrics_path: Option<&Path>,
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
    let report = simulate::run(&scenario, seed, telemetry.node_tracer(), &mut |p: Progress| {
        if show {
            let _ = write!(stderr, "\r{}", bar(&p));
            let _ = stderr.flush();
        }
    })
    .map_err(|e| CommandError::Simulate {
        path: path.to_path_buf(),
        message: e.to_string(),
    });
    telemetry.shutdown();
    let simulate::Simulated { report, metrics } = report?;
    if show {
        let _ = writeln!(stderr);
    }
    let elapsed = wall.elapsed().map(|d| d.as_secs_f64()).unwrap_or_default();
    summarize(&report, elapsed, out).map_err(CommandError::stdout)?;
    if let Some(report_path) = report_path {
        let json = serde_json::to_string_pretty(&report).unwrap_or_default() + "\n";
        std::fs::write(report_path, json).map_err(|source| CommandError::Write {
            path: report_path.to_path_buf(),
            source,
        })?;
        writeln!(out, "report: {}", report_path.display()).map_err(CommandError::stdout)?;
    }
    if let Some(metrics_path) = metrics_path {
        std::fs::write(metrics_path, metrics).map_err(|source| CommandError::Write {
            path: metrics_path.to_path_buf(),
            source,
        })?;
        writeln!(out, "metrics: {}", metrics_path.display()).map_err(CommandError::stdout)?;
    }
    Ok(ExitCode::SUCCESS)
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

fn clock(seconds: f64) -> String {
    let s = seconds as u64;
    format!("{}m{:02}s", s / 60, s % 60)
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
    writeln!(out, "nodes at the end:")?;
    for node in &s.final_nodes {
        writeln!(
            out,
            "  {:<44} {:<10} {:<14} {:<10} {:<12} ${:.4}/h",
            node.name, node.nodepool, node.instance_type, node.capacity_type, node.zone, node.price_per_hour
        )?;
    }
    for pod in &s.pending_pods {
        writeln!(out, "pending: {} {}", pod.pod, pod.reason)?;
    }
    Ok(())
}

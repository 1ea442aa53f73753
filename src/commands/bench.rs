//! `joist bench scheduling`: runs the scheduling simulation on a benchmark problem and reports
//! speed, result and packing quality.
//!
//! Building the problem (pods, catalog) is not timed; one `solve` call is, on one thread, as in
//! Karpenter's benchmark. Fleet cost is the sum of each new NodeClaim's cheapest offering; the
//! lower bound is the cpu (or memory, whichever is larger) the pods on new nodes request, priced at
//! the cheapest price per unit any instance type offers. Peak memory is the process's high-water mark
//! (`VmHWM`), so it includes the problem itself; it reads `unknown` where `/proc` is missing.

use std::{io, process::ExitCode};

use clap::ValueEnum;
use joist_messages::model::resources::names;
use joist_scheduling::{Input, Solution, solve, workloads};

use super::CommandError;

/// A moment on the wall clock, which benchmarks measure on purpose (the rest of Joist keeps
/// tokio's clock, so that virtual time stays deterministic).
#[allow(clippy::disallowed_types)]
pub(super) type WallInstant = std::time::Instant;

/// The benchmark problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Karpenter's scheduling benchmark: 400 fake types, one NodePool, the diverse pod mix.
    Diverse,
    /// 1,000 existing nodes holding pods, plus the pending pods, on the AWS-shaped catalog.
    Existing,
    /// 20 weighted NodePools, 19 of them tainted, on the AWS-shaped catalog.
    NodePools,
    /// The 20 NodePools beside 1,000 running nodes: every pending pod must be placed or given a
    /// reason in one solve (no pod starves behind the others).
    Crowded,
}

/// Builds the problem for `scenario` with `pods` pending pods.
pub fn problem(scenario: Scenario, pods: usize) -> Input {
    match scenario {
        Scenario::Diverse => workloads::karpenter_diverse(pods),
        Scenario::Existing => workloads::existing_cluster(1000, pods),
        Scenario::NodePools => workloads::many_node_pools(pods),
        Scenario::Crowded => workloads::crowded_node_pools(1000, pods),
    }
}

/// The cheapest price per unit of `resource` over all instance types and offerings.
fn cheapest_per_unit(input: &Input, resource: &str) -> Option<f64> {
    input
        .instance_types
        .iter()
        .filter_map(|it| {
            let units = it.capacity.get(resource).millis() as f64 / 1000.0;
            let price = it.cheapest_offering(|_| true)?.price;
            (units > 0.0).then_some(price / units)
        })
        .min_by(f64::total_cmp)
}

/// The packing lower bound for the pods placed on new nodes (see the module docs).
pub fn lower_bound(input: &Input, solution: &Solution) -> f64 {
    [names::CPU, names::MEMORY]
        .into_iter()
        .filter_map(|resource| {
            let total = solution
                .claims
                .iter()
                .map(|c| c.requests.get(resource).millis() as f64 / 1000.0)
                .fold(0.0, |a, b| a + b);
            cheapest_per_unit(input, resource).map(|price| total * price)
        })
        .fold(0.0, f64::max)
}

/// The process's peak resident memory (`VmHWM`), where `/proc` has it.
pub(super) fn peak_memory_mib() -> Option<u64> {
    peak_memory_mib_of("self")
}

/// The peak resident memory (`VmHWM`) of the process `/proc/<process>` describes (`self` or a pid).
pub(super) fn peak_memory_mib_of(process: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The CPU time (user and system, every thread, ended ones included) the process `/proc/<process>`
/// describes has used, in seconds.
pub(super) fn cpu_seconds_of(process: &str) -> Option<f64> {
    /// `/proc` counts CPU time in USER_HZ ticks, which Linux fixes at 100 on every architecture.
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).ok()?;
    // Fields after the command's closing parenthesis start at the third, the state: utime and
    // stime are the 14th and 15th.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / TICKS_PER_SECOND)
}

/// Runs one benchmark and prints its report.
pub fn run(scenario: Scenario, pods: usize, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let input = problem(scenario, pods);
    let start = WallInstant::now();
    let solution = solve(&input);
    let elapsed = start.elapsed().as_secs_f64();
    report(scenario, &input, &solution, elapsed, out).map_err(CommandError::stdout)?;
    Ok(ExitCode::SUCCESS)
}

fn report(
    scenario: Scenario,
    input: &Input,
    solution: &Solution,
    seconds: f64,
    out: &mut dyn io::Write,
) -> io::Result<()> {
    let pods = input.pods.len();
    let on_claims: usize = solution.claims.iter().map(|c| c.pods.len()).sum();
    let cost = solution.cost();
    let bound = lower_bound(input, solution);
    writeln!(
        out,
        "scenario          {}",
        scenario
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string())
    )?;
    writeln!(out, "pods              {pods}")?;
    writeln!(
        out,
        "placed            {} on existing nodes, {on_claims} on new nodes",
        solution.placements.len()
    )?;
    writeln!(out, "unschedulable     {}", solution.unschedulable.len())?;
    let accounted = solution.placements.len() + on_claims + solution.unschedulable.len();
    writeln!(out, "not considered    {}", pods.saturating_sub(accounted))?;
    writeln!(out, "new nodes         {}", solution.claims.len())?;
    writeln!(out, "time              {:.3} s", seconds)?;
    writeln!(out, "pods/s            {:.0}", pods as f64 / seconds.max(1e-9))?;
    writeln!(
        out,
        "per pod           {:.2} µs",
        seconds * 1e6 / pods.max(1) as f64
    )?;
    writeln!(out, "fleet cost        ${cost:.2}/h")?;
    writeln!(out, "lower bound       ${bound:.2}/h")?;
    writeln!(
        out,
        "cost / bound      {:.3}",
        if bound > 0.0 { cost / bound } else { 0.0 }
    )?;
    match peak_memory_mib() {
        Some(mib) => writeln!(out, "peak memory       {mib} MiB"),
        None => writeln!(out, "peak memory       unknown"),
    }
}

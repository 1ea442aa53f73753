//! `joist bench consolidation --nodes N`: the consolidation search on a fragmented cluster.
//!
//! The cluster is built the way the scheduling benchmark builds its nodes: Karpenter's diverse
//! workload is provisioned (pods grown until the simulation opens at least N nodes, then the
//! first N kept, each node on the cheapest on-demand offering of its cheapest type), and a seeded
//! 60 % of the pods are deleted. Then, on one thread:
//!
//! - `single-node scan`: every node is evaluated as a single-node candidate;
//! - `multi-node search`: the binary search over all candidates, in the planner's order;
//! - consolidation to a fixed point: multi-node, else the first single-node candidate that can go,
//!   applied and repeated until nothing can go, giving `cost after` and `nodes after`, as passes of
//!   the planner would; only up to [`FIXED_POINT_UP_TO`] nodes, as each command sets the search up
//!   again over the cluster.
//!
//! Building the cluster is not timed. Each line is `name value`; peak memory is the process's
//! high-water mark (`VmHWM`).

use std::{io, process::ExitCode};

use joist_messages::{
    labels::{INSTANCE_TYPE, ZONE},
    model::instance_type::CapacityType,
};
use joist_scheduling::{
    ExistingNode, Input,
    consolidation::{self, Candidate, Search, Settings},
    workloads,
};

use super::{CommandError, bench::peak_memory_mib};

/// The largest cluster consolidated to a fixed point: every command sets a search up over the
/// cluster again, so the stage grows with the square of the nodes (526 commands at 2,000 nodes,
/// some 2,400 at 10,000).
const FIXED_POINT_UP_TO: usize = 10_000;

/// Share of the pods deleted to fragment the cluster.
const DELETED_SHARE: f64 = 0.6;

/// Runs the benchmark on about `nodes` nodes and prints its figures, each as soon as it is known.
pub fn run(nodes: usize, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let mut line = |name: &str, value: String| -> Result<(), CommandError> {
        writeln!(out, "{name} {value}")
            .and_then(|()| out.flush())
            .map_err(CommandError::stdout)
    };
    let mut base = workloads::fragmented_cluster(nodes, DELETED_SHARE);
    let cost_before = cost(&base);
    line("nodes", base.nodes.len().to_string())?;
    let clock = super::bench::WallInstant::now;
    let settings = Settings::default();

    let candidates = ordered_candidates(&base);
    line("candidates", candidates.len().to_string())?;
    let start = clock();
    let mut search = Search::new(&base, &candidates, settings);
    let consolidatable = (0..candidates.len())
        .filter(|&c| search.consolidate(&[c]).is_ok())
        .count();
    let single_scan = start.elapsed().as_secs_f64();
    line("consolidatable alone", consolidatable.to_string())?;
    line("single-node scan", format!("{single_scan:.3} s"))?;
    let per_candidate = single_scan / candidates.len().max(1) as f64;
    line("per candidate", format!("{:.3} ms", per_candidate * 1e3))?;

    let order: Vec<usize> = (0..candidates.len()).collect();
    let start = clock();
    let multi = Search::new(&base, &candidates, settings).largest_prefix(&order);
    let multi_search = start.elapsed().as_secs_f64();
    let together = multi.map_or(0, |(count, _)| count);
    line(
        "multi-node search",
        format!(
            "{multi_search:.3} s ({together} of {} nodes at once)",
            candidates.len()
        ),
    )?;

    line("cost before", format!("${cost_before:.2}/h"))?;
    if base.nodes.len() > FIXED_POINT_UP_TO {
        line(
            "fixed point",
            format!(
                "not run: above {FIXED_POINT_UP_TO} nodes (each command sets the search up again over the whole cluster)"
            ),
        )?;
    } else {
        let start = clock();
        let commands = fixed_point(&mut base, settings);
        let fixed_point_time = start.elapsed().as_secs_f64();
        line(
            "fixed point",
            format!("{fixed_point_time:.3} s ({commands} commands)"),
        )?;
        let cost_after = cost(&base);
        let lower = 100.0 * (1.0 - cost_after / cost_before.max(f64::MIN_POSITIVE));
        line("cost after", format!("${cost_after:.2}/h ({lower:.1} % lower)"))?;
        line("nodes after", base.nodes.len().to_string())?;
    }
    let peak = peak_memory_mib().map_or_else(|| "unknown".to_owned(), |m| format!("{m} MiB"));
    line("peak memory", peak)?;
    Ok(ExitCode::SUCCESS)
}

/// What a node costs per hour: its type's cheapest on-demand offering in its zone.
fn price(input: &Input, node: &ExistingNode) -> f64 {
    let name = node.labels.get(INSTANCE_TYPE);
    let zone = node.labels.get(ZONE);
    input
        .instance_types
        .iter()
        .find(|it| Some(&it.name) == name)
        .and_then(|it| {
            it.offerings
                .iter()
                .filter(|o| o.capacity_type == CapacityType::OnDemand && Some(&o.zone) == zone)
                .map(|o| o.price)
                .min_by(f64::total_cmp)
        })
        .unwrap_or(0.0)
}

fn cost(input: &Input) -> f64 {
    input.nodes.iter().map(|n| price(input, n)).sum()
}

/// Every node as a candidate, in the planner's order (savings per pod moved, highest first).
fn ordered_candidates(input: &Input) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = input
        .nodes
        .iter()
        .enumerate()
        .map(|(position, node)| Candidate {
            node: position,
            price: price(input, node),
            capacity_type: CapacityType::OnDemand,
            pods: node.pods.clone(),
            held: None,
        })
        .collect();
    candidates.sort_by(|a, b| {
        let ratio = |c: &Candidate| c.price / (1.0 + c.pods.len() as f64);
        ratio(b).total_cmp(&ratio(a)).then(a.node.cmp(&b.node))
    });
    candidates
}

/// Consolidates until nothing can go; how many commands it took.
fn fixed_point(base: &mut Input, settings: Settings) -> usize {
    let mut commands = 0;
    loop {
        let candidates = ordered_candidates(base);
        let order: Vec<usize> = (0..candidates.len()).collect();
        // The search that chose the command also simulates it: one set-up per round.
        let chosen = {
            let mut search = Search::new(base, &candidates, settings);
            let which = match search.largest_prefix(&order) {
                Some((count, _)) => Some(order[..count].to_vec()),
                None => order
                    .iter()
                    .find(|&&c| search.consolidate(&[c]).is_ok())
                    .map(|&c| vec![c]),
            };
            which.and_then(|which| Some((search.simulate(&which).ok()?, which)))
        };
        let Some(((decision, solution), which)) = chosen else {
            return commands;
        };
        let name = format!("replacement-{commands}");
        consolidation::carry_out(base, &candidates, &which, &decision, &solution, &name);
        commands += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_prints_every_figure_and_never_raises_cost() {
        let mut out = Vec::new();
        run(20, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8(out).unwrap_or_default();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_owned()
        };
        for name in [
            "nodes",
            "candidates",
            "single-node scan",
            "per candidate",
            "multi-node search",
            "nodes after",
            "peak memory",
        ] {
            value(name);
        }
        let dollars = |name: &str| -> f64 {
            value(name)
                .trim_start_matches('$')
                .split('/')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name}: {text}"))
        };
        assert!(dollars("cost after") <= dollars("cost before"), "{text}");
    }
}

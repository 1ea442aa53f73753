//! `joist bench drift --nodes N`: an AMI roll-out over N nodes through the whole system on virtual
//! time, as `joist simulate` runs it.
//!
//! The cluster is `bench e2e --nodes N`'s: one NodePool with its default budget (`nodes: 10%`) and
//! a Deployment of N one-CPU pods, each needing a node of its own, scaled from zero at 30 s. At
//! [`RELEASE_AT`] a new `al2023` image is released: every node drifts, and the planner replaces
//! them all under the budget, each replacement launched and Initialized before its node drains.
//! The run stops [`ROLL_OUT_LIMIT`] later.
//!
//! It prints one `name value` line per figure: nodes before the release and how many of them were
//! replaced, `roll-out` (virtual time from the release to the last of them gone, `unfinished` when
//! one is left), drift decisions and decisions per hour of roll-out, the most nodes disrupting at
//! once (decided and not yet gone) beside what the budget allows at the most nodes the pool had,
//! pods pending at the end, wall time and peak memory (`VmHWM`, the whole simulated world).

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    process::ExitCode,
};

use super::{
    CommandError,
    bench::peak_memory_mib,
    bench_e2e::{self, Workload},
};
use crate::simulate::Report;

/// When the new image is released (virtual seconds), once every node is up.
const RELEASE_AT: f64 = 600.0;

/// How long after the release the run goes on: the roll-out's target, one hour.
const ROLL_OUT_LIMIT: f64 = 3600.0;

/// The NodePool's budget, in percent of its nodes (Karpenter's default).
const BUDGET_PERCENT: usize = 10;

/// Runs the benchmark and prints its figures.
pub fn run(nodes: usize, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let (simulated, wall) = bench_e2e::timed("bench drift", &scenario(nodes))?;
    let figures = Figures::of(&simulated.report);
    let roll_out = match figures.roll_out {
        Some(seconds) => format!("{seconds:.0} s"),
        None => "unfinished".to_owned(),
    };
    let per_hour = figures.roll_out.map_or(0.0, |seconds| {
        figures.decisions as f64 * 3600.0 / seconds.max(1.0)
    });
    let lines = [
        ("nodes", figures.before.to_string()),
        ("replaced", figures.replaced.to_string()),
        ("roll-out", roll_out),
        ("decisions", figures.decisions.to_string()),
        ("decisions/hour", format!("{per_hour:.0}")),
        ("most disrupting at once", figures.most_disrupting.to_string()),
        ("budget at the most nodes", figures.budget.to_string()),
        ("pending", simulated.report.summary.pods_pending_end.to_string()),
        ("wall", format!("{wall:.1} s")),
        (
            "peak memory",
            peak_memory_mib().map_or_else(|| "unknown".to_owned(), |mib| format!("{mib} MiB")),
        ),
    ];
    for (name, value) in lines {
        writeln!(out, "{name} {value}").map_err(CommandError::stdout)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The scenario: see the module docs.
pub fn scenario(nodes: usize) -> String {
    let grown = bench_e2e::scenario(Workload::Nodes(nodes), 1);
    let release = format!(
        "    - at: {RELEASE_AT:.0}s\n      releaseImage: {{family: al2023}}\n  until: {:.0}s\n",
        RELEASE_AT + ROLL_OUT_LIMIT
    );
    let (steps, _) = grown
        .rsplit_once("  until:")
        .expect("the e2e scenario ends with its `until`");
    format!("{steps}{release}").replace("name: bench-e2e", "name: bench-drift")
}

/// What the report says of the roll-out.
#[derive(Debug, PartialEq)]
struct Figures {
    /// Nodes up before the release.
    before: usize,
    /// How many of them are gone.
    replaced: usize,
    /// Seconds from the release to the last of them gone, when all are.
    roll_out: Option<f64>,
    /// Disruption decisions after the release.
    decisions: usize,
    /// The most NodeClaims decided and not yet deleted at any moment.
    most_disrupting: usize,
    /// What the budget allows at the most initialized nodes the pool had.
    budget: usize,
}

impl Figures {
    fn of(report: &Report) -> Self {
        let originals: Vec<_> = report
            .instances
            .iter()
            .filter(|i| i.launched_at_seconds < RELEASE_AT)
            .collect();
        let ends: Vec<f64> = originals.iter().filter_map(|i| i.ended_at_seconds).collect();
        let roll_out = (ends.len() == originals.len() && !ends.is_empty())
            .then(|| ends.iter().copied().fold(RELEASE_AT, f64::max) - RELEASE_AT);
        let decisions = report
            .timeline
            .iter()
            .filter(|e| e.event == "disruption-decided" && e.at_seconds >= RELEASE_AT)
            .count();
        // Each change, in time order: +1 or -1 to the nodes disrupting, and to the nodes up.
        let mut changes: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        let mut decided = BTreeSet::new();
        for entry in &report.timeline {
            let at = (entry.at_seconds * 1000.0) as i64;
            let change = changes.entry(at).or_default();
            match entry.event.as_str() {
                "disruption-decided" => {
                    decided.insert(entry.object.as_str());
                    change.0 += 1;
                }
                "disruption-rolled-back" if decided.remove(entry.object.as_str()) => change.0 -= 1,
                "nodeclaim-deleted" if decided.remove(entry.object.as_str()) => change.0 -= 1,
                "nodeclaim-initialized" => change.1 += 1,
                "nodeclaim-deleting" => change.1 -= 1,
                _ => {}
            }
        }
        let (mut disrupting, mut up) = (0_i64, 0_i64);
        let (mut most_disrupting, mut most_up) = (0_i64, 0_i64);
        for (d, u) in changes.into_values() {
            disrupting += d;
            up += u;
            most_disrupting = most_disrupting.max(disrupting);
            most_up = most_up.max(up);
        }
        let most_up = usize::try_from(most_up).unwrap_or(0);
        Figures {
            before: originals.len(),
            replaced: ends.len(),
            roll_out,
            decisions,
            most_disrupting: usize::try_from(most_disrupting).unwrap_or(0),
            budget: (most_up * BUDGET_PERCENT).div_ceil(100),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::Scenario;

    #[test]
    fn the_scenario_releases_an_image_once_the_nodes_are_up() {
        let text = scenario(3);
        let parsed = Scenario::parse(&text).expect("the scenario parses");
        assert!(text.contains("releaseImage: {family: al2023}"), "{text}");
        assert!(text.ends_with("until: 4200s\n"), "{text}");
        assert_eq!(parsed.steps.len(), 2, "the scale-up, then the release");
    }

    #[test]
    fn a_small_roll_out_replaces_every_node_within_the_budget() {
        let mut out = Vec::new();
        run(20, &mut out).expect("the benchmark runs");
        let text = String::from_utf8(out).expect("utf-8");
        let figure = |name: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_owned()
        };
        assert_eq!(figure("nodes"), "20", "{text}");
        assert_eq!(figure("replaced"), "20", "{text}");
        assert_eq!(figure("pending"), "0", "{text}");
        let roll_out: f64 = figure("roll-out")
            .trim_end_matches(" s")
            .parse()
            .unwrap_or_else(|_| panic!("the roll-out finished: {text}"));
        assert!(roll_out < 3600.0, "within the hour: {text}");
        let most: usize = figure("most disrupting at once").parse().expect("a count");
        let budget: usize = figure("budget at the most nodes").parse().expect("a count");
        assert!(most >= 2, "commands ran side by side: {text}");
        assert!(most <= budget, "never more than the budget: {text}");
    }
}

//! `joist what-if --from SNAPSHOT.yaml|--kubeconfig FILE CHANGE.yaml... [--for 30m] [-o json]`:
//! replays a cluster, taken as `kubectl get nodes,pods,nodepools,nodeclaims,ec2nodeclasses,pdb,
//! daemonsets -A -o yaml` prints it (or `joist simulate --snapshot` writes it, or read from a live
//! cluster through a client that refuses writes), on the simulator twice for the same
//! virtual time: as it is, and with the proposed manifests applied at the start (a changed
//! NodePool, EC2NodeClass or budget, a new AMI alias, a workload). It prints what the change
//! makes different: nodes at the end, launched and removed (by why), drifted nodes replaced and
//! when the last went, pods disrupted and when, pods left pending and why, and the lines `cost
//! before $X/h` (at the end without the change) and `cost after $Y/h` (with it); `--html FILE`
//! writes a page with both runs on each chart (nodes, pods pending and running, cost).
//!
//! The simulated cloud is the snapshot's region (its nodes' `topology.kubernetes.io/region`,
//! us-west-2 when none says), with the simulator's prices; its nodes are adopted as running
//! instances ([`crate::simulate::restore`]); nodes of types it does not sell there are named in a
//! note (priced at nothing, they drift in both runs). Fails, naming the file and what is wrong, when the
//! snapshot or a change cannot be read or a change is refused as the API server would refuse it.

use std::{
    collections::BTreeMap,
    fmt::{self, Write as _},
    io,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use serde::Serialize;

use super::{
    CommandError,
    explain::{Output, read_only},
    run::kube_client,
};
use joist_messages::{
    apis::duration::Duration as KarpenterDuration,
    labels::{INSTANCE_TYPE, ZONE},
};
use joist_provider_sim::catalog::Catalog;

use crate::{
    simulate::{
        self, Report, Scenario,
        chart::{Series, escape, step_chart},
        html::STYLE,
        report::{Sample, clock},
        scenario::{Action, Step},
    },
    snapshot::Snapshot,
};

/// The region of a snapshot whose nodes name none.
const DEFAULT_REGION: &str = "us-west-2";

/// What the change made different.
#[derive(Debug, Clone, Serialize)]
pub struct WhatIf {
    /// The virtual time each run covered, in seconds.
    pub seconds: f64,
    /// The manifests applied.
    pub changes: Vec<String>,
    /// The run without the change.
    pub before: Outcome,
    /// The run with it.
    pub after: Outcome,
    /// The snapshot's nodes whose instance types the simulated cloud does not sell in its region,
    /// by type: priced at nothing, and replaced as drifted in both runs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unsold: BTreeMap<String, usize>,
    /// The region simulated.
    pub region: String,
}

/// What one run came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// Nodes at the end.
    pub nodes_at_end: usize,
    /// Nodes launched.
    pub nodes_launched: usize,
    /// Nodes removed, by why.
    pub nodes_removed: BTreeMap<String, usize>,
    /// Pods terminated to move them (evicted or deleted by a drain), and when the first and the
    /// last were, in seconds from the start.
    pub pods_disrupted: usize,
    /// When the first pod was disrupted.
    pub first_disruption_seconds: Option<f64>,
    /// When the last pod was disrupted.
    pub last_disruption_seconds: Option<f64>,
    /// Pods running at the end.
    pub pods_running_end: usize,
    /// Pods pending at the end, with Joist's reason.
    pub pending: Vec<(String, String)>,
    /// Dollars per hour at the end.
    pub cost_per_hour_end: f64,
    /// Dollars spent over the run.
    pub cost_total: f64,
    /// Drifted nodes removed, and when the last went, in seconds from the start.
    pub drifted_replaced: usize,
    /// When the last drifted node went.
    pub last_drifted_seconds: Option<f64>,
    /// Nodes, pods and cost over time, for the page's charts.
    #[serde(skip)]
    pub series: Vec<Sample>,
}

impl Outcome {
    fn of(report: &Report) -> Self {
        let s = &report.summary;
        let disrupted: Vec<f64> = report
            .timeline
            .iter()
            .filter(|e| e.event == "pod-terminating")
            .map(|e| e.at_seconds)
            .collect();
        let drifted: Vec<f64> = (report.instances.iter())
            .filter(|l| l.end_reason.as_deref() == Some("drifted"))
            .filter_map(|l| l.ended_at_seconds)
            .collect();
        Self {
            nodes_at_end: s.final_nodes.len(),
            // The snapshot's nodes were adopted, not launched: the cloud's launches alone.
            nodes_launched: (report.timeline.iter())
                .filter(|e| e.event == "instance-launched")
                .count(),
            nodes_removed: s.nodes_terminated.clone(),
            pods_disrupted: disrupted.len(),
            first_disruption_seconds: disrupted.first().copied(),
            last_disruption_seconds: disrupted.last().copied(),
            pods_running_end: s.pods_running_end,
            pending: s
                .pending_pods
                .iter()
                .map(|p| (p.pod.clone(), p.reason.clone()))
                .collect(),
            cost_per_hour_end: s.cost_per_hour_end,
            cost_total: s.cost_total,
            drifted_replaced: drifted.len(),
            last_drifted_seconds: drifted.iter().copied().reduce(f64::max),
            series: report.series.clone(),
        }
    }
}

/// Where the snapshot comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A file.
    File(PathBuf),
    /// A live cluster, through this kubeconfig, read only.
    Cluster(PathBuf),
}

impl Source {
    /// The snapshot, and what to name it by in errors.
    fn snapshot(&self) -> Result<(Snapshot, PathBuf), CommandError> {
        match self {
            Source::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| CommandError::Read {
                    path: path.clone(),
                    source,
                })?;
                let snapshot = Snapshot::parse(&text).map_err(|e| CommandError::Simulate {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                Ok((snapshot, path.clone()))
            }
            Source::Cluster(kubeconfig) => {
                let named = kubeconfig.clone();
                let start = |message: String| CommandError::Start { message };
                let runtime = super::runtime()?;
                let snapshot = runtime.block_on(async {
                    let client = kube_client(Some(kubeconfig)).await.map_err(start)?;
                    Snapshot::take(&read_only::client(client))
                        .await
                        .map_err(|e| start(e.to_string()))
                })?;
                Ok((snapshot, named))
            }
        }
    }
}

/// Runs `joist what-if`.
pub fn run(
    source: &Source,
    changes: &[PathBuf],
    (duration, html): (&str, Option<&Path>),
    output: Output,
    out: &mut dyn io::Write,
) -> Result<ExitCode, CommandError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| CommandError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let failed = |path: &Path, message: String| CommandError::Simulate {
        path: path.to_path_buf(),
        message,
    };
    let (snapshot, from) = source.snapshot()?;
    let from = from.as_path();
    let mut applied = String::new();
    for change in changes {
        applied.push_str(&read(change)?);
        applied.push_str("\n---\n");
    }
    let before = scenario(&snapshot, None, duration).map_err(|e| failed(from, e))?;
    let after = scenario(&snapshot, Some(&applied), duration).map_err(|e| failed(from, e))?;
    let replay = |scenario: &Scenario| {
        simulate::run(scenario, scenario.seed, Default::default(), None)
            .map(|s| Outcome::of(&s.report))
            .map_err(|e| failed(from, e.to_string()))
    };
    let what_if = WhatIf {
        seconds: before.until.as_secs_f64(),
        changes: changes.iter().map(|c| c.display().to_string()).collect(),
        before: replay(&before)?,
        after: replay(&after)?,
        unsold: unsold(&snapshot, &before.region),
        region: before.region.clone(),
    };
    let text = match output {
        Output::Text => what_if.to_string(),
        Output::Json => {
            let json = serde_json::to_string_pretty(&what_if).map_err(|e| failed(from, e.to_string()))?;
            json + "\n"
        }
    };
    out.write_all(text.as_bytes()).map_err(CommandError::stdout)?;
    if let Some(html) = html {
        std::fs::write(html, page(&what_if)).map_err(|source| CommandError::Write {
            path: html.to_path_buf(),
            source,
        })?;
        writeln!(out, "html report: {}", html.display()).map_err(CommandError::stdout)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The page of `what_if`: the comparison, and each chart with both runs, the run without the
/// change dashed.
fn page(what_if: &WhatIf) -> String {
    let mut page = String::with_capacity(32 * 1024);
    let title = format!("Joist what-if: {}", escape(&what_if.changes.join(", ")));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n\
         <p class=\"meta\">{} of virtual time each way · written by <code>joist what-if</code></p>\n<pre>{}</pre>\n",
        clock(what_if.seconds),
        escape(&what_if.to_string()),
    );
    let (before, after) = (&what_if.before.series, &what_if.after.series);
    type Value = fn(&Sample) -> f64;
    let charts: [(&str, &str, bool, Value); 4] = [
        ("nodes", "#2563eb", true, |s| s.nodes as f64),
        ("pods-pending", "#dc2626", true, |s| s.pods_pending as f64),
        ("pods-running", "#16a34a", true, |s| s.pods_running as f64),
        ("cost", "#9333ea", false, |s| s.cost_per_hour),
    ];
    for (id, colour, counts, value) in charts {
        let _ = writeln!(page, "<h2>{}</h2>", id.replace('-', " "));
        let points = |series: &[Sample]| series.iter().map(|s| (s.at_seconds, value(s))).collect();
        let lines = [
            Series {
                label: "without the change (dashed)",
                colour,
                dashed: true,
                points: points(before),
            },
            Series {
                label: "with it",
                colour,
                dashed: false,
                points: points(after),
            },
        ];
        step_chart(&mut page, id, counts, &lines, what_if.seconds);
    }
    page.push_str("</body>\n</html>\n");
    page
}

/// The scenario replaying `snapshot` for `duration`, with `changes` (YAML documents) applied
/// at the first second when given.
fn scenario(snapshot: &Snapshot, changes: Option<&str>, duration: &str) -> Result<Scenario, String> {
    let until = duration
        .parse::<KarpenterDuration>()
        .map_err(|e| format!("--for {duration:?} is not a duration (like 30m or 1h): {e}"))?
        .as_std();
    let mut scenario = Scenario::parse(BLANK).map_err(|e| e.to_string())?;
    scenario.region = snapshot
        .of_kind("Node")
        .find_map(|n| n["metadata"]["labels"]["topology.kubernetes.io/region"].as_str())
        .unwrap_or(DEFAULT_REGION)
        .to_owned();
    scenario.until = until;
    scenario.steps = changes
        .map(|changes| Step {
            at: Duration::from_secs(1),
            action: Action::Apply(changes.to_owned()),
        })
        .into_iter()
        .collect();
    scenario.snapshot = Some(Arc::new(snapshot.clone()));
    Ok(scenario)
}

/// How many of the snapshot's nodes run each instance type the simulated cloud does not sell
/// in `region` (a KWOK cluster's, a type newer than the simulator's catalog), or not in the
/// node's zone (`TYPE in ZONE`).
fn unsold(snapshot: &Snapshot, region: &str) -> BTreeMap<String, usize> {
    let catalog = Catalog::load(region, &[]).unwrap_or_default();
    let mut unsold = BTreeMap::new();
    for node in snapshot.of_kind("Node") {
        let labels = &node["metadata"]["labels"];
        let Some(instance_type) = labels[INSTANCE_TYPE].as_str() else {
            continue;
        };
        let zone = labels[ZONE].as_str().unwrap_or_default();
        let missing = match catalog.get(instance_type) {
            None => instance_type.to_owned(),
            Some(listing) if !listing.zones.iter().any(|z| z == zone) => format!("{instance_type} in {zone}"),
            Some(_) => continue,
        };
        *unsold.entry(missing).or_default() += 1;
    }
    unsold
}

/// A scenario with nothing in it: the simulator's defaults (boot time, batch windows, no gates).
const BLANK: &str = "kind: Scenario\nmetadata: {name: what-if}\nspec:\n  seed: 1\n  cloud: {region: us-west-2}\n  manifests: ''\n  steps: []\n  until: 1s\n";

impl fmt::Display for WhatIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = (&self.before, &self.after);
        writeln!(
            f,
            "what-if over {} with {}",
            clock(self.seconds),
            self.changes.join(", ")
        )?;
        writeln!(f, "{:<26}{:>16}{:>16}", "", "without it", "with it")?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, before: String, after: String| {
            writeln!(f, "{name:<26}{before:>16}{after:>16}")
        };
        row(
            f,
            "nodes at the end",
            b.nodes_at_end.to_string(),
            a.nodes_at_end.to_string(),
        )?;
        row(
            f,
            "nodes launched",
            b.nodes_launched.to_string(),
            a.nodes_launched.to_string(),
        )?;
        let removed = |o: &Outcome| o.nodes_removed.values().sum::<usize>().to_string();
        row(f, "nodes removed", removed(b), removed(a))?;
        row(
            f,
            "pods disrupted",
            b.pods_disrupted.to_string(),
            a.pods_disrupted.to_string(),
        )?;
        row(
            f,
            "pods running at the end",
            b.pods_running_end.to_string(),
            a.pods_running_end.to_string(),
        )?;
        row(
            f,
            "pods pending at the end",
            b.pending.len().to_string(),
            a.pending.len().to_string(),
        )?;
        row(
            f,
            "$ spent",
            format!("{:.4}", b.cost_total),
            format!("{:.4}", a.cost_total),
        )?;
        for (why, count) in &a.nodes_removed {
            writeln!(f, "with it, {count} node(s) removed: {why}")?;
        }
        if let Some(last) = a.last_drifted_seconds {
            writeln!(
                f,
                "with it, {} drifted node(s) replaced, the last at {}",
                a.drifted_replaced,
                clock(last)
            )?;
        }
        if let (Some(first), Some(last)) = (a.first_disruption_seconds, a.last_disruption_seconds) {
            writeln!(
                f,
                "with it, pods disrupted from {} to {}",
                clock(first),
                clock(last)
            )?;
        }
        for (pod, why) in &a.pending {
            writeln!(f, "with it, pending at the end: {pod}: {why}")?;
        }
        writeln!(f, "cost before ${:.4}/h", b.cost_per_hour_end)?;
        writeln!(f, "cost after ${:.4}/h", a.cost_per_hour_end)?;
        if !self.unsold.is_empty() {
            let types: Vec<String> = (self.unsold.iter())
                .map(|(name, nodes)| format!("{name} ({nodes} nodes)"))
                .collect();
            writeln!(
                f,
                "note: the simulated cloud does not sell {} in {}: those nodes are priced at $0/h and replaced as drifted in both runs",
                types.join(", "),
                self.region
            )?;
        }
        Ok(())
    }
}

//! The HTML report of a run (`joist simulate --html FILE`): one self-contained page, readable
//! offline, built from the [`Report`] alone. It shows the run's figures; charts of nodes, pods
//! running and pending, and cost per hour over virtual time (inline SVG, no script and nothing
//! fetched); what each NodePool and instance type launched and cost; every launch and removal
//! with its reason; every pod still pending with Joist's reason; and the whole timeline.
//!
//! Rendering cannot fail: every text from the cluster is escaped, and an empty run draws empty
//! charts.

use std::{collections::BTreeMap, fmt::Write};

use super::{
    chart::{Series, escape, step_chart},
    report::{Launch, Report, Sample, clock},
};

/// The colours of the series, shared by the charts' lines and legends.
const NODES: &str = "#2563eb";
const RUNNING: &str = "#16a34a";
const PENDING: &str = "#dc2626";
const COST: &str = "#9333ea";

/// The pages' style sheet.
pub const STYLE: &str = "
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #1f2937; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #e5e7eb; padding-bottom: 0.2rem; }
.meta { color: #6b7280; margin-top: 0; }
.figures { display: flex; flex-wrap: wrap; gap: 0.8rem; }
.figure { border: 1px solid #e5e7eb; border-radius: 6px; padding: 0.5rem 0.9rem; min-width: 9rem; }
.figure b { display: block; font-size: 1.3rem; }
.figure span { color: #6b7280; font-size: 0.85rem; }
table { border-collapse: collapse; width: 100%; font-size: 0.9rem; }
th, td { text-align: left; padding: 0.25rem 0.6rem; border-bottom: 1px solid #f3f4f6; vertical-align: top; }
th { background: #f9fafb; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
svg { display: block; margin: 0.5rem 0 1rem; }
svg text { font: 11px system-ui, sans-serif; fill: #4b5563; }
.legend { font-size: 0.85rem; }
.legend i { display: inline-block; width: 0.8rem; height: 0.8rem; margin: 0 0.3rem 0 0.9rem; vertical-align: -0.1rem; }
.none { color: #6b7280; font-style: italic; }
";

/// The page for `report`.
pub fn render(report: &Report) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let title = format!("Joist simulation: {}", escape(&report.scenario));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n\
         <p class=\"meta\">seed {seed} · {duration} of virtual time · written by <code>joist simulate</code></p>\n",
        seed = report.seed,
        duration = clock(report.duration_seconds),
    );
    figures(&mut page, report);
    page.push_str("<h2>Over time</h2>\n");
    for one in &CHARTS {
        chart(&mut page, one, &report.series, report.duration_seconds);
    }
    let end = report.duration_seconds;
    breakdown(
        &mut page,
        "By NodePool",
        "NodePool",
        &report.instances,
        end,
        |l| l.nodepool.clone(),
    );
    breakdown(
        &mut page,
        "By instance type",
        "instance type",
        &report.instances,
        end,
        |l| format!("{} ({})", l.instance_type, l.capacity_type),
    );
    launches(&mut page, report);
    pending(&mut page, report);
    timeline(&mut page, report);
    page.push_str("</body>\n</html>\n");
    page
}

fn figures(page: &mut String, report: &Report) {
    let s = &report.summary;
    let terminated: usize = s.nodes_terminated.values().sum();
    let reasons = s
        .nodes_terminated
        .iter()
        .map(|(reason, n)| format!("{n} {reason}"))
        .collect::<Vec<_>>()
        .join(", ");
    let figures = [
        (s.nodes_launched.to_string(), "nodes launched".to_owned()),
        (terminated.to_string(), format!("terminated {reasons}")),
        (s.final_nodes.len().to_string(), "nodes at the end".to_owned()),
        (
            s.pods_running_end.to_string(),
            "pods running at the end".to_owned(),
        ),
        (
            s.pods_pending_end.to_string(),
            "pods pending at the end".to_owned(),
        ),
        (clock(s.max_pod_pending_seconds), "longest pod wait".to_owned()),
        (
            format!("${:.4}", s.cost_per_hour_end),
            "per hour at the end".to_owned(),
        ),
        (format!("${:.4}", s.cost_total), "spent over the run".to_owned()),
    ];
    page.push_str("<div class=\"figures\">\n");
    for (value, what) in figures {
        let _ = writeln!(
            page,
            "<div class=\"figure\"><b>{}</b><span>{}</span></div>",
            escape(&value),
            escape(&what)
        );
    }
    page.push_str("</div>\n");
}

/// A series on a chart: its label, its colour, and its value in a sample.
type Line = (&'static str, &'static str, fn(&Sample) -> f64);

/// What a chart draws: its id on the page, its lines, and whether they count things (so the axis
/// has whole numbers only).
struct Chart {
    id: &'static str,
    counts: bool,
    lines: &'static [Line],
}

const CHARTS: [Chart; 3] = [
    Chart {
        id: "nodes",
        counts: true,
        lines: &[("nodes", NODES, |s| s.nodes as f64)],
    },
    Chart {
        id: "pods",
        counts: true,
        lines: &[
            ("pods running", RUNNING, |s| s.pods_running as f64),
            ("pods pending", PENDING, |s| s.pods_pending as f64),
        ],
    },
    Chart {
        id: "cost",
        counts: false,
        lines: &[("cost $/h", COST, |s| s.cost_per_hour)],
    },
];

/// `chart` over `duration` seconds.
fn chart(page: &mut String, chart: &Chart, series: &[Sample], duration: f64) {
    let lines: Vec<Series> = chart
        .lines
        .iter()
        .map(|(label, colour, value)| Series {
            label,
            colour,
            dashed: false,
            points: series.iter().map(|s| (s.at_seconds, value(s))).collect(),
        })
        .collect();
    step_chart(page, chart.id, chart.counts, &lines, duration);
}

/// One row of a breakdown: launched, running at the end, $/h at the end, $ spent.
#[derive(Default)]
struct Tally {
    launched: usize,
    at_end: usize,
    per_hour_end: f64,
    spent: f64,
}

fn breakdown(
    page: &mut String,
    title: &str,
    column: &str,
    launches: &[Launch],
    end: f64,
    key: impl Fn(&Launch) -> String,
) {
    let mut rows: BTreeMap<String, Tally> = BTreeMap::new();
    for launch in launches {
        let tally = rows.entry(key(launch)).or_default();
        tally.launched += 1;
        tally.spent += launch.cost_until(end);
        if launch.ended_at_seconds.is_none() {
            tally.at_end += 1;
            tally.per_hour_end += launch.price_per_hour;
        }
    }
    let _ = writeln!(page, "<h2>{}</h2>", escape(title));
    if rows.is_empty() {
        page.push_str("<p class=\"none\">No node was launched.</p>\n");
        return;
    }
    let _ = writeln!(
        page,
        "<table><tr><th>{}</th><th class=\"n\">launched</th><th class=\"n\">at the end</th>\
         <th class=\"n\">$/h at the end</th><th class=\"n\">$ spent</th></tr>",
        escape(column)
    );
    for (name, t) in &rows {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.4}</td>\
             <td class=\"n\">{:.4}</td></tr>",
            escape(name),
            t.launched,
            t.at_end,
            t.per_hour_end,
            t.spent
        );
    }
    page.push_str("</table>\n");
}

fn launches(page: &mut String, report: &Report) {
    let launches = &report.instances;
    page.push_str("<h2>Launches and removals</h2>\n");
    if launches.is_empty() {
        page.push_str("<p class=\"none\">No node was launched.</p>\n");
        return;
    }
    page.push_str(
        "<table><tr><th>node</th><th>NodePool</th><th>instance type</th><th>capacity</th><th>zone</th>\
         <th class=\"n\">$/h</th><th class=\"n\">launched</th><th class=\"n\">ended</th><th>why it ended, or stays</th></tr>\n",
    );
    for l in launches {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.4}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            escape(&l.node),
            escape(&l.nodepool),
            escape(&l.instance_type),
            escape(&l.capacity_type),
            escape(&l.zone),
            l.price_per_hour,
            clock(l.launched_at_seconds),
            l.ended_at_seconds
                .map(clock)
                .unwrap_or_else(|| "running".to_owned()),
            escape(
                l.end_reason
                    .as_deref()
                    .or_else(|| report.stays(&l.node))
                    .unwrap_or("")
            ),
        );
    }
    page.push_str("</table>\n");
}

fn pending(page: &mut String, report: &Report) {
    page.push_str("<h2>Pods pending at the end</h2>\n");
    let pods = &report.summary.pending_pods;
    if pods.is_empty() {
        page.push_str("<p class=\"none\">Every pod was running or done.</p>\n");
        return;
    }
    page.push_str("<table><tr><th>pod</th><th>Joist's reason</th></tr>\n");
    for pod in pods {
        let reason = if pod.reason.is_empty() {
            "(Joist gave none)"
        } else {
            &pod.reason
        };
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td></tr>",
            escape(&pod.pod),
            escape(reason)
        );
    }
    page.push_str("</table>\n");
}

fn timeline(page: &mut String, report: &Report) {
    let _ = writeln!(
        page,
        "<h2>Timeline</h2>\n<details><summary>{} entries</summary>\n\
         <table><tr><th class=\"n\">at</th><th>event</th><th>object</th><th>detail</th></tr>",
        report.timeline.len()
    );
    for entry in &report.timeline {
        let _ = writeln!(
            page,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            clock(entry.at_seconds),
            escape(&entry.event),
            escape(&entry.object),
            escape(&entry.detail)
        );
    }
    page.push_str("</table></details>\n");
}

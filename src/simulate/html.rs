//! The HTML report of a run (`joist simulate --html FILE`): one self-contained page, readable
//! offline, built from the [`Report`] alone. It shows the run's figures; charts of nodes, pods
//! running and pending, and cost per hour over virtual time (inline SVG, no script and nothing
//! fetched); what each NodePool and instance type launched and cost; every launch and removal
//! with its reason; every pod still pending with Joist's reason; and the whole timeline.
//!
//! Rendering cannot fail: every text from the cluster is escaped, and an empty run draws empty
//! charts.

use std::{collections::BTreeMap, fmt::Write};

use super::report::{Launch, Report, Sample, clock};

/// The colours of the series, shared by the charts' lines and legends.
const NODES: &str = "#2563eb";
const RUNNING: &str = "#16a34a";
const PENDING: &str = "#dc2626";
const COST: &str = "#9333ea";

const STYLE: &str = "
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
    launches(&mut page, &report.instances);
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

/// The chart's size and the room its axes take.
const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;

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

/// `chart` over `duration` seconds, each line drawn as steps: a value holds until the next sample.
fn chart(page: &mut String, chart: &Chart, series: &[Sample], duration: f64) {
    let Chart { id, counts, lines } = *chart;
    let top = lines
        .iter()
        .flat_map(|(_, _, value)| series.iter().map(value))
        .fold(0.0, f64::max);
    let tick = if counts {
        nice_step(top).max(1.0)
    } else {
        nice_step(top)
    };
    let y_max = (top / tick).ceil().max(1.0) * tick;
    let duration = duration.max(1.0);
    let x = |seconds: f64| LEFT + (WIDTH - LEFT - RIGHT) * seconds / duration;
    let y = |value: f64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - value / y_max);
    let _ = write!(
        page,
        "<p class=\"legend\">{}</p>\n<svg id=\"chart-{id}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{id} over time\">\n",
        lines
            .iter()
            .map(|(label, colour, _)| format!("<i style=\"background:{colour}\"></i>{}", escape(label)))
            .collect::<String>()
    );
    let mut value = 0.0;
    while value <= y_max + tick / 2.0 {
        let _ = writeln!(
            page,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e7eb\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(value) + 4.0,
            axis_number(value, tick),
            y = y(value),
        );
        value += tick;
    }
    let time_tick = nice_step(duration / 60.0).max(0.5) * 60.0;
    let mut seconds = 0.0;
    while seconds <= duration + 0.5 {
        let _ = writeln!(
            page,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(seconds),
            HEIGHT - 6.0,
            clock(seconds)
        );
        seconds += time_tick;
    }
    for (label, colour, value) in lines {
        let mut path = String::new();
        for (i, sample) in series.iter().enumerate() {
            let (px, py) = (x(sample.at_seconds), y(value(sample)));
            if i == 0 {
                let _ = write!(path, "M{px:.1} {py:.1}");
            } else {
                let _ = write!(path, "H{px:.1}V{py:.1}");
            }
        }
        if !series.is_empty() {
            let _ = write!(path, "H{:.1}", x(duration));
        }
        let _ = writeln!(
            page,
            "<path d=\"{path}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"><title>{}</title></path>",
            escape(label)
        );
    }
    page.push_str("</svg>\n");
}

/// A round step (1, 2 or 5 times a power of ten) that divides `top` into at most five parts.
fn nice_step(top: f64) -> f64 {
    if top <= 0.0 {
        return 1.0;
    }
    let rough = top / 5.0;
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}

fn axis_number(value: f64, tick: f64) -> String {
    if tick >= 1.0 {
        format!("{value:.0}")
    } else {
        let places = (-tick.log10().floor()) as usize;
        format!("{value:.places$}")
    }
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

fn launches(page: &mut String, launches: &[Launch]) {
    page.push_str("<h2>Launches and removals</h2>\n");
    if launches.is_empty() {
        page.push_str("<p class=\"none\">No node was launched.</p>\n");
        return;
    }
    page.push_str(
        "<table><tr><th>node</th><th>NodePool</th><th>instance type</th><th>capacity</th><th>zone</th>\
         <th class=\"n\">$/h</th><th class=\"n\">launched</th><th class=\"n\">ended</th><th>why it ended</th></tr>\n",
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
            escape(l.end_reason.as_deref().unwrap_or("")),
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

/// `text` safe inside HTML elements and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_steps_are_round_numbers_that_cover_the_top() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(4.0), 1.0);
        assert_eq!(nice_step(30.0), 10.0);
        assert_eq!(nice_step(1.53), 0.5);
        assert_eq!(nice_step(100_000.0), 20_000.0);
    }

    #[test]
    fn cluster_text_cannot_break_out_of_the_page() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }
}

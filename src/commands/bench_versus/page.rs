//! The HTML page of `joist bench versus-karpenter --html FILE`: per workload, a table of both
//! controllers' figures and one chart with both timelines (nodes and pending pods; Karpenter
//! dashed, Joist solid). Self-contained, readable offline; rendering cannot fail.

use std::fmt::Write as _;

use super::Run;
use crate::simulate::{
    chart::{Series, escape, step_chart},
    html::STYLE,
};

/// Line colours: nodes and pending pods.
const NODES: &str = "#2563eb";
const PENDING: &str = "#dc2626";

/// The page for every workload's two runs (Karpenter's first).
pub fn render(results: &[(&str, Vec<Run>)]) -> String {
    let mut page = String::with_capacity(32 * 1024);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Joist and Karpenter side by side</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>Joist and Karpenter side by side</h1>\n<p class=\"meta\">Karpenter's performance suite on \
         the local control plane with KWOK, one controller at a time; written by \
         <code>joist bench versus-karpenter</code></p>\n"
    );
    for (workload, runs) in results {
        let _ = writeln!(page, "<h2>{}</h2>", escape(workload));
        table(&mut page, runs);
        let duration = runs
            .iter()
            .filter_map(|run| run.samples.last())
            .map(|s| s.at)
            .fold(0.0, f64::max);
        let labels: Vec<(String, String)> = runs
            .iter()
            .map(|run| {
                let name = run.contender.name();
                let style = if run.contender == super::Contender::Karpenter {
                    " (dashed)"
                } else {
                    ""
                };
                (
                    format!("{name} nodes{style}"),
                    format!("{name} pending pods{style}"),
                )
            })
            .collect();
        let mut lines = Vec::new();
        for (run, (nodes, pending)) in runs.iter().zip(&labels) {
            let dashed = run.contender == super::Contender::Karpenter;
            let points = |value: fn(&super::Sample) -> usize| {
                run.samples.iter().map(|s| (s.at, value(s) as f64)).collect()
            };
            lines.push(Series {
                label: nodes,
                colour: NODES,
                dashed,
                points: points(|s| s.nodes),
            });
            lines.push(Series {
                label: pending,
                colour: PENDING,
                dashed,
                points: points(|s| s.pending),
            });
        }
        step_chart(&mut page, workload, true, &lines, duration);
    }
    page.push_str("</body>\n</html>\n");
    page
}

/// Each controller's figures, a row per phase.
fn table(page: &mut String, runs: &[Run]) {
    page.push_str(
        "<table><tr><th>controller</th><th>phase</th><th class=\"n\">seconds</th>\
         <th class=\"n\">nodes</th><th class=\"n\">$/h</th></tr>\n",
    );
    for run in runs {
        for (i, phase) in run.phases.iter().enumerate() {
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{} {}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{:.4}</td></tr>",
                run.contender.name(),
                i + 1,
                phase.phase.name(),
                phase.seconds,
                phase.nodes,
                phase.cost
            );
        }
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td colspan=\"4\">peak memory {} · cpu {} · pods evicted {}</td></tr>",
            run.contender.name(),
            super::known(run.memory, " MiB"),
            super::known(run.cpu.map(|c| format!("{c:.1}")), " s"),
            run.evicted
        );
    }
    page.push_str("</table>\n");
}

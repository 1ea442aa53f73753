//! The cloud-fault and runaway cases of `joist bench chaos`: each runs the chaos world
//! (`examples/chaos.yaml`'s cloud and manifests) with steps that inject one fault, measures what
//! Joist did while it lasted, and audits what was left once it cleared.
//!
//! | case | fault | pass |
//! |---|---|---|
//! | `throttle-storm` | every EC2 call throttled for 10 minutes while the workload grows and a spot node is interrupted | EC2 calls stay under [`STORM_PEAK`] per second in any 10 s |
//! | `capacity-outage` | every offering out of capacity for 10 minutes | no pod runs, under [`OUTAGE_LAUNCHES`] launch attempts |
//! | `launch-hangs` | launches start instances but never reply, 4 minutes | the claim is deleted at its launch timeout and the instance collected |
//! | `reply-lost` | launches start instances and reply with an error, 2 minutes | each claim keeps its first instance |
//! | `never-registers` | instances launched in 20 minutes never register a Node | claims deleted at the registration timeout; one launch per claim the pods need, per timeout; the NodePool turns `NodeRegistrationHealthy=False` |
//! | `never-ready` | Nodes launched in 20 minutes never turn Ready | claims deleted at the initialization timeout; one launch per claim the pods need, per timeout |
//! | `tainted-after-launch` | every Node that turns Ready is tainted `NoExecute` for 10 minutes | under [`TAINT_NODES`] nodes at once |
//! | `watch-drops` | every watch of Joist's ends every 20 s for 10 minutes while the workload grows, a spot node is interrupted and the workload shrinks | watches were dropped |
//! | `history-gone` | as `watch-drops`, and every resume is refused `410 Gone`, so each drop is a relist | watches were refused and relisted |
//! | `write-conflicts` | every update, patch and delete of Joist's refused `409 Conflict` for 5 minutes while the workload grows and a spot node is interrupted | writes were refused, under [`CONFLICT_RATE`] a second |
//! | `write-replies-lost` | every write of Joist's applied but answered `504` for 3 minutes while the workload grows | a NodeClaim created while replies are lost, and at most [`LOST_REPLY_CLAIMS`] |
//! | `slow-apiserver` | every request of Joist's answered 2 s late for 10 minutes while the workload grows and a spot node is interrupted | requests were delayed; the mailboxes' overflows are counted |
//!
//! Every case must also end with no leaked instance, no claim launched twice, every pod Running
//! and the controllers' view of every Pod, Node and NodeClaim equal to the cluster's.

use joist_actors::effects::faults::FaultPoints;
use joist_provider_sim::Operation;

use super::{
    CommandError,
    bench_chaos::{self, Totals, failed},
};
use crate::simulate::{self, Scenario, Simulated, audit::Audit, report::Report};

/// The most EC2 calls per second, in any 10 s of a throttling storm.
pub const STORM_PEAK: f64 = 2.0;
/// The most launch attempts while every offering is out of capacity for 10 minutes.
pub const OUTAGE_LAUNCHES: usize = 15;
/// The most nodes at once while every Node is tainted after launch.
pub const TAINT_NODES: usize = 8;

/// The most writes refused a second while every update conflicts: a retry waits, it does not spin.
pub const CONFLICT_RATE: f64 = 2.0;
/// The most NodeClaims created while write replies are lost: the growth to 30 pods needs one (as
/// the same run without the fault shows); a create made again after its reply was lost makes two.
pub const LOST_REPLY_CLAIMS: usize = 1;

/// One case.
struct Case {
    name: &'static str,
    /// Steps after the workload grows to 12 pods at 30 s ([`GROW`]), as YAML list items.
    steps: &'static str,
    /// Whether [`CHURN`]'s steps follow.
    churn: bool,
    until: &'static str,
    judge: fn(&Simulated, &Audit) -> Verdict,
}

/// What a case measured, and why it failed if it did.
struct Verdict {
    measure: String,
    problem: Option<String>,
}

impl Verdict {
    fn pass_if(measure: String, ok: bool, problem: impl FnOnce() -> String) -> Self {
        Self {
            measure,
            problem: (!ok).then(problem),
        }
    }
}

/// The step every case starts from: the workload grows to 12 pods at 30 s.
const GROW: &str = "{at: 30s, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 12}}";

/// Steps the Kubernetes-fault cases share after their fault: the workload grows, a spot node is
/// interrupted, the workload shrinks (so objects are created, changed and deleted while it lasts).
const CHURN: &str = "{at: 3m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 30}},
                 {at: 5m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}},
                 {at: 8m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 8}}";

const CASES: [Case; 12] = [
    Case {
        name: "throttle-storm",
        steps: "{at: 3m, failCloud: {operation: ec2, for: 10m}},
                 {at: 4m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 30}},
                 {at: 5m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}}",
        churn: false,
        until: "30m",
        judge: throttle_storm,
    },
    Case {
        name: "capacity-outage",
        steps: "{at: 0s, unavailable: {for: 10m}}",
        churn: false,
        until: "25m",
        judge: capacity_outage,
    },
    Case {
        name: "launch-hangs",
        steps: "{at: 0s, failCloud: {operation: create, failure: hang, for: 4m}}",
        churn: false,
        until: "20m",
        judge: launch_hangs,
    },
    Case {
        name: "reply-lost",
        steps: "{at: 0s, failCloud: {operation: create, failure: loseReply, for: 2m}}",
        churn: false,
        until: "15m",
        judge: reply_lost,
    },
    Case {
        name: "never-registers",
        steps: "{at: 0s, bootFault: {never: register, for: 20m}}",
        churn: false,
        until: "50m",
        judge: never_registers,
    },
    Case {
        name: "never-ready",
        steps: "{at: 0s, bootFault: {never: ready, for: 20m}}",
        churn: false,
        until: "50m",
        judge: never_ready,
    },
    Case {
        name: "tainted-after-launch",
        steps: "{at: 0s, taintNodes: {key: chaos.joist.dev/quarantine, effect: NoExecute, for: 10m}}",
        churn: false,
        until: "30m",
        judge: tainted_after_launch,
    },
    Case {
        name: "watch-drops",
        steps: "{at: 2m, failKube: {failure: dropWatches, for: 10m}}",
        churn: true,
        until: "30m",
        judge: watch_drops,
    },
    Case {
        name: "history-gone",
        steps: "{at: 2m, failKube: {failure: gone, for: 10m}}",
        churn: true,
        until: "30m",
        judge: history_gone,
    },
    Case {
        name: "write-conflicts",
        steps: "{at: 2m, failKube: {failure: conflict, for: 5m}}",
        churn: true,
        until: "30m",
        judge: write_conflicts,
    },
    Case {
        name: "write-replies-lost",
        steps: "{at: 2m, failKube: {failure: loseReply, for: 3m}},
                 {at: 2m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 30}}",
        churn: false,
        until: "30m",
        judge: write_replies_lost,
    },
    Case {
        name: "slow-apiserver",
        steps: "{at: 2m, failKube: {failure: slow, delay: 2s, for: 10m}}",
        churn: true,
        until: "30m",
        judge: slow_apiserver,
    },
];

/// Runs every case in `world`, adding them to `totals` and handing each printed line to `print`.
pub fn run(
    world: &Scenario,
    totals: &mut Totals,
    print: &mut dyn FnMut(String) -> Result<(), CommandError>,
) -> Result<(), CommandError> {
    print(format!(
        "{:<22} {:>6} {:>10} {:>8} {:>6}  measure",
        "case", "leaks", "duplicates", "stranded", "missed"
    ))?;
    for case in &CASES {
        let churn = if case.churn {
            format!(", {CHURN}")
        } else {
            String::new()
        };
        let steps = format!("[{GROW}, {}{churn}]", case.steps);
        let scenario = world
            .with_steps(case.name, &steps, case.until)
            .map_err(|e| failed(format!("{}: {e}", case.name)))?;
        let (simulated, audit) = simulate::run_crashing(&scenario, scenario.seed, FaultPoints::none())
            .map_err(|e| failed(format!("{}: {e}", case.name)))?;
        let verdict = (case.judge)(&simulated, &audit);
        totals.cases += 1;
        totals.add(&audit);
        print(format!(
            "{:<22} {:>6} {:>10} {:>8} {:>6}  {}",
            case.name,
            audit.leaks.len(),
            audit.duplicates.len(),
            audit.stranded.len() + audit.tainted.len(),
            audit.stale.len(),
            verdict.measure
        ))?;
        for line in bench_chaos::details(&audit) {
            print(format!("  {line}"))?;
        }
        if let Some(problem) = verdict.problem {
            totals.failed_cases += 1;
            print(format!("  FAILED: {problem}"))?;
        }
    }
    print(format!("cases {} failed {}", totals.cases, totals.failed_cases))?;
    Ok(())
}

/// Timeline entries of `event` whose detail starts with `detail_starts`.
fn timeline_count(report: &Report, event: &str, detail_starts: &str) -> usize {
    report
        .timeline
        .iter()
        .filter(|e| e.event == event && e.detail.starts_with(detail_starts))
        .count()
}

/// Instances launched in `[from, to)` seconds.
fn launches(report: &Report, from: f64, to: f64) -> usize {
    report
        .instances
        .iter()
        .filter(|i| i.launched_at_seconds >= from && i.launched_at_seconds < to)
        .count()
}

/// The most nodes at once in `[from, to)` seconds.
fn max_nodes(report: &Report, from: f64, to: f64) -> usize {
    report
        .series
        .iter()
        .filter(|s| s.at_seconds >= from && s.at_seconds < to)
        .map(|s| s.nodes)
        .max()
        .unwrap_or(0)
}

fn throttle_storm(simulated: &Simulated, _: &Audit) -> Verdict {
    // The cloud's call log holds its EC2 calls (the interruption queue keeps no log).
    let (from, to) = (180.0, 780.0);
    let calls = simulated.calls.between(from, to).count();
    let rate = simulated.calls.rate(from, to);
    let peak = simulated.calls.peak_rate(from, to, 10.0);
    let measure = format!("{calls} EC2 calls in the 600 s storm ({rate:.2}/s), peak {peak:.1}/s over 10 s");
    Verdict::pass_if(measure, peak <= STORM_PEAK, || {
        format!("{peak:.1} calls/s is above {STORM_PEAK}")
    })
}

fn capacity_outage(simulated: &Simulated, _: &Audit) -> Verdict {
    let report = &simulated.report;
    let attempts = simulated
        .calls
        .between(0.0, 600.0)
        .filter(|c| c.operation == Operation::Create)
        .count();
    let ran = report
        .series
        .iter()
        .filter(|s| s.at_seconds < 600.0)
        .map(|s| s.pods_running)
        .max()
        .unwrap_or(0);
    let measure = format!("{attempts} launch attempts in the 10 min outage; {ran} pods ran during it");
    Verdict::pass_if(measure, attempts <= OUTAGE_LAUNCHES && ran == 0, || {
        format!("more than {OUTAGE_LAUNCHES} attempts, or a pod ran on capacity that did not exist")
    })
}

fn launch_hangs(simulated: &Simulated, _: &Audit) -> Verdict {
    let report = &simulated.report;
    let timeouts = timeline_count(report, "warning", "LaunchTimeout");
    let hung: Vec<Option<f64>> = report
        .instances
        .iter()
        .filter(|i| i.launched_at_seconds < 240.0)
        .map(|i| i.ended_at_seconds)
        .collect();
    let collected = hung.iter().all(Option::is_some);
    let ends: Vec<String> = hung
        .iter()
        .map(|end| end.map_or_else(|| "still running".to_owned(), |end| format!("ended at {end:.0}s")))
        .collect();
    let measure = format!(
        "{timeouts} claims deleted at their launch timeout; instances of hung launches: {}",
        ends.join(", ")
    );
    Verdict::pass_if(measure, timeouts >= 1 && collected && !hung.is_empty(), || {
        "a hung launch was not timed out, or its instance was not collected".to_owned()
    })
}

fn reply_lost(simulated: &Simulated, _: &Audit) -> Verdict {
    let report = &simulated.report;
    let claims = timeline_count(report, "nodeclaim-launched", "");
    let lost = simulated
        .calls
        .between(0.0, 120.0)
        .filter(|c| c.operation == Operation::Create && c.failed)
        .count();
    let measure = format!(
        "{lost} launch replies lost; {} instances for {claims} launched claims",
        report.instances.len()
    );
    Verdict::pass_if(measure, lost >= 1 && report.instances.len() == claims, || {
        "a claim whose reply was lost launched again".to_owned()
    })
}

/// As [`timed_out`], and the NodePool says its nodes do not register: `NodeRegistrationHealthy`
/// turns False.
fn never_registers(simulated: &Simulated, _: &Audit) -> Verdict {
    let mut verdict = timed_out(simulated, "RegistrationTimeout");
    let unhealthy =
        simulated.report.timeline.iter().find(|e| {
            e.event == "nodepool-condition" && e.detail.starts_with("NodeRegistrationHealthy=False")
        });
    match unhealthy {
        Some(e) => {
            let at = format!(
                "; {} NodeRegistrationHealthy=False at {:.0}s",
                e.object, e.at_seconds
            );
            verdict.measure.push_str(&at);
        }
        None => {
            verdict
                .problem
                .get_or_insert_with(|| "no NodePool turned NodeRegistrationHealthy=False".to_owned());
        }
    }
    verdict
}

fn never_ready(simulated: &Simulated, _: &Audit) -> Verdict {
    timed_out(simulated, "InitializationTimeout")
}

/// A 20-minute boot fault whose claims end at the 15-minute timeout `reason`: one launch per
/// claim the pods need, and one more for each timeout that passes inside the fault.
fn timed_out(simulated: &Simulated, reason: &str) -> Verdict {
    let report = &simulated.report;
    let timeouts = timeline_count(report, "warning", reason);
    let broken = launches(report, 0.0, 1200.0);
    let needed = launches(report, 1200.0, f64::MAX).max(1);
    let most = max_nodes(report, 0.0, 1200.0);
    let measure = format!(
        "{broken} launches in the 20 min fault, at most {most} nodes, {timeouts} ended by {reason}; {needed} after"
    );
    Verdict::pass_if(measure, timeouts >= 1 && broken <= 2 * needed, || {
        format!("launched more than once per claim per {reason}")
    })
}

fn tainted_after_launch(simulated: &Simulated, _: &Audit) -> Verdict {
    let report = &simulated.report;
    let launched = launches(report, 0.0, 600.0);
    let most = max_nodes(report, 0.0, 900.0);
    let measure = format!("{launched} launches in the 10 min fault, at most {most} nodes at once");
    Verdict::pass_if(measure, most <= TAINT_NODES, || {
        format!("{most} nodes at once is above {TAINT_NODES}: a runaway")
    })
}

fn watch_drops(simulated: &Simulated, audit: &Audit) -> Verdict {
    let counts = simulated.api_faults;
    let measure = format!(
        "{} watch drops in 10 min; {} objects seen differently at the end",
        counts.watch_drops,
        audit.stale.len()
    );
    Verdict::pass_if(measure, counts.watch_drops > 1, || {
        "no watch was dropped".to_owned()
    })
}

fn history_gone(simulated: &Simulated, audit: &Audit) -> Verdict {
    let counts = simulated.api_faults;
    let measure = format!(
        "{} watch drops, {} resumes refused 410 and relisted; {} objects seen differently at the end",
        counts.watch_drops,
        counts.gone,
        audit.stale.len()
    );
    Verdict::pass_if(measure, counts.gone > 1, || "no watch was refused 410".to_owned())
}

fn write_conflicts(simulated: &Simulated, _: &Audit) -> Verdict {
    let conflicts = simulated.api_faults.conflicts;
    let rate = conflicts as f64 / 300.0;
    let measure = format!("{conflicts} writes refused 409 in the 5 min fault ({rate:.2}/s)");
    Verdict::pass_if(measure, conflicts > 0 && rate <= CONFLICT_RATE, || {
        format!("{rate:.2} refused writes/s: a write retried without waiting (bound {CONFLICT_RATE})")
    })
}

fn write_replies_lost(simulated: &Simulated, _: &Audit) -> Verdict {
    let lost = simulated.api_faults.lost_replies;
    let claims = simulated
        .report
        .timeline
        .iter()
        .filter(|e| e.event == "nodeclaim-created" && (120.0..300.0).contains(&e.at_seconds))
        .count();
    let measure = format!("{lost} write replies lost; {claims} NodeClaims created meanwhile");
    Verdict::pass_if(
        measure,
        lost > 0 && (1..=LOST_REPLY_CLAIMS).contains(&claims),
        || format!("{claims} NodeClaims created while replies were lost (expected 1 to {LOST_REPLY_CLAIMS})"),
    )
}

fn slow_apiserver(simulated: &Simulated, _: &Audit) -> Verdict {
    let delayed = simulated.api_faults.delayed;
    let full = super::metric_total(&simulated.metrics, "joist_mailbox_full_total");
    let measure = format!(
        "{delayed} requests answered 2 s late; {full} sends found a mailbox full (joist_mailbox_full_total)"
    );
    Verdict::pass_if(measure, delayed > 0, || "no request was delayed".to_owned())
}

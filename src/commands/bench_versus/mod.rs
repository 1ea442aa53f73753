//! `joist bench versus-karpenter [--workload NAME] [--scale F] [--quiet S] [--html FILE]
//! [--keep DIR]`: Joist and Karpenter run side by side on the same workloads, the same control
//! plane and the same instance types.
//!
//! For each workload of Karpenter's performance suite ([`workloads`]): a fresh local control
//! plane, Karpenter v1.14.1's KWOK controller on it, the workload; then a fresh control plane,
//! `joist run` with the KWOK cloud, the same workload ([`peers`]). Both controllers read the one
//! catalog, Karpenter's KWOK `instance_types.json`, and get the suite's NodePool (each its own node
//! class); with either, an instance's Node appears 5 s after its launch (Joist's KWOK cloud's boot,
//! and the KWOKNodeClass's `nodeRegistrationDelay`). Each step applies its Deployments with server-side apply and waits ([`observe`] looks
//! once a second): a scale-out until every pod is Running; a scale-down until every pod is Running
//! and no node has been disrupted for three minutes (the suite's quiet period; `--quiet SECONDS`
//! for shorter runs), the phase ending
//! when the last disruption did; a drift (the suite's: 30 s after the scale-out, an annotation
//! added to the NodePool's template) until every node that existed before is gone and every pod
//! Running. A phase that does not end within 50 minutes (the suite's longest bound; `--deadline
//! MINUTES`) is reported unfinished with its figures at the deadline, and that controller's later
//! steps are not run; a controller that exits stops the benchmark with its log, which is then
//! kept.
//!
//! Printed, per workload and controller: each phase's seconds, nodes and cost per hour at its end;
//! the controller's peak resident memory and CPU seconds over the workload (`/proc`), and pods
//! ever evicted through the Eviction API. Then, per workload,
//! each scale-out's floor, the seconds the control plane itself takes to run its pods on nodes
//! created up front ([`floor`]: two copies of each of Karpenter's nodes at its largest scale-out),
//! and
//! `ratio WORKLOAD time T memory M cpu C cost K`: Joist's figure divided by Karpenter's, where time
//! is the sum of the phases less their floor (that measured one for a scale-out; the NodePool's
//! 30 s `consolidateAfter` for a consolidation, which neither controller may cut), and cost the
//! cost per hour at the end, both over the steps both controllers ran; when one did not finish
//! its last, the time is a bound (`<=T` when Karpenter did not, `>=T` when Joist did not) and the
//! line ends saying who did not finish which step.
//! `--html FILE` writes a page with both timelines (nodes and pending pods) on one chart per
//! workload. `--keep DIR` keeps each run's directory (`WORKLOAD-CONTROLLER`: the controller's log,
//! the control plane's logs) in `DIR`, which must be empty, and has both controllers log at
//! `info` (Karpenter's default) rather than `error`, which costs each some CPU; without it the
//! directories are removed after a run that succeeds.

mod floor;
mod observe;
mod page;
mod peers;
mod workloads;

use std::{
    io,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

use self::{
    observe::{Observer, Prices, Sample},
    peers::{Contender, ControlPlane},
    workloads::{Phase, Step, Workload},
};
use super::{
    CommandError,
    bench::{cpu_seconds_of, peak_memory_mib_of},
    bench_controller::{BenchError, apply, client, failed_to},
};

pub use workloads::NAMES as WORKLOADS;

/// How many minutes a phase may take: the suite's longest bound (its drift's total under 50
/// minutes).
pub const SUITE_DEADLINE_MINUTES: u64 = 50;
/// How long no node may be disrupted before a consolidation counts as done: the suite's.
pub const SUITE_QUIET_SECONDS: u64 = 180;
/// The suite's wait between the scale-out and the drift.
const BEFORE_DRIFT: Duration = Duration::from_secs(30);
/// The NodePool's `consolidateAfter`, the floor of every consolidation phase.
const CONSOLIDATE_AFTER: f64 = 30.0;
/// How long the controller has to make the NodePool Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);
/// How often the cluster is looked at.
const TICK: Duration = Duration::from_secs(1);

/// What was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// One workload, else all.
    pub workload: Option<String>,
    /// Times the suite's replica counts.
    pub scale: f64,
    /// Seconds without a disruption that end a consolidation phase.
    pub quiet: u64,
    /// Minutes a phase may take before it is reported unfinished.
    pub deadline: u64,
    /// Where to write the HTML page.
    pub html: Option<PathBuf>,
    /// Where to keep every run's logs, which are otherwise removed after a run that succeeds.
    pub keep: Option<PathBuf>,
}

/// One phase's result.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    /// Which phase.
    pub phase: Phase,
    /// Seconds from the step to its end.
    pub seconds: f64,
    /// Nodes at its end.
    pub nodes: usize,
    /// Cost per hour at its end.
    pub cost: f64,
    /// Whether it ended before the deadline (when not, `seconds` is the deadline's and the
    /// figures are the cluster's then).
    pub finished: bool,
}

/// One controller's run of one workload.
#[derive(Debug, Clone)]
pub struct Run {
    /// Who ran it.
    pub contender: Contender,
    /// Each step's result.
    pub phases: Vec<PhaseResult>,
    /// Peak resident memory, MiB.
    pub memory: Option<u64>,
    /// CPU seconds over the workload.
    pub cpu: Option<f64>,
    /// Pods evicted through the Eviction API.
    pub evicted: usize,
    /// The timeline.
    pub samples: Vec<Sample>,
    /// Its nodes at the end of its largest scale-out.
    pub peak_nodes: Vec<Node>,
}

impl Run {
    /// The first `steps` phases' seconds less their `floors`.
    fn time_above_floor(&self, steps: usize, floors: &[f64]) -> f64 {
        self.phases
            .iter()
            .take(steps)
            .zip(floors)
            .map(|(phase, floor)| (phase.seconds - floor).max(0.0))
            .sum()
    }

    /// The step it did not finish (numbered from 1), if any: its last.
    fn unfinished_step(&self) -> Option<usize> {
        self.phases.iter().position(|p| !p.finished).map(|i| i + 1)
    }
}

/// Runs the benchmark and prints its figures.
pub fn run(options: &Options, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let start = |e: BenchError| CommandError::Start {
        message: e.to_string(),
    };
    if !(options.scale > 0.0 && options.scale <= 1.0) {
        return Err(CommandError::Start {
            message: format!("--scale {}: must be above 0 and at most 1", options.scale),
        });
    }
    let chosen: Vec<Workload> = workloads::all(options.scale)
        .into_iter()
        .filter(|w| options.workload.as_deref().is_none_or(|name| name == w.name))
        .collect();
    if chosen.is_empty() {
        return Err(CommandError::Start {
            message: format!(
                "--workload {}: no such workload (one of {})",
                options.workload.as_deref().unwrap_or_default(),
                WORKLOADS.join(", ")
            ),
        });
    }
    let dir = match &options.keep {
        Some(dir) => kept(dir)?,
        None => std::env::temp_dir().join(format!("joist-bench-versus-{}", std::process::id())),
    };
    let joist = std::env::current_exe().map_err(|source| CommandError::Read {
        path: "this executable (/proc/self/exe)".into(),
        source,
    })?;
    let scripts = peers::scripts().map_err(start)?;
    let catalog = peers::karpenter_catalog(&scripts).map_err(start)?;
    let prices = Arc::new(Prices::read(&catalog).map_err(start)?);
    let runtime = super::runtime()?;
    // Each run's own directory, named after the workload and who runs it.
    let setup = |workload: &str, who: &str| Setup {
        scripts: &scripts,
        catalog: &catalog,
        joist: &joist,
        dir: dir.join(format!("{workload}-{who}")),
        prices: prices.clone(),
        quiet: options.quiet as f64,
        deadline: Duration::from_secs(options.deadline * 60),
        // Logs kept to be read say what each controller did (at the cost of writing them).
        log_level: if options.keep.is_some() { "info" } else { "error" },
    };
    let mut results = Vec::new();
    for workload in &chosen {
        let mut runs = Vec::new();
        for contender in [Contender::Karpenter, Contender::Joist] {
            let run = runtime
                .block_on(one(workload, contender, &setup(workload.name, contender.name())))
                .map_err(start)?;
            print_run(workload.name, &run, out).map_err(CommandError::stdout)?;
            runs.push(run);
        }
        // Karpenter's nodes, the reference, made up front.
        let nodes = floor::up_front(&runs[0].peak_nodes);
        let floors = runtime
            .block_on(floor::measure(workload, &nodes, &setup(workload.name, "floor")))
            .map_err(start)?;
        print_floors(workload, &floors, out).map_err(CommandError::stdout)?;
        print_ratio(workload.name, &runs[0], &runs[1], &floors, out).map_err(CommandError::stdout)?;
        results.push((workload.name, runs));
    }
    // Kept on failure, for the logs, and when asked.
    if options.keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(path) = &options.html {
        std::fs::write(path, page::render(&results)).map_err(|source| CommandError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `dir`, for `--keep`: created when missing; one with anything in it is refused, as the runs'
/// directories would mix with what is there.
fn kept(dir: &Path) -> Result<PathBuf, CommandError> {
    let refused = |why: String| CommandError::Start {
        message: format!("--keep {}: {why}", dir.display()),
    };
    std::fs::create_dir_all(dir).map_err(|e| refused(format!("cannot be created: {e}")))?;
    let mut entries = std::fs::read_dir(dir).map_err(|e| refused(format!("cannot be read: {e}")))?;
    if entries.next().is_some() {
        return Err(refused("is not empty".to_owned()));
    }
    Ok(dir.to_path_buf())
}

/// What every run shares.
struct Setup<'a> {
    scripts: &'a Path,
    catalog: &'a Path,
    joist: &'a Path,
    dir: PathBuf,
    prices: Arc<Prices>,
    quiet: f64,
    /// How long a phase may take.
    deadline: Duration,
    /// The controllers' `LOG_LEVEL`.
    log_level: &'static str,
}

/// `contender` runs `workload` on a fresh control plane.
async fn one(workload: &Workload, contender: Contender, setup: &Setup<'_>) -> Result<Run, BenchError> {
    let cluster = ControlPlane::up(setup.scripts, &setup.dir.join("cluster"))?;
    let log = setup.dir.join(format!("{}.log", contender.name()));
    let mut controller = peers::start(
        contender,
        setup.scripts,
        &cluster,
        setup.catalog,
        setup.joist,
        &log,
        setup.log_level,
    )
    .await?;
    let client = client(&cluster.kubeconfig).await?;
    let stopped = |what: String| BenchError::Controller {
        what,
        log: log.clone(),
    };
    apply(&client, &peers::node_pool(contender)).await?;
    let node_pools = node_pools(&client);
    let ready = poll(READY_WITHIN, TICK, async || {
        Ok(pool_ready(&node_pools).await? || controller.ended())
    })
    .await?;
    if !ready || controller.ended() {
        return Err(stopped(format!(
            "{} did not make the NodePool Ready within {}s",
            contender.name(),
            READY_WITHIN.as_secs()
        )));
    }
    let pid = controller.pid();
    let cpu_before = cpu_seconds_of(&pid);
    let mut observer = Observer::new(&client, setup.prices.clone());
    let began = tokio::time::Instant::now();
    let mut phases = Vec::new();
    let mut peak_nodes = Vec::new();
    for step in &workload.steps {
        if step.phase == Phase::Drift {
            let until = began.elapsed() + BEFORE_DRIFT;
            while began.elapsed() < until {
                observer.sample(began.elapsed().as_secs_f64()).await?;
                tokio::time::sleep(TICK).await;
            }
        }
        let started = began.elapsed().as_secs_f64();
        observer.sample(started).await?;
        let manifests: Vec<String> = step.apps.iter().map(|app| app.manifest().to_string()).collect();
        apply(&client, &manifests.join("\n---\n")).await?;
        if step.phase == Phase::Drift {
            let now = jiff::Timestamp::now().as_second();
            let trigger = json!({"spec": {"template": {"metadata": {"annotations": {
                "test-drift-trigger": format!("drift-{now}")}}}}});
            node_pools
                .patch("default", &PatchParams::default(), &Patch::Merge(&trigger))
                .await
                .map_err(failed_to("annotating the NodePool's template to drift it"))?;
        }
        let limits = (setup.quiet, setup.deadline);
        let waited = wait(step, &mut observer, (&began, started), limits, &mut || {
            controller.ended()
        })
        .await?;
        let (ended, finished) = match waited {
            Waited::Ended(at) => (at, true),
            Waited::PastDeadline(at) => (at, false),
            Waited::ControllerExited => {
                return Err(stopped(format!(
                    "{} exited during step {} ({})",
                    contender.name(),
                    phases.len() + 1,
                    step.phase.name()
                )));
            }
        };
        if step.phase == Phase::ScaleOut && observer.nodes_now.len() > peak_nodes.len() {
            peak_nodes = observer.nodes_now.clone();
        }
        let last = observer.samples.last().cloned().unwrap_or_default();
        phases.push(PhaseResult {
            phase: step.phase,
            seconds: ended - started,
            nodes: last.nodes,
            cost: last.cost,
            finished,
        });
        // What a later step measures would start from a cluster the workload never reached.
        if !finished {
            break;
        }
    }
    let cpu = cpu_seconds_of(&pid)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    Ok(Run {
        contender,
        phases,
        memory: peak_memory_mib_of(&pid),
        cpu,
        evicted: observer.evicted(),
        samples: std::mem::take(&mut observer.samples),
        peak_nodes,
    })
}

/// How a step's wait ended, in seconds since the workload began.
enum Waited {
    /// The step ended then.
    Ended(f64),
    /// The deadline passed then, the step unfinished.
    PastDeadline(f64),
    /// The controller's process exited.
    ControllerExited,
}

/// Waits for `step`, started `started` seconds after `began`, to end (a consolidation after
/// `quiet` seconds without a disruption), for `deadline` to pass, or for `ended` (the
/// controller's process) to say so.
async fn wait(
    step: &Step,
    observer: &mut Observer,
    (began, started): (&tokio::time::Instant, f64),
    (quiet, deadline): (f64, Duration),
    ended: &mut dyn FnMut() -> bool,
) -> Result<Waited, BenchError> {
    let before = observer.names();
    let pods = step.pods as usize;
    // For a scale-down: when the pods were all Running, and when a node was last seen disrupted.
    let (mut settled, mut last_disruption) = (None::<f64>, started);
    loop {
        let at = began.elapsed().as_secs_f64();
        if ended() {
            return Ok(Waited::ControllerExited);
        }
        let sample = observer.sample(at).await?;
        if at - started > deadline.as_secs_f64() {
            return Ok(Waited::PastDeadline(at));
        }
        let running = sample.running == pods;
        match step.phase {
            Phase::ScaleOut if running => return Ok(Waited::Ended(at)),
            Phase::ScaleDown => {
                if sample.disrupting > 0 {
                    last_disruption = at;
                }
                if running && settled.is_none() {
                    settled = Some(at);
                }
                if let Some(settled) = settled
                    && at - settled.max(last_disruption) >= quiet
                {
                    return Ok(Waited::Ended(settled.max(last_disruption)));
                }
            }
            Phase::Drift if running && sample.disrupting == 0 && observer.names().is_disjoint(&before) => {
                return Ok(Waited::Ended(at));
            }
            _ => {}
        }
        tokio::time::sleep(TICK).await;
    }
}

/// The NodePools, as dynamic objects (the same for either controller's CRDs).
fn node_pools(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Whether the NodePool `default` is Ready.
async fn pool_ready(node_pools: &Api<DynamicObject>) -> Result<bool, BenchError> {
    let pool = node_pools
        .get_opt("default")
        .await
        .map_err(failed_to("reading the NodePool default"))?;
    Ok(pool.is_some_and(|pool| {
        pool.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    }))
}

/// Asks `check` every `tick` until it says yes (`true`) or `within` has passed (`false`); an
/// error of `check` ends the wait with it.
async fn poll(
    within: Duration,
    tick: Duration,
    mut check: impl AsyncFnMut() -> Result<bool, BenchError>,
) -> Result<bool, BenchError> {
    let by = tokio::time::Instant::now() + within;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() > by {
            return Ok(false);
        }
        tokio::time::sleep(tick).await;
    }
}

/// A figure that may be unknown (no `/proc`).
fn known<T: std::fmt::Display>(value: Option<T>, unit: &str) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| format!("{v}{unit}"))
}

/// One controller's lines for one workload.
fn print_run(workload: &str, run: &Run, out: &mut dyn io::Write) -> io::Result<()> {
    let who = format!("{workload} {}", run.contender.name());
    for (i, phase) in run.phases.iter().enumerate() {
        let step = format!("{who} step {} {}", i + 1, phase.phase.name());
        writeln!(out, "{step} seconds {:.1}", phase.seconds)?;
        if !phase.finished {
            writeln!(out, "{step} unfinished at the deadline")?;
        }
        writeln!(out, "{step} nodes {}", phase.nodes)?;
        writeln!(out, "{step} cost {:.4} $/h", phase.cost)?;
    }
    writeln!(out, "{who} peak memory {}", known(run.memory, " MiB"))?;
    writeln!(
        out,
        "{who} cpu {}",
        known(run.cpu.map(|c| format!("{c:.1}")), " s")
    )?;
    writeln!(out, "{who} evicted {}", run.evicted)
}

/// The floor of each step of `workload` that has one measured: its scale-outs.
fn print_floors(workload: &Workload, floors: &[f64], out: &mut dyn io::Write) -> io::Result<()> {
    for (i, (step, floor)) in workload.steps.iter().zip(floors).enumerate() {
        if step.phase == Phase::ScaleOut {
            let phase = step.phase.name();
            writeln!(
                out,
                "{} floor step {} {phase} seconds {floor:.1}",
                workload.name,
                i + 1
            )?;
        }
    }
    Ok(())
}

/// `ratio WORKLOAD time T memory M cpu C cost K`: Joist's figures over Karpenter's, over the
/// steps both ran, times less each step's floor; then `unfinished CONTROLLER step N` for a
/// controller that did not finish its last step.
fn print_ratio(
    workload: &str,
    karpenter: &Run,
    joist: &Run,
    floors: &[f64],
    out: &mut dyn io::Write,
) -> io::Result<()> {
    write!(out, "{}", ratio_line(workload, karpenter, joist, floors))?;
    for run in [karpenter, joist] {
        if let Some(step) = run.unfinished_step() {
            write!(out, " unfinished {} step {step}", run.contender.name())?;
        }
    }
    writeln!(out)
}

/// The ratio line's figures. The time is a bound when a controller did not finish the last
/// step both ran: at most (`<=`) when Karpenter did not, as its time would only have grown; at
/// least (`>=`) when Joist did not; unknown when neither did. Cost is each one's at the end of
/// that step.
fn ratio_line(workload: &str, karpenter: &Run, joist: &Run, floors: &[f64]) -> String {
    let ratio = |ours: Option<f64>, theirs: Option<f64>| match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs > 0.0 => format!("{:.2}", ours / theirs),
        _ => "unknown".to_owned(),
    };
    let steps = karpenter.phases.len().min(joist.phases.len());
    let cut_short = |run: &Run| run.unfinished_step() == Some(steps);
    let bound = match (cut_short(karpenter), cut_short(joist)) {
        (true, true) => None,
        (true, false) => Some("<="),
        (false, true) => Some(">="),
        (false, false) => Some(""),
    };
    let time = bound.map_or_else(
        || "unknown".to_owned(),
        |bound| {
            let times = ratio(
                Some(joist.time_above_floor(steps, floors)),
                Some(karpenter.time_above_floor(steps, floors)),
            );
            format!("{bound}{times}")
        },
    );
    let memory = |run: &Run| run.memory.map(|m| m as f64);
    let cost = |run: &Run| steps.checked_sub(1).map(|last| run.phases[last].cost);
    format!(
        "ratio {workload} time {time} memory {} cpu {} cost {}",
        ratio(memory(joist), memory(karpenter)),
        ratio(joist.cpu, karpenter.cpu),
        ratio(cost(joist), cost(karpenter)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `phases`, each (seconds, cost, finished).
    fn run(contender: Contender, phases: &[(f64, f64, bool)]) -> Run {
        Run {
            contender,
            phases: phases
                .iter()
                .map(|&(seconds, cost, finished)| PhaseResult {
                    phase: Phase::ScaleOut,
                    seconds,
                    nodes: 1,
                    cost,
                    finished,
                })
                .collect(),
            memory: Some(100),
            cpu: Some(10.0),
            evicted: 0,
            samples: Vec::new(),
            peak_nodes: Vec::new(),
        }
    }

    fn line(karpenter: &[(f64, f64, bool)], joist: &[(f64, f64, bool)]) -> String {
        let mut out = Vec::new();
        let (karpenter, joist) = (run(Contender::Karpenter, karpenter), run(Contender::Joist, joist));
        print_ratio("w", &karpenter, &joist, &[10.0, 30.0], &mut out).expect("written");
        String::from_utf8(out).expect("text")
    }

    #[test]
    fn both_finished_give_plain_ratios_over_the_floors() {
        let printed = line(
            &[(50.0, 4.0, true), (130.0, 2.0, true)],
            &[(30.0, 4.0, true), (50.0, 1.0, true)],
        );
        // (20 + 20) / (40 + 100).
        assert_eq!(printed, "ratio w time 0.29 memory 1.00 cpu 1.00 cost 0.50\n");
    }

    #[test]
    fn karpenter_cut_short_bounds_the_time_from_above() {
        let printed = line(
            &[(50.0, 4.0, true), (3000.0, 3.0, false)],
            &[(30.0, 4.0, true), (50.0, 1.0, true)],
        );
        assert_eq!(
            printed,
            "ratio w time <=0.01 memory 1.00 cpu 1.00 cost 0.33 unfinished karpenter step 2\n"
        );
    }

    #[test]
    fn joist_cut_short_compares_only_the_steps_both_ran() {
        let printed = line(&[(50.0, 4.0, true), (130.0, 2.0, true)], &[(3000.0, 8.0, false)]);
        // 2990 / 40, cost at the end of step 1.
        assert_eq!(
            printed,
            "ratio w time >=74.75 memory 1.00 cpu 1.00 cost 2.00 unfinished joist step 1\n"
        );
    }

    #[test]
    fn both_cut_short_leave_the_time_unknown() {
        let printed = line(&[(3000.0, 4.0, false)], &[(3000.0, 2.0, false)]);
        assert!(printed.starts_with("ratio w time unknown memory"), "{printed}");
    }
}

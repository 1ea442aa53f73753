//! `joist bench chaos [--soak]`: the crash suite. For every fault point ([`Step::ALL`]) it runs the
//! chaos scenario (`examples/chaos.yaml`, built in) on virtual time, crashes Joist's controllers the
//! first time they reach that point (with `--soak`, also the second and third time), starts new
//! ones from the cluster and the cloud alone 10 s later, and audits what the run left: instances no
//! NodeClaim accounts for (leaks, past the garbage collector's period), NodeClaims launched twice
//! (duplicates), pods not Running (stranded), Nodes still tainted `karpenter.sh/disrupted`, and
//! Pods, Nodes and NodeClaims the controllers' view holds differently from the cluster (missed).
//!
//! Then it runs the cloud-fault and runaway cases ([`chaos_cases`]) in the same world.
//!
//! It prints a row per crash and per case and ends with `steps N crashes N leaks N duplicates N
//! stranded N` (stranded counts pods and tainted nodes; every count covers crashes and cases); the
//! exit code is 1 when any of the last three is not zero, when an object was missed, when a case
//! missed its bound, or when a step was never reached (the suite would then prove nothing about
//! it).

use std::{io, process::ExitCode};

use joist_actors::effects::faults::{FaultPoints, Step};

use super::{CommandError, chaos_cases};
use crate::simulate::{self, Scenario, audit::Audit};

/// The scenario every crash runs in.
pub const SCENARIO: &str = include_str!("../../examples/chaos.yaml");

/// How many times a step is reached before the crash, with `--soak`.
const SOAK_REACHES: u32 = 3;

/// The counts of one suite.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Fault points tried.
    pub steps: usize,
    /// Runs whose crash happened.
    pub crashes: usize,
    /// Instances leaked.
    pub leaks: usize,
    /// NodeClaims launched more than once.
    pub duplicates: usize,
    /// Pods not Running and Nodes left tainted at the end.
    pub stranded: usize,
    /// Objects the controllers' view held differently from the cluster at the end.
    pub missed: usize,
    /// Armed crashes whose step was never reached.
    pub unreached: usize,
    /// Fault cases run.
    pub cases: usize,
    /// Fault cases that missed their bound.
    pub failed_cases: usize,
}

impl Totals {
    /// Adds what one run left behind.
    pub(super) fn add(&mut self, audit: &Audit) {
        self.leaks += audit.leaks.len();
        self.duplicates += audit.duplicates.len();
        self.stranded += audit.stranded.len() + audit.tainted.len();
        self.missed += audit.stale.len();
    }

    /// All zeros where zeros are the pass.
    pub fn passed(&self) -> bool {
        self.leaks == 0
            && self.duplicates == 0
            && self.stranded == 0
            && self.missed == 0
            && self.unreached == 0
            && self.failed_cases == 0
    }
}

/// Runs the suite, printing a row per crash and the totals.
pub fn run(soak: bool, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let totals = suite(soak, &mut |line| {
        writeln!(out, "{line}").map_err(CommandError::stdout)
    })?;
    Ok(if totals.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the suite, handing each printed line to `print`; the totals.
pub fn suite(
    soak: bool,
    print: &mut dyn FnMut(String) -> Result<(), CommandError>,
) -> Result<Totals, CommandError> {
    let scenario = Scenario::parse(SCENARIO).map_err(|e| failed(e.to_string()))?;
    let reaches = if soak { SOAK_REACHES } else { 1 };
    print(row([
        "step",
        "nth",
        "crash at",
        "leaks",
        "duplicates",
        "stranded",
        "tainted",
        "missed",
    ]
    .map(String::from)))?;
    let mut totals = Totals::default();
    for step in Step::ALL {
        totals.steps += 1;
        for nth in 1..=reaches {
            let (_, audit) =
                simulate::run_crashing(&scenario, scenario.seed, FaultPoints::crash_at(step, nth))
                    .map_err(|e| failed(format!("crash at {step} #{nth}: {e}")))?;
            let crash_at = audit
                .crash
                .as_ref()
                .map_or_else(|| "never".to_owned(), |c| format!("{:.0}s", c.at));
            match &audit.crash {
                Some(_) => totals.crashes += 1,
                // A later reach may simply not exist; the first must.
                None if nth == 1 => totals.unreached += 1,
                None => {}
            }
            totals.add(&audit);
            print(row([
                step.name().to_owned(),
                nth.to_string(),
                crash_at,
                audit.leaks.len().to_string(),
                audit.duplicates.len().to_string(),
                audit.stranded.len().to_string(),
                audit.tainted.len().to_string(),
                audit.stale.len().to_string(),
            ]))?;
            for line in details(&audit) {
                print(format!("  {line}"))?;
            }
        }
    }
    if totals.unreached > 0 {
        print(format!("unreached {}", totals.unreached))?;
    }
    print(String::new())?;
    chaos_cases::run(&scenario, &mut totals, print)?;
    print(format!(
        "steps {} crashes {} leaks {} duplicates {} stranded {}",
        totals.steps, totals.crashes, totals.leaks, totals.duplicates, totals.stranded
    ))?;
    Ok(totals)
}

/// The suite's error: `message` says what failed.
pub(super) fn failed(message: String) -> CommandError {
    CommandError::Simulate {
        path: "bench chaos".into(),
        message,
    }
}

/// One line of the table: the step left-aligned, the figures right-aligned under their headings.
fn row(cells: [String; 8]) -> String {
    let [step, nth, crash_at, leaks, duplicates, stranded, tainted, missed] = cells;
    format!(
        "{step:<24} {nth:>5} {crash_at:>9} {leaks:>6} {duplicates:>10} {stranded:>8} {tainted:>7} {missed:>6}"
    )
}

/// What each non-zero column stands for.
pub(super) fn details(audit: &Audit) -> Vec<String> {
    [
        ("leaked", &audit.leaks),
        ("launched twice", &audit.duplicates),
        ("not running", &audit.stranded),
        ("still tainted", &audit.tainted),
        ("missed by the controllers' view", &audit.stale),
    ]
    .into_iter()
    .filter(|(_, items)| !items.is_empty())
    .map(|(what, items)| format!("{what}: {}", items.join(" ")))
    .collect()
}

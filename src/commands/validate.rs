//! `joist validate`: offline checks of manifests against the Karpenter v1 contract.
//!
//! `-` reads standard input, so `kubectl get nodepools -o yaml | joist validate -` checks a live
//! cluster's objects.
//!
//! Output: one line per problem, `FILE: Kind/name: field: reason` (or `FILE: Kind/name: message`
//! for pre-v1 kinds), then a summary line. Exit code 1 when anything is wrong, 0 otherwise.

use std::{
    io,
    path::{Path, PathBuf},
    process::ExitCode,
};

use joist_messages::apis::manifest::{Checker, Outcome};

use super::CommandError;

/// Expands directories into their `*.yaml` / `*.yml` files, sorted by name.
fn manifest_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CommandError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|source| CommandError::Read {
                path: path.clone(),
                source,
            })?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// The text of `path`, or of standard input for `-`.
fn read_input(path: &Path) -> io::Result<String> {
    if path == Path::new("-") {
        io::read_to_string(io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
}

#[derive(Default)]
struct Tally {
    valid: usize,
    with_problems: usize,
    skipped: usize,
    unreadable: usize,
}

pub(super) fn run(paths: &[PathBuf], out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let files = manifest_files(paths)?;
    let mut tally = Tally::default();
    // Generating the CRD schemas is the costly part: do it once for all files.
    let mut checker = Checker::new();
    for file in &files {
        let text = match read_input(file) {
            Ok(text) => text,
            Err(e) => {
                writeln!(out, "{}: cannot read: {e}", file.display()).map_err(CommandError::stdout)?;
                tally.unreadable += 1;
                continue;
            }
        };
        check_file(&mut checker, file, &text, out, &mut tally).map_err(CommandError::stdout)?;
    }
    writeln!(
        out,
        "{} file(s): {} valid, {} with problems, {} not Karpenter kinds (skipped){}",
        files.len(),
        tally.valid,
        tally.with_problems,
        tally.skipped,
        if tally.unreadable > 0 {
            format!(", {} unreadable file(s)", tally.unreadable)
        } else {
            String::new()
        }
    )
    .map_err(CommandError::stdout)?;
    Ok(if tally.with_problems == 0 && tally.unreadable == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Whether `text` is a scenario file (`kind: Scenario`, no `apiVersion`) rather than manifests.
fn is_scenario(text: &str) -> bool {
    serde_saphyr::from_str::<serde_json::Value>(text)
        .is_ok_and(|v| v["kind"] == "Scenario" && v.get("apiVersion").is_none())
}

fn check_file(
    checker: &mut Checker,
    file: &Path,
    text: &str,
    out: &mut dyn io::Write,
    tally: &mut Tally,
) -> io::Result<()> {
    let file = file.display();
    if is_scenario(text) {
        // A `joist simulate` scenario: its own fields and the manifests it applies.
        match crate::simulate::check(text) {
            Ok(_) => tally.valid += 1,
            Err(e) => {
                tally.with_problems += 1;
                writeln!(out, "{file}: scenario: {e}")?;
            }
        }
        return Ok(());
    }
    let documents = match checker.read(text) {
        Ok(documents) => documents,
        Err(e) => {
            tally.unreadable += 1;
            return writeln!(out, "{file}: {e}");
        }
    };
    for document in documents {
        let object = document.object_ref();
        match document.outcome {
            Outcome::Valid(_) => tally.valid += 1,
            Outcome::NotKarpenter => tally.skipped += 1,
            Outcome::Legacy(message) => {
                tally.with_problems += 1;
                writeln!(out, "{file}: {object}: {message}")?;
            }
            Outcome::Invalid(violations) => {
                tally.with_problems += 1;
                for v in violations {
                    writeln!(out, "{file}: {object}: {v}")?;
                }
            }
        }
    }
    Ok(())
}

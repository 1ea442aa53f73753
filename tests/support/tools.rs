//! The external tools the tests drive, installed on first use by the project's own scripts
//! (`scripts/kube-clients`, `scripts/prometheus`), each of which prints `NAME=/abs/path` lines.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// The repository's root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command` (`what` names it in failures) and returns its output, failing the test when it
/// cannot start or exits unsuccessfully (with its standard error).
pub fn succeeded(command: &mut Command, what: &str) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `scripts/<script>` and returns the paths it printed, by name.
pub fn installed(script: &str) -> BTreeMap<String, PathBuf> {
    let output = succeeded(
        &mut Command::new(root().join("scripts").join(script)),
        &format!("scripts/{script}"),
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, path)| (name.to_owned(), PathBuf::from(path)))
        .collect()
}

/// The path `scripts/<script>` printed for `name`.
pub fn path(paths: &BTreeMap<String, PathBuf>, script: &str, name: &str) -> PathBuf {
    paths
        .get(name)
        .cloned()
        .unwrap_or_else(|| panic!("scripts/{script} printed no {name}=: {paths:?}"))
}

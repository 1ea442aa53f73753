//! Joist beside Karpenter: `joist bench versus-karpenter` runs the suite's basic workload, at a
//! tenth of its pods (100, then 70) and with a 20 s quiet period, with Karpenter v1.14.1's KWOK
//! controller (built by `scripts/karpenter-kwok`) on one fresh control plane, `joist run` on
//! another, and the same pods on Karpenter's nodes created up front on a third (the floor).

use std::process::Command;

use super::tools::root;

/// The figure on the line `name VALUE…` of `printed`.
fn figure(printed: &str, name: &str) -> f64 {
    printed
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no figure `{name}` in:\n{printed}"))
}

#[test]
fn karpenter_and_joist_run_the_same_workload_on_the_real_control_plane_and_both_are_measured() {
    let html = std::env::temp_dir().join(format!("joist-versus-{}.html", std::process::id()));
    let logs = std::env::temp_dir().join(format!("joist-versus-{}-logs", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args([
            "bench",
            "versus-karpenter",
            "--workload",
            "basic",
            "--scale",
            "0.1",
        ])
        .args(["--quiet", "20", "--html"])
        .arg(&html)
        .arg("--keep")
        .arg(&logs)
        .current_dir(root())
        .output()
        .expect("run joist bench versus-karpenter");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "versus-karpenter failed:\n{printed}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for controller in ["karpenter", "joist"] {
        // Each controller's log, kept when asked, says what it did.
        let log = logs.join(format!("basic-{controller}/{controller}.log"));
        let kept = std::fs::metadata(&log).map_or(0, |m| m.len());
        assert!(kept > 0, "{}: {kept} bytes", log.display());
        let step = |n: usize, phase: &str, what: &str| {
            figure(&printed, &format!("basic {controller} step {n} {phase} {what}"))
        };
        // Every pod of the scale-out ran (the benchmark waits for it), on nodes of the catalog.
        assert!(step(1, "scale-out", "nodes") >= 1.0, "{controller}:\n{printed}");
        assert!(step(1, "scale-out", "cost") > 0.0, "{controller}:\n{printed}");
        // With 30 % of the pods gone, consolidation leaves the cluster no dearer.
        assert!(
            step(2, "consolidation", "cost") <= step(1, "scale-out", "cost"),
            "{controller}:\n{printed}"
        );
        assert!(figure(&printed, &format!("basic {controller} peak memory")) > 0.0);
        // No controller runs the pods faster than nodes that were there before them.
        assert!(
            figure(&printed, "basic floor step 1 scale-out seconds") < step(1, "scale-out", "seconds"),
            "{controller}:\n{printed}"
        );
    }
    let ratio = printed
        .lines()
        .find_map(|line| line.strip_prefix("ratio basic "))
        .unwrap_or_else(|| panic!("no ratio line:\n{printed}"));
    let words: Vec<&str> = ratio.split_whitespace().collect();
    assert_eq!(
        words.iter().step_by(2).copied().collect::<Vec<_>>(),
        ["time", "memory", "cpu", "cost"],
        "{ratio}"
    );
    for value in words.iter().skip(1).step_by(2) {
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{ratio}"));
        assert!(value > 0.0, "{ratio}");
    }
    let _ = std::fs::remove_dir_all(&logs);
    let page = std::fs::read_to_string(&html).expect("the HTML page");
    let _ = std::fs::remove_file(&html);
    for line in [
        "karpenter nodes",
        "joist nodes",
        "karpenter pending pods",
        "joist pending pods",
    ] {
        assert!(page.contains(line), "the page has no line `{line}`");
    }
}

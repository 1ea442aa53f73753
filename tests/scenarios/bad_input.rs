//! Bad input, end to end through the binary: a malformed scenario file, kubeconfig, environment
//! setting or benchmark directory each stops Joist with exactly one line on standard error that
//! names what is wrong (the file, the field, the variable or the flag) and a non-zero exit code.

use std::{path::PathBuf, process::Command};

/// A scratch directory of this test process.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("joist-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    dir
}

/// A file in the scratch directory holding `text`.
fn file(name: &str, text: &str) -> String {
    let path = scratch().join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path.display().to_string()
}

const SCENARIO: &str =
    "kind: Scenario\nmetadata: {name: t}\nspec:\n  cloud: {region: us-west-2}\n  until: 5m\n";

/// The settings `joist run` needs, for the cloud that needs no credentials.
const RUN_ENV: [(&str, &str); 3] = [
    ("CLUSTER_NAME", "bad-input"),
    ("CLUSTER_ENDPOINT", "https://127.0.0.1:1"),
    ("CLOUD_PROVIDER", "simulated"),
];

/// Runs joist with `args` and only `env` (and a home of its own); its exit code and standard error.
fn joist(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(args)
        .env_clear()
        .env("HOME", scratch())
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist: {e}"));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Variables set for a run.
type Env = Vec<(&'static str, String)>;

/// A case: its name, joist's arguments, its environment, and what its one line must say.
type Case<'a> = (&'a str, Vec<&'a str>, Env, Vec<&'a str>);

#[test]
fn each_bad_input_gets_one_line_naming_what_is_wrong() {
    let not_yaml = file("not-yaml.yaml", "kind: [\n");
    let misspelt = file("misspelt.yaml", &SCENARIO.replace("until", "untill"));
    let bad_step = file(
        "bad-step.yaml",
        &format!("{SCENARIO}  steps:\n    - {{at: 1m, failKube: {{failure: explode, for: 1m}}}}\n"),
    );
    let bad_pool = file(
        "bad-pool.yaml",
        &format!(
            "{SCENARIO}  manifests: |\n    apiVersion: karpenter.sh/v1\n    kind: NodePool\n    metadata: {{name: p}}\n    spec:\n      weight: 1000\n      template: {{spec: {{nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: d}}, requirements: []}}}}\n"
        ),
    );
    let misplaced_field = file(
        "misplaced-field.yaml",
        &format!(
            "{SCENARIO}  manifests: |\n    apiVersion: apps/v1\n    kind: Deployment\n    metadata: {{name: web, namespace: default}}\n    spec:\n      selector: {{matchLabels: {{app: web}}}}\n      template:\n        annotations: {{team: web}}\n        metadata: {{labels: {{app: web}}}}\n        spec: {{containers: [{{name: web, image: nginx}}]}}\n"
        ),
    );
    let kubeconfig = file("kubeconfig", "apiVersion: v1\nclusters: [oops\n");
    let missing = scratch().join("missing.yaml").display().to_string();
    let bad_kubeconfig = format!("KUBECONFIG={kubeconfig}");
    // A directory with a file in it, which `--keep` refuses before building or starting anything.
    let not_empty = scratch().display().to_string();
    let run_with = |extra: (&'static str, String)| {
        let mut env: Vec<(&str, String)> = RUN_ENV.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        env.retain(|(k, _)| *k != extra.0);
        env.push(extra);
        env
    };
    let cases: Vec<Case> = vec![
        (
            "scenario not YAML",
            vec!["simulate", &not_yaml],
            vec![],
            vec!["not-yaml.yaml", "line 1, column 7"],
        ),
        (
            "misspelt scenario field",
            vec!["simulate", &misspelt],
            vec![],
            vec!["misspelt.yaml", "unknown field `untill`"],
        ),
        (
            "bad step value",
            vec!["simulate", &bad_step],
            vec![],
            vec!["spec.steps[0].failKube.failure", "explode"],
        ),
        (
            "invalid NodePool in a scenario",
            vec!["simulate", &bad_pool],
            vec![],
            vec!["spec.manifests", "NodePool/p", "spec.weight"],
        ),
        (
            "a field in the wrong place in a scenario's Deployment",
            vec!["simulate", &misplaced_field],
            vec![],
            vec![
                "spec.manifests",
                "web",
                ".spec.template.annotations: field not declared in schema",
            ],
        ),
        (
            "missing scenario",
            vec!["simulate", &missing],
            vec![],
            vec!["missing.yaml", "No such file"],
        ),
        (
            "malformed kubeconfig",
            vec!["run"],
            run_with(("KUBECONFIG", kubeconfig.clone())),
            vec![&bad_kubeconfig, "line 2 column 11"],
        ),
        (
            "missing kubeconfig",
            vec!["run"],
            run_with(("KUBECONFIG", missing.clone())),
            vec!["KUBECONFIG=", "No such file"],
        ),
        (
            "bad duration",
            vec!["run"],
            run_with(("BATCH_IDLE_DURATION", "abc".to_owned())),
            vec!["BATCH_IDLE_DURATION=\"abc\"", "Go duration"],
        ),
        (
            "bad port",
            vec!["run"],
            run_with(("METRICS_PORT", "70000".to_owned())),
            vec!["METRICS_PORT", "70000"],
        ),
        (
            "bad feature gate",
            vec!["run"],
            run_with(("FEATURE_GATES", "Bogus".to_owned())),
            vec!["FEATURE_GATES"],
        ),
        (
            "versus-karpenter keeping its logs where something is",
            vec!["bench", "versus-karpenter", "--keep", &not_empty],
            vec![],
            vec!["--keep", &not_empty, "is not empty"],
        ),
        (
            "no cluster name",
            vec!["run"],
            run_with(("CLUSTER_NAME", String::new())),
            vec!["CLUSTER_NAME is not set"],
        ),
    ];
    let mut wrong = Vec::new();
    for (case, args, env, expected) in &cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, stderr) = joist(args, &env);
        let lines: Vec<&str> = stderr.lines().collect();
        let named = expected.iter().all(|e| stderr.contains(e));
        if code == 0 || lines.len() != 1 || !lines[0].starts_with("joist: ") || !named {
            wrong.push(format!(
                "{case}: exit {code}, expected {expected:?} on one line, got:\n{stderr}"
            ));
        }
    }
    std::fs::remove_dir_all(scratch()).unwrap_or_else(|e| panic!("{e}"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

//! The controller's IAM policy (`deploy/iam/controller-policy.json`) against the code: every AWS
//! operation the AWS provider calls (found in its source, named as the SDK crates name them) is
//! allowed by a statement, no statement allows an action the code does not need, and every statement
//! that changes EC2 or IAM resources is scoped to what this cluster's Joist launched or created.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The SDK crates the AWS provider calls, and the IAM service prefix of each.
const SERVICES: [(&str, &str); 6] = [
    ("aws-sdk-ec2", "ec2"),
    ("aws-sdk-eks", "eks"),
    ("aws-sdk-iam", "iam"),
    ("aws-sdk-ssm", "ssm"),
    ("aws-sdk-pricing", "pricing"),
    ("aws-sdk-sqs", "sqs"),
];

/// Actions IAM checks besides the one called: CreateFleet launches through RunInstances and tags
/// what it creates; a launch template created with tags is tagged through CreateTags; launching
/// with an instance profile passes its role; an instance profile created with tags is tagged
/// through TagInstanceProfile.
const IMPLIED: [(&str, &str); 5] = [
    ("ec2:CreateFleet", "ec2:RunInstances"),
    ("ec2:CreateFleet", "ec2:CreateTags"),
    ("ec2:CreateFleet", "iam:PassRole"),
    ("ec2:CreateLaunchTemplate", "ec2:CreateTags"),
    ("iam:CreateInstanceProfile", "iam:TagInstanceProfile"),
];

/// Each SDK crate's source directory, from `cargo metadata` (offline: the lock file pins them, and
/// the build fetched them; only this host's packages, as the build fetched no other platform's).
fn sdk_sources() -> BTreeMap<&'static str, PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = crate::tools::succeeded(Command::new(rustc).arg("-vV"), "rustc -vV");
    let version = String::from_utf8_lossy(&version.stdout);
    let host = version
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .unwrap_or_else(|| panic!("rustc -vV names no host: {version}"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = crate::tools::succeeded(
        Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--offline", "--locked"])
            .args(["--filter-platform", host])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
        "cargo metadata",
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    SERVICES
        .iter()
        .map(|(krate, service)| {
            let manifest = metadata["packages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == *krate)
                .and_then(|p| p["manifest_path"].as_str())
                .unwrap_or_else(|| panic!("{krate} is not a dependency"));
            let dir = Path::new(manifest)
                .parent()
                .unwrap_or_else(|| panic!("{manifest}"));
            (*service, dir.join("src/operation"))
        })
        .collect()
}

/// `describe_instance_type_offerings` → `DescribeInstanceTypeOfferings`.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The IAM actions the AWS provider's code calls: each `.operation()` of an SDK client in its
/// non-test source.
fn called_actions() -> BTreeSet<String> {
    let mut operations: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (service, dir) in sdk_sources() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            if path.is_dir()
                && let Some(name) = path.file_name().and_then(|n| n.to_str())
            {
                operations.entry(name.to_owned()).or_default().push(service);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("providers/aws/src");
    let mut actions = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{e}")) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (operation, services) in &operations {
            if code.contains(&format!(".{operation}()")) {
                assert_eq!(
                    services.len(),
                    1,
                    "{}: .{operation}() could be any of {services:?}",
                    path.display()
                );
                actions.insert(format!("{}:{}", services[0], pascal(operation)));
            }
        }
    }
    actions
}

fn policy() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/iam/controller-policy.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A statement's actions (one string or a list).
fn actions_of(statement: &Value) -> Vec<String> {
    match &statement["Action"] {
        Value::String(action) => vec![action.clone()],
        Value::Array(actions) => actions
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        other => panic!("Action is {other}"),
    }
}

#[test]
fn the_iam_policy_allows_exactly_the_calls_the_code_makes() {
    let called = called_actions();
    assert!(
        called.contains("ec2:CreateFleet") && called.contains("sqs:ReceiveMessage"),
        "the scan finds the provider's calls: {called:?}"
    );
    let mut needed = called.clone();
    for (call, implied) in IMPLIED {
        if called.contains(call) {
            needed.insert(implied.to_owned());
        }
    }
    let policy = policy();
    let statements = policy["Statement"].as_array().cloned().unwrap_or_default();
    let allowed: BTreeSet<String> = statements.iter().flat_map(actions_of).collect();
    let missing: Vec<&String> = needed.difference(&allowed).collect();
    assert!(
        missing.is_empty(),
        "the code calls what the policy does not allow: {missing:?}"
    );
    let unused: Vec<&String> = allowed.difference(&needed).collect();
    assert!(
        unused.is_empty(),
        "the policy allows what the code never calls: {unused:?}"
    );
    for statement in &statements {
        assert_eq!(statement["Effect"], "Allow", "{statement}");
        assert!(
            actions_of(statement).iter().all(|a| !a.contains('*')),
            "no wildcard actions: {statement}"
        );
    }
}

#[test]
fn changes_are_scoped_to_what_this_clusters_joist_launched() {
    let cluster_tag = "/kubernetes.io/cluster/${ClusterName}";
    for statement in policy()["Statement"].as_array().cloned().unwrap_or_default() {
        let actions = actions_of(&statement);
        let mutating = actions.iter().any(|a| {
            a.starts_with("ec2:Create")
                || a.starts_with("ec2:Terminate")
                || a.starts_with("iam:Create")
                || a.starts_with("iam:Tag")
                || a.ends_with("RoleToInstanceProfile")
                || a.ends_with("RoleFromInstanceProfile")
        });
        let resources = statement["Resource"].to_string();
        // Launching reads images, snapshots, subnets and security groups it does not own.
        let reads_shared = resources.contains("image/") && !resources.contains("instance/");
        if !mutating || reads_shared {
            continue;
        }
        let condition = statement["Condition"].to_string();
        assert!(
            condition.contains(cluster_tag),
            "{}: changes resources without requiring the tag kubernetes.io/cluster/${{ClusterName}}=owned",
            statement["Sid"]
        );
        assert!(
            condition.contains("karpenter.sh/nodepool")
                || condition.contains("karpenter.k8s.aws/ec2nodeclass"),
            "{}: not scoped to Joist's NodePools or EC2NodeClasses",
            statement["Sid"]
        );
    }
}

//! Joist's CRDs on the real API server, judged against `joist validate`: the committed CRDs install
//! and turn Established, and every Karpenter document of the project's corpora (the valid and
//! invalid fixtures) and a fixed sample of the property tests' fuzzed documents is sent to the API
//! server as a dry-run create with strict field validation (as kubectl sends it), so its OpenAPI
//! schema and CEL rules really run. Documents are judged as a user wrote them: a status and the
//! metadata a server sets (read back with `kubectl get -o yaml`) are taken off first.
//!
//! Each verdict, accepted or refused, must equal `joist validate`'s for the same document, with one
//! kind of exception, each listed in [`STRICTER_THAN_THE_CRDS`] with its reason: a check `joist
//! validate` makes offline that Karpenter makes only once it acts on the object, never in its CRD
//! (and one deliberate difference, in the README's compatibility list).

use std::fmt::Write as _;

use joist_messages::apis::manifest::{Checker, Outcome};
use proptest::{
    sample::Index,
    strategy::{Strategy, ValueTree},
    test_runner::TestRunner,
};
use serde_json::Value;

use crate::{
    control_plane::ControlPlane,
    fixtures::{applied, documents, fixtures, read, valid_by_kind},
    mutants::{fields, mutant},
};

/// How many fuzzed documents are judged by both.
const FUZZED: usize = 400;

/// The refusals `joist validate` makes that the CRDs (Karpenter's, to the field) do not: the kind
/// (any when empty), the start of the field, words of the problem, and why.
const STRICTER_THAN_THE_CRDS: &[(&str, &str, &str, &str)] = &[
    (
        "NodePool",
        "spec.disruption.budgets",
        "schedule",
        "a budget's cron schedule is parsed when the budget is computed",
    ),
    (
        "NodeOverlay",
        "spec.requirements",
        "operator",
        "the NodeOverlay's runtime validation (ValidationSucceeded=False) checks its requirements",
    ),
    (
        "",
        "spec.kubelet",
        "out of range for int32",
        "Karpenter's Go types hold these fields in 32 bits and cannot read a larger value",
    ),
    (
        "EC2NodeClass",
        "spec.",
        "expected at least one",
        "a selector term whose tags are empty names nothing to select by: Joist refuses it, where \
         Karpenter's CRD lets it through",
    ),
];

/// Why `joist validate` alone refuses a `kind` object for `problems`, when every one of them is
/// such a check.
fn stricter(kind: &str, problems: &str) -> Option<&'static str> {
    let each: Vec<Option<&'static str>> = problems
        .split("; ")
        .map(|problem| {
            STRICTER_THAN_THE_CRDS
                .iter()
                .find(|(of, field, word, _)| {
                    (of.is_empty() || *of == kind) && problem.starts_with(field) && problem.contains(word)
                })
                .map(|(_, _, _, why)| *why)
        })
        .collect();
    each.iter().all(Option::is_some).then(|| each[0]).flatten()
}

/// One document and where it came from.
struct Case {
    origin: String,
    document: Value,
}

/// `document` as a user wrote it: no status, none of the metadata a server sets.
fn as_written(mut document: Value) -> Value {
    if let Some(object) = document.as_object_mut() {
        object.remove("status");
    }
    if let Some(metadata) = document["metadata"].as_object_mut() {
        for set_by_the_server in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            metadata.remove(set_by_the_server);
        }
    }
    document
}

/// The fixtures' Karpenter documents.
fn fixture_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dir in ["valid", "invalid"] {
        for file in fixtures(dir) {
            for (i, document) in documents(&file, &read(&file)).into_iter().enumerate() {
                cases.push(Case {
                    origin: format!(
                        "{dir}/{}#{i}",
                        file.file_name().unwrap_or_default().to_string_lossy()
                    ),
                    document: as_written(document),
                });
            }
        }
    }
    cases
}

/// `FUZZED` documents from the property tests' generator, with a fixed seed: a valid fixture of the
/// mutant's kind with one field set to a value a user might write.
fn fuzzed_cases() -> Vec<Case> {
    let bases = valid_by_kind();
    let fields = fields();
    let strategy = (mutant(&fields, None), proptest::arbitrary::any::<Index>());
    let mut runner = TestRunner::deterministic();
    (0..FUZZED)
        .map(|i| {
            let (mutant, pick) = strategy
                .new_tree(&mut runner)
                .unwrap_or_else(|e| panic!("{e}"))
                .current();
            let mut document = applied(&bases, &mutant, &pick);
            // Distinct names, so nothing depends on what an earlier case created (none is stored).
            document["metadata"]["name"] = Value::from(format!("fuzzed-{i}"));
            Case {
                origin: format!("fuzzed #{i}: {} = {}", mutant.field.path(), mutant.value),
                document: as_written(document),
            }
        })
        .collect()
}

/// The API server's verdict on creating `document`: accepted, or refused with its message.
async fn api_verdict(client: &kube::Client, document: &Value) -> Result<(), String> {
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let plural = match document["kind"].as_str().unwrap_or_default() {
        "NodePool" => "nodepools",
        "NodeClaim" => "nodeclaims",
        "EC2NodeClass" => "ec2nodeclasses",
        "NodeOverlay" => "nodeoverlays",
        other => panic!("not a Karpenter kind: {other}"),
    };
    let request = http::Request::post(format!(
        "/apis/{api_version}/{plural}?dryRun=All&fieldValidation=Strict"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(document).unwrap_or_default())
    .unwrap_or_else(|e| panic!("{e}"));
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => Err(status.message),
        Err(other) => panic!("the API server did not judge {document}: {other}"),
    }
}

/// `joist validate`'s verdict on `document`: accepted, or refused with its problems.
fn validate_verdict(checker: &mut Checker, document: &Value) -> Result<(), String> {
    match checker.check_document(document.clone()).outcome {
        Outcome::Valid(_) => Ok(()),
        Outcome::Invalid(problems) => Err(problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_and_joist_validate_give_every_manifest_the_same_verdict() {
    let cluster = ControlPlane::start("crds");
    cluster.kubectl_ok(&["create", "-f", "deploy/crds"]);
    cluster.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout",
        "60s",
        "crd",
        "--all",
    ]);
    let client = cluster.client().await;
    let mut checker = Checker::new();
    let mut cases = fixture_cases();
    let fixtures_judged = cases.len();
    cases.extend(fuzzed_cases());
    let (mut agreed, mut refused) = (0, 0);
    let mut runtime: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut disagreements = String::new();
    for case in &cases {
        let api = api_verdict(&client, &case.document).await;
        let joist = validate_verdict(&mut checker, &case.document);
        let kind = case.document["kind"].as_str().unwrap_or_default();
        match (&api, &joist) {
            (Ok(()), Ok(())) => agreed += 1,
            (Err(_), Err(_)) => {
                agreed += 1;
                refused += 1;
            }
            (Ok(()), Err(problems)) if stricter(kind, problems).is_some() => {
                *runtime
                    .entry(stricter(kind, problems).unwrap_or_default())
                    .or_default() += 1;
            }
            _ => {
                let _ = writeln!(
                    disagreements,
                    "{}\n  API server: {api:?}\n  joist validate: {joist:?}\n  document: {}",
                    case.origin, case.document
                );
            }
        }
    }
    println!(
        "judged {} ({fixtures_judged} fixtures, {FUZZED} fuzzed): {agreed} agreed ({refused} refused by both), \
         {} refused by joist validate alone (below), disagreements {}",
        cases.len(),
        runtime.values().sum::<usize>(),
        disagreements.matches("\n  API server").count()
    );
    for (why, count) in &runtime {
        println!("  {count}: {why}");
    }
    assert!(
        disagreements.is_empty(),
        "the real API server and joist validate disagree:\n{disagreements}"
    );
    assert!(
        refused > 0 && agreed > refused,
        "the corpus must hold both verdicts"
    );
}

//! Joist's CRDs on the real API server, judged against `joist validate`: the committed CRDs install
//! and turn Established, and every Karpenter document of the project's corpora (the valid and
//! invalid fixtures) and a fixed sample of the property tests' fuzzed documents is sent to the API
//! server as a dry-run create with strict field validation (as kubectl sends it), so its OpenAPI
//! schema and CEL rules really run. Documents are judged as a user wrote them: a status and the
//! metadata a server sets (read back with `kubectl get -o yaml`) are taken off first.
//!
//! Each verdict, accepted or refused, must equal `joist validate`'s for the same document, with one
//! kind of exception, each listed in `joist_messages::apis::beyond_the_crds` with its reason: a check `joist
//! validate` makes offline that Karpenter makes only once it acts on the object, never in its CRD
//! (and one deliberate difference, in docs/compatibility.md).
//!
//! kubesim judges the same documents, and each of its verdicts must equal the real server's.

use std::fmt::Write as _;

use joist_messages::apis::{
    Violation,
    beyond_the_crds::beyond_the_crds,
    manifest::{Checker, Outcome},
};
use proptest::{
    sample::Index,
    strategy::{Strategy, ValueTree},
    test_runner::TestRunner,
};
use serde_json::Value;

use crate::{
    control_plane::{ControlPlane, kubesim_with_joist_crds},
    fixtures::{applied, documents, fixtures, read, valid_by_kind},
    mutants::{fields, mutant},
};

/// How many fuzzed documents are judged by both.
const FUZZED: usize = 400;

/// Why `joist validate` alone refuses `document` for `problems`, when every one of them is a check
/// the CRDs do not make.
fn stricter(document: &Value, problems: &[Violation]) -> Option<&'static str> {
    let each: Vec<Option<&'static str>> = problems
        .iter()
        .map(|problem| beyond_the_crds(document, problem))
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
        "CapacityBuffer" => "namespaces/default/capacitybuffers",
        other => panic!("not a kind Karpenter serves: {other}"),
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
fn validate_verdict(checker: &mut Checker, document: &Value) -> Result<(), Vec<Violation>> {
    match checker.check_document(document).outcome {
        Outcome::Valid(_) => Ok(()),
        Outcome::Invalid(problems) => Err(problems),
        other => Err(vec![Violation {
            field: String::new(),
            message: format!("{other:?}"),
        }]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_and_joist_validate_give_every_manifest_the_same_verdict() {
    let cluster = ControlPlane::with_joist_crds("crds");
    let client = cluster.client().await;
    let kubesim = kubesim_with_joist_crds();
    let kubesim_client = kubesim.client();
    let mut kubesim_differences = String::new();
    let mut checker = Checker::new();
    let mut cases = fixture_cases();
    let fixtures_judged = cases.len();
    cases.extend(fuzzed_cases());
    let (mut agreed, mut refused) = (0, 0);
    let mut runtime: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut disagreements = String::new();
    for case in &cases {
        let api = api_verdict(&client, &case.document).await;
        let simulated = api_verdict(&kubesim_client, &case.document).await;
        if simulated.is_ok() != api.is_ok() {
            let _ = writeln!(
                kubesim_differences,
                "{}\n  API server: {api:?}\n  kubesim: {simulated:?}\n  document: {}",
                case.origin, case.document
            );
        }
        let joist = validate_verdict(&mut checker, &case.document);
        match (&api, &joist) {
            (Ok(()), Ok(())) => agreed += 1,
            (Err(_), Err(_)) => {
                agreed += 1;
                refused += 1;
            }
            (Ok(()), Err(problems)) if stricter(&case.document, problems).is_some() => {
                *runtime
                    .entry(stricter(&case.document, problems).unwrap_or_default())
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
    println!(
        "kubesim judged the same {}: differences from the API server {}",
        cases.len(),
        kubesim_differences.matches("\n  API server").count()
    );
    // Both lists in one message: a fix for one often shows in the other.
    assert!(
        kubesim_differences.is_empty() && disagreements.is_empty(),
        "kubesim and the real API server disagree:\n{kubesim_differences}\n\
         the real API server and joist validate disagree:\n{disagreements}"
    );
    assert!(
        refused > 0 && agreed > refused,
        "the corpus must hold both verdicts"
    );
}

//! The compatibility contract, checked end to end against the project's fixtures:
//! `joist validate` accepts the valid manifests and rejects each invalid one on the field its
//! `# expect:` lines name; the generated CRDs alone (OpenAPI schema + CEL rules, evaluated with
//! kube-cel) reject the same manifests; the committed CRDs (and the charts' copies) are current;
//! decoding keeps every field a user wrote; the Helm charts hold to Karpenter's ([`charts`]); and
//! the README and `docs/` link only to what exists and show only commands joist has ([`docs`]);
//! and `actors/` keeps to its layers ([`layers`]).

use std::{collections::HashMap, path::Path, process::Command};

use joist_messages::{
    apis::{
        crds,
        duration::Duration,
        manifest::{KarpenterObject, Outcome, read_manifests},
        schema_check::SchemaChecker,
        validation::Violations,
    },
    model::quantity::Quantity,
};
use serde_json::Value;

use self::fixtures::{documents, fixtures, read};

#[path = "support/chart.rs"]
mod chart;
#[path = "contract/charts.rs"]
mod charts;
#[path = "contract/crd_parity.rs"]
mod crd_parity;
#[path = "contract/docs.rs"]
mod docs;
#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "contract/fuzz.rs"]
mod fuzz;
#[path = "contract/iam.rs"]
mod iam;
#[path = "contract/layers.rs"]
mod layers;
#[path = "support/mutants.rs"]
mod mutants;
#[path = "support/tools.rs"]
mod tools;

/// The `# expect: …` lines of a fixture.
fn expectations(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# expect: "))
        .map(str::to_string)
        .collect()
}

fn joist(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist: {e}"));
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn validate_accepts_every_valid_manifest() {
    for file in fixtures("valid") {
        let (code, out) = joist(&["validate", &file.to_string_lossy()]);
        assert_eq!(code, 0, "{} must be valid:\n{out}", file.display());
        assert!(out.contains("0 with problems"), "{out}");
    }
}

#[test]
fn validate_rejects_each_invalid_manifest_naming_the_field() {
    for file in fixtures("invalid") {
        let path = file.to_string_lossy().into_owned();
        let (code, out) = joist(&["validate", &path]);
        assert_eq!(code, 1, "{path} must be rejected:\n{out}");
        let expected = expectations(&read(&file));
        assert!(!expected.is_empty(), "{path} has no `# expect:` line");
        for field in expected {
            // Each problem line reads `FILE: Kind/name: FIELD: reason`.
            let named = out
                .lines()
                .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(&format!(": {field}: ")));
            assert!(named, "{path}: no problem reported on {field}:\n{out}");
        }
    }
}

#[test]
fn validate_explains_legacy_kinds_with_their_v1_replacement() {
    for file in fixtures("legacy") {
        let (code, out) = joist(&["validate", &file.to_string_lossy()]);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("pre-v1 Karpenter API and is not served"), "{out}");
        for replacement in expectations(&read(&file)) {
            assert!(
                out.contains(&replacement),
                "{}: missing {replacement:?}:\n{out}",
                file.display()
            );
        }
    }
}

#[test]
fn validate_reports_unreadable_input_and_directories() {
    let (code, out) = joist(&["validate", "/nonexistent/nodepool.yaml"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("/nonexistent/nodepool.yaml: cannot read"), "{out}");

    let dir = std::env::temp_dir().join(format!("joist-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    std::fs::write(dir.join("broken.yaml"), "kind: [unclosed").unwrap_or_default();
    let (code, out) = joist(&["validate", &dir.to_string_lossy()]);
    std::fs::remove_dir_all(&dir).unwrap_or_default();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("broken.yaml: not valid YAML"), "{out}");
}

/// What the API server would say about `object` with Joist's CRDs installed, before any admission
/// webhook: OpenAPI schema violations plus failing CEL rules.
fn crd_verdict(schemas: &HashMap<String, Value>, object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let schema = schemas
        .get(kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"));
    let mut structural = Violations::default();
    SchemaChecker::new(schema.clone()).check(object, &mut structural);
    let mut problems: Vec<String> = structural.into_vec().iter().map(ToString::to_string).collect();
    // CEL rules only run on objects that pass the schema, as in the API server.
    if problems.is_empty()
        && let Err(errors) = kube_cel::Validator::new().validate(schema, object, None)
    {
        problems.extend(
            errors
                .into_vec()
                .iter()
                .map(|e| format!("{}: {}", e.field_path, e.message)),
        );
    }
    problems
}

#[test]
fn the_crds_alone_accept_valid_and_reject_invalid_manifests() {
    let schemas = mutants::schemas();
    for file in fixtures("valid") {
        for doc in documents(&file, &read(&file)) {
            let problems = crd_verdict(&schemas, &doc);
            assert!(
                problems.is_empty(),
                "{}: the CRD rejects a valid object: {problems:?}",
                file.display()
            );
        }
    }
    for file in fixtures("invalid") {
        let text = read(&file);
        if text.contains("# crd: accepts") {
            continue;
        }
        for doc in documents(&file, &text) {
            let problems = crd_verdict(&schemas, &doc);
            assert!(
                !problems.is_empty(),
                "{}: the CRD accepts an invalid object",
                file.display()
            );
        }
    }
}

#[test]
fn committed_crds_match_the_generated_ones() {
    let dir = std::env::temp_dir().join(format!("joist-crds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    let (code, out) = joist(&["crds", "--out-dir", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "{out}");
    // The charts carry copies: the joist chart's crds/ (installed once), joist-crd's files/.
    let copies = [
        "deploy/crds",
        "deploy/charts/joist/crds",
        "deploy/charts/joist-crd/files",
    ];
    for (file, _) in crds() {
        let generated = read(&dir.join(file));
        for copy in copies {
            let committed = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(copy).join(file));
            assert!(
                generated == committed,
                "{copy}/{file} is stale: run `cargo run -- crds --out-dir {copy}`"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap_or_default();
    let (code, out) = joist(&["crds"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.matches("kind: CustomResourceDefinition").count(),
        crds().len(),
        "{out}"
    );
}

/// Every scalar the user wrote is still there, with the same meaning, after decoding and encoding.
fn assert_kept(original: &Value, round_trip: &Value, path: &str) {
    match original {
        Value::Object(map) => {
            for (key, value) in map {
                // Status is the controller's, not the user's: a newer controller's extra status
                // fields are dropped on purpose.
                if path.ends_with(".yaml") && key == "status" {
                    continue;
                }
                let next = round_trip
                    .get(key)
                    .unwrap_or_else(|| panic!("{path}.{key} was dropped"));
                assert_kept(value, next, &format!("{path}.{key}"));
            }
        }
        Value::Array(items) => {
            let next = round_trip
                .as_array()
                .unwrap_or_else(|| panic!("{path} is no longer a list"));
            assert_eq!(items.len(), next.len(), "{path} changed length");
            for (i, (a, b)) in items.iter().zip(next).enumerate() {
                assert_kept(a, b, &format!("{path}[{i}]"));
            }
        }
        // Quantities and durations are written back in canonical form (`1000` → "1000",
        // `1.5Gi` → "1536Mi", `90m` → "1h30m"): the meaning must be the same.
        scalar if scalar != round_trip => {
            let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
            let (a, b) = (text(scalar), text(round_trip));
            let same_quantity = a
                .parse::<Quantity>()
                .is_ok_and(|qa| b.parse::<Quantity>() == Ok(qa));
            let same_duration = a
                .parse::<Duration>()
                .is_ok_and(|da| b.parse::<Duration>() == Ok(da));
            assert!(
                same_quantity || same_duration,
                "{path}: {scalar} became {round_trip}"
            );
        }
        _ => {}
    }
}

#[test]
fn decoding_keeps_every_user_field() {
    for file in fixtures("valid") {
        let text = read(&file);
        let docs = read_manifests(&text).unwrap_or_else(|e| panic!("{e}"));
        let originals = documents(&file, &text);
        let decoded: Vec<Value> = docs
            .into_iter()
            .filter_map(|d| match d.outcome {
                Outcome::Valid(object) => object.to_value().ok(),
                _ => None,
            })
            .collect();
        assert_eq!(decoded.len(), originals.len(), "{}", file.display());
        for (original, round_trip) in originals.iter().zip(&decoded) {
            assert_kept(original, round_trip, &file.display().to_string());
        }
    }
}

#[test]
fn defaults_are_karpenters() {
    let text =
        read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/valid/with-other-kinds.yaml"));
    let docs = read_manifests(&text).unwrap_or_else(|e| panic!("{e}"));
    let Outcome::Valid(KarpenterObject::NodePool(pool)) = &docs[0].outcome else {
        panic!("{:?}", docs[0])
    };
    let json = serde_json::to_value(pool).unwrap_or_default();
    assert_eq!(json["spec"]["template"]["spec"]["expireAfter"], "720h");
    assert_eq!(
        json["spec"]["disruption"]["consolidationPolicy"],
        "WhenEmptyOrUnderutilized"
    );
    assert_eq!(json["spec"]["disruption"]["consolidateAfter"], "0s");
    assert_eq!(
        json["spec"]["disruption"]["budgets"],
        serde_json::json!([{"nodes": "10%"}])
    );
    assert_eq!(docs[1].outcome, Outcome::NotKarpenter);

    let text = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/valid/getting-started.yaml"));
    let docs = read_manifests(&text).unwrap_or_else(|e| panic!("{e}"));
    let Outcome::Valid(KarpenterObject::EC2NodeClass(class)) = &docs[1].outcome else {
        panic!("{:?}", docs[1])
    };
    let json = serde_json::to_value(class).unwrap_or_default();
    assert_eq!(
        json["spec"]["metadataOptions"],
        serde_json::json!({"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"})
    );
}

#[test]
fn fields_moved_in_v1_say_where_they_went() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid/v1beta1-fields.yaml");
    let (code, out) = joist(&["validate", &file.to_string_lossy()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.disruption.expireAfter: unknown field: the v1 API has no such field; in v1 it moved to spec.template.spec.expireAfter"), "{out}");
    assert!(out.contains("spec.template.spec.kubelet: unknown field: the v1 API has no such field; in v1 it moved to the EC2NodeClass"), "{out}");
}

#[test]
fn validate_reads_kubectl_lists_from_stdin() {
    use std::io::Write;
    let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: karpenter.sh/v1\n  kind: NodePool\n  metadata: {name: from-cluster}\n  spec:\n    template:\n      spec:\n        nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n        requirements: []\n    weight: 0\n";
    let mut child = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(["validate", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run joist: {e}"));
    child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(list.as_bytes()))
        .transpose()
        .unwrap_or_default();
    let output = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("-: NodePool/from-cluster: spec.weight: must be at least 1, got 0"),
        "{out}"
    );
}

/// The interruption queue's CloudFormation: the queue as Karpenter's (300 s retention, SQS-managed
/// encryption), only EventBridge may send, a rule for every event kind Joist reads whose pattern
/// matches the event AWS sends, and the controller's SQS permissions exactly the calls it makes.
#[test]
fn the_interruption_template_routes_every_event_joist_reads_to_the_queue() {
    use joist_provider::interruption::{Parsed, parse};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/cloudformation/interruption-queue.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let template: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let resources = template["Resources"].as_object().cloned().unwrap_or_default();
    let queue = &resources["InterruptionQueue"]["Properties"];
    assert_eq!(queue["MessageRetentionPeriod"], 300);
    assert_eq!(queue["SqsManagedSseEnabled"], true);
    let sends: Vec<&Value> =
        resources["InterruptionQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["Effect"] == "Allow")
            .collect();
    assert_eq!(sends.len(), 1);
    assert_eq!(
        sends[0]["Principal"]["Service"],
        serde_json::json!(["events.amazonaws.com"])
    );
    let patterns: Vec<(String, String)> = resources
        .values()
        .filter(|r| r["Type"] == "AWS::Events::Rule")
        .flat_map(|r| {
            let pattern = &r["Properties"]["EventPattern"];
            let sources: Vec<String> = pattern["source"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let types: Vec<String> = pattern["detail-type"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            sources
                .into_iter()
                .flat_map(move |s| types.clone().into_iter().map(move |t| (s.clone(), t)))
        })
        .collect();
    // The events AWS sends for each kind Joist reads.
    let instance = serde_json::json!({"instance-id": "i-0123456789abcdef0", "instance-action": "terminate", "state": "stopping"});
    let health = serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                                    "affectedEntities": [{"entityValue": "i-0123456789abcdef0"}]});
    let samples = [
        ("aws.ec2", "EC2 Spot Instance Interruption Warning", &instance),
        (
            "aws.ec2",
            "EC2 Capacity Reservation Instance Interruption Warning",
            &instance,
        ),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation", &instance),
        ("aws.ec2", "EC2 Instance State-change Notification", &instance),
        ("aws.health", "AWS Health Event", &health),
    ];
    for (source, detail_type, detail) in samples {
        let event = serde_json::json!({"version": "0", "id": "1", "detail-type": detail_type, "source": source,
                                       "time": "2026-01-01T00:00:00Z", "region": "us-west-2", "resources": [], "detail": detail});
        assert!(
            matches!(parse(&event.to_string()), Parsed::Interruption(_)),
            "Joist reads {detail_type}"
        );
        assert!(
            patterns.contains(&(source.to_owned(), detail_type.to_owned())),
            "no rule routes {source} / {detail_type} to the queue: {patterns:?}"
        );
    }
    assert_eq!(
        patterns.len(),
        samples.len(),
        "a rule for nothing Joist reads: {patterns:?}"
    );
    let statement =
        &resources["ControllerInterruptionPolicy"]["Properties"]["PolicyDocument"]["Statement"][0];
    assert_eq!(
        statement["Action"],
        serde_json::json!(["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"]),
        "exactly the calls providers/aws/src/sqs.rs makes"
    );
}

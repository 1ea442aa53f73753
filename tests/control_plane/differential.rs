//! kubesim held to the real API server: the same kubectl sessions, command by command, against a
//! kubesim cluster and the real control plane, each answer compared. A difference is a kubesim bug.
//!
//! Each step is a kubectl command and what is compared of its answer: whether it succeeded, and the
//! meaning of what kubectl printed (the unknown fields named, the conflicts, the warnings, the
//! reason of a refusal), or, for a `get`, its output. Then the requests Joist's controllers make,
//! through kube-rs as they make them (NodeClaims created, their status and finalizers patched,
//! Nodes created and labelled as the KWOK cloud does, Leases, Events, evictions), each answer's
//! HTTP status and chosen fields compared. Values only one server makes up (uids, timestamps,
//! resource versions) are never compared.

use std::path::Path;

use http_body_util::BodyExt;
use serde_json::Value;

use super::{
    control_plane::{ControlPlane, kubectl, kubesim_with_joist_crds},
    tools::root,
};

/// What is compared of a step.
enum Compare {
    /// Success, and the meaning of what kubectl printed on stderr.
    Outcome,
    /// Success and the exact standard output.
    Output,
}

/// One kubectl command; `{dir}` in an argument is kubesim's `tests/fixtures/kubectl`, the
/// manifests its own kubectl tests apply.
struct Step {
    args: &'static [&'static str],
    compare: Compare,
}

const fn outcome(args: &'static [&'static str]) -> Step {
    Step {
        args,
        compare: Compare::Outcome,
    }
}

const fn output(args: &'static [&'static str]) -> Step {
    Step {
        args,
        compare: Compare::Output,
    }
}

/// The sessions, each a user's commands in order.
const SESSIONS: &[(&str, &[Step])] = &[
    (
        "server-side apply owns fields",
        &[
            outcome(&["apply", "--server-side", "-f", "{dir}/spread.yaml"]),
            output(&[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.template.spec.affinity.podAntiAffinity..topologyKey} {.spec.template.spec.containers[0].env}",
            ]),
            output(&[
                "get",
                "deploy",
                "web",
                "-o",
                r#"jsonpath={.metadata.managedFields[?(@.operation=="Apply")].manager}"#,
            ]),
            outcome(&["apply", "--server-side", "-f", "{dir}/packed.yaml"]),
            output(&[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.template.spec.affinity}|{.metadata.labels}|{.spec.template.spec.containers[0].env}",
            ]),
            outcome(&[
                "patch",
                "deploy",
                "web",
                "--type=merge",
                "-p",
                r#"{"spec":{"paused":true,"replicas":5}}"#,
            ]),
            outcome(&["apply", "--server-side", "-f", "{dir}/packed.yaml"]),
            outcome(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                "{dir}/packed.yaml",
            ]),
            output(&[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.replicas} {.spec.paused} {.metadata.generation}",
            ]),
            outcome(&[
                "apply",
                "--server-side",
                "--field-manager=other",
                "-f",
                "{dir}/spread.yaml",
            ]),
            output(&[
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.template.spec.affinity.podAntiAffinity..topologyKey}",
            ]),
        ],
    ),
    (
        "unknown fields",
        &[
            outcome(&["apply", "-f", "{dir}/misplaced.yaml"]),
            outcome(&["apply", "--server-side", "-f", "{dir}/misplaced.yaml"]),
            outcome(&["create", "--validate=warn", "-f", "{dir}/misplaced.yaml"]),
            output(&[
                "get",
                "deploy",
                "misplaced",
                "-o",
                "jsonpath={.spec.template.metadata} {.spec.template.spec.containers[0].name}",
            ]),
            outcome(&[
                "patch",
                "deploy",
                "misplaced",
                "--type=merge",
                "-p",
                r#"{"spec":{"paused":true,"pasued":true}}"#,
            ]),
            output(&["get", "deploy", "misplaced", "-o", "jsonpath={.spec.paused}"]),
            outcome(&["apply", "-f", "{dir}/pool-typo.yaml"]),
            outcome(&["apply", "--server-side", "-f", "{dir}/pool-typo.yaml"]),
            outcome(&["create", "--validate=false", "-f", "{dir}/pool-typo.yaml"]),
            output(&[
                "get",
                "nodepool",
                "typo",
                "-o",
                "jsonpath={.spec.disruptions}|{.spec.template.spec.nodeClassRef.name}",
            ]),
        ],
    ),
    (
        "client-side apply, labels and annotations",
        &[
            outcome(&["apply", "-f", "{dir}/settings.yaml"]),
            outcome(&["apply", "-f", "{dir}/settings-trimmed.yaml"]),
            output(&[
                "get",
                "configmap",
                "settings",
                "-o",
                "jsonpath={.data} {.metadata.labels}",
            ]),
            outcome(&["label", "configmap", "settings", "tier=db"]),
            outcome(&["label", "configmap", "settings", "tier=db", "--overwrite"]),
            outcome(&["label", "configmap", "settings", "tier-"]),
            outcome(&["annotate", "configmap", "settings", "note=kept"]),
            output(&[
                "get",
                "configmap",
                "settings",
                "-o",
                "jsonpath={.metadata.labels}|{.metadata.annotations.note}",
            ]),
        ],
    ),
    (
        "finalizers, dry runs and missing namespaces",
        &[
            outcome(&["create", "-f", "{dir}/held.yaml"]),
            outcome(&["delete", "configmap", "held", "--wait=false"]),
            output(&[
                "get",
                "configmap",
                "held",
                "-o",
                "jsonpath={.metadata.finalizers} {.data}",
            ]),
            outcome(&["label", "configmap", "held", "late=yes"]),
            outcome(&[
                "patch",
                "configmap",
                "held",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":["example.com/another"]}}"#,
            ]),
            outcome(&[
                "patch",
                "configmap",
                "held",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]),
            outcome(&["get", "configmap", "held"]),
            outcome(&[
                "create",
                "configmap",
                "dry",
                "--from-literal=a=b",
                "--dry-run=server",
            ]),
            outcome(&["get", "configmap", "dry"]),
            outcome(&["create", "-f", "{dir}/elsewhere.yaml"]),
            outcome(&["create", "configmap", "settings", "--from-literal=a=b"]),
        ],
    ),
];

/// One server's answer to a step: what is compared, and kubectl's stderr as it was (for the report).
#[derive(Debug)]
struct Answer {
    success: bool,
    printed: String,
    stderr: String,
}

impl PartialEq for Answer {
    fn eq(&self, other: &Self) -> bool {
        (self.success, &self.printed) == (other.success, &other.printed)
    }
}

fn run(kubeconfig: &Path, dir: &Path, step: &Step) -> Answer {
    let args: Vec<String> = step
        .args
        .iter()
        .map(|arg| arg.replace("{dir}", &dir.to_string_lossy()))
        .collect();
    let ran = std::process::Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("run kubectl: {e}"));
    let stderr = String::from_utf8_lossy(&ran.stderr);
    let printed = match step.compare {
        Compare::Output => String::from_utf8_lossy(&ran.stdout).into_owned(),
        Compare::Outcome => meaning(&stderr),
    };
    Answer {
        success: ran.status.success(),
        printed,
        stderr: stderr.into_owned(),
    }
}

/// What kubectl's stderr says, without the wording only one server uses: the reason of a refusal,
/// the fields it names (unknown, not declared, in conflict), the managers in conflict and the
/// warnings, sorted.
fn meaning(stderr: &str) -> String {
    let mut said: Vec<String> = Vec::new();
    for line in stderr.lines() {
        if let Some(reason) = line
            .split("Error from server (")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
        {
            said.push(format!("refused: {reason}"));
        }
        if let Some(warning) = line.strip_prefix("Warning: ") {
            said.push(format!("warning: {warning}"));
        }
        for (marker, label) in [
            ("unknown field \"", "unknown"),
            ("conflict with \"", "conflict"),
            ("conflicts with \"", "conflict"),
        ] {
            for piece in line.split(marker).skip(1) {
                if let Some(name) = piece.split('"').next() {
                    said.push(format!("{label}: {name}"));
                }
            }
        }
        // Which undeclared fields kube-apiserver names varies from call to call (it stops at an
        // object's first, in Go's random map order): the refusal is compared, not the fields.
        if line.trim().ends_with(": field not declared in schema") {
            said.push("not declared".to_owned());
        }
        if let Some(field) = line.strip_prefix("- .") {
            said.push(format!("conflicting field: .{field}"));
        }
        if line.contains("not found") {
            said.push("not found".to_owned());
        }
        if line.contains("already exists") {
            said.push("already exists".to_owned());
        }
        if line.contains("no new finalizers can be added") {
            said.push("no new finalizers".to_owned());
        }
    }
    said.sort();
    said.dedup();
    said.join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sessions_get_the_same_answers_from_kubesim_and_the_real_api_server() {
    let real = ControlPlane::with_joist_crds("differential");
    let sim = kubesim_with_joist_crds();
    let served = sim.serve_http(0).await.expect("serve kubesim over HTTP");
    let sim_kubeconfig = real.dir().join("kubesim-kubeconfig");
    served
        .write_kubeconfig(&sim_kubeconfig)
        .expect("kubesim kubeconfig");
    let dir = root().join("kubesim/tests/fixtures/kubectl");

    let mut differences = Vec::new();
    let mut compared = 0;
    for (session, steps) in SESSIONS {
        for step in *steps {
            let expected = run(&real.kubeconfig, &dir, step);
            let got = run(&sim_kubeconfig, &dir, step);
            compared += 1;
            if got != expected {
                let said = |answer: &Answer| {
                    format!(
                        "success {}, compared {:?} (kubectl printed {:?})",
                        answer.success, answer.printed, answer.stderr
                    )
                };
                differences.push(format!(
                    "{session}: kubectl {}\n  real server: {}\n  kubesim:     {}",
                    step.args.join(" "),
                    said(&expected),
                    said(&got)
                ));
            }
        }
    }
    println!(
        "kubectl commands compared: {compared}, differences: {}",
        differences.len()
    );
    assert!(
        differences.is_empty(),
        "kubesim differs from the real API server:\n{}",
        differences.join("\n")
    );
}

/// A request as Joist's controllers send it, and the fields of the answer compared (JSON pointers).
struct Request {
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    accept: &'static str,
    body: &'static str,
    compared: &'static [&'static str],
}

const fn request(
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
    compared: &'static [&'static str],
) -> Request {
    Request {
        method,
        path,
        content_type,
        accept: JSON,
        body,
        compared,
    }
}

/// A GET asking for objects shown as `accept` says (their metadata alone, say).
const fn get_as(path: &'static str, accept: &'static str, compared: &'static [&'static str]) -> Request {
    Request {
        method: "GET",
        path,
        content_type: JSON,
        accept,
        body: "",
        compared,
    }
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

/// Joist's requests in the order a node's life makes them.
const JOIST_REQUESTS: &[Request] = &[
    request(
        "POST",
        "/apis/karpenter.sh/v1/nodeclaims",
        JSON,
        r#"{"apiVersion":"karpenter.sh/v1","kind":"NodeClaim","metadata":{"name":"claim-a",
            "labels":{"karpenter.sh/nodepool":"default"},"finalizers":["karpenter.sh/termination"]},
            "spec":{"nodeClassRef":{"group":"karpenter.k8s.aws","kind":"EC2NodeClass","name":"default"},
            "requirements":[{"key":"node.kubernetes.io/instance-type","operator":"In","values":["c5.large"]}],
            "resources":{"requests":{"cpu":"1"}}}}"#,
        &[
            "/metadata/name",
            "/metadata/generation",
            "/spec/requirements",
            "/status",
        ],
    ),
    request(
        "POST",
        "/apis/karpenter.sh/v1/nodeclaims",
        JSON,
        r#"{"apiVersion":"karpenter.sh/v1","kind":"NodeClaim","metadata":{"name":"claim-b"},
            "spec":{"nodeClassRef":{"group":"karpenter.k8s.aws","kind":"EC2NodeClass","name":"default"},
            "requirements":[{"key":"node.kubernetes.io/instance-type","operator":"Gt","values":["c5.large"]}]}}"#,
        &["/kind", "/reason"],
    ),
    // As the benchmarks' and kube-rs's metadata watches read them.
    get_as(
        "/apis/karpenter.sh/v1/nodeclaims",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        &[
            "/kind",
            "/apiVersion",
            "/items/0/kind",
            "/items/0/apiVersion",
            "/items/0/metadata/name",
            "/items/0/spec",
        ],
    ),
    get_as(
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
        &["/kind", "/apiVersion", "/metadata/labels", "/spec"],
    ),
    request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a/status",
        MERGE,
        r#"{"status":{"providerID":"kwok://i-0a","nodeName":"i-0a","imageID":"ami-1",
            "capacity":{"cpu":"2","memory":"4Gi"},"allocatable":{"cpu":"1930m"},
            "conditions":[{"type":"Launched","status":"True","reason":"Launched","message":"",
            "lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
        &[
            "/status/providerID",
            "/status/capacity",
            "/status/conditions/0/type",
            "/metadata/generation",
        ],
    ),
    request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        MERGE,
        r#"{"metadata":{"annotations":{"karpenter.sh/nodeclaim-termination-timestamp":"2026-01-01T01:00:00Z"}},"status":{"providerID":"ignored"}}"#,
        &[
            "/metadata/annotations",
            "/status/providerID",
            "/metadata/generation",
        ],
    ),
    request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        MERGE,
        r#"{"spec":{"taints":[{"key":"example.com/t","effect":"Sideways"}]}}"#,
        &["/kind", "/reason", "/code"],
    ),
    request(
        "POST",
        "/api/v1/nodes",
        JSON,
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"i-0a","annotations":{"kwok.x-k8s.io/node":"fake"},
            "labels":{"karpenter.sh/nodepool":"default","kubernetes.io/hostname":"i-0a"}},
            "spec":{"providerID":"kwok://i-0a","taints":[{"key":"karpenter.sh/unregistered","effect":"NoExecute"}]},
            "status":{"capacity":{"cpu":"2","pods":"110"},"allocatable":{"cpu":"1930m","pods":"110"}}}"#,
        &["/metadata/name", "/spec/taints", "/status/capacity"],
    ),
    request(
        "PATCH",
        "/api/v1/nodes/i-0a",
        MERGE,
        r#"{"metadata":{"labels":{"karpenter.sh/registered":"true"}},"spec":{"taints":null}}"#,
        &["/metadata/labels", "/spec/taints"],
    ),
    request(
        "PATCH",
        "/api/v1/nodes/i-0a",
        "application/strategic-merge-patch+json",
        r#"{"spec":{"taints":[{"key":"karpenter.sh/disrupted","effect":"NoSchedule"}],"unschedulable":true}}"#,
        &["/spec"],
    ),
    request(
        "DELETE",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        JSON,
        "",
        &["/metadata/finalizers"],
    ),
    request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        MERGE,
        r#"{"metadata":{"finalizers":["karpenter.sh/termination","example.com/late"]}}"#,
        &["/kind", "/reason", "/code"],
    ),
    request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        MERGE,
        r#"{"metadata":{"finalizers":null}}"#,
        &["/metadata/name"],
    ),
    request(
        "GET",
        "/apis/karpenter.sh/v1/nodeclaims/claim-a",
        JSON,
        "",
        &["/reason", "/code"],
    ),
    request(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
        JSON,
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"joist-leader-election"},
            "spec":{"holderIdentity":"joist-a","leaseDurationSeconds":15}}"#,
        &["/spec"],
    ),
    request(
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/joist-leader-election",
        JSON,
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"joist-leader-election","resourceVersion":"1"},
            "spec":{"holderIdentity":"joist-b","leaseDurationSeconds":15}}"#,
        &["/reason", "/code"],
    ),
    request(
        "POST",
        "/api/v1/namespaces/default/events",
        JSON,
        r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"claim-a.1"},"type":"Normal","reason":"Launched",
            "message":"Status condition transitioned","involvedObject":{"kind":"NodeClaim","name":"claim-a","apiVersion":"karpenter.sh/v1"}}"#,
        &["/reason", "/type", "/involvedObject"],
    ),
    request(
        "POST",
        "/api/v1/namespaces/default/pods/missing/eviction",
        JSON,
        r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"missing","namespace":"default"}}"#,
        &["/reason", "/code"],
    ),
];

/// One server's answer to a request: its HTTP status and the compared fields.
async fn answer(client: &kube::Client, request: &Request) -> (u16, Vec<Option<Value>>) {
    let http_request = http::Request::builder()
        .method(request.method)
        .uri(request.path)
        .header("content-type", request.content_type)
        .header("accept", request.accept)
        .body(request.body.as_bytes().to_vec())
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client
        .send(http_request.map(kube::client::Body::from))
        .await
        .unwrap_or_else(|e| panic!("{} {}: {e}", request.method, request.path));
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .to_bytes();
    let document: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let compared = request
        .compared
        .iter()
        .map(|pointer| document.pointer(pointer).cloned())
        .collect();
    (status, compared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joists_requests_get_the_same_answers_from_kubesim_and_the_real_api_server() {
    let real = ControlPlane::with_joist_crds("joist-requests");
    let real_client = real.client().await;
    let sim = kubesim_with_joist_crds();
    let sim_client = sim.client();

    let mut differences = Vec::new();
    for request in JOIST_REQUESTS {
        let expected = answer(&real_client, request).await;
        let got = answer(&sim_client, request).await;
        if got != expected {
            differences.push(format!(
                "{} {}\n  real server: {expected:?}\n  kubesim:     {got:?}",
                request.method, request.path
            ));
        }
    }
    println!(
        "Joist's requests compared: {}, differences: {}",
        JOIST_REQUESTS.len(),
        differences.len()
    );
    assert!(
        differences.is_empty(),
        "kubesim differs from the real API server:\n{}",
        differences.join("\n")
    );
}

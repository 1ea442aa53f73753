//! `joist sim serve`, the real binary: kubesim over HTTP with Joist running on it against the
//! simulated cloud in the region and zone asked for. A pod applied through the printed kubeconfig
//! gets a NodeClaim and a Ready node in that zone within seconds, and the printed metrics URL
//! counts it; a region where nothing is sold stops it at start. And Karpenter's getting-started
//! steps with the real kubectl: apply the NodePool, EC2NodeClass and `inflate`, scale it, see a
//! Ready NodeClaim and Node and the pods Running; `kubectl create deployment` bigger pods and see
//! more NodeClaims; delete both, and see the nodes consolidated away.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use joist_messages::apis::NodeClaim;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::joist_process::http_get;
use crate::tools::{installed, path, root, succeeded};

/// The `joist sim serve` process, killed when the test ends.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `joist sim serve` with `args`, writing its kubeconfig to `kubeconfig`, and returns it
/// with the lines it printed up to "Ctrl-C stops it.".
fn serve(kubeconfig: &std::path::Path, args: &[&str]) -> (Serving, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(["sim", "serve"])
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start joist sim serve: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let serving = Serving(child);
    let printed: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .take_while(|line| line != "Ctrl-C stops it.")
        .collect();
    (serving, printed)
}

fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_serve_runs_joist_on_kubesim_and_serves_its_metrics() {
    let dir = std::env::temp_dir().join(format!("joist-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = dir.join("kubeconfig");
    let (serving, printed) = serve(
        &kubeconfig,
        &[
            "--boot-seconds",
            "1",
            "--region",
            "us-east-1",
            "--zones",
            "us-east-1b",
        ],
    );
    let metrics = printed
        .iter()
        .find_map(|l| l.strip_prefix("metrics: http://"))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics URL in {printed:#?}"))
        .to_owned();

    let config = Kubeconfig::read_from(&kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"));
    let create = |value: serde_json::Value| {
        let client = client.clone();
        async move {
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            let result = match kind.as_str() {
                "EC2NodeClass" => Api::<joist_messages::apis::EC2NodeClass>::all(client)
                    .create(&PostParams::default(), &object(value))
                    .await
                    .map(|_| ()),
                "NodePool" => Api::<joist_messages::apis::NodePool>::all(client)
                    .create(&PostParams::default(), &object(value))
                    .await
                    .map(|_| ()),
                _ => Api::<Pod>::namespaced(client, "default")
                    .create(&PostParams::default(), &object(value))
                    .await
                    .map(|_| ()),
            };
            result.unwrap_or_else(|e| panic!("{kind}: {e}"));
        }
    };
    create(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "KarpenterNodeRole-kubesim", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "kubesim"}}],
                 "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "kubesim"}}]},
    }))
    .await;
    create(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}}},
    }))
    .await;
    create(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "1"}}}]},
    }))
    .await;

    // Within seconds: a NodeClaim, a Ready node, and the pod running on it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut running = false;
    for _ in 0..150 {
        let pod = pods.get("web").await.unwrap_or_else(|e| panic!("{e}"));
        if pod.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let claims = Api::<NodeClaim>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let nodes = Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        running,
        "the pod never ran: {} claims, {} nodes",
        claims.items.len(),
        nodes.items.len()
    );
    assert_eq!((claims.items.len(), nodes.items.len()), (1, 1));
    let zone = nodes.items[0]
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("topology.kubernetes.io/zone"));
    assert_eq!(
        zone.map(String::as_str),
        Some("us-east-1b"),
        "the node is in the zone asked for"
    );

    let (status, exposition) = http_get(&metrics, "/metrics", None).await;
    assert_eq!(status, 200);
    let created = "karpenter_nodeclaims_created_total{reason=\"provisioned\",nodepool=\"default\",min_values_relaxed=\"false\"} 1";
    assert!(exposition.lines().any(|l| l == created), "{exposition}");

    // `joist explain` as printed, through the same kubeconfig.
    let hint = printed
        .iter()
        .find(|l| l.contains("joist explain"))
        .unwrap_or_else(|| panic!("no joist explain line in {printed:#?}"));
    assert!(hint.contains("AWS_REGION=us-east-1"), "{hint}");
    let node = nodes.items[0].metadata.name.clone().unwrap_or_default();
    let (code, json) = explain(&kubeconfig, &["node", &node, "-o", "json"]);
    assert_eq!(code, Some(0), "{json}");
    let answer: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(answer["nodepool"], "default", "{answer:#}");
    assert_eq!(answer["zone"], "us-east-1b", "{answer:#}");
    assert_eq!(answer["pods"], serde_json::json!(["default/web"]), "{answer:#}");
    assert!(answer["standing"]["state"].is_string(), "{answer:#}");
    let (code, text) = explain(&kubeconfig, &["pod", "default/web"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.starts_with(&format!("pod default/web runs on node {node}\n")),
        "{text}"
    );
    let (code, text) = explain(&kubeconfig, &["nodepool", "missing"]);
    assert_eq!(
        (code, text.trim()),
        (Some(2), "joist: nodepool \"missing\" not found")
    );

    // `joist what-if` reads the same cluster: moved to spot, its node is replaced, and the bare
    // pod, evicted, is gone, as on a real cluster.
    let spot = dir.join("spot.yaml");
    let pool = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements: [{key: karpenter.sh/capacity-type, operator: In, values: [spot]}]\n";
    std::fs::write(&spot, pool).unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(["what-if", "--for", "10m", "-o", "json", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg(&spot)
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist what-if: {e}"));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let outcome: serde_json::Value = serde_json::from_str(&printed).unwrap_or_else(|e| panic!("{e}"));
    let (before, after) = (&outcome["before"], &outcome["after"]);
    assert_eq!(
        (
            &before["nodes_at_end"],
            &before["nodes_launched"],
            &before["pods_disrupted"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!(0),
            &serde_json::json!(0)
        ),
        "without the change the cluster stays as it is: {outcome:#}"
    );
    assert_eq!(
        (&after["nodes_launched"], &after["pods_disrupted"]),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "a spot node replaces it: {outcome:#}"
    );
    drop(serving);
}

/// Runs `joist explain ARGS --kubeconfig KUBECONFIG` with the simulated cloud of `joist sim
/// serve --region us-east-1`; its exit code, and what it printed (standard error when it failed).
fn explain(kubeconfig: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .arg("explain")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("CLOUD_PROVIDER", "simulated")
        .env("AWS_REGION", "us-east-1")
        .env("CLUSTER_NAME", "kubesim")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist explain: {e}"));
    let printed = if output.status.success() {
        output.stdout
    } else {
        output.stderr
    };
    (
        output.status.code(),
        String::from_utf8_lossy(&printed).into_owned(),
    )
}

#[test]
fn sim_serve_in_a_region_without_instance_types_stops_naming_those_with_some() {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args(["sim", "serve", "--region", "mars-north-1"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist sim serve: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(
            "the simulated cloud sells no instance type in region mars-north-1: it sells in eu-west-1 ("
        ),
        "{stderr}"
    );
}

#[test]
fn karpenters_getting_started_steps_work_with_kubectl_against_sim_serve() {
    let kubectl = path(&installed("kube-clients"), "kube-clients", "KUBECTL");
    let dir = std::env::temp_dir().join(format!("joist-getting-started-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    // The walkthrough's manifests, with consolidation after 0s instead of 1m and every empty node
    // removable at once (not 10% of them) so the test is quick.
    let manifests = std::fs::read_to_string(root().join("examples/getting-started.yaml"))
        .unwrap_or_else(|e| panic!("{e}"))
        .replace(
            "consolidateAfter: 1m",
            "consolidateAfter: 0s\n    budgets:\n      - nodes: \"100%\"",
        );
    let manifest = dir.join("getting-started.yaml");
    std::fs::write(&manifest, manifests).unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = dir.join("kubeconfig");
    let (_serving, printed) = serve(&kubeconfig, &["--boot-seconds", "1"]);
    assert!(
        printed
            .iter()
            .any(|l| l.trim() == "kubectl apply -f examples/getting-started.yaml"),
        "the commands to try: {printed:#?}"
    );
    let run = |args: &[&str]| -> String {
        let output = succeeded(
            Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args),
            &format!("kubectl {}", args.join(" ")),
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let manifest = manifest.to_string_lossy().into_owned();
    let applied = run(&["apply", "-f", &manifest]);
    for created in [
        "nodepool.karpenter.sh/default created",
        "ec2nodeclass.karpenter.k8s.aws/default created",
        "deployment.apps/inflate created",
    ] {
        assert!(applied.contains(created), "{applied}");
    }
    run(&["scale", "deployment", "inflate", "--replicas", "5"]);
    run(&[
        "wait",
        "--for=condition=Available",
        "deployment/inflate",
        "--timeout=60s",
    ]);
    run(&[
        "wait",
        "--for=condition=Ready",
        "nodeclaims",
        "--all",
        "--timeout=30s",
    ]);

    // What an EKS user sees: Karpenter's columns, filled in.
    let claims = run(&["get", "nodeclaims"]);
    let header: Vec<&str> = claims
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"],
        "{claims}"
    );
    let row: Vec<&str> = claims
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(
        row.len() == 7 && row[0].starts_with("default-") && row[2] == "on-demand" && row[5] == "True",
        "{claims}"
    );
    let pools = run(&["get", "nodepools", "-o", "jsonpath={.items[0].status.nodes}"]);
    assert_eq!(pools, "1");
    let nodes = run(&["get", "nodes", "-o", "name"]);
    assert_eq!(nodes.lines().count(), 1, "{nodes}");
    let phases = run(&["get", "pods", "-o", "jsonpath={.items[*].status.phase}"]);
    assert_eq!(phases, ["Running"; 5].join(" "));

    // The cluster as kubectl prints it, replayed by `joist what-if` with inflate's NodePool moved
    // to the m5 family: the node is replaced, and the pods run on.
    let snapshot = dir.join("snapshot.yaml");
    let printed = run(&[
        "get",
        "nodes,pods,nodepools,nodeclaims,ec2nodeclasses,pdb,daemonsets",
        "-A",
        "-o",
        "yaml",
    ]);
    std::fs::write(&snapshot, printed).unwrap_or_else(|e| panic!("{e}"));
    let change = dir.join("m5.yaml");
    let walkthrough = std::fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("{e}"));
    let pool = walkthrough.split("\n---\n").next().unwrap_or_default();
    let m5 = pool
        .replace("values: [\"c\", \"m\", \"r\"]", "values: [\"m\"]")
        .replace(
            "key: karpenter.k8s.aws/instance-generation\n          operator: Gt\n          values: [\"2\"]",
            "key: karpenter.k8s.aws/instance-family\n          operator: In\n          values: [\"m5\"]",
        );
    // `joist what-if --from SNAPSHOT CHANGE --for DURATION -o json` with `manifest` as the change.
    let what_if = |manifest: &str, duration: &str| -> serde_json::Value {
        std::fs::write(&change, manifest).unwrap_or_else(|e| panic!("{e}"));
        let output = succeeded(
            Command::new(env!("CARGO_BIN_EXE_joist"))
                .arg("what-if")
                .arg("--from")
                .arg(&snapshot)
                .arg(&change)
                .args(["--for", duration, "-o", "json"]),
            "joist what-if",
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"))
    };
    let outcome = what_if(&m5, "10m");
    assert_eq!(outcome["before"]["nodes_at_end"], 1, "{outcome:#}");
    assert_eq!(outcome["before"]["pods_disrupted"], 0, "{outcome:#}");
    assert_eq!(outcome["after"]["nodes_removed"]["drifted"], 1, "{outcome:#}");
    assert_eq!(outcome["after"]["nodes_at_end"], 1, "{outcome:#}");
    assert_eq!(outcome["after"]["pending"], serde_json::json!([]), "{outcome:#}");
    // `inflate` scaled from 5 to 12 in the same walkthrough manifest: its five pods stay where
    // they are, seven more get nodes.
    let deployment = walkthrough
        .split("\n---\n")
        .find(|d| d.contains("kind: Deployment"))
        .unwrap_or_default()
        .replace("replicas: 0", "replicas: 12");
    let outcome = what_if(&deployment, "5m");
    let after = &outcome["after"];
    assert_eq!(after["pods_disrupted"], 0, "no pod of inflate moved: {outcome:#}");
    assert_eq!(
        (&outcome["before"]["pods_running_end"], &after["pods_running_end"]),
        (&serde_json::json!(5), &serde_json::json!(12)),
        "the restored Deployment scaled, not a second one made: {outcome:#}"
    );
    assert!(
        after["nodes_launched"].as_u64().is_some_and(|n| n >= 1),
        "{outcome:#}"
    );
    assert_eq!(after["pending"], serde_json::json!([]), "{outcome:#}");

    // The same through kubectl's own generator (a protobuf body): bigger pods need more nodes.
    let created = run(&["create", "deployment", "web", "--image=nginx", "--replicas=0"]);
    assert_eq!(created.trim(), "deployment.apps/web created");
    run(&["set", "resources", "deployment", "web", "--requests=cpu=3"]);
    run(&["scale", "deployment", "web", "--replicas", "4"]);
    run(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    run(&[
        "wait",
        "--for=condition=Ready",
        "nodeclaims",
        "--all",
        "--timeout=30s",
    ]);
    let claims = run(&["get", "nodeclaims", "-o", "name"]);
    assert!(claims.lines().count() >= 2, "{claims}");
    let web = run(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].status.phase}",
    ]);
    assert_eq!(web, ["Running"; 4].join(" "));

    // Deleting them empties the nodes, and consolidation removes them.
    run(&["delete", "deployment", "inflate", "web"]);
    run(&["wait", "--for=delete", "nodeclaims", "--all", "--timeout=60s"]);
    run(&["wait", "--for=delete", "nodes", "--all", "--timeout=30s"]);
    assert_eq!(run(&["get", "nodeclaims,nodes", "-o", "name"]), "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `joist bench controller`: `joist run` on the simulated cloud (`CLOUD_PROVIDER=simulated`, its
/// NodePool actors over two threads) against `joist sim serve --no-controllers` over HTTP, two
/// processes measured apart: every pod comes up on nodes of both pools, and each process's memory
/// and CPU are read.
#[test]
fn bench_controller_runs_joist_run_apart_from_kubesim_and_measures_each() {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .args([
            "bench",
            "controller",
            "--pods",
            "20",
            "--pools",
            "2",
            "--shards",
            "2",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run joist bench controller: {e}"));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(value("pods"), 20.0, "{text}");
    assert!(value("nodes") >= 2.0, "a node per pool at least: {text}");
    assert!(
        value("first nodeclaim") < value("wall"),
        "the first NodeClaim comes before the pods are up: {text}"
    );
    assert!(
        value("pods created") > 0.0,
        "the last pod's creation is seen on the watch: {text}"
    );
    for process in ["controller", "kubesim"] {
        assert!(value(&format!("{process} peak memory")) > 0.0, "{text}");
        assert!(value(&format!("{process} cpu")) >= 0.0, "{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("scheduling ") && l.ends_with(" batches")),
        "the controller's scheduling metric is read: {text}"
    );
}

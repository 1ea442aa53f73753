//! The real kubectl and helm against kubesim's HTTP front door. The binaries are installed by
//! `scripts/kube-clients` (run here, as part of the test setup) into a cache outside the repo.

use std::{path::PathBuf, process::Command, sync::OnceLock};

use crate::cluster;

/// Paths of kubectl and helm, installing them on first use.
pub fn binaries() -> &'static (PathBuf, PathBuf) {
    static BINARIES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/kube-clients");
        let output = Command::new(&script).output().expect("run scripts/kube-clients");
        assert!(
            output.status.success(),
            "scripts/kube-clients failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let find = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("{key} missing in {text}"))
        };
        (find("KUBECTL="), find("HELM="))
    })
}

/// What a client run printed, and whether it exited zero.
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A client binary's command line with the kubeconfig, its caches and config kept beside it.
pub fn command(binary: &std::path::Path, kubeconfig: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    // The kubeconfig first: after a `--`, it would be the command kubectl runs in a container.
    command.arg("--kubeconfig").arg(kubeconfig).args(args);
    let dir = kubeconfig.parent().expect("dir");
    command.env("HOME", dir);
    command.env("HELM_CACHE_HOME", dir.join("helm-cache"));
    command.env("HELM_CONFIG_HOME", dir.join("helm-config"));
    command.env("HELM_DATA_HOME", dir.join("helm-data"));
    command
}

/// Runs a client binary with the kubeconfig.
pub async fn output(binary: &std::path::Path, kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    let mut command = command(binary, kubeconfig, args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("spawn client");
    Output {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs a client binary with the kubeconfig; returns stdout, failing the test on a non-zero exit.
pub async fn run(binary: &std::path::Path, kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let Output {
        success,
        stdout,
        stderr,
    } = output(binary, kubeconfig, args).await;
    assert!(
        success,
        "{} {} failed:\n{stdout}\n{stderr}",
        binary.display(),
        args.join(" ")
    );
    stdout
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kubesim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A Node named `worker` with 4 CPUs, for pods to run on.
pub const WORKER: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: worker\n  labels: {kubernetes.io/hostname: worker}\nstatus:\n  allocatable: {cpu: \"4\", memory: 8Gi, pods: \"110\"}\n  capacity: {cpu: \"4\", memory: 8Gi, pods: \"110\"}\n";

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: inflate
spec:
  replicas: 0
  selector:
    matchLabels: {app: inflate}
  template:
    metadata:
      labels: {app: inflate}
    spec:
      containers:
      - name: inflate
        image: public.ecr.aws/eks-distro/kubernetes/pause:3.7
        resources:
          requests: {cpu: 1}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_scales_waits_describes_and_deletes() {
    let (kubectl, _) = binaries();
    let cluster = cluster();
    let server = cluster.serve_http(0).await.expect("serve");
    let dir = scratch("kubectl");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    std::fs::write(dir.join("inflate.yaml"), DEPLOYMENT).expect("manifest");
    let manifest = dir.join("inflate.yaml");
    let manifest = manifest.to_str().expect("utf-8 path");

    let applied = run(kubectl, &kubeconfig, &["apply", "-f", manifest]).await;
    assert!(applied.contains("deployment.apps/inflate created"), "{applied}");
    let again = run(kubectl, &kubeconfig, &["apply", "-f", manifest]).await;
    assert!(
        again.contains("deployment.apps/inflate unchanged") || again.contains("configured"),
        "{again}"
    );
    run(
        kubectl,
        &kubeconfig,
        &["scale", "deployment/inflate", "--replicas=2"],
    )
    .await;
    let pending = crate::eventually("two pending pods in kubectl get", || {
        let kubeconfig = kubeconfig.clone();
        async move {
            let out = run(
                kubectl,
                &kubeconfig,
                &["get", "pods", "-l", "app=inflate", "--no-headers"],
            )
            .await;
            (out.lines().filter(|l| l.contains("Pending")).count() == 2).then_some(out)
        }
    })
    .await;
    assert!(pending.contains("inflate-"), "{pending}");
    let reasons = run(
        kubectl,
        &kubeconfig,
        &[
            "get",
            "pods",
            "-l",
            "app=inflate",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ],
    )
    .await;
    assert_eq!(reasons, "Unschedulable Unschedulable");
    let described = run(kubectl, &kubeconfig, &["describe", "deployment", "inflate"]).await;
    assert!(
        described.contains("Replicas:") && described.contains("inflate"),
        "{described}"
    );

    std::fs::write(dir.join("node.yaml"), WORKER).expect("node manifest");
    run(
        kubectl,
        &kubeconfig,
        &["create", "-f", dir.join("node.yaml").to_str().expect("path")],
    )
    .await;
    run(
        kubectl,
        &kubeconfig,
        &[
            "wait",
            "--for=condition=Available",
            "deployment/inflate",
            "--timeout=20s",
        ],
    )
    .await;
    let running = run(
        kubectl,
        &kubeconfig,
        &["get", "pods", "-l", "app=inflate", "--no-headers"],
    )
    .await;
    assert_eq!(
        running.lines().filter(|l| l.contains("Running")).count(),
        2,
        "{running}"
    );
    run(kubectl, &kubeconfig, &["delete", "-f", manifest]).await;
    crate::eventually("the pods to be gone", || {
        let kubeconfig = kubeconfig.clone();
        async move {
            let out = run(
                kubectl,
                &kubeconfig,
                &["get", "pods", "-l", "app=inflate", "--no-headers"],
            )
            .await;
            out.trim().is_empty().then_some(())
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_a_chart() {
    let (kubectl, helm) = binaries();
    let cluster = cluster();
    let server = cluster.serve_http(0).await.expect("serve");
    let dir = scratch("helm");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let chart = dir.join("demo");
    std::fs::create_dir_all(chart.join("templates")).expect("chart dir");
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: demo\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(chart.join("values.yaml"), "replicas: 1\ngreeting: hello\n").expect("values");
    std::fs::write(
        chart.join("templates/all.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\ndata:\n  greeting: {{ .Values.greeting }}\n---\n"
            .to_owned()
            + &DEPLOYMENT.replace("name: inflate", "name: {{ .Release.Name }}-app").replace("replicas: 0", "replicas: {{ .Values.replicas }}"),
    )
    .expect("template");
    let chart = chart.to_str().expect("path");

    const GREETING: [&str; 5] = [
        "get",
        "configmap",
        "demo-settings",
        "-o",
        "jsonpath={.data.greeting}",
    ];
    let installed = run(helm, &kubeconfig, &["install", "demo", chart]).await;
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    let greeting = run(kubectl, &kubeconfig, &GREETING).await;
    assert_eq!(greeting, "hello");
    let upgraded = run(
        helm,
        &kubeconfig,
        &[
            "upgrade",
            "demo",
            chart,
            "--set",
            "greeting=bonjour",
            "--set",
            "replicas=2",
        ],
    )
    .await;
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    let greeting = run(kubectl, &kubeconfig, &GREETING).await;
    assert_eq!(greeting, "bonjour");
    let replicas = run(
        kubectl,
        &kubeconfig,
        &["get", "deployment", "demo-app", "-o", "jsonpath={.spec.replicas}"],
    )
    .await;
    assert_eq!(replicas, "2");
    let releases = run(helm, &kubeconfig, &["list", "--short"]).await;
    assert_eq!(releases.trim(), "demo");
    run(helm, &kubeconfig, &["uninstall", "demo"]).await;
    let left = run(
        kubectl,
        &kubeconfig,
        &[
            "get",
            "configmaps,deployments",
            "--no-headers",
            "--ignore-not-found",
        ],
    )
    .await;
    assert!(!left.contains("demo-"), "{left}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A manifest of `tests/fixtures/kubectl/`, which the real-control-plane differential applies too.
fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/kubectl/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A kubesim cluster with Joist's CRDs served over HTTP, and a kubeconfig for it in a scratch
/// directory named after `name`.
async fn served_with_crds(name: &str) -> (joist_kubesim::Cluster, joist_kubesim::HttpServer, PathBuf) {
    let cluster = cluster();
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .expect("crds");
    let server = cluster.serve_http(0).await.expect("serve");
    let kubeconfig = scratch(name).join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    (cluster, server, kubeconfig)
}

/// As on a real cluster: `kubectl apply --server-side` of a manifest without a field removes the
/// field it applied before, `managedFields` say who owns what, and an apply over a value another
/// manager set is refused until forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_owns_fields_as_on_a_cluster() {
    let (kubectl, _) = binaries();
    let (_cluster, _server, kubeconfig) = served_with_crds("kubectl-ssa").await;
    let (spread, packed) = (fixture("spread.yaml"), fixture("packed.yaml"));
    let read = async |jsonpath: &str| {
        run(
            kubectl,
            &kubeconfig,
            &[
                "get",
                "deployment",
                "web",
                "--show-managed-fields",
                "-o",
                jsonpath,
            ],
        )
        .await
    };

    run(kubectl, &kubeconfig, &["apply", "--server-side", "-f", &spread]).await;
    assert_eq!(
        read("jsonpath={.spec.template.spec.affinity.podAntiAffinity..topologyKey}").await,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        read("jsonpath={.metadata.managedFields[*].manager}/{.metadata.managedFields[*].operation}").await,
        "kubectl/Apply"
    );

    run(kubectl, &kubeconfig, &["apply", "--server-side", "-f", &packed]).await;
    assert_eq!(
        read("jsonpath={.spec.template.spec.affinity}{.metadata.labels}").await,
        "",
        "dropped from the manifest, dropped from the object"
    );

    run(
        kubectl,
        &kubeconfig,
        &["scale", "deployment", "web", "--replicas=3"],
    )
    .await;
    run(
        kubectl,
        &kubeconfig,
        &[
            "patch",
            "deployment",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true,"replicas":5}}"#,
        ],
    )
    .await;
    let refused = output(kubectl, &kubeconfig, &["apply", "--server-side", "-f", &packed]).await;
    assert!(!refused.success, "{}", refused.stdout);
    assert!(
        refused.stderr.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using apps/v1: .spec.replicas"#
        ),
        "{}",
        refused.stderr
    );
    run(
        kubectl,
        &kubeconfig,
        &["apply", "--server-side", "--force-conflicts", "-f", &packed],
    )
    .await;
    assert_eq!(
        read("jsonpath={.spec.replicas} {.spec.paused}").await,
        "2 true",
        "forced: replicas taken over, paused still kubectl-patch's"
    );
    let _ = std::fs::remove_dir_all(kubeconfig.parent().expect("scratch dir"));
}

/// As on a real cluster: kubectl's strict field validation refuses a manifest with unknown fields,
/// naming them; told to warn it prints each and the server drops them; server-side apply refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_or_dropped_with_a_warning_as_on_a_cluster() {
    let (kubectl, _) = binaries();
    let (_cluster, _server, kubeconfig) = served_with_crds("kubectl-unknown-fields").await;
    let (misplaced, typo) = (fixture("misplaced.yaml"), fixture("pool-typo.yaml"));

    let refused_saying = async |args: &[&str], words: &str| {
        let refused = output(kubectl, &kubeconfig, args).await;
        assert!(
            !refused.success && refused.stderr.contains(words),
            "kubectl {}: {}",
            args.join(" "),
            refused.stderr
        );
    };
    refused_saying(
        &["apply", "-f", &misplaced],
        r#"strict decoding error: unknown field "spec.template.annotations", unknown field "spec.template.spec.containers[0].imagePolicy""#,
    )
    .await;
    refused_saying(
        &["apply", "--server-side", "-f", &misplaced],
        ".spec.template.annotations: field not declared in schema",
    )
    .await;
    refused_saying(
        &["apply", "-f", &typo],
        r#"NodePool in version "v1" cannot be handled as a NodePool: strict decoding error: unknown field "spec.disruptions""#,
    )
    .await;

    let warned = output(
        kubectl,
        &kubeconfig,
        &["create", "--validate=warn", "-f", &misplaced],
    )
    .await;
    assert!(warned.success, "{}", warned.stderr);
    assert!(
        warned
            .stderr
            .contains(r#"Warning: unknown field "spec.template.annotations""#),
        "{}",
        warned.stderr
    );
    let template = run(
        kubectl,
        &kubeconfig,
        &[
            "get",
            "deployment",
            "misplaced",
            "-o",
            "jsonpath={.spec.template}",
        ],
    )
    .await;
    assert!(
        !template.contains("team") && !template.contains("imagePolicy"),
        "dropped: {template}"
    );
    let _ = std::fs::remove_dir_all(kubeconfig.parent().expect("scratch dir"));
}

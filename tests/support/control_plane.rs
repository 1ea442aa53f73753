//! A real Kubernetes control plane for a test: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK, built and started by `scripts/kube-control-plane` on 127.0.0.1 with
//! state in a temporary directory. Stopped when the value is dropped and, should the test process
//! die first, by the script's guard when the process is gone. A failed test leaves the directory
//! behind, with every process's log.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use super::{
    joist_process::Controller,
    tools::{self, root, succeeded},
};

/// A running control plane.
pub struct ControlPlane {
    dir: PathBuf,
    /// A cluster-admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The API server's URL.
    pub server: String,
}

impl ControlPlane {
    /// Starts one with its state in a fresh directory named after `name`.
    pub fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("joist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let output = succeeded(
            Command::new(root().join("scripts/kube-control-plane"))
                .arg("up")
                .arg(&dir)
                .args(["--owner", &std::process::id().to_string()]),
            "scripts/kube-control-plane up",
        );
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        let value = |name: &str| {
            printed
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("scripts/kube-control-plane up printed no {name}=: {printed}"))
                .to_owned()
        };
        Self {
            kubeconfig: PathBuf::from(value("KUBECONFIG")),
            server: value("SERVER"),
            dir,
        }
    }

    /// One started as [`ControlPlane::start`] with Joist's CRDs (`deploy/crds`) created and
    /// Established.
    pub fn with_joist_crds(name: &str) -> Self {
        let cluster = Self::start(name);
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
        cluster
    }

    /// The state directory (logs in `logs/`, certificates in `pki/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A cluster-admin client.
    pub async fn client(&self) -> kube::Client {
        client_from(&self.kubeconfig).await
    }

    /// Runs the real kubectl (from `scripts/kube-clients`) against this cluster as cluster-admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("run kubectl: {e}"))
    }

    /// kubectl with `args`, failing the test when it fails; its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for ControlPlane {
    /// Stops it; its directory (logs, certificates, the controllers' logs) stays only when the test
    /// failed.
    fn drop(&mut self) {
        let _ = Command::new(root().join("scripts/kube-control-plane"))
            .arg("down")
            .arg(&self.dir)
            .output();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The EC2NodeClass `default` Joist's KWOK cloud resolves (its images and subnets are the
/// simulated cloud's; the selectors are only checked for form).
pub const KWOK_NODE_CLASS: &str = "apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: default}
spec:
  role: KarpenterNodeRole-kwok
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: kwok}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: kwok}}]
";

/// The project's KWOK catalog, in the format of Karpenter's KWOK provider: both controllers sell it.
pub fn kwok_types() -> PathBuf {
    root().join("tests/fixtures/kwok/instance_types.json")
}

impl ControlPlane {
    /// `joist run` named `name` with the KWOK cloud selling [`kwok_types`], as the user of
    /// `kubeconfig`, with `extra` settings besides; its log is `NAME.log` in this plane's directory.
    pub fn joist(&self, kubeconfig: &Path, name: &str, extra: &[(&str, &str)]) -> Controller {
        let kubeconfig = kubeconfig.to_string_lossy();
        let types = kwok_types();
        let types = types.to_string_lossy();
        let env = [
            ("KUBECONFIG", kubeconfig.as_ref()),
            ("CLUSTER_NAME", "kwok"),
            ("CLUSTER_ENDPOINT", self.server.as_str()),
            ("CLOUD_PROVIDER", "kwok"),
            ("INSTANCE_TYPES_FILE_PATH", types.as_ref()),
            ("SYSTEM_NAMESPACE", "kube-system"),
            ("POD_NAME", name),
            ("LISTEN_ADDRESS", "127.0.0.1"),
            ("METRICS_PORT", "0"),
            ("HEALTH_PROBE_PORT", "0"),
        ];
        let env = env.into_iter().chain(extra.iter().copied());
        Controller::joist(self.dir.join(format!("{name}.log")), env)
    }
}

/// A kubesim cluster with Joist's CRDs, the peer the real control plane is compared with.
pub fn kubesim_with_joist_crds() -> joist_kubesim::Cluster {
    let cluster = joist_kubesim::Cluster::start(joist_kubesim::ClusterSettings::default());
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .expect("kubesim takes Joist's CRDs");
    cluster
}

/// A client from the kubeconfig at `path`.
pub async fn client_from(path: &Path) -> kube::Client {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"))
}

/// The real kubectl, installed on first use.
pub fn kubectl() -> &'static Path {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL.get_or_init(|| tools::path(&tools::installed("kube-clients"), "kube-clients", "KUBECTL"))
}

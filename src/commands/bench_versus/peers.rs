//! What a run of `joist bench versus-karpenter` starts: a fresh local control plane
//! (`scripts/kube-control-plane`), and on it one controller, Karpenter's KWOK controller
//! (`scripts/karpenter-kwok`) or `joist run` with the KWOK cloud, each with its CRDs, its node
//! class and the suite's NodePool. The scripts are found in `$JOIST_SCRIPTS`, else in `scripts/`
//! of the current directory (a checkout of Joist); a missing script or one that fails stops the
//! benchmark with its name and what it printed.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, api::PostParams};

use super::{
    super::bench_controller::{BenchError, Process, client, failed_to, free_port},
    poll,
};

/// The two controllers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// Karpenter v1.14.1's KWOK controller.
    Karpenter,
    /// `joist run` with `CLOUD_PROVIDER=kwok`.
    Joist,
}

impl Contender {
    /// Its name in the output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Karpenter => "karpenter",
            Self::Joist => "joist",
        }
    }
}

/// The directory holding the peer scripts.
pub fn scripts() -> Result<PathBuf, BenchError> {
    let dir = std::env::var_os("JOIST_SCRIPTS").map_or_else(|| PathBuf::from("scripts"), PathBuf::from);
    if dir.join("kube-control-plane").is_file() && dir.join("karpenter-kwok").is_file() {
        return Ok(dir);
    }
    Err(BenchError::Script {
        script: dir.join("karpenter-kwok"),
        message: "not found: run from a checkout of Joist, or set JOIST_SCRIPTS to its scripts/ directory"
            .to_owned(),
    })
}

/// Runs `script` with `args` (and `env`), returning what it printed on stdout; its stderr is
/// passed through, so a build's progress shows.
fn script(scripts: &Path, name: &str, args: &[&str], env: &[(&str, &OsStr)]) -> Result<String, BenchError> {
    let path = scripts.join(name);
    let mut command = Command::new(&path);
    command.args(args).stderr(Stdio::inherit());
    for (key, value) in env {
        command.env(key, value);
    }
    let failed = |message: String| BenchError::Script {
        script: path.clone(),
        message,
    };
    let output = command.output().map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(format!("{} failed ({})", args.join(" "), output.status)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The value of the `NAME=value` line `printed` has.
fn printed_value(printed: &str, name: &str) -> Option<String> {
    printed
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}

/// Builds Karpenter's KWOK controller when missing; its instance-types file, the catalog both
/// controllers are given.
pub fn karpenter_catalog(scripts: &Path) -> Result<PathBuf, BenchError> {
    let printed = script(scripts, "karpenter-kwok", &["install"], &[])?;
    let bin = printed_value(&printed, "BIN").ok_or_else(|| BenchError::Script {
        script: scripts.join("karpenter-kwok"),
        message: format!("install printed no BIN=: {printed}"),
    })?;
    Ok(PathBuf::from(bin).join("instance_types.json"))
}

/// A running control plane, stopped when dropped.
pub struct ControlPlane {
    scripts: PathBuf,
    dir: PathBuf,
    /// Its cluster-admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The API server's URL.
    pub server: String,
}

impl ControlPlane {
    /// Starts one with its state in `dir`.
    pub fn up(scripts: &Path, dir: &Path) -> Result<Self, BenchError> {
        let _ = std::fs::remove_dir_all(dir);
        let owner = std::process::id().to_string();
        let dir_text = dir.to_string_lossy();
        let printed = script(
            scripts,
            "kube-control-plane",
            &["up", &dir_text, "--owner", &owner],
            &[],
        )?;
        let value = |name: &str| {
            printed_value(&printed, name).ok_or_else(|| BenchError::Script {
                script: scripts.join("kube-control-plane"),
                message: format!("up printed no {name}=: {printed}"),
            })
        };
        Ok(Self {
            scripts: scripts.to_owned(),
            dir: dir.to_owned(),
            kubeconfig: PathBuf::from(value("KUBECONFIG")?),
            server: value("SERVER")?,
        })
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(self.scripts.join("kube-control-plane"))
            .arg("down")
            .arg(&self.dir)
            .output();
    }
}

/// The suite's NodePool for `contender`: the same requirements, labels and disruption for both;
/// only the node class differs, each controller's own (Karpenter's KWOK provider takes a
/// KWOKNodeClass, Joist's KWOK cloud an EC2NodeClass).
pub fn node_pool(contender: Contender) -> String {
    let (class, reference) = match contender {
        Contender::Karpenter => (
            "",
            "{group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}",
        ),
        Contender::Joist => (
            "apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: default}
spec:
  role: KarpenterNodeRole-kwok
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: kwok}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: kwok}}]
---
",
            "{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}",
        ),
    };
    format!(
        "{class}apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
  labels: {{testing/cluster: unspecified}}
spec:
  template:
    metadata:
      labels: {{testing/cluster: unspecified}}
    spec:
      requirements:
        - {{key: kubernetes.io/os, operator: In, values: [linux]}}
        - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
        - {{key: karpenter.kwok.sh/instance-size, operator: Lt, values: ['32']}}
      nodeClassRef: {reference}
      expireAfter: Never
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 30s
    budgets: [{{nodes: '100%'}}]
"
    )
}

/// How long a controller's CRDs have to become Established.
const ESTABLISHED_WITHIN: Duration = Duration::from_secs(60);

/// Prepares `cluster` for `contender` and starts it, logging to `log`; the controller's process
/// (its pid is the controller's own, for `/proc`).
pub async fn start(
    contender: Contender,
    scripts: &Path,
    cluster: &ControlPlane,
    catalog: &Path,
    joist: &Path,
    log: &Path,
    log_level: &str,
) -> Result<Process, BenchError> {
    let spawn = |source| BenchError::Spawn {
        what: contender.name(),
        source,
    };
    let out = std::fs::File::create(log).map_err(spawn)?;
    let err = out.try_clone().map_err(spawn)?;
    let mut command = match contender {
        Contender::Karpenter => {
            // Joist's KWOK cloud boots an instance in BOOT_SECONDS; Karpenter's KWOK provider is
            // given the same delay before a launch's Node appears.
            let delay = format!("{}s", super::super::sim::BOOT_SECONDS);
            script(
                scripts,
                "karpenter-kwok",
                &["prepare"],
                &[
                    ("KUBECONFIG", cluster.kubeconfig.as_os_str()),
                    ("NODE_REGISTRATION_DELAY", delay.as_ref()),
                ],
            )?;
            let mut command = Command::new(scripts.join("karpenter-kwok"));
            command.arg("run");
            command
        }
        Contender::Joist => {
            joist_crds(cluster).await?;
            let mut command = Command::new(joist);
            command
                .arg("run")
                .env("CLUSTER_NAME", "kwok")
                .env("CLUSTER_ENDPOINT", &cluster.server)
                .env("CLOUD_PROVIDER", "kwok")
                .env("DISABLE_LEADER_ELECTION", "true")
                .env("LISTEN_ADDRESS", "127.0.0.1");
            command
        }
    };
    let metrics = free_port().map_err(spawn)?;
    let health = free_port().map_err(spawn)?;
    let child = command
        .env("LOG_LEVEL", log_level)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("INSTANCE_TYPES_FILE_PATH", catalog)
        .env("METRICS_PORT", metrics.to_string())
        .env("HEALTH_PROBE_PORT", health.to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(spawn)?;
    Ok(Process { child })
}

/// Creates Joist's CRDs and waits until each is Established.
async fn joist_crds(cluster: &ControlPlane) -> Result<(), BenchError> {
    let client = client(&cluster.kubeconfig).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let mut names = Vec::new();
    for (_, crd) in joist_messages::apis::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.create(&PostParams::default(), &crd)
            .await
            .map_err(failed_to(format!("creating CRD {name}")))?;
        names.push(name);
    }
    let mut waiting = names.as_slice();
    let established = poll(ESTABLISHED_WITHIN, Duration::from_millis(200), async || {
        while let Some((name, rest)) = waiting.split_first() {
            let crd = crds
                .get(name)
                .await
                .map_err(failed_to(format!("reading CRD {name}")))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if !established {
                return Ok(false);
            }
            waiting = rest;
        }
        Ok(true)
    })
    .await?;
    match waiting.first() {
        Some(name) if !established => Err(BenchError::Script {
            script: "deploy/crds".into(),
            message: format!(
                "CRD {name} not Established within {}s",
                ESTABLISHED_WITHIN.as_secs()
            ),
        }),
        _ => Ok(()),
    }
}

//! `joist bench controller --pods N | --nodes N [--pools P] [--shards S] [--replicas R]`: the
//! controller alone, the way it runs in production. Processes of this binary on real time: kubesim
//! serving the Kubernetes API over HTTP (`joist sim serve --no-controllers`) and `joist run` against
//! it with `CLOUD_PROVIDER=simulated` and `NODEPOOL_SHARDS=S` — one, or R replicas with
//! `REPLICA_SHARDS=R` splitting the NodePools between them (each its own simulated cloud), whose
//! memory and CPU time are reported replica by replica. The benchmark applies `joist bench e2e`'s NodePools and Deployments
//! through the API, waits for the pools to be Ready, scales the Deployments to `N` one-CPU pods in
//! all, and waits for every pod to be ready.
//!
//! It prints one `name value` line per figure: pods ready, nodes, wall time from the scale-up to the
//! last pod ready, pods/s, when the last pod was created and when the first NodeClaim was (both from
//! the scale-up, as watches of their metadata opened before it first showed them:
//! [`super::creations`]) and the time between the two (negative when the first NodeClaim came
//! before the last pod), the mean time the
//! controller took to simulate scheduling one batch (its
//! `karpenter_scheduler_scheduling_duration_seconds`), and each process's peak resident memory and
//! CPU time over the run (both from `/proc`, so Linux only). The controller's figures include the
//! simulated cloud, which runs inside it and is small next to the controllers.
//!
//! Failures: a process that does not start or dies, NodePools that are not Ready within a minute,
//! or pods not all ready by the deadline stop the benchmark with an error naming the controller's
//! log, which is then kept in the temporary directory (removed after a run that succeeds). Both
//! processes are killed when it ends.

use std::{
    io::{self, BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::Duration,
};

use http_body_util::BodyExt as _;
use joist_messages::apis::{NodeClaim, NodePool};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, Pod},
};
use kube::{
    Api,
    api::{DynamicObject, ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::GroupVersionKind,
    discovery,
};
use serde_json::{Value, json};

use super::{
    CommandError,
    bench::{WallInstant, cpu_seconds_of, peak_memory_mib_of},
    bench_e2e::{self, NODE_CLASS, Workload},
    creations::Creations,
};

/// How long `joist run` has to make every NodePool Ready.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How often the benchmark looks at the cluster while pods come up.
const POLL: Duration = Duration::from_millis(100);
/// The benchmark gives up when pods are not all ready by this long plus a second per 50 pods.
const DEADLINE_BASE: Duration = Duration::from_secs(120);

/// What `joist bench controller` was asked for.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The pods the Deployments ask for, packed or a node each.
    pub workload: Workload,
    /// NodePools, each with its Deployment.
    pub pools: usize,
    /// `NODEPOOL_SHARDS` for the controller.
    pub shards: usize,
    /// Replicas of the controller; more than one splits the NodePools between them
    /// (`REPLICA_SHARDS` set to this).
    pub replicas: u32,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum BenchError {
    /// A process could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which process.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// kubesim ended before printing where it serves.
    #[error("joist sim serve stopped before it printed its address")]
    NoAddress,
    /// The API server's client could not be configured from kubesim's kubeconfig.
    #[error("cannot use the kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A request to kubesim failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// The benchmark's own manifests did not parse (a bug).
    #[error("the benchmark's manifests: {message}")]
    Manifest {
        /// Why.
        message: String,
    },
    /// A peer script could not be run, or failed.
    #[error("{script}: {message}")]
    Script {
        /// The script (or the file it gave).
        script: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The controller did not get somewhere in time, or ended.
    #[error("{what}; the controller's log is {log}")]
    Controller {
        /// What did not happen.
        what: String,
        /// Where its log is.
        log: PathBuf,
    },
}

/// A child process, killed when dropped.
pub(super) struct Process {
    pub(super) child: Child,
}

impl Process {
    pub(super) fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Its peak memory and CPU seconds so far.
    fn usage(&self) -> (Option<u64>, Option<f64>) {
        let pid = self.pid();
        (peak_memory_mib_of(&pid), cpu_seconds_of(&pid))
    }

    /// Whether it has ended.
    pub(super) fn ended(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the benchmark with this binary's two processes and prints its figures.
pub fn run(options: Options, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let joist = std::env::current_exe().map_err(|source| CommandError::Read {
        path: "this executable (/proc/self/exe)".into(),
        source,
    })?;
    let runtime = super::runtime()?;
    let dir = std::env::temp_dir().join(format!("joist-bench-controller-{}", std::process::id()));
    let lines = runtime
        .block_on(measure(options, &joist, &dir))
        .map_err(|e| CommandError::Start {
            message: e.to_string(),
        })?;
    // Kept on failure, for the controller's log.
    let _ = std::fs::remove_dir_all(&dir);
    for (name, value) in lines {
        writeln!(out, "{name} {value}").map_err(CommandError::stdout)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The figures of one run, as `(name, value)` lines.
async fn measure(options: Options, joist: &Path, dir: &Path) -> Result<Vec<(String, String)>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Spawn {
        what: "the benchmark's temporary directory",
        source,
    })?;
    let kubeconfig = dir.join("kubeconfig");
    let (kubesim, url) = serve(joist, &kubeconfig)?;
    let mut controllers = (0..options.replicas.max(1))
        .map(|replica| controller(joist, &kubeconfig, &url, dir, replica, options))
        .collect::<Result<Vec<_>, _>>()?;
    let client = client(&kubeconfig).await?;
    let pools = options.pools.max(1);
    let log = dir.join(log_name(0));
    let stopped = |what: String| BenchError::Controller {
        what,
        log: log.clone(),
    };

    apply(&client, &manifests(options.workload, pools)).await?;
    let node_pools: Api<NodePool> = Api::all(client.clone());
    let ready_by = tokio::time::Instant::now() + READY_WITHIN;
    while ready_pools(&node_pools).await? < pools {
        if any_ended(&mut controllers) || tokio::time::Instant::now() > ready_by {
            return Err(stopped(format!(
                "the controller did not make {pools} NodePools Ready within {}s",
                READY_WITHIN.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    }

    let pod_creations = Creations::watch::<Pod>(Api::namespaced(client.clone(), "default")).await;
    let claim_creations = Creations::watch::<NodeClaim>(Api::all(client.clone())).await;
    let (_, kubesim_cpu_before) = kubesim.usage();
    let cpu_before: Vec<Option<f64>> = controllers.iter().map(|(c, _)| c.usage().1).collect();
    let start = WallInstant::now();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    for pool in 0..pools {
        let name = format!("inflate-{}", bench_e2e::pool_name(pools, pool));
        let replicas = bench_e2e::share(options.workload.pods(), pools, pool);
        deployments
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .map_err(failed_to(format!("scaling Deployment default/{name}")))?;
    }
    let pods = options.workload.pods();
    let deadline = DEADLINE_BASE + Duration::from_secs((pods / 50) as u64);
    let ready = loop {
        let ready = ready_replicas(&deployments).await?;
        if ready >= pods {
            break ready;
        }
        if any_ended(&mut controllers) || start.elapsed() > deadline {
            return Err(stopped(format!(
                "{ready} of {pods} pods were ready after {}s",
                start.elapsed().as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    let since_start = |at: Option<WallInstant>| at.map(|at| at.saturating_duration_since(start));
    let pods_created = pod_creations.counted();
    let created_at = since_start(pods_created.last.filter(|_| pods_created.objects >= pods));
    let first_claim_at = since_start(claim_creations.counted().first);
    let wall = start.elapsed().as_secs_f64();
    let (kubesim_peak, kubesim_cpu) = kubesim.usage();
    let usage: Vec<(Option<u64>, Option<f64>)> = controllers.iter().map(|(c, _)| c.usage()).collect();
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(failed_to("listing Nodes"))?
        .items
        .len();
    let mut means = Vec::new();
    for (_, port) in &controllers {
        means.extend(scheduling_mean(*port).await);
    }
    let batches: u64 = means.iter().map(|(_, batches)| batches).sum();
    let scheduling = if means.is_empty() || batches == 0 {
        "unknown".to_owned()
    } else {
        let mean = means.iter().map(|(mean, n)| mean * *n as f64).sum::<f64>() / batches as f64;
        format!("{:.1} ms over {batches} batches", mean * 1000.0)
    };
    let seconds =
        |at: Option<Duration>| at.map_or_else(|| "never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    let mib = |peak: Option<u64>| peak.map_or_else(|| "unknown".to_owned(), |m| format!("{m} MiB"));
    let cpu = |after: Option<f64>, before: Option<f64>| match (after, before) {
        (Some(after), Some(before)) => format!("{:.1} s", after - before),
        _ => "unknown".to_owned(),
    };
    let mut lines = vec![
        ("pods".to_owned(), ready.to_string()),
        ("nodes".to_owned(), nodes.to_string()),
        ("wall".to_owned(), format!("{wall:.1} s")),
        (
            "pods/s".to_owned(),
            format!("{:.0}", ready as f64 / wall.max(1e-9)),
        ),
        ("pods created".to_owned(), seconds(created_at)),
        ("first nodeclaim".to_owned(), seconds(first_claim_at)),
        (
            "first nodeclaim after the last pod".to_owned(),
            match (first_claim_at, created_at) {
                (Some(claim), Some(created)) => {
                    format!("{:.2} s", claim.as_secs_f64() - created.as_secs_f64())
                }
                _ => "unknown".to_owned(),
            },
        ),
        ("scheduling".to_owned(), scheduling),
    ];
    if let [(peak, cpu_after)] = usage[..] {
        lines.push(("controller peak memory".to_owned(), mib(peak)));
        lines.push(("controller cpu".to_owned(), cpu(cpu_after, cpu_before[0])));
    } else {
        for (replica, ((peak, cpu_after), before)) in usage.into_iter().zip(cpu_before).enumerate() {
            lines.push((format!("replica {replica} peak memory"), mib(peak)));
            lines.push((format!("replica {replica} cpu"), cpu(cpu_after, before)));
        }
    }
    lines.push(("kubesim peak memory".to_owned(), mib(kubesim_peak)));
    lines.push(("kubesim cpu".to_owned(), cpu(kubesim_cpu, kubesim_cpu_before)));
    Ok(lines)
}

/// Whether a controller replica has ended.
fn any_ended(controllers: &mut [(Process, u16)]) -> bool {
    controllers.iter_mut().any(|(controller, _)| controller.ended())
}

/// The log of the controller replica `replica`.
fn log_name(replica: u32) -> String {
    if replica == 0 {
        "joist-run.log".to_owned()
    } else {
        format!("joist-run-{replica}.log")
    }
}

/// A failed request's error, saying what it was for.
pub(super) fn failed_to(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Api { what, source }
}

/// Starts kubesim alone, writing its kubeconfig to `kubeconfig`; the process and its URL.
fn serve(joist: &Path, kubeconfig: &Path) -> Result<(Process, String), BenchError> {
    let mut child = Command::new(joist)
        .args(["sim", "serve", "--no-controllers", "--kubeconfig"])
        .arg(kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| BenchError::Spawn {
            what: "joist sim serve",
            source,
        })?;
    let stdout = child.stdout.take();
    let process = Process { child };
    // Read to the end of what it prints at start, so that nothing it writes meets a closed pipe.
    let printed: Vec<String> = stdout
        .map(|stdout| {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .take_while(|line| line != "Ctrl-C stops it.")
                .collect()
        })
        .unwrap_or_default();
    let url = printed
        .iter()
        .find_map(|line| {
            let rest = line.strip_prefix("kubesim is serving ")?;
            rest.split_once(" on ")?.1.split_whitespace().next()
        })
        .ok_or(BenchError::NoAddress)?;
    Ok((process, url.to_owned()))
}

/// Starts replica `replica` of `joist run` on the simulated cloud against the API server at
/// `url`, logging to its file in `dir` ([`log_name`]); the process and the port of its metrics.
/// One replica runs alone (no leader election); several split the NodePools between them.
fn controller(
    joist: &Path,
    kubeconfig: &Path,
    url: &str,
    dir: &Path,
    replica: u32,
    options: Options,
) -> Result<(Process, u16), BenchError> {
    let spawn = |source| BenchError::Spawn {
        what: "joist run",
        source,
    };
    let log = std::fs::File::create(dir.join(log_name(replica))).map_err(spawn)?;
    let port = free_port().map_err(spawn)?;
    let health = free_port().map_err(spawn)?;
    let mut command = Command::new(joist);
    if options.replicas > 1 {
        command
            .env("REPLICA_SHARDS", options.replicas.to_string())
            .env("POD_NAME", format!("bench-{replica}"))
            .env("LEADER_ELECTION_NAMESPACE", "default");
    } else {
        command.env("DISABLE_LEADER_ELECTION", "true");
    }
    let child = command
        .arg("run")
        .env("KUBECONFIG", kubeconfig)
        .env("CLUSTER_NAME", "bench")
        .env("CLUSTER_ENDPOINT", url)
        .env("CLOUD_PROVIDER", "simulated")
        .env("AWS_REGION", "us-west-2")
        .env("NODEPOOL_SHARDS", options.shards.to_string())
        .env("LISTEN_ADDRESS", "127.0.0.1")
        .env("METRICS_PORT", port.to_string())
        .env("HEALTH_PROBE_PORT", health.to_string())
        .env("LOG_LEVEL", "error")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(spawn)?;
    Ok((Process { child }, port))
}

/// A port free on 127.0.0.1 a moment ago.
pub(super) fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// A client of the API server `kubeconfig` names.
pub(super) async fn client(kubeconfig: &Path) -> Result<kube::Client, BenchError> {
    let failed = |message: String| BenchError::Kubeconfig {
        path: kubeconfig.to_owned(),
        message,
    };
    let config = Kubeconfig::read_from(kubeconfig).map_err(|e| failed(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .map_err(|e| failed(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| failed(e.to_string()))
}

/// The EC2NodeClass, and each pool with its Deployment for `workload` scaled to zero.
fn manifests(workload: Workload, pools: usize) -> String {
    (0..pools).fold(NODE_CLASS.to_owned(), |mut text, pool| {
        text.push_str(&bench_e2e::pool_manifests(
            &bench_e2e::pool_name(pools, pool),
            workload,
        ));
        text
    })
}

/// Applies every document of `text` with server-side apply, finding each kind in discovery.
pub(super) async fn apply(client: &kube::Client, text: &str) -> Result<(), BenchError> {
    let manifest = |message: String| BenchError::Manifest { message };
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| manifest(e.to_string()))?;
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let object: DynamicObject = serde_json::from_value(document).map_err(|e| manifest(e.to_string()))?;
        let types = object.types.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let what = format!("applying {} {name}", types.kind);
        let gvk = GroupVersionKind::try_from(&types).map_err(|e| manifest(format!("{what}: {e}")))?;
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
            .await
            .map_err(failed_to(what.clone()))?;
        let api: Api<DynamicObject> = match capabilities.scope {
            discovery::Scope::Namespaced => Api::namespaced_with(client.clone(), "default", &resource),
            discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &name,
            &PatchParams::apply("joist-bench").force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(failed_to(what))?;
    }
    Ok(())
}

/// Every object `api` lists; `kind` names them in an error.
async fn list<K>(api: &Api<K>, kind: &str) -> Result<Vec<K>, BenchError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(failed_to(format!("listing {kind}")))?;
    Ok(listed.items)
}

/// How many NodePools have `Ready=True`.
async fn ready_pools(node_pools: &Api<NodePool>) -> Result<usize, BenchError> {
    Ok(list(node_pools, "NodePools")
        .await?
        .iter()
        .filter(|pool| {
            pool.status
                .as_ref()
                .and_then(|status| status.conditions.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|ready| ready.status == "True")
        })
        .count())
}

/// Pods ready, in all the Deployments.
async fn ready_replicas(deployments: &Api<Deployment>) -> Result<usize, BenchError> {
    Ok(list(deployments, "Deployments")
        .await?
        .iter()
        .filter_map(|d| d.status.as_ref()?.ready_replicas)
        .map(|ready| usize::try_from(ready).unwrap_or(0))
        .sum())
}

/// The controller's mean time to simulate scheduling one batch, in seconds, and the number of
/// batches, from its metrics on `port`; `None` when they cannot be read.
async fn scheduling_mean(port: u16) -> Option<(f64, u64)> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let uri = format!("http://127.0.0.1:{port}/metrics").parse().ok()?;
    let response = client.get(uri).await.ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let text = std::str::from_utf8(&body).ok()?;
    let count = super::metric_total(text, "karpenter_scheduler_scheduling_duration_seconds_count");
    let sum = super::metric_total(text, "karpenter_scheduler_scheduling_duration_seconds_sum");
    (count > 0.0).then(|| (sum / count, count as u64))
}

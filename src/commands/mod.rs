//! Command-line interface: one module per subcommand.
//!
//! Commands write their normal output to the writer they are given (stdout in the binary) and
//! return the process exit code; failures that stop a command outright are [`CommandError`]s.

pub mod bench;
pub mod bench_chaos;
pub mod bench_consolidation;
mod bench_controller;
mod bench_drift;
mod bench_e2e;
mod bench_kubesim;
mod bench_versus;
mod chaos_cases;
mod crds;
mod creations;
mod endpoints;
pub mod explain;
mod run;
mod sim;
mod simulate;
mod validate;
mod what_if;

use std::{io, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

pub(crate) use sim::install_crds;

/// Joist: a Kubernetes node autoscaler that speaks Karpenter's v1 API.
#[derive(Debug, Parser)]
#[command(name = "joist", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check NodePool, NodeClaim and EC2NodeClass manifests offline against the v1 contract.
    ///
    /// Prints one line per problem (file, object, field, reason) and exits 1 if there is any.
    /// Directories are searched for *.yaml and *.yml files; `-` reads standard input, and
    /// `kind: List` documents (kubectl get -o yaml) are checked item by item. Other kinds
    /// (Deployments, …) are passed over.
    Validate {
        /// Manifest files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Print the CustomResourceDefinitions Joist serves, or write them to a directory.
    Crds {
        /// Write one file per CRD (Karpenter's file names) into this directory instead.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Runs a scenario on the embedded simulated cluster and cloud, on virtual time.
    Simulate {
        /// The scenario file.
        scenario: PathBuf,
        /// Where to write the JSON report.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Where to write the HTML report (one self-contained page with charts).
        #[arg(long)]
        html: Option<PathBuf>,
        /// Where to write the controllers' Prometheus metrics at the end (OpenMetrics text).
        #[arg(long)]
        metrics: Option<PathBuf>,
        /// Where to write the cluster at the end, as `kubectl get
        /// nodes,pods,nodepools,nodeclaims,ec2nodeclasses,pdb,daemonsets -A -o yaml` prints it.
        #[arg(long)]
        snapshot: Option<PathBuf>,
        /// Overrides the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Run the controllers against the cluster and AWS account the environment names (production).
    ///
    /// Settings are Karpenter's environment variables: CLUSTER_NAME and CLUSTER_ENDPOINT are
    /// required; CLUSTER_CA_BUNDLE, CLUSTER_CIDR, VM_MEMORY_OVERHEAD_PERCENT, RESERVED_ENIS,
    /// BATCH_IDLE_DURATION, BATCH_MAX_DURATION, LOG_LEVEL and INTERRUPTION_QUEUE are optional, as
    /// are Joist's own NODEPOOL_SHARDS and CLOUD_PROVIDER (aws, or simulated for kubesim).
    /// Kubernetes comes from the in-cluster service account or KUBECONFIG; AWS from the default
    /// credential chain and AWS_REGION (AWS_ENDPOINT_URL for an emulator).
    Run,
    /// Explain a decision about a live cluster: why a pod waits or runs where it does, why a node
    /// exists and stays (with a dry run of its removal), what a NodePool's budgets allow now and
    /// over the next 24 hours.
    ///
    /// Reads the cluster of `--kubeconfig` (else KUBECONFIG, else ~/.kube/config) and never writes
    /// to it; instance types and prices come from the cloud `joist run` would use, from the same
    /// environment (CLUSTER_NAME, CLOUD_PROVIDER, AWS_REGION, FEATURE_GATES, …).
    Explain {
        /// What to explain.
        #[command(subcommand)]
        question: explain::Question,
        /// The kubeconfig file of the cluster.
        #[arg(long, global = true)]
        kubeconfig: Option<PathBuf>,
        /// How to print the answer.
        #[arg(short, long, value_enum, default_value_t = explain::Output::Text, global = true)]
        output: explain::Output,
    },
    /// Replay a cluster snapshot on the simulator with and without proposed manifests, and print
    /// what they change: nodes, disrupted and pending pods, `cost before $X/h` and `cost after
    /// $Y/h`.
    ///
    /// The snapshot is what `kubectl get nodes,pods,nodepools,nodeclaims,ec2nodeclasses,pdb,daemonsets
    /// -A -o yaml` prints, or `joist simulate --snapshot` writes; with `--kubeconfig` it is taken
    /// from that cluster, read only.
    WhatIf {
        /// The snapshot of the cluster.
        #[arg(long, required_unless_present = "kubeconfig", conflicts_with = "kubeconfig")]
        from: Option<PathBuf>,
        /// Take the snapshot from this kubeconfig's cluster instead (read only).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The proposed manifests (a changed NodePool, EC2NodeClass, budget, workload …).
        #[arg(required = true)]
        changes: Vec<PathBuf>,
        /// Virtual time to replay each way.
        #[arg(long = "for", default_value = "30m")]
        duration: String,
        /// Where to write a page with both runs on each chart.
        #[arg(long)]
        html: Option<PathBuf>,
        /// How to print the outcome.
        #[arg(short, long, value_enum, default_value_t = explain::Output::Text)]
        output: explain::Output,
    },
    /// Print the version and the API versions Joist serves.
    Version,
    /// The embedded simulated cluster.
    Sim {
        /// What to do with it.
        #[command(subcommand)]
        action: SimAction,
    },
    /// Run a benchmark and print its figures.
    Bench {
        /// What to benchmark.
        #[command(subcommand)]
        target: BenchTarget,
    },
}

/// What `joist sim` does.
#[derive(Debug, Subcommand)]
pub enum SimAction {
    /// Serve kubesim (a Kubernetes API server with a scheduler and kubelets, but no nodes) on
    /// 127.0.0.1, write a kubeconfig for kubectl and helm, and run Joist on it against the
    /// simulated cloud, its metrics served on 127.0.0.1.
    Serve {
        /// Where to write the kubeconfig (default: kubesim-PORT.kubeconfig in the temp directory).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The API server's port (0: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// The metrics port (0: any free one).
        #[arg(long, default_value_t = 0)]
        metrics_port: u16,
        /// Serve kubesim alone, without Joist's controllers.
        #[arg(long)]
        no_controllers: bool,
        /// Seconds from a simulated instance's launch to its node registering.
        #[arg(long, default_value_t = sim::BOOT_SECONDS)]
        boot_seconds: u64,
        /// The simulated cloud's region (us-east-1, us-east-2, us-west-2 or eu-west-1).
        #[arg(long, default_value = "us-west-2")]
        region: String,
        /// The zones it sells in, comma-separated (default: every zone of the region).
        #[arg(long, value_delimiter = ',')]
        zones: Vec<String>,
    },
}

/// What `joist bench` measures.
#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// One scheduling simulation: pods/s, new nodes, fleet cost against a lower bound, peak memory.
    Scheduling {
        /// Pending pods to place.
        #[arg(long, default_value_t = 20_000)]
        pods: usize,
        /// The problem.
        #[arg(long, value_enum, default_value_t = bench::Scenario::Diverse)]
        scenario: bench::Scenario,
    },
    /// The consolidation search on a fragmented cluster: a single-node scan of every node, the
    /// multi-node search, and consolidation to a fixed point with its savings.
    Consolidation {
        /// Nodes in the cluster before consolidation.
        #[arg(long, default_value_t = 1_000)]
        nodes: usize,
    },
    /// An AMI roll-out over N nodes (one pod each, the NodePool's default 10 % budget) on virtual
    /// time: roll-out time, decisions per hour, the most nodes disrupting at once against the
    /// budget, wall time and peak memory.
    Drift {
        /// Nodes in the cluster before the new image is released.
        #[arg(long, default_value_t = 500)]
        nodes: usize,
    },
    /// The quickstart workload at scale through the whole system (kubesim, the simulated cloud and
    /// every controller) on virtual time: pods, nodes, wall time, pods/s, peak memory, and the
    /// share of wall time in kubesim against the controllers.
    E2e {
        /// One-CPU pods, scaled up at 30 s of a 5-minute run.
        #[arg(long, default_value_t = 20_000, conflicts_with = "nodes")]
        pods: usize,
        /// Grow the node count instead: this many one-CPU pods, each needing a node of its own.
        #[arg(long)]
        nodes: Option<usize>,
        /// NodePools, each with its own Deployment of an equal share of the pods.
        #[arg(long, default_value_t = 1)]
        pools: usize,
    },
    /// The controller alone, as in production: `joist run` on the simulated cloud against `joist
    /// sim serve --no-controllers` over HTTP, on real time, with the quickstart workload at scale:
    /// pods, nodes, wall time, pods/s, time to the first NodeClaim, and each process's peak memory
    /// and CPU time.
    Controller {
        /// One-CPU pods in all.
        #[arg(long, default_value_t = 10_000, conflicts_with = "nodes")]
        pods: usize,
        /// Grow the node count instead: this many one-CPU pods, each needing a node of its own.
        #[arg(long)]
        nodes: Option<usize>,
        /// NodePools, each with its own Deployment of an equal share of the pods.
        #[arg(long, default_value_t = 1)]
        pools: usize,
        /// Threads the controller spreads its NodePool actors over (`NODEPOOL_SHARDS`).
        #[arg(long, default_value_t = 0)]
        shards: usize,
        /// Replicas of the controller, splitting the NodePools into as many shards
        /// (`REPLICA_SHARDS`); each replica's memory and CPU time is reported.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        replicas: u32,
    },
    /// Joist and Karpenter v1.14.1's KWOK controller side by side: Karpenter's performance suite
    /// run by each on a fresh local control plane with KWOK, the same NodePool and instance types;
    /// per phase seconds, nodes and cost, each controller's peak memory, CPU and evictions, and
    /// `ratio WORKLOAD time T memory M cpu C cost K` (Joist's over Karpenter's). Needs Go (the
    /// peers are built on first use) and a checkout of Joist (its scripts/).
    VersusKarpenter {
        /// One workload (basic, do-not-disrupt, drift, hostname-spreading, interference, wide);
        /// all when not given.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bench_versus::WORKLOADS))]
        workload: Option<String>,
        /// Times the suite's replica counts (0 < F <= 1), for a machine that cannot hold them.
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Seconds without a node disrupted that end a consolidation phase (the suite's: 180).
        #[arg(long, default_value_t = bench_versus::SUITE_QUIET_SECONDS)]
        quiet: u64,
        /// Minutes a phase may take (the suite's longest bound: 50); past them it is reported
        /// unfinished, with the cluster's figures then, and that controller's later steps are
        /// not run.
        #[arg(long, value_name = "MINUTES", default_value_t = bench_versus::SUITE_DEADLINE_MINUTES,
              value_parser = clap::value_parser!(u64).range(1..))]
        deadline: u64,
        /// Write a page with both timelines per workload.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Keep every run's logs (each controller's, at `info`; each control plane's) in this
        /// directory, created if missing and refused unless empty; otherwise they are removed
        /// after a run that succeeds.
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
    },
    /// The crash suite: Joist's controllers crashed at every fault point of a scenario's life and
    /// started again from the cluster and the cloud alone; prints leaks, duplicate launches and
    /// stranded pods per crash, and `steps N crashes N leaks N duplicates N stranded N`.
    Chaos {
        /// Also crash at the second and third time each fault point is reached.
        #[arg(long)]
        soak: bool,
    },
    /// kubesim at scale: nodes and pods created and run by its scheduler and kubelets, a full pod
    /// list through the API, and a watch fan-out.
    Kubesim {
        /// Nodes (16 cpu, 64 GiB, 110 pods each).
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// Pods (100m cpu, 128 MiB each), placed by kubesim's scheduler.
        #[arg(long, default_value_t = 100_000)]
        pods: usize,
        /// Watchers that each receive every pod update of the fan-out burst.
        #[arg(long, default_value_t = 4)]
        watchers: usize,
    },
}

/// A failure that stops a command.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// What was being read.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// Output could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Where it was going.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The async runtime could not start (or stop waiting for Ctrl-C).
    #[error("cannot run the async runtime: {source}")]
    Runtime {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The HTTP port could not be bound.
    #[error("cannot serve on 127.0.0.1:{port}: {source}")]
    Serve {
        /// The port asked for.
        port: u16,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Joist's CRDs could not be installed into kubesim.
    #[error("cannot install Joist's CRDs into kubesim: {message}")]
    Install {
        /// Why.
        message: String,
    },
    /// `joist run` lost its leader election Lease: it stops, so that only one replica acts.
    #[error("lost the leader election lease {lease}: stopping so that only one replica runs the controllers")]
    LeadershipLost {
        /// The Lease.
        lease: String,
    },
    /// `joist run` could not start (a setting, Kubernetes or AWS).
    #[error("cannot start: {message}")]
    Start {
        /// What to fix.
        message: String,
    },
    /// A scenario could not be read or run.
    #[error("{path}: {message}")]
    Simulate {
        /// The scenario file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// `joist explain` has no answer.
    #[error("{message}")]
    Explain {
        /// Why.
        message: String,
    },
    /// A CRD could not be rendered as YAML.
    #[error("cannot render CRD {name} as YAML: {message}")]
    Render {
        /// The CRD.
        name: String,
        /// The serializer's message.
        message: String,
    },
}

impl CommandError {
    /// Writing to standard output failed.
    pub fn stdout(source: io::Error) -> Self {
        CommandError::Write {
            path: "stdout".into(),
            source,
        }
    }
}

/// The sum of every sample of `series` (any labels) in Prometheus text `metrics`.
fn metric_total(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A benchmark's workload: `--nodes N` when given, else `--pods N`.
fn workload(pods: usize, nodes: Option<usize>) -> bench_e2e::Workload {
    nodes.map_or(bench_e2e::Workload::Pods(pods), bench_e2e::Workload::Nodes)
}

/// The multi-threaded tokio runtime the commands that serve or simulate run on.
fn runtime() -> Result<tokio::runtime::Runtime, CommandError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| CommandError::Runtime { source })
}

/// Runs `cli`, writing its output to `out`.
pub fn run(cli: Cli, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    match cli.command {
        Command::Validate { paths } => validate::run(&paths, out),
        Command::Explain {
            question,
            kubeconfig,
            output,
        } => explain::run(&question, kubeconfig.as_deref(), output, out),
        Command::WhatIf {
            from,
            kubeconfig,
            changes,
            duration,
            html,
            output,
        } => {
            let source = match (from, kubeconfig) {
                (Some(file), _) => what_if::Source::File(file),
                (None, Some(kubeconfig)) => what_if::Source::Cluster(kubeconfig),
                (None, None) => {
                    return Err(CommandError::Start {
                        message: "joist what-if needs --from SNAPSHOT.yaml or --kubeconfig FILE".to_owned(),
                    });
                }
            };
            what_if::run(&source, &changes, (&duration, html.as_deref()), output, out)
        }
        Command::Crds { out_dir } => crds::run(out_dir.as_deref(), out).map(|()| ExitCode::SUCCESS),
        Command::Bench {
            target: BenchTarget::Scheduling { pods, scenario },
        } => bench::run(scenario, pods, out),
        Command::Bench {
            target: BenchTarget::Consolidation { nodes },
        } => bench_consolidation::run(nodes, out),
        Command::Bench {
            target: BenchTarget::Drift { nodes },
        } => bench_drift::run(nodes, out),
        Command::Bench {
            target: BenchTarget::E2e { pods, nodes, pools },
        } => bench_e2e::run(workload(pods, nodes), pools, out),
        Command::Bench {
            target: BenchTarget::Chaos { soak },
        } => bench_chaos::run(soak, out),
        Command::Bench {
            target:
                BenchTarget::Controller {
                    pods,
                    nodes,
                    pools,
                    shards,
                    replicas,
                },
        } => bench_controller::run(
            bench_controller::Options {
                workload: workload(pods, nodes),
                pools,
                shards,
                replicas,
            },
            out,
        ),
        Command::Bench {
            target:
                BenchTarget::VersusKarpenter {
                    workload,
                    scale,
                    quiet,
                    deadline,
                    html,
                    keep,
                },
        } => bench_versus::run(
            &bench_versus::Options {
                workload,
                scale,
                quiet,
                deadline,
                html,
                keep,
            },
            out,
        ),
        Command::Bench {
            target:
                BenchTarget::Kubesim {
                    nodes,
                    pods,
                    watchers,
                },
        } => bench_kubesim::run(nodes, pods, watchers, out),
        Command::Simulate {
            scenario,
            report,
            html,
            metrics,
            snapshot,
            seed,
        } => {
            let outputs = simulate::Outputs {
                report: report.as_deref(),
                html: html.as_deref(),
                metrics: metrics.as_deref(),
                snapshot: snapshot.as_deref(),
            };
            simulate::run(&scenario, outputs, seed, out)
        }
        Command::Sim {
            action:
                SimAction::Serve {
                    kubeconfig,
                    port,
                    metrics_port,
                    no_controllers,
                    boot_seconds,
                    region,
                    zones,
                },
        } => sim::serve(
            sim::ServeOptions {
                kubeconfig,
                port,
                metrics_port,
                controllers: !no_controllers,
                boot: std::time::Duration::from_secs(boot_seconds),
                region,
                zones,
            },
            out,
        ),
        Command::Run => run::run(),
        Command::Version => {
            writeln!(
                out,
                "joist {}\nserves karpenter.sh/v1 (NodePool, NodeClaim) and karpenter.k8s.aws/v1 (EC2NodeClass)",
                env!("CARGO_PKG_VERSION")
            )
            .map_err(CommandError::stdout)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

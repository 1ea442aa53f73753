//! `joist run`: the production controller. It reads Karpenter's settings from the environment
//! ([`settings`]), connects to Kubernetes (the in-cluster service account, or `KUBECONFIG`) and to
//! AWS (the default credential chain: environment, profile, IRSA web identity, EKS Pod Identity,
//! instance metadata; `AWS_ENDPOINT_URL` for an emulator; the simulated cloud with
//! `CLOUD_PROVIDER=simulated`, to run against kubesim; or the same cloud with `CLOUD_PROVIDER=kwok`
//! on a real cluster whose Nodes KWOK runs), and runs every controller until SIGINT or
//! SIGTERM. Logs go to standard error as JSON lines at `LOG_LEVEL`; node traces are exported when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set; Prometheus metrics and health probes are served on
//! Karpenter's ports ([`super::endpoints`]). Replicas elect a leader on a Lease ([`leader`]): only the
//! leader runs the controllers, and one that loses the Lease (or cannot renew it within the renew
//! deadline, even while a request hangs) exits at once. With `REPLICA_SHARDS` the NodePools are
//! split between replicas instead, a Lease per shard ([`shard_leases`]), and a replica that loses
//! a shard exits the same way.
//!
//! Failures at start (a missing or invalid setting, no Kubernetes configuration, an API server that
//! does not answer, no AWS region) stop the command with a message naming what to fix. Later
//! failures are the controllers' to log and retry.

mod deadline;
mod in_flight;
mod leader;
pub(super) mod settings;
mod shard_leases;
#[cfg(test)]
mod test_service;

use std::{net::SocketAddr, process::ExitCode, sync::Arc};

use joist_actors::settings::{Settings, SolverMode};
use joist_messages::{
    model::{instance_type::InstanceType, shape::CapacitySettings},
    time::Clock,
};
use joist_provider::{CloudProvider, interruption::InterruptionQueue};
use joist_provider_aws::{
    AwsCloud, AwsSettings,
    clients::AwsClients,
    cluster::{self, ClusterFacts},
    sqs::SqsQueue,
};
use joist_provider_sim::{CatalogError, KwokQueue, SimCloud, SimSettings};

use self::settings::{CloudKind, RunSettings};
use super::{CommandError, endpoints};
use crate::telemetry::Telemetry;

/// A cloud for the controllers, and its interruption queue if there is one.
pub(super) type Cloud = (Arc<dyn CloudProvider>, Option<Arc<dyn InterruptionQueue>>);

/// Runs the controllers until the process is told to stop.
pub fn run() -> Result<ExitCode, CommandError> {
    let settings = RunSettings::from_env().map_err(|e| CommandError::Start {
        message: e.to_string(),
    })?;
    tracing_subscriber::fmt()
        .json()
        .with_max_level(settings.log_level.as_tracing())
        .with_writer(std::io::stderr)
        .init();
    let telemetry = Telemetry::from_env().map_err(|e| CommandError::Start {
        message: e.to_string(),
    })?;
    let runtime = super::runtime()?;
    let system = actix::System::with_tokio_rt(move || runtime);
    let outcome = system.block_on(serve(settings, &telemetry));
    if let Err(lost @ CommandError::LeadershipLost { .. }) = &outcome {
        // At once: the runtime's worker threads would go on running the controllers while it shuts
        // down (and a solve on its blocking pool would hold that up), and a standby may act from now.
        eprintln!("joist: {lost}");
        std::process::exit(2);
    }
    telemetry.shutdown();
    outcome.map(|()| ExitCode::SUCCESS)
}

/// A client from the kubeconfig file `path` when given, else from `KUBECONFIG` when it is set,
/// else from `~/.kube/config` or the in-cluster service account (a bad file is named, with what is
/// wrong with it, on one line); every request it makes has a deadline ([`deadline`]) and waits
/// for a slot when too many are in flight ([`in_flight`]).
pub(super) async fn kube_client(path: Option<&std::path::Path>) -> Result<kube::Client, String> {
    /// Errors about YAML carry a snippet of the file on the lines after the first.
    fn first_line(error: &dyn std::fmt::Display) -> String {
        error.to_string().lines().next().unwrap_or_default().to_owned()
    }
    let options = kube::config::KubeConfigOptions::default();
    let config = match path {
        Some(path) => {
            let unusable = |e: &dyn std::fmt::Display| {
                format!(
                    "--kubeconfig {}: not a usable kubeconfig: {}",
                    path.display(),
                    first_line(e)
                )
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| unusable(&e))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| unusable(&e))?
        }
        None => {
            let variable = std::env::var("KUBECONFIG").unwrap_or_default();
            if variable.is_empty() {
                kube::Config::infer().await.map_err(|e| {
                    format!(
                        "cannot configure a Kubernetes client (in-cluster service account or ~/.kube/config): {}",
                        first_line(&e)
                    )
                })?
            } else {
                kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                    format!(
                        "KUBECONFIG={variable} is not a usable kubeconfig: {}",
                        first_line(&e)
                    )
                })?
            }
        }
    };
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| format!("cannot make a Kubernetes client: {}", first_line(&e)))?;
    Ok(builder
        .with_layer(&deadline::DeadlineLayer::new(deadline::CALL_DEADLINE))
        .with_layer(&in_flight::InFlightLayer::new(in_flight::IN_FLIGHT_LIMIT))
        .build())
}

async fn serve(settings: RunSettings, telemetry: &Telemetry) -> Result<(), CommandError> {
    let start = |message: String| CommandError::Start { message };
    let client = kube_client(None).await.map_err(start)?;
    let kubernetes_version = kubernetes_version(&client).await?;
    let (cloud, interruption_queue) = cloud(&settings, &client, kubernetes_version).await?;
    let address = |port| SocketAddr::new(settings.listen_address, port);
    let leading = endpoints::Leading::default();
    endpoints::serve_metrics(address(settings.metrics_port), leading.clone())
        .await
        .map_err(start)?;
    endpoints::serve_health(address(settings.health_probe_port), leading.clone())
        .await
        .map_err(start)?;
    let sharded = settings.replica_shards > 0;
    let mut elector = (!settings.disable_leader_election && !sharded).then(|| elector(&settings, &client));
    let (mut shard_leases, replica_shards) = if sharded {
        let (leases, held) = shard_leases(&settings, &client);
        let shards = joist_actors::state::replica_shards::ReplicaShards::new(settings.replica_shards, held);
        (Some(leases), Some(shards))
    } else {
        (None, None)
    };
    // One listener for the whole run: a signal that arrives while the controllers start is kept.
    let stop = stopped().map_err(|source| CommandError::Runtime { source })?;
    tokio::pin!(stop);
    if let Some(elector) = &mut elector {
        tokio::select! {
            () = elector.acquire() => {}
            () = &mut stop => {
                tracing::info!("stopping while standing by");
                return Ok(());
            }
        }
    }
    let controllers = joist_actors::start(
        client,
        cloud,
        Settings {
            interruption_queue,
            replica_shards,
            ..controller_settings(&settings)
        },
        Clock::system(),
        telemetry.node_tracer(),
    );
    let shared = &controllers.shared;
    // Set once, here: the endpoints only read it.
    let _ = leading.set((shared.metrics.clone(), shared.read.clone()));
    let lost = async {
        match (&mut elector, &mut shard_leases) {
            (Some(elector), _) => {
                elector.hold().await;
                settings.leader_election_name.clone()
            }
            (None, Some(leases)) => leases.hold().await,
            (None, None) => std::future::pending().await,
        }
    };
    tokio::select! {
        lease = lost => return Err(CommandError::LeadershipLost { lease }),
        () = &mut stop => {}
    }
    tracing::info!("stopping");
    if let Some(elector) = &mut elector {
        elector.release().await;
    }
    if let Some(leases) = &mut shard_leases {
        leases.release().await;
    }
    Ok(())
}

/// The API server's Kubernetes version, `MAJOR.MINOR`.
pub(super) async fn kubernetes_version(client: &kube::Client) -> Result<String, CommandError> {
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| CommandError::Start {
            message: format!("the Kubernetes API server does not answer /version: {e}"),
        })?;
    Ok(format!(
        "{}.{}",
        version.major.trim_end_matches('+'),
        version.minor.trim_end_matches('+')
    ))
}

/// The controllers' settings as `settings` give them (batch windows, solver pool, NodePool
/// threads, feature gates, scheduler configuration); what a replica holds and the interruption
/// queue are the caller's to add.
pub(super) fn controller_settings(settings: &RunSettings) -> Settings {
    Settings {
        batch_idle: settings.batch_idle,
        batch_max: settings.batch_max,
        solver: SolverMode::Pool,
        shards: settings.node_pool_shards,
        reserved_capacity: settings.feature_gates.reserved_capacity,
        spot_to_spot_consolidation: settings.feature_gates.spot_to_spot_consolidation,
        node_repair: settings.feature_gates.node_repair,
        static_capacity: settings.feature_gates.static_capacity,
        node_overlay: settings.feature_gates.node_overlay,
        capacity_buffer: settings.feature_gates.capacity_buffer,
        scheduler_config: settings.scheduler_config.clone().map(Arc::new),
        ..Settings::default()
    }
}

/// The cloud `CLOUD_PROVIDER` names, over `client` for the simulated ones, and its interruption
/// queue when it has one.
pub(super) async fn cloud(
    settings: &RunSettings,
    client: &kube::Client,
    kubernetes_version: String,
) -> Result<Cloud, CommandError> {
    Ok(match &settings.cloud {
        CloudKind::Aws => aws_cloud(settings, kubernetes_version).await?,
        CloudKind::Simulated { region } => {
            let cloud = simulated_cloud(
                "simulated",
                SimCloud::new(sim_settings(settings, region), client.clone()),
            )?;
            let queue: Arc<dyn InterruptionQueue> = cloud.queue();
            (Arc::new(cloud) as Arc<dyn CloudProvider>, Some(queue))
        }
        CloudKind::Kwok {
            region,
            instance_types_file,
        } => {
            let types = instance_types_file.as_deref().map(kwok_types).transpose()?;
            let cloud = simulated_cloud(
                "kwok",
                SimCloud::on_kwok(sim_settings(settings, region), client.clone(), types),
            )?;
            let queue: Arc<dyn InterruptionQueue> = Arc::new(KwokQueue::new(cloud.clone()));
            (Arc::new(cloud) as Arc<dyn CloudProvider>, Some(queue))
        }
    })
}

/// The cloud and interruption queue `joist run` uses in production: EC2 and, when
/// `INTERRUPTION_QUEUE` names one, SQS.
async fn aws_cloud(settings: &RunSettings, kubernetes_version: String) -> Result<Cloud, CommandError> {
    let start = |message: String| CommandError::Start { message };
    let clients = AwsClients::from_env().await.map_err(|e| start(e.to_string()))?;
    tracing::info!(
        cluster = settings.cluster_name,
        kubernetes = kubernetes_version,
        region = clients.region,
        "starting"
    );
    let interruption_queue = settings.interruption_queue.clone().map(|name| {
        tracing::info!(queue = name, "reading the interruption queue");
        Arc::new(SqsQueue::new(clients.sqs.clone(), name)) as Arc<dyn InterruptionQueue>
    });
    let cluster = cluster_facts(settings, &clients).await?;
    let cloud = AwsCloud::new(
        clients,
        AwsSettings {
            cluster_name: settings.cluster_name.clone(),
            cluster_endpoint: cluster.endpoint,
            cluster_ca_bundle: cluster.ca_bundle,
            cluster_cidr: cluster.service_cidr,
            kubernetes_version,
            capacity: capacity(settings),
            isolated_vpc: settings.isolated_vpc,
            reserved_capacity: settings.feature_gates.reserved_capacity,
        },
    )
    .map_err(|e| start(e.to_string()))?;
    Ok((Arc::new(cloud), interruption_queue))
}

/// The cluster's endpoint, CA bundle and service CIDR: the settings', with what they leave out
/// looked up with `eks:DescribeCluster`, as Karpenter looks them up. An endpoint neither set nor
/// found stops the start; a CA bundle or CIDR that cannot be looked up is warned of, and nodes
/// are launched without it, as before the lookup.
async fn cluster_facts(settings: &RunSettings, clients: &AwsClients) -> Result<ClusterFacts, CommandError> {
    let given = |endpoint: String| ClusterFacts {
        endpoint,
        ca_bundle: settings.cluster_ca_bundle.clone(),
        service_cidr: settings.cluster_cidr.clone(),
    };
    if let (Some(endpoint), Some(_), Some(_)) = (
        &settings.cluster_endpoint,
        &settings.cluster_ca_bundle,
        &settings.cluster_cidr,
    ) {
        return Ok(given(endpoint.clone()));
    }
    match (
        cluster::describe(&clients.eks, &settings.cluster_name).await,
        &settings.cluster_endpoint,
    ) {
        (Ok(found), _) => {
            let facts = ClusterFacts {
                endpoint: settings.cluster_endpoint.clone().unwrap_or(found.endpoint),
                ca_bundle: settings.cluster_ca_bundle.clone().or(found.ca_bundle),
                service_cidr: settings.cluster_cidr.clone().or(found.service_cidr),
            };
            tracing::info!(
                endpoint = facts.endpoint,
                service_cidr = facts.service_cidr,
                "looked the cluster up with eks:DescribeCluster"
            );
            Ok(facts)
        }
        (Err(error), Some(endpoint)) => {
            tracing::warn!(%error, "eks:DescribeCluster failed; nodes get only the CA bundle and CIDR the settings give");
            Ok(given(endpoint.clone()))
        }
        (Err(error), None) => Err(CommandError::Start {
            message: format!(
                "CLUSTER_ENDPOINT is not set and eks:DescribeCluster of {:?} failed: {error}",
                settings.cluster_name
            ),
        }),
    }
}

/// The simulated cloud in `region` that `joist run` starts on (`CLOUD_PROVIDER=simulated` or
/// `kwok`), its nodes booting in [`super::sim::BOOT_SECONDS`].
fn sim_settings(settings: &RunSettings, region: &str) -> SimSettings {
    tracing::info!(
        cluster = settings.cluster_name,
        region,
        "starting on the simulated cloud"
    );
    // Instance ids and node names differ between replicas and restarts (the names only mostly:
    // 254 networks; on KWOK 2^24 names), so the seed is drawn at random: replicas started in one
    // second, or as pid 1 of their containers, must not draw the same ids.
    let seed = fastrand::u64(..);
    SimSettings {
        region: region.to_owned(),
        zones: Vec::new(),
        boot: std::time::Duration::from_secs(super::sim::BOOT_SECONDS),
        cluster_name: settings.cluster_name.clone(),
        capacity: capacity(settings),
        epoch_seconds: Clock::system().now_seconds(),
        seed,
        network: u8::try_from(1 + seed % 254).unwrap_or(1),
    }
}

/// The simulated cloud (`CLOUD_PROVIDER=provider`), or why it cannot start.
fn simulated_cloud(provider: &str, cloud: Result<SimCloud, CatalogError>) -> Result<SimCloud, CommandError> {
    cloud.map_err(|e| CommandError::Start {
        message: format!("CLOUD_PROVIDER={provider}: {e}"),
    })
}

/// The instance types of a Karpenter KWOK instance-types file (`INSTANCE_TYPES_FILE_PATH`).
fn kwok_types(path: &str) -> Result<Vec<InstanceType>, CommandError> {
    let start = |message: String| CommandError::Start { message };
    let text = std::fs::read_to_string(path)
        .map_err(|e| start(format!("INSTANCE_TYPES_FILE_PATH={path}: cannot read it: {e}")))?;
    joist_provider_sim::kwok::instance_types(path, &text)
        .map_err(|e| start(format!("INSTANCE_TYPES_FILE_PATH: {e}")))
}

/// The node capacity settings both clouds share.
fn capacity(settings: &RunSettings) -> CapacitySettings {
    CapacitySettings {
        vm_memory_overhead_permille: settings.vm_memory_overhead_permille(),
        reserved_enis: i64::from(settings.reserved_enis),
        ..CapacitySettings::default()
    }
}

/// The namespace of the Leases (the client's when unset) and this replica's identity in them (its
/// pod name; the host name and process id when unset).
fn lease_holder(settings: &RunSettings, client: &kube::Client) -> (String, String) {
    let namespace = settings
        .leader_election_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let identity = settings.pod_name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}_{}", host.trim(), std::process::id())
    });
    (namespace, identity)
}

/// This replica's candidacy for the `REPLICA_SHARDS` shards' Leases ([`shard_leases`]).
fn shard_leases(
    settings: &RunSettings,
    client: &kube::Client,
) -> (
    shard_leases::ShardLeases,
    tokio::sync::watch::Receiver<std::collections::BTreeSet<u32>>,
) {
    let (namespace, identity) = lease_holder(settings, client);
    tracing::info!(
        shards = settings.replica_shards,
        namespace,
        identity,
        "splitting the nodepools between replicas"
    );
    shard_leases::ShardLeases::new(
        kube::Api::namespaced(client.clone(), &namespace),
        &settings.leader_election_name,
        settings.replica_shards,
        &identity,
    )
}

/// This replica's candidate for the Lease `settings` name ([`lease_holder`]).
fn elector(settings: &RunSettings, client: &kube::Client) -> leader::Elector {
    let (namespace, identity) = lease_holder(settings, client);
    tracing::info!(
        lease = settings.leader_election_name,
        namespace,
        identity,
        "electing a leader"
    );
    leader::Elector::new(
        kube::Api::namespaced(client.clone(), &namespace),
        settings.leader_election_name.clone(),
        identity,
    )
}

/// Listens for SIGINT and SIGTERM (what Kubernetes sends a pod it stops) from now on; the future
/// ends at the first.
fn stopped() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

//! `joist sim serve`: kubesim (the embedded Kubernetes API server and cluster) on 127.0.0.1, with
//! Joist's CRDs installed and a kubeconfig written for kubectl and helm, and, unless
//! `--no-controllers`, Joist's controllers on real time against the simulated cloud, with their
//! Prometheus metrics served on 127.0.0.1. Runs until Ctrl-C. kubesim's own controllers (its
//! scheduler, kubelets and workload controllers) run on a thread of their own, so that serving the
//! API and its watches never waits behind a burst of their work.
//!
//! Failures at start (a port in use, an unwritable kubeconfig) stop the command naming what failed.

use std::{io, net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use joist_actors::{
    effects::node_trace::NodeTracer,
    settings::{Settings, SolverMode},
};
use joist_kubesim::{Cluster, ClusterSettings};
use joist_messages::{model::shape::CapacitySettings, time::Clock};
use joist_provider_sim::{SimCloud, SimSettings};

use super::{CommandError, endpoints};

/// What `joist sim serve` was asked for.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to write the kubeconfig (default: kubesim-PORT.kubeconfig in the temp directory).
    pub kubeconfig: Option<PathBuf>,
    /// The API server's port (0: any free one).
    pub port: u16,
    /// The metrics port (0: any free one).
    pub metrics_port: u16,
    /// Whether Joist's controllers run.
    pub controllers: bool,
    /// From a simulated instance's launch to its node registering.
    pub boot: Duration,
    /// The simulated cloud's region.
    pub region: String,
    /// The zones it sells in (every zone of the region when empty).
    pub zones: Vec<String>,
}

/// Seconds from a simulated instance's launch to its node registering, on real time: `joist sim
/// serve`'s default and `joist run`'s with `CLOUD_PROVIDER=simulated`.
pub(super) const BOOT_SECONDS: u64 = 5;

/// What to try with Joist running: Karpenter's getting-started steps.
const GETTING_STARTED: &str = "  kubectl apply -f examples/getting-started.yaml\n  \
     kubectl scale deployment inflate --replicas 5\n  kubectl get nodeclaims,nodes -w\n";

/// What to try with kubesim alone.
const KUBESIM_ALONE: &str = "  kubectl create deployment web --image=nginx\n  kubectl get pods -w\n";

/// Serves kubesim, and Joist on it, until interrupted.
pub fn serve(options: ServeOptions, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let runtime = super::runtime()?;
    let physics = physics_runtime()?;
    let physics_handle = physics.handle().clone();
    let system = actix::System::with_tokio_rt(move || runtime);
    system.block_on(async move {
        let cluster = Cluster::start_on(ClusterSettings::default(), &physics_handle);
        install_crds(&cluster)?;
        // Joist first: a region or zone where nothing is sold stops the command before anything
        // is served or written.
        let (joist, try_out) = if options.controllers {
            let metrics = start_joist(&cluster, &options).await?;
            let joist = format!(
                "Joist is running on it against a simulated cloud ({}; nodes boot in {}s).\n\
                 metrics: http://{metrics}/metrics\n",
                options.region,
                options.boot.as_secs()
            );
            // `joist explain` reads the cloud from the environment, as `joist run` does.
            let explain = format!(
                "  CLOUD_PROVIDER=simulated AWS_REGION={} CLUSTER_NAME=kubesim joist explain nodepool default\n",
                options.region
            );
            (joist, format!("{GETTING_STARTED}{explain}"))
        } else {
            (String::new(), KUBESIM_ALONE.to_owned())
        };
        let port = options.port;
        let server = cluster
            .serve_http(port)
            .await
            .map_err(|source| CommandError::Serve { port, source })?;
        let path = options.kubeconfig.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("kubesim-{}.kubeconfig", server.address().port()))
        });
        server
            .write_kubeconfig(&path)
            .map_err(|source| CommandError::Write {
                path: path.clone(),
                source,
            })?;
        writeln!(
            out,
            "kubesim is serving Kubernetes v1.35 on {url} (no nodes yet; Joist's CRDs installed).\n\
             {joist}kubeconfig: {path}\n\n  export KUBECONFIG={path}\n{try_out}\nCtrl-C stops it.",
            url = server.url(),
            path = path.display()
        )
        .and_then(|()| out.flush())
        .map_err(CommandError::stdout)?;
        tokio::signal::ctrl_c()
            .await
            .map_err(|source| CommandError::Runtime { source })?;
        Ok(ExitCode::SUCCESS)
    })
}

/// The thread kubesim's controllers run on, apart from the threads serving the API and Joist's.
fn physics_runtime() -> Result<tokio::runtime::Runtime, CommandError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("kubesim-physics")
        .enable_all()
        .build()
        .map_err(|source| CommandError::Runtime { source })
}

/// Starts the simulated cloud and Joist's controllers on `cluster`, and serves their metrics; the
/// address they are served on.
async fn start_joist(cluster: &Cluster, options: &ServeOptions) -> Result<SocketAddr, CommandError> {
    let client = cluster.client();
    let clock = Clock::system();
    let cloud = SimCloud::new(
        SimSettings {
            region: options.region.clone(),
            zones: options.zones.clone(),
            boot: options.boot,
            cluster_name: "kubesim".to_owned(),
            capacity: CapacitySettings::default(),
            epoch_seconds: clock.now_seconds(),
            seed: 1,
            network: 0,
        },
        client.clone(),
    )
    .map_err(|e| CommandError::Start {
        message: e.to_string(),
    })?;
    let settings = Settings {
        solver: SolverMode::Pool,
        interruption_queue: Some(cloud.queue()),
        ..Settings::default()
    };
    let controllers = joist_actors::start(client, Arc::new(cloud), settings, clock, NodeTracer::disabled());
    let leading = endpoints::Leading::default();
    let _ = leading.set((
        controllers.shared.metrics.clone(),
        controllers.shared.read.clone(),
    ));
    let address = SocketAddr::from(([127, 0, 0, 1], options.metrics_port));
    endpoints::serve_metrics(address, leading)
        .await
        .map_err(|message| CommandError::Start { message })
}

/// Creates the NodePool, NodeClaim and EC2NodeClass CRDs, so their manifests apply unchanged.
pub fn install_crds(cluster: &Cluster) -> Result<(), CommandError> {
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .map_err(|e| CommandError::Install {
            message: e.to_string(),
        })
}

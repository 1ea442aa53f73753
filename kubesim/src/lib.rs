//! kubesim: an in-process Kubernetes API server and the cluster around it, for running Joist where
//! there is no cluster.
//!
//! [`Cluster`] is the whole thing: a [`store::Store`] with kube-apiserver's semantics, the REST and
//! watch protocol over it ([`api::ApiServer`]), served in-process to kube-rs ([`Cluster::client`])
//! or over HTTP on 127.0.0.1 for kubectl and helm ([`Cluster::serve_http`]), and the physics that
//! Joist does not own ([`physics`]): a kube-scheduler, kubelets, workload controllers and the
//! disruption controller.
//!
//! Held to the real API server (the repository's real-control-plane tests): server-side apply with
//! field ownership ([`managed_fields`]), unknown fields refused, warned of or dropped by
//! `fieldValidation`, and Joist's custom resources judged by their CRDs' schema and rules.
//!
//! What kubesim does not do, so a surprise is not taken for a Joist bug: no authentication or
//! authorization (every request is allowed); no admission webhooks; built-in kinds are not
//! validated beyond their fields' names. docs/simulator.md lists the rest.

pub mod api;
pub mod aside;
pub mod budget;
pub mod busy;
pub use joist_messages::time as clock;
pub mod conditions;
pub mod encoded;
pub mod error;
pub mod events;
mod handoff;
pub mod history;
pub mod http;
pub mod managed_fields;
pub mod object;
pub mod patch;
pub mod physics;
pub mod protobuf;
mod reclaim;
pub mod resources;
pub mod selector;
pub mod serialized;
pub mod store;

use std::{io, sync::Arc};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tokio::task::JoinHandle;

use self::resources::GroupResource;

pub use self::{
    api::ApiServer,
    clock::Clock,
    error::ApiError,
    http::{HttpServer, InProcess},
    physics::PhysicsSettings,
    serialized::Serializing,
    store::Store,
};

/// How to build a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Where timestamps come from.
    pub clock: Clock,
    /// Seed of generated uids and names.
    pub seed: u64,
    /// Timings of the simulated components.
    pub physics: PhysicsSettings,
    /// When committed versions are serialized: beside, on a thread of their own, for a cluster
    /// that runs on one thread (a simulation on virtual time); at once otherwise.
    pub serializing: Serializing,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            clock: Clock::system(),
            seed: 0,
            physics: PhysicsSettings::default(),
            serializing: Serializing::default(),
        }
    }
}

/// A running simulated cluster. Its controllers stop when it is dropped.
#[derive(Debug)]
pub struct Cluster {
    server: Arc<ApiServer>,
    audit: Arc<api::Audit>,
    controllers: Vec<JoinHandle<()>>,
}

impl Cluster {
    /// Starts a cluster whose controllers (scheduler, kubelets, workload controllers) run on
    /// `physics`, apart from the runtime that serves the API: as kube-apiserver serves while
    /// kube-scheduler and kube-controller-manager work, a burst of their writes does not hold up
    /// the watches that carry it to clients.
    pub fn start_on(settings: ClusterSettings, physics: &tokio::runtime::Handle) -> Self {
        let _spawning_there = physics.enter();
        Self::start(settings)
    }

    /// Starts a cluster on the current tokio runtime.
    pub fn start(settings: ClusterSettings) -> Self {
        let store =
            Arc::new(Store::new(settings.clock, settings.seed).with_serializing(settings.serializing));
        let controllers = physics::start(&store, settings.physics);
        Self {
            server: Arc::new(ApiServer::new(store, "127.0.0.1:443")),
            audit: Arc::default(),
            controllers,
        }
    }

    /// The wall time kubesim's own work has taken so far (see [`busy`]).
    pub fn busy(&self) -> std::time::Duration {
        self.store().busy().total()
    }

    /// The storage, for tests and simulations that read or write without HTTP.
    pub fn store(&self) -> &Arc<Store> {
        self.server.store()
    }

    /// Creates `crds`, so objects of their kinds are served (as `kubectl apply` of the CRD files
    /// would). Fails on the first one the store refuses (one that already exists, say).
    pub fn install_crds(
        &self,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
    ) -> Result<(), ApiError> {
        let resource = GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions");
        for crd in crds {
            let object = serde_json::to_value(&crd).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            self.store().create(&resource, "", object, false)?;
        }
        Ok(())
    }

    /// Every distinct request clients made of the cluster's resources over HTTP (not through the
    /// in-process [`Cluster::client`]), as RBAC names it.
    pub fn accesses(&self) -> Vec<api::Access> {
        self.audit.accesses()
    }

    /// A kube-rs client talking to this cluster in-process.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(InProcess::new(self.server.clone()), "default")
    }

    /// A client whose requests go through `faults` when given, and whose process can crash: once `down`
    /// says so, its requests go unanswered.
    pub fn client_with(&self, faults: Option<&api::ApiFaults>, down: Option<http::Down>) -> kube::Client {
        let service = match down {
            Some(down) => InProcess::until(self.server.clone(), down),
            None => InProcess::new(self.server.clone()),
        };
        let service = match faults {
            Some(faults) => service.with_faults(faults.clone()),
            None => service,
        };
        kube::Client::new(service, "default")
    }

    /// Serves the cluster over HTTP on `127.0.0.1:port` (0: any free port).
    pub async fn serve_http(&self, port: u16) -> io::Result<HttpServer> {
        self.serve_http_through(port, None).await
    }

    /// Serves the cluster over HTTP as [`Cluster::serve_http`], every request through `faults`
    /// when given: the network of the clients that use this address.
    pub async fn serve_http_through(
        &self,
        port: u16,
        faults: Option<api::ApiFaults>,
    ) -> io::Result<HttpServer> {
        HttpServer::bind(Arc::new(self.server.audited(self.audit.clone())), port, faults).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for controller in &self.controllers {
            controller.abort();
        }
    }
}

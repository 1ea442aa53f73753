//! Runs a [`Scenario`]: kubesim, the simulated cloud and Joist's actors on one actix arbiter over
//! paused tokio time (DESIGN.md §4), so half an hour of cluster life takes seconds and one seed
//! always gives the same report. Steps run at their virtual times; the progress callback, when one
//! is given, is called every virtual 30 seconds. [`run_then`] looks at the world at the run's end,
//! while it still runs.

use std::{cell::RefCell, collections::BTreeMap, rc::Rc, sync::Arc, time::Duration};

use joist_actors::{
    effects::faults::{FaultPoints, Step},
    effects::node_trace::NodeTracer,
    settings::{Settings, SolverMode},
};
use joist_kubesim::{
    Cluster, ClusterSettings, Serializing, Store,
    api::{ApiFaults, FaultCounts},
    physics::PhysicsSettings,
};
use joist_messages::{
    apis::manifest::{self, Checker, Outcome},
    model::shape::CapacitySettings,
    time::Clock,
};
use joist_provider_sim::{CallLog, SimCloud, SimReservation, SimSettings};
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    SimulateError,
    audit::{Audit, Crash},
    node_condition, node_taint,
    recorder::Recorder,
    report::{self, Report},
    restore,
    scenario::{Action, ObjectRef, Scenario},
};

/// The Unix time every simulation starts at: 2026-01-01T00:00:00Z.
pub const EPOCH: i64 = 1_767_225_600;

/// How often progress is reported, in virtual time.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// What the progress callback is told.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Virtual time so far.
    pub at: Duration,
    /// The end.
    pub until: Duration,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Pods pending.
    pub pending: usize,
}

/// What a simulation leaves.
#[derive(Debug)]
pub struct Simulated {
    /// What happened.
    pub report: Report,
    /// The controllers' Prometheus metrics at the end (OpenMetrics text).
    pub metrics: String,
    /// The wall time kubesim's own work took (its requests, watches and physics).
    pub kubesim_busy: Duration,
    /// How many writes kubesim's store took (its last resourceVersion): the run's work in a
    /// figure that, unlike its wall time, does not depend on the machine.
    pub kubesim_writes: u64,
    /// Every call Joist made to the cloud.
    pub calls: CallLog,
    /// What the API server's faults did to the controllers' requests.
    pub api_faults: FaultCounts,
    /// The simulated world (its runtime, and the tasks holding the store): dropped with this
    /// value, unless [`Simulated::leave_world`] hands it to the process's exit.
    world: Option<actix::SystemRunner>,
}

impl Simulated {
    /// Leaves the world to be freed by the process's exit, which is about to come, rather than
    /// object by object: a tenth of a large run's wall time.
    pub fn leave_world(&mut self) {
        if let Some(world) = self.world.take() {
            std::mem::forget(world);
        }
    }
}

/// Runs `scenario` with `seed` and returns its report; node traces go to `node_tracer`, progress
/// (if anyone watches it) to `progress`.
pub fn run(
    scenario: &Scenario,
    seed: u64,
    node_tracer: NodeTracer,
    progress: Option<&mut dyn FnMut(Progress)>,
) -> Result<Simulated, SimulateError> {
    run_then(scenario, seed, (node_tracer, progress), async |_| ()).map(|(simulated, ())| simulated)
}

/// The world at a run's end, still running: a client of its cluster, its store, its cloud, its
/// clock, what Joist's controllers running at the end share, and where they crashed.
pub struct Live {
    /// A client of kubesim.
    pub client: kube::Client,
    /// kubesim's store.
    pub store: Arc<Store>,
    /// The simulated cloud.
    pub cloud: SimCloud,
    /// The run's virtual clock.
    pub clock: Clock,
    /// The controllers' view, settings and metrics.
    pub controllers: joist_actors::shared::Shared,
    /// The crash, if a fault point was armed and reached.
    pub crash: Option<Crash>,
}

/// [`run`], then `then` with the world at its end (virtual time goes on while `then` waits, and
/// Joist's controllers with it); returns the report and what `then` returned.
pub fn run_then<T>(
    scenario: &Scenario,
    seed: u64,
    (node_tracer, progress): (NodeTracer, Option<&mut dyn FnMut(Progress)>),
    then: impl AsyncFnOnce(Live) -> T,
) -> Result<(Simulated, T), SimulateError> {
    run_in_world(scenario, seed, (node_tracer, progress), FaultPoints::none(), then)
}

/// Runs `scenario` with `seed` crashing Joist's controllers where `faults` is armed, then starting
/// new ones from the cluster and the cloud alone [`RESTART_AFTER`] later; returns the report and
/// what the run left behind.
pub fn run_crashing(
    scenario: &Scenario,
    seed: u64,
    faults: FaultPoints,
) -> Result<(Simulated, Audit), SimulateError> {
    run_in_world(
        scenario,
        seed,
        (NodeTracer::disabled(), None),
        faults,
        async |live: Live| Audit::of(&live.store, &live.cloud, &live.controllers.read, live.crash),
    )
}

/// [`simulate`] in a world of its own, which the returned report keeps.
fn run_in_world<T>(
    scenario: &Scenario,
    seed: u64,
    watchers: (NodeTracer, Option<&mut dyn FnMut(Progress)>),
    faults: FaultPoints,
    then: impl AsyncFnOnce(Live) -> T,
) -> Result<(Simulated, T), SimulateError> {
    let manifests = prepare(scenario)?;
    let system = paused_system().map_err(SimulateError::Runtime)?;
    let (mut simulated, looked) =
        system.block_on(simulate(scenario, manifests, seed, watchers, faults, then))?;
    simulated.world = Some(system);
    Ok((simulated, looked))
}

/// An actix system on a current-thread runtime whose time is paused: virtual time, which jumps
/// to the next timer whenever every task waits.
pub fn paused_system() -> std::io::Result<actix::SystemRunner> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    Ok(actix::System::with_tokio_rt(move || runtime))
}

async fn simulate<T>(
    scenario: &Scenario,
    mut manifests: Manifests,
    seed: u64,
    (node_tracer, mut progress): (NodeTracer, Option<&mut dyn FnMut(Progress)>),
    faults: FaultPoints,
    then: impl AsyncFnOnce(Live) -> T,
) -> Result<(Simulated, T), SimulateError> {
    let started = Instant::now();
    // A cluster restored from a snapshot goes on from when it was taken.
    let epoch = (scenario.snapshot.as_ref())
        .and_then(|snapshot| snapshot.taken_at())
        .unwrap_or(EPOCH);
    let clock = Clock::starting_at(epoch);
    let cluster = Cluster::start(ClusterSettings {
        clock,
        seed,
        physics: PhysicsSettings {
            scheduler: scenario.scheduler_config.clone(),
            ..PhysicsSettings::default()
        },
        // The whole simulated world runs on this one thread.
        serializing: Serializing::Beside,
    });
    crate::commands::install_crds(&cluster).map_err(|e| SimulateError::Setup(e.to_string()))?;
    let client = cluster.client();
    let cloud = SimCloud::new(
        SimSettings {
            region: scenario.region.clone(),
            zones: scenario.zones.clone(),
            boot: scenario.boot,
            cluster_name: scenario.name.clone(),
            capacity: CapacitySettings::default(),
            epoch_seconds: epoch,
            seed,
            // New nodes named apart from a restored cluster's (a simulation's are on network 0).
            network: u8::from(scenario.snapshot.is_some()),
        },
        client.clone(),
    )
    .map_err(|e| SimulateError::Setup(e.to_string()))?;
    let settings = Settings {
        batch_idle: scenario.batch_idle,
        batch_max: scenario.batch_max,
        solver: SolverMode::Inline,
        watch_jitter_seed: Some(seed),
        interruption_queue: Some(cloud.queue()),
        reserved_capacity: scenario.feature_gates.reserved_capacity,
        node_repair: scenario.feature_gates.node_repair,
        static_capacity: scenario.feature_gates.static_capacity,
        node_overlay: scenario.feature_gates.node_overlay,
        capacity_buffer: scenario.feature_gates.capacity_buffer,
        spot_to_spot_consolidation: scenario.feature_gates.spot_to_spot_consolidation,
        scheduler_config: scenario.scheduler_config.clone(),
        ..Settings::default()
    };
    let restored = match &scenario.snapshot {
        Some(snapshot) => Some(restore::restore(cluster.store(), &cloud, snapshot)?),
        None => None,
    };
    let recorder = Recorder::start(cluster.store().clone(), started);
    if let Some(restored) = restored {
        let detail = format!("{} nodes adopted, {} pods", restored.nodes, restored.pods);
        recorder.note("restored", "snapshot".to_owned(), detail);
    }
    // Only a scenario that fails the API server puts the controllers' requests through faults.
    let api_faults = (scenario.steps.iter())
        .any(|step| matches!(step.action, Action::FailKube { .. }))
        .then(ApiFaults::default);
    let controllers = start_controllers(
        &cluster,
        &cloud,
        api_faults.as_ref(),
        settings,
        (clock, started),
        node_tracer,
        faults,
    );
    let world = World {
        client: &client,
        store: cluster.store(),
        cloud: &cloud,
        api_faults: api_faults.as_ref(),
    };
    // Let every actor start while the runtime is live, so an error in the first step cannot tear
    // one down half-started.
    tokio::task::yield_now().await;
    apply(&client, cluster.store(), manifests.initial, "spec.manifests").await?;
    for (i, step) in scenario.steps.iter().enumerate() {
        advance(started, step.at, scenario.until, cluster.store(), &mut progress).await;
        let field = format!("spec.steps[{i}]");
        let documents = manifests.steps.remove(&i).unwrap_or_default();
        recorder.note("step", field.clone(), describe(&step.action, documents.len()));
        execute(&world, &step.action, documents, &field).await?;
    }
    advance(
        started,
        scenario.until,
        scenario.until,
        cluster.store(),
        &mut progress,
    )
    .await;
    let crash = controllers.crash();
    if let Some(crash) = &crash {
        let detail = format!("Joist's controllers crashed at the fault point {}", crash.step);
        recorder.note_at(crash.at, "crash", crash.step.name().to_owned(), detail);
        if let Some(at) = crash.restarted_at {
            recorder.note_at(
                at,
                "restart",
                crash.step.name().to_owned(),
                "new controllers started".to_owned(),
            );
        }
    }
    let recorded = recorder.finish();
    let last = controllers.last();
    let end = started.elapsed().as_secs_f64();
    let simulated = Simulated {
        report: report::build(&scenario.name, seed, end, cluster.store(), &cloud, recorded),
        metrics: last.metrics.encode(),
        kubesim_busy: cluster.busy(),
        kubesim_writes: cluster.store().revision(),
        api_faults: api_faults.as_ref().map(ApiFaults::counts).unwrap_or_default(),
        calls: cloud.books().calls(),
        world: None,
    };
    // After the report, so what `then` does (and the virtual time it takes) is not in it.
    let looked = then(Live {
        client: client.clone(),
        store: cluster.store().clone(),
        cloud: cloud.clone(),
        clock,
        controllers: last,
        crash,
    })
    .await;
    Ok((simulated, looked))
}

/// How long a crashed controller stays down: a pod restart.
pub const RESTART_AFTER: Duration = Duration::from_secs(10);

/// The controllers of a run, and, with a fault point armed, what came of it.
struct Running {
    first: joist_actors::Controllers,
    armed: Option<(Step, Rc<RefCell<Restart>>)>,
}

/// When the controllers crashed, and the ones started after (with when), seconds into the run.
#[derive(Default)]
struct Restart {
    crashed_at: Option<f64>,
    after: Option<(f64, joist_actors::Controllers)>,
}

impl Running {
    /// What the controllers running at the end share (their view and metrics).
    fn last(&self) -> joist_actors::shared::Shared {
        let restart = self.armed.as_ref().map(|(_, restart)| restart.borrow());
        match restart.as_ref().and_then(|r| r.after.as_ref()) {
            Some((_, controllers)) => controllers.shared.clone(),
            None => self.first.shared.clone(),
        }
    }

    /// The crash, if the armed fault point was reached.
    fn crash(&self) -> Option<Crash> {
        let (step, restart) = self.armed.as_ref()?;
        let restart = restart.borrow();
        Some(Crash {
            step: *step,
            at: restart.crashed_at?,
            restarted_at: restart.after.as_ref().map(|(at, _)| *at),
        })
    }
}

/// Starts Joist's controllers, their client going through `api_faults` if any; with `faults` armed,
/// through a client and a cloud that go silent when they crash, and starts new ones
/// [`RESTART_AFTER`] later.
fn start_controllers(
    cluster: &Cluster,
    cloud: &SimCloud,
    api_faults: Option<&ApiFaults>,
    settings: Settings,
    (clock, started): (Clock, Instant),
    node_tracer: NodeTracer,
    faults: FaultPoints,
) -> Running {
    let Some(step) = faults.armed() else {
        let first = joist_actors::start(
            cluster.client_with(api_faults, None),
            Arc::new(cloud.clone()),
            settings,
            clock,
            node_tracer,
        );
        return Running { first, armed: None };
    };
    let down = faults.clone();
    let armed = Settings {
        faults: faults.clone(),
        ..settings.clone()
    };
    let first = joist_actors::start(
        cluster.client_with(api_faults, Some(Arc::new(move || down.is_down()))),
        Arc::new(cloud.clone()),
        armed,
        clock,
        node_tracer.clone(),
    );
    let (client, cloud) = (cluster.client_with(api_faults, None), cloud.clone());
    let restart = Rc::new(RefCell::new(Restart::default()));
    let noted = restart.clone();
    actix::spawn(async move {
        faults.crashed().await;
        let at = || Instant::now().duration_since(started).as_secs_f64();
        noted.borrow_mut().crashed_at = Some(at());
        tokio::time::sleep(RESTART_AFTER).await;
        let controllers = joist_actors::start(client, Arc::new(cloud), settings, clock, node_tracer);
        noted.borrow_mut().after = Some((at(), controllers));
    });
    Running {
        first,
        armed: Some((step, restart)),
    }
}

/// Lets virtual time run to `target`, reporting progress on the way to `progress`, if given (each
/// report reads every node and pod: the whole cluster every [`PROGRESS_EVERY`]).
async fn advance(
    started: Instant,
    target: Duration,
    until: Duration,
    store: &Store,
    progress: &mut Option<&mut dyn FnMut(Progress)>,
) {
    let Some(progress) = progress else {
        tokio::time::sleep_until(started + target).await;
        return;
    };
    loop {
        let now = started.elapsed();
        if now >= target {
            return;
        }
        tokio::time::sleep_until(started + (now + PROGRESS_EVERY).min(target)).await;
        let nodes = joist_kubesim::resources::GroupResource::new("", "nodes");
        progress(Progress {
            at: started.elapsed(),
            until,
            nodes: store.list_encoded(&nodes, None, None, None).items.len(),
            pending: super::report::pod_phases(store)
                .iter()
                .filter(|pod| pod.phase() == "Pending")
                .count(),
        });
    }
}

/// The timeline's words for a step; `documents` is how many an `apply` step applies.
fn describe(action: &Action, documents: usize) -> String {
    match action {
        Action::Apply(_) => format!("apply {documents} document(s)"),
        Action::Scale { object, replicas } => format!("scale {} {} to {replicas}", object.kind, object.name),
        Action::Unavailable { pattern, duration } => {
            format!("{pattern} unavailable for {}s", duration.as_secs())
        }
        Action::Interrupt { node_selector, count } => {
            format!("interrupt {count} node(s) matching {node_selector:?}")
        }
        Action::Delete(object) => format!("delete {} {}", object.kind, object.name),
        Action::FailCreates { resource, count } => {
            format!(
                "the API server refuses the next {count} create(s) of {}",
                resource.qualified()
            )
        }
        Action::FailCloud {
            operations,
            failure,
            duration,
        } => {
            let names: Vec<&str> = operations.iter().map(|o| o.name()).collect();
            format!(
                "the cloud fails {} ({failure:?}) for {}s",
                names.join(", "),
                duration.as_secs()
            )
        }
        Action::FailKube { failure, duration } => {
            format!(
                "the API server fails Joist's requests ({failure:?}) for {}s",
                duration.as_secs()
            )
        }
        Action::BootFault { fault, duration } => {
            format!(
                "instances launched in the next {}s: {fault:?}",
                duration.as_secs()
            )
        }
        Action::TaintNodes { taint, duration } => format!(
            "every Node that becomes Ready is tainted {}:{} for {}s",
            taint.key,
            taint.effect,
            duration.as_secs()
        ),
        Action::ReleaseImage { family } => format!("a new {family} image is released"),
        Action::NodeCondition {
            node_selector,
            count,
            type_,
            status,
        } => format!("{type_}={status} on {count} node(s) matching {node_selector:?}"),
        Action::ImpairInstances {
            node_selector,
            count,
            category,
        } => format!(
            "{} failing on {count} instance(s) whose nodes match {node_selector:?}",
            category.label()
        ),
        Action::CreateReservation { reservation, .. } => format!(
            "capacity reservation {} for {} {} in {}",
            reservation.id, reservation.count, reservation.instance_type, reservation.zone
        ),
        Action::CancelReservation { id } => format!("capacity reservation {id} is cancelled"),
        Action::CreatePlacementGroup { name, strategy } => {
            format!("{strategy} placement group {name} is created")
        }
        Action::DeletePlacementGroup { name } => format!("placement group {name} is deleted"),
    }
}

/// What steps act on: the cluster (through a client of its own), the cloud, and the faults of
/// the controllers' connection to the API server.
struct World<'a> {
    client: &'a kube::Client,
    store: &'a Arc<Store>,
    cloud: &'a SimCloud,
    /// Present when the scenario has a `failKube` step.
    api_faults: Option<&'a ApiFaults>,
}

async fn execute(
    world: &World<'_>,
    action: &Action,
    documents: Vec<Document>,
    field: &str,
) -> Result<(), SimulateError> {
    let World {
        client,
        store,
        cloud,
        api_faults,
    } = *world;
    match action {
        Action::Apply(_) => apply(client, store, documents, &format!("{field}.apply")).await,
        Action::Scale { object, replicas } => {
            let api = api_for(client, store, object, field)?;
            api.patch(
                &object.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .map(drop)
            .map_err(|e| SimulateError::Step {
                field: field.to_owned(),
                message: format!("scaling {} {}: {e}", object.kind, object.name),
            })
        }
        Action::Delete(object) => {
            let api = api_for(client, store, object, field)?;
            api.delete(&object.name, &DeleteParams::default())
                .await
                .map(drop)
                .map_err(|e| SimulateError::Step {
                    field: field.to_owned(),
                    message: format!("deleting {} {}: {e}", object.kind, object.name),
                })
        }
        Action::Unavailable { pattern, duration } => {
            cloud.make_unavailable(pattern.clone(), *duration);
            Ok(())
        }
        Action::Interrupt { node_selector, count } => {
            cloud.interrupt(node_selector, *count);
            Ok(())
        }
        Action::FailCreates { resource, count } => {
            store.fail_creates(resource, *count);
            Ok(())
        }
        Action::FailCloud {
            operations,
            failure,
            duration,
        } => {
            for operation in operations {
                cloud.fail(*operation, *failure, *duration);
            }
            Ok(())
        }
        Action::FailKube { failure, duration } => {
            if let Some(api_faults) = api_faults {
                api_faults.fail(*failure, *duration);
            }
            Ok(())
        }
        Action::BootFault { fault, duration } => {
            cloud.break_boots(*fault, *duration);
            Ok(())
        }
        Action::TaintNodes { taint, duration } => {
            node_taint::taint_ready_nodes(store.clone(), taint.clone(), *duration);
            Ok(())
        }
        Action::ReleaseImage { family } => {
            cloud.release_image(family);
            Ok(())
        }
        Action::NodeCondition {
            node_selector,
            count,
            type_,
            status,
        } => {
            node_condition::set(store, node_selector, *count, type_, status);
            Ok(())
        }
        Action::ImpairInstances {
            node_selector,
            count,
            category,
        } => {
            cloud.impair(node_selector, *count, *category);
            Ok(())
        }
        Action::CreateReservation {
            reservation,
            ends_after,
        } => {
            let end = ends_after.map(|after| cloud.now() + after.as_secs() as i64);
            cloud.add_reservation(SimReservation {
                end,
                ..reservation.clone()
            });
            Ok(())
        }
        Action::CancelReservation { id } => {
            cloud.cancel_reservation(id);
            Ok(())
        }
        Action::CreatePlacementGroup { name, strategy } => {
            cloud.create_placement_group(name, *strategy);
            Ok(())
        }
        Action::DeletePlacementGroup { name } => {
            cloud.delete_placement_group(name);
            Ok(())
        }
    }
}

/// The API of an object's kind, found by kind in kubesim's discovery.
fn api_for(
    client: &kube::Client,
    store: &Store,
    object: &ObjectRef,
    field: &str,
) -> Result<Api<DynamicObject>, SimulateError> {
    let resource = store
        .with_registry(|r| r.all().find(|t| t.kind == object.kind).cloned())
        .ok_or_else(|| SimulateError::Step {
            field: field.to_owned(),
            message: format!("no resource of kind {:?} is served", object.kind),
        })?;
    Ok(dynamic_api(client, &resource, &object.namespace))
}

fn dynamic_api(
    client: &kube::Client,
    resource: &joist_kubesim::resources::ResourceType,
    namespace: &str,
) -> Api<DynamicObject> {
    let api_resource = ApiResource {
        group: resource.group.clone(),
        version: resource.version.clone(),
        api_version: resource.api_version(),
        kind: resource.kind.clone(),
        plural: resource.plural.clone(),
    };
    if resource.namespaced {
        let namespace = if namespace.is_empty() {
            "default"
        } else {
            namespace
        };
        Api::namespaced_with(client.clone(), namespace, &api_resource)
    } else {
        Api::all_with(client.clone(), &api_resource)
    }
}

/// A manifest document ready to apply: `apiVersion`, `kind`, name, and the body (Karpenter objects
/// with their defaults filled in).
struct Document {
    api_version: String,
    kind: String,
    name: String,
    object_ref: String,
    body: Value,
}

/// Parses and checks every document of `text`, as the API server's CRD validation would: an invalid
/// or pre-v1 Karpenter object is an error naming it and its fields.
fn documents(checker: &mut Checker, text: &str, field: &str) -> Result<Vec<Document>, SimulateError> {
    let values = manifest::parse_documents(text).map_err(|e| SimulateError::Step {
        field: field.to_owned(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for value in values.into_iter().filter(|d| !d.is_null()) {
        let checked = checker.check_document(&value);
        let object_ref = checked.object_ref();
        let rejected = |message: String| SimulateError::Step {
            field: field.to_owned(),
            message: format!("{object_ref}: {message}"),
        };
        let body = match checked.outcome {
            Outcome::Valid(object) => object.to_value().map_err(|e| rejected(e.to_string()))?,
            Outcome::Invalid(violations) => {
                let list = violations
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(rejected(list));
            }
            Outcome::Legacy(message) => return Err(rejected(message)),
            Outcome::NotKarpenter => value,
        };
        out.push(Document {
            api_version: checked.api_version,
            kind: checked.kind,
            name: checked.name,
            object_ref,
            body,
        });
    }
    Ok(out)
}

/// A scenario's manifests, parsed and checked once: those applied at t=0 and each `apply` step's,
/// by step position.
pub(super) struct Manifests {
    initial: Vec<Document>,
    steps: BTreeMap<usize, Vec<Document>>,
}

/// Parses and checks the manifests and every `apply` step before anything starts.
pub(super) fn prepare(scenario: &Scenario) -> Result<Manifests, SimulateError> {
    // Generating the CRD schemas is the costly part of checking: do it once.
    let mut checker = Checker::new();
    let initial = documents(&mut checker, &scenario.manifests, "spec.manifests")?;
    let mut steps = BTreeMap::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        if let Action::Apply(text) = &step.action {
            steps.insert(
                i,
                documents(&mut checker, text, &format!("spec.steps[{i}].apply"))?,
            );
        }
    }
    Ok(Manifests { initial, steps })
}

/// Applies `documents` with server-side apply.
async fn apply(
    client: &kube::Client,
    store: &Store,
    documents: Vec<Document>,
    field: &str,
) -> Result<(), SimulateError> {
    for document in documents {
        let rejected = |message: String| SimulateError::Step {
            field: field.to_owned(),
            message: format!("{}: {message}", document.object_ref),
        };
        let resource = store
            .resource_type_of(&document.api_version, &document.kind)
            .ok_or_else(|| {
                rejected(format!(
                    "{} {} is not served",
                    document.api_version, document.kind
                ))
            })?;
        let namespace = document.body["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let api = dynamic_api(client, &resource, &namespace);
        let object: DynamicObject =
            serde_json::from_value(document.body).map_err(|e| rejected(e.to_string()))?;
        api.patch(
            &document.name,
            &PatchParams::apply("joist-simulate").force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(|e| rejected(e.to_string()))?;
    }
    Ok(())
}

//! ClusterState: runs the reflectors that fill the read model and turns each watch event into the
//! pokes other actors need: a newly provisionable pod to the Batcher, a Node or NodeClaim change
//! to that NodeClaim's actor, a NodePool or node class change to the NodePool actors. It starts an
//! actor for every NodePool and NodeClaim it sees (so NodeClaims that existed before a restart are
//! adopted), sharding NodePool actors over the arbiters it is given. When NodePools are split
//! between replicas ([`crate::state::replica_shards`]) it reflects only the NodeClaims of the
//! NodePools this replica holds, restarting that watch when they change, and starts actors for
//! those NodePools alone.
//!
//! Pod notifications use `try_send`: when the Batcher's mailbox is full the trigger is remembered
//! and sent again on the next tick, never lost and never blocking the watch. Pending pods are
//! looked at again every [`PENDING_REQUEUE`], and at once when capacity goes away (a Node or
//! NodeClaim deleted). Watch errors are
//! retried by the watchers with backoff and logged.
//!
//! Observing ([`ClusterState::observing`], what `joist explain` runs), it fills the read model and
//! does nothing else: no actor is started or poked, no node class resolved, nothing written.
//!
//! It takes no messages, so it has no mailbox to bound: the watch streams are pulled one event at
//! a time, when the previous one has been handled, so a busy ClusterState slows its watches down
//! instead of growing a queue.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use actix::prelude::*;
use futures::{StreamExt, stream::BoxStream};
use joist_messages::{
    apis::{EC2NodeClass, NodeClaim, NodeOverlay, NodePool},
    cached_pod::CachedPod,
    labels::NODEPOOL,
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, ReplicaSet, StatefulSet},
    core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, ReplicationController, Service},
    policy::v1::PodDisruptionBudget,
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{ObjectRef, store::Writer},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::{
    batcher::Batcher,
    node_claim::NodeClaimActor,
    node_class,
    node_pool::NodePoolActor,
    protocol::{PodPending, Reconcile},
    shared::{NodePoolHandle, Shared},
    state::{
        cached,
        default_spread::{self, ControllerSeen, DefaultSpreadWriters},
        read_model::{Listed, PodKey, Writers},
        watch_backoff::watch_backoff,
    },
};

/// How often a replica whose NodePools are split between replicas looks at the shards it holds.
const FOLLOW_SHARDS: Duration = Duration::from_secs(1);

/// How often a trigger the Batcher could not take is retried.
const RETRY_TRIGGER: Duration = Duration::from_secs(1);

/// How often provisionable pods are looked at again even when nothing changed (Karpenter's pod
/// controller requeues them every 10 s): a failed NodeClaim create, a NodePool skipped for a
/// pass or a launch that went nowhere is retried, and no pod stays pending silently.
pub const PENDING_REQUEUE: Duration = Duration::from_secs(10);

/// One watch event, by kind; `deleted` tells a removal from an add or update.
#[derive(Debug)]
pub enum Change {
    /// A pod.
    Pod(Arc<CachedPod>, bool),
    /// A node.
    Node(Arc<Node>, bool),
    /// A NodeClaim.
    NodeClaim(Arc<NodeClaim>, bool),
    /// A VolumeAttachment.
    VolumeAttachment(Arc<VolumeAttachment>, bool),
    /// A NodePool.
    NodePool(Arc<NodePool>, bool),
    /// A node class.
    NodeClass(Arc<EC2NodeClass>, bool),
    /// A NodeOverlay.
    NodeOverlay(Arc<NodeOverlay>, bool),
    /// A Service (reflected while default topology spread is configured).
    Service(Arc<Service>, bool),
    /// A (re)list of a kind the indexes cover ended, with every object it listed.
    Relisted(Listed, HashSet<PodKey>),
    /// A controller default topology spread reads changed; none: their kind was relisted.
    SpreadController(Option<ControllerSeen>),
    /// An object no actor is poked for changed (a DaemonSet, PodDisruptionBudget, Namespace,
    /// PersistentVolumeClaim).
    Other,
    /// Nothing changed (lists starting, watch errors).
    Quiet,
}

/// See the module docs.
pub struct ClusterState {
    shared: Shared,
    /// Where pending pods are sent; none when only observing.
    batcher: Option<Addr<Batcher>>,
    writers: Option<Writers>,
    shards: Vec<ArbiterHandle>,
    next_shard: usize,
    missed_trigger: bool,
    /// Failed resolutions in a row, per node class.
    class_failures: HashMap<String, u32>,
    /// The retry waiting for each failing node class: one at most, however many resolutions fail.
    class_retries: HashMap<String, SpawnHandle>,
    /// Which NodeClaims are reflected, when NodePools are split between replicas.
    claim_scope: Option<watch::Sender<ClaimScope>>,
}

impl ClusterState {
    /// The cluster state actor; `shards` are the arbiters NodePool actors are spread over (none:
    /// the current one).
    pub fn new(shared: Shared, writers: Writers, batcher: Addr<Batcher>, shards: Vec<ArbiterHandle>) -> Self {
        Self {
            batcher: Some(batcher),
            shards,
            ..Self::observing(shared, writers)
        }
    }

    /// A cluster state actor that only fills the read model (see the module docs).
    pub fn observing(shared: Shared, writers: Writers) -> Self {
        Self {
            shared,
            batcher: None,
            writers: Some(writers),
            shards: Vec::new(),
            next_shard: 0,
            missed_trigger: false,
            class_failures: HashMap::new(),
            class_retries: HashMap::new(),
            claim_scope: None,
        }
    }

    /// Pokes the Batcher with any pending pod, so the Provisioner looks again (capacity went away
    /// or a NodePool became usable).
    fn trigger(&mut self) {
        if let Some(pod) = self.shared.read.first_pending_pod() {
            self.notify(PodPending { pod });
        }
    }

    /// A NodeClaim began being deleted: its node's pods are provisioned for now, with the
    /// pending ones, so their replacement is on its way before the drain evicts them.
    fn place_leaving_pods(&mut self, claim: &NodeClaim) {
        let node = claim.status.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(pod) = node.and_then(|node| self.shared.read.pods_on(node).into_iter().next()) {
            self.notify(PodPending {
                pod: (pod.namespace().unwrap_or_default(), pod.name_any()),
            });
        }
    }

    /// Whether this actor acts on what it sees, rather than only observing.
    fn acting(&self) -> bool {
        self.batcher.is_some()
    }

    fn notify(&mut self, pending: PodPending) {
        let Some(batcher) = &self.batcher else {
            return;
        };
        if batcher.try_send(pending).is_err() {
            self.shared.metrics.found_full("batcher");
            self.missed_trigger = true;
        }
    }

    fn node_pool_actor(&mut self, name: &str) -> NodePoolHandle {
        if let Some(actor) = self.shared.directory.node_pools.get(name) {
            return actor.clone();
        }
        let shared = self.shared.clone();
        let owned = name.to_owned();
        let actor = if self.shards.is_empty() {
            Supervisor::start(move |_| NodePoolActor::new(owned, shared))
        } else {
            let shard = &self.shards[self.next_shard % self.shards.len()];
            self.next_shard += 1;
            Supervisor::start_in_arbiter(shard, move |_| NodePoolActor::new(owned, shared))
        };
        let handle = NodePoolHandle {
            reconcile: actor.clone().recipient(),
            launch: actor.recipient(),
        };
        self.shared
            .directory
            .node_pools
            .insert(name.to_owned(), handle.clone());
        handle
    }

    fn node_claim_actor(&mut self, name: &str) -> Recipient<Reconcile> {
        if let Some(actor) = self.shared.directory.node_claims.get(name) {
            return actor.clone();
        }
        let shared = self.shared.clone();
        let owned = name.to_owned();
        let actor = Supervisor::start(move |_| NodeClaimActor::new(owned, shared)).recipient();
        self.shared
            .directory
            .node_claims
            .insert(name.to_owned(), actor.clone());
        actor
    }

    fn poke_claim(&self, name: &str) {
        if let Some(actor) = self.shared.directory.node_claims.get(name) {
            self.shared.poke(&actor, "nodeclaim");
        }
    }

    /// Reconciles a node class off the mailbox; a failed resolution is retried with backoff.
    fn reconcile_class(&mut self, ctx: &mut Context<Self>, class: Arc<EC2NodeClass>, refresh: bool) {
        if !self.acting() {
            return;
        }
        let name = class.name_any();
        let work = node_class::reconcile(self.shared.clone(), class, refresh);
        ctx.spawn(work.into_actor(self).map(move |outcome, state, ctx| {
            if outcome != node_class::Outcome::Failed {
                state.forget_class(ctx, &name);
                return;
            }
            let failures = state.class_failures.entry(name.clone()).or_default();
            *failures += 1;
            let wait = node_class::retry_after(*failures);
            if let Some(pending) = state.class_retries.remove(&name) {
                ctx.cancel_future(pending);
            }
            let retry = ctx.run_later(wait, {
                let name = name.clone();
                move |state, ctx| {
                    state.class_retries.remove(&name);
                    if let Some(class) = state.shared.read.node_class(&name) {
                        state.reconcile_class(ctx, class, true);
                    }
                }
            });
            state.class_retries.insert(name, retry);
        }));
    }

    /// Drops a node class's failures and its pending retry (it resolved, or it is gone).
    fn forget_class(&mut self, ctx: &mut Context<Self>, name: &str) {
        self.class_failures.remove(name);
        if let Some(pending) = self.class_retries.remove(name) {
            ctx.cancel_future(pending);
        }
    }

    /// When NodePools are split between replicas: follows the shards this replica holds and the
    /// NodePools that exist — the NodeClaims reflected (their watch restarts when the selector
    /// changes), an actor for each NodePool of a held shard, and a look at pending pods when the
    /// replica came to act for more.
    fn follow_shards(&mut self) {
        let (Some(shards), Some(scope)) = (self.shared.settings.replica_shards.clone(), &self.claim_scope)
        else {
            return;
        };
        if !self.acting() {
            return;
        }
        let read = self.shared.read.clone();
        if !read.node_pools_listed() {
            return;
        }
        let wanted = shards
            .claims_selector(&read)
            .map_or(ClaimScope::Nothing, ClaimScope::Selected);
        let rescoped = scope.send_if_modified(|current| {
            let changed = *current != wanted;
            *current = wanted;
            changed
        });
        let mut started = false;
        for pool in read.node_pools() {
            let name = pool.name_any();
            if shards.holds_pool(&name) && !self.shared.directory.node_pools.contains_key(&name) {
                let actor = self.node_pool_actor(&name);
                self.shared.poke(&actor.reconcile, "nodepool");
                started = true;
            }
        }
        if rescoped || started {
            tracing::info!(shards = ?shards.held(), "acting for the nodepools of these shards");
            self.trigger();
        }
    }

    fn poke_pools(&self) {
        for actor in self.shared.directory.node_pools.iter() {
            self.shared.poke(&actor.reconcile, "nodepool");
        }
    }
}

impl ClusterState {
    /// The NodeOverlays' stream when the `NodeOverlay` gate is on; with it off, an empty store
    /// that is ready at once, so a cluster without the NodeOverlay CRD is never watched for it.
    fn overlays(&self, mut writer: Writer<NodeOverlay>) -> BoxStream<'static, Change> {
        if self.shared.settings.node_overlay {
            return reflect(
                self.shared.settings.watch_jitter_seed,
                Api::<NodeOverlay>::all(self.shared.client.clone()),
                writer,
                cached::trim,
                Change::NodeOverlay,
                |_| Change::Quiet,
            );
        }
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        futures::stream::empty().boxed()
    }
}

/// A kind the reflectors keep: a Kubernetes object that can be decoded, copied, logged and sent
/// between threads.
trait Reflected:
    Resource<DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Reflected for K where
    K: Resource<DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A reflector over every object of `K`, as a stream of [`Change`]s ([`changes`]), each object
/// `trim`med before it is stored ([`cached`]).
fn reflect<K: Reflected>(
    jitter: Option<u64>,
    api: Api<K>,
    writer: Writer<K>,
    trim: fn(&mut K),
    change: fn(Arc<K>, bool) -> Change,
    relisted: fn(HashSet<PodKey>) -> Change,
) -> BoxStream<'static, Change> {
    let events = watcher::watcher(api, watcher::Config::default())
        .backoff(watch_backoff(jitter))
        .modify(trim)
        .boxed();
    changes(events, writer, change, relisted)
}

/// The watches of what default topology spread reads: Services, and the controllers whose
/// selectors kube-scheduler deduces one from.
fn default_spread_streams(
    jitter: Option<u64>,
    client: &kube::Client,
    writers: DefaultSpreadWriters,
) -> Vec<BoxStream<'static, Change>> {
    vec![
        reflect(
            jitter,
            Api::<Service>::all(client.clone()),
            writers.services,
            default_spread::trim_service,
            Change::Service,
            |listed| Change::Relisted(Listed::Services, listed),
        ),
        reflect(
            jitter,
            Api::<ReplicaSet>::all(client.clone()),
            writers.replica_sets,
            default_spread::trim_replica_set,
            |set, deleted| Change::SpreadController(Some(ControllerSeen::replica_set(&set, deleted))),
            |_| Change::SpreadController(None),
        ),
        reflect(
            jitter,
            Api::<StatefulSet>::all(client.clone()),
            writers.stateful_sets,
            default_spread::trim_stateful_set,
            |set, deleted| Change::SpreadController(Some(ControllerSeen::stateful_set(&set, deleted))),
            |_| Change::SpreadController(None),
        ),
        reflect(
            jitter,
            Api::<ReplicationController>::all(client.clone()),
            writers.replication_controllers,
            default_spread::trim_replication_controller,
            |controller, deleted| {
                Change::SpreadController(Some(ControllerSeen::replication_controller(&controller, deleted)))
            },
            |_| Change::SpreadController(None),
        ),
    ]
}

/// Which NodeClaims a replica whose NodePools are split between replicas reflects.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClaimScope {
    /// Not known until the NodePools are listed: nothing is listed, and the store is not ready.
    Unknown,
    /// The replica holds no NodePool: an empty store.
    Nothing,
    /// The claims this label selector selects.
    Selected(String),
}

/// [`reflect`] over the NodeClaims `scopes` select: each new scope restarts the watch, whose list
/// then replaces the store (and the indexes follow, as after any relist).
fn reflect_scoped(
    jitter: Option<u64>,
    api: Api<NodeClaim>,
    writer: Writer<NodeClaim>,
    mut scopes: watch::Receiver<ClaimScope>,
) -> BoxStream<'static, Change> {
    let open = move |scope: ClaimScope| -> BoxStream<'static, watcher::Result<Event<NodeClaim>>> {
        match scope {
            ClaimScope::Unknown => futures::stream::pending().boxed(),
            ClaimScope::Nothing => futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)])
                .chain(futures::stream::pending())
                .boxed(),
            ClaimScope::Selected(labels) => {
                watcher::watcher(api.clone(), watcher::Config::default().labels(&labels))
                    .backoff(watch_backoff(jitter))
                    .modify(cached::trim_claim)
                    .boxed()
            }
        }
    };
    let first = open(scopes.borrow_and_update().clone());
    let events = futures::stream::unfold(
        (scopes, first, open),
        |(mut scopes, mut events, open)| async move {
            loop {
                tokio::select! {
                    changed = scopes.changed() => {
                        if changed.is_err() {
                            // The ClusterState is gone: the stream ends with it.
                            return None;
                        }
                        events = open(scopes.borrow_and_update().clone());
                    }
                    event = events.next() => return event.map(|event| (event, (scopes, events, open))),
                }
            }
        },
    )
    .boxed();
    changes(events, writer, Change::NodeClaim, |listed| {
        Change::Relisted(Listed::NodeClaims, listed)
    })
}

/// A watch's `events` applied to `writer`'s store and turned into [`Change`]s. A (re)list ends
/// with `relisted(every object it listed)`, so indexes can drop objects deleted while the watch
/// was away (after a `410 Gone`, the reflector's store is replaced; the indexes must follow).
///
/// The store takes a list's objects only at its end, so their changes wait until then too: an
/// actor told of a listed object before the store has it would find nothing (a NodePool's actor
/// would stop, and the pool would never be marked Ready). Only the listed keys wait; the changes
/// then carry the store's own copies, so a relist of 100,000 pods holds no second copy of them.
/// A watched change carries the store's copy too (the read model's indexes may keep it), or the
/// watch's own for a deletion.
fn changes<K: Reflected>(
    events: BoxStream<'static, watcher::Result<Event<K>>>,
    mut writer: Writer<K>,
    change: fn(Arc<K>, bool) -> Change,
    relisted: fn(HashSet<PodKey>) -> Change,
) -> BoxStream<'static, Change> {
    let store = writer.as_reader();
    events
        .inspect(move |event| {
            if let Ok(event) = event {
                writer.apply_watcher_event(event);
            }
        })
        .scan(None::<Vec<ObjectRef<K>>>, move |listing, event| {
            let next = match event {
                Ok(Event::Apply(object)) => {
                    let key = ObjectRef::from_obj_with(&object, Default::default());
                    let stored = store.get(&key).unwrap_or_else(|| Arc::new(object));
                    vec![change(stored, false)]
                }
                Ok(Event::InitApply(object)) => {
                    if let Some(listed) = listing.as_mut() {
                        listed.push(ObjectRef::from_obj_with(&object, Default::default()));
                    }
                    Vec::new()
                }
                Ok(Event::Delete(object)) => vec![change(Arc::new(object), true)],
                Ok(Event::Init) => {
                    *listing = Some(Vec::new());
                    Vec::new()
                }
                Ok(Event::InitDone) => match listing.take() {
                    Some(listed) => {
                        let mut changes: Vec<Change> = listed
                            .iter()
                            .filter_map(|key| Some(change(store.get(key)?, false)))
                            .collect();
                        let keys = listed
                            .into_iter()
                            .map(|key| (key.namespace.unwrap_or_default(), key.name))
                            .collect();
                        changes.push(relisted(keys));
                        changes
                    }
                    None => Vec::new(),
                },
                Err(error) => {
                    tracing::warn!(%error, "watch failed; retrying");
                    Vec::new()
                }
            };
            futures::future::ready(Some(futures::stream::iter(next)))
        })
        .flatten()
        .boxed()
}

impl Actor for ClusterState {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let Some(writers) = self.writers.take() else {
            return;
        };
        let client = &self.shared.client;
        let jitter = self.shared.settings.watch_jitter_seed;
        let claims = Api::<NodeClaim>::all(client.clone());
        let claims = if self.shared.settings.replica_shards.is_some() {
            let (scope, scopes) = watch::channel(ClaimScope::Unknown);
            self.claim_scope = Some(scope);
            ctx.run_interval(FOLLOW_SHARDS, |state, _ctx| state.follow_shards());
            reflect_scoped(jitter, claims, writers.node_claims, scopes)
        } else {
            reflect(
                jitter,
                claims,
                writers.node_claims,
                cached::trim_claim,
                Change::NodeClaim,
                |listed| Change::Relisted(Listed::NodeClaims, listed),
            )
        };
        let mut streams = vec![
            claims,
            reflect(
                jitter,
                Api::<Node>::all(client.clone()),
                writers.nodes,
                cached::trim_node,
                Change::Node,
                |listed| Change::Relisted(Listed::Nodes, listed),
            ),
            reflect(
                jitter,
                Api::<NodePool>::all(client.clone()),
                writers.node_pools,
                cached::trim,
                Change::NodePool,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<EC2NodeClass>::all(client.clone()),
                writers.node_classes,
                cached::trim,
                Change::NodeClass,
                |_| Change::Quiet,
            ),
            self.overlays(writers.overlays),
            reflect(
                jitter,
                Api::<DaemonSet>::all(client.clone()),
                writers.daemon_sets,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<PodDisruptionBudget>::all(client.clone()),
                writers.budgets,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<Namespace>::all(client.clone()),
                writers.namespaces,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<PersistentVolumeClaim>::all(client.clone()),
                writers.volume_claims,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<PersistentVolume>::all(client.clone()),
                writers.volumes,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<StorageClass>::all(client.clone()),
                writers.storage_classes,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<CSINode>::all(client.clone()),
                writers.csi_nodes,
                cached::trim,
                |_, _| Change::Other,
                |_| Change::Quiet,
            ),
            reflect(
                jitter,
                Api::<VolumeAttachment>::all(client.clone()),
                writers.volume_attachments,
                cached::trim,
                Change::VolumeAttachment,
                |listed| Change::Relisted(Listed::VolumeAttachments, listed),
            ),
            reflect(
                jitter,
                Api::<CachedPod>::all(client.clone()),
                writers.pods,
                CachedPod::trim,
                Change::Pod,
                |listed| Change::Relisted(Listed::Pods, listed),
            ),
        ];
        if let Some(spread) = writers.default_spread {
            streams.extend(default_spread_streams(jitter, client, spread));
        }
        ctx.add_stream(futures::stream::select_all(streams));
        ctx.run_interval(RETRY_TRIGGER, |state, _ctx| {
            if std::mem::take(&mut state.missed_trigger) {
                state.trigger();
            }
        });
        ctx.run_interval(PENDING_REQUEUE, |state, _ctx| state.trigger());
        ctx.run_interval(node_class::NODE_CLASS_REFRESH, |state, ctx| {
            for class in state.shared.read.node_classes() {
                state.reconcile_class(ctx, class, true);
            }
        });
    }
}

impl StreamHandler<Change> for ClusterState {
    fn handle(&mut self, change: Change, ctx: &mut Self::Context) {
        let read = self.shared.read.clone();
        if !matches!(change, Change::Quiet) {
            read.note_change();
        }
        match change {
            Change::Pod(pod, deleted) => {
                let _span = tracing::debug_span!("cluster_state.pod", pod = pod.name_any()).entered();
                let now = self.shared.clock.now_seconds();
                let change = read.observe_pod(&pod, deleted, now);
                if change.started
                    && let Some(created) = &pod.metadata.creation_timestamp
                {
                    let seconds = (now - created.0.as_second()).max(0);
                    self.shared.metrics.pods_startup.observe("", seconds as f64);
                }
                if change.newly_pending {
                    self.notify(PodPending {
                        pod: (pod.namespace().unwrap_or_default(), pod.name_any()),
                    });
                }
                if let (true, Some(node)) = (deleted, change.node)
                    && let Some(claim) = read.claim_for_node(&node)
                {
                    self.poke_claim(&claim);
                }
            }
            Change::Node(node, deleted) => {
                let _span = tracing::debug_span!("cluster_state.node", node = node.name_any()).entered();
                if let Some(claim) = read.observe_node(&node, deleted) {
                    self.poke_claim(&claim);
                }
                // Capacity went away: pods still pending are simulated again.
                if deleted {
                    self.trigger();
                }
            }
            Change::VolumeAttachment(attachment, deleted) => {
                read.observe_attachment(&attachment, deleted);
            }
            Change::NodeClaim(claim, deleted) => {
                let name = claim.name_any();
                let _span = tracing::debug_span!("cluster_state.nodeclaim", nodeclaim = name).entered();
                let began_leaving = read.observe_claim(&claim, deleted);
                if began_leaving {
                    self.place_leaving_pods(&claim);
                }
                if !deleted && self.acting() {
                    self.node_claim_actor(&name);
                }
                self.poke_claim(&name);
                // A claim that went away took its capacity with it: its pods are simulated again
                // now. Other changes wait for the periodic look at pending pods.
                if deleted {
                    self.trigger();
                    let class = read.node_class(&claim.spec.node_class_ref.name);
                    if let Some(class) = class.filter(|c| c.metadata.deletion_timestamp.is_some()) {
                        self.reconcile_class(ctx, class, false);
                    }
                }
                if let Some(pool) = claim.labels().get(NODEPOOL).filter(|_| self.acting()) {
                    let actor = self.node_pool_actor(pool);
                    self.shared.poke(&actor.reconcile, "nodepool");
                }
            }
            Change::NodePool(pool, deleted) => {
                let name = pool.name_any();
                let _span = tracing::debug_span!("cluster_state.nodepool", nodepool = name).entered();
                if deleted {
                    if let Some(actor) = self.shared.directory.node_pools.get(&name) {
                        self.shared.poke(&actor.reconcile, "nodepool");
                    }
                } else if self.shared.settings.replica_shards.is_some() {
                    // Its actor starts, and its claims are watched, if this replica holds it.
                    self.follow_shards();
                    let actor = self.shared.directory.node_pools.get(&name).map(|a| a.clone());
                    if let Some(actor) = actor {
                        self.shared.poke(&actor.reconcile, "nodepool");
                        self.trigger();
                    }
                } else if self.acting() {
                    let actor = self.node_pool_actor(&name);
                    self.shared.poke(&actor.reconcile, "nodepool");
                    self.trigger();
                }
            }
            Change::NodeOverlay(overlay, deleted) => {
                let _span =
                    tracing::debug_span!("cluster_state.nodeoverlay", nodeoverlay = overlay.name_any())
                        .entered();
                // A status-only change (the passes' own writes) changes no catalog and needs no
                // answer; a new spec gets its validation now, and passes add conflicts.
                if deleted || !crate::overlay::answered(&overlay) {
                    if !deleted && self.acting() {
                        let shared = self.shared.clone();
                        ctx.spawn(
                            async move { crate::overlay::write_validation(&shared, &overlay).await }
                                .into_actor(self),
                        );
                    }
                    // Every pool's catalog changed: look at pending pods again.
                    self.trigger();
                }
            }
            Change::NodeClass(class, deleted) => {
                let _span =
                    tracing::debug_span!("cluster_state.nodeclass", nodeclass = class.name_any()).entered();
                if deleted {
                    self.forget_class(ctx, &class.name_any());
                } else {
                    self.reconcile_class(ctx, class, false);
                }
                self.poke_pools();
            }
            Change::Service(service, deleted) => {
                if let Some(spread) = read.default_spread() {
                    spread.observe_service(&service, deleted);
                }
            }
            Change::SpreadController(seen) => {
                if let Some(spread) = read.default_spread() {
                    match seen {
                        Some(seen) => spread.observe_controller(seen),
                        // Some may have gone while the watch was away.
                        None => spread.inputs_changed(),
                    }
                }
            }
            Change::Relisted(kind, listed) => {
                let _span =
                    tracing::debug_span!("cluster_state.relisted", ?kind, objects = listed.len()).entered();
                for gone in read.relisted(kind, &listed) {
                    self.poke_claim(&gone);
                }
            }
            Change::Other | Change::Quiet => {}
        }
    }

    fn finished(&mut self, _ctx: &mut Self::Context) {
        tracing::error!("the watch streams ended");
    }
}

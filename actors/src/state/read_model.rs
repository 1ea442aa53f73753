//! The read model every actor consults: kube-runtime reflector stores of the objects Joist watches,
//! plus the indexes the hot paths need (node by provider ID, NodeClaim by provider ID, NodeClaims
//! by NodePool, pods and VolumeAttachments by node, provisionable pods), kept by the ClusterState
//! actor as watch events arrive.
//!
//! NodeClaims Joist just created are visible at once, before their watch event arrives
//! ([`ReadModel::record_created`]), as Karpenter's cluster state records its launches: the next
//! scheduling pass counts them and does not launch for the same pods again. An entry leaves that
//! overlay when the watch shows the claim, or after [`READ_MODEL_LAG`](crate::decide::lifecycle::READ_MODEL_LAG)
//! if it never does (it was deleted before the watch saw it).
//!
//! Reads are lock-free snapshots (`Arc`s of the objects). Reflector stores iterate in hash order,
//! so every list this module returns is sorted by namespace and name: the same cluster always
//! yields the same snapshot, which keeps simulations deterministic.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet, btree_map::Entry},
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use dashmap::{DashMap, DashSet};
use joist_messages::{
    apis::{EC2NodeClass, NodeClaim, NodeOverlay, NodePool},
    cached_pod::CachedPod,
    labels::NODEPOOL,
    model::{
        quantity::Quantity,
        resources::{Resources, names},
    },
    scheduler_config::SchedulerConfig,
};
use joist_scheduling::{
    pod::{PodError, PodInfo},
    volumes::{PodVolumes, StorageObjects, pod_volumes, uses_claims},
};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim},
    policy::v1::PodDisruptionBudget,
    storage::v1::{CSINode, StorageClass, VolumeAttachment},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{
    Resource, ResourceExt,
    runtime::reflector::{self, ObjectRef, Store, store::Writer},
};

use super::{
    cached,
    created::Created,
    default_spread::{DefaultSpread, DefaultSpreadWriters},
    listed,
};
use crate::decide::lifecycle::drainable;
use joist_messages::pods::{finished, is_mirror, owned_by_daemon_set};
use joist_provider::provider_id::instance_id;

/// `namespace/name` of a pod (or of any object: the namespace is empty for cluster-scoped ones).
pub type PodKey = (String, String);

/// A pod with its scheduling view, or why it cannot have one ([`ReadModel::pod_info`]).
pub type Viewed = (Arc<CachedPod>, Result<Arc<PodInfo>, PodError>);

/// The kinds whose indexes a relist rebuilds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Pods: pods by node, provisionable pods.
    Pods,
    /// Nodes: node by provider ID, pods by node.
    Nodes,
    /// NodeClaims: NodeClaim by provider ID, NodeClaims by NodePool.
    NodeClaims,
    /// VolumeAttachments: attachments by node.
    VolumeAttachments,
    /// Services: the selectors default topology spread reads, by namespace.
    Services,
}

/// The writing halves of the stores, consumed by the reflectors ClusterState runs.
pub struct Writers {
    pub(crate) pods: Writer<CachedPod>,
    pub(crate) nodes: Writer<Node>,
    pub(crate) node_claims: Writer<NodeClaim>,
    pub(crate) node_pools: Writer<NodePool>,
    pub(crate) node_classes: Writer<EC2NodeClass>,
    pub(crate) overlays: Writer<NodeOverlay>,
    pub(crate) daemon_sets: Writer<DaemonSet>,
    pub(crate) budgets: Writer<PodDisruptionBudget>,
    pub(crate) namespaces: Writer<Namespace>,
    pub(crate) volume_claims: Writer<PersistentVolumeClaim>,
    pub(crate) volumes: Writer<PersistentVolume>,
    pub(crate) storage_classes: Writer<StorageClass>,
    pub(crate) csi_nodes: Writer<CSINode>,
    pub(crate) volume_attachments: Writer<VolumeAttachment>,
    /// The controllers default topology spread reads, when defaults are configured.
    pub(crate) default_spread: Option<DefaultSpreadWriters>,
}

/// The provisionable pods by key, ordered (a lock poisoned by a panic elsewhere still holds a
/// consistent map: every change is one insert or remove, or one view kept).
#[derive(Default)]
struct Pending(RwLock<BTreeMap<PodKey, Waiting>>);

impl Pending {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<PodKey, Waiting>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<PodKey, Waiting>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A provisionable pod: the store's copy of its latest version, and the scheduling view made of
/// it (kept here rather than in `Index::pod_infos`, so a pass over 100,000 pending pods looks
/// nothing up).
struct Waiting {
    pod: Arc<CachedPod>,
    view: Option<CachedInfo>,
}

#[derive(Default)]
struct Index {
    node_by_provider: DashMap<String, String>,
    claim_by_provider: DashMap<String, String>,
    claim_by_instance: DashMap<String, String>,
    claims_by_pool: DashMap<String, BTreeSet<String>>,
    /// NodeClaims being deleted (their nodes' pods are about to need a place), and whether a
    /// provisioning pass has counted those pods yet.
    leaving: DashMap<String, bool>,
    /// Nodes a provisioning pass counted on for pods (by Node name, or NodeClaim name while in
    /// flight), and until when they are nominated, in epoch seconds.
    nominated: DashMap<String, i64>,
    /// NodeClaims a disruption command launched for its candidates' pods, while the candidates
    /// are still to be deleted.
    reserved: DashSet<String>,
    /// The pods bound to each node, as the watch last delivered them: a pass over a node's pods
    /// (the disruption planner reads every node's) looks none of them up in the store.
    pods_by_node: DashMap<String, BTreeMap<PodKey, Arc<CachedPod>>>,
    /// VolumeAttachment names by the node they attach to.
    attachments_by_node: DashMap<String, BTreeSet<String>>,
    /// Provisionable pods, in order: the first is found without a scan, and a pass takes them
    /// all without a lookup in the store.
    pending: Pending,
    /// Pods seen before they ran, whose start is still to be timed.
    unstarted: DashSet<PodKey>,
    /// When a pod last arrived on or left each node, in epoch seconds.
    last_pod_event: DashMap<String, i64>,
    /// When a pod last left each Node, in epoch seconds.
    last_pod_departure: DashMap<String, i64>,
    /// Pod events not yet written to their claims, by claim name
    /// ([`crate::pod_events`]).
    unrecorded_pod_events: DashMap<String, i64>,
    /// Watch events seen so far: unchanged means nothing in the cluster changed.
    changes: std::sync::atomic::AtomicU64,
    /// Claims created but not yet seen by the watch.
    created: Created,
    /// Each pod's scheduling view, with the version of the pod it was made from and the selector
    /// of its default spread: passes over the nodes' pods reuse it until either changes (the
    /// watch's event drops it when the pod does). A pending pod's is kept in `pending` instead,
    /// made when the watch shows it starting to wait.
    pod_infos: DashMap<PodKey, CachedInfo>,
    /// What each NodeClaim counts against its NodePool, by claim name: the pool, and the claim's
    /// capacity (its requests until it launched).
    claim_usage: DashMap<String, (String, Resources)>,
    /// Each NodePool's usage: the sum of its claims' entries in `claim_usage`, and their number
    /// as `nodes`, kept as claims change rather than summed when asked.
    pool_usage: DashMap<String, Resources>,
}

/// The NodeClaims being deleted and their nodes' pods that must find another place
/// ([`ReadModel::leaving_pods`]).
#[derive(Debug, Default)]
pub struct Leaving {
    /// The NodeClaims, by name.
    pub claims: Vec<String>,
    /// Their nodes' pods, by namespace and name.
    pub pods: Vec<Arc<CachedPod>>,
}

/// How often [`ReadModel::synced`] looks whether the stores have their initial lists.
pub const SYNC_LOOK: Duration = Duration::from_millis(20);

/// A pod's scheduling view, as [`ReadModel::pod_info`] made it.
#[derive(Clone)]
struct CachedInfo {
    /// The `resourceVersion` of the pod it was made from (the watch's copy of a pod is not the
    /// store's, so the version tells them apart, and neither is held here).
    version: String,
    /// The selector its default spread constraints carried, if it had them.
    default_selector: Option<Box<LabelSelector>>,
    /// Whether the pod has volume claims, whose volumes (not the pod) say where it can run.
    uses_claims: bool,
    /// The default spread's generation when the view was made or last found to hold; none when no
    /// default spread is configured.
    spread_generation: Option<u64>,
    info: Arc<PodInfo>,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct ReadModel {
    pods: Store<CachedPod>,
    nodes: Store<Node>,
    node_claims: Store<NodeClaim>,
    node_pools: Store<NodePool>,
    node_classes: Store<EC2NodeClass>,
    overlays: Store<NodeOverlay>,
    daemon_sets: Store<DaemonSet>,
    budgets: Store<PodDisruptionBudget>,
    namespaces: Store<Namespace>,
    volume_claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    storage_classes: Store<StorageClass>,
    csi_nodes: Store<CSINode>,
    volume_attachments: Store<VolumeAttachment>,
    /// kube-scheduler's default topology spread, when `SCHEDULER_CONFIG` configures it.
    default_spread: Option<DefaultSpread>,
    index: Arc<Index>,
}

/// What a pod event changed, for the actors that care.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodChange {
    /// The pod became provisionable.
    pub newly_pending: bool,
    /// The node it is bound to.
    pub node: Option<String>,
    /// The pod, seen before it ran, is now Running: its start can be timed.
    pub started: bool,
}

impl ReadModel {
    /// Empty stores and the writers that fill them.
    pub fn new() -> (Self, Writers) {
        Self::mirroring(None)
    }

    /// Empty stores and the writers that fill them, pods simulated with the default topology
    /// spread `scheduler` configures (none: pods are spread only as they ask).
    pub fn mirroring(scheduler: Option<Arc<SchedulerConfig>>) -> (Self, Writers) {
        let (default_spread, default_spread_w) = scheduler
            .filter(|config| !config.default_constraints().is_empty())
            .map(DefaultSpread::new)
            .unzip();
        let (pods, pods_w) = reflector::store();
        let (nodes, nodes_w) = reflector::store();
        let (node_claims, node_claims_w) = reflector::store();
        let (node_pools, node_pools_w) = reflector::store();
        let (node_classes, node_classes_w) = reflector::store();
        let (overlays, overlays_w) = reflector::store();
        let (daemon_sets, daemon_sets_w) = reflector::store();
        let (budgets, budgets_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        let (volume_claims, volume_claims_w) = reflector::store();
        let (volumes, volumes_w) = reflector::store();
        let (storage_classes, storage_classes_w) = reflector::store();
        let (csi_nodes, csi_nodes_w) = reflector::store();
        let (volume_attachments, volume_attachments_w) = reflector::store();
        let model = Self {
            pods,
            nodes,
            node_claims,
            node_pools,
            node_classes,
            overlays,
            daemon_sets,
            budgets,
            namespaces,
            volume_claims,
            volumes,
            storage_classes,
            csi_nodes,
            volume_attachments,
            default_spread,
            index: Arc::default(),
        };
        let writers = Writers {
            pods: pods_w,
            nodes: nodes_w,
            node_claims: node_claims_w,
            node_pools: node_pools_w,
            node_classes: node_classes_w,
            overlays: overlays_w,
            daemon_sets: daemon_sets_w,
            budgets: budgets_w,
            namespaces: namespaces_w,
            volume_claims: volume_claims_w,
            volumes: volumes_w,
            storage_classes: storage_classes_w,
            csi_nodes: csi_nodes_w,
            volume_attachments: volume_attachments_w,
            default_spread: default_spread_w,
        };
        (model, writers)
    }

    /// Waits until every store has its initial list (Karpenter's cluster-state sync gate), looking
    /// every [`SYNC_LOOK`]: a store's own readiness future keeps one waker, so of the tasks
    /// waiting on it side by side (and the probes that ask it without waiting) only the last to
    /// ask would be woken, and an actor that waited on it could wait for ever.
    pub async fn synced(&self) {
        while !self.is_synced() {
            tokio::time::sleep(SYNC_LOOK).await;
        }
    }

    /// Whether every store has its initial list, without waiting.
    pub fn is_synced(&self) -> bool {
        listed(&self.pods)
            && listed(&self.nodes)
            && listed(&self.node_claims)
            && listed(&self.node_pools)
            && listed(&self.node_classes)
            && listed(&self.overlays)
            && listed(&self.daemon_sets)
            && listed(&self.budgets)
            && listed(&self.namespaces)
            && listed(&self.volume_claims)
            && listed(&self.volumes)
            && listed(&self.storage_classes)
            && listed(&self.csi_nodes)
            && listed(&self.volume_attachments)
            && self.default_spread.as_ref().is_none_or(DefaultSpread::is_synced)
    }

    /// kube-scheduler's default topology spread, when configured.
    pub fn default_spread(&self) -> Option<&DefaultSpread> {
        self.default_spread.as_ref()
    }

    /// Whether the NodePools have been listed (the NodeClaims a replica whose NodePools are split
    /// between replicas reflects depend on them).
    pub fn node_pools_listed(&self) -> bool {
        listed(&self.node_pools)
    }

    /// A NodeClaim by name (the watched store only: a claim's actor acts on what the API shows).
    pub fn node_claim(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.node_claims.get(&ObjectRef::new(name))
    }

    /// Records a NodeClaim Joist just created, so that it counts before its watch event arrives,
    /// trimmed as the watched claims are ([`cached::trim_claim`]).
    pub fn record_created(&self, mut claim: NodeClaim) {
        cached::trim_claim(&mut claim);
        let name = claim.name_any();
        if self.node_claim(&name).is_some() {
            return;
        }
        if let Some(pool) = claim.labels().get(NODEPOOL) {
            file(&self.index.claims_by_pool, pool, name.clone(), true);
        }
        self.account(&name, counted(&claim));
        self.index.created.insert(name, Arc::new(claim));
    }

    /// Replaces what the claim `name` counts against its NodePool's usage with `counted` (nothing
    /// when `None`).
    fn account(&self, name: &str, counted: Option<(String, Resources)>) {
        let index = &self.index;
        if let Some((_, (pool, before))) = index.claim_usage.remove(name)
            && let Some(mut usage) = index.pool_usage.get_mut(&pool)
        {
            usage.sub(&before);
            let nodes = usage.get(names::NODES).saturating_sub(Quantity::from_units(1));
            usage.set(names::NODES, nodes);
        }
        if let Some((pool, amounts)) = counted {
            let mut usage = index.pool_usage.entry(pool.clone()).or_default();
            usage.add(&amounts);
            let nodes = usage.get(names::NODES).saturating_add(Quantity::from_units(1));
            usage.set(names::NODES, nodes);
            drop(usage);
            index.claim_usage.insert(name.to_owned(), (pool, amounts));
        }
    }

    /// What a NodePool's claims hold (their capacity, or their requests until launched) and how
    /// many they are (`nodes`), those just created included. Kept as claims change: reading it
    /// costs nothing per claim.
    pub fn pool_usage(&self, pool: &str) -> Resources {
        self.expire_created();
        self.index
            .pool_usage
            .get(pool)
            .map(|usage| usage.clone())
            .unwrap_or_default()
    }

    /// Drops the created claims the watch never showed within
    /// [`READ_MODEL_LAG`](crate::decide::lifecycle::READ_MODEL_LAG).
    fn expire_created(&self) {
        for (name, claim) in self.index.created.take_expired() {
            if let Some(pool) = claim.labels().get(NODEPOOL) {
                file(&self.index.claims_by_pool, pool, name.clone(), false);
            }
            if self.node_claim(&name).is_none() {
                self.account(&name, None);
            }
        }
    }

    /// The created claims the watch has not shown yet, dropping those waited for too long.
    fn unseen_claims(&self) -> Vec<Arc<NodeClaim>> {
        self.expire_created();
        self.index.created.claims()
    }

    /// A claim by name from the watch, or from the claims Joist just created.
    fn any_claim(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.node_claim(name).or_else(|| self.index.created.get(name))
    }

    /// A NodePool by name.
    pub fn node_pool(&self, name: &str) -> Option<Arc<NodePool>> {
        self.node_pools.get(&ObjectRef::new(name))
    }

    /// An EC2NodeClass by name.
    pub fn node_class(&self, name: &str) -> Option<Arc<EC2NodeClass>> {
        self.node_classes.get(&ObjectRef::new(name))
    }

    /// A Node by name.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// A pod by namespace and name.
    pub fn pod(&self, (namespace, name): &PodKey) -> Option<Arc<CachedPod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Node that registered with `provider_id`.
    pub fn node_for_provider(&self, provider_id: &str) -> Option<Arc<Node>> {
        let name = self.index.node_by_provider.get(provider_id)?.clone();
        self.node(&name)
    }

    /// The NodeClaim whose instance is `provider_id`.
    pub fn claim_for_provider(&self, provider_id: &str) -> Option<String> {
        self.index.claim_by_provider.get(provider_id).map(|n| n.clone())
    }

    /// The NodeClaim of the Node named `node`, through the Node's provider ID.
    pub fn claim_for_node(&self, node: &str) -> Option<String> {
        let provider_id = self.node(node)?.spec.as_ref()?.provider_id.clone()?;
        self.claim_for_provider(&provider_id)
    }

    /// What the claim `name` counts against its NodePool: the pool and its capacity (its requests
    /// until launched); `None` for a claim of no pool or one being deleted.
    pub fn claim_usage(&self, name: &str) -> Option<(String, Resources)> {
        self.index.claim_usage.get(name).map(|usage| usage.clone())
    }

    /// The NodeClaim whose instance has the cloud's `instance_id` (the provider ID's last part).
    pub fn claim_for_instance(&self, instance_id: &str) -> Option<String> {
        self.index.claim_by_instance.get(instance_id).map(|n| n.clone())
    }

    /// The pods bound to a node, by namespace and name.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<CachedPod>> {
        (self.index.pods_by_node.get(node))
            .map(|pods| pods.values().cloned().collect())
            .unwrap_or_default()
    }

    /// `pod` as the scheduling simulation sees it, made once per version of the pod (and of its
    /// default spread and where its volumes can be used); a pod without a `resourceVersion` is
    /// made each time.
    pub fn pod_info(&self, pod: &CachedPod) -> Result<Arc<PodInfo>, PodError> {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let known = self.index.pod_infos.get(&key);
        // The disruption planner asks for every node's pods: a view that holds without a look at
        // the pod's claims or controller is taken as it is while the pod's version holds.
        if let Some(known) = known.as_deref()
            && self.holds_unlooked(known)
            && pod.metadata.resource_version.as_deref() == Some(known.version.as_str())
        {
            return Ok(known.info.clone());
        }
        let (info, made) = self.view(known.as_deref(), pod)?;
        drop(known);
        if let Some(made) = made {
            self.index.pod_infos.insert(key, made);
        }
        Ok(info)
    }

    /// A pending pod's view ([`ReadModel::pod_info`]), the one kept with it while it holds.
    fn waiting_view(&self, waiting: &mut Waiting) -> Result<Arc<PodInfo>, PodError> {
        // Kept views are of the pod's version (a new one drops it).
        if let Some(view) = &waiting.view
            && self.holds_unlooked(view)
        {
            return Ok(view.info.clone());
        }
        let (info, made) = self.view(waiting.view.as_ref(), &waiting.pod)?;
        if made.is_some() {
            waiting.view = made;
        }
        Ok(info)
    }

    /// Whether `view` holds with no look at the pod's claims, controller or Services: it was made
    /// without claims, and the default spread (if configured) is as it was then.
    fn holds_unlooked(&self, view: &CachedInfo) -> bool {
        !view.uses_claims && view.spread_generation == self.spread_generation()
    }

    /// The default spread's generation; none when no default spread is configured.
    fn spread_generation(&self) -> Option<u64> {
        self.default_spread.as_ref().map(DefaultSpread::generation)
    }

    /// `pod`'s view: `known`'s while it was made from this version of the pod with the same
    /// default spread and volumes (kept again with the generation it was found to hold at), else
    /// a new one with what to keep of it (nothing for a pod without a `resourceVersion`).
    fn view(
        &self,
        known: Option<&CachedInfo>,
        pod: &CachedPod,
    ) -> Result<(Arc<PodInfo>, Option<CachedInfo>), PodError> {
        // Read before the inputs: a change made meanwhile moves the generation past this one.
        let spread_generation = self.spread_generation();
        let default_selector = self.default_spread_selector(pod);
        let volumes = pod_volumes(pod, self)?;
        let version = pod.metadata.resource_version.as_deref();
        if let (Some(known), Some(version)) = (known, version)
            && known.version == version
            && known.default_selector.as_deref() == default_selector.as_ref()
            && known.info.constraints().volume_requirements == volumes.requirements
            && known.info.volumes == volumes.attached
        {
            let refreshed = (known.spread_generation != spread_generation).then(|| CachedInfo {
                spread_generation,
                ..known.clone()
            });
            return Ok((known.info.clone(), refreshed));
        }
        let info = Arc::new(self.simulated(pod, default_selector.as_ref(), volumes)?);
        let made = version.map(|version| CachedInfo {
            version: version.to_owned(),
            default_selector: default_selector.map(Box::new),
            uses_claims: uses_claims(pod),
            spread_generation,
            info: info.clone(),
        });
        Ok((info, made))
    }

    /// `pod` as the scheduling simulation sees it, made afresh (for pods seen once, as a
    /// CapacityBuffer's virtual pods are by a provisioning pass).
    pub fn fresh_pod_info(&self, pod: &CachedPod) -> Result<PodInfo, PodError> {
        let volumes = pod_volumes(pod, self)?;
        self.simulated(pod, self.default_spread_selector(pod).as_ref(), volumes)
    }

    fn default_spread_selector(&self, pod: &CachedPod) -> Option<LabelSelector> {
        self.default_spread.as_ref()?.selector_for(pod)
    }

    fn simulated(
        &self,
        pod: &CachedPod,
        default_selector: Option<&LabelSelector>,
        volumes: PodVolumes,
    ) -> Result<PodInfo, PodError> {
        let info = match (&self.default_spread, default_selector) {
            (Some(spread), Some(selector)) => {
                PodInfo::with_default_spread(pod, &spread.constraints(selector))
            }
            _ => PodInfo::from_pod(pod),
        }?;
        Ok(info.with_volumes(volumes))
    }

    /// The NodePools that have NodeClaims here, those just created included.
    pub fn pools_with_claims(&self) -> Vec<String> {
        self.index
            .claims_by_pool
            .iter()
            .filter(|entry| !entry.value().is_empty())
            .map(|entry| entry.key().clone())
            .collect()
    }

    /// The NodeClaims of one NodePool, by name, those just created included.
    pub fn node_claims_of(&self, pool: &str) -> Vec<Arc<NodeClaim>> {
        let names = members(&self.index.claims_by_pool, pool);
        names.iter().filter_map(|name| self.any_claim(name)).collect()
    }

    /// The Nodes of one NodePool's claims, by claim name.
    pub fn nodes_of_pool(&self, pool: &str) -> Vec<Arc<Node>> {
        self.node_claims_of(pool)
            .iter()
            .filter_map(|claim| self.node_for_provider(claim.status.as_ref()?.provider_id.as_deref()?))
            .collect()
    }

    /// The names of the VolumeAttachments on a node, by name, with the volume each attaches.
    pub fn volume_attachments_on(&self, node: &str) -> Vec<(String, String)> {
        members(&self.index.attachments_by_node, node)
            .into_iter()
            .filter_map(|name| {
                let attachment = self.volume_attachments.get(&ObjectRef::new(&name))?;
                let volume = attachment.spec.source.persistent_volume_name.clone();
                Some((name, volume.unwrap_or_default()))
            })
            .collect()
    }

    /// How many volumes each CSI driver can attach to a node (its CSINode's allocatable counts;
    /// drivers that state none are not limited).
    pub fn volume_limits(&self, node: &str) -> BTreeMap<String, u32> {
        let Some(csi_node) = self.csi_nodes.get(&ObjectRef::new(node)) else {
            return BTreeMap::new();
        };
        (csi_node.spec.drivers.iter())
            .filter_map(|driver| {
                let count = driver.allocatable.as_ref()?.count?;
                Some((driver.name.clone(), u32::try_from(count).unwrap_or(0)))
            })
            .collect()
    }

    /// The PersistentVolume a PersistentVolumeClaim is bound to.
    pub fn claimed_volume(&self, namespace: &str, claim: &str) -> Option<String> {
        self.volume_claims
            .get(&ObjectRef::new(claim).within(namespace))?
            .spec
            .as_ref()?
            .volume_name
            .clone()
    }

    /// The first provisionable pod by namespace and name, if any (without listing them all).
    pub fn first_pending_pod(&self) -> Option<PodKey> {
        self.index.pending.read().keys().next().cloned()
    }

    /// Pods the scheduler could not place and Joist should provision for, by namespace and name,
    /// each with its scheduling view or why it has none ([`ReadModel::pod_info`]).
    pub fn pending_pods(&self) -> Vec<Viewed> {
        self.with_pending_pods(|pods| pods.collect())
    }

    /// What `take` makes of [`ReadModel::pending_pods`] as they are read, with no list of them
    /// all in between (a pass over 100,000 pods sorts them straight into its own lists).
    pub fn with_pending_pods<R>(
        &self,
        take: impl FnOnce(&mut dyn ExactSizeIterator<Item = Viewed>) -> R,
    ) -> R {
        let mut pending = self.index.pending.write();
        let mut pods = pending.values_mut().map(|waiting| {
            let view = self.waiting_view(waiting);
            (waiting.pod.clone(), view)
        });
        take(&mut pods)
    }

    /// The pods that must find another place because their node's NodeClaim is being deleted
    /// (expiring, interrupted, disrupted, deleted by hand), as Karpenter's provisioner adds them
    /// to the pending ones: neither DaemonSet, mirror, finished nor already terminating pods. By
    /// namespace and name.
    pub fn leaving_pods(&self) -> Leaving {
        let mut claims: Vec<String> = self.index.leaving.iter().map(|c| c.key().clone()).collect();
        claims.sort();
        let mut pods: Vec<Arc<CachedPod>> = claims
            .iter()
            .filter_map(|claim| self.node_claim(claim)?.status.as_ref()?.node_name.clone())
            .flat_map(|node| self.pods_on(&node))
            .filter(|pod| drainable(pod) && pod.metadata.deletion_timestamp.is_none())
            .collect();
        pods.sort_by_key(|pod| (pod.namespace(), pod.name_any()));
        Leaving { claims, pods }
    }

    /// A provisioning pass counted on `nodes` (Node names, or NodeClaim names while in flight) for
    /// pods: they are nominated until `until` (epoch seconds, later than `now`), and no disruption
    /// candidates meanwhile, as Karpenter's nominated nodes. Nominations past are forgotten.
    pub fn nominate(&self, nodes: impl IntoIterator<Item = String>, now: i64, until: i64) {
        self.index.nominated.retain(|_, end| *end > now);
        for node in nodes {
            self.index.nominated.insert(node, until);
        }
    }

    /// Keeps the NodeClaim, launched by a disruption command for its candidates' pods, from the
    /// provisioner until [`ReadModel::release`]: no other pending pod fills it first.
    pub fn reserve(&self, claim: &str) {
        self.index.reserved.insert(claim.to_owned());
    }

    /// Gives the NodeClaim back to the provisioner (its candidates are deleted, so their pods are
    /// simulated with the pending ones, or the command rolled back).
    pub fn release(&self, claim: &str) {
        self.index.reserved.remove(claim);
    }

    /// Whether the NodeClaim is kept for a disruption command's pods.
    pub fn reserved(&self, claim: &str) -> bool {
        self.index.reserved.contains(claim)
    }

    /// Whether the node (by Node or NodeClaim name) is nominated for pods at `now`.
    pub fn nominated(&self, node: &str, now: i64) -> bool {
        self.index.nominated.get(node).is_some_and(|end| *end > now)
    }

    /// A provisioning pass placed the pods of `leaving`'s NodeClaims (or found they fit nowhere):
    /// their drains need not wait for it any longer.
    pub fn provisioned_for(&self, leaving: &[String]) {
        for claim in leaving {
            if let Some(mut counted) = self.index.leaving.get_mut(claim) {
                *counted = true;
            }
        }
    }

    /// Whether the claim is being deleted and no provisioning pass has counted its node's pods
    /// yet.
    pub fn awaiting_provisioning(&self, claim: &str) -> bool {
        self.index.leaving.get(claim).is_some_and(|counted| !*counted)
    }

    /// Every pod (unsorted: for metrics, which do not care about order).
    pub fn pods(&self) -> Vec<Arc<CachedPod>> {
        self.pods.state()
    }

    /// Every Node, by name.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        sorted(&self.nodes)
    }

    /// Every NodeClaim, by name, those just created included.
    pub fn node_claims(&self) -> Vec<Arc<NodeClaim>> {
        let mut claims = sorted(&self.node_claims);
        let unseen = self.unseen_claims();
        if !unseen.is_empty() {
            claims.extend(unseen);
            claims.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
        claims
    }

    /// Every NodePool, by name.
    pub fn node_pools(&self) -> Vec<Arc<NodePool>> {
        sorted(&self.node_pools)
    }

    /// Every NodeOverlay, by name (none unless the `NodeOverlay` gate is on).
    pub fn overlays(&self) -> Vec<Arc<NodeOverlay>> {
        sorted(&self.overlays)
    }

    /// Every EC2NodeClass, by name.
    pub fn node_classes(&self) -> Vec<Arc<EC2NodeClass>> {
        sorted(&self.node_classes)
    }

    /// Every DaemonSet, by namespace and name.
    pub fn daemon_sets(&self) -> Vec<Arc<DaemonSet>> {
        sorted(&self.daemon_sets)
    }

    /// Every PodDisruptionBudget, by namespace and name.
    pub fn disruption_budgets(&self) -> Vec<Arc<PodDisruptionBudget>> {
        sorted(&self.budgets)
    }

    /// How many watch events have changed the model: equal counts mean an unchanged cluster.
    pub fn changes(&self) -> u64 {
        self.index.changes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a watch event that changed the model.
    pub(crate) fn note_change(&self) {
        self.index
            .changes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// When a pod last arrived on or left `node`, in epoch seconds (Karpenter's `lastPodEventTime`).
    pub fn last_pod_event(&self, node: &str) -> Option<i64> {
        self.index.last_pod_event.get(node).map(|at| *at)
    }

    /// When a pod last left `node`, in epoch seconds: room is being made there.
    pub fn last_pod_departure(&self, node: &str) -> Option<i64> {
        self.index.last_pod_departure.get(node).map(|at| *at)
    }

    /// Notes a pod event of the claim `claim` at `at` (epoch seconds) for the recorder to write.
    pub fn note_pod_event(&self, claim: &str, at: i64) {
        keep_latest(&self.index.unrecorded_pod_events, claim, at);
    }

    /// Takes the pod events noted since the last call, one per claim (its latest).
    pub fn take_pod_events(&self) -> Vec<(String, i64)> {
        let claims: Vec<String> = self
            .index
            .unrecorded_pod_events
            .iter()
            .map(|e| e.key().clone())
            .collect();
        claims
            .into_iter()
            .filter_map(|claim| self.index.unrecorded_pod_events.remove(&claim))
            .collect()
    }

    /// Every Namespace, by name.
    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        sorted(&self.namespaces)
    }

    /// Drops from the indexes every object of `kind` a relist did not list (deleted while the
    /// watch was away); returns the NodeClaims that went, so their actors look again.
    pub(crate) fn relisted(&self, kind: Listed, listed: &HashSet<PodKey>) -> Vec<String> {
        let index = &self.index;
        let cluster_scoped = |name: &String| listed.contains(&(String::new(), name.clone()));
        match kind {
            Listed::Pods => {
                index.pod_infos.retain(|key, _| listed.contains(key));
                index.pending.write().retain(|key, _| listed.contains(key));
                index.unstarted.retain(|key| listed.contains(key));
                for mut pods in index.pods_by_node.iter_mut() {
                    pods.retain(|key, _| listed.contains(key));
                }
                Vec::new()
            }
            Listed::Nodes => {
                index.node_by_provider.retain(|_, node| cluster_scoped(node));
                index.pods_by_node.retain(|node, _| cluster_scoped(node));
                Vec::new()
            }
            Listed::Services => {
                if let Some(spread) = &self.default_spread {
                    spread.relisted_services(listed);
                }
                Vec::new()
            }
            Listed::VolumeAttachments => {
                for mut names in index.attachments_by_node.iter_mut() {
                    names.retain(cluster_scoped);
                }
                Vec::new()
            }
            Listed::NodeClaims => {
                let mut gone = BTreeSet::new();
                index.claim_by_instance.retain(|_, claim| cluster_scoped(claim));
                index.claim_by_provider.retain(|_, claim| {
                    let kept = cluster_scoped(claim);
                    if !kept {
                        gone.insert(claim.clone());
                    }
                    kept
                });
                for mut claims in index.claims_by_pool.iter_mut() {
                    claims.retain(|claim| {
                        let kept = cluster_scoped(claim) || index.created.contains(claim);
                        if !kept {
                            gone.insert(claim.clone());
                        }
                        kept
                    });
                }
                for claim in &gone {
                    self.account(claim, None);
                }
                gone.into_iter().collect()
            }
        }
    }

    /// Updates the pod indexes after a watch event.
    pub(crate) fn observe_pod(&self, pod: &Arc<CachedPod>, deleted: bool, now_seconds: i64) -> PodChange {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if let Some(node) = &node {
            let known = self
                .index
                .pods_by_node
                .get(node)
                .is_some_and(|pods| pods.contains_key(&key));
            if known == deleted {
                // A pod first seen bound arrived when it was scheduled: after a restart, the list
                // of every pod is not a burst of arrivals.
                let at = if deleted {
                    now_seconds
                } else {
                    scheduled_at(pod).map_or(now_seconds, |at| at.min(now_seconds))
                };
                keep_latest(&self.index.last_pod_event, node, at);
                if deleted {
                    keep_latest(&self.index.last_pod_departure, node, at);
                }
                if let Some(claim) = self.claim_for_node(node) {
                    self.note_pod_event(&claim, at);
                }
            }
            if deleted {
                if let Some(mut pods) = self.index.pods_by_node.get_mut(node) {
                    pods.remove(&key);
                }
            } else {
                (self.index.pods_by_node.entry(node.clone()).or_default()).insert(key.clone(), pod.clone());
            }
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let started = if !deleted && phase == Some("Running") {
            self.index.unstarted.remove(&key).is_some()
        } else {
            if !deleted && matches!(phase, None | Some("Pending")) {
                self.index.unstarted.insert(key.clone());
            } else {
                self.index.unstarted.remove(&key);
            }
            false
        };
        // The view of the version before goes with it: a pass that needs one makes it of this
        // version.
        self.index.pod_infos.remove(&key);
        let newly_pending = if !deleted && is_provisionable(pod) {
            match self.index.pending.write().entry(key) {
                // The view is made when the pod starts waiting, for the pass to find. Not on
                // its later changes (a scheduler rewriting its condition as nodes come): the
                // pass makes those again only if it runs before the pod binds. One that cannot
                // be made yet (its volume claim not seen yet) is made, or refused with why, by
                // the pass.
                Entry::Vacant(entry) => {
                    let mut waiting = Waiting {
                        pod: pod.clone(),
                        view: None,
                    };
                    let _ = self.waiting_view(&mut waiting);
                    entry.insert(waiting);
                    true
                }
                Entry::Occupied(mut entry) => {
                    let waiting = entry.get_mut();
                    waiting.pod = pod.clone();
                    let version = pod.metadata.resource_version.as_deref();
                    if (waiting.view.as_ref()).is_some_and(|view| Some(view.version.as_str()) != version) {
                        waiting.view = None;
                    }
                    false
                }
            }
        } else {
            self.index.pending.write().remove(&key);
            false
        };
        PodChange {
            newly_pending,
            node,
            started,
        }
    }

    /// Updates the node index after a watch event; returns the NodeClaim that owns the node.
    pub(crate) fn observe_node(&self, node: &Node, deleted: bool) -> Option<String> {
        let provider_id = node.spec.as_ref()?.provider_id.clone()?;
        if deleted {
            self.index.node_by_provider.remove(&provider_id);
            self.index.pods_by_node.remove(&node.name_any());
            self.index.last_pod_event.remove(&node.name_any());
            self.index.last_pod_departure.remove(&node.name_any());
        } else {
            self.index
                .node_by_provider
                .insert(provider_id.clone(), node.name_any());
        }
        self.claim_for_provider(&provider_id)
    }

    /// Updates the attachment index after a watch event.
    pub(crate) fn observe_attachment(&self, attachment: &VolumeAttachment, deleted: bool) {
        let node = &attachment.spec.node_name;
        file(
            &self.index.attachments_by_node,
            node,
            attachment.name_any(),
            !deleted,
        );
    }

    /// Updates the NodeClaim indexes after a watch event.
    /// Files a NodeClaim's change; whether it just began being deleted.
    pub(crate) fn observe_claim(&self, claim: &NodeClaim, deleted: bool) -> bool {
        let name = claim.name_any();
        self.index.created.seen(&name);
        let began_leaving = if deleted || claim.metadata.deletion_timestamp.is_none() {
            self.index.leaving.remove(&name);
            false
        } else {
            let mut began = false;
            self.index.leaving.entry(name.clone()).or_insert_with(|| {
                began = true;
                false
            });
            began
        };
        if let Some(pool) = claim.labels().get(NODEPOOL) {
            file(&self.index.claims_by_pool, pool, name.clone(), !deleted);
        }
        self.account(&name, if deleted { None } else { counted(claim) });
        let Some(provider_id) = claim.status.as_ref().and_then(|s| s.provider_id.clone()) else {
            return began_leaving;
        };
        let instance = instance_id(&provider_id).to_owned();
        if deleted {
            self.index.claim_by_provider.remove(&provider_id);
            self.index.claim_by_instance.remove(&instance);
        } else {
            self.index.claim_by_provider.insert(provider_id, name.clone());
            self.index.claim_by_instance.insert(instance, name);
        }
        began_leaving
    }
}

/// Files `at` under `key`, unless a later time is filed there already.
fn keep_latest(times: &DashMap<String, i64>, key: &str, at: i64) {
    times
        .entry(key.to_owned())
        .and_modify(|last| *last = (*last).max(at))
        .or_insert(at);
}

/// When the pod was bound to its node (its `PodScheduled` condition turned True), in epoch seconds.
fn scheduled_at(pod: &CachedPod) -> Option<i64> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
}

/// What `claim` counts against its NodePool: its capacity once launched, its requests until then;
/// nothing without a NodePool label, and nothing once it is being deleted (as Karpenter counts
/// only nodes not marked for deletion, so a pool at its limits can replace what is leaving).
fn counted(claim: &NodeClaim) -> Option<(String, Resources)> {
    if claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let pool = claim.labels().get(NODEPOOL)?.clone();
    let capacity = claim
        .status
        .as_ref()
        .map(|s| Resources::from(&s.capacity))
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| Resources::from(&claim.spec.resources.requests));
    Some((pool, capacity))
}

/// The members of `group` in an index, in order (copied out, so no shard lock is held).
fn members<M: Clone>(index: &DashMap<String, BTreeSet<M>>, group: &str) -> Vec<M> {
    index
        .get(group)
        .map(|members| members.iter().cloned().collect())
        .unwrap_or_default()
}

/// Adds `member` to (or, when not `present`, removes it from) the set filed under `group`.
fn file<M: Ord>(index: &DashMap<String, BTreeSet<M>>, group: &str, member: M, present: bool) {
    if present {
        index.entry(group.to_owned()).or_default().insert(member);
    } else if let Some(mut members) = index.get_mut(group) {
        members.remove(&member);
    }
}

fn sorted<K>(store: &Store<K>) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut all = store.state();
    all.sort_by(|a, b| {
        (a.meta().namespace.as_deref(), a.meta().name.as_deref())
            .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
    });
    all
}

/// Karpenter's `IsProvisionable`: not bound, not finished, not being deleted, marked
/// `PodScheduled=False/Unschedulable` by the scheduler, not nominated to a node by a preemption
/// (the scheduler has a place for it), not a DaemonSet's and not a static pod's mirror.
pub fn is_provisionable(pod: &CachedPod) -> bool {
    unprovisionable(pod).is_none()
}

/// Why `pod` is not provisionable ([`is_provisionable`]), if it is not.
pub fn unprovisionable(pod: &CachedPod) -> Option<&'static str> {
    let status = pod.status.as_ref();
    let unschedulable = || {
        status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
    };
    let nominated = || {
        status
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
        Some("it is bound to a node")
    } else if finished(pod) {
        Some("it has finished")
    } else if pod.metadata.deletion_timestamp.is_some() {
        Some("it is being deleted")
    } else if owned_by_daemon_set(pod) {
        Some("it is a DaemonSet's pod (the DaemonSet places it on every node)")
    } else if is_mirror(pod) {
        Some("it is a static pod's mirror")
    } else if nominated() {
        Some("the kube-scheduler nominated a node for it (preemption): it has a place")
    } else if !unschedulable() {
        Some("the kube-scheduler has not marked it unschedulable (PodScheduled=False, Unschedulable)")
    } else {
        None
    }
}

impl StorageObjects for ReadModel {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.volume_claims.get(&ObjectRef::new(name).within(namespace))
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(&ObjectRef::new(name))
    }

    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.storage_classes.get(&ObjectRef::new(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::lifecycle::READ_MODEL_LAG;
    use kube::runtime::watcher::Event;

    fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn claim(name: &str) -> NodeClaim {
        object(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "pool"}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                     "resources": {"requests": {"cpu": "3"}}},
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_waiting_side_by_side_for_the_initial_lists_are_all_let_through() {
        use kube::runtime::watcher::Event;
        let (read, mut writers) = ReadModel::new();
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let read = read.clone();
                tokio::spawn(async move { read.synced().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A readiness probe asks meanwhile, without waiting.
        assert!(!read.is_synced());
        macro_rules! list_nothing {
            ($($store:ident),*) => {$(
                writers.$store.apply_watcher_event(&Event::Init);
                writers.$store.apply_watcher_event(&Event::InitDone);
            )*};
        }
        list_nothing!(
            pods,
            nodes,
            node_claims,
            node_pools,
            node_classes,
            overlays,
            daemon_sets,
            budgets,
            namespaces,
            volume_claims,
            volumes,
            storage_classes,
            csi_nodes,
            volume_attachments
        );
        for task in waiting {
            tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .unwrap_or_else(|_| panic!("a task waiting for the sync was never let through"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(read.is_synced() && read.node_pools_listed());
    }

    #[test]
    fn noted_pod_events_are_taken_once_each_claim_with_its_latest() {
        let (read, _writers) = ReadModel::new();
        read.note_pod_event("a", 200);
        read.note_pod_event("a", 100);
        read.note_pod_event("b", 50);
        let mut taken = read.take_pod_events();
        taken.sort();
        assert_eq!(taken, [("a".to_owned(), 200), ("b".to_owned(), 50)]);
        assert!(read.take_pod_events().is_empty());
    }

    #[test]
    fn a_pod_first_seen_bound_arrived_when_it_was_scheduled_and_one_leaving_leaves_now() {
        let (read, _writers) = ReadModel::new();
        let bound = |name: &str, scheduled: i64| -> CachedPod {
            object(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": "n", "containers": []},
                "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True",
                    "lastTransitionTime": joist_messages::time::rfc3339(scheduled)}]},
            }))
        };
        // Listed after a restart: the pods came long ago, not at the list.
        read.observe_pod(&Arc::new(bound("a", 1_000)), false, 5_000);
        read.observe_pod(&Arc::new(bound("b", 2_000)), false, 5_000);
        assert_eq!(read.last_pod_event("n"), Some(2_000));
        // Seen again: not an event.
        read.observe_pod(&Arc::new(bound("b", 2_000)), false, 5_100);
        assert_eq!(read.last_pod_event("n"), Some(2_000));
        assert_eq!(read.last_pod_departure("n"), None, "arrivals are no departure");
        // A pod leaving leaves now.
        read.observe_pod(&Arc::new(bound("a", 1_000)), true, 6_000);
        assert_eq!(read.last_pod_event("n"), Some(6_000));
        assert_eq!(read.last_pod_departure("n"), Some(6_000));
    }

    #[test]
    fn a_nodes_pods_are_the_versions_the_watch_last_delivered() {
        let (read, _writers) = ReadModel::new();
        let version = |name: &str, version: &str| -> Arc<CachedPod> {
            Arc::new(object(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "resourceVersion": version},
                "spec": {"nodeName": "n", "containers": []},
                "status": {"phase": "Running"},
            })))
        };
        let versions = |read: &ReadModel| -> Vec<(String, String)> {
            let pods = read.pods_on("n");
            let version = |p: &CachedPod| p.metadata.resource_version.clone().unwrap_or_default();
            pods.iter().map(|p| (p.name_any(), version(p))).collect()
        };
        read.observe_pod(&version("a", "1"), false, 0);
        read.observe_pod(&version("b", "2"), false, 0);
        read.observe_pod(&version("a", "3"), false, 0);
        assert_eq!(
            versions(&read),
            [("a".into(), "3".into()), ("b".into(), "2".into())]
        );
        read.observe_pod(&version("a", "4"), true, 0);
        assert_eq!(versions(&read), [("b".to_owned(), "2".to_owned())]);
        assert!(read.pods_on("elsewhere").is_empty());
    }

    #[test]
    fn a_claim_just_created_is_kept_without_its_instance_types_and_keeps_its_zone() {
        let (read, _writers) = ReadModel::new();
        let mut created = claim("pool-a");
        created.spec.requirements = object(serde_json::json!([
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "c5.large"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]},
        ]));
        read.record_created(created);
        let kept = read.node_claims();
        let keys: Vec<&str> = kept[0].spec.requirements.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["topology.kubernetes.io/zone"]);
        let in_flight = crate::state::snapshot::existing_nodes(&read);
        assert_eq!(
            in_flight[0]
                .labels
                .get("topology.kubernetes.io/zone")
                .map(String::as_str),
            Some("us-west-2a"),
            "the scheduling view still places zonal pods on it"
        );
    }

    #[test]
    fn a_disruptions_replacement_takes_no_pending_pod_until_its_candidates_are_deleted() {
        let (read, _writers) = ReadModel::new();
        read.record_created(claim("replacement"));
        read.reserve("replacement");
        assert!(
            crate::state::snapshot::existing_nodes(&read).is_empty(),
            "kept for the candidates' pods"
        );
        read.release("replacement");
        assert_eq!(crate::state::snapshot::existing_nodes(&read).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_just_created_counts_before_its_watch_event() {
        let (read, _writers) = ReadModel::new();
        read.record_created(claim("pool-a"));
        let names =
            |claims: Vec<Arc<NodeClaim>>| -> Vec<String> { claims.iter().map(|c| c.name_any()).collect() };
        assert_eq!(
            names(read.node_claims()),
            ["pool-a"],
            "the next pass sees it as in flight"
        );
        assert_eq!(
            names(read.node_claims_of("pool")),
            ["pool-a"],
            "and counts it against the pool's limits"
        );
        assert_eq!(crate::state::snapshot::existing_nodes(&read).len(), 1);
        assert!(
            read.node_claim("pool-a").is_none(),
            "its actor still waits for the API's view"
        );

        // The watch shows it: it leaves the overlay (the store holds it from then on).
        read.observe_claim(&claim("pool-a"), false);
        assert!(read.index.created.is_empty());

        // A claim the watch never shows (deleted before it was seen) is forgotten after the lag.
        read.record_created(claim("pool-b"));
        tokio::time::sleep(READ_MODEL_LAG).await;
        assert!(read.node_claims().is_empty());
        assert!(read.node_claims_of("pool").is_empty());
        assert!(
            read.index
                .claims_by_pool
                .get("pool")
                .is_none_or(|c| !c.contains("pool-b"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pools_usage_follows_its_claims_and_leaves_out_those_being_deleted() {
        let (read, _writers) = ReadModel::new();
        let amounts = |usage: Resources| -> Vec<(String, String)> {
            usage
                .iter()
                .map(|(name, q)| (name.to_owned(), q.to_string()))
                .collect()
        };
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(n, q)| ((*n).to_owned(), (*q).to_owned()))
                .collect()
        };
        assert!(read.pool_usage("pool").is_empty());
        read.record_created(claim("pool-a"));
        read.record_created(claim("pool-b"));
        assert_eq!(
            amounts(read.pool_usage("pool")),
            pairs(&[("cpu", "6"), ("nodes", "2")])
        );
        // Launched: its capacity counts instead of its requests.
        let mut launched = claim("pool-a");
        launched.status = Some(object(
            serde_json::json!({"capacity": {"cpu": "4", "memory": "8Gi"}}),
        ));
        read.observe_claim(&launched, false);
        assert_eq!(
            amounts(read.pool_usage("pool")),
            pairs(&[("cpu", "7"), ("memory", "8589934592"), ("nodes", "2")])
        );
        // Being deleted: it no longer counts, though the watch still shows it.
        let mut leaving = launched.clone();
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        read.observe_claim(&leaving, false);
        assert_eq!(
            amounts(read.pool_usage("pool")),
            pairs(&[("cpu", "3"), ("nodes", "1")])
        );
        read.observe_claim(&launched, true);
        assert_eq!(
            amounts(read.pool_usage("pool")),
            pairs(&[("cpu", "3"), ("nodes", "1")])
        );
        // A claim the watch never shows stops counting after the lag.
        tokio::time::sleep(READ_MODEL_LAG).await;
        assert!(read.pool_usage("pool").is_empty());
    }

    #[test]
    fn a_pods_scheduling_view_is_made_once_per_version_and_forgotten_when_the_pod_changes() {
        let (read, _writers) = ReadModel::new();
        let pod = |cpu: &str, version: &str| -> Arc<CachedPod> {
            Arc::new(object(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default", "resourceVersion": version},
                "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu}}}]},
            })))
        };
        let view = |pod: &Arc<CachedPod>| read.pod_info(pod).unwrap_or_else(|e| panic!("{e}"));
        let first = pod("1", "1");
        let made = view(&first);
        assert!(
            Arc::ptr_eq(&made, &view(&pod("1", "1"))),
            "the same version is not made again, whichever copy of it is asked about"
        );
        let resized = pod("2", "2");
        let remade = view(&resized);
        assert!(!Arc::ptr_eq(&made, &remade), "a new version gets a new view");
        assert_eq!(remade.requests.get("cpu").millis(), 2000);
        let running = pod("2", "3");
        read.observe_pod(&running, false, 0);
        assert!(
            read.index.pod_infos.is_empty(),
            "a changed pod's view goes, and with it the version it was made from"
        );
        view(&running);
        read.observe_pod(&running, true, 0);
        assert!(
            read.index.pod_infos.is_empty(),
            "a deleted pod's view goes with it"
        );
    }

    #[test]
    fn with_a_default_spread_a_pods_view_holds_until_a_service_or_controller_changes() {
        let config = joist_messages::scheduler_config::SchedulerConfig::parse(
            "podTopologySpread: {defaultConstraints: [{maxSkew: 1, \
             topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}]}",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (read, mut writers) = ReadModel::mirroring(Some(Arc::new(config)));
        let spread = read
            .default_spread()
            .cloned()
            .unwrap_or_else(|| panic!("configured"));
        let pod: Arc<CachedPod> = Arc::new(object(serde_json::json!({
            "metadata": {"name": "web-abc-1", "namespace": "shop", "resourceVersion": "1",
                "labels": {"app": "web", "pod-template-hash": "abc"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                    "uid": "rs-1", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        })));
        let view = || read.pod_info(&pod).unwrap_or_else(|e| panic!("{e}"));
        // Whether the view's default spread counts pods labelled `labels`.
        let counts = |info: &PodInfo, labels: &[(&str, &str)]| -> bool {
            let labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let spread = &info.constraints().spread;
            !spread.is_empty()
                && spread
                    .iter()
                    .all(|c| joist_scheduling::terms::selects(c.selector.as_ref(), &labels))
        };
        let web = [("app", "web")];
        let this_set = [("app", "web"), ("pod-template-hash", "abc")];
        let alone = view();
        assert!(!counts(&alone, &web), "nothing selects the pod yet");
        assert!(Arc::ptr_eq(&alone, &view()), "nothing changed: the view holds");

        let service: k8s_openapi::api::core::v1::Service = object(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"}, "spec": {"selector": {"app": "web"}},
        }));
        spread.observe_service(&service, false);
        let by_service = view();
        assert!(
            counts(&by_service, &web),
            "a Service selecting the pod spreads it among the Service's pods"
        );

        // The pod's controller comes into the store after the pod (the watches are apart).
        let set: k8s_openapi::api::apps::v1::ReplicaSet = object(serde_json::json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "uid": "rs-1"},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}},
        }));
        let writers = writers
            .default_spread
            .as_mut()
            .unwrap_or_else(|| panic!("configured"));
        writers
            .replica_sets
            .apply_watcher_event(&Event::Apply(set.clone()));
        spread.observe_controller(crate::state::default_spread::ControllerSeen::replica_set(
            &set, false,
        ));
        let by_both = view();
        assert!(
            counts(&by_both, &this_set) && !counts(&by_both, &web),
            "the controller's selector joins the Service's"
        );
    }

    #[test]
    fn a_pods_view_follows_its_claim_to_its_volumes_zone_and_driver_and_a_node_has_its_csi_limit() {
        use kube::runtime::watcher::Event;
        use serde_json::json;
        let (read, mut writers) = ReadModel::new();
        let pod: Arc<CachedPod> = Arc::new(object(json!({
            "metadata": {"name": "db-0", "namespace": "default"},
            "spec": {"containers": [], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
        })));
        let claim = |bound: bool| -> PersistentVolumeClaim {
            let mut spec = json!({"storageClassName": "gp3"});
            if bound {
                spec["volumeName"] = json!("pv-1");
            }
            object(json!({"metadata": {"name": "data", "namespace": "default"}, "spec": spec}))
        };
        writers
            .storage_classes
            .apply_watcher_event(&Event::Apply(object(json!({
                "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com",
            }))));
        writers.volumes.apply_watcher_event(&Event::Apply(object(json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}, "nodeAffinity": {"required": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]}]}]}}},
        }))));
        let zones = |info: &PodInfo| -> Vec<String> {
            (info.constraints().volume_requirements.iter())
                .flat_map(|r| {
                    r.get("topology.kubernetes.io/zone")
                        .into_iter()
                        .flat_map(|z| z.values().map(str::to_owned))
                })
                .collect()
        };
        assert!(read.pod_info(&pod).is_err(), "no claim yet");
        writers
            .volume_claims
            .apply_watcher_event(&Event::Apply(claim(false)));
        let unbound = read.pod_info(&pod).unwrap_or_else(|e| panic!("{e}"));
        assert!(zones(&unbound).is_empty(), "its class allows any zone");
        assert_eq!(unbound.volumes.len(), 1, "attached by the class's provisioner");
        writers
            .volume_claims
            .apply_watcher_event(&Event::Apply(claim(true)));
        let bound = read.pod_info(&pod).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            zones(&bound),
            ["us-west-2b"],
            "the same pod, seen again once its claim is bound"
        );

        assert!(read.volume_limits("n1").is_empty());
        writers.csi_nodes.apply_watcher_event(&Event::Apply(object(json!({
            "metadata": {"name": "n1"},
            "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}},
                {"name": "efs.csi.aws.com", "nodeID": "i-1"}]},
        }))));
        assert_eq!(
            read.volume_limits("n1"),
            BTreeMap::from([("ebs.csi.aws.com".to_owned(), 25)])
        );
    }

    #[test]
    fn a_pods_start_is_reported_once_and_only_for_pods_seen_before_they_ran() {
        let (read, _writers) = ReadModel::new();
        let pod = |name: &str, phase: &str| -> CachedPod {
            object(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "status": {"phase": phase},
            }))
        };
        assert!(
            !read
                .observe_pod(&Arc::new(pod("web", "Pending")), false, 0)
                .started
        );
        assert!(
            read.observe_pod(&Arc::new(pod("web", "Running")), false, 0)
                .started,
            "Pending, then Running"
        );
        assert!(
            !read
                .observe_pod(&Arc::new(pod("web", "Running")), false, 0)
                .started,
            "once"
        );
        assert!(
            !read
                .observe_pod(&Arc::new(pod("old", "Running")), false, 0)
                .started,
            "running before it was seen: its start is unknown"
        );
        read.observe_pod(&Arc::new(pod("gone", "Pending")), false, 0);
        read.observe_pod(&Arc::new(pod("gone", "Pending")), true, 0);
        assert!(read.index.unstarted.is_empty(), "deleted pods are forgotten");
    }

    #[test]
    fn a_pending_pods_view_is_made_as_the_watch_brings_it_and_the_pass_finds_it_made() {
        let (read, _writers) = ReadModel::new();
        let pending: Arc<CachedPod> = Arc::new(object(serde_json::json!({
            "metadata": {"name": "waiting", "namespace": "default", "resourceVersion": "4"},
            "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "3"}}}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        })));
        assert!(read.observe_pod(&pending, false, 0).newly_pending);
        let key = ("default".to_owned(), "waiting".to_owned());
        let made = (read.index.pending.read().get(&key))
            .and_then(|waiting| Some(waiting.view.as_ref()?.info.clone()))
            .expect("made when the watch brought the pod");
        assert_eq!(made.requests.get("cpu").millis(), 3000);
        let [(pod, found)] = &read.pending_pods()[..] else {
            panic!("one pod is pending")
        };
        assert!(
            Arc::ptr_eq(pod, &pending),
            "the pass takes the watch's copy, no other"
        );
        let found = found.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert!(Arc::ptr_eq(&made, found), "the pass does not make it again");

        // Listed again at the same version (after a relist): the view stays.
        assert!(!read.observe_pod(&pending, false, 0).newly_pending);
        let [(_, again)] = &read.pending_pods()[..] else {
            panic!("one pod is pending")
        };
        assert!(Arc::ptr_eq(
            &made,
            again.as_ref().unwrap_or_else(|e| panic!("{e}"))
        ));
        // A new version while it waits: the pass sees that version.
        let resized: Arc<CachedPod> = Arc::new(object(serde_json::json!({
            "metadata": {"name": "waiting", "namespace": "default", "resourceVersion": "5"},
            "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "4"}}}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        })));
        read.observe_pod(&resized, false, 0);
        let [(pod, view)] = &read.pending_pods()[..] else {
            panic!("one pod is pending")
        };
        assert!(Arc::ptr_eq(pod, &resized));
        let view = view.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(view.requests.get("cpu").millis(), 4000, "{view:?}");
    }

    #[test]
    fn a_pending_pods_view_follows_its_volume_claim_as_the_claim_binds() {
        let (read, mut writers) = ReadModel::new();
        let zone = |zone: &str| serde_json::json!([{"key": "topology.kubernetes.io/zone", "values": [zone]}]);
        writers
            .storage_classes
            .apply_watcher_event(&Event::Apply(object(serde_json::json!({
                "metadata": {"name": "zonal"}, "provisioner": "ebs.csi.aws.com",
                "allowedTopologies": [{"matchLabelExpressions": zone("us-west-2a")}],
            }))));
        let claim = |volume: Option<&str>| -> PersistentVolumeClaim {
            object(serde_json::json!({
                "metadata": {"name": "data", "namespace": "default"},
                "spec": {"storageClassName": "zonal", "volumeName": volume},
            }))
        };
        writers
            .volume_claims
            .apply_watcher_event(&Event::Apply(claim(None)));
        read.observe_pod(
            &Arc::new(object(serde_json::json!({
                "metadata": {"name": "db", "namespace": "default", "resourceVersion": "1"},
                "spec": {"containers": [], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))),
            false,
            0,
        );
        let zones = || -> Vec<String> {
            let [(_, view)] = &read.pending_pods()[..] else {
                panic!("one pod is pending")
            };
            let view = view.as_ref().unwrap_or_else(|e| panic!("{e}"));
            (view.constraints().volume_requirements.iter())
                .filter_map(|alternative| alternative.get("topology.kubernetes.io/zone"))
                .flat_map(|zones| zones.values().map(str::to_owned).collect::<Vec<_>>())
                .collect()
        };
        assert_eq!(zones(), ["us-west-2a"], "unbound: where its class provisions");

        // Bound meanwhile to a volume in another zone: the pod has not changed, its view has.
        writers.volumes.apply_watcher_event(&Event::Apply(object(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]}]}]}}},
        }))));
        writers
            .volume_claims
            .apply_watcher_event(&Event::Apply(claim(Some("pv-1"))));
        assert_eq!(zones(), ["us-west-2b"], "bound: where its volume is");
    }

    #[test]
    fn a_relist_drops_what_was_deleted_while_the_watch_was_away() {
        let (read, _writers) = ReadModel::new();
        let pending: CachedPod = object(serde_json::json!({
            "metadata": {"name": "waiting", "namespace": "default"},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        }));
        let bound: CachedPod = object(serde_json::json!({
            "metadata": {"name": "bound", "namespace": "default"}, "spec": {"nodeName": "n", "containers": []},
        }));
        let node: Node =
            object(serde_json::json!({"metadata": {"name": "n"}, "spec": {"providerID": "p-1"}}));
        let claim: NodeClaim = object(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "labels": {"karpenter.sh/nodepool": "pool"}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}},
            "status": {"providerID": "p-1"},
        }));
        assert!(read.observe_pod(&Arc::new(pending), false, 0).newly_pending);
        read.observe_pod(&Arc::new(bound), false, 0);
        read.observe_node(&node, false);
        read.observe_claim(&claim, false);
        assert_eq!(read.claim_for_provider("p-1").as_deref(), Some("c"));

        // The relist after a 410 lists the bound pod only: the pending one was deleted meanwhile,
        // and so were the node and the claim.
        let listed = HashSet::from([("default".to_owned(), "bound".to_owned())]);
        read.relisted(Listed::Pods, &listed);
        assert_eq!(
            read.first_pending_pod(),
            None,
            "a deleted pod is no longer pending"
        );
        read.relisted(Listed::Nodes, &HashSet::new());
        assert!(!read.index.node_by_provider.contains_key("p-1"));
        assert!(!read.index.pods_by_node.contains_key("n"));
        assert_eq!(
            read.relisted(Listed::NodeClaims, &HashSet::new()),
            ["c"],
            "its actor is told"
        );
        assert_eq!(read.claim_for_provider("p-1"), None);
        assert!(read.index.claims_by_pool.get("pool").is_none_or(|c| c.is_empty()));
    }

    #[test]
    fn attachments_are_indexed_by_node_until_they_go() {
        let (read, _writers) = ReadModel::new();
        let attachment = |name: &str, node: &str| -> VolumeAttachment {
            object(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": {"persistentVolumeName": "pv"}},
            }))
        };
        read.observe_attachment(&attachment("a", "n"), false);
        read.observe_attachment(&attachment("b", "n"), false);
        read.observe_attachment(&attachment("c", "m"), false);
        let on = |node: &str| read.index.attachments_by_node.get(node).map(|n| n.clone());
        assert_eq!(on("n"), Some(BTreeSet::from(["a".to_owned(), "b".to_owned()])));
        read.observe_attachment(&attachment("a", "n"), true);
        assert_eq!(on("n"), Some(BTreeSet::from(["b".to_owned()])));
        // Detached while the watch was away.
        read.relisted(
            Listed::VolumeAttachments,
            &HashSet::from([(String::new(), "c".to_owned())]),
        );
        assert_eq!(on("n"), Some(BTreeSet::new()));
        assert_eq!(on("m"), Some(BTreeSet::from(["c".to_owned()])));
    }
}

//! kube-scheduler's default topology spread, mirrored: when `SCHEDULER_CONFIG` sets
//! `podTopologySpread.defaultConstraints`, a pod that declares no spread constraints of its own is
//! simulated with them, each carrying the selector kube-scheduler deduces for the pod
//! ([`joist_messages::scheduler_config`]). The deduction reads the Services of the pod's namespace
//! and its controller (a ReplicaSet, StatefulSet or ReplicationController), reflected only while
//! defaults are configured and trimmed to their selectors.
//!
//! A controller that is gone or of another kind contributes nothing, as in kube-scheduler: the
//! selector is then the Services' alone, and a pod with neither gets no defaults. Nothing here
//! fails.
//!
//! A generation moves on with every change to a Service, and to what the deduction reads of one of
//! those controllers (its uid and selector, not its status), after the change is in the store: a
//! pod's view made at one generation holds, unlooked at, until the next.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use dashmap::DashMap;
use joist_messages::{
    cached_pod::CachedPod,
    scheduler_config::{OwnerSelector, SchedulerConfig, deduces_from_owner, default_selector},
};
use k8s_openapi::{
    api::{
        apps::v1::{ReplicaSet, StatefulSet},
        core::v1::{ReplicationController, Service, ServiceSpec, TopologySpreadConstraint},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    ResourceExt,
    runtime::reflector::{self, ObjectRef, Store, store::Writer},
};

use super::{cached, listed};

/// A Service's `spec.selector`: the labels a pod must carry.
type ServiceSelector = BTreeMap<String, String>;

/// The writing halves of the Service and controller stores, for the reflectors ClusterState runs.
pub struct DefaultSpreadWriters {
    pub(crate) services: Writer<Service>,
    pub(crate) replica_sets: Writer<ReplicaSet>,
    pub(crate) stateful_sets: Writer<StatefulSet>,
    pub(crate) replication_controllers: Writer<ReplicationController>,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct DefaultSpread {
    config: Arc<SchedulerConfig>,
    /// Each namespace's Services with a selector: their selectors by Service name.
    services: Arc<DashMap<String, BTreeMap<String, ServiceSelector>>>,
    service_store: Store<Service>,
    replica_sets: Store<ReplicaSet>,
    stateful_sets: Store<StatefulSet>,
    replication_controllers: Store<ReplicationController>,
    /// See the module docs.
    generation: Arc<AtomicU64>,
    /// What the deduction last read of each controller, by kind, namespace and name.
    controllers: Arc<DashMap<(&'static str, String, String), ControllerReads>>,
}

/// A controller's uid and selector (as JSON): what the deduction reads of it.
type ControllerReads = (String, String);

/// What the deduction reads of a controller that changed, or that it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSeen {
    key: (&'static str, String, String),
    reads: Option<ControllerReads>,
}

impl ControllerSeen {
    /// A ReplicaSet as the watch delivered it (or its deletion).
    pub fn replica_set(set: &ReplicaSet, deleted: bool) -> Self {
        Self::of(
            "ReplicaSet",
            set,
            set.spec.as_ref().map(|spec| &spec.selector),
            deleted,
        )
    }

    /// A StatefulSet as the watch delivered it (or its deletion).
    pub fn stateful_set(set: &StatefulSet, deleted: bool) -> Self {
        Self::of(
            "StatefulSet",
            set,
            set.spec.as_ref().map(|spec| &spec.selector),
            deleted,
        )
    }

    /// A ReplicationController as the watch delivered it (or its deletion).
    pub fn replication_controller(controller: &ReplicationController, deleted: bool) -> Self {
        let selector = controller.spec.as_ref().and_then(|spec| spec.selector.as_ref());
        Self::of("ReplicationController", controller, selector, deleted)
    }

    fn of<K: kube::Resource, S: serde::Serialize>(
        kind: &'static str,
        object: &K,
        selector: Option<S>,
        deleted: bool,
    ) -> Self {
        let key = (kind, object.namespace().unwrap_or_default(), object.name_any());
        let reads = (!deleted).then(|| {
            let uid = object.meta().uid.clone().unwrap_or_default();
            (uid, serde_json::to_string(&selector).unwrap_or_default())
        });
        Self { key, reads }
    }
}

impl DefaultSpread {
    /// Empty stores for `config`'s defaults, and the writers that fill them.
    pub fn new(config: Arc<SchedulerConfig>) -> (Self, DefaultSpreadWriters) {
        let (service_store, services_w) = reflector::store();
        let (replica_sets, replica_sets_w) = reflector::store();
        let (stateful_sets, stateful_sets_w) = reflector::store();
        let (replication_controllers, replication_controllers_w) = reflector::store();
        let spread = Self {
            config,
            services: Arc::default(),
            service_store,
            replica_sets,
            stateful_sets,
            replication_controllers,
            generation: Arc::default(),
            controllers: Arc::default(),
        };
        let writers = DefaultSpreadWriters {
            services: services_w,
            replica_sets: replica_sets_w,
            stateful_sets: stateful_sets_w,
            replication_controllers: replication_controllers_w,
        };
        (spread, writers)
    }

    /// Whether the Services and controllers have their initial lists.
    pub fn is_synced(&self) -> bool {
        listed(&self.service_store)
            && listed(&self.replica_sets)
            && listed(&self.stateful_sets)
            && listed(&self.replication_controllers)
    }

    /// The generation of the Services and controllers (see the module docs).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Moves the generation on: a Service or controller changed, and the change is in the store.
    pub fn inputs_changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Records what the deduction reads of a controller (the store has it already): the
    /// generation moves on when that changed, not for a status update.
    pub fn observe_controller(&self, seen: ControllerSeen) {
        let changed = match seen.reads {
            Some(reads) => self.controllers.insert(seen.key, reads.clone()) != Some(reads),
            None => self.controllers.remove(&seen.key).is_some(),
        };
        if changed {
            self.inputs_changed();
        }
    }

    /// Records a Service's selector, or its deletion. A Service without a selector selects no
    /// pod, so it is not kept.
    pub fn observe_service(&self, service: &Service, deleted: bool) {
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let selector = service.spec.as_ref().and_then(|spec| spec.selector.clone());
        let mut services = self.services.entry(namespace.clone()).or_default();
        match selector.filter(|_| !deleted) {
            Some(selector) => {
                services.insert(name, selector);
            }
            None => {
                services.remove(&name);
            }
        }
        let empty = services.is_empty();
        drop(services);
        if empty {
            self.services
                .remove_if(&namespace, |_, services| services.is_empty());
        }
        self.inputs_changed();
    }

    /// Forgets the Services a relist no longer shows (deleted while the watch was away).
    pub fn relisted_services(&self, listed: &HashSet<(String, String)>) {
        self.services.retain(|namespace, by_name| {
            by_name.retain(|name, _| listed.contains(&(namespace.clone(), name.clone())));
            !by_name.is_empty()
        });
        self.inputs_changed();
    }

    /// The selector kube-scheduler deduces for `pod`'s default constraints; `None` for a pod with
    /// constraints of its own, or one nothing selects.
    pub fn selector_for(&self, pod: &CachedPod) -> Option<LabelSelector> {
        let spec = pod.spec.as_ref();
        if spec.is_some_and(|s| {
            s.topology_spread_constraints
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        }) {
            return None;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let no_labels = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&no_labels);
        let owner = self.owner_selector(pod, &namespace);
        let services = self.services.get(&namespace);
        let selectors = services.iter().flat_map(|by_name| by_name.values());
        default_selector(labels, selectors, owner.as_ref())
    }

    /// The default constraints for a pod whose deduced selector is `selector`.
    pub fn constraints(&self, selector: &LabelSelector) -> Vec<TopologySpreadConstraint> {
        self.config.constraints_for(selector)
    }

    /// What `pod`'s controller contributes, if it is one kube-scheduler reads and is still there
    /// (the same object: its UID matches the reference's).
    fn owner_selector(&self, pod: &CachedPod, namespace: &str) -> Option<OwnerSelector> {
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|owner| owner.controller == Some(true))
            .filter(|owner| deduces_from_owner(&owner.api_version, &owner.kind))?;
        let (uid, selector) = match owner.kind.as_str() {
            "ReplicaSet" => {
                let set = self
                    .replica_sets
                    .get(&ObjectRef::new(&owner.name).within(namespace))?;
                let selector = set.spec.as_ref()?.selector.clone();
                (set.metadata.uid.clone(), OwnerSelector::Selector(selector))
            }
            "StatefulSet" => {
                let set = self
                    .stateful_sets
                    .get(&ObjectRef::new(&owner.name).within(namespace))?;
                let selector = set.spec.as_ref()?.selector.clone();
                (set.metadata.uid.clone(), OwnerSelector::Selector(selector))
            }
            _ => {
                let controller =
                    (self.replication_controllers).get(&ObjectRef::new(&owner.name).within(namespace))?;
                let selector = controller.spec.as_ref()?.selector.clone();
                let selector = selector.filter(|labels| !labels.is_empty())?;
                (controller.metadata.uid.clone(), OwnerSelector::Labels(selector))
            }
        };
        (uid.as_ref() == Some(&owner.uid)).then_some(selector)
    }
}

/// A Service as kept: its selector.
pub fn trim_service(service: &mut Service) {
    cached::trim(service);
    service.status = None;
    if let Some(spec) = service.spec.as_mut() {
        *spec = ServiceSpec {
            selector: spec.selector.take(),
            ..ServiceSpec::default()
        };
    }
}

/// A ReplicaSet as kept: its selector (the pod template and status are read by no one).
pub fn trim_replica_set(set: &mut ReplicaSet) {
    cached::trim(set);
    set.status = None;
    if let Some(spec) = set.spec.as_mut() {
        spec.template = None;
    }
}

/// A StatefulSet as kept: its selector.
pub fn trim_stateful_set(set: &mut StatefulSet) {
    cached::trim(set);
    set.status = None;
    if let Some(spec) = set.spec.as_mut() {
        spec.template = Default::default();
        spec.volume_claim_templates = None;
    }
}

/// A ReplicationController as kept: its selector.
pub fn trim_replication_controller(controller: &mut ReplicationController) {
    cached::trim(controller);
    controller.status = None;
    if let Some(spec) = controller.spec.as_mut() {
        spec.template = None;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    const ZONE_SPREAD: &str = "podTopologySpread: {defaultConstraints: [{maxSkew: 1, \
        topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}]}";

    fn pod(value: serde_json::Value) -> CachedPod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_controllers_status_leaves_the_generation_and_its_selector_or_uid_moves_it() {
        let config = Arc::new(SchedulerConfig::parse(ZONE_SPREAD).unwrap());
        let (spread, _writers) = DefaultSpread::new(config);
        let set = |uid: &str, hash: &str, ready: i32| -> ReplicaSet {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-abc", "namespace": "shop", "uid": uid},
                "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": hash}}},
                "status": {"replicas": 3, "readyReplicas": ready},
            }))
            .unwrap()
        };
        let seen = |set: &ReplicaSet, deleted| ControllerSeen::replica_set(set, deleted);
        let start = spread.generation();
        spread.observe_controller(seen(&set("rs-1", "abc", 0), false));
        let first = spread.generation();
        assert!(first > start, "a new controller moves it on");
        spread.observe_controller(seen(&set("rs-1", "abc", 3), false));
        assert_eq!(spread.generation(), first, "its status changing does not");
        spread.observe_controller(seen(&set("rs-1", "def", 3), false));
        let relabelled = spread.generation();
        assert!(relabelled > first, "its selector changing does");
        spread.observe_controller(seen(&set("rs-2", "def", 3), false));
        let recreated = spread.generation();
        assert!(recreated > relabelled, "another object under the name does");
        spread.observe_controller(seen(&set("rs-2", "def", 3), true));
        assert!(spread.generation() > recreated, "its deletion does");
    }

    #[test]
    fn a_replica_sets_pods_are_spread_by_its_selector_and_the_services_that_select_them() {
        let config = Arc::new(SchedulerConfig::parse(ZONE_SPREAD).unwrap());
        let (spread, mut writers) = DefaultSpread::new(config);
        let set: ReplicaSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "uid": "rs-1"},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}},
        }))
        .unwrap();
        writers.replica_sets.apply_watcher_event(&Event::Apply(set));
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"}, "spec": {"selector": {"app": "web"}},
        }))
        .unwrap();
        spread.observe_service(&service, false);

        let web = pod(
            serde_json::json!({"metadata": {"name": "web-abc-1", "namespace": "shop",
            "labels": {"app": "web", "pod-template-hash": "abc"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                "uid": "rs-1", "controller": true}]},
            "spec": {"containers": [{"name": "app"}]}}),
        );
        let selector = spread.selector_for(&web).unwrap();
        assert_eq!(
            selector.match_labels.unwrap().get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(selector.match_expressions.unwrap().len(), 2);

        let bare = pod(
            serde_json::json!({"metadata": {"name": "job-1", "namespace": "shop",
            "labels": {"app": "batch"}}, "spec": {"containers": [{"name": "app"}]}}),
        );
        assert_eq!(spread.selector_for(&bare), None);

        spread.observe_service(&service, true);
        let replaced = pod(
            serde_json::json!({"metadata": {"name": "web-abc-2", "namespace": "shop",
            "labels": {"app": "web", "pod-template-hash": "abc"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                "uid": "an-older-set", "controller": true}]},
            "spec": {"containers": [{"name": "app"}]}}),
        );
        assert_eq!(
            spread.selector_for(&replaced),
            None,
            "the named set is another object now"
        );
    }
}

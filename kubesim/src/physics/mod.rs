//! Cluster physics: the components of a real cluster that Joist does not own, each a small
//! controller over the same store (a kube-scheduler, kubelets, workload controllers, the disruption
//! controller, volume provisioning and attachment).
//!
//! A controller sees the store's changes through [`Informer`]s, keeps what it needs, and writes back
//! through the store like any client. A write that fails (a conflict with another writer, an object
//! deleted meanwhile) is retried on the next change; a controller never stops the cluster. A
//! controller with a burst of writes to make (the scheduler's queue, the kubelets' timers all due at
//! one instant) makes at most [`WRITES_PER_TURN`] before it yields, so the others read the burst
//! while its objects are still held parsed ([`crate::history`]).

mod disruption;
mod kubelet;
mod rollout;
mod scheduler;
mod volumes;
mod workloads;

use std::{sync::Arc, time::Duration};

use joist_messages::scheduler_config::SchedulerConfig;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::task::JoinHandle;

pub use self::kubelet::KubeletSettings;
pub use self::workloads::template_hash;
use crate::{
    error::ApiError,
    history::Reads,
    resources::GroupResource,
    store::{EventKind, ObjectKey, Store, Version, WatchCursor},
};

/// Timings and configuration of the simulated components.
#[derive(Debug, Clone)]
pub struct PhysicsSettings {
    /// Kubelet timings.
    pub kubelet: KubeletSettings,
    /// How often unschedulable pods are retried even when nothing changed (kube-scheduler flushes
    /// them after 5 minutes).
    pub unschedulable_retry: Duration,
    /// From the last pod using a volume on a node leaving to its VolumeAttachment's deletion.
    pub detach_after: Duration,
    /// The scheduler's configuration (its default topology spread); none: kube-scheduler's
    /// defaults, which spread no pod by force.
    pub scheduler: Option<Arc<SchedulerConfig>>,
}

impl Default for PhysicsSettings {
    fn default() -> Self {
        Self {
            kubelet: KubeletSettings::default(),
            unschedulable_retry: Duration::from_secs(300),
            detach_after: Duration::from_secs(10),
            scheduler: None,
        }
    }
}

/// Objects a controller writes before it yields to the rest of the cluster: well within the events a
/// resource's history holds parsed for watches yet to read them.
const WRITES_PER_TURN: usize = 1_000;

/// Starts every physics controller; they run until their handles are aborted.
pub fn start(store: &Arc<Store>, settings: PhysicsSettings) -> Vec<JoinHandle<()>> {
    let busy = store.busy();
    vec![
        busy.spawn(scheduler::run(
            store.clone(),
            settings.unschedulable_retry,
            settings.scheduler,
        )),
        busy.spawn(kubelet::run(store.clone(), settings.kubelet)),
        busy.spawn(workloads::run(store.clone())),
        busy.spawn(disruption::run(store.clone())),
        busy.spawn(volumes::run(store.clone(), settings.detach_after)),
    ]
}

/// One resource's change feed for a controller: the objects as they were at the start, then every
/// change.
pub(crate) struct Informer {
    resource: GroupResource,
    cursor: Option<WatchCursor>,
}

/// A change an informer reports: the object parsed, or read as `T` (the fields a controller
/// reads, see [`Informer::changes_as`]).
pub(crate) struct Change<T = Arc<Value>> {
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (before it, for deletes).
    pub object: T,
}

impl Change {
    /// The key of the changed object.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(&self.object)
    }
}

impl Informer {
    /// An informer of `group/resource`.
    pub fn new(group: &str, resource: &str) -> Self {
        Self {
            resource: GroupResource::new(group, resource),
            cursor: None,
        }
    }

    /// The changes since the last call: on the first call (or after falling behind the store's
    /// history) every current object as `Added`.
    pub fn changes(&mut self, store: &Store) -> Changes {
        self.changes_read(store, Version::value)
    }

    /// [`changes`](Self::changes) with each object read as `T`: a controller that reads a few
    /// fields of a large object (a NodeClaim's startup taints, not its 600 instance types) skips
    /// the rest of its JSON rather than building it.
    pub fn changes_as<T: DeserializeOwned>(&mut self, store: &Store) -> Changes<T> {
        self.changes_read(store, Version::read)
    }

    fn changes_read<T>(&mut self, store: &Store, read: fn(&Version) -> Result<T, ApiError>) -> Changes<T> {
        let resource = self.resource.clone();
        if let Some(cursor) = &mut self.cursor {
            match store.poll(cursor, usize::MAX) {
                Ok(events) => {
                    let versions: Vec<(EventKind, Version)> =
                        events.iter().map(|e| (e.kind, e.object.clone())).collect();
                    return Changes {
                        resource,
                        versions: versions.into_iter(),
                        read,
                    };
                }
                Err(error) => {
                    tracing::warn!(%error, resource = %self.resource.qualified(), "informer relists")
                }
            }
        }
        let page = store.list_encoded(&self.resource, None, None, None);
        self.cursor = store
            .watch(&self.resource, Some(page.revision), Reads::Objects)
            .ok();
        let versions: Vec<(EventKind, Version)> = page
            .items
            .into_iter()
            .map(|json| (EventKind::Added, Version::encoded(json)))
            .collect();
        Changes {
            resource,
            versions: versions.into_iter(),
            read,
        }
    }
}

/// The changes an informer read, each parsed as it is taken: a controller that reads a long
/// backlog holds one object of it at a time (events past the newest thousand keep only their
/// JSON). A version that does not parse is logged and skipped.
pub(crate) struct Changes<T = Arc<Value>> {
    resource: GroupResource,
    versions: std::vec::IntoIter<(EventKind, Version)>,
    read: fn(&Version) -> Result<T, ApiError>,
}

impl<T> Changes<T> {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.versions.len() == 0
    }
}

impl<T> Iterator for Changes<T> {
    type Item = Change<T>;

    fn next(&mut self) -> Option<Change<T>> {
        loop {
            let (kind, version) = self.versions.next()?;
            match (self.read)(&version) {
                Ok(object) => return Some(Change { kind, object }),
                Err(error) => {
                    tracing::error!(%error, resource = %self.resource.qualified(), "informer skips a change")
                }
            }
        }
    }
}

/// Waits for the next write to the store, or until `deadline`.
pub(crate) async fn wait(
    changes: &mut tokio::sync::watch::Receiver<u64>,
    deadline: Option<tokio::time::Instant>,
) -> bool {
    match deadline {
        Some(deadline) => tokio::select! {
            changed = changes.changed() => changed.is_ok(),
            () = tokio::time::sleep_until(deadline) => true,
        },
        None => changes.changed().await.is_ok(),
    }
}

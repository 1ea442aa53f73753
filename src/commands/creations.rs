//! When objects of a kind were created, as a client sees it: a watch of their metadata, opened
//! before a benchmark acts, that notes each object created after it opened the first time it
//! shows, and when the first and the newest did. `joist bench controller` times the first
//! NodeClaim from the last pod's creation with two of them, rather than from the Deployments'
//! status (which the workload controllers write after their pods) and a list every few
//! milliseconds (which sees a claim only when it looks).
//!
//! Only metadata is decoded, so the benchmark's own process adds little beside the two it
//! measures. A watch error is retried with backoff (the watcher lists again and notes only objects
//! it has not seen); the watch ends when the [`Creations`] is dropped.

use std::{
    collections::HashSet,
    fmt::Debug,
    sync::{Arc, Mutex, PoisonError},
};

use futures::StreamExt as _;
use kube::{
    Api, Resource,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;
use tokio::{sync::oneshot, task::JoinHandle};

use super::bench::WallInstant;

/// How long opening a watch waits for its first list.
const LISTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// See the module docs.
pub(super) struct Creations {
    seen: Arc<Mutex<Seen>>,
    watch: JoinHandle<()>,
}

/// The objects seen so far.
#[derive(Default)]
struct Seen {
    /// Every object seen, those there before the watch opened included.
    uids: HashSet<String>,
    /// Objects seen that were created after it opened.
    created: usize,
    /// When the first object showed.
    first: Option<WallInstant>,
    /// When the newest object first showed.
    last: Option<WallInstant>,
}

/// What has been seen of objects created after the watch opened: how many, when the first showed,
/// and when the newest did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    /// Objects created.
    pub(super) objects: usize,
    /// When the first showed.
    pub(super) first: Option<WallInstant>,
    /// When the newest first showed.
    pub(super) last: Option<WallInstant>,
}

impl Creations {
    /// Opens the watch on `objects`; returns once those already there are listed (they are not
    /// counted), so that objects created after are seen as they come, or after [`LISTED_WITHIN`].
    pub(super) async fn watch<K>(objects: Api<PartialObjectMeta<K>>) -> Self
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (listed, on_listed) = oneshot::channel();
        let watch = tokio::spawn(note_creations(objects, seen.clone(), listed));
        // A watch that cannot list goes on trying; the benchmark does not wait for it forever (its
        // figures then say the creations were never seen).
        let _ = tokio::time::timeout(LISTED_WITHIN, on_listed).await;
        Self { seen, watch }
    }

    /// What has been seen so far.
    pub(super) fn counted(&self) -> Counted {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        Counted {
            objects: seen.created,
            first: seen.first,
            last: seen.last,
        }
    }
}

impl Drop for Creations {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Notes every object the watch shows the first time it does, as created unless the first list
/// shows it; says on `listed` when that list is done.
async fn note_creations<K>(
    objects: Api<PartialObjectMeta<K>>,
    seen: Arc<Mutex<Seen>>,
    listed: oneshot::Sender<()>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut listed = Some(listed);
    let objects = watcher(objects, watcher::Config::default()).default_backoff();
    let mut objects = std::pin::pin!(objects);
    while let Some(event) = objects.next().await {
        let object = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => object,
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
                continue;
            }
            Ok(watcher::Event::Init | watcher::Event::Delete(_)) | Err(_) => continue,
        };
        let Some(uid) = object.metadata.uid else { continue };
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.uids.insert(uid) && listed.is_none() {
            seen.created += 1;
            let now = WallInstant::now();
            seen.first.get_or_insert(now);
            seen.last = Some(now);
        }
    }
}

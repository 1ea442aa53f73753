//! Frees parsed versions the watch history lets go of on a thread of their own.
//!
//! An event that leaves the newest events of its resource keeps its JSON and lets go of its
//! parsed versions ([`crate::history`]), which are mostly the last reference to them: freeing a
//! NodeClaim's tree of some thousand values, at each of its writes, was a tenth of a 10,000-node
//! simulation's time, on the thread that runs the whole simulated world. Freeing has no effect
//! anyone can observe, so it can happen anywhere and later.
//!
//! It cannot fail: see [`crate::handoff`].

use std::{cell::RefCell, sync::Arc};

use crate::{handoff::Helper, store::WatchEvent};

/// How many events are handed to the thread at once: waking it for each was a third of what
/// handing them over saved.
pub const BATCH: usize = 64;

/// How many batches may wait for the thread before callers free their own again.
pub const QUEUED: usize = 64;

static RECLAIM: Helper<Arc<WatchEvent>> = Helper::new("kubesim-reclaim", BATCH, QUEUED, drop);

thread_local! {
    /// The events this thread let go of since it last handed a batch over.
    static PENDING: RefCell<Vec<Arc<WatchEvent>>> = const { RefCell::new(Vec::new()) };
}

/// Frees `event` (the parsed versions it held) on the reclaiming thread, or here when that thread
/// is busy or missing.
pub(crate) fn free_later(event: Arc<WatchEvent>) {
    RECLAIM.hand_over(&PENDING, event);
}

#[cfg(test)]
mod tests {
    use std::{sync::Weak, time::Duration};

    use bytes::Bytes;
    use serde_json::json;

    use super::*;
    use crate::store::{EventKind, Version};

    fn event_holding(object: &Arc<serde_json::Value>) -> Arc<WatchEvent> {
        Arc::new(WatchEvent {
            kind: EventKind::Modified,
            object: Version::parsed(Bytes::from(object.to_string()), object.clone()),
            previous: None,
            revision: 1,
        })
    }

    #[test]
    fn versions_let_go_of_are_freed_once_a_batch_is_handed_over() {
        let objects: Vec<Arc<serde_json::Value>> = (0..BATCH)
            .map(|i| Arc::new(json!({"metadata": {"name": format!("claim-{i}")}})))
            .collect();
        let watched: Vec<Weak<serde_json::Value>> = objects.iter().map(Arc::downgrade).collect();
        let mut events: Vec<Arc<WatchEvent>> = objects.iter().map(event_holding).collect();
        drop(objects);
        let last = events.pop().expect("a batch has events");
        events.into_iter().for_each(free_later);
        assert!(
            watched.iter().all(|version| version.upgrade().is_some()),
            "nothing is freed before the batch is full"
        );
        free_later(last);
        let freed = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            watched.iter().all(|version| version.upgrade().is_none())
        });
        assert!(freed, "every version of a handed-over batch is freed");
    }
}

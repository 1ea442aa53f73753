//! One resource's watch history: the events kept for watches to read, and to resume from.
//!
//! Kept are the newest `resumable` events, for a client that reconnects with the
//! resourceVersion it last saw, and every older event a watch still open has not read yet, so a
//! watcher that falls behind during a burst catches up instead of relisting. Memory then follows
//! how far the slowest open watch lags, not the cluster's size. A watch more than
//! [`UNREAD_CAP`] events behind, or a resume from before the oldest event kept, is answered 410
//! Gone, as kube-apiserver answers a watch its cache no longer covers.
//!
//! Only the newest [`PARSED_EVENTS`] events hold their objects parsed, for the cluster's own
//! controllers, which read each event as it comes; older ones hold their JSON alone (a pod's is a
//! ninth of its parsed form), and a watch that lags that far parses what it reads.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use crate::{error::ApiError, reclaim, store::WatchEvent};

/// The most events kept for open watches that have not read them: kube-apiserver's watch cache
/// holds at most this many events of a resource (the upper bound of its size, which grows to keep
/// 75 s of history), and a watch that falls further behind resumes nowhere there either.
pub const UNREAD_CAP: usize = 100 * 1024;

/// The newest events that keep their objects parsed.
pub const PARSED_EVENTS: usize = 1_000;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct History {
    events: VecDeque<Arc<WatchEvent>>,
    /// Watches may resume from any revision at or above this one.
    oldest_resumable: u64,
    readers: Arc<Readers>,
}

/// Where each open watch has read up to.
#[derive(Debug, Default)]
struct Readers {
    positions: Mutex<HashMap<u64, u64>>,
}

impl Readers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.positions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An open watch's place in a [`History`]; it lets go of the history it held when dropped.
#[derive(Debug)]
pub(crate) struct Reader {
    readers: Arc<Readers>,
    id: u64,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.readers.lock().remove(&self.id);
    }
}

impl History {
    /// Records an event, then lets go of what no one needs: beyond the newest `resumable`
    /// events, those every open watch has read, and any beyond [`UNREAD_CAP`].
    pub(crate) fn push(&mut self, event: Arc<WatchEvent>, resumable: usize) {
        self.events.push_back(event);
        if let Some(index) = self.events.len().checked_sub(PARSED_EVENTS + 1)
            && self.events[index].is_parsed()
        {
            let cooled = Arc::new(self.events[index].cooled());
            reclaim::free_later(std::mem::replace(&mut self.events[index], cooled));
        }
        let slowest = self.readers.lock().values().copied().min().unwrap_or(u64::MAX);
        while let Some(oldest) = self.events.front() {
            let surplus = self.events.len() > resumable.min(UNREAD_CAP);
            if !surplus || (oldest.revision > slowest && self.events.len() <= UNREAD_CAP) {
                break;
            }
            self.oldest_resumable = oldest.revision;
            self.events.pop_front();
        }
    }

    /// Refuses a watch from `position` when events after it are gone.
    pub(crate) fn resumable(&self, position: u64) -> Result<(), ApiError> {
        if position < self.oldest_resumable {
            return Err(ApiError::Gone {
                requested: position,
                oldest: self.oldest_resumable,
            });
        }
        Ok(())
    }

    /// A watch that has read up to `position`.
    pub(crate) fn reader(&self, position: u64) -> Reader {
        let mut positions = self.readers.lock();
        let id = (0..).find(|id| !positions.contains_key(id)).unwrap_or_default();
        positions.insert(id, position);
        Reader {
            readers: self.readers.clone(),
            id,
        }
    }

    /// At most `max` events after `position`, or 410 when some are gone.
    pub(crate) fn after(&self, position: u64, max: usize) -> Result<Vec<Arc<WatchEvent>>, ApiError> {
        self.resumable(position)?;
        let start = self.events.partition_point(|event| event.revision <= position);
        Ok(self.events.range(start..).take(max).cloned().collect())
    }

    /// Notes that `reader` has read up to `position`.
    pub(crate) fn read(&self, reader: &Reader, position: u64) {
        self.readers.lock().insert(reader.id, position);
    }
}

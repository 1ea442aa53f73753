//! One resource's watch history: the events kept for watches to read, and to resume from.
//!
//! Kept are the newest `resumable` events, for a client that reconnects with the
//! resourceVersion it last saw, and every older event a watch still open has not read yet, so a
//! watcher that falls behind during a burst catches up instead of relisting. Memory then follows
//! how far the slowest open watch lags, not the cluster's size. A watch more than
//! [`UNREAD_CAP`] events behind, or a resume from before the oldest event kept, is answered 410
//! Gone, as kube-apiserver answers a watch its cache no longer covers.
//!
//! An event holds its objects parsed while it is among the newest [`PARSED_EVENTS`], or while a
//! watch that reads objects ([`Reads::Objects`]) has yet to read it and it is among the newest
//! [`PARSED_UNREAD`]: the cluster's own controllers read each event as it comes, five of them each
//! pod's, and one parse serves them all even when a burst puts them thousands of events behind.
//! Older events hold their JSON alone (a pod's is a ninth of its parsed form), and a watch that
//! lags further parses what it reads. Watches that send JSON (clients over HTTP) hold no event
//! parsed.

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

/// The newest events that keep their objects parsed while a watch reading objects has not read
/// them.
pub const PARSED_UNREAD: usize = 10_000;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct History {
    events: VecDeque<Arc<WatchEvent>>,
    /// Watches may resume from any revision at or above this one.
    oldest_resumable: u64,
    /// Every event up to this revision holds its JSON alone.
    cooled_through: u64,
    readers: Arc<Readers>,
}

/// How a watch reads its events, which decides how long they stay parsed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// As JSON to send on (a client over HTTP).
    Json,
    /// As objects (kubesim's own controllers, `joist simulate`'s recorder).
    Objects,
}

/// Where each open watch has read up to, and how it reads.
#[derive(Debug, Default)]
struct Readers {
    positions: Mutex<HashMap<u64, (u64, Reads)>>,
}

impl Readers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (u64, Reads)>> {
        self.positions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How far the slowest watch has read, and the slowest that reads objects (`u64::MAX` when
    /// there is none).
    fn slowest(&self) -> (u64, u64) {
        self.lock()
            .values()
            .fold((u64::MAX, u64::MAX), |(any, objects), &(position, reads)| {
                let objects = match reads {
                    Reads::Objects => objects.min(position),
                    Reads::Json => objects,
                };
                (any.min(position), objects)
            })
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
        let (slowest, slowest_reading_objects) = self.readers.slowest();
        self.cool(slowest_reading_objects);
        while let Some(oldest) = self.events.front() {
            let surplus = self.events.len() > resumable.min(UNREAD_CAP);
            if !surplus || (oldest.revision > slowest && self.events.len() <= UNREAD_CAP) {
                break;
            }
            self.oldest_resumable = oldest.revision;
            self.events.pop_front();
        }
    }

    /// Lets go of the parsed objects of the events past the newest [`PARSED_EVENTS`] that every
    /// watch reading objects has read (up to `slowest`), and of any past the newest
    /// [`PARSED_UNREAD`].
    fn cool(&mut self, slowest: u64) {
        let len = self.events.len();
        let first = self
            .events
            .partition_point(|event| event.revision <= self.cooled_through);
        for index in first..len.saturating_sub(PARSED_EVENTS) {
            let event = &self.events[index];
            if event.revision > slowest && len - index <= PARSED_UNREAD {
                break;
            }
            self.cooled_through = event.revision;
            if event.is_parsed() {
                let cooled = Arc::new(event.cooled());
                reclaim::free_later(std::mem::replace(&mut self.events[index], cooled));
            }
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

    /// A watch that has read up to `position`, and reads as `reads`.
    pub(crate) fn reader(&self, position: u64, reads: Reads) -> Reader {
        let mut positions = self.readers.lock();
        let id = (0..).find(|id| !positions.contains_key(id)).unwrap_or_default();
        positions.insert(id, (position, reads));
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
        if let Some((read, _)) = self.readers.lock().get_mut(&reader.id) {
            *read = position;
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;

    use super::*;
    use crate::store::{EventKind, Version};

    /// Records a pod event at each of `revisions`, parsed as a write records it.
    fn pushed(history: &mut History, revisions: std::ops::RangeInclusive<u64>) {
        for revision in revisions {
            let object = json!({"metadata": {"name": format!("p-{revision}")}});
            let json = Bytes::from(object.to_string());
            let event = WatchEvent {
                kind: EventKind::Added,
                object: Version::parsed(json, Arc::new(object)),
                previous: None,
                revision,
            };
            history.push(Arc::new(event), usize::MAX);
        }
    }

    /// The revisions of the events that still hold their objects parsed.
    fn parsed(history: &History) -> Vec<u64> {
        history
            .events
            .iter()
            .filter(|event| event.is_parsed())
            .map(|event| event.revision)
            .collect()
    }

    #[test]
    fn events_stay_parsed_until_every_watch_reading_objects_has_read_them() {
        let mut history = History::default();
        let controller = history.reader(0, Reads::Objects);
        let _client = history.reader(0, Reads::Json);
        pushed(&mut history, 1..=3_000);
        assert_eq!(
            parsed(&history).len(),
            3_000,
            "a controller 3,000 events behind reads every one parsed"
        );

        history.read(&controller, 2_500);
        pushed(&mut history, 3_001..=3_001);
        let kept = parsed(&history);
        assert_eq!(
            kept.first(),
            Some(&2_002),
            "read by the controller: only the newest thousand stay parsed, whatever the client over HTTP has read"
        );
        assert_eq!(kept.len(), PARSED_EVENTS);
    }

    #[test]
    fn a_watch_that_lags_past_the_cap_parses_what_it_reads() {
        let mut history = History::default();
        let _controller = history.reader(0, Reads::Objects);
        let total = u64::try_from(PARSED_UNREAD).unwrap_or(u64::MAX) + 500;
        pushed(&mut history, 1..=total);
        let kept = parsed(&history);
        assert_eq!(kept.len(), PARSED_UNREAD, "memory is bounded by the cap");
        assert_eq!(
            kept.first(),
            Some(&501),
            "the oldest unread ones hold their JSON alone"
        );
    }

    #[test]
    fn without_a_watch_reading_objects_only_the_newest_thousand_stay_parsed() {
        let mut history = History::default();
        let _client = history.reader(0, Reads::Json);
        pushed(&mut history, 1..=1_500);
        assert_eq!(parsed(&history), (501..=1_500).collect::<Vec<_>>());
    }
}

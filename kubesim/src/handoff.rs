//! Work no one can observe being done, done on a thread of its own in batches: freeing the parsed
//! versions the watch history lets go of ([`crate::reclaim`]) and serializing the versions the
//! store commits ([`crate::serialized`]), both off the one thread that runs the simulated world.
//!
//! It cannot fail: when the thread cannot be started, or has a full queue, the work is done on the
//! caller's thread at once, so what waits for the thread stays bounded by its queue of batches,
//! and each thread that hands work over holds at most one batch not yet handed over.

use std::{
    cell::RefCell,
    sync::{
        OnceLock,
        mpsc::{self, SyncSender, TrySendError},
    },
    thread::LocalKey,
};

/// A thread that does `work` on each item handed to it (see the module docs).
pub(crate) struct Helper<T: 'static> {
    name: &'static str,
    /// Items handed over at once: waking the thread for each costs more than a small batch.
    batch: usize,
    /// Batches that may wait for the thread before callers do the work themselves.
    queued: usize,
    work: fn(T),
    queue: OnceLock<Option<SyncSender<Vec<T>>>>,
}

impl<T: Send + 'static> Helper<T> {
    /// A helper thread named `name`, started when first handed work.
    pub(crate) const fn new(name: &'static str, batch: usize, queued: usize, work: fn(T)) -> Self {
        Self {
            name,
            batch,
            queued,
            work,
            queue: OnceLock::new(),
        }
    }

    /// Adds `item` to this thread's batch (kept in `pending`), and hands the batch over when it
    /// is full, or does its work here when the helper cannot take it.
    pub(crate) fn hand_over(&'static self, pending: &'static LocalKey<RefCell<Vec<T>>>, item: T) {
        let full = pending.with_borrow_mut(|pending| {
            pending.push(item);
            (pending.len() >= self.batch).then(|| std::mem::replace(pending, Vec::with_capacity(self.batch)))
        });
        let Some(batch) = full else { return };
        let unsent = match self.queue() {
            Some(queue) => match queue.try_send(batch) {
                Ok(()) => return,
                Err(TrySendError::Full(batch) | TrySendError::Disconnected(batch)) => batch,
            },
            None => batch,
        };
        unsent.into_iter().for_each(self.work);
    }

    /// The queue to the thread, started at the first use; `None` when it cannot start.
    fn queue(&'static self) -> Option<&'static SyncSender<Vec<T>>> {
        self.queue
            .get_or_init(|| {
                let (sender, receiver) = mpsc::sync_channel::<Vec<T>>(self.queued);
                let work = self.work;
                std::thread::Builder::new()
                    .name(self.name.to_owned())
                    .spawn(move || receiver.into_iter().flatten().for_each(work))
                    .map_err(|error| {
                        tracing::warn!(%error, thread = self.name, "kubesim does this work on the caller's thread")
                    })
                    .ok()
                    .map(|_| sender)
            })
            .as_ref()
    }
}

//! Request coalescing: identical requests that arrive close together become one API call.
//!
//! EC2 CreateFleet, TerminateInstances and DescribeInstances (by id) requests are batched the way
//! Karpenter's batcher does it:
//! requests with equal keys join one open *window*, and when the window closes a single executor
//! call handles all its items, each caller getting back the result for its own item. Different keys
//! never share a window.
//!
//! A window opens at its first item and closes at the earliest of: [`Window::idle`] with no new item
//! for its key, [`Window::max`] after it opened, or as soon as it holds [`Window::max_items`] items.
//! A closed window leaves the map before its executor runs, so items arriving meanwhile open a new
//! window.
//!
//! No caller hangs: if the executor returns fewer results than items, the callers left over get
//! `None`; if the executor panics or its task is dropped (the runtime shutting down), every caller of
//! the window gets `None`. A caller that stops waiting does not withdraw its item.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::{sync::oneshot, time::Instant};

/// When a window closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The window closes when no request arrives for this long.
    pub idle: Duration,
    /// The window closes this long after it opened, however busy.
    pub max: Duration,
    /// The window closes as soon as it holds this many items.
    pub max_items: usize,
}

impl Window {
    /// CreateFleet's window: 35 ms idle, 1 s max, 1000 items.
    pub const CREATE_FLEET: Window = Window {
        idle: Duration::from_millis(35),
        max: Duration::from_secs(1),
        max_items: 1000,
    };
    /// TerminateInstances' window: 100 ms idle, 1 s max, 500 items.
    pub const TERMINATE: Window = Window {
        idle: Duration::from_millis(100),
        max: Duration::from_secs(1),
        max_items: 500,
    };
    /// DescribeInstances' window (lookups by id): 100 ms idle, 1 s max, 500 items.
    pub const DESCRIBE: Window = Window {
        idle: Duration::from_millis(100),
        max: Duration::from_secs(1),
        max_items: 500,
    };
}

/// What runs one closed window: gets the key and the items in arrival order, returns one result per
/// item, in the same order.
pub type Executor<K, T, R> = Arc<dyn Fn(K, Vec<T>) -> BoxFuture<'static, Vec<R>> + Send + Sync>;

/// Merges the items submitted under equal keys into one executor call per window. Cloning is cheap:
/// clones share their windows.
pub struct Coalescer<K, T, R> {
    window: Window,
    executor: Executor<K, T, R>,
    shared: Arc<Shared<K, T, R>>,
}

/// The open windows, one per key, and the id of the next window to open.
struct Shared<K, T, R> {
    windows: Mutex<HashMap<K, Open<T, R>>>,
    next_id: AtomicU64,
}

/// An open window: its items in arrival order, and where each item's result goes.
struct Open<T, R> {
    /// Tells this window from a later one for the same key, which its timer must leave alone.
    id: u64,
    opened: Instant,
    last: Instant,
    items: Vec<T>,
    senders: Vec<oneshot::Sender<R>>,
}

/// What a window's timer finds when it wakes.
enum Due<T, R> {
    /// The window is gone already (it filled up): nothing left to do.
    Gone,
    /// The window is not due yet: sleep until then.
    Later(Instant),
    /// The window is closed and out of the map: execute it.
    Now(Open<T, R>),
}

impl<K, T, R> Clone for Coalescer<K, T, R> {
    fn clone(&self) -> Self {
        Self {
            window: self.window,
            executor: Arc::clone(&self.executor),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, T, R> Coalescer<K, T, R>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    T: Send + 'static,
    R: Send + 'static,
{
    /// A coalescer whose windows close by `window` and run on `executor`.
    pub fn new(window: Window, executor: Executor<K, T, R>) -> Self {
        let shared = Shared {
            windows: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        };
        Self {
            window,
            executor,
            shared: Arc::new(shared),
        }
    }

    /// Adds `item` to the open window for `key` (opening one if none), waits for the window to be
    /// executed, and returns this item's result; `None` when the executor returned no result for it
    /// (or panicked). Must run inside a tokio runtime.
    pub async fn submit(&self, key: K, item: T) -> Option<R> {
        let (sender, receiver) = oneshot::channel();
        self.add(key, item, sender);
        receiver.await.ok()
    }

    /// Adds an item to the window for `key`: opens the window and starts its timer if there was none,
    /// and takes it out and executes it if the item filled it.
    fn add(&self, key: K, item: T, sender: oneshot::Sender<R>) {
        let now = Instant::now();
        let mut opened = None;
        let full = {
            let mut windows = self.windows();
            let window = windows.entry(key.clone()).or_insert_with(|| {
                let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
                opened = Some(id);
                Open {
                    id,
                    opened: now,
                    last: now,
                    items: Vec::new(),
                    senders: Vec::new(),
                }
            });
            window.last = now;
            window.items.push(item);
            window.senders.push(sender);
            if window.items.len() >= self.window.max_items {
                windows.remove(&key)
            } else {
                None
            }
        };
        match (full, opened) {
            (Some(window), _) => {
                tokio::spawn(execute(Arc::clone(&self.executor), key, window));
            }
            (None, Some(id)) => {
                tokio::spawn(self.clone().close_when_due(key, id));
            }
            (None, None) => {}
        }
    }

    /// The timer of window `id`: sleeps until the window is due, then takes it out and executes it.
    async fn close_when_due(self, key: K, id: u64) {
        loop {
            match self.take_if_due(&key, id) {
                Due::Gone => return,
                Due::Later(deadline) => tokio::time::sleep_until(deadline).await,
                Due::Now(window) => return execute(Arc::clone(&self.executor), key, window).await,
            }
        }
    }

    /// Takes window `id` out of the map if it is due: `idle` after its last item or `max` after it
    /// opened, whichever comes first.
    fn take_if_due(&self, key: &K, id: u64) -> Due<T, R> {
        let mut windows = self.windows();
        let deadline = match windows.get(key) {
            Some(window) if window.id == id => {
                (window.last + self.window.idle).min(window.opened + self.window.max)
            }
            _ => return Due::Gone,
        };
        if deadline > Instant::now() {
            return Due::Later(deadline);
        }
        windows.remove(key).map_or(Due::Gone, Due::Now)
    }

    /// The open windows, locked (a poisoned lock still holds consistent windows).
    fn windows(&self) -> MutexGuard<'_, HashMap<K, Open<T, R>>> {
        self.shared.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs one closed window and hands each caller its result; callers left without one get `None`
/// when their sender drops.
async fn execute<K, T, R>(executor: Executor<K, T, R>, key: K, window: Open<T, R>) {
    let items = window.items.len();
    let results = executor(key, window.items).await;
    if results.len() < items {
        tracing::warn!(
            items,
            results = results.len(),
            "the executor returned fewer results than items"
        );
    }
    for (sender, result) in window.senders.into_iter().zip(results) {
        // A caller that stopped waiting has nothing to receive.
        let _ = sender.send(result);
    }
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, future::join_all};

    use super::*;

    /// Small windows on real time: the crate's tokio has no `test-util` to pause time.
    const QUICK: Window = Window {
        idle: Duration::from_millis(20),
        max: Duration::from_millis(200),
        max_items: 100,
    };

    /// The executor's calls, as (key, number of items).
    type Calls = Arc<Mutex<Vec<(u32, usize)>>>;

    /// A coalescer whose executor doubles each item and records its calls.
    fn doubling(window: Window) -> (Coalescer<u32, u32, u32>, Calls) {
        let calls = Calls::default();
        let record = Arc::clone(&calls);
        let executor: Executor<u32, u32, u32> = Arc::new(move |key: u32, items: Vec<u32>| {
            record
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((key, items.len()));
            async move { items.into_iter().map(|item| item * 2).collect::<Vec<u32>>() }.boxed()
        });
        (Coalescer::new(window, executor), calls)
    }

    /// The calls recorded so far, sorted.
    fn recorded(calls: &Calls) -> Vec<(u32, usize)> {
        let mut calls = calls.lock().unwrap_or_else(PoisonError::into_inner).clone();
        calls.sort_unstable();
        calls
    }

    #[tokio::test]
    async fn equal_keys_share_one_call_and_each_caller_gets_its_result() {
        let (coalescer, calls) = doubling(QUICK);
        let results = join_all((0..10).map(|item| coalescer.submit(7, item))).await;
        assert_eq!(results, (0..10).map(|item| Some(item * 2)).collect::<Vec<_>>());
        assert_eq!(recorded(&calls), vec![(7, 10)]);
    }

    #[tokio::test]
    async fn different_keys_are_executed_separately() {
        let (coalescer, calls) = doubling(QUICK);
        let results = join_all((0..6).map(|item| coalescer.submit(item % 2, item))).await;
        assert_eq!(results, (0..6).map(|item| Some(item * 2)).collect::<Vec<_>>());
        assert_eq!(recorded(&calls), vec![(0, 3), (1, 3)]);
    }

    #[tokio::test]
    async fn a_full_window_closes_and_the_next_item_opens_another() {
        let (coalescer, calls) = doubling(Window {
            max_items: 3,
            ..QUICK
        });
        let results = join_all((0..7).map(|item| coalescer.submit(0, item))).await;
        assert_eq!(results, (0..7).map(|item| Some(item * 2)).collect::<Vec<_>>());
        assert_eq!(recorded(&calls), vec![(0, 1), (0, 3), (0, 3)]);
    }

    #[tokio::test]
    async fn a_steady_trickle_still_closes_at_max() {
        // Items every 20 ms never leave the window idle for 100 ms, so only `max` can close it.
        let (coalescer, calls) = doubling(Window {
            idle: Duration::from_millis(100),
            ..QUICK
        });
        let mut callers = Vec::new();
        for item in 0..15 {
            let coalescer = coalescer.clone();
            callers.push(tokio::spawn(async move { coalescer.submit(0, item).await }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !recorded(&calls).is_empty(),
            "no window closed in 300 ms of items"
        );
        let results: Vec<_> = join_all(callers)
            .await
            .into_iter()
            .map(|joined| joined.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(results, (0..15).map(|item| Some(item * 2)).collect::<Vec<_>>());
        let calls = recorded(&calls);
        assert!(calls.len() >= 2, "{calls:?}");
        assert_eq!(calls.iter().map(|&(_, items)| items).sum::<usize>(), 15);
    }

    #[tokio::test]
    async fn callers_without_a_result_get_none() {
        let executor: Executor<u32, u32, u32> = Arc::new(|_: u32, items: Vec<u32>| {
            async move { items.into_iter().take(2).collect::<Vec<u32>>() }.boxed()
        });
        let coalescer = Coalescer::new(QUICK, executor);
        let results = join_all((0..4).map(|item| coalescer.submit(0, item))).await;
        assert_eq!(results, vec![Some(0), Some(1), None, None]);
    }

    #[tokio::test]
    async fn a_panicking_executor_answers_none() {
        let executor: Executor<u32, u32, u32> =
            Arc::new(|_: u32, _: Vec<u32>| -> BoxFuture<'static, Vec<u32>> { panic!("the executor failed") });
        let coalescer = Coalescer::new(QUICK, executor);
        let results = join_all((0..3).map(|item| coalescer.submit(0, item))).await;
        assert_eq!(results, vec![None, None, None]);
    }
}

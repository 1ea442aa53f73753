//! How much wall time kubesim's own work takes: its request handling, its watch streams and its
//! physics controllers. Benchmarks that run kubesim and its clients on one runtime read it to split
//! a run's wall time between the simulated cluster and the controllers under test.
//!
//! The meter adds the real time each piece of kubesim work spends inside a poll (or a call); time
//! spent waiting, virtual or real, is not counted. It never affects what kubesim does, so it may
//! read the real clock even on paused virtual time.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::task::JoinHandle;

/// The shared meter. Cheap to clone; clones add to the same total.
#[derive(Debug, Clone, Default)]
pub struct Busy(Arc<AtomicU64>);

impl Busy {
    /// The time counted so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Runs `work`, counting its time.
    pub fn time<T>(&self, work: impl FnOnce() -> T) -> T {
        #[allow(clippy::disallowed_types)] // Measures real work; never read for behaviour.
        let start = std::time::Instant::now();
        let result = work();
        self.add(start.elapsed());
        result
    }

    /// Spawns `future` on the current runtime, counting the time of each of its polls.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(Timed {
            future: Box::pin(future),
            busy: self.clone(),
        })
    }

    fn add(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// A future whose polls are counted.
struct Timed<F> {
    future: Pin<Box<F>>,
    busy: Busy,
}

impl<F: Future> Future for Timed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.busy.time(|| this.future.as_mut().poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_work_inside_polls_and_not_the_waits_between_them() {
        let busy = Busy::default();
        let task = busy.spawn(async {
            for _ in 0..3 {
                // Ten real milliseconds of work, then a virtual minute of waiting.
                std::thread::sleep(Duration::from_millis(10));
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        });
        task.await.unwrap_or_else(|e| panic!("{e}"));
        let total = busy.total();
        assert!(total >= Duration::from_millis(30), "{total:?}");
        assert!(total < Duration::from_secs(60), "{total:?}");
        busy.time(|| std::thread::sleep(Duration::from_millis(5)));
        assert!(busy.total() >= total + Duration::from_millis(5));
    }
}

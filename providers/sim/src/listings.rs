//! One reading of the KWOK cloud's instances back from their Nodes at a time, shared by the
//! lookups that missed while it was pending.
//!
//! A lookup the books cannot answer (an instance another replica launched, or this controller
//! before it restarted) lists every KWOK Node to read the instances back. When hundreds of
//! NodeClaims launch or terminate together, hundreds of lookups miss at once, and each listing of
//! its own held a copy of every Node in the controller at the same moment: at 500 nodes that was
//! most of its peak memory. Here a lookup that missed waits for the listing in flight and, when
//! one began after its miss, takes that listing's outcome instead of listing again: a listing
//! begun after the miss was served after it, so it saw every Node the miss could have wanted.
//!
//! A listing that fails fails every lookup that shares it. One whose caller was dropped before it
//! ended leaves no outcome, and the next lookup lists again.

use std::{
    future::Future,
    sync::atomic::{AtomicU64, Ordering},
};

use joist_provider::CloudError;
use tokio::sync::Mutex;

/// The listings of one cloud (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Listings {
    /// Listings begun so far; a lookup reads it when it misses.
    begun: AtomicU64,
    /// Held while a listing is in flight; the outcome of the last one begun, once it ended.
    last: Mutex<Option<Result<(), CloudError>>>,
}

impl Listings {
    /// Runs `list` unless a listing begun after this call's start ends first, whose outcome is
    /// then this call's.
    pub(crate) async fn shared<F>(&self, list: impl FnOnce() -> F) -> Result<(), CloudError>
    where
        F: Future<Output = Result<(), CloudError>>,
    {
        let missed_at = self.begun.load(Ordering::Acquire);
        let mut last = self.last.lock().await;
        if self.begun.load(Ordering::Acquire) > missed_at
            && let Some(outcome) = last.as_ref()
        {
            return outcome.clone();
        }
        // Cleared before the count moves, so a listing dropped half-way is never taken for one
        // that ended.
        *last = None;
        self.begun.fetch_add(1, Ordering::AcqRel);
        let outcome = list().await;
        *last = Some(outcome.clone());
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };

    use joist_provider::CloudError;

    use super::Listings;

    /// A listing that takes a second and counts itself in `made`, failing when `fail` says so.
    async fn listing(made: Arc<AtomicUsize>, fail: bool) -> Result<(), CloudError> {
        made.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if fail {
            return Err(CloudError::Transient {
                message: "listing the KWOK nodes: connection refused".to_owned(),
            });
        }
        Ok(())
    }

    /// `lookups` lookups missing together, their outcomes and the listings they made.
    async fn missing_together(lookups: usize, fail: bool) -> (Vec<Result<(), CloudError>>, usize) {
        let listings = Arc::new(Listings::default());
        let made = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..lookups)
            .map(|_| {
                let (listings, made) = (listings.clone(), made.clone());
                tokio::spawn(async move { listings.shared(|| listing(made, fail)).await })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap_or_else(|e| panic!("{e}")));
        }
        (outcomes, made.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_that_miss_together_share_at_most_two_listings() {
        let (outcomes, made) = missing_together(200, false).await;
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        // The first lists at once; those that missed after it began wait for one more.
        assert!((1..=2).contains(&made), "{made} listings for 200 lookups");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_listing_fails_every_lookup_that_shared_it() {
        let (outcomes, made) = missing_together(50, true).await;
        assert!(made <= 2, "{made} listings for 50 lookups");
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Err(CloudError::Transient { message }) if message.contains("connection refused"))),
            "{outcomes:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_after_a_listing_ended_lists_again() {
        let listings = Listings::default();
        let made = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let outcome = listings.shared(|| listing(made.clone(), false)).await;
            assert!(outcome.is_ok(), "{outcome:?}");
        }
        assert_eq!(
            made.load(Ordering::SeqCst),
            3,
            "a listing that ended before a miss cannot answer it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_dropped_half_way_answers_no_one() {
        let listings = Arc::new(Listings::default());
        let made = Arc::new(AtomicUsize::new(0));
        // A lookup after `at` ms; the listing in flight ends at 1 s.
        let lookup = |at: u64| {
            let (listings, made) = (listings.clone(), made.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(at)).await;
                listings.shared(|| listing(made, false)).await
            })
        };
        let first = lookup(0);
        // Both miss while the first listing is in flight; the earlier one lists next, and is
        // dropped before its listing ends.
        let dropped = lookup(100);
        let waiting = lookup(200);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        dropped.abort();
        for task in [first, waiting] {
            let outcome = task.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(outcome.is_ok(), "{outcome:?}");
        }
        // The first listing began before the waiting lookup missed, and the one begun after it
        // never ended: the waiting lookup listed for itself.
        assert_eq!(made.load(Ordering::SeqCst), 3);
    }
}

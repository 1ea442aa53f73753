//! The runaway guard: a launch circuit breaker per NodePool.
//!
//! A NodeClaim deleted because its launch failed (every offering out of capacity, no launch within
//! the launch timeout, no Node within the registration timeout, a Node never Ready) counts against its NodePool; a
//! launch that works clears the count. After [`TRIP_AFTER`] failures in a row the breaker opens:
//! the provisioner leaves the NodePool out of its passes for a pause that doubles with each trip
//! in a row ([`FIRST_PAUSE`] up to [`MAX_PAUSE`]), pods left unschedulable meanwhile say so in
//! their `FailedScheduling` event, and the NodePool gets a `LaunchesPaused` warning. Once the pause is
//! over one more pass may launch; if that launch fails too the breaker opens again at once, for
//! twice as long. So a cloud that refuses everything, or instances that never join, cost a few
//! launches an hour instead of one every batch.
//!
//! The breakers live in memory: a restart closes them, and the first failures open them again.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use crate::decide::timing::doubling_backoff;

/// Failed launches in a row that open a NodePool's breaker.
pub const TRIP_AFTER: u32 = 3;
/// The first pause.
pub const FIRST_PAUSE: Duration = Duration::from_secs(60);
/// The longest pause.
pub const MAX_PAUSE: Duration = Duration::from_secs(15 * 60);

/// One NodePool's breaker.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    trips: u32,
    open_until: Option<Instant>,
    last_failure: String,
}

/// Why a NodePool's launches are paused, and for how long still.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    /// What is left of the pause.
    pub left: Duration,
    /// Failed launches in a row.
    pub failures: u32,
    /// The last failure (`RegistrationTimeout: the node did not register in time`).
    pub last_failure: String,
}

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "launches paused for {}s after {} failed launches in a row (last: {})",
            self.left.as_secs(),
            self.failures,
            self.last_failure
        )
    }
}

/// Every NodePool's breaker (see the module docs).
#[derive(Debug, Default)]
pub struct Breakers(Mutex<HashMap<String, Breaker>>);

impl Breakers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Breaker>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a failed launch of `pool`; the pause it starts when it opens the breaker.
    pub fn failed(&self, pool: &str, failure: String) -> Option<Paused> {
        let now = Instant::now();
        let mut breakers = self.lock();
        let breaker = breakers.entry(pool.to_owned()).or_default();
        breaker.failures = breaker.failures.saturating_add(1);
        breaker.last_failure = failure;
        let open = breaker.open_until.is_some_and(|until| until > now);
        if breaker.failures < TRIP_AFTER || open {
            return None;
        }
        breaker.trips = breaker.trips.saturating_add(1);
        let pause = doubling_backoff(FIRST_PAUSE, breaker.trips, MAX_PAUSE);
        breaker.open_until = Some(now + pause);
        Some(Paused {
            left: pause,
            failures: breaker.failures,
            last_failure: breaker.last_failure.clone(),
        })
    }

    /// A launch of `pool` worked: its breaker closes.
    pub fn succeeded(&self, pool: &str) {
        self.lock().remove(pool);
    }

    /// Whether `pool`'s launches are paused now, and why.
    pub fn paused(&self, pool: &str) -> Option<Paused> {
        let now = Instant::now();
        let breakers = self.lock();
        let breaker = breakers.get(pool)?;
        let until = breaker.open_until.filter(|until| *until > now)?;
        Some(Paused {
            left: until - now,
            failures: breaker.failures,
            last_failure: breaker.last_failure.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_open_the_breaker_for_a_pause_that_doubles_until_a_launch_works() {
        let breakers = Breakers::default();
        let fail = || breakers.failed("default", "LaunchTimeout: late".to_owned());
        assert_eq!((fail(), fail()), (None, None));
        assert_eq!(breakers.paused("default"), None);
        let opened = fail().map(|p| p.left);
        assert_eq!(opened, Some(FIRST_PAUSE));
        assert!(
            breakers
                .paused("default")
                .is_some_and(|p| p.to_string().contains("after 3 failed launches"))
        );
        assert_eq!(breakers.paused("other"), None, "breakers are per NodePool");
        // A claim already in flight failing during the pause does not lengthen it.
        assert_eq!(fail(), None);
        tokio::time::advance(FIRST_PAUSE).await;
        assert_eq!(
            breakers.paused("default"),
            None,
            "the pause is over: one more pass may launch"
        );
        assert_eq!(
            fail().map(|p| p.left),
            Some(2 * FIRST_PAUSE),
            "that launch failed too"
        );
        tokio::time::advance(2 * FIRST_PAUSE).await;
        breakers.succeeded("default");
        assert_eq!(
            (fail(), fail()),
            (None, None),
            "a launch that works starts the count again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_pause_is_capped() {
        let breakers = Breakers::default();
        let mut last = None;
        for _ in 0..40 {
            if let Some(paused) = breakers.failed("default", "InsufficientCapacityError: none".to_owned()) {
                last = Some(paused.left);
            }
            tokio::time::advance(MAX_PAUSE).await;
        }
        assert_eq!(last, Some(MAX_PAUSE));
    }
}

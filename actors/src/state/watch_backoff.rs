//! How long a watch waits before it lists again after an error (a 410 Gone when it fell behind the
//! API server's history, a dropped connection): kube-runtime's default schedule, 0.8 s doubling to
//! 30 s and starting over after 2 minutes without an error, with jitter so that watches that fail
//! together do not come back together.
//!
//! The jitter is random in production. A simulation draws it from its seed instead: a relist then
//! comes at the same moment of virtual time in every run of a seed, where random jitter made large
//! simulated runs differ from one run to the next.

use std::time::Duration;

use kube::runtime::utils::{Backoff, ResetTimerBackoff};

/// The first wait after an error.
pub const FIRST: Duration = Duration::from_millis(800);
/// The longest wait.
pub const LONGEST: Duration = Duration::from_secs(30);
/// How long without an error before the waits start over from [`FIRST`].
pub const RESET_AFTER: Duration = Duration::from_secs(120);

/// The backoff of one watch: jitter from `seed` when given, random otherwise.
pub fn watch_backoff(seed: Option<u64>) -> ResetTimerBackoff<Jittered> {
    ResetTimerBackoff::new(Jittered::new(seed), RESET_AFTER)
}

/// Exponential waits with jitter; see the module docs.
pub struct Jittered {
    builder: backon::ExponentialBuilder,
    waits: backon::ExponentialBackoff,
}

impl Jittered {
    fn new(seed: Option<u64>) -> Self {
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(FIRST)
            .with_max_delay(LONGEST)
            .with_factor(2.0)
            .without_max_times()
            .with_jitter();
        let builder = match seed {
            Some(seed) => builder.with_jitter_seed(seed),
            None => builder,
        };
        Self {
            waits: backon::BackoffBuilder::build(builder),
            builder,
        }
    }
}

impl Iterator for Jittered {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.waits.next()
    }
}

impl Backoff for Jittered {
    fn reset(&mut self) {
        self.waits = backon::BackoffBuilder::build(self.builder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(seed: Option<u64>) -> Vec<Duration> {
        let mut backoff = Jittered::new(seed);
        (0..8)
            .map(|_| backoff.next().expect("a watch always retries"))
            .collect()
    }

    #[test]
    fn a_seed_gives_the_same_waits_every_time() {
        assert_eq!(waits(Some(7)), waits(Some(7)));
        assert_ne!(waits(Some(7)), waits(Some(8)), "the jitter follows the seed");
    }

    #[test]
    fn waits_double_from_the_first_to_the_longest_with_jitter_on_top() {
        let waits = waits(Some(7));
        assert!(waits[0] >= FIRST && waits[0] < FIRST * 2, "{waits:?}");
        assert!(waits[3] >= FIRST * 8, "{waits:?}");
        assert!(waits.iter().all(|wait| *wait <= LONGEST * 2), "{waits:?}");
    }
}

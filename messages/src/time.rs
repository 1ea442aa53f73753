//! The clock of the simulated world and of the controllers: wall-clock timestamps
//! (creationTimestamp, conditions, events) read from `tokio::time`, so a simulation on paused
//! virtual time stamps objects deterministically and production follows the system clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Seconds since the Unix epoch, counted from a fixed start on tokio's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch_seconds: i64,
    started: Instant,
}

impl Clock {
    /// A clock that reads `epoch_seconds` now and advances with tokio's (possibly paused) time.
    pub fn starting_at(epoch_seconds: i64) -> Self {
        Self {
            epoch_seconds,
            started: Instant::now(),
        }
    }

    /// A clock that follows the system's wall clock.
    pub fn system() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX));
        Self::starting_at(now)
    }

    /// Seconds since the Unix epoch.
    pub fn now_seconds(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_secs()).unwrap_or(i64::MAX);
        self.epoch_seconds.saturating_add(elapsed)
    }

    /// Now, to the nanosecond, for span timestamps.
    pub fn now_system(&self) -> SystemTime {
        system_time(self.epoch_seconds) + self.started.elapsed()
    }

    /// Now, as the RFC 3339 timestamp Kubernetes writes (`2026-11-21T10:00:00Z`).
    pub fn now_rfc3339(&self) -> String {
        rfc3339(self.now_seconds())
    }
}

/// An epoch second as a [`SystemTime`] (times before 1970 are clamped to the epoch).
pub fn system_time(seconds: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// An epoch second as the RFC 3339 timestamp Kubernetes writes.
pub fn rfc3339(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map_or_else(|_| "1970-01-01T00:00:00Z".to_owned(), |t| t.to_string())
}

/// Parses a Kubernetes timestamp back to epoch seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    text.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_in_the_format_kubernetes_writes() {
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40Z"), Some(1_795_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_advances_with_paused_tokio_time() {
        let clock = Clock::starting_at(100);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now_seconds(), 190);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let since_epoch = clock.now_system().duration_since(UNIX_EPOCH).unwrap_or_default();
        assert_eq!(since_epoch, Duration::from_millis(190_250));
    }
}

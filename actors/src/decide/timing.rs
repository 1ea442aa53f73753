//! Karpenter's fixed durations: how long a NodeClaim may take to launch, register and
//! initialize, how long an offering out of capacity is skipped, how long a drain waits at least,
//! how long a node counted on for pods is nominated, and the doubling backoff every retry in the
//! controllers uses.

use std::time::Duration;

/// A NodeClaim not launched within this long is deleted (Karpenter's `LaunchTimeout`).
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// A launched NodeClaim whose Node has not registered within this long is deleted.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// A registered NodeClaim whose Node has not reported Ready within this long is deleted.
pub const INITIALIZATION_TIMEOUT: Duration = REGISTRATION_TIMEOUT;
/// Offerings that ran out of capacity are skipped for this long.
pub const UNAVAILABLE_OFFERING_TTL: Duration = Duration::from_secs(3 * 60);
/// Instance types per NodePool are listed again after this long.
pub const INSTANCE_TYPES_TTL: Duration = Duration::from_secs(5 * 60);
/// Draining waits at least this long after tainting, for pods bound before the taint was seen.
pub const MINIMUM_DRAIN_TIME: Duration = Duration::from_secs(5);
/// A drain evicts a tier's pods largest first, their sizes ranked among the pods of every node
/// being drained, one size at a time this far apart, for the first [`MINIMUM_DRAIN_TIME`] of its
/// evictions (Joist's own: Karpenter evicts a tier at once).
pub const EVICTION_WAVE_GAP: Duration = Duration::from_secs(2);
/// The longest a drain holds its evictions until a provisioning pass has counted the node's pods
/// (Joist's own: Karpenter evicts at once and provisions alongside).
pub const PROVISIONING_WAIT: Duration = Duration::from_secs(30);
/// An instance with no NodeClaim is terminated once it is older than this.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// How long a node a provisioning pass counted on for pods is no disruption candidate
/// (Karpenter's nomination window): two batches of at most `batch_max`, and at least 10 s. The
/// pods get there within it, or the next pass counts on the node again.
pub fn nomination_window(batch_max: Duration) -> Duration {
    batch_max.saturating_mul(2).max(Duration::from_secs(10))
}

/// A retry wait that doubles with each failure in a row: `first` after the first, up to `max`.
pub fn doubling_backoff(first: Duration, failures: u32, max: Duration) -> Duration {
    first
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(max)
}

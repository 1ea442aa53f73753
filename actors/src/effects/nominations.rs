//! The `Nominated` event a pod gets when a provisioning pass counts on a node for it, as Karpenter
//! writes it: `Pod should schedule on: nodeclaim/NAME` for a NodeClaim launched for it or still
//! launching, `…: nodeclaim/NAME, node/NODE` for a registered node. How such a message is read
//! back ([`targets`]): `joist explain node` names the pods a node was launched for from these
//! events (those that name its NodeClaim without a Node).
//!
//! Karpenter tells a pod at most once in its de-duplication window, whatever the message names,
//! and limits these events across all pods to [`PER_SECOND`] in bursts of [`BURST`], so a batch
//! of 10,000 pods costs the API server a burst's worth; [`Limit`] is that token bucket, on tokio's
//! clock (virtual in the simulator). An event over the limit is dropped: it is a hint, never part
//! of the launch.

use tokio::time::Instant;

/// The event's reason.
pub const REASON: &str = "Nominated";

/// What every message starts with.
const PREFIX: &str = "Pod should schedule on: ";

/// Nominations told per second, across all pods (Karpenter's `PodNominationRateLimiter`).
pub const PER_SECOND: f64 = 5.0;

/// Nominations that may be told at once after a quiet spell.
pub const BURST: f64 = 10.0;

/// Where a pod should schedule: a NodeClaim, its Node, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The NodeClaim, when known.
    pub claim: Option<&'a str>,
    /// The Node, once registered.
    pub node: Option<&'a str>,
}

/// The message telling a pod it should schedule on `target`, as Karpenter words it.
pub fn message(target: Target<'_>) -> String {
    let named: Vec<String> = (target.claim.map(|c| format!("nodeclaim/{c}")).into_iter())
        .chain(target.node.map(|n| format!("node/{n}")))
        .collect();
    format!("{PREFIX}{}", named.join(", "))
}

/// The objects a `Nominated` message names (`nodeclaim/NAME`, `node/NAME`); none for any other
/// message.
pub fn targets(message: &str) -> impl Iterator<Item = &str> {
    message
        .strip_prefix(PREFIX)
        .into_iter()
        .flat_map(|named| named.split(", "))
}

/// See the module docs.
#[derive(Debug)]
pub struct Limit {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for Limit {
    fn default() -> Self {
        Self {
            tokens: BURST,
            at: None,
        }
    }
}

impl Limit {
    /// Whether one more nomination may be told at `now` (and counts it when it may).
    pub fn take(&mut self, now: Instant) -> bool {
        if !self.available(now) {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// Whether one more nomination may be told at `now`, without counting it.
    pub fn available(&mut self, now: Instant) -> bool {
        if let Some(at) = self.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * PER_SECOND;
            self.tokens = (self.tokens + refill).min(BURST);
        }
        self.at = Some(now);
        self.tokens >= 1.0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_message_names_its_claim_and_reads_back() {
        let launched = Target {
            claim: Some("default-abc12"),
            node: None,
        };
        let said = message(launched);
        assert_eq!(said, "Pod should schedule on: nodeclaim/default-abc12");
        assert_eq!(targets(&said).collect::<Vec<_>>(), ["nodeclaim/default-abc12"]);
        let registered = Target {
            claim: Some("c"),
            node: Some("n"),
        };
        assert_eq!(
            targets(&message(registered)).collect::<Vec<_>>(),
            ["nodeclaim/c", "node/n"],
            "Karpenter names both when both are known"
        );
        assert_eq!(targets("Failed to schedule pod").count(), 0);
    }

    #[test]
    fn a_burst_passes_then_five_a_second() {
        let start = Instant::now();
        let mut limit = Limit::default();
        let told = (0..100).filter(|_| limit.take(start)).count();
        assert_eq!(told, 10, "one burst at once");
        let second = start + Duration::from_secs(1);
        let told = (0..100).filter(|_| limit.take(second)).count();
        assert_eq!(told, 5, "then five a second");
        let later = second + Duration::from_secs(60);
        let told = (0..100).filter(|_| limit.take(later)).count();
        assert_eq!(told, 10, "a quiet minute refills no more than a burst");
    }
}

//! client-go's event correlator, which every Event Karpenter records goes through (its recorder
//! writes core/v1 Events through client-go's broadcaster), so a controller that reports the same
//! thing over and over grows a count on one Event instead of the API server's store:
//!
//! - **Aggregation**: events about one object with the same type and reason but
//!   [`AGGREGATE_MAX_MESSAGES`] different messages within [`AGGREGATE_INTERVAL`] become one Event
//!   whose message is `(combined from similar events): ` and the latest message.
//! - **Counting**: an event seen before (same object, type, reason and message; or the same
//!   aggregate) is written as a patch of the Event first written for it: its `count` grows by one,
//!   its `lastTimestamp` and message are the latest, its `firstTimestamp` stays.
//! - **Spam filter**: each object may have [`SPAM_BURST`] events, refilled at one per
//!   [`SPAM_REFILL`]; events beyond that are dropped (and still counted for the next write).
//!
//! client-go bounds each of its three caches to 4,096 entries (least recently used first); these
//! are bounded by time instead, so a cluster with more objects than that still gets counts: an
//! Event not seen for [`FORGET_AFTER`] (kube-apiserver's default Event TTL) is forgotten, and its
//! next occurrence is a new Event. A patch of an Event the API server no longer has is written as
//! a create by the caller. Nothing here fails.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use tokio::time::Instant;

/// Different messages about one object and reason after which they are aggregated (client-go's
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_MESSAGES: usize = 10;

/// How recent the previous similar event must be to count towards aggregation (client-go's
/// `defaultAggregateIntervalInSeconds`).
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);

/// Events an object may have at once before the spam filter drops them (`defaultSpamBurst`).
pub const SPAM_BURST: f64 = 25.0;

/// How often the spam filter gives an object back one event (`defaultSpamQPS`, 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);

/// How long an Event is remembered for counting after it was last seen: kube-apiserver's
/// default `--event-ttl`, after which the Event itself is gone.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The prefix of an aggregated event's message.
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";

/// One event to record.
#[derive(Debug, Clone, Copy)]
pub struct Occurrence<'a> {
    /// What identifies the object the event is about (kind, namespace, name, UID).
    pub object: &'a str,
    /// `Normal` or `Warning`.
    pub kind: &'a str,
    /// The reason.
    pub reason: &'a str,
    /// The message.
    pub message: &'a str,
}

/// How to write an event that passed the correlator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Correlated {
    /// The Event's name: a new one, or the one first written for this event.
    pub name: String,
    /// The message to write (the aggregate's, for an aggregated event).
    pub message: String,
    /// The count the Event has with this occurrence.
    pub count: i32,
    /// The tokio instant the Event was first seen, for its `firstTimestamp`.
    pub first_seen: Instant,
    /// Whether the Event was written before: patch it rather than create it.
    pub existing: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Correlator {
    /// Events written, by the key that makes two the same.
    logged: HashMap<String, Logged>,
    /// Messages seen per object, type and reason, for aggregation.
    similar: HashMap<String, Similar>,
    /// Spam filter buckets, per object.
    buckets: HashMap<String, Bucket>,
    /// The size of the three maps at which expired entries are next pruned.
    prune_at: usize,
    /// The last timestamp used in a new Event's name, so two names are never the same.
    last_stamp: u128,
}

#[derive(Debug)]
struct Logged {
    name: String,
    count: i32,
    first_seen: Instant,
    last_seen: Instant,
}

#[derive(Debug)]
struct Similar {
    messages: HashSet<String>,
    last_seen: Instant,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// The tokens the bucket holds `now`, refilled since it was last taken from (unbounded).
    fn tokens_at(&self, now: Instant) -> f64 {
        self.tokens + now.saturating_duration_since(self.at).as_secs_f64() / SPAM_REFILL.as_secs_f64()
    }
}

/// The least number of entries before a prune is worth its scan.
const PRUNE_FLOOR: usize = 1024;

impl Correlator {
    /// Correlates one occurrence seen `now`: how to write it, or `None` when the spam filter drops
    /// it. `object_name` and `stamp_nanos` (the wall clock in nanoseconds) name a new Event as
    /// client-go does: `<object name>.<nanoseconds in hex>`.
    pub fn correlate(
        &mut self,
        event: Occurrence<'_>,
        object_name: &str,
        now: Instant,
        stamp_nanos: u128,
    ) -> Option<Correlated> {
        self.prune(now);
        let group = format!("{}\u{0}{}\u{0}{}", event.object, event.kind, event.reason);
        let (key, message) = match self.aggregated(&group, event.message, now) {
            true => (group, format!("{AGGREGATE_PREFIX}{}", event.message)),
            false => (format!("{group}\u{0}{}", event.message), event.message.to_owned()),
        };
        if self
            .logged
            .get(&key)
            .is_some_and(|l| now.saturating_duration_since(l.last_seen) >= FORGET_AFTER)
        {
            self.logged.remove(&key);
        }
        let correlated = match self.logged.get_mut(&key) {
            Some(logged) => {
                logged.count = logged.count.saturating_add(1);
                logged.last_seen = now;
                Correlated {
                    name: logged.name.clone(),
                    message,
                    count: logged.count,
                    first_seen: logged.first_seen,
                    existing: true,
                }
            }
            None => {
                self.last_stamp = stamp_nanos.max(self.last_stamp + 1);
                let name = format!("{object_name}.{:x}", self.last_stamp);
                let logged = Logged {
                    name: name.clone(),
                    count: 1,
                    first_seen: now,
                    last_seen: now,
                };
                self.logged.insert(key, logged);
                Correlated {
                    name,
                    message,
                    count: 1,
                    first_seen: now,
                    existing: false,
                }
            }
        };
        self.admitted(event.object, now).then_some(correlated)
    }

    /// Notes `message` among the similar events of `group`; whether they are now aggregated.
    fn aggregated(&mut self, group: &str, message: &str, now: Instant) -> bool {
        let similar = self.similar.entry(group.to_owned()).or_insert_with(|| Similar {
            messages: HashSet::new(),
            last_seen: now,
        });
        if now.saturating_duration_since(similar.last_seen) > AGGREGATE_INTERVAL {
            similar.messages.clear();
        }
        similar.last_seen = now;
        similar.messages.insert(message.to_owned());
        if similar.messages.len() < AGGREGATE_MAX_MESSAGES {
            return false;
        }
        // Kept one short of the limit, as client-go's set is, so every later message aggregates.
        let any = similar.messages.iter().next().cloned();
        if let Some(any) = any {
            similar.messages.remove(&any);
        }
        true
    }

    /// Whether the spam filter lets one more event about `object` through (and takes its token).
    fn admitted(&mut self, object: &str, now: Instant) -> bool {
        let bucket = self.buckets.entry(object.to_owned()).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        bucket.tokens = bucket.tokens_at(now).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }

    /// Drops what no longer changes an outcome, once the maps have doubled since the last prune:
    /// Events not seen for [`FORGET_AFTER`], similar sets older than [`AGGREGATE_INTERVAL`] and
    /// buckets that have refilled. Amortised constant time per event.
    fn prune(&mut self, now: Instant) {
        let size = self.logged.len() + self.similar.len() + self.buckets.len();
        if size < self.prune_at.max(PRUNE_FLOOR) {
            return;
        }
        let age = |at: Instant| now.saturating_duration_since(at);
        self.logged.retain(|_, l| age(l.last_seen) < FORGET_AFTER);
        self.similar.retain(|_, s| age(s.last_seen) <= AGGREGATE_INTERVAL);
        self.buckets.retain(|_, b| b.tokens_at(now) < SPAM_BURST);
        self.prune_at = 2 * (self.logged.len() + self.similar.len() + self.buckets.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occurrence<'a>(object: &'a str, reason: &'a str, message: &'a str) -> Occurrence<'a> {
        Occurrence {
            object,
            kind: "Warning",
            reason,
            message,
        }
    }

    fn correlate(correlator: &mut Correlator, event: Occurrence<'_>, now: Instant) -> Option<Correlated> {
        correlator.correlate(event, "node-a", now, 0x1000)
    }

    #[test]
    fn a_repeated_event_counts_on_the_event_first_written() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        let first = correlate(
            &mut correlator,
            occurrence("node/a", "DisruptionBlocked", "pdb"),
            start,
        )
        .expect("the first event passes");
        assert!(!first.existing);
        assert_eq!((first.name.as_str(), first.count), ("node-a.1000", 1));
        let later = start + Duration::from_secs(180);
        let second = correlate(
            &mut correlator,
            occurrence("node/a", "DisruptionBlocked", "pdb"),
            later,
        )
        .expect("the repeat passes");
        assert_eq!(
            second,
            Correlated {
                name: "node-a.1000".to_owned(),
                message: "pdb".to_owned(),
                count: 2,
                first_seen: start,
                existing: true,
            }
        );
        let other = correlate(
            &mut correlator,
            occurrence("node/b", "DisruptionBlocked", "pdb"),
            later,
        )
        .expect("another object's event passes");
        assert!(!other.existing, "another object's event is an Event of its own");
        assert_ne!(
            other.name, first.name,
            "two Events named at one instant get two names"
        );
    }

    #[test]
    fn ten_messages_of_one_reason_within_ten_minutes_are_combined() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        let messages: Vec<String> = (0..12).map(|i| format!("0/{i} nodes are available")).collect();
        let outcomes: Vec<Correlated> = messages
            .iter()
            .enumerate()
            .map(|(i, message)| {
                let at = start + Duration::from_secs(30 * i as u64);
                correlate(
                    &mut correlator,
                    occurrence("pod/p", "FailedScheduling", message),
                    at,
                )
                .expect("within the spam burst")
            })
            .collect();
        assert!(
            outcomes[..9]
                .iter()
                .all(|o| !o.existing && !o.message.starts_with(AGGREGATE_PREFIX))
        );
        let combined = &outcomes[9];
        assert!(!combined.existing, "the tenth message starts the combined Event");
        assert_eq!(
            combined.message,
            format!("{AGGREGATE_PREFIX}0/9 nodes are available")
        );
        assert_eq!(
            (
                outcomes[11].name.as_str(),
                outcomes[11].count,
                outcomes[11].existing
            ),
            (combined.name.as_str(), 3, true),
            "later messages count on the combined Event"
        );
        let quiet = start + Duration::from_secs(330) + AGGREGATE_INTERVAL + Duration::from_secs(1);
        let fresh = correlate(
            &mut correlator,
            occurrence("pod/p", "FailedScheduling", "new"),
            quiet,
        )
        .expect("within the spam burst");
        assert_eq!(
            fresh.message, "new",
            "ten quiet minutes start the count of messages over"
        );
    }

    #[test]
    fn an_object_gets_twenty_five_events_then_one_per_five_minutes() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        let reasons: Vec<String> = (0..27).map(|i| format!("Reason{i}")).collect();
        let passed = reasons
            .iter()
            .filter(|reason| correlate(&mut correlator, occurrence("node/a", reason, "m"), start).is_some())
            .count();
        assert_eq!(passed, 25);
        let soon = start + SPAM_REFILL - Duration::from_secs(1);
        assert!(correlate(&mut correlator, occurrence("node/a", "Late", "m"), soon).is_none());
        let refilled = start + SPAM_REFILL + Duration::from_secs(1);
        let next = correlate(&mut correlator, occurrence("node/a", "Reason25", "m"), refilled)
            .expect("a token back after five minutes");
        assert_eq!(
            (next.count, next.existing),
            (2, true),
            "a dropped event still counts: the next write carries it (a create if it was never written)"
        );
        assert!(
            correlate(&mut correlator, occurrence("node/b", "Reason0", "m"), refilled).is_some(),
            "each object has its own bucket"
        );
    }

    #[test]
    fn an_event_unseen_for_an_hour_is_written_anew() {
        let mut correlator = Correlator::default();
        let start = Instant::now();
        correlate(&mut correlator, occurrence("node/a", "Blocked", "m"), start).expect("first");
        let late = start + FORGET_AFTER;
        let again = correlate(&mut correlator, occurrence("node/a", "Blocked", "m"), late).expect("passes");
        assert!(!again.existing, "an Event past its TTL is not patched");
        let objects: Vec<String> = (0..2 * PRUNE_FLOOR).map(|i| format!("node/{i}")).collect();
        for object in &objects {
            correlate(&mut correlator, occurrence(object, "Blocked", "m"), late).expect("fresh object");
        }
        let much_later = late + FORGET_AFTER;
        for object in &objects {
            correlate(&mut correlator, occurrence(object, "Other", "m"), much_later);
        }
        assert!(
            correlator.logged.len() < 3 * PRUNE_FLOOR,
            "Events past their TTL are pruned as new ones come: {} kept",
            correlator.logged.len()
        );
    }
}

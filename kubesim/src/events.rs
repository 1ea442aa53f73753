//! Kubernetes Events (core/v1) recorded by kubesim's components, as `kubectl describe` and
//! `kubectl get events` show them. Recording never fails the action it reports: a rejected Event is
//! logged and dropped.
//!
//! Repeats make a series, as kube-scheduler's recorder (client-go's events.k8s.io broadcaster)
//! makes them: an event about the same object with the same reason from the same component, within
//! [`SERIES_FINISH`] of the last one, whatever its message, counts on the Event first written
//! (`count`, `lastTimestamp`; the message stays the first one's) instead of adding an Event. One
//! difference: client-go writes the second occurrence at once and later counts every 30 minutes
//! or when the series ends; kubesim writes every count at once.

use std::{collections::HashMap, time::Duration};

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    resources::GroupResource,
    store::{ObjectKey, Part, Store},
};

/// How long after its last occurrence a series ends (client-go's `finishTime`, 6 minutes); the
/// next occurrence starts a new Event.
pub const SERIES_FINISH: Duration = Duration::from_secs(360);

/// The least number of open series before a prune is worth its scan.
const PRUNE_FLOOR: usize = 1024;

/// What an Event says, and who says it.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// `Normal` or `Warning`.
    pub kind: &'a str,
    /// The reason (`FailedScheduling`).
    pub reason: &'a str,
    /// The message.
    pub message: &'a str,
    /// The component reporting (`default-scheduler`).
    pub component: &'a str,
}

/// One component's recorder: the series it has open (see the module docs).
#[derive(Debug, Default)]
pub struct Recorder {
    /// Open series by object, reason and component.
    open: HashMap<(String, String, String), Series>,
    /// The number of open series at which ended ones are next pruned.
    prune_at: usize,
}

#[derive(Debug)]
struct Series {
    event: ObjectKey,
    count: u64,
    last_seen: Instant,
}

impl Recorder {
    /// Records an Event about `object` (in its namespace, or `default` for cluster-scoped objects),
    /// or counts it on the open series it belongs to.
    pub fn record(&mut self, store: &Store, object: &Value, report: Report<'_>) {
        let now = Instant::now();
        self.prune(now);
        let metadata = &object["metadata"];
        let identity = metadata["uid"]
            .as_str()
            .or_else(|| metadata["name"].as_str())
            .unwrap_or_default();
        let key = (
            identity.to_owned(),
            report.reason.to_owned(),
            report.component.to_owned(),
        );
        if let Some(series) = self
            .open
            .get_mut(&key)
            .filter(|s| now.saturating_duration_since(s.last_seen) < SERIES_FINISH)
        {
            series.count += 1;
            series.last_seen = now;
            if count(store, &series.event, series.count) {
                return;
            }
        }
        if let Some(event) = create(store, object, report) {
            let series = Series {
                event,
                count: 1,
                last_seen: now,
            };
            self.open.insert(key, series);
        }
    }

    /// Drops ended series once their number has doubled since the last prune.
    fn prune(&mut self, now: Instant) {
        if self.open.len() < self.prune_at.max(PRUNE_FLOOR) {
            return;
        }
        self.open
            .retain(|_, s| now.saturating_duration_since(s.last_seen) < SERIES_FINISH);
        self.prune_at = 2 * self.open.len();
    }
}

/// Writes `count` and the time onto the series' Event; false when the Event is gone.
fn count(store: &Store, event: &ObjectKey, count: u64) -> bool {
    let now = store.clock().now_rfc3339();
    let counted = store.modify(&events(), event, Part::Main, false, |current| {
        let mut next = current.clone();
        next["count"] = json!(count);
        next["lastTimestamp"] = json!(now);
        Ok(next)
    });
    counted.is_ok()
}

/// Creates a new Event; its key, unless the store refused it.
fn create(store: &Store, object: &Value, report: Report<'_>) -> Option<ObjectKey> {
    let Report {
        kind,
        reason,
        message,
        component,
    } = report;
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or_default();
    let namespace = metadata["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let now = store.clock().now_rfc3339();
    let event_name = format!("{name}.{}", store.random_suffix());
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": object["apiVersion"], "kind": object["kind"], "name": name,
            "namespace": metadata["namespace"], "uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"],
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    match store.create(&events(), namespace, event, false) {
        Ok(_) => Some(ObjectKey::new(namespace, &event_name)),
        Err(error) => {
            tracing::warn!(%error, reason, object = name, "kubesim: cannot record an event");
            None
        }
    }
}

fn events() -> GroupResource {
    GroupResource::new("", "events")
}

#[cfg(test)]
mod tests {
    use joist_messages::time::Clock;

    use super::*;

    fn failed_scheduling(store: &Store) -> Vec<Value> {
        let listed = store.list(&events(), Some("default"), None, None, |e| {
            e["reason"] == "FailedScheduling"
        });
        listed.items.iter().map(|e| e.as_ref().clone()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_count_on_one_event_until_the_series_ends() {
        let store = Store::new(Clock::starting_at(1_800_000_000), 7);
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "namespace": "default", "uid": "u-1"}});
        let mut recorder = Recorder::default();
        let record = |recorder: &mut Recorder, message: &str| {
            let report = Report {
                kind: "Warning",
                reason: "FailedScheduling",
                message,
                component: "default-scheduler",
            };
            recorder.record(&store, &pod, report)
        };
        record(&mut recorder, "0/1 nodes are available");
        tokio::time::advance(Duration::from_secs(60)).await;
        record(&mut recorder, "0/2 nodes are available");
        tokio::time::advance(Duration::from_secs(60)).await;
        record(&mut recorder, "0/3 nodes are available");
        let series = failed_scheduling(&store);
        assert_eq!(series.len(), 1, "one Event for the series: {series:?}");
        assert_eq!(series[0]["count"], 3);
        assert_eq!(
            series[0]["message"], "0/1 nodes are available",
            "a series keeps its first note"
        );
        assert_ne!(series[0]["lastTimestamp"], series[0]["firstTimestamp"]);

        tokio::time::advance(SERIES_FINISH).await;
        record(&mut recorder, "0/4 nodes are available");
        assert_eq!(
            failed_scheduling(&store).len(),
            2,
            "after six quiet minutes a new Event starts"
        );
    }
}

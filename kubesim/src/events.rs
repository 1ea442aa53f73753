//! Kubernetes Events (core/v1) recorded by kubesim's components, as `kubectl describe` and
//! `kubectl get events` show them. Recording never fails the action it reports: a rejected Event is
//! logged and dropped.
//!
//! Repeats make a series, as kube-scheduler's recorder (client-go's events.k8s.io broadcaster)
//! makes them: an event about the same object with the same reason from the same component, within
//! [`SERIES_FINISH`] of the last one, whatever its message, counts on the Event first written
//! (`count`, `lastTimestamp`; the message stays the first one's) instead of adding an Event. As in
//! client-go, the second occurrence is written at once and later ones are counted in memory: the
//! count is written when the series ends (looked at every [`SERIES_FINISH`]) and every
//! [`SERIES_REFRESH`] while it lasts. The owner calls [`Recorder::sweep`] by
//! [`Recorder::next_sweep`].

use std::{collections::HashMap, sync::Arc, time::Duration};

use joist_messages::time::rfc3339;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    resources::GroupResource,
    store::{ObjectKey, Store},
};

/// How long after its last occurrence a series ends (client-go's `finishTime`, 6 minutes); the
/// next occurrence starts a new Event. Also how often open series are looked at.
pub const SERIES_FINISH: Duration = Duration::from_secs(360);

/// How often the counts of series still going are written (client-go's `refreshTime`).
pub const SERIES_REFRESH: Duration = Duration::from_secs(1800);

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
    /// When open series are next looked at; none while there are none.
    next_sweep: Option<Instant>,
    /// When the counts of series still going are next written.
    next_refresh: Option<Instant>,
}

#[derive(Debug)]
struct Series {
    event: ObjectKey,
    /// The Event as created, held until the second occurrence is written, so that write does not
    /// parse it again from the store (most series have a second occurrence and no more; one that
    /// has none holds it until it ends).
    created: Option<Arc<Value>>,
    count: u64,
    /// The count the Event shows.
    written: u64,
    last_seen: Instant,
    /// When it was last seen, in epoch seconds (the Event's `lastTimestamp`).
    last_seen_at: i64,
}

impl Recorder {
    /// Records an Event about `object` (in its namespace, or `default` for cluster-scoped objects),
    /// or counts it on the open series it belongs to.
    pub fn record(&mut self, store: &Store, object: &Value, report: Report<'_>) {
        let now = Instant::now();
        self.sweep(store);
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
        if let Some(series) = self.open.get_mut(&key) {
            if now.saturating_duration_since(series.last_seen) < SERIES_FINISH {
                series.count += 1;
                series.last_seen = now;
                series.last_seen_at = store.clock().now_seconds();
                // Past the second, occurrences wait for the sweep (which closes the series if its
                // Event is gone by then).
                if series.count > 2 || series.write(store) {
                    return;
                }
            } else if series.count > series.written {
                // Ended before the sweep came: its count goes out before a new series starts.
                series.write(store);
            }
        }
        if let Some((event, created)) = create(store, object, report) {
            let series = Series {
                event,
                created: Some(created),
                count: 1,
                written: 1,
                last_seen: now,
                last_seen_at: store.clock().now_seconds(),
            };
            self.open.insert(key, series);
            self.next_sweep.get_or_insert(now + SERIES_FINISH);
            self.next_refresh.get_or_insert(now + SERIES_REFRESH);
        }
    }

    /// When [`Recorder::sweep`] has work next.
    pub fn next_sweep(&self) -> Option<Instant> {
        self.next_sweep
    }

    /// When due, writes the counts of the series that ended and closes them, and every
    /// [`SERIES_REFRESH`] the counts of those still going. A series whose Event is gone closes:
    /// its next occurrence starts a new Event.
    pub fn sweep(&mut self, store: &Store) {
        let now = Instant::now();
        if self.next_sweep.is_none_or(|at| now < at) {
            return;
        }
        let refresh = self.next_refresh.is_some_and(|at| now >= at);
        self.open.retain(|_, series| {
            let ended = now.saturating_duration_since(series.last_seen) >= SERIES_FINISH;
            let due = (ended || refresh) && series.count > series.written;
            let gone = due && !series.write(store);
            !ended && !gone
        });
        let open = !self.open.is_empty();
        self.next_sweep = open.then_some(now + SERIES_FINISH);
        if refresh || !open {
            self.next_refresh = open.then_some(now + SERIES_REFRESH);
        }
    }
}

impl Series {
    /// Writes the count and the time of the last occurrence onto the Event; false when it is
    /// gone.
    fn write(&mut self, store: &Store) -> bool {
        let seen = rfc3339(self.last_seen_at);
        let count = self.count;
        let written = store
            .edit(&events(), &self.event, self.created.take(), |_, event| {
                event["count"] = json!(count);
                event["lastTimestamp"] = json!(seen);
                Ok(true)
            })
            .is_ok();
        if written {
            self.written = count;
        }
        written
    }
}

/// Creates a new Event; its key and the Event as stored, unless the store refused it.
fn create(store: &Store, object: &Value, report: Report<'_>) -> Option<(ObjectKey, Arc<Value>)> {
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
        Ok(created) => Some((ObjectKey::new(namespace, &event_name), created)),
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

    /// A store, a pod (not stored: the recorder reads only its metadata) and a recorder.
    fn world() -> (Store, Value, Recorder) {
        let store = Store::new(Clock::starting_at(1_800_000_000), 7);
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "namespace": "default", "uid": "u-1"}});
        (store, pod, Recorder::default())
    }

    fn failed(message: &str) -> Report<'_> {
        Report {
            kind: "Warning",
            reason: "FailedScheduling",
            message,
            component: "default-scheduler",
        }
    }

    /// One occurrence, then a minute of virtual time, then the sweep its owner would run.
    async fn a_minute(recorder: &mut Recorder, store: &Store, pod: &Value, message: &str) {
        recorder.record(store, pod, failed(message));
        tokio::time::advance(Duration::from_secs(60)).await;
        recorder.sweep(store);
    }

    fn failed_scheduling(store: &Store) -> Vec<Value> {
        let listed = store.list(&events(), Some("default"), None, None, |e| {
            e["reason"] == "FailedScheduling"
        });
        listed.items.iter().map(|e| e.as_ref().clone()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_count_on_one_event_until_the_series_ends() {
        let (store, pod, mut recorder) = world();
        let record = |recorder: &mut Recorder, message: &str| recorder.record(&store, &pod, failed(message));
        record(&mut recorder, "0/1 nodes are available");
        tokio::time::advance(Duration::from_secs(60)).await;
        record(&mut recorder, "0/2 nodes are available");
        tokio::time::advance(Duration::from_secs(60)).await;
        record(&mut recorder, "0/3 nodes are available");
        let series = failed_scheduling(&store);
        assert_eq!(series.len(), 1, "one Event for the series: {series:?}");
        assert_eq!(
            series[0]["count"], 2,
            "the second occurrence is written at once, the third waits"
        );
        assert_eq!(
            series[0]["message"], "0/1 nodes are available",
            "a series keeps its first note"
        );
        let second = series[0]["lastTimestamp"].clone();
        assert_ne!(second, series[0]["firstTimestamp"]);

        // Nothing is written while the series goes on; the sweep after it ends writes its count.
        let third_at = store.clock().now_rfc3339();
        recorder.sweep(&store);
        assert_eq!(failed_scheduling(&store)[0]["count"], 2);
        let ends = recorder.next_sweep().expect("a series is open");
        tokio::time::advance(SERIES_FINISH).await;
        assert!(tokio::time::Instant::now() >= ends);
        recorder.sweep(&store);
        let ended = failed_scheduling(&store);
        assert_eq!(ended[0]["count"], 3);
        assert_eq!(
            ended[0]["lastTimestamp"],
            json!(third_at),
            "stamped when last seen"
        );
        assert_eq!(recorder.next_sweep(), None, "no series left open");

        record(&mut recorder, "0/4 nodes are available");
        assert_eq!(
            failed_scheduling(&store).len(),
            2,
            "after six quiet minutes a new Event starts"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_that_ends_between_sweeps_keeps_its_count_when_the_next_one_starts() {
        let (store, pod, mut recorder) = world();
        // Occurrences at 0, 100 and 200 s; the sweep at 360 s finds the series still going.
        for _ in 0..3 {
            recorder.record(&store, &pod, failed("0/1 nodes are available"));
            tokio::time::advance(Duration::from_secs(100)).await;
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        recorder.sweep(&store);
        // The series ends at 560 s; the next occurrence, at 561 s, comes before the next sweep.
        tokio::time::advance(Duration::from_secs(201)).await;
        assert!(
            recorder
                .next_sweep()
                .is_some_and(|at| tokio::time::Instant::now() < at)
        );
        recorder.record(&store, &pod, failed("0/2 nodes are available"));
        let mut counts: Vec<_> = failed_scheduling(&store)
            .iter()
            .map(|e| e["count"].clone())
            .collect();
        counts.sort_by_key(|c| c.as_u64());
        assert_eq!(counts, [json!(1), json!(3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_series_has_its_count_written_every_half_hour() {
        let (store, pod, mut recorder) = world();
        // One occurrence a minute for 40 minutes: the series never ends.
        for _ in 0..40 {
            a_minute(&mut recorder, &store, &pod, "0/1 nodes are available").await;
        }
        let count = failed_scheduling(&store)[0]["count"].as_u64().unwrap_or_default();
        assert_eq!(
            count, 30,
            "written by the refresh at 30 minutes, not at every occurrence or sweep"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_whose_event_was_deleted_starts_a_new_one_after_the_refresh() {
        let (store, pod, mut recorder) = world();
        let delete = |store: &Store| {
            let event = &failed_scheduling(store)[0];
            let key = ObjectKey::new("default", event["metadata"]["name"].as_str().unwrap_or_default());
            store
                .delete(&events(), &key, &crate::store::DeleteOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
        };
        // One occurrence a minute; the Event is deleted at minute 10, the series goes on.
        for minute in 0..32 {
            if minute == 10 {
                delete(&store);
            }
            a_minute(&mut recorder, &store, &pod, &format!("attempt {minute}")).await;
        }
        let again = failed_scheduling(&store);
        assert_eq!(again.len(), 1, "the refresh found the Event gone: {again:?}");
        assert_eq!(
            again[0]["message"], "attempt 30",
            "a new series after the refresh"
        );
    }
}

//! Kubernetes Events with Karpenter's reasons, recorded the way a busy controller must: the same
//! event (object, reason, message) is written at most once per [`DEDUPE_WINDOW`], as Karpenter's
//! recorder does; what passes goes through client-go's correlator
//! ([`correlator`](super::correlator)), as Karpenter's events do, so a repeat patches the count of
//! the Event first written and similar events are combined; and writes leave the caller at once
//! for a background writer that keeps at most [`EVENT_WRITES_IN_FLIGHT`] requests in flight. A pass that tells 5,000 pods why they cannot be
//! placed costs it no API round trips, and the same 5,000 messages on the next pass cost nothing.
//!
//! Failures: an event that cannot be written is logged and dropped, and so is one that finds the
//! writer's queue ([`EVENT_QUEUE`]) full; an Event is a report, never part of the action it reports.
//! A count patched onto an Event the API server no longer has (its TTL passed) is created anew.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use joist_messages::time::Clock;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::{Api, Resource, api::PostParams};
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};

use crate::effects::{
    correlator::{Correlated, Correlator, Occurrence},
    kube_ops::{self, COMPONENT, timestamp},
    metrics::Metrics,
    nominations,
};

/// The same event is written at most once in this long (Karpenter's de-duplication window).
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

/// Events queued for the writer before new ones are dropped.
pub const EVENT_QUEUE: usize = 10_000;

/// Event writes in flight at once.
pub const EVENT_WRITES_IN_FLIGHT: usize = 16;

/// See the module docs. Cheap to clone; clones share the window and the writer.
#[derive(Clone)]
pub struct Events {
    clock: Clock,
    metrics: Metrics,
    queue: mpsc::Sender<Outgoing>,
    recent: Arc<Mutex<Recent>>,
    nominations: Arc<Mutex<nominations::Limit>>,
}

/// An Event for the writer: created, or, when `existing`, its count and latest message patched
/// onto the Event of that name.
struct Outgoing {
    event: Event,
    existing: bool,
}

/// Events written within the window, by what makes them the same, and the correlator's state.
/// Expired entries count as absent; they are pruned once the map has doubled since the last
/// prune, so recording stays amortised constant time however many distinct events a pass records.
#[derive(Default)]
struct Recent {
    written: HashMap<EventKey, Instant>,
    prune_at: usize,
    correlator: Correlator,
}

/// What makes two events the same: the object (kind, namespace, name, UID), the reason and the
/// message.
type EventKey = (String, String, String);

impl Events {
    /// A recorder writing through `client`; starts its writer on the current tokio runtime. Events
    /// dropped for a full queue are counted in `metrics`.
    pub fn start(client: kube::Client, clock: Clock, metrics: Metrics) -> Self {
        let (queue, mut received) = mpsc::channel::<Outgoing>(EVENT_QUEUE);
        let events = futures::stream::poll_fn(move |cx| received.poll_recv(cx));
        tokio::spawn(
            events.for_each_concurrent(EVENT_WRITES_IN_FLIGHT, move |outgoing| {
                let client = client.clone();
                async move {
                    let reason = outgoing.event.reason.clone().unwrap_or_default();
                    if let Err(error) = write(client, outgoing).await {
                        tracing::warn!(reason, %error, "recording an event failed");
                    }
                }
            }),
        );
        Self {
            clock,
            metrics,
            queue,
            recent: Arc::default(),
            nominations: Arc::default(),
        }
    }

    /// Records a Normal event about `object`.
    pub fn normal<K: Resource<DynamicType = ()>>(&self, object: &K, reason: &str, message: &str) {
        self.record(object, false, reason, message);
    }

    /// Records a Warning event about `object`.
    pub fn warn<K: Resource<DynamicType = ()>>(&self, object: &K, reason: &str, message: &str) {
        self.record(object, true, reason, message);
    }

    /// Tells `pod` where it should schedule (`Nominated`), as Karpenter's recorder does: at most
    /// once per pod in [`DEDUPE_WINDOW`] whatever it names, then within the rate of nominations
    /// across all pods ([`nominations::Limit`]); one over the rate is dropped, and the pod waits
    /// out the window.
    pub fn nominated<K: Resource<DynamicType = ()>>(&self, pod: &K, target: nominations::Target<'_>) {
        let now = Instant::now();
        let object = object_key(&pod.object_ref(&()));
        let fresh = (self.recent.lock().unwrap_or_else(|e| e.into_inner())).first_in_window(
            now,
            &object,
            nominations::REASON,
            "",
        );
        if fresh
            && self
                .nominations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(now)
        {
            self.normal(pod, nominations::REASON, &nominations::message(target));
        }
    }

    /// Whether a nomination could be told now: a pass stops telling pods once none could.
    pub fn can_nominate(&self) -> bool {
        (self.nominations.lock().unwrap_or_else(|e| e.into_inner())).available(Instant::now())
    }

    fn record<K: Resource<DynamicType = ()>>(&self, object: &K, warning: bool, reason: &str, message: &str) {
        let reference: ObjectReference = object.object_ref(&());
        let kind = if warning { "Warning" } else { "Normal" };
        let Some(correlated) = self.correlate(&reference, kind, reason, message) else {
            return;
        };
        tracing::debug!(
            reason,
            message,
            object = reference.name,
            count = correlated.count,
            "event"
        );
        let existing = correlated.existing;
        let event = event(&self.clock, reference, kind, reason, correlated);
        if self.queue.try_send(Outgoing { event, existing }).is_err() {
            self.metrics.found_full("events");
            tracing::warn!(reason, "the event queue is full; dropping an event");
        }
    }

    /// How to write this event: `None` when it was written within the window or the correlator's
    /// spam filter drops it.
    fn correlate(
        &self,
        reference: &ObjectReference,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Option<Correlated> {
        let object = object_key(reference);
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if !recent.first_in_window(now, &object, reason, message) {
            return None;
        }
        let occurrence = Occurrence {
            object: &object,
            kind,
            reason,
            message,
        };
        let stamp = self
            .clock
            .now_system()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let name = reference.name.as_deref().unwrap_or("object");
        recent.correlator.correlate(occurrence, name, now, stamp)
    }
}

impl Recent {
    /// Whether this event was not written within the window (and notes that it is now).
    fn first_in_window(&mut self, now: Instant, object: &str, reason: &str, message: &str) -> bool {
        if self.written.len() >= self.prune_at.max(EVENT_QUEUE) {
            self.written
                .retain(|_, at| now.saturating_duration_since(*at) < DEDUPE_WINDOW);
            self.prune_at = 2 * self.written.len();
        }
        let key = (object.to_owned(), reason.to_owned(), message.to_owned());
        match self.written.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < DEDUPE_WINDOW => false,
            _ => {
                self.written.insert(key, now);
                true
            }
        }
    }
}

/// What names the object of an event: its kind, namespace, name and UID.
fn object_key(reference: &ObjectReference) -> String {
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{}",
        reference.kind.as_deref().unwrap_or_default(),
        reference.namespace.as_deref().unwrap_or_default(),
        reference.name.as_deref().unwrap_or_default(),
        reference.uid.as_deref().unwrap_or_default(),
    )
}

/// The Event for `correlated`, named and counted by the correlator.
fn event(
    clock: &Clock,
    reference: ObjectReference,
    kind: &str,
    reason: &str,
    correlated: Correlated,
) -> Event {
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let now = timestamp(clock);
    let seen_for = i64::try_from(correlated.first_seen.elapsed().as_secs()).unwrap_or(0);
    let first = Time(jiff::Timestamp::from_second(clock.now_seconds() - seen_for).unwrap_or_default());
    Event {
        metadata: ObjectMeta {
            name: Some(correlated.name),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: reference,
        reason: Some(reason.to_owned()),
        message: Some(correlated.message),
        type_: Some(kind.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        first_timestamp: Some(first),
        last_timestamp: Some(now),
        count: Some(correlated.count),
        ..Event::default()
    }
}

/// Writes one Event: a patch of its count, latest time and message when it exists, else a create
/// (also when the Event to patch is gone, as client-go's recorder does).
async fn write(client: kube::Client, outgoing: Outgoing) -> Result<(), kube::Error> {
    let Outgoing { event, existing } = outgoing;
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client, &namespace);
    if existing {
        let name = event.metadata.name.clone().unwrap_or_default();
        let body = json!({
            "count": event.count, "lastTimestamp": event.last_timestamp, "message": event.message,
        });
        if kube_ops::patch(&api, &name, body).await? {
            return Ok(());
        }
    }
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        // A create of this Event already landed (a count raced its first write): the count
        // is a report, not worth a retry.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

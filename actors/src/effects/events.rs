//! Kubernetes Events with Karpenter's reasons, recorded the way a busy controller must: the same
//! event (object, reason, message) is written at most once per [`DEDUPE_WINDOW`], as Karpenter's
//! recorder does, and writes leave the caller at once for a background writer that keeps at most
//! [`EVENT_WRITES_IN_FLIGHT`] requests in flight. A pass that tells 5,000 pods why they cannot be
//! placed costs it no API round trips, and the same 5,000 messages on the next pass cost nothing.
//!
//! Failures: an event that cannot be written is logged and dropped, and so is one that finds the
//! writer's queue ([`EVENT_QUEUE`]) full; an Event is a report, never part of the action it reports.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use joist_messages::time::Clock;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Resource, api::PostParams};
use tokio::{sync::mpsc, time::Instant};

use crate::{
    effects::kube_ops::{COMPONENT, timestamp},
    effects::metrics::Metrics,
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
    queue: mpsc::Sender<Event>,
    recent: Arc<Mutex<Recent>>,
}

/// Events written within the window, by what makes them the same. Expired entries count as
/// absent; they are pruned once the map has doubled since the last prune, so recording stays
/// amortised constant time however many distinct events a pass records.
#[derive(Default)]
struct Recent {
    written: HashMap<EventKey, Instant>,
    prune_at: usize,
}

/// What makes two events the same: the object (its UID, or name), the reason and the message.
type EventKey = (String, String, String);

impl Events {
    /// A recorder writing through `client`; starts its writer on the current tokio runtime. Events
    /// dropped for a full queue are counted in `metrics`.
    pub fn start(client: kube::Client, clock: Clock, metrics: Metrics) -> Self {
        let (queue, mut received) = mpsc::channel::<Event>(EVENT_QUEUE);
        let events = futures::stream::poll_fn(move |cx| received.poll_recv(cx));
        tokio::spawn(events.for_each_concurrent(EVENT_WRITES_IN_FLIGHT, move |event| {
            let client = client.clone();
            async move {
                let namespace = event.metadata.namespace.clone().unwrap_or_default();
                let api: Api<Event> = Api::namespaced(client, &namespace);
                if let Err(error) = api.create(&PostParams::default(), &event).await {
                    tracing::warn!(reason = event.reason, %error, "recording an event failed");
                }
            }
        }));
        Self {
            clock,
            metrics,
            queue,
            recent: Arc::default(),
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

    fn record<K: Resource<DynamicType = ()>>(&self, object: &K, warning: bool, reason: &str, message: &str) {
        let reference: ObjectReference = object.object_ref(&());
        let identity = reference
            .uid
            .clone()
            .or_else(|| reference.name.clone())
            .unwrap_or_default();
        if !self.first_in_window(identity, reason, message) {
            return;
        }
        tracing::debug!(reason, message, object = reference.name, "event");
        let event = event(&self.clock, reference, warning, reason, message);
        if self.queue.try_send(event).is_err() {
            self.metrics.found_full("events");
            tracing::warn!(reason, "the event queue is full; dropping an event");
        }
    }

    /// Whether this event was not written within the window (and notes that it is now).
    fn first_in_window(&self, identity: String, reason: &str, message: &str) -> bool {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.written.len() >= recent.prune_at.max(EVENT_QUEUE) {
            recent
                .written
                .retain(|_, at| now.saturating_duration_since(*at) < DEDUPE_WINDOW);
            recent.prune_at = 2 * recent.written.len();
        }
        let key = (identity, reason.to_owned(), message.to_owned());
        match recent.written.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < DEDUPE_WINDOW => false,
            _ => {
                recent.written.insert(key, now);
                true
            }
        }
    }
}

fn event(clock: &Clock, reference: ObjectReference, warning: bool, reason: &str, message: &str) -> Event {
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let now = timestamp(clock);
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", reference.name.as_deref().unwrap_or("object"))),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: reference,
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

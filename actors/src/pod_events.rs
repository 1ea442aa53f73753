//! The PodEventRecorder: writes each NodeClaim's last pod event (a pod bound to its Node, or gone
//! from it) to the claim's `status.lastPodEventTime`, as Karpenter's pod-events controller does, so
//! that `consolidateAfter` counts from it after a restart or a failover.
//!
//! The read model notes each event as the watch shows it
//! ([`ReadModel::note_pod_event`](crate::state::read_model::ReadModel::note_pod_event)); every
//! [`FLUSH_EVERY`] the recorder takes what was noted and writes, [`WRITES_IN_FLIGHT`] at a time,
//! the events at least [`DEDUPE_SECONDS`] after what the claim records (Karpenter's
//! de-duplication: a burst of pods costs one write). Pods bind in bursts of thousands; noting is a
//! map entry, so such a burst holds no request or actor step per claim. A write that fails is noted
//! again for the next round and logged; a claim gone or being deleted is skipped.

use std::time::Duration;

use actix::prelude::*;
use futures::{StreamExt, stream};
use joist_messages::{apis::NodeClaim, time::rfc3339};
use serde_json::json;

use crate::{decide::lifecycle::last_pod_event, effects::kube_ops, shared::Shared};

/// How often noted events are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// An event this soon after the one the claim records is not written (seconds).
pub const DEDUPE_SECONDS: i64 = 10;

/// Writes in flight at once.
pub const WRITES_IN_FLIGHT: usize = 16;

/// See the module docs.
pub struct PodEventRecorder {
    shared: Shared,
    /// A round of writes is running: the next tick leaves the noted events for later.
    busy: bool,
}

impl PodEventRecorder {
    /// A recorder over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self { shared, busy: false }
    }
}

impl Actor for PodEventRecorder {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(FLUSH_EVERY, |recorder, ctx| {
            if recorder.busy {
                return;
            }
            let events = recorder.shared.read.take_pod_events();
            if events.is_empty() {
                return;
            }
            recorder.busy = true;
            let round = record(recorder.shared.clone(), events)
                .into_actor(recorder)
                .map(|(), recorder, _| recorder.busy = false);
            ctx.spawn(round);
        });
    }
}

/// Whether an event at `event` is worth writing over the one the claim records (epoch seconds).
pub fn due(event: i64, recorded: Option<i64>) -> bool {
    recorded.is_none_or(|recorded| event >= recorded + DEDUPE_SECONDS)
}

/// Writes the events that are due (see the module docs).
async fn record(shared: Shared, events: Vec<(String, i64)>) {
    let api = kube_ops::cluster::<NodeClaim>(&shared.client);
    stream::iter(events)
        .for_each_concurrent(WRITES_IN_FLIGHT, |(name, at)| {
            let (shared, api) = (&shared, &api);
            async move {
                let Some(claim) = shared.read.node_claim(&name) else {
                    return;
                };
                if claim.metadata.deletion_timestamp.is_some() || !due(at, last_pod_event(&claim)) {
                    return;
                }
                let body = json!({"status": {"lastPodEventTime": rfc3339(at)}});
                if let Err(error) = kube_ops::patch_status_body(api, &name, body).await {
                    tracing::debug!(nodeclaim = name, %error, "recording a pod event failed; next round");
                    shared.read.note_pod_event(&name, at);
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_written_unless_the_claim_records_one_within_ten_seconds() {
        assert!(due(100, None), "nothing recorded yet");
        assert!(!due(100, Some(91)), "within the de-duplication window");
        assert!(due(100, Some(90)));
        assert!(!due(100, Some(100)), "the event the claim records");
        assert!(!due(100, Some(130)), "an older event than the one recorded");
    }
}

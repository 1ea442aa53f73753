//! The Interruption actor under a flood: a queue that hands out more messages per receive than SQS
//! would, each slow to delete, on virtual time. Every message is worked off and counted, and never
//! more than [`MESSAGES_IN_FLIGHT`] are handled at once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{controllers_on_kubesim, paused_system, sample};
use joist_actors::{interruption::MESSAGES_IN_FLIGHT, settings::Settings};
use joist_provider::{
    CloudFuture,
    interruption::{InterruptionQueue, QueueMessage},
};

/// Messages in the flood.
const FLOOD: usize = 1_000;
/// Messages one receive hands out: more than the actor may handle at once.
const PER_RECEIVE: usize = 25;

/// A queue holding [`FLOOD`] messages that are not events; a delete takes a virtual second.
#[derive(Debug, Default)]
struct FloodQueue {
    handed_out: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    deleted: AtomicUsize,
}

impl InterruptionQueue for FloodQueue {
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>> {
        Box::pin(async move {
            let start = self
                .handed_out
                .fetch_add(PER_RECEIVE, Ordering::SeqCst)
                .min(FLOOD);
            let end = (start + PER_RECEIVE).min(FLOOD);
            if start == end {
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
            Ok((start..end)
                .map(|i| QueueMessage {
                    receipt: format!("r-{i}"),
                    body: format!("noise {i}"),
                })
                .collect())
        })
    }

    fn delete<'a>(&'a self, _receipt: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.deleted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

#[test]
fn a_flood_of_queue_messages_is_worked_off_at_most_ten_at_a_time() {
    let system = paused_system();
    let queue = Arc::new(FloodQueue::default());
    let metrics = system.block_on({
        let queue = queue.clone();
        async move {
            let settings = Settings {
                interruption_queue: Some(queue),
                ..Settings::default()
            };
            let (_cluster, controllers) = controllers_on_kubesim("flood", settings);
            // Ten at a time, a second each: 100 virtual seconds of work, and some to spare.
            tokio::time::sleep(Duration::from_secs(300)).await;
            controllers.shared.metrics.encode()
        }
    });
    assert_eq!(
        queue.deleted.load(Ordering::SeqCst),
        FLOOD,
        "every message deleted"
    );
    assert_eq!(
        queue.most_in_flight.load(Ordering::SeqCst),
        MESSAGES_IN_FLIGHT,
        "handled concurrently, and never more than the bound"
    );
    let series = "karpenter_interruption_received_messages_total{message_type=\"no_op\"}";
    assert_eq!(sample(&metrics, series), Some(FLOOD as f64), "{metrics}");
}

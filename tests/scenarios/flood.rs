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

use joist_actors::{
    interruption::MESSAGES_IN_FLIGHT,
    settings::{Settings, SolverMode},
};
use joist_kubesim::{Cluster, ClusterSettings};
use joist_messages::{model::shape::CapacitySettings, time::Clock};
use joist_provider::{
    CloudFuture,
    interruption::{InterruptionQueue, QueueMessage},
};
use joist_provider_sim::{SimCloud, SimSettings};

use super::{NodeTracer, sample};

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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let system = actix::System::with_tokio_rt(move || runtime);
    let queue = Arc::new(FloodQueue::default());
    let metrics = system.block_on({
        let queue = queue.clone();
        async move {
            let cluster = Cluster::start(ClusterSettings::default());
            cluster
                .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
                .unwrap_or_else(|e| panic!("{e}"));
            let client = cluster.client();
            let cloud = SimCloud::new(
                SimSettings {
                    region: "us-west-2".to_owned(),
                    zones: Vec::new(),
                    boot: Duration::from_secs(30),
                    cluster_name: "flood".to_owned(),
                    capacity: CapacitySettings::default(),
                    epoch_seconds: 1_767_225_600,
                    seed: 1,
                },
                client.clone(),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let settings = Settings {
                solver: SolverMode::Inline,
                interruption_queue: Some(queue),
                ..Settings::default()
            };
            let controllers = joist_actors::start(
                client,
                Arc::new(cloud),
                settings,
                Clock::starting_at(1_767_225_600),
                NodeTracer::disabled(),
            );
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

//! The simulated cloud's interruption queue: an in-memory stand-in for the SQS queue EventBridge
//! fills on AWS, carrying the same EventBridge JSON, so `joist simulate` runs the real parser and
//! the real Interruption actor.
//!
//! As SQS does: a receive waits up to [`LONG_POLL`] for a message and takes up to
//! [`RECEIVE_BATCH`]; a message received and not deleted within [`VISIBILITY_TIMEOUT`] is
//! delivered again. Receives fail with throttling while a fault is injected ([`SimQueue::fail`]).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use joist_provider::{
    CloudError, CloudFuture,
    interruption::{InterruptionQueue, QueueMessage},
};
use tokio::{sync::Notify, time::Instant};

/// How long a receive waits for a first message.
pub const LONG_POLL: Duration = Duration::from_secs(20);

/// The most messages one receive takes.
pub const RECEIVE_BATCH: usize = 10;

/// How long a received message stays hidden before it is delivered again.
pub const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(20);

/// See the module docs.
#[derive(Debug, Default)]
pub struct SimQueue {
    state: Mutex<QueueState>,
    arrived: Notify,
}

#[derive(Debug, Default)]
struct QueueState {
    waiting: VecDeque<QueueMessage>,
    in_flight: BTreeMap<String, (QueueMessage, Instant)>,
    sent: u64,
    failing_until: Option<Instant>,
}

impl SimQueue {
    /// Puts a message body on the queue.
    pub fn send(&self, body: String) {
        let mut state = self.lock();
        state.sent += 1;
        let receipt = format!("receipt-{}", state.sent);
        state.waiting.push_back(QueueMessage { receipt, body });
        drop(state);
        self.arrived.notify_one();
    }

    /// Makes receives fail with a throttling error for `duration`.
    pub fn fail(&self, duration: Duration) {
        self.lock().failing_until = Some(Instant::now() + duration);
    }

    /// Messages waiting or received and not yet deleted.
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.waiting.len() + state.in_flight.len()
    }

    /// Whether no message is waiting or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes up to a batch, putting back messages whose visibility timeout passed; fails while a
    /// fault is injected.
    pub(crate) fn take(&self) -> Result<Vec<QueueMessage>, CloudError> {
        let now = Instant::now();
        let mut state = self.lock();
        if state.failing_until.is_some_and(|until| until > now) {
            return Err(CloudError::Transient {
                message: "ReceiveMessage: RequestThrottled (injected fault)".to_owned(),
            });
        }
        let expired: Vec<String> = state
            .in_flight
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(receipt, _)| receipt.clone())
            .collect();
        for receipt in expired {
            if let Some((message, _)) = state.in_flight.remove(&receipt) {
                state.waiting.push_back(message);
            }
        }
        let count = state.waiting.len().min(RECEIVE_BATCH);
        let taken: Vec<QueueMessage> = state.waiting.drain(..count).collect();
        for message in &taken {
            state.in_flight.insert(
                message.receipt.clone(),
                (message.clone(), now + VISIBILITY_TIMEOUT),
            );
        }
        Ok(taken)
    }
}

impl InterruptionQueue for SimQueue {
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>> {
        Box::pin(async move {
            let deadline = Instant::now() + LONG_POLL;
            loop {
                let taken = self.take()?;
                if !taken.is_empty() {
                    return Ok(taken);
                }
                // A wake-up left by an earlier send only costs one more look.
                if tokio::time::timeout_at(deadline, self.arrived.notified())
                    .await
                    .is_err()
                {
                    return Ok(Vec::new());
                }
            }
        })
    }

    fn delete<'a>(&'a self, receipt: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            self.lock().in_flight.remove(receipt);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn messages_are_delivered_deleted_or_delivered_again() {
        let queue = SimQueue::default();
        for i in 0..12 {
            queue.send(format!("m{i}"));
        }
        let first = queue.receive().await.unwrap_or_default();
        assert_eq!(first.len(), RECEIVE_BATCH, "a batch at most");
        for message in &first[..9] {
            queue.delete(&message.receipt).await.unwrap_or_default();
        }
        let second = queue.receive().await.unwrap_or_default();
        assert_eq!(second.len(), 2, "the rest");
        tokio::time::sleep(VISIBILITY_TIMEOUT).await;
        let again = queue.receive().await.unwrap_or_default();
        let bodies: Vec<&str> = again.iter().map(|m| m.body.as_str()).collect();
        assert_eq!(bodies, ["m9", "m10", "m11"], "undeleted messages come back");
        let started = Instant::now();
        for message in &again {
            queue.delete(&message.receipt).await.unwrap_or_default();
        }
        assert!(queue.receive().await.unwrap_or_default().is_empty());
        assert!(started.elapsed() >= LONG_POLL, "an empty queue is long-polled");
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_injected_fault_throttles_receives_until_it_ends_and_loses_nothing() {
        let queue = SimQueue::default();
        queue.send("warning".to_owned());
        queue.fail(Duration::from_secs(30));
        assert!(matches!(queue.receive().await, Err(CloudError::Transient { .. })));
        tokio::time::sleep(Duration::from_secs(30)).await;
        let received = queue.receive().await.unwrap_or_default();
        assert_eq!(received.len(), 1, "the message waited out the fault");
    }
}

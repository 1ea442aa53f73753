//! The interruption queue on AWS: the SQS queue `INTERRUPTION_QUEUE` names, which EventBridge
//! fills with interruption events (see the CloudFormation of Karpenter's getting-started guide).
//!
//! The queue URL is looked up once with `GetQueueUrl` and kept; receives are Karpenter's long
//! polls (10 messages, 20 s wait, 20 s visibility). Failures (a queue that does not exist,
//! throttling, a call that times out) are `Transient` errors naming the call and the queue: the
//! Interruption actor retries with backoff.

use aws_sdk_sqs::error::ProvideErrorMetadata;
use joist_provider::{
    CloudError, CloudFuture,
    interruption::{InterruptionQueue, QueueMessage},
};
use tokio::sync::OnceCell;

/// Messages one receive takes at most.
const RECEIVE_BATCH: i32 = 10;
/// Seconds a receive waits for a first message.
const LONG_POLL_SECONDS: i32 = 20;
/// Seconds a received message stays hidden before SQS delivers it again.
const VISIBILITY_SECONDS: i32 = 20;

/// See the module docs.
#[derive(Debug)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    name: String,
    url: OnceCell<String>,
}

impl SqsQueue {
    /// The queue named `name`, read through `client`.
    pub fn new(client: aws_sdk_sqs::Client, name: String) -> Self {
        Self {
            client,
            name,
            url: OnceCell::new(),
        }
    }

    /// A failed `call`, named with the queue: the service's message, else the error as displayed.
    fn failed(&self, call: &str, error: &(impl ProvideErrorMetadata + std::fmt::Display)) -> CloudError {
        CloudError::Transient {
            message: format!(
                "SQS {call} on queue {:?}: {}",
                self.name,
                error.message().map_or_else(|| error.to_string(), str::to_owned)
            ),
        }
    }

    async fn url(&self) -> Result<&str, CloudError> {
        self.url
            .get_or_try_init(|| async {
                let answer = self
                    .client
                    .get_queue_url()
                    .queue_name(&self.name)
                    .send()
                    .await
                    .map_err(|e| self.failed("GetQueueUrl", &e))?;
                answer.queue_url.ok_or_else(|| CloudError::Transient {
                    message: format!("SQS GetQueueUrl on queue {:?} returned no URL", self.name),
                })
            })
            .await
            .map(String::as_str)
    }
}

impl InterruptionQueue for SqsQueue {
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>> {
        Box::pin(async move {
            let url = self.url().await?;
            let answer = self
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(RECEIVE_BATCH)
                .wait_time_seconds(LONG_POLL_SECONDS)
                .visibility_timeout(VISIBILITY_SECONDS)
                .send()
                .await
                .map_err(|e| self.failed("ReceiveMessage", &e))?;
            Ok(answer
                .messages
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| {
                    Some(QueueMessage {
                        receipt: m.receipt_handle?,
                        body: m.body.unwrap_or_default(),
                    })
                })
                .collect())
        })
    }

    fn delete<'a>(&'a self, receipt: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let url = self.url().await?;
            self.client
                .delete_message()
                .queue_url(url)
                .receipt_handle(receipt)
                .send()
                .await
                .map_err(|e| self.failed("DeleteMessage", &e))?;
            Ok(())
        })
    }
}

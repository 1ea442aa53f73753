//! Deadlines on cloud calls. A call the cloud never answers (a connection that hangs, a reply lost
//! on the way) must not hold a NodeClaim's actor, the garbage collector or a node class forever: past
//! its deadline it fails as [`CloudError::Transient`], which its caller retries with backoff as it
//! retries a throttle. What the call may have done meanwhile is found later: a launch by
//! [`CloudProvider::find_launch`](joist_provider::CloudProvider::find_launch) before the claim
//! launches again, or by the garbage collector once the claim is gone; a termination by the next
//! look at the instance.

use std::{future::Future, time::Duration};

use joist_provider::CloudError;

/// How long any cloud call but a launch may take (a launch has until its claim's launch timeout).
pub const CLOUD_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `call`, failed as transient when it has not answered within `limit`; `what` names it in the error.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, CloudError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(CloudError::Transient {
            message: format!("{what}: no reply from the cloud within {}s", limit.as_secs()),
        })
    })
}

/// `call` within [`CLOUD_CALL_TIMEOUT`].
pub async fn bounded<T>(
    what: &str,
    call: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, CloudError> {
    within(CLOUD_CALL_TIMEOUT, what, call).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_fails_as_transient_at_its_deadline() {
        let started = tokio::time::Instant::now();
        let hung = bounded(
            "DescribeInstances",
            std::future::pending::<Result<(), CloudError>>(),
        )
        .await;
        assert_eq!(started.elapsed(), CLOUD_CALL_TIMEOUT);
        let Err(error) = hung else {
            panic!("a hung call answered")
        };
        assert!(error.is_retryable());
        assert!(
            error.to_string().contains("DescribeInstances: no reply"),
            "{error}"
        );
        assert_eq!(bounded("DescribeInstances", async { Ok(7) }).await, Ok(7));
    }
}

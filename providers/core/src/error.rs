//! The errors a [`CloudProvider`](crate::CloudProvider) returns, as Karpenter classifies them.

use thiserror::Error;

use crate::OfferingKey;

/// What went wrong in a cloud call.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CloudError {
    /// The instance does not exist (any more): deletion is complete, a registered claim is orphaned.
    #[error("no instance for {provider_id}")]
    NodeClaimNotFound {
        /// The provider ID looked up.
        provider_id: String,
    },
    /// Every offering the claim allowed is out of capacity; they go to the unavailable-offering
    /// cache and the claim is deleted so its pods are simulated again without them.
    #[error("insufficient capacity for {}: {message}", list(.offerings))]
    InsufficientCapacity {
        /// The offerings that failed.
        offerings: Vec<OfferingKey>,
        /// What the cloud said.
        message: String,
    },
    /// The node class cannot launch yet (not found, not resolved, not ready).
    #[error("node class {node_class} is not ready: {reason}")]
    NodeClassNotReady {
        /// The node class's name.
        node_class: String,
        /// What is missing.
        reason: String,
    },
    /// The launch was refused for a reason a retry will not fix soon (bad request, quota).
    #[error("creating the instance failed ({reason}): {message}")]
    Create {
        /// A short machine-readable reason (`InvalidParameter`, `Unauthorized` …).
        reason: String,
        /// What the cloud said.
        message: String,
    },
    /// A throttle, timeout or outage: retry with backoff.
    #[error("transient cloud error: {message}")]
    Transient {
        /// What the cloud said.
        message: String,
    },
}

impl CloudError {
    /// Whether trying the same call again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CloudError::Transient { .. } | CloudError::Create { .. })
    }
}

fn list(offerings: &[OfferingKey]) -> String {
    if offerings.is_empty() {
        return "no offerings".to_owned();
    }
    offerings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use joist_messages::model::instance_type::CapacityType;

    use super::*;

    #[test]
    fn capacity_errors_name_every_offering_and_are_not_retried_in_place() {
        let error = CloudError::InsufficientCapacity {
            offerings: vec![OfferingKey {
                instance_type: "m5.large".into(),
                zone: "us-west-2a".into(),
                capacity_type: CapacityType::Spot,
            }],
            message: "InsufficientInstanceCapacity".into(),
        };
        assert_eq!(
            error.to_string(),
            "insufficient capacity for spot:m5.large:us-west-2a: InsufficientInstanceCapacity"
        );
        assert!(!error.is_retryable());
        assert!(
            CloudError::Transient {
                message: "throttled".into()
            }
            .is_retryable()
        );
    }
}

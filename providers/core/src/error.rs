//! The errors a [`CloudProvider`](crate::CloudProvider) returns, as Karpenter classifies them.

use thiserror::Error;

use crate::OfferingKey;

/// What went wrong in a cloud call. New kinds may come (a cloud's new failure Karpenter
/// classifies), so a match outside this crate keeps an arm for the others.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
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
    /// The launch was refused for a reason the cloud gave (a bad request, a quota): reported on the
    /// claim and tried again with a doubling backoff, as Karpenter requeues a failed launch, since
    /// a quota raised or a node class fixed lets a later attempt succeed.
    #[error("creating the instance failed ({reason}): {message}")]
    Create {
        /// A short machine-readable reason (`InvalidParameter`, `Unauthorized` …).
        reason: String,
        /// What the cloud said.
        message: String,
    },
    /// The cloud refused a query the controllers' credentials are not allowed to make (a missing
    /// IAM permission): asking again is useless until the permission is granted.
    #[error("{operation} is not permitted: {message}")]
    NotPermitted {
        /// The cloud's operation (`DescribeInstanceStatus`).
        operation: String,
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
    /// Whether trying the same call again later can succeed: after a throttle or outage
    /// ([`CloudError::Transient`]) or a refusal ([`CloudError::Create`]), but not for a missing
    /// instance, offerings out of capacity (the claim goes, and its pods are placed again without
    /// them), a node class that is not ready (the claim goes until it is) or a query the
    /// controllers are not permitted to make.
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
                placement_group: None,
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

    #[test]
    fn a_refused_launch_is_retried_and_a_class_not_ready_or_a_missing_instance_is_not() {
        let refused = CloudError::Create {
            reason: "VcpuLimitExceeded".into(),
            message: "quota".into(),
        };
        assert!(
            refused.is_retryable(),
            "a raised quota lets a later launch succeed"
        );
        let not_ready = CloudError::NodeClassNotReady {
            node_class: "default".into(),
            reason: "no subnets".into(),
        };
        assert!(!not_ready.is_retryable());
        let gone = CloudError::NodeClaimNotFound {
            provider_id: "aws:///us-west-2a/i-0".into(),
        };
        assert!(!gone.is_retryable());
    }
}

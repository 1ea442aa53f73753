//! Errors of the AWS provider: an EC2 or SSM call that failed (named by its operation, with the
//! service's code and message). Each converts into the
//! [`CloudError`] the controllers act on: throttling, server faults and no answer at all become
//! `Transient`, the rest `Create` errors carrying the service's code and words.

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata};
use joist_provider::CloudError;

/// See the module docs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AwsError {
    /// An API call failed.
    #[error("{operation}: {message}")]
    Api {
        /// The operation, as AWS names it (`DescribeInstanceTypes`).
        operation: &'static str,
        /// The service's error code, when it sent one.
        code: Option<String>,
        /// The whole error, with its sources.
        message: String,
    },
}

impl AwsError {
    /// Wraps an SDK error from `operation`.
    pub fn api<E>(operation: &'static str, error: E) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        Self::Api {
            operation,
            code: error.code().map(str::to_owned),
            message: DisplayErrorContext(&error).to_string(),
        }
    }

    /// The service's error code, if any.
    pub fn code(&self) -> Option<&str> {
        let Self::Api { code, .. } = self;
        code.as_deref()
    }

    /// Whether a retry may succeed (throttling, a server fault, no answer at all).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { code: None, .. } => true,
            Self::Api { code: Some(code), .. } => {
                code.contains("Throttl")
                    || code.starts_with("InternalError")
                    || ["RequestLimitExceeded", "ServiceUnavailable", "Unavailable"].contains(&code.as_str())
            }
        }
    }
}

impl From<AwsError> for CloudError {
    fn from(error: AwsError) -> Self {
        if error.is_retryable() {
            CloudError::Transient {
                message: error.to_string(),
            }
        } else {
            CloudError::Create {
                reason: error.code().unwrap_or("Unknown").to_owned(),
                message: error.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: Option<&str>) -> AwsError {
        AwsError::Api {
            operation: "CreateFleet",
            code: code.map(str::to_owned),
            message: "it failed".into(),
        }
    }

    #[test]
    fn throttling_and_missing_answers_are_retried_the_rest_names_its_code() {
        assert!(matches!(
            CloudError::from(api(Some("RequestLimitExceeded"))),
            CloudError::Transient { .. }
        ));
        assert!(matches!(
            CloudError::from(api(None)),
            CloudError::Transient { .. }
        ));
        let CloudError::Create { reason, .. } = CloudError::from(api(Some("InvalidParameterValue"))) else {
            panic!("not a Create error")
        };
        assert_eq!(reason, "InvalidParameterValue");
    }
}

//! The AWS SDK clients Joist uses (EC2, SSM, IAM, SQS, EKS, and the Price List API at the endpoint region that
//! serves this one), built from one `SdkConfig`: the default credential chain
//! (environment, profile, web identity for IRSA, container credentials for EKS Pod Identity,
//! IMDS), the region, `AWS_ENDPOINT_URL` when set (aws-config reads it), and rustls with ring for
//! TLS. Every call is bounded ([`AWS_CALL_TIMEOUT`], [`PRICING_CALL_TIMEOUT`]). Building never
//! calls AWS; a missing region is an error naming the variable to set.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig, timeout::TimeoutConfig};
use aws_sdk_ec2::config::SharedHttpClient;
use aws_smithy_http_client::{
    Builder,
    tls::{self, rustls_provider::CryptoMode},
};

use crate::pricing::pricing_endpoint_region;

/// The longest one Price List API call (a page, with its retries) may take.
pub const PRICING_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest one EC2, SSM or IAM call (with its retries) may take: a call that hangs fails, and
/// the controller that made it retries on its own schedule instead of waiting forever.
pub const AWS_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A timeout configuration bounding each operation, retries included, by `timeout`.
fn bounded(timeout: Duration) -> TimeoutConfig {
    TimeoutConfig::builder().operation_timeout(timeout).build()
}

/// Why the clients could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    /// Neither the environment nor the profile names a region.
    #[error("no AWS region: set AWS_REGION (or the profile's region)")]
    NoRegion,
}

/// The HTTP client every SDK client uses: hyper with rustls on ring (plain HTTP works too, for
/// emulators on loopback).
pub fn http_client() -> SharedHttpClient {
    Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// The clients and the region they talk to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AwsClients {
    /// EC2.
    pub ec2: aws_sdk_ec2::Client,
    /// SSM (AMI aliases).
    pub ssm: aws_sdk_ssm::Client,
    /// SQS (the interruption queue).
    pub sqs: aws_sdk_sqs::Client,
    /// IAM (instance profiles for a node class's role).
    pub iam: aws_sdk_iam::Client,
    /// EKS (the cluster's endpoint, CA and service CIDR, when the settings leave them out).
    pub eks: aws_sdk_eks::Client,
    /// The Price List API, at the endpoint region serving this region.
    pub pricing: aws_sdk_pricing::Client,
    /// The region, `us-west-2`.
    pub region: String,
}

impl AwsClients {
    /// Clients configured from the environment (see the module docs).
    pub async fn from_env() -> Result<Self, ClientsError> {
        let config = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http_client())
            .load()
            .await;
        Self::from_config(&config)
    }

    /// Clients for an already loaded configuration.
    pub fn from_config(config: &SdkConfig) -> Result<Self, ClientsError> {
        let region = config.region().ok_or(ClientsError::NoRegion)?.to_string();
        // A price refresh runs in the background and must end: bound each call, retries included.
        let pricing = aws_sdk_pricing::config::Builder::from(config)
            .region(Region::new(pricing_endpoint_region(&region)))
            .timeout_config(bounded(PRICING_CALL_TIMEOUT))
            .build();
        let ec2 = aws_sdk_ec2::config::Builder::from(config)
            .timeout_config(bounded(AWS_CALL_TIMEOUT))
            .build();
        let ssm = aws_sdk_ssm::config::Builder::from(config)
            .timeout_config(bounded(AWS_CALL_TIMEOUT))
            .build();
        let sqs = aws_sdk_sqs::config::Builder::from(config)
            .timeout_config(bounded(AWS_CALL_TIMEOUT))
            .build();
        let iam = aws_sdk_iam::config::Builder::from(config)
            .timeout_config(bounded(AWS_CALL_TIMEOUT))
            .build();
        let eks = aws_sdk_eks::config::Builder::from(config)
            .timeout_config(bounded(AWS_CALL_TIMEOUT))
            .build();
        Ok(Self {
            ec2: aws_sdk_ec2::Client::from_conf(ec2),
            ssm: aws_sdk_ssm::Client::from_conf(ssm),
            sqs: aws_sdk_sqs::Client::from_conf(sqs),
            iam: aws_sdk_iam::Client::from_conf(iam),
            eks: aws_sdk_eks::Client::from_conf(eks),
            pricing: aws_sdk_pricing::Client::from_conf(pricing),
            region,
        })
    }
}

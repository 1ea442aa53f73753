//! Joist's AWS cloud provider (`joist-provider-aws`): what runs on EKS.
//!
//! - [`clients`]: the SDK clients, from the default credential chain;
//! - [`cluster`]: the cluster's endpoint, CA and service CIDR from `eks:DescribeCluster`;
//! - [`node_class`]: EC2NodeClass resolution (subnets, security groups, AMIs, instance profile,
//!   created for a role by [`instance_profile`]);
//! - [`ami`]: AMI aliases to the SSM parameters AWS publishes;
//! - [`catalog`]: instance types and their zones from the EC2 API, as shared [`Ec2Shape`]s;
//! - [`instances`]: Joist's instances listed by the cluster's tags, read and terminated;
//! - [`instance_status`]: the instances EC2's status checks find impaired or with a scheduled event;
//! - [`pricing`]: on-demand prices parsed from the Pricing API's price list, spot prices, and the
//!   store that keeps the last known ones; [`price_source`] fetches them;
//! - [`user_data`]: the bootstrap user data per AMI family, merged with the user's;
//! - [`offerings`]: the instance types a class can launch, priced, with capacity per its settings;
//! - [`launch_template`]: hash-named launch templates, created once and reused;
//! - [`placement_groups`]: the placement group a class names, from DescribePlacementGroups;
//! - [`fleet`]: CreateFleet requests and what their answers mean; [`coalesce`] merges identical
//!   requests (and terminations) into one call;
//! - [`provider`]: [`AwsCloud`], the `CloudProvider` joining them, which `joist run` uses;
//! - [`sqs`]: the interruption queue, read from SQS.
//!
//! Tested against moto (an AWS API emulator) in `tests/`; what moto cannot do (capacity errors,
//! the Price List API) is covered by unit tests at the SDK boundary.
//!
//! [`Ec2Shape`]: joist_messages::model::shape::Ec2Shape

pub mod ami;
pub mod capacity_reservations;
pub mod catalog;
pub mod clients;
pub mod cluster;
pub mod coalesce;
pub mod error;
pub mod fleet;
pub mod instance_profile;
pub mod instance_status;
pub mod instances;
pub mod launch_template;
pub mod node_class;
pub mod offerings;
pub mod placement_groups;
pub mod price_source;
pub mod pricing;
pub mod provider;
pub mod sqs;
pub mod user_data;

pub use provider::{AwsCloud, AwsCloudError, AwsSettings};

/// 16 hex digits naming `data` stably (the first 64 bits of its SHA-256): the suffix of the names
/// Joist gives the AWS resources it creates (launch templates, instance profiles).
pub(crate) fn short_hash(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

//! Joist's AWS cloud provider (`joist-provider-aws`): what runs on EKS.
//!
//! - [`clients`]: the SDK clients, from the default credential chain;
//! - [`node_class`]: EC2NodeClass resolution (subnets, security groups, AMIs, instance profile);
//! - [`ami`]: AMI aliases to the SSM parameters AWS publishes;
//! - [`catalog`]: instance types and their zones from the EC2 API, as shared [`Ec2Shape`]s;
//! - [`instances`]: Joist's instances listed by the cluster's tags, read and terminated;
//! - [`pricing`]: on-demand prices parsed from the Pricing API's price list, spot prices, and the
//!   store that keeps the last known ones;
//! - [`user_data`]: the bootstrap user data per AMI family, merged with the user's.
//!
//! Built so far: the parts above, tested against moto (an AWS API emulator) in `tests/`. Not built
//! yet, and not reachable from the `joist` command: launch templates, CreateFleet, the SDK calls behind [`pricing::PriceSource`], and the
//! `CloudProvider` implementation that joins them (see the README's feature table).
//!
//! [`Ec2Shape`]: joist_messages::model::shape::Ec2Shape

pub mod ami;
pub mod catalog;
pub mod clients;
pub mod coalesce;
pub mod error;
pub mod fleet;
pub mod instances;
pub mod launch_template;
pub mod node_class;
pub mod offerings;
pub mod price_source;
pub mod pricing;
pub mod provider;
pub mod user_data;

pub use provider::{AwsCloud, AwsCloudError, AwsSettings};

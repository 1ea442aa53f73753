//! The placement group an EC2NodeClass's `placementGroupSelector` names, read with
//! DescribePlacementGroups as Karpenter's AWS provider reads it: by id (`GroupIds`) or by name
//! (`GroupNames`), `available` groups only; the first answer wins.
//!
//! Failures: a group EC2 does not know (`InvalidPlacementGroup.Unknown`) is no group, not an error;
//! a group whose strategy Joist cannot read is logged and taken as none found; any other failure
//! converts as every EC2 error does ([`AwsError`]).

use aws_sdk_ec2::types::{Filter, PlacementGroup as Ec2PlacementGroup, PlacementStrategy};
use joist_messages::apis::ec2nodeclass::PlacementGroupSelector;
use joist_provider::placement_group::{PlacementGroup, Strategy};

use crate::{clients::AwsClients, error::AwsError};

const OPERATION: &str = "DescribePlacementGroups";

/// The available group `selector` names, if any.
pub async fn describe(
    clients: &AwsClients,
    selector: &PlacementGroupSelector,
) -> Result<Option<PlacementGroup>, AwsError> {
    let available = Filter::builder().name("state").values("available").build();
    let request = clients.ec2.describe_placement_groups().filters(available);
    let request = match (&selector.id, &selector.name) {
        (Some(id), _) => request.group_ids(id),
        (None, Some(name)) => request.group_names(name),
        (None, None) => return Ok(None),
    };
    match request.send().await {
        Ok(output) => Ok(output.placement_groups().first().and_then(group)),
        Err(error) => {
            let error = AwsError::api(OPERATION, error.into_service_error());
            match error.code() {
                Some(code) if code.starts_with("InvalidPlacementGroup") => Ok(None),
                _ => Err(error),
            }
        }
    }
}

/// Joist's view of a described group; `None` when it lacks an id or name or has a strategy Joist
/// does not know.
fn group(described: &Ec2PlacementGroup) -> Option<PlacementGroup> {
    let id = described.group_id()?;
    let strategy = match described.strategy() {
        Some(PlacementStrategy::Cluster) => Strategy::Cluster,
        Some(PlacementStrategy::Spread) => Strategy::Spread,
        Some(PlacementStrategy::Partition) => Strategy::Partition {
            partitions: described
                .partition_count()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
        },
        other => {
            tracing::warn!(group = id, strategy = ?other, "placement group has a strategy Joist does not know");
            return None;
        }
    };
    Some(PlacementGroup {
        id: id.to_owned(),
        name: described.group_name().unwrap_or_default().to_owned(),
        strategy,
    })
}

//! Joist's instances as EC2 reports them: read by id (lookups arriving together go out as one
//! DescribeInstances, [`Lookups`]) or listed by the cluster's tags, converted to the
//! provider-neutral [`Instance`], and terminated. Instances are found by the tags Karpenter
//! writes (`karpenter.sh/nodepool` and `kubernetes.io/cluster/<name>: owned`), so instances
//! Karpenter launched are adopted and the other way round.
//!
//! Failures: an API error is returned with its operation; an instance id EC2 does not know (or
//! one already terminated) is `NodeClaimNotFound`, as the lifecycle expects.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use aws_sdk_ec2::types::{CapacityReservationPreference, Filter, InstanceLifecycleType, InstanceStateName};
use futures::FutureExt;
use joist_messages::{
    apis::ec2nodeclass::ReservationType,
    labels::tags,
    model::instance_type::{CapacityType, Reservation},
};
use joist_provider::{CloudError, Instance, InstanceState, launch::cluster_tag};

use crate::{
    clients::AwsClients,
    coalesce::{Coalescer, Window},
    error::AwsError,
};

/// What EC2 reports for one instance id.
type Described = Vec<aws_sdk_ec2::types::Instance>;

/// Instance lookups by id, coalesced ([`crate::coalesce`]): a drift check of many claims, or the
/// termination polls of many deleting claims, make one DescribeInstances call, not one each.
pub type Lookups = Coalescer<(), String, Result<Described, CloudError>>;

/// The lookups through `clients`.
pub fn lookups(clients: AwsClients) -> Lookups {
    Coalescer::new(
        Window::DESCRIBE,
        Arc::new(move |(), ids: Vec<String>| {
            let clients = clients.clone();
            async move {
                // Each call's instances by id, so every caller finds its own without a scan.
                let by_id = |ids| async {
                    let described = describe_ec2(&clients, Vec::new(), ids).await?;
                    let mut by_id: HashMap<String, Described> = HashMap::new();
                    for instance in described {
                        let id = instance.instance_id().unwrap_or_default().to_owned();
                        by_id.entry(id).or_default().push(instance);
                    }
                    Ok(by_id)
                };
                for_each_id(&ids, by_id, |by_id: &HashMap<String, Described>, id| {
                    by_id.get(id).cloned().unwrap_or_default()
                })
                .await
            }
            .boxed()
        }),
    )
}

/// The error a caller gets whose coalesced `operation` was dropped before it answered (the
/// runtime shutting down).
pub fn abandoned(operation: &str) -> CloudError {
    CloudError::Transient {
        message: format!("the {operation} call was abandoned before it answered"),
    }
}

/// The provider ID Kubernetes uses for an instance: `aws:///us-west-2a/i-0123…`.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The instance id inside a provider ID, if it is one of AWS's.
pub fn instance_id(provider_id: &str) -> Option<&str> {
    let id = joist_provider::provider_id::instance_id(provider_id.strip_prefix("aws:///")?);
    id.starts_with("i-").then_some(id)
}

/// Joist's live instances in `cluster`.
pub async fn list(clients: &AwsClients, cluster: &str) -> Result<Vec<Instance>, AwsError> {
    let filters = vec![
        Filter::builder().name("tag-key").values(tags::NODEPOOL).build(),
        Filter::builder()
            .name(format!("tag:{}", cluster_tag(cluster)))
            .values("owned")
            .build(),
        Filter::builder()
            .name("instance-state-name")
            .values("pending")
            .values("running")
            .values("stopping")
            .values("stopped")
            .values("shutting-down")
            .build(),
    ];
    describe(clients, filters, Vec::new()).await
}

/// The instance behind `provider_id`.
pub async fn get(lookups: &Lookups, provider_id: &str) -> Result<Instance, CloudError> {
    by_provider_id(lookups, provider_id)
        .await?
        .iter()
        .filter_map(instance)
        .find(|i| i.state != InstanceState::Terminated)
        .ok_or_else(|| not_found(provider_id))
}

/// What EC2 reports for the instance behind `provider_id`: `NodeClaimNotFound` when the provider
/// ID is not AWS's or EC2 does not know the id.
async fn by_provider_id(lookups: &Lookups, provider_id: &str) -> Result<Described, CloudError> {
    by_instance(lookups, "DescribeInstances", provider_id).await
}

/// The answer a coalesced `operation` by instance id gives for the instance behind `provider_id`:
/// `NodeClaimNotFound`, naming the provider ID, when it is not AWS's or EC2 does not know the id.
pub async fn by_instance<T: Send + 'static>(
    coalescer: &Coalescer<(), String, Result<T, CloudError>>,
    operation: &str,
    provider_id: &str,
) -> Result<T, CloudError> {
    let id = instance_id(provider_id).ok_or_else(|| not_found(provider_id))?;
    coalescer
        .submit((), id.to_owned())
        .await
        .unwrap_or_else(|| Err(abandoned(operation)))
        .map_err(|error| match error {
            CloudError::NodeClaimNotFound { .. } => not_found(provider_id),
            other => other,
        })
}

fn not_found(provider_id: &str) -> CloudError {
    CloudError::NodeClaimNotFound {
        provider_id: provider_id.to_owned(),
    }
}

/// Terminates the instances `ids` in one call and answers for each, in order: `Ok` once EC2
/// is terminating it, `NodeClaimNotFound` when EC2 does not know it.
pub async fn terminate_all(clients: &AwsClients, ids: &[String]) -> Vec<Result<(), CloudError>> {
    for_each_id(ids, |ids| terminate(clients, ids), |(), _| ()).await
}

/// Makes `call` for all `ids` at once and gives each id its part of the answer (`part`), in order.
/// One unknown id fails EC2's whole call, so then `call` is made for each id on its own, and an id
/// EC2 does not know gets `NodeClaimNotFound`.
async fn for_each_id<A, T, F, Fut>(
    ids: &[String],
    call: F,
    part: impl Fn(&A, &str) -> T,
) -> Vec<Result<T, CloudError>>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Result<A, AwsError>>,
{
    match call(ids.to_vec()).await {
        Ok(answer) => ids.iter().map(|id| Ok(part(&answer, id))).collect(),
        Err(error) if is_not_found(&error) && ids.len() > 1 => {
            let mut results = Vec::with_capacity(ids.len());
            for id in ids {
                let alone = call(vec![id.clone()]).await;
                results.push(
                    alone
                        .map(|answer| part(&answer, id))
                        .map_err(|e| error_for(e, id)),
                );
            }
            results
        }
        Err(error) => ids.iter().map(|id| Err(error_for(error.clone(), id))).collect(),
    }
}

async fn terminate(clients: &AwsClients, ids: Vec<String>) -> Result<(), AwsError> {
    clients
        .ec2
        .terminate_instances()
        .set_instance_ids(Some(ids))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| AwsError::api("TerminateInstances", e.into_service_error()))
}

fn is_not_found(error: &AwsError) -> bool {
    error.code() == Some("InvalidInstanceID.NotFound")
}

/// The error a caller asking about instance `id` gets for `error`.
fn error_for(error: AwsError, id: &str) -> CloudError {
    if is_not_found(&error) {
        not_found(id)
    } else {
        error.into()
    }
}

/// Adds `tags` to the instance `id`.
pub async fn tag(clients: &AwsClients, id: &str, tags: &[(&str, &str)]) -> Result<(), AwsError> {
    clients
        .ec2
        .create_tags()
        .resources(id)
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| AwsError::api("CreateTags", e.into_service_error()))
}

/// Where an instance was put: what drift is judged on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The image it booted.
    pub image_id: String,
    /// Its subnet.
    pub subnet_id: String,
    /// Its security groups.
    pub security_group_ids: Vec<String>,
    /// The capacity reservation it runs in, while it is reserved.
    pub reservation_id: Option<String>,
    /// The partition of its placement group it runs in (EC2 says 0 for none).
    pub partition: Option<u32>,
}

/// The placement of the instance behind `provider_id`.
pub async fn placement(lookups: &Lookups, provider_id: &str) -> Result<Placement, CloudError> {
    let described = by_provider_id(lookups, provider_id).await?;
    let instance = described.first().ok_or_else(|| not_found(provider_id))?;
    Ok(Placement {
        image_id: instance.image_id().unwrap_or_default().to_owned(),
        subnet_id: instance.subnet_id().unwrap_or_default().to_owned(),
        security_group_ids: instance
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect(),
        reservation_id: reservation(instance).map(|r| r.id),
        partition: instance
            .placement()
            .and_then(|p| p.partition_number())
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0),
    })
}

async fn describe(
    clients: &AwsClients,
    filters: Vec<Filter>,
    ids: Vec<String>,
) -> Result<Vec<Instance>, AwsError> {
    let mut instances: Vec<Instance> = describe_ec2(clients, filters, ids)
        .await?
        .iter()
        .filter_map(instance)
        .collect();
    instances.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    Ok(instances)
}

/// Every instance matching `filters` and `ids`, every page followed.
async fn describe_ec2(
    clients: &AwsClients,
    filters: Vec<Filter>,
    ids: Vec<String>,
) -> Result<Vec<aws_sdk_ec2::types::Instance>, AwsError> {
    let reservations = clients
        .ec2
        .describe_instances()
        .set_filters((!filters.is_empty()).then_some(filters))
        .set_instance_ids((!ids.is_empty()).then_some(ids))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| AwsError::api("DescribeInstances", e.into_service_error()))?;
    Ok(reservations
        .into_iter()
        .flat_map(|r| r.instances.unwrap_or_default())
        .collect())
}

/// The neutral view of an EC2 instance; `None` without an id or a zone.
fn instance(ec2: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
    let id = ec2.instance_id()?;
    let zone = ec2.placement()?.availability_zone()?;
    let tags: BTreeMap<String, String> = ec2
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or_default().to_owned())))
        .collect();
    let reservation = reservation(ec2);
    let capacity_type = match (&reservation, ec2.instance_lifecycle()) {
        (Some(_), _) => CapacityType::Reserved,
        (None, Some(InstanceLifecycleType::Spot)) => CapacityType::Spot,
        (None, _) => CapacityType::OnDemand,
    };
    let state = match ec2.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Pending) => InstanceState::Pending,
        Some(InstanceStateName::Running) => InstanceState::Running,
        Some(InstanceStateName::Terminated) => InstanceState::Terminated,
        _ => InstanceState::ShuttingDown,
    };
    Some(Instance {
        provider_id: provider_id(zone, id),
        instance_type: ec2
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        zone: zone.to_owned(),
        capacity_type,
        reservation,
        image_id: ec2.image_id().unwrap_or_default().to_owned(),
        price: 0.0,
        state,
        launched_at: ec2.launch_time().map_or(0, |t| t.secs()),
        tags,
    })
}

/// The reservation an instance runs in, as Karpenter reads it: reserved only while it has a
/// reservation id and may run nowhere else (`capacity-reservations-only`); a capacity block or an
/// interruptible reservation by its lifecycle.
fn reservation(ec2: &aws_sdk_ec2::types::Instance) -> Option<Reservation> {
    let id = ec2.capacity_reservation_id()?;
    let only = ec2
        .capacity_reservation_specification()
        .and_then(|s| s.capacity_reservation_preference())
        == Some(&CapacityReservationPreference::CapacityReservationsOnly);
    only.then(|| Reservation {
        id: id.to_owned(),
        kind: if ec2.instance_lifecycle() == Some(&InstanceLifecycleType::CapacityBlock) {
            ReservationType::CapacityBlock
        } else {
            ReservationType::Default
        },
        interruptible: ec2.instance_lifecycle()
            == Some(&InstanceLifecycleType::InterruptibleCapacityReservation),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_foreign_ones_are_refused() {
        let id = provider_id("us-west-2a", "i-0123456789abcdef0");
        assert_eq!(id, "aws:///us-west-2a/i-0123456789abcdef0");
        assert_eq!(instance_id(&id), Some("i-0123456789abcdef0"));
        assert_eq!(instance_id("kwok://node-1"), None);
        assert_eq!(instance_id("aws:///us-west-2a/not-an-instance"), None);
    }
}

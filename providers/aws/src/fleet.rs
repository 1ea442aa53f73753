//! EC2 CreateFleet of type `instant`, as Karpenter sends it: one launch-template config per
//! template, overrides = instance types × the chosen subnet of each zone, each override's
//! `Priority` its rank by price (0 first); spot fleets use `price-capacity-optimized`, on-demand
//! fleets (and ODCR launches) `lowest-price`; a capacity block is launched as `capacity-block`
//! capacity and an interruptible reservation as `reserved-capacity`; the fleet and its instances
//! and volumes carry the launch tags. A launch into a placement group has its capacity errors
//! scoped to the group, and a spread group's limit in a zone marks every type asked for there.
//!
//! Identical requests are meant to be coalesced into one call for `count` instances
//! ([`crate::coalesce`]); [`FleetOutcome::into_results`] fans the answer back out, one instance per
//! caller.
//!
//! Failures: a call EC2 refuses outright is an [`AwsError`]. A fleet that launches fewer instances
//! than asked answers the rest with its per-override errors: when they are capacity errors
//! ([`CAPACITY_ERROR_CODES`]) a `CloudError::InsufficientCapacity` naming the offerings (for the
//! unavailable-offering cache), otherwise a `CloudError::Create` with EC2's code and words.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{
    DefaultTargetCapacityType, FleetLaunchTemplateConfigRequest, FleetLaunchTemplateOverridesRequest,
    FleetLaunchTemplateSpecificationRequest, FleetOnDemandAllocationStrategy, FleetReservationType,
    FleetType, InstanceLifecycle, InstanceType as Ec2InstanceType, LaunchTemplateAndOverridesResponse,
    OnDemandOptionsRequest, ReservedCapacityOptionsRequest, ResourceType, SpotAllocationStrategy,
    SpotOptionsRequest, Tag, TagSpecification, TargetCapacitySpecificationRequest,
};
use joist_messages::{apis::ec2nodeclass::ReservationType, model::instance_type::CapacityType};
use joist_provider::{CloudError, OfferingKey, placement_group};

use crate::{clients::AwsClients, error::AwsError};

/// The CreateFleet error codes that mean "no capacity here now": the offering goes to the
/// unavailable-offering cache and the next attempt goes elsewhere.
pub const CAPACITY_ERROR_CODES: [&str; 7] = [
    "InsufficientInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "UnfulfillableCapacity",
    "Unsupported",
    "InsufficientFreeAddressesInSubnet",
    "MaxFleetCountExceeded",
];

/// The code a spread placement group's limit is reported under once Joist read it as a capacity
/// error (EC2 tells it by its words, not its code).
const SPREAD_LIMIT_CODE: &str = "SpreadPlacementGroupLimitExceeded";

/// Whether a CreateFleet error code is a capacity error (see [`CAPACITY_ERROR_CODES`]).
pub fn is_capacity_error(code: &str) -> bool {
    CAPACITY_ERROR_CODES.contains(&code) || code == SPREAD_LIMIT_CODE
}

/// One instance type in one subnet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Override {
    /// The instance type.
    pub instance_type: String,
    /// The subnet.
    pub subnet_id: String,
    /// The subnet's zone.
    pub zone: String,
    /// Rank by price, 0 for the cheapest.
    pub priority: u32,
}

/// The overrides launched with one template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TemplateConfig {
    /// The template's name.
    pub template: String,
    /// Its overrides.
    pub overrides: Vec<Override>,
}

/// One fleet request, less its size: equal requests can share one call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FleetRequest {
    /// Spot, on-demand or reserved.
    pub capacity_type: CapacityType,
    /// For a reserved launch, the kind of reservation every override's template targets: an
    /// ODCR is launched as on-demand capacity, a capacity block as `capacity-block`, an
    /// interruptible reservation as `reserved-capacity`.
    pub reservation: Option<(ReservationType, bool)>,
    /// Launch by the overrides' `Priority` (the overlaid price rank) instead of EC2's prices:
    /// `prioritized` on-demand, `capacity-optimized-prioritized` spot, as Karpenter does when a
    /// NodeOverlay changed a price.
    pub prioritized: bool,
    /// The placement group (its id) every template launches into: capacity errors are scoped to it.
    pub placement_group: Option<String>,
    /// One config per template.
    pub configs: Vec<TemplateConfig>,
    /// The launch tags.
    pub tags: BTreeMap<String, String>,
}

/// An instance the fleet launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    /// `i-0123…`.
    pub instance_id: String,
    /// The offering it was launched in.
    pub offering: OfferingKey,
}

/// An error the fleet reported for one override (or for the whole request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetError {
    /// EC2's code (`InsufficientInstanceCapacity`).
    pub code: String,
    /// EC2's words.
    pub message: String,
    /// The offering it concerns, when EC2 named one.
    pub offering: Option<OfferingKey>,
}

/// What one CreateFleet call returned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetOutcome {
    /// The instances, in EC2's order.
    pub launched: Vec<Launched>,
    /// The errors.
    pub errors: Vec<FleetError>,
}

impl FleetOutcome {
    /// One result per caller of a coalesced request for `count` instances: an instance each while
    /// they last, with the offerings that reported capacity errors (for the unavailable-offering
    /// cache), then the error the fleet's errors amount to (see the module docs).
    pub fn into_results(self, count: usize) -> Vec<Result<(Launched, Vec<OfferingKey>), CloudError>> {
        let unavailable: Vec<OfferingKey> = self
            .errors
            .iter()
            .filter(|e| is_capacity_error(&e.code))
            .filter_map(|e| e.offering.clone())
            .collect();
        let failure = failure(&self.errors, &unavailable);
        let mut launched = self.launched.into_iter();
        (0..count)
            .map(|_| {
                launched
                    .next()
                    .map(|l| (l, unavailable.clone()))
                    .ok_or_else(|| failure.clone())
            })
            .collect()
    }
}

/// What a fleet that launched nothing (for one caller) amounts to: a capacity error naming the
/// `unavailable` offerings when any error was one (or EC2 said nothing), else EC2's first code.
fn failure(errors: &[FleetError], unavailable: &[OfferingKey]) -> CloudError {
    let mut said: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.code, e.message))
        .collect();
    said.dedup();
    match errors.first() {
        Some(first) if !errors.iter().any(|e| is_capacity_error(&e.code)) => CloudError::Create {
            reason: first.code.clone(),
            message: said.join("; "),
        },
        Some(_) => CloudError::InsufficientCapacity {
            offerings: unavailable.to_vec(),
            message: said.join("; "),
        },
        None => CloudError::InsufficientCapacity {
            offerings: Vec::new(),
            message: "CreateFleet launched fewer instances than asked and reported no error".to_owned(),
        },
    }
}

/// How a spot fleet chooses among its overrides.
fn spot_strategy(prioritized: bool) -> SpotAllocationStrategy {
    if prioritized {
        SpotAllocationStrategy::CapacityOptimizedPrioritized
    } else {
        SpotAllocationStrategy::PriceCapacityOptimized
    }
}

/// How an on-demand fleet chooses among its overrides.
fn on_demand_strategy(prioritized: bool) -> FleetOnDemandAllocationStrategy {
    if prioritized {
        FleetOnDemandAllocationStrategy::Prioritized
    } else {
        FleetOnDemandAllocationStrategy::LowestPrice
    }
}

/// Sends `request` for `count` instances.
pub async fn create(
    clients: &AwsClients,
    request: &FleetRequest,
    count: usize,
) -> Result<FleetOutcome, AwsError> {
    let (target, spot, on_demand) = match request.capacity_type {
        CapacityType::Spot => (
            DefaultTargetCapacityType::Spot,
            Some(
                SpotOptionsRequest::builder()
                    .allocation_strategy(spot_strategy(request.prioritized))
                    .build(),
            ),
            None,
        ),
        _ => (
            DefaultTargetCapacityType::OnDemand,
            None,
            Some(
                OnDemandOptionsRequest::builder()
                    .allocation_strategy(on_demand_strategy(request.prioritized))
                    .build(),
            ),
        ),
    };
    let (target, on_demand, reserved) = match (request.capacity_type, request.reservation) {
        (CapacityType::Reserved, Some((ReservationType::CapacityBlock, _))) => {
            (DefaultTargetCapacityType::CapacityBlock, None, None)
        }
        (CapacityType::Reserved, Some((_, true))) => (
            DefaultTargetCapacityType::ReservedCapacity,
            None,
            Some(
                ReservedCapacityOptionsRequest::builder()
                    .reservation_types(FleetReservationType::InterruptibleCapacityReservation)
                    .build(),
            ),
        ),
        _ => (target, on_demand, None),
    };
    let tags: Vec<Tag> = request
        .tags
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect();
    let tag_specifications = [ResourceType::Instance, ResourceType::Volume, ResourceType::Fleet]
        .into_iter()
        .map(|resource| {
            TagSpecification::builder()
                .resource_type(resource)
                .set_tags(Some(tags.clone()))
                .build()
        })
        .collect();
    let output = clients
        .ec2
        .create_fleet()
        .r#type(FleetType::Instant)
        .target_capacity_specification(
            TargetCapacitySpecificationRequest::builder()
                .total_target_capacity(i32::try_from(count).unwrap_or(i32::MAX))
                .default_target_capacity_type(target)
                .build(),
        )
        .set_spot_options(spot)
        .set_on_demand_options(on_demand)
        .set_reserved_capacity_options(reserved)
        .set_launch_template_configs(Some(request.configs.iter().map(config).collect()))
        .set_tag_specifications(Some(tag_specifications))
        .send()
        .await
        .map_err(|e| AwsError::api("CreateFleet", e.into_service_error()))?;
    let zones: BTreeMap<&str, &str> = request
        .configs
        .iter()
        .flat_map(|c| &c.overrides)
        .map(|o| (o.subnet_id.as_str(), o.zone.as_str()))
        .collect();
    let offering = |response: Option<&LaunchTemplateAndOverridesResponse>,
                    lifecycle: Option<&InstanceLifecycle>| {
        let overrides = response?.overrides()?;
        let zone = overrides
            .availability_zone()
            .or_else(|| zones.get(overrides.subnet_id()?).copied())?;
        Some(OfferingKey {
            instance_type: overrides.instance_type()?.as_str().to_owned(),
            zone: zone.to_owned(),
            capacity_type: match lifecycle {
                Some(InstanceLifecycle::Spot) => CapacityType::Spot,
                // A reservation's instance reports the lifecycle it is billed as.
                _ if request.capacity_type == CapacityType::Reserved => CapacityType::Reserved,
                Some(_) => CapacityType::OnDemand,
                None => request.capacity_type,
            },
            placement_group: request.placement_group.clone(),
        })
    };
    let launched = output
        .instances()
        .iter()
        .flat_map(|fleet_instance| {
            let offering = offering(
                fleet_instance.launch_template_and_overrides(),
                fleet_instance.lifecycle(),
            );
            fleet_instance.instance_ids().iter().filter_map(move |id| {
                Some(Launched {
                    instance_id: id.clone(),
                    offering: offering.clone()?,
                })
            })
        })
        .collect();
    let errors = output
        .errors()
        .iter()
        .flat_map(|error| {
            let reported = FleetError {
                code: error.error_code().unwrap_or("Unknown").to_owned(),
                message: error.error_message().unwrap_or_default().to_owned(),
                offering: offering(error.launch_template_and_overrides(), error.lifecycle()),
            };
            spread_limit_everywhere_in_zone(request, reported)
        })
        .collect();
    Ok(FleetOutcome { launched, errors })
}

/// A spread group's limit reached in a zone holds for every type in that zone: the error is
/// repeated for each of the request's overrides there, as a capacity error, so the whole zone goes
/// to the unavailable-offering cache (scoped to the group). Any other error is kept as it is.
fn spread_limit_everywhere_in_zone(request: &FleetRequest, error: FleetError) -> Vec<FleetError> {
    let Some(reported) = error
        .offering
        .clone()
        .filter(|_| placement_group::is_spread_limit(&error.message))
    else {
        return vec![error];
    };
    let mut types: Vec<&str> = request
        .configs
        .iter()
        .flat_map(|c| &c.overrides)
        .filter(|o| o.zone == reported.zone)
        .map(|o| o.instance_type.as_str())
        .collect();
    types.sort_unstable();
    types.dedup();
    types
        .into_iter()
        .map(|instance_type| FleetError {
            code: SPREAD_LIMIT_CODE.to_owned(),
            message: error.message.clone(),
            offering: Some(OfferingKey {
                instance_type: instance_type.to_owned(),
                ..reported.clone()
            }),
        })
        .collect()
}

fn config(config: &TemplateConfig) -> FleetLaunchTemplateConfigRequest {
    FleetLaunchTemplateConfigRequest::builder()
        .launch_template_specification(
            FleetLaunchTemplateSpecificationRequest::builder()
                .launch_template_name(&config.template)
                .version("$Latest")
                .build(),
        )
        .set_overrides(Some(
            config
                .overrides
                .iter()
                .map(|o| {
                    FleetLaunchTemplateOverridesRequest::builder()
                        .instance_type(Ec2InstanceType::from(o.instance_type.as_str()))
                        .subnet_id(&o.subnet_id)
                        .availability_zone(&o.zone)
                        .priority(f64::from(o.priority))
                        .build()
                })
                .collect(),
        ))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlaid_price_makes_the_fleet_launch_by_priority() {
        assert_eq!(
            on_demand_strategy(false),
            FleetOnDemandAllocationStrategy::LowestPrice
        );
        assert_eq!(
            on_demand_strategy(true),
            FleetOnDemandAllocationStrategy::Prioritized
        );
        assert_eq!(
            spot_strategy(false),
            SpotAllocationStrategy::PriceCapacityOptimized
        );
        assert_eq!(
            spot_strategy(true),
            SpotAllocationStrategy::CapacityOptimizedPrioritized
        );
    }

    fn key(instance_type: &str) -> OfferingKey {
        OfferingKey {
            instance_type: instance_type.into(),
            zone: "us-west-2a".into(),
            capacity_type: CapacityType::Spot,
            placement_group: None,
        }
    }

    fn error(code: &str, instance_type: &str) -> FleetError {
        FleetError {
            code: code.into(),
            message: format!("{code} for {instance_type}"),
            offering: Some(key(instance_type)),
        }
    }

    #[test]
    fn a_coalesced_fleet_gives_each_caller_one_instance_and_the_rest_the_capacity_error() {
        let outcome = FleetOutcome {
            launched: vec![Launched {
                instance_id: "i-1".into(),
                offering: key("m5.large"),
            }],
            errors: vec![error("InsufficientInstanceCapacity", "c5.large")],
        };
        let results = outcome.into_results(2);
        assert_eq!(results.len(), 2);
        assert!(
            matches!(&results[0], Ok((l, unavailable)) if l.instance_id == "i-1" && unavailable == &[key("c5.large")])
        );
        let Err(CloudError::InsufficientCapacity { offerings, message }) = &results[1] else {
            panic!("{:?}", results[1])
        };
        assert_eq!(offerings, &[key("c5.large")]);
        assert!(message.contains("InsufficientInstanceCapacity"), "{message}");
    }

    #[test]
    fn only_non_capacity_errors_are_a_create_error_with_ec2s_code() {
        let outcome = FleetOutcome {
            launched: Vec::new(),
            errors: vec![error("InvalidLaunchTemplateName.NotFoundException", "m5.large")],
        };
        let results = outcome.into_results(1);
        assert!(
            matches!(&results[0], Err(CloudError::Create { reason, .. }) if reason == "InvalidLaunchTemplateName.NotFoundException"),
            "{results:?}"
        );
        let every_code_is_capacity = CAPACITY_ERROR_CODES.iter().all(|code| is_capacity_error(code));
        assert!(every_code_is_capacity && !is_capacity_error("UnauthorizedOperation"));
    }

    #[test]
    fn a_full_spread_group_marks_every_type_asked_for_in_its_zone_for_that_group_only() {
        let overrides = |zone: &str, types: &[&str]| {
            types
                .iter()
                .map(|t| Override {
                    instance_type: (*t).into(),
                    subnet_id: format!("subnet-{zone}"),
                    zone: zone.into(),
                    priority: 0,
                })
                .collect::<Vec<_>>()
        };
        let mut both_zones = overrides("us-west-2a", &["m5.large", "c5.large"]);
        both_zones.extend(overrides("us-west-2b", &["m5.large"]));
        let request = FleetRequest {
            capacity_type: CapacityType::OnDemand,
            reservation: None,
            prioritized: false,
            placement_group: Some("pg-1".into()),
            configs: vec![TemplateConfig {
                template: "t".into(),
                overrides: both_zones,
            }],
            tags: BTreeMap::new(),
        };
        let scoped = OfferingKey {
            placement_group: Some("pg-1".into()),
            ..key("m5.large")
        };
        let full = FleetError {
            code: "InsufficientInstanceCapacity".into(),
            message: "You have reached the limit of instances in this spread placement group".into(),
            offering: Some(scoped),
        };
        let marked = spread_limit_everywhere_in_zone(&request, full);
        let keys: Vec<String> = marked
            .iter()
            .filter_map(|e| e.offering.as_ref())
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            keys,
            ["spot:c5.large:us-west-2a:pg-1", "spot:m5.large:us-west-2a:pg-1"]
        );
        assert!(marked.iter().all(|e| is_capacity_error(&e.code)));
        let other = error("InsufficientInstanceCapacity", "m5.large");
        assert_eq!(spread_limit_everywhere_in_zone(&request, other.clone()), [other]);
    }
}

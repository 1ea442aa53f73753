//! EC2NodeClass resolution: the subnets, security groups and AMIs its selector terms select, and
//! the instance profile its nodes get, as the EC2NodeClass status reports them.
//!
//! - Subnets: by id, or by tags (a value of `*` only asks for the key), terms ORed.
//! - Security groups: by id, name or tags, terms ORed.
//! - AMIs: an alias reads the SSM parameters AWS publishes for the cluster's Kubernetes version
//!   ([`crate::ami`]); ids, tags, name, owner and SSM parameters go through `DescribeImages`.
//!   Per architecture and variant the newest non-deprecated image wins.
//! - Instance profile: `spec.instanceProfile` as given, or the one Joist keeps for `spec.role`
//!   ([`crate::instance_profile`]).
//! - Capacity reservations: [`crate::capacity_reservations`], none being no error.
//!
//! Failures: nothing selected is a [`ResolveError`] naming the field and what it asked for (the
//! class turns `Ready=False` with that message); an API error is returned as such, for a retry.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{Filter, Image};
use joist_messages::apis::{
    EC2NodeClass, EC2NodeClassStatus,
    common::NodeSelectorRequirementWithMinValues,
    ec2nodeclass::{ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet},
};

use joist_provider::capacity_reservation;

use crate::{
    ami::{self, AliasError},
    capacity_reservations,
    catalog::kubernetes_arch,
    clients::AwsClients,
    error::AwsError,
    instance_profile,
};

/// Why a node class does not resolve.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Nothing matched the selector terms of `field`.
    #[error("{field}: no {what} matches {terms}")]
    NothingSelected {
        /// `spec.subnetSelectorTerms`.
        field: &'static str,
        /// `subnet`.
        what: &'static str,
        /// The terms, as the user wrote them.
        terms: String,
    },
    /// An alias cannot be resolved.
    #[error(transparent)]
    Alias(#[from] AliasError),
    /// A part Joist does not build yet.
    #[error("{field}: {reason}")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// What is missing.
        reason: &'static str,
    },
    /// An API call failed.
    #[error(transparent)]
    Api(#[from] AwsError),
}

/// Resolves `class` for `cluster`, running Kubernetes `kubernetes` (`1.35`); with `room`, also
/// the capacity reservations it selects at `now` (seconds since the epoch), each one's room
/// counted there (none: reserved capacity is off, and none are asked for).
pub async fn resolve(
    clients: &AwsClients,
    class: &EC2NodeClass,
    (cluster, kubernetes): (&str, &str),
    room: Option<&capacity_reservation::Availability>,
    now: i64,
) -> Result<EC2NodeClassStatus, ResolveError> {
    let spec = &class.spec;
    let instance_profile = match (&spec.instance_profile, &spec.role) {
        (Some(profile), _) => profile.clone(),
        (None, Some(role)) => {
            let class_name = class.metadata.name.as_deref().unwrap_or_default();
            instance_profile::ensure(clients, cluster, class_name, role).await?
        }
        (None, None) => {
            return Err(ResolveError::Unsupported {
                field: "spec",
                reason: "neither spec.role nor spec.instanceProfile is set",
            });
        }
    };
    Ok(EC2NodeClassStatus {
        subnets: subnets(clients, class).await?,
        security_groups: security_groups(clients, class).await?,
        amis: amis(clients, class, kubernetes).await?,
        instance_profile: Some(instance_profile),
        capacity_reservations: match room {
            Some(room) => {
                capacity_reservations::describe(clients, &spec.capacity_reservation_selector_terms, now)
                    .await?
                    .into_iter()
                    .map(|(entry, available)| {
                        room.sync(&entry.id, available);
                        entry
                    })
                    .collect()
            }
            None => Vec::new(),
        },
        conditions: Vec::new(),
    })
}

/// Per zone, the one of `subnets` with the most free addresses (Karpenter's choice for a launch):
/// zone → subnet id.
pub async fn zonal_subnets(
    clients: &AwsClients,
    subnets: &[ResolvedSubnet],
) -> Result<BTreeMap<String, String>, AwsError> {
    let described = clients
        .ec2
        .describe_subnets()
        .set_subnet_ids(Some(subnets.iter().map(|s| s.id.clone()).collect()))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| AwsError::api("DescribeSubnets", e.into_service_error()))?;
    let mut best: BTreeMap<String, (i32, String)> = BTreeMap::new();
    for subnet in &described {
        let (Some(id), Some(zone)) = (subnet.subnet_id(), subnet.availability_zone()) else {
            continue;
        };
        let free = subnet.available_ip_address_count().unwrap_or(0);
        if best.get(zone).is_none_or(|(most, _)| free > *most) {
            best.insert(zone.to_owned(), (free, id.to_owned()));
        }
    }
    Ok(best.into_iter().map(|(zone, (_, id))| (zone, id)).collect())
}

/// `tag:K=V` filters for a tag selector; `*` asks only for the key.
fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<Filter> {
    tags.iter()
        .map(|(key, value)| {
            if value == "*" {
                Filter::builder().name("tag-key").values(key).build()
            } else {
                Filter::builder().name(format!("tag:{key}")).values(value).build()
            }
        })
        .collect()
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

fn describe_terms<T: serde::Serialize>(terms: &[T]) -> String {
    serde_json::to_string(terms).unwrap_or_default()
}

async fn subnets(clients: &AwsClients, class: &EC2NodeClass) -> Result<Vec<ResolvedSubnet>, ResolveError> {
    let terms = &class.spec.subnet_selector_terms;
    let mut found = BTreeMap::new();
    for term in terms {
        let mut filters = tag_filters(&term.tags);
        if let Some(id) = &term.id {
            filters.push(filter("subnet-id", id));
        }
        let subnets = clients
            .ec2
            .describe_subnets()
            .set_filters(Some(filters))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| AwsError::api("DescribeSubnets", e.into_service_error()))?;
        for subnet in subnets {
            if let (Some(id), Some(zone)) = (subnet.subnet_id(), subnet.availability_zone()) {
                let resolved = ResolvedSubnet {
                    id: id.to_owned(),
                    zone: zone.to_owned(),
                    zone_id: subnet.availability_zone_id().map(str::to_owned),
                };
                found.insert(id.to_owned(), resolved);
            }
        }
    }
    if found.is_empty() {
        return Err(ResolveError::NothingSelected {
            field: "spec.subnetSelectorTerms",
            what: "subnet",
            terms: describe_terms(terms),
        });
    }
    let mut subnets: Vec<ResolvedSubnet> = found.into_values().collect();
    subnets.sort_by(|a, b| (&a.zone, &a.id).cmp(&(&b.zone, &b.id)));
    Ok(subnets)
}

async fn security_groups(
    clients: &AwsClients,
    class: &EC2NodeClass,
) -> Result<Vec<ResolvedSecurityGroup>, ResolveError> {
    let terms = &class.spec.security_group_selector_terms;
    let mut found = BTreeMap::new();
    for term in terms {
        let mut filters = tag_filters(&term.tags);
        if let Some(id) = &term.id {
            filters.push(filter("group-id", id));
        }
        if let Some(name) = &term.name {
            filters.push(filter("group-name", name));
        }
        let groups = clients
            .ec2
            .describe_security_groups()
            .set_filters(Some(filters))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| AwsError::api("DescribeSecurityGroups", e.into_service_error()))?;
        for group in groups {
            if let Some(id) = group.group_id() {
                let resolved = ResolvedSecurityGroup {
                    id: id.to_owned(),
                    name: group.group_name().map(str::to_owned),
                };
                found.insert(id.to_owned(), resolved);
            }
        }
    }
    if found.is_empty() {
        return Err(ResolveError::NothingSelected {
            field: "spec.securityGroupSelectorTerms",
            what: "security group",
            terms: describe_terms(terms),
        });
    }
    Ok(found.into_values().collect())
}

/// An image found for a term, with the requirements of the types it serves.
struct Candidate {
    image: Image,
    requirements: Vec<NodeSelectorRequirementWithMinValues>,
}

async fn amis(
    clients: &AwsClients,
    class: &EC2NodeClass,
    kubernetes: &str,
) -> Result<Vec<ResolvedAmi>, ResolveError> {
    let terms = &class.spec.ami_selector_terms;
    let mut candidates = Vec::new();
    for (index, term) in terms.iter().enumerate() {
        if let Some(alias) = &term.alias {
            for parameter in ami::parameters(alias, index, kubernetes)? {
                let Some(id) = ssm_parameter(clients, &parameter.path).await? else {
                    continue;
                };
                for image in describe_images(clients, vec![filter("image-id", &id)], Vec::new()).await? {
                    candidates.push(Candidate {
                        image,
                        requirements: parameter.requirements.clone(),
                    });
                }
            }
            continue;
        }
        let mut filters = tag_filters(&term.tags);
        if let Some(id) = &term.id {
            filters.push(filter("image-id", id));
        }
        if let Some(name) = &term.name {
            filters.push(filter("name", name));
        }
        if let Some(path) = &term.ssm_parameter {
            match ssm_parameter(clients, path).await? {
                Some(id) => filters.push(filter("image-id", &id)),
                None => continue,
            }
        }
        let owners = term.owner.iter().cloned().collect();
        for image in describe_images(clients, filters, owners).await? {
            let arch = image
                .architecture()
                .and_then(|a| kubernetes_arch(a.as_str()))
                .unwrap_or("amd64");
            let requirements = vec![ami::arch_requirement(arch)];
            candidates.push(Candidate { image, requirements });
        }
    }
    let amis = newest_per_requirements(candidates);
    if amis.is_empty() {
        return Err(ResolveError::NothingSelected {
            field: "spec.amiSelectorTerms",
            what: "AMI",
            terms: describe_terms(terms),
        });
    }
    Ok(amis)
}

/// Per requirement set, the newest image, non-deprecated ones first (Karpenter's order).
fn newest_per_requirements(candidates: Vec<Candidate>) -> Vec<ResolvedAmi> {
    let mut best: BTreeMap<String, (bool, String, ResolvedAmi)> = BTreeMap::new();
    for Candidate { image, requirements } in candidates {
        let Some(id) = image.image_id() else { continue };
        let deprecated = image.deprecation_time().is_some_and(|t| !t.is_empty());
        let created = image.creation_date().unwrap_or_default().to_owned();
        let key = serde_json::to_string(&requirements).unwrap_or_default();
        let rank = (!deprecated, created.clone());
        let better = best
            .get(&key)
            .is_none_or(|(fresh, date, _)| rank > (*fresh, date.clone()));
        if better {
            let ami = ResolvedAmi {
                id: id.to_owned(),
                name: image.name().map(str::to_owned),
                deprecated,
                requirements,
            };
            best.insert(key, (!deprecated, created, ami));
        }
    }
    best.into_values().map(|(_, _, ami)| ami).collect()
}

async fn describe_images(
    clients: &AwsClients,
    filters: Vec<Filter>,
    owners: Vec<String>,
) -> Result<Vec<Image>, AwsError> {
    clients
        .ec2
        .describe_images()
        .set_filters(Some(filters))
        .set_owners((!owners.is_empty()).then_some(owners))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| AwsError::api("DescribeImages", e.into_service_error()))
}

/// The value of an SSM parameter; `None` when it does not exist (that variant is not published).
async fn ssm_parameter(clients: &AwsClients, path: &str) -> Result<Option<String>, AwsError> {
    match clients.ssm.get_parameter().name(path).send().await {
        Ok(output) => Ok(output.parameter().and_then(|p| p.value()).map(str::to_owned)),
        Err(error) => {
            let error = error.into_service_error();
            if error.is_parameter_not_found() {
                Ok(None)
            } else {
                Err(AwsError::api("GetParameter", error))
            }
        }
    }
}

//! Which offerings a NodeClaim may launch into, best first: the choice every provider makes before
//! it calls its cloud (the AWS provider turns the answer into CreateFleet overrides; the simulated
//! cloud tries them in order).
//!
//! As Karpenter does: keep the instance types whose labels meet the claim's requirements and whose
//! allocatable resources hold its requests; keep their available offerings in an allowed zone;
//! buy reserved capacity if any is offered, else spot if the claim allows it, else on-demand; order
//! by price and keep at most [`MAX_INSTANCE_TYPES`] types. Fails with a typed error naming the
//! claim when its requirements do not parse or nothing is left.
//!
//! Also here, because every provider writes them the same way: the labels a launched node carries
//! ([`node_labels`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use joist_messages::{
    apis::{EC2NodeClass, NodeClaim},
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, REGION, ZONE, aws, tags},
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        requirements::Requirements,
        resources::Resources,
    },
};

use crate::{CloudError, OfferingKey};

/// At most this many instance types go into one launch request.
pub const MAX_INSTANCE_TYPES: usize = 60;

/// One offering to try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// The type.
    pub instance_type: &'a InstanceType,
    /// The offering.
    pub offering: &'a Offering,
}

impl Candidate<'_> {
    /// The offering's cache key.
    pub fn key(&self) -> OfferingKey {
        OfferingKey {
            instance_type: self.instance_type.name.clone(),
            zone: self.offering.zone.clone(),
            capacity_type: self.offering.capacity_type,
        }
    }
}

/// The tag key that marks an instance as `cluster`'s (`kubernetes.io/cluster/<cluster>=owned`).
pub fn cluster_tag(cluster: &str) -> String {
    format!("{}{cluster}", tags::CLUSTER_PREFIX)
}

/// The tags every instance launched for `claim` through `class` in `cluster` carries, as Karpenter
/// tags it (so either controller adopts the other's instances): the class's own `spec.tags`, then
/// cluster ownership, the EKS cluster name, the EC2NodeClass and the NodePool. The NodeClaim's
/// name (`karpenter.sh/nodeclaim`) is the caller's to add, when its launch allows.
pub fn instance_tags(cluster: &str, class: &EC2NodeClass, claim: &NodeClaim) -> BTreeMap<String, String> {
    let mut instance_tags = class.spec.tags.clone();
    instance_tags.extend([
        (cluster_tag(cluster), "owned".to_owned()),
        (tags::EKS_CLUSTER_NAME.to_owned(), cluster.to_owned()),
        (
            tags::EC2_NODE_CLASS.to_owned(),
            class.metadata.name.clone().unwrap_or_default(),
        ),
    ]);
    if let Some(pool) = claim.metadata.labels.as_ref().and_then(|l| l.get(NODEPOOL)) {
        instance_tags.insert(tags::NODEPOOL.to_owned(), pool.clone());
    }
    instance_tags
}

/// The labels a node of `instance_type` in `zone` carries, before the NodeClaim's own: the
/// instance type's single-valued labels, zone, region, capacity type, and the zone's ID
/// (`topology.k8s.aws/zone-id`) when `node_class` resolved a subnet in it.
pub fn node_labels(
    instance_type: &InstanceType,
    region: &str,
    zone: &str,
    capacity_type: &str,
    node_class: &EC2NodeClass,
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = instance_type
        .requirements
        .implied_labels()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    labels.insert(ZONE.to_owned(), zone.to_owned());
    labels.insert(REGION.to_owned(), region.to_owned());
    labels.insert(CAPACITY_TYPE.to_owned(), capacity_type.to_owned());
    let zone_id = node_class
        .status
        .iter()
        .flat_map(|s| &s.subnets)
        .find(|s| s.zone == zone)
        .and_then(|s| s.zone_id.clone());
    if let Some(zone_id) = zone_id {
        labels.insert(aws::ZONE_ID.to_owned(), zone_id);
    }
    labels
}

/// The claim's requirements as a set, or a `Create` error naming the bad one.
pub fn claim_requirements(claim: &NodeClaim) -> Result<Requirements, CloudError> {
    claim
        .spec
        .requirements
        .iter()
        .map(|r| r.to_requirement())
        .collect::<Result<Requirements, _>>()
        .map_err(|e| CloudError::Create {
            reason: "InvalidRequirements".to_owned(),
            message: format!(
                "nodeclaim {:?} spec.requirements: {e}",
                claim.metadata.name.as_deref().unwrap_or_default()
            ),
        })
}

/// The offerings to try for `claim`, best first (see the module docs).
pub fn candidates<'a>(
    claim: &NodeClaim,
    instance_types: &'a [Arc<InstanceType>],
) -> Result<Vec<Candidate<'a>>, CloudError> {
    let requirements = claim_requirements(claim)?;
    let requests = Resources::from(&claim.spec.resources.requests);
    let allows = |key: &str, value: &str| requirements.get(key).is_none_or(|r| r.has(value));
    let mut all: Vec<Candidate<'a>> = instance_types
        .iter()
        // The claim's list of types first: it rules out most of the catalog at the cost of a lookup.
        .filter(|it| allows(INSTANCE_TYPE, &it.name))
        .filter(|it| it.requirements.overlaps(&requirements) && requests.fits(&it.allocatable()))
        .flat_map(|it| {
            it.offerings
                .iter()
                .filter(|o| {
                    o.available && allows(ZONE, &o.zone) && allows(CAPACITY_TYPE, o.capacity_type.label())
                })
                .map(move |offering| Candidate {
                    instance_type: it,
                    offering,
                })
        })
        .collect();
    let chosen = [CapacityType::Reserved, CapacityType::Spot, CapacityType::OnDemand]
        .into_iter()
        .find(|c| all.iter().any(|candidate| candidate.offering.capacity_type == *c));
    let Some(chosen) = chosen else {
        return Err(CloudError::InsufficientCapacity {
            offerings: Vec::new(),
            message: format!(
                "no instance type allowed by nodeclaim {:?} has an available offering that fits {requests}",
                claim.metadata.name.as_deref().unwrap_or_default()
            ),
        });
    };
    all.retain(|c| c.offering.capacity_type == chosen);
    all.sort_by(|a, b| {
        a.offering
            .price
            .total_cmp(&b.offering.price)
            .then_with(|| a.instance_type.name.cmp(&b.instance_type.name))
            .then_with(|| a.offering.zone.cmp(&b.offering.zone))
    });
    let mut kept_types = BTreeSet::new();
    all.retain(|c| {
        kept_types.contains(c.instance_type.name.as_str()) || {
            let room = kept_types.len() < MAX_INSTANCE_TYPES;
            if room {
                kept_types.insert(c.instance_type.name.as_str());
            }
            room
        }
    });
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use joist_messages::{
        apis::{
            NodeClaimSpec,
            common::{NodeClassReference, NodeSelectorRequirementWithMinValues},
            nodeclaim::ResourceRequirements,
        },
        labels::INSTANCE_TYPE,
        model::{
            quantity::Quantity,
            requirements::{Operator, Requirement},
            resources::names,
        },
    };

    use super::*;

    fn instance_type(name: &str, cpu: i64, prices: &[(&str, CapacityType, f64, bool)]) -> Arc<InstanceType> {
        Arc::new(InstanceType {
            name: name.into(),
            requirements: [
                Requirement::new(INSTANCE_TYPE, Operator::In, [name]).unwrap_or_else(|e| panic!("{e}"))
            ]
            .into_iter()
            .collect(),
            offerings: prices
                .iter()
                .map(|&(zone, capacity_type, price, available)| Offering {
                    zone: zone.into(),
                    capacity_type,
                    price,
                    available,
                    reservation_id: None,
                })
                .collect(),
            capacity: Resources::new().with(names::CPU, Quantity::from_units(cpu)),
            overhead: Default::default(),
        })
    }

    fn claim(cpu: &str, requirements: &[(&str, &[&str])]) -> NodeClaim {
        let spec = NodeClaimSpec {
            taints: Vec::new(),
            startup_taints: Vec::new(),
            requirements: requirements
                .iter()
                .map(|(key, values)| NodeSelectorRequirementWithMinValues {
                    key: (*key).into(),
                    operator: Operator::In,
                    values: values.iter().map(|v| (*v).to_owned()).collect(),
                    min_values: None,
                })
                .collect(),
            resources: ResourceRequirements {
                requests: BTreeMap::from([(names::CPU.to_owned(), cpu.parse().unwrap_or_default())]),
            },
            node_class_ref: NodeClassReference {
                group: "karpenter.k8s.aws".into(),
                kind: "EC2NodeClass".into(),
                name: "default".into(),
            },
            termination_grace_period: None,
            expire_after: None,
        };
        NodeClaim::new("default-abcde", spec)
    }

    #[test]
    fn instances_carry_karpenters_tags_over_the_classs_own() {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}],
                     "tags": {"team": "web", "eks:eks-cluster-name": "not-this"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "default-abc", "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let tags = instance_tags("prod", &class, &claim);
        let expected: BTreeMap<String, String> = [
            ("team", "web"),
            ("eks:eks-cluster-name", "prod"),
            ("kubernetes.io/cluster/prod", "owned"),
            ("karpenter.k8s.aws/ec2nodeclass", "default"),
            ("karpenter.sh/nodepool", "default"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(tags, expected);
    }
    #[test]
    fn spot_is_preferred_cheapest_first_and_unavailable_offerings_are_skipped() {
        use CapacityType::{OnDemand, Spot};
        let types = [
            instance_type(
                "m5.large",
                2,
                &[
                    ("a", Spot, 0.04, false),
                    ("b", Spot, 0.05, true),
                    ("a", OnDemand, 0.096, true),
                ],
            ),
            instance_type(
                "c5.large",
                2,
                &[("a", Spot, 0.045, true), ("a", OnDemand, 0.085, true)],
            ),
            instance_type("m5.xlarge", 4, &[("a", Spot, 0.08, true)]),
        ];
        let chosen = candidates(&claim("1", &[]), &types).unwrap_or_else(|e| panic!("{e}"));
        let keys: Vec<String> = chosen.iter().map(|c| c.key().to_string()).collect();
        assert_eq!(keys, ["spot:c5.large:a", "spot:m5.large:b", "spot:m5.xlarge:a"]);

        let on_demand = candidates(&claim("1", &[(CAPACITY_TYPE, &["on-demand"])]), &types)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            on_demand.first().map(|c| c.key().to_string()),
            Some("on-demand:c5.large:a".into())
        );

        let big = candidates(&claim("3", &[]), &types).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(big.len(), 1, "only m5.xlarge holds 3 cpu");
    }

    #[test]
    fn nothing_left_is_a_capacity_error_naming_the_claim() {
        let types = [instance_type(
            "m5.large",
            2,
            &[("a", CapacityType::Spot, 0.04, false)],
        )];
        let error = candidates(&claim("1", &[]), &types).err();
        assert!(
            matches!(&error, Some(CloudError::InsufficientCapacity { message, .. }) if message.contains("default-abcde")),
            "{error:?}"
        );
    }
}

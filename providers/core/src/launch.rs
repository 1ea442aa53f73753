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
//! A [`CandidateMemo`] remembers the answers for claims alike over one catalog.
//!
//! Also here, because every provider writes them the same way: the labels a launched node carries
//! ([`node_labels`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use joist_messages::{
    apis::{EC2NodeClass, NodeClaim, ec2nodeclass::ReservationType},
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
    /// The offering's cache key, scoped to the type's placement group when it has one.
    pub fn key(&self) -> OfferingKey {
        OfferingKey {
            instance_type: self.instance_type.name.clone(),
            zone: self.offering.zone.clone(),
            capacity_type: self.offering.capacity_type,
            placement_group: crate::placement_group::group_of(self.instance_type).map(str::to_owned),
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
    Ok(at(instance_types, &ranked(claim, instance_types)?))
}

/// The candidates at `positions` (type, offering) of `instance_types`.
fn at<'a>(instance_types: &'a [Arc<InstanceType>], positions: &[(usize, usize)]) -> Vec<Candidate<'a>> {
    positions
        .iter()
        .filter_map(|&(t, o)| {
            let instance_type = instance_types.get(t)?;
            Some(Candidate {
                instance_type,
                offering: instance_type.offerings.get(o)?,
            })
        })
        .collect()
}

/// [`candidates`] as positions: the type's in `instance_types`, the offering's in the type's.
fn ranked(
    claim: &NodeClaim,
    instance_types: &[Arc<InstanceType>],
) -> Result<Vec<(usize, usize)>, CloudError> {
    let requirements = claim_requirements(claim)?;
    let requests = Resources::from(&claim.spec.resources.requests);
    let allows = |key: &str, value: &str| requirements.get(key).is_none_or(|r| r.has(value));
    let mut all: Vec<(usize, usize)> = instance_types
        .iter()
        .enumerate()
        // The claim's list of types first: it rules out most of the catalog at the cost of a lookup.
        .filter(|(_, it)| allows(INSTANCE_TYPE, &it.name))
        .filter(|(_, it)| it.requirements.overlaps(&requirements) && requests.fits(&it.allocatable()))
        .flat_map(|(t, it)| {
            it.offerings
                .iter()
                .enumerate()
                .filter(|(_, o)| o.available && o.allowed_by(&requirements))
                .map(move |(o, _)| (t, o))
        })
        .collect();
    let offering = |&(t, o): &(usize, usize)| &instance_types[t].offerings[o];
    let chosen = [CapacityType::Reserved, CapacityType::Spot, CapacityType::OnDemand]
        .into_iter()
        .find(|c| {
            all.iter()
                .any(|candidate| offering(candidate).capacity_type == *c)
        });
    let Some(chosen) = chosen else {
        return Err(CloudError::InsufficientCapacity {
            offerings: Vec::new(),
            message: format!(
                "no instance type allowed by nodeclaim {:?} has an available offering that fits {requests}",
                claim.metadata.name.as_deref().unwrap_or_default()
            ),
        });
    };
    all.retain(|candidate| offering(candidate).capacity_type == chosen);
    if chosen == CapacityType::Reserved {
        keep_one_kind_of_reservation(&mut all, offering);
    }
    all.sort_by(|a, b| {
        let (type_a, type_b) = (&instance_types[a.0].name, &instance_types[b.0].name);
        offering(a)
            .price
            .total_cmp(&offering(b).price)
            .then_with(|| type_a.cmp(type_b))
            .then_with(|| offering(a).zone.cmp(&offering(b).zone))
    });
    let mut kept_types = BTreeSet::new();
    all.retain(|&(t, _)| {
        kept_types.contains(&t) || {
            let room = kept_types.len() < MAX_INSTANCE_TYPES;
            if room {
                kept_types.insert(t);
            }
            room
        }
    });
    Ok(all)
}

/// Narrows reserved candidates to what one launch can target, as Karpenter's filters do: the
/// reservations of one kind (ODCRs, capacity blocks, interruptible ODCRs: the kind of the cheapest
/// offering, ties to that order), one capacity block only (the cheapest), and per type and zone
/// the reservation with the most room.
fn keep_one_kind_of_reservation<'a>(
    all: &mut Vec<(usize, usize)>,
    offering: impl Fn(&(usize, usize)) -> &'a Offering,
) {
    let kind = |candidate: &(usize, usize)| {
        offering(candidate).reservation.as_ref().map_or(0, |offered| {
            match (offered.reservation.kind, offered.reservation.interruptible) {
                (ReservationType::CapacityBlock, _) => 1,
                (_, true) => 2,
                (_, false) => 0,
            }
        })
    };
    let cheapest = all.iter().min_by(|a, b| {
        offering(a)
            .price
            .total_cmp(&offering(b).price)
            .then_with(|| kind(a).cmp(&kind(b)))
    });
    let Some(chosen) = cheapest.map(kind) else {
        return;
    };
    all.retain(|candidate| kind(candidate) == chosen);
    if chosen == 1 {
        let block = all
            .iter()
            .copied()
            .min_by(|a, b| offering(a).price.total_cmp(&offering(b).price));
        all.retain(|candidate| Some(*candidate) == block);
    }
    let room =
        |candidate: &(usize, usize)| offering(candidate).reservation.as_ref().map_or(0, |r| r.capacity);
    let mut best: HashMap<(usize, &str), (usize, usize)> = HashMap::new();
    for candidate in all.iter() {
        let place = (candidate.0, offering(candidate).zone.as_str());
        let kept = best.entry(place).or_insert(*candidate);
        if room(candidate) > room(kept) {
            *kept = *candidate;
        }
    }
    all.retain(|candidate| best.get(&(candidate.0, offering(candidate).zone.as_str())) == Some(candidate));
}

/// The last answers of [`candidates`], so that claims alike launched one after another (the
/// hundreds of identical NodeClaims of a scale-out) do not each rank the whole catalog again.
///
/// An answer is kept for a claim's requirements and requests over the very same instance types:
/// the same `Arc`s, held here so that none is freed and its address taken by another. Another
/// catalog (a type or an offering's availability changed) drops every answer. Failures are not
/// kept.
#[derive(Debug, Default)]
pub struct CandidateMemo {
    catalog: Vec<Arc<InstanceType>>,
    answers: HashMap<String, Vec<(usize, usize)>>,
}

/// Answers a [`CandidateMemo`] keeps before it starts again.
const MEMO_ANSWERS: usize = 64;

impl CandidateMemo {
    /// [`candidates`], from memory when the same question was asked of the same catalog.
    pub fn candidates<'a>(
        &mut self,
        claim: &NodeClaim,
        instance_types: &'a [Arc<InstanceType>],
    ) -> Result<Vec<Candidate<'a>>, CloudError> {
        let same_catalog = self.catalog.len() == instance_types.len()
            && self
                .catalog
                .iter()
                .zip(instance_types)
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if !same_catalog {
            self.catalog = instance_types.to_vec();
            self.answers.clear();
        }
        let question = serde_json::to_string(&(&claim.spec.requirements, &claim.spec.resources.requests))
            .unwrap_or_default();
        if let Some(answer) = self.answers.get(&question) {
            return Ok(at(instance_types, answer));
        }
        let answer = ranked(claim, instance_types)?;
        let candidates = at(instance_types, &answer);
        if self.answers.len() >= MEMO_ANSWERS {
            self.answers.clear();
        }
        self.answers.insert(question, answer);
        Ok(candidates)
    }
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
                    reservation: None,
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

    /// `it` with a reserved offering in zone `a` of reservation `id` of `kind`.
    fn with_reservation(
        it: Arc<InstanceType>,
        id: &str,
        (kind, interruptible): (ReservationType, bool),
        price: f64,
        room: u32,
    ) -> Arc<InstanceType> {
        use joist_messages::model::instance_type::{OfferedReservation, Reservation};
        let mut it = Arc::unwrap_or_clone(it);
        it.add_offerings(vec![Offering {
            zone: "a".into(),
            capacity_type: CapacityType::Reserved,
            price,
            available: room > 0,
            reservation: Some(OfferedReservation {
                reservation: Reservation {
                    id: id.into(),
                    kind,
                    interruptible,
                },
                capacity: room,
            }),
        }]);
        Arc::new(it)
    }

    #[test]
    fn a_reserved_launch_targets_one_kind_of_reservation_and_the_roomiest_of_each_type_and_zone() {
        use CapacityType::OnDemand;
        use ReservationType::{CapacityBlock, Default as Odcr};
        let plain = |name| instance_type(name, 2, &[("a", OnDemand, 0.1, true)]);
        let keys = |types: &[Arc<InstanceType>]| -> Vec<String> {
            candidates(&claim("1", &[]), types)
                .unwrap_or_else(|e| panic!("{e}"))
                .iter()
                .map(|c| {
                    c.offering
                        .reservation
                        .as_ref()
                        .map_or(String::new(), |r| r.reservation.id.clone())
                })
                .collect()
        };
        let odcrs = [
            with_reservation(plain("m5.large"), "cr-small", (Odcr, false), 1e-8, 1),
            with_reservation(plain("m5.large"), "cr-big", (Odcr, false), 1e-8, 5),
            with_reservation(plain("c5.large"), "cr-block", (CapacityBlock, false), 2e-8, 1),
        ];
        // m5.large's two ODCRs in zone a: the one with more room; the block is another kind.
        let merged = Arc::new(InstanceType {
            offerings: [&odcrs[0], &odcrs[1]]
                .iter()
                .flat_map(|it| it.offerings.clone())
                .filter(|o| o.capacity_type == CapacityType::Reserved)
                .collect(),
            ..(*odcrs[0]).clone()
        });
        assert_eq!(keys(&[merged.clone(), odcrs[2].clone()]), ["cr-big"]);
        let blocks = [
            with_reservation(plain("m5.large"), "cr-b1", (CapacityBlock, false), 2e-8, 1),
            with_reservation(plain("c5.large"), "cr-b2", (CapacityBlock, false), 1e-8, 1),
            with_reservation(plain("r5.large"), "cr-int", (Odcr, true), 3e-8, 1),
        ];
        assert_eq!(keys(&blocks), ["cr-b2"], "the cheapest capacity block alone");
    }

    #[test]
    fn the_memo_answers_claims_alike_as_candidates_does_and_asks_a_new_catalog_afresh() {
        use CapacityType::Spot;
        let keys = |chosen: &[Candidate<'_>]| chosen.iter().map(|c| c.key().to_string()).collect::<Vec<_>>();
        let catalog = vec![
            instance_type("m5.large", 2, &[("a", Spot, 0.04, true), ("b", Spot, 0.05, true)]),
            instance_type("m5.xlarge", 4, &[("a", Spot, 0.08, true)]),
        ];
        let mut memo = CandidateMemo::default();
        for cpu in ["1", "3", "1"] {
            let remembered = memo
                .candidates(&claim(cpu, &[]), &catalog)
                .unwrap_or_else(|e| panic!("{e}"));
            let fresh = candidates(&claim(cpu, &[]), &catalog).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(keys(&remembered), keys(&fresh), "{cpu} cpu");
        }
        // The cheapest offering sold out: a new catalog, a new answer.
        let mut sold_out = catalog.clone();
        sold_out[0] = instance_type(
            "m5.large",
            2,
            &[("a", Spot, 0.04, false), ("b", Spot, 0.05, true)],
        );
        let chosen = memo
            .candidates(&claim("1", &[]), &sold_out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(keys(&chosen), ["spot:m5.large:b", "spot:m5.xlarge:a"]);
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

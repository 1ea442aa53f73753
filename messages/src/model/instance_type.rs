//! Instance types and their offerings, as a cloud provider describes them to the scheduler.
//!
//! An [`InstanceType`] carries its label requirements (arch, family, cpu, …), its capacity and the
//! overhead the kubelet reserves, and its [`Offering`]s: one per zone × capacity type, each with an
//! hourly price and whether it can be launched right now. Allocatable is capacity minus overhead.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{
    requirements::{Operator, Requirement, Requirements},
    resources::Resources,
};
use crate::{
    apis::ec2nodeclass::ReservationType,
    labels::{CAPACITY_TYPE, ZONE, aws, capacity_type},
};

/// How an instance is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Spot: cheaper, interruptible.
    Spot,
    /// On-demand.
    OnDemand,
    /// From a capacity reservation.
    Reserved,
}

impl CapacityType {
    /// The `karpenter.sh/capacity-type` label value.
    pub const fn label(self) -> &'static str {
        match self {
            CapacityType::Spot => capacity_type::SPOT,
            CapacityType::OnDemand => capacity_type::ON_DEMAND,
            CapacityType::Reserved => capacity_type::RESERVED,
        }
    }

    /// Parses a `karpenter.sh/capacity-type` label value.
    pub fn from_label(value: &str) -> Option<Self> {
        [CapacityType::Spot, CapacityType::OnDemand, CapacityType::Reserved]
            .into_iter()
            .find(|c| c.label() == value)
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The zones and the capacity types `offerings` cover, each sorted and without repeats: the values
/// of an instance type's zone and capacity-type requirements.
pub fn offered_zones_and_capacity_types(offerings: &[Offering]) -> (Vec<&str>, Vec<&str>) {
    let mut zones: Vec<&str> = offerings.iter().map(|o| o.zone.as_str()).collect();
    zones.sort_unstable();
    zones.dedup();
    let mut capacity_types: Vec<&str> = offerings.iter().map(|o| o.capacity_type.label()).collect();
    capacity_types.sort_unstable();
    capacity_types.dedup();
    (zones, capacity_types)
}

/// One way to buy an instance type: a zone and a capacity type, at a price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offering {
    /// The zone (`us-west-2a`).
    pub zone: String,
    /// Spot, on-demand or reserved.
    pub capacity_type: CapacityType,
    /// Price in US dollars per hour.
    pub price: f64,
    /// False while the offering is known to be out of capacity.
    pub available: bool,
    /// The capacity reservation behind a reserved offering; `None` for every other.
    pub reservation: Option<OfferedReservation>,
}

impl Offering {
    /// True when `reqs` allow this offering: its zone and capacity type, and the labels of its
    /// reservation. An offering without a reservation has none of those labels, so a requirement
    /// that one have a value rules it out.
    pub fn allowed_by(&self, reqs: &Requirements) -> bool {
        let allows = |key: &str, value: Option<&str>| {
            reqs.get(key)
                .is_none_or(|r| value.map_or_else(|| r.allows_absent(), |v| r.has(v)))
        };
        let reservation = self.reservation.as_ref().map(|r| &r.reservation);
        allows(ZONE, Some(&self.zone))
            && allows(CAPACITY_TYPE, Some(self.capacity_type.label()))
            && allows(aws::CAPACITY_RESERVATION_ID, reservation.map(|r| r.id.as_str()))
            && allows(
                aws::CAPACITY_RESERVATION_TYPE,
                reservation.map(|r| r.kind.label()),
            )
            && allows(
                aws::CAPACITY_RESERVATION_INTERRUPTIBLE,
                reservation.map(|r| if r.interruptible { "true" } else { "false" }),
            )
    }
}

/// A capacity reservation, as the nodes launched into it are labelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The reservation's id (`cr-…`).
    pub id: String,
    /// An on-demand capacity reservation or a capacity block.
    pub kind: ReservationType,
    /// Whether EC2 may take the capacity back.
    pub interruptible: bool,
}

impl Reservation {
    /// The labels a node launched into this reservation carries.
    pub fn labels(&self) -> [(&'static str, String); 3] {
        [
            (aws::CAPACITY_RESERVATION_ID, self.id.clone()),
            (aws::CAPACITY_RESERVATION_TYPE, self.kind.label().to_owned()),
            (
                aws::CAPACITY_RESERVATION_INTERRUPTIBLE,
                self.interruptible.to_string(),
            ),
        ]
    }
}

/// The reservation behind a reserved offering, and the instances it can still take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedReservation {
    /// The reservation.
    pub reservation: Reservation,
    /// Instances it can still take, as last counted.
    pub capacity: u32,
}

/// What the kubelet and the OS hold back from an instance's capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overhead {
    /// `kubeReserved`.
    pub kube_reserved: Resources,
    /// `systemReserved`.
    pub system_reserved: Resources,
    /// The hard eviction threshold.
    pub eviction_threshold: Resources,
}

impl Overhead {
    /// The sum of the three reservations.
    pub fn total(&self) -> Resources {
        let mut total = self.kube_reserved.clone();
        total.add(&self.system_reserved);
        total.add(&self.eviction_threshold);
        total
    }
}

/// A shape of machine the cloud can launch (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceType {
    /// The name (`m5.large`).
    pub name: String,
    /// The labels a node of this type has, as requirements (zones and capacity types included).
    pub requirements: Requirements,
    /// The ways to buy it.
    pub offerings: Vec<Offering>,
    /// Total resources of the machine.
    pub capacity: Resources,
    /// What is held back from capacity.
    pub overhead: Overhead,
}

impl InstanceType {
    /// Capacity minus overhead: what pods can request.
    pub fn allocatable(&self) -> Resources {
        let mut allocatable = self.capacity.clone();
        allocatable.sub(&self.overhead.total());
        allocatable
    }

    /// Adds `offerings` (a capacity reservation's, say), widening the zone and capacity-type
    /// requirements to cover them.
    pub fn add_offerings(&mut self, offerings: Vec<Offering>) {
        if offerings.is_empty() {
            return;
        }
        self.offerings.extend(offerings);
        let (zones, capacity_types) = offered_zones_and_capacity_types(&self.offerings);
        for (key, values) in [(ZONE, zones), (CAPACITY_TYPE, capacity_types)] {
            if let Ok(requirement) = Requirement::new(key, Operator::In, values) {
                self.requirements.set(requirement);
            }
        }
    }

    /// The cheapest available offering that `allowed` accepts.
    pub fn cheapest_offering(&self, allowed: impl Fn(&Offering) -> bool) -> Option<&Offering> {
        self.offerings
            .iter()
            .filter(|o| o.available && allowed(o))
            .min_by(|a, b| a.price.total_cmp(&b.price))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        quantity::Quantity,
        requirements::{Operator, Requirement},
        resources::names::*,
    };

    fn m5_large() -> InstanceType {
        let offering = |zone: &str, capacity_type, price| Offering {
            zone: zone.into(),
            capacity_type,
            price,
            available: true,
            reservation: None,
        };
        InstanceType {
            name: "m5.large".into(),
            requirements: [Requirement::new(crate::labels::ARCH, Operator::In, ["amd64"])
                .unwrap_or_else(|e| panic!("{e}"))]
            .into_iter()
            .collect(),
            offerings: vec![
                offering("us-west-2a", CapacityType::OnDemand, 0.096),
                offering("us-west-2a", CapacityType::Spot, 0.035),
                Offering {
                    available: false,
                    ..offering("us-west-2b", CapacityType::Spot, 0.030)
                },
            ],
            capacity: Resources::new()
                .with(CPU, Quantity::from_units(2))
                .with(MEMORY, Quantity::from_units(8 << 30))
                .with(PODS, Quantity::from_units(29)),
            overhead: Overhead {
                kube_reserved: Resources::new().with(CPU, Quantity::from_millis(70)),
                system_reserved: Resources::new(),
                eviction_threshold: Resources::new().with(MEMORY, Quantity::from_units(100 << 20)),
            },
        }
    }

    #[test]
    fn allocatable_subtracts_overhead() {
        let it = m5_large();
        assert_eq!(it.allocatable().get(CPU), Quantity::from_millis(1930));
        assert_eq!(
            it.allocatable().get(MEMORY),
            Quantity::from_units((8 << 30) - (100 << 20))
        );
        assert_eq!(it.allocatable().get(PODS), Quantity::from_units(29));
    }

    #[test]
    fn cheapest_offering_skips_unavailable_ones() {
        let it = m5_large();
        let cheapest = it.cheapest_offering(|_| true).map(|o| o.price);
        assert_eq!(cheapest, Some(0.035));
        let on_demand = it
            .cheapest_offering(|o| o.capacity_type == CapacityType::OnDemand)
            .map(|o| o.price);
        assert_eq!(on_demand, Some(0.096));
    }

    #[test]
    fn serializes_as_plain_data_and_back() {
        let it = m5_large();
        let json = serde_json::to_string(&it).unwrap_or_default();
        let back: InstanceType = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(back, it);
        assert_eq!(
            CapacityType::from_label("on-demand"),
            Some(CapacityType::OnDemand)
        );
    }
}

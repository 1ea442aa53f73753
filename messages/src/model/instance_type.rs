//! Instance types and their offerings, as a cloud provider describes them to the scheduler.
//!
//! An [`InstanceType`] carries its label requirements (arch, family, cpu, …), its capacity and the
//! overhead the kubelet reserves, and its [`Offering`]s: one per zone × capacity type, each with an
//! hourly price and whether it can be launched right now. Allocatable is capacity minus overhead.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{requirements::Requirements, resources::Resources};
use crate::labels::capacity_type;

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
    /// The capacity reservation backing a reserved offering.
    pub reservation_id: Option<String>,
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
            reservation_id: None,
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

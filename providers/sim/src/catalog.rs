//! The simulated cloud's catalog: EC2 instance shapes generated from the data the PyPI `moto`
//! package ships (`data/instance-types.json`, written by `scripts/generate-catalog.py`) for
//! us-east-1, us-east-2, us-west-2 and eu-west-1, and the built-in table of real on-demand prices
//! ([`joist_provider::prices`]: us-east-1's published rates, charged in every region). Spot prices
//! are on-demand less the family's discount from that table: a model, not a quote.
//!
//! Only types that have a price are offered, as Karpenter drops unpriced offerings: the few the
//! price figures lack (types AWS does not sell in us-east-1) are never offered.
//! Both files are compiled in; a malformed file is a build defect, reported by [`CatalogError`]
//! when the catalog is first loaded (and caught by this module's tests).

use std::collections::{BTreeMap, BTreeSet};

use joist_messages::model::{
    instance_type::{CapacityType, InstanceType, Offering},
    shape::{CapacitySettings, Ec2Shape},
};
use joist_provider::prices::{PriceTable, PriceTableError};
use serde::Deserialize;
use thiserror::Error;

const INSTANCE_TYPES: &str = include_str!("../data/instance-types.json");

/// A built-in data file that does not parse.
#[derive(Debug, Error)]
pub enum CatalogError {
    /// The instance shapes.
    #[error("the built-in catalog file instance-types.json is malformed: {0}")]
    Shapes(#[from] serde_json::Error),
    /// The price table.
    #[error(transparent)]
    Prices(#[from] PriceTableError),
    /// Nothing is sold in the region, or in the zones, asked for.
    #[error("the simulated cloud sells no instance type in {place}: it sells in {known}")]
    NothingSold {
        /// The region, and the zones when some were named.
        place: String,
        /// The regions and zones it sells in.
        known: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShapesFile {
    instance_types: Vec<ShapeEntry>,
}

#[derive(Deserialize)]
struct ShapeEntry {
    #[serde(flatten)]
    shape: Ec2Shape,
    /// Region → zones where the type is offered.
    zones: BTreeMap<String, Vec<String>>,
}

/// One type the simulated cloud sells in a region.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// The hardware.
    pub shape: Ec2Shape,
    /// The zones (of those asked for) where it is offered.
    pub zones: Vec<String>,
    /// On-demand dollars per hour.
    pub on_demand: f64,
    /// Spot dollars per hour.
    pub spot: f64,
}

impl Listing {
    /// The price of one offering.
    pub fn price(&self, capacity_type: CapacityType) -> f64 {
        match capacity_type {
            CapacityType::Spot => self.spot,
            CapacityType::OnDemand | CapacityType::Reserved => self.on_demand,
        }
    }

    /// The scheduler's view, with spot and on-demand offerings in each zone.
    pub fn instance_type(&self, region: &str, settings: &CapacitySettings) -> InstanceType {
        let offerings = self
            .zones
            .iter()
            .flat_map(|zone| {
                [CapacityType::Spot, CapacityType::OnDemand].map(|capacity_type| Offering {
                    zone: zone.clone(),
                    capacity_type,
                    price: self.price(capacity_type),
                    available: true,
                    reservation: None,
                })
            })
            .collect();
        self.shape.instance_type(region, offerings, settings)
    }
}

/// The types sold in one region and set of zones, by name.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    listings: BTreeMap<String, Listing>,
}

impl Catalog {
    /// The built-in catalog for `region`, limited to `zones` (every zone of the region when empty).
    pub fn load(region: &str, zones: &[String]) -> Result<Self, CatalogError> {
        let shapes: ShapesFile = serde_json::from_str(INSTANCE_TYPES)?;
        let prices = PriceTable::built_in()?;
        let mut listings = BTreeMap::new();
        for entry in shapes.instance_types {
            let (Some(on_demand), Some(spot_discount)) = (
                prices.on_demand(region, &entry.shape.name),
                prices.spot_discount(&entry.shape.name),
            ) else {
                continue;
            };
            let offered: Vec<String> = entry
                .zones
                .get(region)
                .into_iter()
                .flatten()
                .filter(|zone| zones.is_empty() || zones.contains(zone))
                .cloned()
                .collect();
            if offered.is_empty() {
                continue;
            }
            let spot = round_to_ten_thousandths(on_demand * (1.0 - spot_discount));
            listings.insert(
                entry.shape.name.clone(),
                Listing {
                    shape: entry.shape,
                    zones: offered,
                    on_demand,
                    spot,
                },
            );
        }
        if listings.is_empty() {
            let place = if zones.is_empty() {
                format!("region {region}")
            } else {
                format!("zones {} of region {region}", zones.join(", "))
            };
            // Only a refusal needs every region's zones: the file is read again for it.
            let shapes: ShapesFile = serde_json::from_str(INSTANCE_TYPES)?;
            let known = places(&shapes)
                .iter()
                .map(|(region, zones)| {
                    let zones: Vec<&str> = zones.iter().copied().collect();
                    format!("{region} ({})", zones.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(CatalogError::NothingSold { place, known });
        }
        Ok(Self { listings })
    }

    /// A type by name.
    pub fn get(&self, name: &str) -> Option<&Listing> {
        self.listings.get(name)
    }

    /// Every type, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Listing> {
        self.listings.values()
    }

    /// How many types are sold.
    pub fn len(&self) -> usize {
        self.listings.len()
    }

    /// Whether nothing is sold (an unknown region).
    pub fn is_empty(&self) -> bool {
        self.listings.is_empty()
    }
}

/// The zones of each region some type is offered in.
fn places(shapes: &ShapesFile) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut places: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (region, zones) in shapes.instance_types.iter().flat_map(|entry| &entry.zones) {
        places
            .entry(region.as_str())
            .or_default()
            .extend(zones.iter().map(String::as_str));
    }
    places
}

fn round_to_ten_thousandths(price: f64) -> f64 {
    (price * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use joist_messages::model::{quantity::Quantity, resources::names};

    use super::*;

    fn zones(region: &str) -> Vec<String> {
        ["a", "b", "c"].iter().map(|z| format!("{region}{z}")).collect()
    }

    /// The catalog's types the us-east-1 price figures lack: not sold in us-east-1 (hpc*,
    /// trn2.48xlarge, dl2q.24xlarge) or too new for the figures (p5e, x8aedz).
    const UNPRICED: [&str; 18] = [
        "dl2q.24xlarge",
        "hpc6a.48xlarge",
        "hpc6id.32xlarge",
        "hpc7a.12xlarge",
        "hpc7a.24xlarge",
        "hpc7a.48xlarge",
        "hpc7a.96xlarge",
        "hpc8a.96xlarge",
        "p5e.48xlarge",
        "trn2.48xlarge",
        "x8aedz.12xlarge",
        "x8aedz.24xlarge",
        "x8aedz.3xlarge",
        "x8aedz.6xlarge",
        "x8aedz.large",
        "x8aedz.metal-12xl",
        "x8aedz.metal-24xl",
        "x8aedz.xlarge",
    ];

    #[test]
    fn every_type_but_the_unpriced_few_is_sold_in_every_region_it_is_offered_in() {
        let shapes: ShapesFile = serde_json::from_str(INSTANCE_TYPES).unwrap_or_else(|e| panic!("{e}"));
        let places = places(&shapes);
        assert_eq!(
            places.keys().copied().collect::<Vec<_>>(),
            ["eu-west-1", "us-east-1", "us-east-2", "us-west-2"]
        );
        for &region in places.keys() {
            let catalog = Catalog::load(region, &[]).unwrap_or_else(|e| panic!("{e}"));
            let unsold: Vec<&str> = shapes
                .instance_types
                .iter()
                .filter(|entry| entry.zones.contains_key(region))
                .map(|entry| entry.shape.name.as_str())
                .filter(|name| catalog.get(name).is_none())
                .collect();
            assert!(
                unsold.iter().all(|name| UNPRICED.contains(name)),
                "{region}: unpriced {unsold:?}"
            );
            assert!(catalog.len() > 950, "{region}: only {} types", catalog.len());
            // The types the issue named, in the regions users run most.
            let named = [
                ("p3.8xlarge", 12.24),
                ("x2idn.16xlarge", 6.669),
                ("c5n.large", 0.108),
            ];
            let named = named
                .into_iter()
                .filter(|_| matches!(region, "us-east-1" | "us-west-2"));
            for (name, price) in named {
                assert_eq!(
                    catalog.get(name).map(|l| l.on_demand),
                    Some(price),
                    "{region} {name}"
                );
            }
        }
    }

    #[test]
    fn both_regions_sell_the_common_families_at_real_prices() {
        for region in ["us-east-1", "us-west-2"] {
            let catalog = Catalog::load(region, &zones(region)).unwrap_or_else(|e| panic!("{e}"));
            assert!(catalog.len() > 1000, "{region}: only {} types", catalog.len());
            let m5 = catalog
                .get("m5.large")
                .unwrap_or_else(|| panic!("{region}: no m5.large"));
            assert_eq!(m5.on_demand, 0.096, "{region}: m5.large on-demand");
            assert!(m5.spot < m5.on_demand && m5.spot > 0.0);
            assert_eq!(m5.zones.len(), 3);
        }
    }

    #[test]
    fn shapes_come_through_with_their_eks_capacity() {
        let catalog = Catalog::load("us-west-2", &zones("us-west-2")).unwrap_or_else(|e| panic!("{e}"));
        let it = catalog
            .get("m5.large")
            .map(|l| l.instance_type("us-west-2", &CapacitySettings::default()))
            .unwrap_or_else(|| panic!("no m5.large"));
        assert_eq!(it.capacity.get(names::PODS), Quantity::from_units(29));
        assert_eq!(it.offerings.len(), 6, "spot and on-demand in three zones");
        let graviton = catalog.get("m6g.large").map(|l| l.shape.arch.as_str());
        assert_eq!(graviton, Some("arm64"));
        let gpu = catalog
            .get("g4dn.xlarge")
            .map(|l| l.shape.capacity(&CapacitySettings::default()));
        assert_eq!(
            gpu.map(|c| c.get(names::NVIDIA_GPU)),
            Some(Quantity::from_units(1))
        );
    }

    #[test]
    fn a_region_or_zone_without_types_is_refused_naming_those_with_some() {
        let unknown = Catalog::load("mars-north-1", &[]).map(|c| c.len());
        let message = unknown.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.starts_with(
                "the simulated cloud sells no instance type in region mars-north-1: it sells in "
            ) && message.contains("eu-west-1 (eu-west-1a, eu-west-1b, eu-west-1c)")
                && message.contains("us-west-2 ("),
            "{message}"
        );
        let zone = Catalog::load("us-west-2", &["us-west-2z".to_owned()]).map(|c| c.len());
        let message = zone.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("in zones us-west-2z of region us-west-2: "),
            "{message}"
        );
    }
}

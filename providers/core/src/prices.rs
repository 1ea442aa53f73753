//! The built-in on-demand price table (`data/on-demand-prices.json`, compiled in): real prices
//! per region and instance type, grouped by family, each family with its source noted and the
//! share of the on-demand price its spot offerings typically save. Every provider starts from it,
//! so offerings are ordered by price before (or without) any price API: the simulated cloud sells
//! at these prices, the AWS provider falls back to them until the Pricing API answers.
//!
//! Failures: the file is a build input; a malformed one is a [`PriceTableError`] when the table is
//! first read (and this module's tests catch it).

use std::collections::BTreeMap;

use serde::Deserialize;

const PRICES: &str = include_str!("../data/on-demand-prices.json");

/// The built-in price file does not parse.
#[derive(Debug, thiserror::Error)]
#[error("the built-in price table on-demand-prices.json is malformed: {0}")]
pub struct PriceTableError(#[from] serde_json::Error);

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FamilyPrices {
    spot_discount: f64,
    prices: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The built-in table (see the module docs).
#[derive(Debug, Clone, Deserialize)]
pub struct PriceTable {
    families: BTreeMap<String, FamilyPrices>,
}

impl PriceTable {
    /// The table compiled into Joist.
    pub fn built_in() -> Result<Self, PriceTableError> {
        Ok(serde_json::from_str(PRICES)?)
    }

    /// The on-demand dollars per hour of `instance_type` in `region`, if the table has it.
    pub fn on_demand(&self, region: &str, instance_type: &str) -> Option<f64> {
        self.families
            .get(family(instance_type))?
            .prices
            .get(region)?
            .get(instance_type)
            .copied()
    }

    /// The share of the on-demand price spot saves for `instance_type`'s family.
    pub fn spot_discount(&self, instance_type: &str) -> Option<f64> {
        self.families.get(family(instance_type)).map(|f| f.spot_discount)
    }

    /// Every on-demand price in `region`, by instance type.
    pub fn region(&self, region: &str) -> BTreeMap<String, f64> {
        self.families
            .values()
            .filter_map(|f| f.prices.get(region))
            .flat_map(|prices| prices.iter().map(|(name, price)| (name.clone(), *price)))
            .collect()
    }
}

/// The family of an instance type: `m5` of `m5.large`.
fn family(instance_type: &str) -> &str {
    instance_type
        .split_once('.')
        .map_or(instance_type, |(family, _)| family)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_prices_common_types_in_both_regions() {
        let table = PriceTable::built_in().unwrap_or_else(|e| panic!("{e}"));
        for region in ["us-east-1", "us-west-2"] {
            assert_eq!(table.on_demand(region, "m5.large"), Some(0.096), "{region}");
            assert!(table.region(region).len() > 200, "{region}");
        }
        assert_eq!(table.on_demand("mars-north-1", "m5.large"), None);
        assert!(
            table
                .spot_discount("m5.large")
                .is_some_and(|d| d > 0.0 && d < 1.0)
        );
    }
}

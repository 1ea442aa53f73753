//! Instance prices for the AWS provider, kept the way Karpenter keeps them
//! (`pkg/providers/pricing`): on-demand prices from the Price List API's `GetProducts`, spot prices
//! from EC2's `DescribeSpotPriceHistory`, both refreshed every [`PRICING_REFRESH`].
//!
//! [`Prices`] starts from a built-in on-demand table, so every offering has a price before the first
//! call answers (or when the APIs cannot be reached at all). Until spot data arrives, a spot offering
//! is priced at its type's on-demand price; after that, only zones EC2 reported a price for have one.
//! The SDK calls live behind [`PriceSource`]; this module parses what they return
//! ([`parse_on_demand`], [`latest_spot_prices`]) and applies it ([`refresh`]).
//!
//! How it fails: a price-list document that is not JSON, lacks `product.attributes.instanceType` or
//! carries a price that is not a number fails its whole page with a [`PricingError`] naming the
//! document's index (the documents are generated in a versioned format and the query's filters make
//! every one an instance type, so such a document means the format changed: a loud error, rather
//! than a table that silently stops updating type by type). Documents with a zero price or without an
//! hourly price in the currency are skipped, as Karpenter skips them. A source that fails or returns
//! nothing never erases prices: [`refresh`] keeps the last known ones and returns the errors for the
//! caller to log.

use std::{
    collections::{BTreeMap, btree_map::Entry},
    fmt,
    time::Duration,
};

use futures::future::{self, BoxFuture};
use serde::Deserialize;
use thiserror::Error;

/// How often prices are fetched again: Karpenter's pricing controller runs every 12 hours.
pub const PRICING_REFRESH: Duration = Duration::from_secs(12 * 60 * 60);

/// The Price List API's service code for EC2 (`GetProducts`' `ServiceCode`).
pub const PRICING_SERVICE_CODE: &str = "AmazonEC2";

/// The product descriptions spot prices are asked for (`DescribeSpotPriceHistory`'s
/// `ProductDescriptions`): accounts that still have EC2-Classic report VPC instances under the second.
pub const SPOT_PRODUCT_DESCRIPTIONS: [&str; 2] = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"];

/// The unit of an hourly price dimension in the price list.
const HOURLY_UNIT: &str = "Hrs";

/// The field every on-demand price-list document must carry.
const INSTANCE_TYPE_FIELD: &str = "product.attributes.instanceType";

/// Which kind of price a refresh or an error concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceKind {
    /// On-demand prices, from the Price List API.
    OnDemand,
    /// Spot prices, from EC2's spot price history.
    Spot,
}

impl fmt::Display for PriceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PriceKind::OnDemand => "on-demand",
            PriceKind::Spot => "spot",
        })
    }
}

/// What went wrong reading or fetching prices.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PricingError {
    /// A price-list document is not JSON, or not shaped like a price-list entry.
    #[error("price list document {index} is not a price list entry: {message}")]
    InvalidDocument {
        /// The document's position in the page (from 0).
        index: usize,
        /// What the JSON parser said.
        message: String,
    },
    /// A price-list document lacks a field every instance product has.
    #[error("price list document {index} has no {field}")]
    MissingField {
        /// The document's position in the page (from 0).
        index: usize,
        /// The missing field's path (`product.attributes.instanceType`).
        field: &'static str,
    },
    /// A price-list document's hourly price is not a finite, non-negative number.
    #[error("price list document {index} prices {instance_type} at {value:?}, which is not a price")]
    InvalidPrice {
        /// The document's position in the page (from 0).
        index: usize,
        /// The instance type the document prices.
        instance_type: String,
        /// The price as written.
        value: String,
    },
    /// The call behind a [`PriceSource`] failed (throttled, denied, unreachable …).
    #[error("fetching {kind} prices failed: {message}")]
    Fetch {
        /// Which prices were being fetched.
        kind: PriceKind,
        /// What the API said.
        message: String,
    },
    /// A [`PriceSource`] answered with no usable price; the last known prices were kept.
    #[error("no {kind} prices were returned; keeping the last known ones")]
    Empty {
        /// Which prices came back empty.
        kind: PriceKind,
    },
}

/// A future a [`PriceSource`] returns.
pub type PriceFuture<'a, T> = BoxFuture<'a, Result<T, PricingError>>;

/// Where fresh prices come from: the AWS SDK in production, a fake in tests.
pub trait PriceSource: Send + Sync {
    /// On-demand prices per instance type in `region`: both [`on_demand_filters`] queries (shared
    /// instances and bare metal), every page (at most 100 documents each), parsed with
    /// [`parse_on_demand_in`] in [`price_currency`]`(region)` and merged. Karpenter fails the update
    /// when either query fails.
    fn on_demand<'a>(&'a self, region: &'a str) -> PriceFuture<'a, BTreeMap<String, f64>>;

    /// The spot price history for the [`SPOT_PRODUCT_DESCRIPTIONS`] in `zones`, asked with a start
    /// time of now, so EC2 returns the price in effect in each zone.
    fn spot<'a>(&'a self, zones: &'a [String]) -> PriceFuture<'a, Vec<SpotPrice>>;
}

/// One `TERM_MATCH` filter of a `GetProducts` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermMatch {
    /// The product attribute (`regionCode`, `tenancy` …).
    pub field: &'static str,
    /// The value it must equal.
    pub value: String,
}

/// The two `GetProducts` queries Karpenter runs for on-demand prices in `region`: Linux instances
/// with no pre-installed software, on shared tenancy (`Compute Instance`) and bare metal on dedicated
/// tenancy (`Compute Instance (bare metal)`).
pub fn on_demand_filters(region: &str) -> [Vec<TermMatch>; 2] {
    let query = |tenancy: &str, product_family: &str| -> Vec<TermMatch> {
        [
            ("regionCode", region),
            ("preInstalledSw", "NA"),
            ("operatingSystem", "Linux"),
            ("capacitystatus", "Used"),
            ("marketoption", "OnDemand"),
            ("tenancy", tenancy),
            ("productFamily", product_family),
        ]
        .into_iter()
        .map(|(field, value)| TermMatch {
            field,
            value: value.to_owned(),
        })
        .collect()
    };
    [
        query("Shared", "Compute Instance"),
        query("Dedicated", "Compute Instance (bare metal)"),
    ]
}

/// The region whose Price List API endpoint serves `region`: the API is not in every region, so
/// Asia Pacific regions use Mumbai, European regions Frankfurt, China regions Ningxia and every
/// other region N. Virginia (Karpenter's choice).
pub fn pricing_endpoint_region(region: &str) -> &'static str {
    if region.starts_with("ap-") {
        "ap-south-1"
    } else if region.starts_with("cn-") {
        "cn-northwest-1"
    } else if region.starts_with("eu-") {
        "eu-central-1"
    } else {
        "us-east-1"
    }
}

/// The currency the price list quotes `region` in: yuan in the China regions, dollars elsewhere.
pub fn price_currency(region: &str) -> &'static str {
    if region.starts_with("cn-") { "CNY" } else { "USD" }
}

/// The hourly on-demand price in dollars per instance type in `documents`, a page's `PriceList`
/// (see [`parse_on_demand_in`]).
pub fn parse_on_demand(documents: &[String]) -> Result<BTreeMap<String, f64>, PricingError> {
    parse_on_demand_in(documents, "USD")
}

/// The hourly on-demand price in `currency` per instance type in `documents`, a page's `PriceList`:
/// each document a JSON string holding one product and its terms.
///
/// A document's price is the first non-zero one (in offer-term and rate-code order) among its
/// on-demand dimensions billed in `Hrs`; documents with no such price are skipped, and a later
/// document for the same type replaces an earlier one. Fails on the first document that is not JSON,
/// lacks `product.attributes.instanceType` or has a price that is not a number (see the module docs).
pub fn parse_on_demand_in(
    documents: &[String],
    currency: &str,
) -> Result<BTreeMap<String, f64>, PricingError> {
    let mut prices = BTreeMap::new();
    for (index, document) in documents.iter().enumerate() {
        let entry: PriceListEntry =
            serde_json::from_str(document).map_err(|error| PricingError::InvalidDocument {
                index,
                message: error.to_string(),
            })?;
        let instance_type = entry
            .product
            .attributes
            .instance_type
            .filter(|instance_type| !instance_type.is_empty())
            .ok_or(PricingError::MissingField {
                index,
                field: INSTANCE_TYPE_FIELD,
            })?;
        if let Some(price) = hourly_price(&entry.terms, currency, index, &instance_type)? {
            prices.insert(instance_type, price);
        }
    }
    Ok(prices)
}

/// The part of a price-list document prices are read from.
#[derive(Deserialize)]
struct PriceListEntry {
    #[serde(default)]
    product: Product,
    #[serde(default)]
    terms: Terms,
}

#[derive(Default, Deserialize)]
struct Product {
    #[serde(default)]
    attributes: Attributes,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Attributes {
    instance_type: Option<String>,
}

#[derive(Default, Deserialize)]
struct Terms {
    /// Offer term code → term.
    #[serde(rename = "OnDemand", default)]
    on_demand: BTreeMap<String, OfferTerm>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OfferTerm {
    /// Rate code → dimension.
    #[serde(default)]
    price_dimensions: BTreeMap<String, PriceDimension>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PriceDimension {
    unit: Option<String>,
    /// Currency → price, as a decimal string.
    #[serde(default)]
    price_per_unit: BTreeMap<String, String>,
}

/// The first non-zero hourly price in `currency` among `terms`, if any.
fn hourly_price(
    terms: &Terms,
    currency: &str,
    index: usize,
    instance_type: &str,
) -> Result<Option<f64>, PricingError> {
    let dimensions = terms
        .on_demand
        .values()
        .flat_map(|term| term.price_dimensions.values());
    for dimension in dimensions {
        if dimension.unit.as_deref() != Some(HOURLY_UNIT) {
            continue;
        }
        let Some(written) = dimension.price_per_unit.get(currency) else {
            continue;
        };
        let price = written
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|price| price.is_finite() && *price >= 0.0)
            .ok_or_else(|| PricingError::InvalidPrice {
                index,
                instance_type: instance_type.to_owned(),
                value: written.clone(),
            })?;
        if price > 0.0 {
            return Ok(Some(price));
        }
    }
    Ok(None)
}

/// One record of EC2's spot price history.
#[derive(Debug, Clone, PartialEq)]
pub struct SpotPrice {
    /// The instance type (`m5.large`).
    pub instance_type: String,
    /// The zone (`us-east-1a`).
    pub zone: String,
    /// Dollars per hour.
    pub price: f64,
    /// Seconds since the Unix epoch when the price took effect.
    pub timestamp: i64,
}

/// The newest record per instance type and zone in `history`, ordered by type then zone. Of records
/// with the same timestamp the later one in `history` wins; records whose price is not a positive
/// number are dropped.
pub fn latest_spot_prices(history: Vec<SpotPrice>) -> Vec<SpotPrice> {
    let mut latest = BTreeMap::new();
    for record in history.into_iter().filter(|record| is_price(record.price)) {
        let key = (record.instance_type.clone(), record.zone.clone());
        keep_newer(&mut latest, key, record, |record| record.timestamp);
    }
    latest.into_values().collect()
}

/// A spot price as [`Prices`] keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ZonalSpot {
    price: f64,
    timestamp: i64,
}

/// The last known prices (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    /// Instance type → dollars per hour.
    on_demand: BTreeMap<String, f64>,
    /// Instance type → zone → price.
    spot: BTreeMap<String, BTreeMap<String, ZonalSpot>>,
    on_demand_refreshed_at: Option<i64>,
    spot_refreshed_at: Option<i64>,
}

impl Prices {
    /// Prices from a built-in on-demand table (instance type → dollars per hour) that no API has
    /// refreshed yet; entries whose price is not a positive number are dropped.
    pub fn new(built_in: BTreeMap<String, f64>) -> Self {
        Prices {
            on_demand: built_in
                .into_iter()
                .filter(|(_, price)| is_price(*price))
                .collect(),
            ..Prices::default()
        }
    }

    /// The last known on-demand price of `instance_type`.
    pub fn on_demand(&self, instance_type: &str) -> Option<f64> {
        self.on_demand.get(instance_type).copied()
    }

    /// The last known spot price of `instance_type` in `zone`: its on-demand price until spot
    /// prices first arrive, then only what EC2 reported for that zone.
    pub fn spot(&self, instance_type: &str, zone: &str) -> Option<f64> {
        if self.spot_refreshed_at.is_none() {
            return self.on_demand(instance_type);
        }
        self.spot.get(instance_type)?.get(zone).map(|spot| spot.price)
    }

    /// Merges fresh on-demand prices into the table at `now` (seconds since the Unix epoch): types
    /// missing from `prices` keep their last known price. Returns false, changing nothing, when
    /// `prices` holds no positive price.
    pub fn update_on_demand(&mut self, prices: BTreeMap<String, f64>, now: i64) -> bool {
        let fresh: Vec<(String, f64)> = prices.into_iter().filter(|(_, price)| is_price(*price)).collect();
        if fresh.is_empty() {
            return false;
        }
        self.on_demand.extend(fresh);
        self.on_demand_refreshed_at = Some(now);
        true
    }

    /// Merges a spot price history into the table at `now` (seconds since the Unix epoch): the
    /// newest record per type and zone, unless the table already holds a newer one; other zones and
    /// types keep their last known price. Returns false, changing nothing, when `history` holds no
    /// positive price.
    pub fn update_spot(&mut self, history: Vec<SpotPrice>, now: i64) -> bool {
        let latest = latest_spot_prices(history);
        if latest.is_empty() {
            return false;
        }
        for record in latest {
            let zones = self.spot.entry(record.instance_type).or_default();
            let spot = ZonalSpot {
                price: record.price,
                timestamp: record.timestamp,
            };
            keep_newer(zones, record.zone, spot, |spot| spot.timestamp);
        }
        self.spot_refreshed_at = Some(now);
        true
    }

    /// When on-demand prices were last refreshed (seconds since the Unix epoch); `None` while the
    /// built-in table is all there is.
    pub fn on_demand_refreshed_at(&self) -> Option<i64> {
        self.on_demand_refreshed_at
    }

    /// When spot prices were last refreshed (seconds since the Unix epoch); `None` until they first
    /// arrive.
    pub fn spot_refreshed_at(&self) -> Option<i64> {
        self.spot_refreshed_at
    }

    /// Whether either kind of price was never refreshed or was last refreshed [`PRICING_REFRESH`] or
    /// longer before `now` (seconds since the Unix epoch). A failed refresh leaves this true: the
    /// caller paces its retries.
    pub fn needs_refresh(&self, now: i64) -> bool {
        is_due(self.on_demand_refreshed_at, now) || is_due(self.spot_refreshed_at, now)
    }
}

/// Fetches on-demand prices for `region` and spot prices for `zones` from `source` concurrently and
/// applies what arrives at `now` (seconds since the Unix epoch). A kind whose fetch fails or comes
/// back empty keeps its last known prices; the returned errors (none on full success) say why, for
/// the caller to log.
pub async fn refresh(
    prices: &mut Prices,
    source: &dyn PriceSource,
    region: &str,
    zones: &[String],
    now: i64,
) -> Vec<PricingError> {
    let (on_demand, spot) = future::join(source.on_demand(region), source.spot(zones)).await;
    let mut errors = Vec::new();
    match on_demand {
        Ok(table) => {
            if !prices.update_on_demand(table, now) {
                errors.push(PricingError::Empty {
                    kind: PriceKind::OnDemand,
                });
            }
        }
        Err(error) => errors.push(error),
    }
    match spot {
        Ok(history) => {
            if !prices.update_spot(history, now) {
                errors.push(PricingError::Empty {
                    kind: PriceKind::Spot,
                });
            }
        }
        Err(error) => errors.push(error),
    }
    errors
}

/// Whether [`PRICING_REFRESH`] has passed between `refreshed_at` (never: yes) and `now`; a clock
/// that went back says no.
fn is_due(refreshed_at: Option<i64>, now: i64) -> bool {
    let Some(at) = refreshed_at else {
        return true;
    };
    u64::try_from(now.saturating_sub(at)).unwrap_or(0) >= PRICING_REFRESH.as_secs()
}

/// Whether `price` can be a price: finite and above zero (a zero price means no price).
fn is_price(price: f64) -> bool {
    price.is_finite() && price > 0.0
}

/// Stores `value` under `key` unless the value already there is newer.
fn keep_newer<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, value: V, timestamp: impl Fn(&V) -> i64) {
    match map.entry(key) {
        Entry::Vacant(slot) => {
            slot.insert(value);
        }
        Entry::Occupied(mut slot) => {
            if timestamp(&value) >= timestamp(slot.get()) {
                slot.insert(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = include_str!("../tests/fixtures/pricing/get-products-page1.json");
    const METAL: &str = include_str!("../tests/fixtures/pricing/get-products-metal.json");
    const MALFORMED: &str = include_str!("../tests/fixtures/pricing/get-products-malformed.json");

    const HOUR: i64 = 60 * 60;

    /// A fixture's documents, as `GetProducts`' `PriceList` holds them.
    fn documents(fixture: &str) -> Vec<String> {
        serde_json::from_str(fixture).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parsed(fixture: &str) -> BTreeMap<String, f64> {
        parse_on_demand(&documents(fixture)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn table(entries: &[(&str, f64)]) -> BTreeMap<String, f64> {
        entries
            .iter()
            .map(|(instance_type, price)| ((*instance_type).to_owned(), *price))
            .collect()
    }

    fn spot(instance_type: &str, zone: &str, price: f64, timestamp: i64) -> SpotPrice {
        SpotPrice {
            instance_type: instance_type.to_owned(),
            zone: zone.to_owned(),
            price,
            timestamp,
        }
    }

    fn zones() -> Vec<String> {
        vec!["us-east-1a".to_owned(), "us-east-1b".to_owned()]
    }

    /// Answers every call with what it was built with.
    struct FakeSource {
        on_demand: Result<BTreeMap<String, f64>, PricingError>,
        spot: Result<Vec<SpotPrice>, PricingError>,
    }

    impl PriceSource for FakeSource {
        fn on_demand<'a>(&'a self, _region: &'a str) -> PriceFuture<'a, BTreeMap<String, f64>> {
            Box::pin(async move { self.on_demand.clone() })
        }

        fn spot<'a>(&'a self, _zones: &'a [String]) -> PriceFuture<'a, Vec<SpotPrice>> {
            Box::pin(async move { self.spot.clone() })
        }
    }

    #[test]
    fn hourly_prices_are_read_from_shared_and_bare_metal_pages() {
        assert_eq!(documents(PAGE).len(), 4);
        let shared = parsed(PAGE);
        assert_eq!(shared.get("m5.large"), Some(&0.096));
        assert_eq!(shared.get("c5.xlarge"), Some(&0.17));
        assert_eq!(shared.get("t3.micro"), Some(&0.0104));
        let metal = parsed(METAL);
        assert_eq!(metal, table(&[("c5.metal", 4.08), ("m5.metal", 4.608)]));
    }

    #[test]
    fn zero_prices_and_other_currencies_are_skipped() {
        let shared = parsed(PAGE);
        assert_eq!(shared.len(), 3);
        assert_eq!(shared.get("u7i-12tb.224xlarge"), None);
        let in_yuan = parse_on_demand_in(&documents(PAGE), price_currency("cn-north-1"));
        assert_eq!(in_yuan, Ok(BTreeMap::new()));
        assert_eq!(price_currency("us-east-1"), "USD");
    }

    #[test]
    fn a_document_without_an_instance_type_fails_the_page_naming_it() {
        let error = parse_on_demand(&documents(MALFORMED)).err();
        assert_eq!(
            error,
            Some(PricingError::MissingField {
                index: 1,
                field: "product.attributes.instanceType",
            })
        );
        assert_eq!(
            error.map(|e| e.to_string()).as_deref(),
            Some("price list document 1 has no product.attributes.instanceType")
        );
    }

    #[test]
    fn a_document_that_is_not_json_or_has_no_numeric_price_fails_the_page_naming_it() {
        let mut page = documents(PAGE);
        page.insert(2, r#"{"product": {"attributes": "#.to_owned());
        assert!(matches!(
            parse_on_demand(&page),
            Err(PricingError::InvalidDocument { index: 2, .. })
        ));
        let garbled = vec![documents(PAGE)[0].replace("0.0960000000", "n/a")];
        assert_eq!(
            parse_on_demand(&garbled),
            Err(PricingError::InvalidPrice {
                index: 0,
                instance_type: "m5.large".to_owned(),
                value: "n/a".to_owned(),
            })
        );
    }

    #[test]
    fn the_newest_spot_price_wins_per_type_and_zone() {
        let latest = latest_spot_prices(vec![
            spot("m5.large", "us-east-1a", 0.041, 200),
            spot("m5.large", "us-east-1b", 0.052, 150),
            spot("m5.large", "us-east-1a", 0.035, 300),
            spot("m5.large", "us-east-1a", 0.090, 100),
            spot("c5.xlarge", "us-east-1a", 0.0, 400),
        ]);
        assert_eq!(
            latest,
            vec![
                spot("m5.large", "us-east-1a", 0.035, 300),
                spot("m5.large", "us-east-1b", 0.052, 150),
            ]
        );
    }

    #[test]
    fn spot_is_priced_at_on_demand_until_spot_prices_arrive() {
        let mut prices = Prices::new(table(&[("m5.large", 0.096), ("c5.xlarge", 0.17)]));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.096));
        assert_eq!(prices.spot("r5.large", "us-east-1a"), None);

        let first = vec![spot("m5.large", "us-east-1a", 0.035, 300)];
        assert!(prices.update_spot(first, 1_000));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.035));
        assert_eq!(prices.spot("m5.large", "us-east-1b"), None);
        assert_eq!(prices.spot("c5.xlarge", "us-east-1a"), None);

        // An older record arriving later does not replace a newer one; other zones merge in.
        let second = vec![
            spot("m5.large", "us-east-1a", 0.090, 100),
            spot("m5.large", "us-east-1b", 0.052, 150),
        ];
        assert!(prices.update_spot(second, 2_000));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.035));
        assert_eq!(prices.spot("m5.large", "us-east-1b"), Some(0.052));
        assert_eq!(prices.spot_refreshed_at(), Some(2_000));
    }

    #[test]
    fn updates_merge_and_empty_updates_are_ignored() {
        let mut prices = Prices::new(table(&[("m5.large", 0.1), ("c5.xlarge", 0.17), ("x9.free", 0.0)]));
        assert_eq!(prices.on_demand("x9.free"), None);
        assert!(!prices.update_on_demand(BTreeMap::new(), 1_000));
        assert!(!prices.update_on_demand(table(&[("m5.large", 0.0)]), 1_000));
        assert!(!prices.update_spot(Vec::new(), 1_000));
        assert_eq!(prices.on_demand("m5.large"), Some(0.1));
        assert_eq!(prices.on_demand_refreshed_at(), None);

        assert!(prices.update_on_demand(parsed(METAL), 2_000));
        assert!(prices.update_on_demand(parsed(PAGE), 2_000));
        assert_eq!(prices.on_demand("m5.large"), Some(0.096));
        assert_eq!(prices.on_demand("m5.metal"), Some(4.608));
        assert_eq!(prices.on_demand("c5.xlarge"), Some(0.17));
        assert_eq!(prices.on_demand_refreshed_at(), Some(2_000));
    }

    #[tokio::test]
    async fn a_refresh_applies_both_kinds_of_price() {
        let mut prices = Prices::new(table(&[("m5.large", 0.1)]));
        let source = FakeSource {
            on_demand: Ok(parsed(PAGE)),
            spot: Ok(vec![spot("m5.large", "us-east-1a", 0.035, 900)]),
        };
        let errors = refresh(&mut prices, &source, "us-east-1", &zones(), 1_000).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(prices.on_demand("m5.large"), Some(0.096));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.035));
        assert_eq!(prices.on_demand_refreshed_at(), Some(1_000));
        assert_eq!(prices.spot_refreshed_at(), Some(1_000));
    }

    #[tokio::test]
    async fn a_failed_or_empty_refresh_keeps_the_last_known_prices() {
        let mut prices = Prices::new(table(&[("m5.large", 0.1)]));
        let throttled = PricingError::Fetch {
            kind: PriceKind::OnDemand,
            message: "ThrottlingException: Rate exceeded".to_owned(),
        };
        let failing = FakeSource {
            on_demand: Err(throttled.clone()),
            spot: Ok(Vec::new()),
        };
        let errors = refresh(&mut prices, &failing, "us-east-1", &zones(), 1_000).await;
        let no_spot = PricingError::Empty {
            kind: PriceKind::Spot,
        };
        assert_eq!(errors, vec![throttled, no_spot]);
        assert_eq!(prices.on_demand("m5.large"), Some(0.1));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.1));
        assert_eq!(prices.on_demand_refreshed_at(), None);
        assert!(prices.needs_refresh(1_000));

        let working = FakeSource {
            on_demand: Ok(parsed(PAGE)),
            spot: Ok(vec![spot("m5.large", "us-east-1a", 0.035, 900)]),
        };
        let errors = refresh(&mut prices, &working, "us-east-1", &zones(), 2_000).await;
        assert!(errors.is_empty(), "{errors:?}");
        let denied = PricingError::Fetch {
            kind: PriceKind::Spot,
            message: "UnauthorizedOperation".to_owned(),
        };
        let broken = FakeSource {
            on_demand: Ok(BTreeMap::new()),
            spot: Err(denied.clone()),
        };
        let errors = refresh(&mut prices, &broken, "us-east-1", &zones(), 3_000).await;
        let no_on_demand = PricingError::Empty {
            kind: PriceKind::OnDemand,
        };
        assert_eq!(errors, vec![no_on_demand, denied]);
        assert_eq!(prices.on_demand("m5.large"), Some(0.096));
        assert_eq!(prices.spot("m5.large", "us-east-1a"), Some(0.035));
        assert_eq!(prices.on_demand_refreshed_at(), Some(2_000));
        assert_eq!(prices.spot_refreshed_at(), Some(2_000));
    }

    #[test]
    fn prices_need_a_refresh_twelve_hours_after_the_last() {
        let mut prices = Prices::new(table(&[("m5.large", 0.1)]));
        assert!(prices.needs_refresh(0));
        assert!(prices.update_on_demand(table(&[("m5.large", 0.096)]), 1_000));
        assert!(prices.needs_refresh(1_000), "spot prices were never refreshed");
        let history = vec![spot("m5.large", "us-east-1a", 0.035, 900)];
        assert!(prices.update_spot(history, 1_000));
        assert!(!prices.needs_refresh(1_000));
        assert!(!prices.needs_refresh(1_000 + 12 * HOUR - 1));
        assert!(prices.needs_refresh(1_000 + 12 * HOUR));
        assert!(!prices.needs_refresh(0), "the clock went back");
    }

    #[test]
    fn the_pricing_endpoint_depends_on_the_region() {
        assert_eq!(pricing_endpoint_region("us-west-2"), "us-east-1");
        assert_eq!(pricing_endpoint_region("sa-east-1"), "us-east-1");
        assert_eq!(pricing_endpoint_region("ap-northeast-1"), "ap-south-1");
        assert_eq!(pricing_endpoint_region("cn-north-1"), "cn-northwest-1");
        assert_eq!(pricing_endpoint_region("eu-west-1"), "eu-central-1");
    }

    #[test]
    fn on_demand_queries_cover_shared_instances_and_bare_metal() {
        fn value<'a>(filters: &'a [TermMatch], field: &str) -> Option<&'a str> {
            let filter = filters.iter().find(|filter| filter.field == field)?;
            Some(filter.value.as_str())
        }
        let [shared, metal] = on_demand_filters("us-west-2");
        for filters in [&shared, &metal] {
            assert_eq!(value(filters, "regionCode"), Some("us-west-2"));
            assert_eq!(value(filters, "operatingSystem"), Some("Linux"));
            assert_eq!(value(filters, "preInstalledSw"), Some("NA"));
            assert_eq!(value(filters, "capacitystatus"), Some("Used"));
            assert_eq!(value(filters, "marketoption"), Some("OnDemand"));
            assert_eq!(filters.len(), 7);
        }
        assert_eq!(value(&shared, "tenancy"), Some("Shared"));
        assert_eq!(value(&shared, "productFamily"), Some("Compute Instance"));
        assert_eq!(value(&metal, "tenancy"), Some("Dedicated"));
        assert_eq!(
            value(&metal, "productFamily"),
            Some("Compute Instance (bare metal)")
        );
    }
}

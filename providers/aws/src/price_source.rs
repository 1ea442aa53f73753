//! The [`PriceSource`] that asks AWS: on-demand prices from the Price List API's `GetProducts`
//! (both of Karpenter's queries, every page of 100 documents, parsed in the region's currency),
//! spot prices from EC2's `DescribeSpotPriceHistory` for the Linux product descriptions in the
//! asked zones, with a start time of now so each zone's current price comes back.
//!
//! In an isolated VPC (`ISOLATED_VPC`) the Price List API cannot be reached, so on-demand prices
//! are not asked for and the built-in table stays in use.
//!
//! Failures: a call that fails is a [`PricingError::Fetch`] naming the kind of price and carrying
//! the API's words; a spot record without a type, zone, parsable price or timestamp is skipped.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter as Ec2Filter;
use aws_sdk_pricing::types::{Filter, FilterType};
use futures::FutureExt;

use crate::{
    clients::AwsClients,
    error::AwsError,
    pricing::{
        PRICING_SERVICE_CODE, PriceFuture, PriceKind, PriceSource, PricingError, SPOT_PRODUCT_DESCRIPTIONS,
        SpotPrice, on_demand_filters, parse_on_demand_in, price_currency,
    },
};

/// Page size of `GetProducts` (its maximum).
const PRODUCTS_PAGE: i32 = 100;

/// Prices from the AWS APIs (see the module docs).
#[derive(Debug, Clone)]
pub struct SdkPriceSource {
    clients: AwsClients,
    isolated_vpc: bool,
}

impl SdkPriceSource {
    /// A source asking through `clients`; with `isolated_vpc`, on-demand prices are not asked for.
    pub fn new(clients: AwsClients, isolated_vpc: bool) -> Self {
        Self {
            clients,
            isolated_vpc,
        }
    }

    async fn products(
        &self,
        region: &str,
        query: Vec<crate::pricing::TermMatch>,
    ) -> Result<Vec<String>, PricingError> {
        let filters = query
            .into_iter()
            .map(|term| {
                Filter::builder()
                    .r#type(FilterType::TermMatch)
                    .field(term.field)
                    .value(term.value)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fetch(PriceKind::OnDemand, e.to_string()))?;
        tracing::debug!(region, "reading on-demand prices");
        self.clients
            .pricing
            .get_products()
            .service_code(PRICING_SERVICE_CODE)
            .set_filters(Some(filters))
            .max_results(PRODUCTS_PAGE)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| {
                fetch(
                    PriceKind::OnDemand,
                    AwsError::api("GetProducts", e.into_service_error()).to_string(),
                )
            })
    }
}

fn fetch(kind: PriceKind, message: String) -> PricingError {
    PricingError::Fetch { kind, message }
}

impl PriceSource for SdkPriceSource {
    fn on_demand<'a>(&'a self, region: &'a str) -> PriceFuture<'a, BTreeMap<String, f64>> {
        async move {
            if self.isolated_vpc {
                return Err(fetch(
                    PriceKind::OnDemand,
                    "ISOLATED_VPC is set, so the Price List API is not asked; the built-in prices stay"
                        .to_owned(),
                ));
            }
            let mut prices = BTreeMap::new();
            for query in on_demand_filters(region) {
                let documents = self.products(region, query).await?;
                prices.extend(parse_on_demand_in(&documents, price_currency(region))?);
            }
            Ok(prices)
        }
        .boxed()
    }

    fn spot<'a>(&'a self, zones: &'a [String]) -> PriceFuture<'a, Vec<SpotPrice>> {
        async move {
            let zone_filter = Ec2Filter::builder()
                .name("availability-zone")
                .set_values(Some(zones.to_vec()))
                .build();
            let history = self
                .clients
                .ec2
                .describe_spot_price_history()
                .set_product_descriptions(Some(SPOT_PRODUCT_DESCRIPTIONS.map(str::to_owned).to_vec()))
                .start_time(aws_sdk_ec2::primitives::DateTime::from(
                    std::time::SystemTime::now(),
                ))
                .filters(zone_filter)
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|e| {
                    fetch(
                        PriceKind::Spot,
                        AwsError::api("DescribeSpotPriceHistory", e.into_service_error()).to_string(),
                    )
                })?;
            Ok(history
                .iter()
                .filter_map(|record| {
                    Some(SpotPrice {
                        instance_type: record.instance_type()?.as_str().to_owned(),
                        zone: record.availability_zone()?.to_owned(),
                        price: record.spot_price()?.parse().ok()?,
                        timestamp: record.timestamp()?.secs(),
                    })
                })
                .collect())
        }
        .boxed()
    }
}

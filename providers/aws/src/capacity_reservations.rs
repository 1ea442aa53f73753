//! The capacity reservations an EC2NodeClass selects, read with DescribeCapacityReservations as
//! Karpenter's AWS provider reads them.
//!
//! A term with an `id` asks for that reservation; a term with tags (`*` for any value) or an
//! instance match criteria asks with filters, its `ownerID` among them; a term with only an
//! owner asks nothing. Every call asks only for `active` reservations and follows every page.
//! Reservations several terms select are kept once, ones already ended are dropped, and the rest
//! come sorted by id with the instances each can still take. An entry EC2 describes with a match
//! criteria or a type Joist does not know is logged and left out.
//!
//! Failures: an id EC2 does not know is no reservation, not an error; any other failure converts
//! as every EC2 error does ([`AwsError`]).

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{
    CapacityReservation as Ec2Reservation, CapacityReservationType, Filter,
    InstanceMatchCriteria as Ec2Criteria,
};
use joist_messages::apis::ec2nodeclass::{
    CapacityReservation, CapacityReservationSelectorTerm, InstanceMatchCriteria, ReservationType,
};
use joist_provider::capacity_reservation;

use crate::{clients::AwsClients, error::AwsError};

const OPERATION: &str = "DescribeCapacityReservations";

/// One DescribeCapacityReservations question.
#[derive(Debug, Clone, PartialEq)]
enum Query {
    /// One reservation by id.
    Id(String),
    /// Reservations by filters.
    Filters(Vec<Filter>),
}

/// The question each term asks, if any.
fn query(term: &CapacityReservationSelectorTerm) -> Option<Query> {
    if let Some(id) = &term.id {
        return Some(Query::Id(id.clone()));
    }
    if term.tags.is_empty() && term.instance_match_criteria.is_none() {
        return None;
    }
    let filter = |name: &str, value: &str| Filter::builder().name(name).values(value).build();
    let mut filters = Vec::new();
    if let Some(owner) = &term.owner_id {
        filters.push(filter("owner-id", owner));
    }
    for (key, value) in &term.tags {
        filters.push(if value == "*" {
            filter("tag-key", key)
        } else {
            filter(&format!("tag:{key}"), value)
        });
    }
    if let Some(criteria) = term.instance_match_criteria {
        let value = match criteria {
            InstanceMatchCriteria::Open => "open",
            InstanceMatchCriteria::Targeted => "targeted",
        };
        filters.push(filter("instance-match-criteria", value));
    }
    Some(Query::Filters(filters))
}

/// The reservations `terms` select at `now` (seconds since the epoch), each with the instances it
/// can still take (see the module docs).
pub async fn describe(
    clients: &AwsClients,
    terms: &[CapacityReservationSelectorTerm],
    now: i64,
) -> Result<Vec<(CapacityReservation, u32)>, AwsError> {
    let mut found: BTreeMap<String, (CapacityReservation, u32)> = BTreeMap::new();
    for query in terms.iter().filter_map(query) {
        for described in ask(clients, query).await? {
            if let Some((entry, room)) = entry(&described, now) {
                found.entry(entry.id.clone()).or_insert((entry, room));
            }
        }
    }
    Ok(found.into_values().collect())
}

async fn ask(clients: &AwsClients, query: Query) -> Result<Vec<Ec2Reservation>, AwsError> {
    let active = Filter::builder().name("state").values("active").build();
    let request = clients.ec2.describe_capacity_reservations().filters(active);
    let request = match query {
        Query::Id(id) => request.capacity_reservation_ids(id),
        Query::Filters(filters) => filters
            .into_iter()
            .fold(request.max_results(1000), |request, filter| {
                request.filters(filter)
            }),
    };
    let described: Result<Vec<Ec2Reservation>, _> =
        request.into_paginator().items().send().try_collect().await;
    match described.map_err(|e| AwsError::api(OPERATION, e.into_service_error())) {
        Err(error) if error.code().is_some_and(|code| code.ends_with(".NotFound")) => Ok(Vec::new()),
        other => other,
    }
}

/// The status entry of one described reservation and its room; `None` for one that ended before
/// `now`, lacks an id, type or zone, or that Joist cannot read.
fn entry(described: &Ec2Reservation, now: i64) -> Option<(CapacityReservation, u32)> {
    let id = described.capacity_reservation_id()?;
    let end = described.end_date().map(|t| t.secs());
    if end.is_some_and(|end| end <= now) {
        return None;
    }
    let instance_match_criteria = match described.instance_match_criteria() {
        Some(Ec2Criteria::Open) => InstanceMatchCriteria::Open,
        Some(Ec2Criteria::Targeted) => InstanceMatchCriteria::Targeted,
        other => {
            tracing::warn!(reservation = id, criteria = ?other, "failed to parse discovered capacity reservation: unknown instance match criteria");
            return None;
        }
    };
    let reservation_type = match described.reservation_type() {
        None | Some(CapacityReservationType::Default) => ReservationType::Default,
        Some(CapacityReservationType::CapacityBlock) => ReservationType::CapacityBlock,
        Some(other) => {
            tracing::warn!(
                reservation = id,
                kind = other.as_str(),
                "failed to parse discovered capacity reservation: unknown reservation type"
            );
            return None;
        }
    };
    let entry = CapacityReservation {
        id: id.to_owned(),
        availability_zone: described.availability_zone()?.to_owned(),
        instance_type: described.instance_type()?.to_owned(),
        owner_id: described.owner_id().unwrap_or_default().to_owned(),
        instance_match_criteria,
        end_time: end
            .and_then(|end| jiff::Timestamp::from_second(end).ok())
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
        interruptible: Some(described.interruptible().unwrap_or(false)),
        reservation_type,
        state: capacity_reservation::state(reservation_type, end, now),
    };
    let room = u32::try_from(described.available_instance_count().unwrap_or(0)).unwrap_or(0);
    Some((entry, room))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A term as a user writes it (`{"id": "cr-1"}`).
    fn term(written: serde_json::Value) -> CapacityReservationSelectorTerm {
        serde_json::from_value(written).unwrap_or_else(|e| panic!("{e}"))
    }

    fn filters(query: Option<Query>) -> Vec<(String, Vec<String>)> {
        match query {
            Some(Query::Filters(filters)) => filters
                .iter()
                .map(|f| (f.name().unwrap_or_default().to_owned(), f.values().to_vec()))
                .collect(),
            other => panic!("not filters: {other:?}"),
        }
    }

    #[test]
    fn terms_become_an_id_query_filters_or_nothing() {
        use serde_json::json;
        assert_eq!(
            query(&term(json!({"id": "cr-1"}))),
            Some(Query::Id("cr-1".into()))
        );
        assert_eq!(
            query(&term(json!({"ownerID": "123456789012"}))),
            None,
            "an owner alone asks nothing"
        );
        let criteria = term(json!({
            "tags": {"team": "ml", "env": "*"}, "ownerID": "123456789012", "instanceMatchCriteria": "open"
        }));
        assert_eq!(
            filters(query(&criteria)),
            [
                ("owner-id".into(), vec!["123456789012".into()]),
                ("tag-key".into(), vec!["env".into()]),
                ("tag:team".into(), vec!["ml".into()]),
                ("instance-match-criteria".into(), vec!["open".into()]),
            ]
        );
    }
}

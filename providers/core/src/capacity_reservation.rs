//! Capacity reservations as every provider offers them, with Karpenter v1.14's rules: an on-demand
//! capacity reservation (ODCR) or a capacity block the EC2NodeClass selects becomes, while it is
//! not expiring and its zone is one the class launches in, one `reserved` offering of its instance
//! type in its zone, priced at the on-demand price divided by [`RESERVED_PRICE_DIVISOR`] (so it is
//! always the cheapest way to buy that type, and consolidation still tells the types apart), and
//! available while it can take another instance.
//!
//! A capacity block is `expiring` from [`EXPIRY_LEAD_SECONDS`] before its end (EC2 reclaims its
//! instances 30 minutes before the end; Joist drains them ten minutes earlier still).
//!
//! How many instances a reservation can still take is counted by [`Availability`]: set from the
//! cloud's own count whenever the reservations are described, one less for each launch into it,
//! one more for each instance in it confirmed terminated, none once a launch into it ran out of
//! capacity or EC2 warned that it takes the capacity back. Nothing here fails: a reservation of a
//! type the provider does not sell simply offers nothing.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use joist_messages::{
    apis::{
        EC2NodeClassStatus,
        ec2nodeclass::{CapacityReservation, ReservationState, ReservationType},
    },
    model::instance_type::{CapacityType, OfferedReservation, Offering, Reservation},
};

/// A reserved offering costs its type's on-demand price divided by this.
pub const RESERVED_PRICE_DIVISOR: f64 = 10_000_000.0;

/// Seconds before its end at which a capacity block is `expiring`: its nodes are drained and it
/// offers no capacity.
pub const EXPIRY_LEAD_SECONDS: i64 = 40 * 60;

/// How often the reservations are described again, and reserved nodes checked for demotion and
/// expiry.
pub const POLL_INTERVAL: Duration = Duration::from_secs(60);

/// Where a reservation is at `now` (seconds since the epoch): a capacity block with an end is
/// `expiring` from [`EXPIRY_LEAD_SECONDS`] before it; everything else is `active`.
pub fn state(kind: ReservationType, end: Option<i64>, now: i64) -> ReservationState {
    match (kind, end) {
        (ReservationType::CapacityBlock, Some(end)) if now >= end - EXPIRY_LEAD_SECONDS => {
            ReservationState::Expiring
        }
        _ => ReservationState::Active,
    }
}

/// The labels-level view of a status entry.
pub fn reservation(entry: &CapacityReservation) -> Reservation {
    Reservation {
        id: entry.id.clone(),
        kind: entry.reservation_type,
        interruptible: entry.interruptible.unwrap_or(false),
    }
}

/// The reserved offerings of `instance_type` from the reservations in `status`: one per
/// reservation of that type in `zones` (where the class launches the type) that is not expiring,
/// priced from `on_demand` (the type's on-demand price; none prices the offering at zero), and
/// available while `availability` counts room in it ([`recount`] brings that up to date).
pub fn reserved_offerings(
    instance_type: &str,
    on_demand: Option<f64>,
    zones: &[&str],
    status: &EC2NodeClassStatus,
    availability: &Availability,
) -> Vec<Offering> {
    status
        .capacity_reservations
        .iter()
        .filter(|entry| {
            entry.instance_type == instance_type
                && entry.state != ReservationState::Expiring
                && zones.contains(&entry.availability_zone.as_str())
        })
        .map(|entry| {
            let capacity = availability.count(&entry.id);
            Offering {
                zone: entry.availability_zone.clone(),
                capacity_type: CapacityType::Reserved,
                price: on_demand.map_or(0.0, |price| price / RESERVED_PRICE_DIVISOR),
                available: capacity > 0,
                reservation: Some(OfferedReservation {
                    reservation: reservation(entry),
                    capacity,
                }),
            }
        })
        .collect()
}

/// Sets the room of each reserved offering of `offerings` from `counts` (a provider's
/// [`Availability::counts_now`]), available while it has room. True when any changed.
pub fn recount(offerings: &mut [Offering], counts: &HashMap<String, u32>) -> bool {
    let mut changed = false;
    for offering in offerings {
        if let Some(offered) = &mut offering.reservation {
            let capacity = counts.get(&offered.reservation.id).copied().unwrap_or(0);
            changed |= offered.capacity != capacity || offering.available != (capacity > 0);
            offered.capacity = capacity;
            offering.available = capacity > 0;
        }
    }
    changed
}

/// How many instances each reservation can still take (see the module docs). A reservation never
/// counted has no room.
#[derive(Debug, Default)]
pub struct Availability {
    counts: Mutex<HashMap<String, u32>>,
}

impl Availability {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cloud counted `available` free instances in `id`.
    pub fn sync(&self, id: &str, available: u32) {
        self.counts().insert(id.to_owned(), available);
    }

    /// An instance was launched into `id`.
    pub fn launched(&self, id: &str) {
        if let Some(count) = self.counts().get_mut(id) {
            *count = count.saturating_sub(1);
        }
    }

    /// An instance in `id` is confirmed terminated.
    pub fn terminated(&self, id: &str) {
        if let Some(count) = self.counts().get_mut(id) {
            *count += 1;
        }
    }

    /// `id` has no room: a launch into it ran out of capacity, or EC2 takes its capacity back.
    pub fn exhausted(&self, id: &str) {
        self.counts().insert(id.to_owned(), 0);
    }

    /// The instances `id` can still take.
    pub fn count(&self, id: &str) -> u32 {
        self.counts().get(id).copied().unwrap_or(0)
    }

    /// Every counted reservation's room, for the controllers' catalog.
    pub fn counts_now(&self) -> HashMap<String, u32> {
        self.counts().clone()
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::apis::ec2nodeclass::InstanceMatchCriteria;

    use super::*;

    fn entry(id: &str, instance_type: &str, zone: &str, state: ReservationState) -> CapacityReservation {
        CapacityReservation {
            id: id.into(),
            availability_zone: zone.into(),
            instance_type: instance_type.into(),
            owner_id: "123456789012".into(),
            instance_match_criteria: InstanceMatchCriteria::Targeted,
            end_time: None,
            interruptible: None,
            reservation_type: ReservationType::Default,
            state,
        }
    }

    #[test]
    fn a_capacity_block_expires_forty_minutes_before_its_end_and_an_odcr_never() {
        let end = 10_000;
        let block = ReservationType::CapacityBlock;
        assert_eq!(
            state(block, Some(end), end - 40 * 60 - 1),
            ReservationState::Active
        );
        assert_eq!(state(block, Some(end), end - 40 * 60), ReservationState::Expiring);
        assert_eq!(
            state(ReservationType::Default, Some(end), end),
            ReservationState::Active
        );
        assert_eq!(state(block, None, end), ReservationState::Active);
    }

    #[test]
    fn a_reservation_offers_its_type_near_free_while_it_has_room_in_a_launchable_zone() {
        let status = EC2NodeClassStatus {
            capacity_reservations: vec![
                entry("cr-a", "m5.large", "us-west-2a", ReservationState::Active),
                entry("cr-b", "m5.large", "us-west-2b", ReservationState::Active),
                entry("cr-c", "m5.large", "us-west-2a", ReservationState::Expiring),
                entry("cr-d", "m5.large", "us-west-2c", ReservationState::Active),
                entry("cr-e", "c5.large", "us-west-2a", ReservationState::Active),
            ],
            ..EC2NodeClassStatus::default()
        };
        let availability = Availability::default();
        for id in ["cr-a", "cr-c", "cr-d", "cr-e"] {
            availability.sync(id, 2);
        }
        let offerings = reserved_offerings(
            "m5.large",
            Some(0.096),
            &["us-west-2a", "us-west-2b"],
            &status,
            &availability,
        );
        let available: Vec<(&str, bool)> = offerings
            .iter()
            .map(|o| {
                (
                    o.reservation.as_ref().map_or("", |r| r.reservation.id.as_str()),
                    o.available,
                )
            })
            .collect();
        assert_eq!(
            available,
            [("cr-a", true), ("cr-b", false)],
            "cr-b was never counted, cr-c expires, cr-d is in a zone the class does not launch in"
        );
        assert!(
            offerings
                .iter()
                .all(|o| o.capacity_type == CapacityType::Reserved)
        );
        assert!((offerings[0].price - 0.096 / RESERVED_PRICE_DIVISOR).abs() < 1e-15);
    }

    #[test]
    fn a_recount_gives_a_reserved_offering_the_room_its_provider_counts_now() {
        let status = EC2NodeClassStatus {
            capacity_reservations: vec![entry("cr-a", "m5.large", "us-west-2a", ReservationState::Active)],
            ..EC2NodeClassStatus::default()
        };
        let availability = Availability::default();
        let mut offerings = reserved_offerings("m5.large", None, &["us-west-2a"], &status, &availability);
        assert!(!offerings[0].available);
        availability.sync("cr-a", 3);
        assert!(recount(&mut offerings, &availability.counts_now()));
        assert!(offerings[0].available);
        assert_eq!(offerings[0].reservation.as_ref().map(|r| r.capacity), Some(3));
        assert!(
            !recount(&mut offerings, &availability.counts_now()),
            "nothing changed"
        );
    }

    #[test]
    fn launches_and_terminations_count_a_reservation_down_and_up_and_exhaustion_empties_it() {
        let availability = Availability::default();
        availability.sync("cr-a", 1);
        availability.launched("cr-a");
        availability.launched("cr-a");
        assert_eq!(availability.count("cr-a"), 0, "never below zero");
        availability.terminated("cr-a");
        assert_eq!(availability.count("cr-a"), 1);
        availability.exhausted("cr-a");
        assert_eq!(availability.count("cr-a"), 0);
        availability.launched("cr-unknown");
        assert_eq!(availability.count("cr-unknown"), 0);
    }
}

//! The simulated cloud's capacity reservations: what EC2's DescribeCapacityReservations would
//! return, and whether a launch into one finds room.
//!
//! A reservation holds `count` instances of one type in one zone; an instance launched into it
//! takes one until it ends. A cancelled reservation, or one past its end, is no longer described
//! (EC2 lists only `active` ones to Karpenter's filter), and the instances it held keep running as
//! on-demand instances. The simulated cloud does not reclaim a capacity block's instances at its
//! end: Joist drains them 40 minutes before, which is what a scenario checks.
//!
//! Selection follows EC2's filters as Karpenter builds them: a term with an `id` selects that
//! reservation; a term with tags or an instance match criteria selects the reservations with every
//! tag (`*` for any value), that criteria and, when given, that owner; a term with only an owner
//! selects nothing.

use std::collections::BTreeMap;

use joist_messages::apis::ec2nodeclass::{
    CapacityReservation, CapacityReservationSelectorTerm, InstanceMatchCriteria, ReservationType,
};
use joist_provider::capacity_reservation;

/// The account that owns the simulated cloud's reservations unless a scenario names another.
pub const OWNER_ID: &str = "123456789012";

/// One reservation (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SimReservation {
    /// Its id (`cr-…`).
    pub id: String,
    /// The type it reserves.
    pub instance_type: String,
    /// Its zone.
    pub zone: String,
    /// Instances it holds.
    pub count: u32,
    /// An ODCR or a capacity block.
    pub kind: ReservationType,
    /// Whether EC2 may take the capacity back.
    pub interruptible: bool,
    /// `open` or `targeted`.
    pub match_criteria: InstanceMatchCriteria,
    /// The owning account.
    pub owner_id: String,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// When it ends, in seconds since the epoch.
    pub end: Option<i64>,
}

impl SimReservation {
    /// Whether `term` selects this reservation.
    fn selected_by(&self, term: &CapacityReservationSelectorTerm) -> bool {
        if let Some(id) = &term.id {
            return *id == self.id;
        }
        if term.tags.is_empty() && term.instance_match_criteria.is_none() {
            return false;
        }
        term.owner_id.as_ref().is_none_or(|owner| *owner == self.owner_id)
            && term
                .instance_match_criteria
                .is_none_or(|c| c == self.match_criteria)
            && term
                .tags
                .iter()
                .all(|(key, value)| self.tags.get(key).is_some_and(|v| value == "*" || v == value))
    }

    /// The status entry Karpenter would write for it at `now`.
    fn entry(&self, now: i64) -> CapacityReservation {
        CapacityReservation {
            id: self.id.clone(),
            availability_zone: self.zone.clone(),
            instance_type: self.instance_type.clone(),
            owner_id: self.owner_id.clone(),
            instance_match_criteria: self.match_criteria,
            end_time: self
                .end
                .and_then(|end| jiff::Timestamp::from_second(end).ok())
                .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
            interruptible: Some(self.interruptible),
            reservation_type: self.kind,
            state: capacity_reservation::state(self.kind, self.end, now),
        }
    }
}

/// Every reservation the cloud has, and how many instances each holds now.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    by_id: BTreeMap<String, (SimReservation, u32)>,
}

impl Reservations {
    /// Adds (or replaces) a reservation, holding no instance yet.
    pub fn add(&mut self, reservation: SimReservation) {
        let held = self.by_id.get(&reservation.id).map_or(0, |(_, held)| *held);
        self.by_id.insert(reservation.id.clone(), (reservation, held));
    }

    /// Cancels `id`; false when there is no such reservation.
    pub fn cancel(&mut self, id: &str) -> bool {
        self.by_id.remove(id).is_some()
    }

    /// Whether `id` is there at `now`.
    fn active(&self, id: &str, now: i64) -> Option<&(SimReservation, u32)> {
        self.by_id
            .get(id)
            .filter(|(r, _)| r.end.is_none_or(|end| now < end))
    }

    /// The reservations `terms` select at `now`, as status entries sorted by id, each with the
    /// instances it can still take.
    pub fn describe(
        &self,
        terms: &[CapacityReservationSelectorTerm],
        now: i64,
    ) -> Vec<(CapacityReservation, u32)> {
        self.by_id
            .keys()
            .filter_map(|id| self.active(id, now))
            .filter(|(r, _)| terms.iter().any(|term| r.selected_by(term)))
            .map(|(r, held)| (r.entry(now), r.count.saturating_sub(*held)))
            .collect()
    }

    /// Takes one instance's room in `id`; false when it has none (or is gone).
    pub fn take(&mut self, id: &str, now: i64) -> bool {
        if self.active(id, now).is_none_or(|(r, held)| *held >= r.count) {
            return false;
        }
        if let Some((_, held)) = self.by_id.get_mut(id) {
            *held += 1;
        }
        true
    }

    /// Gives back the room an ended instance held in `id`.
    pub fn release(&mut self, id: &str) {
        if let Some((_, held)) = self.by_id.get_mut(id) {
            *held = held.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(id: &str, tags: &[(&str, &str)]) -> SimReservation {
        SimReservation {
            id: id.into(),
            instance_type: "m5.large".into(),
            zone: "us-west-2a".into(),
            count: 1,
            kind: ReservationType::Default,
            interruptible: false,
            match_criteria: InstanceMatchCriteria::Targeted,
            owner_id: OWNER_ID.into(),
            tags: tags.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            end: Some(1_000),
        }
    }

    fn term(id: Option<&str>, tags: &[(&str, &str)], owner: Option<&str>) -> CapacityReservationSelectorTerm {
        CapacityReservationSelectorTerm {
            tags: tags.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            id: id.map(Into::into),
            owner_id: owner.map(Into::into),
            instance_match_criteria: None,
        }
    }

    #[test]
    fn terms_select_by_id_or_by_every_tag_and_an_owner_alone_selects_nothing() {
        let mut reservations = Reservations::default();
        reservations.add(reservation("cr-a", &[("team", "ml")]));
        reservations.add(reservation("cr-b", &[("team", "web")]));
        let ids = |terms: &[CapacityReservationSelectorTerm]| -> Vec<String> {
            reservations
                .describe(terms, 0)
                .into_iter()
                .map(|(e, _)| e.id)
                .collect()
        };
        assert_eq!(ids(&[term(Some("cr-b"), &[], None)]), ["cr-b"]);
        assert_eq!(ids(&[term(None, &[("team", "ml")], None)]), ["cr-a"]);
        assert_eq!(ids(&[term(None, &[("team", "*")], None)]), ["cr-a", "cr-b"]);
        assert_eq!(
            ids(&[term(None, &[("team", "*")], Some("999999999999"))]),
            Vec::<String>::new()
        );
        assert_eq!(ids(&[term(None, &[], Some(OWNER_ID))]), Vec::<String>::new());
    }

    #[test]
    fn a_reservation_takes_its_count_gives_room_back_and_is_gone_at_its_end() {
        let mut reservations = Reservations::default();
        reservations.add(reservation("cr-a", &[]));
        assert!(reservations.take("cr-a", 0));
        assert!(!reservations.take("cr-a", 0), "one instance fills it");
        reservations.release("cr-a");
        assert!(reservations.take("cr-a", 0));
        reservations.release("cr-a");
        assert!(!reservations.take("cr-a", 1_000), "ended");
        assert!(
            reservations
                .describe(&[term(Some("cr-a"), &[], None)], 1_000)
                .is_empty()
        );
        assert!(reservations.cancel("cr-a"));
        assert!(!reservations.take("cr-a", 0));
    }
}

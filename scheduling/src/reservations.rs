//! Capacity reservations during one solve, counted as Karpenter's reservation manager counts them.
//!
//! A reservation's reserved offerings can launch only as many NodeClaims as it has room for, so
//! the solve counts the room down as its claims take it. Pessimistically, as Karpenter does: a
//! claim holds one place in every reservation some instance type it may still launch could use
//! (an available reserved offering its requirements allow), from the pod that made it compatible
//! until a later pod rules it out. A claim that ends up holding any is narrowed to `reserved`
//! capacity in the reservations it holds.
//!
//! Two modes ([`ReservedOfferingMode`]): the provisioner's `Strict` refuses a pod that would
//! leave a claim with compatible reservations but no place in any (they were all taken earlier
//! in the batch), so the pod waits for the next batch rather than launching on-demand while
//! reserved capacity is still to be had; the disruption simulations' `Fallback` lets the claim go
//! on without a reservation. Room is counted once per reservation however many NodePools list it
//! (the smallest count any offering reports).

use std::{collections::HashMap, sync::Arc};

use joist_messages::model::{
    instance_type::InstanceType,
    requirements::{Operator, Requirement, Requirements},
};

use crate::input::ReservedOfferingMode;

/// The reservations one solve counts (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    ids: Vec<String>,
    index: HashMap<String, u32>,
    room: Vec<u32>,
    mode: ReservedOfferingMode,
}

impl Ledger {
    /// Every reservation an available offering of `catalog` launches into and counts room in,
    /// with that room.
    pub fn new(catalog: &[Arc<InstanceType>], mode: ReservedOfferingMode) -> Self {
        let mut ledger = Ledger {
            mode,
            ..Ledger::default()
        };
        let offered = catalog
            .iter()
            .flat_map(|it| &it.offerings)
            .filter(|o| o.available)
            .filter_map(|o| o.reservation.as_ref())
            .filter(|offered| offered.capacity > 0);
        for offered in offered {
            let id = &offered.reservation.id;
            match ledger.index.get(id) {
                Some(&r) => ledger.room[r as usize] = ledger.room[r as usize].min(offered.capacity),
                None => {
                    ledger.index.insert(id.clone(), ledger.ids.len() as u32);
                    ledger.ids.push(id.clone());
                    ledger.room.push(offered.capacity);
                }
            }
        }
        ledger
    }

    /// True when no offering launches into a reservation.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The number of a reservation `id`.
    pub fn number(&self, id: &str) -> Option<u32> {
        self.index.get(id).copied()
    }

    /// Whether a claim holding `held` may hold `r`: it does already, or there is room.
    pub fn can_hold(&self, r: u32, held: &[u32]) -> bool {
        held.contains(&r) || self.room[r as usize] > 0
    }

    /// Whether a claim that held `held`, could use reservations (`compatible`) and may hold
    /// `holdable` of them may take the pod, in this ledger's mode.
    pub fn allows(&self, held: &[u32], compatible: bool, holdable: &[u32]) -> bool {
        self.mode == ReservedOfferingMode::Fallback
            || !holdable.is_empty()
            || (!compatible && held.is_empty())
    }

    /// Makes `held` hold `next`: places no longer needed are given back, new ones taken.
    pub fn rehold(&mut self, held: &mut Vec<u32>, next: &[u32]) {
        for &r in held.iter().filter(|r| !next.contains(r)) {
            self.room[r as usize] += 1;
        }
        for &r in next.iter().filter(|r| !held.contains(r)) {
            self.room[r as usize] -= 1;
        }
        held.clear();
        held.extend_from_slice(next);
    }

    /// The room left in each reservation, to put back with [`Self::restore`].
    pub fn room(&self) -> &[u32] {
        &self.room
    }

    /// Puts back the room [`Self::room`] returned.
    pub fn restore(&mut self, room: &[u32]) {
        self.room.copy_from_slice(room);
    }

    /// `reqs` narrowed to reserved capacity in the reservations `held` (unchanged when none).
    pub fn narrow(&self, reqs: &Requirements, held: &[u32]) -> Requirements {
        let mut narrowed = reqs.clone();
        if held.is_empty() {
            return narrowed;
        }
        let mut ids: Vec<&str> = held.iter().map(|&r| self.ids[r as usize].as_str()).collect();
        ids.sort_unstable();
        let pinned = [
            Requirement::new(
                joist_messages::labels::CAPACITY_TYPE,
                Operator::In,
                [joist_messages::labels::capacity_type::RESERVED],
            ),
            Requirement::new(
                joist_messages::labels::aws::CAPACITY_RESERVATION_ID,
                Operator::In,
                ids,
            ),
        ];
        for requirement in pinned.into_iter().flatten() {
            narrowed.add(requirement);
        }
        narrowed
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::{
        apis::ec2nodeclass::ReservationType,
        labels::aws::CAPACITY_RESERVATION_ID,
        model::instance_type::{CapacityType, OfferedReservation, Offering, Reservation},
    };

    use super::*;

    fn reserved(id: &str, capacity: u32) -> Offering {
        Offering {
            zone: "us-west-2a".into(),
            capacity_type: CapacityType::Reserved,
            price: 0.0,
            available: capacity > 0,
            reservation: Some(OfferedReservation {
                reservation: Reservation {
                    id: id.into(),
                    kind: ReservationType::Default,
                    interruptible: false,
                },
                capacity,
            }),
        }
    }

    fn catalog(offerings: Vec<Offering>) -> Vec<Arc<InstanceType>> {
        vec![Arc::new(InstanceType {
            name: "m5.large".into(),
            requirements: Requirements::new(),
            offerings,
            capacity: Default::default(),
            overhead: Default::default(),
        })]
    }

    #[test]
    fn holding_takes_room_and_letting_go_gives_it_back() {
        let mut ledger = Ledger::new(
            &catalog(vec![reserved("cr-a", 1), reserved("cr-b", 2)]),
            Default::default(),
        );
        let (a, b) = (
            ledger.number("cr-a").unwrap_or(9),
            ledger.number("cr-b").unwrap_or(9),
        );
        let mut first = Vec::new();
        ledger.rehold(&mut first, &[a, b]);
        assert!(!ledger.can_hold(a, &[]), "cr-a is full");
        assert!(ledger.can_hold(a, &first), "but the claim holding it keeps it");
        assert!(ledger.can_hold(b, &[]));
        ledger.rehold(&mut first, &[b]);
        assert!(ledger.can_hold(a, &[]), "given back");
        assert_eq!(ledger.room(), [1, 1]);
    }

    #[test]
    fn strict_refuses_a_claim_left_without_the_reservations_it_could_use_and_fallback_does_not() {
        let strict = Ledger::new(&catalog(vec![reserved("cr-a", 1)]), ReservedOfferingMode::Strict);
        assert!(!strict.allows(&[], true, &[]), "compatible, none left");
        assert!(
            !strict.allows(&[0], false, &[]),
            "a pod ruled out what the claim held"
        );
        assert!(strict.allows(&[], false, &[]), "never could use one");
        assert!(strict.allows(&[], true, &[0]));
        let fallback = Ledger::new(
            &catalog(vec![reserved("cr-a", 1)]),
            ReservedOfferingMode::Fallback,
        );
        assert!(fallback.allows(&[], true, &[]));
    }

    #[test]
    fn a_claim_holding_reservations_is_narrowed_to_them() {
        let ledger = Ledger::new(
            &catalog(vec![reserved("cr-b", 1), reserved("cr-a", 1)]),
            Default::default(),
        );
        let narrowed = ledger.narrow(&Requirements::new(), &[1, 0]);
        let ids: Vec<&str> = narrowed
            .get(CAPACITY_RESERVATION_ID)
            .map(|r| r.values().collect())
            .unwrap_or_default();
        assert_eq!(ids, ["cr-a", "cr-b"]);
        assert!(
            narrowed
                .get(joist_messages::labels::CAPACITY_TYPE)
                .is_some_and(|r| r.has("reserved"))
        );
        assert!(ledger.narrow(&Requirements::new(), &[]).is_empty());
    }

    #[test]
    fn a_reservation_listed_twice_counts_the_smaller_room_and_an_unavailable_one_none() {
        let ledger = Ledger::new(
            &catalog(vec![
                reserved("cr-a", 3),
                reserved("cr-a", 2),
                reserved("cr-z", 0),
            ]),
            Default::default(),
        );
        assert_eq!(ledger.room(), [2]);
        assert_eq!(ledger.number("cr-z"), None);
    }
}

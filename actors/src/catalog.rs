//! The Catalog: instance types per NodePool, as the cloud lists them, and the unavailable-offering
//! cache. An offering that ran out of capacity is marked unavailable for
//! [`UNAVAILABLE_OFFERING_TTL`], so the next simulation routes around it and the claim falls back
//! to the next offering. Lists are kept for [`INSTANCE_TYPES_TTL`] or until the NodePool's spec
//! (its generation) or its node class (whose resolved status the types depend on) changes: the
//! pool's own status writes, which come with every claim, keep the list. A failed listing is
//! returned to the caller and not cached. The room left in capacity reservations changes with
//! every launch, so it is read from the cloud's count on every request, not kept; with
//! Karpenter's `ReservedCapacity` gate off, reserved offerings are left out.
//!
//! One copy of each instance type serves every NodePool that lists it alike ([`Shared`]): pools of
//! one node class list the same types, and an instance type with its requirements is some 12 KB,
//! so 64 pools of 1,268 types each held a gigabyte of identical copies. A pool's list is its view
//! into that one catalog, a pointer per type.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Weak},
};

use actix::prelude::*;
use joist_messages::{
    apis::{EC2NodeClass, NodePool},
    model::instance_type::InstanceType,
};
use joist_provider::{CloudError, CloudProvider, OfferingKey, capacity_reservation};
use kube::ResourceExt;
use tokio::time::Instant;

use crate::{
    decide::timing::{INSTANCE_TYPES_TTL, UNAVAILABLE_OFFERING_TTL},
    protocol::{GetInstanceTypes, MarkUnavailable},
};

/// Requests queued before callers wait (`send`) or see `Full` (`try_send`).
pub const CATALOG_MAILBOX: usize = 256;

/// What a pool's list of instance types is made for: the NodePool's generation and its node
/// class's resource version. A list is kept while they hold.
pub fn list_versions(pool: &NodePool, class: &EC2NodeClass) -> (i64, String) {
    (
        pool.metadata.generation.unwrap_or_default(),
        class.resource_version().unwrap_or_default(),
    )
}

struct Listed {
    /// The [`list_versions`] the list was made for.
    versions: (i64, String),
    at: Instant,
    types: Arc<Vec<Arc<InstanceType>>>,
}

/// The instance types some pool's list holds, by name, each once however many pools list it.
/// Weak: a type no list holds any more is dropped with the last list, and its entry with the
/// next listing of that name.
#[derive(Default)]
struct Shared {
    by_name: HashMap<String, Vec<Weak<InstanceType>>>,
}

impl Shared {
    /// `listed` as shared copies: a type equal to one already held is that one.
    fn share(&mut self, listed: Vec<InstanceType>) -> Vec<Arc<InstanceType>> {
        listed
            .into_iter()
            .map(|it| {
                let held = self.by_name.entry(it.name.clone()).or_default();
                held.retain(|copy| copy.strong_count() > 0);
                if let Some(same) = held.iter().filter_map(Weak::upgrade).find(|copy| **copy == it) {
                    return same;
                }
                let it = Arc::new(it);
                held.push(Arc::downgrade(&it));
                it
            })
            .collect()
    }
}

/// See the module docs.
pub struct Catalog {
    cloud: Arc<dyn CloudProvider>,
    /// Karpenter's `ReservedCapacity` gate: off, reserved offerings are left out.
    reserved_capacity: bool,
    listed: HashMap<String, Listed>,
    shared: Shared,
    unavailable: BTreeMap<OfferingKey, Instant>,
}

impl Catalog {
    /// A catalog over `cloud`, offering capacity reservations when `reserved_capacity`.
    pub fn new(cloud: Arc<dyn CloudProvider>, reserved_capacity: bool) -> Self {
        Self {
            cloud,
            reserved_capacity,
            listed: HashMap::new(),
            shared: Shared::default(),
            unavailable: BTreeMap::new(),
        }
    }

    /// `types` with the offerings in the cache marked unavailable and each capacity reservation's
    /// room as the cloud counts it now (shared when nothing changes).
    fn with_availability(&mut self, types: &Arc<Vec<Arc<InstanceType>>>) -> Arc<Vec<Arc<InstanceType>>> {
        let now = Instant::now();
        self.unavailable.retain(|_, until| *until > now);
        let reserved = types
            .iter()
            .any(|it| it.offerings.iter().any(|o| o.reservation.is_some()));
        if self.unavailable.is_empty() && !reserved {
            return types.clone();
        }
        // Only the types with an offering to change are copied; the rest stay shared.
        let mut marked = types.as_ref().clone();
        for key in self.unavailable.keys() {
            let Some(it) = marked.iter_mut().find(|it| key.covers(it)) else {
                continue;
            };
            for offering in &mut Arc::make_mut(it).offerings {
                if offering.zone == key.zone && offering.capacity_type == key.capacity_type {
                    offering.available = false;
                }
            }
        }
        if reserved {
            let counts = self.cloud.reserved_capacity();
            for it in marked
                .iter_mut()
                .filter(|it| it.offerings.iter().any(|o| o.reservation.is_some()))
            {
                let mut offerings = it.offerings.clone();
                if !self.reserved_capacity {
                    offerings.retain(|o| o.reservation.is_none());
                    Arc::make_mut(it).offerings = offerings;
                } else if capacity_reservation::recount(&mut offerings, &counts) {
                    Arc::make_mut(it).offerings = offerings;
                }
            }
        }
        Arc::new(marked)
    }
}

impl Actor for Catalog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(CATALOG_MAILBOX);
    }
}

impl Handler<GetInstanceTypes> for Catalog {
    type Result = ResponseActFuture<Self, Result<Arc<Vec<Arc<InstanceType>>>, CloudError>>;

    fn handle(&mut self, msg: GetInstanceTypes, _ctx: &mut Self::Context) -> Self::Result {
        let pool_name = msg.node_pool.name_any();
        let _span = tracing::debug_span!("catalog.get_instance_types", nodepool = pool_name).entered();
        let versions = list_versions(&msg.node_pool, &msg.node_class);
        if let Some(listed) = self.listed.get(&pool_name)
            && listed.versions == versions
            && listed.at.elapsed() < INSTANCE_TYPES_TTL
        {
            let types = listed.types.clone();
            return Box::pin(fut::ready(Ok(self.with_availability(&types))));
        }
        let cloud = self.cloud.clone();
        let list = async move { cloud.instance_types(&msg.node_pool, &msg.node_class).await };
        Box::pin(list.into_actor(self).map(move |listed, catalog, _ctx| {
            let types = Arc::new(catalog.shared.share(listed?));
            catalog.listed.insert(
                pool_name,
                Listed {
                    versions,
                    at: Instant::now(),
                    types: types.clone(),
                },
            );
            Ok(catalog.with_availability(&types))
        }))
    }
}

impl Handler<MarkUnavailable> for Catalog {
    type Result = ();

    fn handle(&mut self, msg: MarkUnavailable, _ctx: &mut Self::Context) {
        let until = Instant::now() + UNAVAILABLE_OFFERING_TTL;
        for offering in msg.offerings {
            tracing::info!(%offering, "offering marked unavailable");
            self.unavailable.insert(offering, until);
        }
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::model::{
        instance_type::{CapacityType, Offering, Overhead},
        requirements::Requirements,
        resources::Resources,
    };

    use super::*;

    fn instance_type(name: &str, price: f64) -> InstanceType {
        InstanceType {
            name: name.into(),
            requirements: Requirements::new(),
            offerings: vec![Offering {
                zone: "zone-a".into(),
                capacity_type: CapacityType::OnDemand,
                price,
                available: true,
                reservation: None,
            }],
            capacity: Resources::new(),
            overhead: Overhead::default(),
        }
    }

    #[test]
    fn pools_listing_the_same_types_share_one_copy_of_each() {
        let mut shared = Shared::default();
        let listing = || vec![instance_type("m5.large", 0.096), instance_type("c5.large", 0.085)];
        let first = shared.share(listing());
        let second = shared.share(listing());
        assert!(first.iter().zip(&second).all(|(a, b)| Arc::ptr_eq(a, b)));

        let repriced = shared.share(vec![instance_type("m5.large", 0.1)]);
        assert!(
            !Arc::ptr_eq(&repriced[0], &first[0]),
            "a type that differs is its own copy"
        );
        assert_eq!(repriced[0].offerings[0].price, 0.1);

        drop((first, second, repriced));
        let again = shared.share(vec![instance_type("m5.large", 0.096)]);
        assert_eq!(again[0].offerings[0].price, 0.096);
        assert_eq!(
            shared.by_name["m5.large"].len(),
            1,
            "copies no list holds are forgotten"
        );
    }
}

//! The Catalog: instance types per NodePool, as the cloud lists them, and the unavailable-offering
//! cache. An offering that ran out of capacity is marked unavailable for
//! [`UNAVAILABLE_OFFERING_TTL`], so the next simulation routes around it and the claim falls back
//! to the next offering. Lists are kept for [`INSTANCE_TYPES_TTL`] or until the NodePool's spec
//! (its generation) or its node class (whose resolved status the types depend on) changes: the
//! pool's own status writes, which come with every claim, keep the list. A failed listing is
//! returned to the caller and not cached.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use actix::prelude::*;
use joist_messages::model::instance_type::InstanceType;
use joist_provider::{CloudError, CloudProvider, OfferingKey};
use kube::ResourceExt;
use tokio::time::Instant;

use crate::{
    decide::timing::{INSTANCE_TYPES_TTL, UNAVAILABLE_OFFERING_TTL},
    protocol::{GetInstanceTypes, MarkUnavailable},
};

/// Requests queued before callers wait (`send`) or see `Full` (`try_send`).
pub const CATALOG_MAILBOX: usize = 256;

struct Listed {
    /// The NodePool generation and node class resource version the list was made for.
    versions: (i64, String),
    at: Instant,
    types: Arc<Vec<Arc<InstanceType>>>,
}

/// See the module docs.
pub struct Catalog {
    cloud: Arc<dyn CloudProvider>,
    listed: HashMap<String, Listed>,
    unavailable: BTreeMap<OfferingKey, Instant>,
}

impl Catalog {
    /// A catalog over `cloud`.
    pub fn new(cloud: Arc<dyn CloudProvider>) -> Self {
        Self {
            cloud,
            listed: HashMap::new(),
            unavailable: BTreeMap::new(),
        }
    }

    /// `types` with the offerings in the cache marked unavailable (shared when none are).
    fn with_availability(&mut self, types: &Arc<Vec<Arc<InstanceType>>>) -> Arc<Vec<Arc<InstanceType>>> {
        let now = Instant::now();
        self.unavailable.retain(|_, until| *until > now);
        if self.unavailable.is_empty() {
            return types.clone();
        }
        // Only the types with an unavailable offering are copied; the rest stay shared.
        let mut marked = types.as_ref().clone();
        for key in self.unavailable.keys() {
            let Some(it) = marked.iter_mut().find(|it| it.name == key.instance_type) else {
                continue;
            };
            for offering in &mut Arc::make_mut(it).offerings {
                if offering.zone == key.zone && offering.capacity_type == key.capacity_type {
                    offering.available = false;
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
        let versions = (
            msg.node_pool.metadata.generation.unwrap_or_default(),
            msg.node_class.resource_version().unwrap_or_default(),
        );
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
            let types: Arc<Vec<Arc<InstanceType>>> = Arc::new(listed?.into_iter().map(Arc::new).collect());
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

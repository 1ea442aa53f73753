//! One actor per NodePool: it creates the NodeClaims the Provisioner planned for the pool, after
//! checking the pool's limits against what its NodeClaims hold right now, and it keeps the pool's
//! status: `resources` and `nodes` in use, the node class generation it saw, and the conditions
//! `ValidationSucceeded`, `NodeClassReady`, `NodeRegistrationHealthy` (see
//! [`registration_health`]) and `Ready` (the Provisioner launches only from Ready pools).
//!
//! An invalid NodePool is not an error of the controller: it gets `ValidationSucceeded=False` with
//! the field and the rule it breaks, and a Warning event, and launches nothing until fixed.
//!
//! A pool that turns Ready, or whose spec or node class changes while Ready, has the Catalog list
//! its instance types at once, so the first provisioning pass finds them listed.
//!
//! A static NodePool (`replicas`) is kept at its size by the same actor ([`static_capacity`]),
//! one reconcile at a time, when the `StaticCapacity` gate is on; with the gate off it is not
//! valid, and says so.

use std::sync::Arc;

use actix::prelude::*;
use joist_messages::{
    apis::{NodePool, Validate},
    conditions::{ConditionStatus, ConditionType, ConditionUpdate},
    model::resources::names::NODES,
};
use kube::{Api, ResourceExt};

use crate::{
    catalog::list_versions,
    claim_creation, decide,
    effects::kube_ops::{self, set_condition},
    protocol::{GetInstanceTypes, LaunchPlan, Reconcile},
    shared::Shared,
    static_capacity,
};

/// Launch plans and pokes queued before senders wait or see `Full`.
pub const NODE_POOL_MAILBOX: usize = 64;

/// See the module docs.
pub struct NodePoolActor {
    name: String,
    shared: Shared,
    /// The next look at a static pool, when one is due.
    requeue: Option<SpawnHandle>,
    /// The [`list_versions`] the Catalog was last asked to list the pool's instance types for.
    listed: Option<(i64, String)>,
}

impl NodePoolActor {
    /// The actor for the NodePool `name`.
    pub fn new(name: String, shared: Shared) -> Self {
        Self {
            name,
            shared,
            requeue: None,
            listed: None,
        }
    }

    /// Has the Catalog list the instance types of `pool` (Ready) unless it was asked to for the
    /// same versions; the answer stays in the Catalog.
    fn list_instance_types(&mut self, pool: Arc<NodePool>) {
        let class_name = &pool.spec.template.spec.node_class_ref.name;
        let Some(class) = self.shared.read.node_class(class_name) else {
            return;
        };
        let versions = list_versions(&pool, &class);
        if self.listed.as_ref() == Some(&versions) {
            return;
        }
        self.listed = Some(versions);
        self.shared.catalog.instance_types.do_send(GetInstanceTypes {
            node_pool: pool,
            node_class: class,
        });
    }
}

impl Actor for NodePoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(NODE_POOL_MAILBOX);
    }
}

impl Supervised for NodePoolActor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        tracing::warn!(nodepool = self.name, "restarting the nodepool actor");
    }
}

impl Handler<Reconcile> for NodePoolActor {
    // Atomic: a static pool's count must not be judged by two reconciles at once.
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _msg: Reconcile, ctx: &mut Self::Context) -> Self::Result {
        let _span = tracing::debug_span!("nodepool.reconcile", nodepool = self.name).entered();
        let Some(pool) = self.shared.read.node_pool(&self.name) else {
            self.shared.directory.node_pools.remove(&self.name);
            self.shared.registration_health.forget(&self.name);
            ctx.stop();
            return AtomicResponse::new(Box::pin(fut::ready(())));
        };
        let shared = self.shared.clone();
        let keeps_size = decide::static_capacity::is_static(&pool) && shared.settings.static_capacity;
        let work = async move {
            let ready = write_status(&shared, &pool).await;
            if keeps_size && ready {
                static_capacity::reconcile(&shared, &pool).await;
            }
            ready.then_some(pool)
        };
        AtomicResponse::new(Box::pin(work.into_actor(self).map(move |ready, actor, ctx| {
            if let Some(pool) = ready {
                actor.list_instance_types(pool);
            }
            if keeps_size {
                if let Some(pending) = actor.requeue.take() {
                    ctx.cancel_future(pending);
                }
                actor.requeue = Some(ctx.notify_later(Reconcile, static_capacity::STATIC_REQUEUE));
            }
        })))
    }
}

impl Handler<LaunchPlan> for NodePoolActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: LaunchPlan, _ctx: &mut Self::Context) -> Self::Result {
        let _span = tracing::debug_span!(
            "nodepool.launch_plan",
            nodepool = self.name,
            claims = msg.claims.len()
        )
        .entered();
        let shared = self.shared.clone();
        Box::pin(async move { claim_creation::create_claims(&shared, msg).await })
    }
}

/// Publishes usage and readiness; whether the pool is Ready.
async fn write_status(shared: &Shared, pool: &NodePool) -> bool {
    let mut status = pool.status.clone().unwrap_or_default();
    let before = serde_json::to_value(&status).unwrap_or_default();
    let generation = pool.metadata.generation;
    let clock = &shared.clock;
    let mut violations = pool.validate();
    if decide::static_capacity::is_static(pool) && !shared.settings.static_capacity {
        violations.push(joist_messages::apis::Violation {
            field: "spec.replicas".to_owned(),
            message:
                "static NodePools need the StaticCapacity feature gate (FEATURE_GATES=StaticCapacity=true)"
                    .to_owned(),
        });
    }
    let valid = violations.is_empty();
    let problems = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let validation = if valid {
        ConditionUpdate::holds(ConditionType::ValidationSucceeded)
    } else {
        ConditionUpdate::new(
            ConditionType::ValidationSucceeded,
            ConditionStatus::False,
            "ValidationFailed",
        )
        .with_message(problems.as_str())
    };
    let newly_invalid = set_condition(&mut status.conditions, clock, generation, &validation) && !valid;
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class = shared.read.node_class(class_name);
    let class_ready = class.as_ref().is_some_and(|c| c.is_ready());
    let class_message = format!("EC2NodeClass {class_name:?} is missing or not ready");
    let node_class = if class_ready {
        ConditionUpdate::holds(ConditionType::NodeClassReady)
    } else {
        ConditionUpdate::new(
            ConditionType::NodeClassReady,
            ConditionStatus::False,
            "NodeClassNotReady",
        )
        .with_message(class_message)
    };
    set_condition(&mut status.conditions, clock, generation, &node_class);
    let class_generation = class.and_then(|c| c.metadata.generation);
    let health = shared.registration_health.condition(pool, class_generation);
    set_condition(&mut status.conditions, clock, generation, &health);
    status.node_class_observed_generation = class_generation;
    let is_ready = valid && class_ready;
    let ready = if is_ready {
        ConditionUpdate::holds(ConditionType::Ready)
    } else {
        ConditionUpdate::new(ConditionType::Ready, ConditionStatus::False, "NotReady")
            .with_message("ValidationSucceeded or NodeClassReady is not True")
    };
    set_condition(&mut status.conditions, clock, generation, &ready);
    let usage = shared.read.pool_usage(&pool.name_any());
    status.nodes = Some(usage.get(NODES).millis() / 1000);
    status.resources = usage
        .iter()
        .filter(|(name, _)| *name != NODES)
        .map(|(name, q)| (name.to_owned(), q))
        .collect();
    let body = serde_json::to_value(&status).unwrap_or_default();
    if body == before {
        return is_ready;
    }
    let api: Api<NodePool> = kube_ops::cluster(&shared.client);
    if let Err(error) = kube_ops::patch_status(&api, &pool.name_any(), body).await {
        tracing::warn!(nodepool = pool.name_any(), %error, "writing the nodepool status failed");
    }
    if newly_invalid {
        shared.events.warn(pool, "ValidationFailed", &problems);
    }
    is_ready
}

//! The scheduling problem a pass starts from, shared by the Provisioner and the
//! DisruptionPlanner: the nodes it is given, every Ready NodePool that is not being deleted with
//! the instance types its node class offers (from the Catalog, NodeOverlays applied), the
//! daemonsets and the namespace labels. Pods are the caller's to add. Building it writes the
//! NodeOverlays' statuses with the conflicts found across the pools.
//!
//! A NodePool that is not Ready, being deleted, static or paused, or whose instance types cannot
//! be listed, whose node class is missing, or whose requirements do not parse, is left out of
//! this pass with why ([`LeftOut`]); the pass goes on without it.

use std::{collections::BTreeSet, sync::Arc};

use joist_messages::{
    apis::NodePool,
    conditions::{ConditionType, is_true},
};
use joist_scheduling::{ExistingNode, Input, pod::PodInfo};
use kube::ResourceExt;

use crate::{
    decide::static_capacity::is_static, overlay, protocol::GetInstanceTypes, settings::ACTOR_REQUEST_TIMEOUT,
    shared::Shared, state::snapshot,
};

/// A problem, and the NodePools its `node_pools` stand for, in the same order.
pub struct Problem {
    /// The problem, without pods.
    pub input: Input,
    /// The NodePools, by position in `input.node_pools`.
    pub pools: Vec<Arc<NodePool>>,
    /// The NodePools of this replica left out of the problem, with why.
    pub left_out: Vec<LeftOut>,
}

/// A NodePool a problem leaves out, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftOut {
    /// The NodePool's name.
    pub nodepool: String,
    /// Why.
    pub why: Why,
}

/// Why a NodePool is left out of a problem.
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    /// It is not Ready.
    NotReady,
    /// It is being deleted.
    Deleting,
    /// It is static: it keeps its own size, and pods never make it launch.
    Static,
    /// Its launches are paused (see [`crate::state::breaker`]), with why.
    Paused(String),
    /// Its node class is not in the cluster.
    NoNodeClass(String),
    /// Its instance types could not be listed.
    InstanceTypes(String),
    /// Its template cannot be simulated (a requirement that does not parse).
    Invalid(String),
}

impl LeftOut {
    /// Whether its launches are paused: the only reason a pod that fits nowhere is told.
    pub fn is_paused(&self) -> bool {
        matches!(self.why, Why::Paused(_))
    }
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nodepool {:?}: ", self.nodepool)?;
        match &self.why {
            Why::NotReady => f.write_str("not Ready"),
            Why::Deleting => f.write_str("being deleted"),
            Why::Static => f.write_str("static: it keeps its own size"),
            Why::Paused(why) => f.write_str(why),
            Why::NoNodeClass(class) => write!(f, "its node class {class:?} is not in the cluster"),
            Why::InstanceTypes(error) => write!(f, "its instance types could not be listed: {error}"),
            Why::Invalid(message) => write!(f, "it cannot be simulated: {message}"),
        }
    }
}

/// The problem over `nodes` (see the module docs).
pub async fn cluster(shared: &Shared, nodes: Vec<ExistingNode>) -> Problem {
    let read = &shared.read;
    let mut input = Input {
        nodes,
        namespaces: snapshot::namespace_labels(read),
        ..Input::default()
    };
    let mut pools: Vec<Arc<NodePool>> = Vec::new();
    let mut left_out = Vec::new();
    let mut conflicted = BTreeSet::new();
    for pool in read.node_pools() {
        let name = pool.name_any();
        // Another replica's shard: its pods are that replica's too.
        if !shared.settings.acts_for_pool(&name) {
            continue;
        }
        let mut leave = |why: Why| {
            tracing::debug!(nodepool = name, ?why, "nodepool left out of the pass");
            left_out.push(LeftOut {
                nodepool: name.clone(),
                why,
            });
        };
        let ready = pool
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, ConditionType::Ready));
        if pool.metadata.deletion_timestamp.is_some() {
            leave(Why::Deleting);
            continue;
        }
        if is_static(&pool) {
            leave(Why::Static);
            continue;
        }
        if !ready {
            leave(Why::NotReady);
            continue;
        }
        if let Some(why) = shared.breakers.paused(&name) {
            leave(Why::Paused(why.to_string()));
            continue;
        }
        let class_name = &pool.spec.template.spec.node_class_ref.name;
        let Some(class) = read.node_class(class_name) else {
            leave(Why::NoNodeClass(class_name.clone()));
            continue;
        };
        let request = GetInstanceTypes {
            node_pool: pool.clone(),
            node_class: class,
        };
        let types = match shared
            .catalog
            .instance_types
            .send(request)
            .timeout(ACTOR_REQUEST_TIMEOUT)
            .await
        {
            Ok(Ok(types)) => types,
            Ok(Err(error)) => {
                tracing::warn!(nodepool = name, %error, "listing instance types failed");
                leave(Why::InstanceTypes(error.to_string()));
                continue;
            }
            Err(error) => {
                tracing::warn!(nodepool = name, %error, "the catalog did not answer");
                leave(Why::InstanceTypes(format!("the catalog did not answer: {error}")));
                continue;
            }
        };
        let overlay::Overlaid {
            types,
            conflicted: left_out,
            ..
        } = overlay::for_pool(shared, &pool, types);
        conflicted.extend(left_out);
        let start = input.instance_types.len();
        input.instance_types.extend(types.iter().cloned());
        match snapshot::pool_input(read, &pool, (start..input.instance_types.len()).collect()) {
            Ok(pool_input) => {
                input.node_pools.push(pool_input);
                pools.push(pool);
            }
            Err(message) => {
                input.instance_types.truncate(start);
                tracing::warn!(%message, "skipping an invalid nodepool");
                leave(Why::Invalid(message.to_string()));
            }
        }
    }
    overlay::write_statuses(shared, conflicted);
    input.daemonsets = read
        .daemon_sets()
        .iter()
        .filter_map(|ds| {
            let template = &ds.spec.as_ref()?.template;
            PodInfo::from_pod(&snapshot::daemon_pod(
                template,
                &ds.namespace().unwrap_or_default(),
            ))
            .ok()
        })
        .collect();
    Problem {
        input,
        pools,
        left_out,
    }
}

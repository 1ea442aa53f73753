//! The scheduling problem a pass starts from, shared by the Provisioner and the
//! DisruptionPlanner: the nodes it is given, every Ready NodePool that is not being deleted with
//! the instance types its node class offers (from the Catalog, NodeOverlays applied), the
//! daemonsets and the namespace labels. Pods are the caller's to add. Building it writes the
//! NodeOverlays' statuses with the conflicts found across the pools.
//!
//! A NodePool whose instance types cannot be listed, whose node class is missing, or whose
//! requirements do not parse is left out of this pass and logged; the pass goes on without it.

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
    /// NodePools left out because their launches are paused (see [`crate::state::breaker`]), with why.
    pub paused: Vec<String>,
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
    let mut paused = Vec::new();
    let mut conflicted = BTreeSet::new();
    for pool in read.node_pools() {
        // Another replica's shard: its pods are that replica's too.
        if !shared.settings.acts_for_pool(&pool.name_any()) {
            continue;
        }
        let ready = pool
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, ConditionType::Ready));
        // Static pools keep their own size: pods never make them launch.
        if !ready || pool.metadata.deletion_timestamp.is_some() || is_static(&pool) {
            tracing::debug!(
                nodepool = pool.name_any(),
                ready,
                "nodepool left out of the pass: not Ready, deleting or static"
            );
            continue;
        }
        let name = pool.name_any();
        if let Some(why) = shared.breakers.paused(&name) {
            paused.push(format!("nodepool {name:?}: {why}"));
            continue;
        }
        let Some(class) = read.node_class(&pool.spec.template.spec.node_class_ref.name) else {
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
                tracing::warn!(nodepool = pool.name_any(), %error, "listing instance types failed");
                continue;
            }
            Err(error) => {
                tracing::warn!(nodepool = pool.name_any(), %error, "the catalog did not answer");
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
    Problem { input, pools, paused }
}

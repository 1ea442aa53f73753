//! `joist explain pod NAMESPACE/NAME`: for a pending pod, what a provisioning pass would do with
//! it now (the existing or launching node it fits on, or the new node it would get), and when it
//! fits nowhere, why not per NodePool (taints, requirements, limits, topology, no instance type
//! with room: then the nearest type and what it lacks), with the NodePools the pass leaves out and
//! why; for a running pod, the node it runs on, whose NodePool launched it and when.
//!
//! The pod is simulated alone against the cluster as read, as the provisioner would simulate
//! it: a batch of many pods may place it otherwise.

use std::{fmt, sync::Arc};

use joist_messages::{
    cached_pod::CachedPod,
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE},
    model::{instance_type::InstanceType, resources::Resources},
};
use joist_scheduling::{Reason, ReservedOfferingMode, solve};
use kube::ResourceExt;
use serde::Serialize;

use super::ExplainError;
use crate::{
    problem::{self, Problem},
    shared::Shared,
    state::{read_model::unprovisionable, snapshot},
};

/// See the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct PodAnswer {
    /// The pod (`namespace/name`).
    pub pod: String,
    /// What becomes of it.
    #[serde(flatten)]
    pub state: PodState,
}

/// A pod's state and what explains it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PodState {
    /// Bound to a node.
    Running {
        /// The node.
        node: String,
        /// Its NodeClaim and NodePool, when a NodePool manages it.
        nodeclaim: Option<String>,
        /// Its NodePool.
        nodepool: Option<String>,
        /// The node's instance type, capacity type and zone.
        instance_type: String,
        /// `on-demand`, `spot` or `reserved`.
        capacity_type: String,
        /// Its zone.
        zone: String,
        /// How long after the pod was created its node was (negative: before), in seconds.
        node_created_after_pod_seconds: Option<i64>,
    },
    /// Not bound, and not Joist's to provision.
    NotProvisionable {
        /// Why.
        reason: String,
    },
    /// Not bound; what a provisioning pass would do now.
    Pending {
        /// Where it would go, when it fits somewhere.
        placement: Option<String>,
        /// Per NodePool, why it cannot go there, when it fits nowhere.
        nodepools: Vec<PoolReason>,
        /// NodePools the pass leaves out, with why.
        left_out: Vec<String>,
    },
}

/// Why a NodePool cannot take the pod.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReason {
    /// The NodePool.
    pub nodepool: String,
    /// Why.
    pub reason: String,
    /// When no instance type has room: the nearest one and what it lacks.
    pub nearest: Option<Nearest>,
}

/// The instance type nearest to holding a pod, and what it lacks.
#[derive(Debug, Clone, Serialize)]
pub struct Nearest {
    /// The type.
    pub instance_type: String,
    /// Each resource it lacks: `cpu: needs 9, has 7910m`.
    pub lacks: Vec<String>,
}

/// The answer for the pod `name` (`namespace/name`).
pub async fn explain(shared: &Shared, name: &str) -> Result<PodAnswer, ExplainError> {
    let Some((namespace, pod_name)) = name.split_once('/') else {
        return Err(ExplainError::PodName(name.to_owned()));
    };
    let read = &shared.read;
    let pod = read
        .pod(&(namespace.to_owned(), pod_name.to_owned()))
        .ok_or_else(|| ExplainError::NotFound {
            kind: "pod",
            name: name.to_owned(),
        })?;
    let state = match pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        Some(node) => running(shared, &pod, node),
        None => match unprovisionable(&pod) {
            Some(reason) => PodState::NotProvisionable {
                reason: reason.to_owned(),
            },
            None => pending(shared, &pod).await,
        },
    };
    Ok(PodAnswer {
        pod: name.to_owned(),
        state,
    })
}

/// A bound pod's node, and whose it is.
fn running(shared: &Shared, pod: &CachedPod, node: String) -> PodState {
    let read = &shared.read;
    let found = read.node(&node);
    let claim = read.claim_for_node(&node);
    let label = |key: &str| {
        found
            .as_ref()
            .and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    let created = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
    };
    let after = match (
        found.as_ref().and_then(|n| created(&n.metadata)),
        created(&pod.metadata),
    ) {
        (Some(node), Some(pod)) => Some(node - pod),
        _ => None,
    };
    PodState::Running {
        nodepool: found.as_ref().and_then(|n| n.labels().get(NODEPOOL).cloned()),
        nodeclaim: claim,
        instance_type: label(INSTANCE_TYPE),
        capacity_type: label(CAPACITY_TYPE),
        zone: label(ZONE),
        node_created_after_pod_seconds: after,
        node,
    }
}

/// What a provisioning pass would do with `pod` alone now.
async fn pending(shared: &Shared, pod: &CachedPod) -> PodState {
    let read = &shared.read;
    let info = match read.fresh_pod_info(pod) {
        Ok(info) => info,
        Err(error) => {
            return PodState::NotProvisionable {
                reason: format!("it cannot be simulated: {error}"),
            };
        }
    };
    let Problem {
        mut input, left_out, ..
    } = problem::cluster(shared, snapshot::existing_nodes(read)).await;
    let left_out: Vec<String> = left_out.iter().map(ToString::to_string).collect();
    input.pods = vec![Arc::new(info)];
    input.options.reserved_offerings = ReservedOfferingMode::Strict;
    let solution = solve(&input);
    if let Some(placement) = solution.placements.first() {
        return PodState::Pending {
            placement: Some(format!(
                "fits on existing or launching node {}",
                input.nodes[placement.node].name
            )),
            nodepools: Vec::new(),
            left_out,
        };
    }
    if let Some(claim) = solution.claims.first() {
        let types: Vec<&str> = claim
            .instance_types
            .iter()
            .take(5)
            .map(|&t| input.instance_types[t].name.as_str())
            .collect();
        return PodState::Pending {
            placement: Some(format!(
                "a new node of nodepool {} ({}) from ${:.4}/h",
                input.node_pools[claim.node_pool].name,
                types.join(", "),
                claim.price
            )),
            nodepools: Vec::new(),
            left_out,
        };
    }
    let reasons = solution
        .unschedulable
        .first()
        .map(|u| u.reasons.clone())
        .unwrap_or_default();
    let nodepools = reasons
        .into_iter()
        .map(|(pool, reason)| {
            let nearest = match &reason {
                Reason::NoInstanceType { requests } => {
                    input.node_pools.iter().find(|p| p.name == pool).and_then(|p| {
                        // The types the pool's requirements allow: the others are no answer.
                        let allowed = (p.instance_types.iter())
                            .map(|&t| &*input.instance_types[t])
                            .filter(|t| p.requirements.intersects(&t.requirements).is_ok());
                        nearest(allowed, requests)
                    })
                }
                _ => None,
            };
            PoolReason {
                nodepool: pool,
                reason: reason.to_string(),
                nearest,
            }
        })
        .collect();
    PodState::Pending {
        placement: None,
        nodepools,
        left_out,
    }
}

/// Of `types`, the one nearest to holding `requests` (the fewest resources short, then the
/// smallest shortfall relative to the request), and what it lacks; `None` when there are none.
fn nearest<'a>(types: impl Iterator<Item = &'a InstanceType>, requests: &Resources) -> Option<Nearest> {
    let shortfall = |t: &InstanceType| {
        let allocatable = t.allocatable();
        let short: Vec<(String, String)> = requests
            .exceeding(&allocatable)
            .map(|(name, needed, has)| (name.to_owned(), format!("{name}: needs {needed}, has {has}")))
            .collect();
        let relative: f64 = requests
            .exceeding(&allocatable)
            .map(|(_, needed, has)| (needed.millis() - has.millis()) as f64 / needed.millis().max(1) as f64)
            .sum();
        (short, relative)
    };
    types
        .map(|t| (t, shortfall(t)))
        .min_by(|(a, (short_a, rel_a)), (b, (short_b, rel_b))| {
            short_a
                .len()
                .cmp(&short_b.len())
                .then(rel_a.total_cmp(rel_b))
                .then_with(|| a.name.cmp(&b.name))
        })
        .map(|(t, (short, _))| Nearest {
            instance_type: t.name.clone(),
            lacks: if short.is_empty() {
                vec!["no resource: its offerings, or the daemonsets' overhead, leave no room".to_owned()]
            } else {
                short.into_iter().map(|(_, line)| line).collect()
            },
        })
}

impl fmt::Display for PodAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            PodState::Running {
                node,
                nodeclaim,
                nodepool,
                instance_type,
                capacity_type,
                zone,
                node_created_after_pod_seconds,
            } => {
                writeln!(f, "pod {} runs on node {node}", self.pod)?;
                match (nodepool, nodeclaim) {
                    (Some(pool), Some(claim)) => writeln!(
                        f,
                        "  nodeclaim {claim} of nodepool {pool}: {instance_type} {capacity_type} in {zone}"
                    )?,
                    _ => writeln!(f, "  the node is not managed by a NodePool")?,
                }
                match node_created_after_pod_seconds {
                    Some(after) if *after >= 0 => writeln!(
                        f,
                        "  the node was created {after}s after the pod: launched while the pod was pending"
                    )?,
                    Some(before) => writeln!(
                        f,
                        "  the node was created {}s before the pod: the pod fit on existing capacity",
                        -before
                    )?,
                    None => {}
                }
            }
            PodState::NotProvisionable { reason } => {
                writeln!(
                    f,
                    "pod {} is not bound, and Joist does not provision for it: {reason}",
                    self.pod
                )?;
            }
            PodState::Pending {
                placement,
                nodepools,
                left_out,
            } => {
                writeln!(f, "pod {} is pending", self.pod)?;
                match placement {
                    Some(placement) => writeln!(f, "  a provisioning pass now: {placement}")?,
                    None => writeln!(f, "  it fits on no node and no NodePool can launch one for it:")?,
                }
                for p in nodepools {
                    writeln!(f, "  nodepool {}: {}", p.nodepool, p.reason)?;
                    if let Some(nearest) = &p.nearest {
                        writeln!(
                            f,
                            "    nearest instance type {} lacks {}",
                            nearest.instance_type,
                            nearest.lacks.join("; ")
                        )?;
                    }
                }
                for l in left_out {
                    writeln!(f, "  left out: {l}")?;
                }
            }
        }
        Ok(())
    }
}

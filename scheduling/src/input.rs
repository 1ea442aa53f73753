//! What a scheduling simulation is asked: the cluster as it is, the capacity it may add, the pods.
//!
//! The solver takes these by reference and copies nothing it does not need; instance types live
//! once in [`Input::instance_types`] and NodePools refer to them by position.
//!
//! Conventions the caller is responsible for: an existing node's `pods` include its daemonset
//! pods; NodeClaims launched by an earlier pass but not yet registered are passed as existing
//! nodes (labels from their single-valued requirements, allocatable of their instance type,
//! `initialized: false`); a pod's volume topology is already folded into its node requirements.

use std::{collections::BTreeMap, sync::Arc};

use joist_messages::{
    labels::{CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODEPOOL, ZONE},
    model::{
        instance_type::{InstanceType, Offering},
        quantity::Quantity,
        requirements::{Operator, Requirement, Requirements},
        resources::Resources,
    },
};
use k8s_openapi::api::core::v1::Taint;

use crate::pod::PodInfo;

/// A NodePool as the simulation sees it.
#[derive(Debug, Clone)]
pub struct NodePoolInput {
    /// The NodePool's name.
    pub name: String,
    /// Higher weights are tried first.
    pub weight: i32,
    /// The template's requirements, `minValues` included.
    pub requirements: Requirements,
    /// The template's labels (they become requirements too).
    pub labels: BTreeMap<String, String>,
    /// The template's taints (startup taints are not listed: they do not affect scheduling).
    pub taints: Vec<Taint>,
    /// Per limited resource (`nodes` included), the limit minus current usage: zero or less means
    /// none is left. Resources not listed are unlimited; `None` when the NodePool has no limits.
    /// A plain map, not [`Resources`], because a limit used up exactly must stay listed.
    pub remaining: Option<BTreeMap<String, Quantity>>,
    /// Positions in [`Input::instance_types`] of the types its node class offers.
    pub instance_types: Vec<usize>,
}

impl NodePoolInput {
    /// What every node of the pool satisfies: the template's requirements, its labels, and the
    /// pool's own `karpenter.sh/nodepool` label.
    pub fn node_requirements(&self) -> Requirements {
        let mut requirements = self.requirements.clone();
        for (key, value) in &self.labels {
            if let Ok(req) = Requirement::new(key, Operator::In, [value.as_str()]) {
                requirements.add(req);
            }
        }
        if let Ok(req) = Requirement::new(NODEPOOL, Operator::In, [self.name.as_str()]) {
            requirements.add(req);
        }
        requirements
    }
}

/// Positions of `pools` in the order the solver tries them: heaviest first, then by name.
pub fn pool_order(pools: &[NodePoolInput]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pools.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&pools[a], &pools[b]);
        pb.weight.cmp(&pa.weight).then_with(|| pa.name.cmp(&pb.name))
    });
    order
}

/// A node that exists (or is launching) and can take pods.
#[derive(Debug, Clone)]
pub struct ExistingNode {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Its allocatable resources.
    pub allocatable: Resources,
    /// The pods bound to it, daemonset pods included: shared with the cluster's cached views, so
    /// a pass over every node copies no pod.
    pub pods: Vec<Arc<PodInfo>>,
    /// False while the node is still starting; initialized nodes are tried first.
    pub initialized: bool,
    /// How many volumes each CSI driver can attach here (its CSINode's allocatable count);
    /// drivers not named are not limited.
    pub volume_limits: BTreeMap<String, u32>,
}

impl ExistingNode {
    /// The initialized node a claim with `requirements` becomes once launched as `it` on
    /// `offering`, named `name`: labelled with the single-valued requirements of both, its
    /// hostname, zone, capacity type and instance type; holding `pods`.
    pub fn launched(
        name: &str,
        requirements: &Requirements,
        it: &InstanceType,
        offering: &Offering,
        pods: Vec<Arc<PodInfo>>,
    ) -> Self {
        let mut labels: BTreeMap<String, String> = it
            .requirements
            .implied_labels()
            .chain(requirements.implied_labels())
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        labels.insert(HOSTNAME.to_owned(), name.to_owned());
        labels.insert(ZONE.to_owned(), offering.zone.clone());
        labels.insert(
            CAPACITY_TYPE.to_owned(),
            offering.capacity_type.label().to_owned(),
        );
        labels.insert(INSTANCE_TYPE.to_owned(), it.name.clone());
        ExistingNode {
            name: name.to_owned(),
            labels,
            taints: Vec::new(),
            allocatable: it.allocatable(),
            pods,
            initialized: true,
            volume_limits: Default::default(),
        }
    }
}

/// What to do when a NodePool's `minValues` cannot be met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinValuesPolicy {
    /// The pod does not schedule on that NodePool (Karpenter's default).
    #[default]
    Strict,
    /// Launch with fewer distinct values than asked.
    BestEffort,
}

/// What a claim does when the capacity reservations it could launch into were all taken by
/// earlier claims of the same solve (see [`crate::reservations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReservedOfferingMode {
    /// Goes on without a reservation: the disruption simulations.
    #[default]
    Fallback,
    /// Refuses the pod, which waits for the next batch: the provisioner.
    Strict,
}

/// Solver settings (Karpenter's `MIN_VALUES_POLICY` and `PREFERENCE_POLICY`, and the reserved
/// offering mode of the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// See [`MinValuesPolicy`].
    pub min_values: MinValuesPolicy,
    /// Ignore preferred affinities and `ScheduleAnyway` spread instead of trying them first.
    pub ignore_preferences: bool,
    /// See [`ReservedOfferingMode`].
    pub reserved_offerings: ReservedOfferingMode,
}

/// One scheduling problem.
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// Every instance type any NodePool may launch.
    pub instance_types: Vec<Arc<InstanceType>>,
    /// NodePools that may launch capacity (ready, not being deleted).
    pub node_pools: Vec<NodePoolInput>,
    /// Existing nodes.
    pub nodes: Vec<ExistingNode>,
    /// One template pod per daemonset; each adds its requests to every node it would land on.
    pub daemonsets: Vec<PodInfo>,
    /// Namespace labels, for affinity `namespaceSelector`s.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The pods to place (shared: a provisioning pass hands over the views its read model keeps).
    pub pods: Vec<Arc<PodInfo>>,
    /// Settings.
    pub options: Options,
}

//! What a scheduling simulation answers: placements, new NodeClaims, and why the rest cannot go.
//!
//! Pods, nodes, NodePools and instance types are referred to by their position in the
//! [`Input`](crate::input::Input). [`Reason`] is written for people: it names the constraint and
//! the amounts, and feeds `FailedScheduling` events.

use std::fmt;

use joist_messages::model::{
    requirements::{Incompatibility, Requirements},
    resources::Resources,
};

/// A pod bound to an existing node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The pod's position in `Input::pods`.
    pub pod: usize,
    /// The node's position in `Input::nodes`.
    pub node: usize,
}

/// A node to launch.
#[derive(Debug, Clone, PartialEq)]
pub struct NewClaim {
    /// The NodePool's position in `Input::node_pools`.
    pub node_pool: usize,
    /// The NodePool's requirements narrowed by its pods and their topology.
    pub requirements: Requirements,
    /// Positions in `Input::instance_types` that fit, cheapest first (at most 600).
    pub instance_types: Vec<usize>,
    /// The cheapest available offering of the first type, per hour.
    pub price: f64,
    /// The summed requests of its pods.
    pub requests: Resources,
    /// The pods, by position in `Input::pods`.
    pub pods: Vec<usize>,
}

/// Why a pod cannot go to capacity from one NodePool.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// The NodePool's taint is not tolerated.
    Taint {
        /// The taint, as `key=value:Effect`.
        taint: String,
    },
    /// The pod's node requirements and the NodePool's cannot both hold.
    Requirements(Incompatibility),
    /// No instance type has room for the pod (with daemonset overhead) and an available offering.
    NoInstanceType {
        /// The pod's requests.
        requests: Resources,
    },
    /// Every instance type that fits would exceed the NodePool's limits.
    Limits {
        /// The limited resources that ran out.
        resources: Vec<String>,
    },
    /// A host port is already taken by a daemonset.
    HostPort {
        /// The port.
        port: i32,
    },
    /// A topology spread or (anti-)affinity term cannot be met.
    Topology {
        /// The term, described.
        constraint: String,
    },
    /// Fewer distinct values than the NodePool's `minValues` remain.
    MinValues {
        /// The label key.
        key: String,
        /// Distinct values needed.
        needed: u32,
        /// Distinct values left.
        found: usize,
    },
    /// The capacity reservations the pod could launch into were taken by other NodeClaims of
    /// this batch: it waits for the next batch rather than leave reserved capacity unused.
    ReservedCapacity,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Taint { taint } => write!(f, "did not tolerate taint {taint}"),
            Reason::Requirements(why) => write!(f, "incompatible requirements: {why}"),
            Reason::NoInstanceType { requests } => write!(
                f,
                "no instance type met the scheduling requirements or had enough resources (requests {requests})"
            ),
            Reason::Limits { resources } => write!(
                f,
                "all available instance types exceed limits for nodepool ({})",
                resources.join(", ")
            ),
            Reason::HostPort { port } => write!(f, "host port {port} is taken by a daemonset"),
            Reason::Topology { constraint } => write!(f, "unsatisfiable {constraint}"),
            Reason::MinValues { key, needed, found } => write!(
                f,
                "minValues requirement not met for {key}: needed {needed}, {found} left"
            ),
            Reason::ReservedCapacity => write!(
                f,
                "limited reserved offering capacity is held by other nodeclaims of this batch; retried next batch"
            ),
        }
    }
}

/// A pod that cannot be placed, with the reason per NodePool.
#[derive(Debug, Clone, PartialEq)]
pub struct Unschedulable {
    /// The pod's position in `Input::pods`.
    pub pod: usize,
    /// Per NodePool (by name), why it could not take the pod; empty when there are no NodePools.
    pub reasons: Vec<(String, Reason)>,
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reasons.is_empty() {
            return f.write_str("no existing node fits and no NodePool can launch capacity");
        }
        for (i, (pool, reason)) in self.reasons.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "nodepool {pool:?}: {reason}")?;
        }
        Ok(())
    }
}

/// The answer to one [`Input`](crate::input::Input).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Solution {
    /// Pods bound to existing nodes.
    pub placements: Vec<Placement>,
    /// Nodes to launch, in the order they were opened.
    pub claims: Vec<NewClaim>,
    /// Pods that fit nowhere.
    pub unschedulable: Vec<Unschedulable>,
}

impl Solution {
    /// The summed hourly price of the new claims.
    pub fn cost(&self) -> f64 {
        self.claims.iter().map(|c| c.price).fold(0.0, |a, b| a + b)
    }
}

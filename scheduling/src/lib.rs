//! Joist's scheduling simulation: pure algorithms over the `joist-messages` vocabulary.
//!
//! No I/O, no async, no actor runtime: providers and actors depend on it, never the reverse.
//! [`pod`] and [`terms`] turn Kubernetes pods into the compact form the simulation works on,
//! [`input`] describes a problem (nodes, NodePools, instance types, daemonsets, pods),
//! [`volumes`] says where a pod's volumes can be used,
//! [`solver::solve`] answers it with a [`solution::Solution`], [`consolidation`] asks it whether
//! nodes can go, and [`workloads`] builds the benchmark problems.

mod amounts;
mod bitset;
mod catalog;
mod classes;
pub mod consolidation;
mod dims;
pub mod input;
pub mod ownership;
pub mod pod;
mod reservations;
mod reserve;
pub mod solution;
pub mod solver;
pub mod taints;
pub mod terms;
mod topology;
pub mod volumes;
pub mod workloads;

pub use input::{ExistingNode, Input, MinValuesPolicy, NodePoolInput, Options, ReservedOfferingMode};
pub use solution::{NewClaim, Placement, Reason, Solution, Unschedulable};
pub use solver::solve;

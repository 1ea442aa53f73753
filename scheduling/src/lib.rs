//! Joist's scheduling simulation: pure algorithms over the `joist-messages` vocabulary.
//!
//! No I/O, no async, no actor runtime: providers and actors depend on it, never the reverse. This crate turns Kubernetes objects into the
//! compact forms the simulation works on ([`pod`]) and matches pods against nodes ([`taints`]).
//! The first-fit-decreasing solver, topology and instance-type selection build on these.

pub mod pod;
pub mod taints;

//! Joist's vocabulary: the Karpenter v1 API types ([`apis`]), the domain model ([`model`]) and the
//! well-known labels ([`labels`]).
//!
//! This crate holds plain data and pure functions only (no I/O, no cloud SDKs, no actor runtime),
//! so every other crate can depend on it and it outlives any framework choice.

pub mod apis;
pub mod labels;
pub mod model;
pub mod time;

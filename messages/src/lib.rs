//! Joist's vocabulary: the Karpenter v1 API types ([`apis`]), the domain model ([`model`]), the
//! well-known labels ([`labels`]), what a pod is to an autoscaler ([`pods`]), the part of it
//! Joist keeps ([`cached_pod`]) and the kube-scheduler settings it mirrors ([`scheduler_config`]).
//!
//! This crate holds plain data and pure functions only (no I/O, no cloud SDKs, no actor runtime),
//! so every other crate can depend on it and it outlives any framework choice.

pub mod apis;
pub mod cached_pod;
pub mod conditions;
pub mod labels;
pub mod model;
pub mod nodes;
pub mod pods;
pub mod scheduler_config;
pub mod time;

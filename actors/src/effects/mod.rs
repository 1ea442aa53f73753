//! The effects layer: how the controllers act on the world and report it. Kubernetes writes
//! ([`kube_ops`], [`events`] through client-go's [`correlator`], a pod's [`nominations`]), the cloud under deadlines and
//! fault points ([`cloud_calls`], [`faults`]), traces ([`node_trace`]) and Prometheus [`metrics`].
//! Each write returns its error to the caller, which decides whether to retry.

pub mod cloud_calls;
pub mod cluster_claims;
pub mod correlator;
pub mod events;
pub mod faults;
pub mod kube_ops;
pub mod metrics;
pub mod node_trace;
pub mod nominations;

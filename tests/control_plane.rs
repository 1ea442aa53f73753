//! The real Kubernetes control plane tier: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK built from their Go modules and started by `scripts/kube-control-plane`
//! (a cold build takes minutes; later runs use the cached binaries). Joist's CRDs and CEL rules are
//! judged by the real API server against `joist validate` ([`crds`]); both Helm charts install with
//! the real helm and `joist run`, with the KWOK cloud and the chart's own ServiceAccount token under
//! the real RBAC authorizer, takes nodes through their lives ([`lives`]); and kubesim answers the
//! same kubectl sessions as the real API server ([`differential`]); and Karpenter's own KWOK
//! controller runs a workload beside Joist ([`versus`]) and hands its cluster to Joist and takes it
//! back ([`swap`]).

#[path = "support/chart.rs"]
#[allow(dead_code)]
mod chart;
#[path = "support/control_plane.rs"]
mod control_plane;
#[path = "control_plane/crds.rs"]
mod crds;
#[path = "control_plane/differential.rs"]
mod differential;
#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/joist_process.rs"]
#[allow(dead_code)]
mod joist_process;
#[path = "control_plane/lives.rs"]
mod lives;
#[path = "support/mutants.rs"]
#[allow(dead_code)]
mod mutants;
#[path = "control_plane/swap.rs"]
mod swap;
#[path = "support/tools.rs"]
mod tools;
#[path = "control_plane/versus.rs"]
mod versus;

//! What nodes need to join the cluster, looked up with `eks:DescribeCluster` when the settings
//! leave it out, as Karpenter looks it up: the API server endpoint, the certificate authority and
//! the service CIDR (which AL2023's nodeadm needs). Karpenter's install sets only the cluster's
//! name and interruption queue, so a Joist installed with Karpenter's values finds the rest here.
//!
//! Fails with the call's error ([`AwsError`]), or [`ClusterLookupError::NoEndpoint`] when EKS
//! answers without an endpoint (a cluster still being created).

use crate::error::AwsError;

/// The facts of an EKS cluster nodes join with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFacts {
    /// The API server's URL.
    pub endpoint: String,
    /// The cluster's certificate authority, base64, as EKS gives it.
    pub ca_bundle: Option<String>,
    /// The service CIDR: IPv4 when the cluster has one, else IPv6.
    pub service_cidr: Option<String>,
}

/// Why the lookup failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterLookupError {
    /// The call failed (no such cluster, no `eks:DescribeCluster` permission, no answer).
    #[error(transparent)]
    Call(#[from] AwsError),
    /// EKS knows the cluster but gave no endpoint.
    #[error("eks:DescribeCluster of {cluster:?} gave no endpoint (status {status})")]
    NoEndpoint {
        /// The cluster's name.
        cluster: String,
        /// Its status (`CREATING` …).
        status: String,
    },
}

/// Looks the cluster `name` up with `eks:DescribeCluster`.
pub async fn describe(eks: &aws_sdk_eks::Client, name: &str) -> Result<ClusterFacts, ClusterLookupError> {
    let output = eks
        .describe_cluster()
        .name(name)
        .send()
        .await
        .map_err(|e| AwsError::api("DescribeCluster", e))?;
    let cluster = output.cluster();
    let endpoint = cluster
        .and_then(|c| c.endpoint())
        .filter(|e| !e.is_empty())
        .ok_or_else(|| ClusterLookupError::NoEndpoint {
            cluster: name.to_owned(),
            status: cluster
                .and_then(|c| c.status())
                .map_or_else(|| "unknown".to_owned(), |s| s.as_str().to_owned()),
        })?;
    let network = cluster.and_then(|c| c.kubernetes_network_config());
    let service_cidr = network
        .and_then(|n| n.service_ipv4_cidr().or(n.service_ipv6_cidr()))
        .map(str::to_owned);
    Ok(ClusterFacts {
        endpoint: endpoint.to_owned(),
        ca_bundle: cluster
            .and_then(|c| c.certificate_authority())
            .and_then(|ca| ca.data())
            .map(str::to_owned),
        service_cidr,
    })
}

//! The cluster looked up with `eks:DescribeCluster` at moto, as `joist run` looks it up when its
//! settings leave the endpoint, CA bundle or service CIDR out (Karpenter's install sets none).

use aws_sdk_eks::types::{KubernetesNetworkConfigRequest, VpcConfigRequest};
use joist_provider_aws::cluster;

use super::moto;

#[tokio::test]
async fn the_endpoint_ca_and_service_cidr_of_the_cluster_are_looked_up() {
    let clients = moto::clients().await;
    clients
        .eks
        .create_cluster()
        .name("looked-up")
        .role_arn("arn:aws:iam::123456789012:role/eks-cluster")
        .resources_vpc_config(VpcConfigRequest::builder().subnet_ids("subnet-0a").build())
        .kubernetes_network_config(
            KubernetesNetworkConfigRequest::builder()
                .service_ipv4_cidr("10.100.0.0/16")
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let facts = cluster::describe(&clients.eks, "looked-up")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(facts.endpoint.starts_with("https://"), "{facts:?}");
    assert!(
        facts.ca_bundle.as_deref().is_some_and(|ca| !ca.is_empty()),
        "{facts:?}"
    );
    assert_eq!(facts.service_cidr.as_deref(), Some("10.100.0.0/16"));

    let unknown = cluster::describe(&clients.eks, "nowhere").await;
    let error = unknown.map_or_else(|e| e.to_string(), |facts| panic!("found {facts:?}"));
    assert!(
        error.starts_with("DescribeCluster: ") && error.contains("ResourceNotFoundException"),
        "{error}"
    );
}

//! The swap between Karpenter and Joist on EC2, at moto: each controller finds the other's
//! instances by its own rules. Karpenter lists its instances with three tag filters and a state
//! filter (its instance provider's `List`, read from its source at v1.14.1: the keys
//! `karpenter.sh/nodepool` and `karpenter.k8s.aws/ec2nodeclass`, `eks:eks-cluster-name` equal to
//! the cluster's name; pending, running, stopping or stopped) and deletes the NodeClaims whose
//! instance it does not list; Joist lists by `karpenter.sh/nodepool` and the cluster's `owned` tag.

use aws_sdk_ec2::types::{Filter, InstanceType as Ec2Type, ResourceType, Tag, TagSpecification};
use joist_provider::CloudProvider;
use joist_provider_aws::instances;

use super::launch::{Fleet, claim, fleet, spec};

/// The instances Karpenter v1.14.1 lists as its own in `cluster`, by its filters.
async fn karpenters_list(clients: &joist_provider_aws::clients::AwsClients, cluster: &str) -> Vec<String> {
    let described = clients
        .ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name("tag-key")
                .values("karpenter.sh/nodepool")
                .build(),
        )
        .filters(
            Filter::builder()
                .name("tag-key")
                .values("karpenter.k8s.aws/ec2nodeclass")
                .build(),
        )
        .filters(
            Filter::builder()
                .name("tag:eks:eks-cluster-name")
                .values(cluster)
                .build(),
        )
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(
                    ["pending", "running", "stopping", "stopped"]
                        .map(String::from)
                        .to_vec(),
                ))
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_lists_the_instances_joist_launched() {
    let cluster = "swap-to-karpenter";
    let Fleet {
        clients,
        cloud,
        class,
        types,
    } = fleet(cluster, &spec("")).await;
    let launched = cloud
        .create(&claim("default-swapped"), Some(&class), &types)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = instances::instance_id(&launched.instance.provider_id)
        .unwrap_or_else(|| panic!("{}", launched.instance.provider_id))
        .to_owned();
    assert_eq!(karpenters_list(&clients, cluster).await, [id]);
    cloud
        .delete(&launched.instance.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_lists_reads_and_terminates_the_instances_karpenter_launched() {
    let cluster = "swap-to-joist";
    let Fleet {
        clients,
        cloud,
        class,
        ..
    } = fleet(cluster, &spec("")).await;
    let status = class.status.as_ref().unwrap_or_else(|| panic!("resolved"));
    // An instance as Karpenter launches and then tags it.
    let tags = [
        (format!("kubernetes.io/cluster/{cluster}"), "owned".to_owned()),
        ("eks:eks-cluster-name".to_owned(), cluster.to_owned()),
        ("karpenter.sh/nodepool".to_owned(), "default".to_owned()),
        ("karpenter.k8s.aws/ec2nodeclass".to_owned(), "default".to_owned()),
        ("karpenter.sh/nodeclaim".to_owned(), "default-k8r7p".to_owned()),
        (
            "Name".to_owned(),
            "ip-192-168-7-7.us-west-2.compute.internal".to_owned(),
        ),
    ];
    let run = clients
        .ec2
        .run_instances()
        .image_id(&status.amis[0].id)
        .instance_type(Ec2Type::M5Large)
        .subnet_id(&status.subnets[0].id)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .set_tags(Some(
                    tags.iter()
                        .map(|(k, v)| Tag::builder().key(k).value(v).build())
                        .collect(),
                ))
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = run.instances()[0].instance_id().unwrap_or_default().to_owned();
    assert_eq!(
        karpenters_list(&clients, cluster).await,
        std::slice::from_ref(&id),
        "Karpenter's own"
    );

    let listed = cloud.list().await.unwrap_or_else(|e| panic!("{e}"));
    let provider_id = instances::provider_id(&status.subnets[0].zone, &id);
    let found = listed
        .iter()
        .find(|i| i.provider_id == provider_id)
        .unwrap_or_else(|| panic!("{provider_id} not among {listed:#?}"));
    assert_eq!(found.instance_type, "m5.large");
    assert_eq!(
        found.tags.get("karpenter.sh/nodeclaim").map(String::as_str),
        Some("default-k8r7p"),
        "the NodeClaim that accounts for it"
    );
    assert!(found.price > 0.0, "priced from the catalog: {found:?}");
    let got = cloud.get(&provider_id).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.zone, status.subnets[0].zone);
    cloud.delete(&provider_id).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(karpenters_list(&clients, cluster).await.is_empty());
}

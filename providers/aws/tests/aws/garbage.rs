//! Joist's garbage collector against moto: an instance tagged as this cluster's Joist instance
//! with no NodeClaim accounting for it is terminated; another cluster's instance is left alone.
//! The controllers run on a clock an hour ahead, so the instances are past the orphan grace period.

use std::{sync::Arc, time::Duration};

use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use joist_actors::{effects::node_trace::NodeTracer, settings::Settings};
use joist_kubesim::{Cluster, ClusterSettings};
use joist_messages::{model::shape::CapacitySettings, time::Clock};
use joist_provider::{CloudError, CloudProvider};
use joist_provider_aws::{AwsCloud, AwsSettings, instances};

use crate::moto;

const CLUSTER: &str = "gc";

async fn launch(clients: &joist_provider_aws::clients::AwsClients, image: &str, cluster: &str) -> String {
    let tags = TagSpecification::builder()
        .resource_type(ResourceType::Instance)
        .tags(
            Tag::builder()
                .key(joist_messages::labels::tags::NODEPOOL)
                .value("default")
                .build(),
        )
        .tags(
            Tag::builder()
                .key(joist_provider::launch::cluster_tag(cluster))
                .value("owned")
                .build(),
        )
        .build();
    let launched = clients
        .ec2
        .run_instances()
        .image_id(image)
        .instance_type(InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .tag_specifications(tags)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let instance = &launched.instances()[0];
    instances::provider_id(
        instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default(),
        instance.instance_id().unwrap_or_default(),
    )
}

#[actix::test]
async fn an_instance_no_nodeclaim_accounts_for_is_terminated() {
    let clients = moto::clients().await;
    let images = clients
        .ec2
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let image = images
        .images()
        .first()
        .and_then(|i| i.image_id())
        .unwrap_or_else(|| panic!("moto has no images"))
        .to_owned();
    let orphan = launch(&clients, &image, CLUSTER).await;
    let foreign = launch(&clients, &image, "someone-else").await;

    let cluster = Cluster::start(ClusterSettings::default());
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .unwrap_or_else(|e| panic!("{e}"));
    let cloud = AwsCloud::new(
        clients.clone(),
        AwsSettings {
            cluster_name: CLUSTER.to_owned(),
            cluster_endpoint: "https://gc.example.eks.amazonaws.com".to_owned(),
            cluster_ca_bundle: None,
            cluster_cidr: None,
            kubernetes_version: moto::KUBERNETES.to_owned(),
            capacity: CapacitySettings::default(),
            isolated_vpc: true,
            reserved_capacity: true,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let an_hour_ahead = Clock::starting_at(Clock::system().now_seconds() + 3600);
    let _controllers = joist_actors::start(
        cluster.client(),
        Arc::new(cloud.clone()),
        Settings {
            garbage_collection: Duration::from_millis(500),
            ..Settings::default()
        },
        an_hour_ahead,
        NodeTracer::disabled(),
    );

    let mut gone = false;
    for _ in 0..60 {
        if matches!(
            cloud.get(&orphan).await,
            Err(CloudError::NodeClaimNotFound { .. })
        ) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(gone, "the orphan {orphan} was not terminated within 15 s");
    let kept = instances::get(&instances::lookups(clients.clone()), &foreign).await;
    assert!(
        kept.is_ok(),
        "another cluster's instance is not Joist's to collect: {kept:?}"
    );
}

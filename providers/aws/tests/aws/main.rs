//! The AWS provider against moto, a real AWS API emulator (see [`moto`]): the instance-type
//! catalog read from the wire, EC2NodeClass resolution from tags, ids, names and AMI aliases,
//! instances listed, looked up ([`lookups`]) and terminated, their status checks read
//! ([`instance_status`]), launches through CreateFleet
//! ([`launch`]), orphaned instances collected ([`garbage`]), the cluster looked up with
//! `eks:DescribeCluster` ([`cluster`]), and each of Karpenter and Joist finding the instances the
//! other launched ([`swap`]).
//! One test binary, so the SDK is linked once.

mod capacity_reservations;
mod cluster;
mod fake_ec2;
mod garbage;
mod instance_status;
mod launch;
mod lookups;
mod moto;
mod paging;
mod placement_groups;
mod swap;

use aws_sdk_ec2::types::Tag;
use joist_messages::{
    apis::EC2NodeClass,
    model::{requirements::Operator, shape::CapacitySettings},
};
use joist_provider_aws::{
    catalog,
    node_class::{self, ResolveError},
};

/// Tags the default VPC's subnets in `zones` and its default security group with
/// `karpenter.sh/discovery: cluster`; returns the subnet ids tagged and the group's id.
async fn tag_network(
    clients: &joist_provider_aws::clients::AwsClients,
    cluster: &str,
    zones: &[&str],
) -> (Vec<String>, String) {
    let ec2 = &clients.ec2;
    let subnets = ec2
        .describe_subnets()
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut tagged: Vec<String> = subnets
        .subnets()
        .iter()
        .filter(|s| zones.contains(&s.availability_zone().unwrap_or_default()))
        .filter_map(|s| s.subnet_id().map(str::to_owned))
        .collect();
    tagged.sort();
    let groups = ec2
        .describe_security_groups()
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let group = groups
        .security_groups()
        .iter()
        .find(|g| g.group_name() == Some("default"))
        .and_then(|g| g.group_id())
        .unwrap_or_else(|| panic!("moto has no default security group"))
        .to_owned();
    let tag = Tag::builder()
        .key("karpenter.sh/discovery")
        .value(cluster)
        .build();
    let mut request = ec2.create_tags().tags(tag);
    for resource in tagged.iter().chain([&group]) {
        request = request.resources(resource);
    }
    request.send().await.unwrap_or_else(|e| panic!("{e}"));
    (tagged, group)
}

fn node_class(yaml_spec: &str) -> EC2NodeClass {
    let text = format!(
        "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {{name: default}}\nspec:\n{yaml_spec}"
    );
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_is_read_from_the_wire_with_every_page_followed() {
    let clients = moto::clients().await;
    let shapes = catalog::shapes(&clients.ec2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(shapes.len() > 500, "only {} instance types", shapes.len());
    let m5 = shapes.get("m5.large").unwrap_or_else(|| panic!("no m5.large"));
    assert_eq!((m5.vcpus, m5.memory_mib, m5.arch.as_str()), (2, 8192, "amd64"));
    assert_eq!(
        m5.max_pods(&CapacitySettings::default()),
        29,
        "3 ENIs × (10 IPs − 1) + 2"
    );
    let graviton = shapes.get("m6g.large").unwrap_or_else(|| panic!("no m6g.large"));
    assert_eq!(graviton.arch, "arm64");
    let zones = catalog::zones(&clients.ec2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let m5_zones: Vec<&str> = zones
        .get("m5.large")
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    assert!(m5_zones.contains(&"us-west-2a"), "{m5_zones:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_class_resolves_subnets_groups_and_alias_amis_from_tags() {
    let clients = moto::clients().await;
    let (subnets, group) = tag_network(&clients, "resolve-tags", &["us-west-2a", "us-west-2b"]).await;
    let class = node_class(
        "  instanceProfile: KarpenterNodeInstanceProfile
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: resolve-tags}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: '*'}}]
",
    );
    let status = node_class::resolve(&clients, &class, ("resolve", moto::KUBERNETES), None, 0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut resolved: Vec<String> = status.subnets.iter().map(|s| s.id.clone()).collect();
    resolved.sort();
    assert_eq!(resolved, subnets, "exactly the tagged subnets");
    let zones: Vec<&str> = status.subnets.iter().map(|s| s.zone.as_str()).collect();
    assert_eq!(zones, ["us-west-2a", "us-west-2b"]);
    assert!(
        status.subnets.iter().all(|s| s.zone_id.is_some()),
        "{:?}",
        status.subnets
    );
    assert!(
        status.security_groups.iter().any(|g| g.id == group),
        "{:?}",
        status.security_groups
    );
    assert_eq!(
        status.instance_profile.as_deref(),
        Some("KarpenterNodeInstanceProfile")
    );
    assert_eq!(
        status.amis.len(),
        6,
        "2 architectures × standard, nvidia, neuron: {:#?}",
        status.amis
    );
    let arm_standard = status
        .amis
        .iter()
        .find(|a| a.name.as_deref() == Some("amazon-eks-node-al2023-arm64-standard-1.35-v20251101"))
        .unwrap_or_else(|| panic!("{:#?}", status.amis));
    assert_eq!(arm_standard.requirements[0].values, ["arm64"]);
    assert_eq!(arm_standard.requirements[1].operator, Operator::DoesNotExist);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_and_names_select_directly() {
    let clients = moto::clients().await;
    let (subnets, group) = tag_network(&clients, "resolve-ids", &["us-west-2c"]).await;
    let class = node_class(&format!(
        "  instanceProfile: p
  amiSelectorTerms: [{{alias: bottlerocket@latest}}]
  subnetSelectorTerms: [{{id: {}}}]
  securityGroupSelectorTerms: [{{name: default}}]
",
        subnets[0]
    ));
    let status = node_class::resolve(&clients, &class, ("resolve", moto::KUBERNETES), None, 0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.subnets.len(), 1);
    assert_eq!(status.subnets[0].zone, "us-west-2c");
    assert!(status.security_groups.iter().any(|g| g.id == group));
    assert_eq!(
        status.amis.len(),
        4,
        "bottlerocket: 2 architectures × standard, nvidia"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_selected_says_which_field_and_what_it_asked_for() {
    let clients = moto::clients().await;
    let class = node_class(
        "  instanceProfile: p
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: nobody-tagged-this}}]
  securityGroupSelectorTerms: [{name: default}]
",
    );
    let error = node_class::resolve(&clients, &class, ("resolve", moto::KUBERNETES), None, 0)
        .await
        .err();
    assert_eq!(
        error.map(|e| e.to_string()).as_deref(),
        Some(
            r#"spec.subnetSelectorTerms: no subnet matches [{"tags":{"karpenter.sh/discovery":"nobody-tagged-this"}}]"#
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_gets_an_instance_profile_kept_holding_exactly_that_role() {
    use joist_provider_aws::instance_profile;
    let clients = moto::clients().await;
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    for role in ["KarpenterNodeRole-roles", "OtherNodeRole-roles"] {
        clients
            .iam
            .create_role()
            .role_name(role)
            .assume_role_policy_document(trust)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let with_role = |role: &str| {
        node_class(&format!(
            "  role: {role}
  amiSelectorTerms: [{{alias: al2023@latest}}]
  subnetSelectorTerms: [{{tags: {{karpenter.sh/discovery: '*'}}}}]
  securityGroupSelectorTerms: [{{name: default}}]
"
        ))
    };
    let roles_of = |profile: String| {
        let iam = clients.iam.clone();
        async move {
            let found = iam
                .get_instance_profile()
                .instance_profile_name(profile)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            found
                .instance_profile()
                .map(|p| {
                    p.roles()
                        .iter()
                        .map(|r| r.role_name().to_owned())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        }
    };
    let expected = instance_profile::name("roles", moto::REGION, "default");

    let status = node_class::resolve(
        &clients,
        &with_role("KarpenterNodeRole-roles"),
        ("roles", moto::KUBERNETES),
        None,
        0,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.instance_profile.as_deref(), Some(expected.as_str()));
    assert_eq!(roles_of(expected.clone()).await, ["KarpenterNodeRole-roles"]);

    let arn = "arn:aws:iam::123456789012:role/OtherNodeRole-roles";
    node_class::resolve(&clients, &with_role(arn), ("roles", moto::KUBERNETES), None, 0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        roles_of(expected).await,
        ["OtherNodeRole-roles"],
        "a changed role replaces the old one"
    );

    let missing = node_class::resolve(
        &clients,
        &with_role("NoSuchRole"),
        ("roles", moto::KUBERNETES),
        None,
        0,
    )
    .await;
    assert!(
        matches!(&missing, Err(ResolveError::Api(e)) if e.to_string().contains("AddRoleToInstanceProfile")),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_are_listed_by_the_cluster_tags_read_and_terminated() {
    use aws_sdk_ec2::types::{ResourceType, TagSpecification};
    use joist_provider::{CloudError, InstanceState};
    use joist_provider_aws::instances;

    let clients = moto::clients().await;
    let image = clients
        .ssm
        .get_parameter()
        .name("/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/standard/recommended/image_id")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let image = image
        .parameter()
        .and_then(|p| p.value())
        .unwrap_or_default()
        .to_owned();
    let launch = |tags: Vec<(&str, &str)>| {
        let spec = tags
            .iter()
            .fold(
                TagSpecification::builder().resource_type(ResourceType::Instance),
                |spec, (k, v)| spec.tags(Tag::builder().key(*k).value(*v).build()),
            )
            .build();
        clients
            .ec2
            .run_instances()
            .image_id(&image)
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .tag_specifications(spec)
            .send()
    };
    let cluster_tag = joist_provider::launch::cluster_tag("listed");
    let ours = launch(vec![
        (joist_messages::labels::tags::NODEPOOL, "default"),
        (&cluster_tag, "owned"),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let other_cluster = joist_provider::launch::cluster_tag("someone-else");
    launch(vec![
        (joist_messages::labels::tags::NODEPOOL, "default"),
        (&other_cluster, "owned"),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    launch(vec![(&cluster_tag, "owned")])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = ours.instances()[0].instance_id().unwrap_or_default().to_owned();

    let listed = instances::list(&clients, "listed")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        listed.len(),
        1,
        "only this cluster's NodePool instances: {listed:#?}"
    );
    let instance = &listed[0];
    assert!(instance.provider_id.ends_with(&id), "{}", instance.provider_id);
    assert!(
        instance.provider_id.starts_with("aws:///us-west-2"),
        "{}",
        instance.provider_id
    );
    assert_eq!(
        (instance.instance_type.as_str(), instance.image_id.as_str()),
        ("m5.large", image.as_str())
    );
    assert_eq!(
        instance
            .tags
            .get(joist_messages::labels::tags::NODEPOOL)
            .map(String::as_str),
        Some("default")
    );

    let lookups = instances::lookups(clients.clone());
    let got = instances::get(&lookups, &instance.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(got.state, InstanceState::Terminated);
    let id = instances::instance_id(&instance.provider_id)
        .unwrap_or_default()
        .to_owned();
    let results = instances::terminate_all(&clients, &[id, "i-0000000000000dead".to_owned()]).await;
    assert!(
        matches!(results[..], [Ok(()), Err(CloudError::NodeClaimNotFound { .. })]),
        "one unknown id does not stop the other's termination: {results:?}"
    );
    let gone = instances::get(&lookups, &instance.provider_id).await;
    assert!(
        matches!(gone, Err(CloudError::NodeClaimNotFound { .. })),
        "{gone:?}"
    );
    let listed = instances::list(&clients, "listed")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listed.is_empty(),
        "a terminated instance is not listed: {listed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_prices_come_from_ec2s_spot_price_history_in_the_asked_zones() {
    use joist_provider_aws::{
        price_source::SdkPriceSource,
        pricing::{PriceSource, Prices},
    };
    let clients = moto::clients().await;
    let source = SdkPriceSource::new(clients.clone(), true);
    let zones = vec!["us-west-2a".to_owned(), "us-west-2b".to_owned()];
    let spot = source.spot(&zones).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        spot.iter()
            .any(|s| s.instance_type == "m5.large" && s.zone == "us-west-2a"),
        "moto answers DescribeSpotPriceHistory for every type"
    );
    assert!(
        spot.iter().all(|s| zones.contains(&s.zone) && s.price > 0.0),
        "only the asked zones, with prices: {:?}",
        &spot[..spot.len().min(3)]
    );
    let mut prices = Prices::new(std::collections::BTreeMap::from([("m5.large".to_owned(), 0.096)]));
    assert!(prices.update_spot(spot, 1_800_000_000));
    assert!(prices.spot("m5.large", "us-west-2a").is_some_and(|p| p < 0.096));
    assert_eq!(
        prices.spot("m5.large", "us-west-2c"),
        None,
        "no price for a zone not asked"
    );

    let isolated = source.on_demand(moto::REGION).await;
    assert!(
        isolated
            .as_ref()
            .is_err_and(|e| e.to_string().contains("ISOLATED_VPC")),
        "{isolated:?}"
    );
}

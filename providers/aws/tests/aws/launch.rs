//! [`AwsCloud`] launching through moto: a real CreateFleet from a launch template it created,
//! the instance described and terminated, and the template reused by the next launch. The
//! EC2NodeClass is handed to the launch as the controllers hand it, resolved and Ready.

use std::{collections::BTreeMap, sync::Arc};

use base64::Engine;
use joist_messages::{
    apis::{
        EC2NodeClass, NodeClaim, NodeClaimSpec, NodePool,
        common::{NodeClassReference, NodeSelectorRequirementWithMinValues},
        nodeclaim::ResourceRequirements,
    },
    labels::{CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, ZONE},
    model::{
        instance_type::{CapacityType, InstanceType},
        requirements::Operator,
        shape::CapacitySettings,
    },
};
use joist_provider::{CloudError, CloudProvider};
use joist_provider_aws::{AwsCloud, AwsSettings, launch_template};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{moto, node_class, tag_network};

const CLUSTER: &str = "fleet";
const EFA_CLUSTER: &str = "fleet-efa";
const ENDPOINT: &str = "https://fleet.example.eks.amazonaws.com";

pub(super) fn claim(name: &str) -> NodeClaim {
    let requirement = |key: &str, values: &[&str]| NodeSelectorRequirementWithMinValues {
        key: key.to_owned(),
        operator: Operator::In,
        values: values.iter().map(|v| (*v).to_owned()).collect(),
        min_values: None,
    };
    let mut claim = NodeClaim::new(
        name,
        NodeClaimSpec {
            taints: Vec::new(),
            startup_taints: Vec::new(),
            requirements: vec![
                requirement(INSTANCE_TYPE, &["m5.large", "c5.large"]),
                requirement(CAPACITY_TYPE, &["on-demand"]),
            ],
            resources: ResourceRequirements {
                requests: BTreeMap::from([("cpu".to_owned(), "1".parse().unwrap_or_default())]),
            },
            node_class_ref: NodeClassReference {
                group: "karpenter.k8s.aws".into(),
                kind: "EC2NodeClass".into(),
                name: "default".into(),
            },
            termination_grace_period: None,
            expire_after: None,
        },
    );
    claim.metadata.labels = Some(BTreeMap::from([(NODEPOOL.to_owned(), "default".to_owned())]));
    claim
}

/// What a launch test starts from: moto, Joist's AWS provider, the class `default` as the
/// NodeClass controller leaves it (resolved and Ready), and the instance types it
/// offers the NodePool `default`.
pub(super) struct Fleet {
    pub clients: joist_provider_aws::clients::AwsClients,
    pub cloud: AwsCloud,
    pub class: EC2NodeClass,
    pub types: Vec<Arc<InstanceType>>,
}

/// The class spec of the launch tests (the network tagged for `CLUSTER`); `extra` adds fields.
pub(super) fn spec(extra: &str) -> String {
    format!(
        "  instanceProfile: KarpenterNodeInstanceProfile
  amiSelectorTerms: [{{alias: al2023@latest}}]
  subnetSelectorTerms: [{{tags: {{karpenter.sh/discovery: {CLUSTER}}}}}]
  securityGroupSelectorTerms: [{{tags: {{karpenter.sh/discovery: {CLUSTER}}}}}]
{extra}"
    )
}

/// The launch world of a cluster named `cluster`: each test has its own, so each finds its own
/// launch templates in the moto they share; they share the discovery-tagged network.
pub(super) async fn fleet(cluster: &str, spec: &str) -> Fleet {
    let clients = moto::clients().await;
    tag_network(&clients, CLUSTER, &["us-west-2d"]).await;
    let cloud = AwsCloud::new(
        clients.clone(),
        AwsSettings {
            cluster_name: cluster.to_owned(),
            cluster_endpoint: ENDPOINT.to_owned(),
            cluster_ca_bundle: None,
            cluster_cidr: Some("10.100.0.0/16".to_owned()),
            kubernetes_version: moto::KUBERNETES.to_owned(),
            capacity: CapacitySettings::default(),
            isolated_vpc: false,
            reserved_capacity: true,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut class = node_class(spec);
    let mut status = cloud
        .resolve_node_class(&class)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    status.conditions.push(Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Ready".into(),
        message: String::new(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        observed_generation: None,
    });
    class.status = Some(status);
    let pool: NodePool = serde_saphyr::from_str(
        "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\n\
         spec: {template: {spec: {nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}, requirements: []}}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let types: Vec<Arc<InstanceType>> = cloud
        .instance_types(&pool, &class)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(Arc::new)
        .collect();
    Fleet {
        clients,
        cloud,
        class,
        types,
    }
}

/// The launch template data of the one template Joist created for `cluster`.
async fn our_template(
    clients: &joist_provider_aws::clients::AwsClients,
    cluster: &str,
) -> aws_sdk_ec2::types::ResponseLaunchTemplateData {
    let templates = clients
        .ec2
        .describe_launch_templates()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name(format!("tag:{}", launch_template::CLUSTER_TAG))
                .values(cluster)
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ours: Vec<&str> = templates
        .launch_templates()
        .iter()
        .filter_map(|t| t.launch_template_name())
        .filter(|name| name.starts_with(launch_template::NAME_PREFIX))
        .collect();
    assert_eq!(ours.len(), 1, "one template: {ours:?}");
    let versions = clients
        .ec2
        .describe_launch_template_versions()
        .launch_template_name(ours[0])
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    versions
        .launch_template_versions()
        .first()
        .and_then(|v| v.launch_template_data())
        .cloned()
        .unwrap_or_else(|| panic!("the template has no data: {versions:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_launches_from_a_reused_template_and_the_instance_is_terminated() {
    let Fleet {
        clients,
        cloud,
        class,
        types,
    } = fleet(CLUSTER, &spec("")).await;
    let m5 = types
        .iter()
        .find(|t| t.name == "m5.large")
        .unwrap_or_else(|| panic!("no m5.large among {} types", types.len()));
    assert!(
        m5.offerings.iter().all(|o| o.zone == "us-west-2d"),
        "offered only in the class's zone: {:?}",
        m5.offerings
    );
    assert!(types.iter().all(|t| {
        t.requirements
            .get("kubernetes.io/arch")
            .is_some_and(|r| r.has("amd64") || r.has("arm64"))
    }),);

    let first = cloud
        .create(&claim("default-first"), Some(&class), &types)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let instance = &first.instance;
    assert_eq!(
        (
            instance.instance_type.as_str(),
            instance.capacity_type,
            instance.zone.as_str()
        ),
        ("c5.large", CapacityType::OnDemand, "us-west-2d"),
        "the cheapest allowed offering is the first override"
    );
    assert_eq!(instance.price, 0.085);
    assert_eq!(first.labels.get(ZONE).map(String::as_str), Some("us-west-2d"));
    assert_eq!(first.labels.get(NODEPOOL).map(String::as_str), Some("default"));

    let described = cloud
        .get(&instance.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tag = |key: &str| described.tags.get(key).map(String::as_str);
    assert_eq!(
        tag(joist_messages::labels::tags::NODECLAIM),
        Some("default-first")
    );
    assert_eq!(tag(joist_messages::labels::tags::NODEPOOL), Some("default"));
    assert_eq!(tag(&joist_provider::launch::cluster_tag(CLUSTER)), Some("owned"));
    assert_eq!(tag("eks:eks-cluster-name"), Some(CLUSTER));
    assert!(
        class
            .status
            .iter()
            .flat_map(|s| &s.amis)
            .any(|a| a.id == described.image_id),
        "booted a resolved image: {}",
        described.image_id
    );

    let second = cloud
        .create(&claim("default-second"), Some(&class), &types)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(second.instance.provider_id, instance.provider_id);
    let user_data = our_template(&clients, CLUSTER)
        .await
        .user_data()
        .and_then(|encoded| base64::engine::general_purpose::STANDARD.decode(encoded).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|| panic!("the template has no user data"));
    assert!(user_data.contains(ENDPOINT), "{user_data}");
    assert!(user_data.contains("maxPods: 29"), "{user_data}");

    let listed = cloud.list().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(listed.len(), 2, "{listed:#?}");
    for launched in [&first, &second] {
        let provider_id = &launched.instance.provider_id;
        cloud.delete(provider_id).await.unwrap_or_else(|e| panic!("{e}"));
        let gone = cloud.get(provider_id).await;
        assert!(
            matches!(gone, Err(CloudError::NodeClaimNotFound { .. })),
            "{gone:?}"
        );
    }
    assert!(cloud.list().await.unwrap_or_else(|e| panic!("{e}")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classs_network_and_cpu_options_reach_the_launch_template() {
    let Fleet {
        clients,
        cloud,
        class,
        types,
    } = fleet(
        EFA_CLUSTER,
        &spec(
            "  networkInterfaces:
    - {networkCardIndex: 0, deviceIndex: 0, interfaceType: interface}
    - {networkCardIndex: 1, deviceIndex: 0, interfaceType: efa-only}
  ipPrefixCount: 2
  cpuOptions: {nestedVirtualization: enabled}
  connectionTracking: {tcpEstablishedTimeout: 3600, udpTimeout: 30}
",
        ),
    )
    .await;
    // Only types with a second network card and EFA can carry the interfaces.
    let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
    assert!(
        !names.contains(&"m5.large") && !names.contains(&"c5.large"),
        "{names:?}"
    );
    assert!(names.contains(&"m6in.32xlarge"), "{names:?}");
    let mut claim = claim("default-efa");
    for requirement in claim
        .spec
        .requirements
        .iter_mut()
        .filter(|r| r.key == INSTANCE_TYPE)
    {
        requirement.values = vec!["m6in.32xlarge".to_owned()];
    }
    let launched = cloud
        .create(&claim, Some(&class), &types)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        launched.instance.instance_type, "m6in.32xlarge",
        "the cheapest type that can carry them"
    );

    let data = our_template(&clients, EFA_CLUSTER).await;
    let interfaces = data.network_interfaces();
    assert_eq!(interfaces.len(), 2, "{interfaces:#?}");
    let (primary, efa) = (&interfaces[0], &interfaces[1]);
    assert_eq!(
        (primary.network_card_index(), primary.device_index()),
        (Some(0), Some(0))
    );
    assert_eq!(
        primary.ipv4_prefix_count(),
        Some(2),
        "prefix delegation on the primary"
    );
    let tracking = primary.connection_tracking_specification();
    assert_eq!(
        tracking.map(|t| (t.tcp_established_timeout(), t.udp_timeout())),
        Some((Some(3600), Some(30)))
    );
    assert_eq!(
        (efa.network_card_index(), efa.interface_type()),
        (Some(1), Some("efa-only"))
    );
    assert_eq!(
        efa.ipv4_prefix_count(),
        None,
        "an EFA-only interface has no addresses"
    );
    assert!(
        !primary.groups().is_empty() && primary.groups() == efa.groups(),
        "{interfaces:#?}"
    );
    let nested = data.cpu_options().and_then(|c| c.nested_virtualization());
    assert_eq!(nested.map(|n| n.as_str()), Some("enabled"));
    cloud
        .delete(&launched.instance.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

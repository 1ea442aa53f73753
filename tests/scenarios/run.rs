//! `joist run`, the production binary, end to end: kubesim served over HTTP with a kubeconfig, moto
//! as AWS (`AWS_ENDPOINT_URL`), Karpenter's settings in the environment. A pending pod becomes a
//! NodeClaim and a moto instance; a Node registered with that instance's provider ID turns the claim
//! Registered and Initialized; SIGTERM stops the binary cleanly. A missing setting stops it at once,
//! naming the variable.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use joist_kubesim::{
    Cluster, ClusterSettings,
    api::{ApiFailure, ApiFaults},
    http::HttpServer,
};
use joist_messages::apis::NodeClaim;
use joist_provider::CloudError;
use joist_provider_aws::{clients::AwsClients, instances};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::api::{Api, PostParams};

#[path = "../../providers/aws/tests/aws/moto.rs"]
mod moto;

use super::{
    chart,
    joist_process::{Controller, eventually, http_get, shard_holders, within},
    sample, tools,
};

const CLUSTER: &str = "e2e";

/// How long an empty node's removal may take: a node nominated for a pod stays out of disruption
/// for 20 s, passes come every 10 s, then a 15 s validation, the drain, the instance's termination
/// and the claim's finalizer (about 48 s on an idle machine; CI runs many worlds side by side).
const EMPTINESS_REMOVAL: Duration = Duration::from_secs(120);

/// The harness's settings for `joist run` against the API server at `url`, as the chart would set
/// them in kube-system but with a debug log and ephemeral ports on 127.0.0.1, then `env`.
fn harness_environment(url: &str, env: &[(&str, &str)]) -> Vec<(String, String)> {
    [
        ("CLUSTER_NAME", CLUSTER),
        ("CLUSTER_ENDPOINT", url),
        ("CLUSTER_CIDR", "10.100.0.0/16"),
        ("LOG_LEVEL", "debug"),
        ("LISTEN_ADDRESS", "127.0.0.1"),
        ("METRICS_PORT", "0"),
        ("HEALTH_PROBE_PORT", "0"),
        ("SYSTEM_NAMESPACE", "kube-system"),
    ]
    .iter()
    .chain(env)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// Every request made of `cluster` (by `joist run`: the test's own go through the in-process client
/// and are made after) is one the Helm chart's Roles grant, in the release's namespace kube-system.
fn assert_granted(cluster: &Cluster) {
    let objects = chart::defaults();
    let denied: Vec<String> = cluster
        .accesses()
        .into_iter()
        .filter(|a| {
            !chart::grants(
                objects,
                a.verb,
                &a.group,
                &a.resource,
                a.namespace.as_deref(),
                a.name.as_deref(),
            )
        })
        .map(|a| format!("{a:?}"))
        .collect();
    assert!(
        denied.is_empty(),
        "joist run made requests the chart's RBAC does not grant:\n{}",
        denied.join("\n")
    );
}

/// Starts `joist run` with exactly `env` and the platform's: the kubeconfig (for the pod's service
/// account), moto's endpoint and test credentials (for IRSA), `PATH`. Its log goes to `dir/name.log`.
fn spawn(
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    name: &str,
    env: &[(String, String)],
) -> Controller {
    let kubeconfig = kubeconfig.to_string_lossy();
    let platform = [
        ("KUBECONFIG", kubeconfig.as_ref()),
        ("AWS_ENDPOINT_URL", moto::endpoint()),
        ("AWS_REGION", moto::REGION),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let env = platform
        .into_iter()
        .chain(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Controller::joist(dir.join(format!("{name}.log")), env)
}

/// The environment the chart's Deployment gives the controller container, rendered for this
/// cluster with `values`; downward-API values as the kubelet would fill them (namespace
/// kube-system, pod joist-0).
fn chart_environment(server_url: &str, values: &[&str]) -> Vec<(String, String)> {
    let endpoint = format!("settings.clusterEndpoint={server_url}");
    let mut args = vec![
        "--set",
        "settings.clusterName=e2e",
        "--set",
        &endpoint,
        "--set",
        "settings.clusterCIDR=10.100.0.0/16",
    ];
    args.extend_from_slice(values);
    let objects = chart::render(&args).unwrap_or_else(|e| panic!("{e}"));
    let deployment = chart::object(&objects, "Deployment", "joist");
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap_or_else(|| panic!("no env in {deployment}"))
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_owned();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => "kube-system".to_owned(),
                Some("metadata.name") => "joist-0".to_owned(),
                Some(other) => panic!("{name}: no downward-API value for {other}"),
                None => e["value"].as_str().unwrap_or_default().to_owned(),
            };
            (name, value)
        })
        .collect()
}

fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn condition(claim: &NodeClaim, type_: &str) -> bool {
    claim
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// kubesim over HTTP with Joist's CRDs, `joist run` against it and moto, and an EC2NodeClass on
/// moto's subnet in us-west-2a and a NodePool of `instance_types`; `env` adds settings.
struct World {
    clients: AwsClients,
    client: kube::Client,
    joist: Controller,
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: HttpServer,
    /// The network between `server` and its clients (none by default).
    network: ApiFaults,
    cluster: Cluster,
}

/// Where `joist run`'s settings come from.
enum Settings<'a> {
    /// The test's own (the cluster, a debug log level, ephemeral ports on 127.0.0.1), and `env`.
    Harness(&'a [(&'a str, &'a str)]),
    /// Exactly what the Helm chart's Deployment gives the container, rendered with `values`.
    Chart(&'a [&'a str]),
}

impl World {
    async fn start(instance_types: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with(instance_types, Settings::Harness(env)).await
    }

    async fn start_with(instance_types: &str, settings: Settings<'_>) -> Self {
        let clients = moto::clients().await;
        let subnets = clients
            .ec2
            .describe_subnets()
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let subnet = subnets
            .subnets()
            .iter()
            .find(|s| s.availability_zone() == Some("us-west-2a"))
            .and_then(|s| s.subnet_id())
            .unwrap_or_else(|| panic!("moto has no subnet in us-west-2a"))
            .to_owned();

        let cluster = Cluster::start(ClusterSettings::default());
        cluster
            .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
            .unwrap_or_else(|e| panic!("{e}"));
        let network = ApiFaults::default();
        let server = cluster
            .serve_http_through(0, Some(network.clone()))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // One directory per world: tests run in parallel in this process.
        static WORLDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let world = WORLDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("joist-e2e-{}-{world}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let kubeconfig = dir.join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .unwrap_or_else(|e| panic!("{e}"));
        let client = cluster.client();
        let version = client.apiserver_version().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            format!("{}.{}", version.major, version.minor),
            moto::KUBERNETES,
            "moto is seeded with the AMI parameters of kubesim's version"
        );

        let env: Vec<(String, String)> = match settings {
            Settings::Harness(env) => harness_environment(&server.url(), env),
            Settings::Chart(values) => chart_environment(&server.url(), values),
        };
        let joist = spawn(&dir, &kubeconfig, "joist", &env);

        let classes: Api<joist_messages::apis::EC2NodeClass> = Api::all(client.clone());
        let class = yaml(&format!(
            "apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {{name: default}}
spec:
  instanceProfile: KarpenterNodeInstanceProfile-e2e
  amiSelectorTerms: [{{alias: al2023@latest}}]
  subnetSelectorTerms: [{{id: {subnet}}}]
  securityGroupSelectorTerms: [{{name: default}}]
"
        ));
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let pools: Api<joist_messages::apis::NodePool> = Api::all(client.clone());
        let pool = yaml(&format!(
            "apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: default}}
spec:
  template:
    spec:
      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
      requirements:
      - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
      - {{key: node.kubernetes.io/instance-type, operator: In, values: [{instance_types}]}}
"
        ));
        pools
            .create(&PostParams::default(), &pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            clients,
            client,
            joist,
            dir,
            kubeconfig,
            server,
            network,
            cluster,
        }
    }

    /// Another `joist run` replica against the same cluster, named `name`, with `env` added to the
    /// harness's settings.
    fn replica(&self, name: &str, env: &[(&str, &str)]) -> Controller {
        let env = harness_environment(&self.server.url(), env);
        spawn(&self.dir, &self.kubeconfig, name, &env)
    }

    /// Another replica as [`World::replica`], reaching the cluster at an address of its own, out of
    /// reach of the faults of the world's `network`; the address stops when the server is dropped.
    async fn replica_elsewhere(&self, name: &str, env: &[(&str, &str)]) -> (Controller, HttpServer) {
        let server = self.cluster.serve_http(0).await.unwrap_or_else(|e| panic!("{e}"));
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        server
            .write_kubeconfig(&kubeconfig)
            .unwrap_or_else(|e| panic!("{e}"));
        let env = harness_environment(&server.url(), env);
        (spawn(&self.dir, &kubeconfig, name, &env), server)
    }

    /// Every request `joist run` made of the cluster so far is one the Helm chart's Roles grant.
    fn assert_the_chart_grants_every_request(&self) {
        assert_granted(&self.cluster);
    }

    /// A pod `web` (1 CPU) whose NodeClaim launched and whose Node, `node_name`, registered and
    /// initialized: the claims API, the claim's name and its provider ID.
    async fn running_node(&self, node_name: &str) -> (Api<NodeClaim>, String, String) {
        self.pod("web", "1").await;
        let claims: Api<NodeClaim> = Api::all(self.client.clone());
        let launched = launched_claim(&self.joist, &claims).await;
        let claim_name = launched.metadata.name.clone().unwrap_or_default();
        let provider_id = launched.status.and_then(|s| s.provider_id).unwrap_or_default();
        register_node(&self.client, node_name, &provider_id).await;
        initialized_claim(&self.joist, &claims, &claim_name).await;
        (claims, claim_name, provider_id)
    }

    /// A pod asking for `cpu` CPUs and 1 GiB.
    async fn pod(&self, name: &str, cpu: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let pod = yaml(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
  - name: web
    image: nginx
    resources: {{requests: {{cpu: '{cpu}', memory: 1Gi}}}}
"
        ));
        pods.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// What EC2 (moto) reports for the instance behind `provider_id`.
async fn described(clients: &AwsClients, provider_id: &str) -> Result<joist_provider::Instance, CloudError> {
    instances::get(&instances::lookups(clients.clone()), provider_id).await
}

/// The first NodeClaim that has launched an instance.
async fn launched_claim(joist: &Controller, claims: &Api<NodeClaim>) -> NodeClaim {
    eventually(joist, "a launched NodeClaim", || async {
        let list = claims.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|c| c.status.as_ref().and_then(|s| s.provider_id.as_ref()).is_some())
    })
    .await
}

/// The kubelet's part: registers a Ready Node named `name` with the instance's provider ID.
async fn register_node(client: &kube::Client, name: &str, provider_id: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = yaml(&format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/arch: amd64, kubernetes.io/os: linux}}
spec:
  providerID: {provider_id}
  taints: [{{key: karpenter.sh/unregistered, effect: NoExecute}}]
status:
  capacity: {{cpu: '2', memory: 7910Mi, pods: '29'}}
  allocatable: {{cpu: 1930m, memory: 7220Mi, pods: '29'}}
  conditions: [{{type: Ready, status: 'True'}}]
"
    ));
    nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The claim, once it is Registered and Initialized.
async fn initialized_claim(joist: &Controller, claims: &Api<NodeClaim>, name: &str) -> NodeClaim {
    eventually(joist, "Registered and Initialized", || async {
        let claim = claims.get(name).await.ok()?;
        (condition(&claim, "Registered") && condition(&claim, "Initialized")).then_some(claim)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_launches_a_moto_instance_for_a_pending_pod_and_initializes_its_node() {
    let world = World::start("m5.large, m5.xlarge", &[]).await;
    world.pod("web", "1").await;
    let World {
        clients,
        client,
        mut joist,
        cluster,
        ..
    } = world;

    let claims: Api<NodeClaim> = Api::all(client.clone());
    let launched = launched_claim(&joist, &claims).await;
    let claim_name = launched.metadata.name.clone().unwrap_or_default();
    let status = launched.status.clone().unwrap_or_default();
    let provider_id = status.provider_id.clone().unwrap_or_default();
    let instance = described(&clients, &provider_id)
        .await
        .unwrap_or_else(|e| panic!("moto has no instance {provider_id}: {e}"));
    assert_eq!(instance.instance_type, "m5.large", "the cheapest type that fits");
    assert_eq!(instance.zone, "us-west-2a");
    assert_eq!(
        instance
            .tags
            .get(joist_messages::labels::tags::NODECLAIM)
            .map(String::as_str),
        Some(claim_name.as_str())
    );
    assert_eq!(
        instance
            .tags
            .get(joist_messages::labels::tags::NODEPOOL)
            .map(String::as_str),
        Some("default")
    );

    register_node(&client, "ip-10-0-0-10.us-west-2.compute.internal", &provider_id).await;
    let initialized = initialized_claim(&joist, &claims, &claim_name).await;
    let node_name = "ip-10-0-0-10.us-west-2.compute.internal";
    assert_eq!(
        initialized.status.and_then(|s| s.node_name).as_deref(),
        Some(node_name)
    );
    // Karpenter's tagging: the instance is named after its Node, and the claim says so.
    eventually(&joist, "the instance named after its node", || async {
        let instance = described(&clients, &provider_id).await.ok()?;
        let claim = claims.get(&claim_name).await.ok()?;
        let tagged = claim.metadata.annotations?.get("karpenter.k8s.aws/tagged")? == "true";
        (tagged && instance.tags.get("Name").map(String::as_str) == Some(node_name)).then_some(())
    })
    .await;

    // The kubelet's probes and Prometheus' scrape, on Karpenter's endpoints.
    assert_eq!(joist.get("health probes", "/healthz").await.0, 200);
    assert_eq!(joist.get("health probes", "/readyz").await.0, 200, "synced");
    assert_eq!(joist.get("metrics", "/nothing").await.0, 404);
    let (status, metrics) = joist.get("metrics", "/metrics").await;
    assert_eq!(status, 200);
    for (series, value) in [
        (
            "karpenter_nodeclaims_created_total{reason=\"provisioned\",nodepool=\"default\",min_values_relaxed=\"false\"}",
            1.0,
        ),
        (
            "karpenter_nodes_created_total{nodepool=\"default\",zone=\"us-west-2a\"}",
            1.0,
        ),
        ("karpenter_cluster_state_synced", 1.0),
        ("karpenter_cluster_state_node_count", 1.0),
    ] {
        assert_eq!(sample(&metrics, series), Some(value), "{series} in\n{metrics}");
    }
    assert!(
        metrics.contains("karpenter_nodes_allocatable{node_name=\"ip-10-0-0-10.us-west-2.compute.internal\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("karpenter_pods_state{name=\"web\",namespace=\"default\""),
        "{metrics}"
    );

    assert_granted(&cluster);

    // SIGTERM, as Kubernetes stops a pod: a clean exit.
    joist.signal("-TERM");
    let mut exit = None;
    for _ in 0..100 {
        exit = joist.child.try_wait().unwrap_or_else(|e| panic!("{e}"));
        if exit.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        exit.is_some_and(|e| e.success()),
        "{exit:?} within 10 s of SIGTERM; joist run logged:\n{}",
        joist.log()
    );
    let still_there = described(&clients, &provider_id).await;
    assert!(
        !matches!(still_there, Err(CloudError::NodeClaimNotFound { .. })),
        "stopping the controller leaves the node's instance running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_of_pending_pods_over_http_get_one_nodeclaim_per_needed_node() {
    // Short batch windows make passes run back to back, each right after the last one created its
    // claims: a pass that did not see those claims yet would launch for the same pods again.
    let world = World::start(
        "m5.xlarge",
        &[("BATCH_IDLE_DURATION", "100ms"), ("BATCH_MAX_DURATION", "300ms")],
    )
    .await;
    // Three CPUs each: one pod per m5.xlarge, so the pods need exactly as many nodes.
    const PODS: usize = 20;
    for burst in 0..4 {
        for i in 0..PODS / 4 {
            world.pod(&format!("burst-{burst}-{i}"), "3").await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let claims: Api<NodeClaim> = Api::all(world.client.clone());
    let count = || async { claims.list(&Default::default()).await.map(|l| l.items.len()).ok() };
    let reached = eventually(&world.joist, "a NodeClaim for every pod", || async {
        count().await.filter(|n| *n >= PODS)
    })
    .await;
    // Passes keep running (every 10 s, and as the claims launch): none may add a claim.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let settled = count().await.unwrap_or_default();
    assert_eq!(
        (reached, settled),
        (PODS, PODS),
        "one NodeClaim per pod that needs its own node; joist run logged:\n{}",
        world.joist.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_removes_a_node_once_its_pods_are_gone() {
    let world = World::start("m5.large", &[]).await;
    let (claims, claim_name, provider_id) = world
        .running_node("ip-10-0-0-20.us-west-2.compute.internal")
        .await;
    // The workload goes: the node is empty, and emptiness removes it.
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    pods.delete("web", &Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    within(
        EMPTINESS_REMOVAL,
        &world.joist,
        "the empty node's NodeClaim removed",
        || async { claims.get_opt(&claim_name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let instance = described(&world.clients, &provider_id).await;
    assert!(
        matches!(instance, Err(CloudError::NodeClaimNotFound { .. })),
        "the instance is terminated: {instance:?}"
    );
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = nodes.get_opt("ip-10-0-0-20.us-west-2.compute.internal").await;
    assert!(matches!(node, Ok(None)), "and its Node deleted: {node:?}");
    world.assert_the_chart_grants_every_request();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_adopts_an_instance_karpenter_launched_and_removes_it_once_empty() {
    use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
    let world = World::start("m5.large", &[]).await;
    let classes: Api<joist_messages::apis::EC2NodeClass> = Api::all(world.client.clone());
    let (image, subnet) = eventually(&world.joist, "the class resolved", || async {
        let status = classes.get("default").await.ok()?.status?;
        Some((status.amis.first()?.id.clone(), status.subnets.first()?.clone()))
    })
    .await;
    // An instance, its NodeClaim and its Node as Karpenter leaves them.
    let claim_name = "default-k8r7p";
    let tags = [
        (format!("kubernetes.io/cluster/{CLUSTER}"), "owned"),
        ("eks:eks-cluster-name".to_owned(), CLUSTER),
        ("karpenter.sh/nodepool".to_owned(), "default"),
        ("karpenter.k8s.aws/ec2nodeclass".to_owned(), "default"),
        ("karpenter.sh/nodeclaim".to_owned(), claim_name),
    ];
    let run = world
        .clients
        .ec2
        .run_instances()
        .image_id(&image)
        .instance_type(InstanceType::M5Large)
        .subnet_id(&subnet.id)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .set_tags(Some(
                    tags.iter()
                        .map(|(k, v)| Tag::builder().key(k).value(*v).build())
                        .collect(),
                ))
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let id = run.instances()[0].instance_id().unwrap_or_default();
    let provider_id = instances::provider_id(&subnet.zone, id);
    let node_name = "ip-10-0-0-40.us-west-2.compute.internal";
    let labels = format!(
        "{{karpenter.sh/nodepool: default, karpenter.sh/capacity-type: on-demand, \
         node.kubernetes.io/instance-type: m5.large, topology.kubernetes.io/zone: {}}}",
        subnet.zone
    );
    let claims: Api<NodeClaim> = Api::all(world.client.clone());
    let claim: NodeClaim = yaml(&format!(
        "apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata:
  name: {claim_name}
  labels: {labels}
  annotations: {{karpenter.sh/nodepool-hash: '4012513481623584108', karpenter.sh/nodepool-hash-version: v3}}
  finalizers: [karpenter.sh/termination]
spec:
  nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
  requirements: [{{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}}]
"
    ));
    claims
        .create(&PostParams::default(), &claim)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let now = "2026-11-28T00:00:00Z";
    let conditions: Vec<serde_json::Value> = ["Launched", "Registered", "Initialized", "Ready"]
        .iter()
        .map(|c| serde_json::json!({"type": c, "status": "True", "reason": c, "message": "", "lastTransitionTime": now}))
        .collect();
    let status = serde_json::json!({"status": {
        "providerID": provider_id, "nodeName": node_name, "imageID": image,
        "capacity": {"cpu": "2", "memory": "7910Mi", "pods": "29"},
        "allocatable": {"cpu": "1930m", "memory": "7220Mi", "pods": "29"},
        "conditions": conditions,
    }});
    claims
        .patch_status(
            claim_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node: Node = yaml(&format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {node_name}
  labels: {labels}
spec: {{providerID: {provider_id}}}
status:
  capacity: {{cpu: '2', memory: 7910Mi, pods: '29'}}
  allocatable: {{cpu: 1930m, memory: 7220Mi, pods: '29'}}
  conditions: [{{type: Ready, status: 'True'}}]
"
    ));
    nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // Joist takes the claim over (its hash re-stamped with Joist's version, not read as drift),
    // and, the node being empty, removes it through its own cloud: the instance is terminated.
    // The removal may follow the re-stamp within one look, so the re-stamp is read from the log.
    within(
        EMPTINESS_REMOVAL,
        &world.joist,
        "the empty node's NodeClaim removed",
        || async { claims.get_opt(claim_name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let log = world.joist.log();
    assert!(
        !log.contains("nodeclaim drifted"),
        "Karpenter's hash is re-stamped, not drift: {log}"
    );
    assert!(log.contains("emptiness"), "removed as empty: {log}");
    let instance = described(&world.clients, &provider_id).await;
    assert!(
        matches!(instance, Err(CloudError::NodeClaimNotFound { .. })),
        "Karpenter's instance is terminated by Joist: {instance:?}"
    );
    assert!(!log.contains("created nodeclaim"), "nothing launched: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_reads_the_interruption_queue_and_drains_the_warned_node() {
    let queue = "e2e-interruptions";
    let sqs = moto::clients().await.sqs;
    let url = sqs
        .create_queue()
        .queue_name(queue)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .queue_url
        .unwrap_or_default();
    let world = World::start("m5.large", &[("INTERRUPTION_QUEUE", queue)]).await;
    let (claims, claim_name, provider_id) = world
        .running_node("ip-10-0-0-30.us-west-2.compute.internal")
        .await;
    let instance = provider_id.rsplit('/').next().unwrap_or_default();
    let event = |source: &str, detail_type: &str, detail: serde_json::Value| {
        serde_json::json!({
            "version": "0", "id": "e2e", "detail-type": detail_type, "source": source,
            "account": "123456789012", "time": "2026-01-01T00:00:00Z", "region": "us-west-2",
            "resources": [], "detail": detail,
        })
        .to_string()
    };
    let warned = |id: &str| serde_json::json!({"instance-id": id, "instance-action": "terminate"});
    let state = |state: &str| serde_json::json!({"instance-id": "i-0123456789abcdef0", "state": state});
    // Every kind Joist reads: the spot warning and a rebalance recommendation for the running
    // node, the other kinds for an instance Joist does not know, and a body that is no event.
    let bodies = [
        event(
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            warned(instance),
        ),
        event(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            warned(instance),
        ),
        event(
            "aws.ec2",
            "EC2 Capacity Reservation Instance Interruption Warning",
            warned("i-0123456789abcdef0"),
        ),
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            state("stopping"),
        ),
        event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            state("shutting-down"),
        ),
        event(
            "aws.health",
            "AWS Health Event",
            serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                               "affectedEntities": [{"entityValue": "i-0123456789abcdef0"}]}),
        ),
        "not an event".to_owned(),
    ];
    for body in bodies {
        sqs.send_message()
            .queue_url(&url)
            .message_body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The warned node's claim goes: drained (its bare pod evicted) and its instance terminated.
    eventually(&world.joist, "the warned NodeClaim removed", || async {
        claims.get_opt(&claim_name).await.ok()?.is_none().then_some(())
    })
    .await;
    let terminated = described(&world.clients, &provider_id).await;
    assert!(
        matches!(terminated, Err(CloudError::NodeClaimNotFound { .. })),
        "{terminated:?}"
    );
    let left = sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .messages
        .unwrap_or_default();
    assert!(left.is_empty(), "every message was deleted: {left:?}");
    let deleted = "karpenter_interruption_deleted_messages_total";
    let metrics = eventually(&world.joist, "seven messages counted as deleted", || async {
        let metrics = world.joist.get("metrics", "/metrics").await.1;
        (sample(&metrics, deleted) == Some(7.0)).then_some(metrics)
    })
    .await;
    for message_type in [
        "rebalance_recommendation",
        "spot_interrupted",
        "capacity_reservation_interrupted",
        "instance_stopped",
        "instance_terminated",
        "scheduled_change",
        "no_op",
    ] {
        let series =
            format!("karpenter_interruption_received_messages_total{{message_type=\"{message_type}\"}}");
        assert_eq!(sample(&metrics, &series), Some(1.0), "{series} in\n{metrics}");
    }
    assert_eq!(
        sample(
            &metrics,
            "karpenter_nodeclaims_disrupted_total{reason=\"spot_interrupted\",nodepool=\"default\",capacity_type=\"on-demand\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    world.assert_the_chart_grants_every_request();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_retries_a_queue_that_does_not_exist_and_provisions_all_the_same() {
    let world = World::start("m5.large", &[("INTERRUPTION_QUEUE", "no-such-queue")]).await;
    // The other controllers go on: a pending pod gets its node.
    world
        .running_node("ip-10-0-0-40.us-west-2.compute.internal")
        .await;
    // The queue is tried again, and each failure logged with the queue's error.
    eventually(&world.joist, "two failed receives logged", || async {
        let log = world.joist.log();
        let failures = log
            .lines()
            .filter(|l| l.contains("receiving from the interruption queue failed"))
            .filter(|l| l.contains("GetQueueUrl"))
            .count();
        (failures >= 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_with_the_charts_environment_reaches_ready_and_provisions() {
    // Karpenter's values file, with the ports this test may use: the chart decides the rest.
    // With a kube-scheduler default spread, so the objects it is deduced from are read too.
    let values = [
        "-f",
        "tests/fixtures/helm/karpenter-values.yaml",
        "-f",
        "tests/fixtures/helm/scheduler-config-values.yaml",
        "--set",
        "controller.metrics.port=0",
        "--set",
        "controller.healthProbe.port=0",
        "--set",
        "controller.env[0].name=LISTEN_ADDRESS",
        "--set",
        "controller.env[0].value=127.0.0.1",
        "--set",
        "settings.interruptionQueue=",
    ];
    let world = World::start_with("m5.large", Settings::Chart(&values)).await;
    eventually(&world.joist, "Ready", || async {
        (world.joist.get("health probes", "/readyz").await.0 == 200).then_some(())
    })
    .await;
    world
        .running_node("ip-10-0-0-50.us-west-2.compute.internal")
        .await;
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), "kube-system");
    let lease = leases
        .get("joist-leader-election")
        .await
        .unwrap_or_else(|e| panic!("the chart's lease: {e}"));
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("joist-0"),
        "the pod named by the downward API leads"
    );
    world.assert_the_chart_grants_every_request();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_charts_install_into_kubesim_with_the_real_helm() {
    let cluster = Cluster::start(ClusterSettings::default());
    let server = cluster.serve_http(0).await.unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("joist-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = dir.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    for install in [
        vec!["install", "joist-crd", "deploy/charts/joist-crd"],
        vec![
            "install",
            "joist",
            "deploy/charts/joist",
            "--namespace",
            "kube-system",
            "-f",
            "tests/fixtures/helm/karpenter-values.yaml",
        ],
    ] {
        let mut args = install.clone();
        args.extend(["--kubeconfig", &kubeconfig]);
        let (ok, out, err) = chart::run_helm(&args);
        assert!(
            ok && out.contains("STATUS: deployed"),
            "helm {install:?}: {out}{err}"
        );
    }
    // The CRDs are served: NodePools can be listed and created.
    let client = cluster.client();
    let pools: Api<joist_messages::apis::NodePool> = Api::all(client.clone());
    assert!(pools.list(&Default::default()).await.is_ok());
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "kube-system");
    let deployment = deployments.get("joist").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(2));
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client);
    assert!(roles.get("joist").await.is_ok(), "the controller's ClusterRole");
}

/// A Prometheus server of Debian's package (installed by `scripts/prometheus`), killed on drop.
struct Prometheus {
    child: Child,
    address: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Paths of `prometheus` and `promtool`.
fn prometheus_binaries() -> (PathBuf, PathBuf) {
    let paths = tools::installed("prometheus");
    (
        tools::path(&paths, "prometheus", "PROMETHEUS"),
        tools::path(&paths, "prometheus", "PROMTOOL"),
    )
}

/// PromQL `query` against `prometheus`: the result vector.
async fn query(prometheus: &Prometheus, query: &str) -> Vec<serde_json::Value> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect();
    let (status, body) = http_get(
        &prometheus.address,
        &format!("/api/v1/query?query={encoded}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{query}: {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    answer["data"]["result"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_series_karpenters_dashboards_query() {
    let (prometheus, promtool) = prometheus_binaries();
    let world = World::start("m5.large", &[]).await;
    world
        .running_node("ip-10-0-0-60.us-west-2.compute.internal")
        .await;
    let target = world.joist.address("metrics").await;

    // promtool reads the Prometheus text format a scraper without OpenMetrics gets. Its one lint
    // finding is Karpenter's own name for the cluster state's node count.
    let (status, text) = http_get(&target, "/metrics", None).await;
    assert_eq!(status, 200);
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    {
        use std::io::Write;
        let mut stdin = check.stdin.take().unwrap_or_else(|| panic!("promtool's stdin"));
        stdin.write_all(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    }
    let checked = check.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let findings =
        String::from_utf8_lossy(&checked.stdout).into_owned() + &String::from_utf8_lossy(&checked.stderr);
    let unexpected: Vec<&str> = findings
        .lines()
        .filter(|l| !l.starts_with("karpenter_cluster_state_node_count non-histogram and non-summary metrics should not have \"_count\" suffix"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "promtool check metrics:\n{findings}\n{text}"
    );

    // A real Prometheus scrapes `joist run` as Karpenter's guide sets it up: job `karpenter`.
    let dir = world.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n- job_name: karpenter\n  static_configs: [{{targets: ['{target}']}}]\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let server = Prometheus {
        child: Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap_or_else(|e| panic!("{e}")))
            .spawn()
            .unwrap_or_else(|e| panic!("start prometheus: {e}")),
        address: format!("127.0.0.1:{port}"),
    };
    // Queries of Karpenter's capacity dashboard, each of which must return series.
    let dashboard = [
        "sum by(cluster,nodepool)(karpenter_nodes_created_total{nodepool=~\".*\"})",
        "sum by(reason)(karpenter_voluntary_disruption_eligible_nodes)",
        "sum by(phase)(karpenter_pods_state)",
        "sum by(arch,capacity_type,instance_type,nodepool,zone)(karpenter_pods_state{nodepool=~\".*\"})",
        "count by(nodepool)(karpenter_nodes_allocatable{nodepool!=\"N/A\",resource_type=\"cpu\"})",
        "sum by(nodepool)(karpenter_nodes_allocatable{nodepool!=\"N/A\",resource_type=\"memory\"})",
        "karpenter_nodepools_usage{resource_type=\"cpu\"}",
        "karpenter_nodes_total_pod_requests{resource_type=\"cpu\"} / karpenter_nodes_allocatable{resource_type=\"cpu\"}",
        "sum by(nodepool)(karpenter_nodeclaims_created_total)",
        // And of its performance dashboard.
        "sum(rate(controller_runtime_reconcile_total{job=\"karpenter\"}[10m])) by (controller)",
        "histogram_quantile(0.99, rate(controller_runtime_reconcile_time_seconds_bucket{controller=\"nodeclaim.lifecycle\"}[10m]))",
    ];
    let logs = world.dir.join("prometheus/prometheus.log");
    for promql in dashboard {
        let mut result = Vec::new();
        for _ in 0..150 {
            let listening = tokio::net::TcpStream::connect(&server.address).await.is_ok();
            if listening && http_get(&server.address, "/-/ready", None).await.0 == 200 {
                result = query(&server, promql).await;
                if !result.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            !result.is_empty(),
            "{promql} returned no series; prometheus logged:\n{}",
            std::fs::read_to_string(&logs).unwrap_or_default()
        );
    }
    let up = query(&server, "up{job=\"karpenter\"}").await;
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
}

/// The holder of the leader election Lease in `namespace`, if any.
async fn leader(client: &kube::Client, namespace: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases.get_opt("joist-leader-election").await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_that_a_standby_replaces_when_killed_or_stopped() {
    let mut world = World::start("m5.large", &[("POD_NAME", "joist-a")]).await;
    let client = world.client.clone();
    eventually(&world.joist, "joist-a leading", || async {
        (leader(&client, "kube-system").await.as_deref() == Some("joist-a")).then_some(())
    })
    .await;
    let mut b = world.replica("joist-b", &[("POD_NAME", "joist-b")]);
    eventually(&b, "joist-b standing by", || async {
        b.log().contains("standing by").then_some(())
    })
    .await;
    assert_eq!(
        b.get("health probes", "/readyz").await,
        (200, "standing by".to_owned())
    );
    assert_eq!(
        b.get("metrics", "/metrics").await.1,
        "# EOF\n",
        "a standby runs no controllers"
    );
    // Only the leader acts: one pending pod, one NodeClaim.
    world.pod("web", "1").await;
    let claims: Api<NodeClaim> = Api::all(client.clone());
    launched_claim(&world.joist, &claims).await;

    // kill -9: the standby takes over once the lease has not changed for its 15 s.
    world.joist.child.kill().unwrap_or_else(|e| panic!("{e}"));
    let killed = tokio::time::Instant::now();
    eventually(&b, "joist-b leading", || async {
        (leader(&client, "kube-system").await.as_deref() == Some("joist-b")).then_some(())
    })
    .await;
    let failover = killed.elapsed();
    println!("a standby took over {failover:?} after kill -9");
    assert!(
        failover >= Duration::from_secs(12) && failover < Duration::from_secs(18),
        "took over {failover:?} after the leader died (15 s lease, 1 s retries)"
    );
    eventually(&b, "joist-b ready as leader", || async {
        (b.get("health probes", "/readyz").await == (200, "ok".to_owned())).then_some(())
    })
    .await;

    // SIGTERM: the leader gives the lease up at once, and a new replica leads within seconds.
    let mut c = world.replica("joist-c", &[("POD_NAME", "joist-c")]);
    eventually(&c, "joist-c standing by", || async {
        c.log().contains("standing by").then_some(())
    })
    .await;
    b.signal("-TERM");
    let terminated = tokio::time::Instant::now();
    eventually(&c, "joist-c leading", || async {
        (leader(&client, "kube-system").await.as_deref() == Some("joist-c")).then_some(())
    })
    .await;
    println!("a standby took over {:?} after SIGTERM", terminated.elapsed());
    assert!(
        terminated.elapsed() < Duration::from_secs(5),
        "the released lease was taken in {:?}",
        terminated.elapsed()
    );
    let exit = b.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(exit.success(), "{exit:?}\n{}", b.log());
    assert!(b.log().contains("released the lease"), "{}", b.log());
    let _ = c.child.kill();
    world.assert_the_chart_grants_every_request();
}

/// The renew deadline of `joist run`'s leader election (controller-runtime's).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_api_server_is_black_holed_stops_before_a_standby_takes_over() {
    let mut world = World::start("m5.large", &[("POD_NAME", "joist-a")]).await;
    let client = world.client.clone();
    eventually(&world.joist, "joist-a leading", || async {
        (leader(&client, "kube-system").await.as_deref() == Some("joist-a")).then_some(())
    })
    .await;
    let (mut b, _b_address) = world
        .replica_elsewhere("joist-b", &[("POD_NAME", "joist-b")])
        .await;
    eventually(&b, "joist-b standing by", || async {
        b.log().contains("standing by").then_some(())
    })
    .await;

    // From now nothing joist-a sends arrives and nothing comes back: its renew hangs. It must
    // stop acting within the renew deadline of its last renew, before joist-b may take the Lease
    // over (15 s after that renew), and not when the hung request ends (here, after a minute).
    world.network.fail(ApiFailure::BlackHole, Duration::from_secs(60));
    let cut = tokio::time::Instant::now();
    let (mut a_stopped, mut b_leads) = (None, None);
    while (a_stopped.is_none() || b_leads.is_none()) && cut.elapsed() < Duration::from_secs(45) {
        if a_stopped.is_none() && world.joist.child.try_wait().ok().flatten().is_some() {
            a_stopped = Some(cut.elapsed());
        }
        if b_leads.is_none() && leader(&client, "kube-system").await.as_deref() == Some("joist-b") {
            b_leads = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("after the black hole opened: joist-a stopped at {a_stopped:?}, joist-b led at {b_leads:?}");
    let a_log = world.joist.log();
    let a_stopped = a_stopped
        .unwrap_or_else(|| panic!("joist-a never stopped behind the black hole; it logged:\n{a_log}"));
    let b_leads = b_leads.unwrap_or_else(|| panic!("joist-b never took over; it logged:\n{}", b.log()));
    assert!(
        a_stopped <= RENEW_DEADLINE + Duration::from_secs(2),
        "joist-a stopped {a_stopped:?} after the black hole opened"
    );
    assert!(
        a_stopped < b_leads,
        "two leaders: joist-b led {b_leads:?} and joist-a stopped {a_stopped:?} after the black hole opened"
    );
    assert!(a_log.contains("could not renew the lease in time"), "{a_log}");
    let exit = world.joist.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exit.code(), Some(2), "{a_log}");
    let _ = b.child.kill();
}

#[test]
fn joist_run_without_a_cluster_name_stops_at_once_naming_the_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_joist"))
        .arg("run")
        .env_clear()
        .env("CLUSTER_ENDPOINT", "https://example.eks.amazonaws.com")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CLUSTER_NAME is not set"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joist_run_without_an_endpoint_looks_the_cluster_up_as_karpenter_does() {
    moto::clients()
        .await
        .eks
        .create_cluster()
        .name("looked-up-e2e")
        .role_arn("arn:aws:iam::123456789012:role/eks-cluster")
        .resources_vpc_config(aws_sdk_eks::types::VpcConfigRequest::builder().build())
        .kubernetes_network_config(
            aws_sdk_eks::types::KubernetesNetworkConfigRequest::builder()
                .service_ipv4_cidr("10.96.0.0/12")
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    // Only the cluster's name, as Karpenter's install gives it.
    let unset = [("CLUSTER_ENDPOINT", ""), ("CLUSTER_CIDR", "")];
    let world = World::start(
        "m5.large",
        &[&unset[..], &[("CLUSTER_NAME", "looked-up-e2e")]].concat(),
    )
    .await;
    let found = eventually(&world.joist, "the cluster looked up", || async {
        world.joist.log().lines().find_map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).ok()?;
            let fields = &entry["fields"];
            (fields["message"] == "looked the cluster up with eks:DescribeCluster").then(|| fields.clone())
        })
    })
    .await;
    assert!(
        found["endpoint"]
            .as_str()
            .is_some_and(|e| e.starts_with("https://")),
        "{found}"
    );
    assert_eq!(found["service_cidr"], "10.96.0.0/12");

    // A cluster EKS does not know, and no endpoint: the start stops, saying why.
    let mut world = World::start(
        "m5.large",
        &[&unset[..], &[("CLUSTER_NAME", "not-in-eks")]].concat(),
    )
    .await;
    let exit = world.joist.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(!exit.success());
    let log = world.joist.log();
    assert!(
        log.contains("CLUSTER_ENDPOINT is not set and eks:DescribeCluster of") && log.contains("not-in-eks"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_split_the_nodepools_and_take_over_the_shards_of_one_killed() {
    use joist_actors::state::replica_shards::shard_of;
    const SHARDS: u32 = 3;
    let replica = |name: &'static str| [("POD_NAME", name), ("REPLICA_SHARDS", "3")];
    let world = World::start("m5.large", &replica("joist-a")).await;
    let mut others = [
        world.replica("joist-b", &replica("joist-b")),
        world.replica("joist-c", &replica("joist-c")),
    ];
    let client = world.client.clone();
    // Two NodePools per shard, each selected by its pods' `team` label.
    let mut teams: Vec<String> = Vec::new();
    for shard in 0..SHARDS {
        let names = (0..).map(|i| format!("team-{i}"));
        teams.extend(names.filter(|n| shard_of(n, SHARDS) == shard).take(2));
    }
    let pools: Api<joist_messages::apis::NodePool> = Api::all(client.clone());
    for team in &teams {
        let pool = yaml(&format!(
            "apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {team}}}
spec:
  template:
    metadata: {{labels: {{team: {team}}}}}
    spec:
      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
      requirements:
      - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
      - {{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}}
"
        ));
        pools
            .create(&PostParams::default(), &pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The three replicas started together: each holds one shard.
    let holders = eventually(&world.joist, "every shard held, one each", || async {
        let holders: Vec<String> = shard_holders(&client, SHARDS)
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        let distinct: std::collections::BTreeSet<&String> = holders.iter().collect();
        (distinct.len() == 3).then_some(holders)
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let create_pod = |name: String, team: &str| {
        let pod: Pod = yaml(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{team: {team}}}
  containers:
  - name: web
    image: nginx
    resources: {{requests: {{cpu: '1', memory: 1Gi}}}}
"
        ));
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    for team in &teams {
        create_pod(format!("web-{team}"), team).await;
    }
    // A pod every pool admits belongs to the first of the heaviest by name, `default`: only the
    // holder of that pool's shard launches for it.
    pods.create(
        &PostParams::default(),
        &yaml(
            "apiVersion: v1
kind: Pod
metadata: {name: anywhere}
spec:
  containers:
  - name: web
    image: nginx
    resources: {requests: {cpu: '1', memory: 1Gi}}
",
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let pool_of = |claim: &NodeClaim| {
        claim
            .metadata
            .labels
            .as_ref()?
            .get("karpenter.sh/nodepool")
            .cloned()
    };
    let launched = |claims: Vec<NodeClaim>| -> Vec<(String, String)> {
        claims
            .iter()
            .filter_map(|c| Some((pool_of(c)?, c.status.as_ref()?.provider_id.clone()?)))
            .collect()
    };
    eventually(
        &world.joist,
        "a launched NodeClaim for every team's pod",
        || async {
            let list = launched(claims.list(&Default::default()).await.ok()?.items);
            (list.len() > teams.len()).then_some(())
        },
    )
    .await;
    // Every pool got its node from one replica alone: one claim each, on instances of their own.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = claims
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .items;
    let mut per_pool: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for claim in &all {
        *per_pool.entry(pool_of(claim).unwrap_or_default()).or_default() += 1;
    }
    let expected: std::collections::BTreeMap<String, usize> = teams
        .iter()
        .chain([&"default".to_owned()])
        .map(|pool| (pool.clone(), 1))
        .collect();
    assert_eq!(per_pool, expected, "{}", world.joist.log());
    let instances: std::collections::BTreeSet<String> = launched(all).into_iter().map(|(_, id)| id).collect();
    assert_eq!(instances.len(), teams.len() + 1, "one instance per claim");

    // kill -9 the replica holding the shard of `teams[0]`: another takes the shard over within
    // 20 s and launches for that shard's pools.
    let shard = shard_of(&teams[0], SHARDS) as usize;
    let victim = holders[shard].clone();
    let killed = tokio::time::Instant::now();
    let survivor = match victim.as_str() {
        "joist-a" => {
            let mut joist = world.joist;
            joist.child.kill().unwrap_or_else(|e| panic!("{e}"));
            let _ = joist.child.wait();
            others
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("two replicas"))
        }
        name => {
            let position = if name == "joist-b" { 0 } else { 1 };
            others[position].child.kill().unwrap_or_else(|e| panic!("{e}"));
            let _ = others[position].child.wait();
            world.joist
        }
    };
    let taken_by = within(
        Duration::from_secs(20),
        &survivor,
        "the killed replica's shard taken over",
        || async {
            let holder = shard_holders(&client, SHARDS).await[shard].clone()?;
            (holder != victim).then_some(holder)
        },
    )
    .await;
    println!(
        "{taken_by} took shard {shard} over {:?} after kill -9",
        killed.elapsed()
    );
    create_pod("web-after".to_owned(), &teams[0]).await;
    eventually(
        &survivor,
        "a second launched NodeClaim for the taken-over pool",
        || async {
            let list = launched(claims.list(&Default::default()).await.ok()?.items);
            (list.iter().filter(|(pool, _)| *pool == teams[0]).count() == 2).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_shard_another_took_stops_at_once() {
    let mut world = World::start("m5.large", &[("POD_NAME", "joist-a"), ("REPLICA_SHARDS", "1")]).await;
    let client = world.client.clone();
    eventually(&world.joist, "joist-a holding the shard", || async {
        (shard_holders(&client, 1).await[0].as_deref() == Some("joist-a")).then_some(())
    })
    .await;
    // Another holder in the Lease, as a replica that wrongly took it over would write it.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let name = "joist-leader-election-shard-0";
    let mut lease = leases.get(name).await.unwrap_or_else(|e| panic!("{e}"));
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("intruder".to_owned());
    }
    leases
        .replace(name, &PostParams::default(), &lease)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = tokio::time::Instant::now();
    let exit = loop {
        if let Some(exit) = world.joist.child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break exit;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(10),
            "joist-a still runs 10 s after another holder took its shard:\n{}",
            world.joist.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = world.joist.log();
    assert_eq!(exit.code(), Some(2), "{log}");
    assert!(log.contains("another replica took the shard"), "{log}");
    assert_eq!(
        shard_holders(&client, 1).await[0].as_deref(),
        Some("intruder"),
        "a replica that lost its shard does not write it back"
    );
    let _ = world.joist.child.kill();
}

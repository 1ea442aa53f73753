//! `joist run` on the real control plane, as Karpenter's e2e suites check a node's life: both Helm
//! charts installed with the real helm, the controller out of cluster with a token of the chart's
//! own ServiceAccount (so the real RBAC authorizer refuses whatever the ClusterRole does not
//! grant) and the NodeRepair gate on, the KWOK cloud selling the types of a Karpenter KWOK instance-types file, the real
//! kube-scheduler binding pods and KWOK running them. Each test has a control plane of its own; they
//! run one at a time, as two would share this machine's two cores.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use joist_messages::apis::NodeClaim;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::api::{Api, ListParams};

use crate::{
    chart::run_helm,
    control_plane::{ControlPlane, KWOK_NODE_CLASS, client_from},
    joist_process::{Controller, shard_holders, within},
};

/// One test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a step may take: node boot (5 s), the batch windows, the disruption passes (every 10 s)
/// and the drains, on a loaded machine.
const STEP: Duration = Duration::from_secs(180);

/// A NodePool template's spec: amd64 on-demand nodes of the KWOK types' `c` and `s` families, of
/// the `default` EC2NodeClass.
const TEMPLATE_SPEC: &str = "      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64]}
        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
        - {key: karpenter.kwok.sh/instance-family, operator: In, values: [c, s]}
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
";

/// The NodePool and its EC2NodeClass, with the pool's `disruption` and `template` extras.
fn pool(disruption: &str, template: &str) -> String {
    let template_spec = TEMPLATE_SPEC;
    format!(
        r#"{KWOK_NODE_CLASS}---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: default}}
spec:
  template:
    spec:
{template_spec}{template}
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets: [{{nodes: "100%"}}]
{disruption}
"#
    )
}

/// The `inflate` Deployment of Karpenter's getting-started guide, at no replicas (the tests scale
/// it).
const INFLATE: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: inflate, namespace: default}
spec:
  replicas: 0
  selector: {matchLabels: {app: inflate}}
  template:
    metadata: {labels: {app: inflate}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: inflate
          image: registry.k8s.io/pause:3.10
          resources: {requests: {cpu: "1"}}
"#;

/// The node a pod is bound to.
fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A control plane with Joist's charts installed and `joist run` replicas on it.
struct World {
    cluster: ControlPlane,
    admin: kube::Client,
    /// A kubeconfig with a token of the chart's ServiceAccount.
    service_account: PathBuf,
}

impl World {
    /// A control plane named `name` with the charts, `pool` applied and the `inflate` Deployment.
    async fn start(name: &str, pool: &str) -> Self {
        Self::start_with(name, pool, &[]).await
    }

    /// [`World::start`] with the `joist` chart's `values` (`key=value`) set besides.
    async fn start_with(name: &str, pool: &str, values: &[&str]) -> Self {
        let cluster = ControlPlane::start(name);
        let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
        let endpoint = format!("settings.clusterEndpoint={}", cluster.server);
        let helm = |args: &[&str]| {
            let mut all = vec!["--kubeconfig", kubeconfig.as_str(), "--namespace", "kube-system"];
            all.extend_from_slice(args);
            let (ok, out, err) = run_helm(&all);
            assert!(ok, "helm {}: {err}{out}", args.join(" "));
        };
        helm(&["install", "joist-crd", "deploy/charts/joist-crd"]);
        // No replica in the cluster (its nodes are fake): the test runs the controller as the
        // chart's ServiceAccount. The KWOK cloud creates Nodes, which kubelets do in production.
        let mut install = vec![
            "install",
            "joist",
            "deploy/charts/joist",
            "--skip-crds",
            "--set",
            "settings.clusterName=kwok",
            "--set",
            &endpoint,
            "--set",
            "replicas=0",
            "--set-json",
            r#"additionalClusterRoleRules=[{"apiGroups":[""],"resources":["nodes"],"verbs":["create"]}]"#,
        ];
        for value in values {
            install.extend(["--set", value]);
        }
        helm(&install);
        let token = cluster.kubectl_ok(&[
            "create",
            "token",
            "joist",
            "-n",
            "kube-system",
            "--duration",
            "2h",
        ]);
        let service_account = cluster.dir().join("joist.kubeconfig");
        let ca = cluster.dir().join("pki/ca.crt");
        std::fs::write(
            &service_account,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kwok\n  cluster: {{server: {}, certificate-authority: {}}}\n\
                 users:\n- name: joist\n  user: {{token: {}}}\ncontexts:\n- name: joist\n  context: {{cluster: kwok, user: joist, namespace: kube-system}}\n\
                 current-context: joist\n",
                cluster.server,
                ca.display(),
                token.trim()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let admin = cluster.client().await;
        let world = Self {
            cluster,
            admin,
            service_account,
        };
        world.apply(pool);
        world.apply(INFLATE);
        world
    }

    /// `joist explain ARGS -o json` with the KWOK cloud, as the chart's ServiceAccount: the answer.
    fn explain(&self, args: &[&str]) -> serde_json::Value {
        let types = crate::control_plane::kwok_types();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_joist"))
            .arg("explain")
            .args(args)
            .args(["-o", "json", "--kubeconfig"])
            .arg(&self.service_account)
            .env("CLUSTER_NAME", "kwok")
            .env("CLUSTER_ENDPOINT", &self.cluster.server)
            .env("CLOUD_PROVIDER", "kwok")
            .env("INSTANCE_TYPES_FILE_PATH", &types)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap_or_else(|e| panic!("cannot run joist explain: {e}"));
        assert!(
            output.status.success(),
            "joist explain {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `kubectl apply` of `manifests` as cluster-admin.
    fn apply(&self, manifests: &str) {
        let file = self.cluster.dir().join("applied.yaml");
        std::fs::write(&file, manifests).unwrap_or_else(|e| panic!("{e}"));
        self.cluster.kubectl_ok(&["apply", "-f", &file.to_string_lossy()]);
    }

    /// A `joist run` replica named `name` with the KWOK cloud, as the chart's ServiceAccount.
    fn replica(&self, name: &str) -> Controller {
        self.replica_with(name, &[])
    }

    /// [`World::replica`] with `extra` settings.
    fn replica_with(&self, name: &str, extra: &[(&str, &str)]) -> Controller {
        let settings = [&[("FEATURE_GATES", "NodeRepair=true")], extra].concat();
        self.cluster.joist(&self.service_account, name, &settings)
    }

    fn scale(&self, replicas: u32) {
        self.cluster.kubectl_ok(&[
            "scale",
            "deployment",
            "inflate",
            "--replicas",
            &replicas.to_string(),
        ]);
    }

    /// The `inflate` pods once there are `count`, every one Running on a node.
    async fn running(&self, count: usize) -> Option<Vec<Pod>> {
        self.running_labelled("app=inflate", count).await
    }

    /// The pods `selector` selects once there are `count`, every one Running on a node.
    async fn running_labelled(&self, selector: &str, count: usize) -> Option<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let pods = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items;
        let running = pods.iter().filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        (running.count() == count && pods.len() == count).then_some(pods)
    }

    /// A control plane named `name` with `pool`, one replica `joist-a`, and `replicas` inflate pods
    /// Running; the guard keeps other tests out until it is dropped.
    async fn serving(
        name: &str,
        pool: &str,
        replicas: u32,
    ) -> (tokio::sync::MutexGuard<'static, ()>, Self, Controller, Vec<Pod>) {
        let one = ONE_AT_A_TIME.lock().await;
        let world = Self::start(name, pool).await;
        let joist = world.replica("joist-a");
        world.scale(replicas);
        let what = format!("{replicas} inflate pods Running");
        let pods = within(STEP, &joist, &what, || world.running(replicas as usize)).await;
        (one, world, joist, pods)
    }

    /// Whether the node `name` is still there.
    async fn has_node(&self, name: &str) -> bool {
        self.nodes()
            .await
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// Every object of a cluster-scoped kind (none while the API server does not answer).
    async fn all<K>(&self) -> Vec<K>
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope> + Clone + std::fmt::Debug,
        K: serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::all(self.admin.clone());
        api.list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    async fn nodes(&self) -> Vec<Node> {
        self.all().await
    }

    async fn claims(&self) -> Vec<NodeClaim> {
        self.all().await
    }

    /// The names of the NodeClaims.
    async fn claim_names(&self) -> BTreeSet<String> {
        self.claims()
            .await
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    }

    /// The CPUs of every node.
    async fn cpus(&self) -> i64 {
        self.nodes()
            .await
            .iter()
            .filter_map(|n| {
                n.status
                    .as_ref()?
                    .capacity
                    .as_ref()?
                    .get("cpu")?
                    .0
                    .parse::<i64>()
                    .ok()
            })
            .sum()
    }

    /// Each launched NodeClaim has an instance of its own and exactly one Node, and every Node
    /// belongs to a NodeClaim: nothing was launched twice or left behind.
    async fn assert_one_instance_per_claim(&self) {
        assert_one_instance_per_claim_of(self, &[]).await;
    }

    /// What breaks "one instance per claim, one Node per instance", if anything does.
    async fn instance_sharing(&self) -> Option<String> {
        let claims = self.claims().await;
        let launched: Vec<(Option<&String>, &String)> = claims
            .iter()
            .filter_map(|c| Some((c.metadata.name.as_ref(), c.status.as_ref()?.provider_id.as_ref()?)))
            .collect();
        let distinct: BTreeSet<&String> = launched.iter().map(|(_, id)| *id).collect();
        if distinct.len() != launched.len() {
            return Some(format!("two claims share an instance: {launched:?}"));
        }
        let node_ids: Vec<String> = self
            .nodes()
            .await
            .iter()
            .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
            .collect();
        let nodes: BTreeSet<&String> = node_ids.iter().collect();
        if nodes.len() != node_ids.len() {
            return Some(format!("two nodes share an instance: {node_ids:?}"));
        }
        (nodes != distinct).then(|| format!("nodes and claims differ: nodes {nodes:?}, claims {distinct:?}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_nodes_that_are_consolidated_then_removed_once_empty() {
    let (_one, world, joist, pods) = World::serving("provisioning", &pool("", ""), 5).await;
    let nodes = world.nodes().await;
    for node in pods.iter().filter_map(node_of) {
        let pooled = nodes.iter().any(|n| {
            n.metadata.name.as_deref() == Some(node)
                && n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.get("karpenter.sh/nodepool").map(String::as_str) == Some("default"))
        });
        assert!(pooled, "{node} is not a node of the default NodePool");
    }
    world.assert_one_instance_per_claim().await;
    let scaled_up = world.cpus().await;

    world.scale(1);
    within(STEP, &joist, "fewer CPUs for the one pod left", || async {
        let cpus = world.cpus().await;
        (cpus < scaled_up && world.running(1).await.is_some()).then_some(())
    })
    .await;

    world.scale(0);
    within(STEP, &joist, "every node removed once empty", || async {
        (world.claims().await.is_empty() && world.nodes().await.is_empty()).then_some(())
    })
    .await;
}

/// A volume in test-zone-c, its claim bound to it, and the `db` Deployment of one pod using it.
const VOLUME_IN_ZONE_C: &str = r#"apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-c}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  csi: {driver: ebs.csi.aws.com, volumeHandle: vol-c}
  claimRef: {namespace: default, name: db-data}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [test-zone-c]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: db-data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  resources: {requests: {storage: 10Gi}}
  volumeName: pv-c
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: db, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: db
          image: registry.k8s.io/pause:3.10
          resources: {requests: {cpu: "1"}}
      volumes:
        - name: data
          persistentVolumeClaim: {claimName: db-data}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_a_node_in_its_volumes_zone_where_kube_scheduler_binds_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let world = World::start("volumes", &pool("", "")).await;
    world.apply(VOLUME_IN_ZONE_C);
    let joist = world.replica("joist-a");
    let pods = within(STEP, &joist, "the db pod Running", || {
        world.running_labelled("app=db", 1)
    })
    .await;
    let node = node_of(&pods[0]).unwrap_or_default().to_owned();
    let zone = world
        .nodes()
        .await
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
        .and_then(|n| n.metadata.labels?.get("topology.kubernetes.io/zone").cloned());
    assert_eq!(zone.as_deref(), Some("test-zone-c"), "node {node}");
    world.assert_one_instance_per_claim().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_nodepool_template_replaces_every_drifted_node() {
    let (_one, world, joist, _) = World::serving("drift", &pool("", ""), 3).await;
    let before = world.claim_names().await;

    world.apply(&pool("", "    metadata: {labels: {rollout: second}}"));
    within(
        STEP,
        &joist,
        "every node replaced by one with the new label",
        || async {
            let claims = world.claim_names().await;
            let nodes = world.nodes().await;
            let relabelled = !nodes.is_empty()
                && nodes.iter().all(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("rollout"))
                        .map(String::as_str)
                        == Some("second")
                });
            (claims.is_disjoint(&before) && relabelled && world.running(3).await.is_some()).then_some(())
        },
    )
    .await;
    world.assert_one_instance_per_claim().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_node_is_replaced() {
    let (_one, world, joist, _) = World::serving("expiry", &pool("", "      expireAfter: 40s"), 1).await;
    let first = world.claim_names().await;
    within(
        STEP,
        &joist,
        "the pod Running on a node launched after the first expired",
        || async {
            let claims = world.claim_names().await;
            (!claims.is_empty() && claims.is_disjoint(&first) && world.running(1).await.is_some())
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_disruption_budget_holds_a_drain_until_it_allows_it() {
    let (_one, world, joist, pods) = World::serving("pdb", &pool("", ""), 2).await;
    world.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: inflate, namespace: default}\n\
         spec: {minAvailable: 2, selector: {matchLabels: {app: inflate}}}\n",
    );
    let node = node_of(&pods[0]).unwrap_or_default().to_owned();
    let claim = world
        .claims()
        .await
        .into_iter()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
        .and_then(|c| c.metadata.name)
        .unwrap_or_else(|| panic!("no NodeClaim for node {node}"));
    world
        .cluster
        .kubectl_ok(&["delete", "nodeclaim", &claim, "--wait=false"]);

    // The drain starts (the node is tainted), but the Eviction API refuses every eviction while the
    // budget allows none: nothing leaves the node for as long as that lasts.
    within(STEP, &joist, "the node tainted for its drain", || async {
        let nodes = world.nodes().await;
        let tainted = nodes.iter().any(|n| {
            n.metadata.name.as_deref() == Some(node.as_str())
                && n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == "karpenter.sh/disrupted"))
        });
        tainted.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let on_node = |pods: &[Pod]| pods.iter().filter(|p| node_of(p) == Some(node.as_str())).count();
    let held = world.running(2).await.unwrap_or_default();
    assert_eq!(
        on_node(&held),
        on_node(&pods),
        "a pod left node {node} although the budget allowed no disruption"
    );
    assert!(
        world.has_node(&node).await,
        "node {node} went while its drain was held"
    );

    // `joist explain`, with the controller's own identity (the chart's RBAC, through the real
    // authorizer), says what the node is waiting on.
    let answer = world.explain(&["node", &node]);
    assert_eq!(
        answer["standing"]["reason"], "its NodeClaim is being deleted",
        "{answer:#}"
    );
    assert_eq!(answer["nodeclaim"], claim.as_str(), "{answer:#}");
    // The controller's role writes Events but may not list them: the answer says what it could
    // not read, and still names the pods older than the node on it.
    let launched_for = &answer["launched_for"];
    assert!(
        launched_for["events_unreadable"]
            .as_str()
            .is_some_and(|why| why.contains("forbidden")),
        "{answer:#}"
    );
    assert_eq!(
        launched_for["older_pods_on_it"].as_array().map(Vec::len),
        Some(on_node(&pods)),
        "{answer:#}"
    );
    let pool = world.explain(&["nodepool", "default"]);
    assert_eq!(pool["nodes"]["deleting"], 1, "{pool:#}");

    world
        .cluster
        .kubectl_ok(&["delete", "poddisruptionbudget", "inflate", "-n", "default"]);
    within(
        STEP,
        &joist,
        "the node gone and its pods Running elsewhere",
        || async { (!world.has_node(&node).await && world.running(2).await.is_some()).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_warning_drains_the_node_before_it_is_reclaimed() {
    let (_one, world, joist, pods) = World::serving("interruption", &pool("", ""), 2).await;
    let node = node_of(&pods[0]).unwrap_or_default().to_owned();
    let before = world.claim_names().await;
    // The KWOK cloud puts EC2's two-minute warning for the node's instance on its queue.
    world
        .cluster
        .kubectl_ok(&["annotate", "node", &node, "kwok.joist.dev/interrupt=spot"]);
    within(
        STEP,
        &joist,
        "the warned node replaced and its pods Running elsewhere",
        || async {
            let gone = !world.has_node(&node).await;
            let claims = world.claim_names().await;
            let pods = world.running(2).await?;
            let moved = pods.iter().all(|p| node_of(p) != Some(node.as_str()));
            (gone && moved && claims != before).then_some(())
        },
    )
    .await;
    assert!(
        joist
            .log()
            .contains("interrupting the instance its node asks to be interrupted"),
        "{}",
        joist.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_broken_past_its_toleration_is_repaired() {
    let (_one, world, joist, pods) = World::serving("repair", &pool("", ""), 2).await;
    let node = node_of(&pods[0]).unwrap_or_default().to_owned();
    let before = world.claim_names().await;
    // The node's agent reports its networking broken for 31 minutes: past the 30 minutes the
    // repair policy tolerates. (KWOK keeps the condition: it only rewrites a node that is not Ready.)
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(31);
    let broken = format!(
        r#"{{"status":{{"conditions":[{{"type":"NetworkingReady","status":"False","reason":"IPAMExhausted",
            "message":"no addresses left","lastTransitionTime":"{since}","lastHeartbeatTime":"{since}"}}]}}}}"#
    );
    world
        .cluster
        .kubectl_ok(&["patch", "node", &node, "--subresource=status", "-p", &broken]);
    within(
        STEP,
        &joist,
        "the broken node replaced and its pods Running elsewhere",
        || async {
            let gone = !world.has_node(&node).await;
            let claims = world.claim_names().await;
            let pods = world.running(2).await?;
            let moved = pods.iter().all(|p| node_of(p) != Some(node.as_str()));
            (gone && moved && !claims.is_empty() && claims != before).then_some(())
        },
    )
    .await;
    world.assert_one_instance_per_claim().await;
}

/// The holder of the controller's Lease.
async fn leader(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases
        .get_opt("joist-leader-election")
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_takes_over_a_killed_leader_without_launching_twice() {
    let _one = ONE_AT_A_TIME.lock().await;
    let world = World::start("failover", &pool("", "")).await;
    let a = world.replica("joist-a");
    within(STEP, &a, "joist-a leading", || async {
        (leader(&world.admin).await.as_deref() == Some("joist-a")).then_some(())
    })
    .await;
    let b = world.replica("joist-b");
    within(STEP, &b, "joist-b standing by", || async {
        b.log().contains("standing by").then_some(())
    })
    .await;
    world.scale(3);
    within(STEP, &a, "three inflate pods Running", || world.running(3)).await;
    let before = world.claim_names().await;

    a.signal("-KILL");
    within(STEP, &b, "joist-b leading", || async {
        (leader(&world.admin).await.as_deref() == Some("joist-b")).then_some(())
    })
    .await;
    // Two disruption passes and a garbage collection later, the new leader still runs every node
    // the old one launched: it found their instances, it did not take them for leaks.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = world.claim_names().await;
    assert_eq!(
        before, after,
        "the new leader changed the nodes the old one launched"
    );
    assert!(
        world.running(3).await.is_some(),
        "the pods were disturbed by the failover"
    );
    world.scale(6);
    within(STEP, &b, "six inflate pods Running", || world.running(6)).await;
    world.assert_one_instance_per_claim().await;
    // The service account client is the one the controller used: it can read what it needs.
    let service_account = client_from(&world.service_account).await;
    let claims: Api<NodeClaim> = Api::all(service_account);
    assert!(claims.list(&ListParams::default()).await.is_ok());
}

/// A NodePool `team` of the default class whose nodes carry the label `team: {team}`.
fn team_pool(team: &str) -> String {
    let template_spec = TEMPLATE_SPEC;
    format!(
        r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {team}}}
spec:
  template:
    metadata: {{labels: {{team: {team}}}}}
    spec:
{template_spec}"#
    )
}

/// A one-CPU pod `name` labelled `app: teams` that only a node of `team` takes. A bare pod that
/// consolidation evicted would be gone for good (no controller makes it again), and the team
/// pools consolidate at once (`consolidateAfter: 0s`) a node whose pod fits beside an inflate
/// pod on another: it is `karpenter.sh/do-not-disrupt`, as the test counts pods, not moves.
fn team_pod(name: &str, team: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  labels: {{app: teams}}
  annotations: {{karpenter.sh/do-not-disrupt: "true"}}
spec:
  terminationGracePeriodSeconds: 0
  nodeSelector: {{team: {team}}}
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
      resources: {{requests: {{cpu: "1"}}}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_split_the_nodepools_and_take_over_the_shard_of_one_killed() {
    use joist_actors::state::replica_shards::shard_of;
    const SHARDS: u32 = 3;
    let _one = ONE_AT_A_TIME.lock().await;
    let world = World::start_with("shards", &pool("", ""), &["settings.replicaShards=3"]).await;
    // A NodePool in each shard, besides `default`.
    let teams: Vec<String> = (0..SHARDS)
        .filter_map(|shard| {
            (0..)
                .map(|i| format!("team-{i}"))
                .find(|t| shard_of(t, SHARDS) == shard)
        })
        .collect();
    world.apply(
        &teams
            .iter()
            .map(|t| team_pool(t))
            .collect::<Vec<_>>()
            .join("---\n"),
    );
    let sharded = [("REPLICA_SHARDS", "3")];
    let mut replicas: Vec<(String, Controller)> = ["joist-a", "joist-b", "joist-c"]
        .into_iter()
        .map(|name| (name.to_owned(), world.replica_with(name, &sharded)))
        .collect();
    let holders = within(STEP, &replicas[0].1, "every shard held, one each", || async {
        let holders: Vec<String> = shard_holders(&world.admin, SHARDS)
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        let distinct: BTreeSet<&String> = holders.iter().collect();
        (distinct.len() == 3).then_some(holders)
    })
    .await;

    // The inflate pods (every pool admits them: they belong to `default`) and one pod per team.
    world.scale(3);
    let pods: Vec<String> = teams.iter().map(|t| team_pod(&format!("web-{t}"), t)).collect();
    world.apply(&pods.join("---\n"));
    within(STEP, &replicas[0].1, "three inflate pods Running", || {
        world.running(3)
    })
    .await;
    within(STEP, &replicas[0].1, "a pod of every team Running", || {
        world.running_labelled("app=teams", teams.len())
    })
    .await;
    assert_one_instance_per_claim_of(&world, &replicas).await;

    // kill -9 the holder of the first team's shard: another replica takes the shard over within
    // 20 s and launches for that team.
    let shard = shard_of(&teams[0], SHARDS) as usize;
    let victim = replicas
        .iter()
        .position(|(name, _)| *name == holders[shard])
        .unwrap_or_else(|| panic!("{holders:?}"));
    let (victim, killed) = replicas.remove(victim);
    killed.signal("-KILL");
    let at = tokio::time::Instant::now();
    let survivor = &replicas[0].1;
    let taken_by = within(
        Duration::from_secs(20),
        survivor,
        "the killed replica's shard taken over",
        || async {
            let holder = shard_holders(&world.admin, SHARDS).await[shard].clone()?;
            (holder != victim).then_some(holder)
        },
    )
    .await;
    println!(
        "{taken_by} took shard {shard} over {:?} after kill -9",
        at.elapsed()
    );
    world.apply(&team_pod("web-after", &teams[0]));
    within(STEP, survivor, "the taken-over team's new pod Running", || {
        world.running_labelled("app=teams", teams.len() + 1)
    })
    .await;
    assert_one_instance_per_claim_of(&world, &replicas).await;
}

/// [`World::assert_one_instance_per_claim`], a failure showing what each of `replicas` logged, to
/// tell which wrote which claim's provider ID.
async fn assert_one_instance_per_claim_of(world: &World, replicas: &[(String, Controller)]) {
    if let Some(broken) = world.instance_sharing().await {
        let logs: Vec<String> = replicas
            .iter()
            .map(|(name, replica)| format!("--- {name} logged:\n{}", replica.log()))
            .collect();
        panic!("{broken}\n{}", logs.join("\n"));
    }
}

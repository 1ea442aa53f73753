//! The swap from Karpenter to Joist and back, on the real control plane. Karpenter v1.14.1's KWOK
//! controller (`scripts/karpenter-kwok`) provisions three NodePools' workload (205 pods), one pod
//! of it `karpenter.sh/do-not-disrupt` and another Deployment under a PodDisruptionBudget; Karpenter is
//! stopped, as `helm uninstall` with the CRDs kept stops it, and `joist run` with the KWOK cloud
//! takes over. Through the hand-off every NodeClaim, Node and pod stays as it was (nothing launched,
//! deleted or evicted by the swap itself); then Joist replaces a node of Karpenter's that gets a
//! spot interruption, consolidates what Karpenter left, replaces the nodes of a NodePool whose
//! template changed, and gives pending pods nodes. Then the way back:
//! Joist stopped, Karpenter started, nothing touched by that swap either, and Karpenter removes the
//! nodes Joist launched once they are empty and launches for pending pods beside them.
//!
//! The NodePools keep Karpenter's KWOK node class (`KWOKNodeClass`); Joist's KWOK cloud takes a
//! class's images and subnets from the EC2NodeClass of the same name, created beside it with
//! Joist's EC2NodeClass CRD (on EKS both controllers read the one EC2NodeClass).

use std::{collections::BTreeMap, process::Command, time::Duration};

use joist_messages::apis::NodeClaim;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    ResourceExt,
    api::{Api, ListParams},
};

use crate::{
    control_plane::{ControlPlane, KWOK_NODE_CLASS, kwok_types},
    joist_process::{Controller, within},
    tools::{root, succeeded},
};

/// What a step may take: node boot (5 s), the batch windows, the disruption passes and the
/// drains, on a loaded machine.
const STEP: Duration = Duration::from_secs(240);

/// How long the controller that took over is watched after it starts: its first reconcile of
/// every NodeClaim and Node, and several disruption passes (every 10 s, each command validated
/// for 15 s before it acts).
const HAND_OFF: Duration = Duration::from_secs(45);

/// The replicas of the workload's Deployments `web`, `batch` and `misc` at the start.
const WEB: u32 = 80;
const BATCH: u32 = 24;
const MISC: u32 = 100;

/// The NodePool `name`: on-demand amd64 nodes of 2 or 4 CPUs labelled `tier: NAME` (and
/// `extra_labels`), consolidated by `policy`, Karpenter's KWOK node class.
fn pool(name: &str, policy: &str, extra_labels: &str) -> String {
    format!(
        r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {name}}}
spec:
  template:
    metadata: {{labels: {{tier: {name}{extra_labels}}}}}
    spec:
      requirements:
        - {{key: kubernetes.io/arch, operator: In, values: [amd64]}}
        - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
        - {{key: karpenter.kwok.sh/instance-cpu, operator: In, values: ["2", "4"]}}
      nodeClassRef: {{group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}}
      expireAfter: Never
  disruption:
    consolidationPolicy: {policy}
    consolidateAfter: 0s
    budgets: [{{nodes: "100%"}}]
"#
    )
}

/// The Deployment `name` of `replicas` half-CPU pods on the nodes of NodePool `tier`, its pods
/// annotated with `annotations`.
fn deployment(name: &str, tier: &str, replicas: u32, annotations: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}, annotations: {{{annotations}}}}}
    spec:
      nodeSelector: {{tier: {tier}}}
      terminationGracePeriodSeconds: 0
      containers:
        - name: {name}
          image: registry.k8s.io/pause:3.10
          resources: {{requests: {{cpu: 500m}}}}
"#
    )
}

/// The workload, 205 pods: `web` and the do-not-disrupt `keep` on NodePool `web`, `batch` under a
/// budget of one unavailable pod on NodePool `batch`, and `misc` on NodePool `misc`.
fn workload() -> String {
    [
        deployment("web", "web", WEB, ""),
        deployment("keep", "web", 1, r#"karpenter.sh/do-not-disrupt: "true""#),
        deployment("batch", "batch", BATCH, ""),
        deployment("misc", "misc", MISC, ""),
        "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: batch, namespace: default}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: batch}}
"
        .to_owned(),
    ]
    .join("---\n")
}

/// What a swap must leave as it was: each NodeClaim and Node by name with its uid, each pod by
/// name with its uid and node.
#[derive(Debug, PartialEq)]
struct Held {
    claims: BTreeMap<String, String>,
    nodes: BTreeMap<String, String>,
    pods: BTreeMap<String, (String, String)>,
}

/// The local control plane with Karpenter's CRDs and KWOKNodeClass, Joist's EC2NodeClass CRD and
/// class, the NodePools and the workload.
struct Cluster {
    plane: ControlPlane,
    admin: kube::Client,
}

impl Cluster {
    async fn start() -> Self {
        let plane = ControlPlane::start("swap");
        let mut prepare = Command::new(root().join("scripts/karpenter-kwok"));
        prepare
            .arg("prepare")
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("NODE_REGISTRATION_DELAY", "5s");
        succeeded(&mut prepare, "scripts/karpenter-kwok prepare");
        let class_crd = "deploy/crds/karpenter.k8s.aws_ec2nodeclasses.yaml";
        plane.kubectl_ok(&["create", "-f", class_crd]);
        plane.kubectl_ok(&["wait", "--for", "condition=Established", "-f", class_crd]);
        let admin = plane.client().await;
        let cluster = Self { plane, admin };
        cluster.apply(&[
            KWOK_NODE_CLASS.to_owned(),
            pool("web", "WhenEmpty", ""),
            pool("batch", "WhenEmpty", ""),
            pool("misc", "WhenEmpty", ""),
            workload(),
        ]);
        cluster
    }

    /// `kubectl apply` of `manifests`.
    fn apply(&self, manifests: &[String]) {
        let file = self.plane.dir().join("applied.yaml");
        std::fs::write(&file, manifests.join("---\n")).unwrap_or_else(|e| panic!("{e}"));
        self.plane.kubectl_ok(&["apply", "-f", &file.to_string_lossy()]);
    }

    fn scale(&self, deployment: &str, replicas: u32) {
        let replicas = format!("--replicas={replicas}");
        self.plane
            .kubectl_ok(&["scale", "deployment", deployment, &replicas]);
    }

    /// Karpenter's KWOK controller, logging to `karpenter-N.log`.
    fn karpenter(&self, n: u32) -> Controller {
        let mut command = Command::new(root().join("scripts/karpenter-kwok"));
        command
            .arg("run")
            .env("KUBECONFIG", &self.plane.kubeconfig)
            .env("INSTANCE_TYPES_FILE_PATH", kwok_types());
        Controller::start(command, self.plane.dir().join(format!("karpenter-{n}.log")))
    }

    async fn claims(&self) -> Vec<NodeClaim> {
        listed(Api::all(self.admin.clone())).await
    }

    /// NodePool `pool`'s NodeClaims.
    async fn claims_of(&self, pool: &str) -> Vec<NodeClaim> {
        self.claims()
            .await
            .into_iter()
            .filter(|c| c.labels().get("karpenter.sh/nodepool").map(String::as_str) == Some(pool))
            .collect()
    }

    async fn nodes(&self) -> Vec<Node> {
        listed(Api::all(self.admin.clone())).await
    }

    async fn pods(&self) -> Vec<Pod> {
        listed(Api::namespaced(self.admin.clone(), "default")).await
    }

    /// Whether the `app` pods are `count`, every one Running on a node.
    async fn running(&self, app: &str, count: usize) -> bool {
        let pods = self.pods().await;
        let pods: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.labels().get("app").map(String::as_str) == Some(app))
            .collect();
        pods.len() == count
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
    }

    /// Every pod Running and no NodeClaim or Node being deleted: no disruption under way.
    async fn settled(&self) -> bool {
        let deleting = self
            .claims()
            .await
            .iter()
            .any(|c| c.metadata.deletion_timestamp.is_some())
            || self
                .nodes()
                .await
                .iter()
                .any(|n| n.metadata.deletion_timestamp.is_some());
        let pods = self.pods().await;
        !deleting
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
    }

    async fn held(&self) -> Held {
        let uid = |meta: &kube::api::ObjectMeta| meta.uid.clone().unwrap_or_default();
        Held {
            claims: self
                .claims()
                .await
                .iter()
                .map(|c| (c.name_any(), uid(&c.metadata)))
                .collect(),
            nodes: self
                .nodes()
                .await
                .iter()
                .map(|n| (n.name_any(), uid(&n.metadata)))
                .collect(),
            pods: self
                .pods()
                .await
                .iter()
                .map(|p| {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    (p.name_any(), (uid(&p.metadata), node.unwrap_or_default()))
                })
                .collect(),
        }
    }

    /// Watches the cluster for [`HAND_OFF`] after `controller` took over, failing as soon as a
    /// NodeClaim, Node or pod of `before` changes or one is added.
    async fn unchanged_through_hand_off(&self, before: &Held, controller: &Controller, who: &str) {
        let until = tokio::time::Instant::now() + HAND_OFF;
        while tokio::time::Instant::now() < until {
            let now = self.held().await;
            assert!(
                now == *before,
                "{who} changed the cluster it took over:\nbefore {before:#?}\nnow {now:#?}\n{who} logged:\n{}",
                controller.log()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Every object `api` lists (none while the API server does not answer).
async fn listed<K>(api: Api<K>) -> Vec<K>
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Stops `controller` as a Deployment's rollout or `helm uninstall` stops it: SIGTERM, then waits.
fn stop(mut controller: Controller) {
    controller.signal("-TERM");
    let _ = controller.child.wait();
}

#[tokio::test]
async fn karpenters_cluster_is_taken_over_by_joist_and_handed_back_with_nothing_relaunched_deleted_or_evicted()
 {
    let cluster = Cluster::start().await;

    // Karpenter provisions the workload.
    let karpenter = cluster.karpenter(1);
    for (app, count) in [("web", WEB), ("keep", 1), ("batch", BATCH), ("misc", MISC)] {
        let what = format!("Karpenter's nodes running {count} {app} pods");
        within(STEP, &karpenter, &what, || async {
            cluster.running(app, count as usize).await.then_some(())
        })
        .await;
    }
    within(STEP, &karpenter, "Karpenter's cluster settled", || async {
        cluster.settled().await.then_some(())
    })
    .await;
    stop(karpenter);
    let karpenters = cluster.held().await;
    let keep = |held: &Held| {
        held.pods
            .iter()
            .filter(|(name, _)| name.starts_with("keep-"))
            .map(|(name, pod)| (name.clone(), pod.clone()))
            .collect::<Vec<_>>()
    };
    let kept = keep(&karpenters);
    assert_eq!(kept.len(), 1, "{karpenters:#?}");

    // Joist takes over: nothing relaunched, deleted or evicted.
    let joist = cluster.plane.joist(&cluster.plane.kubeconfig, "joist", &[]);
    cluster
        .unchanged_through_hand_off(&karpenters, &joist, "joist")
        .await;

    // Joist's KWOK cloud knows the instances Karpenter launched: one of them interrupted is
    // replaced before it is reclaimed.
    let interrupted = cluster.claims_of("batch").await;
    let interrupted = interrupted.first().expect("a batch node");
    let node = interrupted
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("Karpenter's claim names its node");
    cluster.plane.kubectl_ok(&[
        "annotate",
        "node",
        &node,
        &format!("{}=spot", joist_provider_sim::kwok::INTERRUPT_ANNOTATION),
    ]);
    within(
        STEP,
        &joist,
        "Joist replacing Karpenter's interrupted node",
        || async {
            let gone = !cluster
                .claims()
                .await
                .iter()
                .any(|c| c.name_any() == interrupted.name_any());
            (gone && cluster.running("batch", BATCH as usize).await && cluster.settled().await).then_some(())
        },
    )
    .await;

    // Joist consolidates what Karpenter left once most of `web` is gone.
    let web_nodes = cluster.claims_of("web").await.len();
    cluster.apply(&[pool("web", "WhenEmptyOrUnderutilized", "")]);
    cluster.scale("web", 6);
    within(STEP, &joist, "Joist consolidating NodePool web", || async {
        let fewer = cluster.claims_of("web").await.len() < web_nodes;
        (fewer && cluster.running("web", 6).await && cluster.settled().await).then_some(())
    })
    .await;
    cluster.apply(&[pool("web", "WhenEmpty", "")]);

    // Joist replaces every node of NodePool batch once its template changed.
    let drifted: Vec<String> = cluster
        .claims_of("batch")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    cluster.apply(&[pool("batch", "WhenEmpty", ", rev: \"2\"")]);
    within(
        STEP,
        &joist,
        "Joist replacing the drifted nodes of NodePool batch",
        || async {
            let claims = cluster.claims_of("batch").await;
            let replaced = !claims.is_empty()
                && claims.iter().all(|c| {
                    !drifted.contains(&c.name_any()) && c.labels().get("rev").map(String::as_str) == Some("2")
                });
            (replaced && cluster.running("batch", BATCH as usize).await && cluster.settled().await)
                .then_some(())
        },
    )
    .await;

    // Joist gives pending pods nodes.
    let before_scale_up = cluster.held().await;
    cluster.scale("web", 20);
    within(STEP, &joist, "Joist's nodes running 20 web pods", || async {
        (cluster.running("web", 20).await && cluster.settled().await).then_some(())
    })
    .await;
    let joists_web: Vec<String> = cluster
        .claims_of("web")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .filter(|name| !before_scale_up.claims.contains_key(name))
        .collect();
    assert!(
        !joists_web.is_empty(),
        "Joist launched no node for 14 pending pods:\n{}",
        joist.log()
    );
    stop(joist);
    let joists = cluster.held().await;
    assert_eq!(keep(&joists), kept, "the do-not-disrupt pod was disrupted");

    // The way back: Karpenter takes over Joist's cluster, touching nothing.
    let karpenter = cluster.karpenter(2);
    cluster
        .unchanged_through_hand_off(&joists, &karpenter, "karpenter")
        .await;

    // Karpenter removes the nodes Joist launched once they are empty, and launches beside them.
    cluster.scale("web", 0);
    within(
        STEP,
        &karpenter,
        "Karpenter removing Joist's emptied web nodes",
        || async {
            let names: Vec<String> = cluster.claims().await.iter().map(ResourceExt::name_any).collect();
            joists_web
                .iter()
                .all(|claim| !names.contains(claim))
                .then_some(())
        },
    )
    .await;
    cluster.scale("batch", 32);
    within(
        STEP,
        &karpenter,
        "Karpenter's nodes running 32 batch pods",
        || async { cluster.running("batch", 32).await.then_some(()) },
    )
    .await;
    assert_eq!(
        keep(&cluster.held().await),
        kept,
        "the do-not-disrupt pod was disrupted"
    );
    stop(karpenter);
}

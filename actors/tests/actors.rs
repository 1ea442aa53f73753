//! Actor tests: mailbox floods (bounded, nothing lost that matters, the actor keeps serving) and
//! supervision (a failing NodeClaim actor is restarted without disturbing the others). Time is
//! paused tokio time, so windows and backoffs are exact.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use actix::prelude::*;
use joist_actors::{
    batcher::{BATCHER_MAILBOX, Batcher},
    catalog::{CATALOG_MAILBOX, Catalog},
    kube_ops,
    node_claim::MAX_CONSECUTIVE_FAILURES,
    protocol::{GetInstanceTypes, MarkUnavailable, PodPending, ProvisionBatch},
    read_model::PodKey,
    settings::{Settings, SolverMode},
};
use joist_kubesim::{Cluster, ClusterSettings, resources::GroupResource};
use joist_messages::{
    apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool},
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        quantity::Quantity,
        resources::{Resources, names},
    },
    time::Clock,
};
use joist_provider::{
    CloudError, CloudFuture, CloudProvider, Drift, Instance, InstanceState, Launch, OfferingKey,
};
use kube::{Api, api::PostParams};

/// The batches a Batcher sent, each a list of pod keys.
type Batches = Arc<Mutex<Vec<Vec<PodKey>>>>;

/// Collects the batches a Batcher sends.
struct Collector(Batches);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<ProvisionBatch> for Collector {
    type Result = ();
    fn handle(&mut self, msg: ProvisionBatch, _: &mut Self::Context) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(msg.pods);
    }
}

fn pod(i: usize) -> PodPending {
    PodPending {
        pod: ("default".to_owned(), format!("pod-{i}")),
    }
}

#[actix::test]
async fn a_pod_flood_is_bounded_deduplicated_and_batched_once() {
    tokio::time::pause();
    let batches = Arc::new(Mutex::new(Vec::new()));
    let collector = Collector(batches.clone()).start();
    let batcher = Batcher::new(&Settings::default(), collector.recipient()).start();
    tokio::task::yield_now().await;
    // 10,000 notifications, each pod twice, sent without yielding: the mailbox fills.
    let (mut accepted, mut full) = (0, 0);
    for i in 0..10_000 {
        match batcher.try_send(pod(i / 2)) {
            Ok(()) => accepted += 1,
            Err(SendError::Full(_)) => full += 1,
            Err(SendError::Closed(_)) => panic!("the batcher stopped"),
        }
    }
    assert!(full > 0, "a bounded mailbox must push back");
    assert!(
        accepted <= BATCHER_MAILBOX + 2,
        "accepted {accepted} > capacity {BATCHER_MAILBOX}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let batches = batches.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(batches.len(), 1, "one idle window, one batch");
    assert_eq!(batches[0].len(), accepted.div_ceil(2), "each pod once");
}

#[actix::test]
async fn a_busy_stream_of_pods_is_cut_at_the_max_window() {
    tokio::time::pause();
    let batches = Arc::new(Mutex::new(Vec::new()));
    let collector = Collector(batches.clone()).start();
    let batcher = Batcher::new(&Settings::default(), collector.recipient()).start();
    for i in 0..30 {
        batcher.do_send(pod(i));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sizes: Vec<usize> = batches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(Vec::len)
        .collect();
    assert_eq!(
        sizes,
        [20, 10],
        "a pod every 0.5 s never idles 1 s: the 10 s maximum closes the window"
    );
}

/// A cloud for tests: one instance type; listing types fails for NodePools named `broken`.
#[derive(Default)]
struct FakeCloud {
    broken_calls: AtomicUsize,
    launched: Mutex<Vec<String>>,
}

fn m5_large() -> InstanceType {
    InstanceType {
        name: "m5.large".into(),
        requirements: Default::default(),
        offerings: vec![Offering {
            zone: "zone-a".into(),
            capacity_type: CapacityType::OnDemand,
            price: 0.096,
            available: true,
            reservation_id: None,
        }],
        capacity: Resources::new().with(names::CPU, Quantity::from_units(2)),
        overhead: Default::default(),
    }
}

impl CloudProvider for FakeCloud {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn create<'a>(&'a self, claim: &'a NodeClaim, _types: &'a [InstanceType]) -> CloudFuture<'a, Launch> {
        Box::pin(async move {
            let name = claim.metadata.name.clone().unwrap_or_default();
            self.launched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(name.clone());
            Ok(Launch {
                instance: Instance {
                    provider_id: format!("fake:///{name}"),
                    instance_type: "m5.large".into(),
                    zone: "zone-a".into(),
                    capacity_type: CapacityType::OnDemand,
                    image_id: "ami-fake".into(),
                    price: 0.096,
                    state: InstanceState::Pending,
                    launched_at: 0,
                    tags: BTreeMap::new(),
                },
                capacity: m5_large().capacity,
                allocatable: m5_large().capacity,
                labels: BTreeMap::new(),
                unavailable: Vec::new(),
            })
        })
    }
    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            Err(CloudError::NodeClaimNotFound {
                provider_id: provider_id.to_owned(),
            })
        })
    }
    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance> {
        Box::pin(async move {
            Err(CloudError::NodeClaimNotFound {
                provider_id: provider_id.to_owned(),
            })
        })
    }
    fn list(&self) -> CloudFuture<'_, Vec<Instance>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn instance_types<'a>(
        &'a self,
        pool: &'a NodePool,
        _class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>> {
        Box::pin(async move {
            if pool.metadata.name.as_deref() == Some("broken") {
                self.broken_calls.fetch_add(1, Ordering::SeqCst);
                return Err(CloudError::Transient {
                    message: "the catalog API is down".into(),
                });
            }
            Ok(vec![m5_large()])
        })
    }
    fn resolve_node_class<'a>(&'a self, _class: &'a EC2NodeClass) -> CloudFuture<'a, EC2NodeClassStatus> {
        Box::pin(async { Ok(EC2NodeClassStatus::default()) })
    }
    fn is_drifted<'a>(&'a self, _claim: &'a NodeClaim) -> CloudFuture<'a, Option<Drift>> {
        Box::pin(async { Ok(None) })
    }
}

#[actix::test]
async fn the_catalog_survives_a_flood_and_still_applies_every_mark() {
    tokio::time::pause();
    let catalog = Catalog::new(Arc::new(FakeCloud::default())).start();
    tokio::task::yield_now().await;
    let mark = |zone: &str| MarkUnavailable {
        offerings: vec![OfferingKey {
            instance_type: "m5.large".into(),
            zone: zone.into(),
            capacity_type: CapacityType::OnDemand,
        }],
    };
    let mut full = 0;
    for _ in 0..1_000 {
        if catalog.try_send(mark("zone-b")).is_err() {
            full += 1;
        }
    }
    assert!(full >= 1_000 - CATALOG_MAILBOX - 2, "only {} refused", full);
    catalog.do_send(mark("zone-a"));
    let pool: NodePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "good"},
        "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let types = catalog
        .send(GetInstanceTypes {
            node_pool: Arc::new(pool),
            node_class: Arc::new(class),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !types[0].offerings[0].available,
        "the mark sent after the flood was applied"
    );
}

async fn create<K>(api: &Api<K>, value: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

#[actix::test]
async fn a_failing_nodeclaim_actor_is_restarted_and_the_others_carry_on() {
    tokio::time::pause();
    let clock = Clock::starting_at(1_767_225_600);
    let cluster = Cluster::start(ClusterSettings {
        clock,
        ..ClusterSettings::default()
    });
    let crds = GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions");
    for (_, crd) in joist_messages::apis::crds() {
        let crd = serde_json::to_value(&crd).unwrap_or_default();
        cluster
            .store()
            .create(&crds, "", crd, false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let client = cluster.client();
    let cloud = Arc::new(FakeCloud::default());
    let settings = Settings {
        solver: SolverMode::Inline,
        ..Settings::default()
    };
    let controllers = joist_actors::start(client.clone(), cloud.clone(), settings, clock);
    let classes: Api<EC2NodeClass> = kube_ops::cluster(&client);
    create(&classes, serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
    }))
    .await;
    let pools: Api<NodePool> = kube_ops::cluster(&client);
    let claims: Api<NodeClaim> = kube_ops::cluster(&client);
    for name in ["broken", "good"] {
        create(&pools, serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        }))
        .await;
        create(&claims, serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": format!("{name}-claim"), "labels": {"karpenter.sh/nodepool": name}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
        }))
        .await;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = cloud.broken_calls.load(Ordering::SeqCst);
    assert!(
        calls > MAX_CONSECUTIVE_FAILURES as usize,
        "the failing actor tried {calls} times: it should have been restarted and kept trying"
    );
    let directory = &controllers.shared.directory.node_claims;
    let broken = directory.get("broken-claim").map(|a| a.connected());
    assert_eq!(broken, Some(true), "the restarted actor is still reachable");
    let launched = cloud.launched.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        launched,
        ["good-claim"],
        "the healthy claim launched despite its neighbour"
    );
    let good = claims.get("good-claim").await.unwrap_or_else(|e| panic!("{e}"));
    let provider = good.status.and_then(|s| s.provider_id);
    assert_eq!(provider.as_deref(), Some("fake:///good-claim"));
}

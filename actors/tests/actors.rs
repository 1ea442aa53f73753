//! Actor tests: mailbox floods (bounded, nothing lost that matters, the actor keeps serving),
//! supervision (a failing NodeClaim actor is restarted without disturbing the others), garbage
//! collection of leaked instances, and NodePool actors sharded over arbiters. Time is paused tokio
//! time, so windows and backoffs are exact, except for the sharding test: other arbiters run their
//! own runtimes on real time.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use actix::prelude::*;
use joist_actors::{
    batcher::{BATCHER_MAILBOX, Batcher},
    catalog::{CATALOG_MAILBOX, Catalog},
    effects::kube_ops,
    effects::metrics::{CategoryLabels, Metrics},
    effects::node_trace::NodeTracer,
    node_claim::{MAX_CONSECUTIVE_FAILURES, NODE_CLAIM_MAILBOX},
    node_pool::NODE_POOL_MAILBOX,
    protocol::{GetInstanceTypes, MarkUnavailable, PodPending, ProvisionBatch, Reconcile},
    provisioner::PROVISIONER_MAILBOX,
    settings::{Settings, SolverMode},
    state::read_model::ReadModel,
};
use joist_kubesim::{Cluster, ClusterSettings, resources::GroupResource};
use joist_messages::{
    apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodeOverlay, NodePool},
    conditions::{ConditionType, is_true},
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        quantity::Quantity,
        resources::{Resources, names},
    },
    time::Clock,
};
use joist_provider::{
    CloudError, CloudFuture, CloudProvider, Drift, Instance, InstanceState, Launch, OfferingKey,
    instance_status::{InstanceHealth, StatusCategory, StatusCheck},
};
use kube::{Api, api::PostParams};

/// Metrics no test reads.
fn metrics() -> Metrics {
    Metrics::new(ReadModel::new().0)
}

/// The batches a Batcher sent, each its count of pods.
type Batches = Arc<Mutex<Vec<usize>>>;

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
    let batcher = Batcher::new(&Settings::default(), collector.recipient(), metrics()).start();
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
    assert_eq!(batches[0], accepted.div_ceil(2), "each pod once");
}

#[actix::test]
async fn a_busy_stream_of_pods_is_cut_at_the_max_window() {
    tokio::time::pause();
    let batches = Arc::new(Mutex::new(Vec::new()));
    let collector = Collector(batches.clone()).start();
    let batcher = Batcher::new(&Settings::default(), collector.recipient(), metrics()).start();
    for i in 0..30 {
        batcher.do_send(pod(i));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sizes: Vec<usize> = batches.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        sizes,
        [20, 10],
        "a pod every 0.5 s never idles 1 s: the 10 s maximum closes the window"
    );
}

/// A cloud for tests: one instance type; listing types fails for NodePools named `broken`;
/// launched instances are kept until deleted; status checks report `impaired`, or are refused
/// as not permitted while `status_refused` holds.
#[derive(Default)]
struct FakeCloud {
    broken_calls: AtomicUsize,
    listings: AtomicUsize,
    launched: Mutex<Vec<String>>,
    instances: Mutex<BTreeMap<String, Instance>>,
    deleted: Mutex<Vec<String>>,
    impaired: Mutex<Vec<InstanceHealth>>,
    status_refused: AtomicBool,
    status_asks: AtomicUsize,
    reclaimed: Mutex<Vec<String>>,
}

fn instance(provider_id: &str, launched_at: i64) -> Instance {
    Instance {
        provider_id: provider_id.to_owned(),
        instance_type: "m5.large".into(),
        zone: "zone-a".into(),
        capacity_type: CapacityType::OnDemand,
        reservation: None,
        image_id: "ami-fake".into(),
        price: 0.096,
        state: InstanceState::Running,
        launched_at,
        tags: BTreeMap::new(),
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
            reservation: None,
        }],
        capacity: Resources::new()
            .with(names::CPU, Quantity::from_units(2))
            .with(names::PODS, Quantity::from_units(29)),
        overhead: Default::default(),
    }
}

impl CloudProvider for FakeCloud {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn create<'a>(
        &'a self,
        claim: &'a NodeClaim,
        _node_class: Option<&'a EC2NodeClass>,
        _types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Launch> {
        Box::pin(async move {
            let name = claim.metadata.name.clone().unwrap_or_default();
            locked(&self.launched).push(name.clone());
            let mut instance = instance(&format!("fake:///{name}"), EPOCH);
            let label = |key: &str| claim.metadata.labels.as_ref().and_then(|l| l.get(key));
            if let Some(capacity_type) =
                label("karpenter.sh/capacity-type").and_then(|c| CapacityType::from_label(c))
            {
                instance.capacity_type = capacity_type;
            }
            locked(&self.instances).insert(instance.provider_id.clone(), instance.clone());
            let mut labels = BTreeMap::from([
                (
                    "node.kubernetes.io/instance-type".to_owned(),
                    "m5.large".to_owned(),
                ),
                ("topology.kubernetes.io/zone".to_owned(), "zone-a".to_owned()),
                ("karpenter.sh/capacity-type".to_owned(), "on-demand".to_owned()),
            ]);
            // As every provider does: the claim's own labels go with the node's.
            labels.extend(
                claim
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            Ok(Launch {
                instance,
                capacity: m5_large().capacity,
                allocatable: m5_large().capacity,
                labels,
                unavailable: Vec::new(),
            })
        })
    }
    fn find_launch<'a>(
        &'a self,
        _claim: &'a NodeClaim,
        _types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Option<Launch>> {
        Box::pin(async { Ok(None) })
    }
    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            locked(&self.deleted).push(provider_id.to_owned());
            match locked(&self.instances).remove(provider_id) {
                Some(_) => Ok(()),
                None => Err(CloudError::NodeClaimNotFound {
                    provider_id: provider_id.to_owned(),
                }),
            }
        })
    }
    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance> {
        Box::pin(async move {
            locked(&self.instances)
                .get(provider_id)
                .cloned()
                .ok_or_else(|| CloudError::NodeClaimNotFound {
                    provider_id: provider_id.to_owned(),
                })
        })
    }
    fn list(&self) -> CloudFuture<'_, Vec<Instance>> {
        Box::pin(async { Ok(locked(&self.instances).values().cloned().collect()) })
    }
    fn instance_types<'a>(
        &'a self,
        pool: &'a NodePool,
        _class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>> {
        Box::pin(async move {
            self.listings.fetch_add(1, Ordering::SeqCst);
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
    fn resolve_placement_group<'a>(
        &'a self,
        _node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<joist_provider::placement_group::PlacementGroup>> {
        Box::pin(async { Ok(None) })
    }
    fn is_drifted<'a>(
        &'a self,
        _claim: &'a NodeClaim,
        _node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<Drift>> {
        Box::pin(async { Ok(None) })
    }
    fn name_instance<'a>(&'a self, provider_id: &'a str, node_name: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let mut instances = locked(&self.instances);
            let instance = instances
                .get_mut(provider_id)
                .ok_or_else(|| CloudError::NodeClaimNotFound {
                    provider_id: provider_id.to_owned(),
                })?;
            instance.tags.insert("Name".into(), node_name.into());
            Ok(())
        })
    }

    fn repair_policies(&self) -> &'static [joist_provider::repair::RepairPolicy] {
        joist_provider::repair::EC2_REPAIR_POLICIES
    }

    fn reserved_capacity(&self) -> std::collections::HashMap<String, u32> {
        std::collections::HashMap::new()
    }

    fn reservation_reclaimed(&self, id: &str) {
        locked(&self.reclaimed).push(id.to_owned());
    }

    fn impaired_instances(&self) -> CloudFuture<'_, Vec<InstanceHealth>> {
        Box::pin(async move {
            self.status_asks.fetch_add(1, Ordering::SeqCst);
            if self.status_refused.load(Ordering::SeqCst) {
                return Err(CloudError::NotPermitted {
                    operation: "DescribeInstanceStatus".into(),
                    message: "UnauthorizedOperation".into(),
                });
            }
            Ok(locked(&self.impaired).clone())
        })
    }
}

#[actix::test]
async fn the_catalog_survives_a_flood_and_still_applies_every_mark() {
    tokio::time::pause();
    let catalog = Catalog::new(Arc::new(FakeCloud::default()), true).start();
    tokio::task::yield_now().await;
    let mark = |zone: &str| MarkUnavailable {
        offerings: vec![OfferingKey {
            instance_type: "m5.large".into(),
            zone: zone.into(),
            capacity_type: CapacityType::OnDemand,
            placement_group: None,
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

#[actix::test]
async fn the_catalog_lists_again_for_a_spec_change_not_for_a_status_write() {
    let cloud = Arc::new(FakeCloud::default());
    let catalog = Catalog::new(cloud.clone(), true).start();
    let pool = |generation: i64, resource_version: &str| -> Arc<NodePool> {
        Arc::new(serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "good", "generation": generation, "resourceVersion": resource_version},
            "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        })).unwrap_or_else(|e| panic!("{e}")))
    };
    let class: Arc<EC2NodeClass> = Arc::new(serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default", "resourceVersion": "7"},
        "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
    })).unwrap_or_else(|e| panic!("{e}")));
    let list = async |node_pool: Arc<NodePool>| {
        catalog
            .send(GetInstanceTypes {
                node_pool,
                node_class: class.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        cloud.listings.load(Ordering::SeqCst)
    };
    assert_eq!(list(pool(1, "10")).await, 1);
    assert_eq!(list(pool(1, "11")).await, 1, "a status write keeps the list");
    assert_eq!(list(pool(2, "12")).await, 2, "a spec change lists again");
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

/// The Unix time the tests' clocks start at: 2026-01-01T00:00:00Z.
const EPOCH: i64 = 1_767_225_600;

/// kubesim with Joist's CRDs, a fake cloud and every controller running.
struct World {
    cluster: Cluster,
    client: kube::Client,
    cloud: Arc<FakeCloud>,
    controllers: joist_actors::Controllers,
}

fn world(settings: Settings) -> World {
    world_over(cluster(), settings)
}

/// kubesim with Joist's CRDs, no controllers yet.
fn cluster() -> Cluster {
    let cluster = Cluster::start(ClusterSettings {
        clock: Clock::starting_at(EPOCH),
        ..ClusterSettings::default()
    });
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
}

/// Every controller started over `cluster`, as it stands.
fn world_over(cluster: Cluster, settings: Settings) -> World {
    let clock = *cluster.store().clock();
    let client = cluster.client();
    let cloud = Arc::new(FakeCloud::default());
    let settings = Settings {
        solver: SolverMode::Inline,
        ..settings
    };
    let controllers = joist_actors::start(
        client.clone(),
        cloud.clone(),
        settings,
        clock,
        NodeTracer::disabled(),
    );
    World {
        cluster,
        client,
        cloud,
        controllers,
    }
}

impl World {
    async fn node_class(&self) {
        create(&kube_ops::cluster::<EC2NodeClass>(&self.client), serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
        }))
        .await;
    }

    async fn node_pool(&self, name: &str) {
        create(&kube_ops::cluster::<NodePool>(&self.client), serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        }))
        .await;
    }

    async fn node_claim(&self, name: &str, pool: &str) {
        create(&self.claims(), serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
        }))
        .await;
    }

    /// An unschedulable pod asking for one CPU, written straight into the store.
    fn pending_pod(&self, name: &str) {
        let pods = GroupResource::new("", "pods");
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "pause", "image": "pause", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        });
        self.cluster
            .store()
            .create(&pods, "default", pod, false)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn claims(&self) -> Api<NodeClaim> {
        kube_ops::cluster(&self.client)
    }

    /// NodePool `default` with no budget for voluntary disruption: only what a test makes happen
    /// removes a node.
    async fn pool_without_budget(&self) {
        create(&kube_ops::cluster::<NodePool>(&self.client), serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {
                "template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}},
                "disruption": {"budgets": [{"nodes": "0"}]}
            }
        }))
        .await;
    }

    /// A registered NodeClaim `name` of pool `default` with a Ready Node `{name}-node`, launched
    /// by the fake cloud as instance `name`.
    async fn registered_claim(&self, name: &str) {
        create(&self.claims(), serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default"}, "finalizers": ["karpenter.sh/termination"]},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
        }))
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("{name}-node")},
            "spec": {"providerID": format!("fake:///{name}")},
            "status": {"allocatable": {"cpu": "2", "pods": "29"}, "conditions": [{"type": "Ready", "status": "True"}]},
        });
        self.cluster
            .store()
            .create(&GroupResource::new("", "nodes"), "", node, false)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn claim_names(&self) -> Vec<String> {
        let list = self.claims().list(&Default::default()).await;
        let list = list.unwrap_or_else(|e| panic!("{e}"));
        list.items.into_iter().filter_map(|c| c.metadata.name).collect()
    }
}

/// Offers `count` copies of `message` without yielding; returns how many the mailbox took.
fn flood<M>(actor: &Recipient<M>, count: usize, message: impl Fn() -> M) -> usize
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    let mut accepted = 0;
    for _ in 0..count {
        match actor.try_send(message()) {
            Ok(()) => accepted += 1,
            Err(SendError::Full(_)) => {}
            Err(SendError::Closed(_)) => panic!("the actor stopped during the flood"),
        }
    }
    accepted
}

#[actix::test]
async fn a_failing_nodeclaim_actor_is_restarted_and_the_others_carry_on() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    for name in ["broken", "good"] {
        world.node_pool(name).await;
        world.node_claim(&format!("{name}-claim"), name).await;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = world.cloud.broken_calls.load(Ordering::SeqCst);
    assert!(
        calls > MAX_CONSECUTIVE_FAILURES as usize,
        "the failing actor tried {calls} times: it should have been restarted and kept trying"
    );
    let directory = &world.controllers.shared.directory.node_claims;
    let broken = directory.get("broken-claim").map(|a| a.connected());
    assert_eq!(broken, Some(true), "the restarted actor is still reachable");
    let launched = locked(&world.cloud.launched).clone();
    assert_eq!(
        launched,
        ["good-claim"],
        "the healthy claim launched despite its neighbour"
    );
    let good = world
        .claims()
        .get("good-claim")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let provider = good.status.and_then(|s| s.provider_id);
    assert_eq!(provider.as_deref(), Some("fake:///good-claim"));
    // A failure that persists is retried ever more slowly across restarts: twenty more minutes
    // bring a handful of calls (the backoff is capped at five minutes), not hundreds.
    tokio::time::sleep(Duration::from_secs(20 * 60)).await;
    let later = world.cloud.broken_calls.load(Ordering::SeqCst) - calls;
    assert!(
        (1..=8).contains(&later),
        "{later} calls in twenty minutes: the restart must keep the backoff"
    );
}

#[actix::test]
async fn a_ready_nodepool_has_its_instance_types_listed_before_a_pod_waits() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    world.node_pool("default").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let listings = || world.cloud.listings.load(Ordering::SeqCst);
    assert_eq!(listings(), 1, "listed once the pool is Ready, and once only");
    world.pending_pod("first");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(world.claim_names().await.len(), 1);
    assert_eq!(listings(), 1, "the first pass found the pool's types listed");
}

#[actix::test]
async fn a_provisioner_flood_is_bounded_and_folds_into_one_nodeclaim() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    world.node_pool("default").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    world.pending_pod("lonely");
    let batch = || ProvisionBatch { pods: 1 };
    let accepted = flood(&world.controllers.provisioner.clone().recipient(), 1_000, batch);
    assert!(
        (1..=PROVISIONER_MAILBOX + 2).contains(&accepted),
        "accepted {accepted} of 1,000 batches; capacity {PROVISIONER_MAILBOX}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        world.claim_names().await.len(),
        1,
        "every batch after the first sees the claim in flight: one pod, one NodeClaim"
    );
}

#[actix::test]
async fn a_nodepool_flood_is_bounded_and_its_status_still_lands() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_pool("default").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let actor = world
        .controllers
        .shared
        .directory
        .node_pools
        .get("default")
        .map(|a| a.clone());
    let actor = actor.unwrap_or_else(|| panic!("no actor for the nodepool"));
    let accepted = flood(&actor.reconcile, 1_000, || Reconcile);
    assert!(
        accepted <= NODE_POOL_MAILBOX + 2,
        "accepted {accepted} of 1,000 pokes; capacity {NODE_POOL_MAILBOX}"
    );
    // The node class arrives after the flood: the pool must still turn Ready.
    world.node_class().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pool = kube_ops::cluster::<NodePool>(&world.client).get("default").await;
    let conditions = pool
        .unwrap_or_else(|e| panic!("{e}"))
        .status
        .unwrap_or_default()
        .conditions;
    assert!(is_true(&conditions, ConditionType::Ready), "{conditions:#?}");
}

#[actix::test]
async fn an_invalid_node_class_is_not_ready_launches_nothing_and_says_why_once() {
    tokio::time::pause();
    let world = world(Settings::default());
    // No primary interface: the API server refuses it now, but an object stored under an older
    // CRD can still hold it, so it goes into the store as such an object would be there.
    world
        .cluster
        .store()
        .create(
            &GroupResource::new("karpenter.k8s.aws", "ec2nodeclasses"),
            "",
            serde_json::json!({
                "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
                "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                         "networkInterfaces": [{"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"}],
                         "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
            }),
            false,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    world.node_pool("default").await;
    world.pending_pod("web");
    tokio::time::sleep(Duration::from_secs(90)).await;
    let class = kube_ops::cluster::<EC2NodeClass>(&world.client)
        .get("default")
        .await;
    let conditions = class
        .unwrap_or_else(|e| panic!("{e}"))
        .status
        .unwrap_or_default()
        .conditions;
    let validation = conditions.iter().find(|c| c.type_ == "ValidationSucceeded");
    assert!(
        validation.is_some_and(|c| c.status == "False"
            && c.reason == "ValidationFailed"
            && c.message
                .contains("spec.networkInterfaces: networkInterfaces needs the primary interface")),
        "{conditions:#?}"
    );
    assert!(!is_true(&conditions, ConditionType::Ready), "{conditions:#?}");
    assert_eq!(
        world.claim_names().await,
        Vec::<String>::new(),
        "nothing launches for it"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::all(world.client.clone())
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let warned = events.items.iter().filter(|e| {
        e.reason.as_deref() == Some("ValidationFailed")
            && e.involved_object.kind.as_deref() == Some("EC2NodeClass")
    });
    assert_eq!(warned.count(), 1, "one warning, not one per refresh");
}

/// Objects that exist when Joist starts reach it in its watches' first lists; each is acted on
/// once the read model holds it. Before, the NodePool actors were told of listed pools before the
/// store had them (past actix's 16 stream items per turn), found nothing and stopped: with 20
/// pools, most never became Ready and their pods never got nodes.
#[actix::test]
async fn every_node_pool_listed_at_startup_becomes_ready() {
    tokio::time::pause();
    let cluster = cluster();
    let store = cluster.store().clone();
    let pools = GroupResource::new("karpenter.sh", "nodepools");
    let classes = GroupResource::new("karpenter.k8s.aws", "ec2nodeclasses");
    let class = serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]}
    });
    store
        .create(&classes, "", class, false)
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..20 {
        let pool = serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": format!("pool-{i:02}")},
            "spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        });
        store
            .create(&pools, "", pool, false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let world = world_over(cluster, Settings::default());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let listed = kube_ops::cluster::<NodePool>(&world.client)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let not_ready: Vec<String> = listed
        .items
        .iter()
        .filter(|p| {
            !p.status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, ConditionType::Ready))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(listed.items.len(), 20);
    assert!(not_ready.is_empty(), "never Ready: {not_ready:?}");
}

/// Two overlays of one weight that reprice the same offerings: the earlier name is marked
/// `Conflict` and stays so (no writer undoes it), the other is valid, and the conflict clears once
/// its cause is deleted.
#[actix::test]
async fn a_conflicted_overlay_is_marked_once_and_cleared_when_its_cause_goes() {
    tokio::time::pause();
    let world = world(Settings {
        node_overlay: true,
        ..Settings::default()
    });
    world.node_class().await;
    world.node_pool("default").await;
    let overlays = kube_ops::cluster::<NodeOverlay>(&world.client);
    for name in ["a-cheaper", "b-cheaper"] {
        create(
            &overlays,
            serde_json::json!({
                "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": name},
                "spec": {"requirements": [], "priceAdjustment": "-10%"}
            }),
        )
        .await;
    }
    world.pending_pod("web");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let validation = |name: &'static str| {
        let overlays = overlays.clone();
        async move {
            let overlay = overlays.get(name).await.unwrap_or_else(|e| panic!("{e}"));
            let version = overlay.metadata.resource_version.clone();
            let condition = overlay
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .find(|c| c.type_ == "ValidationSucceeded")
                .map(|c| (c.status, c.reason));
            (condition, version)
        }
    };
    let (conflicted, version) = validation("a-cheaper").await;
    assert_eq!(conflicted, Some(("False".to_owned(), "Conflict".to_owned())));
    let (valid, _) = validation("b-cheaper").await;
    assert_eq!(valid, Some(("True".to_owned(), "ValidationSucceeded".to_owned())));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        validation("a-cheaper").await.1,
        version,
        "its status is not rewritten"
    );

    overlays
        .delete("b-cheaper", &Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    world.pending_pod("api");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (cleared, _) = validation("a-cheaper").await;
    assert_eq!(
        cleared,
        Some(("True".to_owned(), "ValidationSucceeded".to_owned()))
    );
}

#[actix::test]
async fn a_nodeclaim_flood_is_bounded_and_launches_once() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    world.node_pool("default").await;
    world.node_claim("flooded", "default").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let actor = world
        .controllers
        .shared
        .directory
        .node_claims
        .get("flooded")
        .map(|a| a.clone());
    let actor = actor.unwrap_or_else(|| panic!("no actor for the nodeclaim"));
    let accepted = flood(&actor, 1_000, || Reconcile);
    assert!(
        accepted <= NODE_CLAIM_MAILBOX + 2,
        "accepted {accepted} of 1,000 pokes; capacity {NODE_CLAIM_MAILBOX}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        locked(&world.cloud.launched).clone(),
        ["flooded"],
        "one launch, however many pokes"
    );
    let claim = world
        .claims()
        .get("flooded")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let conditions = claim.status.unwrap_or_default().conditions;
    assert!(is_true(&conditions, ConditionType::Launched), "{conditions:#?}");
}

#[actix::test]
async fn a_watch_flood_of_pods_reaches_the_read_model_whole() {
    tokio::time::pause();
    let world = world(Settings::default());
    for i in 0..2_000 {
        world.pending_pod(&format!("pod-{i}"));
    }
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(world.controllers.shared.read.pending_pods().len(), 2_000);
}

#[actix::test]
async fn leaked_instances_are_terminated_and_claimed_ones_kept() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    world.node_pool("default").await;
    world.node_claim("kept", "default").await;
    let leaked = instance("fake:///leaked", EPOCH - 600);
    let young = instance("fake:///young", EPOCH + 235);
    for orphan in [&leaked, &young] {
        locked(&world.cloud.instances).insert(orphan.provider_id.clone(), orphan.clone());
    }
    tokio::time::sleep(Duration::from_secs(250)).await;
    let remaining: Vec<String> = locked(&world.cloud.instances).keys().cloned().collect();
    assert_eq!(
        remaining,
        ["fake:///kept", "fake:///young"],
        "the orphan is terminated; the claimed instance and the one inside its grace period stay"
    );
    assert_eq!(locked(&world.cloud.deleted).clone(), ["fake:///leaked"]);
}

#[actix::test]
async fn a_registered_claim_whose_instance_is_gone_is_deleted_unless_its_node_is_ready() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    // No budget for voluntary disruption: only the garbage collector removes an empty node here.
    world.pool_without_budget().await;
    let nodes = GroupResource::new("", "nodes");
    for name in ["gone", "alive"] {
        world.registered_claim(name).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for name in ["gone", "alive"] {
        let claim = world.claims().get(name).await.unwrap_or_else(|e| panic!("{e}"));
        let conditions = claim.status.map(|s| s.conditions).unwrap_or_default();
        assert!(
            is_true(&conditions, ConditionType::Registered),
            "{name} registered: {conditions:?}"
        );
    }
    // Both instances are terminated behind Joist's back; one kubelet stops posting Ready.
    locked(&world.cloud.instances).clear();
    let key = joist_kubesim::store::ObjectKey::new("", "gone-node");
    world
        .cluster
        .store()
        .modify(&nodes, &key, joist_kubesim::store::Part::Status, false, |node| {
            let mut node = node.clone();
            node["status"]["conditions"] = serde_json::json!([{"type": "Ready", "status": "Unknown"}]);
            Ok(node)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_secs(150)).await;
    assert_eq!(
        world.claim_names().await,
        ["alive"],
        "the claim without an instance or a Ready node is deleted; a Ready node's claim is kept"
    );
}

#[actix::test]
async fn nodepool_actors_sharded_over_arbiters_do_their_work() {
    let world = world(Settings {
        shards: 2,
        ..Settings::default()
    });
    world.node_class().await;
    let pools = ["a", "b", "c"];
    for name in pools {
        world.node_pool(name).await;
    }
    let api = kube_ops::cluster::<NodePool>(&world.client);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut ready = 0;
        for name in pools {
            let pool = api.get(name).await.unwrap_or_else(|e| panic!("{e}"));
            let conditions = pool.status.unwrap_or_default().conditions;
            ready += usize::from(is_true(&conditions, ConditionType::Ready));
        }
        if ready == pools.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ready} of 3 sharded nodepools turned Ready in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world.pending_pod("placed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while world.claim_names().await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NodeClaim from a sharded nodepool in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix::test]
async fn events_are_written_once_per_two_minutes_then_counted_on_the_first_event() {
    tokio::time::pause();
    let world = world(Settings::default());
    let events = joist_actors::effects::events::Events::start(
        world.client.clone(),
        Clock::starting_at(EPOCH),
        metrics(),
    );
    let pods: Vec<k8s_openapi::api::core::v1::Pod> = (0..5_000)
        .map(|i| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "default", "uid": format!("uid-{i}")}
            }))
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let message = "Failed to schedule pod, no nodepool fits";
    // Two passes over 5,000 unschedulable pods: recording returns at once, and the second pass
    // repeats the first's messages, so it writes nothing.
    for _ in 0..2 {
        for pod in &pods {
            events.warn(pod, "FailedScheduling", message);
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let store = world.cluster.store();
    let events_resource = GroupResource::new("", "events");
    let failed = || {
        store
            .list(&events_resource, None, None, None, |e| {
                e["reason"] == "FailedScheduling"
            })
            .items
    };
    assert_eq!(failed().len(), 5_000, "one event per pod, not one per pass");
    let first_of = |pod: &str| {
        failed()
            .into_iter()
            .find(|e| e["involvedObject"]["name"] == pod)
            .unwrap_or_else(|| panic!("no event about {pod}"))
    };
    let first = first_of("pod-0");
    tokio::time::sleep(joist_actors::effects::events::DEDUPE_WINDOW).await;
    events.warn(&pods[0], "FailedScheduling", message);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        failed().len(),
        5_000,
        "after two minutes the same event is counted, not written anew"
    );
    let counted = first_of("pod-0");
    assert_eq!(counted["metadata"]["name"], first["metadata"]["name"]);
    assert_eq!(counted["count"], 2);
    assert_eq!(counted["firstTimestamp"], first["firstTimestamp"]);
    assert_ne!(counted["lastTimestamp"], first["lastTimestamp"]);
    // The Event is gone (its TTL passed, or someone deleted it): the next count is a new Event.
    let name = first["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    store
        .delete(
            &events_resource,
            &joist_kubesim::store::ObjectKey::new("default", &name),
            &joist_kubesim::store::DeleteOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(joist_actors::effects::events::DEDUPE_WINDOW).await;
    events.warn(&pods[0], "FailedScheduling", message);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let recreated = first_of("pod-0");
    assert_eq!(recreated["metadata"]["name"], first["metadata"]["name"]);
    assert_eq!(
        recreated["count"], 3,
        "the count carries over to the recreated Event"
    );
}

#[actix::test]
async fn registration_never_undoes_a_taint_another_agent_just_removed() {
    use joist_actors::{
        decide::lifecycle::{Action, Memory, Next, Plan},
        lifecycle::execute::{STALE_VIEW_RETRY, Target, execute},
    };
    let world = world(Settings::default());
    let nodes = GroupResource::new("", "nodes");
    let store = world.cluster.store();
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-1"},
        "spec": {"providerID": "fake:///unclaimed", "taints": [
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
            {"key": "agent.io/starting", "effect": "NoSchedule"}]},
    });
    let created = store
        .create(&nodes, "", node, false)
        .unwrap_or_else(|e| panic!("{e}"));
    // What Joist read: the node with both taints.
    let stale: k8s_openapi::api::core::v1::Node =
        serde_json::from_value((*created).clone()).unwrap_or_else(|e| panic!("{e}"));
    // Meanwhile the node's agent removes its startup taint.
    let key = joist_kubesim::store::ObjectKey::new("", "n-1");
    store
        .modify(
            &nodes,
            &key,
            joist_kubesim::store::Part::Whole,
            false,
            |current| {
                let mut next = current.clone();
                next["spec"]["taints"] =
                    serde_json::json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]);
                Ok(next)
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let claim: NodeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "c", "uid": "c-uid"},
        "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}},
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let register = || Plan {
        actions: vec![Action::Register],
        next: Next::OnChange,
    };
    let shared = &world.controllers.shared;
    let target = Target {
        claim: &claim,
        node: Some(&stale),
    };
    let next = execute(shared, &target, register(), &mut Memory::default()).await;
    assert_eq!(
        next.ok(),
        Some(Next::After(STALE_VIEW_RETRY)),
        "a stale view is refused"
    );
    let taints = |node: &serde_json::Value| node["spec"]["taints"].clone();
    let now = store.get(&nodes, &key).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        taints(&now),
        serde_json::json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]),
        "the agent's removal stands"
    );
    // Looking again with the fresh node registers it: the boot taint goes, nothing comes back.
    let fresh: k8s_openapi::api::core::v1::Node =
        serde_json::from_value((*now).clone()).unwrap_or_else(|e| panic!("{e}"));
    let target = Target {
        claim: &claim,
        node: Some(&fresh),
    };
    execute(shared, &target, register(), &mut Memory::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let registered = store.get(&nodes, &key).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(taints(&registered), serde_json::json!([]));
    assert_eq!(
        registered["metadata"]["labels"]["karpenter.sh/registered"],
        "true"
    );
}

#[actix::test]
async fn a_planner_flood_is_bounded_and_folds_into_one_disruption() {
    use joist_actors::disruption::{PLANNER_MAILBOX, PlanNow};
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    world.node_pool("default").await;
    // A claim as the provisioner writes it: with Joist's finalizer, so termination runs.
    create(&world.claims(), serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": "idle", "labels": {"karpenter.sh/nodepool": "default"}, "finalizers": ["karpenter.sh/termination"]},
        "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The kubelet's part: the launched instance registers as a Ready node with nothing on it.
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "idle-node"},
        "spec": {"providerID": "fake:///idle"},
        "status": {"allocatable": {"cpu": "2", "pods": "29"}, "conditions": [{"type": "Ready", "status": "True"}]},
    });
    world
        .cluster
        .store()
        .create(&GroupResource::new("", "nodes"), "", node, false)
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let claim = world.claims().get("idle").await.unwrap_or_else(|e| panic!("{e}"));
    let consolidatable = claim
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == "Consolidatable" && c.status == "True");
    assert!(
        consolidatable,
        "the planner shows what it found: {:?}",
        claim.status
    );
    let accepted = flood(
        &world.controllers.disruption_planner.clone().recipient(),
        1_000,
        || PlanNow,
    );
    assert!(
        (1..=PLANNER_MAILBOX + 2).contains(&accepted),
        "accepted {accepted} of 1,000 requests; capacity {PLANNER_MAILBOX}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        world.claim_names().await.is_empty(),
        "the empty node's claim went"
    );
    assert_eq!(
        locked(&world.cloud.deleted).as_slice(),
        ["fake:///idle"],
        "one disruption, one termination, however many requests"
    );
}

/// A world reading the interruption queue it returns, on paused time, with the class, the pool
/// `default` and one claim `name` of it with extra `labels`, launched.
async fn interruptible_world(
    name: &str,
    labels: serde_json::Value,
) -> (World, Arc<joist_provider_sim::queue::SimQueue>) {
    tokio::time::pause();
    let queue = Arc::new(joist_provider_sim::queue::SimQueue::default());
    let world = world(Settings {
        interruption_queue: Some(queue.clone()),
        ..Settings::default()
    });
    world.node_class().await;
    world.node_pool("default").await;
    let mut labels = labels;
    labels["karpenter.sh/nodepool"] = serde_json::json!("default");
    create(&world.claims(), serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "labels": labels, "finalizers": ["karpenter.sh/termination"]},
        "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    (world, queue)
}

#[actix::test]
async fn an_interruption_flood_is_drained_and_every_message_deleted() {
    let (world, queue) = interruptible_world("doomed", serde_json::json!({})).await;
    // 1,000 messages: garbage, events for instances no claim has, and one warning for the claim's
    // instance (the fake cloud names it after the claim).
    for i in 0..1_000 {
        let instance = if i == 500 {
            "doomed".to_owned()
        } else {
            format!("i-{i:04}")
        };
        let body = match i % 3 {
            0 => format!("not json {i}"),
            _ => serde_json::json!({
                "version": "0", "id": format!("e-{i}"), "detail-type": "EC2 Spot Instance Interruption Warning",
                "source": "aws.ec2", "time": "2026-01-01T00:00:05Z", "region": "us-west-2",
                "resources": [], "detail": {"instance-id": instance, "instance-action": "terminate"},
            })
            .to_string(),
        };
        queue.send(body);
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(queue.is_empty(), "{} messages left", queue.len());
    assert!(world.claim_names().await.is_empty(), "the interrupted claim went");
    assert_eq!(locked(&world.cloud.deleted).as_slice(), ["fake:///doomed"]);
}

#[actix::test]
async fn a_reservation_interruption_drains_the_node_and_counts_its_reservation_full() {
    let labels = serde_json::json!({
        "karpenter.sh/capacity-type": "reserved",
        "karpenter.k8s.aws/capacity-reservation-id": "cr-0123",
        "karpenter.k8s.aws/capacity-reservation-interruptible": "true",
    });
    let (world, queue) = interruptible_world("reserved", labels).await;
    queue.send(
        serde_json::json!({
            "version": "0", "id": "e-1", "detail-type": "EC2 Capacity Reservation Instance Interruption Warning",
            "source": "aws.ec2", "time": "2026-01-01T00:00:05Z", "region": "us-west-2",
            "resources": [], "detail": {"instance-id": "reserved", "instance-action": "terminate"},
        })
        .to_string(),
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(world.claim_names().await.is_empty(), "the interrupted claim went");
    assert_eq!(
        locked(&world.cloud.reclaimed).as_slice(),
        ["cr-0123"],
        "no new claim is launched into a reservation EC2 takes back"
    );
}

#[actix::test]
async fn an_instance_failing_its_status_checks_is_replaced_and_a_broken_one_is_not_drained() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.node_class().await;
    // No budget for voluntary disruption: only the status checks remove a node here.
    world.pool_without_budget().await;
    for name in ["broken", "maintained", "healthy"] {
        world.registered_claim(name).await;
        // A pod that may not be evicted holds a graceful drain of its node.
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{name}-pod"), "namespace": "default",
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {"nodeName": format!("{name}-node"), "containers": [{"name": "app", "image": "app"}]},
            "status": {"phase": "Running"}
        });
        world
            .cluster
            .store()
            .create(&GroupResource::new("", "pods"), "default", pod, false)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let clock = Clock::starting_at(EPOCH);
    let failing_since = clock.now_seconds();
    let health = |id: &str, category, name: &str| InstanceHealth {
        instance_id: id.into(),
        checks: vec![StatusCheck {
            category,
            name: name.into(),
            failed: true,
            impaired_since: Some(failing_since),
        }],
    };
    *locked(&world.cloud.impaired) = vec![
        health("broken", StatusCategory::System, "reachability"),
        health("maintained", StatusCategory::Event, "system-maintenance"),
        // Another cluster's instance in the same account: no NodeClaim, left alone.
        health("elsewhere", StatusCategory::Instance, "reachability"),
    ];
    let deleting = |claim: &NodeClaim| claim.metadata.deletion_timestamp.is_some();
    let claim = |name: &'static str| {
        let claims = world.claims();
        async move { claims.get_opt(name).await.unwrap_or_else(|e| panic!("{e}")) }
    };
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(
        claim("maintained").await.is_none_or(|c| deleting(&c)),
        "a scheduled event replaces the node at the next poll"
    );
    let broken = claim("broken").await.unwrap_or_else(|| panic!("broken is gone"));
    assert!(
        !deleting(&broken),
        "a check failing for less than two minutes is not acted on yet"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    let counted = |category: &str| {
        world
            .controllers
            .shared
            .metrics
            .instance_status_unhealthy
            .get_or_create(&CategoryLabels {
                category: category.into(),
            })
            .get()
    };
    assert_eq!(
        (
            counted("SystemStatus"),
            counted("EventStatus"),
            counted("InstanceStatus")
        ),
        (1, 1, 0),
        "each claimed instance and category counted once, polls after the first not again"
    );
    let unhealthy_events = world
        .cluster
        .store()
        .list(&GroupResource::new("", "events"), None, None, None, |e| {
            e["reason"] == "InstanceUnhealthy"
        })
        .items;
    let about: BTreeSet<String> = unhealthy_events
        .iter()
        .filter_map(|e| e["involvedObject"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        about.contains("broken") && about.contains("maintained") && !about.contains("healthy"),
        "{about:?}"
    );
    assert!(
        claim("broken").await.is_none(),
        "a broken instance's claim is terminated without a drain: its pod does not hold it"
    );
    assert!(
        claim("maintained").await.is_some_and(|c| deleting(&c)),
        "a node with scheduled maintenance is drained gracefully: its pod holds it"
    );
    assert!(
        claim("healthy").await.is_some_and(|c| !deleting(&c)),
        "a healthy instance's claim stays"
    );
    let deleted = locked(&world.cloud.deleted).clone();
    assert!(
        deleted.contains(&"fake:///broken".to_owned()) && !deleted.contains(&"fake:///maintained".to_owned()),
        "the broken instance is terminated, the draining one not yet: {deleted:?}"
    );
}

#[actix::test]
async fn a_cloud_that_does_not_permit_the_status_query_is_not_asked_again() {
    tokio::time::pause();
    let world = world(Settings::default());
    world.cloud.status_refused.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(world.cloud.status_asks.load(Ordering::SeqCst), 1);
}

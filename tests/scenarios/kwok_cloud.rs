//! The KWOK cloud shared by replicas: one replica reads back the instances another launched from
//! their Nodes, and forgets them once their Nodes are gone, without listing the Nodes again for
//! an instance it knows has ended.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use joist_kubesim::{Cluster, ClusterSettings};
use joist_messages::model::instance_type::CapacityType;
use joist_provider::{CloudProvider, Instance, InstanceState};
use joist_provider_sim::{SimCloud, kwok};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};

use super::{EPOCH, sim_settings};

/// A KWOK cloud on `client`, as one replica of `joist run` holds it.
fn replica(client: kube::Client) -> SimCloud {
    SimCloud::on_kwok(sim_settings("kwok"), client, None).unwrap_or_else(|e| panic!("{e}"))
}

/// The Node another replica registers for the instance it launched, named `name`.
fn launched_elsewhere(name: &str) -> Node {
    let instance = Instance {
        provider_id: format!("{}{name}", kwok::PROVIDER_PREFIX),
        instance_type: "m5.large".to_owned(),
        zone: "us-west-2a".to_owned(),
        capacity_type: CapacityType::OnDemand,
        reservation: None,
        image_id: String::new(),
        price: 0.096,
        state: InstanceState::Pending,
        launched_at: EPOCH,
        tags: [("karpenter.sh/nodeclaim".to_owned(), "default-x7k2p".to_owned())].into(),
    };
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    kwok::for_kwok(node, &instance)
}

/// A client that counts the lists of Nodes made through it.
#[derive(Clone)]
struct CountingNodeLists {
    inner: kube::Client,
    lists: Arc<AtomicUsize>,
}

impl tower_service::Service<http::Request<kube::client::Body>> for CountingNodeLists {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let watch = request.uri().query().is_some_and(|q| q.contains("watch=true"));
        if request.method() == http::Method::GET && request.uri().path() == "/api/v1/nodes" && !watch {
            self.lists.fetch_add(1, Ordering::SeqCst);
        }
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(request).await })
    }
}

/// The provider IDs `cloud` lists as running.
async fn running(cloud: &SimCloud) -> Vec<String> {
    let listed = cloud.list().await.unwrap_or_else(|e| panic!("{e}"));
    listed.into_iter().map(|i| i.provider_id).collect()
}

#[tokio::test]
async fn an_instance_another_replica_terminated_is_no_longer_listed() {
    let cluster = Cluster::start(ClusterSettings::default());
    let nodes: Api<Node> = Api::all(cluster.client());
    let lists = Arc::new(AtomicUsize::new(0));
    let counting = CountingNodeLists {
        inner: cluster.client(),
        lists: lists.clone(),
    };
    let cloud = replica(kube::Client::new(counting, "default"));
    let name = "ip-10-1-2-3.us-west-2.compute.internal";
    let provider_id = format!("{}{name}", kwok::PROVIDER_PREFIX);
    nodes
        .create(&PostParams::default(), &launched_elsewhere(name))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        running(&cloud).await,
        vec![provider_id.clone()],
        "read back from its Node"
    );

    // The other replica terminates it: its Node goes.
    nodes
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        running(&cloud).await.is_empty(),
        "an instance whose Node is gone is not reported running, so no collector takes it for a leak"
    );
    let listed_before = lists.load(Ordering::SeqCst);
    let described = cloud.get(&provider_id).await;
    assert!(
        matches!(
            described,
            Err(joist_provider::CloudError::NodeClaimNotFound { .. })
        ),
        "{described:?}"
    );
    let deleted = cloud.delete(&provider_id).await;
    assert!(
        matches!(deleted, Err(joist_provider::CloudError::NodeClaimNotFound { .. })),
        "{deleted:?}"
    );
    assert_eq!(
        lists.load(Ordering::SeqCst),
        listed_before,
        "an instance the books know has ended is not looked for in a list of every Node"
    );
}

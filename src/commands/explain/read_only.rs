//! A Kubernetes client that can only read, for `joist explain` and `joist what-if --kubeconfig`:
//! every request but a GET fails at once with [`Refused`], before it leaves the process. The
//! controllers' code `explain` borrows (the read model, the catalog, the disruption and
//! provisioning passes) acts on nothing, but a pass still tries one write, a NodeOverlay's status
//! when overlays conflict; that write, and any a later change would add, is refused here.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{Method, Request, Response};
use kube::client::Body;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A write `joist explain` refused to send.
#[derive(Debug, thiserror::Error)]
#[error("joist explain only reads: {method} {path} was not sent")]
pub struct Refused {
    /// The request's method.
    method: Method,
    /// Its path.
    path: String,
}

/// `client`, refusing every request but a GET.
pub fn client(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    kube::Client::new(ReadOnly(client), namespace)
}

/// The service [`client`] wraps.
#[derive(Clone)]
struct ReadOnly(kube::Client);

impl Service<Request<Body>> for ReadOnly {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.method() != Method::GET {
            let refused = Refused {
                method: request.method().clone(),
                path: request.uri().path().to_owned(),
            };
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let client = self.0.clone();
        Box::pin(async move { client.send(request).await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::apis::NodePool;
    use kube::{Api, api::PostParams};

    use super::*;

    #[tokio::test]
    async fn reads_pass_and_writes_are_refused_before_they_reach_the_server() {
        let cluster = joist_kubesim::Cluster::start(joist_kubesim::ClusterSettings::default());
        crate::commands::install_crds(&cluster).unwrap_or_else(|e| panic!("{e}"));
        let pools: Api<NodePool> = Api::all(client(cluster.client()));
        assert!(pools.list(&Default::default()).await.is_ok(), "a list is a GET");
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let error = pools
            .create(&PostParams::default(), &pool)
            .await
            .err()
            .unwrap_or_else(|| panic!("the create went through"));
        assert!(
            error.to_string().contains("joist explain only reads: POST"),
            "{error}"
        );
        let stored: Api<NodePool> = Api::all(cluster.client());
        assert!(
            stored
                .get_opt("default")
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .is_none(),
            "nothing reached the server"
        );
    }
}

//! A bound on the requests `joist run` has in flight to the Kubernetes API server at once, as a
//! layer of the client's service stack.
//!
//! kube's client speaks HTTP/1.1: one request at a time per connection. Without a bound, a burst
//! of work (10,000 NodeClaims launching together) opened a connection for every request in flight,
//! about a thousand at 10,000 nodes, each with its buffers and tasks in the controller and in the
//! API server, which itself serves only a few hundred at once (kube-apiserver's
//! `--max-requests-inflight` 400 and `--max-mutating-requests-inflight` 200, for every client
//! together). A request past the bound waits for a slot before it is sent, and keeps it until its
//! response body ends or is dropped, when its connection goes back to the pool. Watches take no
//! slot: each stays open for as long as it runs. Nothing here fails; a request waits instead.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_layer::Layer;
use tower_service::Service;

use super::deadline::is_watch;

/// Requests other than watches in flight at once: half of what kube-apiserver admits from all its
/// clients together by default. A burst is served as fast with this many as with a thousand
/// (`joist bench controller --nodes 10000`, docs/performance.md).
pub const IN_FLIGHT_LIMIT: usize = 100;

/// Holds the requests of the service it wraps to `limit` in flight at once (see the module docs).
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    slots: Arc<Semaphore>,
}

impl InFlightLayer {
    /// The layer with `limit` slots, shared by every service it makes.
    pub fn new(limit: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit)),
        }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            slots: self.slots.clone(),
        }
    }
}

/// The service [`InFlightLayer`] makes.
#[derive(Debug, Clone)]
pub struct InFlight<S> {
    inner: S,
    slots: Arc<Semaphore>,
}

impl<S, RequestBody, ResponseBody> Service<Request<RequestBody>> for InFlight<S>
where
    S: Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<SlotBody<ResponseBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    /// The inner call is made now but sent only when polled (hyper's client connects lazily), so
    /// the request waits for its slot before it takes a connection.
    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let slots = (!is_watch(&request)).then(|| self.slots.clone());
        let call = self.inner.call(request);
        Box::pin(async move {
            // The semaphore is never closed, so a slot always comes.
            let slot = match slots {
                Some(slots) => slots.acquire_owned().await.ok(),
                None => None,
            };
            let response = call.await?;
            Ok(response.map(|body| SlotBody { inner: body, slot }))
        })
    }
}

/// A response body that holds its request's slot until it ends, fails or is dropped.
pub struct SlotBody<B> {
    inner: B,
    slot: Option<OwnedSemaphorePermit>,
}

impl<B> Body for SlotBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            this.slot = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::commands::run::test_service::{Answering, Stalling, get};

    #[tokio::test(start_paused = true)]
    async fn a_request_past_the_limit_waits_until_a_body_in_flight_ends() {
        let mut service = InFlightLayer::new(2).layer(Answering {
            delay: Duration::ZERO,
            body: || Full::new(Bytes::from_static(b"{}")),
        });
        let first = service
            .call(get("/api/v1/nodes/a"))
            .await
            .unwrap_or_else(|e| match e {});
        let second = service
            .call(get("/api/v1/nodes/b"))
            .await
            .unwrap_or_else(|e| match e {});
        let mut third = service.call(get("/api/v1/nodes/c"));
        let waiting = tokio::time::timeout(Duration::from_secs(60), &mut third).await;
        assert!(
            waiting.is_err(),
            "a third request was sent with two bodies unread"
        );

        let read = first.into_body().collect().await.unwrap_or_else(|e| match e {});
        assert_eq!(read.to_bytes(), Bytes::from_static(b"{}"));
        let third = tokio::time::timeout(Duration::from_secs(1), third).await;
        assert!(third.is_ok(), "the third request still waits after a body ended");
        drop(second);
        let fourth = tokio::time::timeout(Duration::from_secs(1), service.call(get("/api/v1/nodes/d"))).await;
        assert!(fourth.is_ok(), "a dropped body kept its slot");
        drop(third);
    }

    #[tokio::test(start_paused = true)]
    async fn watches_take_no_slot() {
        let mut service = InFlightLayer::new(1).layer(Answering {
            delay: Duration::ZERO,
            body: Stalling::default,
        });
        let watch = service
            .call(get("/api/v1/pods?watch=true&resourceVersion=7"))
            .await
            .unwrap_or_else(|e| match e {});
        let list = tokio::time::timeout(Duration::from_secs(1), service.call(get("/api/v1/pods"))).await;
        assert!(list.is_ok(), "an open watch held the only slot");
        drop(watch);
    }
}

//! A deadline on every request `joist run` makes of the Kubernetes API server, as a layer of the
//! client's service stack. Without one a request to an API server that stopped answering (a
//! network black hole, a hung connection) waits forever, and so does the controller that made it.
//!
//! A request fails with [`Unanswered`] when its response has not begun within the deadline, or,
//! except for watches, when its body then pauses for longer than the deadline between two parts.
//! A watch's body is left alone: it is quiet for as long as nothing changes, and kube's watcher
//! already ends a watch that is idle past the server's own timeout. Controllers see the failure as
//! any other API error and retry as they do for those.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

/// How long a request may wait for its response to begin, and a response's body for its next
/// part (client-go's `--request-timeout` is often set to the same).
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request the API server did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("the Kubernetes API server did not answer {what} within {}s", .limit.as_secs())]
pub struct Unanswered {
    /// The method and path of the request.
    what: String,
    /// The deadline it missed.
    limit: Duration,
}

/// Puts a deadline of `limit` on every request of the service it wraps (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    limit: Duration,
}

impl DeadlineLayer {
    /// The layer with deadline `limit`.
    pub fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            limit: self.limit,
        }
    }
}

/// The service [`DeadlineLayer`] makes.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

impl<S, RequestBody, ResponseBody> Service<Request<RequestBody>> for Deadline<S>
where
    S: Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResponseBody: Body<Data = Bytes> + Unpin,
    ResponseBody::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody<ResponseBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let watch = is_watch(&request);
        let what = format!("{} {}", request.method(), request.uri().path());
        let limit = self.limit;
        let call = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, call).await {
                Ok(Ok(response)) => {
                    let idle = (!watch).then_some(limit);
                    Ok(response.map(|body| DeadlineBody::new(body, idle, what)))
                }
                Ok(Err(error)) => Err(error.into()),
                Err(_) => Err(Box::new(Unanswered { what, limit }) as BoxError),
            }
        })
    }
}

/// Whether `request` opens a watch (`?watch=true`), whose response stays open while it runs.
pub fn is_watch<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// A response body that fails when it pauses for longer than its deadline between two parts.
pub struct DeadlineBody<B> {
    inner: B,
    /// The deadline and when the current pause reaches it; none for a watch.
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    what: String,
}

impl<B> DeadlineBody<B> {
    fn new(inner: B, idle: Option<Duration>, what: String) -> Self {
        Self {
            inner,
            idle: idle.map(|limit| (limit, Box::pin(tokio::time::sleep(limit)))),
            what,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some((limit, pause)) = &mut this.idle {
                pause.as_mut().reset(Instant::now() + *limit);
            }
            return Poll::Ready(frame.map(|part| part.map_err(Into::into)));
        }
        let Some((limit, pause)) = &mut this.idle else {
            return Poll::Pending;
        };
        ready!(pause.as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(Unanswered {
            what: std::mem::take(&mut this.what),
            limit: *limit,
        }))))
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
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::commands::run::test_service::{Answering, Stalling, get};

    #[tokio::test(start_paused = true)]
    async fn a_request_the_api_server_never_answers_fails_at_the_deadline() {
        let mut service = DeadlineLayer::new(CALL_DEADLINE).layer(Answering {
            delay: Duration::from_secs(3600),
            body: || Full::new(Bytes::from_static(b"{}")),
        });
        let started = Instant::now();
        let error = service
            .call(get("/api/v1/namespaces/kube-system/pods"))
            .await
            .err()
            .unwrap_or_else(|| panic!("answered"));
        assert_eq!(started.elapsed(), CALL_DEADLINE);
        assert_eq!(
            error.to_string(),
            "the Kubernetes API server did not answer GET /api/v1/namespaces/kube-system/pods within 30s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_fails_at_the_deadline_unless_it_is_a_watch() {
        let mut service = DeadlineLayer::new(CALL_DEADLINE).layer(Answering {
            delay: Duration::ZERO,
            body: Stalling::default,
        });
        let response = service
            .call(get("/api/v1/pods?limit=500"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let error = response
            .into_body()
            .collect()
            .await
            .err()
            .unwrap_or_else(|| panic!("the body ended"));
        assert!(
            error.to_string().contains("did not answer GET /api/v1/pods"),
            "{error}"
        );

        let response = service
            .call(get("/api/v1/pods?watch=true&resourceVersion=7"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut body = response.into_body();
        assert!(body.frame().await.is_some_and(|frame| frame.is_ok()));
        let quiet = tokio::time::timeout(10 * CALL_DEADLINE, body.frame()).await;
        assert!(quiet.is_err(), "a quiet watch was ended");
    }
}

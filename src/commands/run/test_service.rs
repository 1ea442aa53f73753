//! Stand-ins for the Kubernetes API server in the tests of the client's layers: a service that
//! answers every request after a delay, and a response body that stops after its first part.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tower_service::Service;

/// An API server that answers every request after `delay` with the body `body` makes.
pub struct Answering<B> {
    pub delay: Duration,
    pub body: fn() -> B,
}

impl<B: Send + 'static> Service<Request<()>> for Answering<B> {
    type Response = Response<B>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let (delay, body) = (self.delay, (self.body)());
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(Response::new(body))
        })
    }
}

/// A body that sends its first part and then nothing more.
#[derive(Default)]
pub struct Stalling {
    sent: bool,
}

impl Body for Stalling {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.sent {
            return Poll::Pending;
        }
        this.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"items\":[")))))
    }
}

pub fn get(uri: &str) -> Request<()> {
    Request::get(uri).body(()).unwrap_or_else(|e| panic!("{e}"))
}

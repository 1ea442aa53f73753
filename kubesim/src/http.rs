//! kubesim's two front doors over one [`ApiServer`]: a `tower::Service` that `kube::Client::new`
//! accepts for in-process use, and HTTP/1.1 on 127.0.0.1 for kubectl and helm, with a kubeconfig
//! that points at it.
//!
//! A request whose body cannot be read gets a 400 `Status`; a connection that breaks ends only
//! that connection. The HTTP server stops when its [`HttpServer`] handle is dropped.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinHandle};

use crate::api::{ApiBody, ApiFaults, ApiRequest, ApiServer};
use crate::error::ApiError;

/// The in-process front door: hand it to `kube::Client::new`.
#[derive(Clone)]
pub struct InProcess {
    server: Arc<ApiServer>,
    /// When it says the client's process is down, requests are neither sent nor answered.
    down: Option<Down>,
    /// The faults this client's requests go through.
    faults: Option<ApiFaults>,
}

/// Whether a client's process is down (see [`InProcess::until`]).
pub type Down = Arc<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess").finish_non_exhaustive()
    }
}

impl InProcess {
    /// A service over `server`.
    pub fn new(server: Arc<ApiServer>) -> Self {
        Self {
            server,
            down: None,
            faults: None,
        }
    }

    /// A service over `server` for a client that can crash: once `down` says so, a request is
    /// never sent, and one already sent never gets its answer (the reply is lost with the process).
    pub fn until(server: Arc<ApiServer>, down: Down) -> Self {
        Self {
            server,
            down: Some(down),
            faults: None,
        }
    }

    /// The same service, its requests going through `faults`.
    pub fn with_faults(self, faults: ApiFaults) -> Self {
        Self {
            faults: Some(faults),
            ..self
        }
    }
}

impl<B> tower_service::Service<Request<B>> for InProcess
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    type Response = Response<ApiBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ApiBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let server = self.server.clone();
        let faults = self.faults.clone();
        let Some(down) = self.down.clone() else {
            return Box::pin(async move { Ok(answer(&server, faults.as_ref(), request).await) });
        };
        Box::pin(async move {
            if down() {
                std::future::pending::<()>().await;
            }
            let response = answer(&server, faults.as_ref(), request).await;
            if down() {
                std::future::pending::<()>().await;
            }
            Ok(response)
        })
    }
}

/// Collects the body and answers the request, through `faults` when there are any.
async fn answer<B>(server: &ApiServer, faults: Option<&ApiFaults>, request: Request<B>) -> Response<ApiBody>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            let error = ApiError::BadRequest(format!("cannot read the request body: {error}"));
            let mut response =
                Response::new(http_body_util::Full::new(Bytes::from(error.status().to_string())).boxed());
            *response.status_mut() = http::StatusCode::BAD_REQUEST;
            return response;
        }
    };
    let request = ApiRequest::from_http(Request::from_parts(parts, body));
    match faults {
        Some(faults) => faults.answer(server, request).await,
        None => server.handle(request),
    }
}

/// kubesim served over HTTP on a loopback port. Dropping it stops the server.
#[derive(Debug)]
pub struct HttpServer {
    address: SocketAddr,
    accept_loop: JoinHandle<()>,
}

impl HttpServer {
    /// Serves on `127.0.0.1:port` (0: any free port), every request through `faults` when given:
    /// several servers over one [`ApiServer`] give their clients different networks.
    pub async fn bind(server: Arc<ApiServer>, port: u16, faults: Option<ApiFaults>) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let address = listener.local_addr()?;
        let accept_loop = tokio::spawn(async move {
            loop {
                let (stream, _) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "kubesim: accept failed");
                        continue;
                    }
                };
                let server = server.clone();
                let faults = faults.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |request: Request<hyper::body::Incoming>| {
                            let server = server.clone();
                            let faults = faults.clone();
                            async move { Ok::<_, Infallible>(answer(&server, faults.as_ref(), request).await) }
                        },
                    );
                    if let Err(error) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(%error, "kubesim: connection ended with an error");
                    }
                });
            }
        });
        Ok(Self { address, accept_loop })
    }

    /// The address served.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// A kubeconfig (YAML) whose current context is this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubesim\n  cluster:\n    server: {}\n\
             users:\n- name: kubesim\n  user: {{}}\ncontexts:\n- name: kubesim\n  context:\n    cluster: kubesim\n    \
             user: kubesim\n    namespace: default\ncurrent-context: kubesim\n",
            self.url()
        )
    }

    /// Writes [`HttpServer::kubeconfig`] to a file.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

//! The HTTP endpoints of `joist run` (and the metrics of `joist sim serve`), on Karpenter's ports:
//! Prometheus metrics at `METRICS_PORT/metrics`, and the kubelet's probes at
//! `HEALTH_PROBE_PORT/healthz` (the process answers) and `/readyz` (ready while standing by for the leader; once leading, when the cluster
//! state has its initial lists, 503 until then). A standby has no metrics of its own yet. Metrics
//! are OpenMetrics for a scraper that accepts it, else the Prometheus text format.
//!
//! Failing to listen (a port in use, an address not on this host) stops `joist run` at start with
//! the address named. Other paths answer 404; a connection that breaks is logged at debug and
//! forgotten.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use joist_actors::{effects::metrics::Metrics, state::read_model::ReadModel};
use tokio::net::TcpListener;

/// The OpenMetrics exposition, for scrapers that accept it (Prometheus does).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format, for the others.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What one endpoint server answers to a path and the request's Accept header.
type Answer = Arc<dyn Fn(&str, &str) -> Response<Full<Bytes>> + Send + Sync>;

/// The running controllers' metrics and read model, once this replica leads.
pub type Leading = Arc<OnceLock<(Metrics, ReadModel)>>;

/// Serves `/metrics` on `address`; the address it listens on.
pub async fn serve_metrics(address: SocketAddr, leading: Leading) -> Result<SocketAddr, String> {
    serve(
        address,
        "metrics",
        Arc::new(move |path, accept| {
            let openmetrics = accept.contains("application/openmetrics-text");
            match (path, leading.get(), openmetrics) {
                ("/metrics", Some((metrics, _)), true) => {
                    respond(StatusCode::OK, OPENMETRICS, metrics.encode())
                }
                ("/metrics", Some((metrics, _)), false) => {
                    respond(StatusCode::OK, PROMETHEUS_TEXT, metrics.encode_text())
                }
                ("/metrics", None, true) => respond(StatusCode::OK, OPENMETRICS, "# EOF\n".to_owned()),
                ("/metrics", None, false) => respond(StatusCode::OK, PROMETHEUS_TEXT, String::new()),
                _ => not_found(),
            }
        }),
    )
    .await
}

/// Serves `/healthz` and `/readyz` on `address`; the address it listens on.
pub async fn serve_health(address: SocketAddr, leading: Leading) -> Result<SocketAddr, String> {
    serve(
        address,
        "health probes",
        Arc::new(move |path, _| match (path, leading.get()) {
            ("/healthz", _) => respond(StatusCode::OK, "text/plain", "ok".to_owned()),
            ("/readyz", None) => respond(StatusCode::OK, "text/plain", "standing by".to_owned()),
            ("/readyz", Some((_, read))) if read.is_synced() => {
                respond(StatusCode::OK, "text/plain", "ok".to_owned())
            }
            ("/readyz", Some(_)) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "the cluster state has not been listed yet".to_owned(),
            ),
            _ => not_found(),
        }),
    )
    .await
}

async fn serve(address: SocketAddr, what: &'static str, answer: Answer) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| format!("cannot listen on {address} for {what}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {address} for {what}: {e}"))?;
    tracing::info!(address = %bound, what, "listening");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, most likely: give connections time to close.
                    tracing::warn!(%error, what, "accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let answer = answer.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let accept = request
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let response = answer(request.uri().path(), accept);
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(async move {
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%error, what, "endpoint connection ended");
                }
            });
        }
    });
    Ok(bound)
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}

fn not_found() -> Response<Full<Bytes>> {
    respond(StatusCode::NOT_FOUND, "text/plain", "not found".to_owned())
}

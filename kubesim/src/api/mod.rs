//! The Kubernetes REST protocol over the store: discovery, the verbs on every resource, the
//! subresources Joist and kubectl use, and the response formats clients ask for (JSON, Table, watch
//! streams).
//!
//! Every failure becomes a `Status` body with kube-apiserver's code and reason ([`ApiError`]); no
//! request can stop the server.

mod audit;
mod custom_resources;
mod faults;
mod field_validation;
mod objects;
mod openapi;
mod request;
mod subresources;
mod table;
mod token;
mod watch;

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::{Value, json};

use self::objects::{Document, Shown};
pub use self::{
    audit::{Access, Audit},
    faults::{ApiFailure, ApiFaults, FaultCounts},
    request::{Query, ResourcePath, Route},
    subresources::bind,
};
use crate::{error::ApiError, protobuf::ProtobufError, store::Store};

/// A response body: a whole JSON document or a watch stream.
pub type ApiBody = BoxBody<Bytes, Infallible>;

/// What kube-apiserver reports as its version (the Kubernetes minor kubesim follows).
pub const KUBERNETES_VERSION: (&str, &str) = ("1", "35");

/// The request as the handler sees it: method, path, query, content type, accept, body.
#[derive(Debug)]
pub struct ApiRequest {
    /// HTTP method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The parsed query.
    pub query: Query,
    /// The Content-Type header.
    pub content_type: String,
    /// The Accept header.
    pub accept: String,
    /// The User-Agent header (the field manager of a write that names none).
    pub user_agent: String,
    /// The whole body.
    pub body: Bytes,
    /// The warnings the response carries (`Warning: 299` headers), gathered while it is served.
    warnings: std::sync::Mutex<Vec<String>>,
}

impl ApiRequest {
    /// Reads the parts kubesim needs from an HTTP request whose body is already collected.
    pub fn from_http(request: http::Request<Bytes>) -> Self {
        let (parts, body) = request.into_parts();
        let header = |name: http::header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            content_type: header(CONTENT_TYPE),
            accept: header(http::header::ACCEPT),
            user_agent: header(http::header::USER_AGENT),
            query: Query::parse(parts.uri.query()),
            path: parts.uri.path().to_owned(),
            method: parts.method,
            body,
            warnings: std::sync::Mutex::default(),
        }
    }

    /// The field manager of a write: the `fieldManager` parameter, else the user agent up to its
    /// first `/`, as kube-apiserver names it.
    fn field_manager(&self) -> &str {
        self.query.get("fieldManager").unwrap_or_else(|| {
            let agent = self.user_agent.split('/').next().unwrap_or_default();
            if agent.is_empty() { "unknown" } else { agent }
        })
    }

    /// Adds warnings to the response.
    fn warn(&self, warnings: impl IntoIterator<Item = String>) {
        if let Ok(mut held) = self.warnings.lock() {
            held.extend(warnings);
        }
    }

    /// The response with the warnings gathered while serving it.
    fn with_warnings(&self, mut response: Response<ApiBody>) -> Response<ApiBody> {
        let warnings = self.warnings.lock().map(|held| held.clone()).unwrap_or_default();
        for warning in warnings {
            let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
            if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
                response.headers_mut().append(http::header::WARNING, value);
            }
        }
        response
    }

    /// How the client asked to be shown objects: as a `meta.k8s.io` Table (kubectl get), as their
    /// metadata alone (kube-rs's and client-go's metadata clients), or whole.
    fn shown(&self) -> Shown {
        if self.accept.contains("as=Table") {
            Shown::Table
        } else if self.accept.contains("as=PartialObjectMetadata") {
            Shown::Metadata
        } else {
            Shown::Whole
        }
    }
}

/// The API server: routes requests to the store. Both front doors (the in-process tower service
/// and HTTP) call [`ApiServer::handle`].
#[derive(Debug, Clone)]
pub struct ApiServer {
    store: Arc<Store>,
    address: String,
    audit: Option<Arc<Audit>>,
}

impl ApiServer {
    /// A server over `store`; `address` is what discovery reports as the server address.
    pub fn new(store: Arc<Store>, address: impl Into<String>) -> Self {
        Self {
            store,
            address: address.into(),
            audit: None,
        }
    }

    /// The same server, recording every resource request in `audit`.
    pub fn audited(&self, audit: Arc<Audit>) -> Self {
        Self {
            audit: Some(audit),
            ..self.clone()
        }
    }

    /// The store behind the server.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Answers one request.
    pub fn handle(&self, request: ApiRequest) -> Response<ApiBody> {
        let method = request.method.clone();
        let path = request.path.clone();
        let response = self.store.busy().time(|| {
            self.dispatch(request)
                .unwrap_or_else(|error| json_response(error.code(), &error.status()))
        });
        tracing::debug!(%method, %path, status = response.status().as_u16(), "api request");
        response
    }

    fn dispatch(&self, request: ApiRequest) -> Result<Response<ApiBody>, ApiError> {
        if request.path.starts_with("/openapi/") {
            return openapi::serve(&self.store, &request.path).map(|doc| json_response(200, &doc));
        }
        let route = request::route(&self.store, &request.path)?;
        if request.method != Method::GET && !matches!(route, Route::Resource(_)) {
            return Err(ApiError::MethodNotAllowed);
        }
        let document = match route {
            Route::Version => version(),
            Route::Health => return Ok(text_response(200, "ok")),
            Route::CoreVersions => self.store.with_registry(|r| r.core_versions(&self.address)),
            Route::Groups => self.store.with_registry(|r| r.group_list()),
            Route::Group(group) => self
                .store
                .with_registry(|r| r.group(&group))
                .ok_or(ApiError::NoSuchResource)?,
            Route::Resources(group, version) => self
                .store
                .with_registry(|r| r.resource_list(&group, &version))
                .ok_or(ApiError::NoSuchResource)?,
            Route::Resource(path) => return self.resource(&request, &path),
        };
        Ok(json_response(200, &document))
    }

    fn resource(&self, request: &ApiRequest, path: &ResourcePath) -> Result<Response<ApiBody>, ApiError> {
        if let Some(audit) = &self.audit {
            audit.record(&request.method, request.query.flag("watch"), path);
        }
        if let Some(subresource) = path.subresource.as_deref() {
            return subresources::handle(&self.store, request, path, subresource)
                .map(|(code, doc)| request.with_warnings(self.document_response(code, doc)));
        }
        let store = &self.store;
        let (code, document) = match (&request.method, path.key()) {
            (&Method::GET, None) if request.query.flag("watch") => {
                return watch::serve(store.clone(), request, path).map(streaming_response);
            }
            (&Method::GET, None) => return Ok(bytes_response(200, objects::list(store, request, path)?)),
            (&Method::GET, Some(key)) => {
                let object = store.get(&path.rtype.group_resource(), &key)?;
                let document = match request.shown() {
                    Shown::Whole => objects::versioned(path, object),
                    shown => objects::presented(&path.rtype, &object, shown, store.clock())
                        .into_owned()
                        .into(),
                };
                (200, document)
            }
            (&Method::POST, None) => objects::create(store, request, path)?,
            (&Method::PUT, Some(key)) => (200, objects::update(store, request, path, &key)?),
            (&Method::PATCH, Some(key)) => objects::patch(store, request, path, &key)?,
            (&Method::DELETE, Some(key)) => objects::delete(store, request, path, &key)?,
            (&Method::DELETE, None) => (200, objects::delete_collection(store, request, path)?.into()),
            _ => return Err(ApiError::MethodNotAllowed),
        };
        Ok(request.with_warnings(self.document_response(code, document)))
    }

    /// A response with a document: a stored version as it was last serialized.
    fn document_response(&self, code: u16, document: Document) -> Response<ApiBody> {
        match document {
            Document::Stored(version) => bytes_response(code, self.store.encoded(&version)),
            Document::Encoded(json) => bytes_response(code, json),
            Document::Built(value) => json_response(code, &value),
        }
    }
}

/// `/version`.
fn version() -> Value {
    let (major, minor) = KUBERNETES_VERSION;
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": format!("v{major}.{minor}.0-kubesim"),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "kubesim",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// Parses a JSON (or, for apply patches, YAML) request body.
fn parse_body(request: &ApiRequest) -> Result<Value, ApiError> {
    if request
        .content_type
        .starts_with("application/vnd.kubernetes.protobuf")
    {
        // Built-in kinds decode as an API server decodes them; other kinds (custom resources)
        // take JSON or YAML only, as on a real cluster.
        return crate::protobuf::decode_object(&request.body).map_err(|e| match e {
            ProtobufError::UnsupportedKind { .. } => {
                ApiError::UnsupportedMediaType("application/json, application/yaml".to_owned())
            }
            e => ApiError::BadRequest(e.to_string()),
        });
    }
    if request.content_type.starts_with("application/apply-patch+yaml") {
        let text = std::str::from_utf8(&request.body)
            .map_err(|_| ApiError::BadRequest("the apply patch is not UTF-8".to_owned()))?;
        return serde_saphyr::from_str(text)
            .map_err(|e| ApiError::BadRequest(format!("the apply patch is not valid YAML: {e}")));
    }
    serde_json::from_slice(&request.body)
        .map_err(|e| ApiError::BadRequest(format!("the request body is not valid JSON: {e}")))
}

fn json_response(code: u16, document: &Value) -> Response<ApiBody> {
    bytes_response(code, serde_json::to_vec(document).unwrap_or_default())
}

fn bytes_response(code: u16, body: impl Into<Bytes>) -> Response<ApiBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text_response(code: u16, text: &'static str) -> Response<ApiBody> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

fn streaming_response(body: ApiBody) -> Response<ApiBody> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().insert(
        http::header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    response
}

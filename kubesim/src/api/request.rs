//! Reading a request: which route a path names, and the query parameters of the Kubernetes API.
//!
//! A path that names no served resource is a 404 `NotFound`, as kube-apiserver answers it; a query
//! value that does not parse (a bad selector, a non-numeric `limit`) is a 400 naming the parameter.

use std::{collections::HashMap, sync::Arc};

use crate::{
    error::ApiError,
    resources::ResourceType,
    selector::{FieldSelector, LabelSelector},
    store::{ObjectKey, Store},
};

/// What a path asks for.
#[derive(Debug)]
pub enum Route {
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz`
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`
    Resources(String, String),
    /// Anything under a resource.
    Resource(ResourcePath),
}

/// A path under a served resource.
#[derive(Debug)]
pub struct ResourcePath {
    /// The served type.
    pub rtype: Arc<ResourceType>,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object's name, if the path names one.
    pub name: Option<String>,
    /// `status`, `scale`, `binding`, `eviction`.
    pub subresource: Option<String>,
}

impl ResourcePath {
    /// The key of the named object (the namespace is empty for cluster-scoped resources).
    pub fn key(&self) -> Option<ObjectKey> {
        let namespace = if self.rtype.namespaced {
            self.namespace.as_deref().unwrap_or("default")
        } else {
            ""
        };
        self.name.as_deref().map(|name| ObjectKey::new(namespace, name))
    }
}

/// Resolves a path against the served resources.
pub fn route(store: &Store, path: &str) -> Result<Route, ApiError> {
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["healthz" | "livez" | "readyz", ..] => return Ok(Route::Health),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["apis", group] => return Ok(Route::Group((*group).to_owned())),
        ["api", version] => return Ok(Route::Resources(String::new(), (*version).to_owned())),
        ["apis", group, version] => return Ok(Route::Resources((*group).to_owned(), (*version).to_owned())),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::NoSuchResource),
    };
    let namespaced_path = match rest {
        ["namespaces", namespace, plural, tail @ ..] => store
            .resource_type(group, version, plural)
            .filter(|t| t.namespaced)
            .map(|rtype| (rtype, Some((*namespace).to_owned()), tail)),
        _ => None,
    };
    let (rtype, namespace, tail) = match namespaced_path {
        Some(found) => found,
        None => {
            let [plural, tail @ ..] = rest else {
                return Err(ApiError::NoSuchResource);
            };
            let rtype = store
                .resource_type(group, version, plural)
                .ok_or(ApiError::NoSuchResource)?;
            (rtype, None, tail)
        }
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(decode(name)), None),
        [name, sub] => (Some(decode(name)), Some((*sub).to_owned())),
        _ => return Err(ApiError::NoSuchResource),
    };
    Ok(Route::Resource(ResourcePath {
        rtype,
        namespace,
        name,
        subresource,
    }))
}

/// The query parameters kubesim acts on.
#[derive(Debug, Default)]
pub struct Query {
    params: HashMap<String, String>,
}

impl Query {
    /// Parses `a=b&c=d` with percent-decoding.
    pub fn parse(query: Option<&str>) -> Self {
        let params = query
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (decode(key), decode(value))
            })
            .collect();
        Self { params }
    }

    /// A raw parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A true/false parameter.
    pub fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    /// `dryRun=All`.
    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    /// `labelSelector`.
    pub fn label_selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::BadRequest(format!("unable to parse requirement: labelSelector: {e}")))
    }

    /// `fieldSelector`.
    pub fn field_selector(&self) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.get("fieldSelector").unwrap_or_default())
            .map_err(|e| ApiError::BadRequest(format!("invalid fieldSelector: {e}")))
    }

    /// A non-negative integer parameter (`limit`, `timeoutSeconds`).
    pub fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|text| {
                text.parse::<u64>().map_err(|_| {
                    ApiError::BadRequest(format!("{name}: not a non-negative integer: {text:?}"))
                })
            })
            .transpose()
    }

    /// `resourceVersion` as a number (None when absent or "0", which both mean "any").
    pub fn resource_version(&self) -> Result<Option<u64>, ApiError> {
        match self.get("resourceVersion") {
            None | Some("0") => Ok(None),
            Some(text) => text.parse::<u64>().map(Some).map_err(|_| {
                ApiError::BadRequest(format!("resourceVersion: not a resource version: {text:?}"))
            }),
        }
    }
}

/// Percent-decoding of a path segment or query component (`+` is a space in queries).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        index += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_decoded() {
        let query = Query::parse(Some(
            "labelSelector=app%3Dweb%2Ctier+in+%28a%29&limit=500&watch=true",
        ));
        assert_eq!(query.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(query.number("limit"), Ok(Some(500)));
        assert!(query.flag("watch"));
        assert!(
            matches!(Query::parse(Some("limit=x")).number("limit"), Err(ApiError::BadRequest(m)) if m.contains("limit"))
        );
    }
}

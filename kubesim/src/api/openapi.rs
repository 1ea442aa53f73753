//! The OpenAPI v3 documents kubectl and helm download before they write: an index of group versions
//! and, per group version, the operations of each resource.
//!
//! kubesim has no schemas, so the documents carry no component schemas; what clients read from them
//! is that creates and patches accept `fieldValidation`, which makes them leave validation to the
//! server. kubesim accepts every field (it does not reject unknown ones). `/openapi/v2` is not served
//! (404), which clients treat as "no v2 document".

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::{error::ApiError, store::Store};

/// Answers a path under `/openapi/`.
pub fn serve(store: &Store, path: &str) -> Result<Value, ApiError> {
    let rest = path.strip_prefix("/openapi/v3").ok_or(ApiError::NoSuchResource)?;
    let rest = rest.trim_matches('/');
    store.with_registry(|registry| {
        let group_versions: BTreeSet<(String, String)> =
            registry.all().map(|t| (t.group.clone(), t.version.clone())).collect();
        if rest.is_empty() {
            let mut paths = Map::new();
            for (group, version) in &group_versions {
                let prefix = prefix(group, version);
                let hash = fingerprint(registry.all().filter(|t| t.group == *group && t.version == *version).map(|t| t.plural.as_str()));
                paths.insert(prefix.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{prefix}?hash={hash:016X}")}));
            }
            return Ok(json!({"paths": paths}));
        }
        let (group, version) = group_versions
            .iter()
            .find(|(group, version)| prefix(group, version) == rest)
            .ok_or(ApiError::NoSuchResource)?;
        let mut paths = Map::new();
        for rtype in registry.all().filter(|t| t.group == *group && t.version == *version) {
            let gvk = json!({"group": group, "version": version, "kind": rtype.kind});
            let operation = |verb: &str| {
                json!({
                    "operationId": format!("{verb}{}", rtype.kind),
                    "x-kubernetes-action": verb,
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                })
            };
            let base = if rtype.namespaced {
                format!("/{}/namespaces/{{namespace}}/{}", prefix(group, version), rtype.plural)
            } else {
                format!("/{}/{}", prefix(group, version), rtype.plural)
            };
            paths.insert(base.clone(), json!({"post": operation("post"), "get": operation("list")}));
            paths.insert(
                format!("{base}/{{name}}"),
                json!({"get": operation("get"), "put": operation("put"), "patch": operation("patch"), "delete": operation("delete")}),
            );
        }
        Ok(json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (kubesim)", "version": format!("v{}.{}", super::KUBERNETES_VERSION.0, super::KUBERNETES_VERSION.1)},
            "paths": paths,
            "components": {"schemas": {}},
        }))
    })
}

fn prefix(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// FNV-1a over the resource names, so a client's cached document changes when a CRD adds one.
fn fingerprint<'a>(names: impl Iterator<Item = &'a str>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in names.flat_map(|name| name.bytes().chain([0])) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

//! Subresources: `/status` (spec and status written separately), `/scale` (an autoscaling/v1 Scale
//! view of a workload's `spec.replicas`, or of the paths a CRD's `subresources.scale` names),
//! `pods/binding` (what a scheduler posts), `pods/eviction` (a delete that honours
//! PodDisruptionBudgets: 429 when the budget is spent) and `serviceaccounts/token` (see [`token`]).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    ApiRequest, ResourcePath,
    field_validation::{Body, Declared},
    objects::{Document, apply_patch, field_write, is_apply, patch_stored, versioned},
    parse_body,
    table::evaluate,
    token,
};
use crate::object::text;
use crate::{
    budget,
    error::ApiError,
    managed_fields::{Scope, record_update},
    object::Pointer,
    store::{DeleteOptions, ObjectKey, Part, Store},
};
use crate::{patch::merge_patch, resources::ScalePaths};

/// Serves one subresource request; returns the code and the body.
pub fn handle(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
    subresource: &str,
) -> Result<(u16, Document), ApiError> {
    let key = path.key().ok_or(ApiError::NoSuchResource)?;
    let resource = path.rtype.group_resource();
    let dry_run = request.query.dry_run();
    let method = request.method.as_str();
    if !path.rtype.subresources().iter().any(|s| s.name == subresource) {
        return Err(ApiError::MethodNotAllowed);
    }
    match (subresource, method) {
        ("status", "GET") => Ok((200, versioned(path, store.get(&resource, &key)?))),
        ("status", "PUT") => {
            let mut object = parse_body(request)?;
            Declared::of(store, path).check(request, path, &mut object, Body::Object)?;
            let write = field_write(store, request, path, Scope::Status);
            let updated = store.modify(&resource, &key, Part::Status, dry_run, |current| {
                let mut next = object;
                record_update(Some(current), &mut next, &write);
                Ok(next)
            })?;
            Ok((200, versioned(path, updated)))
        }
        ("status", "PATCH") => {
            let patch = parse_body(request)?;
            let write = field_write(store, request, path, Scope::Status);
            let declared = Declared::of(store, path);
            if is_apply(request) {
                declared.check_applied(path, &patch)?;
            }
            let patched = patch_stored(
                store,
                request,
                path,
                &key,
                Part::Status,
                &patch,
                &write,
                &declared,
            )?;
            Ok((200, patched))
        }
        ("scale", "GET") => Ok((
            200,
            scale_of(&*store.get(&resource, &key)?, &scale_paths(path)?).into(),
        )),
        ("scale", "PUT" | "PATCH") => {
            let body = parse_body(request)?;
            let paths = scale_paths(path)?;
            let updated = store.modify(&resource, &key, Part::Main, dry_run, |current| {
                let scale = if method == "PUT" {
                    body.clone()
                } else {
                    apply_patch(path, &request.content_type, &scale_of(current, &paths), &body)?
                };
                let replicas = scale
                    .at("/spec/replicas")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| ApiError::Invalid {
                        kind: "Scale".to_owned(),
                        name: key.name.clone(),
                        reason: "spec.replicas: Required value".to_owned(),
                    })?;
                let mut next = current.clone();
                merge_patch(&mut next, &at_path(&paths.spec_replicas, json!(replicas)));
                next["metadata"]["resourceVersion"] = scale
                    .at("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                Ok(next)
            })?;
            Ok((200, scale_of(&updated, &paths).into()))
        }
        ("binding", "POST") => {
            let binding = parse_body(request)?;
            let node = text(&binding, "/target/name");
            bind(store, &key, None, node, dry_run)?;
            Ok((201, success().into()))
        }
        ("token", "POST") => {
            let account = store.get(&resource, &key)?;
            let request = body_or_empty(request)?;
            Ok((
                201,
                token::issue(&account, &request, store.clock().now_seconds())?.into(),
            ))
        }
        ("eviction", "POST") => {
            budget::evict(store, &key, &eviction_options(request, dry_run)?)?;
            Ok((201, success().into()))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// The body of a request whose body may be left out (an Eviction, a TokenRequest): `{}` then.
fn body_or_empty(request: &ApiRequest) -> Result<Value, ApiError> {
    if request.body.is_empty() {
        Ok(json!({}))
    } else {
        parse_body(request)
    }
}

/// The DeleteOptions an Eviction carries (`deleteOptions`: a uid precondition, a grace period);
/// an empty body takes the defaults.
fn eviction_options(request: &ApiRequest, dry_run: bool) -> Result<DeleteOptions, ApiError> {
    let body = body_or_empty(request)?;
    let options = &body["deleteOptions"];
    let precondition = |field: &str| {
        options
            .at(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    Ok(DeleteOptions {
        uid: precondition("uid"),
        resource_version: precondition("resourceVersion"),
        grace_period_seconds: options.get("gracePeriodSeconds").and_then(Value::as_i64),
        dry_run,
        ..DeleteOptions::default()
    })
}

fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// Binds a pod to a node, as kube-scheduler's bind does: 409 when it is already bound. `held` is
/// the pod as the binder read it, handed over so the binding need not copy it ([`Store::edit`]).
pub fn bind(
    store: &Store,
    pod: &ObjectKey,
    held: Option<Arc<Value>>,
    node: &str,
    dry_run: bool,
) -> Result<(), ApiError> {
    if node.is_empty() {
        return Err(ApiError::Invalid {
            kind: "Binding".to_owned(),
            name: pod.name.clone(),
            reason: "target.name: Required value".to_owned(),
        });
    }
    let now = store.clock().now_rfc3339();
    let assign = |object: &mut Value| {
        if let Some(bound) = object
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::Conflict {
                resource: "pods".to_owned(),
                name: pod.name.clone(),
                reason: format!("pod {} is already assigned to node \"{bound}\"", pod.name),
            });
        }
        object["spec"]["nodeName"] = json!(node);
        crate::conditions::set(object, "PodScheduled", "True", "", "", &now);
        Ok(true)
    };
    let pods = crate::resources::GroupResource::new("", "pods");
    if dry_run {
        store.modify(&pods, pod, Part::Whole, true, |current| {
            let mut next = current.clone();
            assign(&mut next)?;
            Ok(next)
        })?;
    } else {
        store.edit(&pods, pod, held, |_, object| assign(object))?;
    }
    Ok(())
}

/// Where the Scale of the resource at `path` reads and writes.
fn scale_paths(path: &ResourcePath) -> Result<ScalePaths, ApiError> {
    path.rtype.scale.clone().ok_or(ApiError::MethodNotAllowed)
}

/// A merge patch that sets the field at the dotted `path` (`.spec.replicas`) to `value`.
fn at_path(path: &str, value: Value) -> Value {
    path.split('.')
        .filter(|field| !field.is_empty())
        .rev()
        .fold(value, |inner, field| json!({ field: inner }))
}

/// The autoscaling/v1 Scale of an object, read at `paths`.
fn scale_of(object: &Value, paths: &ScalePaths) -> Value {
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(|selector| evaluate(object, &format!("{selector}.matchLabels")))
        .as_ref()
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let metadata = &object["metadata"];
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": metadata["name"], "namespace": metadata["namespace"], "uid": metadata["uid"],
            "resourceVersion": metadata["resourceVersion"], "creationTimestamp": metadata["creationTimestamp"],
        },
        "spec": {"replicas": evaluate(object, &paths.spec_replicas).unwrap_or(json!(1))},
        "status": {
            "replicas": evaluate(object, &paths.status_replicas).unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

//! The verbs on a resource's objects: list, create, update, patch (JSON, merge, strategic merge and
//! server-side apply), delete and deletecollection.
//!
//! Server-side apply creates the object when it is missing and otherwise merges the applied
//! configuration into it (strategic merge for built-in kinds, JSON merge for custom resources);
//! every write records its field manager's fields in `managedFields` ([`crate::managed_fields`]),
//! so an apply removes the fields its manager no longer applies and refuses to change fields other
//! managers own (409) unless forced.

use std::{borrow::Cow, sync::Arc};

use bytes::Bytes;
use serde_json::{Value, json};

use super::{
    ApiRequest, ResourcePath, custom_resources,
    field_validation::{Body, Declared},
    parse_body, table,
};
use crate::{
    clock::Clock,
    error::ApiError,
    managed_fields::{Lists, Scope, Write, record_apply, record_update},
    object::Pointer,
    patch::{json_patch, merge_patch, strategic_merge_patch},
    resources::ResourceType,
    store::{DeleteOptions, Encoded, ObjectKey, Part, Propagation, Store},
};

/// A list (serialized as it is written, without copying the objects), or a Table when kubectl asks
/// for one; paged by `limit` and `continue`.
pub fn list(store: &Store, request: &ApiRequest, path: &ResourcePath) -> Result<Vec<u8>, ApiError> {
    let labels = request.query.label_selector()?;
    let fields = request.query.field_selector()?;
    let limit = request
        .query
        .number("limit")?
        .and_then(|l| usize::try_from(l).ok())
        .filter(|l| *l > 0);
    let from = request.query.get("continue").map(parse_continue).transpose()?;
    let namespace = path
        .rtype
        .namespaced
        .then_some(path.namespace.as_deref())
        .flatten();
    let resource = path.rtype.group_resource();
    let metadata = |revision: u64, next: &Option<ObjectKey>| {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if let Some(next) = next {
            metadata["continue"] = json!(format!("{revision}.{}.{}", next.namespace, next.name));
        }
        metadata
    };
    let shown = request.shown();
    if shown != Shown::Whole || !labels.is_empty() || !fields.is_empty() {
        let page = store.list(&resource, namespace, from.as_ref(), limit, |object| {
            labels.matches(object.at("/metadata/labels").and_then(Value::as_object)) && fields.matches(object)
        });
        let metadata = metadata(page.revision, &page.next);
        match shown {
            Shown::Table => {
                let table = table::table(
                    &path.rtype,
                    &page.items,
                    metadata,
                    table::Options::of(request),
                    store.clock(),
                );
                return Ok(serde_json::to_vec(&table).unwrap_or_default());
            }
            Shown::Metadata => {
                let items = page.items.iter().map(|object| {
                    Ok(Bytes::from(
                        serde_json::to_vec(&PartialMetadata::of(object)).unwrap_or_default(),
                    ))
                });
                return list_body(("PartialObjectMetadataList", META_V1), metadata, items);
            }
            Shown::Whole => {}
        }
        // Each item was just read, so the store has its JSON at hand (a version in another
        // apiVersion is converted).
        let items = page
            .items
            .iter()
            .map(|object| match in_version(&path.rtype, object) {
                Cow::Borrowed(_) => Ok(store.encoded(object)),
                Cow::Owned(converted) => encode(path, &converted),
            });
        return list_body(list_kind(path), metadata, items);
    }
    let page = store.list_encoded(&resource, namespace, from.as_ref(), limit);
    let stored_as = StoredAs::of(&path.rtype);
    let items = page.items.iter().map(|json| {
        if stored_as.matches(json) {
            return Ok(json.clone());
        }
        let object: Value = serde_json::from_slice(json).map_err(|error| {
            ApiError::Internal(format!("a stored {} does not parse: {error}", path.rtype.kind))
        })?;
        encode(path, &object)
    });
    list_body(list_kind(path), metadata(page.revision, &page.next), items)
}

/// The API version of `PartialObjectMetadata` and its list.
const META_V1: &str = "meta.k8s.io/v1";

/// How a request wants objects shown, from its Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Whole, in the version the request used.
    Whole,
    /// As a `meta.k8s.io` Table (kubectl get).
    Table,
    /// As `PartialObjectMetadata`: the metadata alone.
    Metadata,
}

/// An object as `PartialObjectMetadata`, as kube-apiserver answers a metadata client: its
/// metadata, borrowed, serialized with the kind and version of that type.
#[derive(serde::Serialize)]
pub struct PartialMetadata<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: &'a Value,
}

impl<'a> PartialMetadata<'a> {
    /// The metadata of `object`.
    pub fn of(object: &'a Value) -> Self {
        Self {
            kind: "PartialObjectMetadata",
            api_version: META_V1,
            metadata: &object["metadata"],
        }
    }

    /// As a JSON value of its own.
    pub fn to_value(&self) -> Value {
        json!({"kind": self.kind, "apiVersion": self.api_version, "metadata": self.metadata})
    }
}

/// The kind and API version of a list of the path's resource (`PodList`, `v1`).
fn list_kind(path: &ResourcePath) -> (String, String) {
    (format!("{}List", path.rtype.kind), path.rtype.api_version())
}

/// Tells whether an object's stored JSON is already in a resource type's version, so it is sent
/// as it is: its `apiVersion` is the first key of the stored JSON (keys are kept sorted). A
/// mismatch sends it converted, which is right whatever the JSON.
pub struct StoredAs {
    head: Vec<u8>,
}

impl StoredAs {
    /// For objects served in `rtype`'s version.
    pub fn of(rtype: &ResourceType) -> Self {
        Self {
            head: format!("{{\"apiVersion\":{}", json!(rtype.api_version())).into_bytes(),
        }
    }

    /// Whether `json` is in that version.
    pub fn matches(&self, json: &[u8]) -> bool {
        json.starts_with(&self.head)
    }
}

/// An object of a list, in the version the request asked for.
fn encode(path: &ResourcePath, object: &Value) -> Result<Bytes, ApiError> {
    serde_json::to_vec(&*in_version(&path.rtype, object))
        .map(Bytes::from)
        .map_err(|error| ApiError::Internal(format!("cannot serialize {}: {error}", path.rtype.plural)))
}

/// A list document of `items` (already serialized), of `kind` in `api_version`.
fn list_body(
    (kind, api_version): (impl serde::Serialize, impl serde::Serialize),
    metadata: Value,
    items: impl Iterator<Item = Result<Bytes, ApiError>>,
) -> Result<Vec<u8>, ApiError> {
    let head = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
    let mut body = serde_json::to_vec(&head).unwrap_or_default();
    body.pop();
    body.extend_from_slice(b",\"items\":[");
    for (index, item) in items.enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item?);
    }
    body.extend_from_slice(b"]}");
    Ok(body)
}

/// A continue token: `revision.namespace.name`.
fn parse_continue(token: &str) -> Result<ObjectKey, ApiError> {
    let mut parts = token.splitn(3, '.');
    match (parts.next().map(str::parse::<u64>), parts.next(), parts.next()) {
        (Some(Ok(_)), Some(namespace), Some(name)) => Ok(ObjectKey::new(namespace, name)),
        _ => Err(ApiError::BadRequest(format!(
            "continue: not a continue token kubesim issued: {token:?}"
        ))),
    }
}

/// An object as a request wants it shown.
pub fn presented<'a>(rtype: &ResourceType, object: &'a Value, shown: Shown, clock: &Clock) -> Cow<'a, Value> {
    match shown {
        Shown::Table => {
            let metadata = json!({"resourceVersion": object.at("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)});
            let options = table::Options { include_object: true };
            Cow::Owned(table::table(
                rtype,
                &[Arc::new(object.clone())],
                metadata,
                options,
                clock,
            ))
        }
        Shown::Metadata => Cow::Owned(PartialMetadata::of(object).to_value()),
        Shown::Whole => in_version(rtype, object),
    }
}

/// The object with the apiVersion of the version the request used (all versions share storage);
/// copied only when that differs from the stored one.
pub fn in_version<'a>(rtype: &ResourceType, object: &'a Value) -> Cow<'a, Value> {
    let api_version = rtype.api_version();
    if object.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str()) {
        return Cow::Borrowed(object);
    }
    let mut object = object.clone();
    object["apiVersion"] = json!(api_version);
    Cow::Owned(object)
}

/// A response body: a stored object served as it is stored (shared, not copied: a large object's
/// copy would cost more than its serialization), or a value built for the response.
#[derive(Debug)]
pub enum Document {
    /// A stored version of an object.
    Stored(Arc<Value>),
    /// A stored version of an object as JSON, in the version the request asked for.
    Encoded(Bytes),
    /// Anything else.
    Built(Value),
}

impl From<Value> for Document {
    fn from(value: Value) -> Self {
        Document::Built(value)
    }
}

/// [`in_version`] as a response body: the stored object itself when the request used its version.
pub fn versioned(path: &ResourcePath, object: Arc<Value>) -> Document {
    match in_version(&path.rtype, &object) {
        Cow::Borrowed(_) => Document::Stored(object),
        Cow::Owned(other) => Document::Built(other),
    }
}

/// POST to a collection: 201 with the created object.
pub fn create(store: &Store, request: &ApiRequest, path: &ResourcePath) -> Result<(u16, Document), ApiError> {
    let mut object = parse_body(request)?;
    check_kind(path, &object)?;
    Declared::of(store, path).check(request, path, &mut object, Body::Object)?;
    custom_resources::judge(path, None, &object)?;
    record_update(
        None,
        &mut object,
        &field_write(store, request, path, main_scope(path)),
    );
    let namespace = if path.rtype.namespaced {
        path.namespace.as_deref().unwrap_or_default()
    } else {
        ""
    };
    let created = store.create(
        &path.rtype.group_resource(),
        namespace,
        object,
        request.query.dry_run(),
    )?;
    Ok((201, versioned(path, created)))
}

/// PUT on an object.
pub fn update(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
    key: &ObjectKey,
) -> Result<Document, ApiError> {
    let mut object = parse_body(request)?;
    check_kind(path, &object)?;
    Declared::of(store, path).check(request, path, &mut object, Body::Object)?;
    let write = field_write(store, request, path, main_scope(path));
    let updated = store.modify(
        &path.rtype.group_resource(),
        key,
        Part::Main,
        request.query.dry_run(),
        |current| {
            custom_resources::judge(path, Some(current), &object)?;
            let mut next = object;
            record_update(Some(current), &mut next, &write);
            Ok(next)
        },
    )?;
    Ok(versioned(path, updated))
}

/// PATCH on an object (or on `/status` through [`apply_patch`]); an apply patch of a missing object
/// creates it (201).
pub fn patch(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
    key: &ObjectKey,
) -> Result<(u16, Document), ApiError> {
    let resource = path.rtype.group_resource();
    let patch = parse_body(request)?;
    let dry_run = request.query.dry_run();
    let write = field_write(store, request, path, main_scope(path));
    let declared = Declared::of(store, path);
    if is_apply(request) {
        declared.check_applied(path, &patch)?;
    }
    if is_apply(request) && store.get(&resource, key).is_err() {
        check_kind(path, &patch)?;
        let mut object = patch.clone();
        object["metadata"]["name"] = json!(key.name);
        record_apply(None, &patch, &mut object, &write, false)?;
        custom_resources::judge(path, None, &object)?;
        let created = store.create(&resource, &key.namespace, object, dry_run)?;
        return Ok((201, versioned(path, created)));
    }
    let patched = patch_stored(store, request, path, key, Part::Main, &patch, &write, &declared)?;
    Ok((200, patched))
}

/// Applies a PATCH to `part` of the stored object at `key` and answers with the result: through
/// the store's spec-sparing write when the patch leaves the spec alone ([`leaves_spec_alone`]).
#[allow(clippy::too_many_arguments)]
pub fn patch_stored(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
    key: &ObjectKey,
    part: Part,
    patch: &Value,
    write: &Write,
    declared: &Declared,
) -> Result<Document, ApiError> {
    let resource = path.rtype.group_resource();
    let dry_run = request.query.dry_run();
    let change = |current: &Value| patched_and_recorded(request, path, current, patch, write, declared);
    if leaves_spec_alone(request, patch, part) {
        let patched = store.modify_sparing_spec(&resource, key, part, dry_run, change)?;
        return encoded_versioned(path, patched);
    }
    Ok(versioned(
        path,
        store.modify(&resource, key, part, dry_run, change)?,
    ))
}

/// Whether a PATCH leaves the object's spec as it is, so that the store applies it without parsing
/// the spec ([`Store::modify_sparing_spec`]): a merge patch (strategic or not) of the status, which
/// changes nothing else, or of the object when it names neither the spec nor a directive at its
/// top. A JSON patch may test or move fields of the spec, and an apply records who owns them.
fn leaves_spec_alone(request: &ApiRequest, patch: &Value, part: Part) -> bool {
    let media = request.content_type.split(';').next().unwrap_or_default().trim();
    let merge = matches!(
        media,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    );
    let names_no_spec = || {
        patch
            .as_object()
            .is_some_and(|fields| fields.keys().all(|name| name != "spec" && !name.starts_with('$')))
    };
    merge && (part == Part::Status || names_no_spec())
}

/// [`versioned`] for an object the store wrote as JSON: that JSON when the request used its
/// version.
fn encoded_versioned(path: &ResourcePath, written: Encoded) -> Result<Document, ApiError> {
    if written.api_version == path.rtype.api_version() {
        return Ok(Document::Encoded(written.json));
    }
    let object = serde_json::from_slice(&written.json)
        .map_err(|error| ApiError::Internal(format!("a written object does not parse: {error}")))?;
    Ok(versioned(path, Arc::new(object)))
}

/// Whether a PATCH is a server-side apply.
pub fn is_apply(request: &ApiRequest) -> bool {
    request.content_type.starts_with("application/apply-patch")
}

/// The main resource's scope of field ownership.
fn main_scope(path: &ResourcePath) -> Scope {
    Scope::Main {
        status_subresource: path.rtype.status_subresource,
    }
}

/// How a write through `path` is recorded in `managedFields`.
pub fn field_write<'r>(
    store: &Store,
    request: &'r ApiRequest,
    path: &ResourcePath,
    scope: Scope,
) -> Write<'r> {
    Write {
        manager: request.field_manager(),
        api_version: path.rtype.api_version(),
        time: store.clock().now_rfc3339(),
        lists: if is_builtin(path) {
            Lists::Strategic
        } else {
            Lists::Atomic
        },
        scope,
    }
}

/// `current` with the PATCH applied and the write recorded in its `managedFields` (an apply's
/// configuration is checked for unknown fields by the caller, any other patch's result here).
pub fn patched_and_recorded(
    request: &ApiRequest,
    path: &ResourcePath,
    current: &Value,
    patch: &Value,
    write: &Write,
    declared: &Declared,
) -> Result<Value, ApiError> {
    let mut next = apply_patch(path, &request.content_type, current, patch)?;
    if is_apply(request) {
        record_apply(
            Some(current),
            patch,
            &mut next,
            write,
            request.query.flag("force"),
        )?;
    } else {
        declared.check(request, path, &mut next, Body::Patched)?;
        record_update(Some(current), &mut next, write);
    }
    if matches!(write.scope, Scope::Main { .. }) {
        custom_resources::judge(path, Some(current), &next)?;
    }
    Ok(next)
}

/// Applies a patch of the given content type to a copy of `current`.
pub fn apply_patch(
    path: &ResourcePath,
    content_type: &str,
    current: &Value,
    patch: &Value,
) -> Result<Value, ApiError> {
    let builtin = is_builtin(path);
    let mut next = current.clone();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let invalid = |e: crate::patch::PatchError| ApiError::Invalid {
        kind: path.rtype.kind.clone(),
        name: path.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    };
    match media {
        "application/json-patch+json" => json_patch(&mut next, patch).map_err(invalid)?,
        "application/merge-patch+json" => merge_patch(&mut next, patch),
        "application/strategic-merge-patch+json" if builtin => {
            strategic_merge_patch(&mut next, patch).map_err(invalid)?
        }
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            let mut applied = patch.clone();
            if let Some(metadata) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.remove("resourceVersion");
                metadata.remove("managedFields");
            }
            if builtin {
                strategic_merge_patch(&mut next, &applied).map_err(invalid)?;
            } else {
                merge_patch(&mut next, &applied);
            }
        }
        _ => {
            let accepted = if builtin {
                "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
            } else {
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            };
            return Err(ApiError::UnsupportedMediaType(accepted.to_owned()));
        }
    }
    Ok(next)
}

/// Built-in kinds take strategic merge patches; custom resources do not.
fn is_builtin(path: &ResourcePath) -> bool {
    !path.rtype.group.contains('.') || path.rtype.group.ends_with(".k8s.io")
}

/// DELETE on an object: 200 with the object (gone, or marked for deletion when finalizers remain or
/// a pod shuts down), as kube-apiserver answers it.
pub fn delete(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
    key: &ObjectKey,
) -> Result<(u16, Document), ApiError> {
    let options = delete_options(request)?;
    let deleted = store.delete(&path.rtype.group_resource(), key, &options)?;
    Ok((200, versioned(path, deleted)))
}

/// DELETE on a collection: every object that matches the selectors.
pub fn delete_collection(
    store: &Store,
    request: &ApiRequest,
    path: &ResourcePath,
) -> Result<Value, ApiError> {
    let labels = request.query.label_selector()?;
    let fields = request.query.field_selector()?;
    let options = delete_options(request)?;
    let namespace = path
        .rtype
        .namespaced
        .then_some(path.namespace.as_deref())
        .flatten();
    let resource = path.rtype.group_resource();
    let page = store.list(&resource, namespace, None, None, |object| {
        labels.matches(object.at("/metadata/labels").and_then(Value::as_object)) && fields.matches(object)
    });
    let mut items = Vec::new();
    for object in page.items {
        let key = ObjectKey::of(&object);
        match store.delete(&resource, &key, &options) {
            Ok(deleted) => items.push(in_version(&path.rtype, &deleted).into_owned()),
            Err(ApiError::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(json!({
        "kind": format!("{}List", path.rtype.kind),
        "apiVersion": path.rtype.api_version(),
        "metadata": {"resourceVersion": store.revision().to_string()},
        "items": items,
    }))
}

/// DeleteOptions from the body (kube-rs, kubectl) and the query.
fn delete_options(request: &ApiRequest) -> Result<DeleteOptions, ApiError> {
    // helm sends DeleteOptions as protobuf; kubesim reads only JSON options and takes the defaults
    // (background propagation, no preconditions) for any other encoding.
    let body: Value = if request.body.is_empty() || !request.content_type.contains("json") {
        json!({})
    } else {
        parse_body(request)?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| request.query.get("propagationPolicy"))
        .unwrap_or("Background");
    let propagation = match policy {
        "Orphan" => Propagation::Orphan,
        "Background" | "Foreground" => Propagation::Background,
        other => {
            return Err(ApiError::BadRequest(format!(
                "propagationPolicy: unknown policy {other:?}"
            )));
        }
    };
    let orphan = body.get("orphanDependents").and_then(Value::as_bool) == Some(true);
    let dry_run = request.query.dry_run()
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        propagation: if orphan { Propagation::Orphan } else { propagation },
        uid: body
            .at("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_owned),
        resource_version: body
            .at("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned),
        grace_period_seconds: body
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| request.query.get("gracePeriodSeconds")?.parse().ok()),
        dry_run,
    })
}

/// A body whose kind contradicts the path is refused, as kube-apiserver does.
fn check_kind(path: &ResourcePath, object: &Value) -> Result<(), ApiError> {
    match object.get("kind").and_then(Value::as_str) {
        Some(kind) if kind != path.rtype.kind => Err(ApiError::BadRequest(format!(
            "the kind {kind} of the body does not match the resource {} ({})",
            path.rtype.plural, path.rtype.kind
        ))),
        _ => Ok(()),
    }
}

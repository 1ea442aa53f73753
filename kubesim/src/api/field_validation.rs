//! Unknown fields, handled as kube-apiserver handles them under the `fieldValidation` parameter.
//!
//! A field the kind does not have (a built-in kind's field as its Go type declares it, read from the
//! Kubernetes protobuf descriptors; a custom resource's as its CRD's structural schema declares it,
//! with `metadata` checked as ObjectMeta) is, for a create, an update or the result of a patch:
//!
//! - `Strict`: refused, 400 for a whole object and 422 for a patch, naming every unknown field
//!   (`kubectl` sends `Strict` unless told `--validate=warn|false`);
//! - `Warn` (the default): dropped, with a `Warning: 299` header per field, as `kubectl` prints them;
//! - `Ignore`: dropped silently.
//!
//! A server-side apply configuration with an unknown field is refused whatever the parameter (500,
//! as kube-apiserver fails to build its typed patch).
//!
//! Failure modes: a kind with no descriptor and a custom resource whose CRD kubesim does not hold
//! are not checked; a duplicate field cannot be seen (the body is parsed before it is checked).

use std::sync::Arc;

use serde_json::Value;

use super::{ApiRequest, ResourcePath};
use crate::{
    error::ApiError,
    object::Pointer,
    patch::{ListStrategy, list_strategy},
    protobuf::{Findings, Scan, Step, unknown_fields, unknown_metadata_fields},
    resources::GroupResource,
    store::{ObjectKey, Store},
};

/// The `fieldValidation` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Directive {
    Strict,
    Warn,
    Ignore,
}

impl Directive {
    fn of(request: &ApiRequest) -> Result<Directive, ApiError> {
        match request.query.get("fieldValidation") {
            None | Some("Warn") => Ok(Directive::Warn),
            Some("Strict") => Ok(Directive::Strict),
            Some("Ignore") => Ok(Directive::Ignore),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation: invalid value {other:?}: must be one of Ignore, Warn or Strict"
            ))),
        }
    }
}

/// What the checked object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// A whole object sent by the client (create, update).
    Object,
    /// The result of a JSON, merge or strategic merge patch.
    Patched,
}

/// The declared fields of one kind: its protobuf descriptor, or its CRD's schema (resolved before
/// the store is locked for a write).
pub struct Declared {
    crd: Option<Arc<Value>>,
}

impl Declared {
    /// What declares the fields of the path's kind.
    pub fn of(store: &Store, path: &ResourcePath) -> Declared {
        let rtype = &path.rtype;
        let crds = GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions");
        let custom = rtype.group.contains('.') && !rtype.group.ends_with(".k8s.io");
        let crd = custom
            .then(|| {
                store
                    .get(
                        &crds,
                        &ObjectKey::new("", &format!("{}.{}", rtype.plural, rtype.group)),
                    )
                    .ok()
            })
            .flatten();
        Declared { crd }
    }

    /// Checks `object` for unknown fields under the request's `fieldValidation`: refuses it, or
    /// drops them (recording a warning for each unless told to ignore them). A built-in object's
    /// empty map fields are dropped too, as Go's JSON leaves them out.
    pub fn check(
        &self,
        request: &ApiRequest,
        path: &ResourcePath,
        object: &mut Value,
        body: Body,
    ) -> Result<(), ApiError> {
        let directive = Directive::of(request)?;
        let found = self.scan(path, object, Scan::Every);
        for steps in &found.empty_maps {
            remove(object, steps);
        }
        if found.unknown.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = found.unknown.iter().map(|steps| dotted(steps)).collect();
        if directive == Directive::Strict {
            let kind = &path.rtype.kind;
            let listed = named
                .iter()
                .map(|field| format!("unknown field {field:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            let reason = format!(
                "{kind} in version {:?} cannot be handled as a {kind}: strict decoding error: {listed}",
                path.rtype.version
            );
            return Err(match body {
                Body::Object => ApiError::BadRequest(reason),
                Body::Patched => ApiError::Invalid {
                    kind: kind.clone(),
                    name: path.name.clone().unwrap_or_default(),
                    reason,
                },
            });
        }
        for steps in &found.unknown {
            remove(object, steps);
        }
        if directive == Directive::Warn {
            request.warn(named.iter().map(|field| format!("unknown field {field:?}")));
        }
        Ok(())
    }

    /// Refuses a server-side apply configuration with unknown fields, as kube-apiserver does: in
    /// each object up to its first unknown field, a built-in object's `metadata` left out.
    /// kube-apiserver walks an object's fields in Go's random map order, so which fields it names
    /// varies from call to call; kubesim names them in the order of their names, one of its
    /// answers.
    pub fn check_applied(&self, path: &ResourcePath, config: &Value) -> Result<(), ApiError> {
        let builtin = self.crd.is_none();
        let unknown: Vec<Vec<Step>> = self
            .scan(path, config, Scan::UpToTheFirstUnknown)
            .unknown
            .into_iter()
            .filter(|steps| !(builtin && steps.first() == Some(&Step::Field("metadata".to_owned()))))
            .collect();
        let fields: Vec<String> = unknown
            .iter()
            .map(|steps| {
                format!(
                    "{}: field not declared in schema",
                    applied_path(config, steps, builtin)
                )
            })
            .collect();
        let listed = match fields.as_slice() {
            [] => return Ok(()),
            [one] => one.clone(),
            many => format!("errors:\n  {}", many.join("\n  ")),
        };
        Err(ApiError::ApplyFailed(format!(
            "failed to create typed patch object ({}/{}; {}, Kind={}): {listed}",
            path.namespace.as_deref().unwrap_or_default(),
            path.name.as_deref().unwrap_or_default(),
            path.rtype.api_version(),
            path.rtype.kind,
        )))
    }

    /// The unknown fields (and empty maps) of an object of the path's kind.
    fn scan(&self, path: &ResourcePath, object: &Value, scan: Scan) -> Findings {
        let rtype = &path.rtype;
        if self.crd.is_none() {
            return unknown_fields(&rtype.api_version(), &rtype.kind, object, scan).unwrap_or_default();
        }
        let schema = self
            .crd
            .as_deref()
            .and_then(|crd| crd.at("/spec/versions"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|version| version["name"] == rtype.version.as_str())
            .and_then(|version| version.at("/schema/openAPIV3Schema"));
        let mut found = Findings::default();
        let Some(schema) = schema else {
            return found;
        };
        let mut walk = SchemaWalk {
            scan,
            steps: Vec::new(),
            unknown: Vec::new(),
        };
        for (key, value) in object.as_object().into_iter().flatten() {
            let known = match key.as_str() {
                "apiVersion" | "kind" => true,
                "metadata" => {
                    let path = [Step::Field(key.clone())];
                    walk.unknown.extend(unknown_metadata_fields(value, &path, scan));
                    true
                }
                _ => walk.field(schema, key, value),
            };
            if !known && scan == Scan::UpToTheFirstUnknown {
                break;
            }
        }
        found.unknown = walk.unknown;
        found
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// A walk of a custom resource beside its CRD's structural schema.
struct SchemaWalk {
    scan: Scan,
    steps: Vec<Step>,
    unknown: Vec<Vec<Step>>,
}

impl SchemaWalk {
    /// Checks the field `key` of an object of schema `parent`; false when the schema has no such
    /// field and keeps no unknown ones.
    fn field(&mut self, parent: &Value, key: &str, value: &Value) -> bool {
        let properties = parent.get("properties").and_then(Value::as_object);
        let additional = parent.get("additionalProperties").filter(|a| a.is_object());
        let free = properties.is_none() && additional.is_none()
            || preserves_unknown(parent)
            || parent.get("additionalProperties") == Some(&Value::Bool(true));
        self.steps.push(Step::Field(key.to_owned()));
        let known = match properties.and_then(|p| p.get(key)).or(additional) {
            Some(schema) => {
                self.value(schema, value);
                true
            }
            None if free => true,
            None => {
                self.unknown.push(self.steps.clone());
                false
            }
        };
        self.steps.pop();
        known
    }

    fn value(&mut self, schema: &Value, value: &Value) {
        match value {
            Value::Object(map) => {
                for (key, item) in map.iter().filter(|(_, item)| !item.is_null()) {
                    if !self.field(schema, key, item) && self.scan == Scan::UpToTheFirstUnknown {
                        break;
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (index, item) in items.iter().enumerate() {
                        self.steps.push(Step::Index(index));
                        self.value(item_schema, item);
                        self.steps.pop();
                    }
                }
            }
            _ => {}
        }
    }
}

/// A path as server-side apply prints it: `.spec.template.spec.containers[name="web"].image`, a
/// built-in list merged by a key naming its item by that key.
fn applied_path(config: &Value, steps: &[Step], builtin: bool) -> String {
    let mut out = String::new();
    let mut node = Some(config);
    let mut parent: Option<&Value> = None;
    let mut field = "";
    for step in steps {
        match step {
            Step::Field(name) => {
                out.push('.');
                out.push_str(name);
                parent = node;
                node = node.and_then(|n| n.get(name));
                field = name;
            }
            Step::Index(index) => {
                let item = node.and_then(|n| n.get(*index));
                let key = match (builtin, parent.and_then(Value::as_object)) {
                    (true, Some(map)) => match list_strategy(field, map, map) {
                        ListStrategy::Keyed(key) => {
                            item.and_then(|i| i.get(key)).map(|v| format!("{key}={v}"))
                        }
                        _ => None,
                    },
                    _ => None,
                };
                out.push_str(&format!("[{}]", key.unwrap_or_else(|| index.to_string())));
                node = item;
            }
        }
    }
    out
}

/// A path as kube-apiserver prints it: `spec.template.spec.containers[0].imagePolicy`.
fn dotted(steps: &[Step]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Field(field) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(field);
            }
            Step::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Removes the field at `steps`.
fn remove(object: &mut Value, steps: &[Step]) {
    let Some((Step::Field(last), parents)) = steps.split_last() else {
        return;
    };
    let parent = parents.iter().try_fold(object, |node, step| match step {
        Step::Field(field) => node.get_mut(field),
        Step::Index(index) => node.get_mut(*index),
    });
    if let Some(map) = parent.and_then(Value::as_object_mut) {
        map.remove(last);
    }
}

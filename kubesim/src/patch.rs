//! The three PATCH flavours of the Kubernetes API, applied to objects held as JSON.
//!
//! - [`merge_patch`]: `application/merge-patch+json` (RFC 7386). It cannot fail.
//! - [`json_patch`]: `application/json-patch+json` (RFC 6902), applied atomically.
//! - [`strategic_merge_patch`]: `application/strategic-merge-patch+json`, the flavour `kubectl apply`,
//!   `kubectl patch` and most controllers use for built-in kinds. Lists are merged by the key the
//!   Kubernetes Go struct tags name (`containers` by `name`, `conditions` by `type`, ...), and the
//!   `$patch`, `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList` directives are honoured
//!   and never stored.
//!
//! JSON patch and strategic merge patch fail with a [`PatchError`] naming the operation index and
//! pointer, or the field, that could not be applied (kube-apiserver answers such requests with
//! `422 Unprocessable Entity` or `400 Bad Request`). On error the target is left unchanged.

use serde_json::{Map, Value};

/// Why a JSON patch or strategic merge patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The JSON patch document is not an array.
    #[error("JSON patch must be an array of operations, found {found}")]
    JsonPatchNotArray {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A JSON patch operation is not an object.
    #[error("JSON patch operation {index} must be an object, found {found}")]
    OperationNotObject {
        /// The zero-based index of the operation.
        index: usize,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A JSON patch operation lacks a member it needs (`op`, `path`, `from` or `value`), or a
    /// string member is not a string.
    #[error("JSON patch operation {index} is missing the {member:?} member (or it has the wrong type)")]
    MissingMember {
        /// The zero-based index of the operation.
        index: usize,
        /// The member's name.
        member: &'static str,
    },
    /// A JSON patch operation has an `op` other than the six RFC 6902 defines.
    #[error(
        "JSON patch operation {index} has unknown op {op:?} \
         (expected add, remove, replace, move, copy or test)"
    )]
    UnknownOp {
        /// The zero-based index of the operation.
        index: usize,
        /// The op as written.
        op: String,
    },
    /// A `path` or `from` is not an RFC 6901 JSON pointer.
    #[error("JSON patch operation {index}: {pointer:?} is not a valid JSON pointer")]
    InvalidPointer {
        /// The zero-based index of the operation.
        index: usize,
        /// The pointer as written.
        pointer: String,
    },
    /// A pointer names a location that does not exist (or whose parent does not exist, for `add`).
    #[error("JSON patch operation {index}: path {pointer:?} does not exist")]
    PathNotFound {
        /// The zero-based index of the operation.
        index: usize,
        /// The pointer as written.
        pointer: String,
    },
    /// `add` names an array index past the end of the array.
    #[error("JSON patch operation {index}: array index in {pointer:?} is out of bounds")]
    IndexOutOfBounds {
        /// The zero-based index of the operation.
        index: usize,
        /// The pointer as written.
        pointer: String,
    },
    /// `remove` or `move` names the whole document (the empty pointer).
    #[error("JSON patch operation {index}: cannot remove the whole document (pointer \"\")")]
    RemoveRoot {
        /// The zero-based index of the operation.
        index: usize,
    },
    /// `move` names a destination inside its own source.
    #[error("JSON patch operation {index}: cannot move {from:?} into its own child {pointer:?}")]
    MoveIntoChild {
        /// The zero-based index of the operation.
        index: usize,
        /// The source pointer.
        from: String,
        /// The destination pointer.
        pointer: String,
    },
    /// A `test` operation found a different value.
    #[error("JSON patch operation {index}: test failed, the value at {pointer:?} is not {expected}")]
    TestFailed {
        /// The zero-based index of the operation.
        index: usize,
        /// The pointer tested.
        pointer: String,
        /// The expected value, as JSON text.
        expected: String,
    },
    /// A strategic merge patch is not a JSON object.
    #[error("strategic merge patch must be a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A `$patch` directive is not `replace`, `merge` or `delete`.
    #[error(
        "strategic merge patch: unknown $patch directive {value} in {field:?} \
         (expected replace, merge or delete)"
    )]
    UnknownDirective {
        /// The dotted path of the field carrying the directive (`<root>` for the top level).
        field: String,
        /// The directive's value, as JSON text.
        value: String,
    },
    /// A `$retainKeys`, `$setElementOrder/...` or `$deleteFromPrimitiveList/...` directive has the
    /// wrong shape.
    #[error("strategic merge patch: directive {directive:?} {reason}")]
    InvalidDirective {
        /// The dotted path of the directive.
        directive: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The JSON type of a value, for error messages.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// RFC 7386 JSON merge patch (application/merge-patch+json): objects merge recursively, null deletes,
/// anything else replaces.
///
/// Lists are always replaced wholesale, so a merge patch of `spec.containers` must carry every
/// container. A patch that is not an object replaces the target.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// RFC 6902 JSON patch (application/json-patch+json): add, remove, replace, move, copy, test, with
/// RFC 6901 pointers (~0 ~1 escapes, `-` to append). Applied atomically: on error the target is left
/// unchanged.
///
/// As the RFC requires, `add` does not create missing parents: adding
/// `/metadata/labels/app` to an object without labels fails. Numbers compare numerically in
/// `test` (`1` equals `1.0`).
///
/// # Errors
///
/// A [`PatchError`] naming the zero-based index of the first operation that failed and its
/// pointer: a malformed operation, an invalid pointer, a missing location, an out-of-bounds array
/// index, a failed `test`, or a `move` into its own child.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Array(operations) = patch else {
        return Err(PatchError::JsonPatchNotArray {
            found: json_type(patch),
        });
    };
    let mut document = target.clone();
    for (index, operation) in operations.iter().enumerate() {
        apply_operation(&mut document, index, operation)?;
    }
    *target = document;
    Ok(())
}

/// Why a pointer could not be followed, before the operation index and pointer are attached.
enum Fault {
    NotFound,
    OutOfBounds,
    Root,
}

impl Fault {
    fn into_error(self, index: usize, pointer: &str) -> PatchError {
        match self {
            Fault::NotFound => PatchError::PathNotFound {
                index,
                pointer: pointer.to_owned(),
            },
            Fault::OutOfBounds => PatchError::IndexOutOfBounds {
                index,
                pointer: pointer.to_owned(),
            },
            Fault::Root => PatchError::RemoveRoot { index },
        }
    }
}

fn string_member<'o>(
    operation: &'o Map<String, Value>,
    index: usize,
    member: &'static str,
) -> Result<&'o str, PatchError> {
    operation
        .get(member)
        .and_then(Value::as_str)
        .ok_or(PatchError::MissingMember { index, member })
}

fn value_member(operation: &Map<String, Value>, index: usize) -> Result<&Value, PatchError> {
    operation.get("value").ok_or(PatchError::MissingMember {
        index,
        member: "value",
    })
}

/// Parses an RFC 6901 pointer into unescaped reference tokens; `None` if it is malformed.
fn parse_pointer(pointer: &str) -> Option<Vec<String>> {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    pointer
        .strip_prefix('/')?
        .split('/')
        .map(unescape_token)
        .collect()
}

fn unescape_token(raw: &str) -> Option<String> {
    let mut token = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => token.push('~'),
                Some('1') => token.push('/'),
                _ => return None,
            }
        } else {
            token.push(c);
        }
    }
    Some(token)
}

/// An RFC 6901 array index: `0` or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    let well_formed = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if well_formed { token.parse().ok() } else { None }
}

fn resolve<'v>(document: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    tokens.iter().try_fold(document, |current, token| match current {
        Value::Object(map) => map.get(token.as_str()),
        Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
        _ => None,
    })
}

fn resolve_mut<'v>(document: &'v mut Value, tokens: &[String]) -> Option<&'v mut Value> {
    tokens.iter().try_fold(document, |current, token| match current {
        Value::Object(map) => map.get_mut(token.as_str()),
        Value::Array(items) => array_index(token).and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

fn add_at(document: &mut Value, tokens: &[String], value: Value) -> Result<(), Fault> {
    let Some((last, parent_tokens)) = tokens.split_last() else {
        *document = value;
        return Ok(());
    };
    match resolve_mut(document, parent_tokens).ok_or(Fault::NotFound)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            if last == "-" {
                items.push(value);
                return Ok(());
            }
            let position = array_index(last).ok_or(Fault::NotFound)?;
            if position > items.len() {
                return Err(Fault::OutOfBounds);
            }
            items.insert(position, value);
            Ok(())
        }
        _ => Err(Fault::NotFound),
    }
}

fn remove_at(document: &mut Value, tokens: &[String]) -> Result<Value, Fault> {
    let (last, parent_tokens) = tokens.split_last().ok_or(Fault::Root)?;
    match resolve_mut(document, parent_tokens).ok_or(Fault::NotFound)? {
        Value::Object(map) => map.remove(last.as_str()).ok_or(Fault::NotFound),
        Value::Array(items) => {
            let position = array_index(last)
                .filter(|&i| i < items.len())
                .ok_or(Fault::NotFound)?;
            Ok(items.remove(position))
        }
        _ => Err(Fault::NotFound),
    }
}

/// JSON equality with numbers compared by value, as RFC 6902 `test` requires.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || x.as_f64()
                    .zip(y.as_f64())
                    .is_some_and(|(x, y)| x.partial_cmp(&y) == Some(std::cmp::Ordering::Equal))
        }
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            xs.len() == ys.len()
                && xs
                    .iter()
                    .all(|(key, x)| ys.get(key).is_some_and(|y| json_equal(x, y)))
        }
        _ => a == b,
    }
}

/// The `from` member of a `move` or `copy`, as written and as parsed.
fn from_member(operation: &Map<String, Value>, index: usize) -> Result<(&str, Vec<String>), PatchError> {
    let from = string_member(operation, index, "from")?;
    let tokens = parse_pointer(from).ok_or_else(|| PatchError::InvalidPointer {
        index,
        pointer: from.to_owned(),
    })?;
    Ok((from, tokens))
}

fn apply_operation(document: &mut Value, index: usize, operation: &Value) -> Result<(), PatchError> {
    let Value::Object(operation) = operation else {
        return Err(PatchError::OperationNotObject {
            index,
            found: json_type(operation),
        });
    };
    let op = string_member(operation, index, "op")?;
    let path = string_member(operation, index, "path")?;
    let tokens = parse_pointer(path).ok_or_else(|| PatchError::InvalidPointer {
        index,
        pointer: path.to_owned(),
    })?;
    match op {
        "add" => {
            let value = value_member(operation, index)?.clone();
            add_at(document, &tokens, value).map_err(|fault| fault.into_error(index, path))
        }
        "remove" => remove_at(document, &tokens)
            .map(drop)
            .map_err(|fault| fault.into_error(index, path)),
        "replace" => {
            let value = value_member(operation, index)?.clone();
            let slot = resolve_mut(document, &tokens).ok_or_else(|| PatchError::PathNotFound {
                index,
                pointer: path.to_owned(),
            })?;
            *slot = value;
            Ok(())
        }
        "move" => {
            let (from, source) = from_member(operation, index)?;
            if source == tokens {
                return if resolve(document, &source).is_some() {
                    Ok(())
                } else {
                    Err(PatchError::PathNotFound {
                        index,
                        pointer: from.to_owned(),
                    })
                };
            }
            if tokens.starts_with(&source) {
                return Err(PatchError::MoveIntoChild {
                    index,
                    from: from.to_owned(),
                    pointer: path.to_owned(),
                });
            }
            let value = remove_at(document, &source).map_err(|fault| fault.into_error(index, from))?;
            add_at(document, &tokens, value).map_err(|fault| fault.into_error(index, path))
        }
        "copy" => {
            let (from, source) = from_member(operation, index)?;
            let value = resolve(document, &source)
                .cloned()
                .ok_or_else(|| PatchError::PathNotFound {
                    index,
                    pointer: from.to_owned(),
                })?;
            add_at(document, &tokens, value).map_err(|fault| fault.into_error(index, path))
        }
        "test" => {
            let expected = value_member(operation, index)?;
            let actual = resolve(document, &tokens).ok_or_else(|| PatchError::PathNotFound {
                index,
                pointer: path.to_owned(),
            })?;
            if json_equal(actual, expected) {
                Ok(())
            } else {
                Err(PatchError::TestFailed {
                    index,
                    pointer: path.to_owned(),
                    expected: expected.to_string(),
                })
            }
        }
        other => Err(PatchError::UnknownOp {
            index,
            op: other.to_owned(),
        }),
    }
}

const PATCH_DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Strategic merge patch (application/strategic-merge-patch+json) for built-in kinds.
///
/// Maps merge recursively and `null` deletes a key. Lists follow Kubernetes' patch strategies:
/// `containers`, `initContainers`, `ephemeralContainers`, `volumes`, `env`, `imagePullSecrets` and
/// `resourceClaims` merge by `name`; `volumeMounts` by `mountPath`; `volumeDevices` by `devicePath`;
/// `conditions` and `addresses` by `type`; `ownerReferences` by `uid`; `hostAliases` by `ip`;
/// `topologySpreadConstraints` by `topologyKey`; `ports` by `containerPort` inside a container and by
/// `port` elsewhere (Service ports). `finalizers` is a set union. Every other list (`tolerations`,
/// Node `taints`, `args`, ...) is replaced wholesale.
///
/// Directives: `"$patch": "replace"` replaces a map, `"$patch": "delete"` deletes a map field or a
/// keyed-list element, a bare `{"$patch": "replace"}` element replaces a list with the patch's other
/// elements, `$setElementOrder/<field>` reorders the elements it names (elements it does not name keep
/// their positions), `$retainKeys` drops the keys it does not list, and
/// `$deleteFromPrimitiveList/<field>` removes values from a primitive list. None of them is stored.
///
/// A target that is not an object is treated as an empty object.
///
/// # Errors
///
/// [`PatchError::NotAnObject`] for a patch that is not an object, [`PatchError::UnknownDirective`]
/// for a `$patch` other than `replace`, `merge` or `delete`, and [`PatchError::InvalidDirective`]
/// for a malformed `$retainKeys`, `$setElementOrder/...` or `$deleteFromPrimitiveList/...`. The
/// target is left unchanged on error.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(patch_map) = patch else {
        return Err(PatchError::NotAnObject {
            found: json_type(patch),
        });
    };
    let mut merged = match target {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    merge_map(&mut merged, patch_map, "")?;
    *target = Value::Object(merged);
    Ok(())
}

/// A `$patch` directive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Directive {
    Replace,
    Merge,
    Delete,
}

/// How a list field is patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListStrategy {
    /// Merge elements that share this key's value.
    Keyed(&'static str),
    /// Union of primitives.
    Set,
    /// Replace wholesale.
    Atomic,
}

/// The dotted path of a field, for error messages.
fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// The dotted path of a field carrying a directive, `<root>` for the top level.
fn field_name(path: &str) -> String {
    if path.is_empty() {
        "<root>".to_owned()
    } else {
        path.to_owned()
    }
}

fn is_directive_key(key: &str) -> bool {
    key == PATCH_DIRECTIVE
        || key == RETAIN_KEYS
        || key.starts_with(SET_ELEMENT_ORDER)
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
}

/// The `$patch` directive of a patch map, if any.
fn directive(map: &Map<String, Value>, path: &str) -> Result<Option<Directive>, PatchError> {
    let Some(raw) = map.get(PATCH_DIRECTIVE) else {
        return Ok(None);
    };
    match raw.as_str() {
        Some("replace") => Ok(Some(Directive::Replace)),
        Some("merge") => Ok(Some(Directive::Merge)),
        Some("delete") => Ok(Some(Directive::Delete)),
        _ => Err(PatchError::UnknownDirective {
            field: field_name(path),
            value: raw.to_string(),
        }),
    }
}

/// Whether a list element is nothing but a `$patch` directive (`{"$patch": "replace"}`).
fn is_bare_directive(element: &Value) -> bool {
    matches!(element, Value::Object(map) if map.len() == 1 && map.contains_key(PATCH_DIRECTIVE))
}

/// Whether a map is a container (so its `ports` are keyed by `containerPort`).
fn is_container(target_parent: &Map<String, Value>, patch_parent: &Map<String, Value>) -> bool {
    let has_container_ports = |map: &Map<String, Value>| {
        matches!(map.get("ports"), Some(Value::Array(items))
            if items.iter().any(|item| item.get("containerPort").is_some()))
    };
    target_parent.contains_key("image")
        || patch_parent.contains_key("image")
        || has_container_ports(target_parent)
        || has_container_ports(patch_parent)
}

/// The Kubernetes patch strategy of the list `field` of an object.
pub(crate) fn list_strategy(
    field: &str,
    target_parent: &Map<String, Value>,
    patch_parent: &Map<String, Value>,
) -> ListStrategy {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => ListStrategy::Keyed("name"),
        "volumeMounts" => ListStrategy::Keyed("mountPath"),
        "volumeDevices" => ListStrategy::Keyed("devicePath"),
        "conditions" | "addresses" => ListStrategy::Keyed("type"),
        "ownerReferences" => ListStrategy::Keyed("uid"),
        "hostAliases" => ListStrategy::Keyed("ip"),
        "topologySpreadConstraints" => ListStrategy::Keyed("topologyKey"),
        "ports" if is_container(target_parent, patch_parent) => ListStrategy::Keyed("containerPort"),
        "ports" => ListStrategy::Keyed("port"),
        "finalizers" => ListStrategy::Set,
        _ => ListStrategy::Atomic,
    }
}

/// Strategic-merges `patch` into `target`, honouring a `$patch` directive on the map itself.
fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
) -> Result<(), PatchError> {
    match directive(patch, path)? {
        Some(Directive::Replace) => {
            let mut replacement = Map::new();
            merge_fields(&mut replacement, patch, path)?;
            *target = replacement;
            Ok(())
        }
        Some(Directive::Delete) => {
            target.clear();
            Ok(())
        }
        Some(Directive::Merge) | None => merge_fields(target, patch, path),
    }
}

/// A patch value with its directives resolved against nothing, as stored when it has no counterpart.
fn fresh_value(value: &Value, path: &str) -> Result<Value, PatchError> {
    match value {
        Value::Object(map) => {
            let mut fresh = Map::new();
            merge_map(&mut fresh, map, path)?;
            Ok(Value::Object(fresh))
        }
        other => Ok(other.clone()),
    }
}

fn merge_fields(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
) -> Result<(), PatchError> {
    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let keys: Option<Vec<&str>> = match retain {
            Value::Array(keys) => keys.iter().map(Value::as_str).collect(),
            _ => None,
        };
        let keys = keys.ok_or_else(|| PatchError::InvalidDirective {
            directive: join(path, RETAIN_KEYS),
            reason: "must be a list of field names",
        })?;
        target.retain(|key, _| keys.contains(&key.as_str()));
    }

    for (key, value) in patch {
        let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else {
            continue;
        };
        let Value::Array(doomed) = value else {
            return Err(PatchError::InvalidDirective {
                directive: join(path, key),
                reason: "must be a list of values to remove",
            });
        };
        if let Some(Value::Array(items)) = target.get_mut(field) {
            items.retain(|item| !doomed.contains(item));
        }
    }

    for (key, value) in patch {
        if is_directive_key(key) {
            continue;
        }
        let field_path = join(path, key);
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(child_patch) => {
                if directive(child_patch, &field_path)? == Some(Directive::Delete) {
                    target.remove(key);
                    continue;
                }
                let child = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !child.is_object() {
                    *child = Value::Object(Map::new());
                }
                if let Value::Object(child_map) = child {
                    merge_map(child_map, child_patch, &field_path)?;
                }
            }
            Value::Array(patch_items) => {
                let strategy = list_strategy(key, target, patch);
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                if let Value::Array(items) = slot {
                    merge_list(items, patch_items, strategy, &field_path)?;
                }
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }

    for (key, value) in patch {
        let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) else {
            continue;
        };
        let Value::Array(order) = value else {
            return Err(PatchError::InvalidDirective {
                directive: join(path, key),
                reason: "must be a list giving the order of the list's elements",
            });
        };
        let identity = match list_strategy(field, target, patch) {
            ListStrategy::Keyed(merge_key) => Some(merge_key),
            ListStrategy::Set => None,
            ListStrategy::Atomic => continue,
        };
        if let Some(Value::Array(items)) = target.get_mut(field) {
            apply_order(items, order, identity);
        }
    }
    Ok(())
}

fn merge_list(
    items: &mut Vec<Value>,
    patch: &[Value],
    strategy: ListStrategy,
    path: &str,
) -> Result<(), PatchError> {
    let mut replace_list = false;
    for (i, element) in patch.iter().enumerate() {
        if let Value::Object(element_map) = element {
            let element_directive = directive(element_map, &format!("{path}[{i}]"))?;
            if is_bare_directive(element) && element_directive == Some(Directive::Replace) {
                replace_list = true;
            }
        }
    }
    if replace_list || strategy == ListStrategy::Atomic {
        let mut replacement = Vec::with_capacity(patch.len());
        for (i, element) in patch.iter().enumerate() {
            if !is_bare_directive(element) {
                replacement.push(fresh_value(element, &format!("{path}[{i}]"))?);
            }
        }
        *items = replacement;
        return Ok(());
    }
    match strategy {
        ListStrategy::Keyed(merge_key) => merge_keyed_list(items, patch, merge_key, path),
        ListStrategy::Set => {
            for element in patch {
                if !element.is_null() && !element.is_object() && !items.contains(element) {
                    items.push(element.clone());
                }
            }
            Ok(())
        }
        ListStrategy::Atomic => Ok(()),
    }
}

fn merge_keyed_list(
    items: &mut Vec<Value>,
    patch: &[Value],
    merge_key: &str,
    path: &str,
) -> Result<(), PatchError> {
    for (i, element) in patch.iter().enumerate() {
        let element_path = format!("{path}[{i}]");
        let Value::Object(element_patch) = element else {
            if !element.is_null() {
                items.push(element.clone());
            }
            continue;
        };
        if is_bare_directive(element) {
            continue;
        }
        let identity = element_patch.get(merge_key);
        if directive(element_patch, &element_path)? == Some(Directive::Delete) {
            if let Some(identity) = identity {
                items.retain(|item| item.get(merge_key) != Some(identity));
            }
            continue;
        }
        let position = identity.and_then(|identity| {
            items
                .iter()
                .position(|item| item.get(merge_key) == Some(identity))
        });
        match position {
            Some(position) => match &mut items[position] {
                Value::Object(existing_map) => merge_map(existing_map, element_patch, &element_path)?,
                existing => *existing = fresh_value(element, &element_path)?,
            },
            None => items.push(fresh_value(element, &element_path)?),
        }
    }
    Ok(())
}

/// Reorders the elements `order` names into that order, using the slots they already occupy;
/// elements `order` does not name stay where they are. `merge_key` identifies map elements; `None`
/// compares primitive elements directly.
fn apply_order(items: &mut [Value], order: &[Value], merge_key: Option<&str>) {
    let identity = |value: &Value| -> Option<Value> {
        match merge_key {
            Some(merge_key) => value.get(merge_key).cloned(),
            None => Some(value.clone()),
        }
    };
    let wanted: Vec<Value> = order.iter().filter_map(&identity).collect();
    let rank = |value: &Value| identity(value).and_then(|id| wanted.iter().position(|w| *w == id));
    let ranked: Vec<(usize, usize)> = items
        .iter()
        .enumerate()
        .filter_map(|(slot, item)| rank(item).map(|r| (slot, r)))
        .collect();
    let mut reordered: Vec<(usize, Value)> =
        ranked.iter().map(|&(slot, r)| (r, items[slot].clone())).collect();
    reordered.sort_by_key(|&(r, _)| r);
    for (&(slot, _), (_, value)) in ranked.iter().zip(reordered) {
        items[slot] = value;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value) -> Value {
        let mut target = target;
        merge_patch(&mut target, &patch);
        target
    }

    fn json_patched(target: Value, patch: Value) -> Value {
        let mut target = target;
        json_patch(&mut target, &patch).expect("JSON patch applies");
        target
    }

    fn strategic(target: Value, patch: Value) -> Value {
        let mut target = target;
        strategic_merge_patch(&mut target, &patch).expect("strategic merge patch applies");
        target
    }

    /// Whether any object key anywhere in `value` is a patch directive.
    fn has_directive(value: &Value) -> bool {
        match value {
            Value::Object(map) => map
                .iter()
                .any(|(key, child)| key.starts_with('$') || has_directive(child)),
            Value::Array(items) => items.iter().any(has_directive),
            _ => false,
        }
    }

    fn pod(containers: Value) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": containers},
        })
    }

    // ---- merge patch ----

    #[test]
    fn merge_patch_rfc7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": "b", "b": "c"}), json!({"a": null}), json!({"b": "c"})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            let description = format!("{target} + {patch}");
            assert_eq!(merged(target, patch), expected, "{description}");
        }
    }

    #[test]
    fn merge_patch_null_deletes_label_and_replaces_lists() {
        let target = json!({
            "metadata": {"labels": {"app": "web", "tier": "frontend"}},
            "spec": {"containers": [
                {"name": "app", "image": "app:1"},
                {"name": "sidecar", "image": "envoy"},
            ]},
        });
        let patch = json!({
            "metadata": {"labels": {"tier": null, "track": "stable"}},
            "spec": {"containers": [{"name": "app", "image": "app:2"}]},
        });
        assert_eq!(
            merged(target, patch),
            json!({
                "metadata": {"labels": {"app": "web", "track": "stable"}},
                "spec": {"containers": [{"name": "app", "image": "app:2"}]},
            })
        );
    }

    // ---- JSON patch ----

    #[test]
    fn json_patch_add() {
        let target = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"args": ["a", "c"]}});
        let patched = json_patched(
            target,
            json!([
                {"op": "add", "path": "/metadata/labels/tier", "value": "frontend"},
                {"op": "add", "path": "/spec/args/1", "value": "b"},
                {"op": "add", "path": "/spec/args/-", "value": "d"},
                {"op": "add", "path": "/metadata/labels/app", "value": "api"},
            ]),
        );
        assert_eq!(
            patched,
            json!({
                "metadata": {"labels": {"app": "api", "tier": "frontend"}},
                "spec": {"args": ["a", "b", "c", "d"]},
            })
        );
    }

    #[test]
    fn json_patch_remove_and_replace() {
        let target = json!({
            "metadata": {"labels": {"app": "web", "tier": "db"}},
            "spec": {"replicas": 1, "args": [1, 2, 3]},
        });
        let patched = json_patched(
            target,
            json!([
                {"op": "remove", "path": "/metadata/labels/tier"},
                {"op": "remove", "path": "/spec/args/0"},
                {"op": "replace", "path": "/spec/replicas", "value": 3},
            ]),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"labels": {"app": "web"}}, "spec": {"replicas": 3, "args": [2, 3]}})
        );
    }

    #[test]
    fn json_patch_replace_and_remove_need_an_existing_location() {
        let mut target = json!({"spec": {}});
        assert_eq!(
            json_patch(
                &mut target,
                &json!([{"op": "replace", "path": "/spec/replicas", "value": 3}])
            ),
            Err(PatchError::PathNotFound {
                index: 0,
                pointer: "/spec/replicas".to_owned()
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "remove", "path": "/spec/replicas"}])),
            Err(PatchError::PathNotFound {
                index: 0,
                pointer: "/spec/replicas".to_owned()
            })
        );
        assert_eq!(target, json!({"spec": {}}));
    }

    #[test]
    fn json_patch_move_and_copy() {
        let target = json!({"metadata": {"labels": {"old": "x"}, "annotations": {}}});
        let patched = json_patched(
            target,
            json!([
                {"op": "copy", "from": "/metadata/labels/old", "path": "/metadata/annotations/old"},
                {"op": "move", "from": "/metadata/labels/old", "path": "/metadata/labels/new"},
            ]),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"labels": {"new": "x"}, "annotations": {"old": "x"}}})
        );
    }

    #[test]
    fn json_patch_move_into_own_child_is_rejected() {
        let mut target = json!({"a": {"b": {}}});
        assert_eq!(
            json_patch(
                &mut target,
                &json!([{"op": "move", "from": "/a", "path": "/a/b/c"}])
            ),
            Err(PatchError::MoveIntoChild {
                index: 0,
                from: "/a".to_owned(),
                pointer: "/a/b/c".to_owned()
            })
        );
    }

    #[test]
    fn json_patch_test_op() {
        let target = json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 1}});
        let patched = json_patched(
            target,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/spec/replicas", "value": 1.0},
                {"op": "replace", "path": "/spec/replicas", "value": 2},
            ]),
        );
        assert_eq!(patched["spec"]["replicas"], json!(2));
    }

    #[test]
    fn json_patch_failing_test_leaves_target_unchanged() {
        let original = json!({"metadata": {"resourceVersion": "7", "labels": {"app": "web"}}});
        let mut target = original.clone();
        let result = json_patch(
            &mut target,
            &json!([
                {"op": "add", "path": "/metadata/labels/tier", "value": "db"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "6"},
            ]),
        );
        assert_eq!(
            result,
            Err(PatchError::TestFailed {
                index: 1,
                pointer: "/metadata/resourceVersion".to_owned(),
                expected: "\"6\"".to_owned(),
            })
        );
        assert_eq!(target, original);
    }

    #[test]
    fn json_patch_bad_pointer_names_op_index() {
        let mut target = json!({"metadata": {"name": "web"}});
        let error = json_patch(
            &mut target,
            &json!([
                {"op": "add", "path": "/metadata/labels", "value": {}},
                {"op": "remove", "path": "metadata/name"},
            ]),
        )
        .expect_err("pointer without leading slash is rejected");
        assert_eq!(
            error,
            PatchError::InvalidPointer {
                index: 1,
                pointer: "metadata/name".to_owned()
            }
        );
        let message = error.to_string();
        assert!(
            message.contains("operation 1") && message.contains("metadata/name"),
            "{message}"
        );
        assert_eq!(target, json!({"metadata": {"name": "web"}}));
        assert!(matches!(
            json_patch(&mut target, &json!([{"op": "remove", "path": "/metadata/a~2b"}])),
            Err(PatchError::InvalidPointer { index: 0, .. })
        ));
    }

    #[test]
    fn json_patch_pointer_escapes() {
        let target = json!({"metadata": {"annotations": {"example.com/owner": "a", "a~b": "c"}}});
        let patched = json_patched(
            target,
            json!([
                {"op": "replace", "path": "/metadata/annotations/example.com~1owner", "value": "b"},
                {"op": "remove", "path": "/metadata/annotations/a~0b"},
            ]),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"annotations": {"example.com/owner": "b"}}})
        );
    }

    #[test]
    fn json_patch_add_does_not_create_parents() {
        let mut target = json!({"metadata": {"name": "web"}});
        assert_eq!(
            json_patch(
                &mut target,
                &json!([{"op": "add", "path": "/metadata/labels/app", "value": "web"}])
            ),
            Err(PatchError::PathNotFound {
                index: 0,
                pointer: "/metadata/labels/app".to_owned()
            })
        );
    }

    #[test]
    fn json_patch_array_bounds() {
        let mut target = json!({"args": ["a"]});
        assert_eq!(
            json_patch(
                &mut target,
                &json!([{"op": "add", "path": "/args/2", "value": "c"}])
            ),
            Err(PatchError::IndexOutOfBounds {
                index: 0,
                pointer: "/args/2".to_owned()
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "remove", "path": "/args/1"}])),
            Err(PatchError::PathNotFound {
                index: 0,
                pointer: "/args/1".to_owned()
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "remove", "path": "/args/01"}])),
            Err(PatchError::PathNotFound {
                index: 0,
                pointer: "/args/01".to_owned()
            })
        );
        assert_eq!(
            json_patched(target, json!([{"op": "add", "path": "/args/1", "value": "b"}])),
            json!({"args": ["a", "b"]})
        );
    }

    #[test]
    fn json_patch_whole_document() {
        let patched = json_patched(
            json!({"a": 1}),
            json!([{"op": "replace", "path": "", "value": {"b": 2}}]),
        );
        assert_eq!(patched, json!({"b": 2}));
        let mut target = json!({"a": 1});
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "remove", "path": ""}])),
            Err(PatchError::RemoveRoot { index: 0 })
        );
    }

    #[test]
    fn json_patch_malformed_operations() {
        let mut target = json!({});
        assert_eq!(
            json_patch(&mut target, &json!({"op": "add"})),
            Err(PatchError::JsonPatchNotArray { found: "object" })
        );
        assert_eq!(
            json_patch(&mut target, &json!(["add"])),
            Err(PatchError::OperationNotObject {
                index: 0,
                found: "string"
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "upsert", "path": "/a", "value": 1}])),
            Err(PatchError::UnknownOp {
                index: 0,
                op: "upsert".to_owned()
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "add", "path": "/a"}])),
            Err(PatchError::MissingMember {
                index: 0,
                member: "value"
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"op": "copy", "path": "/a"}])),
            Err(PatchError::MissingMember {
                index: 0,
                member: "from"
            })
        );
        assert_eq!(
            json_patch(&mut target, &json!([{"path": "/a", "value": 1}])),
            Err(PatchError::MissingMember {
                index: 0,
                member: "op"
            })
        );
        assert_eq!(
            json_patched(json!({}), json!([{"op": "add", "path": "/a", "value": null}])),
            json!({"a": null})
        );
    }

    // ---- strategic merge patch ----

    #[test]
    fn strategic_patch_container_image_by_name_keeps_other_containers() {
        let target = pod(json!([
            {"name": "app", "image": "app:1", "ports": [{"containerPort": 80}]},
            {"name": "sidecar", "image": "envoy:1"},
        ]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "app", "image": "app:2"}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([
                {"name": "app", "image": "app:2", "ports": [{"containerPort": 80}]},
                {"name": "sidecar", "image": "envoy:1"},
            ])
        );
        assert_eq!(patched["metadata"]["name"], json!("web"));
    }

    #[test]
    fn strategic_patch_adds_container() {
        let target = pod(json!([{"name": "app", "image": "app:1"}]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "debug", "image": "busybox"}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "app", "image": "app:1"}, {"name": "debug", "image": "busybox"}])
        );
    }

    #[test]
    fn strategic_patch_delete_directive_removes_container() {
        let target = pod(json!([{"name": "app", "image": "app:1"}, {"name": "sidecar", "image": "envoy:1"}]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "app", "image": "app:1"}])
        );
    }

    #[test]
    fn strategic_patch_replace_directive_in_list() {
        let target = pod(json!([{"name": "app", "image": "app:1"}, {"name": "sidecar", "image": "envoy:1"}]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "only:1"}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "only", "image": "only:1"}])
        );
        assert!(!has_directive(&patched));
    }

    #[test]
    fn strategic_patch_env_merged_by_name() {
        let target = pod(json!([{
            "name": "app",
            "image": "app:1",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        }]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{
                "name": "app",
                "env": [
                    {"name": "B", "value": "3"},
                    {"name": "C", "value": "4"},
                    {"name": "A", "$patch": "delete"},
                ],
            }]}}),
        );
        assert_eq!(
            patched["spec"]["containers"][0]["env"],
            json!([{"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
        );
    }

    #[test]
    fn strategic_patch_env_value_from_replaces_value() {
        let target = pod(json!([{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]}]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "app", "env": [
                {"name": "A", "value": null, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ]}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"][0]["env"],
            json!([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}])
        );
    }

    #[test]
    fn strategic_patch_volume_mounts_merged_by_mount_path() {
        let target = pod(json!([{
            "name": "app",
            "image": "app:1",
            "volumeMounts": [
                {"name": "data", "mountPath": "/data"},
                {"name": "cache", "mountPath": "/cache"},
            ],
        }]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{
                "name": "app",
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
            }]}}),
        );
        assert_eq!(
            patched["spec"]["containers"][0]["volumeMounts"],
            json!([
                {"name": "data", "mountPath": "/data", "readOnly": true},
                {"name": "cache", "mountPath": "/cache"},
            ])
        );
    }

    #[test]
    fn strategic_patch_conditions_merged_by_type() {
        let target = json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        ]}});
        let patched = strategic(
            target,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": null}]}}),
        );
        assert_eq!(
            patched["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
        );
    }

    #[test]
    fn strategic_patch_tolerations_and_taints_replaced_wholesale() {
        let target = json!({
            "spec": {
                "tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
                "taints": [{"key": "x", "effect": "NoSchedule"}, {"key": "y", "effect": "NoSchedule"}],
            }
        });
        let patched = strategic(
            target,
            json!({"spec": {
                "tolerations": [{"key": "c", "operator": "Exists"}],
                "taints": [{"key": "x", "effect": "NoExecute"}],
            }}),
        );
        assert_eq!(
            patched["spec"]["tolerations"],
            json!([{"key": "c", "operator": "Exists"}])
        );
        assert_eq!(
            patched["spec"]["taints"],
            json!([{"key": "x", "effect": "NoExecute"}])
        );
    }

    #[test]
    fn strategic_patch_finalizers_union_and_delete_from_primitive_list() {
        let target = json!({"metadata": {"finalizers": ["a", "b"]}});
        let patched = strategic(target, json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(patched["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let patched = strategic(
            patched,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "c"]}}),
        );
        assert_eq!(patched["metadata"]["finalizers"], json!(["b"]));
        assert!(!has_directive(&patched));
    }

    #[test]
    fn strategic_patch_set_element_order_is_honoured_and_not_stored() {
        let target = pod(json!([{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]));
        let patched = strategic(
            target,
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "image": "a:2"}],
            }}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "b", "image": "b:1"}, {"name": "a", "image": "a:2"}])
        );
        assert!(!has_directive(&patched), "{patched}");
    }

    #[test]
    fn strategic_patch_service_ports_keyed_by_port() {
        let target = json!({"kind": "Service", "spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "https", "port": 443, "targetPort": 8443},
        ]}});
        let patched = strategic(
            target,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
        );
        assert_eq!(
            patched["spec"]["ports"],
            json!([
                {"name": "http", "port": 80, "targetPort": 9090},
                {"name": "https", "port": 443, "targetPort": 8443},
            ])
        );
    }

    #[test]
    fn strategic_patch_container_ports_keyed_by_container_port() {
        let target = pod(json!([{
            "name": "app",
            "image": "app:1",
            "ports": [{"name": "http", "containerPort": 80}, {"name": "metrics", "containerPort": 9090}],
        }]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "app", "ports": [
                {"name": "prom", "containerPort": 9090},
                {"name": "grpc", "containerPort": 50051},
            ]}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"][0]["ports"],
            json!([
                {"name": "http", "containerPort": 80},
                {"name": "prom", "containerPort": 9090},
                {"name": "grpc", "containerPort": 50051},
            ])
        );
    }

    #[test]
    fn strategic_patch_owner_references_keyed_by_uid() {
        let target = json!({"metadata": {"ownerReferences": [
            {"uid": "1", "kind": "ReplicaSet", "name": "a", "controller": true},
            {"uid": "2", "kind": "ConfigMap", "name": "b"},
        ]}});
        let patched = strategic(
            target,
            json!({"metadata": {"ownerReferences": [
                {"uid": "1", "controller": false},
                {"uid": "2", "$patch": "delete"},
            ]}}),
        );
        assert_eq!(
            patched["metadata"]["ownerReferences"],
            json!([{"uid": "1", "kind": "ReplicaSet", "name": "a", "controller": false}])
        );
    }

    #[test]
    fn strategic_patch_maps_merge_and_null_deletes() {
        let target =
            json!({"metadata": {"labels": {"app": "web", "tier": "frontend"}, "annotations": {"a": "1"}}});
        let patched = strategic(
            target,
            json!({"metadata": {"labels": {"tier": null, "track": "stable"}, "annotations": null}}),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"labels": {"app": "web", "track": "stable"}}})
        );
    }

    #[test]
    fn strategic_patch_map_directives() {
        let target =
            json!({"metadata": {"labels": {"app": "web", "tier": "frontend"}, "annotations": {"a": "1"}}});
        let patched = strategic(
            target,
            json!({"metadata": {
                "labels": {"$patch": "replace", "only": "this"},
                "annotations": {"$patch": "delete"},
            }}),
        );
        assert_eq!(patched, json!({"metadata": {"labels": {"only": "this"}}}));
    }

    #[test]
    fn strategic_patch_retain_keys_clears_other_union_members() {
        let target = json!({"spec": {"strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }}});
        let patched = strategic(
            target,
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
        );
        assert_eq!(patched, json!({"spec": {"strategy": {"type": "Recreate"}}}));
    }

    #[test]
    fn strategic_patch_other_lists_are_atomic() {
        let target = pod(json!([{"name": "app", "image": "app:1", "args": ["--a", "--b"]}]));
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{"name": "app", "args": ["--c"]}]}}),
        );
        assert_eq!(patched["spec"]["containers"][0]["args"], json!(["--c"]));
    }

    #[test]
    fn strategic_patch_new_fields_are_stored_without_directives() {
        let target = json!({"metadata": {"name": "web"}});
        let patched = strategic(
            target,
            json!({"spec": {"containers": [{
                "name": "app",
                "image": "app:1",
                "env": [{"name": "X", "$patch": "delete"}],
            }]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "app", "image": "app:1", "env": []}])
        );
        assert!(!has_directive(&patched));
    }

    #[test]
    fn strategic_patch_errors_leave_target_unchanged() {
        let original = pod(json!([{"name": "app", "image": "app:1"}]));
        let mut target = original.clone();
        assert_eq!(
            strategic_merge_patch(&mut target, &json!([{"op": "add"}])),
            Err(PatchError::NotAnObject { found: "array" })
        );
        let error = strategic_merge_patch(
            &mut target,
            &json!({"metadata": {"labels": {"a": "b"}}, "spec": {"template": {"$patch": "upsert"}}}),
        )
        .expect_err("unknown directive is rejected");
        assert_eq!(
            error,
            PatchError::UnknownDirective {
                field: "spec.template".to_owned(),
                value: "\"upsert\"".to_owned()
            }
        );
        assert!(error.to_string().contains("spec.template"), "{error}");
        assert!(matches!(
            strategic_merge_patch(
                &mut target,
                &json!({"spec": {"containers": [{"name": "app", "$patch": 1}]}})
            ),
            Err(PatchError::UnknownDirective { field, .. }) if field == "spec.containers[0]"
        ));
        assert!(matches!(
            strategic_merge_patch(&mut target, &json!({"$patch": "nope"})),
            Err(PatchError::UnknownDirective { field, .. }) if field == "<root>"
        ));
        assert!(matches!(
            strategic_merge_patch(&mut target, &json!({"spec": {"$retainKeys": "type"}})),
            Err(PatchError::InvalidDirective { directive, .. }) if directive == "spec.$retainKeys"
        ));
        assert_eq!(target, original);
    }
}

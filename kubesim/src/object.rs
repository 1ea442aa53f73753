//! Reading the fields every Kubernetes object has, from its JSON form. Absent or non-string fields
//! read as empty, the way the API server treats a missing optional field.

use std::collections::BTreeMap;

use serde_json::Value;

/// The string at a JSON pointer (`/metadata/name`), or "" when absent or not a string.
pub fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.labels` as a map (non-string values are left out).
pub fn labels(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

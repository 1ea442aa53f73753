//! `meta.k8s.io/v1` Tables, the format `kubectl get` asks for: NAME, the kind's columns (a CRD's
//! additionalPrinterColumns, or kubesim's choice for built-in kinds) and AGE.
//!
//! Column paths use the JSONPath subset CRDs use in practice: `.a.b`, `[n]`, escaped dots
//! (`node\.kubernetes\.io/zone`) and filters `[?(@.type=="Ready")]`. A path that matches nothing
//! gives an empty cell.

use std::sync::Arc;

use serde_json::{Value, json};

use super::ApiRequest;
use crate::{
    clock::{Clock, parse_rfc3339},
    object::Pointer,
    resources::ResourceType,
};

/// How rows carry their objects.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The whole object (`includeObject=Object`) rather than its metadata only.
    pub include_object: bool,
}

impl Options {
    /// The options a request asks for.
    pub fn of(request: &ApiRequest) -> Self {
        Self {
            include_object: request.query.get("includeObject") != Some("None"),
        }
    }
}

/// A Table of `items`.
pub fn table(
    rtype: &ResourceType,
    items: &[Arc<Value>],
    metadata: Value,
    options: Options,
    clock: &Clock,
) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}),
    ];
    for column in &rtype.printer_columns {
        columns.push(json!({"name": column.name, "type": column.kind, "format": "", "description": "", "priority": column.priority}));
    }
    let has_age = rtype
        .printer_columns
        .iter()
        .any(|c| c.name.eq_ignore_ascii_case("age"));
    if !has_age {
        columns.push(
            json!({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}),
        );
    }
    let now = clock.now_seconds();
    let rows: Vec<Value> = items
        .iter()
        .map(|object| {
            let mut cells = vec![object.at("/metadata/name").cloned().unwrap_or(Value::Null)];
            for column in &rtype.printer_columns {
                let cell = evaluate(object, &column.path).unwrap_or(Value::Null);
                cells.push(if column.kind == "date" {
                    age_cell(&cell, now)
                } else {
                    cell
                });
            }
            if !has_age {
                cells.push(age_cell(
                    object.at("/metadata/creationTimestamp").unwrap_or(&Value::Null),
                    now,
                ));
            }
            let mut shown = if options.include_object {
                (**object).clone()
            } else {
                super::objects::PartialMetadata::of(object).to_value()
            };
            shown["apiVersion"] = json!(
                shown
                    .get("apiVersion")
                    .cloned()
                    .unwrap_or_else(|| json!(rtype.api_version()))
            );
            json!({"cells": cells, "object": shown})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// `5m`, `3h`, `2d`: kubectl's age format.
fn age_cell(timestamp: &Value, now: i64) -> Value {
    let Some(then) = timestamp.as_str().and_then(parse_rfc3339) else {
        return json!("<unknown>");
    };
    let seconds = (now - then).max(0);
    let text = match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    json!(text)
}

/// Evaluates a printer-column JSONPath against an object.
pub fn evaluate(object: &Value, path: &str) -> Option<Value> {
    let mut current = object;
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            let inside = &after[..end];
            rest = after[end + 1..].strip_prefix('.').unwrap_or(&after[end + 1..]);
            current = match inside.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                Some(filter) => {
                    let (field, value) = filter.split_once("==")?;
                    let value = value.trim().trim_matches('"').trim_matches('\'');
                    current
                        .as_array()?
                        .iter()
                        .find(|item| item.get(field.trim()).and_then(Value::as_str) == Some(value))?
                }
                None => current.get(inside.parse::<usize>().ok()?)?,
            };
            continue;
        }
        let (field, remainder) = split_field(rest);
        current = current.get(field.as_str())?;
        rest = remainder;
    }
    Some(current.clone())
}

/// The first field of a path (unescaping `\.`) and what follows it.
fn split_field(path: &str) -> (String, &str) {
    let mut field = String::new();
    let mut chars = path.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    field.push(escaped);
                }
            }
            '.' => return (field, &path[index + 1..]),
            '[' => return (field, &path[index..]),
            c => field.push(c),
        }
    }
    (field, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_cover_what_karpenter_crds_use() {
        let node = json!({
            "metadata": {"labels": {"node.kubernetes.io/instance-type": "m5.large"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "2"}},
            "spec": {"taints": [{"key": "a"}]},
        });
        assert_eq!(
            evaluate(&node, ".metadata.labels.node\\.kubernetes\\.io/instance-type"),
            Some(json!("m5.large"))
        );
        assert_eq!(
            evaluate(&node, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(evaluate(&node, ".spec.taints[0].key"), Some(json!("a")));
        assert_eq!(evaluate(&node, ".status.missing"), None);
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let created = json!("2026-11-21T10:00:00Z");
        let now = parse_rfc3339("2026-11-21T10:05:00Z").unwrap_or_default();
        assert_eq!(age_cell(&created, now), json!("5m"));
        assert_eq!(age_cell(&created, now + 86_400 * 3), json!("3d"));
    }
}

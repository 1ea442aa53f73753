//! Checks a document against a CRD's OpenAPI v3 schema, as kube-apiserver does before CEL.
//!
//! Covers what Joist's generated CRDs use: `type`, `properties`, `required`, `additionalProperties`,
//! `items`, `enum`, `pattern`, `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`,
//! `maxProperties`, int-or-string, the `format`s kube-openapi checks that the schemas use (integer
//! ranges such as `int32`, and `date-time`), and strict field validation (a field the schema does not list is
//! reported, unless `x-kubernetes-preserve-unknown-fields` allows it). Every violation is returned,
//! each with its field path. `metadata` is left to the typed decoder, as the API server handles
//! ObjectMeta itself. Null values are treated as absent. Unknown fields under `status` are not
//! reported: controllers newer than this schema may write them.
//!
//! Failure modes: a pattern the regex engine cannot compile is reported as a violation on the
//! field (it would be a bug in the generated schema, and is covered by tests).

use std::collections::HashMap;

use regex::Regex;
use serde_json::Value;

use super::validation::Violations;

/// Root fields the API server checks itself; CRD schemas do not list them.
const ROOT_FIELDS_OF_THE_API_SERVER: &[&str] = &["apiVersion", "kind", "metadata"];

/// Validates values against one CRD schema, compiling each pattern once.
pub struct SchemaChecker {
    schema: Value,
    walker: Walker,
}

impl SchemaChecker {
    /// A checker for `schema` (a CRD version's `openAPIV3Schema` as JSON).
    pub fn new(schema: Value) -> Self {
        SchemaChecker {
            schema,
            walker: Walker::default(),
        }
    }

    /// Every way `value` breaks the schema.
    pub fn check(&mut self, value: &Value, out: &mut Violations) {
        self.walker.check_node(&self.schema, value, "", out);
    }
}

/// Walks a value beside its schema, caching each compiled pattern.
#[derive(Default)]
struct Walker {
    patterns: HashMap<String, Result<Regex, String>>,
}

impl Walker {
    fn check_node(&mut self, schema: &Value, value: &Value, path: &str, out: &mut Violations) {
        if value.is_null() {
            return;
        }
        let field = if path.is_empty() { "<root>" } else { path };
        let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
        if let Some(expected) = schema.get("type").and_then(Value::as_str)
            && !int_or_string
            && !type_matches(expected, value)
        {
            out.push(field, format!("expected {expected}, got {}", describe(value)));
            return;
        }
        if int_or_string && !(value.is_string() || value.is_i64() || value.is_u64()) {
            out.push(
                field,
                format!("expected an integer or a string, got {}", describe(value)),
            );
            return;
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array)
            && !options.contains(value)
        {
            let names: Vec<String> = options.iter().map(|o| o.to_string()).collect();
            out.push(field, format!("{value} is not one of {}", names.join(", ")));
        }
        match value {
            Value::String(text) => self.check_string(schema, text, field, out),
            Value::Number(n) => {
                check_integer_format(schema, n, field, out);
                check_number(schema, n.as_f64().unwrap_or_default(), field, out);
            }
            Value::Array(items) => self.check_array(schema, items, path, out),
            Value::Object(map) => self.check_object(schema, map, path, out),
            Value::Bool(_) | Value::Null => {}
        }
    }

    fn check_string(&mut self, schema: &Value, text: &str, field: &str, out: &mut Violations) {
        let len = text.chars().count() as u64;
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            out.push(field, format!("must be at most {max} characters, got {len}"));
        }
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            out.push(field, format!("must be at least {min} characters, got {len}"));
        }
        if schema.get("format").and_then(Value::as_str) == Some("date-time")
            && text.parse::<jiff::Timestamp>().is_err()
        {
            out.push(
                field,
                format!("{text:?} is not a date-time (RFC 3339, like 2026-01-01T00:00:00Z)"),
            );
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            let compiled = self
                .patterns
                .entry(pattern.to_string())
                .or_insert_with(|| Regex::new(&go_regex(pattern)).map_err(|e| e.to_string()));
            match compiled {
                Ok(re) if re.is_match(text) => {}
                Ok(_) => out.push(
                    field,
                    format!("{text:?} does not match the required format {pattern}"),
                ),
                Err(e) => out.push(field, format!("schema pattern {pattern} does not compile: {e}")),
            }
        }
    }

    fn check_array(&mut self, schema: &Value, items: &[Value], path: &str, out: &mut Violations) {
        let field = if path.is_empty() { "<root>" } else { path };
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
            && items.len() as u64 > max
        {
            out.push(
                field,
                format!("must have at most {max} items, got {}", items.len()),
            );
        }
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            out.push(
                field,
                format!("must have at least {min} item(s), got {}", items.len()),
            );
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                self.check_node(item_schema, item, &format!("{path}[{i}]"), out);
            }
        }
    }

    fn check_object(
        &mut self,
        schema: &Value,
        map: &serde_json::Map<String, Value>,
        path: &str,
        out: &mut Violations,
    ) {
        let join = |key: &str| {
            if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            }
        };
        if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
            && map.len() as u64 > max
        {
            out.push(
                join("").trim_end_matches('.'),
                format!("must have at most {max} entries, got {}", map.len()),
            );
        }
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = name.as_str() else { continue };
            // The API server fills defaults in before it validates: a defaulted field is never
            // missing.
            let defaulted = schema["properties"][name].get("default").is_some();
            if map.get(name).is_none_or(Value::is_null) && !defaulted {
                out.push(join(name), "required field is missing");
            }
        }
        let preserve = schema
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true);
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        for (key, value) in map {
            if path.is_empty() && ROOT_FIELDS_OF_THE_API_SERVER.contains(&key.as_str()) {
                continue;
            }
            match (properties.and_then(|p| p.get(key)), additional) {
                (Some(prop), _) => self.check_node(prop, value, &join(key), out),
                (None, Some(additional)) => {
                    self.check_node(additional, value, &format!("{path}[{key}]"), out)
                }
                (None, None) if preserve || (properties.is_none() && schema.get("type").is_none()) => {}
                (None, None) if properties.is_none() && schema.get("additionalProperties").is_some() => {}
                (None, None) => {
                    // Status is written by controllers, possibly newer ones than this schema:
                    // extra fields there are version skew, not a user's mistake.
                    if !value.is_null() && !is_status(path) {
                        out.push(join(key), "unknown field: the v1 API has no such field");
                    }
                }
            }
        }
    }
}

/// Go's `\s` and `\d` are ASCII-only; Rust's are Unicode-aware. Rewrite them so patterns match
/// what the API server matches.
fn go_regex(pattern: &str) -> String {
    pattern.replace(r"\s", r"[\t\n\f\r ]").replace(r"\d", "[0-9]")
}

fn is_status(path: &str) -> bool {
    path == "status" || path.starts_with("status.") || path.starts_with("status[")
}

fn check_number(schema: &Value, n: f64, field: &str, out: &mut Violations) {
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && n > max
    {
        out.push(field, format!("must be at most {max}, got {n}"));
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && n < min
    {
        out.push(field, format!("must be at least {min}, got {n}"));
    }
}

/// The range an integer `format` allows, as kube-openapi checks it (Rust's unsigned formats too,
/// which the generated schemas name).
fn check_integer_format(schema: &Value, n: &serde_json::Number, field: &str, out: &mut Violations) {
    let Some(format) = schema.get("format").and_then(Value::as_str) else {
        return;
    };
    let (min, max): (i128, i128) = match format {
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" => (0, u64::MAX.into()),
        _ => return,
    };
    // An integral float (`10.0`) is an integer to kube-openapi.
    let integral = |f: f64| (f.fract() == 0.0 && f.abs() < 1e30).then_some(f as i128);
    let value = n
        .as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
        .or_else(|| n.as_f64().and_then(integral));
    if value.is_none_or(|v| v < min || v > max) {
        out.push(field, format!("{n} is out of range for {format}"));
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        // kube-openapi accepts an integral float (`10.0`) as an integer.
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn violations(schema: Value, value: Value) -> Vec<String> {
        let mut out = Violations::default();
        SchemaChecker::new(schema).check(&value, &mut out);
        out.into_vec().into_iter().map(|v| v.to_string()).collect()
    }

    /// As kube-openapi checks formats: `ipPrefixCount: 2147483648` cannot be stored in an int32
    /// field (the fuzz found the checker letting it through to a decoder that refuses it).
    #[test]
    fn integers_must_fit_their_format() {
        let schema = json!({"type": "object", "properties": {
            "small": {"type": "integer", "format": "int32"},
            "count": {"type": "integer", "format": "uint32"},
        }});
        assert_eq!(
            violations(schema.clone(), json!({"small": 2_147_483_648_i64, "count": -1})),
            [
                "count: -1 is out of range for uint32",
                "small: 2147483648 is out of range for int32"
            ]
        );
        assert!(violations(schema, json!({"small": -5, "count": 10.0})).is_empty());
        let time = json!({"type": "string", "format": "date-time"});
        assert_eq!(
            violations(time.clone(), json!("")),
            [r#"<root>: "" is not a date-time (RFC 3339, like 2026-01-01T00:00:00Z)"#]
        );
        assert!(violations(time, json!("2026-01-01T00:00:00Z")).is_empty());
    }

    #[test]
    fn a_required_field_with_a_default_is_never_missing() {
        let schema = json!({"type": "object", "required": ["nodes"], "properties": {
            "nodes": {"type": "string", "default": "10%"},
        }});
        assert!(violations(schema, json!({})).is_empty());
    }

    #[test]
    fn reports_every_violation_with_its_path() {
        let schema = json!({"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "string", "pattern": "^x+$"},
            "n": {"type": "integer", "minimum": 1, "maximum": 100},
            "e": {"type": "string", "enum": ["In", "NotIn"]},
            "l": {"type": "array", "maxItems": 1, "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
        }});
        let got = violations(
            schema,
            json!({"a": "y", "n": 0, "e": "Equals", "l": [{"k": "v", "z": 1}, {}], "q": 1}),
        );
        assert!(
            got.contains(&"b: required field is missing".to_string()),
            "{got:?}"
        );
        assert!(
            got.iter().any(|v| v.starts_with("a: \"y\" does not match")),
            "{got:?}"
        );
        assert!(
            got.contains(&"n: must be at least 1, got 0".to_string()),
            "{got:?}"
        );
        assert!(
            got.iter().any(|v| v.starts_with("e: \"Equals\" is not one of")),
            "{got:?}"
        );
        assert!(
            got.iter().any(|v| v.starts_with("l: must have at most 1")),
            "{got:?}"
        );
        assert!(
            got.contains(&"l[0].z: unknown field: the v1 API has no such field".to_string()),
            "{got:?}"
        );
        assert!(
            got.contains(&"q: unknown field: the v1 API has no such field".to_string()),
            "{got:?}"
        );
    }

    #[test]
    fn maps_preserved_fields_and_int_or_string() {
        let schema = json!({"type": "object", "properties": {
            "limits": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": "^[0-9]+$"}},
            "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"maxPods": {"type": "integer"}}},
        }});
        assert!(
            violations(
                schema.clone(),
                json!({"limits": {"cpu": 1000, "memory": "10"}, "open": {"anything": 1}})
            )
            .is_empty()
        );
        let got = violations(
            schema,
            json!({"limits": {"cpu": "x"}, "open": {"maxPods": "many"}}),
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("limits[cpu]: \"x\" does not match"), "{got:?}");
        assert!(got[1].starts_with("open.maxPods: expected integer"), "{got:?}");
    }

    #[test]
    fn patterns_use_go_ascii_classes_and_integral_floats_are_integers() {
        let schema = json!({"type": "object", "properties": {
            "cron": {"type": "string", "pattern": r"^(.+)\s(.+)$"},
            "weight": {"type": "integer"},
        }});
        assert!(violations(schema.clone(), json!({"cron": "0 9", "weight": 10.0})).is_empty());
        assert_eq!(
            violations(schema.clone(), json!({"cron": "0\u{a0}9"})).len(),
            1,
            "NBSP is not Go's \\s"
        );
        assert_eq!(violations(schema, json!({"weight": 10.5})).len(), 1);
    }
}

//! Fuzzed Karpenter objects: every field a CRD's OpenAPI schema lists, set to values of its own type
//! that users might write (empty, negative, huge, odd strings, empty or repeated lists) or to a
//! value of another type. Shared by the contract tests (`joist validate`'s checks) and the scenario
//! tests (the controllers, through kubesim).

use joist_messages::apis::{crds, openapi_schema};
use proptest::prelude::*;
use serde_json::{Value, json};

/// One step of a field's path.
#[derive(Debug, Clone)]
pub enum Segment {
    /// An object property.
    Key(String),
    /// The first item of a list.
    First,
    /// An entry of a map (`additionalProperties`).
    Entry,
}

/// A field a CRD's schema lists, and its schema.
#[derive(Debug, Clone)]
pub struct Field {
    /// The CRD's kind.
    pub kind: String,
    /// Where it is.
    pub segments: Vec<Segment>,
    /// Its schema.
    pub schema: Value,
}

/// The key fuzzed map entries get.
const ENTRY: &str = "fuzz.example.com/key";

impl Field {
    /// The field as violations name it: `spec.template.spec.requirements[0].key`.
    pub fn path(&self) -> String {
        let mut path = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Key(key) if path.is_empty() => path.push_str(key),
                Segment::Key(key) => path.push_str(&format!(".{key}")),
                Segment::First => path.push_str("[0]"),
                Segment::Entry => path.push_str(&format!("[{ENTRY}]")),
            }
        }
        path
    }

    /// The schema's type (`string`, `integer`, …; `int-or-string`; `any` when it names none).
    pub fn type_name(&self) -> &str {
        if self.schema["x-kubernetes-int-or-string"] == true {
            return "int-or-string";
        }
        self.schema["type"].as_str().unwrap_or("any")
    }

    /// `document` with this field set to `value`, making the objects and lists on the way.
    pub fn set(&self, document: &mut Value, value: Value) {
        let mut at = document;
        for segment in &self.segments {
            match segment {
                Segment::Key(_) | Segment::Entry if !at.is_object() => *at = json!({}),
                Segment::First if at.as_array().is_none_or(|items| items.is_empty()) => {
                    *at = json!([{}]);
                }
                _ => {}
            }
            at = match segment {
                Segment::Key(key) => &mut at[key.as_str()],
                Segment::Entry => &mut at[ENTRY],
                Segment::First => &mut at[0],
            };
        }
        *at = value;
    }
}

/// Every CRD's OpenAPI schema, by kind.
pub fn schemas() -> std::collections::HashMap<String, Value> {
    crds()
        .iter()
        .map(|(_, crd)| (crd.spec.names.kind.clone(), openapi_schema(crd)))
        .collect()
}

/// Every field under `spec` of every CRD Joist serves.
pub fn fields() -> Vec<Field> {
    let mut fields = Vec::new();
    for (_, crd) in crds() {
        let schema = openapi_schema(&crd);
        walk(
            &crd.spec.names.kind,
            &schema["properties"]["spec"],
            vec![Segment::Key("spec".to_owned())],
            &mut fields,
        );
    }
    fields
}

fn walk(kind: &str, schema: &Value, segments: Vec<Segment>, out: &mut Vec<Field>) {
    out.push(Field {
        kind: kind.to_owned(),
        segments: segments.clone(),
        schema: schema.clone(),
    });
    let deeper = |segment: Segment| {
        let mut next = segments.clone();
        next.push(segment);
        next
    };
    if let Some(properties) = schema["properties"].as_object() {
        for (key, property) in properties {
            walk(kind, property, deeper(Segment::Key(key.clone())), out);
        }
    }
    if schema["items"].is_object() {
        walk(kind, &schema["items"], deeper(Segment::First), out);
    }
    if schema["additionalProperties"].is_object() {
        walk(kind, &schema["additionalProperties"], deeper(Segment::Entry), out);
    }
}

/// Strings a user might write where a name, duration, quantity, label or id is expected.
fn odd_string() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            " ",
            "0",
            "-1",
            "1.5",
            "1e400",
            "99999999999999999999Gi",
            "-5m",
            "0s",
            "Never",
            "1h30m",
            "720h",
            "In",
            "Gt",
            "*",
            "a/b/c",
            "kubernetes.io/arch",
            "karpenter.sh/nodepool",
            "amd64",
            "al2023@latest",
            "ami-0123456789abcdef0",
            "subnet-1",
            "sg-",
            "@every 1h",
            "* * * * *",
            "100%",
            "-10%",
            "é",
            "NoExecute",
            "true",
        ])
        .prop_map(String::from),
        "[a-zA-Z0-9./@%:*-]{0,24}",
        "\\PC{0,12}",
    ]
}

/// A value of the field's own type.
fn typed_value(field: &Field) -> BoxedStrategy<Value> {
    match field.type_name() {
        "string" => odd_string().prop_map(Value::from).boxed(),
        "integer" => prop_oneof![
            prop::sample::select(vec![0i64, -1, 1, i64::from(i32::MAX) + 1, i64::MAX, i64::MIN]),
            any::<i64>(),
        ]
        .prop_map(Value::from)
        .boxed(),
        "number" => prop_oneof![Just(-1.0f64), Just(0.0), Just(1e300), -1e6f64..1e6]
            .prop_map(Value::from)
            .boxed(),
        "boolean" => any::<bool>().prop_map(Value::from).boxed(),
        "int-or-string" => prop_oneof![
            odd_string().prop_map(Value::from),
            any::<i64>().prop_map(Value::from)
        ]
        .boxed(),
        "array" => Just(json!([])).boxed(),
        "object" => Just(json!({})).boxed(),
        _ => Just(Value::Null).boxed(),
    }
}

/// A value of another type than the field's (none for fields of any type).
pub fn wrong_value(field: &Field) -> Option<Value> {
    match field.type_name() {
        "string" => Some(json!(5)),
        "integer" | "number" | "int-or-string" => Some(json!([1])),
        "boolean" | "array" => Some(json!("x")),
        "object" => Some(json!(7)),
        _ => None,
    }
}

/// A fuzzed field: which one, and its new value (`wrong`: of another type).
#[derive(Debug, Clone)]
pub struct Mutant {
    /// The field.
    pub field: Field,
    /// Its new value.
    pub value: Value,
    /// Whether the value is of another type than the schema's.
    pub wrong: bool,
}

/// Any field of a CRD of `kind` (all kinds: none) set to a value of its type or, one time in five,
/// of another type.
pub fn mutant(fields: &[Field], kind: Option<&str>) -> BoxedStrategy<Mutant> {
    let fields: Vec<Field> = fields
        .iter()
        .filter(|f| kind.is_none_or(|k| f.kind == k))
        .cloned()
        .collect();
    prop::sample::select(fields)
        .prop_flat_map(|field| {
            let typed = typed_value(&field).prop_map(|v| (v, false));
            let strategy = match wrong_value(&field) {
                Some(wrong) => prop_oneof![4 => typed, 1 => Just((wrong, true))].boxed(),
                None => typed.boxed(),
            };
            (Just(field), strategy)
        })
        .prop_map(|(field, (value, wrong))| Mutant { field, value, wrong })
        .boxed()
}

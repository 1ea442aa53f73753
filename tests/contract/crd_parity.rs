//! Joist's CRDs against Karpenter v1.14.1's, fact by fact. The facts of Karpenter's published
//! CRDs are committed as data (`tests/fixtures/karpenter-v1.14.1/crd-facts.tsv`, written by
//! `scripts/karpenter-crd-facts`): every field path with its type, enum, bounds, default, required
//! list and int-or-string and preserve-unknown-fields markers. Every path Karpenter has, Joist must
//! have with the same facts, and Joist may add no path or fact of its own, except the differences
//! kept on purpose in [`DELIBERATE`], each with why (docs/compatibility.md lists the
//! same). Patterns and CEL rules are text rather than structure: the validation tests hold them.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::tools::root;

/// The facts the data holds, in its order.
const FACTS: [&str; 14] = [
    "type",
    "enum",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "default",
    "required",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
];

/// (CRD, path, fact, why Joist differs).
const DELIBERATE: &[(&str, &str, &str, &str)] = &[
    (
        "karpenter.k8s.aws_ec2nodeclasses",
        ".",
        "required",
        "Joist requires `spec`; an EC2NodeClass without one fails Karpenter's own spec rules too",
    ),
    (
        "karpenter.k8s.aws_ec2nodeclasses",
        ".spec.subnetSelectorTerms",
        "minItems",
        "Joist says \"at least one term\" with minItems where Karpenter uses a CEL rule: the same objects pass",
    ),
    (
        "karpenter.k8s.aws_ec2nodeclasses",
        ".spec.securityGroupSelectorTerms",
        "minItems",
        "as for subnetSelectorTerms",
    ),
    (
        "karpenter.k8s.aws_ec2nodeclasses",
        ".spec.kubelet",
        "x-kubernetes-preserve-unknown-fields",
        "Joist keeps kubelet fields it does not interpret instead of pruning them (looser)",
    ),
];

type Facts = BTreeMap<(String, String), BTreeMap<String, Value>>;

/// Karpenter's facts, from the committed data.
fn karpenter() -> Facts {
    let path = root().join("tests/fixtures/karpenter-v1.14.1/crd-facts.tsv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut facts = Facts::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let fields: Vec<&str> = line.splitn(4, '\t').collect();
        let [crd, path, fact, value] = fields[..] else {
            panic!("a malformed line in the Karpenter facts: {line:?}");
        };
        let value = serde_json::from_str(value).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        facts
            .entry((crd.to_owned(), path.to_owned()))
            .or_default()
            .insert(fact.to_owned(), value);
    }
    facts
}

/// Joist's facts, from the CRDs it generates.
fn joist() -> Facts {
    let mut facts = Facts::new();
    for (file, crd) in joist_messages::apis::crds() {
        let name = file.trim_end_matches(".yaml");
        walk(name, &joist_messages::apis::openapi_schema(&crd), "", &mut facts);
    }
    facts
}

fn walk(crd: &str, schema: &Value, path: &str, facts: &mut Facts) {
    let mut found: BTreeMap<String, Value> = FACTS
        .iter()
        .filter_map(|fact| Some(((*fact).to_owned(), schema.get(*fact)?.clone())))
        .collect();
    found.entry("type".to_owned()).or_insert_with(|| Value::from(""));
    let key = if path.is_empty() { "." } else { path };
    facts.insert((crd.to_owned(), key.to_owned()), found);
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            walk(crd, child, &format!("{path}.{name}"), facts);
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        walk(crd, items, &format!("{path}[]"), facts);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk(crd, values, &format!("{path}{{}}"), facts);
    }
}

/// `value` with order-free lists sorted (enums, required lists), `null` left out of enums (the API
/// server drops nulls before validating, so an enum admitting null admits nothing more), and
/// numbers as floats (a CRD's bounds are doubles: `1` and `1.0` are the same bound).
fn normalized(fact: &str, value: Option<&Value>) -> Option<Value> {
    let value = value?.clone();
    match (fact, value) {
        ("enum" | "required", Value::Array(items)) => {
            let mut items: Vec<Value> = items.into_iter().filter(|v| !v.is_null()).collect();
            items.sort_by_key(Value::to_string);
            Some(Value::Array(items))
        }
        (_, Value::Number(n)) => n.as_f64().map(Value::from),
        (_, value) => Some(value),
    }
}

/// Every difference, as (CRD, path, fact, what differs).
fn differences(karpenter: &Facts, joist: &Facts) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&(String, String)> = karpenter.keys().chain(joist.keys()).collect();
    for key @ (crd, path) in keys {
        let (theirs, ours) = (karpenter.get(key), joist.get(key));
        let (Some(theirs), Some(ours)) = (theirs, ours) else {
            let side = if ours.is_none() {
                "Joist lacks it"
            } else {
                "Karpenter lacks it"
            };
            out.push((crd.clone(), path.clone(), "path".to_owned(), side.to_owned()));
            continue;
        };
        for fact in FACTS {
            let (a, b) = (
                normalized(fact, theirs.get(fact)),
                normalized(fact, ours.get(fact)),
            );
            if a != b {
                let show = |v: Option<Value>| v.map_or("none".to_owned(), |v| v.to_string());
                let what = format!("Karpenter {}, Joist {}", show(a), show(b));
                out.push((crd.clone(), path.clone(), fact.to_owned(), what));
            }
        }
    }
    out
}

#[test]
fn joists_crds_have_every_field_and_fact_of_karpenter_v1_14_1s() {
    let karpenter = karpenter();
    assert!(
        karpenter.len() > 240,
        "the data holds every path: {}",
        karpenter.len()
    );
    let found = differences(&karpenter, &joist());
    let deliberate = |(crd, path, fact, _): &(String, String, String, String)| {
        DELIBERATE
            .iter()
            .any(|(c, p, f, _)| c == crd && p == path && f == fact)
    };
    let unexplained: Vec<String> = found
        .iter()
        .filter(|d| !deliberate(d))
        .map(|(crd, path, fact, what)| format!("{crd} {path} {fact}: {what}"))
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} differences from Karpenter v1.14.1:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    for (crd, path, fact, why) in DELIBERATE {
        assert!(
            found
                .iter()
                .any(|(c, p, f, _)| c == crd && p == path && f == fact),
            "{crd} {path} {fact} no longer differs: drop it from DELIBERATE ({why})"
        );
    }
}

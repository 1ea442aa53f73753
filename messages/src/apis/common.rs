//! Pieces shared by NodePool and NodeClaim: requirements with `minValues`, the node class
//! reference, taints, and the validation of each.

use k8s_openapi::api::core::v1::Taint;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::validation::Violations;
use crate::{
    labels,
    model::requirements::{Operator, Requirement, RequirementEntry, RequirementError},
};

/// Pattern of a qualified label key (optional DNS prefix, `/`, name).
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";

/// A node selector requirement, plus the minimum number of distinct values a launch must keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirementWithMinValues {
    /// The label key.
    #[schemars(length(max = 316), regex(pattern = LABEL_KEY_PATTERN))]
    pub key: String,
    /// How the key relates to the values.
    pub operator: Operator,
    /// The values (one integer for Gt/Lt/Gte/Lte, none for Exists/DoesNotExist). The CRD carries
    /// Karpenter's `maxLength: 63` on the list itself, where the API server ignores it; label
    /// values are checked one by one by the validation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxLength" = 63))]
    pub values: Vec<String>,
    /// The minimum number of distinct values (1..=50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub min_values: Option<u32>,
}

impl NodeSelectorRequirementWithMinValues {
    /// The requirement as a set in the algebra.
    pub fn to_requirement(&self) -> Result<Requirement, RequirementError> {
        Requirement::new(&self.key, self.operator, self.values.iter().cloned())
            .map(|r| r.with_min_values(self.min_values))
    }
}

impl From<RequirementEntry> for NodeSelectorRequirementWithMinValues {
    fn from(entry: RequirementEntry) -> Self {
        NodeSelectorRequirementWithMinValues {
            key: entry.key,
            operator: entry.operator,
            values: entry.values,
            min_values: entry.min_values,
        }
    }
}

/// CEL rule and message on a requirements list: `In` needs at least one value.
pub const IN_NEEDS_VALUES: (&str, &str) = (
    "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)",
    "requirements with operator 'In' must have a value defined",
);
/// CEL rule and message on a requirements list: numeric operators take one non-negative integer.
pub const NUMERIC_NEEDS_ONE_INTEGER: (&str, &str) = (
    "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)",
    "requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single positive integer value",
);
/// CEL rule and message on a requirements list: `In` with `minValues` lists at least that many values.
pub const MIN_VALUES_NEEDS_VALUES: (&str, &str) = (
    "self.all(x, (x.operator == 'In' && has(x.minValues)) ? x.values.size() >= x.minValues : true)",
    "requirements with 'minValues' must have at least that many values specified in the 'values' field",
);

/// Checks a requirements list; `restricted_keys` applies the NodePool label-domain rules.
pub fn validate_requirements(
    out: &mut Violations,
    path: &str,
    list: &[NodeSelectorRequirementWithMinValues],
    restricted_keys: bool,
) {
    if list.len() > 100 {
        out.push(
            path,
            format!("at most 100 requirements are allowed, got {}", list.len()),
        );
    }
    for (i, r) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if !is_qualified_label_key(&r.key) {
            out.push(
                format!("{at}.key"),
                format!("{:?} is not a valid label key", r.key),
            );
        }
        if restricted_keys && let Some(reason) = labels::restricted_label_reason(&r.key) {
            out.push(format!("{at}.key"), reason);
        }
        match r.operator {
            Operator::In if r.values.is_empty() => {
                out.push(format!("{at}.values"), "operator In must have at least one value");
            }
            op if op.is_numeric() => {
                // The same width as CEL's int() and the requirement algebra.
                let one_non_negative_int =
                    r.values.len() == 1 && r.values[0].parse::<i64>().is_ok_and(|n| n >= 0);
                if !one_non_negative_int {
                    out.push(
                        format!("{at}.values"),
                        format!(
                            "operator {op} must have a single non-negative integer value, got {:?}",
                            r.values
                        ),
                    );
                }
            }
            Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                out.push(
                    format!("{at}.values"),
                    format!("operator {} takes no values", r.operator),
                );
            }
            _ => {}
        }
        if let Some(min) = r.min_values {
            if !(1..=50).contains(&min) {
                out.push(
                    format!("{at}.minValues"),
                    format!("must be between 1 and 50, got {min}"),
                );
            }
            if r.operator == Operator::In && (r.values.len() as u32) < min {
                out.push(
                    format!("{at}.minValues"),
                    format!(
                        "minValues {min} needs at least {min} values, got {}",
                        r.values.len()
                    ),
                );
            }
        }
    }
}

/// True when `key` is a qualified Kubernetes label key.
pub fn is_qualified_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty() && is_label_value(name);
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

/// True when `value` is a valid label value (empty, or ≤ 63 alphanumerics with `-_.` inside).
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && value.as_bytes()[0].is_ascii_alphanumeric()
            && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric())
}

/// A reference to the provider-specific node class (`EC2NodeClass`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct NodeClassReference {
    /// The API group of the node class (`karpenter.k8s.aws`).
    #[x_kube(validation = Rule::new("self != ''").message("group may not be empty"))]
    #[schemars(regex(pattern = "^[^/]*$"))]
    pub group: String,
    /// The kind of the node class (`EC2NodeClass`).
    #[x_kube(validation = Rule::new("self != ''").message("kind may not be empty"))]
    pub kind: String,
    /// The name of the node class.
    #[x_kube(validation = Rule::new("self != ''").message("name may not be empty"))]
    pub name: String,
}

impl NodeClassReference {
    fn validate(&self, out: &mut Violations, path: &str) {
        for (field, value) in [("group", &self.group), ("kind", &self.kind), ("name", &self.name)] {
            if value.is_empty() {
                out.push(format!("{path}.{field}"), format!("{field} may not be empty"));
            }
        }
        if self.group.contains('/') {
            out.push(format!("{path}.group"), "group must not contain '/'");
        }
    }
}

/// Drops the `default` schemars derives from a `#[serde(default)]` where Karpenter's CRD declares
/// none: the field still decodes when absent, the API server just does not fill it in.
pub fn without_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// A condition's `type`: a qualified name, as Kubernetes' `metav1.Condition` declares it.
const CONDITION_TYPE_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

/// The schema of a status condition list with `metav1.Condition`'s constraints: `status` one of
/// `True`, `False`, `Unknown`; `reason` a CamelCase word of at most 1,024 characters, required and
/// non-empty unless `optional_reason`, when it (and `message`) may be left out or empty, as on
/// NodeClaims.
fn conditions_schema(optional_reason: bool) -> schemars::Schema {
    let (required, reason) = if optional_reason {
        (
            serde_json::json!(["lastTransitionTime", "status", "type"]),
            serde_json::json!({"type": "string", "maxLength": 1024,
                               "pattern": r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?|)$"}),
        )
    } else {
        (
            serde_json::json!(["lastTransitionTime", "message", "reason", "status", "type"]),
            serde_json::json!({"type": "string", "minLength": 1, "maxLength": 1024,
                               "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"}),
        )
    };
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "required": required,
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "reason": reason,
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {"type": "string", "maxLength": 316, "pattern": CONDITION_TYPE_PATTERN},
            },
        },
    })
}

/// The conditions of a NodePool or EC2NodeClass (`reason` and `message` required).
pub fn required_reason_conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    conditions_schema(false)
}

/// The conditions of a NodeClaim (`reason` and `message` optional).
pub fn optional_reason_conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    conditions_schema(true)
}

/// The schema of a taint list: key and effect required, effect one of the three Kubernetes effects.
pub fn taints_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["key", "effect"],
            "properties": {
                "key": {"type": "string", "minLength": 1, "pattern": LABEL_KEY_PATTERN},
                "value": {"type": "string", "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"},
                "effect": {"type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                "timeAdded": {"type": "string", "format": "date-time"},
            },
        },
    })
}

/// Checks a taint list.
pub fn validate_taints(out: &mut Violations, path: &str, taints: &[Taint]) {
    for (i, taint) in taints.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if !is_qualified_label_key(&taint.key) {
            out.push(
                format!("{at}.key"),
                format!("{:?} is not a valid taint key", taint.key),
            );
        }
        if let Some(value) = &taint.value
            && !is_label_value(value)
        {
            out.push(
                format!("{at}.value"),
                format!("{value:?} is not a valid taint value"),
            );
        }
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&taint.effect.as_str()) {
            out.push(
                format!("{at}.effect"),
                format!(
                    "{:?} is not one of NoSchedule, PreferNoSchedule, NoExecute",
                    taint.effect
                ),
            );
        }
    }
}

/// Checks the parts of a NodeClaim spec that NodePool templates share.
pub(crate) fn validate_claim_basics(
    out: &mut Violations,
    path: &str,
    node_class_ref: &NodeClassReference,
    taints: &[Taint],
    startup_taints: &[Taint],
) {
    node_class_ref.validate(out, &format!("{path}.nodeClassRef"));
    validate_taints(out, &format!("{path}.taints"), taints);
    validate_taints(out, &format!("{path}.startupTaints"), startup_taints);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_and_values() {
        assert!(is_qualified_label_key("karpenter.k8s.aws/instance-family"));
        assert!(is_qualified_label_key("team"));
        assert!(!is_qualified_label_key("Bad_Domain.com/x"));
        assert!(!is_qualified_label_key("/x"));
        assert!(!is_qualified_label_key("-x"));
        assert!(is_label_value("") && is_label_value("us-west-2a"));
        assert!(!is_label_value("has space"));
    }
}

//! The refusals `joist validate` makes that the CRDs do not: checks made offline that Karpenter
//! makes only once it acts on an object (or, for one, a deliberate difference), so an API server
//! with these CRDs accepts what they refuse. The real-API-server differential test counts them, and
//! kubesim, which judges custom resources with `joist validate`'s rules, lets them through as the
//! real server does.

use serde_json::Value;

use super::Violation;

/// One such check.
struct Beyond {
    /// The kind (any when empty).
    kind: &'static str,
    /// The start of the field.
    field: &'static str,
    /// Words of the problem (its message).
    words: &'static str,
    /// Whether the value at the field, as written, is one the CRDs let through.
    lets_through: fn(Option<&Value>) -> bool,
    /// Why the CRDs let it through.
    why: &'static str,
}

/// Why a number the schema takes whole is refused past 32 bits.
const THIRTY_TWO_BITS: &str =
    "Karpenter's Go types hold these fields in 32 bits and cannot read a larger value";

const BEYOND_THE_CRDS: &[Beyond] = &[
    Beyond {
        kind: "NodePool",
        field: "spec.disruption.budgets",
        words: "invalid cron schedule",
        lets_through: always,
        why: "a budget's cron schedule is parsed when the budget is computed",
    },
    Beyond {
        kind: "NodeOverlay",
        field: "spec.requirements",
        words: "operator ",
        lets_through: always,
        why: "the NodeOverlay's runtime validation (ValidationSucceeded=False) checks its requirements",
    },
    Beyond {
        kind: "",
        field: "spec.kubelet",
        words: "out of range for int32",
        lets_through: always,
        why: THIRTY_TWO_BITS,
    },
    Beyond {
        kind: "CapacityBuffer",
        field: "spec.",
        words: "out of range for int32",
        lets_through: always,
        why: THIRTY_TWO_BITS,
    },
    Beyond {
        kind: "EC2NodeClass",
        field: "spec.",
        words: "expected at least one",
        // The CRDs refuse a term with no `tags` at all; one with `tags: {}` passes them.
        lets_through: |term| term.is_some_and(|term| term.get("tags").is_some()),
        why: "a selector term whose tags are empty names nothing to select by: Joist refuses it, where \
              Karpenter's CRD lets it through",
    },
    Beyond {
        kind: "CapacityBuffer",
        field: "spec",
        words: "a buffer needs podTemplateRef or scalableRef",
        lets_through: always,
        why: "Karpenter's buffer controller finds a buffer without a source when it resolves it \
              (ReadyForProvisioning=False, ResolutionFailed)",
    },
    Beyond {
        kind: "CapacityBuffer",
        field: "spec.scalableRef",
        words: "is not a Deployment, ReplicaSet or StatefulSet",
        lets_through: always,
        why: "Karpenter's buffer controller refuses a workload kind it cannot read when it resolves the buffer",
    },
    Beyond {
        kind: "CapacityBuffer",
        field: "spec.provisioningStrategy",
        words: "the only strategy",
        lets_through: always,
        why: "the CRD takes any strategy; Karpenter's documentation supports only active-capacity",
    },
    Beyond {
        kind: "CapacityBuffer",
        field: "spec.limits",
        words: "cannot be negative",
        lets_through: always,
        why: "the CRD takes any quantity; a negative limit holds no pod",
    },
];

fn always(_: Option<&Value>) -> bool {
    true
}

/// Why the CRDs let `violation` of `document` (as written) through, when it is a check only
/// `joist validate` makes; `None` when an API server with the CRDs refuses it too.
pub fn beyond_the_crds(document: &Value, violation: &Violation) -> Option<&'static str> {
    let kind = document.get("kind").and_then(Value::as_str).unwrap_or_default();
    let value = document.pointer(&pointer(&violation.field));
    BEYOND_THE_CRDS
        .iter()
        .find(|beyond| {
            (beyond.kind.is_empty() || beyond.kind == kind)
                && violation.field.starts_with(beyond.field)
                && violation.message.contains(beyond.words)
                && (beyond.lets_through)(value)
        })
        .map(|beyond| beyond.why)
}

/// The JSON pointer of a field path (`spec.terms[0].tags` → `/spec/terms/0/tags`).
fn pointer(field: &str) -> String {
    field
        .split('.')
        .flat_map(|part| part.split(['[', ']']).filter(|piece| !piece.is_empty()))
        .map(|piece| format!("/{}", piece.replace('~', "~0").replace('/', "~1")))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn violation(field: &str, message: &str) -> Violation {
        Violation {
            field: field.to_owned(),
            message: message.to_owned(),
        }
    }

    #[test]
    fn a_term_with_empty_tags_passes_the_crds_and_one_without_tags_does_not() {
        let problem =
            "a subnet selector term must set tags or id: expected at least one, got none, ['tags', 'id']";
        let class = |term: Value| json!({"kind": "EC2NodeClass", "spec": {"subnetSelectorTerms": [term]}});
        let empty_tags = class(json!({"tags": {}}));
        let no_tags = class(json!({}));
        let at = violation("spec.subnetSelectorTerms[0]", problem);
        assert!(beyond_the_crds(&empty_tags, &at).is_some());
        assert_eq!(beyond_the_crds(&no_tags, &at), None);
    }

    #[test]
    fn only_the_listed_kinds_and_fields_are_beyond_the_crds() {
        let pool = json!({"kind": "NodePool", "spec": {}});
        let schedule = violation(
            "spec.disruption.budgets[0].schedule",
            "invalid cron schedule \"x\": not five fields",
        );
        assert!(beyond_the_crds(&pool, &schedule).is_some());
        let overlay = json!({"kind": "NodeOverlay"});
        assert_eq!(beyond_the_crds(&overlay, &schedule), None);
        assert_eq!(
            beyond_the_crds(&pool, &violation("spec.weight", "must be at most 100")),
            None
        );
    }
}

//! The hashes drift is judged by, as Karpenter stamps them: a NodePool's hash covers the static
//! fields of its template (labels, annotations, taints, startup taints, `expireAfter`,
//! `terminationGracePeriod`, `nodeClassRef`), an EC2NodeClass's hash its spec without the selector
//! terms (what those select is judged by the instance's image, subnet and security groups
//! instead). Requirements are not hashed: a requirement change drifts only the nodes it no longer
//! admits. Budgets, limits, weight and the consolidation policy are not hashed: changing them
//! replaces nothing.
//!
//! Each hash comes with a version ([`NODEPOOL_HASH_VERSION`], [`EC2NODECLASS_HASH_VERSION`]). A
//! NodeClaim stamped with another version (an older Joist, or Karpenter itself, whose hash
//! algorithm differs) is re-stamped with the current hash instead of being called drifted, as
//! Karpenter does when its own algorithm changes: taking over a Karpenter cluster replaces no node.
//!
//! The hash is FNV-1a (64 bits) over canonical JSON (object keys sorted, lists whose order means
//! nothing sorted), printed in decimal as Karpenter prints its own; it is stable across Joist
//! builds and Rust versions.

use std::hash::Hasher;

use serde_json::{Value, json};

use super::{EC2NodeClass, NodePool};
use crate::labels::annotations::{
    EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION as EC2NODECLASS_HASH_VERSION_KEY, NODEPOOL_HASH,
    NODEPOOL_HASH_VERSION as NODEPOOL_HASH_VERSION_KEY,
};

/// The version of Joist's NodePool hash, stamped beside it.
pub const NODEPOOL_HASH_VERSION: &str = "joist-v1";

/// The version of Joist's EC2NodeClass hash, stamped beside it.
pub const EC2NODECLASS_HASH_VERSION: &str = "joist-v1";

/// The hash of a NodePool's static template fields (see the module docs).
pub fn nodepool_hash(pool: &NodePool) -> String {
    let template = &pool.spec.template;
    let taints = to_sorted_list(&template.spec.taints);
    let startup = to_sorted_list(&template.spec.startup_taints);
    hash(&json!({
        "labels": template.metadata.labels,
        "annotations": template.metadata.annotations,
        "taints": taints,
        "startupTaints": startup,
        "expireAfter": template.spec.expire_after,
        "terminationGracePeriod": template.spec.termination_grace_period,
        "nodeClassRef": template.spec.node_class_ref,
    }))
}

/// The hash of an EC2NodeClass's spec without its selector terms (see the module docs).
pub fn ec2nodeclass_hash(class: &EC2NodeClass) -> String {
    let mut spec = serde_json::to_value(&class.spec).unwrap_or_default();
    if let Some(fields) = spec.as_object_mut() {
        for selector in [
            "subnetSelectorTerms",
            "securityGroupSelectorTerms",
            "amiSelectorTerms",
            "capacityReservationSelectorTerms",
            "placementGroupSelector",
        ] {
            fields.remove(selector);
        }
    }
    hash(&spec)
}

/// The annotations that stamp `pool`'s hash on a NodeClaim: the hash, and its version.
pub fn nodepool_stamp(pool: &NodePool) -> [(String, String); 2] {
    nodepool_hash_stamp(nodepool_hash(pool))
}

/// The annotations that stamp `class`'s hash on a NodeClaim: the hash, and its version.
pub fn ec2nodeclass_stamp(class: &EC2NodeClass) -> [(String, String); 2] {
    ec2nodeclass_hash_stamp(ec2nodeclass_hash(class))
}

/// The annotations of a NodePool hash already worked out ([`nodepool_hash`]).
pub fn nodepool_hash_stamp(hash: String) -> [(String, String); 2] {
    [
        (NODEPOOL_HASH.to_owned(), hash),
        (
            NODEPOOL_HASH_VERSION_KEY.to_owned(),
            NODEPOOL_HASH_VERSION.to_owned(),
        ),
    ]
}

/// The annotations of an EC2NodeClass hash already worked out ([`ec2nodeclass_hash`]).
pub fn ec2nodeclass_hash_stamp(hash: String) -> [(String, String); 2] {
    [
        (EC2NODECLASS_HASH.to_owned(), hash),
        (
            EC2NODECLASS_HASH_VERSION_KEY.to_owned(),
            EC2NODECLASS_HASH_VERSION.to_owned(),
        ),
    ]
}

/// Each item as canonical JSON text, for lists hashed as sets.
fn to_sorted_list<T: serde::Serialize>(items: &[T]) -> Vec<String> {
    let mut texts: Vec<String> = items
        .iter()
        .map(|item| canonical(&serde_json::to_value(item).unwrap_or_default()))
        .collect();
    texts.sort_unstable();
    texts
}

fn hash(value: &Value) -> String {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(canonical(value).as_bytes());
    hasher.finish().to_string()
}

/// JSON text with every object's keys sorted, whatever order the map kept them in.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort_unstable();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&fields[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(extra: &str) -> NodePool {
        let text = format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  template:\n    metadata:\n      labels: {{team: a}}\n    spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n      requirements: [{{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}]\n{extra}"
        );
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_template_label_change_drifts_and_a_disruption_or_requirement_change_does_not() {
        let base = nodepool_hash(&pool(""));
        assert_eq!(base, nodepool_hash(&pool("")), "stable");
        let mut relabelled = pool("");
        relabelled
            .spec
            .template
            .metadata
            .labels
            .insert("team".into(), "b".into());
        assert_ne!(base, nodepool_hash(&relabelled));
        let policy = pool("  disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 5m}\n");
        assert_eq!(base, nodepool_hash(&policy), "consolidation policy is not hashed");
        let mut requirements = pool("");
        requirements.spec.template.spec.requirements.clear();
        assert_eq!(
            base,
            nodepool_hash(&requirements),
            "requirements drift on their own"
        );
        let mut expiry = pool("");
        expiry.spec.template.spec.expire_after = "24h".parse().unwrap_or_else(|e| panic!("{e:?}"));
        assert_ne!(base, nodepool_hash(&expiry));
    }

    #[test]
    fn taint_order_does_not_matter() {
        let a = pool("");
        let mut one = a.clone();
        let mut two = a;
        let taint = |key: &str| k8s_openapi::api::core::v1::Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        one.spec.template.spec.taints = vec![taint("x"), taint("y")];
        two.spec.template.spec.taints = vec![taint("y"), taint("x")];
        assert_eq!(nodepool_hash(&one), nodepool_hash(&two));
    }

    #[test]
    fn a_node_class_hash_ignores_selectors_but_not_block_devices() {
        let class = |ami: &str, volume: &str| -> EC2NodeClass {
            serde_saphyr::from_str(&format!(
                "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {{name: d}}\nspec:\n  role: r\n  amiSelectorTerms: [{{alias: {ami}}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n  blockDeviceMappings: [{{deviceName: /dev/xvda, ebs: {{volumeSize: {volume}}}}}]\n"
            ))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let base = ec2nodeclass_hash(&class("al2023@latest", "20Gi"));
        assert_eq!(base, ec2nodeclass_hash(&class("al2023@v20250101", "20Gi")));
        assert_ne!(base, ec2nodeclass_hash(&class("al2023@latest", "40Gi")));
    }
}

//! Pod affinity, anti-affinity and topology spread terms, prepared for the simulation.
//!
//! Label selectors become [`Requirements`] over pod labels (`matchLabels` as `In`, the four set
//! operators as themselves); a missing selector matches no pod, an empty one matches every pod,
//! as in Kubernetes. `matchLabelKeys` of a spread constraint is folded into its selector with the
//! owning pod's values. Affinity namespaces follow the API: the listed names plus those a
//! `namespaceSelector` selects, or the pod's own namespace when neither is given.
//!
//! Failure modes: [`TermError`] names the pod, the field and the malformed selector.

use std::collections::{BTreeMap, BTreeSet};

use joist_messages::{
    labels::normalize_label_key,
    model::requirements::{Operator, Requirement, Requirements},
};
use k8s_openapi::{
    api::core::v1::{PodAffinityTerm, TopologySpreadConstraint, WeightedPodAffinityTerm},
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};

/// A selector or term that cannot be simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field}: {message}")]
pub struct TermError {
    /// `namespace/name`.
    pub pod: String,
    /// Where the term is.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Which namespaces an affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespaces {
    /// Namespaces listed by name.
    pub names: BTreeSet<String>,
    /// A selector over namespace labels; an empty one selects every namespace.
    pub selector: Option<Requirements>,
}

impl Namespaces {
    /// Only `namespace`.
    pub fn only(namespace: &str) -> Self {
        Namespaces {
            names: BTreeSet::from([namespace.to_string()]),
            selector: None,
        }
    }

    /// True when the term covers `namespace`, whose labels are `labels`.
    pub fn contains(&self, namespace: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.names.contains(namespace)
            || self.selector.as_ref().is_some_and(|s| {
                s.is_empty() || labels.is_some_and(|l| s.matches_labels(|k| l.get(k).map(String::as_str)))
            })
    }
}

/// A required (or preferred, treated as required until relaxed) pod affinity or anti-affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AffinityTerm {
    /// The node label that defines a domain (`kubernetes.io/hostname`, a zone, ...).
    pub topology_key: String,
    /// Which pods the term is about; `None` matches none.
    pub selector: Option<Requirements>,
    /// Where those pods are looked for.
    pub namespaces: Namespaces,
}

/// `whenUnsatisfiable` and the policies of a topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpreadConstraint {
    /// The node label that defines a domain.
    pub topology_key: String,
    /// The largest allowed difference between a domain's count and the smallest count.
    pub max_skew: u32,
    /// `DoNotSchedule` (true) or `ScheduleAnyway` (false, a preference Karpenter relaxes last).
    pub hard: bool,
    /// Which pods are counted (with `matchLabelKeys` folded in); `None` counts none.
    pub selector: Option<Requirements>,
    /// With fewer eligible domains than this, the smallest count is taken as zero.
    pub min_domains: Option<u32>,
    /// `nodeAffinityPolicy: Honor` (the default): only domains the pod's node requirements allow count.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor`: only domains with capacity whose taints the pod tolerates count.
    pub honor_node_taints: bool,
}

/// True when `selector` (a prepared label selector) selects a pod with `labels`.
pub fn selects(selector: Option<&Requirements>, labels: &BTreeMap<String, String>) -> bool {
    selector.is_some_and(|s| s.matches_labels(|k| labels.get(k).map(String::as_str)))
}

/// Prepares a Kubernetes label selector; `None` stays `None` (matches nothing).
pub fn label_selector(
    pod: &str,
    field: &str,
    selector: Option<&LabelSelector>,
) -> Result<Option<Requirements>, TermError> {
    let Some(selector) = selector else {
        return Ok(None);
    };
    let bad = |at: String, message: String| TermError {
        pod: pod.to_string(),
        field: at,
        message,
    };
    let mut out = Requirements::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        let req = Requirement::new(key, Operator::In, [value.as_str()])
            .map_err(|e| bad(format!("{field}.matchLabels[{key}]"), e.to_string()))?;
        out.add(req);
    }
    for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        let operator = match expr.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(bad(at, format!("unknown operator {other:?}"))),
        };
        let values = expr.values.clone().unwrap_or_default();
        out.add(Requirement::new(&expr.key, operator, values).map_err(|e| bad(at.clone(), e.to_string()))?);
    }
    Ok(Some(out))
}

/// Prepares one pod affinity term of a pod in `namespace`.
pub fn affinity_term(
    pod: &str,
    namespace: &str,
    field: &str,
    term: &PodAffinityTerm,
) -> Result<AffinityTerm, TermError> {
    let selector = label_selector(
        pod,
        &format!("{field}.labelSelector"),
        term.label_selector.as_ref(),
    )?;
    let names: BTreeSet<String> = term.namespaces.iter().flatten().cloned().collect();
    let ns_selector = label_selector(
        pod,
        &format!("{field}.namespaceSelector"),
        term.namespace_selector.as_ref(),
    )?;
    let namespaces = if names.is_empty() && ns_selector.is_none() {
        Namespaces::only(namespace)
    } else {
        Namespaces {
            names,
            selector: ns_selector,
        }
    };
    Ok(AffinityTerm {
        topology_key: normalize_label_key(&term.topology_key).to_string(),
        selector,
        namespaces,
    })
}

/// Prepares weighted terms, heaviest first (the order Karpenter relaxes them in).
pub fn weighted_terms(
    pod: &str,
    namespace: &str,
    field: &str,
    terms: &[WeightedPodAffinityTerm],
) -> Result<Vec<(i32, AffinityTerm)>, TermError> {
    let mut out = terms
        .iter()
        .enumerate()
        .map(|(i, t)| {
            affinity_term(
                pod,
                namespace,
                &format!("{field}[{i}].podAffinityTerm"),
                &t.pod_affinity_term,
            )
            .map(|term| (t.weight, term))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_by_key(|(weight, _)| std::cmp::Reverse(*weight));
    Ok(out)
}

/// Prepares a topology spread constraint of a pod with `labels`.
pub fn spread_constraint(
    pod: &str,
    field: &str,
    labels: &BTreeMap<String, String>,
    constraint: &TopologySpreadConstraint,
) -> Result<SpreadConstraint, TermError> {
    let bad = |at: &str, message: String| TermError {
        pod: pod.to_string(),
        field: format!("{field}.{at}"),
        message,
    };
    let max_skew = u32::try_from(constraint.max_skew)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            bad(
                "maxSkew",
                format!("must be at least 1, got {}", constraint.max_skew),
            )
        })?;
    let hard = match constraint.when_unsatisfiable.as_str() {
        "DoNotSchedule" => true,
        "ScheduleAnyway" => false,
        other => return Err(bad("whenUnsatisfiable", format!("unknown value {other:?}"))),
    };
    let min_domains = constraint
        .min_domains
        .map(|m| u32::try_from(m).map_err(|_| bad("minDomains", format!("must be positive, got {m}"))))
        .transpose()?;
    let mut selector = label_selector(
        pod,
        &format!("{field}.labelSelector"),
        constraint.label_selector.as_ref(),
    )?;
    if let Some(selector) = selector.as_mut() {
        for key in constraint.match_label_keys.iter().flatten() {
            if let Some(value) = labels.get(key) {
                let req = Requirement::new(key, Operator::In, [value.as_str()])
                    .map_err(|e| bad("matchLabelKeys", e.to_string()))?;
                selector.add(req);
            }
        }
    }
    let honor = |policy: Option<&String>, default: bool, at: &str| match policy.map(String::as_str) {
        None => Ok(default),
        Some("Honor") => Ok(true),
        Some("Ignore") => Ok(false),
        Some(other) => Err(bad(at, format!("unknown policy {other:?}"))),
    };
    Ok(SpreadConstraint {
        topology_key: normalize_label_key(&constraint.topology_key).to_string(),
        max_skew,
        hard,
        selector,
        min_domains,
        honor_node_affinity: honor(
            constraint.node_affinity_policy.as_ref(),
            true,
            "nodeAffinityPolicy",
        )?,
        honor_node_taints: honor(constraint.node_taints_policy.as_ref(), false, "nodeTaintsPolicy")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_missing_selector_matches_nothing_and_an_empty_one_everything() {
        let any = labels(&[("app", "web")]);
        assert!(!selects(None, &any));
        let empty = label_selector("ns/p", "f", Some(&LabelSelector::default()))
            .ok()
            .flatten();
        assert!(selects(empty.as_ref(), &any));
    }

    #[test]
    fn match_label_keys_narrow_the_selector_to_the_pods_own_values() {
        let constraint: TopologySpreadConstraint = serde_json::from_value(serde_json::json!({
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["pod-template-hash"],
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let own = labels(&[("app", "web"), ("pod-template-hash", "abc")]);
        let spread = spread_constraint("ns/p", "f", &own, &constraint).unwrap_or_else(|e| panic!("{e}"));
        assert!(selects(spread.selector.as_ref(), &own));
        assert!(!selects(
            spread.selector.as_ref(),
            &labels(&[("app", "web"), ("pod-template-hash", "old")])
        ));
        assert!(spread.honor_node_affinity && !spread.honor_node_taints);
    }

    #[test]
    fn affinity_namespaces_default_to_the_pods_own() {
        let term: PodAffinityTerm = serde_json::from_value(serde_json::json!({
            "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let prepared = affinity_term("ns/p", "ns", "f", &term).unwrap_or_else(|e| panic!("{e}"));
        assert!(prepared.namespaces.contains("ns", None));
        assert!(!prepared.namespaces.contains("other", None));
        let all: PodAffinityTerm = serde_json::from_value(serde_json::json!({
            "topologyKey": "kubernetes.io/hostname", "namespaceSelector": {},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let prepared = affinity_term("ns/p", "ns", "f", &all).unwrap_or_else(|e| panic!("{e}"));
        assert!(prepared.namespaces.contains("other", None));
    }

    #[test]
    fn bad_terms_name_the_field() {
        let constraint: TopologySpreadConstraint = serde_json::from_value(serde_json::json!({
            "maxSkew": 0, "topologyKey": "k", "whenUnsatisfiable": "DoNotSchedule",
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let err = spread_constraint(
            "ns/p",
            "spec.topologySpreadConstraints[0]",
            &BTreeMap::new(),
            &constraint,
        );
        assert!(
            matches!(&err, Err(TermError { field, .. }) if field == "spec.topologySpreadConstraints[0].maxSkew"),
            "{err:?}"
        );
    }
}

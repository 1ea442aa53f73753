//! The part of kube-scheduler's configuration an autoscaler must mirror to place pods where
//! kube-scheduler will: the PodTopologySpread plugin's `defaultConstraints`, applied to every pod
//! that declares no `topologySpreadConstraints` of its own. A cluster whose scheduler spreads
//! such pods over zones with `DoNotSchedule` leaves them Pending on nodes an autoscaler packed into
//! one zone; mirroring the defaults launches the nodes the scheduler will use.
//!
//! The document is the one Karpenter reads from `SCHEDULER_CONFIG` (no `apiVersion` or `kind`):
//!
//! ```yaml
//! podTopologySpread:
//!   defaultConstraints:
//!     - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}
//! ```
//!
//! As kube-scheduler does, a default constraint carries no selector: each pod's is deduced
//! ([`default_selector`]) from the Services in its namespace that select it and from its controller
//! when that is a ReplicationController, ReplicaSet or StatefulSet. A pod for which nothing can be
//! deduced (a bare pod, a Job's pod no Service selects) gets no defaults.
//!
//! Failure modes: [`SchedulerConfig::parse`] refuses an unknown field, a malformed document and
//! every constraint kube-scheduler itself would refuse, with a [`SchedulerConfigError`] naming the
//! field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::Deserialize;

use crate::apis::common::is_qualified_label_key;

/// Why a scheduler configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerConfigError {
    /// The document is not YAML of the expected shape (an unknown field included).
    #[error("scheduler config: {0}")]
    Parse(String),
    /// A field has a value kube-scheduler would refuse.
    #[error("scheduler config: {field}: {message}")]
    Field {
        /// Its path, `podTopologySpread.defaultConstraints[0].maxSkew`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// kube-scheduler behaviour the simulation mirrors (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The PodTopologySpread plugin's arguments.
    #[serde(default)]
    pub pod_topology_spread: Option<PodTopologySpreadArgs>,
}

/// The PodTopologySpread plugin's arguments that matter to placement.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTopologySpreadArgs {
    /// Constraints for pods that declare none, without selectors.
    #[serde(default)]
    pub default_constraints: Vec<TopologySpreadConstraint>,
}

impl SchedulerConfig {
    /// Reads and checks a document (see the module docs).
    pub fn parse(text: &str) -> Result<Self, SchedulerConfigError> {
        let config: Self =
            serde_saphyr::from_str_with_options(text, serde_saphyr::options! { with_snippet: false })
                .map_err(|e| SchedulerConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// The default constraints, none when unset.
    pub fn default_constraints(&self) -> &[TopologySpreadConstraint] {
        self.pod_topology_spread
            .as_ref()
            .map_or(&[], |args| args.default_constraints.as_slice())
    }

    /// The checks kube-scheduler makes of `defaultConstraints` (for a document read as part of
    /// another, which [`SchedulerConfig::parse`] does not see).
    pub fn validate(&self) -> Result<(), SchedulerConfigError> {
        let constraints = self.default_constraints();
        for (i, constraint) in constraints.iter().enumerate() {
            let bad = |at: &str, message: String| SchedulerConfigError::Field {
                field: format!("podTopologySpread.defaultConstraints[{i}]{at}"),
                message,
            };
            if constraint.max_skew <= 0 {
                return Err(bad(
                    ".maxSkew",
                    format!("must be at least 1, got {}", constraint.max_skew),
                ));
            }
            if !is_qualified_label_key(&constraint.topology_key) {
                return Err(bad(
                    ".topologyKey",
                    format!("{:?} is not a label key", constraint.topology_key),
                ));
            }
            if !matches!(
                constraint.when_unsatisfiable.as_str(),
                "DoNotSchedule" | "ScheduleAnyway"
            ) {
                return Err(bad(
                    ".whenUnsatisfiable",
                    format!(
                        "{:?} is not DoNotSchedule or ScheduleAnyway",
                        constraint.when_unsatisfiable
                    ),
                ));
            }
            if constraint.label_selector.is_some() {
                return Err(bad(
                    ".labelSelector",
                    "must not be set: the selector is deduced for each pod".to_owned(),
                ));
            }
            if constraint
                .match_label_keys
                .as_ref()
                .is_some_and(|keys| !keys.is_empty())
            {
                return Err(bad(
                    ".matchLabelKeys",
                    "must not be set: kube-scheduler ignores it on default constraints".to_owned(),
                ));
            }
            let repeated = constraints[..i].iter().position(|earlier| {
                earlier.topology_key == constraint.topology_key
                    && earlier.when_unsatisfiable == constraint.when_unsatisfiable
            });
            if let Some(j) = repeated {
                return Err(bad(
                    "",
                    format!(
                        "repeats [{j}]: the same topologyKey {:?} and whenUnsatisfiable {}",
                        constraint.topology_key, constraint.when_unsatisfiable
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The default constraints for a pod whose deduced selector is `selector`.
    pub fn constraints_for(&self, selector: &LabelSelector) -> Vec<TopologySpreadConstraint> {
        self.default_constraints()
            .iter()
            .map(|constraint| TopologySpreadConstraint {
                label_selector: Some(selector.clone()),
                ..constraint.clone()
            })
            .collect()
    }
}

/// What a pod's controller contributes to its deduced selector.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnerSelector {
    /// A ReplicationController's selector: its labels override the Services' on a shared key.
    Labels(BTreeMap<String, String>),
    /// A ReplicaSet's or StatefulSet's selector: its requirements are added to the Services'.
    Selector(LabelSelector),
}

/// Whether kube-scheduler deduces a selector from a controller of this API version and kind.
pub fn deduces_from_owner(api_version: &str, kind: &str) -> bool {
    matches!(
        (api_version, kind),
        ("v1", "ReplicationController") | ("apps/v1", "ReplicaSet" | "StatefulSet")
    )
}

/// The selector kube-scheduler deduces for a pod with `labels`: every selector of `services` (the
/// non-nil selectors of the Services in its namespace) that the pod matches, merged key by key (a
/// later Service wins a shared key), then its controller's `owner`. `None` when nothing is deduced:
/// such a pod gets no default constraints (an empty selector would count every pod).
pub fn default_selector<'a>(
    labels: &BTreeMap<String, String>,
    services: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
    owner: Option<&OwnerSelector>,
) -> Option<LabelSelector> {
    let mut match_labels = BTreeMap::new();
    for selector in services {
        if selector.iter().all(|(key, value)| labels.get(key) == Some(value)) {
            match_labels.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    let mut match_expressions = Vec::new();
    match owner {
        Some(OwnerSelector::Labels(owner_labels)) => {
            match_labels.extend(owner_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Some(OwnerSelector::Selector(selector)) => {
            match_expressions.extend(selector.match_labels.iter().flatten().map(|(key, value)| {
                LabelSelectorRequirement {
                    key: key.clone(),
                    operator: "In".to_owned(),
                    values: Some(vec![value.clone()]),
                }
            }));
            match_expressions.extend(selector.match_expressions.iter().flatten().cloned());
        }
        None => {}
    }
    if match_labels.is_empty() && match_expressions.is_empty() {
        return None;
    }
    Some(LabelSelector {
        match_labels: (!match_labels.is_empty()).then_some(match_labels),
        match_expressions: (!match_expressions.is_empty()).then_some(match_expressions),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ZONE_SPREAD: &str = "podTopologySpread:\n  defaultConstraints:\n    - maxSkew: 1\n      \
        topologyKey: topology.kubernetes.io/zone\n      whenUnsatisfiable: DoNotSchedule\n";

    #[test]
    fn a_document_of_karpenters_shape_is_read() {
        let config = SchedulerConfig::parse(ZONE_SPREAD).unwrap();
        let [constraint] = config.default_constraints() else {
            panic!("one constraint")
        };
        assert_eq!(constraint.topology_key, "topology.kubernetes.io/zone");
        assert_eq!(constraint.max_skew, 1);
        assert!(
            SchedulerConfig::parse("{}")
                .unwrap()
                .default_constraints()
                .is_empty()
        );
    }

    #[test]
    fn what_kube_scheduler_refuses_is_refused_with_its_field() {
        let refused = |text: &str| SchedulerConfig::parse(text).unwrap_err().to_string();
        assert!(refused("podTopologySpread: {defaultConstrains: []}").contains("defaultConstrains"));
        let constraint = |body: &str| format!("podTopologySpread: {{defaultConstraints: [{body}]}}");
        assert!(
            refused(&constraint(
                "{maxSkew: 0, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}"
            ))
            .contains("podTopologySpread.defaultConstraints[0].maxSkew: must be at least 1")
        );
        assert!(
            refused(&constraint(
                "{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: Sometimes}"
            ))
            .contains("[0].whenUnsatisfiable")
        );
        assert!(
            refused(&constraint(
                "{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, \
                 labelSelector: {matchLabels: {app: web}}}"
            ))
            .contains("[0].labelSelector: must not be set")
        );
        let twice = "{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}";
        assert!(refused(&constraint(&format!("{twice}, {twice}"))).contains("[1]: repeats [0]"));
    }

    #[test]
    fn the_selector_is_deduced_from_matching_services_and_the_controller() {
        let pod = labels(&[("app", "web"), ("pod-template-hash", "abc"), ("tier", "front")]);
        let web = labels(&[("app", "web")]);
        let other = labels(&[("app", "db")]);
        let replica_set = OwnerSelector::Selector(LabelSelector {
            match_labels: Some(labels(&[("pod-template-hash", "abc")])),
            match_expressions: None,
        });
        let selector = default_selector(&pod, [&web, &other], Some(&replica_set)).unwrap();
        assert_eq!(selector.match_labels, Some(web.clone()));
        let [requirement] = selector.match_expressions.as_deref().unwrap() else {
            panic!()
        };
        assert_eq!(
            (requirement.key.as_str(), requirement.operator.as_str()),
            ("pod-template-hash", "In")
        );

        let controller = OwnerSelector::Labels(labels(&[("tier", "front")]));
        let selector = default_selector(&pod, [&web], Some(&controller)).unwrap();
        assert_eq!(
            selector.match_labels,
            Some(labels(&[("app", "web"), ("tier", "front")]))
        );
    }

    #[test]
    fn a_pod_nothing_selects_gets_no_selector() {
        let pod = labels(&[("app", "batch")]);
        assert_eq!(default_selector(&pod, [&labels(&[("app", "web")])], None), None);
        assert_eq!(default_selector(&pod, [&BTreeMap::new()], None), None);
    }

    #[test]
    fn each_constraint_carries_the_pods_selector() {
        let config = SchedulerConfig::parse(ZONE_SPREAD).unwrap();
        let selector = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: None,
        };
        let [constraint] = config.constraints_for(&selector).try_into().unwrap();
        assert_eq!(constraint.label_selector, Some(selector));
        assert_eq!(constraint.when_unsatisfiable, "DoNotSchedule");
    }
}

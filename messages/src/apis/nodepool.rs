//! `karpenter.sh/v1` NodePool: the constraints and limits for nodes Joist may launch.
//!
//! Field names, defaults and validation match Karpenter v1 (fact sheet §1.1). Defaults are applied
//! when deserializing (`expireAfter: 720h`, `consolidationPolicy: WhenEmptyOrUnderutilized`,
//! `consolidateAfter: 0s`, `budgets: [{nodes: 10%}]`) and also appear in the generated CRD. Rules
//! live twice: as CEL / OpenAPI constraints on the CRD, and in [`Validate::validate`] with field paths.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Taint, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{
        IN_NEEDS_VALUES, MIN_VALUES_NEEDS_VALUES, NUMERIC_NEEDS_ONE_INTEGER, NodeClassReference,
        NodeSelectorRequirementWithMinValues, is_label_value, is_qualified_label_key, taints_schema,
        validate_claim_basics, validate_requirements,
    },
    cron::check_schedule,
    duration::{BudgetDuration, Duration, NillableDuration},
    validation::{Validate, Violation, Violations},
};
use crate::{labels, model::quantity::Quantity};

/// CEL over a list or map whose items' label key is `key` (e.g. `x` or `x.key`): keys in the
/// `kubernetes.io` domain are reserved except well-known ones.
fn kubernetes_io_rule(key: &str) -> String {
    format!(
        r#"self.all(x, {key} in ["beta.kubernetes.io/instance-type", "failure-domain.beta.kubernetes.io/region", "beta.kubernetes.io/os", "beta.kubernetes.io/arch", "failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone", "topology.kubernetes.io/region", "node.kubernetes.io/instance-type", "kubernetes.io/arch", "kubernetes.io/os", "node.kubernetes.io/windows-build"] || {key}.find("^([^/]+)").endsWith("node.kubernetes.io") || {key}.find("^([^/]+)").endsWith("node-restriction.kubernetes.io") || !{key}.find("^([^/]+)").endsWith("kubernetes.io"))"#
    )
}

/// CEL (see [`kubernetes_io_rule`]): keys in the `k8s.io` domain are reserved except `kops.k8s.io`.
fn k8s_io_rule(key: &str) -> String {
    format!(
        r#"self.all(x, {key}.find("^([^/]+)").endsWith("kops.k8s.io") || !{key}.find("^([^/]+)").endsWith("k8s.io"))"#
    )
}

/// CEL (see [`kubernetes_io_rule`]): keys in the `karpenter.sh` domain are reserved except the
/// capacity type.
fn karpenter_sh_rule(key: &str) -> String {
    format!(
        r#"self.all(x, {key} == "karpenter.sh/capacity-type" || !{key}.find("^([^/]+)").endsWith("karpenter.sh"))"#
    )
}

/// CEL (see [`kubernetes_io_rule`]): `karpenter.sh/nodepool` and `kubernetes.io/hostname` are never
/// user-set.
fn nodepool_and_hostname_rule(key: &str) -> String {
    format!(r#"self.all(x, {key} != "karpenter.sh/nodepool" && {key} != "kubernetes.io/hostname")"#)
}

/// NodePoolSpec: the constraints, limits and disruption settings for the nodes this NodePool launches.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    status = "NodePoolStatus",
    category = "karpenter",
    derive = "PartialEq",
    doc = "NodePool is the Schema for the NodePools API",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.nodes"),
    printcolumn(
        name = "NodeClass",
        type_ = "string",
        json_path = ".spec.template.spec.nodeClassRef.name"
    ),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodes"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Weight",
        type_ = "integer",
        json_path = ".spec.weight",
        priority = "1"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".status.resources.cpu",
        priority = "1"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.resources.memory",
        priority = "1"
    )
)]
#[x_kube(
    validation = Rule::new("has(self.replicas) == has(oldSelf.replicas)")
        .message("a NodePool cannot switch between static (replicas set) and dynamic (replicas unset)"),
    validation = Rule::new("!has(self.replicas) || !has(self.limits) || self.limits.all(k, k == 'nodes')")
        .message("a static NodePool takes only limits.nodes"),
    validation = Rule::new("!has(self.replicas) || !has(self.weight)")
        .message("a static NodePool takes no weight")
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// The template of the NodeClaims this NodePool launches.
    pub template: NodeClaimTemplate,
    /// How and when Joist may disrupt this NodePool's nodes. The CRD defaults only
    /// `consolidateAfter` here, as Karpenter's does; the other fields default themselves.
    #[serde(default)]
    #[schemars(extend("default" = {"consolidateAfter": "0s"}))]
    pub disruption: Disruption,
    /// Upper bounds on the total capacity of this NodePool's nodes (any resource, and `nodes`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Priority among NodePools: higher weights are tried first (1..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
    /// A static NodePool's node count (Karpenter's `StaticCapacity` feature gate): Joist keeps
    /// exactly this many nodes whatever the pods need, within `limits.nodes`. It is the NodePool's
    /// scale subresource (`kubectl scale nodepool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
}

/// Labels and annotations propagated to NodeClaims and Nodes.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateMetadata {
    /// Labels for the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "template_labels_schema")]
    #[x_kube(
        validation = Rule::new(kubernetes_io_rule("x")).message("label domain \"kubernetes.io\" is restricted"),
        validation = Rule::new(k8s_io_rule("x")).message("label domain \"k8s.io\" is restricted"),
        validation = Rule::new(karpenter_sh_rule("x")).message("label domain \"karpenter.sh\" is restricted"),
        validation = Rule::new(nodepool_and_hostname_rule("x"))
            .message("label \"karpenter.sh/nodepool\" and \"kubernetes.io/hostname\" are restricted")
    )]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// At most 100 labels, values as Kubernetes allows them (the CEL rules bound their cost by this).
fn template_labels_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 100,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
        },
    })
}

/// The NodeClaim template of a NodePool.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeClaimTemplate {
    /// Labels and annotations.
    #[serde(default)]
    #[schemars(transform = super::common::without_default)]
    pub metadata: TemplateMetadata,
    /// The NodeClaim spec, without resource requests.
    pub spec: NodeClaimTemplateSpec,
}

/// The NodeClaim spec within a NodePool template.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Taints applied to the node; pods must tolerate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub taints: Vec<Taint>,
    /// Taints applied at boot and removed by a daemon; ignored for provisioning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub startup_taints: Vec<Taint>,
    /// Label requirements every node of this NodePool satisfies.
    #[schemars(length(max = 100))]
    #[x_kube(
        validation = Rule::new(IN_NEEDS_VALUES.0).message(IN_NEEDS_VALUES.1),
        validation = Rule::new(NUMERIC_NEEDS_ONE_INTEGER.0).message(NUMERIC_NEEDS_ONE_INTEGER.1),
        validation = Rule::new(MIN_VALUES_NEEDS_VALUES.0).message(MIN_VALUES_NEEDS_VALUES.1),
        validation = Rule::new(kubernetes_io_rule("x.key")).message("label domain \"kubernetes.io\" is restricted"),
        validation = Rule::new(k8s_io_rule("x.key")).message("label domain \"k8s.io\" is restricted"),
        validation = Rule::new(karpenter_sh_rule("x.key")).message("label domain \"karpenter.sh\" is restricted"),
        validation = Rule::new(nodepool_and_hostname_rule("x.key"))
            .message("label \"karpenter.sh/nodepool\" and \"kubernetes.io/hostname\" are restricted")
    )]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The provider-specific node class; its group and kind never change.
    #[x_kube(
        validation = Rule::new("self.group == oldSelf.group").message("nodeClassRef.group is immutable"),
        validation = Rule::new("self.kind == oldSelf.kind").message("nodeClassRef.kind is immutable")
    )]
    pub node_class_ref: NodeClassReference,
    /// Maximum time to drain a node before its pods are forcibly deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<Duration>,
    /// Node lifetime, after which it is replaced (`Never` disables expiry).
    #[serde(default = "default_expire_after")]
    pub expire_after: NillableDuration,
}

fn default_expire_after() -> NillableDuration {
    NillableDuration::After(Duration::from_secs(720 * 3600))
}

/// Which nodes consolidation may remove or replace.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsolidationPolicy {
    /// Only nodes without workload pods.
    WhenEmpty,
    /// Empty nodes, and nodes whose pods fit elsewhere or on a cheaper node.
    #[default]
    WhenEmptyOrUnderutilized,
    /// Score-gated consolidation (savings weighed against disruption).
    Balanced,
}

/// A disruption method a budget can be limited to.
#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DisruptionReason {
    /// Consolidation of underutilized nodes.
    Underutilized,
    /// Removal of empty nodes.
    Empty,
    /// Replacement of drifted nodes.
    Drifted,
}

/// Disruption settings of a NodePool.
///
/// `consolidateAfter` is required by the CRD (as in Karpenter) but defaults to `0s` when decoding,
/// so `joist validate` can still report every other problem of a document that omits it.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("required" = ["consolidateAfter"]))]
pub struct Disruption {
    /// How long a node must be consolidatable before it is consolidated (`Never` disables it).
    #[serde(default = "zero_seconds")]
    #[schemars(transform = super::common::without_default)]
    pub consolidate_after: NillableDuration,
    /// Which nodes consolidation considers.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// Limits on how many nodes may be disrupted at once; the most restrictive active one wins.
    #[serde(default = "default_budgets")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.schedule) == has(x.duration))")
        .message("'schedule' must be set with 'duration'"))]
    pub budgets: Vec<Budget>,
}

fn zero_seconds() -> NillableDuration {
    NillableDuration::After(Duration::from_secs(0))
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            consolidate_after: zero_seconds(),
            consolidation_policy: ConsolidationPolicy::default(),
            budgets: default_budgets(),
        }
    }
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget {
        nodes: default_budget_nodes(),
        reasons: vec![],
        schedule: None,
        duration: None,
    }]
}

fn default_budget_nodes() -> String {
    "10%".to_string()
}

/// Pattern of [`Budget::nodes`].
pub const BUDGET_NODES_PATTERN: &str = "^((100|[0-9]{1,2})%|[0-9]+)$";
/// Pattern of [`Budget::schedule`].
pub const BUDGET_SCHEDULE_PATTERN: &str =
    r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$";

/// A limit on simultaneous disruptions, optionally only during a schedule and for some reasons.
/// `nodes` is required by the CRD, as in Karpenter, and defaults to `10%` when decoding.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[schemars(extend("required" = ["nodes"]))]
pub struct Budget {
    /// A node count (`5`) or a percentage of the NodePool's nodes (`10%`, rounded up).
    #[serde(default = "default_budget_nodes")]
    #[schemars(regex(pattern = BUDGET_NODES_PATTERN))]
    pub nodes: String,
    /// The disruption methods this budget limits; all when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub reasons: Vec<DisruptionReason>,
    /// When the budget becomes active (cron, UTC); always active when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = BUDGET_SCHEDULE_PATTERN))]
    pub schedule: Option<String>,
    /// How long the budget stays active after each schedule hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<BudgetDuration>,
}

/// A parsed [`Budget::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetNodes {
    /// At most this many nodes.
    Count(u32),
    /// At most this percentage (0..=100) of the NodePool's nodes, rounded up.
    Percent(u8),
}

impl BudgetNodes {
    /// Parses `5` or `10%`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} must be a non-negative integer or a percentage from 0% to 100%");
        match text.strip_suffix('%') {
            Some(pct) if (1..=3).contains(&pct.len()) => match pct.parse::<u8>() {
                Ok(p) if p <= 100 && pct.bytes().all(|b| b.is_ascii_digit()) => Ok(BudgetNodes::Percent(p)),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
            None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse().map(BudgetNodes::Count).map_err(|_| bad())
            }
            None => Err(bad()),
        }
    }

    /// How many of `total` nodes may be disrupted (percentages round up, as PDBs do).
    pub fn allowed(self, total: u32) -> u32 {
        match self {
            BudgetNodes::Count(n) => n,
            BudgetNodes::Percent(p) => (u64::from(total) * u64::from(p)).div_ceil(100) as u32,
        }
    }
}

/// The observed state of a NodePool.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// The summed capacity of the NodePool's nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// How many nodes the NodePool has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub nodes: Option<i64>,
    /// The generation of the node class last seen ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
    /// `ValidationSucceeded`, `NodeClassReady`, `NodeRegistrationHealthy`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::common::required_reason_conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl Validate for NodePool {
    fn validate(&self) -> Vec<Violation> {
        let mut out = Violations::default();
        out.require_name(self.metadata.name.as_deref(), "NodePool");
        let spec = &self.spec;
        if spec.replicas.is_some() {
            if let Some(key) = spec
                .limits
                .keys()
                .find(|k| *k != crate::model::resources::names::NODES)
            {
                out.push(
                    format!("spec.limits[{key}]"),
                    "a static NodePool takes only limits.nodes",
                );
            }
            if spec.weight.is_some() {
                out.push("spec.weight", "a static NodePool takes no weight");
            }
        }
        let template = "spec.template";
        for (key, value) in &spec.template.metadata.labels {
            let at = format!("{template}.metadata.labels[{key}]");
            if !is_qualified_label_key(key) {
                out.push(&at, format!("{key:?} is not a valid label key"));
            } else if let Some(reason) = labels::restricted_label_reason(key) {
                out.push(&at, reason);
            }
            if !is_label_value(value) {
                out.push(&at, format!("{value:?} is not a valid label value"));
            }
        }
        if spec.template.metadata.labels.len() > 100 {
            out.push(
                format!("{template}.metadata.labels"),
                "at most 100 labels are allowed",
            );
        }
        let claim = &spec.template.spec;
        let claim_path = format!("{template}.spec");
        validate_requirements(
            &mut out,
            &format!("{claim_path}.requirements"),
            &claim.requirements,
            true,
        );
        validate_claim_basics(
            &mut out,
            &claim_path,
            &claim.node_class_ref,
            &claim.taints,
            &claim.startup_taints,
        );
        if let Some(weight) = spec.weight
            && !(1..=100).contains(&weight)
        {
            out.push(
                "spec.weight",
                format!("weight must be between 1 and 100, got {weight}"),
            );
        }
        for (name, amount) in &spec.limits {
            if amount.millis() < 0 {
                out.push(
                    format!("spec.limits[{name}]"),
                    format!("limit must not be negative, got {amount}"),
                );
            }
        }
        validate_budgets(&mut out, &spec.disruption.budgets);
        out.into_vec()
    }
}

fn validate_budgets(out: &mut Violations, budgets: &[Budget]) {
    if budgets.len() > 50 {
        out.push(
            "spec.disruption.budgets",
            format!("at most 50 budgets are allowed, got {}", budgets.len()),
        );
    }
    for (i, budget) in budgets.iter().enumerate() {
        let at = format!("spec.disruption.budgets[{i}]");
        if let Err(e) = BudgetNodes::parse(&budget.nodes) {
            out.push(format!("{at}.nodes"), e);
        }
        match (&budget.schedule, &budget.duration) {
            (Some(_), None) => out.push(format!("{at}.duration"), "'schedule' must be set with 'duration'"),
            (None, Some(_)) => out.push(format!("{at}.schedule"), "'duration' must be set with 'schedule'"),
            (Some(schedule), Some(_)) => {
                if let Err(e) = check_schedule(schedule) {
                    out.push(
                        format!("{at}.schedule"),
                        format!("invalid cron schedule {schedule:?}: {e}"),
                    );
                }
            }
            (None, None) => {}
        }
        let mut seen = std::collections::BTreeSet::new();
        for reason in &budget.reasons {
            if !seen.insert(reason) {
                out.push(
                    format!("{at}.reasons"),
                    format!("reason {reason:?} is listed twice"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_nodes_parse_and_round_up() {
        assert_eq!(BudgetNodes::parse("10%"), Ok(BudgetNodes::Percent(10)));
        assert_eq!(BudgetNodes::parse("5"), Ok(BudgetNodes::Count(5)));
        assert_eq!(BudgetNodes::parse("100%"), Ok(BudgetNodes::Percent(100)));
        for bad in ["150%", "-1", "", "%", "1.5", "10 %", "1000%"] {
            assert!(BudgetNodes::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(BudgetNodes::Percent(10).allowed(11), 2);
        assert_eq!(BudgetNodes::Percent(10).allowed(10), 1);
        assert_eq!(BudgetNodes::Percent(0).allowed(10), 0);
        assert_eq!(BudgetNodes::Count(3).allowed(1), 3);
    }
}

//! What the scheduler knows of nodes and pods, and kube-scheduler's filters over them: whether a
//! node can take a pod and, when it cannot, the reason kube-scheduler gives (its first failing
//! filter, in kube-scheduler's order).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
};

use joist_messages::model::{quantity::Quantity, resources::Resources};
use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm, Taint, Toleration,
    TopologySpreadConstraint,
};
use serde_json::Value;

use super::volume_topology::{self, VolumeNeed};
use crate::object::Pointer;
use crate::physics::volumes::claim_names;
use crate::{
    conditions,
    object::{items, labels, text},
    selector::label_selector_matches,
};

/// What the scheduler knows about a node.
pub(super) struct NodeInfo {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) taints: Vec<Taint>,
    pub(super) schedulable: bool,
    pub(super) ready: bool,
    pub(super) allocatable: Resources,
    pub(super) requested: Resources,
    pub(super) pods: i64,
    pub(super) ports: HashSet<(String, i64)>,
    /// The claims its pods use (`namespace/name`), with how many of its pods use each.
    pub(super) claims: HashMap<String, usize>,
    /// How many volumes its CSI driver can attach (its CSINode's count), when limited.
    pub(super) volume_limit: Option<usize>,
}

/// What a pod asks of a node.
pub(super) struct PodNeeds {
    pub(super) requests: Resources,
    pub(super) ports: Vec<(String, i64)>,
    /// The claims it uses, `namespace/name`.
    pub(super) claims: Vec<String>,
    pub(super) node_selector: BTreeMap<String, String>,
    pub(super) affinity: Affinity,
    pub(super) tolerations: Vec<Toleration>,
    pub(super) spread: Vec<TopologySpreadConstraint>,
    /// Where its claims let it go ([`super::volume_topology`]).
    pub(super) volumes: Vec<VolumeNeed>,
}

/// A bound pod, as the scheduler accounts for it.
pub(super) struct Bound {
    pub(super) node: String,
    pub(super) requests: Resources,
    pub(super) ports: Vec<(String, i64)>,
    pub(super) claims: Vec<String>,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) namespace: String,
    /// Its required pod anti-affinity terms, which keep the pods they select out of its domains.
    pub(super) anti_terms: Vec<PodAffinityTerm>,
}

/// Why a node cannot take a pod: the first of kube-scheduler's filters it fails.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Refusal {
    NotReady,
    Unschedulable,
    NodeAffinity,
    Taint {
        key: String,
        value: String,
    },
    TooManyPods,
    Insufficient(String),
    Ports,
    VolumeLimit,
    VolumeBinding,
    VolumeNodeAffinity,
    Spread,
    PodAffinity,
    PodAntiAffinity,
    /// A bound pod's required anti-affinity selects the pod, and the node is in its domain.
    ExistingAntiAffinity,
}

impl fmt::Display for Refusal {
    /// kube-scheduler's words for the reason, as its "0/N nodes are available" message counts them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotReady => f.write_str("node(s) had untolerated taint {node.kubernetes.io/not-ready: }"),
            Self::Unschedulable => f.write_str("node(s) were unschedulable"),
            Self::NodeAffinity => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            Self::Taint { key, value } => write!(f, "node(s) had untolerated taint {{{key}: {value}}}"),
            Self::TooManyPods => f.write_str("Too many pods"),
            Self::Insufficient(resource) => write!(f, "Insufficient {resource}"),
            Self::Ports => f.write_str("node(s) didn't have free ports for the requested pod ports"),
            Self::VolumeLimit => f.write_str("node(s) exceed max volume count"),
            Self::VolumeBinding => f.write_str("node(s) didn't find available persistent volumes to bind"),
            Self::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
            Self::Spread => f.write_str("node(s) didn't match pod topology spread constraints"),
            Self::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Self::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Self::ExistingAntiAffinity => {
                f.write_str("node(s) didn't satisfy existing pods anti-affinity rules")
            }
        }
    }
}

/// Whether the pod may go to the node; why not when it may not. `affinity` holds the pod's own
/// required (anti-)affinity terms, `held_off` the bound pods' anti-affinity terms that select it.
pub(super) fn filter(
    node: &NodeInfo,
    needs: &PodNeeds,
    spread: &[SpreadCounts],
    affinity: &[AffinityDomains<'_>],
    held_off: &[AffinityDomains<'_>],
) -> Result<(), Refusal> {
    if !node.ready {
        return Err(Refusal::NotReady);
    }
    if !node.schedulable
        && !tolerated(
            &needs.tolerations,
            "node.kubernetes.io/unschedulable",
            "",
            "NoSchedule",
        )
    {
        return Err(Refusal::Unschedulable);
    }
    if !needs
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        || !node_affinity_matches(&needs.affinity, node)
    {
        return Err(Refusal::NodeAffinity);
    }
    if let Some(taint) = untolerated(&node.taints, &needs.tolerations, &["NoSchedule", "NoExecute"]) {
        return Err(Refusal::Taint {
            key: taint.key.clone(),
            value: taint.value.clone().unwrap_or_default(),
        });
    }
    // The first resource, by name, the node lacks once the pod is added (checked in place: this
    // runs for every candidate node).
    let pods = Quantity::from_units(node.pods + 1);
    let short = needs
        .requests
        .iter()
        .map(|(name, amount)| (name, node.requested.get(name).saturating_add(amount)))
        .chain(std::iter::once(("pods", pods)))
        .filter(|(name, total)| *total > node.allocatable.get(name))
        .map(|(name, _)| name)
        .min();
    if let Some(name) = short {
        return Err(if name == "pods" {
            Refusal::TooManyPods
        } else {
            Refusal::Insufficient(name.to_owned())
        });
    }
    if needs.ports.iter().any(|port| node.ports.contains(port)) {
        return Err(Refusal::Ports);
    }
    if let Some(limit) = node.volume_limit {
        let new = needs
            .claims
            .iter()
            .filter(|c| !node.claims.contains_key(*c))
            .count();
        if new > 0 && node.claims.len() + new > limit {
            return Err(Refusal::VolumeLimit);
        }
    }
    if let Some(refusal) = volume_topology::refusal(&needs.volumes, node) {
        return Err(refusal);
    }
    if spread.iter().any(|counts| !counts.allows(node)) {
        return Err(Refusal::Spread);
    }
    if let Some(term) = affinity.iter().find(|term| !term.allows(node)) {
        return Err(if term.anti {
            Refusal::PodAntiAffinity
        } else {
            Refusal::PodAffinity
        });
    }
    if held_off.iter().any(|term| !term.allows(node)) {
        return Err(Refusal::ExistingAntiAffinity);
    }
    Ok(())
}

/// Whether a pod may run on a node at all: its node selector, required node affinity and
/// tolerations (what the DaemonSet controller checks before it creates a node's pod).
pub(in crate::physics) fn node_accepts(pod: &Value, node: &Value) -> bool {
    let needs = PodNeeds::of(pod);
    let node = NodeInfo::of(node);
    needs
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        && node_affinity_matches(&needs.affinity, &node)
        && untolerated(&node.taints, &needs.tolerations, &["NoSchedule", "NoExecute"]).is_none()
}

/// Whether a pod-affinity term selects a bound pod.
pub(super) fn term_selects(term: &PodAffinityTerm, namespace: &str, bound: &Bound) -> bool {
    selects(term, namespace, &bound.namespace, &bound.labels)
}

/// Whether a pod-affinity term of a pod in `namespace` selects a pod in `their_namespace` with
/// `labels`.
pub(super) fn selects(
    term: &PodAffinityTerm,
    namespace: &str,
    their_namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let in_namespace = match &term.namespaces {
        Some(namespaces) if !namespaces.is_empty() => namespaces.iter().any(|n| n == their_namespace),
        _ => their_namespace == namespace,
    };
    in_namespace && selector_matches(term, labels)
}

/// For one required pod (anti-)affinity term: the domains that hold a selected pod (for a bound
/// pod's anti-affinity term that selects the incoming pod, the domains of the pods holding it).
pub(super) struct AffinityDomains<'a> {
    pub(super) key: String,
    /// Selected pods per domain (domains with none may be listed with 0).
    pub(super) domains: &'a HashMap<String, usize>,
    pub(super) anti: bool,
    /// No pod matches anywhere and the incoming pod matches its own term: any domain will do.
    pub(super) first_of_its_kind: bool,
}

impl AffinityDomains<'_> {
    fn allows(&self, node: &NodeInfo) -> bool {
        let holds = |domain: &String| self.domains.get(domain).is_some_and(|&pods| pods > 0);
        match node.labels.get(&self.key) {
            None => self.anti,
            Some(domain) if self.anti => !holds(domain),
            Some(domain) => self.first_of_its_kind || holds(domain),
        }
    }
}

/// Pods per domain for one spread constraint.
pub(super) struct SpreadCounts {
    pub(super) key: String,
    pub(super) max_skew: i64,
    pub(super) counts: BTreeMap<String, i64>,
}

impl SpreadCounts {
    pub(super) fn allows(&self, node: &NodeInfo) -> bool {
        let Some(domain) = node.labels.get(&self.key) else {
            return false;
        };
        let min = self.counts.values().copied().min().unwrap_or(0);
        let here = self.counts.get(domain).copied().unwrap_or(0);
        here + 1 - min <= self.max_skew
    }
}

impl NodeInfo {
    /// A node with nothing on it yet.
    pub(super) fn of(node: &Value) -> Self {
        Self {
            name: text(node, "/metadata/name").to_owned(),
            labels: labels(node),
            taints: parse(&node["spec"], "taints"),
            schedulable: node.at("/spec/unschedulable").and_then(Value::as_bool) != Some(true),
            ready: conditions::status(node, "Ready") == Some("True"),
            allocatable: resources(node.at("/status/allocatable")),
            requested: Resources::new(),
            pods: 0,
            ports: HashSet::new(),
            claims: HashMap::new(),
            volume_limit: None,
        }
    }

    /// How well the node suits a pod with `needs` (lower is better): first how many of its
    /// `PreferNoSchedule` taints the pod does not tolerate (kube-scheduler's TaintToleration
    /// score, whose weight outweighs resource balance), then the fraction of cpu and memory in
    /// use after placing the pod.
    pub(super) fn score(&self, needs: &PodNeeds) -> (usize, f64) {
        let preferred_against = self
            .taints
            .iter()
            .filter(|t| {
                t.effect == "PreferNoSchedule"
                    && !tolerated(
                        &needs.tolerations,
                        &t.key,
                        t.value.as_deref().unwrap_or_default(),
                        &t.effect,
                    )
            })
            .count();
        (preferred_against, self.allocated_share(&needs.requests))
    }

    /// Fraction of cpu and memory in use after placing `requests`.
    fn allocated_share(&self, requests: &Resources) -> f64 {
        let share = |name: &str| {
            let total = self.allocatable.get(name).millis() as f64;
            if total <= 0.0 {
                1.0
            } else {
                (self.requested.get(name).millis() as f64 + requests.get(name).millis() as f64) / total
            }
        };
        (share("cpu") + share("memory")) / 2.0
    }
}

impl PodNeeds {
    /// Whether where the pod may go depends on other pods: required pod (anti-)affinity, or a
    /// `DoNotSchedule` topology spread.
    pub(super) fn depends_on_pods(&self) -> bool {
        self.required_pod_terms().next().is_some()
            || self
                .spread
                .iter()
                .any(|c| c.when_unsatisfiable == "DoNotSchedule")
    }

    /// The required pod affinity terms, then the anti-affinity ones (marked `true`).
    pub(super) fn required_pod_terms(&self) -> impl Iterator<Item = (&PodAffinityTerm, bool)> {
        let affinity = self
            .affinity
            .pod_affinity
            .as_ref()
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        let anti = self
            .affinity
            .pod_anti_affinity
            .as_ref()
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        affinity
            .into_iter()
            .flatten()
            .map(|t| (t, false))
            .chain(anti.into_iter().flatten().map(|t| (t, true)))
    }

    pub(super) fn of(pod: &Value) -> Self {
        let spec = pod.get("spec").unwrap_or(&Value::Null);
        let init = items(spec, "/initContainers").iter().map(|c| {
            let sidecar = c.get("restartPolicy").and_then(Value::as_str) == Some("Always");
            (resources(c.at("/resources/requests")), sidecar)
        });
        let app = items(spec, "/containers")
            .iter()
            .map(|c| resources(c.at("/resources/requests")));
        let mut requests = Resources::of_containers(app, init);
        requests.apply_pod_level(
            &resources(spec.at("/resources/requests")),
            &resources(spec.at("/resources/limits")),
        );
        requests.add(&resources(spec.get("overhead")));
        let ports = items(spec, "/containers")
            .iter()
            .flat_map(|c| items(c, "/ports"))
            .filter_map(|p| {
                let port = p.get("hostPort")?.as_i64().filter(|p| *p > 0)?;
                Some((
                    p.get("protocol")
                        .and_then(Value::as_str)
                        .unwrap_or("TCP")
                        .to_owned(),
                    port,
                ))
            })
            .collect();
        let namespace = text(pod, "/metadata/namespace");
        let claims = claim_names(pod)
            .map(|claim| format!("{namespace}/{claim}"))
            .collect();
        Self {
            requests,
            ports,
            claims,
            node_selector: parse(spec, "nodeSelector"),
            affinity: parse(spec, "affinity"),
            tolerations: parse(spec, "tolerations"),
            spread: parse(spec, "topologySpreadConstraints"),
            volumes: Vec::new(),
        }
    }
}

/// A field of a pod spec as its Kubernetes type (absent or malformed: the default).
pub(in crate::physics) fn parse<T: serde::de::DeserializeOwned + Default>(spec: &Value, field: &str) -> T {
    spec.get(field)
        .and_then(|v| T::deserialize(v).ok())
        .unwrap_or_default()
}

/// A resource list (`{"cpu": "500m", …}`), skipping amounts that do not parse.
fn resources(list: Option<&Value>) -> Resources {
    list.and_then(Value::as_object)
        .map(|list| {
            list.iter()
                .filter_map(|(name, amount)| {
                    let text = match amount {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    Some((name.clone(), text.parse::<Quantity>().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a taint is tolerated by one of `tolerations`.
/// The first of `taints` with one of `effects` that `tolerations` do not tolerate.
pub(in crate::physics) fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        effects.contains(&t.effect.as_str())
            && !tolerated(
                tolerations,
                &t.key,
                t.value.as_deref().unwrap_or_default(),
                &t.effect,
            )
    })
}

fn tolerated(tolerations: &[Toleration], key: &str, value: &str, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == effect);
        let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty() || k == key);
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == value
                    && t.key.as_deref().is_some_and(|k| !k.is_empty())
            }
        };
        effect_ok && key_ok && value_ok
    })
}

pub(super) fn node_affinity_matches(affinity: &Affinity, node: &NodeInfo) -> bool {
    let Some(selector) = affinity
        .node_affinity
        .as_ref()
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

pub(super) fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&node.name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(v), Some(l)) if v > l)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(v), Some(l)) if v < l)
        }
        _ => false,
    }
}

pub(super) fn selector_matches(term: &PodAffinityTerm, labels: &BTreeMap<String, String>) -> bool {
    term.label_selector
        .as_ref()
        .is_some_and(|s| label_selector_matches(s, labels))
}

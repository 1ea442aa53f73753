//! Pods as the simulation sees them: effective requests, node requirements, tolerations, ports.
//!
//! [`PodInfo::from_pod`] does the Kubernetes arithmetic once per pod, so the solver's inner loops
//! only compare prepared values:
//! - **requests** follow the scheduler: the sum over app containers and restartable (sidecar) init
//!   containers, at least the largest one-shot init container plus the sidecars started before it,
//!   plus pod overhead, plus one `pods` slot. A container's missing request defaults to its limit,
//!   as the API server does at admission.
//! - **node requirements** are the alternatives (ORed terms) of required node affinity, each
//!   narrowed by `nodeSelector`; a pod without either has one empty alternative. Where its
//!   volumes can be used comes from the cluster, not the pod
//!   ([`PodInfo::with_volume_requirements`]).
//!
//! Failure modes: [`PodError`] names the pod and what Joist cannot simulate (for example
//! `matchFields`, which Karpenter also rejects) or a malformed quantity or requirement.

use std::{
    collections::{BTreeMap, HashMap},
    hash::{Hash, Hasher},
    sync::{Arc, LazyLock, Mutex, PoisonError, Weak},
};

use crate::{
    taints::Toleration,
    terms::{AffinityTerm, SpreadConstraint, TermError, affinity_term, spread_constraint, weighted_terms},
    volumes::PodVolumes,
};
use joist_messages::{
    cached_pod::{CachedContainer, CachedPod, CachedPodSpec},
    labels::annotations::DO_NOT_DISRUPT,
    model::{
        quantity::Quantity,
        requirements::{Operator, Requirement, Requirements},
        resources::{Resources, names},
    },
};
use k8s_openapi::{
    api::core::v1::{NodeSelectorTerm, TopologySelectorTerm, TopologySpreadConstraint},
    apimachinery::pkg::api::resource::Quantity as KubeQuantity,
};

/// Why a pod cannot be simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// A resource amount does not parse.
    #[error("pod {pod}: {field}: {message}")]
    BadQuantity {
        /// `namespace/name`.
        pod: String,
        /// Where the quantity is.
        field: String,
        /// The parser's message.
        message: String,
    },
    /// A node selector requirement is malformed or uses an unknown operator.
    #[error("pod {pod}: {field}: {message}")]
    BadRequirement {
        /// `namespace/name`.
        pod: String,
        /// Where the requirement is.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A pod affinity term or spread constraint is malformed.
    #[error(transparent)]
    Term(#[from] TermError),
    /// A volume the pod uses cannot be placed: its claim, volume or StorageClass is missing or
    /// unusable.
    #[error("pod {pod}: {field}: {message}")]
    Volume {
        /// `namespace/name`.
        pod: String,
        /// The volume in the pod.
        field: String,
        /// What is missing or wrong.
        message: String,
    },
    /// The pod uses node affinity `matchFields`, which cannot be simulated for nodes that do not
    /// exist yet.
    #[error("pod {pod}: {field}: matchFields is not supported for provisioning")]
    MatchFields {
        /// `namespace/name`.
        pod: String,
        /// Where the term is.
        field: String,
    },
}

/// A host port a pod binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// The port number.
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`, as a small code (0, 1, 2).
    pub protocol: u8,
}

/// Everything about a pod that decides where it may go, except its size.
///
/// Pods with equal constraints (the replicas of one workload) form one scheduling class, which the
/// solver prepares once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Constraints {
    /// Namespace.
    pub namespace: String,
    /// Labels, for topology and affinity.
    pub labels: BTreeMap<String, String>,
    /// Required node requirements: ORed alternatives, tried first to last.
    pub node_requirements: Vec<Requirements>,
    /// Where the pod's volumes can be used (its claims' PersistentVolume node affinity, or their
    /// StorageClass's allowed topologies while unbound): ORed alternatives, tried first to last;
    /// empty when its volumes go anywhere. Kept apart from `node_requirements`, as kube-scheduler
    /// keeps them apart from node affinity: they narrow the node, not the domains a topology
    /// spread counts.
    pub volume_requirements: Vec<Requirements>,
    /// Preferred node affinity terms with their weights, heaviest first.
    pub preferred_node_requirements: Vec<(i32, Requirements)>,
    /// Tolerations, sorted.
    pub tolerations: Vec<Toleration>,
    /// Host ports the pod binds, sorted.
    pub host_ports: Vec<HostPort>,
    /// Required pod affinity terms.
    pub pod_affinity: Vec<AffinityTerm>,
    /// Preferred pod affinity terms, heaviest first.
    pub preferred_pod_affinity: Vec<(i32, AffinityTerm)>,
    /// Required pod anti-affinity terms.
    pub pod_anti_affinity: Vec<AffinityTerm>,
    /// Preferred pod anti-affinity terms, heaviest first.
    pub preferred_pod_anti_affinity: Vec<(i32, AffinityTerm)>,
    /// Topology spread constraints.
    pub spread: Vec<SpreadConstraint>,
    /// Whether the pod pins the node it lands on: `karpenter.sh/do-not-disrupt: "true"` keeps
    /// that node from every voluntary disruption for as long as the pod runs there.
    pub pins_node: bool,
}

/// A volume a pod has attached to its node, as CSI attach limits count it: its driver and its
/// claim (`namespace/name`; pods sharing a claim attach it once).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttachedVolume {
    /// The CSI driver (`ebs.csi.aws.com`).
    pub driver: String,
    /// The claim, `namespace/name`.
    pub claim: String,
}

/// A pod prepared for the simulation (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    /// The pod's UID (or `namespace/name` when it has none yet).
    pub uid: String,
    /// Name.
    pub name: String,
    /// Effective requests, including one `pods` slot; shared with the pods requesting the same.
    pub requests: Arc<Resources>,
    /// Creation time in seconds since the epoch (0 when unknown), for queue order.
    pub created_unix: i64,
    /// The volumes it attaches to its node, for the nodes whose CSI drivers limit them (none
    /// until [`PodInfo::with_volumes`]).
    pub volumes: Vec<AttachedVolume>,
    /// Where the pod may go: shared, so copies of the pod (each pass's candidates, a simulation's
    /// moves) do not copy its labels and terms.
    constraints: Arc<Constraints>,
    /// A hash of `constraints`, taken once: every simulation sorts its pods into scheduling
    /// classes by it, and hashing the labels and terms each time, then comparing them with the
    /// class's, was most of a consolidation pass over a large cluster. Pods of one kind share
    /// their constraints ([`Kinds`]), so the comparison is mostly of two pointers.
    kind_hash: u64,
}

/// A pod's [`Constraints`] as a key: hashed by the hash its pod took once, equal when the
/// constraints are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kind<'a> {
    /// The constraints.
    pub constraints: &'a Constraints,
    hash: u64,
}

impl Hash for Kind<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Kind<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && (std::ptr::eq(self.constraints, other.constraints) || self.constraints == other.constraints)
    }
}

impl Eq for Kind<'_> {}

/// `value`'s hash, the same in every run (the hash [`Kind`] keys by, for constraints).
fn hash_of(value: &impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// How many new values go by between two sweeps of the values no pod holds any more.
const SWEEP_EVERY: usize = 4_096;

/// The values of one sort (constraints, requests) held by the pods alive in this process, one
/// copy per distinct value (the replicas of a workload share theirs), so telling two pods' values
/// apart is mostly comparing two pointers. A cache only: sharing is invisible, since a shared
/// value is never changed in place.
struct Interned<T> {
    by_hash: HashMap<u64, Weak<T>>,
    added: usize,
}

impl<T> Default for Interned<T> {
    fn default() -> Self {
        Self {
            by_hash: HashMap::new(),
            added: 0,
        }
    }
}

impl<T: PartialEq> Interned<T> {
    /// The live copy of `value`, or a new one.
    fn share(&mut self, value: T, hash: u64) -> Arc<T> {
        if let Some(live) = self.by_hash.get(&hash).and_then(Weak::upgrade)
            && *live == value
        {
            return live;
        }
        let new = Arc::new(value);
        self.by_hash.insert(hash, Arc::downgrade(&new));
        self.added += 1;
        if self.added.is_multiple_of(SWEEP_EVERY) {
            self.by_hash.retain(|_, held| held.strong_count() > 0);
        }
        new
    }
}

/// `value` (whose hash is `hash`), shared through `interned` with the pods holding an equal one.
fn share<T: PartialEq>(interned: &Mutex<Interned<T>>, value: T, hash: u64) -> Arc<T> {
    interned
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .share(value, hash)
}

/// `constraints`, shared with the pods of the same kind alive in this process.
fn shared(constraints: Constraints, hash: u64) -> Arc<Constraints> {
    static KINDS: LazyLock<Mutex<Interned<Constraints>>> = LazyLock::new(Mutex::default);
    share(&KINDS, constraints, hash)
}

/// `requests`, shared with the pods alive in this process that request the same: the solver
/// turns a run of pods holding one copy into vectors without reading each pod's.
fn shared_requests(requests: Resources) -> Arc<Resources> {
    static REQUESTS: LazyLock<Mutex<Interned<Resources>>> = LazyLock::new(Mutex::default);
    let hash = hash_of(&requests);
    share(&REQUESTS, requests, hash)
}

impl PodInfo {
    /// Where the pod may go.
    pub fn constraints(&self) -> &Constraints {
        &self.constraints
    }

    /// The pod's constraints as a key of scheduling classes.
    pub(crate) fn kind(&self) -> Kind<'_> {
        Kind {
            constraints: &self.constraints,
            hash: self.kind_hash,
        }
    }

    /// Changes where the pod may go (generated workloads and tests shape pods this way).
    pub fn change_constraints(&mut self, change: impl FnOnce(&mut Constraints)) {
        change(Arc::make_mut(&mut self.constraints));
        self.kind_hash = hash_of(&*self.constraints);
    }

    /// The pod with what its volumes need of a node: where they can be used (see
    /// [`Constraints::volume_requirements`]) and what they attach.
    #[must_use]
    pub fn with_volumes(mut self, volumes: PodVolumes) -> Self {
        self.volumes = volumes.attached;
        self.with_volume_requirements(volumes.requirements)
    }

    /// The pod whose volumes can be used only where one of `alternatives` holds (see
    /// [`Constraints::volume_requirements`]).
    #[must_use]
    pub fn with_volume_requirements(mut self, alternatives: Vec<Requirements>) -> Self {
        if alternatives != self.constraints.volume_requirements {
            let mut constraints = Constraints::clone(&self.constraints);
            constraints.volume_requirements = alternatives;
            self.kind_hash = hash_of(&constraints);
            self.constraints = shared(constraints, self.kind_hash);
        }
        self
    }

    /// Prepares `pod` (see the module docs).
    pub fn from_pod(pod: &CachedPod) -> Result<Self, PodError> {
        Self::with_default_spread(pod, &[])
    }

    /// Prepares `pod`, spread by `defaults` when it declares no topology spread constraints of its
    /// own, as kube-scheduler applies its configured default constraints (their selectors already
    /// deduced for this pod; see [`joist_messages::scheduler_config`]).
    pub fn with_default_spread(
        pod: &CachedPod,
        defaults: &[TopologySpreadConstraint],
    ) -> Result<Self, PodError> {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let no_spec;
        let spec = match &pod.spec {
            Some(spec) => spec,
            None => {
                no_spec = CachedPodSpec::default();
                &no_spec
            }
        };
        let requests = effective_requests(&key, spec)?;

        let selector: Vec<Requirement> = spec
            .node_selector
            .iter()
            .flatten()
            .map(|(k, v)| {
                Requirement::new(k, Operator::In, [v.as_str()]).map_err(|e| PodError::BadRequirement {
                    pod: key.clone(),
                    field: format!("spec.nodeSelector[{k}]"),
                    message: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        let affinity = spec.affinity.as_ref();
        let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
        let required_terms = node_affinity
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|s| s.node_selector_terms.as_slice())
            .unwrap_or_default();
        let field =
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
        let mut node_requirements = Vec::with_capacity(required_terms.len().max(1));
        for (i, term) in required_terms.iter().enumerate() {
            let mut reqs = term_requirements(&key, &format!("{field}[{i}]"), term)?;
            for r in &selector {
                reqs.add(r.clone());
            }
            node_requirements.push(reqs);
        }
        if node_requirements.is_empty() {
            node_requirements.push(selector.into_iter().collect());
        }

        let preferred_field = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution";
        let mut preferred_node_requirements = node_affinity
            .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, p)| {
                term_requirements(&key, &format!("{preferred_field}[{i}].preference"), &p.preference)
                    .map(|r| (p.weight, r))
            })
            .collect::<Result<Vec<_>, _>>()?;
        preferred_node_requirements.sort_by_key(|(weight, _)| std::cmp::Reverse(*weight));

        let mut host_ports: Vec<HostPort> = all_containers(spec)
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = p.host_port.filter(|port| *port > 0)?;
                let protocol = match p.protocol.as_deref() {
                    Some("UDP") => 1,
                    Some("SCTP") => 2,
                    _ => 0,
                };
                Some(HostPort { port, protocol })
            })
            .collect();
        host_ports.sort_unstable();
        host_ports.dedup();
        let mut tolerations: Vec<Toleration> =
            spec.tolerations.iter().flatten().map(Toleration::from).collect();
        tolerations.sort();
        tolerations.dedup();

        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let own_spread = spec.topology_spread_constraints.as_deref().unwrap_or_default();
        let (spread_constraints, spread_field) = if own_spread.is_empty() && !defaults.is_empty() {
            (defaults, "schedulerConfig.podTopologySpread.defaultConstraints")
        } else {
            (own_spread, "spec.topologySpreadConstraints")
        };
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let pod_anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |terms: Option<&Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>, field: &str| {
            terms
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, t)| affinity_term(&key, &namespace, &format!("{field}[{i}]"), t))
                .collect::<Result<Vec<_>, _>>()
        };
        let constraints = Constraints {
            pod_affinity: required(
                pod_affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
                "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            )?,
            preferred_pod_affinity: weighted_terms(
                &key,
                &namespace,
                "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution",
                pod_affinity
                    .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_deref())
                    .unwrap_or_default(),
            )?,
            pod_anti_affinity: required(
                pod_anti_affinity
                    .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
                "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            )?,
            preferred_pod_anti_affinity: weighted_terms(
                &key,
                &namespace,
                "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution",
                pod_anti_affinity
                    .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_deref())
                    .unwrap_or_default(),
            )?,
            spread: spread_constraints
                .iter()
                .enumerate()
                .map(|(i, c)| spread_constraint(&key, &format!("{spread_field}[{i}]"), &labels, c))
                .collect::<Result<Vec<_>, _>>()?,
            namespace,
            labels,
            node_requirements,
            volume_requirements: Vec::new(),
            preferred_node_requirements,
            tolerations,
            host_ports,
            pins_node: (pod.metadata.annotations.as_ref())
                .and_then(|annotations| annotations.get(DO_NOT_DISRUPT))
                .is_some_and(|value| value == "true"),
        };
        let hash = hash_of(&constraints);
        Ok(PodInfo {
            uid: pod.metadata.uid.clone().unwrap_or_else(|| key.clone()),
            name,
            requests: shared_requests(requests),
            created_unix: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            volumes: Vec::new(),
            kind_hash: hash,
            constraints: shared(constraints, hash),
        })
    }
}

fn all_containers(spec: &CachedPodSpec) -> impl Iterator<Item = &CachedContainer> {
    spec.init_containers.iter().flatten().chain(&spec.containers)
}

/// One container's requests, a missing request defaulting to the limit. The container's field
/// path (`spec.containers[0]`) is written out only for an error.
fn container_requests(
    pod: &str,
    field: &dyn Fn() -> String,
    container: &CachedContainer,
) -> Result<Resources, PodError> {
    let resources = container.resources.as_ref();
    let mut out = amounts(
        pod,
        &|| format!("{}.resources.limits", field()),
        resources.and_then(|r| r.limits.as_deref()),
    )?;
    let requests = amounts(
        pod,
        &|| format!("{}.resources.requests", field()),
        resources.and_then(|r| r.requests.as_deref()),
    )?;
    for (name, amount) in requests.iter() {
        out.set(name, amount); // requests win over limits.
    }
    Ok(out)
}

/// A list of amounts parsed, the first unreadable one the error (at `field[name]`).
fn amounts(
    pod: &str,
    field: &dyn Fn() -> String,
    list: Option<&[(String, KubeQuantity)]>,
) -> Result<Resources, PodError> {
    let mut out = Resources::new();
    for (name, amount) in list.into_iter().flatten() {
        out.set(
            name,
            parse_quantity(pod, || format!("{}[{name}]", field()), amount)?,
        );
    }
    Ok(out)
}

/// An amount parsed; `field` names where it is, and is called only when it does not read (every
/// pending pod's requests are parsed on every provisioning pass).
fn parse_quantity(
    pod: &str,
    field: impl FnOnce() -> String,
    amount: &KubeQuantity,
) -> Result<Quantity, PodError> {
    amount.0.parse().map_err(
        |e: joist_messages::model::quantity::QuantityError| PodError::BadQuantity {
            pod: pod.to_string(),
            field: field(),
            message: e.to_string(),
        },
    )
}

/// The pod's effective requests, as kube-scheduler computes them (see the module docs).
pub fn effective_requests(pod: &str, spec: &CachedPodSpec) -> Result<Resources, PodError> {
    let app = (spec.containers.iter().enumerate())
        .map(|(i, c)| container_requests(pod, &|| format!("spec.containers[{i}]"), c))
        .collect::<Result<Vec<_>, _>>()?;
    let init = (spec.init_containers.iter().flatten().enumerate())
        .map(|(i, c)| {
            let requests = container_requests(pod, &|| format!("spec.initContainers[{i}]"), c)?;
            Ok((requests, c.restart_policy.as_deref() == Some("Always")))
        })
        .collect::<Result<Vec<_>, PodError>>()?;
    let mut total = Resources::of_containers(app, init);
    if let Some(pod_level) = &spec.resources {
        let requests = amounts(
            pod,
            &|| "spec.resources.requests".to_owned(),
            pod_level.requests.as_deref(),
        )?;
        let limits = amounts(
            pod,
            &|| "spec.resources.limits".to_owned(),
            pod_level.limits.as_deref(),
        )?;
        total.apply_pod_level(&requests, &limits);
    }
    for (name, amount) in spec.overhead.iter().flatten() {
        let parsed = parse_quantity(pod, || format!("spec.overhead[{name}]"), amount)?;
        total.add(&Resources::new().with(name, parsed));
    }
    total.add(&Resources::new().with(names::PODS, Quantity::from_units(1)));
    Ok(total)
}

/// The requirements of one node selector term.
pub(crate) fn term_requirements(
    pod: &str,
    field: &str,
    term: &NodeSelectorTerm,
) -> Result<Requirements, PodError> {
    if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(PodError::MatchFields {
            pod: pod.to_string(),
            field: format!("{field}.matchFields"),
        });
    }
    let mut out = Requirements::new();
    for (i, expr) in term.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        let bad = |message: String| PodError::BadRequirement {
            pod: pod.to_string(),
            field: at.clone(),
            message,
        };
        let operator: Operator = core_operator(&expr.operator)
            .ok_or_else(|| bad(format!("unknown operator {:?}", expr.operator)))?;
        let values = expr.values.clone().unwrap_or_default();
        out.add(Requirement::new(&expr.key, operator, values).map_err(|e| bad(e.to_string()))?);
    }
    Ok(out)
}

/// A StorageClass's allowed topology term as requirements (each expression `key In values`).
pub(crate) fn topology_requirements(term: &TopologySelectorTerm) -> Result<Requirements, String> {
    term.match_label_expressions
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| {
            Requirement::new(&e.key, Operator::In, e.values.iter().cloned())
                .map_err(|error| format!("matchLabelExpressions[{i}]: {error}"))
        })
        .collect()
}

/// The operators a core/v1 node selector may use.
fn core_operator(text: &str) -> Option<Operator> {
    Some(match text {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn cpu(info: &PodInfo) -> i64 {
        info.requests.get(names::CPU).millis()
    }

    #[test]
    fn pods_of_one_kind_share_their_constraints_until_one_is_changed() {
        let info = |port: i32| {
            PodInfo::from_pod(&pod(serde_json::json!({
                "containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": port}]}],
            })))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let (first, second, other) = (info(7001), info(7001), info(7002));
        assert!(Arc::ptr_eq(&first.constraints, &second.constraints));
        assert_eq!(first.kind(), second.kind());
        assert!(!Arc::ptr_eq(&first.constraints, &other.constraints));
        assert_ne!(first.kind(), other.kind());
        let mut changed = second.clone();
        changed.change_constraints(|c| c.host_ports.clear());
        assert!(changed.constraints().host_ports.is_empty());
        assert_eq!(
            first.constraints().host_ports.len(),
            1,
            "the shared copy is untouched"
        );
        assert_ne!(changed.kind(), first.kind());
    }

    #[test]
    fn pods_requesting_the_same_share_one_copy_of_their_requests() {
        let info = |cpu: &str| {
            PodInfo::from_pod(&pod(serde_json::json!({
                "containers": [{"name": "a", "resources": {"requests": {"cpu": cpu}}}],
            })))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let (first, second, other) = (info("250m"), info("0.25"), info("500m"));
        assert!(
            Arc::ptr_eq(&first.requests, &second.requests),
            "250m and 0.25 are one amount"
        );
        assert!(!Arc::ptr_eq(&first.requests, &other.requests));
        assert_eq!(cpu(&first), 250);
        assert_eq!(cpu(&other), 500);
    }

    #[test]
    fn requests_sum_containers_add_overhead_and_one_pod_slot() {
        let info = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}},
            ],
            "overhead": {"cpu": "100m"},
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cpu(&info), 1600, "a missing request defaults to the limit");
        assert_eq!(
            info.requests.get(names::MEMORY),
            "1Gi".parse().unwrap_or_default()
        );
        assert_eq!(info.requests.get(names::PODS), Quantity::from_units(1));
    }

    #[test]
    fn pod_level_resources_stand_for_the_containers_cpu_memory_and_huge_pages() {
        let info = PodInfo::from_pod(&pod(serde_json::json!({
            "resources": {"requests": {"cpu": "3"}, "limits": {"memory": "2Gi", "cpu": "4"}},
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
            ],
            "overhead": {"cpu": "100m"},
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cpu(&info),
            3100,
            "the pod-level request replaces the containers' 1 cpu"
        );
        assert_eq!(
            info.requests.get(names::MEMORY),
            "2Gi".parse().unwrap_or_default(),
            "no memory request anywhere: the pod-level limit stands for one"
        );
        assert_eq!(
            info.requests.get("nvidia.com/gpu"),
            Quantity::from_units(1),
            "other resources stay the containers'"
        );
        let limits_only = PodInfo::from_pod(&pod(serde_json::json!({
            "resources": {"limits": {"cpu": "4"}},
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}}}],
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cpu(&limits_only),
            500,
            "a container's request wins over a pod-level limit"
        );
    }

    #[test]
    fn init_containers_count_at_their_peak_and_sidecars_run_alongside() {
        let info = PodInfo::from_pod(&pod(serde_json::json!({
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "2"}}},
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        // Peak is the one-shot init (2) plus the sidecar started before it (0.2); steady state 1.2.
        assert_eq!(cpu(&info), 2200);
        let small_init = PodInfo::from_pod(&pod(serde_json::json!({
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "100m"}}}],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cpu(&small_init), 1000);
    }

    #[test]
    fn node_selector_narrows_every_affinity_term() {
        let info = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [{"name": "app"}],
            "nodeSelector": {"kubernetes.io/arch": "arm64"},
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}]},
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}},
                    {"weight": 50, "preference": {"matchExpressions": [{"key": "y", "operator": "Exists"}]}},
                ],
            }},
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(info.constraints().node_requirements.len(), 2);
        for alternative in &info.constraints().node_requirements {
            assert!(
                alternative
                    .get("kubernetes.io/arch")
                    .is_some_and(|r| r.has("arm64") && !r.has("amd64"))
            );
        }
        assert_eq!(
            info.constraints().preferred_node_requirements[0].0,
            50,
            "heaviest preference first"
        );
    }

    #[test]
    fn a_pod_without_constraints_has_one_empty_alternative() {
        let info = PodInfo::from_pod(&pod(serde_json::json!({"containers": [{"name": "app",
            "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "hostPort": 53, "protocol": "UDP"}, {"containerPort": 9000}]}]})))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(info.constraints().node_requirements, vec![Requirements::new()]);
        assert_eq!(
            info.constraints().host_ports,
            vec![
                HostPort {
                    port: 53,
                    protocol: 1
                },
                HostPort {
                    port: 8080,
                    protocol: 0
                }
            ]
        );
        assert_eq!(info.uid, "u1");
    }

    #[test]
    fn errors_name_the_pod_and_field() {
        let bad_quantity = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "lots"}}}],
        })));
        assert!(
            matches!(&bad_quantity, Err(PodError::BadQuantity { pod, field, .. })
            if pod == "ns/p" && field == "spec.containers[0].resources.requests[cpu]"),
            "{bad_quantity:?}"
        );
        let bad_init_limit = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [{"name": "app"}],
            "initContainers": [{"name": "a"}, {"name": "b", "resources": {"limits": {"memory": "1Zz"}}}],
        })));
        assert!(
            matches!(&bad_init_limit, Err(PodError::BadQuantity { field, .. })
            if field == "spec.initContainers[1].resources.limits[memory]"),
            "{bad_init_limit:?}"
        );
        let match_fields = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [{"name": "app"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}},
        })));
        assert!(matches!(match_fields, Err(PodError::MatchFields { .. })));
        let bad_operator = PodInfo::from_pod(&pod(serde_json::json!({
            "containers": [{"name": "app"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "k", "operator": "Equals", "values": ["v"]}]}]}}},
        })));
        assert!(matches!(bad_operator, Err(PodError::BadRequirement { .. })));
    }

    #[test]
    fn default_spread_applies_only_to_pods_without_constraints_of_their_own() {
        let spread = |key: &str| -> TopologySpreadConstraint {
            serde_json::from_value(serde_json::json!({"maxSkew": 1, "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let defaults = [spread("topology.kubernetes.io/zone")];
        let bare = pod(serde_json::json!({"containers": [{"name": "app"}]}));
        let defaulted = PodInfo::with_default_spread(&bare, &defaults).unwrap_or_else(|e| panic!("{e}"));
        let keys = |info: &PodInfo| {
            info.constraints
                .spread
                .iter()
                .map(|c| c.topology_key.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&defaulted), ["topology.kubernetes.io/zone"]);
        assert!(defaulted.constraints.spread[0].hard);

        let own = pod(serde_json::json!({"containers": [{"name": "app"}],
            "topologySpreadConstraints": [spread("kubernetes.io/hostname")]}));
        let kept = PodInfo::with_default_spread(&own, &defaults).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(keys(&kept), ["kubernetes.io/hostname"]);
    }
}

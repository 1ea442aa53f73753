//! The scenario file `joist simulate` runs (the format is documented in docs/simulator.md and kept
//! stable): a simulated cloud, controller settings, manifests applied at t=0, timed steps, and an
//! end time. Parsing checks everything a run would trip over later, and every error names the
//! field (`spec.steps[2].at`) and what is wrong with it.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use joist_kubesim::{api::ApiFailure, resources::GroupResource};
use joist_messages::{
    apis::{
        duration::Duration as KarpenterDuration,
        ec2nodeclass::{ALIAS_FAMILIES, InstanceMatchCriteria, ReservationType},
    },
    model::instance_type::CapacityType,
    scheduler_config::SchedulerConfig,
};
use joist_provider::{instance_status::StatusCategory, placement_group::Strategy};
use joist_provider_sim::{BootFault, Failure, OfferingPattern, Operation, SimReservation};
use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;

/// A scenario that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not YAML of the scenario's shape.
    #[error("the scenario is not valid: {0}")]
    Parse(String),
    /// A field holds a value that cannot be used.
    #[error("scenario field {field}: {message}")]
    Field {
        /// The field's path.
        field: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    seed: u64,
    cloud: CloudSpec,
    #[serde(default)]
    settings: SettingsSpec,
    #[serde(default)]
    manifests: String,
    #[serde(default)]
    steps: Vec<StepSpec>,
    until: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CloudSpec {
    region: String,
    #[serde(default)]
    zones: Vec<String>,
    #[serde(default = "default_boot_seconds")]
    boot_seconds: u64,
}

fn default_boot_seconds() -> u64 {
    40
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SettingsSpec {
    batch_idle_duration: Option<String>,
    batch_max_duration: Option<String>,
    #[serde(default)]
    feature_gates: FeatureGates,
    scheduler_config: Option<SchedulerConfig>,
}

/// Karpenter's feature gates a scenario may set (the chart's `settings.featureGates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FeatureGates {
    /// `ReservedCapacity`: capacity reservations are launched into (on unless turned off, as in
    /// Karpenter).
    #[serde(default = "on")]
    pub reserved_capacity: bool,
    /// `NodeRepair`: nodes broken for longer than the cloud's repair policies tolerate are replaced.
    #[serde(default)]
    pub node_repair: bool,
    /// `SpotToSpotConsolidation`: spot nodes may be replaced by cheaper spot nodes.
    #[serde(default)]
    pub spot_to_spot_consolidation: bool,
    /// `StaticCapacity`: NodePools with `replicas` keep that many nodes.
    #[serde(default)]
    pub static_capacity: bool,
    /// `NodeOverlay`: NodeOverlays change the catalog's prices and extended resources.
    #[serde(default)]
    pub node_overlay: bool,
    /// `CapacityBuffer`: CapacityBuffers keep room for pods not there yet.
    #[serde(default)]
    pub capacity_buffer: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            reserved_capacity: true,
            node_repair: false,
            spot_to_spot_consolidation: false,
            static_capacity: false,
            node_overlay: false,
            capacity_buffer: false,
        }
    }
}

fn on() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    at: String,
    apply: Option<String>,
    scale: Option<ScaleSpec>,
    unavailable: Option<UnavailableSpec>,
    interrupt: Option<InterruptSpec>,
    delete: Option<ObjectSpec>,
    #[serde(rename = "failCreates")]
    fail_creates: Option<FailCreatesSpec>,
    #[serde(rename = "failCloud")]
    fail_cloud: Option<FailCloudSpec>,
    #[serde(rename = "failKube")]
    fail_kube: Option<FailKubeSpec>,
    #[serde(rename = "releaseImage")]
    release_image: Option<ReleaseImageSpec>,
    #[serde(rename = "nodeCondition")]
    node_condition: Option<NodeConditionSpec>,
    #[serde(rename = "bootFault")]
    boot_fault: Option<BootFaultSpec>,
    #[serde(rename = "taintNodes")]
    taint_nodes: Option<TaintNodesSpec>,
    #[serde(rename = "impairInstances")]
    impair_instances: Option<ImpairSpec>,
    #[serde(rename = "createCapacityReservation")]
    create_capacity_reservation: Option<ReservationSpec>,
    #[serde(rename = "cancelCapacityReservation")]
    cancel_capacity_reservation: Option<CancelReservationSpec>,
    #[serde(rename = "createPlacementGroup")]
    create_placement_group: Option<PlacementGroupSpec>,
    #[serde(rename = "deletePlacementGroup")]
    delete_placement_group: Option<DeletePlacementGroupSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementGroupSpec {
    name: String,
    strategy: String,
    #[serde(default)]
    partitions: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeletePlacementGroupSpec {
    name: String,
}

/// The placement group strategies a `createPlacementGroup` step names (a partition group's count
/// comes from `partitions`).
const PLACEMENT_STRATEGIES: [(&str, Strategy); 3] = [
    ("cluster", Strategy::Cluster),
    ("partition", Strategy::Partition { partitions: 0 }),
    ("spread", Strategy::Spread),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReservationSpec {
    id: String,
    instance_type: String,
    zone: String,
    count: u32,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    ends_after: Option<String>,
    #[serde(default)]
    interruptible: bool,
    #[serde(default)]
    instance_match_criteria: Option<String>,
    #[serde(default, rename = "ownerID")]
    owner_id: Option<String>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelReservationSpec {
    id: String,
}

/// The reservation types a `createCapacityReservation` step names.
const RESERVATION_TYPES: [(&str, ReservationType); 2] = [
    ("default", ReservationType::Default),
    ("capacity-block", ReservationType::CapacityBlock),
];

/// The instance match criteria a `createCapacityReservation` step names.
const MATCH_CRITERIA: [(&str, InstanceMatchCriteria); 2] = [
    ("targeted", InstanceMatchCriteria::Targeted),
    ("open", InstanceMatchCriteria::Open),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImpairSpec {
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default = "one")]
    count: usize,
    check: String,
}

/// The checks an `impairInstances` step fails, by the names a scenario uses.
const STATUS_CHECKS: [(&str, StatusCategory); 3] = [
    ("instance", StatusCategory::Instance),
    ("system", StatusCategory::System),
    ("event", StatusCategory::Event),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FailKubeSpec {
    failure: String,
    #[serde(default)]
    delay: Option<String>,
    #[serde(rename = "for")]
    duration: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BootFaultSpec {
    never: String,
    #[serde(rename = "for")]
    duration: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TaintNodesSpec {
    key: String,
    #[serde(default)]
    value: Option<String>,
    effect: String,
    #[serde(rename = "for")]
    duration: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeConditionSpec {
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default = "one")]
    count: usize,
    #[serde(rename = "type", default = "ready")]
    type_: String,
    #[serde(default = "not_true")]
    status: String,
}

fn ready() -> String {
    "Ready".to_owned()
}

fn not_true() -> String {
    "False".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReleaseImageSpec {
    family: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FailCreatesSpec {
    resource: String,
    #[serde(default = "one")]
    count: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FailCloudSpec {
    operation: String,
    #[serde(default)]
    failure: Option<String>,
    #[serde(rename = "for")]
    duration: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScaleSpec {
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    name: String,
    replicas: i32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UnavailableSpec {
    #[serde(default)]
    instance_type: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    capacity_type: Option<String>,
    #[serde(rename = "for")]
    duration: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InterruptSpec {
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default = "one")]
    count: usize,
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ObjectSpec {
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    name: String,
}

/// A Kubernetes object named by kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// The kind (`Deployment`).
    pub kind: String,
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Apply more manifests.
    Apply(String),
    /// Set a workload's replicas.
    Scale {
        /// The workload.
        object: ObjectRef,
        /// Replicas wanted.
        replicas: i32,
    },
    /// Make the offerings a pattern covers refuse launches (`InsufficientInstanceCapacity`).
    Unavailable {
        /// The offerings: a field left open covers every value.
        pattern: OfferingPattern,
        /// For how long.
        duration: Duration,
    },
    /// Interrupt spot instances.
    Interrupt {
        /// Labels the nodes must carry.
        node_selector: BTreeMap<String, String>,
        /// How many.
        count: usize,
    },
    /// Delete an object.
    Delete(ObjectRef),
    /// Make the API server refuse the next creates of a resource (500).
    FailCreates {
        /// The resource: `nodeclaims.karpenter.sh`, `pods`.
        resource: GroupResource,
        /// How many creates fail.
        count: usize,
    },
    /// Make cloud calls fail: throttled, hanging, or losing their replies.
    FailCloud {
        /// The calls (`ec2` names every EC2 call).
        operations: Vec<Operation>,
        /// How they fail.
        failure: Failure,
        /// For how long.
        duration: Duration,
    },
    /// Make the API server fail Joist's requests for a while: refused or lost writes, slow
    /// answers, watches that drop or must list again.
    FailKube {
        /// How they fail.
        failure: ApiFailure,
        /// For how long.
        duration: Duration,
    },
    /// Make instances launched for a while come up broken.
    BootFault {
        /// What they never do.
        fault: BootFault,
        /// For how long launches are affected.
        duration: Duration,
    },
    /// Taint every Node that becomes Ready, for a while, as a foreign controller would.
    TaintNodes {
        /// The taint.
        taint: Taint,
        /// For how long.
        duration: Duration,
    },
    /// Make a status check of running instances fail from now on, as EC2 reports a broken
    /// instance or host, or schedule maintenance for them (`event`).
    ImpairInstances {
        /// Labels their nodes must carry.
        node_selector: BTreeMap<String, String>,
        /// How many.
        count: usize,
        /// Which check.
        category: StatusCategory,
    },
    /// Create a capacity reservation in the cloud (or replace the one with its id).
    CreateReservation {
        /// The reservation, its end (if any) counted from the step.
        reservation: SimReservation,
        /// How long after the step it ends.
        ends_after: Option<Duration>,
    },
    /// Cancel a capacity reservation: its instances run on as on-demand instances.
    CancelReservation {
        /// Its id.
        id: String,
    },
    /// Create a placement group in the cloud (a new one, with a new id, when the name is taken).
    CreatePlacementGroup {
        /// Its name.
        name: String,
        /// How it places instances.
        strategy: Strategy,
    },
    /// Delete a placement group: it is no longer described; its instances run on.
    DeletePlacementGroup {
        /// Its name.
        name: String,
    },
    /// Set a condition on Nodes, as a failing kubelet or the node monitoring agent would: the
    /// first `count` nodes by name that match and do not show `status` yet.
    NodeCondition {
        /// Labels the nodes must carry.
        node_selector: BTreeMap<String, String>,
        /// How many.
        count: usize,
        /// The condition's type (`Ready`).
        type_: String,
        /// Its new status (`True`, `False`, `Unknown`).
        status: String,
    },
    /// Release a new image for an AMI family: node classes selecting `family@latest` move to it,
    /// and the nodes booted from the old one drift (`AMIDrift`).
    ReleaseImage {
        /// The family (`al2023`).
        family: String,
    },
}

/// One timed step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// When, after the start.
    pub at: Duration,
    /// What.
    pub action: Action,
}

/// A parsed, checked scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// Seed of every random choice.
    pub seed: u64,
    /// The cloud's region.
    pub region: String,
    /// The cloud's zones.
    pub zones: Vec<String>,
    /// From launch to Node registration.
    pub boot: Duration,
    /// `batchIdleDuration`.
    pub batch_idle: Duration,
    /// `batchMaxDuration`.
    pub batch_max: Duration,
    /// The feature gates turned on.
    pub feature_gates: FeatureGates,
    /// The cluster's kube-scheduler settings (`settings.schedulerConfig`), which kubesim's
    /// scheduler applies and Joist mirrors, as `SCHEDULER_CONFIG` tells it in production.
    pub scheduler_config: Option<Arc<SchedulerConfig>>,
    /// Manifests applied at t=0.
    pub manifests: String,
    /// Steps in time order.
    pub steps: Vec<Step>,
    /// When the run ends.
    pub until: Duration,
    /// A cluster to start from, restored before anything runs (`joist what-if`; no scenario file
    /// names one).
    pub snapshot: Option<std::sync::Arc<crate::snapshot::Snapshot>>,
}

fn duration(field: &str, text: &str) -> Result<Duration, ScenarioError> {
    text.parse::<KarpenterDuration>()
        .map(|d| d.as_std())
        .map_err(|e| ScenarioError::Field {
            field: field.to_owned(),
            message: format!("{text:?} is not a duration (like 90s, 2m, 1h30m): {e}"),
        })
}

/// `text` read as YAML of `T`'s shape; the error is one line (where, and what is wrong), without
/// the snippet of the file a terminal would show under it.
fn yaml<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, ScenarioError> {
    serde_saphyr::from_str_with_options(text, serde_saphyr::options! { with_snippet: false })
        .map_err(|e| ScenarioError::Parse(e.to_string()))
}

/// The names of a scenario vocabulary, for an error listing the choices.
fn names<T>(choices: &[(&str, T)]) -> String {
    choices
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `name` stands for in a vocabulary table (`Operation::NAMES` …).
fn lookup<T: Copy>(choices: &[(&str, T)], name: &str) -> Option<T> {
    choices.iter().find(|(n, _)| *n == name).map(|(_, value)| *value)
}

/// What `name`, the value of `field`, stands for in a vocabulary table, or an error listing the
/// choices.
fn choice<T: Copy>(field: String, name: &str, choices: &[(&str, T)]) -> Result<T, ScenarioError> {
    lookup(choices, name).ok_or_else(|| ScenarioError::Field {
        field,
        message: format!("{name:?} is not one of {}", names(choices)),
    })
}

/// A `failCloud` step; `field` is its path.
fn fail_cloud(field: &str, spec: FailCloudSpec) -> Result<Action, ScenarioError> {
    let operations = match spec.operation.as_str() {
        "ec2" => Operation::EC2.to_vec(),
        name => vec![
            lookup(&Operation::NAMES, name).ok_or_else(|| ScenarioError::Field {
                field: format!("{field}.operation"),
                message: format!(
                    "{name:?} is not ec2 (every EC2 call) or one of {}",
                    names(&Operation::NAMES)
                ),
            })?,
        ],
    };
    let failure = match spec.failure.as_deref() {
        None => Failure::Throttle,
        Some(name) => choice(format!("{field}.failure"), name, &Failure::NAMES)?,
    };
    if failure != Failure::Throttle && operations.contains(&Operation::ReceiveMessages) {
        return Err(ScenarioError::Field {
            field: format!("{field}.failure"),
            message: "receiveMessages can only be throttled: the queue redelivers what a lost reply carried"
                .to_owned(),
        });
    }
    Ok(Action::FailCloud {
        operations,
        failure,
        duration: duration(&format!("{field}.for"), &spec.duration)?,
    })
}

/// A `failKube` step; `field` is its path.
fn fail_kube(field: &str, spec: FailKubeSpec) -> Result<Action, ScenarioError> {
    let failure = choice(format!("{field}.failure"), &spec.failure, &ApiFailure::NAMES)?;
    let failure = match (failure, spec.delay) {
        (ApiFailure::Slow(_), Some(delay)) => ApiFailure::Slow(duration(&format!("{field}.delay"), &delay)?),
        (ApiFailure::Slow(_), None) => {
            return Err(ScenarioError::Field {
                field: format!("{field}.delay"),
                message: "a slow API server needs the delay of every request (like 2s)".to_owned(),
            });
        }
        (_, Some(_)) => {
            return Err(ScenarioError::Field {
                field: format!("{field}.delay"),
                message: format!("only failure slow takes a delay, not {}", spec.failure),
            });
        }
        (failure, None) => failure,
    };
    Ok(Action::FailKube {
        failure,
        duration: duration(&format!("{field}.for"), &spec.duration)?,
    })
}

impl ObjectRef {
    fn new(kind: String, namespace: Option<String>, name: String) -> Self {
        Self {
            kind,
            namespace: namespace.unwrap_or_default(),
            name,
        }
    }
}

impl Scenario {
    /// Parses and checks a scenario file's text.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let file: File = yaml(text)?;
        if file.kind != "Scenario" {
            return Err(ScenarioError::Field {
                field: "kind".to_owned(),
                message: format!("must be Scenario, not {:?}", file.kind),
            });
        }
        let spec = file.spec;
        let settings = &spec.settings;
        let batch_idle = match &settings.batch_idle_duration {
            Some(text) => duration("spec.settings.batchIdleDuration", text)?,
            None => Duration::from_secs(1),
        };
        let batch_max = match &settings.batch_max_duration {
            Some(text) => duration("spec.settings.batchMaxDuration", text)?,
            None => Duration::from_secs(10),
        };
        let until = duration("spec.until", &spec.until)?;
        let steps = Self::steps(spec.steps, until, &spec.until)?;
        if spec
            .cloud
            .zones
            .iter()
            .any(|z| !z.starts_with(&spec.cloud.region))
        {
            return Err(ScenarioError::Field {
                field: "spec.cloud.zones".to_owned(),
                message: format!("every zone must be in region {}", spec.cloud.region),
            });
        }
        let scheduler_config = match spec.settings.scheduler_config {
            Some(config) => {
                config.validate().map_err(|error| ScenarioError::Field {
                    field: "spec.settings.schedulerConfig".to_owned(),
                    message: error.to_string(),
                })?;
                Some(Arc::new(config))
            }
            None => None,
        };
        Ok(Self {
            name: file.metadata.name,
            seed: spec.seed,
            region: spec.cloud.region,
            zones: spec.cloud.zones,
            boot: Duration::from_secs(spec.cloud.boot_seconds),
            batch_idle,
            batch_max,
            feature_gates: spec.settings.feature_gates,
            scheduler_config,
            manifests: spec.manifests,
            steps,
            until,
            snapshot: None,
        })
    }

    /// This scenario's world with other steps (a YAML list, as `spec.steps` holds them) and end.
    pub fn with_steps(&self, name: &str, steps: &str, until: &str) -> Result<Self, ScenarioError> {
        let specs: Vec<StepSpec> = yaml(steps)?;
        let end = duration("spec.until", until)?;
        Ok(Self {
            name: name.to_owned(),
            steps: Self::steps(specs, end, until)?,
            until: end,
            ..self.clone()
        })
    }

    /// Timed steps, checked and in time order; none may come after `until`.
    fn steps(specs: Vec<StepSpec>, until: Duration, until_text: &str) -> Result<Vec<Step>, ScenarioError> {
        let mut steps = Vec::with_capacity(specs.len());
        for (i, step) in specs.into_iter().enumerate() {
            let field = format!("spec.steps[{i}]");
            let at = duration(&format!("{field}.at"), &step.at)?;
            if at > until {
                return Err(ScenarioError::Field {
                    field: format!("{field}.at"),
                    message: format!("{} is after spec.until ({until_text})", step.at),
                });
            }
            steps.push(Step {
                at,
                action: Self::action(&field, step)?,
            });
        }
        steps.sort_by_key(|s| s.at);
        Ok(steps)
    }

    fn action(field: &str, step: StepSpec) -> Result<Action, ScenarioError> {
        let mut actions = Vec::new();
        if let Some(text) = step.apply {
            actions.push(Action::Apply(text));
        }
        if let Some(scale) = step.scale {
            actions.push(Action::Scale {
                object: ObjectRef::new(scale.kind, scale.namespace, scale.name),
                replicas: scale.replicas,
            });
        }
        if let Some(u) = step.unavailable {
            let capacity_type = u
                .capacity_type
                .map(|label| {
                    CapacityType::from_label(&label).ok_or_else(|| ScenarioError::Field {
                        field: format!("{field}.unavailable.capacityType"),
                        message: format!("{label:?} is not spot, on-demand or reserved"),
                    })
                })
                .transpose()?;
            actions.push(Action::Unavailable {
                duration: duration(&format!("{field}.unavailable.for"), &u.duration)?,
                pattern: OfferingPattern {
                    instance_type: u.instance_type,
                    zone: u.zone,
                    capacity_type,
                },
            });
        }
        if let Some(i) = step.interrupt {
            actions.push(Action::Interrupt {
                node_selector: i.node_selector,
                count: i.count,
            });
        }
        if let Some(d) = step.delete {
            actions.push(Action::Delete(ObjectRef::new(d.kind, d.namespace, d.name)));
        }
        if let Some(f) = step.fail_creates {
            let (resource, group) = f.resource.split_once('.').unwrap_or((&f.resource, ""));
            actions.push(Action::FailCreates {
                resource: GroupResource::new(group, resource),
                count: f.count,
            });
        }
        if let Some(f) = step.fail_cloud {
            actions.push(fail_cloud(&format!("{field}.failCloud"), f)?);
        }
        if let Some(f) = step.fail_kube {
            actions.push(fail_kube(&format!("{field}.failKube"), f)?);
        }
        if let Some(b) = step.boot_fault {
            let fault = choice(format!("{field}.bootFault.never"), &b.never, &BootFault::NAMES)?;
            actions.push(Action::BootFault {
                fault,
                duration: duration(&format!("{field}.bootFault.for"), &b.duration)?,
            });
        }
        if let Some(t) = step.taint_nodes {
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&t.effect.as_str()) {
                return Err(ScenarioError::Field {
                    field: format!("{field}.taintNodes.effect"),
                    message: format!("{:?} is not NoSchedule, PreferNoSchedule or NoExecute", t.effect),
                });
            }
            actions.push(Action::TaintNodes {
                duration: duration(&format!("{field}.taintNodes.for"), &t.duration)?,
                taint: Taint {
                    key: t.key,
                    value: t.value,
                    effect: t.effect,
                    time_added: None,
                },
            });
        }
        if let Some(r) = step.release_image {
            // The families an `amiSelectorTerms` alias accepts.
            choice(format!("{field}.releaseImage.family"), &r.family, ALIAS_FAMILIES)?;
            actions.push(Action::ReleaseImage { family: r.family });
        }
        if let Some(c) = step.node_condition {
            if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
                return Err(ScenarioError::Field {
                    field: format!("{field}.nodeCondition.status"),
                    message: format!("{:?} is not True, False or Unknown", c.status),
                });
            }
            actions.push(Action::NodeCondition {
                node_selector: c.node_selector,
                count: c.count,
                type_: c.type_,
                status: c.status,
            });
        }
        if let Some(i) = step.impair_instances {
            actions.push(Action::ImpairInstances {
                category: choice(format!("{field}.impairInstances.check"), &i.check, &STATUS_CHECKS)?,
                node_selector: i.node_selector,
                count: i.count,
            });
        }
        if let Some(r) = step.create_capacity_reservation {
            actions.push(reservation(&format!("{field}.createCapacityReservation"), r)?);
        }
        if let Some(c) = step.cancel_capacity_reservation {
            actions.push(Action::CancelReservation { id: c.id });
        }
        if let Some(g) = step.create_placement_group {
            actions.push(placement_group(&format!("{field}.createPlacementGroup"), g)?);
        }
        if let Some(g) = step.delete_placement_group {
            actions.push(Action::DeletePlacementGroup { name: g.name });
        }
        match (actions.pop(), actions.is_empty()) {
            (Some(action), true) => Ok(action),
            _ => Err(ScenarioError::Field {
                field: field.to_owned(),
                message: "a step does exactly one of apply, scale, unavailable, interrupt, delete, failCreates, failCloud, failKube, releaseImage, nodeCondition, bootFault, taintNodes, impairInstances, createCapacityReservation, cancelCapacityReservation, createPlacementGroup, deletePlacementGroup"
                    .to_owned(),
            }),
        }
    }
}

/// A `createPlacementGroup` step (at `field`) as the group it creates: a partition group needs
/// `partitions` (1 to 7, as EC2 allows), and only a partition group takes it.
fn placement_group(field: &str, g: PlacementGroupSpec) -> Result<Action, ScenarioError> {
    let strategy = match (
        choice(format!("{field}.strategy"), &g.strategy, &PLACEMENT_STRATEGIES)?,
        g.partitions,
    ) {
        (Strategy::Partition { .. }, Some(partitions @ 1..=7)) => Strategy::Partition { partitions },
        (Strategy::Partition { .. }, _) => {
            return Err(ScenarioError::Field {
                field: format!("{field}.partitions"),
                message: "a partition group needs partitions, from 1 to 7".to_owned(),
            });
        }
        (_, Some(_)) => {
            return Err(ScenarioError::Field {
                field: format!("{field}.partitions"),
                message: "only a partition group has partitions".to_owned(),
            });
        }
        (strategy, None) => strategy,
    };
    Ok(Action::CreatePlacementGroup {
        name: g.name,
        strategy,
    })
}

/// A `createCapacityReservation` step (at `field`) as the reservation it creates.
fn reservation(field: &str, r: ReservationSpec) -> Result<Action, ScenarioError> {
    let kind = match &r.kind {
        Some(kind) => choice(format!("{field}.type"), kind, &RESERVATION_TYPES)?,
        None => ReservationType::Default,
    };
    let match_criteria = match &r.instance_match_criteria {
        Some(criteria) => choice(
            format!("{field}.instanceMatchCriteria"),
            criteria,
            &MATCH_CRITERIA,
        )?,
        None => InstanceMatchCriteria::Targeted,
    };
    let ends_after = r
        .ends_after
        .as_deref()
        .map(|text| duration(&format!("{field}.endsAfter"), text))
        .transpose()?;
    Ok(Action::CreateReservation {
        reservation: SimReservation {
            id: r.id,
            instance_type: r.instance_type,
            zone: r.zone,
            count: r.count,
            kind,
            interruptible: r.interruptible,
            match_criteria,
            owner_id: r
                .owner_id
                .unwrap_or_else(|| joist_provider_sim::OWNER_ID.to_owned()),
            tags: r.tags,
            end: None,
        },
        ends_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str =
        "kind: Scenario\nmetadata: {name: t}\nspec:\n  cloud: {region: us-west-2}\n  until: 5m\n";

    #[test]
    fn defaults_follow_karpenter() {
        let scenario = Scenario::parse(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(scenario.batch_idle, Duration::from_secs(1));
        assert_eq!(scenario.batch_max, Duration::from_secs(10));
        assert_eq!(scenario.boot, Duration::from_secs(40));
        assert_eq!(scenario.until, Duration::from_secs(300));
    }

    #[test]
    fn errors_name_the_field() {
        let late = format!("{MINIMAL}  steps:\n    - at: 10m\n      delete: {{kind: Deployment, name: x}}\n");
        let error = Scenario::parse(&late)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("spec.steps[0].at"), "{error}");
        let two = format!(
            "{MINIMAL}  steps:\n    - at: 1m\n      apply: x\n      delete: {{kind: Pod, name: x}}\n"
        );
        let error = Scenario::parse(&two)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("exactly one"), "{error}");
        let bad = MINIMAL.replace("5m", "five minutes");
        let error = Scenario::parse(&bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("spec.until"), "{error}");
    }
}

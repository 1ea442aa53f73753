//! `karpenter.sh/v1` NodeClaim: one node Joist has decided to launch, and its lifecycle status.
//!
//! The spec is written once by the provisioner and never changes (`self == oldSelf` on the CRD);
//! the status records the instance (`providerID`, `imageID`), its capacity and the lifecycle
//! conditions (`Launched`, `Registered`, `Initialized`, `Drifted`, `Consolidatable`, …).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::Taint,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{
        IN_NEEDS_VALUES, MIN_VALUES_NEEDS_VALUES, NUMERIC_NEEDS_ONE_INTEGER, NodeClassReference,
        NodeSelectorRequirementWithMinValues, taints_schema, validate_claim_basics, validate_requirements,
    },
    duration::{Duration, NillableDuration},
    validation::{Validate, Violation, Violations},
};
use crate::model::quantity::Quantity;

/// NodeClaimSpec: the requirements and resources of one node to launch; immutable once created.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    status = "NodeClaimStatus",
    category = "karpenter",
    derive = "PartialEq",
    doc = "NodeClaim is the Schema for the NodeClaims API",
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".metadata.labels.node\\.kubernetes\\.io/instance-type"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/capacity-type"
    ),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".metadata.labels.topology\\.kubernetes\\.io/zone"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "ImageID",
        type_ = "string",
        json_path = ".status.imageID",
        priority = "1"
    ),
    printcolumn(
        name = "ID",
        type_ = "string",
        json_path = ".status.providerID",
        priority = "1"
    ),
    printcolumn(
        name = "NodePool",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/nodepool",
        priority = "1"
    ),
    printcolumn(
        name = "NodeClass",
        type_ = "string",
        json_path = ".spec.nodeClassRef.name",
        priority = "1"
    ),
    printcolumn(
        name = "Drifted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drifted\")].status",
        priority = "1"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// Taints applied to the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub taints: Vec<Taint>,
    /// Taints applied at boot and removed by a daemon.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints_schema")]
    pub startup_taints: Vec<Taint>,
    /// Label requirements, including the price-ordered instance types (at most 600).
    #[schemars(length(max = 100))]
    #[x_kube(
        validation = Rule::new(IN_NEEDS_VALUES.0).message(IN_NEEDS_VALUES.1),
        validation = Rule::new(NUMERIC_NEEDS_ONE_INTEGER.0).message(NUMERIC_NEEDS_ONE_INTEGER.1),
        validation = Rule::new(MIN_VALUES_NEEDS_VALUES.0).message(MIN_VALUES_NEEDS_VALUES.1)
    )]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The resources the node must provide: pod requests plus daemonset overhead.
    #[serde(default)]
    #[schemars(transform = super::common::without_default)]
    pub resources: ResourceRequirements,
    /// The provider-specific node class.
    pub node_class_ref: NodeClassReference,
    /// Maximum time to drain the node before its pods are forcibly deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<Duration>,
    /// Node lifetime (`Never` disables expiry); the CRD defaults it to 720h, as Karpenter's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "720h"))]
    pub expire_after: Option<NillableDuration>,
}

/// Requested resources.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequirements {
    /// Minimum amounts of each resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

/// The observed state of a NodeClaim.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// The Node that registered for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The cloud provider's instance id (`aws:///us-west-2a/i-0123…`).
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The image the instance booted.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The instance's capacity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// The instance's allocatable resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// When a pod was last bound to or removed from the node (consolidation waits from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<Time>,
    /// `Launched`, `Registered`, `Initialized`, `Ready`, `Drifted`, `Consolidatable`, ….
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::common::optional_reason_conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl Validate for NodeClaim {
    fn validate(&self) -> Vec<Violation> {
        let mut out = Violations::default();
        out.require_name(self.metadata.name.as_deref(), "NodeClaim");
        let spec = &self.spec;
        validate_requirements(&mut out, "spec.requirements", &spec.requirements, false);
        validate_claim_basics(
            &mut out,
            "spec",
            &spec.node_class_ref,
            &spec.taints,
            &spec.startup_taints,
        );
        for (name, amount) in &spec.resources.requests {
            if amount.millis() < 0 {
                out.push(
                    format!("spec.resources.requests[{name}]"),
                    format!("request must not be negative, got {amount}"),
                );
            }
        }
        out.into_vec()
    }
}

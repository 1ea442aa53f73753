//! `autoscaling.x-k8s.io/v1beta1` CapacityBuffer (Karpenter's `CapacityBuffer` feature gate): room
//! kept free for pods that are not there yet. A buffer names a pod shape, a `PodTemplate`
//! (`podTemplateRef`) or the template of a Deployment, ReplicaSet or StatefulSet (`scalableRef`),
//! and how many of them to keep room for: `replicas`, a `percentage` of the workload's replicas
//! (the larger of the two when both are set), capped by `limits` on their total requests.
//! Provisioning places that many virtual pods like pending ones, so nodes are launched for them,
//! and disruption keeps the nodes they sit on; how is `joist_actors::capacity_buffers`' job.
//!
//! Rules live as CEL on the CRD and in [`Validate::validate`], each naming the field.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::validation::{Validate, Violation, Violations};
use crate::model::{quantity::Quantity, resources::Resources};

/// The only provisioning strategy: the buffer's virtual pods are provisioned for.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";

/// The kinds a `scalableRef` may name (group `apps`, or none).
pub const SCALABLE_KINDS: [&str; 3] = ["Deployment", "ReplicaSet", "StatefulSet"];

/// CapacityBufferSpec: the pods to keep room for, and how many.
#[derive(CustomResource, KubeSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    namespaced,
    status = "CapacityBufferStatus",
    category = "autoscaling",
    shortname = "cb",
    derive = "PartialEq",
    doc = "CapacityBuffer keeps room in the cluster for pods of a shape before they exist",
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.provisioningStrategy"),
    printcolumn(
        name = "PodTemplate",
        type_ = "string",
        json_path = ".status.podTemplateRef.name"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("!has(self.podTemplateRef) || has(self.replicas) || has(self.limits)")
    .message("podTemplateRef needs replicas or limits"))]
#[x_kube(validation = Rule::new("!(has(self.podTemplateRef) && has(self.scalableRef))")
    .message("podTemplateRef and scalableRef are mutually exclusive"))]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferSpec {
    /// How the buffer is kept: `buffer.x-k8s.io/active-capacity`, the default and only strategy.
    #[serde(default = "active_capacity", skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    /// A `PodTemplate` in the buffer's namespace: the shape of its pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// A Deployment, ReplicaSet or StatefulSet in the buffer's namespace: its pod template is the
    /// shape, and its replicas the base of `percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_ref: Option<ScalableRef>,
    /// How many pods to keep room for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Room for this percentage of the `scalableRef`'s replicas (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub percentage: Option<i32>,
    /// The most the buffer's pods may request in total, per resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

#[allow(clippy::unnecessary_wraps)] // serde's `default` needs the field's own type.
fn active_capacity() -> Option<String> {
    Some(ACTIVE_CAPACITY.to_owned())
}

/// An object in the buffer's namespace, by name.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalObjectRef {
    /// Its name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// A workload in the buffer's namespace.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    /// Its API group (`apps`; empty for the core group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Its kind.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Its name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// The observed state of a CapacityBuffer, as Karpenter writes it.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    /// The PodTemplate the pods were made from (for a `podTemplateRef` buffer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// How many pods room is kept for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The PodTemplate's generation the pods were made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_generation: Option<i64>,
    /// `ReadyForProvisioning` and `Provisioning`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::common::required_reason_conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The strategy in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
}

impl CapacityBufferSpec {
    /// How many pods room is kept for, given the workload's `scalable_replicas` (for a
    /// `scalableRef`) and one pod's `requests`: the larger of `replicas` and `percentage` of the
    /// workload's replicas (rounded up, at least one when both are above zero), capped per resource
    /// by `limits` over the requests; with neither, as many as `limits` hold; 0 when nothing says.
    pub fn pods(&self, scalable_replicas: Option<i32>, requests: &Resources) -> i32 {
        let by_percentage = match (self.percentage, scalable_replicas) {
            (Some(percentage), Some(replicas)) if percentage > 0 && replicas > 0 => {
                let wanted = (i64::from(replicas) * i64::from(percentage) + 99) / 100;
                Some(i32::try_from(wanted).unwrap_or(i32::MAX).max(1))
            }
            (Some(_), Some(_)) => Some(0),
            _ => None,
        };
        let asked = match (self.replicas, by_percentage) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let cap = self.limits.as_ref().and_then(|limits| {
            limits
                .iter()
                .filter_map(|(name, limit)| {
                    let request = requests.get(name).millis();
                    (request > 0).then(|| limit.millis().max(0) / request)
                })
                .min()
                .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
        });
        match (asked, cap) {
            (Some(asked), Some(cap)) => asked.min(cap),
            (Some(asked), None) => asked,
            (None, Some(cap)) => cap,
            (None, None) => 0,
        }
        .max(0)
    }
}

impl Validate for CapacityBuffer {
    fn validate(&self) -> Vec<Violation> {
        let mut out = Violations::default();
        out.require_name(self.metadata.name.as_deref(), "CapacityBuffer");
        let spec = &self.spec;
        match (&spec.pod_template_ref, &spec.scalable_ref) {
            (Some(_), Some(_)) => out.push(
                "spec.scalableRef",
                "podTemplateRef and scalableRef are mutually exclusive",
            ),
            (Some(_), None) if spec.replicas.is_none() && spec.limits.is_none() => {
                out.push("spec.podTemplateRef", "podTemplateRef needs replicas or limits");
            }
            (None, Some(scalable)) => {
                let group = scalable.api_group.as_deref().unwrap_or_default();
                if !matches!(group, "" | "apps") || !SCALABLE_KINDS.contains(&scalable.kind.as_str()) {
                    out.push(
                        "spec.scalableRef",
                        format!(
                            "{group}/{} is not a Deployment, ReplicaSet or StatefulSet of group apps",
                            scalable.kind
                        ),
                    );
                }
            }
            (None, None) => out.push("spec", "a buffer needs podTemplateRef or scalableRef"),
            (Some(_), None) => {}
        }
        if let Some(strategy) = spec
            .provisioning_strategy
            .as_deref()
            .filter(|s| *s != ACTIVE_CAPACITY)
        {
            out.push(
                "spec.provisioningStrategy",
                format!("{strategy:?} is not {ACTIVE_CAPACITY:?}, the only strategy"),
            );
        }
        for (name, limit) in spec.limits.iter().flatten() {
            if limit.millis() < 0 {
                out.push(format!("spec.limits[{name}]"), "a limit cannot be negative");
            }
        }
        out.into_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(replicas: Option<i32>, percentage: Option<i32>, limits: &[(&str, &str)]) -> CapacityBufferSpec {
        let limits: BTreeMap<String, Quantity> = limits
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.parse().unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        CapacityBufferSpec {
            replicas,
            percentage,
            limits: (!limits.is_empty()).then_some(limits),
            ..CapacityBufferSpec::default()
        }
    }

    fn one_cpu() -> Resources {
        Resources::default().with("cpu", Quantity::from_units(1))
    }

    #[test]
    fn the_larger_of_replicas_and_percentage_counts_capped_by_limits() {
        assert_eq!(spec(Some(2), None, &[]).pods(None, &one_cpu()), 2);
        assert_eq!(
            spec(None, Some(10), &[]).pods(Some(15), &one_cpu()),
            2,
            "1.5 rounds up"
        );
        assert_eq!(
            spec(None, Some(1), &[]).pods(Some(3), &one_cpu()),
            1,
            "at least one"
        );
        assert_eq!(spec(Some(1), Some(50), &[]).pods(Some(10), &one_cpu()), 5);
        assert_eq!(spec(Some(8), None, &[("cpu", "3500m")]).pods(None, &one_cpu()), 3);
        assert_eq!(
            spec(None, None, &[("cpu", "4")]).pods(None, &one_cpu()),
            4,
            "limits alone"
        );
        assert_eq!(
            spec(Some(5), None, &[("memory", "1Gi")]).pods(None, &one_cpu()),
            5,
            "a limit on a resource the pods do not request caps nothing"
        );
        assert_eq!(spec(None, None, &[]).pods(None, &one_cpu()), 0);
    }

    #[test]
    fn a_buffer_names_one_source_and_a_scalable_workload_of_apps() {
        let mut buffer = CapacityBuffer::new("b", spec(Some(1), None, &[]));
        buffer.metadata.namespace = Some("default".into());
        let fields = |b: &CapacityBuffer| b.validate().into_iter().map(|v| v.field).collect::<Vec<_>>();
        assert_eq!(fields(&buffer), ["spec"]);
        buffer.spec.pod_template_ref = Some(LocalObjectRef { name: "t".into() });
        assert!(fields(&buffer).is_empty());
        buffer.spec.scalable_ref = Some(ScalableRef {
            api_group: Some("apps".into()),
            kind: "Deployment".into(),
            name: "web".into(),
        });
        assert_eq!(fields(&buffer), ["spec.scalableRef"]);
        buffer.spec.pod_template_ref = None;
        assert!(fields(&buffer).is_empty());
        buffer.spec.scalable_ref = Some(ScalableRef {
            api_group: Some("batch".into()),
            kind: "Job".into(),
            name: "j".into(),
        });
        assert_eq!(fields(&buffer), ["spec.scalableRef"]);
    }
}

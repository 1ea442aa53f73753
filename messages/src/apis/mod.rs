//! The Karpenter v1 API: NodePool and NodeClaim (`karpenter.sh/v1`) and EC2NodeClass
//! (`karpenter.k8s.aws/v1`), NodeOverlay, and the CapacityBuffer Karpenter serves beside them
//! (`autoscaling.x-k8s.io/v1beta1`), with their CRDs, defaults and validation.
//!
//! The CRDs Joist installs are generated from these types ([`crds`]); the YAML committed under
//! `deploy/crds/` is checked against them in CI.

pub mod beyond_the_crds;
// kube's `printcolumn(...)` entries repeat keys such as `type_` by design.
#[allow(clippy::duplicated_attributes)]
pub mod capacitybuffer;
pub mod common;
pub mod cron;
pub mod duration;
pub mod hash;
// kube's `printcolumn(...)` entries repeat keys such as `type_` by design.
#[allow(clippy::duplicated_attributes)]
pub mod ec2nodeclass;
pub mod manifest;
// kube's `printcolumn(...)` entries repeat keys such as `type_` by design.
#[allow(clippy::duplicated_attributes)]
pub mod nodeclaim;
// kube's `printcolumn(...)` entries repeat keys such as `type_` by design.
#[allow(clippy::duplicated_attributes)]
pub mod nodepool;
// kube's `printcolumn(...)` entries repeat keys such as `type_` by design.
#[allow(clippy::duplicated_attributes)]
pub mod nodeoverlay;
pub mod schema_check;
pub mod validation;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use capacitybuffer::{CapacityBuffer, CapacityBufferSpec, CapacityBufferStatus};
pub use ec2nodeclass::{EC2NodeClass, EC2NodeClassSpec, EC2NodeClassStatus};
pub use nodeclaim::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
pub use nodeoverlay::{NodeOverlay, NodeOverlaySpec, NodeOverlayStatus};
pub use nodepool::{NodePool, NodePoolSpec, NodePoolStatus};
pub use validation::{Validate, Violation};

/// The OpenAPI v3 schema of `crd`'s first (served) version, `null` when it has none.
pub fn openapi_schema(crd: &CustomResourceDefinition) -> serde_json::Value {
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema).unwrap_or_default()
}

/// The CRDs Joist serves, each with the file name Karpenter uses for it.
pub fn crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("karpenter.sh_nodepools.yaml", with_object_fields(NodePool::crd())),
        (
            "karpenter.sh_nodeclaims.yaml",
            with_object_fields(NodeClaim::crd()),
        ),
        (
            "karpenter.k8s.aws_ec2nodeclasses.yaml",
            with_object_fields(EC2NodeClass::crd()),
        ),
        (
            "karpenter.sh_nodeoverlays.yaml",
            with_object_fields(NodeOverlay::crd()),
        ),
        (
            "autoscaling.x-k8s.io_capacitybuffers.yaml",
            with_object_fields(CapacityBuffer::crd()),
        ),
    ]
}

/// `crd` with `apiVersion`, `kind` and `metadata` declared at the root of each version's schema,
/// as Karpenter's CRDs (and controller-gen's) declare them. `metadata` is a bare `type: object`:
/// the API server refuses a CRD whose metadata schema says anything more (a description included).
fn with_object_fields(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    let typed = |type_: &str, description: Option<&str>| JSONSchemaProps {
        type_: Some(type_.to_owned()),
        description: description.map(str::to_owned),
        ..JSONSchemaProps::default()
    };
    let schemas = crd.spec.versions.iter_mut().filter_map(|v| v.schema.as_mut());
    for root in schemas.filter_map(|s| s.open_api_v3_schema.as_mut()) {
        let properties = root.properties.get_or_insert_with(Default::default);
        properties.entry("apiVersion".to_owned()).or_insert_with(|| {
            typed(
                "string",
                Some("The versioned schema of this representation of an object."),
            )
        });
        properties
            .entry("kind".to_owned())
            .or_insert_with(|| typed("string", Some("The REST resource this object represents.")));
        properties
            .entry("metadata".to_owned())
            .or_insert_with(|| typed("object", None));
    }
    crd
}

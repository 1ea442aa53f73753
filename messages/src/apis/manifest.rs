//! Reading manifests: multi-document YAML → typed Karpenter objects, or the reasons they are not.
//!
//! Each document is checked the way an API server with Joist's CRDs would check it: first against
//! the generated CRD's OpenAPI schema (types, required fields, enums, patterns, bounds, and fields
//! the v1 API does not have, as `kubectl apply` reports by default), all violations at once; then,
//! once it decodes, every semantic rule through [`Validate`]. Pre-v1 kinds (v1alpha5 Provisioner, v1alpha1 AWSNodeTemplate,
//! v1beta1 …) get a message naming their v1 replacement. `autoscaling.x-k8s.io/v1beta1`
//! CapacityBuffers are checked like Karpenter's own kinds, as Karpenter serves them. Kinds from
//! other API groups are passed over: a manifest file may hold Deployments next to NodePools.
//!
//! A `kind: List` document (what `kubectl get -o yaml` prints) is checked item by item.
//!
//! Failure modes: a file that is not YAML at all is a [`ManifestError`]; everything else is a
//! per-document [`Outcome`], so one bad document never hides the others.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{
    CapacityBuffer, EC2NodeClass, NodeClaim, NodeOverlay, NodePool,
    schema_check::SchemaChecker,
    validation::{Validate, Violation, Violations},
};
use crate::labels::{AWS_GROUP, KARPENTER_GROUP};

/// Every YAML document of `text` (empty ones as null); the error is one line, with no snippet.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, ManifestError> {
    serde_saphyr::from_multiple_with_options(text, serde_saphyr::options! { with_snippet: false })
        .map_err(|e| ManifestError(e.to_string()))
}

/// The text is not YAML.
#[derive(Debug, thiserror::Error)]
#[error("not valid YAML: {0}")]
pub struct ManifestError(String);

/// A typed Karpenter object.
#[derive(Debug, Clone, PartialEq)]
pub enum KarpenterObject {
    /// `karpenter.sh/v1` NodePool.
    NodePool(Box<NodePool>),
    /// `karpenter.sh/v1` NodeClaim.
    NodeClaim(Box<NodeClaim>),
    /// `karpenter.k8s.aws/v1` EC2NodeClass.
    EC2NodeClass(Box<EC2NodeClass>),
    /// `karpenter.sh/v1alpha1` NodeOverlay.
    NodeOverlay(Box<NodeOverlay>),
    /// `autoscaling.x-k8s.io/v1beta1` CapacityBuffer, which Karpenter serves beside its own kinds.
    CapacityBuffer(Box<CapacityBuffer>),
}

impl KarpenterObject {
    /// The object as JSON, defaults filled in.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            KarpenterObject::NodePool(o) => serde_json::to_value(o),
            KarpenterObject::NodeClaim(o) => serde_json::to_value(o),
            KarpenterObject::EC2NodeClass(o) => serde_json::to_value(o),
            KarpenterObject::NodeOverlay(o) => serde_json::to_value(o),
            KarpenterObject::CapacityBuffer(o) => serde_json::to_value(o),
        }
    }
}

/// What became of one document.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A valid Karpenter v1 object.
    Valid(KarpenterObject),
    /// A Karpenter object that breaks these rules.
    Invalid(Vec<Violation>),
    /// A pre-v1 Karpenter kind; the message names the v1 replacement.
    Legacy(String),
    /// A kind outside the Karpenter API groups, not checked.
    NotKarpenter,
}

/// One document of a manifest file.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// `apiVersion` as written (empty when missing).
    pub api_version: String,
    /// `kind` as written (empty when missing).
    pub kind: String,
    /// `metadata.name` (empty when missing).
    pub name: String,
    /// The verdict.
    pub outcome: Outcome,
}

impl Document {
    /// `Kind/name`, as kubectl names objects.
    pub fn object_ref(&self) -> String {
        let kind = if self.kind.is_empty() {
            "<no kind>"
        } else {
            &self.kind
        };
        let name = if self.name.is_empty() {
            "<no name>"
        } else {
            &self.name
        };
        format!("{kind}/{name}")
    }
}

/// Parses every document in `text` and checks each one (see the module docs). To check many
/// files, build one [`Checker`] and call [`Checker::read`] instead.
pub fn read_manifests(text: &str) -> Result<Vec<Document>, ManifestError> {
    Checker::new().read(text)
}

/// A `kind: List` (or `NodePoolList`, …) as `kubectl get -o yaml` prints it becomes its items.
fn list_items(value: Value) -> Vec<Value> {
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match value {
        Value::Object(mut map) if is_list && map.get("items").is_some_and(Value::is_array) => {
            match map.remove("items") {
                Some(Value::Array(items)) => items,
                _ => vec![],
            }
        }
        other => vec![other],
    }
}

/// Checks documents against Joist's CRD schemas and rules; build once, use for many documents.
pub struct Checker {
    node_pool: SchemaChecker,
    node_claim: SchemaChecker,
    ec2_node_class: SchemaChecker,
    node_overlay: SchemaChecker,
    capacity_buffer: SchemaChecker,
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

impl Checker {
    /// A checker for the CRDs generated from this crate's types.
    pub fn new() -> Self {
        fn schema_of<K: kube::CustomResourceExt>() -> SchemaChecker {
            SchemaChecker::new(super::openapi_schema(&K::crd()))
        }
        Checker {
            node_pool: schema_of::<NodePool>(),
            node_claim: schema_of::<NodeClaim>(),
            ec2_node_class: schema_of::<EC2NodeClass>(),
            node_overlay: schema_of::<NodeOverlay>(),
            capacity_buffer: schema_of::<CapacityBuffer>(),
        }
    }

    fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
        value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
    }

    /// Parses every document in `text` and checks each one.
    pub fn read(&mut self, text: &str) -> Result<Vec<Document>, ManifestError> {
        Ok(parse_documents(text)?
            .into_iter()
            .flat_map(list_items)
            .filter(|v| !v.is_null())
            .map(|value| self.check_document(&value))
            .collect())
    }

    /// Checks one parsed document.
    pub fn check_document(&mut self, value: &Value) -> Document {
        let api_version = Self::str_at(value, "/apiVersion").to_string();
        let kind = Self::str_at(value, "/kind").to_string();
        let name = Self::str_at(value, "/metadata/name").to_string();
        let outcome = match (api_version.as_str(), kind.as_str()) {
            ("karpenter.sh/v1", "NodePool") => decode::<NodePool>(&mut self.node_pool, value, |o| {
                KarpenterObject::NodePool(Box::new(o))
            }),
            ("karpenter.sh/v1", "NodeClaim") => decode::<NodeClaim>(&mut self.node_claim, value, |o| {
                KarpenterObject::NodeClaim(Box::new(o))
            }),
            ("karpenter.sh/v1alpha1", "NodeOverlay") => {
                decode::<NodeOverlay>(&mut self.node_overlay, value, |o| {
                    KarpenterObject::NodeOverlay(Box::new(o))
                })
            }
            ("autoscaling.x-k8s.io/v1beta1", "CapacityBuffer") => {
                decode::<CapacityBuffer>(&mut self.capacity_buffer, value, |o| {
                    KarpenterObject::CapacityBuffer(Box::new(o))
                })
            }
            ("karpenter.k8s.aws/v1", "EC2NodeClass") => {
                decode::<EC2NodeClass>(&mut self.ec2_node_class, value, |o| {
                    KarpenterObject::EC2NodeClass(Box::new(o))
                })
            }
            _ if api_version.is_empty() || kind.is_empty() => Outcome::Invalid(vec![Violation {
                field: if api_version.is_empty() {
                    "apiVersion"
                } else {
                    "kind"
                }
                .to_string(),
                message: "every document needs apiVersion and kind".to_string(),
            }]),
            (api_version, kind) => match legacy_replacement(api_version, kind) {
                Some(message) => Outcome::Legacy(message),
                None if is_karpenter_group(api_version) => Outcome::Invalid(vec![Violation {
                    field: "kind".to_string(),
                    message: format!(
                        "{api_version} {kind} is not served; Joist serves karpenter.sh/v1 NodePool and NodeClaim, karpenter.sh/v1alpha1 NodeOverlay, and karpenter.k8s.aws/v1 EC2NodeClass"
                    ),
                }]),
                None => Outcome::NotKarpenter,
            },
        };
        Document {
            api_version,
            kind,
            name,
            outcome,
        }
    }
}

fn is_karpenter_group(api_version: &str) -> bool {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    group == KARPENTER_GROUP || group == AWS_GROUP
}

/// The migration message for a pre-v1 kind.
fn legacy_replacement(api_version: &str, kind: &str) -> Option<String> {
    let replacement = match (api_version, kind) {
        ("karpenter.sh/v1alpha5", "Provisioner") => {
            "karpenter.sh/v1 NodePool (AWS settings such as providerRef move to a karpenter.k8s.aws/v1 EC2NodeClass referenced by spec.template.spec.nodeClassRef)"
        }
        ("karpenter.sh/v1alpha5", "Machine") => "karpenter.sh/v1 NodeClaim",
        ("karpenter.k8s.aws/v1alpha1", "AWSNodeTemplate") => "karpenter.k8s.aws/v1 EC2NodeClass",
        ("karpenter.sh/v1beta1", "NodePool") => "karpenter.sh/v1 NodePool",
        ("karpenter.sh/v1beta1", "NodeClaim") => "karpenter.sh/v1 NodeClaim",
        ("karpenter.k8s.aws/v1beta1", "EC2NodeClass") => "karpenter.k8s.aws/v1 EC2NodeClass",
        _ => return None,
    };
    Some(format!(
        "{api_version} {kind} is a pre-v1 Karpenter API and is not served; migrate it to {replacement} (Karpenter's v1 migration guide lists the field changes)"
    ))
}

/// Fields that v1beta1 had and v1 moved, with where they went.
const MOVED_IN_V1: &[(&str, &str)] = &[
    (
        "spec.disruption.expireAfter",
        "in v1 it moved to spec.template.spec.expireAfter",
    ),
    (
        "spec.template.spec.kubelet",
        "in v1 it moved to the EC2NodeClass (spec.kubelet)",
    ),
    (
        "spec.template.spec.resources",
        "NodePools take no resource requests; use spec.limits",
    ),
];

fn decode<T>(schema: &mut SchemaChecker, value: &Value, wrap: impl FnOnce(T) -> KarpenterObject) -> Outcome
where
    T: DeserializeOwned + Validate,
{
    let mut structural = Violations::default();
    schema.check(value, &mut structural);
    let mut violations = structural.into_vec();
    violations.extend(T::validate_written(value));
    for v in &mut violations {
        if let Some(hint) = MOVED_IN_V1
            .iter()
            .find(|(field, _)| *field == v.field)
            .map(|(_, hint)| hint)
        {
            v.message = format!("{}; {hint}", v.message);
        }
    }
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(typed) => {
            // The semantic rules often restate a schema rule in other words: one line per field.
            let semantic = typed.validate();
            let already = |v: &Violation| violations.iter().any(|s| s.field == v.field);
            let new: Vec<Violation> = semantic.into_iter().filter(|v| !already(v)).collect();
            violations.extend(new);
            if violations.is_empty() {
                Outcome::Valid(wrap(typed))
            } else {
                Outcome::Invalid(violations)
            }
        }
        Err(_) if !violations.is_empty() => Outcome::Invalid(violations),
        Err(e) => Outcome::Invalid(vec![decode_violation(&e)]),
    }
}

/// Turns a decoding error into a violation on the right field.
fn decode_violation(e: &serde_path_to_error::Error<serde_json::Error>) -> Violation {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = e.inner().to_string();
    // serde reports a missing field at its parent; name the field itself.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next())
    {
        let field = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        return Violation {
            field,
            message: "required field is missing".to_string(),
        };
    }
    Violation { field: path, message }
}

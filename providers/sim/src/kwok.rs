//! The simulated cloud on a real cluster with KWOK: nodes that KWOK, not kubesim, plays the
//! kubelet of, and instance types read from a file in the format of Karpenter's own KWOK provider
//! (`kwok/cloudprovider/instance_types.json` in the Karpenter module), so both controllers can be
//! given one catalog.
//!
//! A Node the cloud registers in KWOK mode carries KWOK's annotation (`kwok.x-k8s.io/node: fake`),
//! which is what KWOK selects the nodes it manages by, and no status conditions: KWOK writes them,
//! as a kubelet would. It also carries its instance ([`INSTANCE_ANNOTATION`]), so the cloud can be
//! read back from the cluster ([`listed`]): a replica that takes over from another, or a
//! controller restarted, finds the instances launched before as EC2 would report them. An instance
//! still booting when its launcher died is lost with it, as if it never launched. Names are drawn
//! from a fresh instance id, so replicas never pick the same one.
//!
//! Instances are named as Karpenter's KWOK provider names them, `kwok://NODE` ([`PROVIDER_PREFIX`]),
//! and the Nodes that provider launched are read back too, from their labels
//! ([`launched_elsewhere`]): Karpenter adopts the NodeClaims Joist launched on KWOK, and Joist
//! those Karpenter launched, as on EC2, where both read one instance's tags. A node annotated
//! [`INTERRUPT_ANNOTATION`] gets EC2's two-minute spot interruption warning on the cloud's queue
//! ([`crate::KwokQueue`]) and is reclaimed when it runs out.
//!
//! The file is a JSON list of types, each with a `name`, an `architecture`, `operatingSystems`,
//! `resources` (capacity; `pods` defaults to 110) and `offerings`, each offering a `Price`,
//! `Available` and `Requirements` on `topology.kubernetes.io/zone` and
//! `karpenter.sh/capacity-type`. As Karpenter's KWOK provider does, every offering counts as
//! available, each type reserves 100m CPU and 10Mi of memory for the kubelet, and the type's
//! labels `karpenter.kwok.sh/instance-{size,family,cpu,memory}` are derived from its name and
//! resources. A file that does not parse, or an offering that names another label or no single
//! zone and capacity type, is refused with a [`KwokTypesError`] naming the type and the field.

use std::collections::BTreeMap;

use joist_messages::{
    labels::{ARCH, CAPACITY_TYPE, INSTANCE_TYPE, NODEPOOL, OS, ZONE},
    model::{
        instance_type::{CapacityType, InstanceType, Offering, Overhead, offered_zones_and_capacity_types},
        quantity::Quantity,
        requirements::{Operator, Requirement, Requirements},
        resources::{Resources, names},
    },
};
use joist_provider::{CloudError, Instance};
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::api::{Api, ListParams, ObjectList};
use serde::Deserialize;
use thiserror::Error;

/// The annotation (and label) KWOK manages fake nodes by, with its value.
pub const KWOK_NODE: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// How the provider ID of a KWOK instance begins, Karpenter's KWOK provider's: the rest is the
/// Node's name.
pub const PROVIDER_PREFIX: &str = "kwok://";

/// The label Karpenter's KWOK provider writes an instance's hourly price in (for eks-node-viewer).
pub const PRICE_LABEL: &str = "eks-node-viewer/instance-price";

/// The annotation a KWOK node carries its instance in, as JSON.
pub const INSTANCE_ANNOTATION: &str = "kwok.joist.dev/instance";

/// The annotation that asks the KWOK cloud for a spot interruption of a node's instance
/// (`kubectl annotate node NAME kwok.joist.dev/interrupt=spot`).
pub const INTERRUPT_ANNOTATION: &str = "kwok.joist.dev/interrupt";

/// The label group of the types' derived labels, Karpenter's KWOK provider's.
const LABEL_GROUP: &str = "karpenter.kwok.sh";

/// An instance-types file that cannot be used.
#[derive(Debug, Error)]
pub enum KwokTypesError {
    /// Not JSON of the expected shape.
    #[error("{path}: not a list of KWOK instance types: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A field of one type is unusable.
    #[error("{path}: instance type {name:?}: {field}: {reason}")]
    Field {
        /// The file.
        path: String,
        /// The type.
        name: String,
        /// The field, as `offerings[2].Requirements[0].key`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The file lists no type.
    #[error("{path}: lists no instance type")]
    Empty {
        /// The file.
        path: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeEntry {
    name: String,
    offerings: Vec<OfferingEntry>,
    architecture: String,
    operating_systems: Vec<String>,
    resources: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OfferingEntry {
    price: f64,
    requirements: Vec<RequirementEntry>,
}

#[derive(Deserialize)]
struct RequirementEntry {
    key: String,
    operator: String,
    values: Vec<String>,
}

/// The instance types a KWOK instance-types file lists (`path` names it in errors).
pub fn instance_types(path: &str, text: &str) -> Result<Vec<InstanceType>, KwokTypesError> {
    let entries: Vec<TypeEntry> = serde_json::from_str(text).map_err(|source| KwokTypesError::Parse {
        path: path.to_owned(),
        source,
    })?;
    if entries.is_empty() {
        return Err(KwokTypesError::Empty {
            path: path.to_owned(),
        });
    }
    entries
        .into_iter()
        .map(|entry| entry.instance_type(path))
        .collect()
}

impl TypeEntry {
    fn instance_type(self, path: &str) -> Result<InstanceType, KwokTypesError> {
        let field_error = |field: String, reason: String| KwokTypesError::Field {
            path: path.to_owned(),
            name: self.name.clone(),
            field,
            reason,
        };
        let mut capacity = Resources::default();
        capacity.set(names::PODS, Quantity::from_units(110));
        for (resource, amount) in &self.resources {
            let amount = amount
                .parse::<Quantity>()
                .map_err(|e| field_error(format!("resources.{resource}"), e.to_string()))?;
            capacity.set(resource, amount);
        }
        let offerings = self
            .offerings
            .iter()
            .enumerate()
            .map(|(i, offering)| {
                offering
                    .offering()
                    .map_err(|(field, reason)| field_error(format!("offerings[{i}].{field}"), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut requirements = Requirements::default();
        let (zones, capacity_types) = offered_zones_and_capacity_types(&offerings);
        // Written as Kubernetes writes a quantity, as Karpenter's labels are.
        let cpu = capacity.get(names::CPU).to_string();
        let memory = capacity.get(names::MEMORY).to_string();
        let labels: [(&str, Vec<&str>); 9] = [
            (INSTANCE_TYPE, vec![&self.name]),
            (ARCH, vec![&self.architecture]),
            (OS, self.operating_systems.iter().map(String::as_str).collect()),
            (ZONE, zones),
            (CAPACITY_TYPE, capacity_types),
            (
                &format!("{LABEL_GROUP}/instance-size"),
                vec![size(&self.name, &cpu)],
            ),
            (
                &format!("{LABEL_GROUP}/instance-family"),
                vec![family(&self.name)],
            ),
            (&format!("{LABEL_GROUP}/instance-cpu"), vec![&cpu]),
            (&format!("{LABEL_GROUP}/instance-memory"), vec![&memory]),
        ];
        for (key, values) in labels {
            let requirement = Requirement::new(key, Operator::In, values)
                .map_err(|e| field_error(key.to_owned(), e.to_string()))?;
            requirements.add(requirement);
        }
        Ok(InstanceType {
            name: self.name,
            requirements,
            offerings,
            capacity,
            overhead: Overhead {
                kube_reserved: Resources::default()
                    .with(names::CPU, Quantity::from_millis(100))
                    .with(names::MEMORY, Quantity::from_units(10 * 1024 * 1024)),
                ..Overhead::default()
            },
        })
    }
}

impl OfferingEntry {
    /// The offering, or the field (below the offering) and what is wrong with it.
    fn offering(&self) -> Result<Offering, (String, String)> {
        let mut zone = None;
        let mut capacity_type = None;
        for (i, requirement) in self.requirements.iter().enumerate() {
            let field = |name: &str| format!("Requirements[{i}].{name}");
            let [value] = requirement.values.as_slice() else {
                return Err((field("values"), "an offering needs exactly one value".to_owned()));
            };
            if requirement.operator != "In" {
                return Err((
                    field("operator"),
                    format!("must be In, got {:?}", requirement.operator),
                ));
            }
            match requirement.key.as_str() {
                ZONE => zone = Some(value.clone()),
                CAPACITY_TYPE => {
                    capacity_type = Some(
                        CapacityType::from_label(value)
                            .ok_or_else(|| (field("values"), format!("unknown capacity type {value:?}")))?,
                    );
                }
                other => {
                    return Err((
                        field("key"),
                        format!("Joist's offerings are by {ZONE} and {CAPACITY_TYPE} only, got {other:?}"),
                    ));
                }
            }
        }
        let missing = |key: &str| ("Requirements".to_owned(), format!("no {key} requirement"));
        Ok(Offering {
            zone: zone.ok_or_else(|| missing(ZONE))?,
            capacity_type: capacity_type.ok_or_else(|| missing(CAPACITY_TYPE))?,
            price: self.price,
            available: true,
            reservation: None,
        })
    }
}

/// The size part of an EC2-style name (`m5.large` → `large`), else the CPU count, as Karpenter's
/// KWOK provider derives it.
fn size<'a>(name: &'a str, cpu: &'a str) -> &'a str {
    const SIZES: [&str; 6] = ["nano", "micro", "small", "medium", "large", "metal"];
    match name.split_once('.') {
        Some((family, size))
            if !family.is_empty()
                && (SIZES.contains(&size)
                    || size
                        .strip_suffix("xlarge")
                        .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))) =>
        {
            size
        }
        _ => cpu,
    }
}

/// The family: the name up to its first `.` or `-`, else its first character.
fn family(name: &str) -> &str {
    match name.find(['.', '-']) {
        Some(at) => &name[..at],
        None => name.get(..1).unwrap_or_default(),
    }
}

/// `node` as a node KWOK plays the kubelet of: KWOK's annotation and label, the `instance` it runs
/// on, and no status conditions, which KWOK writes.
pub fn for_kwok(mut node: Node, instance: &Instance) -> Node {
    let (key, value) = KWOK_NODE;
    let metadata = &mut node.metadata;
    let annotations = metadata.annotations.get_or_insert_default();
    annotations.insert(key.to_owned(), value.to_owned());
    let running = Instance {
        state: joist_provider::InstanceState::Running,
        ..instance.clone()
    };
    annotations.insert(
        INSTANCE_ANNOTATION.to_owned(),
        serde_json::to_string(&running).unwrap_or_default(),
    );
    metadata
        .labels
        .get_or_insert_default()
        .insert(key.to_owned(), value.to_owned());
    if let Some(status) = &mut node.status {
        status.conditions = None;
    }
    node
}

/// An instance read back from its Node.
pub struct Listed {
    /// The instance.
    pub instance: Instance,
    /// Its Node's name.
    pub node_name: String,
    /// Its Node's labels.
    pub labels: BTreeMap<String, String>,
    /// Whether its Node asks for a spot interruption ([`INTERRUPT_ANNOTATION`]).
    pub interrupt: bool,
}

/// A KWOK Node as the cloud reads it back: its name, creation time, labels, annotations and
/// provider ID. The rest of a Node (its status, its managed fields) is passed over while the list
/// is read: the whole Nodes of a listing were a fifth of the controller's heap at the peak of a
/// 1,000-pod run on KWOK (docs/performance.md).
#[derive(Debug, Clone, Deserialize)]
pub struct KwokNode {
    metadata: KwokNodeMeta,
    #[serde(default)]
    spec: KwokNodeSpec,
}

/// The part of a KWOK Node's metadata the cloud reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KwokNodeMeta {
    #[serde(default)]
    name: String,
    creation_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

/// The part of a KWOK Node's spec the cloud reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KwokNodeSpec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
}

/// The instances whose KWOK nodes are in the cluster: Joist's, from their instance annotation,
/// and those of Karpenter's KWOK provider, from their Node ([`launched_elsewhere`]); Nodes that are
/// neither are passed over.
pub async fn listed(client: &kube::Client) -> Result<Vec<Listed>, CloudError> {
    let (key, value) = KWOK_NODE;
    let failed = |e: &dyn std::fmt::Display| CloudError::Transient {
        message: format!("listing the KWOK nodes: {e}"),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let request = kube::core::Request::new(nodes.resource_url())
        .list(&ListParams::default().labels(&format!("{key}={value}")))
        .map_err(|e| failed(&e))?;
    let list: ObjectList<KwokNode> = client.request(request).await.map_err(|e| failed(&e))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|node| {
            let annotations = node.metadata.annotations.as_ref()?;
            let interrupt = annotations.contains_key(INTERRUPT_ANNOTATION);
            let instance = match annotations.get(INSTANCE_ANNOTATION) {
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| {
                        tracing::warn!(node = node.metadata.name, error = %e, "a KWOK node's instance annotation is unreadable");
                    })
                    .ok()?,
                None => launched_elsewhere(&node)?,
            };
            Some(Listed {
                instance,
                node_name: node.metadata.name,
                labels: node.metadata.labels.unwrap_or_default(),
                interrupt,
            })
        })
        .collect())
}

/// The instance behind a Node that Karpenter's KWOK provider launched: its provider ID
/// (`kwok://NODE`) and the labels of its offering, the price Karpenter writes for eks-node-viewer
/// ([`PRICE_LABEL`]; 0 when it is missing, for the cloud to look up), and no image (none is
/// recorded; Karpenter's KWOK provider reports no image drift). `None` for a Node with another
/// provider ID, and, with a warning, for one without those labels.
pub fn launched_elsewhere(node: &KwokNode) -> Option<Instance> {
    let name = node.metadata.name.as_str();
    let provider_id = node.spec.provider_id.as_deref()?;
    if !provider_id.starts_with(PROVIDER_PREFIX) {
        return None;
    }
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let offering = (
        label(INSTANCE_TYPE),
        label(ZONE),
        label(CAPACITY_TYPE).and_then(CapacityType::from_label),
    );
    let (Some(instance_type), Some(zone), Some(capacity_type)) = offering else {
        tracing::warn!(
            node = name,
            "a KWOK node launched elsewhere lacks its instance-type, zone or capacity-type label; not adopted"
        );
        return None;
    };
    let tags = label(NODEPOOL)
        .map(|pool| (NODEPOOL.to_owned(), pool.to_owned()))
        .into_iter()
        .collect();
    Some(Instance {
        provider_id: provider_id.to_owned(),
        instance_type: instance_type.to_owned(),
        zone: zone.to_owned(),
        capacity_type,
        reservation: None,
        image_id: String::new(),
        price: label(PRICE_LABEL)
            .and_then(|p| p.parse().ok())
            .unwrap_or_default(),
        state: joist_provider::InstanceState::Running,
        launched_at: node
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        tags,
    })
}

/// A node name in EC2's private DNS form, drawn from the low bits of `instance_id`.
pub fn node_name(instance_id: &str, region: &str) -> String {
    let bits = u64::from_str_radix(instance_id.trim_start_matches("i-"), 16).unwrap_or_default();
    format!(
        "ip-10-{}-{}-{}.{region}.compute.internal",
        (bits >> 16) & 0xff,
        (bits >> 8) & 0xff,
        bits & 0xff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_TYPES: &str = r#"[
      {"name": "c-2x-amd64-linux", "architecture": "amd64", "operatingSystems": ["linux"],
       "resources": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "20Gi", "pods": "32"},
       "offerings": [
         {"Price": 0.05, "Available": true, "Requirements": [
           {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
           {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]},
         {"Price": 0.08, "Available": false, "Requirements": [
           {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
           {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-b"]}]}]},
      {"name": "m5.large", "architecture": "arm64", "operatingSystems": ["linux", "windows"],
       "resources": {"cpu": "2", "memory": "8Gi"},
       "offerings": [
         {"Price": 0.096, "Available": true, "Requirements": [
           {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
           {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]}]}
    ]"#;

    fn label(it: &InstanceType, key: &str) -> Vec<String> {
        it.requirements
            .get(key)
            .map(|r| r.values().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    #[test]
    fn karpenters_kwok_file_reads_as_types_with_offerings_labels_and_overhead() {
        let types = instance_types("types.json", TWO_TYPES).unwrap_or_else(|e| panic!("{e}"));
        let [generic, ec2] = types.as_slice() else {
            panic!("{types:?}")
        };
        assert_eq!(generic.name, "c-2x-amd64-linux");
        assert_eq!(generic.offerings.len(), 2);
        assert!(
            generic.offerings.iter().all(|o| o.available),
            "every offering is available"
        );
        assert_eq!(generic.offerings[0].capacity_type, CapacityType::Spot);
        assert_eq!(generic.offerings[1].zone, "test-zone-b");
        assert_eq!(generic.capacity.get(names::PODS), Quantity::from_units(32));
        assert_eq!(
            generic.allocatable().get(names::CPU),
            Quantity::from_millis(1900),
            "100m reserved for the kubelet"
        );
        assert_eq!(label(generic, ZONE), ["test-zone-a", "test-zone-b"]);
        assert_eq!(label(generic, CAPACITY_TYPE), ["on-demand", "spot"]);
        assert_eq!(label(generic, "karpenter.kwok.sh/instance-family"), ["c"]);
        assert_eq!(label(generic, "karpenter.kwok.sh/instance-size"), ["2"]);
        assert_eq!(label(generic, "karpenter.kwok.sh/instance-memory"), ["4Gi"]);
        assert_eq!(
            ec2.capacity.get(names::PODS),
            Quantity::from_units(110),
            "Kubernetes' default"
        );
        assert_eq!(label(ec2, "karpenter.kwok.sh/instance-size"), ["large"]);
        assert_eq!(label(ec2, "karpenter.kwok.sh/instance-family"), ["m5"]);
        assert_eq!(label(ec2, OS), ["linux", "windows"]);
        assert_eq!(label(ec2, ARCH), ["arm64"]);
    }

    /// A Node as Karpenter's KWOK provider creates it, with `labels` and `provider_id`.
    fn karpenters_node(labels: serde_json::Value, provider_id: &str) -> KwokNode {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kwok-default-x7k2p-1", "creationTimestamp": "2026-11-28T07:00:00Z",
                         "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": labels},
            "spec": {"providerID": provider_id},
            "status": {"capacity": {"cpu": "4"}, "conditions": []},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_node_karpenters_kwok_provider_launched_reads_as_its_instance() {
        let labels = serde_json::json!({
            "node.kubernetes.io/instance-type": "c-4x-amd64-linux",
            "topology.kubernetes.io/zone": "test-zone-b",
            "karpenter.sh/capacity-type": "spot",
            "karpenter.sh/nodepool": "default",
            "eks-node-viewer/instance-price": "0.136000",
        });
        let node = karpenters_node(labels.clone(), "kwok://kwok-default-x7k2p-1");
        let Some(instance) = launched_elsewhere(&node) else {
            panic!("not read")
        };
        assert_eq!(instance.provider_id, "kwok://kwok-default-x7k2p-1");
        assert_eq!(
            (
                instance.instance_type.as_str(),
                instance.zone.as_str(),
                instance.capacity_type
            ),
            ("c-4x-amd64-linux", "test-zone-b", CapacityType::Spot)
        );
        assert!((instance.price - 0.136).abs() < 1e-9, "{}", instance.price);
        assert_eq!(instance.launched_at, 1_795_849_200);
        assert_eq!(instance.tags.get(NODEPOOL).map(String::as_str), Some("default"));
        assert_eq!(instance.image_id, "", "no image recorded");

        let elsewhere = karpenters_node(labels.clone(), "aws:///us-west-2a/i-0abc");
        assert!(launched_elsewhere(&elsewhere).is_none(), "not a KWOK instance");
        let mut unlabelled = labels;
        unlabelled["karpenter.sh/capacity-type"] = serde_json::json!("lease");
        let unlabelled = karpenters_node(unlabelled, "kwok://kwok-default-x7k2p-1");
        assert!(
            launched_elsewhere(&unlabelled).is_none(),
            "no capacity type it knows"
        );
    }

    #[test]
    fn an_unusable_file_is_refused_naming_the_type_and_field() {
        let error = |text: &str| match instance_types("t.json", text) {
            Ok(types) => panic!("accepted: {types:?}"),
            Err(e) => e.to_string(),
        };
        assert!(error("{}").starts_with("t.json: not a list of KWOK instance types"));
        assert_eq!(error("[]"), "t.json: lists no instance type");
        let other_key = TWO_TYPES.replacen("topology.kubernetes.io/zone", "example.com/rack", 1);
        assert_eq!(
            error(&other_key),
            "t.json: instance type \"c-2x-amd64-linux\": offerings[0].Requirements[1].key: Joist's \
             offerings are by topology.kubernetes.io/zone and karpenter.sh/capacity-type only, got \
             \"example.com/rack\""
        );
        let bad_quantity = TWO_TYPES.replacen("\"4Gi\"", "\"four\"", 1);
        assert!(
            error(&bad_quantity)
                .starts_with("t.json: instance type \"c-2x-amd64-linux\": resources.memory: "),
            "{}",
            error(&bad_quantity)
        );
    }
}

//! The resource types kubesim serves: the built-in table, and the types that CustomResourceDefinitions add.
//!
//! Discovery documents (`/api/v1`, `/apis/{group}/{version}`) and request routing both read this registry.
//! A CRD whose spec cannot be read registers nothing; the create still succeeds, as a real API server
//! would store it and report the problem in its conditions.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::{Value, json};

use crate::object::Pointer;
use crate::object::text;

/// Where an object is stored: its API group and plural resource name. Every served version of a
/// resource shares one storage.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group; empty for the core group.
    pub group: String,
    /// The plural resource name (`pods`, `nodepools`).
    pub resource: String,
}

impl GroupResource {
    /// A group/resource pair.
    pub fn new(group: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// `resource.group`, or just `resource` for the core group, as Kubernetes messages name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// One served resource in one version.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// The API group; empty for the core group.
    pub group: String,
    /// The version (`v1`).
    pub version: String,
    /// The kind (`Pod`).
    pub kind: String,
    /// The plural name (`pods`).
    pub plural: String,
    /// The singular name (`pod`).
    pub singular: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl's short names (`po`).
    pub short_names: Vec<String>,
    /// Whether `/status` is a separate subresource (then the main resource ignores status changes).
    pub status_subresource: bool,
    /// Whether status given on create is kept (Nodes, which kubelets register with their status).
    pub keeps_status_on_create: bool,
    /// The columns `kubectl get` shows, beyond NAME and AGE (a CRD's additionalPrinterColumns).
    pub printer_columns: Vec<PrinterColumn>,
    /// Where a `/scale` subresource reads and writes, when the type has one.
    pub scale: Option<ScalePaths>,
}

/// The fields an autoscaling/v1 Scale stands for (a CRD's `subresources.scale`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// The desired count (`.spec.replicas`).
    pub spec_replicas: String,
    /// The observed count (`.status.replicas`).
    pub status_replicas: String,
    /// The label selector (`.spec.selector` of a workload), if any.
    pub label_selector: Option<String>,
}

impl ScalePaths {
    /// The workloads' paths: `.spec.replicas`, `.status.replicas`, `.spec.selector`.
    fn workload() -> Self {
        Self {
            spec_replicas: ".spec.replicas".to_owned(),
            status_replicas: ".status.replicas".to_owned(),
            label_selector: Some(".spec.selector".to_owned()),
        }
    }
}

/// A column of the Table that `kubectl get` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type of the cell (`string`, `integer`, `date`).
    pub kind: String,
    /// JSONPath-like dotted path to the value (`.spec.nodeClassRef.name`).
    pub path: String,
    /// 0 for default columns, 1 for `-o wide` only.
    pub priority: i64,
}

impl ResourceType {
    /// `group/version`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage this type reads and writes.
    pub fn group_resource(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.plural)
    }

    /// The subresources served besides the resource itself.
    pub fn subresources(&self) -> Vec<Subresource> {
        let mut subresources = Vec::new();
        if self.status_subresource {
            subresources.push(STATUS);
        }
        if self.scale.is_some() {
            subresources.push(SCALE);
        }
        match (self.group.as_str(), self.plural.as_str()) {
            ("", "pods") => subresources.extend([BINDING, EVICTION]),
            ("", "serviceaccounts") => subresources.push(TOKEN),
            _ => {}
        }
        subresources
    }
}

/// A subresource a type serves, as discovery lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subresource {
    /// The path segment after the object's name (`status`, `eviction`).
    pub name: &'static str,
    /// The kind it takes and returns; `None` for the resource's own kind.
    pub kind: Option<&'static str>,
    /// The verbs it serves.
    pub verbs: &'static [&'static str],
    /// The group and version of its kind where they are not the resource's own: kubectl drain
    /// evicts only when discovery names policy/v1 for `pods/eviction` (it deletes pods otherwise).
    pub group_version: Option<(&'static str, &'static str)>,
}

const STATUS: Subresource = Subresource {
    name: "status",
    kind: None,
    verbs: &["get", "patch", "update"],
    group_version: None,
};
const SCALE: Subresource = Subresource {
    name: "scale",
    kind: Some("Scale"),
    verbs: &["get", "patch", "update"],
    group_version: Some(("autoscaling", "v1")),
};
const BINDING: Subresource = Subresource {
    name: "binding",
    kind: Some("Binding"),
    verbs: &["create"],
    group_version: None,
};
const EVICTION: Subresource = Subresource {
    name: "eviction",
    kind: Some("Eviction"),
    verbs: &["create"],
    group_version: Some(("policy", "v1")),
};
const TOKEN: Subresource = Subresource {
    name: "token",
    kind: Some("TokenRequest"),
    verbs: &["create"],
    group_version: Some(("authentication.k8s.io", "v1")),
};

/// Verbs every resource supports; discovery advertises them and kubectl checks them.
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The resource types currently served, keyed by group, version and plural.
#[derive(Debug, Default)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
    /// Types added by each CRD (by CRD name), so an update or delete of the CRD replaces them.
    from_crds: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Registry {
    /// The built-in Kubernetes types Joist, kubectl and helm use.
    pub fn builtin() -> Self {
        let mut registry = Self::default();
        for &(group, version, kind, plural, namespaced, short, status) in BUILTIN {
            let singular = kind.to_lowercase();
            registry.insert(ResourceType {
                group: group.to_owned(),
                version: version.to_owned(),
                kind: kind.to_owned(),
                plural: plural.to_owned(),
                singular,
                namespaced,
                short_names: short.split_whitespace().map(str::to_owned).collect(),
                status_subresource: status,
                keeps_status_on_create: kind == "Node",
                printer_columns: builtin_columns(kind),
                scale: matches!(plural, "deployments" | "replicasets" | "statefulsets")
                    .then(ScalePaths::workload),
            });
        }
        registry
    }

    fn insert(&mut self, resource: ResourceType) {
        let key = (
            resource.group.clone(),
            resource.version.clone(),
            resource.plural.clone(),
        );
        self.types.insert(key, Arc::new(resource));
    }

    /// The type served at `group/version/plural`, if any.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
            .cloned()
    }

    /// Any served version of a group/resource (the first one, which CRDs list as their storage order).
    pub fn any_version(&self, resource: &GroupResource) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|((group, _, plural), _)| *group == resource.group && *plural == resource.resource)
            .map(|(_, resource)| resource.clone())
    }

    /// The served type of `apiVersion` and `kind`, as found in a manifest.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.kind == kind && t.api_version() == api_version)
            .cloned()
    }

    /// Every served type, in group/version/plural order.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Registers (or re-registers) the versions a CustomResourceDefinition serves. Returns false when
    /// the CRD's spec lacks the group, names or versions.
    pub fn apply_crd(&mut self, crd: &Value) -> bool {
        let name = text(crd, "/metadata/name").to_owned();
        self.remove_crd(&name);
        let Some(types) = crd_types(crd) else { return false };
        let keys = types
            .iter()
            .map(|t| (t.group.clone(), t.version.clone(), t.plural.clone()))
            .collect();
        for resource in types {
            self.insert(resource);
        }
        self.from_crds.insert(name, keys);
        true
    }

    /// Stops serving what a CRD added.
    pub fn remove_crd(&mut self, name: &str) {
        for key in self.from_crds.remove(name).unwrap_or_default() {
            self.types.remove(&key);
        }
    }

    /// `/api`: the core group's versions.
    pub fn core_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    /// `/apis`: every named group with its versions.
    pub fn group_list(&self) -> Value {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for resource in self.types.values().filter(|t| !t.group.is_empty()) {
            let versions = groups.entry(&resource.group).or_default();
            if !versions.contains(&resource.version.as_str()) {
                versions.push(&resource.version);
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(group, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                    .collect();
                json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
            })
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/{group}`: one group's versions, if it is served.
    pub fn group(&self, group: &str) -> Option<Value> {
        let list = self.group_list();
        list["groups"]
            .as_array()?
            .iter()
            .find(|g| g["name"] == group)
            .map(|g| {
                let mut g = g.clone();
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                g
            })
    }

    /// `/api/v1` or `/apis/{group}/{version}`: the resources of one group version, if any is served.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for t in self
            .types
            .values()
            .filter(|t| t.group == group && t.version == version)
        {
            resources.push(json!({
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": VERBS,
                "shortNames": t.short_names,
            }));
            for sub in t.subresources() {
                let mut resource = json!({
                    "name": format!("{}/{}", t.plural, sub.name),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": sub.kind.unwrap_or(&t.kind),
                    "verbs": sub.verbs,
                });
                if let Some((group, version)) = sub.group_version {
                    resource["group"] = json!(group);
                    resource["version"] = json!(version);
                }
                resources.push(resource);
            }
        }
        if resources.is_empty() {
            return None;
        }
        let group_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }
}

/// The types a CRD serves, one per served version, or None if the spec is incomplete.
fn crd_types(crd: &Value) -> Option<Vec<ResourceType>> {
    let spec = crd.get("spec")?;
    let group = spec.get("group")?.as_str()?;
    let names = spec.get("names")?;
    let kind = names.get("kind")?.as_str()?;
    let plural = names.get("plural")?.as_str()?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
    let short_names: Vec<String> = names
        .get("shortNames")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut types = Vec::new();
    for version in spec.get("versions")?.as_array()? {
        if version.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let printer_columns = version
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|columns| {
                columns
                    .iter()
                    .filter_map(|c| {
                        Some(PrinterColumn {
                            name: c.get("name")?.as_str()?.to_owned(),
                            kind: c
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("string")
                                .to_owned(),
                            path: c.get("jsonPath")?.as_str()?.to_owned(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        types.push(ResourceType {
            group: group.to_owned(),
            version: version.get("name")?.as_str()?.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            singular: singular.clone(),
            namespaced,
            short_names: short_names.clone(),
            status_subresource: version.at("/subresources/status").is_some(),
            keeps_status_on_create: false,
            printer_columns,
            scale: version.at("/subresources/scale").and_then(|scale| {
                Some(ScalePaths {
                    spec_replicas: scale.get("specReplicasPath")?.as_str()?.to_owned(),
                    status_replicas: scale.get("statusReplicasPath")?.as_str()?.to_owned(),
                    label_selector: scale
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                })
            }),
        });
    }
    (!types.is_empty()).then_some(types)
}

/// The default `kubectl get` columns of the built-in kinds kubesim users look at most.
fn builtin_columns(kind: &str) -> Vec<PrinterColumn> {
    let column = |name: &str, kind: &str, path: &str, priority: i64| PrinterColumn {
        name: name.to_owned(),
        kind: kind.to_owned(),
        path: path.to_owned(),
        priority,
    };
    match kind {
        "Pod" => vec![
            column("Status", "string", ".status.phase", 0),
            column("Node", "string", ".spec.nodeName", 0),
            column("IP", "string", ".status.podIP", 1),
        ],
        "Node" => vec![
            column(
                "Instance-Type",
                "string",
                ".metadata.labels.node\\.kubernetes\\.io/instance-type",
                0,
            ),
            column(
                "Zone",
                "string",
                ".metadata.labels.topology\\.kubernetes\\.io/zone",
                0,
            ),
            column("Provider-ID", "string", ".spec.providerID", 1),
        ],
        "Deployment" | "ReplicaSet" | "StatefulSet" => vec![
            column("Desired", "integer", ".spec.replicas", 0),
            column("Ready", "integer", ".status.readyReplicas", 0),
            column("Available", "integer", ".status.availableReplicas", 0),
        ],
        "DaemonSet" => vec![
            column("Desired", "integer", ".status.desiredNumberScheduled", 0),
            column("Ready", "integer", ".status.numberReady", 0),
        ],
        "PodDisruptionBudget" => vec![
            column("Min-Available", "string", ".spec.minAvailable", 0),
            column("Max-Unavailable", "string", ".spec.maxUnavailable", 0),
            column("Allowed-Disruptions", "integer", ".status.disruptionsAllowed", 0),
        ],
        "Event" => vec![
            column("Type", "string", ".type", 0),
            column("Reason", "string", ".reason", 0),
            column("Object", "string", ".involvedObject.name", 0),
            column("Message", "string", ".message", 0),
        ],
        _ => Vec::new(),
    }
}

/// (group, version, kind, plural, namespaced, short names, status subresource)
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static str,
    bool,
);

/// The built-in types served from the start.
#[rustfmt::skip]
const BUILTIN: &[Builtin] = &[
    ("", "v1", "Pod", "pods", true, "po", true),
    ("", "v1", "Node", "nodes", false, "no", true),
    ("", "v1", "Namespace", "namespaces", false, "ns", true),
    ("", "v1", "Service", "services", true, "svc", true),
    (
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        true,
        "rc",
        true,
    ),
    ("", "v1", "Endpoints", "endpoints", true, "ep", false),
    ("", "v1", "ConfigMap", "configmaps", true, "cm", false),
    ("", "v1", "Secret", "secrets", true, "", false),
    ("", "v1", "ServiceAccount", "serviceaccounts", true, "sa", false),
    ("", "v1", "Event", "events", true, "ev", false),
    ("", "v1", "PodTemplate", "podtemplates", true, "", false),
    (
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        false,
        "pv",
        true,
    ),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
        "pvc",
        true,
    ),
    ("", "v1", "ResourceQuota", "resourcequotas", true, "quota", true),
    ("", "v1", "LimitRange", "limitranges", true, "limits", false),
    ("apps", "v1", "Deployment", "deployments", true, "deploy", true),
    ("apps", "v1", "ReplicaSet", "replicasets", true, "rs", true),
    ("apps", "v1", "DaemonSet", "daemonsets", true, "ds", true),
    ("apps", "v1", "StatefulSet", "statefulsets", true, "sts", true),
    (
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        true,
        "",
        false,
    ),
    ("batch", "v1", "Job", "jobs", true, "", true),
    ("batch", "v1", "CronJob", "cronjobs", true, "cj", true),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
        "pdb",
        true,
    ),
    ("coordination.k8s.io", "v1", "Lease", "leases", true, "", false),
    (
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        false,
        "sc",
        false,
    ),
    ("storage.k8s.io", "v1", "CSINode", "csinodes", false, "", false),
    (
        "storage.k8s.io",
        "v1",
        "CSIDriver",
        "csidrivers",
        false,
        "",
        false,
    ),
    (
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
        false,
        "",
        true,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        true,
        "",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
        "",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
        "",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        "",
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        "crd crds",
        true,
    ),
    ("events.k8s.io", "v1", "Event", "events", true, "ev", false),
    (
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        true,
        "ing",
        true,
    ),
    (
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
        "netpol",
        false,
    ),
    (
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        false,
        "pc",
        false,
    ),
    (
        "node.k8s.io",
        "v1",
        "RuntimeClass",
        "runtimeclasses",
        false,
        "",
        false,
    ),
    (
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
        "hpa",
        true,
    ),
    (
        "autoscaling",
        "v1",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
        "hpa",
        true,
    ),
    (
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        true,
        "",
        false,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_serves_each_of_its_served_versions_and_stops_when_removed() {
        let mut registry = Registry::builtin();
        let crd = json!({
            "metadata": {"name": "nodepools.karpenter.sh"},
            "spec": {
                "group": "karpenter.sh", "scope": "Cluster",
                "names": {"kind": "NodePool", "plural": "nodepools", "singular": "nodepool"},
                "versions": [
                    {"name": "v1", "served": true, "subresources": {"status": {}}},
                    {"name": "v1beta1", "served": false},
                ],
            },
        });
        assert!(registry.apply_crd(&crd));
        let served = registry
            .get("karpenter.sh", "v1", "nodepools")
            .expect("v1 served");
        assert!(!served.namespaced);
        assert!(served.status_subresource);
        assert!(registry.get("karpenter.sh", "v1beta1", "nodepools").is_none());
        assert!(registry.resource_list("karpenter.sh", "v1").is_some());
        registry.remove_crd("nodepools.karpenter.sh");
        assert!(registry.get("karpenter.sh", "v1", "nodepools").is_none());
        assert!(registry.group("karpenter.sh").is_none());
    }

    #[test]
    fn discovery_lists_pod_subresources_kubectl_needs() {
        let registry = Registry::builtin();
        let list = registry.resource_list("", "v1").expect("core v1");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        for expected in [
            "pods",
            "pods/status",
            "pods/eviction",
            "pods/binding",
            "nodes",
            "namespaces",
        ] {
            assert!(names.contains(&expected), "{expected} missing from {names:?}");
        }
    }
}

//! A portable snapshot of a cluster, the input `joist what-if` starts from: the document
//! `kubectl get nodes,pods,nodepools,nodeclaims,ec2nodeclasses,pdb,daemonsets -A -o yaml` prints
//! (a `v1` `List` of those objects). [`Snapshot::take`] reads it through any client (a live
//! cluster's, or kubesim's at the end of a `joist simulate` run), [`Snapshot::to_yaml`] writes it,
//! [`Snapshot::parse`] reads one back, so a snapshot can be attached to a bug report and replayed.
//!
//! Items are ordered by kind (in [`KINDS`]' order), then namespace and name, and carry no
//! `managedFields` (kubectl hides them too), so the same cluster always gives the same file.
//! Fails with a [`SnapshotError`] naming the kind that could not be listed, or what in a file is
//! not a snapshot.

use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::Value;

/// The kinds a snapshot holds, as `(group, version, kind)`, in its order.
pub const KINDS: [(&str, &str, &str); 7] = [
    ("karpenter.k8s.aws", "v1", "EC2NodeClass"),
    ("karpenter.sh", "v1", "NodePool"),
    ("karpenter.sh", "v1", "NodeClaim"),
    ("", "v1", "Node"),
    ("apps", "v1", "DaemonSet"),
    ("policy", "v1", "PodDisruptionBudget"),
    ("", "v1", "Pod"),
];

/// Why a snapshot could not be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A kind could not be listed.
    #[error("cannot list {kind}: {source}")]
    List {
        /// The kind.
        kind: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The snapshot could not be written as YAML.
    #[error("cannot write the snapshot as YAML: {0}")]
    Render(String),
    /// The text is not YAML of a `List`.
    #[error("not a snapshot (a kind: List of objects, as kubectl get -o yaml prints): {0}")]
    Parse(String),
    /// An item is not one of the snapshot's kinds.
    #[error(
        "items[{index}]: {kind} is not one of the kinds a snapshot holds (nodes, pods, nodepools, nodeclaims, ec2nodeclasses, pdb, daemonsets)"
    )]
    Kind {
        /// Its position.
        index: usize,
        /// Its `apiVersion` and `kind`.
        kind: String,
    },
}

/// See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The objects, each with its `apiVersion` and `kind`.
    pub items: Vec<Value>,
}

impl Snapshot {
    /// Lists every kind of [`KINDS`] through `client`.
    pub async fn take(client: &kube::Client) -> Result<Self, SnapshotError> {
        let mut items = Vec::new();
        for (group, version, kind) in KINDS {
            let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let listed = api
                .list(&Default::default())
                .await
                .map_err(|source| SnapshotError::List { kind, source })?;
            let mut objects: Vec<Value> = listed
                .items
                .into_iter()
                .map(|object| {
                    let mut value = serde_json::to_value(object).unwrap_or_default();
                    value["apiVersion"] = Value::from(resource.api_version.clone());
                    value["kind"] = Value::from(kind);
                    if let Some(metadata) = value["metadata"].as_object_mut() {
                        metadata.remove("managedFields");
                    }
                    value
                })
                .collect();
            objects.sort_by_key(|o| (text(o, "/metadata/namespace"), text(o, "/metadata/name")));
            items.extend(objects);
        }
        Ok(Self { items })
    }

    /// The snapshot as kubectl prints it: a `v1` `List`.
    pub fn to_yaml(&self) -> Result<String, SnapshotError> {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": self.items,
            "metadata": {"resourceVersion": ""},
        });
        serde_saphyr::to_string(&list).map_err(|e| SnapshotError::Render(e.to_string()))
    }

    /// A snapshot from `text`, a `List` of objects of [`KINDS`] (other kinds are refused, naming
    /// the item).
    pub fn parse(yaml: &str) -> Result<Self, SnapshotError> {
        let list: Value =
            serde_saphyr::from_str_with_options(yaml, serde_saphyr::options! { with_snippet: false })
                .map_err(|e| SnapshotError::Parse(e.to_string()))?;
        if list["kind"] != "List" {
            return Err(SnapshotError::Parse(format!(
                "its kind is {}, not List",
                list["kind"].as_str().unwrap_or("missing")
            )));
        }
        let items = list["items"].as_array().cloned().unwrap_or_default();
        for (index, item) in items.iter().enumerate() {
            let known = KINDS.iter().any(|(group, version, kind)| {
                let api_version = if group.is_empty() {
                    (*version).to_owned()
                } else {
                    format!("{group}/{version}")
                };
                item["apiVersion"] == api_version.as_str() && item["kind"] == *kind
            });
            if !known {
                return Err(SnapshotError::Kind {
                    index,
                    kind: format!("{} {}", text(item, "/apiVersion"), text(item, "/kind")),
                });
            }
        }
        Ok(Self { items })
    }

    /// When the snapshot was taken, as far as its objects tell: the latest creation time,
    /// condition transition or node heartbeat among them (Unix seconds; a kubelet reports its
    /// node's status at least every five minutes); `None` when none carries a time.
    pub fn taken_at(&self) -> Option<i64> {
        let times = self.items.iter().flat_map(|item| {
            let conditions = item["status"]["conditions"].as_array().into_iter().flatten();
            std::iter::once(&item["metadata"]["creationTimestamp"])
                .chain(conditions.flat_map(|c| [&c["lastTransitionTime"], &c["lastHeartbeatTime"]]))
                .filter_map(|t| joist_messages::time::parse_rfc3339(t.as_str()?))
        });
        times.max()
    }

    /// The items of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.items.iter().filter(move |item| item["kind"] == kind)
    }
}

/// The string at `pointer` in `value`, or empty.
pub(crate) fn text(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_round_trips_and_refuses_what_it_does_not_hold() {
        let snapshot = Snapshot {
            items: vec![
                serde_json::json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {"limits": {"cpu": "10"}}}),
                serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"}}),
            ],
        };
        let yaml = snapshot.to_yaml().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Snapshot::parse(&yaml).ok(), Some(snapshot));
        let other =
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: s}}\n";
        assert_eq!(
            Snapshot::parse(other).err().map(|e| e.to_string()).as_deref(),
            Some(
                "items[0]: v1 Secret is not one of the kinds a snapshot holds (nodes, pods, nodepools, nodeclaims, ec2nodeclasses, pdb, daemonsets)"
            )
        );
        assert!(Snapshot::parse("kind: Pod\n").is_err());
    }
}

//! What a run left behind that it should not have: instances no NodeClaim accounts for, NodeClaims
//! launched more than once, Nodes still tainted for a disruption no one is carrying out, pods not
//! Running, and objects the controllers' view holds differently from the cluster (missed by a
//! watch). The fault-injection suite (`joist bench chaos`) reads it after each crash; every list
//! is empty after a clean run that ends quiet.
//!
//! Failure modes: none; it reads the store and the cloud's books.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use joist_actors::{effects::faults::Step, state::read_model::ReadModel};
use joist_kubesim::{Store, resources::GroupResource};
use joist_messages::{
    cached_pod::CachedPod,
    labels::{tags, taints},
};
use joist_provider_sim::SimCloud;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::Value;

/// Where the controllers crashed, and when they came back (seconds into the run).
#[derive(Debug, Clone)]
pub struct Crash {
    /// The fault point.
    pub step: Step,
    /// When it was reached.
    pub at: f64,
    /// When new controllers started; none if the run ended first.
    pub restarted_at: Option<f64>,
}

/// What a run left behind (see the module docs).
#[derive(Debug, Default)]
pub struct Audit {
    /// The crash, if one was armed and reached.
    pub crash: Option<Crash>,
    /// Instances still running that no NodeClaim names (provider IDs).
    pub leaks: Vec<String>,
    /// NodeClaims more than one instance was launched for (name: instances).
    pub duplicates: Vec<String>,
    /// Nodes still tainted `karpenter.sh/disrupted` or as a disruption's candidate.
    pub tainted: Vec<String>,
    /// Pods neither Running nor Succeeded (`namespace/name`).
    pub stranded: Vec<String>,
    /// Pods, Nodes and NodeClaims the controllers' view misses, holds at another version, or
    /// still holds after they were deleted, and pods it files under the wrong Node
    /// (`kind namespace/name: what`).
    pub stale: Vec<String>,
}

impl Audit {
    /// Reads what `store` and `cloud` hold at the end of a run, and what the controllers that
    /// ran last see in `view`.
    pub fn of(store: &Store, cloud: &SimCloud, view: &ReadModel, crash: Option<Crash>) -> Self {
        let named: BTreeSet<String> = list(store, "karpenter.sh", "nodeclaims", &|c| {
            c["status"]["providerID"].is_string()
        })
        .iter()
        .filter_map(|claim| claim["status"]["providerID"].as_str().map(str::to_owned))
        .collect();
        let instances = cloud.books().instances();
        let leaks = instances
            .iter()
            .filter(|r| r.ended.is_none() && !named.contains(&r.instance.provider_id))
            .map(|r| r.instance.provider_id.clone())
            .collect();
        let mut launched: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for record in &instances {
            if let Some(claim) = record.instance.tags.get(tags::NODECLAIM) {
                launched
                    .entry(claim)
                    .or_default()
                    .push(&record.instance.provider_id);
            }
        }
        let duplicates = launched
            .into_iter()
            .filter(|(_, ids)| ids.len() > 1)
            .map(|(claim, ids)| format!("{claim}: {}", ids.join(", ")))
            .collect();
        let disrupted = |node: &Value| {
            node["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter().any(|t| {
                    t["key"]
                        .as_str()
                        .is_some_and(|k| taints::DISRUPTION_MARKS.contains(&k))
                })
            })
        };
        let tainted = list(store, "", "nodes", &disrupted)
            .iter()
            .map(|node| name(node))
            .collect();
        let not_running =
            |pod: &Value| !matches!(pod["status"]["phase"].as_str(), Some("Running" | "Succeeded"));
        let stranded = list(store, "", "pods", &not_running)
            .iter()
            .map(|pod| key(pod))
            .collect();
        Self {
            crash,
            leaks,
            duplicates,
            tainted,
            stranded,
            stale: stale_view(store, view),
        }
    }
}

/// The objects of `group`/`resource` that are `wanted` (the store filters as it lists: a large
/// cluster's Running pods are passed over).
fn list(store: &Store, group: &str, resource: &str, wanted: &dyn Fn(&Value) -> bool) -> Vec<Arc<Value>> {
    store
        .list(&GroupResource::new(group, resource), None, None, None, wanted)
        .items
}

/// An object's `namespace/name` (`/name` for a cluster-scoped one).
fn key(object: &Value) -> String {
    let text = |field: &str| object["metadata"][field].as_str().unwrap_or_default();
    format!("{}/{}", text("namespace"), text("name"))
}

/// `namespace/name` → resourceVersion.
type Versions = BTreeMap<String, String>;

/// The versions of the objects whose metadata the view holds.
fn seen<'a>(metas: impl Iterator<Item = &'a ObjectMeta>) -> Versions {
    metas
        .map(|m| {
            let key = format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            );
            (key, m.resource_version.clone().unwrap_or_default())
        })
        .collect()
}

/// The differences between the cluster's objects and the view's, kind by kind.
fn stale_view(store: &Store, view: &ReadModel) -> Vec<String> {
    let stored = |group: &str, resource: &str| -> Versions {
        list(store, group, resource, &|_| true)
            .iter()
            .map(|o| {
                let version = o["metadata"]["resourceVersion"].as_str().unwrap_or_default();
                (key(o), version.to_owned())
            })
            .collect()
    };
    let pods = view.pods();
    let (nodes, claims) = (view.nodes(), view.node_claims());
    let mut stale = Vec::new();
    for (kind, cluster, held) in [
        ("Pod", stored("", "pods"), seen(pods.iter().map(|p| &p.metadata))),
        (
            "Node",
            stored("", "nodes"),
            seen(nodes.iter().map(|n| &n.metadata)),
        ),
        (
            "NodeClaim",
            stored("karpenter.sh", "nodeclaims"),
            seen(claims.iter().map(|c| &c.metadata)),
        ),
    ] {
        for (key, version) in &cluster {
            match held.get(key) {
                None => stale.push(format!("{kind} {key}: missed")),
                Some(held) if held != version => {
                    stale.push(format!("{kind} {key}: seen at version {held}, not {version}"));
                }
                Some(_) => {}
            }
        }
        let deleted = held.keys().filter(|key| !cluster.contains_key(*key));
        stale.extend(deleted.map(|key| format!("{kind} {key}: deleted, still seen")));
    }
    let mut bound: BTreeMap<&str, Vec<&CachedPod>> = BTreeMap::new();
    for pod in &pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            bound.entry(node).or_default().push(pod);
        }
    }
    for (node, on_node) in bound {
        let filed: BTreeSet<Option<String>> = view
            .pods_on(node)
            .iter()
            .map(|p| p.metadata.uid.clone())
            .collect();
        for pod in on_node.into_iter().filter(|p| !filed.contains(&p.metadata.uid)) {
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            stale.push(format!("Pod {key}: not filed under its node {node}"));
        }
    }
    stale
}

fn name(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use joist_kubesim::Clock;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_view_that_missed_objects_is_stale() {
        let store = Store::new(Clock::system(), 1);
        let pods = GroupResource::new("", "pods");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}});
        store
            .create(&pods, "default", pod, false)
            .unwrap_or_else(|e| panic!("{e}"));
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
        store
            .create(&GroupResource::new("", "nodes"), "", node, false)
            .unwrap_or_else(|e| panic!("{e}"));
        let (view, _writers) = ReadModel::new();
        assert_eq!(
            stale_view(&store, &view),
            ["Pod default/web: missed", "Node /n1: missed"]
        );
    }
}

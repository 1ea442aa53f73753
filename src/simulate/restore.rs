//! A [`Snapshot`] of a cluster restored into the simulated world, before anything in it runs, so
//! a scenario (`joist what-if`) starts from that cluster rather than an empty one. A Deployment's
//! pods (their ReplicaSet named after it and their `pod-template-hash`) come back under a
//! Deployment of that name, whose current ReplicaSet holds them, so a change that scales the
//! Deployment scales them.
//!
//! Straight into kubesim's store, in one go: the node classes and NodePools (their specs: Joist
//! works their status out again), DaemonSets and PodDisruptionBudgets, NodeClaims and Nodes with
//! their status, each Node's instance adopted by the simulated cloud (type, zone and capacity type
//! from its labels, the cloud's price), and the pods. A pod's controller is not in a snapshot, so
//! the pods of each ReplicaSet or StatefulSet come back owned by a ReplicaSet of that name, as
//! many replicas as there were pods, whose template is the first pod's: an evicted pod is made
//! again, as its controller would (selected by [`RESTORED_SET`], beside the labels they share);
//! a StatefulSet's pods lose their own hostnames, and a pod claiming a volume, which no snapshot
//! holds, waits when it is made again. DaemonSets' pods, mirror pods and finished pods are left to
//! their controllers or out. Objects keep their names, labels, annotations and finalizers; uids,
//! versions and creation times are kubesim's (so `expireAfter` counts from the restore), and an
//! object that was being deleted comes back as it was before (pods being deleted stay out).
//!
//! Fails with [`SimulateError::Setup`] naming the object the store refused.

use std::collections::{BTreeMap, BTreeSet};

use joist_kubesim::{
    Store,
    physics::template_hash,
    resources::GroupResource,
    store::{ObjectKey, Part},
};
use joist_provider_sim::SimCloud;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};

use super::SimulateError;
use crate::snapshot::{Snapshot, text};

/// What a restore made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Nodes whose instances the cloud adopted.
    pub nodes: usize,
    /// Pods restored.
    pub pods: usize,
}

/// Restores `snapshot` into `store` and `cloud` (see the module docs).
pub fn restore(store: &Store, cloud: &SimCloud, snapshot: &Snapshot) -> Result<Restored, SimulateError> {
    let mut restored = Restored::default();
    let namespaces: BTreeSet<String> = (snapshot.items.iter())
        .map(|item| text(item, "/metadata/namespace"))
        .filter(|namespace| !namespace.is_empty())
        .collect();
    for namespace in namespaces {
        let key = ObjectKey::new("", &namespace);
        if store.get(&resource("", "namespaces"), &key).is_err() {
            let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
            create(store, &resource("", "namespaces"), "", object)?;
        }
    }
    for (group, plural, kind) in [
        ("karpenter.k8s.aws", "ec2nodeclasses", "EC2NodeClass"),
        ("karpenter.sh", "nodepools", "NodePool"),
        ("apps", "daemonsets", "DaemonSet"),
        ("policy", "poddisruptionbudgets", "PodDisruptionBudget"),
    ] {
        for item in snapshot.of_kind(kind) {
            create(
                store,
                &resource(group, plural),
                &text(item, "/metadata/namespace"),
                fresh(item),
            )?;
        }
    }
    let mut claim_of_node = BTreeMap::new();
    for item in snapshot.of_kind("NodeClaim") {
        let claims = resource("karpenter.sh", "nodeclaims");
        create(store, &claims, "", fresh(item))?;
        set_status(store, &claims, item)?;
        let node = text(item, "/status/nodeName");
        if !node.is_empty() {
            claim_of_node.insert(node, text(item, "/metadata/name"));
        }
    }
    for item in snapshot.of_kind("Node") {
        let nodes = resource("", "nodes");
        create(store, &nodes, "", fresh(item))?;
        set_status(store, &nodes, item)?;
        let node: Node = serde_json::from_value(item.clone())
            .map_err(|e| SimulateError::Setup(format!("node {}: {e}", text(item, "/metadata/name"))))?;
        let claim = claim_of_node
            .get(&text(item, "/metadata/name"))
            .map(String::as_str);
        restored.nodes += usize::from(cloud.adopt_node(&node, claim));
    }
    restored.pods = restore_pods(store, snapshot)?;
    Ok(restored)
}

/// The pods, each ReplicaSet's or StatefulSet's under a ReplicaSet of its controller's name.
fn restore_pods(store: &Store, snapshot: &Snapshot) -> Result<usize, SimulateError> {
    let pods: Vec<&Value> = snapshot.of_kind("Pod").filter(|p| restorable(p)).collect();
    let mut groups: BTreeMap<(String, String), Vec<&Value>> = BTreeMap::new();
    let mut bare = Vec::new();
    for pod in &pods {
        match controller(pod) {
            // A StatefulSet's set is named apart from a ReplicaSet of the same name.
            Some((kind, name)) if kind == "ReplicaSet" => groups
                .entry((text(pod, "/metadata/namespace"), name))
                .or_default()
                .push(pod),
            Some((kind, name)) if kind == "StatefulSet" => groups
                .entry((text(pod, "/metadata/namespace"), format!("{name}-statefulset")))
                .or_default()
                .push(pod),
            _ => bare.push(*pod),
        }
    }
    for pod in bare {
        create(
            store,
            &resource("", "pods"),
            &text(pod, "/metadata/namespace"),
            fresh(pod),
        )?;
    }
    for ((namespace, name), members) in groups {
        // A Deployment's ReplicaSet comes back under a Deployment of that name, as the current
        // set kubesim's Deployment controller names by its template's hash: a change that scales
        // the Deployment scales these pods.
        let (set_name, hash, owner) = match deployment_of(&name, &members) {
            Some(deployment) => {
                let object = deployment_object(&namespace, &deployment, &members);
                let created = create(store, &resource("apps", "deployments"), &namespace, object)?;
                let hash = template_hash(&created["spec"]["template"]);
                let owner = owner_reference("Deployment", &deployment, &created);
                (format!("{deployment}-{hash}"), Some(hash), Some(owner))
            }
            None => (name, None, None),
        };
        let mut set = replica_set(&namespace, &set_name, &members, hash.as_deref());
        if let Some(owner) = owner {
            set["metadata"]["ownerReferences"] = json!([owner]);
        }
        let set = create(store, &resource("apps", "replicasets"), &namespace, set)?;
        let owner = owner_reference("ReplicaSet", &set_name, &set);
        for pod in members {
            let mut object = fresh(pod);
            object["metadata"]["ownerReferences"] = json!([owner]);
            object["metadata"]["labels"][RESTORED_SET] = json!(set_name);
            if let Some(hash) = &hash {
                object["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(hash);
            }
            create(store, &resource("", "pods"), &namespace, object)?;
        }
    }
    Ok(pods.len())
}

/// The label a restored set selects its pods by, beside the labels they share (which may be
/// none).
const RESTORED_SET: &str = "sim.joist.dev/restored-set";

/// The label a Deployment's ReplicaSets and their pods carry their template's hash in.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The Deployment whose ReplicaSet `name` was, when `members` say so: each carries a
/// `pod-template-hash` that ends the set's name.
fn deployment_of(name: &str, members: &[&Value]) -> Option<String> {
    let hash = text(members.first()?, &format!("/metadata/labels/{POD_TEMPLATE_HASH}"));
    let deployment = name.strip_suffix(&format!("-{hash}"))?;
    (!hash.is_empty() && !deployment.is_empty()).then(|| deployment.to_owned())
}

/// The labels every one of `members` carries, but a template's hash.
fn shared_labels(members: &[&Value]) -> Map<String, Value> {
    let labels = |pod: &Value| pod["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    let first = members.first().map(|p| labels(p)).unwrap_or_default();
    first
        .into_iter()
        .filter(|(key, value)| {
            key != POD_TEMPLATE_HASH && members.iter().all(|p| labels(p).get(key) == Some(value))
        })
        .collect()
}

/// The first of `members`' spec as a template's: unbound, without a StatefulSet pod's own
/// hostname.
fn template_spec(members: &[&Value]) -> Value {
    let mut spec = members.first().map(|p| p["spec"].clone()).unwrap_or_default();
    if let Some(spec) = spec.as_object_mut() {
        for own in ["nodeName", "hostname", "subdomain"] {
            spec.remove(own);
        }
    }
    spec
}

/// A Deployment `name` of `members`: as many replicas, the labels they share as its selector and
/// its template's (the set's own label when they share none), the first one's spec.
fn deployment_object(namespace: &str, name: &str, members: &[&Value]) -> Value {
    let mut labels = shared_labels(members);
    if labels.is_empty() {
        labels.insert(RESTORED_SET.to_owned(), json!(name));
    }
    workload("Deployment", (namespace, name), labels, members)
}

/// A ReplicaSet `name` for `members`: as many replicas, the labels they all share and
/// [`RESTORED_SET`] (and a Deployment's template `hash`) as its selector, the first one's spec as
/// its template.
fn replica_set(namespace: &str, name: &str, members: &[&Value], hash: Option<&str>) -> Value {
    let mut labels = shared_labels(members);
    labels.insert(RESTORED_SET.to_owned(), json!(name));
    if let Some(hash) = hash {
        labels.insert(POD_TEMPLATE_HASH.to_owned(), json!(hash));
    }
    workload("ReplicaSet", (namespace, name), labels, members)
}

/// A `kind` (of `apps/v1`) named `name` in `namespace` keeping as many replicas as `members`,
/// selecting them by `labels`, their template the first one's spec with `labels`.
fn workload(
    kind: &str,
    (namespace, name): (&str, &str),
    labels: Map<String, Value>,
    members: &[&Value],
) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": members.len(),
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": template_spec(members)},
        },
    })
}

/// An owner reference to the `kind` `name`, as `created`.
fn owner_reference(kind: &str, name: &str, created: &Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind, "name": name,
        "uid": created["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    })
}

/// Whether a pod comes back: not a DaemonSet's, not a mirror, not finished, not being deleted.
fn restorable(pod: &Value) -> bool {
    let phase = text(pod, "/status/phase");
    controller(pod).is_none_or(|(kind, _)| kind != "DaemonSet")
        && pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null()
        && phase != "Succeeded"
        && phase != "Failed"
        && pod["metadata"]["deletionTimestamp"].is_null()
}

/// The kind and name of an object's controller, if it has one.
fn controller(object: &Value) -> Option<(String, String)> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .map(|o| (text(o, "/kind"), text(o, "/name")))
}

/// `item` as a new object: its name, namespace, labels, annotations and finalizers, its spec and
/// the rest of its fields; no status, uid or version.
fn fresh(item: &Value) -> Value {
    let mut object = item.clone();
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.retain(|key, _| {
            matches!(
                key.as_str(),
                "name" | "namespace" | "labels" | "annotations" | "finalizers"
            )
        });
    }
    object
}

fn create(
    store: &Store,
    resource: &GroupResource,
    namespace: &str,
    object: Value,
) -> Result<Value, SimulateError> {
    let name = text(&object, "/metadata/name");
    store
        .create(resource, namespace, object, false)
        .map(|created| (*created).clone())
        .map_err(|e| SimulateError::Setup(format!("restoring {} {namespace}/{name}: {e}", resource.resource)))
}

/// Writes `item`'s status onto the stored object of the same name.
fn set_status(store: &Store, resource: &GroupResource, item: &Value) -> Result<(), SimulateError> {
    let name = text(item, "/metadata/name");
    let status = item["status"].clone();
    store
        .modify(
            resource,
            &ObjectKey::new("", &name),
            Part::Status,
            false,
            |stored| {
                let mut object = stored.clone();
                object["status"] = status;
                Ok(object)
            },
        )
        .map(|_| ())
        .map_err(|e| {
            SimulateError::Setup(format!(
                "restoring the status of {} {name}: {e}",
                resource.resource
            ))
        })
}

fn resource(group: &str, plural: &str) -> GroupResource {
    GroupResource::new(group, plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_set_selects_its_pods_by_its_own_label_and_drops_their_hostnames() {
        let pod = |ordinal: u32| {
            json!({
                "metadata": {"name": format!("db-{ordinal}"), "labels": {
                    "app": "db", "statefulset.kubernetes.io/pod-name": format!("db-{ordinal}")}},
                "spec": {"hostname": format!("db-{ordinal}"), "subdomain": "db", "nodeName": "n1",
                         "containers": [{"name": "db", "image": "db"}]},
            })
        };
        let (first, second) = (pod(0), pod(1));
        let set = replica_set("default", "db-statefulset", &[&first, &second], None);
        assert_eq!(
            set["spec"]["selector"]["matchLabels"],
            json!({"app": "db", RESTORED_SET: "db-statefulset"}),
            "the labels both pods carry, and the set's own"
        );
        assert_eq!(set["spec"]["replicas"], 2);
        let template = &set["spec"]["template"]["spec"];
        assert!(
            template["hostname"].is_null()
                && template["subdomain"].is_null()
                && template["nodeName"].is_null(),
            "{template}"
        );
        let unlabelled = json!({"metadata": {"name": "job-x"}, "spec": {"containers": []}});
        let set = replica_set("default", "job", &[&unlabelled], None);
        assert_eq!(
            set["spec"]["selector"]["matchLabels"],
            json!({RESTORED_SET: "job"}),
            "pods without labels are still selected, by the set's label alone"
        );
    }

    #[test]
    fn a_deployments_set_is_known_by_the_hash_that_ends_its_name() {
        let pod = json!({"metadata": {"name": "web-7d9f-abcde", "labels": {"app": "web", POD_TEMPLATE_HASH: "7d9f"}}});
        assert_eq!(deployment_of("web-7d9f", &[&pod]).as_deref(), Some("web"));
        assert_eq!(
            deployment_of("other", &[&pod]),
            None,
            "a set named otherwise is its own"
        );
        let unhashed = json!({"metadata": {"name": "web-x", "labels": {"app": "web"}}});
        assert_eq!(deployment_of("web-", &[&unhashed]), None);
        let deployment = deployment_object("default", "web", &[&pod]);
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"],
            json!({"app": "web"}),
            "the old hash is no label of the Deployment"
        );
    }
}

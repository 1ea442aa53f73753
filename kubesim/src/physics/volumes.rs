//! Volumes: the PersistentVolume provisioner and the attach/detach controller with its CSI
//! driver. A PersistentVolumeClaim is bound to a volume provisioned for it (`pvc-<claim uid>`,
//! driver `ebs.csi.aws.com`) once a pod using it is bound to a node, in that node's zone (the
//! volume's node affinity names it, and the scheduler keeps the claim's later pods there); a pod on a node attaches its
//! claims' volumes there (one VolumeAttachment per volume and node, attached at once); a volume
//! that no pod on the node uses any more (its pods deleted or finished: a pod shutting down still
//! uses it) is detached after [`PhysicsSettings::detach_after`](super::PhysicsSettings), that
//! is its VolumeAttachment deleted, and at once when the node is gone.
//!
//! Left out: binding modes (every claim waits for its first consumer, `Immediate` ones too; a
//! class's allowed topologies are honoured by the scheduler), access modes, CSINodes (attach
//! limits are the scheduler's, from CSINodes made by hand), reclaiming the volumes of deleted
//! claims, and volumes other than claims (ephemeral ones too).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use joist_messages::labels::ZONE;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Informer, wait};
use crate::{
    object::{Pointer, labels, text},
    resources::GroupResource,
    store::{DeleteOptions, EventKind, ObjectKey, Part, Store},
};

/// The CSI driver the simulated volumes belong to.
pub const DRIVER: &str = "ebs.csi.aws.com";

/// A volume on a node: (node name, PersistentVolume name).
type Attachment = (String, String);

#[derive(Default)]
struct Volumes {
    /// Claims as last seen (or as bound here, before the informer shows it).
    claims: HashMap<ObjectKey, Arc<Value>>,
    /// Nodes by name, with their zone (empty when unlabelled).
    nodes: HashMap<String, String>,
    /// Bound pods that use claims, as last seen, with the attachments they use.
    pods: HashMap<ObjectKey, (Arc<Value>, Vec<Attachment>)>,
    /// Pods waiting for a claim to be bound, by claim.
    waiting: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// Who uses each attachment.
    users: HashMap<Attachment, BTreeSet<ObjectKey>>,
    /// VolumeAttachments that exist, by what they attach (so by node first).
    attached: BTreeMap<Attachment, String>,
    detaching: BTreeMap<Attachment, Instant>,
    dirty: BTreeSet<Attachment>,
}

/// Runs the volume controllers until aborted.
pub async fn run(store: Arc<Store>, detach_after: Duration) {
    let mut changes = store.subscribe();
    let mut claims = Informer::new("", "persistentvolumeclaims");
    let mut nodes = Informer::new("", "nodes");
    let mut attachments = Informer::new("storage.k8s.io", "volumeattachments");
    let mut pods = Informer::new("", "pods");
    let mut volumes = Volumes::default();
    loop {
        for change in nodes.changes(&store) {
            volumes.observe_node(change.kind, &change.object);
        }
        for change in attachments.changes(&store) {
            volumes.observe_attachment(change.kind, &change.object);
        }
        for change in claims.changes(&store) {
            volumes.observe_claim(change.kind, &change.object);
        }
        for change in pods.changes(&store) {
            volumes.observe_pod(&store, change.kind, &change.object);
        }
        volumes.reconcile(&store, detach_after);
        let deadline = volumes.detaching.values().min().copied();
        if !wait(&mut changes, deadline).await {
            return;
        }
    }
}

/// The claims a pod's volumes name.
pub(super) fn claim_names(pod: &Value) -> impl Iterator<Item = &str> {
    pod.at("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.at("/persistentVolumeClaim/claimName")?.as_str())
}

impl Volumes {
    fn observe_node(&mut self, kind: EventKind, node: &Value) {
        let name = ObjectKey::of(node).name;
        if kind == EventKind::Deleted {
            self.nodes.remove(&name);
            let on_node = self
                .attached
                .range((name.clone(), String::new())..)
                .take_while(|((node, _), _)| *node == name)
                .map(|(attachment, _)| attachment.clone());
            self.dirty.extend(on_node.collect::<Vec<_>>());
        } else {
            let zone = labels(node).remove(ZONE).unwrap_or_default();
            self.nodes.insert(name, zone);
        }
    }

    fn observe_attachment(&mut self, kind: EventKind, attachment: &Value) {
        let node = text(attachment, "/spec/nodeName").to_owned();
        let volume = text(attachment, "/spec/source/persistentVolumeName").to_owned();
        let key = (node, volume);
        if kind == EventKind::Deleted {
            self.attached.remove(&key);
        } else {
            self.attached.insert(key.clone(), ObjectKey::of(attachment).name);
        }
        self.dirty.insert(key);
    }

    fn observe_claim(&mut self, kind: EventKind, claim: &Arc<Value>) {
        let key = ObjectKey::of(claim);
        if kind == EventKind::Deleted {
            self.claims.remove(&key);
            return;
        }
        self.claims.insert(key.clone(), claim.clone());
        // Pods that waited for it: their volumes can attach now.
        for pod in self.waiting.remove(&key).unwrap_or_default() {
            if let Some((pod, _)) = self.pods.get(&pod).cloned() {
                self.track(pod);
            }
        }
    }

    fn observe_pod(&mut self, store: &Store, kind: EventKind, pod: &Arc<Value>) {
        if claim_names(pod).next().is_none() {
            return;
        }
        let key = ObjectKey::of(pod);
        let node = text(pod, "/spec/nodeName");
        let finished = matches!(text(pod, "/status/phase"), "Succeeded" | "Failed");
        if kind == EventKind::Deleted || finished || node.is_empty() {
            // Gone, done, or not bound yet (its claims bind once it is).
            self.forget(&key);
            return;
        }
        for name in claim_names(pod) {
            let claim = ObjectKey::new(&key.namespace, name);
            self.provision(store, &claim, node);
        }
        self.track(pod.clone());
    }

    /// Binds `claim` to a volume provisioned for it in `node`'s zone, unless it has one.
    fn provision(&mut self, store: &Store, claim: &ObjectKey, node: &str) {
        let Some(object) = self.claims.get(claim) else {
            return;
        };
        if object.at("/spec/volumeName").is_some() {
            return;
        }
        let volume = format!("pvc-{}", text(object, "/metadata/uid"));
        let mut pv = json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume, "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}},
            "spec": {
                "capacity": {"storage": object.at("/spec/resources/requests/storage").cloned().unwrap_or(json!("1Gi"))},
                "accessModes": object.at("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": object.at("/spec/storageClassName").cloned().unwrap_or(json!("")),
                "csi": {"driver": DRIVER, "volumeHandle": format!("vol-{}", text(object, "/metadata/uid"))},
                "claimRef": {
                    "kind": "PersistentVolumeClaim", "namespace": claim.namespace,
                    "name": claim.name, "uid": object["metadata"]["uid"],
                },
            },
        });
        if let Some(zone) = self.nodes.get(node).filter(|zone| !zone.is_empty()) {
            pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}]}});
        }
        let volumes = GroupResource::new("", "persistentvolumes");
        if let Err(error) = store.create(&volumes, "", pv, false) {
            tracing::debug!(%error, volume, "kubesim volumes: cannot provision");
            return;
        }
        let _ = store.modify(
            &volumes,
            &ObjectKey::new("", &volume),
            Part::Status,
            false,
            |current| {
                let mut next = current.clone();
                next["status"]["phase"] = json!("Bound");
                Ok(next)
            },
        );
        let bound = store.modify(
            &GroupResource::new("", "persistentvolumeclaims"),
            claim,
            Part::Whole,
            false,
            |current| {
                let mut next = current.clone();
                next["spec"]["volumeName"] = json!(volume);
                next["status"]["phase"] = json!("Bound");
                Ok(next)
            },
        );
        match bound {
            Ok(bound) => {
                self.claims.insert(claim.clone(), bound);
            }
            Err(error) => tracing::debug!(%error, claim = %claim.name, "kubesim volumes: cannot bind"),
        }
    }

    /// Records the attachments a bound pod needs; claims not bound yet make it wait for them.
    fn track(&mut self, pod: Arc<Value>) {
        let key = ObjectKey::of(&pod);
        let node = text(&pod, "/spec/nodeName").to_owned();
        let mut uses = Vec::new();
        for name in claim_names(&pod) {
            let claim = ObjectKey::new(&key.namespace, name);
            let volume = self
                .claims
                .get(&claim)
                .and_then(|c| c.at("/spec/volumeName")?.as_str().map(str::to_owned));
            match volume {
                Some(volume) => uses.push((node.clone(), volume)),
                None => {
                    self.waiting.entry(claim).or_default().insert(key.clone());
                }
            }
        }
        self.release(&key);
        for attachment in &uses {
            self.users
                .entry(attachment.clone())
                .or_default()
                .insert(key.clone());
            self.dirty.insert(attachment.clone());
        }
        self.pods.insert(key, (pod, uses));
    }

    /// Forgets a pod that no longer uses its claims, and what it waited for.
    fn forget(&mut self, pod: &ObjectKey) {
        if let Some((object, _)) = self.pods.get(pod) {
            for name in claim_names(object) {
                let claim = ObjectKey::new(&pod.namespace, name);
                if let Some(waiting) = self.waiting.get_mut(&claim) {
                    waiting.remove(pod);
                }
            }
        }
        self.release(pod);
    }

    /// Drops a pod's uses of its attachments.
    fn release(&mut self, pod: &ObjectKey) {
        let Some((_, uses)) = self.pods.remove(pod) else {
            return;
        };
        for attachment in uses {
            if let Some(users) = self.users.get_mut(&attachment) {
                users.remove(pod);
                if users.is_empty() {
                    self.users.remove(&attachment);
                }
            }
            self.dirty.insert(attachment);
        }
    }

    fn reconcile(&mut self, store: &Store, detach_after: Duration) {
        let resource = GroupResource::new("storage.k8s.io", "volumeattachments");
        let now = Instant::now();
        let due: Vec<Attachment> = self
            .detaching
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(a, _)| a.clone())
            .collect();
        self.dirty.extend(due);
        while let Some(attachment) = self.dirty.pop_first() {
            let used = self.users.contains_key(&attachment);
            let node_gone = !self.nodes.contains_key(&attachment.0);
            match (used && !node_gone, self.attached.get(&attachment)) {
                (true, None) => {
                    self.detaching.remove(&attachment);
                    let (node, volume) = &attachment;
                    let name = format!("csi-{volume}-{node}");
                    let object = json!({
                        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                        "metadata": {"name": name},
                        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": volume}},
                    });
                    if store.create(&resource, "", object, false).is_ok() {
                        let _ =
                            store.modify(&resource, &ObjectKey::new("", &name), Part::Status, false, |c| {
                                let mut next = c.clone();
                                next["status"]["attached"] = json!(true);
                                Ok(next)
                            });
                        self.attached.insert(attachment, name);
                    }
                }
                (true, Some(_)) => {
                    self.detaching.remove(&attachment);
                }
                (false, Some(name)) => {
                    // A node that is gone takes its attachments with it, even mid-detach.
                    let at = if node_gone {
                        now
                    } else {
                        *self
                            .detaching
                            .entry(attachment.clone())
                            .or_insert(now + detach_after)
                    };
                    if at <= now {
                        let key = ObjectKey::new("", name);
                        if store.delete(&resource, &key, &DeleteOptions::default()).is_ok() {
                            self.attached.remove(&attachment);
                            self.detaching.remove(&attachment);
                        }
                    }
                }
                (false, None) => {
                    self.detaching.remove(&attachment);
                }
            }
        }
    }
}

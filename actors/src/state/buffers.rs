//! What CapacityBuffers ask for, as the provisioner and disruption read it: each ready buffer's
//! virtual pods (written by [`crate::capacity_buffers`]), and the existing nodes the last
//! provisioning pass put some of them on (written by the provisioner).
//!
//! A virtual pod is a pod object that exists only here: named `capacity-buffer-<buffer>-<i>`,
//! with the template's labels (so affinity and topology spread see it) and spec, minus any volume
//! claim and node name. Provisioning places them after every real pod, so they never take room a
//! pending pod needs in the same pass; the nodes holding them are not disrupted, and their room
//! stays taken in consolidation's simulation ([`Buffers::held_on`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, PoisonError, RwLock},
};

use joist_messages::cached_pod::CachedPod;
use joist_scheduling::pod::PodInfo;

/// A buffer, by namespace and name.
pub type BufferKey = (String, String);

/// Where the last provisioning pass put a buffer's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    /// Every one on a node there is (in flight included).
    Fits,
    /// Some on a new node, or nowhere.
    NeedsNodes,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Buffers {
    /// Each ready buffer's virtual pods.
    pods: RwLock<BTreeMap<BufferKey, Vec<Arc<CachedPod>>>>,
    /// Node (or in-flight NodeClaim) name → the virtual pods the last pass placed there.
    held: RwLock<HashMap<String, Vec<Arc<PodInfo>>>>,
    /// Each buffer's outcome in the last pass.
    provisioned: RwLock<BTreeMap<BufferKey, Provisioned>>,
}

impl Buffers {
    /// Sets every ready buffer's virtual pods (the buffers not named hold none).
    pub fn set_pods(&self, pods: BTreeMap<BufferKey, Vec<Arc<CachedPod>>>) {
        *self.pods.write().unwrap_or_else(PoisonError::into_inner) = pods;
    }

    /// Each ready buffer's virtual pods.
    pub fn pods_by_buffer(&self) -> BTreeMap<BufferKey, Vec<Arc<CachedPod>>> {
        self.pods.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every virtual pod, with the buffer it stands for.
    pub fn pods(&self) -> Vec<(BufferKey, Arc<CachedPod>)> {
        let pods = self.pods.read().unwrap_or_else(PoisonError::into_inner);
        pods.iter()
            .flat_map(|(key, pods)| pods.iter().map(move |pod| (key.clone(), pod.clone())))
            .collect()
    }

    /// Records where the last provisioning pass put virtual pods on existing nodes, and each
    /// buffer's outcome (replacing the previous pass's answer).
    pub fn placed(
        &self,
        held: HashMap<String, Vec<Arc<PodInfo>>>,
        provisioned: BTreeMap<BufferKey, Provisioned>,
    ) {
        *self.held.write().unwrap_or_else(PoisonError::into_inner) = held;
        *self.provisioned.write().unwrap_or_else(PoisonError::into_inner) = provisioned;
    }

    /// Each buffer's outcome in the last pass.
    pub fn provisioned(&self) -> BTreeMap<BufferKey, Provisioned> {
        self.provisioned
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the node (or in-flight NodeClaim) `name` holds virtual pods.
    pub fn holds(&self, name: &str) -> bool {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(name)
    }

    /// The virtual pods on the node (or in-flight NodeClaim) `name`.
    pub fn held_on(&self, name: &str) -> Vec<Arc<PodInfo>> {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

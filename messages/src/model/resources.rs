//! Resource lists: amounts per resource name, with the arithmetic scheduling needs.
//!
//! [`Resources`] keeps its entries sorted by name in a small vector, so adding, subtracting and
//! comparing two lists is one merge pass with no hashing, and an empty list does not allocate.
//! Absent names count as zero. `fits` is the question the scheduler asks ("do these requests fit in
//! that allocatable?"): every requested amount must be at most what is available, and a request for
//! a resource the other side does not list fits only when it is zero.

use std::{collections::BTreeMap, fmt};

use super::quantity::Quantity;

/// Whether pod-level resources may set `name`: CPU, memory and huge pages, as in Kubernetes 1.34.
fn is_pod_level(name: &str) -> bool {
    name == names::CPU || name == names::MEMORY || name.starts_with("hugepages-")
}

/// Well-known resource names.
pub mod names {
    /// CPU, in cores (milli-cores in [`super::Quantity::millis`]).
    pub const CPU: &str = "cpu";
    /// Memory, in bytes.
    pub const MEMORY: &str = "memory";
    /// Local ephemeral storage, in bytes.
    pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
    /// Pod slots.
    pub const PODS: &str = "pods";
    /// NVIDIA GPUs.
    pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
    /// EFA interfaces (the EFA device plugin's resource).
    pub const EFA: &str = "vpc.amazonaws.com/efa";
    /// The NodePool limit on the number of nodes.
    pub const NODES: &str = "nodes";
}

/// Amounts per resource name (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    entries: Vec<(String, Quantity)>,
}

impl Resources {
    /// An empty list.
    pub const fn new() -> Self {
        Resources { entries: Vec::new() }
    }

    /// The amount of `name`, zero when absent.
    pub fn get(&self, name: &str) -> Quantity {
        match self.entries.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.entries[i].1,
            Err(_) => Quantity::ZERO,
        }
    }

    /// Sets the amount of `name`; a zero amount removes the entry.
    pub fn set(&mut self, name: &str, amount: Quantity) {
        match self.entries.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) if amount.is_zero() => {
                self.entries.remove(i);
            }
            Ok(i) => self.entries[i].1 = amount,
            Err(_) if amount.is_zero() => {}
            Err(i) => self.entries.insert(i, (name.to_string(), amount)),
        }
    }

    /// Builder form of [`Resources::set`].
    #[must_use]
    pub fn with(mut self, name: &str, amount: Quantity) -> Self {
        self.set(name, amount);
        self
    }

    /// The entries, sorted by name, zero amounts omitted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Quantity)> {
        self.entries.iter().map(|(n, q)| (n.as_str(), *q))
    }

    /// True when every amount is zero.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds `other` to `self`, name by name.
    pub fn add(&mut self, other: &Resources) {
        self.merge(other, Quantity::saturating_add);
    }

    /// Subtracts `other` from `self`, name by name (results may go negative).
    pub fn sub(&mut self, other: &Resources) {
        self.merge(other, Quantity::saturating_sub);
    }

    /// The larger amount per name (used for init containers and for "the largest candidate").
    pub fn max(&mut self, other: &Resources) {
        self.merge(other, Ord::max);
    }

    /// A pod's requests from its containers', as kube-scheduler adds them up: the `app`
    /// containers and the sidecars (`init` containers flagged true, `restartPolicy: Always`)
    /// together, or more when an init container's start needs more beside the sidecars started
    /// before it. Init containers come in their order.
    pub fn of_containers(
        app: impl IntoIterator<Item = Resources>,
        init: impl IntoIterator<Item = (Resources, bool)>,
    ) -> Resources {
        let mut total = Resources::new();
        for requests in app {
            total.add(&requests);
        }
        let mut sidecars = Resources::new();
        let mut init_peak = Resources::new();
        for (requests, sidecar) in init {
            if sidecar {
                sidecars.add(&requests);
                init_peak.max(&sidecars);
            } else {
                let mut running = sidecars.clone();
                running.add(&requests);
                init_peak.max(&running);
            }
        }
        total.add(&sidecars);
        total.max(&init_peak);
        total
    }

    /// Applies pod-level resources (`spec.resources`, Kubernetes' PodLevelResources, on by default
    /// since 1.34) to `self`, the requests aggregated from the pod's containers, as kube-scheduler
    /// and Karpenter count them: a pod-level request of CPU, memory or huge pages replaces the
    /// containers' total, and a pod-level limit stands for a request that neither the pod nor any
    /// container makes (the API server's defaulting). Other resources stay the containers'.
    pub fn apply_pod_level(&mut self, requests: &Resources, limits: &Resources) {
        for (name, limit) in limits.iter() {
            if is_pod_level(name) && requests.get(name).is_zero() && self.get(name).is_zero() {
                self.set(name, limit);
            }
        }
        for (name, request) in requests.iter() {
            if is_pod_level(name) {
                self.set(name, request);
            }
        }
    }

    fn merge(&mut self, other: &Resources, op: impl Fn(Quantity, Quantity) -> Quantity) {
        for (name, amount) in other.iter() {
            let merged = op(self.get(name), amount);
            self.set(name, merged);
        }
    }

    /// True when every amount in `self` is at most the same amount in `available`.
    pub fn fits(&self, available: &Resources) -> bool {
        self.iter().all(|(name, amount)| amount <= available.get(name))
    }

    /// The names whose amount in `self` exceeds `available`, with both amounts.
    pub fn exceeding<'a>(
        &'a self,
        available: &'a Resources,
    ) -> impl Iterator<Item = (&'a str, Quantity, Quantity)> + 'a {
        self.iter().filter_map(|(name, amount)| {
            let limit = available.get(name);
            (amount > limit).then_some((name, amount, limit))
        })
    }
}

impl FromIterator<(String, Quantity)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Quantity)>>(iter: I) -> Self {
        let mut out = Resources::new();
        for (name, amount) in iter {
            let total = out.get(&name).saturating_add(amount);
            out.set(&name, total);
        }
        out
    }
}

impl From<&BTreeMap<String, Quantity>> for Resources {
    fn from(map: &BTreeMap<String, Quantity>) -> Self {
        map.iter().map(|(n, q)| (n.clone(), *q)).collect()
    }
}

impl serde::Serialize for Resources {
    /// As a map of name to quantity string, like a Kubernetes `ResourceList`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Resources {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Quantity>::deserialize(d)?;
        Ok(Resources::from(&map))
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, amount)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}: {amount}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::{names::*, *};

    fn res(pairs: &[(&str, &str)]) -> Resources {
        pairs
            .iter()
            .map(|(n, q)| (n.to_string(), q.parse().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn add_sub_and_absent_names_are_zero() {
        let mut a = res(&[(CPU, "1"), (MEMORY, "1Gi")]);
        a.add(&res(&[(CPU, "500m"), (PODS, "1")]));
        assert_eq!(a.get(CPU), Quantity::from_millis(1500));
        assert_eq!(a.get(PODS), Quantity::from_units(1));
        a.sub(&res(&[(PODS, "1")]));
        assert_eq!(a.get(PODS), Quantity::ZERO);
        assert_eq!(a.iter().count(), 2, "a zero amount leaves the list");
        assert_eq!(a.get(NVIDIA_GPU), Quantity::ZERO);
    }

    #[test]
    fn fits_requires_every_requested_amount() {
        let node = res(&[(CPU, "2"), (MEMORY, "4Gi"), (PODS, "29")]);
        assert!(res(&[(CPU, "2"), (MEMORY, "4Gi")]).fits(&node));
        assert!(!res(&[(CPU, "2001m")]).fits(&node));
        assert!(
            !res(&[(NVIDIA_GPU, "1")]).fits(&node),
            "a resource the node lacks does not fit"
        );
        assert!(Resources::new().fits(&node));
        let big = res(&[(CPU, "3"), (MEMORY, "1Gi")]);
        let over: Vec<_> = big.exceeding(&node).map(|(n, ..)| n).collect();
        assert_eq!(over, vec![CPU]);
    }

    #[test]
    fn max_takes_the_larger_amount_per_name() {
        let mut a = res(&[(CPU, "1"), (MEMORY, "4Gi")]);
        a.max(&res(&[(CPU, "2"), (MEMORY, "1Gi")]));
        assert_eq!(a, res(&[(CPU, "2"), (MEMORY, "4Gi")]));
    }
}

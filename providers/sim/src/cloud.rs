//! The simulated cloud's state: instances with their lifetimes and prices, the faults in force
//! ([`crate::faults`]), and the ledger `joist simulate` reports from.
//!
//! Instances boot for [`SimSettings::boot`] and then register as Nodes through the Kubernetes API
//! ([`crate::node`]); terminating one removes its Node, as the cloud controller manager does. The
//! state sits behind one mutex, held only for bookkeeping (never across an await).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use joist_messages::model::shape::CapacitySettings;
use joist_provider::{
    CloudError, Instance, InstanceState, OfferingKey,
    instance_status::{InstanceHealth, StatusCheck},
    provider_id::instance_id,
};

use crate::faults::{BootFault, CallLog, Failure, Faults, OfferingPattern, Operation, Reply};
use serde::Serialize;
use tokio::{task::JoinHandle, time::Instant};

/// How long a spot instance runs after its interruption warning.
pub const INTERRUPTION_NOTICE: Duration = Duration::from_secs(120);

/// How the simulated cloud behaves.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// The region (`us-west-2`).
    pub region: String,
    /// The zones it sells in (all of the region's when empty).
    pub zones: Vec<String>,
    /// From launch to the Node registering.
    pub boot: Duration,
    /// The cluster's name, tagged on instances.
    pub cluster_name: String,
    /// Node capacity settings.
    pub capacity: CapacitySettings,
    /// The Unix time at which the simulation starts.
    pub epoch_seconds: i64,
    /// Seed of instance ids.
    pub seed: u64,
    /// The second octet of the private addresses the Node names are drawn from (`ip-10-N-…`), so
    /// that the clouds of several controllers on one cluster do not name two nodes alike.
    pub network: u8,
}

/// Why an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndReason {
    /// Joist (or anyone) terminated it.
    Terminated,
    /// The cloud reclaimed a spot instance, or it was terminated after its interruption warning.
    SpotInterruption,
}

/// An instance's life, for reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceRecord {
    /// The instance.
    pub instance: Instance,
    /// The Node name it registers as.
    pub node_name: String,
    /// Seconds after the start of the simulation it launched.
    pub launched: f64,
    /// Seconds after the start it ended, if it has.
    pub ended: Option<f64>,
    /// Why it ended.
    pub end_reason: Option<EndReason>,
}

/// What the cloud did, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CloudEvent {
    /// An instance was launched.
    Launched {
        /// Its id.
        instance: String,
        /// Its offering.
        offering: OfferingKey,
        /// Dollars per hour.
        price: f64,
    },
    /// A launch found an offering out of capacity.
    InsufficientCapacity {
        /// The offering.
        offering: OfferingKey,
    },
    /// A spot instance got its two-minute warning.
    InterruptionWarning {
        /// Its id.
        instance: String,
    },
    /// An instance ended.
    Ended {
        /// Its id.
        instance: String,
        /// Why.
        reason: EndReason,
    },
    /// A status check of an instance started failing, or an event was scheduled for it.
    Impaired {
        /// Its id.
        instance: String,
        /// The check or event (`reachability`, `system-maintenance`).
        check: String,
    },
    /// A new image was released for an AMI family: node classes selecting `family@latest`
    /// resolve to it from their next resolution.
    ImageReleased {
        /// The family (`al2023`).
        family: String,
        /// The new image.
        image: String,
    },
}

/// An instance the cloud tracks.
pub(crate) struct Tracked {
    pub record: InstanceRecord,
    pub labels: BTreeMap<String, String>,
    /// The task that registers its Node, until it is done; ending the instance aborts it.
    pub boot: Option<JoinHandle<()>>,
    /// Whether its Node was created, or it was read back from its Node: on KWOK, where an
    /// instance is its Node, such an instance whose Node is gone was ended by another controller.
    pub registered: bool,
    /// Its failed status checks and scheduled events; empty while it is healthy.
    pub health: Vec<StatusCheck>,
}

#[derive(Default)]
pub(crate) struct State {
    launched: u64,
    pub instances: BTreeMap<String, Tracked>,
    /// Injected faults and the call log.
    pub faults: Faults,
    pub events: Vec<(f64, CloudEvent)>,
}

/// The cloud's books (see the module docs); cheap to clone, every clone shares them.
#[derive(Clone)]
pub struct Books {
    started: Instant,
    seed: u64,
    state: Arc<Mutex<State>>,
}

impl Books {
    /// Empty books whose clock starts now.
    pub fn new(seed: u64) -> Self {
        Self {
            started: Instant::now(),
            seed,
            state: Arc::default(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Seconds since the books were opened.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub(crate) fn record(&self, state: &mut State, event: CloudEvent) {
        state.events.push((self.elapsed(), event));
    }

    /// A fresh instance's key in the books, `key` of an id drawn from the seed (the id itself; on
    /// KWOK, the Node name drawn from it), and the ordinal it was drawn with. An id whose key the
    /// books hold already is drawn again: an instance adopted from a snapshot of a run with the
    /// same seed, or on KWOK another id with the same low 24 bits, which would name the same Node.
    pub(crate) fn next_instance_id(&self, state: &mut State, key: impl Fn(&str) -> String) -> (String, u64) {
        loop {
            state.launched += 1;
            let n = state.launched;
            let mut z = self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^= z >> 31;
            let id = key(&format!("i-0{:016x}", z));
            if !state.instances.contains_key(&id) {
                return (id, n);
            }
        }
    }

    /// Makes the offerings `pattern` covers refuse launches for `duration`.
    pub fn make_unavailable(&self, pattern: OfferingPattern, duration: Duration) {
        self.lock().faults.make_unavailable(pattern, duration);
    }

    /// Makes every call of `operation` fail as `failure` says for `duration`.
    pub fn fail(&self, operation: Operation, failure: Failure, duration: Duration) {
        self.lock().faults.fail(operation, failure, duration);
    }

    /// Makes instances launched in the next `duration` come up broken as `fault` says.
    pub fn break_boots(&self, fault: BootFault, duration: Duration) {
        self.lock().faults.break_boots(fault, duration);
    }

    /// Logs a call of `operation`; refuses it while it is throttled (see [`Faults::call`]).
    pub(crate) fn call(&self, operation: Operation) -> Result<Reply, CloudError> {
        let at = self.elapsed();
        self.lock().faults.call(operation, at)
    }

    /// Every call made so far.
    pub fn calls(&self) -> CallLog {
        self.lock().faults.calls.clone()
    }

    /// Every instance ever launched, in launch order.
    pub fn instances(&self) -> Vec<InstanceRecord> {
        let state = self.lock();
        let mut records: Vec<InstanceRecord> = state.instances.values().map(|t| t.record.clone()).collect();
        records.sort_by(|a, b| {
            a.launched
                .total_cmp(&b.launched)
                .then(a.node_name.cmp(&b.node_name))
        });
        records
    }

    /// What the cloud did, with seconds since the start.
    pub fn events(&self) -> Vec<(f64, CloudEvent)> {
        self.lock().events.clone()
    }

    /// Ends an instance; false when it had already ended or never existed.
    pub(crate) fn end(&self, instance_id: &str, reason: EndReason) -> Option<String> {
        let elapsed = self.elapsed();
        let mut state = self.lock();
        let tracked = state.instances.get_mut(instance_id)?;
        if tracked.record.ended.is_some() {
            return None;
        }
        tracked.record.ended = Some(elapsed);
        tracked.record.end_reason = Some(reason);
        tracked.record.instance.state = InstanceState::Terminated;
        if let Some(boot) = tracked.boot.take() {
            boot.abort();
        }
        let node = tracked.record.node_name.clone();
        let event = CloudEvent::Ended {
            instance: instance_id.to_owned(),
            reason,
        };
        self.record(&mut state, event);
        Some(node)
    }

    /// Forgets the boot of an instance that is done booting (see [`Tracked::boot`]), and
    /// whether its Node was `registered`.
    pub(crate) fn booted(&self, instance_id: &str, registered: bool) {
        if let Some(tracked) = self.lock().instances.get_mut(instance_id) {
            tracked.boot = None;
            tracked.registered = registered;
        }
    }

    /// The running instances whose Node exists, or did (see [`Tracked::registered`]).
    pub(crate) fn registered(&self) -> BTreeSet<String> {
        self.lock()
            .instances
            .iter()
            .filter(|(_, t)| t.registered && t.record.ended.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether the books hold the instance, running or ended.
    pub(crate) fn knows(&self, instance_id: &str) -> bool {
        self.lock().instances.contains_key(instance_id)
    }

    /// Takes a running instance launched elsewhere (another replica, before a restart) into the
    /// books, unless they know it already.
    pub(crate) fn adopt(&self, instance: Instance, node_name: String, labels: BTreeMap<String, String>) {
        let launched = self.elapsed();
        let id = instance_id(&instance.provider_id).to_owned();
        self.lock().instances.entry(id).or_insert_with(|| Tracked {
            record: InstanceRecord {
                instance,
                node_name,
                launched,
                ended: None,
                end_reason: None,
            },
            labels,
            boot: None,
            registered: true,
            health: Vec::new(),
        });
    }

    /// Adds `check` to the status of each of `instances`, as EC2 reports a failing check or a
    /// scheduled event.
    pub(crate) fn impair(&self, instances: &[String], check: &StatusCheck) {
        let mut state = self.lock();
        for id in instances {
            if let Some(tracked) = state.instances.get_mut(id) {
                tracked.health.push(check.clone());
                let event = CloudEvent::Impaired {
                    instance: id.clone(),
                    check: check.name.clone(),
                };
                self.record(&mut state, event);
            }
        }
    }

    /// The running instances with a failed check or a scheduled event, in id order.
    pub(crate) fn impaired(&self) -> Vec<InstanceHealth> {
        self.lock()
            .instances
            .iter()
            .filter(|(_, t)| t.record.ended.is_none() && !t.health.is_empty())
            .map(|(id, t)| InstanceHealth {
                instance_id: id.clone(),
                checks: t.health.clone(),
            })
            .collect()
    }

    /// Whether the instance got an interruption warning.
    pub(crate) fn was_warned(&self, instance_id: &str) -> bool {
        self.lock().events.iter().any(
            |(_, event)| matches!(event, CloudEvent::InterruptionWarning { instance } if instance == instance_id),
        )
    }

    /// Running instances whose node labels include all of `selector`, at most `count`, in id order.
    pub(crate) fn pick(&self, selector: &BTreeMap<String, String>, count: usize) -> Vec<String> {
        let state = self.lock();
        // Instances are keyed by id, so this walks them in id order.
        state
            .instances
            .iter()
            .filter(|(_, t)| {
                t.record.ended.is_none() && selector.iter().all(|(k, v)| t.labels.get(k) == Some(v))
            })
            .map(|(id, _)| id.clone())
            .take(count)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kwok;

    /// Seed 17844 draws ids whose low 24 bits agree at ordinals 10 and 15: on KWOK both would name
    /// the Node `ip-10-…`, and two NodeClaims would get one instance.
    #[test]
    fn on_kwok_an_id_naming_a_node_the_books_hold_is_drawn_again() {
        let books = Books::new(17_844);
        let node = |id: &str| kwok::node_name(id, "us-west-2");
        let mut names = BTreeSet::new();
        for _ in 0..24 {
            let (name, _) = books.next_instance_id(&mut books.lock(), node);
            // Taken into the books as a Node of that name would be read back.
            let labels = serde_json::json!({
                "node.kubernetes.io/instance-type": "c-1x-amd64-linux",
                "topology.kubernetes.io/zone": "test-zone-a",
                "karpenter.sh/capacity-type": "on-demand",
            });
            let read_back: kwok::KwokNode = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": format!("{}{name}", kwok::PROVIDER_PREFIX)},
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            let instance = kwok::launched_elsewhere(&read_back).unwrap_or_else(|| panic!("{name}: not read"));
            books.adopt(instance, name.clone(), BTreeMap::new());
            names.insert(name);
        }
        assert_eq!(names.len(), 24, "every launch names a Node of its own: {names:?}");
    }
}

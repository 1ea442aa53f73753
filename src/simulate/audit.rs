//! What a run left behind that it should not have: instances no NodeClaim accounts for, NodeClaims
//! launched more than once, Nodes still tainted for a disruption no one is carrying out, pods not
//! Running. The fault-injection suite (`joist bench chaos`) reads it after each crash; every list
//! is empty after a clean run that ends quiet.
//!
//! Failure modes: none; it reads the store and the cloud's books.

use std::collections::{BTreeMap, BTreeSet};

use joist_actors::faults::Step;
use joist_kubesim::{Store, resources::GroupResource};
use joist_messages::labels::{tags, taints};
use joist_provider_sim::SimCloud;
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
    /// Nodes still tainted `karpenter.sh/disrupted`.
    pub tainted: Vec<String>,
    /// Pods neither Running nor Succeeded (`namespace/name`).
    pub stranded: Vec<String>,
}

impl Audit {
    /// Reads what `store` and `cloud` hold at the end of a run.
    pub fn of(store: &Store, cloud: &SimCloud, crash: Option<Crash>) -> Self {
        // The store filters as it lists: a large cluster's Running pods are passed over.
        let list = |group: &str, resource: &str, wanted: &dyn Fn(&Value) -> bool| {
            store
                .list(&GroupResource::new(group, resource), None, None, None, wanted)
                .items
        };
        let named: BTreeSet<String> = list("karpenter.sh", "nodeclaims", &|c| {
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
            node["spec"]["taints"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["key"] == taints::DISRUPTED))
        };
        let tainted = list("", "nodes", &disrupted)
            .iter()
            .map(|node| name(node))
            .collect();
        let not_running =
            |pod: &Value| !matches!(pod["status"]["phase"].as_str(), Some("Running" | "Succeeded"));
        let stranded = list("", "pods", &not_running)
            .iter()
            .map(|pod| {
                format!(
                    "{}/{}",
                    pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                    name(pod)
                )
            })
            .collect();
        Self {
            crash,
            leaks,
            duplicates,
            tainted,
            stranded,
        }
    }
}

fn name(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

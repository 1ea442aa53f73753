//! The workloads of Karpenter's performance suite (`test/suites/performance` of its module, v1.14.1),
//! written down as Joist's own: each a list of steps, every step applying Deployments at new
//! replica counts and saying what to wait for. The pods are pause containers with CPU and memory
//! requests only, labelled `testing/cluster: unspecified` as the suite labels them; a Deployment
//! selects every label of its pods.
//!
//! `scale` multiplies every replica count (at least one each), for runs smaller than the suite's.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The label every pod and Deployment of the suite carries, and its value.
pub const TEST_LABEL: (&str, &str) = ("testing/cluster", "unspecified");

/// What a step waits for after applying its Deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Pods added: until every pod is Running.
    ScaleOut,
    /// Pods removed: until every pod is Running and disruption has gone quiet (consolidation).
    ScaleDown,
    /// The NodePool's template changed: until every node that existed before is gone and every
    /// pod is Running.
    Drift,
}

impl Phase {
    /// The phase's name in the benchmark's output.
    pub fn name(self) -> &'static str {
        match self {
            Self::ScaleOut => "scale-out",
            Self::ScaleDown => "consolidation",
            Self::Drift => "drift",
        }
    }
}

/// One step: the Deployments it applies (created, or updated to their replicas) and what it waits
/// for; `pods` is how many pods all Deployments ask for after it.
#[derive(Debug, Clone)]
pub struct Step {
    /// What the step waits for.
    pub phase: Phase,
    /// The Deployments it applies.
    pub apps: Vec<App>,
    /// Pods of every Deployment after the step.
    pub pods: u32,
}

/// A Deployment of the suite.
#[derive(Debug, Clone)]
pub struct App {
    /// Its name, and its pods' `app` label.
    pub name: String,
    /// Replicas.
    pub replicas: u32,
    /// Each pod's CPU request.
    pub cpu: &'static str,
    /// Each pod's memory request.
    pub memory: &'static str,
    /// Its pods' constraints.
    pub traits: Traits,
}

/// The constraints and marks a Deployment's pods may carry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traits {
    /// A topology spread over `kubernetes.io/hostname` (max skew 1, DoNotSchedule).
    pub hostname_spread: bool,
    /// A topology spread over zones (max skew 1, DoNotSchedule).
    pub zone_spread: bool,
    /// Required anti-affinity with its own pods on `kubernetes.io/hostname`.
    pub self_anti_affinity: bool,
    /// The `karpenter.sh/do-not-disrupt` annotation.
    pub do_not_disrupt: bool,
    /// The wide workload's `deployment-index` label.
    pub index: Option<usize>,
}

/// A named workload: its steps in order.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Its name (`--workload NAME`).
    pub name: &'static str,
    /// Its steps.
    pub steps: Vec<Step>,
}

/// The names of every workload, in the order they run.
pub const NAMES: [&str; 6] = [
    "basic",
    "do-not-disrupt",
    "drift",
    "hostname-spreading",
    "interference",
    "wide",
];

/// Every workload at `scale` times the suite's replica counts.
pub fn all(scale: f64) -> Vec<Workload> {
    NAMES.iter().map(|name| workload(name, scale)).collect()
}

/// Builds the steps of one workload, keeping the replica counts of the Deployments applied so far.
struct Builder {
    scale: f64,
    replicas: BTreeMap<String, u32>,
    steps: Vec<Step>,
}

impl Builder {
    fn new(scale: f64) -> Self {
        Self {
            scale,
            replicas: BTreeMap::new(),
            steps: Vec::new(),
        }
    }

    /// An app at the suite's `replicas`, scaled.
    fn app(&self, name: &str, replicas: u32, cpu: &'static str, memory: &'static str, traits: Traits) -> App {
        App {
            name: name.to_owned(),
            replicas: ((f64::from(replicas) * self.scale).round() as u32).max(1),
            cpu,
            memory,
            traits,
        }
    }

    fn step(mut self, phase: Phase, apps: Vec<App>) -> Self {
        for app in &apps {
            self.replicas.insert(app.name.clone(), app.replicas);
        }
        let pods = self.replicas.values().sum();
        self.steps.push(Step { phase, apps, pods });
        self
    }
}

/// Two Deployments of the suite: 900m/3100Mi and 3500m/28Gi pods.
fn small_and_large(b: &Builder, replicas: u32, small: Traits, large: Traits) -> Vec<App> {
    vec![
        b.app("small-resource-app", replicas, "900m", "3100Mi", small),
        b.app("large-resource-app", replicas, "3500m", "28Gi", large),
    ]
}

fn spread() -> Traits {
    Traits {
        hostname_spread: true,
        ..Traits::default()
    }
}

/// The workload `name` (one of [`NAMES`]) at `scale`.
fn workload(name: &'static str, scale: f64) -> Workload {
    let b = Builder::new(scale);
    let none = Traits::default();
    let b = match name {
        "basic" => {
            let out = small_and_large(&b, 500, none, none);
            let down = small_and_large(&b, 350, none, none);
            b.step(Phase::ScaleOut, out).step(Phase::ScaleDown, down)
        }
        "do-not-disrupt" => {
            let mut out = small_and_large(&b, 500, spread(), none);
            let dnd = Traits {
                do_not_disrupt: true,
                ..none
            };
            out.push(b.app("do-not-disrupt-app", 100, "900m", "450Mi", dnd));
            let down = small_and_large(&b, 250, spread(), none);
            b.step(Phase::ScaleOut, out).step(Phase::ScaleDown, down)
        }
        "drift" => {
            let out = vec![
                b.app("hostname-spread-app", 300, "900m", "3100Mi", spread()),
                b.app("standard-app", 300, "3500m", "28Gi", none),
            ];
            b.step(Phase::ScaleOut, out).step(Phase::Drift, Vec::new())
        }
        "hostname-spreading" => {
            let out = small_and_large(&b, 500, spread(), none);
            let down = small_and_large(&b, 350, spread(), none);
            b.step(Phase::ScaleOut, out).step(Phase::ScaleDown, down)
        }
        "interference" => {
            let alone = Traits {
                self_anti_affinity: true,
                ..none
            };
            let first = vec![b.app("small-resource-app", 500, "900m", "3100Mi", alone)];
            let second = vec![
                b.app("small-resource-app", 250, "900m", "3100Mi", alone),
                b.app("large-resource-app", 500, "3500m", "28Gi", alone),
            ];
            let third = vec![
                b.app("small-resource-app", 400, "900m", "3100Mi", alone),
                b.app("large-resource-app", 200, "3500m", "28Gi", alone),
            ];
            b.step(Phase::ScaleOut, first)
                .step(Phase::ScaleOut, second)
                .step(Phase::ScaleDown, third)
        }
        _ => {
            let out = wide(&b, [35, 30]);
            let down = wide(&b, [25, 20]);
            b.step(Phase::ScaleOut, out).step(Phase::ScaleDown, down)
        }
    };
    Workload { name, steps: b.steps }
}

/// The wide workload's requests, Deployment by Deployment.
const WIDE: [(&str, &str); 30] = [
    ("240m", "300Mi"),
    ("450m", "400Mi"),
    ("650m", "700Mi"),
    ("900m", "1Gi"),
    ("1400m", "2Gi"),
    ("1900m", "4Gi"),
    ("2400m", "8Gi"),
    ("2800m", "4Gi"),
    ("3300m", "16Gi"),
    ("3700m", "10Gi"),
    ("2300m", "64Gi"),
    ("900m", "30Gi"),
    ("1300m", "32Gi"),
    ("2800m", "32Gi"),
    ("1800m", "30Gi"),
    ("1850m", "20Gi"),
    ("3300m", "30Gi"),
    ("3800m", "300Mi"),
    ("225m", "500Mi"),
    ("450m", "750Mi"),
    ("700m", "1Gi"),
    ("900m", "2Gi"),
    ("1300m", "4Gi"),
    ("1800m", "8Gi"),
    ("2400m", "16Gi"),
    ("2800m", "32Gi"),
    ("3400m", "28Gi"),
    ("3800m", "64Gi"),
    ("3300m", "13Gi"),
    ("2800m", "24Gi"),
];

/// The 30 wide Deployments: the first 20 at `replicas[0]`, the rest at `replicas[1]`; all spread
/// over zones, 1–3 alone on their nodes, 4–6 spread over nodes.
fn wide(b: &Builder, replicas: [u32; 2]) -> Vec<App> {
    WIDE.iter()
        .enumerate()
        .map(|(i, (cpu, memory))| {
            let index = i + 1;
            let traits = Traits {
                zone_spread: true,
                self_anti_affinity: index <= 3,
                hostname_spread: (4..=6).contains(&index),
                index: Some(index),
                ..Traits::default()
            };
            let count = if index <= 20 { replicas[0] } else { replicas[1] };
            b.app(&format!("wide-deployment-{index}"), count, cpu, memory, traits)
        })
        .collect()
}

impl App {
    /// The Deployment, as the suite builds it.
    pub fn manifest(&self) -> Value {
        let mut labels = json!({"app": self.name, TEST_LABEL.0: TEST_LABEL.1});
        let t = self.traits;
        if let Some(index) = t.index {
            labels["deployment-index"] = json!(index.to_string());
            if t.self_anti_affinity {
                labels["has-anti-affinity"] = json!("true");
            }
            if t.hostname_spread {
                labels["has-hostname-spread"] = json!("true");
            }
        }
        let own = json!({"matchLabels": labels});
        let app = json!({"matchLabels": {"app": self.name}});
        let spread = |key: &str, selector: &Value| {
            json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                   "labelSelector": selector})
        };
        let mut spec = json!({
            "containers": [{
                "name": "pause",
                "image": "public.ecr.aws/eks-distro/kubernetes/pause:3.2",
                "resources": {"requests": {"cpu": self.cpu, "memory": self.memory}},
            }],
        });
        let mut constraints = Vec::new();
        if t.zone_spread {
            constraints.push(spread("topology.kubernetes.io/zone", &app));
        }
        if t.hostname_spread {
            let selector = if t.index.is_some() { &app } else { &own };
            constraints.push(spread("kubernetes.io/hostname", selector));
        }
        if !constraints.is_empty() {
            spec["topologySpreadConstraints"] = json!(constraints);
        }
        if t.self_anti_affinity {
            spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": own}
            ]}});
        }
        let mut metadata = json!({"labels": labels});
        if t.do_not_disrupt {
            metadata["annotations"] = json!({"karpenter.sh/do-not-disrupt": "true"});
        }
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": "default", "labels": {TEST_LABEL.0: TEST_LABEL.1}},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": metadata, "spec": spec},
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_counts_the_pods_of_every_deployment_after_each_step() {
        let workloads = all(1.0);
        let pods = |name: &str| -> Vec<u32> {
            let w = workloads.iter().find(|w| w.name == name).expect("workload");
            w.steps.iter().map(|s| s.pods).collect()
        };
        assert_eq!(pods("basic"), [1000, 700]);
        assert_eq!(pods("do-not-disrupt"), [1100, 600]);
        assert_eq!(pods("drift"), [600, 600]);
        assert_eq!(pods("hostname-spreading"), [1000, 700]);
        assert_eq!(pods("interference"), [500, 750, 600]);
        assert_eq!(pods("wide"), [1000, 700]);
        let tenth: Vec<u32> = workload("basic", 0.1).steps.iter().map(|s| s.pods).collect();
        assert_eq!(tenth, [100, 70]);
    }

    #[test]
    fn a_deployment_selects_its_pods_and_carries_its_constraints() {
        let wide = workload("wide", 1.0);
        let first = wide.steps[0].apps[0].manifest();
        let spec = &first["spec"];
        assert_eq!(
            spec["selector"]["matchLabels"],
            spec["template"]["metadata"]["labels"]
        );
        assert_eq!(
            spec["template"]["metadata"]["labels"]["has-anti-affinity"],
            "true"
        );
        let pod = &spec["template"]["spec"];
        assert_eq!(
            pod["topologySpreadConstraints"][0]["topologyKey"],
            "topology.kubernetes.io/zone"
        );
        assert!(pod["affinity"]["podAntiAffinity"].is_object());
        let dnd = workload("do-not-disrupt", 1.0).steps[0].apps[2].manifest();
        assert_eq!(
            dnd["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"],
            "true"
        );
    }
}

//! `joist bench e2e --pods N | --nodes N [--pools P]`: a workload at scale through the whole
//! system (kubesim, the simulated cloud and every Joist controller) on virtual time, as `joist
//! simulate` runs it.
//!
//! The scenario is the getting-started walkthrough grown: `P` NodePools, each with its own
//! Deployment pinned to it by a node selector, all scaled from zero at 30 s and run to 5 minutes of
//! virtual time. With `--pods N` ([`Workload::Pods`]) the Deployments ask for `N` one-CPU pods,
//! packed onto as few nodes as fit; with `--nodes N` ([`Workload::Nodes`]) for `N` pods that each
//! need a node of their own (required hostname anti-affinity), so `N` nodes: the cluster grown in
//! its node count rather than its pod count. It prints one `name value` line per figure: pods Running and pending
//! at the end, nodes, wall time, pods brought to Running per wall second, peak memory (`VmHWM`: the
//! whole simulated world, not Joist alone), kubesim's writes (its last resourceVersion: the work
//! of the run in a figure that does not vary with the machine), and the share of wall time kubesim's own work took
//! (requests, watches, scheduler, kubelets) against the rest: Joist's controllers with their API
//! client, and the much smaller simulated cloud and report recorder.
//!
//! Sharded NodePool actors are not measured here: shards run on arbiters of their own, in real time,
//! which a run on virtual time cannot hold.

use std::{fmt::Write as _, io, process::ExitCode};

use super::{CommandError, bench::peak_memory_mib};
use crate::simulate::{self, Scenario, Simulated};

/// Virtual seconds of the run, and when the Deployments are scaled up.
const UNTIL: &str = "5m";
const SCALE_AT: &str = "30s";

/// What the benchmark's Deployments ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// This many one-CPU pods, packed.
    Pods(usize),
    /// This many pods of one CPU, each on a node of its own.
    Nodes(usize),
}

impl Workload {
    /// The pods in all.
    pub fn pods(self) -> usize {
        match self {
            Self::Pods(pods) | Self::Nodes(pods) => pods,
        }
    }
}

/// Runs the benchmark and prints its figures.
pub fn run(workload: Workload, pools: usize, out: &mut dyn io::Write) -> Result<ExitCode, CommandError> {
    let (simulated, wall) = timed("bench e2e", &scenario(workload, pools))?;
    let summary = &simulated.report.summary;
    let running = summary.pods_running_end;
    let kubesim = simulated.kubesim_busy.as_secs_f64() / wall.max(1e-9);
    let lines = [
        ("pods", running.to_string()),
        ("pending", summary.pods_pending_end.to_string()),
        ("nodes", summary.final_nodes.len().to_string()),
        ("wall", format!("{wall:.1} s")),
        ("pods/s", format!("{:.0}", running as f64 / wall.max(1e-9))),
        (
            "longest pod wait (virtual)",
            format!("{:.0} s", summary.max_pod_pending_seconds),
        ),
        (
            "peak memory",
            peak_memory_mib().map_or_else(|| "unknown".to_owned(), |mib| format!("{mib} MiB")),
        ),
        ("kubesim writes", simulated.kubesim_writes.to_string()),
        ("kubesim share", format!("{:.0}%", kubesim * 100.0)),
        (
            "controllers share",
            format!("{:.0}%", (1.0 - kubesim).max(0.0) * 100.0),
        ),
    ];
    for (name, value) in lines {
        writeln!(out, "{name} {value}").map_err(CommandError::stdout)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the scenario `text` on virtual time for the benchmark `command`: what came of it, and the
/// wall seconds it took (freeing the simulated world not included: the command ends there). A
/// scenario that does not parse or run is the command's error.
pub(super) fn timed(command: &str, text: &str) -> Result<(Simulated, f64), CommandError> {
    let failed = |message: String| CommandError::Simulate {
        path: command.into(),
        message,
    };
    let scenario = Scenario::parse(text).map_err(|e| failed(e.to_string()))?;
    let start = super::bench::WallInstant::now();
    let mut simulated = simulate::run(&scenario, scenario.seed, Default::default(), None)
        .map_err(|e| failed(e.to_string()))?;
    simulated.leave_world();
    Ok((simulated, start.elapsed().as_secs_f64()))
}

/// The scenario: see the module docs.
pub fn scenario(workload: Workload, pools: usize) -> String {
    let pools = pools.max(1);
    let mut manifests = String::new();
    let mut steps = String::new();
    for pool in 0..pools {
        let name = pool_name(pools, pool);
        let replicas = share(workload.pods(), pools, pool);
        manifests.push_str(&indent(&pool_manifests(&name, workload)));
        let _ = write!(
            steps,
            "    - at: {SCALE_AT}\n      scale: {{kind: Deployment, namespace: default, name: inflate-{name}, replicas: {replicas}}}\n"
        );
    }
    format!(
        "kind: Scenario\nmetadata:\n  name: bench-e2e\nspec:\n  seed: 42\n  cloud:\n    region: us-west-2\n    \
         zones: [us-west-2a, us-west-2b, us-west-2c]\n    bootSeconds: 40\n  settings:\n    batchIdleDuration: 1s\n    \
         batchMaxDuration: 10s\n  manifests: |\n{}{manifests}  steps:\n{steps}  until: {UNTIL}\n",
        indent(NODE_CLASS)
    )
}

/// The name of pool `pool` of `pools`: `default` when it is the only one.
pub(super) fn pool_name(pools: usize, pool: usize) -> String {
    if pools == 1 {
        "default".to_owned()
    } else {
        format!("pool-{pool}")
    }
}

/// The pods pool `pool` of `pools` gets out of `pods`: an equal share, the first ones one more.
pub(super) fn share(pods: usize, pools: usize, pool: usize) -> usize {
    pods / pools + usize::from(pool < pods % pools)
}

/// The NodePool `name` and its Deployment for `workload`, scaled to zero.
pub(super) fn pool_manifests(name: &str, workload: Workload) -> String {
    let spread = match workload {
        Workload::Pods(_) => "",
        Workload::Nodes(_) => NODE_OF_ITS_OWN,
    };
    POOL.replace("{spread}", spread).replace("{name}", name)
}

/// A pod template's affinity that puts each pod of the Deployment on a node of its own.
const NODE_OF_ITS_OWN: &str = "
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: kubernetes.io/hostname
              labelSelector:
                matchLabels:
                  app: inflate-{name}";

fn indent(manifests: &str) -> String {
    manifests.lines().fold(String::new(), |mut text, line| {
        let _ = writeln!(text, "    {line}");
        text
    })
}

pub(super) const NODE_CLASS: &str = "\
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata:
  name: default
spec:
  role: KarpenterNodeRole-bench
  amiSelectorTerms:
    - alias: al2023@latest
  subnetSelectorTerms:
    - tags:
        karpenter.sh/discovery: bench
  securityGroupSelectorTerms:
    - tags:
        karpenter.sh/discovery: bench
";

/// One NodePool and the Deployment pinned to it (`{name}` stands for the pool's name).
const POOL: &str = "\
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: {name}
spec:
  template:
    spec:
      requirements:
        - key: kubernetes.io/arch
          operator: In
          values: [amd64]
        - key: karpenter.sh/capacity-type
          operator: In
          values: [on-demand]
        - key: karpenter.k8s.aws/instance-category
          operator: In
          values: [c, m, r]
        - key: karpenter.k8s.aws/instance-generation
          operator: Gt
          values: ['2']
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
      expireAfter: 720h
  limits:
    cpu: 100000000
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 1m
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: inflate-{name}
  namespace: default
spec:
  replicas: 0
  selector:
    matchLabels:
      app: inflate-{name}
  template:
    metadata:
      labels:
        app: inflate-{name}
    spec:
      nodeSelector:
        karpenter.sh/nodepool: {name}{spread}
      terminationGracePeriodSeconds: 0
      containers:
        - name: inflate
          image: public.ecr.aws/eks-distro/kubernetes/pause:3.7
          resources:
            requests:
              cpu: 1
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_splits_the_pods_over_its_pools_and_checks_as_the_api_server_would() {
        let text = scenario(Workload::Pods(10), 3);
        let checked = simulate::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(checked.steps.len(), 3);
        for (pool, replicas) in [("pool-0", 4), ("pool-1", 3), ("pool-2", 3)] {
            assert!(
                text.contains(&format!("name: inflate-{pool}, replicas: {replicas}}}")),
                "{pool} should get {replicas} pods:\n{text}"
            );
        }
        let single = scenario(Workload::Pods(20_000), 1);
        simulate::check(&single).unwrap_or_else(|e| panic!("{e}\n{single}"));
        assert!(single.contains("name: inflate-default, replicas: 20000}"));
        assert!(!single.contains("podAntiAffinity"));
    }

    #[test]
    fn a_small_run_brings_every_pod_up_on_every_pool_and_prints_every_figure() {
        let mut out = Vec::new();
        run(Workload::Pods(30), 2, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8(out).unwrap_or_default();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.split([' ', '%']).next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {text}"))
        };
        assert_eq!(value("pods"), 30.0, "{text}");
        assert_eq!(value("pending"), 0.0, "{text}");
        assert!(value("nodes") >= 2.0, "one node per pool at least: {text}");
        assert!(value("wall") > 0.0 && value("pods/s") > 0.0, "{text}");
        assert!(value("longest pod wait (virtual)") > 0.0, "{text}");
        value("peak memory");
        assert!(
            value("kubesim writes") > 60.0,
            "each pod created and bound: {text}"
        );
        let shares = value("kubesim share") + value("controllers share");
        assert!((99.0..=101.0).contains(&shares), "{text}");
    }

    #[test]
    fn a_run_by_nodes_gives_every_pod_a_node_of_its_own() {
        let mut out = Vec::new();
        run(Workload::Nodes(12), 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8(out).unwrap_or_default();
        assert!(text.lines().any(|l| l == "pods 12"), "{text}");
        assert!(text.lines().any(|l| l == "pending 0"), "{text}");
        assert!(text.lines().any(|l| l == "nodes 12"), "one node per pod: {text}");
    }
}

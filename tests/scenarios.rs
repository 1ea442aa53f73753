//! Scenario tests: whole runs of `joist simulate` (kubesim, the simulated cloud and Joist's actors on
//! virtual time), asserting what a user would check in the report: pods end Running on kubesim's
//! own scheduler, on the cheapest type that fits, within NodePool limits, weights, taints, node
//! affinity and zonal spread; a capacity error falls back to the next offering within one batch
//! cycle; a pod that fits nowhere stays Pending and is told why. Every node's life is one trace,
//! recorded in memory or exported over OTLP by the real binary. And the production binary, `joist
//! run`, against kubesim and moto ([`run`]); `joist sim serve` with Joist running on it ([`serve`]); the
//! Interruption actor under a flood ([`flood`]).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    process::Command,
    sync::{Arc, mpsc},
    time::Duration,
};

use joist::simulate::{
    self, Report, Scenario,
    driver::{EPOCH, paused_system as simulation_system},
    report::Entry,
};
use joist_actors::effects::node_trace::{NodeTracer, ROOT_SPAN};
use opentelemetry::trace::SpanId;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value::Value as OtlpValue,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor, SpanData};
use prost::Message;

#[path = "scenarios/bad_input.rs"]
mod bad_input;
#[path = "scenarios/blockers.rs"]
mod blockers;
#[path = "scenarios/capacity_buffers.rs"]
mod capacity_buffers;
#[path = "scenarios/chaos.rs"]
mod chaos;
#[path = "support/chart.rs"]
mod chart;
#[path = "scenarios/explain.rs"]
mod explain;
#[path = "scenarios/flood.rs"]
mod flood;
#[path = "scenarios/fuzz.rs"]
mod fuzz;
#[path = "scenarios/html.rs"]
mod html;
#[path = "support/joist_process.rs"]
mod joist_process;
#[path = "scenarios/kwok_cloud.rs"]
mod kwok_cloud;
#[path = "support/mutants.rs"]
mod mutants;
#[path = "scenarios/placement_groups.rs"]
mod placement_groups;
#[path = "scenarios/reservations.rs"]
mod reservations;
#[path = "scenarios/run.rs"]
mod run;
#[path = "scenarios/serve.rs"]
mod serve;
#[path = "support/tools.rs"]
mod tools;
#[path = "scenarios/what_if.rs"]
mod what_if;

/// The simulation's paused actix system (virtual time).
fn paused_system() -> actix::SystemRunner {
    simulation_system().unwrap_or_else(|e| panic!("{e}"))
}

/// The simulated cloud of cluster `name` in us-west-2, from [`EPOCH`], its nodes booting in 30 s.
fn sim_settings(name: &str) -> joist_provider_sim::SimSettings {
    joist_provider_sim::SimSettings {
        region: "us-west-2".to_owned(),
        zones: Vec::new(),
        boot: Duration::from_secs(30),
        cluster_name: name.to_owned(),
        capacity: joist_messages::model::shape::CapacitySettings::default(),
        epoch_seconds: EPOCH,
        seed: 1,
        network: 0,
    }
}

/// kubesim with Joist's CRDs, the simulated cloud in us-west-2 and every controller running on
/// it with `settings` (the solver inline), on the current actix system.
fn controllers_on_kubesim(
    name: &str,
    settings: joist_actors::settings::Settings,
) -> (joist_kubesim::Cluster, joist_actors::Controllers) {
    let cluster = joist_kubesim::Cluster::start(joist_kubesim::ClusterSettings {
        clock: joist_messages::time::Clock::starting_at(EPOCH),
        ..Default::default()
    });
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .unwrap_or_else(|e| panic!("{e}"));
    let client = cluster.client();
    let cloud = joist_provider_sim::SimCloud::new(sim_settings(name), client.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let settings = joist_actors::settings::Settings {
        solver: joist_actors::settings::SolverMode::Inline,
        ..settings
    };
    let controllers = joist_actors::start(
        client,
        Arc::new(cloud),
        settings,
        joist_messages::time::Clock::starting_at(EPOCH),
        NodeTracer::disabled(),
    );
    (cluster, controllers)
}

/// An on-demand amd64 NodePool, with extra `requirements` entries and extra `spec` fields.
fn pool(name: &str, requirements: &str, spec: &str) -> String {
    format!(
        "apiVersion: karpenter.sh/v1
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
{requirements}
      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
{spec}
---
"
    )
}

/// A requirement on `karpenter.k8s.aws/instance-family`.
fn family(families: &[&str]) -> String {
    format!(
        "        - key: karpenter.k8s.aws/instance-family\n          operator: In\n          values: [{}]",
        families.join(", ")
    )
}

const NODE_CLASS: &str = "apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata:
  name: default
spec:
  role: KarpenterNodeRole-test
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: test}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: test}}]
---
";

/// Pod-spec lines that keep `app: web` pods on separate nodes.
const APART: &str = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: web}}
              topologyKey: kubernetes.io/hostname";

/// A PodDisruptionBudget that lets no `app: guarded` pod be evicted.
const GUARDED_PDB: &str = "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: guarded, namespace: default}
spec:
  maxUnavailable: 0
  selector: {matchLabels: {app: guarded}}
---
";

/// `pool` with extra fields in its template's spec (`expireAfter: 5m`).
fn with_template_fields(pool: &str, fields: &str) -> String {
    pool.replace("      nodeClassRef:", &format!("{fields}\n      nodeClassRef:"))
}

/// The on-demand c5 NodePool `default`, with extra fields in its template's spec.
fn c5_pool_with(fields: &str) -> String {
    with_template_fields(&pool("default", &family(&["c5"]), ""), fields)
}

/// A WhenEmpty NodePool of `families` that disrupts one node at a time.
fn one_at_a_time(families: &[&str]) -> String {
    pool(
        "default",
        &family(families),
        &disruption("WhenEmpty", "[{nodes: '1'}]"),
    )
}

/// A Deployment of `replicas` pause pods requesting `cpu`, with extra pod-spec lines.
fn deployment(name: &str, replicas: u32, cpu: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
{spec_extra}
      containers:
        - name: pause
          image: pause
          resources: {{requests: {{cpu: \"{cpu}\"}}}}
---
"
    )
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// Four c5 nodes (one `web` pod each, kept apart) scaled down to two pods at 2 min, under the
/// NodePool's `disruption` fields (besides `consolidationPolicy: WhenEmptyOrUnderutilized`): the
/// manifests and the steps.
fn four_apart_scaled_to_two(disruption: &str) -> (String, &'static str) {
    let manifests = pool(
        "default",
        &family(&["c5"]),
        &format!("  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n{disruption}"),
    ) + NODE_CLASS
        + &deployment("web", 4, "1", APART);
    let steps = "[{at: 2m, scale: {kind: Deployment, namespace: default, name: web, replicas: 2}}]";
    (manifests, steps)
}

/// The steps of a scenario that applies `manifests` at `at` (`3m`).
fn applied_at(at: &str, manifests: &str) -> String {
    let body = indent(&indent(&indent(manifests)));
    format!("\n    - at: {at}\n      apply: |\n{body}")
}

/// A scenario applying `manifests` at t=0 with `steps`, run for `until`.
fn scenario(manifests: &str, steps: &str, until: &str) -> Scenario {
    scenario_with("{}", manifests, steps, until)
}

/// `scenario` with controller `settings` (`{featureGates: {nodeRepair: true}}`).
fn scenario_with(settings: &str, manifests: &str, steps: &str, until: &str) -> Scenario {
    let text = format!(
        "kind: Scenario
metadata: {{name: test}}
spec:
  seed: 7
  cloud: {{region: us-west-2, zones: [us-west-2a, us-west-2b, us-west-2c], bootSeconds: 40}}
  settings: {settings}
  manifests: |
{}  steps: {steps}
  until: {until}
",
        indent(manifests)
    );
    Scenario::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn run(scenario: &Scenario) -> Report {
    simulate::run(scenario, scenario.seed, NodeTracer::disabled(), None)
        .unwrap_or_else(|e| panic!("{e}"))
        .report
}

#[test]
fn quickstart_runs_every_pod_and_is_deterministic() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let scenario = Scenario::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    // Just before `inflate` is deleted at 6m: every pod runs, on on-demand nodes of the pool, the
    // first node already consolidated into the second.
    let mut scaled = scenario.clone();
    scaled.steps.retain(|step| step.at < Duration::from_secs(360));
    scaled.until = Duration::from_secs(359);
    let before = run(&scaled);
    let s = &before.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (30, 0), "{s:#?}");
    assert!(!s.final_nodes.is_empty() && s.final_nodes.iter().all(|n| n.nodepool == "default"));
    assert!(
        s.final_nodes.iter().all(|n| n.capacity_type == "on-demand"),
        "the NodePool allows on-demand only: {s:#?}"
    );
    assert_eq!(s.nodes_terminated.get("underutilized"), Some(&1), "{s:#?}");
    // Then the Deployment goes, and so do its nodes.
    let report = run(&scenario);
    let s = &report.summary;
    assert!(s.final_nodes.is_empty(), "{s:#?}");
    assert_eq!(s.nodes_terminated.values().sum::<usize>(), s.nodes_launched);
    let latency = s.max_pending_to_nodeclaim_seconds.unwrap_or(f64::MAX);
    assert!(
        latency <= 1.1,
        "pending pod → NodeClaim took {latency}s (batch idle 1s + 100ms allowed)"
    );
    let again = run(&scenario);
    let json = |r: &Report| serde_json::to_string(r).unwrap_or_default();
    assert_eq!(json(&report), json(&again), "same seed, same report");
    // Reading the cluster for a progress bar changes nothing of the run.
    let mut reported = Vec::new();
    let mut progress = |p: simulate::Progress| reported.push(p.at);
    let watched = simulate::run(
        &scenario,
        scenario.seed,
        NodeTracer::disabled(),
        Some(&mut progress),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .report;
    assert_eq!(
        json(&report),
        json(&watched),
        "the same report with progress shown"
    );
    assert!(reported.len() >= 10, "progress every 30 s: {reported:?}");
}

#[test]
fn a_custom_label_nodepool_launches_one_node_and_runs_its_pods() {
    let team = "        - key: company.com/team\n          operator: In\n          values: [a, b]";
    let selector = "      nodeSelector: {company.com/team: a}";
    let manifests = pool("teams", team, "") + NODE_CLASS + &deployment("team-a", 3, "100m", selector);
    let report = run(&scenario(&manifests, "[]", "11m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
    assert_eq!(s.nodes_launched, 1, "one node serves all three pods: {s:#?}");
}

#[test]
fn a_drained_node_outlives_the_pods_shutting_down_on_it() {
    let slow = "      terminationGracePeriodSeconds: 120";
    let manifests = pool("default", &family(&["c5"]), "")
        + NODE_CLASS
        + &deployment("slow", 1, "1", slow).replace(
            "    metadata: {labels: {app: slow}}",
            "    metadata: {labels: {app: slow}, annotations: {kubesim.joist.dev/shutdown-after: 90s}}",
        );
    // Deleting the NodePool deletes its NodeClaims: the node is drained and terminated.
    let steps = "[{at: 3m, delete: {kind: NodePool, name: default}}]";
    let report = run(&scenario(&manifests, steps, "8m"));
    let first = |event: &str| first_at(&report, event);
    let (terminating, terminated) = (first("pod-terminating"), first("pod-terminated"));
    assert!(
        (89.0..=91.0).contains(&(terminated - terminating)),
        "the pod shuts down for 90 s: {terminating} → {terminated}"
    );
    let ended = first("instance-ended");
    assert!(
        ended >= terminated,
        "the instance ended at {ended}s, before its pod stopped at {terminated}s"
    );
}

/// When the timeline first shows `event`, in seconds.
/// The timeline entries of one kind, in time order.
fn entries<'a>(report: &'a Report, event: &'a str) -> impl Iterator<Item = &'a Entry> {
    report.timeline.iter().filter(move |e| e.event == event)
}

fn first_at(report: &Report, event: &str) -> f64 {
    entries(report, event)
        .next()
        .map(|e| e.at_seconds)
        .unwrap_or_else(|| panic!("no {event} in {:#?}", report.timeline))
}

#[test]
fn a_nodepool_reports_its_nodes_registering_until_its_spec_changes() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 1, "1", "");
    let edited = indent(&indent(&indent(&pool(
        "default",
        &family(&["c5"]),
        "  weight: 10",
    ))));
    let steps = format!(
        "
    - at: 3m
      apply: |
{edited}"
    );
    let report = run(&scenario(&manifests, &steps, "4m"));
    let health: Vec<(f64, &str)> = entries(&report, "nodepool-condition")
        .filter(|e| e.object == "NodePool/default" && e.detail.starts_with("NodeRegistrationHealthy="))
        .map(|e| (e.at_seconds, e.detail.as_str()))
        .collect();
    let registered = first_at(&report, "nodeclaim-registered");
    match health.as_slice() {
        [(healthy_at, "NodeRegistrationHealthy=True"), (reset_at, reset)] => {
            assert!(
                *healthy_at >= registered,
                "healthy before any node registered: {health:?}"
            );
            assert!(*reset_at >= 180.0, "reset before the edit: {health:?}");
            assert!(
                reset.starts_with("NodeRegistrationHealthy=Unknown: "),
                "{health:?}"
            );
        }
        _ => panic!("expected True once the node registered, then Unknown after the edit: {health:?}"),
    }
}

#[test]
fn a_pod_pending_after_a_failed_create_gets_its_node_at_the_next_requeue() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 0, "1", "");
    let steps = "
    - at: 0s
      failCreates: {resource: nodeclaims.karpenter.sh, count: 1}
    - at: 10s
      scale: {kind: Deployment, namespace: default, name: web, replicas: 1}";
    let report = run(&scenario(&manifests, steps, "3m"));
    assert_eq!(report.summary.pods_running_end, 1, "{:#?}", report.summary);
    // The first pass (batch closed at ~11 s) fails to create its claim; nothing changes in the
    // cluster after that, and the 10 s requeue plus one batch window bring the claim.
    let created = first_at(&report, "nodeclaim-created");
    assert!(
        (13.0..=23.0).contains(&created),
        "the claim came at {created}s: not within a requeue of the failure"
    );
}

#[test]
fn a_launch_plan_slower_to_create_than_a_pass_is_not_planned_twice() {
    // Every request of the controller takes 3 s: the 200 claims of the first pass, created 16 at a
    // time, take almost 40 s, while the pods stay pending and are looked at again every 10 s.
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 0, "1", APART);
    let steps = "
    - at: 0s
      failKube: {failure: slow, delay: 3s, for: 4m}
    - at: 10s
      scale: {kind: Deployment, namespace: default, name: web, replicas: 200}";
    let report = run(&scenario(&manifests, steps, "6m"));
    assert_eq!(report.summary.pods_running_end, 200, "{:#?}", report.summary);
    let created = entries(&report, "nodeclaim-created").count();
    assert_eq!(
        created, 200,
        "one claim per pod: none for pods a plan still being created covers"
    );
}

#[test]
fn a_node_class_that_first_fails_to_resolve_recovers_and_nodes_launch() {
    let manifests = pool("default", &family(&["c5"]), "") + &deployment("web", 2, "1", "");
    let class = indent(&indent(&indent(NODE_CLASS)));
    let steps = format!(
        "
    - at: 0s
      failCloud: {{operation: resolveNodeClass, for: 30s}}
    - at: 1s
      apply: |
{class}"
    );
    let report = run(&scenario(&manifests, &steps, "4m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    let created = first_at(&report, "nodeclaim-created");
    assert!(
        (30.0..=75.0).contains(&created),
        "resolution is retried with backoff once the fault clears (30 s): the first claim came at {created}s"
    );
}

/// How many nodes the report says were removed for `reason`.
fn terminated(report: &Report, reason: &str) -> usize {
    report.summary.nodes_terminated.get(reason).copied().unwrap_or(0)
}

/// A NodePool's `disruption` block.
fn disruption(policy: &str, budgets: &str) -> String {
    format!(
        "  disruption:\n    consolidationPolicy: {policy}\n    consolidateAfter: 30s\n    budgets: {budgets}"
    )
}

/// The c5 NodePool `default` under `policy`, every node disruptable at once, and the node class.
fn c5_cluster(policy: &str) -> String {
    pool(
        "default",
        &family(&["c5"]),
        &disruption(policy, "[{nodes: '100%'}]"),
    ) + NODE_CLASS
}

/// A c5 NodePool with `policy` and `budgets`, the node class, and `inflate` with `replicas` 1-CPU pods.
fn c5_inflate(policy: &str, budgets: &str, replicas: u32) -> String {
    pool("default", &family(&["c5"]), &disruption(policy, budgets))
        + NODE_CLASS
        + &deployment("inflate", replicas, "1", "")
}

#[test]
fn nodes_go_once_their_workload_is_deleted() {
    let manifests = c5_inflate("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]", 10);
    let steps = "[{at: 3m, delete: {kind: Deployment, namespace: default, name: inflate}}]";
    let report = run(&scenario(&manifests, steps, "6m"));
    let s = &report.summary;
    assert!(s.nodes_launched >= 1);
    assert!(s.final_nodes.is_empty(), "every empty node goes: {s:#?}");
    assert_eq!(terminated(&report, "empty"), s.nodes_launched, "{s:#?}");
    assert!(
        report
            .timeline
            .iter()
            .any(|e| e.event == "disruption-decided" && e.detail.contains("emptiness")),
        "{:#?}",
        report.timeline
    );
}

#[test]
fn scaling_forty_replicas_down_to_four_ends_on_a_node_sized_for_four() {
    let manifests = c5_inflate("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]", 40);
    let steps = "[{at: 3m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 4}}]";
    let report = run(&scenario(&manifests, steps, "10m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
    assert_eq!(s.final_nodes.len(), 1, "{s:#?}");
    // Four 1-CPU pods (and nothing else) fit a c5.xlarge (4 vCPUs, about 3.9 allocatable)? No:
    // they need a c5.2xlarge, the cheapest c5 with room for four.
    assert_eq!(s.final_nodes[0].instance_type, "c5.2xlarge", "{s:#?}");
    assert!(terminated(&report, "underutilized") >= 1, "{s:#?}");
}

#[test]
fn consolidation_moves_no_pod_onto_a_node_inside_its_consolidate_after() {
    // Karpenter #3006: a node whose pods changed less than consolidateAfter ago is no destination.
    // `a` runs alone on a c5.large; at 6m `b` gets a c5.xlarge with room for `a`'s pod, which may
    // move there only once that node has been still for five minutes.
    let disruption = "  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    \
                      consolidateAfter: 5m\n    budgets: [{nodes: '100%'}]";
    let manifests = pool("default", &family(&["c5"]), disruption)
        + NODE_CLASS
        + &deployment("a", 1, "1", "")
        + &deployment("b", 0, "1", "");
    let steps = "[{at: 6m, scale: {kind: Deployment, namespace: default, name: b, replicas: 2}}]";
    let settling = run(&scenario(&manifests, steps, "11m"));
    assert_eq!(settling.summary.final_nodes.len(), 2, "{:#?}", settling.summary);
    assert_eq!(
        terminated(&settling, "underutilized"),
        0,
        "{:#?}",
        settling.summary
    );
    let settled = run(&scenario(&manifests, steps, "16m"));
    assert_eq!(settled.summary.final_nodes.len(), 1, "{:#?}", settled.summary);
    assert!(
        terminated(&settled, "underutilized") >= 1,
        "{:#?}",
        settled.summary
    );
}

#[test]
fn pod_level_requests_size_the_nodes_and_the_scheduler_honours_them() {
    // Two pods whose containers ask 100m but whose pod-level request is 3 CPUs (PodLevelResources,
    // on by default since Kubernetes 1.34): a c5.large (about 1.9 allocatable) holds neither.
    let manifests = c5_pool_with("")
        + NODE_CLASS
        + &deployment("sized", 2, "100m", "      resources: {requests: {cpu: '3'}}");
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert!(
        s.final_nodes.iter().all(|n| n.instance_type != "c5.large"),
        "{s:#?}"
    );
}

#[test]
fn when_empty_keeps_an_underused_node_and_removes_an_empty_one() {
    let manifests = c5_inflate("WhenEmpty", "[{nodes: '100%'}]", 20);
    let steps = "
    - at: 3m
      scale: {kind: Deployment, namespace: default, name: inflate, replicas: 1}
    - at: 8m
      delete: {kind: Deployment, namespace: default, name: inflate}";
    let scale_only = "[{at: 3m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 1}}]";
    let kept = run(&scenario(&manifests, scale_only, "7m59s"));
    assert_eq!(terminated(&kept, "underutilized"), 0, "{:#?}", kept.summary);
    assert!(!kept.summary.final_nodes.is_empty(), "the underused node stays");
    let emptied = run(&scenario(&manifests, steps, "11m"));
    assert!(emptied.summary.final_nodes.is_empty(), "{:#?}", emptied.summary);
    assert!(terminated(&emptied, "empty") >= 1);
}

#[test]
fn budgets_of_zero_block_every_disruption() {
    let delete = "[{at: 3m, delete: {kind: Deployment, namespace: default, name: inflate}}]";
    for budgets in [
        "[{nodes: '0'}]",
        // Active from midnight for 12 hours: the whole run (it starts 2026-01-01T00:00Z).
        "[{nodes: '100%'}, {nodes: '0', schedule: '0 0 * * *', duration: 12h}]",
    ] {
        let manifests = c5_inflate("WhenEmptyOrUnderutilized", budgets, 4);
        let report = run(&scenario(&manifests, delete, "6m"));
        assert!(
            !report.summary.final_nodes.is_empty(),
            "{budgets}: {:#?}",
            report.summary
        );
        assert_eq!(terminated(&report, "empty"), 0, "{budgets}");
    }
}

#[test]
fn do_not_disrupt_pods_and_a_pdb_without_disruptions_pin_their_node() {
    let pinned = "      annotations: {karpenter.sh/do-not-disrupt: 'true'}";
    let scale_down = "[{at: 3m, scale: {kind: Deployment, namespace: default, name: NAME, replicas: 1}}]";
    for (name, extra, objects) in [("pinned", pinned, ""), ("guarded", "", GUARDED_PDB)] {
        let mut workload = deployment(name, 10, "1", "");
        if !extra.is_empty() {
            workload = workload.replace(
                &format!("    metadata: {{labels: {{app: {name}}}}}"),
                &format!("    metadata:\n      labels: {{app: {name}}}\n{extra}"),
            );
        }
        let manifests = c5_cluster("WhenEmptyOrUnderutilized") + objects + &workload;
        let report = run(&scenario(&manifests, &scale_down.replace("NAME", name), "8m"));
        let s = &report.summary;
        assert_eq!(terminated(&report, "underutilized"), 0, "{name}: {s:#?}");
        assert_eq!(s.pods_running_end, 1, "{name}");
        assert_eq!(s.final_nodes.len(), s.nodes_launched, "{name}: every node stays");
    }
}

#[test]
fn nodes_kept_apart_by_anti_affinity_are_packed_once_the_constraint_goes() {
    let manifests = c5_cluster("WhenEmptyOrUnderutilized") + &deployment("web", 4, "500m", APART);
    // The same Deployment applied again without the constraint (server-side apply removes what
    // the manifest no longer says): its pods roll over to ones that may share nodes.
    let steps = applied_at("3m", &deployment("web", 4, "500m", ""));
    let report = run(&scenario(&manifests, &steps, "12m"));
    let s = &report.summary;
    let apart_nodes = report
        .timeline
        .iter()
        .filter(|e| e.event == "instance-launched" && e.at_seconds < 180.0)
        .count();
    assert_eq!(
        apart_nodes, 4,
        "one node per pod while they must stay apart: {s:#?}"
    );
    assert!(terminated(&report, "underutilized") >= 3, "{s:#?}");
    assert_eq!(s.pods_running_end, 4);
    assert!(
        s.final_nodes.len() <= 2,
        "four half-used nodes are packed: {s:#?}"
    );
    assert!(s.cost_per_hour_end < 4.0 * 0.085, "{s:#?}");
}

#[test]
fn pods_planned_for_a_launching_node_keep_it_when_a_larger_pod_arrives() {
    // Three 2.5-CPU pods get a c5.2xlarge. While it boots, a 3.5-CPU pod arrives: the next pass
    // keeps the three on the launching node and launches a c5.xlarge for the new pod. Packed again
    // with them, largest first, the new pod would take the launching node's room and two of the
    // three a second c5.2xlarge.
    let manifests = c5_cluster("WhenEmpty") + &deployment("first", 3, "2500m", "");
    let steps = applied_at("10s", &deployment("later", 1, "3500m", ""));
    let report = run(&scenario(&manifests, &steps, "3m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
    assert_eq!(s.nodes_launched, 2, "{s:#?}");
    let mut types: Vec<&str> = (s.final_nodes.iter())
        .map(|node| node.instance_type.as_str())
        .collect();
    types.sort_unstable();
    assert_eq!(types, ["c5.2xlarge", "c5.xlarge"], "{s:#?}");
}

/// `inflate` scaled from 40 one-CPU pods to 4 at 3m, with `fault` (a step's body) from then on, run
/// until `until`.
fn scale_down_with(fault: &str, until: &str) -> Report {
    let manifests = c5_inflate("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]", 40);
    let steps = format!(
        "[{{at: 3m, scale: {{kind: Deployment, namespace: default, name: inflate, replicas: 4}}}},
          {{at: 3m, {fault}}}]"
    );
    run(&scenario(&manifests, &steps, until))
}

/// Four `web` pods kept apart, each beside a three-CPU `batch` pod (kept apart too) until
/// `batch` is deleted at 3m: then each node is too big for its one pod, and no two can merge.
fn web_beside_batch() -> String {
    let batch_apart = APART.replace("app: web", "app: batch");
    c5_cluster("WhenEmptyOrUnderutilized")
        + &deployment("web", 4, "500m", APART)
        + &deployment("batch", 4, "3", &batch_apart)
}

/// The disruption decisions after 3m.
fn decided_after_three_minutes(report: &Report) -> Vec<&Entry> {
    entries(report, "disruption-decided")
        .filter(|e| e.at_seconds > 180.0)
        .collect()
}

#[test]
fn nodes_that_can_each_go_alone_are_consolidated_in_one_pass() {
    let steps = "[{at: 3m, delete: {kind: Deployment, namespace: default, name: batch}}]";
    let report = run(&scenario(&web_beside_batch(), steps, "10m"));
    let decided = decided_after_three_minutes(&report);
    assert_eq!(terminated(&report, "underutilized"), 4, "{decided:#?}");
    // One validation wait for all four, not one after another.
    assert!(
        decided.iter().all(|e| e.at_seconds == decided[0].at_seconds),
        "{decided:#?}"
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
}

#[test]
fn consolidation_waits_for_the_nodes_a_scale_down_touched_to_settle_and_decides_once() {
    // `batch` goes from two nodes at 3m and from the other two at 3m20s: the first two open at
    // 3m30s, while the others settle until 3m50s. Deciding at once would take the open pair alone
    // (no pod may move onto a settling node), then the rest a pass later; waiting for the pool
    // takes all four in one decision.
    decided_once_batch_has_left(&web_beside_batch(), "", 4, 4);
}

#[test]
fn a_node_open_since_before_a_scale_down_waits_for_the_nodes_it_touched() {
    // Beside `web_beside_batch`, a `solo` pod kept from `batch` (and from other solo pods): it
    // has a node of its own, open long before `batch` goes, and could move onto a node `batch`
    // left. `batch` leaves two nodes at 3m and the other two at 3m20s. Timed from its own window,
    // the solo node would go at 3m30s onto one of the first two to open, restarting its window;
    // timed from when the pool began making room, it waits, and one decision sees all five
    // nodes: the four `web` nodes each replaced by a smaller one, `solo` left where it is.
    let solo_apart = APART.replace(
        "matchLabels: {app: web}",
        "matchExpressions: [{key: app, operator: In, values: [batch, solo]}]",
    );
    let manifests = web_beside_batch() + &deployment("solo", 1, "1500m", &solo_apart);
    decided_once_batch_has_left(&manifests, "", 4, 5);
}

#[test]
fn empty_nodes_wait_with_their_pool_and_go_with_its_consolidation() {
    // As `web_beside_batch`, with two `solo` pods on nodes of their own (kept from every pod
    // here), deleted at 3m: those nodes open empty at 3m30s, while `batch` nodes settle until
    // 3m50s. Emptiness decided at once would hold the next pass for its 15 s validation; it waits
    // and goes with the rest.
    let apart_from = |apps: &str| {
        APART.replace(
            "matchLabels: {app: web}",
            &format!("matchExpressions: [{{key: app, operator: In, values: [{apps}]}}]"),
        )
    };
    let manifests = c5_cluster("WhenEmptyOrUnderutilized")
        + &deployment("web", 4, "500m", &apart_from("web, solo"))
        + &deployment("batch", 4, "3", &apart_from("batch, solo"))
        + &deployment("solo", 2, "1", &apart_from("web, batch, solo"));
    let solo_goes = ", {at: 3m, delete: {kind: Deployment, namespace: default, name: solo}}";
    let report = decided_once_batch_has_left(&manifests, solo_goes, 4, 4);
    assert_eq!(terminated(&report, "empty"), 2, "{:#?}", report.summary);
}

/// Runs `manifests` (with `web_beside_batch`) as `batch` leaves two nodes at 3m and the other two
/// at 3m20s (with `also`, more steps), and checks that one decision, taken once the last two
/// settled (3m50s), took `underutilized` nodes, and that `running` pods run at the end.
fn decided_once_batch_has_left(manifests: &str, also: &str, underutilized: usize, running: usize) -> Report {
    let steps = format!(
        "[{{at: 3m, scale: {{kind: Deployment, namespace: default, name: batch, replicas: 2}}}},
          {{at: 200s, scale: {{kind: Deployment, namespace: default, name: batch, replicas: 0}}}}{also}]"
    );
    let report = run(&scenario(manifests, &steps, "10m"));
    let decided = decided_after_three_minutes(&report);
    assert_eq!(
        terminated(&report, "underutilized"),
        underutilized,
        "{decided:#?}"
    );
    assert!(
        decided
            .iter()
            .all(|e| e.at_seconds == decided[0].at_seconds && e.at_seconds >= 230.0),
        "one decision once the last two nodes settled: {decided:#?}"
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (running, 0), "{s:#?}");
    report
}

#[test]
fn one_pass_decides_a_multi_node_command_for_each_group_of_nodes_that_merge() {
    // Six 1200m pods, one a c5.large (2 vCPUs, room for one), launched while c5a is not to be
    // had. Types have at most 4 vCPUs: a c5a.xlarge takes three pods for less than two c5.large
    // cost. Under `WhenEmpty` nothing moves; once the pool consolidates underused nodes, three
    // nodes merge onto one c5a.xlarge and the other three onto another: two multi-node commands,
    // decided in the same pass rather than a validation apart.
    let requirements = family(&["c5", "c5a"])
        + "\n        - key: karpenter.k8s.aws/instance-cpu\n          operator: Lt\n          values: ['5']";
    let pool_with = |policy: &str| pool("default", &requirements, &disruption(policy, "[{nodes: '100%'}]"));
    let manifests = pool_with("WhenEmpty") + NODE_CLASS + &deployment("inflate", 0, "1200m", "");
    let mut steps: String = ["c5a.large", "c5a.xlarge"]
        .iter()
        .map(|t| format!("\n    - at: 0s\n      unavailable: {{instanceType: {t}, for: 2m}}"))
        .collect();
    for n in 1..=6 {
        steps += &format!(
            "\n    - at: {}s\n      scale: {{kind: Deployment, namespace: default, name: inflate, replicas: {n}}}",
            n * 10
        );
    }
    steps += &applied_at("3m", &pool_with("WhenEmptyOrUnderutilized"));
    let report = run(&scenario(&manifests, &steps, "10m"));
    let s = &report.summary;
    let multi: Vec<&Entry> = decided_after_three_minutes(&report)
        .into_iter()
        .filter(|e| e.detail.starts_with("multi-node"))
        .collect();
    assert_eq!(multi.len(), 2, "{multi:#?}");
    assert_eq!(
        multi[0].at_seconds, multi[1].at_seconds,
        "in one pass: {multi:#?}"
    );
    assert_eq!(terminated(&report, "underutilized"), 6, "{s:#?}");
    assert!(
        s.final_nodes.len() == 2 && s.final_nodes.iter().all(|n| n.instance_type == "c5a.xlarge"),
        "{s:#?}"
    );
    assert_eq!((s.pods_running_end, s.pods_pending_end), (6, 0), "{s:#?}");
}

#[test]
fn a_multi_node_commands_small_pods_wait_for_the_large_pods_of_the_nodes_drained_beside() {
    // `dest`, a one-node pool kept from consolidation, has room for a 500m pod beside its `anchor`.
    // In `default`: `b` (1500m) alone on a c5.xlarge once `mate` is gone, and `a` (500m) alone on a
    // c5.large. Once `default` consolidates underused nodes, one command takes both: `a` onto
    // `dest`'s node, `b` onto one new c5.large. kube-scheduler sends a pod to the least allocated
    // node; were `a` evicted with `b`, it would take the empty replacement, `b` would fit nowhere
    // and a node would be launched for it.
    let dest = pool(
        "dest",
        "        - key: node.kubernetes.io/instance-type\n          operator: In\n          values: [c5.large]",
        &format!(
            "  limits: {{cpu: 2}}\n{}",
            disruption("WhenEmpty", "[{nodes: '100%'}]")
        ),
    );
    let default_with = |policy: &str| {
        pool(
            "default",
            &family(&["c5"]),
            &disruption(policy, "[{nodes: '100%'}]"),
        )
    };
    let in_pool = |name: &str| format!("      nodeSelector: {{karpenter.sh/nodepool: {name}}}");
    let manifests = dest
        + &default_with("WhenEmpty")
        + NODE_CLASS
        + &deployment("anchor", 1, "1", &in_pool("dest"))
        + &deployment("temp", 1, "800m", &in_pool("dest"));
    let with_b = "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: b}}
              topologyKey: kubernetes.io/hostname";
    let deleted = |name: &str| {
        format!("\n    - at: 140s\n      delete: {{kind: Deployment, namespace: default, name: {name}}}")
    };
    // `a` comes once `dest` and `b`'s node are full, and finds room there once `temp` and `mate` go.
    let steps = applied_at(
        "0s",
        &(deployment("b", 1, "1500m", &in_pool("default")) + &deployment("mate", 1, "2", with_b)),
    ) + &applied_at("90s", &deployment("a", 1, "500m", ""))
        + &deleted("temp")
        + &deleted("mate")
        + &applied_at("3m", &default_with("WhenEmptyOrUnderutilized"));
    let report = run(&scenario(&manifests, &steps, "8m"));
    let s = &report.summary;
    let decided = decided_after_three_minutes(&report);
    assert!(
        decided.len() == 1 && decided[0].detail.starts_with("multi-node"),
        "{decided:#?}"
    );
    let created: Vec<&Entry> = entries(&report, "nodeclaim-created")
        .filter(|e| e.at_seconds > 180.0)
        .collect();
    assert_eq!(
        created.len(),
        1,
        "the replacement alone: no node for a pod left pending: {created:#?}"
    );
    assert_eq!(terminated(&report, "underutilized"), 2, "{s:#?}");
    assert_eq!(s.final_nodes.len(), 2, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
}

#[test]
fn empty_nodes_go_in_the_same_pass_as_consolidation() {
    // Beside `web_beside_batch`, two `solo` pods on nodes of their own (apart from every pod
    // here), deleted with `batch`: those nodes are empty, the others underutilized.
    let solo_apart = APART.replace(
        "matchLabels: {app: web}",
        "matchExpressions: [{key: app, operator: In, values: [web, batch, solo]}]",
    );
    let manifests = web_beside_batch() + &deployment("solo", 2, "1", &solo_apart);
    let steps = "[{at: 3m, delete: {kind: Deployment, namespace: default, name: batch}},
                  {at: 3m, delete: {kind: Deployment, namespace: default, name: solo}}]";
    let report = run(&scenario(&manifests, steps, "10m"));
    let decided = decided_after_three_minutes(&report);
    assert!(terminated(&report, "empty") >= 1, "{decided:#?}");
    assert!(terminated(&report, "underutilized") >= 1, "{decided:#?}");
    // Emptiness does not take a validation wait of its own before consolidation.
    assert!(
        decided.iter().all(|e| e.at_seconds == decided[0].at_seconds),
        "{decided:#?}"
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
}

#[test]
fn a_failed_replacement_rolls_back_and_the_node_keeps_serving() {
    // Every launch fails from the scale-down on: the replacement never comes.
    let report = scale_down_with("failCloud: {operation: create, for: 1h}", "12m");
    let s = &report.summary;
    assert!(
        report
            .timeline
            .iter()
            .any(|e| e.event == "disruption-rolled-back"),
        "{:#?}",
        report.timeline
    );
    assert_eq!(terminated(&report, "underutilized"), 0, "{s:#?}");
    assert_eq!(
        (s.pods_running_end, s.pods_pending_end),
        (4, 0),
        "the pods kept running: {s:#?}"
    );
}

#[test]
fn a_pod_consolidation_cannot_simulate_holds_its_node() {
    // Node affinity by field: the scheduler places it anywhere, Joist cannot simulate it.
    let by_field = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchFields: [{key: metadata.name, operator: NotIn, values: [nowhere]}]";
    let manifests = c5_inflate("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]", 20)
        + &deployment("pinned", 1, "50m", by_field);
    // Two nodes (a second scale-up a minute later), then nearly nothing left to run.
    let steps = "[{at: 1m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 40}},
                  {at: 4m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 2}}]";
    let report = run(&scenario(&manifests, steps, "12m"));
    let evicted: Vec<&str> = entries(&report, "pod-terminating")
        .map(|e| e.object.as_str())
        .filter(|pod| pod.contains("pinned"))
        .collect();
    assert!(
        evicted.is_empty(),
        "consolidation evicted {evicted:?}, judging its node without it"
    );
    assert!(
        terminated(&report, "underutilized") + terminated(&report, "empty") > 0,
        "the other nodes were consolidated: {:#?}",
        decisions(&report)
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
}

#[test]
fn a_restart_does_not_start_consolidate_after_again() {
    let manifests = pool(
        "default",
        &family(&["c5"]),
        &disruption("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]").replace("30s", "2m"),
    ) + NODE_CLASS
        + &deployment("inflate", 40, "1", "");
    let steps = "[{at: 3m, scale: {kind: Deployment, namespace: default, name: inflate, replicas: 4}}]";
    let world = scenario(&manifests, steps, "12m");
    // The controllers crash as their first command taints its candidates, and start again.
    let (crashed, _) = simulate::run_crashing(
        &world,
        world.seed,
        joist_actors::effects::faults::FaultPoints::crash_at(
            joist_actors::effects::faults::Step::DisruptionMarked,
            1,
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let report = &crashed.report;
    let restarted = first_at(report, "restart");
    let decided = entries(report, "disruption-decided")
        .map(|e| e.at_seconds)
        .find(|&at| at > restarted)
        .unwrap_or_else(|| panic!("nothing decided after the restart: {:#?}", report.timeline));
    assert!(
        decided - restarted < 60.0,
        "decided {}s after the restart: the pods left at 3m, as the claims record, so \
         consolidateAfter (2m) had passed",
        decided - restarted
    );
}

#[test]
fn a_rolled_back_command_keeps_its_replacement_until_its_own_timeout() {
    // Instances launched from the scale-down on register but never turn Ready.
    let report = scale_down_with("bootFault: {never: ready, for: 1h}", "25m");
    let rolled_back = first_at(&report, "disruption-rolled-back");
    let replacement = entries(&report, "nodeclaim-created")
        .find(|e| e.at_seconds > 180.0)
        .map(|e| e.object.clone())
        .unwrap_or_else(|| panic!("no replacement: {:#?}", report.timeline));
    let deleted = entries(&report, "nodeclaim-deleting")
        .find(|e| e.object == replacement)
        .map(|e| e.at_seconds)
        .unwrap_or_else(|| panic!("{replacement} was never deleted: {:#?}", report.timeline));
    assert!(
        deleted > rolled_back + 60.0,
        "{replacement} deleted at {deleted}s, by the rollback at {rolled_back}s rather than at its \
         initialization timeout"
    );
    let s = &report.summary;
    assert_eq!(terminated(&report, "underutilized"), 0, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
}

/// Each `disruption-decided` entry of the timeline.
fn decisions(report: &Report) -> Vec<&str> {
    entries(report, "disruption-decided")
        .map(|e| e.detail.as_str())
        .collect()
}

/// The most nodes that stood at once between `from` and the end, counted from launches and ends.
fn most_nodes_after(report: &Report, from: f64) -> i64 {
    let (mut now, mut most) = (0i64, 0i64);
    for e in &report.timeline {
        match e.event.as_str() {
            "instance-launched" => now += 1,
            "instance-ended" => now -= 1,
            _ => continue,
        }
        if e.at_seconds >= from {
            most = most.max(now);
        }
    }
    most
}

#[test]
fn a_new_image_rolls_every_node_one_at_a_time_within_a_budget_of_one() {
    let manifests = one_at_a_time(&["c5"]) + NODE_CLASS + &deployment("web", 3, "1", APART);
    let steps = "[{at: 3m, releaseImage: {family: al2023}}]";
    let report = run(&scenario(&manifests, steps, "15m"));
    let s = &report.summary;
    assert_eq!(terminated(&report, "drifted"), 3, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
    assert_eq!(s.final_nodes.len(), 3, "{s:#?}");
    let decided = decisions(&report);
    assert_eq!(decided.len(), 3, "{decided:#?}");
    assert!(
        decided
            .iter()
            .all(|d| d.starts_with("drift of ") && !d.split(" by ").next().unwrap_or_default().contains(',')),
        "one node per command: {decided:#?}"
    );
    assert!(
        most_nodes_after(&report, 180.0) <= 4,
        "the budget of one: never more than one replacement beside the three"
    );
    assert!(
        report.timeline.iter().any(|e| e.event == "image-released"),
        "the step is on the timeline"
    );
}

/// The most NodeClaims at once between a `disruption-decided` entry naming them and their
/// deletion (or the command's rollback).
fn most_disrupting_at_once(report: &Report) -> usize {
    let mut disrupting = std::collections::BTreeSet::new();
    let mut most = 0;
    for e in &report.timeline {
        match e.event.as_str() {
            "disruption-decided" => {
                disrupting.insert(e.object.as_str());
            }
            "disruption-rolled-back" | "nodeclaim-deleted" => {
                disrupting.remove(e.object.as_str());
            }
            _ => {}
        }
        most = most.max(disrupting.len());
    }
    most
}

#[test]
fn ten_drift_commands_run_side_by_side_under_a_budget_of_ten() {
    let ten_at_once = pool(
        "default",
        &family(&["c5"]),
        &disruption("WhenEmpty", "[{nodes: '10'}]"),
    );
    let manifests = ten_at_once + NODE_CLASS + &deployment("web", 12, "1", APART);
    let steps = "[{at: 3m, releaseImage: {family: al2023}}]";
    let report = run(&scenario(&manifests, steps, "15m"));
    let s = &report.summary;
    assert_eq!(terminated(&report, "drifted"), 12, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (12, 0), "{s:#?}");
    let decided = decisions(&report);
    assert_eq!(
        decided.len(),
        12,
        "one command per drifted node, each on the timeline: {decided:#?}"
    );
    assert_eq!(
        most_disrupting_at_once(&report),
        10,
        "ten commands in flight at once, never more: {decided:#?}"
    );
}

#[test]
fn an_expiring_nodes_pods_get_one_replacement_before_the_first_eviction() {
    let manifests = c5_pool_with("      expireAfter: 5m") + NODE_CLASS + &deployment("web", 3, "1", "");
    let report = run(&scenario(&manifests, "[]", "9m"));
    let s = &report.summary;
    let deleting = first_at(&report, "nodeclaim-deleting");
    let evicted = first_at(&report, "pod-terminating");
    let replacements: Vec<f64> = entries(&report, "nodeclaim-created")
        .map(|e| e.at_seconds)
        .filter(|&at| at >= deleting)
        .collect();
    assert_eq!(
        replacements.len(),
        1,
        "one replacement for the three pods, not one per eviction: {:#?}",
        report.timeline
    );
    assert!(
        replacements[0] < evicted,
        "the replacement ({}) was created before the first eviction ({evicted})",
        replacements[0]
    );
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
}

#[test]
fn a_node_pool_at_its_cpu_limit_still_rolls_a_new_image() {
    // Three c5.large (2 CPUs each): the pool is at its limit once they run.
    let at_limit = pool(
        "default",
        &family(&["c5"]),
        &format!(
            "{}\n  limits:\n    cpu: '6'",
            disruption("WhenEmpty", "[{nodes: '1'}]")
        ),
    );
    let manifests = at_limit + NODE_CLASS + &deployment("web", 3, "1", APART);
    let steps = "[{at: 3m, releaseImage: {family: al2023}}]";
    let report = run(&scenario(&manifests, steps, "15m"));
    let s = &report.summary;
    assert_eq!(s.final_nodes.len(), 3, "{s:#?}");
    assert_eq!(
        terminated(&report, "drifted"),
        3,
        "each drifted node gave its CPUs back for its replacement: {:#?}",
        decisions(&report)
    );
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
}

#[test]
fn a_requirement_change_replaces_every_old_node_with_a_conforming_one() {
    let manifests = one_at_a_time(&["c5"]) + NODE_CLASS + &deployment("web", 2, "1", APART);
    let steps = applied_at("3m", &one_at_a_time(&["m5"]));
    let report = run(&scenario(&manifests, &steps, "12m"));
    let s = &report.summary;
    assert_eq!(terminated(&report, "drifted"), 2, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert!(
        s.final_nodes.iter().all(|n| n.instance_type.starts_with("m5.")),
        "{s:#?}"
    );
}

#[test]
fn expire_after_replaces_a_node_even_under_a_budget_of_zero() {
    let zero_budget = pool(
        "default",
        &family(&["c5"]),
        &disruption("WhenEmptyOrUnderutilized", "[{nodes: '0'}]"),
    );
    let manifests = with_template_fields(&zero_budget, "      expireAfter: 5m")
        + NODE_CLASS
        + &deployment("web", 2, "1", "");
    let report = run(&scenario(&manifests, "[]", "8m"));
    let s = &report.summary;
    assert!(terminated(&report, "expired") >= 1, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert!(!s.final_nodes.is_empty(), "provisioning replaced the capacity");
}

#[test]
fn a_blocking_pdb_holds_an_expiry_until_the_grace_period_then_its_pod_is_deleted() {
    let manifests = c5_pool_with("      expireAfter: 5m\n      terminationGracePeriod: 3m")
        + NODE_CLASS
        + GUARDED_PDB
        + &deployment("guarded", 1, "1", "");
    let report = run(&scenario(&manifests, "[]", "12m"));
    let s = &report.summary;
    let deleting = first_at(&report, "nodeclaim-deleting");
    let ended = first_at(&report, "instance-ended");
    assert!((300.0..330.0).contains(&deleting), "expired at 5m: {deleting}");
    // The drain waits on the budget until 30 s (the pod's own grace period) before the 3m deadline,
    // deletes the pod with the time left, and the instance goes at the deadline at the latest.
    assert!(
        ended - deleting >= 150.0 && ended - deleting <= 200.0,
        "held about three minutes: deleting at {deleting}, ended at {ended}"
    );
    assert_eq!(terminated(&report, "expired"), 1, "{s:#?}");
    assert_eq!(s.pods_running_end, 1, "{s:#?}");
    let expiring = first_at(&report, "grace-period-expiring");
    assert!(
        (deleting + 140.0..=ended).contains(&expiring),
        "the pod was deleted 30 s before the deadline: deleting at {deleting}, pod deleted at {expiring}, ended at {ended}"
    );
}

#[test]
fn critical_pods_leave_an_expiring_node_after_the_others() {
    let critical = "      priorityClassName: system-cluster-critical
      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: web}}
              topologyKey: kubernetes.io/hostname";
    let manifests = c5_pool_with("      expireAfter: 5m")
        + NODE_CLASS
        + &deployment("web", 1, "500m", "")
        + &deployment("dns", 1, "500m", critical);
    let report = run(&scenario(&manifests, "[]", "8m"));
    let left = |app: &str, event: &str| {
        report
            .timeline
            .iter()
            .find(|e| e.event == event && e.object.starts_with(&format!("default/{app}-")))
            .unwrap_or_else(|| panic!("no {event} of {app} in {:#?}", report.timeline))
            .clone()
    };
    let web = left("web", "pod-terminating");
    let dns = left("dns", "pod-terminating");
    assert!(web.detail.ends_with("drain tier non-critical"), "{web:?}");
    assert!(dns.detail.ends_with("drain tier critical"), "{dns:?}");
    let web_gone = left("web", "pod-terminated").at_seconds;
    assert!(
        dns.at_seconds >= web_gone,
        "the critical pod is evicted once the others are gone: {dns:?}, web gone at {web_gone}"
    );
}

/// Three `web` pods on three c5 nodes.
fn three_web_nodes() -> String {
    pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 3, "1", APART)
}

/// `three_web_nodes` with node repair on, and these steps.
fn repairing(steps: &str, until: &str) -> Report {
    run(&scenario_with(
        "{featureGates: {nodeRepair: true}}",
        &three_web_nodes(),
        steps,
        until,
    ))
}

#[test]
fn a_node_not_ready_for_thirty_minutes_is_repaired_counting_from_its_last_flap() {
    // NotReady at 3m, Ready again at 20m, NotReady again at 25m: the toleration restarts, so the
    // node goes at 55m, not at 33m, and goes at once (no drain to wait for).
    let steps = "[{at: 3m, nodeCondition: {count: 1, type: Ready, status: 'False'}},
                  {at: 20m, nodeCondition: {count: 1, type: Ready, status: 'True'}},
                  {at: 25m, nodeCondition: {count: 1, type: Ready, status: 'False'}}]";
    let report = repairing(steps, "60m");
    let s = &report.summary;
    let flaps = entries(&report, "node-condition").count();
    assert_eq!(flaps, 3, "{:#?}", report.timeline);
    let deleting = first_at(&report, "nodeclaim-deleting");
    assert!(
        (3300.0..3330.0).contains(&deleting),
        "repaired 30 minutes after the last flap (25m): {deleting}"
    );
    let ended = first_at(&report, "instance-ended");
    assert!(ended - deleting < 10.0, "forceful: {deleting} → {ended}");
    assert_eq!(terminated(&report, "unhealthy"), 1, "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (3, 0), "{s:#?}");
    assert_eq!(s.final_nodes.len(), 3, "the capacity was replaced: {s:#?}");
}

#[test]
fn a_nodepool_with_too_many_broken_nodes_repairs_none_and_says_why() {
    // Two of three nodes broken is more than 20 %: the fault is not the nodes'.
    let steps = "[{at: 3m, nodeCondition: {count: 2, type: Ready, status: 'Unknown'}}]";
    let report = repairing(steps, "40m");
    let s = &report.summary;
    assert_eq!(terminated(&report, "unhealthy"), 0, "{s:#?}");
    let blocked = entries(&report, "warning")
        .find(|e| e.detail.starts_with("NodeRepairBlocked"))
        .unwrap_or_else(|| panic!("no NodeRepairBlocked warning in {:#?}", report.timeline));
    assert!(blocked.at_seconds >= 1980.0, "blocked once due: {blocked:?}");
    assert!(blocked.detail.contains("2 of 3"), "{blocked:?}");
    assert_eq!(s.final_nodes.len(), 3, "{s:#?}");
}

#[test]
fn without_the_gate_a_broken_node_stays() {
    let steps = "[{at: 3m, nodeCondition: {count: 1}}]";
    let report = run(&scenario(&three_web_nodes(), steps, "40m"));
    assert_eq!(terminated(&report, "unhealthy"), 0, "{:#?}", report.summary);
}

#[test]
fn an_expiring_node_keeps_its_instance_until_its_pods_volume_is_detached() {
    let claim = "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
---
";
    let volume = "      volumes:
        - name: data
          persistentVolumeClaim: {claimName: data}";
    let manifests =
        c5_pool_with("      expireAfter: 5m") + NODE_CLASS + claim + &deployment("db", 1, "1", volume);
    let report = run(&scenario(&manifests, "[]", "8m"));
    let at = |event| entries(&report, event).map(|e| e.at_seconds).collect::<Vec<_>>();
    let attached = at("volume-attached");
    let detached = at("volume-detached");
    let ended = first_at(&report, "instance-ended");
    let terminated = first_at(&report, "pod-terminated");
    assert_eq!(
        attached.len(),
        2,
        "on the first node, then on its replacement: {:#?}",
        report.timeline
    );
    assert_eq!(detached.len(), 1, "{:#?}", report.timeline);
    assert!(
        detached[0] >= terminated + 10.0 && ended >= detached[0],
        "the pod stopped at {terminated}, its volume detached at {}, the instance ended at {ended}",
        detached[0]
    );
    assert_eq!(report.summary.pods_running_end, 1, "{:#?}", report.summary);
}

/// An EBS StorageClass `name` that provisions for a claim's first consumer, only in `zone`.
fn storage_class_in(name: &str, zone: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {name}}}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
allowedTopologies:
  - matchLabelExpressions: [{{key: topology.kubernetes.io/zone, values: [{zone}]}}]
---
"
    )
}

#[test]
fn pods_get_nodes_in_the_zones_their_volumes_allow() {
    // `db`'s claim is bound to a volume in us-west-2c; `cache`'s waits for its first consumer
    // with a class that provisions only in us-west-2b. Both would fit one node anywhere.
    let storage = "apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-c}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  csi: {driver: ebs.csi.aws.com, volumeHandle: vol-c}
  claimRef: {namespace: default, name: db-data}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [us-west-2c]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: db-data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
  volumeName: pv-c
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: cache-data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: only-b
  resources: {requests: {storage: 10Gi}}
---
";
    let volume = |claim: &str| {
        format!(
            "      volumes:
        - name: data
          persistentVolumeClaim: {{claimName: {claim}}}"
        )
    };
    let manifests = c5_pool_with("")
        + NODE_CLASS
        + &storage_class_in("only-b", "us-west-2b")
        + storage
        + &deployment("db", 1, "1", &volume("db-data"))
        + &deployment("cache", 1, "1", &volume("cache-data"));
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    let mut zones: Vec<&str> = s.final_nodes.iter().map(|n| n.zone.as_str()).collect();
    zones.sort_unstable();
    assert_eq!(zones, ["us-west-2b", "us-west-2c"], "{s:#?}");
}

#[test]
fn a_stateful_sets_pods_come_back_to_their_volumes_zone_when_their_nodes_expire() {
    // Its claims can only be made in us-west-2c; once made, each pod is tied to its volume.
    let manifests = c5_pool_with("      expireAfter: 4m")
        + NODE_CLASS
        + &storage_class_in("zonal-c", "us-west-2c")
        + "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers:
        - name: db
          image: postgres
          resources: {requests: {cpu: '1'}}
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        storageClassName: zonal-c
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 10Gi}}
---
";
    // Expired at about 4m50s and 5m40s (the second pod waited for the first to be Ready).
    let report = run(&scenario(&manifests, "[]", "7m30s"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert_eq!(terminated(&report, "expired"), 2, "{s:#?}");
    assert!(
        s.final_nodes.iter().all(|n| n.zone == "us-west-2c"),
        "{:#?}",
        s.final_nodes
    );
    // Each volume was attached on a first node, then again on its pod's next one.
    let mut attached: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in entries(&report, "volume-attached") {
        *attached.entry(entry.object.as_str()).or_default() += 1;
    }
    assert_eq!(attached.len(), 2, "one volume per pod: {attached:?}");
    assert!(attached.values().all(|&n| n >= 2), "{attached:?}");
}

#[test]
fn a_pod_whose_claim_does_not_exist_is_left_out_and_named() {
    let volume = "      volumes:
        - name: data
          persistentVolumeClaim: {claimName: missing}";
    let manifests = c5_pool_with("") + NODE_CLASS + &deployment("db", 1, "1", volume);
    let report = run(&scenario(&manifests, "[]", "2m"));
    let s = &report.summary;
    assert!(s.final_nodes.is_empty(), "{s:#?}");
    let [pending] = s.pending_pods.as_slice() else {
        panic!("one pod pending: {s:#?}");
    };
    assert!(
        pending.reason.contains(
            "spec.volumes[0].persistentVolumeClaim.claimName: PersistentVolumeClaim default/missing not found"
        ),
        "{pending:?}"
    );
}

/// A spot NodePool of c5 and the `web` Deployment of two one-CPU pods.
fn spot_web() -> String {
    let spot = pool("spot", &family(&["c5"]), "").replace("values: [on-demand]", "values: [spot]");
    spot + NODE_CLASS + &deployment("web", 2, "1", "")
}

/// When the first NodeClaim to be deleted at or after `from` began its deletion.
fn drained_after(report: &Report, from: f64) -> f64 {
    entries(report, "nodeclaim-deleting")
        .map(|e| e.at_seconds)
        .find(|&at| at >= from)
        .unwrap_or_else(|| panic!("no node was drained after {from}s: {:#?}", report.timeline))
}

#[test]
fn a_spot_interruption_is_replaced_before_the_instance_is_reclaimed() {
    let manifests = spot_web();
    let steps = "[{at: 3m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}}]";
    let report = run(&scenario(&manifests, steps, "8m"));
    let s = &report.summary;
    let warned = first_at(&report, "interruption-warning");
    // The warning is on the queue at 3m; the replacement is asked for within seconds.
    let replacement = report
        .timeline
        .iter()
        .find(|e| e.event == "nodeclaim-created" && e.at_seconds >= warned)
        .map(|e| e.at_seconds)
        .unwrap_or_else(|| panic!("no replacement: {:#?}", report.timeline));
    assert!(
        replacement - warned <= 5.0,
        "replacement {}s after the warning",
        replacement - warned
    );
    // The old node is drained while it still runs, and the pods run again before the two-minute
    // notice is up.
    let ended = report
        .timeline
        .iter()
        .find(|e| e.event == "instance-ended" && e.at_seconds >= warned)
        .unwrap_or_else(|| panic!("the instance never ended: {:#?}", report.timeline));
    assert!(
        ended.at_seconds - warned < 120.0,
        "Joist terminated it {}s after the warning, before the reclaim",
        ended.at_seconds - warned
    );
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert_eq!(s.nodes_terminated.get("interrupted"), Some(&1), "{s:#?}");
    // The evicted pods' successors run before the instance would have been reclaimed.
    let waited = s
        .max_pod_pending_after_interruption_seconds
        .unwrap_or_else(|| panic!("no interruption measured: {s:#?}"));
    assert!(waited > 0.0 && waited < 120.0, "evicted pods waited {waited}s");
    // The interrupted offering is marked unavailable: the replacement launches elsewhere.
    let offering =
        |event: &simulate::report::Entry| event.detail.split(" at ").next().unwrap_or_default().to_owned();
    let launched = |pick: &dyn Fn(&simulate::report::Entry) -> bool| {
        report
            .timeline
            .iter()
            .find(|e| e.event == "instance-launched" && pick(e))
            .map(offering)
            .unwrap_or_else(|| panic!("{:#?}", report.timeline))
    };
    let interrupted = launched(&|e| e.object == ended.object);
    let replacement = launched(&|e| e.at_seconds >= warned);
    assert_ne!(
        interrupted, replacement,
        "the replacement avoids the interrupted offering"
    );
}

#[test]
fn a_node_class_keeps_launching_while_its_resolution_is_throttled() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 2, "1", "");
    // Every refresh of the class from 2m to 7m is throttled; the workload grows at 3m.
    let steps = "[{at: 2m, failCloud: {operation: resolveNodeClass, for: 5m}},
                  {at: 3m, scale: {kind: Deployment, namespace: default, name: web, replicas: 12}}]";
    let report = run(&scenario(&manifests, steps, "6m"));
    let launched = report
        .timeline
        .iter()
        .find(|e| e.event == "nodeclaim-created" && e.at_seconds >= 180.0)
        .map(|e| e.at_seconds)
        .unwrap_or_else(|| panic!("nothing launched for the scale-up: {:#?}", report.timeline));
    assert!(
        launched < 200.0,
        "launched at {launched}s: the class resolved before the throttling stays Ready"
    );
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (12, 0), "{s:#?}");
}

#[test]
fn a_refused_nodeclaim_delete_leaves_the_interruption_message_for_redelivery() {
    let manifests = spot_web();
    // The API server refuses every delete from just before the warning until 3m30s.
    let steps = "[{at: 2m55s, failKube: {failure: conflict, for: 35s}},
                  {at: 3m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}}]";
    let report = run(&scenario(&manifests, steps, "8m"));
    let warned = first_at(&report, "interruption-warning");
    let drained = drained_after(&report, warned);
    assert!(
        drained >= 210.0 && drained < warned + 120.0,
        "drained at {drained}s: after the API server took deletes again (210s), from the message \
         given again, and before the reclaim ({}s)",
        warned + 120.0
    );
    let s = &report.summary;
    assert_eq!(s.nodes_terminated.get("interrupted"), Some(&1), "{s:#?}");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
}

#[test]
fn a_throttled_interruption_queue_is_retried_while_provisioning_goes_on() {
    let manifests = spot_web();
    let steps = "[{at: 2m, failCloud: {operation: receiveMessages, for: 60s}},
                  {at: 2m10s, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}},
                  {at: 2m20s, scale: {kind: Deployment, namespace: default, name: web, replicas: 12}}]";
    let report = run(&scenario(&manifests, steps, "8m"));
    let s = &report.summary;
    let warned = first_at(&report, "interruption-warning");
    // Provisioning does not wait for the queue: the scale-up gets its nodes during the outage.
    let during = report
        .timeline
        .iter()
        .filter(|e| e.event == "nodeclaim-created" && e.at_seconds > 140.0 && e.at_seconds < 180.0)
        .count();
    assert!(during >= 1, "{:#?}", report.timeline);
    // The warning is read once the queue answers again (backoff at most doubling past the minute),
    // and the warned node is still drained before its reclaim.
    let drained = drained_after(&report, warned);
    assert!(
        (180.0..=180.0 + 32.0).contains(&drained),
        "drained at {drained}s; the queue failed from 120s to 180s"
    );
    assert!(drained < warned + 120.0, "before the reclaim");
    assert_eq!((s.pods_running_end, s.pods_pending_end), (12, 0), "{s:#?}");
}

/// The value of the series named exactly `series` in an OpenMetrics exposition.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_final_metrics_count_launches_interruptions_and_disruptions_as_karpenter_does() {
    let spot = c5_inflate("WhenEmptyOrUnderutilized", "[{nodes: '100%'}]", 2)
        .replace("values: [on-demand]", "values: [spot]");
    let steps = "[{at: 3m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: spot}, count: 1}},
                  {at: 6m, delete: {kind: Deployment, namespace: default, name: inflate}}]";
    let scenario = scenario(&spot, steps, "10m");
    let simulate::Simulated { report, metrics, .. } =
        simulate::run(&scenario, scenario.seed, NodeTracer::disabled(), None)
            .unwrap_or_else(|e| panic!("{e}"));
    let s = &report.summary;
    let launched = s.nodes_launched as f64;
    let count =
        |series: &str| sample(&metrics, series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
    assert_eq!(
        count(
            "karpenter_nodeclaims_created_total{reason=\"provisioned\",nodepool=\"default\",min_values_relaxed=\"false\"}"
        ),
        launched
    );
    assert_eq!(
        count("karpenter_interruption_received_messages_total{message_type=\"spot_interrupted\"}"),
        1.0
    );
    assert_eq!(count("karpenter_interruption_deleted_messages_total"), 1.0);
    assert_eq!(
        count(
            "karpenter_nodeclaims_disrupted_total{reason=\"spot_interrupted\",nodepool=\"default\",capacity_type=\"spot\"}"
        ),
        1.0
    );
    let emptied = terminated(&report, "empty") as f64;
    assert!(emptied >= 1.0, "{s:#?}");
    assert_eq!(
        count(
            "karpenter_nodeclaims_disrupted_total{reason=\"empty\",nodepool=\"default\",capacity_type=\"spot\"}"
        ),
        emptied
    );
    assert!(
        count(
            "karpenter_voluntary_disruption_decisions_total{decision=\"delete\",reason=\"empty\",consolidation_type=\"empty\"}"
        ) >= 1.0
    );
    let ended: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("karpenter_nodeclaims_terminated_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        ended, launched,
        "every NodeClaim's termination finished and was counted"
    );
    // The performance dashboard's summaries, read by quantile.
    assert_eq!(
        count("karpenter_nodes_termination_duration_seconds_count{nodepool=\"default\"}"),
        launched
    );
    assert!(
        count("karpenter_nodes_termination_duration_seconds{nodepool=\"default\",quantile=\"0.5\"}") > 0.0
    );
    let started = count("karpenter_pods_startup_duration_seconds_count");
    assert!(started >= 2.0, "every pod that ran was timed: {started}");
    assert!(count("karpenter_pods_startup_duration_seconds{quantile=\"1\"}") > 0.0);
    assert!(
        count("controller_runtime_reconcile_total{controller=\"nodeclaim.lifecycle\",result=\"success\"}")
            >= 1.0
    );
    assert_eq!(count("karpenter_cluster_state_node_count"), 0.0);
}

#[test]
fn the_cheapest_type_that_fits_is_launched() {
    let manifests =
        pool("default", &family(&["m5", "c5", "r5"]), "") + NODE_CLASS + &deployment("web", 1, "1", "");
    let report = run(&scenario(&manifests, "[]", "3m"));
    let nodes = &report.summary.final_nodes;
    assert_eq!(nodes.len(), 1, "{nodes:#?}");
    // One 1-CPU pod fits a 2-vCPU node; of m5/c5/r5.large, c5.large is cheapest ($0.085/h).
    assert_eq!(
        (nodes[0].instance_type.as_str(), nodes[0].price_per_hour),
        ("c5.large", 0.085)
    );
    assert_eq!(report.summary.pods_running_end, 1);
}

#[test]
fn nodepool_limits_cap_capacity_and_say_so() {
    let manifests = pool("default", &family(&["c5"]), "  limits:\n    cpu: 4")
        + NODE_CLASS
        + &deployment("web", 6, "1", "");
    let report = run(&scenario(&manifests, "[]", "5m"));
    let s = &report.summary;
    let cpus: i64 = s
        .final_nodes
        .iter()
        .map(|n| {
            if n.instance_type == "c5.large" {
                2
            } else if n.instance_type == "c5.xlarge" {
                4
            } else {
                99
            }
        })
        .sum();
    assert!(cpus <= 4, "launched {cpus} vCPUs past a limit of 4: {s:#?}");
    assert!(s.pods_pending_end > 0);
    assert!(
        s.pending_pods.iter().all(|p| p.reason.contains("limits")),
        "pending pods should be told the NodePool's limits stop them: {:#?}",
        s.pending_pods
    );
}

#[test]
fn heavier_nodepools_are_tried_first() {
    let light = pool("light", &family(&["c5"]), "");
    let manifests = light
        + &pool("heavy", &family(&["m5"]), "  weight: 50")
        + NODE_CLASS
        + &deployment("web", 2, "1", "");
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert!(!s.final_nodes.is_empty());
    assert!(
        s.final_nodes
            .iter()
            .all(|n| n.nodepool == "heavy" && n.instance_type.starts_with("m5.")),
        "{s:#?}"
    );
}

#[test]
fn taints_keep_intolerant_pods_off_and_tolerant_pods_on() {
    let taint = "      taints:\n        - {key: dedicated, value: batch, effect: NoSchedule}";
    // The taint belongs to the template spec: insert it before nodeClassRef's line.
    let tainted =
        pool("batch", "", "").replace("      nodeClassRef:", &format!("{taint}\n      nodeClassRef:"));
    let tolerant =
        "      tolerations:\n        - {key: dedicated, operator: Equal, value: batch, effect: NoSchedule}";
    let manifests =
        tainted + NODE_CLASS + &deployment("plain", 1, "1", "") + &deployment("batch", 1, "1", tolerant);
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (1, 1), "{s:#?}");
    let pending = &s.pending_pods[0];
    assert!(pending.pod.starts_with("default/plain-"), "{pending:?}");
    assert!(
        pending
            .reason
            .contains("did not tolerate taint dedicated=batch:NoSchedule"),
        "{pending:?}"
    );
}

#[test]
fn required_node_affinity_picks_the_family() {
    let affinity = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {key: karpenter.k8s.aws/instance-family, operator: In, values: [r5]}";
    let manifests = pool("default", "", "") + NODE_CLASS + &deployment("memory", 2, "1", affinity);
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert_eq!(s.pods_running_end, 2);
    assert!(
        s.final_nodes.iter().all(|n| n.instance_type.starts_with("r5.")),
        "{s:#?}"
    );
}

#[test]
fn zonal_topology_spread_lands_in_every_zone() {
    let spread = "      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {matchLabels: {app: spread}}";
    let manifests = pool("default", "", "") + NODE_CLASS + &deployment("spread", 3, "1", spread);
    let report = run(&scenario(&manifests, "[]", "3m"));
    let s = &report.summary;
    assert_eq!(s.pods_running_end, 3, "{s:#?}");
    let mut zones: Vec<&str> = s.final_nodes.iter().map(|n| n.zone.as_str()).collect();
    zones.sort_unstable();
    zones.dedup();
    assert_eq!(zones, ["us-west-2a", "us-west-2b", "us-west-2c"]);
}

/// A kube-scheduler that spreads every Deployment's pods over zones by default (its
/// PodTopologySpread `defaultConstraints`), as both kubesim's scheduler and Joist are told.
const ZONE_SPREAD_BY_DEFAULT: &str = "{schedulerConfig: {podTopologySpread: {defaultConstraints: [
    {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}]}}}";

#[test]
fn pods_are_launched_for_where_the_schedulers_default_spread_will_put_them() {
    // Nodes in every zone first (for pods spread by their own constraint); then six pods that
    // declare no spread of their own and fit none of those nodes. The scheduler lets no zone run
    // more than one of them above another, so capacity packed into one zone would leave four of
    // them Pending.
    let own_spread = "      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule,
           labelSelector: {matchLabels: {app: base}}}";
    let base = deployment("base", 3, "1", own_spread);
    let web = deployment("web", 0, "3", "");
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &base + &web;
    let steps = "[{at: 2m, scale: {kind: Deployment, name: web, replicas: 6}}]";
    let report = run(&scenario_with(ZONE_SPREAD_BY_DEFAULT, &manifests, steps, "4m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (9, 0), "{s:#?}");
}

#[test]
fn a_default_spread_with_a_selector_is_refused_by_its_field() {
    let settings = "{schedulerConfig: {podTopologySpread: {defaultConstraints: [{maxSkew: 1,
        topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule,
        labelSelector: {matchLabels: {app: web}}}]}}}";
    let text = format!(
        "kind: Scenario\nmetadata: {{name: test}}\nspec:\n  cloud: {{region: us-west-2}}\n  \
         settings: {settings}\n  until: 1m\n"
    );
    let Err(error) = Scenario::parse(&text).map(|_| ()) else {
        panic!("a default constraint with a selector was accepted")
    };
    let error = error.to_string();
    assert!(
        error.contains("spec.settings.schedulerConfig")
            && error.contains("defaultConstraints[0].labelSelector: must not be set"),
        "{error}"
    );
}

#[test]
fn a_capacity_error_falls_back_to_the_next_offering_within_one_batch() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 0, "1", "");
    let steps = "
    - at: 0s
      unavailable: {instanceType: c5.large, zone: us-west-2a, capacityType: on-demand, for: 10m}
    - at: 10s
      scale: {kind: Deployment, namespace: default, name: web, replicas: 1}";
    let report = run(&scenario(&manifests, steps, "3m"));
    let s = &report.summary;
    assert_eq!(s.pods_running_end, 1, "{s:#?}");
    let at = |event: &str| {
        report
            .timeline
            .iter()
            .find(|e| e.event == event)
            .map(|e| e.at_seconds)
    };
    assert!(
        at("insufficient-capacity").is_some(),
        "the cheapest offering was tried and refused"
    );
    let launched = report
        .timeline
        .iter()
        .find(|e| e.event == "instance-launched")
        .unwrap_or_else(|| panic!("nothing launched: {:#?}", report.timeline));
    assert!(
        !launched.detail.contains("on-demand:c5.large:us-west-2a"),
        "{launched:?}"
    );
    let waited = launched.at_seconds - 10.0;
    assert!(
        waited <= 11.0,
        "fell back {waited}s after the pod appeared: more than one batch cycle"
    );
}

#[test]
fn a_pod_that_fits_nowhere_stays_pending_and_says_why() {
    let manifests = pool("default", "", "") + NODE_CLASS + &deployment("huge", 1, "1000", "");
    let report = run(&scenario(&manifests, "[]", "2m"));
    let s = &report.summary;
    assert_eq!((s.pods_pending_end, s.nodes_launched), (1, 0), "{s:#?}");
    let reason = &s.pending_pods[0].reason;
    assert!(
        reason.contains("no instance type met the scheduling requirements"),
        "{reason}"
    );
}

fn seconds(span: &SpanData) -> f64 {
    span.end_time
        .duration_since(span.start_time)
        .unwrap_or_default()
        .as_secs_f64()
}

#[test]
fn every_node_life_is_one_trace_with_a_span_per_phase() {
    let exporter = InMemorySpanExporter::default();
    let tracer = NodeTracer::new(Arc::new(SimpleSpanProcessor::new(exporter.clone())));
    let manifests = format!(
        "{NODE_CLASS}{}{}",
        pool("default", "", ""),
        deployment("inflate", 2, "1", "")
    );
    let steps = "[{at: 3m, interrupt: {nodeSelector: {karpenter.sh/capacity-type: on-demand}, count: 1}}]";
    let scenario = scenario(&manifests, steps, "8m");
    let report = simulate::run(&scenario, scenario.seed, tracer, None)
        .unwrap_or_else(|e| panic!("{e}"))
        .report;
    let spans = exporter.get_finished_spans().unwrap_or_else(|e| panic!("{e}"));
    let mut traces: BTreeMap<_, Vec<SpanData>> = BTreeMap::new();
    for span in spans {
        traces
            .entry(span.span_context.trace_id().to_bytes())
            .or_default()
            .push(span);
    }
    assert_eq!(
        traces.len(),
        report.summary.nodes_launched as usize,
        "one trace per launched node: {traces:#?}"
    );
    fn names(spans: &[SpanData]) -> Vec<&str> {
        let mut names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        names.sort_unstable();
        names
    }
    let (ended, alive): (Vec<_>, Vec<_>) = traces
        .values()
        .partition(|spans| spans.iter().any(|s| s.name == ROOT_SPAN));
    assert_eq!(
        (ended.len(), alive.len()),
        (1, 1),
        "the interrupted node and its replacement"
    );
    assert_eq!(
        names(ended[0]),
        [
            "nodeclaim",
            "nodeclaim.initialization",
            "nodeclaim.launch",
            "nodeclaim.registration",
            "nodeclaim.termination"
        ]
    );
    assert_eq!(
        names(alive[0]),
        [
            "nodeclaim.initialization",
            "nodeclaim.launch",
            "nodeclaim.registration"
        ]
    );
    let root = ended[0]
        .iter()
        .find(|s| s.name == ROOT_SPAN)
        .unwrap_or_else(|| panic!("no root"));
    assert_eq!(root.parent_span_id, SpanId::INVALID);
    for phase in ended[0].iter().filter(|s| s.name != ROOT_SPAN) {
        assert_eq!(
            phase.parent_span_id,
            root.span_context.span_id(),
            "{}",
            phase.name
        );
        assert!(
            phase.start_time >= root.start_time && phase.end_time <= root.end_time,
            "{phase:#?}"
        );
    }
    for spans in traces.values() {
        let registration = spans.iter().find(|s| s.name == "nodeclaim.registration");
        let took = registration.map_or(0.0, seconds);
        assert!(
            (40.0..=42.0).contains(&took),
            "registration waits for the 40 s boot, took {took}s"
        );
    }
}

/// Receives OTLP/HTTP requests on 127.0.0.1 and passes their bodies on; the thread ends with the
/// test process.
fn otlp_receiver() -> (String, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (bodies, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let bodies = bodies.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                loop {
                    let mut length = None;
                    let mut line = String::new();
                    let mut request_line = true;
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if request_line {
                            assert!(line.starts_with("POST /v1/traces "), "{line}");
                            request_line = false;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse::<usize>().ok();
                        }
                    }
                    let mut body = vec![0; length.unwrap_or(0)];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = bodies.send(body);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if reader.get_mut().write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{address}"), received)
}

#[test]
fn simulate_exports_node_traces_over_otlp_when_the_endpoint_is_set() {
    let (endpoint, received) = otlp_receiver();
    tools::succeeded(
        Command::new(env!("CARGO_BIN_EXE_joist"))
            .args([
                "simulate",
                concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.yaml"),
            ])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_SERVICE_NAME"),
        "joist simulate",
    );
    let requests: Vec<ExportTraceServiceRequest> = received
        .try_iter()
        .map(|body| ExportTraceServiceRequest::decode(body.as_slice()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut launches = Vec::new();
    for resource_spans in requests.iter().flat_map(|r| &r.resource_spans) {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref()?.value.clone());
        assert_eq!(service, Some(OtlpValue::StringValue("joist".into())));
        let spans = resource_spans.scope_spans.iter().flat_map(|s| &s.spans);
        launches.extend(spans.filter(|s| s.name == "nodeclaim.launch").cloned());
    }
    assert_eq!(
        launches.len(),
        2,
        "the quickstart launches two nodes: {requests:#?}"
    );
    assert_ne!(launches[0].trace_id, launches[1].trace_id, "one trace per node");
    let epoch = Duration::from_secs(1_767_225_600).as_nanos() as u64;
    let started = launches[0].start_time_unix_nano;
    assert!(
        (epoch..epoch + 600_000_000_000).contains(&started),
        "spans carry the scenario's virtual time (2026-01-01T00:00Z + minutes), not the wall clock: {started}"
    );
}

/// The static c5.large NodePool `fixed` with `spec` lines (`replicas`, `limits`), the node class,
/// and `manifests` after them.
fn static_pool(spec: &str, manifests: &str) -> String {
    let only_c5_large = "        - key: node.kubernetes.io/instance-type\n          operator: In\n          values: [c5.large]";
    pool("fixed", only_c5_large, spec) + NODE_CLASS + manifests
}

/// A scenario with the `StaticCapacity` gate on.
fn static_scenario(manifests: &str, steps: &str, until: &str) -> Report {
    run(&scenario_with(
        "{featureGates: {staticCapacity: true}}",
        manifests,
        steps,
        until,
    ))
}

/// Instances running at `at` seconds.
fn running_at(report: &Report, at: f64) -> usize {
    report
        .instances
        .iter()
        .filter(|l| l.launched_at_seconds <= at && l.ended_at_seconds.is_none_or(|end| end > at))
        .count()
}

#[test]
fn a_static_nodepool_keeps_its_size_without_pods_and_follows_its_replicas() {
    let steps = "
    - {at: 5m, scale: {kind: NodePool, name: fixed, replicas: 5}}
    - {at: 10m, scale: {kind: NodePool, name: fixed, replicas: 1}}";
    // consolidateAfter 0s: a dynamic pool would remove these empty nodes at once.
    let report = static_scenario(&static_pool("  replicas: 3", ""), steps, "15m");
    let s = &report.summary;
    assert_eq!(
        running_at(&report, 290.0),
        3,
        "three empty nodes kept: {:#?}",
        report.instances
    );
    assert_eq!(
        running_at(&report, 590.0),
        5,
        "scaled to five: {:#?}",
        report.instances
    );
    assert_eq!(s.final_nodes.len(), 1, "{s:#?}");
    assert_eq!(s.nodes_launched, 5, "no node replaced for nothing: {s:#?}");
    assert_eq!(terminated(&report, "terminated"), 4, "{s:#?}");
    assert!(
        s.final_nodes
            .iter()
            .all(|n| n.instance_type == "c5.large" && n.nodepool == "fixed")
    );
    let launched = first_at(&report, "nodeclaim-created");
    assert!(launched < 5.0, "the pool is filled at once: {launched}s");
}

#[test]
fn a_static_nodepool_stops_at_its_node_limit_and_says_so() {
    let report = static_scenario(
        &static_pool("  replicas: 5\n  limits: {nodes: 3}", ""),
        "[]",
        "5m",
    );
    assert_eq!(report.summary.nodes_launched, 3, "{:#?}", report.summary);
    let limited = entries(&report, "warning").find(|e| e.detail.starts_with("LimitsExceeded"));
    assert!(
        limited.is_some(),
        "no LimitsExceeded warning in {:#?}",
        report.timeline
    );
}

#[test]
fn pods_run_on_a_static_nodepools_nodes_but_never_make_it_launch() {
    let manifests = static_pool("  replicas: 1", &deployment("web", 4, "1", ""));
    let report = static_scenario(&manifests, "[]", "5m");
    let s = &report.summary;
    // One c5.large (2 vCPUs) holds one of the 1-CPU pods; the rest wait: the pool is static.
    assert_eq!(
        (s.nodes_launched, s.pods_running_end, s.pods_pending_end),
        (1, 1, 3),
        "{s:#?}"
    );
}

#[test]
fn without_the_gate_a_static_nodepool_launches_nothing_and_says_why() {
    let report = run(&scenario(&static_pool("  replicas: 3", ""), "[]", "3m"));
    assert_eq!(report.summary.nodes_launched, 0, "{:#?}", report.summary);
    let refused = entries(&report, "warning")
        .find(|e| e.object == "NodePool/fixed" && e.detail.contains("StaticCapacity feature gate"));
    assert!(
        refused.is_some(),
        "no warning naming the gate in {:#?}",
        report.timeline
    );
}

/// A NodeOverlay taking 60 % off the m5 family.
const M5_DISCOUNT: &str = "apiVersion: karpenter.sh/v1alpha1
kind: NodeOverlay
metadata: {name: m5-discount}
spec:
  weight: 10
  requirements:
    - {key: karpenter.k8s.aws/instance-family, operator: In, values: [m5]}
  priceAdjustment: '-60%'
---
";

#[test]
fn a_price_overlay_changes_the_instance_type_joist_chooses() {
    let families = family(&["c6a", "m5"]);
    // The pods come once the overlay has been seen, as in a cluster where it was applied before.
    let manifests =
        pool("default", &families, "") + NODE_CLASS + M5_DISCOUNT + &deployment("web", 0, "1", "");
    let steps = "[{at: 30s, scale: {kind: Deployment, namespace: default, name: web, replicas: 5}}]";
    let plain = run(&scenario(&manifests, steps, "3m"));
    let overlaid = run(&scenario_with(
        "{featureGates: {nodeOverlay: true}}",
        &manifests,
        steps,
        "3m",
    ));
    let chosen = |report: &Report| {
        report
            .instances
            .iter()
            .map(|l| (l.instance_type.clone(), l.price_per_hour))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        chosen(&plain),
        [("c6a.2xlarge".to_owned(), 0.306)],
        "without the gate, the list price"
    );
    let discounted = chosen(&overlaid);
    assert_eq!(discounted.len(), 1, "{discounted:?}");
    assert_eq!(discounted[0].0, "m5.2xlarge", "{discounted:?}");
    assert!(
        (discounted[0].1 - 0.384 * 0.4).abs() < 1e-6,
        "billed at the overlaid price: {discounted:?}"
    );
    assert_eq!(overlaid.summary.pods_running_end, 5);
}

#[test]
fn a_static_nodepools_drifted_nodes_are_replaced_one_at_a_time() {
    let steps = "[{at: 2m, releaseImage: {family: al2023}}]";
    let report = static_scenario(&static_pool("  replicas: 2", ""), steps, "20m");
    let s = &report.summary;
    assert_eq!(
        (s.nodes_launched, s.final_nodes.len()),
        (4, 2),
        "{:#?}",
        report.instances
    );
    assert_eq!(terminated(&report, "terminated"), 2, "{s:#?}");
    // One replacement at a time: the second is launched once the first is up (40 s boot) and its
    // drifted node has begun to go.
    let launched: Vec<f64> = report.instances.iter().map(|l| l.launched_at_seconds).collect();
    assert!(launched[3] >= launched[2] + 40.0, "{launched:?}");
    assert!(launched[2] > 120.0, "after the image release: {launched:?}");
}

#[test]
fn a_node_whose_host_fails_its_status_check_for_two_minutes_is_replaced() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 2, "1", "");
    let steps = "[{at: 3m, impairInstances: {check: system, count: 1}}]";
    let report = run(&scenario(&manifests, steps, "9m"));
    let impaired = report
        .timeline
        .iter()
        .find(|e| e.event == "instance-impaired")
        .unwrap_or_else(|| panic!("no instance impaired: {:#?}", report.timeline));
    let deleting = drained_after(&report, impaired.at_seconds);
    // Asked every minute, acted on once the check has failed for two minutes.
    let after = deleting - impaired.at_seconds;
    assert!(
        (120.0..=185.0).contains(&after),
        "the broken node's claim was deleted {after}s after its check failed: {:#?}",
        report.timeline
    );
    let ended = report
        .timeline
        .iter()
        .find(|e| e.event == "instance-ended" && e.object == impaired.object)
        .unwrap_or_else(|| panic!("the broken instance never ended: {:#?}", report.timeline));
    assert!(ended.at_seconds >= deleting, "{:#?}", report.timeline);
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
}

/// A NodePool of c5 with `policy`, a node left with one of three `heavy` pods (each with
/// `pod-deletion-cost` `cost`) after a scale-down at 2m, and a `light` pod kept off that node by
/// anti-affinity on a c5.large of its own.
fn balanced_cluster(policy: &str, cost: &str) -> String {
    let disruption = format!("  disruption:\n    consolidationPolicy: {policy}\n    consolidateAfter: 30s");
    let heavy = format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: heavy, namespace: default}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: heavy}}}}
  template:
    metadata:
      labels: {{app: heavy}}
      annotations: {{controller.kubernetes.io/pod-deletion-cost: \"{cost}\"}}
    spec:
      containers:
        - name: pause
          image: pause
          resources: {{requests: {{cpu: \"1\"}}}}
---
"
    );
    // Pinned to a c5.large, the cheapest c5: however the first batch is packed, only the heavy
    // node is worth replacing.
    let apart = "      nodeSelector: {node.kubernetes.io/instance-type: c5.large}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: heavy}}
              topologyKey: kubernetes.io/hostname";
    pool("default", &family(&["c5"]), &disruption)
        + NODE_CLASS
        + &heavy
        + &deployment("light", 1, "1500m", apart)
}

/// The instance types launched after `from`, in order.
fn launched_after(report: &Report, from: f64) -> Vec<String> {
    entries(report, "instance-launched")
        .filter(|e| e.at_seconds > from)
        .map(|e| e.detail.split(':').nth(1).unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn balanced_consolidation_weighs_what_a_move_saves_against_what_it_disrupts() {
    let steps = "[{at: 2m, scale: {kind: Deployment, namespace: default, name: heavy, replicas: 1}}]";
    let scaled_down = 120.0;
    let outcome = |policy: &str, cost: &str| {
        let scenario = scenario(&balanced_cluster(policy, cost), steps, "10m");
        let simulate::Simulated { report, metrics, .. } =
            simulate::run(&scenario, scenario.seed, NodeTracer::disabled(), None)
                .unwrap_or_else(|e| panic!("{e}"));
        let s = &report.summary;
        assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
        let approvals: Vec<String> = entries(&report, "consolidation-approved")
            .filter(|e| e.at_seconds > scaled_down)
            .map(|e| e.detail.clone())
            .collect();
        let rejected = sample(
            &metrics,
            &format!(
                "karpenter_consolidation_moves_total{{decision=\"rejected\",nodepool=\"default\",policy=\"{policy}\"}}"
            ),
        );
        let held_by_score = sample(
            &metrics,
            "karpenter_voluntary_disruption_candidates_remaining{nodepool=\"default\",blocker=\"score\"}",
        );
        (
            launched_after(&report, scaled_down),
            approvals,
            rejected,
            held_by_score,
        )
    };
    // After the scale-down, consolidation decides beside the emptiness command (the emptied node
    // still counts in the pool): replacing the heavy node (a c5.xlarge left with one pod) by a
    // c5.large saves a quarter of the pool's cost. A deletion cost of 2^30 makes its pod nine
    // times as costly to move as a plain one: the move is then about three quarters of the
    // pool's disruption, a score near 0.3, under Balanced's 0.5.
    let costly = "1073741824";
    let (replaced, _, rejected, _) = outcome("WhenEmptyOrUnderutilized", costly);
    assert_eq!(replaced, ["c5.large"], "the other policy replaces it");
    assert_eq!(rejected, None, "and refuses nothing");
    let (replaced, approvals, rejected, held_by_score) = outcome("Balanced", costly);
    assert!(
        replaced.is_empty() && approvals.is_empty(),
        "Balanced leaves a move that disrupts far more than it saves: {replaced:?} {approvals:?}"
    );
    assert!(
        rejected.is_some_and(|n| n >= 1.0),
        "the refused move is counted: {rejected:?}"
    );
    assert_eq!(held_by_score, Some(1.0), "the heavy node stays for its score");
    // Without the deletion cost the same move is 40 % of the disruption (0.62), and it is made.
    let (replaced, approvals, _, _) = outcome("Balanced", "0");
    assert_eq!(replaced, ["c5.large"]);
    assert!(
        approvals
            .iter()
            .any(|a| a.contains("score 0.62 >= threshold 0.50 (k: 2, savings 25.0%, disruption 40.0%)")),
        "the approval is told with its score: {approvals:?}"
    );
}

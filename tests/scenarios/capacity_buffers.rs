//! CapacityBuffers in whole runs, behind the `CapacityBuffer` gate: room launched for a buffer's
//! pods before they exist, kept against consolidation, taken by real pods at once (and launched
//! again for the buffer); a buffer sized from a Deployment's replicas; one whose PodTemplate is
//! missing says so; and nothing with the gate off.

use super::{APART, NODE_CLASS, Report, deployment, family, pool, run, scenario_with, terminated};

/// Pod-spec lines that keep `app: worker` pods on separate nodes.
const WORKERS_APART: &str = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: worker}}
              topologyKey: kubernetes.io/hostname";

/// The c5 NodePool `default` consolidating after 30 s, and the node class.
fn consolidating() -> String {
    pool(
        "default",
        &family(&["c5"]),
        "  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 30s",
    ) + NODE_CLASS
}

/// The PodTemplate `worker`: 1-CPU pods labelled `app: worker`, kept apart.
fn worker_template() -> String {
    let spec: String = WORKERS_APART.lines().map(|l| format!("  {l}\n")).collect();
    format!(
        "apiVersion: v1
kind: PodTemplate
metadata: {{name: worker, namespace: default}}
template:
  metadata: {{labels: {{app: worker}}}}
  spec:
{spec}        containers:
          - name: worker
            image: worker
            resources: {{requests: {{cpu: \"1\"}}}}
---
"
    )
}

/// A CapacityBuffer `name` with `spec` (flow-style YAML fields).
fn buffer(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: autoscaling.x-k8s.io/v1beta1
kind: CapacityBuffer
metadata: {{name: {name}, namespace: default}}
spec: {{{spec}}}
---
"
    )
}

/// The scenario settings with the gate on.
const GATE_ON: &str = "{featureGates: {capacityBuffer: true}}";

/// The buffer `default/name`'s replicas and conditions at the end.
fn buffer_status(report: &Report, name: &str) -> (Option<i64>, Vec<String>) {
    let wanted = format!("default/{name}");
    let found = report
        .summary
        .capacity_buffers
        .iter()
        .find(|b| b.buffer == wanted);
    let found = found.unwrap_or_else(|| panic!("no buffer {wanted}: {:#?}", report.summary));
    (found.replicas, found.conditions.clone())
}

#[test]
fn a_buffer_gets_nodes_before_its_pods_exist_keeps_them_and_real_pods_start_there_at_once() {
    let manifests = consolidating()
        + &worker_template()
        + &buffer("headroom", "podTemplateRef: {name: worker}, replicas: 2");
    let steps = format!(
        "[{{at: 6m, apply: {:?}}}]",
        deployment("worker", 2, "1", WORKERS_APART)
    );
    let report = run(&scenario_with(GATE_ON, &manifests, &steps, "12m"));
    let s = &report.summary;
    let at_six: Vec<f64> = report
        .instances
        .iter()
        .map(|i| i.launched_at_seconds)
        .filter(|at| *at < 360.0)
        .collect();
    assert_eq!(
        at_six.len(),
        2,
        "two nodes for the buffer before any pod exists: {:#?}",
        report.instances
    );
    assert_eq!(
        s.nodes_terminated.values().sum::<usize>(),
        0,
        "the buffer's nodes are kept: {s:#?}"
    );
    assert_eq!((s.pods_running_end, s.pods_pending_end), (2, 0), "{s:#?}");
    assert!(
        s.max_pod_pending_seconds < 5.0,
        "the workers start on the buffer's nodes without waiting for a launch: {}s",
        s.max_pod_pending_seconds
    );
    assert_eq!(
        s.nodes_launched, 4,
        "the buffer is made whole again beside the workers: {s:#?}"
    );
    let (replicas, conditions) = buffer_status(&report, "headroom");
    assert_eq!(replicas, Some(2));
    assert!(
        conditions.contains(&"ReadyForProvisioning=True (Resolved)".to_owned())
            && conditions.contains(&"Provisioning=True (FitsExistingCapacity)".to_owned()),
        "{conditions:?}"
    );
}

#[test]
fn a_buffer_of_a_deployments_share_adds_that_many_nodes_beside_it() {
    let manifests = consolidating()
        + &deployment("web", 4, "1", APART)
        + &buffer(
            "web-surge",
            "scalableRef: {apiGroup: apps, kind: Deployment, name: web}, percentage: 50",
        );
    let report = run(&scenario_with(GATE_ON, &manifests, "[]", "8m"));
    let s = &report.summary;
    assert_eq!((s.pods_running_end, s.pods_pending_end), (4, 0), "{s:#?}");
    assert_eq!(
        s.final_nodes.len(),
        6,
        "four for web and two for half of it again: {s:#?}"
    );
    assert_eq!(
        terminated(&report, "empty") + terminated(&report, "underutilized"),
        0
    );
    assert_eq!(buffer_status(&report, "web-surge").0, Some(2));
}

#[test]
fn a_buffer_whose_pod_template_is_missing_launches_nothing_and_says_so() {
    let manifests = consolidating() + &buffer("headroom", "podTemplateRef: {name: nope}, replicas: 2");
    let report = run(&scenario_with(GATE_ON, &manifests, "[]", "3m"));
    assert_eq!(report.summary.nodes_launched, 0, "{:#?}", report.summary);
    let (_, conditions) = buffer_status(&report, "headroom");
    assert!(
        conditions.contains(&"ReadyForProvisioning=False (PodTemplateNotFound)".to_owned())
            && conditions.contains(&"Provisioning=False (NotReadyForProvisioning)".to_owned()),
        "{conditions:?}"
    );
}

#[test]
fn with_the_gate_off_a_buffer_launches_nothing() {
    let manifests = consolidating()
        + &worker_template()
        + &buffer("headroom", "podTemplateRef: {name: worker}, replicas: 2");
    let report = run(&scenario_with("{}", &manifests, "[]", "3m"));
    assert_eq!(report.summary.nodes_launched, 0, "{:#?}", report.summary);
    assert_eq!(
        buffer_status(&report, "headroom"),
        (None, Vec::new()),
        "nothing writes its status"
    );
}

//! Prometheus metrics with Karpenter's names, types and labels, so Karpenter's dashboards work
//! against Joist unchanged (docs/operations.md, "Metrics").
//!
//! Two kinds live here. Counters and histograms of things that happen (a NodeClaim created, a
//! disruption decided, an interruption message received) are fields of [`Metrics`], recorded by the
//! actor that sees the event. Gauges of what the cluster holds (nodes' allocatable and requests,
//! pods by phase, NodePool usage and limits, cluster-state sync) are read from the read model when
//! Prometheus scrapes ([`state`]), so no event pays for them.
//!
//! Recording never fails and never blocks. Encoding can only fail on a formatter error, which
//! writing to a `String` never produces.

mod state;
mod summary;
#[cfg(test)]
mod tests;

use std::{fmt::Write, sync::Arc};

use joist_messages::{
    apis::NodeClaim,
    labels::{CAPACITY_TYPE, NODEPOOL, ZONE},
};
use kube::ResourceExt;
use prometheus_client::{
    encoding::{EncodeLabelSet, text},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

pub use self::summary::Summary;
use crate::state::{read_model::ReadModel, replica_shards::ReplicaShards};

/// Karpenter's `DurationBuckets`: controller-runtime's thresholds, plus longer ones for
/// controllers without a timeout.
pub const DURATION_BUCKETS: [f64; 45] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25,
    1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0,
    50.0, 60.0, 90.0, 120.0, 150.0, 300.0, 600.0,
];

/// Karpenter's NodeClaim termination buckets: 1 s doubling to 2048 s.
/// `karpenter_consolidation_score`'s buckets (Karpenter's).
const SCORE_BUCKETS: [f64; 8] = [0.1, 0.25, 0.33, 0.5, 1.0, 2.0, 5.0, 10.0];

const TERMINATION_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// `karpenter_nodeclaims_created_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreatedLabels {
    /// `provisioned`, or the disruption reason a replacement is for.
    pub reason: String,
    /// The NodePool.
    pub nodepool: String,
    /// Whether minValues was relaxed to find an instance type (never, in Joist).
    pub min_values_relaxed: String,
}

/// `karpenter_nodeclaims_terminated_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// The NodePool.
    pub nodepool: String,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: String,
    /// The zone.
    pub zone: String,
}

/// `karpenter_nodeclaims_disrupted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisruptedLabels {
    /// Snake-case reason: `empty`, `underutilized`, `spot_interrupted`, `instance_terminated` …
    pub reason: String,
    /// The NodePool.
    pub nodepool: String,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: String,
}

/// `karpenter_nodeclaims_unhealthy_disrupted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnhealthyLabels {
    /// The broken Node condition, snake case (`ready`, `accelerated_hardware_ready`).
    pub condition: String,
    /// The NodePool.
    pub nodepool: String,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: String,
    /// The image the node booted.
    pub image_id: String,
}

/// `karpenter_nodes_created_total` and `karpenter_nodes_terminated_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The NodePool.
    pub nodepool: String,
    /// The zone.
    pub zone: String,
}

/// `karpenter_voluntary_disruption_decisions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `delete` or `replace`.
    pub decision: String,
    /// `empty`, `underutilized` or `drifted`.
    pub reason: String,
    /// `empty`, `single` or `multi`.
    pub consolidation_type: String,
}

/// Labels of one consolidation type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsolidationTypeLabels {
    /// `empty`, `single` or `multi`.
    pub consolidation_type: String,
}

/// Labels of one disruption reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `empty`, `underutilized` or `drifted`.
    pub reason: String,
}

/// `karpenter_nodepools_allowed_disruptions`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    /// The NodePool.
    pub nodepool: String,
    /// `empty`, `underutilized` or `drifted`.
    pub reason: String,
}

/// `karpenter_voluntary_disruption_candidates_remaining`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolBlockerLabels {
    /// The NodePool.
    pub nodepool: String,
    /// Why its nodes stay (`budget`, `score`, …: `disruption::blockers`).
    pub blocker: String,
}

/// `karpenter_consolidation_moves_total` and `karpenter_consolidation_score`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveLabels {
    /// `approved` or `rejected`.
    pub decision: String,
    /// The NodePool.
    pub nodepool: String,
    /// Its consolidation policy.
    pub policy: String,
}

/// Labels of one NodePool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The NodePool.
    pub nodepool: String,
}

/// `karpenter_interruption_received_messages_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    /// The event kind (`spot_interrupted`, `scheduled_change` …; `no_action` when not understood).
    pub message_type: String,
}

/// `karpenter_interruption_instance_status_unhealthy_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    /// The status check (`InstanceStatus`, `SystemStatus`, `EventStatus`).
    pub category: String,
}

/// Labels of one controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller (Joist: the actor kind).
    pub controller: String,
}

/// `joist_mailbox_full_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabels {
    /// The actor kind whose mailbox was full.
    pub actor: String,
}

/// `controller_runtime_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// The controller (Joist: the actor kind).
    pub controller: String,
    /// `success`, `requeue_after` or `error`.
    pub result: String,
}

/// Every metric an event records (see the module docs). Cheap to clone: clones share the series.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// NodeClaims created, by reason and NodePool.
    pub nodeclaims_created: Family<CreatedLabels, Counter>,
    /// NodeClaims whose termination finished.
    pub nodeclaims_terminated: Family<ClaimLabels, Counter>,
    /// NodeClaims deleted for a reason (disruption, interruption, launch failure).
    pub nodeclaims_disrupted: Family<DisruptedLabels, Counter>,
    /// NodeClaims repaired, by the Node condition that broke.
    pub nodeclaims_unhealthy_disrupted: Family<UnhealthyLabels, Counter>,
    /// From a NodeClaim's deletion to its finalizer's removal.
    pub nodeclaims_termination_duration: Family<PoolLabels, Histogram>,
    /// Nodes registered.
    pub nodes_created: Family<NodeLabels, Counter>,
    /// Nodes released.
    pub nodes_terminated: Family<NodeLabels, Counter>,
    /// Disruption commands carried out.
    pub disruption_decisions: Family<DecisionLabels, Counter>,
    /// Disruption commands abandoned at validation.
    pub disruption_failed_validations: Family<ConsolidationTypeLabels, Counter>,
    /// Candidates at the last pass, by reason.
    pub disruption_eligible_nodes: Family<ReasonLabels, Gauge>,
    /// Candidates the last full pass judged and left, per NodePool and blocker.
    pub disruption_candidates_remaining: Family<PoolBlockerLabels, Gauge>,
    /// Time to evaluate one disruption pass.
    pub disruption_evaluation_duration: Family<ReasonLabels, Histogram>,
    /// Disruptions each NodePool's budgets allow now, by reason.
    pub nodepools_allowed_disruptions: Family<PoolReasonLabels, Gauge>,
    /// Interruption messages received, by kind.
    pub interruption_received: Family<MessageLabels, Counter>,
    /// Interruption messages deleted.
    pub interruption_deleted: Counter,
    /// From an interruption event's emission to its handling.
    pub interruption_queue_duration: Histogram,
    /// Consolidation moves decided or refused by the `Balanced` score, per NodePool they take
    /// nodes of.
    pub consolidation_moves: Family<MoveLabels, Counter>,
    /// The `Balanced` score of each move decided or refused in a Balanced NodePool.
    pub consolidation_score: Family<MoveLabels, Histogram>,
    /// Instances found unhealthy by their status checks, each instance and check counted once
    /// while it stays unhealthy.
    pub instance_status_unhealthy: Family<CategoryLabels, Counter>,
    /// Time to simulate scheduling one batch.
    pub scheduling_duration: Family<ControllerLabels, Histogram>,
    /// Reconciles (an actor's step, pass or batch), by controller and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Time of one reconcile, by controller.
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    /// From a pod's creation to its running, for pods seen before they ran.
    pub pods_startup: Summary,
    /// From a NodeClaim's deletion to its node's release, by NodePool.
    pub nodes_termination: Summary,
    /// Sends that found an actor's mailbox (or the event writer's queue) full, by actor.
    pub mailbox_full: Family<ActorLabels, Counter>,
}

impl Metrics {
    /// A fresh registry with every metric at zero, and the cluster-state gauges read from `read`.
    pub fn new(read: ReadModel) -> Self {
        Self::for_shards(read, None)
    }

    /// [`Metrics::new`], the cluster-state gauges covering what the replica holding `shards` acts
    /// for (everything when none; see [`state`]).
    pub fn for_shards(read: ReadModel, shards: Option<ReplicaShards>) -> Self {
        let duration = || Histogram::new(DURATION_BUCKETS);
        let metrics = Self {
            registry: Arc::default(),
            nodeclaims_created: Family::default(),
            nodeclaims_terminated: Family::default(),
            nodeclaims_disrupted: Family::default(),
            nodeclaims_unhealthy_disrupted: Family::default(),
            nodeclaims_termination_duration: Family::new_with_constructor(|| {
                Histogram::new(TERMINATION_BUCKETS)
            }),
            nodes_created: Family::default(),
            nodes_terminated: Family::default(),
            disruption_decisions: Family::default(),
            disruption_failed_validations: Family::default(),
            disruption_eligible_nodes: Family::default(),
            disruption_candidates_remaining: Family::default(),
            disruption_evaluation_duration: Family::new_with_constructor(duration),
            nodepools_allowed_disruptions: Family::default(),
            interruption_received: Family::default(),
            interruption_deleted: Counter::default(),
            interruption_queue_duration: duration(),
            instance_status_unhealthy: Family::default(),
            consolidation_moves: Family::default(),
            consolidation_score: Family::new_with_constructor(|| Histogram::new(SCORE_BUCKETS)),
            scheduling_duration: Family::new_with_constructor(duration),
            reconciles: Family::default(),
            mailbox_full: Family::default(),
            reconcile_time: Family::new_with_constructor(duration),
            pods_startup: Summary::new(
                "karpenter_pods_startup_duration_seconds",
                "From a pod's creation to its running",
                None,
            ),
            nodes_termination: Summary::new(
                "karpenter_nodes_termination_duration_seconds",
                "From a node's deletion to its release",
                Some("nodepool"),
            ),
        };
        // Karpenter starts these series at zero, so a rate over them exists before any failure.
        for consolidation_type in ["empty", "single", "multi"] {
            metrics
                .disruption_failed_validations
                .get_or_create_owned(&ConsolidationTypeLabels {
                    consolidation_type: consolidation_type.to_owned(),
                });
        }
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        registry.register_collector(Box::new(state::ClusterStateCollector::new(read, shards)));
        registry.register_collector(Box::new(metrics.pods_startup.clone()));
        registry.register_collector(Box::new(metrics.nodes_termination.clone()));
        Self {
            registry: Arc::new(registry),
            ..metrics
        }
    }

    fn register(&self, r: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        let c = "karpenter_nodeclaims_";
        r.register(
            format!("{c}created"),
            "NodeClaims created",
            self.nodeclaims_created.clone(),
        );
        r.register(
            format!("{c}terminated"),
            "NodeClaims terminated",
            self.nodeclaims_terminated.clone(),
        );
        r.register(
            format!("{c}disrupted"),
            "NodeClaims disrupted, by reason",
            self.nodeclaims_disrupted.clone(),
        );
        r.register(
            format!("{c}unhealthy_disrupted"),
            "NodeClaims replaced by node repair, by the broken Node condition",
            self.nodeclaims_unhealthy_disrupted.clone(),
        );
        r.register(
            format!("{c}termination_duration_seconds"),
            "From a NodeClaim's deletion to the removal of its finalizer",
            self.nodeclaims_termination_duration.clone(),
        );
        r.register(
            "karpenter_nodes_created",
            "Nodes registered",
            self.nodes_created.clone(),
        );
        r.register(
            "karpenter_nodes_terminated",
            "Nodes terminated",
            self.nodes_terminated.clone(),
        );
        let d = "karpenter_voluntary_disruption_";
        r.register(
            format!("{d}decisions"),
            "Disruption decisions carried out",
            self.disruption_decisions.clone(),
        );
        r.register(
            format!("{d}failed_validations"),
            "Disruption decisions that no longer held at validation",
            self.disruption_failed_validations.clone(),
        );
        r.register(
            format!("{d}eligible_nodes"),
            "Nodes eligible for disruption at the last pass",
            self.disruption_eligible_nodes.clone(),
        );
        r.register(
            format!("{d}candidates_remaining"),
            "Candidates the last disruption pass judged and left, by NodePool and blocker",
            self.disruption_candidates_remaining.clone(),
        );
        r.register(
            format!("{d}decision_evaluation_duration_seconds"),
            "Time to evaluate a disruption pass",
            self.disruption_evaluation_duration.clone(),
        );
        r.register(
            "karpenter_nodepools_allowed_disruptions",
            "Disruptions each NodePool's budgets allow now",
            self.nodepools_allowed_disruptions.clone(),
        );
        let i = "karpenter_interruption_";
        r.register(
            format!("{i}received_messages"),
            "Interruption messages received, by kind",
            self.interruption_received.clone(),
        );
        r.register(
            format!("{i}deleted_messages"),
            "Interruption messages deleted",
            self.interruption_deleted.clone(),
        );
        r.register(
            format!("{i}message_queue_duration_seconds"),
            "From an interruption event's emission to its handling",
            self.interruption_queue_duration.clone(),
        );
        r.register(
            "karpenter_consolidation_moves",
            "Consolidation moves decided or refused, by decision, NodePool and consolidation policy",
            self.consolidation_moves.clone(),
        );
        r.register(
            "karpenter_consolidation_score",
            "Balanced consolidation scores of the moves decided or refused, by decision, NodePool and policy",
            self.consolidation_score.clone(),
        );
        r.register(
            format!("{i}instance_status_unhealthy"),
            "Unhealthy instance statuses found by the cloud's status checks, by check category",
            self.instance_status_unhealthy.clone(),
        );
        r.register(
            "joist_mailbox_full",
            "Sends that found an actor's mailbox full: coalesced into the message already queued \
             (nodeclaim and nodepool pokes, batcher triggers, provisioner batches) or dropped (events)",
            self.mailbox_full.clone(),
        );
        r.register(
            "controller_runtime_reconcile",
            "Reconciles, by controller and result",
            self.reconciles.clone(),
        );
        r.register(
            "controller_runtime_reconcile_time_seconds",
            "Time of one reconcile, by controller",
            self.reconcile_time.clone(),
        );
        r.register(
            "karpenter_scheduler_scheduling_duration_seconds",
            "Time to simulate scheduling one batch of pending pods",
            self.scheduling_duration.clone(),
        );
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// The Prometheus text format (0.0.4) of every metric, for scrapers that do not ask for
    /// OpenMetrics (promtool, older agents): the same samples, with each counter family named by
    /// its `_total` samples as that format wants, summaries typed as summaries (their `_sum` and
    /// `_count` samples in the family), and no `# EOF`.
    pub fn encode_text(&self) -> String {
        let summaries = [self.pods_startup.name(), self.nodes_termination.name()];
        // The HELP and TYPE lines of a summary's `_sum` and `_count` families, which that format
        // folds into the summary's.
        let parts: Vec<String> = summaries
            .iter()
            .flat_map(|s| {
                ["HELP", "TYPE"]
                    .into_iter()
                    .flat_map(move |kind| ["_sum ", "_count "].map(|part| format!("# {kind} {s}{part}")))
            })
            .collect();
        let open = self.encode();
        let mut out = String::with_capacity(open.len() + 1024);
        let mut lines = open.lines().peekable();
        while let Some(line) = lines.next() {
            if !line.starts_with('#') {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            if line == "# EOF" || parts.iter().any(|p| line.starts_with(p.as_str())) {
                continue;
            }
            let type_name = |line: &str, kind: &str| {
                line.strip_prefix("# TYPE ")
                    .and_then(|rest| rest.strip_suffix(kind))
                    .map(str::to_owned)
            };
            if let Some(name) = type_name(line, " gauge").filter(|name| summaries.contains(&name.as_str())) {
                let _ = writeln!(out, "# TYPE {name} summary");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or_default();
                if lines
                    .peek()
                    .and_then(|next| type_name(next, " counter"))
                    .as_deref()
                    == Some(name)
                {
                    lines.next();
                    let _ = writeln!(out, "# HELP {name}_total{}", &rest[name.len()..]);
                    let _ = writeln!(out, "# TYPE {name}_total counter");
                    continue;
                }
            }
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Counts a send that found `actor`'s mailbox full.
    pub fn found_full(&self, actor: &str) {
        self.mailbox_full
            .get_or_create(&ActorLabels {
                actor: actor.to_owned(),
            })
            .inc();
    }

    /// Counts one reconcile of `controller` that ended with `result` after `seconds`.
    pub fn reconciled(&self, controller: &str, result: &str, seconds: f64) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconcile_time.get_or_create(&labels).observe(seconds);
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: labels.controller,
                result: result.to_owned(),
            })
            .inc();
    }

    /// The terminated-claim labels of `claim`.
    pub fn claim_labels(claim: &impl ResourceExt) -> ClaimLabels {
        let label = |key: &str| claim.labels().get(key).cloned().unwrap_or_default();
        ClaimLabels {
            nodepool: label(NODEPOOL),
            capacity_type: label(CAPACITY_TYPE),
            zone: label(ZONE),
        }
    }

    /// Counts a NodeClaim created in `nodepool` for `reason` (`provisioned`, or the disruption
    /// reason a replacement is for).
    pub fn created(&self, nodepool: &str, reason: &str) {
        self.nodeclaims_created
            .get_or_create(&CreatedLabels {
                reason: reason.to_owned(),
                nodepool: nodepool.to_owned(),
                min_values_relaxed: "false".to_owned(),
            })
            .inc();
    }

    /// The node labels (`nodepool`, `zone`) of `object`.
    pub fn node_labels(object: &impl ResourceExt) -> NodeLabels {
        let ClaimLabels { nodepool, zone, .. } = Self::claim_labels(object);
        NodeLabels { nodepool, zone }
    }

    /// Counts `claim` as repaired because its Node's `condition` broke.
    pub fn repaired(&self, claim: &NodeClaim, condition: &str) {
        let ClaimLabels {
            nodepool,
            capacity_type,
            ..
        } = Self::claim_labels(claim);
        let image_id = claim
            .status
            .as_ref()
            .and_then(|s| s.image_id.clone())
            .unwrap_or_default();
        self.nodeclaims_unhealthy_disrupted
            .get_or_create(&UnhealthyLabels {
                condition: snake_case(condition),
                nodepool,
                capacity_type,
                image_id,
            })
            .inc();
    }

    /// Counts `claim` as disrupted for `reason` (snake case).
    pub fn disrupted(&self, claim: &impl ResourceExt, reason: &str) {
        let ClaimLabels {
            nodepool,
            capacity_type,
            ..
        } = Self::claim_labels(claim);
        self.nodeclaims_disrupted
            .get_or_create(&DisruptedLabels {
                reason: reason.to_owned(),
                nodepool,
                capacity_type,
            })
            .inc();
    }
}

/// Karpenter's snake-case metric reason for an event or disruption reason: `LaunchTimeout` →
/// `launch_timeout`, `Underutilized` → `underutilized`; a trailing `Error` is dropped, as Karpenter
/// counts `InsufficientCapacityError` as `insufficient_capacity`.
pub fn snake_case(reason: &str) -> String {
    let reason = reason.strip_suffix("Error").unwrap_or(reason);
    let mut snake = String::with_capacity(reason.len() + 4);
    for (i, c) in reason.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

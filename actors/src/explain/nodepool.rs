//! `joist explain nodepool NAME`: the NodePool's conditions, the limits it has used, its nodes by
//! state, which of them drifted, and what its disruption budgets allow now and over the next
//! 24 hours (each scheduled window's opening and closing).

use std::fmt;

use joist_messages::{
    apis::{
        NodeClaim,
        nodepool::{Budget, DisruptionReason},
    },
    conditions::{ConditionType, is_true},
    model::resources::Resources,
};
use kube::ResourceExt;
use serde::Serialize;

use super::{ConditionLine, ExplainError, utc};
use crate::{
    decide::{budgets, lifecycle::transitioned_at},
    disruption::{self, in_flight::Holding},
    shared::Shared,
};

/// How far ahead the budgets are looked at.
const AHEAD_SECONDS: i64 = 24 * 3600;

/// The conditions a NodePool's answer shows, in Karpenter's order.
const POOL_CONDITIONS: [ConditionType; 4] = [
    ConditionType::Ready,
    ConditionType::ValidationSucceeded,
    ConditionType::NodeClassReady,
    ConditionType::NodeRegistrationHealthy,
];

/// See the module docs.
#[derive(Debug, Clone, Serialize)]
pub struct PoolAnswer {
    /// The NodePool.
    pub nodepool: String,
    /// Its status conditions.
    pub conditions: Vec<ConditionLine>,
    /// Each limited resource: used and limit.
    pub limits: Vec<Limit>,
    /// Its NodeClaims by state.
    pub nodes: NodeStates,
    /// Its drifted NodeClaims.
    pub drifted: Vec<Drifted>,
    /// Its budgets, as written, and whether each is active now.
    pub budgets: Vec<BudgetNow>,
    /// The disruptions allowed now, and from each change in the next 24 hours.
    pub allowed: Vec<Allowed>,
}

/// A limited resource.
#[derive(Debug, Clone, Serialize)]
pub struct Limit {
    /// The resource (`cpu`, `memory`, `nodes`, …).
    pub resource: String,
    /// What the NodePool's NodeClaims hold.
    pub used: String,
    /// The limit.
    pub limit: String,
}

/// NodeClaims by where they are in their lives (each counted once), and the disruption marks
/// on them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeStates {
    /// Not yet launched.
    pub launching: usize,
    /// Launched, their Node not yet registered.
    pub registering: usize,
    /// Registered, not yet initialized.
    pub initializing: usize,
    /// Initialized and not being deleted.
    pub initialized: usize,
    /// Being deleted.
    pub deleting: usize,
    /// Marked `Drifted`.
    pub drifted: usize,
    /// Marked `Consolidatable`.
    pub consolidatable: usize,
}

/// A drifted NodeClaim.
#[derive(Debug, Clone, Serialize)]
pub struct Drifted {
    /// The NodeClaim.
    pub nodeclaim: String,
    /// What drifted (the condition's reason: `NodePoolDrifted`, `AMIDrift`, …).
    pub reason: String,
    /// Since when (RFC 3339).
    pub since: String,
}

/// A budget as written, and whether it applies now.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetNow {
    /// The budget.
    #[serde(flatten)]
    pub budget: Budget,
    /// Whether it applies now (a schedule that does not parse: it applies, allowing nothing).
    pub active: bool,
}

/// What the budgets allow from a time on, less what is already disrupting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allowed {
    /// From when (RFC 3339).
    pub from: String,
    /// Empty nodes that may go.
    pub empty: u32,
    /// Underutilized nodes that may go.
    pub underutilized: u32,
    /// Drifted nodes that may be replaced.
    pub drifted: u32,
}

/// The answer for the NodePool `name`.
pub fn explain(shared: &Shared, name: &str) -> Result<PoolAnswer, ExplainError> {
    let read = &shared.read;
    let pool = read.node_pool(name).ok_or_else(|| ExplainError::NotFound {
        kind: "nodepool",
        name: name.to_owned(),
    })?;
    let now = shared.clock.now_seconds();
    let conditions = pool.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let claims = read.node_claims_of(name);
    let budget = disruption::Budgets::of(shared, vec![pool.clone()], &Holding::default(), now);
    let allowed_at = |at: i64| {
        let of = |reason| budget.allowed_at(name, reason, at);
        (
            of(DisruptionReason::Empty),
            of(DisruptionReason::Underutilized),
            of(DisruptionReason::Drifted),
        )
    };
    let mut allowed: Vec<Allowed> = Vec::new();
    let mut last = None;
    for at in std::iter::once(now).chain(budgets::changes_between(&pool, now, now + AHEAD_SECONDS)) {
        let counts = allowed_at(at);
        if last.replace(counts) != Some(counts) {
            let (empty, underutilized, drifted) = counts;
            allowed.push(Allowed {
                from: utc(at),
                empty,
                underutilized,
                drifted,
            });
        }
    }
    Ok(PoolAnswer {
        nodepool: name.to_owned(),
        conditions: POOL_CONDITIONS
            .iter()
            .filter_map(|&type_| ConditionLine::of(conditions, type_))
            .collect(),
        limits: limits(&pool.spec.limits, &read.pool_usage(name)),
        nodes: states(&claims),
        drifted: drifted(&claims),
        budgets: pool
            .spec
            .disruption
            .budgets
            .iter()
            .map(|b| BudgetNow {
                budget: b.clone(),
                active: budgets::is_active(b, now).unwrap_or(true),
            })
            .collect(),
        allowed,
    })
}

/// Each limited resource, used against its limit.
fn limits(
    limits: &std::collections::BTreeMap<String, joist_messages::model::quantity::Quantity>,
    used: &Resources,
) -> Vec<Limit> {
    limits
        .iter()
        .map(|(resource, limit)| Limit {
            resource: resource.clone(),
            used: used.get(resource).to_string(),
            limit: limit.to_string(),
        })
        .collect()
}

/// `claims` by state.
fn states(claims: &[std::sync::Arc<NodeClaim>]) -> NodeStates {
    let mut states = NodeStates::default();
    for claim in claims {
        let conditions = claim.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let holds = |type_| is_true(conditions, type_);
        let count = if claim.metadata.deletion_timestamp.is_some() {
            &mut states.deleting
        } else if !holds(ConditionType::Launched) {
            &mut states.launching
        } else if !holds(ConditionType::Registered) {
            &mut states.registering
        } else if !holds(ConditionType::Initialized) {
            &mut states.initializing
        } else {
            &mut states.initialized
        };
        *count += 1;
        states.drifted += usize::from(holds(ConditionType::Drifted));
        states.consolidatable += usize::from(holds(ConditionType::Consolidatable));
    }
    states
}

/// The drifted ones of `claims`, longest drifted first.
fn drifted(claims: &[std::sync::Arc<NodeClaim>]) -> Vec<Drifted> {
    let mut drifted: Vec<(i64, Drifted)> = claims
        .iter()
        .filter_map(|claim| {
            let conditions = &claim.status.as_ref()?.conditions;
            let condition = ConditionLine::of(conditions, ConditionType::Drifted)?;
            let since = transitioned_at(claim, ConditionType::Drifted)?;
            (condition.status == "True").then(|| {
                (
                    since,
                    Drifted {
                        nodeclaim: claim.name_any(),
                        reason: condition.reason,
                        since: utc(since),
                    },
                )
            })
        })
        .collect();
    drifted.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.nodeclaim.cmp(&b.1.nodeclaim)));
    drifted.into_iter().map(|(_, d)| d).collect()
}

impl fmt::Display for PoolAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "nodepool {}", self.nodepool)?;
        for condition in &self.conditions {
            writeln!(f, "  {condition}")?;
        }
        if self.limits.is_empty() {
            writeln!(f, "limits: none")?;
        } else {
            let limits: Vec<String> = self
                .limits
                .iter()
                .map(|l| format!("{} {} of {}", l.resource, l.used, l.limit))
                .collect();
            writeln!(f, "limits used: {}", limits.join(", "))?;
        }
        let n = &self.nodes;
        writeln!(
            f,
            "nodes: {} initialized, {} initializing, {} registering, {} launching, {} deleting; {} drifted, {} consolidatable",
            n.initialized,
            n.initializing,
            n.registering,
            n.launching,
            n.deleting,
            n.drifted,
            n.consolidatable
        )?;
        for d in &self.drifted {
            writeln!(
                f,
                "  drifted: nodeclaim {} ({}) since {}",
                d.nodeclaim, d.reason, d.since
            )?;
        }
        writeln!(f, "budgets:")?;
        for b in &self.budgets {
            let reasons = if b.budget.reasons.is_empty() {
                "all reasons".to_owned()
            } else {
                let names: Vec<String> = b.budget.reasons.iter().map(|r| format!("{r:?}")).collect();
                names.join(", ")
            };
            let window = match (&b.budget.schedule, &b.budget.duration) {
                (Some(schedule), Some(duration)) => {
                    format!(" from {schedule:?} (UTC) for {duration}")
                }
                _ => String::new(),
            };
            let active = if b.active { "active now" } else { "not active now" };
            writeln!(f, "  nodes {} for {reasons}{window}: {active}", b.budget.nodes)?;
        }
        writeln!(
            f,
            "disruptions allowed (empty, underutilized, drifted), next 24 h:"
        )?;
        for a in &self.allowed {
            writeln!(
                f,
                "  from {}: {} empty, {} underutilized, {} drifted",
                a.from, a.empty, a.underutilized, a.drifted
            )?;
        }
        Ok(())
    }
}

//! NodePool registration health: the NodePool condition `NodeRegistrationHealthy`, which tells a
//! user that a pool's nodes keep failing to launch or join (a wrong AMI, instance profile, subnet or
//! user data) and need a look, as Karpenter's does.
//!
//! Each NodePool keeps its last [`WINDOW`] outcomes: a NodeClaim whose Node registered counts as a
//! success; one deleted at the launch or registration timeout counts as a failure. When at least
//! half the window ([`UNHEALTHY_FAILURES`] of [`WINDOW`]) failed, the condition is False with the
//! last failure's reason; otherwise, once a node has registered, it is True; before any verdict it
//! is Unknown. A change to the NodePool's spec or to its node class starts the window afresh, as
//! the problem may be fixed.
//!
//! The windows live in memory: after a restart a pool's window is seeded from the condition it
//! already has (True as one success, False as enough failures to stay False), so a restart does not
//! forget a verdict. Failure modes: none; a pool never judged reads Unknown.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, MutexGuard, PoisonError},
};

use joist_messages::{
    apis::NodePool,
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

/// The condition this module judges.
const HEALTHY: ConditionType = ConditionType::NodeRegistrationHealthy;

/// The condition's type.
/// Outcomes a NodePool's window holds.
pub const WINDOW: usize = 4;
/// Failures in the window that make the pool unhealthy.
pub const UNHEALTHY_FAILURES: usize = WINDOW / 2;

/// A failed registration: the reason and message the condition shows while it is False.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `RegistrationFailed`, or the reason of the claim's last launch attempt (`LaunchFailed`).
    pub reason: String,
    /// What went wrong, for the user.
    pub message: String,
}

impl Failure {
    /// A claim whose instance launched but whose Node never registered.
    pub fn registration() -> Self {
        Self {
            reason: "RegistrationFailed".to_owned(),
            message: "Failed to register node".to_owned(),
        }
    }
}

/// One NodePool's recent outcomes (`true`: registered), newest last.
#[derive(Debug, Default)]
struct Window {
    outcomes: VecDeque<bool>,
    last_failure: Option<Failure>,
}

impl Window {
    fn record(&mut self, registered: bool) {
        if self.outcomes.len() == WINDOW {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(registered);
    }

    fn failures(&self) -> usize {
        self.outcomes.iter().filter(|registered| !**registered).count()
    }

    /// Seeds an empty window from the condition a pool already carries.
    fn seed(&mut self, condition: &Condition) {
        match condition.status.as_str() {
            "True" => self.record(true),
            "False" => {
                for _ in 0..UNHEALTHY_FAILURES {
                    self.record(false);
                }
                self.last_failure = Some(Failure {
                    reason: condition.reason.clone(),
                    message: condition.message.clone(),
                });
            }
            _ => {}
        }
    }

    /// The condition.
    fn verdict(&self) -> ConditionUpdate {
        if self.failures() >= UNHEALTHY_FAILURES {
            let failure = self.last_failure.clone().unwrap_or_else(Failure::registration);
            return ConditionUpdate::new(HEALTHY, ConditionStatus::False, failure.reason)
                .with_message(failure.message);
        }
        if self.outcomes.contains(&true) {
            return ConditionUpdate::holds(HEALTHY);
        }
        ConditionUpdate::new(HEALTHY, ConditionStatus::Unknown, "AwaitingReconciliation").with_message(
            "no node of this NodePool has registered or failed to since its spec or node class changed",
        )
    }
}

/// Every NodePool's window (see the module docs), by NodePool name.
#[derive(Debug, Default)]
pub struct RegistrationHealth(Mutex<HashMap<String, Window>>);

impl RegistrationHealth {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Window>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A NodeClaim of `pool` registered its Node.
    pub fn registered(&self, pool: &str) {
        self.lock().entry(pool.to_owned()).or_default().record(true);
    }

    /// A NodeClaim of `pool` was deleted at the launch or registration timeout.
    pub fn failed(&self, pool: &str, failure: Failure) {
        let mut windows = self.lock();
        let window = windows.entry(pool.to_owned()).or_default();
        window.record(false);
        window.last_failure = Some(failure);
    }

    /// Drops the window of a NodePool that is gone (one of the same name starts afresh).
    pub fn forget(&self, pool: &str) {
        self.lock().remove(pool);
    }

    /// The `NodeRegistrationHealthy` condition `pool` should carry, given
    /// the generation of its node class now. Starts the pool's window afresh when the pool's spec
    /// or its node class changed since the condition was last written.
    pub fn condition(&self, pool: &NodePool, class_generation: Option<i64>) -> ConditionUpdate {
        let current = pool
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, HEALTHY));
        let class_seen = pool
            .status
            .as_ref()
            .and_then(|s| s.node_class_observed_generation);
        let mut windows = self.lock();
        let window = windows.entry(pool.name_any()).or_default();
        let changed = current.is_none_or(|c| c.observed_generation != pool.metadata.generation)
            || class_seen != class_generation;
        if changed {
            *window = Window::default();
        } else if window.outcomes.is_empty()
            && let Some(condition) = current
        {
            window.seed(condition);
        }
        window.verdict()
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::apis::NodePoolStatus;

    use super::*;

    fn pool(generation: i64, class_seen: i64, condition: Option<(&str, &str)>) -> NodePool {
        let mut pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default", "generation": generation},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []
            }}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        pool.status = Some(NodePoolStatus {
            node_class_observed_generation: Some(class_seen),
            conditions: condition
                .map(|(status, reason)| {
                    serde_json::from_value(serde_json::json!({
                        "type": HEALTHY.as_str(), "status": status, "reason": reason,
                        "message": "seen before", "observedGeneration": generation,
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }))
                    .unwrap_or_else(|e| panic!("{e}"))
                })
                .into_iter()
                .collect(),
            ..Default::default()
        });
        pool
    }

    fn status(health: &RegistrationHealth, pool: &NodePool) -> &'static str {
        health.condition(pool, Some(1)).status.as_str()
    }

    fn verdict(health: &RegistrationHealth, pool: &NodePool) -> (&'static str, String, String) {
        let condition = health.condition(pool, Some(1));
        (condition.status.as_str(), condition.reason, condition.message)
    }

    #[test]
    fn half_the_window_failing_makes_the_pool_unhealthy_and_it_recovers_only_once_most_register() {
        let health = RegistrationHealth::default();
        let judged = pool(1, 1, Some(("Unknown", "AwaitingReconciliation")));
        let timeout = || Failure {
            reason: "LaunchFailed".to_owned(),
            message: "UnauthorizedOperation: not allowed".to_owned(),
        };
        assert_eq!(status(&health, &judged), "Unknown");
        health.failed("default", timeout());
        assert_eq!(
            status(&health, &judged),
            "Unknown",
            "one failure alone is no verdict"
        );
        health.failed("default", timeout());
        let (status_now, reason, message) = verdict(&health, &judged);
        assert_eq!(
            (status_now, reason.as_str(), message.as_str()),
            ("False", "LaunchFailed", "UnauthorizedOperation: not allowed")
        );
        health.registered("default");
        health.registered("default");
        assert_eq!(
            status(&health, &judged),
            "False",
            "two failures of four still fail"
        );
        health.registered("default");
        assert_eq!(status(&health, &judged), "True");
        health.failed("default", Failure::registration());
        assert_eq!(status(&health, &judged), "True", "one failure of four is healthy");
    }

    #[test]
    fn a_restart_keeps_the_verdict_the_pool_carries() {
        let health = RegistrationHealth::default();
        let unhealthy = pool(2, 1, Some(("False", "RegistrationFailed")));
        let (status_now, reason, message) = verdict(&health, &unhealthy);
        assert_eq!(
            (status_now, reason.as_str(), message.as_str()),
            ("False", "RegistrationFailed", "seen before")
        );
        health.registered("default");
        assert_eq!(status(&health, &unhealthy), "False", "seeded as two failures");
        let healthy = RegistrationHealth::default();
        let judged = pool(2, 1, Some(("True", HEALTHY.as_str())));
        assert_eq!(status(&healthy, &judged), "True");
        healthy.failed("default", Failure::registration());
        assert_eq!(status(&healthy, &judged), "True", "seeded as one success");
    }

    #[test]
    fn a_changed_spec_or_node_class_starts_the_window_afresh() {
        let health = RegistrationHealth::default();
        health.failed("default", Failure::registration());
        health.failed("default", Failure::registration());
        let judged = pool(3, 1, Some(("False", "RegistrationFailed")));
        assert_eq!(status(&health, &judged), "False");
        assert_eq!(
            health.condition(&judged, Some(2)).status.as_str(),
            "Unknown",
            "the node class changed"
        );
        health.failed("default", Failure::registration());
        health.failed("default", Failure::registration());
        let edited = pool(4, 1, Some(("False", "RegistrationFailed")));
        let edited = NodePool {
            status: edited.status.map(|mut s| {
                s.conditions[0].observed_generation = Some(3);
                s
            }),
            ..edited
        };
        assert_eq!(status(&health, &edited), "Unknown", "the pool's spec changed");
        assert_eq!(status(&health, &pool(1, 1, None)), "Unknown", "no condition yet");
        health.failed("default", Failure::registration());
        health.failed("default", Failure::registration());
        health.forget("default");
        let carried = pool(5, 1, Some(("Unknown", "AwaitingReconciliation")));
        assert_eq!(
            status(&health, &carried),
            "Unknown",
            "a pool deleted and made again"
        );
    }
}

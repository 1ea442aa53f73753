//! How a Deployment moves its pods from its old ReplicaSets to the one of its current template, as
//! the Kubernetes Deployment controller does: `RollingUpdate` (the default) adds new pods while the
//! total stays within `replicas + maxSurge` and removes old ones while the available pods stay at
//! `replicas - maxUnavailable` or more, unavailable old pods first; `Recreate` removes every old
//! pod before the first new one is created. Pure arithmetic over replica counts, run again on every
//! change of the Deployment, its ReplicaSets or their pods.
//!
//! Left out: proportional scaling of a Deployment resized mid-rollout (the new ReplicaSet takes the
//! difference), `minReadySeconds`, `paused` and `progressDeadlineSeconds`.

use serde_json::Value;

use crate::object::Pointer;

/// One ReplicaSet, as a rollout counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Replicas it is asked for (`spec.replicas`).
    pub replicas: i64,
    /// Its pods that exist, shutting down or not (`status.replicas`).
    pub pods: i64,
    /// Its pods that are available (`status.availableReplicas`).
    pub available: i64,
}

/// How a Deployment replaces its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Every old pod goes before the first new one comes.
    Recreate,
    /// Old and new pods overlap, within these bounds (in pods).
    RollingUpdate {
        /// Pods allowed above `replicas`.
        max_surge: i64,
        /// Pods allowed below `replicas` that are not available.
        max_unavailable: i64,
    },
}

impl Strategy {
    /// The strategy of `deployment`, its percentages resolved against `desired` replicas
    /// (`maxSurge` rounded up, `maxUnavailable` down, both 25 % by default; when both come to
    /// zero, one pod may be unavailable, as Kubernetes resolves it).
    pub fn of(deployment: &Value, desired: i64) -> Self {
        let strategy = deployment.at("/spec/strategy");
        if strategy.and_then(|s| s["type"].as_str()) == Some("Recreate") {
            return Self::Recreate;
        }
        let bound = |field: &str, round_up: bool| {
            let value = strategy.and_then(|s| s.at(&format!("/rollingUpdate/{field}")));
            resolve(value, desired, round_up).unwrap_or_else(|| resolve_percent(25, desired, round_up))
        };
        let max_surge = bound("maxSurge", true);
        let max_unavailable = bound("maxUnavailable", false);
        Self::RollingUpdate {
            max_surge,
            max_unavailable: if max_surge == 0 && max_unavailable == 0 {
                1
            } else {
                max_unavailable
            },
        }
    }

    /// `maxUnavailable` in pods (all of them for `Recreate`).
    pub fn max_unavailable(self, desired: i64) -> i64 {
        match self {
            Self::Recreate => desired,
            Self::RollingUpdate { max_unavailable, .. } => max_unavailable,
        }
    }

    /// The replicas to ask of the current template's ReplicaSet (`new`) and of each old one, in
    /// the order given (oldest first), for a Deployment of `desired` replicas.
    pub fn targets(self, desired: i64, new: Counts, old: &[Counts]) -> (i64, Vec<i64>) {
        let mut old_targets: Vec<i64> = old.iter().map(|o| o.replicas).collect();
        if old.iter().all(|o| o.replicas == 0) {
            // Nothing to roll away from: plain scaling, once every old pod is gone for Recreate.
            let old_pods_left = old.iter().any(|o| o.pods > 0);
            let new_target = match self {
                Self::Recreate if old_pods_left => new.replicas,
                _ => desired,
            };
            return (new_target, old_targets);
        }
        let Self::RollingUpdate {
            max_surge,
            max_unavailable,
        } = self
        else {
            return (new.replicas, vec![0; old.len()]);
        };
        if new.replicas > desired {
            return (desired, old_targets);
        }
        let total: i64 = new.replicas + old_targets.iter().sum::<i64>();
        let room = desired + max_surge - total;
        if new.replicas < desired && room > 0 {
            return ((new.replicas + room).min(desired), old_targets);
        }
        let min_available = desired - max_unavailable;
        // Unavailable old pods go first: removing them costs no availability.
        let new_unavailable = new.replicas - new.available;
        let mut may_remove = (total - min_available - new_unavailable).max(0);
        for (target, counts) in old_targets.iter_mut().zip(old) {
            let unhealthy = (*target - counts.available).max(0).min(may_remove);
            *target -= unhealthy;
            may_remove -= unhealthy;
        }
        // Then available ones, oldest first, while enough stay available. Both steps stay within
        // what the replica counts allow, so a ReplicaSet status that lags its pods cannot make
        // more go than may.
        let available = new.available + old.iter().map(|o| o.available).sum::<i64>();
        let mut surplus = (available - min_available).max(0).min(may_remove);
        for target in &mut old_targets {
            let removed = (*target).min(surplus);
            *target -= removed;
            surplus -= removed;
        }
        (new.replicas, old_targets)
    }
}

/// A bound given as a number of pods or a percentage of `desired`.
fn resolve(value: Option<&Value>, desired: i64, round_up: bool) -> Option<i64> {
    match value? {
        Value::Number(n) => n.as_i64(),
        Value::String(text) => text
            .strip_suffix('%')?
            .parse::<i64>()
            .ok()
            .map(|p| resolve_percent(p, desired, round_up)),
        _ => None,
    }
}

fn resolve_percent(percent: i64, desired: i64, round_up: bool) -> i64 {
    let scaled = percent * desired;
    if round_up {
        (scaled + 99) / 100
    } else {
        scaled / 100
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn counts(replicas: i64, available: i64) -> Counts {
        Counts {
            replicas,
            pods: replicas,
            available,
        }
    }

    #[test]
    fn the_defaults_are_a_quarter_each_way() {
        let deployment = json!({"spec": {}});
        assert_eq!(
            Strategy::of(&deployment, 10),
            Strategy::RollingUpdate {
                max_surge: 3,
                max_unavailable: 2
            }
        );
        let exact = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}});
        assert_eq!(
            Strategy::of(&exact, 10),
            Strategy::RollingUpdate {
                max_surge: 0,
                max_unavailable: 1
            },
            "both zero: one at a time"
        );
        let recreate = json!({"spec": {"strategy": {"type": "Recreate"}}});
        assert_eq!(Strategy::of(&recreate, 10), Strategy::Recreate);
    }

    /// Runs a rollout of `desired` pods to the end, every pod becoming available at once, and
    /// returns the most pods alive and the fewest available at any step.
    fn roll(strategy: Strategy, desired: i64) -> (i64, i64, usize) {
        let mut new = counts(0, 0);
        let mut old = [counts(desired, desired)];
        let (mut most, mut fewest, mut steps) = (desired, desired, 0);
        while !(new.available == desired && old[0].pods == 0) {
            steps += 1;
            assert!(steps < 100, "the rollout does not finish: {new:?} {old:?}");
            let (new_target, old_targets) = strategy.targets(desired, new, &old);
            new = counts(new_target, new_target);
            old[0] = counts(old_targets[0], old_targets[0]);
            most = most.max(new.pods + old[0].pods);
            fewest = fewest.min(new.available + old[0].available);
        }
        (most, fewest, steps)
    }

    #[test]
    fn a_rolling_update_stays_within_its_surge_and_availability() {
        let strategy = Strategy::RollingUpdate {
            max_surge: 1,
            max_unavailable: 0,
        };
        let (most, fewest, steps) = roll(strategy, 4);
        assert_eq!((most, fewest), (5, 4), "one extra pod, none missing");
        assert!(steps >= 4, "one pod at a time: {steps} steps");
        let (most, fewest, _) = roll(Strategy::of(&json!({"spec": {}}), 8), 8);
        assert!(most <= 10 && fewest >= 6, "{most} {fewest}");
    }

    #[test]
    fn new_pods_that_are_not_available_hold_the_old_ones() {
        let strategy = Strategy::RollingUpdate {
            max_surge: 1,
            max_unavailable: 0,
        };
        let (new_target, old) = strategy.targets(4, counts(1, 0), &[counts(4, 4)]);
        assert_eq!((new_target, old), (1, vec![4]), "the surge pod is not up yet");
        let (_, old) = strategy.targets(4, counts(1, 1), &[counts(4, 4)]);
        assert_eq!(old, vec![3], "once it is, an old one goes");
    }

    #[test]
    fn unavailable_old_pods_go_first() {
        let strategy = Strategy::RollingUpdate {
            max_surge: 0,
            max_unavailable: 1,
        };
        // Two old sets, the older one's pods unavailable: of the one pod the budget lets go (four
        // pods, three must stay), an unavailable one goes, and no available one.
        let (_, old) = strategy.targets(4, counts(0, 0), &[counts(2, 0), counts(2, 2)]);
        assert_eq!(old, vec![1, 2]);
        let (_, old) = strategy.targets(4, counts(0, 0), &[counts(2, 2), counts(2, 2)]);
        assert_eq!(old, vec![1, 2], "all available: the oldest set's go first");
    }

    #[test]
    fn recreate_removes_every_old_pod_before_the_first_new_one() {
        let (new_target, old) = Strategy::Recreate.targets(3, counts(0, 0), &[counts(3, 3)]);
        assert_eq!((new_target, old), (0, vec![0]));
        let shutting_down = Counts {
            replicas: 0,
            pods: 2,
            available: 0,
        };
        let (new_target, _) = Strategy::Recreate.targets(3, counts(0, 0), &[shutting_down]);
        assert_eq!(new_target, 0, "old pods still shutting down");
        assert_eq!(
            Strategy::Recreate
                .targets(3, counts(0, 0), &[Counts::default()])
                .0,
            3
        );
    }
}

//! Node repair (Karpenter's `NodeRepair` feature gate), decided without I/O: a Node whose
//! condition matches one of the cloud's [`RepairPolicy`]s for longer than the policy tolerates is
//! repaired, that is its claim is deleted with a termination deadline of now (forceful: no budget
//! applies and no drain is waited for), unless more than [`UNHEALTHY_NODES_ALLOWED`] of its
//! NodePool's nodes are broken too, which says the fault is not the node's: then nothing is
//! repaired and a `NodeRepairBlocked` event says why, again every [`BLOCKED_RETRY`].
//!
//! A condition that recovers, or flaps, moves its last transition time and so restarts its
//! toleration.

use std::{sync::Arc, time::Duration};

use joist_provider::repair::RepairPolicy;
use k8s_openapi::api::core::v1::{Node, NodeCondition};

/// The share of a NodePool's nodes, in percent and rounded up to a whole node, that may be broken
/// while nodes are still repaired (Karpenter's 20 %: one node of three may be).
pub const UNHEALTHY_NODES_ALLOWED: usize = 20;

/// How soon a blocked repair looks again.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(5 * 60);

/// What repair makes of a claim's Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Nothing to repair (or the gate is off, or the claim is being deleted anyway).
    Healthy,
    /// Broken, but within its toleration: look again after this long.
    Tolerated(Duration),
    /// Broken for too long: replace it now.
    Due {
        /// The broken condition's type (`Ready`).
        condition: String,
        /// Why, for the event and the log.
        message: String,
    },
    /// Broken for too long, but too many of its NodePool's nodes are too.
    Blocked {
        /// Why, for the event.
        message: String,
    },
}

/// The condition of `node` that `policy` calls broken, if it shows it.
fn matching<'a>(node: &'a Node, policy: &RepairPolicy) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == policy.condition && c.status == policy.status)
}

/// The broken condition of `node` whose toleration ends first, and how long is left of it.
fn broken<'a>(
    node: &'a Node,
    policies: &[RepairPolicy],
    now_seconds: i64,
) -> Option<(&'a NodeCondition, RepairPolicy, Duration)> {
    policies
        .iter()
        .filter_map(|policy| {
            let condition = matching(node, policy)?;
            let since = condition
                .last_transition_time
                .as_ref()
                .map_or(now_seconds, |t| t.0.as_second());
            let held = Duration::from_secs(u64::try_from(now_seconds - since).unwrap_or(0));
            Some((condition, *policy, policy.toleration.saturating_sub(held)))
        })
        .min_by_key(|(_, _, left)| *left)
}

/// Whether any of `node`'s conditions matches a policy (however long it has held).
fn is_broken(node: &Node, policies: &[RepairPolicy]) -> bool {
    policies.iter().any(|policy| matching(node, policy).is_some())
}

/// Whether a pool of `total` nodes with `broken` of them broken may still repair one: up to
/// [`UNHEALTHY_NODES_ALLOWED`] percent, rounded up.
pub fn pool_tolerates(broken: usize, total: usize) -> bool {
    broken <= (total * UNHEALTHY_NODES_ALLOWED).div_ceil(100)
}

/// What repair makes of `node` (see the module docs); `pool_nodes` lists the Nodes of its
/// NodePool, and is asked only once a repair is due.
pub fn assess(
    node: &Node,
    policies: &[RepairPolicy],
    now_seconds: i64,
    pool_nodes: impl FnOnce() -> Vec<Arc<Node>>,
) -> Repair {
    let Some((condition, policy, left)) = broken(node, policies, now_seconds) else {
        return Repair::Healthy;
    };
    if !left.is_zero() {
        return Repair::Tolerated(left);
    }
    let nodes = pool_nodes();
    let broken_nodes = nodes.iter().filter(|n| is_broken(n, policies)).count();
    if !pool_tolerates(broken_nodes, nodes.len()) {
        return Repair::Blocked {
            message: format!(
                "more than {UNHEALTHY_NODES_ALLOWED}% of the nodepool's nodes are unhealthy ({broken_nodes} of {})",
                nodes.len()
            ),
        };
    }
    Repair::Due {
        condition: condition.type_.clone(),
        message: format!(
            "its {} condition has been {} for over {} minutes",
            condition.type_,
            condition.status,
            policy.toleration.as_secs() / 60
        ),
    }
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use joist_provider::repair::EC2_REPAIR_POLICIES;
    use k8s_openapi::{api::core::v1::NodeStatus, apimachinery::pkg::apis::meta::v1::Time};

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn node(conditions: &[(&str, &str, i64)]) -> Arc<Node> {
        let conditions = conditions
            .iter()
            .map(|&(type_, status, since)| NodeCondition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                last_transition_time: Some(Time(
                    Timestamp::from_second(since).unwrap_or_else(|e| panic!("{e}")),
                )),
                ..NodeCondition::default()
            })
            .collect();
        Arc::new(Node {
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    fn assess_alone(node: &Node) -> Repair {
        assess(node, EC2_REPAIR_POLICIES, NOW, Vec::new)
    }

    #[test]
    fn a_ready_node_is_healthy() {
        assert_eq!(
            assess_alone(&node(&[("Ready", "True", NOW - 7200)])),
            Repair::Healthy
        );
    }

    #[test]
    fn a_not_ready_node_is_tolerated_for_thirty_minutes() {
        let ten_minutes = node(&[("Ready", "False", NOW - 600)]);
        assert_eq!(
            assess_alone(&ten_minutes),
            Repair::Tolerated(Duration::from_secs(20 * 60))
        );
        let thirty = node(&[("Ready", "Unknown", NOW - 1800)]);
        assert!(matches!(assess_alone(&thirty), Repair::Due { .. }));
    }

    #[test]
    fn the_condition_ending_first_decides() {
        let gpu = node(&[
            ("Ready", "False", NOW - 60),
            ("AcceleratedHardwareReady", "False", NOW - 600),
        ]);
        let Repair::Due { condition, message } = assess_alone(&gpu) else {
            panic!("a failed accelerator is repaired after 10 minutes");
        };
        assert_eq!(condition, "AcceleratedHardwareReady");
        assert!(message.contains("over 10 minutes"), "{message}");
    }

    #[test]
    fn a_condition_that_recovered_restarts_its_toleration() {
        // Broken 40 minutes ago, recovered, broken again 5 minutes ago: 25 minutes left.
        let flapped = node(&[("Ready", "False", NOW - 300)]);
        assert_eq!(
            assess_alone(&flapped),
            Repair::Tolerated(Duration::from_secs(25 * 60))
        );
    }

    #[test]
    fn one_broken_node_of_three_is_repaired_two_are_not() {
        assert!(pool_tolerates(1, 3));
        assert!(!pool_tolerates(2, 3));
        assert!(pool_tolerates(2, 10));
        assert!(!pool_tolerates(3, 10));
        let broken = node(&[("Ready", "False", NOW - 3600)]);
        let healthy = node(&[("Ready", "True", NOW - 3600)]);
        let pool = |broken_count: usize| {
            let mut nodes = vec![healthy.clone(); 3 - broken_count];
            nodes.extend(std::iter::repeat_n(broken.clone(), broken_count));
            nodes
        };
        assert!(matches!(
            assess(&broken, EC2_REPAIR_POLICIES, NOW, || pool(1)),
            Repair::Due { .. }
        ));
        let Repair::Blocked { message } = assess(&broken, EC2_REPAIR_POLICIES, NOW, || pool(2)) else {
            panic!("two broken nodes of three block repair");
        };
        assert!(message.contains("2 of 3"), "{message}");
    }
}

//! Instance health as the cloud reports it: EC2's instance status checks (DescribeInstanceStatus),
//! read as Karpenter's AWS provider (v1.12 on) reads them, without I/O.
//!
//! A cloud lists the instances whose instance status or system status check is impaired, or that
//! have a scheduled event of a kind that means the host is going away ([`InstanceHealth`], with one
//! [`StatusCheck`] per detail it gave). [`unhealthy`] then says which categories count: a failed
//! instance or system check once it has been impaired for [`UNHEALTHY_AFTER`], a scheduled event at
//! once (its time is often in the future; a host with one is vacated now, as the same event from
//! the interruption queue is). Checks of attached EBS volumes are not read: a volume a pod mounts
//! does not make the node unhealthy.
//!
//! What the controllers do with it: each category is handled as an interruption of its
//! [`kind`](StatusCategory::kind): an instance or system check failure terminates the NodeClaim at
//! once (its instance is already broken: no graceful drain), a scheduled event drains it as the
//! interruption queue's scheduled change does.

use std::{collections::BTreeSet, time::Duration};

use crate::interruption::Kind;

/// How long an instance or system check must have failed before the instance is unhealthy
/// (Karpenter's `UnhealthyThreshold`).
pub const UNHEALTHY_AFTER: Duration = Duration::from_secs(120);

/// How often the cloud is asked (Karpenter's `InstanceStatusInterval`).
pub const POLL_INTERVAL: Duration = Duration::from_secs(60);

/// The scheduled event codes that mean the instance's host is going away: the `event.code` filter
/// of the cloud's query.
pub const EVENT_CODES: [&str; 5] = [
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
];

/// Which of EC2's checks a detail belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusCategory {
    /// The instance's own reachability check (the OS, its network).
    Instance,
    /// The host's check (power, network, hardware).
    System,
    /// A scheduled event: reboot, maintenance, retirement, stop.
    Event,
}

impl StatusCategory {
    /// The `category` label of `karpenter_interruption_instance_status_unhealthy_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Instance => "InstanceStatus",
            Self::System => "SystemStatus",
            Self::Event => "EventStatus",
        }
    }

    /// The kind of interruption it is handled as: the claim is deleted, at once for a broken
    /// instance or host ([`Kind::forceful`]).
    pub fn kind(self) -> Kind {
        match self {
            Self::Instance => Kind::InstanceStatus,
            Self::System => Kind::SystemStatus,
            Self::Event => Kind::EventStatus,
        }
    }
}

/// One detail of a status the cloud reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCheck {
    /// Which check.
    pub category: StatusCategory,
    /// The check's name (`reachability`) or the event's code (`system-maintenance`).
    pub name: String,
    /// Whether it failed (a scheduled event always counts as failed).
    pub failed: bool,
    /// Since when, in seconds since the Unix epoch, when the cloud says.
    pub impaired_since: Option<i64>,
}

/// An instance the cloud reported as impaired or with a scheduled event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceHealth {
    /// The cloud's instance id (`i-0123…`).
    pub instance_id: String,
    /// What it reported.
    pub checks: Vec<StatusCheck>,
}

/// The categories that make the instance unhealthy at `now` (seconds since the Unix epoch): see
/// the module docs. A failed check without a start time has failed long enough.
pub fn unhealthy(health: &InstanceHealth, now: i64) -> BTreeSet<StatusCategory> {
    let threshold = i64::try_from(UNHEALTHY_AFTER.as_secs()).unwrap_or(i64::MAX);
    health
        .checks
        .iter()
        .filter(|check| check.failed)
        .filter(|check| {
            check.category == StatusCategory::Event
                || check
                    .impaired_since
                    .is_none_or(|since| now.saturating_sub(since) >= threshold)
        })
        .map(|check| check.category)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(category: StatusCategory, failed: bool, impaired_since: Option<i64>) -> StatusCheck {
        StatusCheck {
            category,
            name: "reachability".into(),
            failed,
            impaired_since,
        }
    }

    fn health(checks: Vec<StatusCheck>) -> InstanceHealth {
        InstanceHealth {
            instance_id: "i-0123".into(),
            checks,
        }
    }

    #[test]
    fn a_failed_check_counts_once_it_has_failed_for_two_minutes() {
        let failing = health(vec![check(StatusCategory::System, true, Some(1_000))]);
        assert!(
            unhealthy(&failing, 1_119).is_empty(),
            "119 s is not yet long enough"
        );
        assert_eq!(
            unhealthy(&failing, 1_120),
            BTreeSet::from([StatusCategory::System])
        );
    }

    #[test]
    fn a_scheduled_event_counts_at_once_and_a_passing_check_never() {
        let reported = health(vec![
            check(StatusCategory::Event, true, Some(5_000)),
            check(StatusCategory::Instance, false, Some(0)),
        ]);
        assert_eq!(
            unhealthy(&reported, 1_000),
            BTreeSet::from([StatusCategory::Event])
        );
    }

    #[test]
    fn a_failed_check_without_a_start_time_counts() {
        let failing = health(vec![check(StatusCategory::Instance, true, None)]);
        assert_eq!(unhealthy(&failing, 0), BTreeSet::from([StatusCategory::Instance]));
    }
}

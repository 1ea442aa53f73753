//! Status conditions, typed: every condition Joist writes or reads on NodeClaims, NodePools,
//! EC2NodeClasses and NodeOverlays, their statuses, the reasons Joist deletes a NodeClaim for, and
//! the one way to read and to set a condition list. The names are Karpenter's, so `kubectl`,
//! Karpenter's tooling and its dashboards read Joist's objects unchanged.
//!
//! Nothing here fails: a condition list without the wanted type reads as "not true".

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// NodeClaim: the cloud launched its instance.
    Launched,
    /// NodeClaim: its Node registered.
    Registered,
    /// NodeClaim: its Node is Ready, its startup taints are gone and its resources are reported.
    Initialized,
    /// Every kind: the object is usable (for a NodeClaim, its Node's readiness).
    Ready,
    /// NodeClaim: it no longer matches its NodePool or node class; the reason says how.
    Drifted,
    /// NodeClaim: consolidation may take it (its `consolidateAfter` has passed).
    Consolidatable,
    /// NodeClaim: its Node has been drained.
    Drained,
    /// NodeClaim: its Node's volumes are detached.
    VolumesDetached,
    /// NodeClaim: its instance is terminating.
    InstanceTerminating,
    /// NodeClaim: a disruption command took it; the reason is the disruption reason.
    DisruptionReason,
    /// NodePool, EC2NodeClass, NodeOverlay: the spec passed Karpenter's runtime validation.
    ValidationSucceeded,
    /// NodePool: its node class exists and is Ready.
    NodeClassReady,
    /// NodePool: its recent nodes launched and registered.
    NodeRegistrationHealthy,
    /// EC2NodeClass: its subnet selector found subnets.
    SubnetsReady,
    /// EC2NodeClass: its security group selector found security groups.
    SecurityGroupsReady,
    /// EC2NodeClass: its AMI selector found images.
    AMIsReady,
    /// EC2NodeClass: its instance profile exists.
    InstanceProfileReady,
    /// EC2NodeClass: its capacity reservation selector was resolved (found or not).
    CapacityReservationsReady,
    /// EC2NodeClass: its placement group selector found a group, or it has none.
    PlacementGroupReady,
    /// CapacityBuffer: its pod template and count were resolved.
    ReadyForProvisioning,
    /// CapacityBuffer: whether its pods fit the capacity there is (True) or need new nodes.
    Provisioning,
}

impl ConditionType {
    /// The type as written in `status.conditions[].type`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Launched => "Launched",
            Self::Registered => "Registered",
            Self::Initialized => "Initialized",
            Self::Ready => "Ready",
            Self::Drifted => "Drifted",
            Self::Consolidatable => "Consolidatable",
            Self::Drained => "Drained",
            Self::VolumesDetached => "VolumesDetached",
            Self::InstanceTerminating => "InstanceTerminating",
            Self::DisruptionReason => "DisruptionReason",
            Self::ValidationSucceeded => "ValidationSucceeded",
            Self::NodeClassReady => "NodeClassReady",
            Self::NodeRegistrationHealthy => "NodeRegistrationHealthy",
            Self::SubnetsReady => "SubnetsReady",
            Self::SecurityGroupsReady => "SecurityGroupsReady",
            Self::AMIsReady => "AMIsReady",
            Self::InstanceProfileReady => "InstanceProfileReady",
            Self::CapacityReservationsReady => "CapacityReservationsReady",
            Self::PlacementGroupReady => "PlacementGroupReady",
            Self::ReadyForProvisioning => "ReadyForProvisioning",
            Self::Provisioning => "Provisioning",
        }
    }
}

impl fmt::Display for ConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`: not decided yet.
    Unknown,
}

impl ConditionStatus {
    /// The status as written in `status.conditions[].status`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// One condition to set: type, status, reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// The type.
    pub type_: ConditionType,
    /// The status.
    pub status: ConditionStatus,
    /// The reason, CamelCase.
    pub reason: String,
    /// The message, for a person; empty when the reason says it all.
    pub message: String,
}

impl ConditionUpdate {
    /// `type_` at `status` for `reason`, with no message.
    pub fn new(type_: ConditionType, status: ConditionStatus, reason: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: String::new(),
        }
    }

    /// `type_` true, with the type as its reason (Karpenter's convention for a condition that
    /// holds).
    pub fn holds(type_: ConditionType) -> Self {
        Self::new(type_, ConditionStatus::True, type_.as_str())
    }

    /// The same update with `message`.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }
}

/// The condition of type `type_`, if the list has one.
pub fn find(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// Whether the condition of type `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    has_status(conditions, type_, ConditionStatus::True)
}

/// Whether a condition of type `type_` has `status` (a list a careless writer gave the same type
/// twice answers for either).
pub fn has_status(conditions: &[Condition], type_: ConditionType, status: ConditionStatus) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_.as_str() && c.status == status.as_str())
}

/// Sets `update` in `conditions` at `now` for the object's `generation`; true when anything
/// changed. The transition time moves only when the status does.
pub fn set(
    conditions: &mut Vec<Condition>,
    now: Time,
    generation: Option<i64>,
    update: &ConditionUpdate,
) -> bool {
    let status = update.status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == update.type_.as_str()) {
        Some(c)
            if c.status == status
                && c.reason == update.reason
                && c.message == update.message
                && c.observed_generation == generation =>
        {
            false
        }
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            status.clone_into(&mut c.status);
            c.reason.clone_from(&update.reason);
            c.message.clone_from(&update.message);
            c.observed_generation = generation;
            true
        }
        None => {
            conditions.push(Condition {
                type_: update.type_.as_str().to_owned(),
                status: status.to_owned(),
                reason: update.reason.clone(),
                message: update.message.clone(),
                observed_generation: generation,
                last_transition_time: now,
            });
            true
        }
    }
}

/// Why Joist deletes a NodeClaim of its own accord (the event reason, and the `reason` label of
/// `karpenter_nodeclaims_disrupted_total` in snake case), as Karpenter names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimDeletion {
    /// Every offering the claim allowed was out of capacity.
    InsufficientCapacity,
    /// The instance was not launched within the launch timeout.
    LaunchTimeout,
    /// The Node did not register within the registration timeout.
    RegistrationTimeout,
    /// The Node did not initialize within the initialization timeout.
    InitializationTimeout,
    /// The claim's NodePool or node class is missing or cannot launch.
    NodeClassNotReady,
    /// The claim's Node is gone or being deleted.
    NodeDeleted,
}

impl ClaimDeletion {
    /// Karpenter's reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InsufficientCapacity => "InsufficientCapacityError",
            Self::LaunchTimeout => "LaunchTimeout",
            Self::RegistrationTimeout => "RegistrationTimeout",
            Self::InitializationTimeout => "InitializationTimeout",
            Self::NodeClassNotReady => "NodeClassNotReady",
            Self::NodeDeleted => "NodeDeleted",
        }
    }

    /// Whether the deletion means the launch failed: what a NodePool's launch circuit breaker
    /// counts.
    pub const fn is_failed_launch(self) -> bool {
        matches!(
            self,
            Self::InsufficientCapacity
                | Self::LaunchTimeout
                | Self::RegistrationTimeout
                | Self::InitializationTimeout
        )
    }
}

impl fmt::Display for ClaimDeletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(jiff::Timestamp::from_second(second).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn setting_moves_the_transition_time_only_when_the_status_changes() {
        let mut conditions = Vec::new();
        let launching = ConditionUpdate::new(ConditionType::Launched, ConditionStatus::Unknown, "Launching");
        assert!(set(&mut conditions, at(10), Some(1), &launching));
        assert!(
            !set(&mut conditions, at(20), Some(1), &launching),
            "nothing changed"
        );
        assert!(!is_true(&conditions, ConditionType::Launched));
        let retried = launching.clone().with_message("retrying");
        assert!(set(&mut conditions, at(30), Some(1), &retried));
        assert_eq!(
            conditions[0].last_transition_time,
            at(10),
            "the status did not change"
        );
        assert!(set(
            &mut conditions,
            at(40),
            Some(1),
            &ConditionUpdate::holds(ConditionType::Launched)
        ));
        assert_eq!(conditions[0].last_transition_time, at(40));
        assert_eq!(
            (conditions[0].reason.as_str(), conditions[0].message.as_str()),
            ("Launched", "")
        );
        assert!(is_true(&conditions, ConditionType::Launched));
        assert!(
            !is_true(&conditions, ConditionType::Registered),
            "a missing condition is not true"
        );
    }

    #[test]
    fn only_launch_failures_count_against_the_breaker() {
        assert!(ClaimDeletion::InsufficientCapacity.is_failed_launch());
        assert!(ClaimDeletion::InitializationTimeout.is_failed_launch());
        assert!(!ClaimDeletion::NodeDeleted.is_failed_launch());
        assert!(!ClaimDeletion::NodeClassNotReady.is_failed_launch());
        assert_eq!(
            ClaimDeletion::InsufficientCapacity.to_string(),
            "InsufficientCapacityError"
        );
    }
}

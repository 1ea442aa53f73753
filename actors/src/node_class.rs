//! EC2NodeClass status and finalizer: the cloud resolves a node class (subnets, security groups,
//! images, instance profile) and Joist publishes the result with Karpenter's conditions.
//!
//! - Resolution runs when the class changes and again every [`NODE_CLASS_REFRESH`], so a new image
//!   or subnet is picked up as Karpenter picks it up.
//! - A resolution that fails sets `Ready=False` with the cloud's message (NodePools using the
//!   class stop launching and say why), and is retried with backoff ([`retry_after`]) instead of
//!   waiting for the class to be edited. A transient failure (a throttle, a timeout) is retried
//!   the same way but keeps the class's last status, as Karpenter does: a class that resolved a
//!   minute ago still launches while EC2 throttles.
//! - A class its validation refuses (a rule the CRD cannot express, or a field Joist does not
//!   honour yet) is not resolved: it gets `ValidationSucceeded=False` and `Ready=False` with the
//!   problems, and a `ValidationFailed` warning, and is looked at again when it is edited.
//! - A class's `placementGroupSelector` is resolved with it ([`joist_provider::placement_group`]):
//!   `PlacementGroupReady=True` when the group is found (or none is asked for); when no available
//!   group matches, `PlacementGroupReady=False` (`PlacementGroupNotFound`), `Ready=False` and a
//!   warning, and the class is tried again with backoff, so a group created later is picked up
//!   within a minute; a failed lookup is `PlacementGroupResolutionFailed`.
//! - A class with kubelet fields its nodes' user data cannot carry (fields Joist does not interpret,
//!   on AL2 or Bottlerocket) is used all the same, as Karpenter uses it after its CRD pruned them,
//!   with a `KubeletFieldsNotPassed` warning naming them.
//! - Joist's finalizer keeps a class that NodeClaims still use from going away: its deletion waits,
//!   with a `WaitingOnNodeClaimTermination` event, until the last claim is gone.

use std::{sync::Arc, time::Duration};

use joist_messages::{
    apis::{EC2NodeClass, Validate},
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate},
    labels::TERMINATION_FINALIZER,
};
use joist_provider::{CloudError, placement_group};
use kube::ResourceExt;
use serde_json::json;

use crate::{
    decide::timing::doubling_backoff,
    effects::{
        cluster_claims::every_claim,
        kube_ops::{self, set_condition},
    },
    shared::Shared,
};

/// How often every node class is resolved again.
pub const NODE_CLASS_REFRESH: Duration = Duration::from_secs(60);

/// The first retry of a failed resolution; each further failure doubles it, up to
/// [`NODE_CLASS_REFRESH`].
pub const RESOLUTION_RETRY: Duration = Duration::from_secs(5);

const READY_PARTS: [ConditionType; 6] = [
    ConditionType::SubnetsReady,
    ConditionType::SecurityGroupsReady,
    ConditionType::AMIsReady,
    ConditionType::InstanceProfileReady,
    ConditionType::CapacityReservationsReady,
    ConditionType::ValidationSucceeded,
];

/// What one reconcile of a class came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The class resolved (or its status already answered its generation).
    Resolved,
    /// Resolution failed: try again after [`retry_after`].
    Failed,
    /// The class is invalid: nothing to do until it is edited.
    Invalid,
    /// The class is being deleted: its finalizer was released, or waits for its NodeClaims.
    Deleting,
}

/// The wait before retrying a resolution that failed `failures` times in a row.
pub fn retry_after(failures: u32) -> Duration {
    doubling_backoff(RESOLUTION_RETRY, failures, NODE_CLASS_REFRESH)
}

/// Whether the class is Ready for its current generation (its status answers its spec as it is).
pub fn is_current(class: &EC2NodeClass) -> bool {
    class.is_ready()
        && class
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, ConditionType::Ready))
            .is_some_and(|ready| ready.observed_generation == class.metadata.generation)
}

/// Resolves `class` and writes its status (see the module docs); `refresh` resolves even a class
/// whose status is current.
pub async fn reconcile(shared: Shared, class: Arc<EC2NodeClass>, refresh: bool) -> Outcome {
    if class.metadata.deletion_timestamp.is_some() {
        release(&shared, &class).await;
        return Outcome::Deleting;
    }
    let api = kube_ops::cluster::<EC2NodeClass>(&shared.client);
    if !class.finalizers().iter().any(|f| f == TERMINATION_FINALIZER) {
        let mut finalizers = class.finalizers().to_vec();
        finalizers.push(TERMINATION_FINALIZER.to_owned());
        let body =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": class.resource_version()}});
        if let Err(error) = kube_ops::patch(&api, &class.name_any(), body).await {
            tracing::debug!(ec2nodeclass = class.name_any(), %error, "adding the finalizer failed; next time");
        }
    }
    if is_current(&class) && !refresh {
        return Outcome::Resolved;
    }
    let generation = class.metadata.generation;
    let before = class.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let violations = class.validate();
    let outcome = if !violations.is_empty() {
        let problems = violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let newly = kube_ops::set_validation_failed(
            &mut status.conditions,
            &shared.clock,
            generation,
            ("ValidationFailed", &problems),
            "ValidationSucceeded is not True",
        );
        if newly {
            shared.events.warn(class.as_ref(), "ValidationFailed", &problems);
        }
        Outcome::Invalid
    } else {
        let dropped = class.spec.kubelet_fields_not_passed();
        if !dropped.is_empty() {
            let message = format!(
                "kubelet fields {} are not passed to {:?} nodes: only AL2023 nodes take any KubeletConfiguration field",
                dropped.join(", "),
                class.spec.user_data_family()
            );
            shared
                .events
                .warn(class.as_ref(), "KubeletFieldsNotPassed", &message);
        }
        resolve(&shared, &class, &mut status, generation).await
    };
    if status != before {
        let body = status_patch(&before, &status);
        if let Err(error) = kube_ops::patch_status(&api, &class.name_any(), body).await {
            tracing::warn!(ec2nodeclass = class.name_any(), %error, "writing the node class status failed");
        }
    }
    outcome
}

/// The merge patch that makes the status `before` into `after`: a field `after` leaves out (a
/// list that became empty, as when no capacity reservation is selected any more) is written as
/// null, or the server would keep the old value.
fn status_patch(
    before: &joist_messages::apis::EC2NodeClassStatus,
    after: &joist_messages::apis::EC2NodeClassStatus,
) -> serde_json::Value {
    let mut patch = serde_json::to_value(after).unwrap_or_default();
    if let (Some(fields), serde_json::Value::Object(was)) = (
        patch.as_object_mut(),
        serde_json::to_value(before).unwrap_or_default(),
    ) {
        for key in was.keys() {
            fields.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    patch
}

/// Resolves a valid `class` into `status`, with its conditions.
async fn resolve(
    shared: &Shared,
    class: &EC2NodeClass,
    status: &mut joist_messages::apis::EC2NodeClassStatus,
    generation: Option<i64>,
) -> Outcome {
    match shared.cloud.resolve_node_class(class).await {
        Ok(resolved) => {
            let conditions = std::mem::take(&mut status.conditions);
            *status = resolved;
            status.conditions = conditions;
            for part in READY_PARTS {
                let holds = ConditionUpdate::holds(part);
                set_condition(&mut status.conditions, &shared.clock, generation, &holds);
            }
            resolve_placement_group(shared, class, status, generation).await
        }
        Err(error @ CloudError::Transient { .. }) => {
            tracing::warn!(ec2nodeclass = class.name_any(), %error, "resolving the node class failed; its status stays");
            Outcome::Failed
        }
        Err(error) => {
            let message = error.to_string();
            tracing::warn!(ec2nodeclass = class.name_any(), %message, "resolving the node class failed");
            set_condition(
                &mut status.conditions,
                &shared.clock,
                generation,
                &ConditionUpdate::new(ConditionType::Ready, ConditionStatus::False, "ResolutionFailed")
                    .with_message(message.as_str()),
            );
            shared.events.warn(class, "ResolutionFailed", &message);
            Outcome::Failed
        }
    }
}

/// Resolves `class`'s placement group (its other parts resolved) and sets `PlacementGroupReady` and
/// `Ready` for it (see the module docs).
async fn resolve_placement_group(
    shared: &Shared,
    class: &EC2NodeClass,
    status: &mut joist_messages::apis::EC2NodeClassStatus,
    generation: Option<i64>,
) -> Outcome {
    let selector = class.spec.placement_group_selector.as_ref();
    let failed = |reason: &str, message: String| {
        ConditionUpdate::new(ConditionType::PlacementGroupReady, ConditionStatus::False, reason)
            .with_message(message.as_str())
    };
    let update = match (shared.cloud.resolve_placement_group(class).await, selector) {
        (Ok(Some(_)), _) | (Ok(None), None) => ConditionUpdate::holds(ConditionType::PlacementGroupReady),
        (Ok(None), Some(selector)) => failed(
            "PlacementGroupNotFound",
            format!(
                "spec.placementGroupSelector: placement group {} not found",
                placement_group::describe_selector(selector)
            ),
        ),
        (Err(error @ CloudError::Transient { .. }), _) => {
            tracing::warn!(ec2nodeclass = class.name_any(), %error, "resolving the placement group failed; its status stays");
            return Outcome::Failed;
        }
        (Err(error), _) => failed(
            "PlacementGroupResolutionFailed",
            format!("spec.placementGroupSelector: failed to resolve placement group: {error}"),
        ),
    };
    let ready = update.status == ConditionStatus::True;
    let newly = set_condition(&mut status.conditions, &shared.clock, generation, &update);
    let overall = if ready {
        ConditionUpdate::holds(ConditionType::Ready)
    } else {
        ConditionUpdate::new(ConditionType::Ready, ConditionStatus::False, "NotReady")
            .with_message("PlacementGroupReady is not True")
    };
    set_condition(&mut status.conditions, &shared.clock, generation, &overall);
    if ready {
        return Outcome::Resolved;
    }
    if newly {
        shared.events.warn(class, &update.reason, &update.message);
    }
    Outcome::Failed
}

/// Releases a deleted class's finalizer once no NodeClaim uses it.
async fn release(shared: &Shared, class: &EC2NodeClass) {
    if !class.finalizers().iter().any(|f| f == TERMINATION_FINALIZER) {
        return;
    }
    let name = class.name_any();
    let users = match &shared.settings.replica_shards {
        None => shared
            .read
            .node_claims()
            .iter()
            .filter(|c| c.spec.node_class_ref.name == name)
            .count(),
        // Another replica's claims may use the class too: the holder of shard 0 asks the API.
        Some(_) if !shared.settings.acts_cluster_wide() => return,
        Some(_) => match every_claim(&shared.client).await {
            Ok(claims) => claims.iter().filter(|c| c.node_class == name).count(),
            Err(error) => {
                tracing::warn!(ec2nodeclass = name, %error, "listing every nodeclaim failed; the class is kept");
                return;
            }
        },
    };
    if users > 0 {
        let message = format!("waiting on {users} NodeClaim(s) using the class to terminate");
        shared
            .events
            .normal(class, "WaitingOnNodeClaimTermination", &message);
        return;
    }
    let api = kube_ops::cluster::<EC2NodeClass>(&shared.client);
    if let Err(error) = kube_ops::remove_finalizer(&api, class).await {
        tracing::warn!(ec2nodeclass = name, %error, "releasing the node class failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_field_left_empty_is_written_as_null_so_the_server_drops_it() {
        use joist_messages::apis::{EC2NodeClassStatus, ec2nodeclass::ResolvedSecurityGroup};
        let group = ResolvedSecurityGroup {
            id: "sg-1".into(),
            name: None,
        };
        let before = EC2NodeClassStatus {
            security_groups: vec![group.clone()],
            instance_profile: Some("profile".into()),
            ..EC2NodeClassStatus::default()
        };
        let after = EC2NodeClassStatus {
            instance_profile: Some("profile".into()),
            ..EC2NodeClassStatus::default()
        };
        let patch = status_patch(&before, &after);
        assert_eq!(patch["securityGroups"], serde_json::Value::Null);
        assert_eq!(patch["instanceProfile"], "profile");
        assert!(patch.get("amis").is_none(), "a field neither had is not written");
    }

    #[test]
    fn failed_resolutions_back_off_up_to_the_refresh_period() {
        let waits: Vec<u64> = (1..=6).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
    }
}

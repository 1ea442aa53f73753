//! A launch's node class, as every provider checks it before it calls its cloud (Karpenter's
//! order), and drift: a claim's instance compared with what its class resolves to now
//! ([`drift`]), in EC2's order of reasons. The controllers hand the class in, read from their own
//! view of the cluster; no provider reads the API server for it.
//!
//! Failures: a class that is missing, not Ready or not resolved is
//! [`CloudError::NodeClassNotReady`] (the claim is deleted and its pods are simulated again).

use joist_messages::apis::{EC2NodeClass, EC2NodeClassStatus, ec2nodeclass::ResolvedSubnet};

use crate::{CloudError, Drift};

/// `class` (the claim's, named `name`) and its resolved status when it can launch; otherwise why
/// not.
pub fn launchable<'c>(
    name: &str,
    class: Option<&'c EC2NodeClass>,
) -> Result<(&'c EC2NodeClass, &'c EC2NodeClassStatus), CloudError> {
    let not_ready = |reason: &str| CloudError::NodeClassNotReady {
        node_class: name.to_owned(),
        reason: reason.to_owned(),
    };
    let class = class.ok_or_else(|| not_ready("not found"))?;
    if !class.is_ready() {
        return Err(not_ready("its Ready condition is not True"));
    }
    let status = class
        .status
        .as_ref()
        .ok_or_else(|| not_ready("its status is not resolved"))?;
    Ok((class, status))
}

/// Why an instance that booted `image_id` drifted from its class's resolved `status`: its image
/// is no longer one the class selects (`AMIDrift`), no subnet of the class holds it (`in_subnet`:
/// `SubnetDrift`), its `security_groups`, where the cloud tracks them, differ from the class's
/// (`SecurityGroupDrift`), or the capacity `reservation` it runs in is no longer one the class
/// selects (`CapacityReservationDrift`); `None` when it still matches.
pub fn drift(
    status: &EC2NodeClassStatus,
    image_id: &str,
    in_subnet: impl Fn(&ResolvedSubnet) -> bool,
    security_groups: Option<&[String]>,
    reservation: Option<&str>,
) -> Option<Drift> {
    let security_groups_differ = security_groups.is_some_and(|have| {
        let mut wanted: Vec<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
        let mut have: Vec<&str> = have.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        have.sort_unstable();
        wanted != have
    });
    let reservation_gone =
        reservation.is_some_and(|id| !status.capacity_reservations.iter().any(|r| r.id == id));
    let reason = if !status.amis.iter().any(|a| a.id == image_id) {
        "AMIDrift"
    } else if !status.subnets.iter().any(in_subnet) {
        "SubnetDrift"
    } else if security_groups_differ {
        "SecurityGroupDrift"
    } else if reservation_gone {
        "CapacityReservationDrift"
    } else {
        return None;
    };
    Some(Drift {
        reason: reason.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn class(conditions: serde_json::Value) -> EC2NodeClass {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
            "status": {"conditions": conditions}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_a_ready_class_launches_and_the_refusal_says_why() {
        let ready = class(
            json!([{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
        );
        assert!(launchable("default", Some(&ready)).is_ok());
        let unready = class(
            json!([{"type": "Ready", "status": "False", "reason": "SubnetsNotFound", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
        );
        let refused = launchable("default", Some(&unready))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            refused,
            Err("node class default is not ready: its Ready condition is not True".to_owned())
        );
        assert!(matches!(
            launchable("gone", None),
            Err(CloudError::NodeClassNotReady { node_class, reason }) if node_class == "gone" && reason == "not found"
        ));
    }
}

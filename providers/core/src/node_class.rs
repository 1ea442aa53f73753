//! The node class a launch needs, read from the cluster: every provider checks the claim's
//! EC2NodeClass the same way before it calls its cloud, as Karpenter does.
//!
//! Drift compares a claim's instance with what its class resolves to now ([`drift_basis`]), in
//! EC2's order of reasons ([`drift`]).
//!
//! Failures: a class that does not exist, or whose `Ready` condition is not `True`, is
//! [`CloudError::NodeClassNotReady`] (the claim is deleted and its pods are simulated again); an API
//! server that does not answer is `Transient`.

use joist_messages::apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, ec2nodeclass::ResolvedSubnet};
use kube::Api;

use crate::{CloudError, Drift};

/// The claim's EC2NodeClass, if it exists and is Ready (see the module docs).
pub async fn ready(client: &kube::Client, claim: &NodeClaim) -> Result<EC2NodeClass, CloudError> {
    let name = &claim.spec.node_class_ref.name;
    let not_ready = |reason: &str| CloudError::NodeClassNotReady {
        node_class: name.clone(),
        reason: reason.to_owned(),
    };
    let classes: Api<EC2NodeClass> = Api::all(client.clone());
    let class = classes
        .get_opt(name)
        .await
        .map_err(|e| CloudError::Transient {
            message: format!("reading EC2NodeClass {name}: {e}"),
        })?
        .ok_or_else(|| not_ready("not found"))?;
    let ready = class
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        Ok(class)
    } else {
        Err(not_ready("its Ready condition is not True"))
    }
}

/// What drift compares: the claim's provider ID and its class's resolved status; `None` when the
/// claim has no instance yet or the class has not been resolved.
pub async fn drift_basis<'a>(
    client: &kube::Client,
    claim: &'a NodeClaim,
) -> Result<Option<(&'a str, EC2NodeClassStatus)>, CloudError> {
    let Some(provider_id) = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) else {
        return Ok(None);
    };
    Ok(ready(client, claim)
        .await?
        .status
        .map(|status| (provider_id, status)))
}

/// Why an instance that booted `image_id` drifted from its class's resolved `status`: its image
/// is no longer one the class selects (`AMIDrift`), no subnet of the class holds it (`in_subnet`:
/// `SubnetDrift`), or its `security_groups`, where the cloud tracks them, differ from the class's
/// (`SecurityGroupDrift`); `None` when it still matches.
pub fn drift(
    status: &EC2NodeClassStatus,
    image_id: &str,
    in_subnet: impl Fn(&ResolvedSubnet) -> bool,
    security_groups: Option<&[String]>,
) -> Option<Drift> {
    let reason = if !status.amis.iter().any(|a| a.id == image_id) {
        "AMIDrift"
    } else if !status.subnets.iter().any(in_subnet) {
        "SubnetDrift"
    } else {
        let have = security_groups?;
        let mut wanted: Vec<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
        let mut have: Vec<&str> = have.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        have.sort_unstable();
        if wanted == have {
            return None;
        }
        "SecurityGroupDrift"
    };
    Some(Drift {
        reason: reason.to_owned(),
    })
}

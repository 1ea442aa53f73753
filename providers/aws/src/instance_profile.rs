//! Instance profiles for an EC2NodeClass that names a `spec.role`, as Karpenter manages them: one
//! per class, named `<cluster>_<16 hex digits>` from a hash of the region and the class's name,
//! tagged as the cluster's, holding exactly that role. Created when missing; a profile holding
//! another role (the class's role was changed) gets the new one in its place.
//!
//! Failures: an IAM error is returned with its operation (a role that does not exist fails
//! `AddRoleToInstanceProfile` with IAM's `NoSuchEntity`, and the class reports it). Deleting the
//! profile when its class is deleted is not built yet: the profile stays behind.

use aws_sdk_iam::types::Tag;

use joist_messages::labels::tags::EC2_NODE_CLASS;
use joist_provider::launch::cluster_tag;

use crate::{clients::AwsClients, error::AwsError};

/// The name of the instance profile of class `class` in `cluster` and `region`.
pub fn name(cluster: &str, region: &str, class: &str) -> String {
    format!(
        "{cluster}_{}",
        crate::short_hash(format!("{region}/{class}").as_bytes())
    )
}

/// The role's name in `role`, which may be a name or an ARN (`arn:aws:iam::1:role/path/Name`).
fn role_name(role: &str) -> &str {
    role.rsplit('/').next().unwrap_or(role)
}

/// The name of the instance profile holding `role` for `class`, creating or fixing it first.
pub async fn ensure(
    clients: &AwsClients,
    cluster: &str,
    class: &str,
    role: &str,
) -> Result<String, AwsError> {
    let profile = name(cluster, &clients.region, class);
    let role = role_name(role);
    let existing = match clients
        .iam
        .get_instance_profile()
        .instance_profile_name(&profile)
        .send()
        .await
    {
        Ok(output) => output.instance_profile().cloned(),
        Err(error) => {
            let error = error.into_service_error();
            if !error.is_no_such_entity_exception() {
                return Err(AwsError::api("GetInstanceProfile", error));
            }
            None
        }
    };
    let roles: Vec<String> = match existing {
        Some(found) => found.roles().iter().map(|r| r.role_name().to_owned()).collect(),
        None => {
            create(clients, cluster, class, &profile).await?;
            Vec::new()
        }
    };
    if roles.iter().any(|r| r == role) {
        return Ok(profile);
    }
    for other in &roles {
        clients
            .iam
            .remove_role_from_instance_profile()
            .instance_profile_name(&profile)
            .role_name(other)
            .send()
            .await
            .map_err(|e| AwsError::api("RemoveRoleFromInstanceProfile", e.into_service_error()))?;
    }
    clients
        .iam
        .add_role_to_instance_profile()
        .instance_profile_name(&profile)
        .role_name(role)
        .send()
        .await
        .map_err(|e| AwsError::api("AddRoleToInstanceProfile", e.into_service_error()))?;
    tracing::info!(instance_profile = %profile, role, ec2nodeclass = class, "instance profile holds the role");
    Ok(profile)
}

async fn create(clients: &AwsClients, cluster: &str, class: &str, profile: &str) -> Result<(), AwsError> {
    let tags = [
        (cluster_tag(cluster), "owned".to_owned()),
        ("eks:eks-cluster-name".to_owned(), cluster.to_owned()),
        (EC2_NODE_CLASS.to_owned(), class.to_owned()),
        ("topology.kubernetes.io/region".to_owned(), clients.region.clone()),
    ]
    .into_iter()
    .filter_map(|(key, value)| Tag::builder().key(key).value(value).build().ok())
    .collect();
    clients
        .iam
        .create_instance_profile()
        .instance_profile_name(profile)
        .set_tags(Some(tags))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| AwsError::api("CreateInstanceProfile", e.into_service_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hash_the_region_and_class_and_roles_may_be_arns() {
        let a = name("demo", "us-west-2", "default");
        assert!(a.starts_with("demo_") && a.len() == "demo_".len() + 16, "{a}");
        assert_eq!(a, name("demo", "us-west-2", "default"));
        assert_ne!(a, name("demo", "us-east-1", "default"));
        assert_eq!(
            role_name("arn:aws:iam::123456789012:role/eks/KarpenterNodeRole"),
            "KarpenterNodeRole"
        );
        assert_eq!(role_name("KarpenterNodeRole"), "KarpenterNodeRole");
    }
}

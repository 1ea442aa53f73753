//! EC2NodeClass status: the cloud resolves a node class (subnets, security groups, images,
//! instance profile) and Joist publishes the result with Karpenter's conditions. A resolution that
//! fails sets `Ready=False` with the cloud's message, so NodePools using the class stop launching
//! and say why.

use std::sync::Arc;

use joist_messages::apis::EC2NodeClass;
use kube::ResourceExt;

use crate::{
    kube_ops::{self, set_condition},
    shared::Shared,
};

const READY_PARTS: [&str; 5] = [
    "SubnetsReady",
    "SecurityGroupsReady",
    "AMIsReady",
    "InstanceProfileReady",
    "ValidationSucceeded",
];

/// Whether the class's status already answers its current generation.
pub fn is_current(class: &EC2NodeClass) -> bool {
    class.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.observed_generation == class.metadata.generation)
    })
}

/// Resolves `class` and writes its status.
pub async fn reconcile(shared: Shared, class: Arc<EC2NodeClass>) {
    if is_current(&class) || class.metadata.deletion_timestamp.is_some() {
        return;
    }
    let generation = class.metadata.generation;
    let mut status = class.status.clone().unwrap_or_default();
    match shared.cloud.resolve_node_class(&class).await {
        Ok(resolved) => {
            let conditions = std::mem::take(&mut status.conditions);
            status = resolved;
            status.conditions = conditions;
            for part in READY_PARTS.into_iter().chain(["Ready"]) {
                set_condition(
                    &mut status.conditions,
                    &shared.clock,
                    generation,
                    (part, "True", part, ""),
                );
            }
        }
        Err(error) => {
            let message = error.to_string();
            set_condition(
                &mut status.conditions,
                &shared.clock,
                generation,
                ("Ready", "False", "ResolutionFailed", &message),
            );
            shared.events.warn(class.as_ref(), "ResolutionFailed", &message);
        }
    }
    let api = kube_ops::cluster::<EC2NodeClass>(&shared.client);
    let body = serde_json::to_value(&status).unwrap_or_default();
    if let Err(error) = kube_ops::patch_status(&api, &class.name_any(), body).await {
        tracing::warn!(ec2nodeclass = class.name_any(), %error, "writing the node class status failed");
    }
}

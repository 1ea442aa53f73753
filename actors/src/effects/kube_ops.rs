//! The writes the actors make through the Kubernetes API: merge patches of objects and their
//! status, status conditions and finalizers (Events go through [`crate::effects::events`]). Errors are
//! returned as `kube::Error`; a 404 on a patch or delete means someone else finished the job and is
//! reported as `Ok(false)`.

use std::fmt::Debug;

use joist_messages::{
    apis::NodeClaim,
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate},
    labels::TERMINATION_FINALIZER,
    time::Clock,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    core::{ClusterResourceScope, NamespaceResourceScope},
};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The component name on Events and field managers.
pub const COMPONENT: &str = "joist";

fn ok_unless_missing<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// A cluster-scoped API of `K`.
pub fn cluster<K>(client: &kube::Client) -> Api<K>
where
    K: Resource<Scope = ClusterResourceScope>,
    K::DynamicType: Default,
{
    Api::all(client.clone())
}

/// Merge-patches an object; false when it no longer exists.
pub async fn patch<K>(api: &Api<K>, name: &str, patch: Value) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    ok_unless_missing(
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await,
    )
}

/// Merge-patches an object's status; false when it no longer exists.
pub async fn patch_status<K>(api: &Api<K>, name: &str, status: Value) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    patch_status_body(api, name, serde_json::json!({ "status": status })).await
}

/// Merge-patches the status subresource with a whole body (`status`, and `metadata.resourceVersion`
/// to make the write optimistic); false when the object no longer exists.
pub async fn patch_status_body<K>(api: &Api<K>, name: &str, body: Value) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    ok_unless_missing(
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(body))
            .await,
    )
}

/// Deletes an object; false when it was already gone.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    ok_unless_missing(api.delete(name, &DeleteParams::default()).await)
}

/// Removes Joist's finalizer from an object; false when it no longer exists.
pub async fn remove_finalizer<K>(api: &Api<K>, object: &K) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let finalizers: Vec<&String> = object
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != TERMINATION_FINALIZER)
        .collect();
    let body = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": object.resource_version()}
    });
    patch(api, &object.name_any(), body).await
}

/// The clock's time as a Kubernetes timestamp.
pub fn timestamp(clock: &Clock) -> Time {
    Time(jiff::Timestamp::from_second(clock.now_seconds()).unwrap_or_default())
}

/// The claim's conditions with `updates` applied, merged into the `status` fields given, as a
/// status patch body that holds only if the claim is still the version they were computed from (a
/// stale view gets 409).
pub fn claim_conditions_patch(
    clock: &Clock,
    claim: &NodeClaim,
    updates: &[ConditionUpdate],
    mut status: Value,
) -> Value {
    let mut conditions = claim
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for update in updates {
        set_condition(&mut conditions, clock, claim.metadata.generation, update);
    }
    status["conditions"] = serde_json::json!(conditions);
    serde_json::json!({"metadata": {"resourceVersion": claim.resource_version()}, "status": status})
}

/// A status patch body that removes the claim's condition `type_`, valid only against the version
/// it was computed from.
pub fn claim_condition_removal_patch(claim: &NodeClaim, type_: ConditionType) -> Value {
    let mut conditions = claim.status.clone().unwrap_or_default().conditions;
    conditions.retain(|c| c.type_ != type_.as_str());
    serde_json::json!({
        "metadata": {"resourceVersion": claim.resource_version()},
        "status": {"conditions": conditions},
    })
}

/// Sets a condition in `conditions` at the clock's time; true when anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    clock: &Clock,
    generation: Option<i64>,
    update: &ConditionUpdate,
) -> bool {
    conditions::set(conditions, timestamp(clock), generation, update)
}

/// Sets `ValidationSucceeded=False` with `reason` and `message`, and `Ready=False` saying
/// `ready_message`; whether validation newly failed (a warning is due).
pub fn set_validation_failed(
    conditions: &mut Vec<Condition>,
    clock: &Clock,
    generation: Option<i64>,
    (reason, message): (&str, &str),
    ready_message: &str,
) -> bool {
    let failed = ConditionUpdate::new(ConditionType::ValidationSucceeded, ConditionStatus::False, reason)
        .with_message(message);
    let newly = set_condition(conditions, clock, generation, &failed);
    let not_ready = ConditionUpdate::new(ConditionType::Ready, ConditionStatus::False, "NotReady")
        .with_message(ready_message);
    set_condition(conditions, clock, generation, &not_ready);
    newly
}

/// Namespaced API helper, for symmetry with [`cluster`].
pub fn namespaced<K>(client: &kube::Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    Api::namespaced(client.clone(), namespace)
}

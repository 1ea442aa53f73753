//! The writes the actors make through the Kubernetes API: merge patches of objects and their
//! status, status conditions and finalizers (Events go through [`crate::effects::events`]). Errors are
//! returned as `kube::Error`; a 404 on a patch or delete means someone else finished the job and is
//! reported as `Ok(false)`.

use std::fmt::Debug;

use joist_messages::{
    apis::NodeClaim,
    conditions::{self, ConditionStatus, ConditionType, ConditionUpdate},
    labels::{TERMINATION_FINALIZER, annotations::NODECLAIM_TERMINATION_TIMESTAMP},
    time::Clock,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    core::{ClusterResourceScope, NamespaceResourceScope},
};
use serde::{
    Deserialize, Deserializer,
    de::{DeserializeOwned, IgnoredAny},
};
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

/// An answer read to its end and dropped: the writes here only need to know they held, and
/// building the object they return cost more than the write (a NodeClaim's answer carries its up
/// to 600 instance types: at 10,000 nodes, deserializing them was a tenth of the controller's
/// CPU).
struct Unread;

impl<'de> Deserialize<'de> for Unread {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer).map(|_| Unread)
    }
}

/// Merge-patches `name` (its status subresource when `status`) without building the answer.
async fn merge_unread<K: Resource + Clone>(
    api: &Api<K>,
    status: bool,
    name: &str,
    patch: Value,
) -> Result<bool, kube::Error> {
    let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
    let request = kube::core::Request::new(api.resource_url());
    let (request, verb) = if status {
        (
            request.patch_subresource("status", name, &params, &patch),
            "patch_status",
        )
    } else {
        (request.patch(name, &params, &patch), "patch")
    };
    let mut request = request.map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert(verb);
    let client = api.clone().into_client();
    ok_unless_missing(client.request::<Unread>(request).await)
}

/// Merge-patches an object; false when it no longer exists.
pub async fn patch<K: Resource + Clone>(api: &Api<K>, name: &str, patch: Value) -> Result<bool, kube::Error> {
    merge_unread(api, false, name, patch).await
}

/// Merge-patches an object's status; false when it no longer exists.
pub async fn patch_status<K: Resource + Clone>(
    api: &Api<K>,
    name: &str,
    status: Value,
) -> Result<bool, kube::Error> {
    patch_status_body(api, name, serde_json::json!({ "status": status })).await
}

/// Merge-patches the status subresource with a whole body (`status`, and `metadata.resourceVersion`
/// to make the write optimistic); false when the object no longer exists.
pub async fn patch_status_body<K: Resource + Clone>(
    api: &Api<K>,
    name: &str,
    body: Value,
) -> Result<bool, kube::Error> {
    merge_unread(api, true, name, body).await
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

/// Annotates NodeClaim `name` with its termination deadline (epoch seconds), Karpenter's
/// `karpenter.sh/nodeclaim-termination-timestamp`: from then on its pods are deleted rather than
/// evicted and its instance is terminated. False when the claim no longer exists.
pub async fn stamp_termination_deadline(
    client: &kube::Client,
    name: &str,
    deadline: i64,
) -> Result<bool, kube::Error> {
    let body = serde_json::json!({"metadata": {"annotations": {
        NODECLAIM_TERMINATION_TIMESTAMP: joist_messages::time::rfc3339(deadline),
    }}});
    patch(&cluster::<NodeClaim>(client), name, body).await
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

#[cfg(test)]
mod tests {
    use joist_kubesim::{Cluster, ClusterSettings};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::PostParams;
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_patch_whose_answer_is_not_read_still_lands_and_a_missing_object_is_no_error() {
        let kubesim = Cluster::start(ClusterSettings::default());
        let nodes: Api<Node> = cluster(&kubesim.client());
        let node = serde_json::from_value(json!({"metadata": {"name": "n"}})).expect("a valid Node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("{e}"));

        let labelled = patch(&nodes, "n", json!({"metadata": {"labels": {"team": "a"}}})).await;
        assert!(labelled.unwrap_or_else(|e| panic!("{e}")));
        let capacity = json!({"capacity": {"cpu": "4"}});
        assert!(
            patch_status(&nodes, "n", capacity)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
        let stored = nodes.get("n").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stored.labels().get("team").map(String::as_str), Some("a"));
        let cpu = stored
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("cpu").cloned());
        assert_eq!(cpu.map(|q| q.0), Some("4".to_owned()));

        let gone = patch(&nodes, "gone", json!({"metadata": {"labels": {"team": "a"}}})).await;
        assert!(
            !gone.unwrap_or_else(|e| panic!("{e}")),
            "a missing object is reported as gone"
        );
        let stale = json!({"metadata": {"resourceVersion": "1"}, "status": {"capacity": {"cpu": "8"}}});
        assert!(
            patch_status_body(&nodes, "n", stale).await.is_err(),
            "a write from an old version is refused, not dropped"
        );
    }
}

//! The writes the actors make through the Kubernetes API: merge patches of objects and their
//! status, status conditions, finalizers, and Events. Errors are returned as `kube::Error`; a 404
//! on a patch or delete means someone else finished the job and is reported as `Ok(false)`.

use std::fmt::Debug;

use joist_messages::{labels::TERMINATION_FINALIZER, time::Clock};
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time},
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
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
    let body = serde_json::json!({ "status": status });
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
fn now(clock: &Clock) -> Time {
    Time(jiff::Timestamp::from_second(clock.now_seconds()).unwrap_or_default())
}

/// Sets a condition in `conditions`; true when anything changed. The transition time moves only
/// when the status does.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    clock: &Clock,
    generation: Option<i64>,
    (type_, status, reason, message): (&str, &str, &str, &str),
) -> bool {
    let now = now(clock);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => false,
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status.to_owned();
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
            true
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                observed_generation: generation,
                last_transition_time: now,
            });
            true
        }
    }
}

/// Whether a condition is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Records an Event about `object`; a failure is logged, never returned: an Event is a report,
/// not part of the action it reports.
pub async fn record_event<K>(
    client: &kube::Client,
    clock: &Clock,
    object: &K,
    warning: bool,
    reason: &str,
    message: &str,
) where
    K: Resource<DynamicType = ()>,
{
    let reference: ObjectReference = object.object_ref(&());
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let now = now(clock);
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", reference.name.as_deref().unwrap_or("object"))),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: reference,
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(reason, %error, "recording an event failed");
    }
}

/// Namespaced API helper, for symmetry with [`cluster`].
pub fn namespaced<K>(client: &kube::Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    Api::namespaced(client.clone(), namespace)
}

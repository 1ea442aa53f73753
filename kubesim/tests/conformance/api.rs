//! The API server's protocol and semantics through kube-rs, in-process.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use joist_kubesim::{ApiServer, Clock, InProcess, Store};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

use crate::{cluster, eventually};

pub fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).expect("config map")
}

pub fn api_error(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn writes_get_uids_versions_and_stale_updates_conflict() {
    let cluster = cluster();
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let created = maps
        .create(&PostParams::default(), &config_map("settings"))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let duplicate = maps
        .create(&PostParams::default(), &config_map("settings"))
        .await
        .expect_err("name taken");
    assert_eq!(api_error(duplicate), 409);

    let mut first = maps.get("settings").await.expect("get");
    let mut second = first.clone();
    first.data = Some([("k".to_owned(), "one".to_owned())].into());
    let updated = maps
        .replace("settings", &PostParams::default(), &first)
        .await
        .expect("update");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    second.data = Some([("k".to_owned(), "two".to_owned())].into());
    let stale = maps
        .replace("settings", &PostParams::default(), &second)
        .await
        .expect_err("stale version");
    assert_eq!(api_error(stale), 409);
    assert_eq!(api_error(maps.get("missing").await.expect_err("absent")), 404);
    let elsewhere: Api<ConfigMap> = Api::namespaced(cluster.client(), "no-such-namespace");
    assert_eq!(
        api_error(
            elsewhere
                .create(&PostParams::default(), &config_map("x"))
                .await
                .expect_err("no namespace")
        ),
        404
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_they_are_removed() {
    let cluster = cluster();
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let mut held = config_map("held");
    held.metadata.finalizers = Some(vec!["example.com/cleanup".to_owned()]);
    maps.create(&PostParams::default(), &held).await.expect("create");
    maps.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let deleting = maps.get("held").await.expect("still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let add = Patch::Merge(json!({"metadata": {"finalizers": ["example.com/cleanup", "example.com/more"]}}));
    assert_eq!(
        api_error(
            maps.patch("held", &PatchParams::default(), &add)
                .await
                .expect_err("no new finalizers")
        ),
        422,
        "Invalid, as kube-apiserver answers"
    );
    let clear = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    maps.patch("held", &PatchParams::default(), &clear)
        .await
        .expect("remove finalizer");
    assert_eq!(api_error(maps.get("held").await.expect_err("gone")), 404);
}

#[tokio::test]
async fn a_watch_resumed_from_its_last_version_sees_every_change() {
    let cluster = cluster();
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let start = maps
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("version");
    // Another kind moves the revision on before the first ConfigMap: nothing of ConfigMaps was
    // dropped, so the watch from the empty list still resumes (every reflector does this at
    // startup for the kinds that have no objects yet).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cluster.client(), "default");
    let secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create s");
    maps.create(&PostParams::default(), &config_map("a"))
        .await
        .expect("create a");
    let mut stream = maps
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch")
        .boxed();
    let last = match stream.try_next().await.expect("event") {
        Some(WatchEvent::Added(map)) => map.metadata.resource_version.expect("version"),
        other => panic!("expected ADDED a, got {other:?}"),
    };
    drop(stream);
    // Changes while no one watches.
    maps.create(&PostParams::default(), &config_map("b"))
        .await
        .expect("create b");
    maps.delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    let mut resumed = maps
        .watch(&WatchParams::default(), &last)
        .await
        .expect("resume")
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match resumed.try_next().await.expect("event") {
            Some(WatchEvent::Added(map)) => {
                seen.push(format!("ADDED {}", map.metadata.name.unwrap_or_default()))
            }
            Some(WatchEvent::Deleted(map)) => {
                seen.push(format!("DELETED {}", map.metadata.name.unwrap_or_default()))
            }
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "DELETED a"]);
}

/// As kube-apiserver since 1.31: a name made from `generateName` that is taken is made again, so
/// 20,000 creates by one prefix all succeed (five random characters collide about a dozen times
/// among so many).
#[test]
fn creates_by_generate_name_make_a_taken_name_again() {
    let store = Store::new(Clock::system(), 1);
    let maps = joist_kubesim::resources::GroupResource::new("", "configmaps");
    let made = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "m-"}});
    for _ in 0..20_000 {
        store
            .create(&maps, "default", made.clone(), false)
            .unwrap_or_else(|e| panic!("every create by generateName succeeds: {e}"));
    }
}

/// The cluster's own components (binding, kubelets, Event series) write through `Store::edit`:
/// the change lands with a new resourceVersion and the metadata as it was, a reader still holding
/// the version before sees it unchanged, an edit that changes nothing writes nothing, and one that
/// fails leaves the object as it was.
#[test]
fn an_edit_writes_its_change_and_loses_nothing_when_it_changes_nothing_or_fails() {
    use joist_kubesim::{ApiError, resources::GroupResource, store::ObjectKey};
    let store = Store::new(Clock::system(), 1);
    let maps = GroupResource::new("", "configmaps");
    let key = ObjectKey::new("default", "m");
    let made = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "labels": {"app": "a"}}, "data": {"k": "v"}});
    let created = store.create(&maps, "default", made, false).expect("create");
    let kept = store.get(&maps, &key).expect("get");
    let held = store.get(&maps, &key).expect("get");
    let written = store
        .edit(&maps, &key, Some(held), |metadata, object| {
            assert_eq!(metadata["labels"]["app"], "a", "the edit reads the metadata");
            assert!(object.get("metadata").is_none(), "and cannot change it");
            object["data"]["k"] = json!("w");
            Ok(true)
        })
        .expect("edits")
        .expect("a change is written");
    assert_eq!(written["data"]["k"], "w");
    assert_eq!(written["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(written["metadata"]["labels"], created["metadata"]["labels"]);
    assert_ne!(
        written["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    assert_eq!(
        kept["data"]["k"], "v",
        "a version another reader holds stays as it was"
    );
    assert_eq!(*store.get(&maps, &key).expect("get"), *written);

    let revision = store.revision();
    let unchanged = store.edit(&maps, &key, None, |_, _| Ok(false)).expect("edits");
    assert!(unchanged.is_none());
    let failed = store.edit(&maps, &key, None, |_, object| {
        object["data"]["k"] = json!("lost");
        Err(ApiError::BadRequest("refused".to_owned()))
    });
    assert!(matches!(failed, Err(ApiError::BadRequest(_))));
    assert_eq!(store.revision(), revision, "neither wrote anything");
    assert_eq!(
        *store.get(&maps, &key).expect("get"),
        *written,
        "nor changed the object"
    );
    let missing = store.edit(&maps, &ObjectKey::new("default", "gone"), None, |_, _| Ok(true));
    assert!(matches!(missing, Err(ApiError::NotFound { .. })));
}

/// A store that keeps two events for resumes, the ConfigMaps of `default` served from it, and
/// the first of them, `m0`.
async fn short_history() -> (Arc<Store>, Api<ConfigMap>, ConfigMap) {
    let store = Arc::new(Store::new(Clock::system(), 1).with_history_limit(2));
    let client = Client::new(
        InProcess::new(Arc::new(ApiServer::new(store.clone(), "127.0.0.1:443"))),
        "default",
    );
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = maps
        .create(&PostParams::default(), &config_map("m0"))
        .await
        .expect("create");
    (store, maps, first)
}

/// A watch of `maps` from the version of `first`.
async fn watch_since(
    maps: &Api<ConfigMap>,
    first: &ConfigMap,
) -> impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin {
    let version = first.metadata.resource_version.clone().expect("version");
    maps.watch(&WatchParams::default(), &version)
        .await
        .expect("watch")
        .boxed()
}

/// kubesim keeps an object's JSON and parses it again once no one holds the parsed version: an
/// object written long ago reads, lists, patches and deletes like one just written.
#[tokio::test]
async fn an_object_the_history_let_go_of_reads_and_writes_whole() {
    let (_store, maps, first) = short_history().await;
    for name in ["m1", "m2", "m3", "m4"] {
        maps.create(&PostParams::default(), &config_map(name))
            .await
            .expect("create");
    }
    let read = maps.get("m0").await.expect("get");
    assert_eq!(read, first, "read back as it was written");
    let listed = maps.list(&ListParams::default()).await.expect("list");
    assert_eq!(listed.items.first(), Some(&first));
    assert_eq!(listed.items.len(), 5);
    let patched = maps
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"other": "w"}})),
        )
        .await
        .expect("patch");
    let data = patched.data.expect("data");
    assert_eq!(
        (
            data.get("k").map(String::as_str),
            data.get("other").map(String::as_str)
        ),
        (Some("v"), Some("w")),
        "the patch lands on the stored object"
    );
    maps.delete("m2", &DeleteParams::default()).await.expect("delete");
    assert_eq!(api_error(maps.get("m2").await.expect_err("deleted")), 404);
}

/// A merge patch of a status is applied without parsing the object's spec: the spec is written
/// back as it was (a spec in the patch is discarded, as kube-apiserver discards it), the answer, a
/// read, a watch and a label-selector watch see the whole object, the creator keeps owning the
/// spec, and a stale resourceVersion or a dry run changes nothing.
#[tokio::test]
async fn a_status_patch_keeps_the_spec_it_does_not_read() {
    let store = Arc::new(Store::new(Clock::system(), 1));
    let client = Client::new(
        InProcess::new(Arc::new(ApiServer::new(store.clone(), "127.0.0.1:443"))),
        "default",
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": "n1"},
    }))
    .expect("pod");
    let created = pods.create(&PostParams::default(), &pod).await.expect("create");
    let version = created.metadata.resource_version.clone().expect("version");
    let mut everything = pods
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch")
        .boxed();
    let mut labelled = pods
        .watch(&WatchParams::default().labels("app=a"), &version)
        .await
        .expect("watch")
        .boxed();

    let patch = json!({"status": {"phase": "Running"}, "spec": {"nodeName": "elsewhere"}});
    let patched = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("status patch");
    assert_eq!(
        patched.spec, created.spec,
        "the answer carries the spec as it was"
    );
    assert_eq!(
        patched.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    let read = pods.get("p").await.expect("get");
    assert_eq!(read, patched);
    let owners: Vec<(String, Option<String>)> = read
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|entry| {
            (
                entry.operation.clone().unwrap_or_default(),
                entry.subresource.clone(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [
            ("Update".to_owned(), None),
            ("Update".to_owned(), Some("status".to_owned()))
        ]
    );
    let creator = &read.metadata.managed_fields.as_ref().expect("managed fields")[0];
    assert!(
        creator
            .fields_v1
            .as_ref()
            .is_some_and(|fields| fields.0.get("f:spec").is_some()),
        "the creator still owns the spec: {creator:?}"
    );
    for watch in [&mut everything, &mut labelled] {
        match watch.next().await {
            Some(Ok(WatchEvent::Modified(seen))) => assert_eq!(seen, read),
            other => panic!("expected the status write, got {other:?}"),
        }
    }

    let stale = json!({"metadata": {"resourceVersion": version}, "status": {"phase": "Failed"}});
    let refused = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(stale))
        .await
        .expect_err("stale");
    assert_eq!(api_error(refused), 409);
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let tried = pods
        .patch_status(
            "p",
            &dry_run,
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("dry run");
    assert_eq!(
        (tried.status.and_then(|s| s.phase), tried.spec),
        (Some("Failed".to_owned()), read.spec.clone())
    );
    assert_eq!(
        pods.get("p").await.expect("get"),
        read,
        "a dry run writes nothing"
    );
}

/// A merge patch that names no spec is applied without parsing it too: labels and finalizers
/// change, the spec and generation stay, and removing the last finalizer of an object being
/// deleted deletes it.
#[tokio::test]
async fn a_metadata_patch_keeps_the_spec_and_its_last_finalizer_lets_the_object_go() {
    let (_store, maps, _first) = short_history().await;
    let pods: Api<Pod> = Api::namespaced(maps.into_client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "finalizers": ["example.com/hold"]},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .expect("pod");
    let created = pods.create(&PostParams::default(), &pod).await.expect("create");
    let labelled = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("label");
    assert_eq!(
        (&labelled.spec, labelled.metadata.generation),
        (&created.spec, created.metadata.generation)
    );
    assert_eq!(labelled.labels().get("team").map(String::as_str), Some("a"));
    assert_eq!(pods.get("p").await.expect("get"), labelled);
    pods.delete("p", &DeleteParams::default()).await.expect("delete");
    assert!(
        pods.get("p")
            .await
            .expect("held")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    assert_eq!(api_error(pods.get("p").await.expect_err("gone")), 404);
}

/// Events beyond the newest thousand keep only their JSON in kubesim: a watch that lags that far
/// still gets every event whole, and a selector watch still tells which match.
#[tokio::test]
async fn a_watch_that_lags_a_long_burst_gets_every_event_whole() {
    let cluster = cluster();
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let start = maps
        .create(&PostParams::default(), &config_map("start"))
        .await
        .expect("create");
    let version = start.metadata.resource_version.clone().expect("version");
    let mut everything = maps
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch")
        .boxed();
    let mut tier_a = maps
        .watch(&WatchParams::default().labels("tier=a"), &version)
        .await
        .expect("watch")
        .boxed();
    const MAPS: usize = 2_500;
    for n in 0..MAPS {
        let mut map = config_map(&format!("m{n}"));
        map.metadata.labels = Some([("tier".to_owned(), ["a", "b"][n % 2].to_owned())].into());
        maps.create(&PostParams::default(), &map).await.expect("create");
    }
    for n in 0..MAPS {
        match everything.try_next().await.expect("an event") {
            Some(WatchEvent::Added(map)) => {
                assert_eq!(map.name_any(), format!("m{n}"));
                assert_eq!(map.data, config_map("x").data, "m{n} arrives whole");
            }
            other => panic!("expected m{n} added, got {other:?}"),
        }
    }
    for n in (0..MAPS).step_by(2) {
        match tier_a.try_next().await.expect("an event") {
            Some(WatchEvent::Added(map)) => assert_eq!(map.name_any(), format!("m{n}")),
            other => panic!("expected m{n} added, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_watch_older_than_the_history_gets_410_gone() {
    let (_store, maps, first) = short_history().await;
    for name in ["m1", "m2", "m3"] {
        maps.create(&PostParams::default(), &config_map(name))
            .await
            .expect("create");
    }
    let mut stream = watch_since(&maps, &first).await;
    match stream.try_next().await.expect("event") {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn an_open_watch_that_falls_behind_the_history_still_gets_every_event() {
    let (store, maps, first) = short_history().await;
    let mut stream = watch_since(&maps, &first).await;
    // Written straight to the store, so the watch reads nothing until all twenty are in.
    let names: Vec<String> = (1..=20).map(|i| format!("m{i}")).collect();
    let resource = joist_kubesim::resources::GroupResource::new("", "configmaps");
    for name in &names {
        let map = serde_json::to_value(config_map(name)).expect("json");
        store.create(&resource, "default", map, false).expect("create");
    }
    let mut seen = Vec::new();
    while seen.len() < names.len() {
        match stream.try_next().await.expect("event") {
            Some(WatchEvent::Added(map)) => seen.push(map.name_any()),
            other => panic!("expected every ADDED event, got {other:?} after {seen:?}"),
        }
    }
    assert_eq!(seen, names);
}

#[tokio::test]
async fn a_reflector_mirrors_pods_and_selectors_filter_lists() {
    let cluster = cluster();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let (reader, writer) = reflector::store::<Pod>();
    let mirror = tokio::spawn(
        reflector(writer, watcher(pods.clone(), watcher::Config::default()))
            .applied_objects()
            .for_each(|_| async {}),
    );
    for (name, app) in [("web-1", "web"), ("web-2", "web"), ("db-1", "db")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
    eventually("the reflector to hold three pods", || {
        let count = reader.state().len();
        async move { (count == 3).then_some(()) }
    })
    .await;
    let web = pods
        .list(&ListParams::default().labels("app in (web)"))
        .await
        .expect("list");
    assert_eq!(web.items.len(), 2);
    let unbound = pods
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .expect("list");
    assert_eq!(unbound.items.len(), 3);
    let page = pods.list(&ListParams::default().limit(2)).await.expect("page");
    assert_eq!(page.items.len(), 2);
    let rest = pods
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(&page.metadata.continue_.expect("token")),
        )
        .await;
    assert_eq!(rest.expect("second page").items.len(), 1);
    pods.delete("db-1", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the reflector to drop the deleted pod", || {
        let count = reader.state().len();
        async move { (count == 2).then_some(()) }
    })
    .await;
    mirror.abort();
}

#[tokio::test]
async fn strategic_merge_patches_merge_containers_by_name_and_applies_own_their_fields() {
    let cluster = cluster();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "two"},
        "spec": {"containers": [{"name": "app", "image": "app:1"}, {"name": "sidecar", "image": "proxy:1"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create");
    let patch = Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "image": "app:2"}]}}));
    let patched = pods
        .patch("two", &PatchParams::default(), &patch)
        .await
        .expect("strategic patch");
    let images: Vec<String> = patched
        .spec
        .expect("spec")
        .containers
        .into_iter()
        .map(|c| c.image.unwrap_or_default())
        .collect();
    assert_eq!(images, ["app:2", "proxy:1"]);

    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let applied =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}});
    let params = PatchParams::apply("joist-test");
    maps.patch("applied", &params, &Patch::Apply(&applied))
        .await
        .expect("apply creates");
    let again =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"b": "2"}});
    let reapplied = maps
        .patch("applied", &params, &Patch::Apply(&again))
        .await
        .expect("apply again");
    let keys = |map: ConfigMap| map.data.unwrap_or_default().into_keys().collect::<Vec<_>>();
    assert_eq!(
        keys(reapplied),
        ["b"],
        "the manager stopped applying a: it is removed"
    );

    let other =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"c": "3"}});
    let merged = maps
        .patch(
            "applied",
            &PatchParams::apply("another-manager"),
            &Patch::Apply(&other),
        )
        .await
        .expect("apply by another manager");
    let managers: Vec<String> = merged
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    assert_eq!(managers, ["joist-test", "another-manager"]);
    assert_eq!(
        keys(merged),
        ["b", "c"],
        "another manager's apply merges with the first one's fields"
    );
}

/// As the real API server: a CRD's `metadata` schema may say nothing but `type: object`.
#[tokio::test]
async fn a_crd_whose_metadata_schema_says_more_than_its_type_is_refused() {
    let cluster = cluster();
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(cluster.client());
    let (_, bare) = joist_messages::apis::crds().remove(0);
    let mut described = bare.clone();
    described.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("metadata"))
        .expect("a metadata schema")
        .description = Some("Standard object metadata.".to_owned());
    match crds.create(&PostParams::default(), &described).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("properties[metadata]: Forbidden"),
                "{}",
                status.message
            );
        }
        other => panic!("a CRD with a described metadata schema: {other:?}"),
    }
    crds.create(&PostParams::default(), &bare)
        .await
        .expect("the same CRD with a bare metadata schema");
}

#[tokio::test]
async fn a_crd_serves_its_custom_resources() {
    let cluster = cluster();
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(cluster.client());
    for (_, crd) in joist_messages::apis::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let pools: Api<joist_messages::apis::NodePool> = Api::all(cluster.client());
    let pool: joist_messages::apis::NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
        }}},
    }))
    .expect("node pool");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create NodePool");
    let listed = pools.list(&ListParams::default()).await.expect("list NodePools");
    assert_eq!(listed.items.len(), 1);
    // The CRD's scale subresource reads and writes the paths it names: spec.replicas, status.nodes.
    pools
        .patch_status(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodes": 2}})),
        )
        .await
        .expect("status");
    let scaled = pools
        .patch_scale(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .expect("scale");
    assert_eq!(
        (
            scaled.spec.and_then(|s| s.replicas),
            scaled.status.map(|s| s.replicas)
        ),
        (Some(4), Some(2))
    );
    let pool = pools.get("default").await.expect("get");
    assert_eq!(pool.spec.replicas, Some(4));
    crds.delete("nodepools.karpenter.sh", &DeleteParams::default())
        .await
        .expect("delete CRD");
    assert!(
        pools.list(&ListParams::default()).await.is_err(),
        "NodePools are no longer served"
    );
}

/// As kube-apiserver answers a metadata client (kube-rs's `PartialObjectMeta`, client-go's metadata
/// informers): a get, a list and a watch carry each object's metadata alone, as
/// `PartialObjectMetadata` in `meta.k8s.io/v1`.
#[tokio::test]
async fn a_metadata_client_gets_metadata_alone_from_gets_lists_and_watches() {
    let cluster = cluster();
    let client = cluster.client();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    maps.create(&PostParams::default(), &config_map("a"))
        .await
        .expect("create a");
    let read = |path: &str, accept: &str| {
        let request = http::Request::builder()
            .uri(path)
            .header("accept", accept)
            .body(Vec::new())
            .expect("request");
        let client = client.clone();
        async move {
            let text = client.request_text(request).await.expect("answered");
            serde_json::from_str::<serde_json::Value>(&text).expect("JSON")
        }
    };
    let one = read(
        "/api/v1/namespaces/default/configmaps/a",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!(
        (&one["kind"], &one["apiVersion"], &one["metadata"]["name"]),
        (
            &json!("PartialObjectMetadata"),
            &json!("meta.k8s.io/v1"),
            &json!("a")
        )
    );
    assert!(one.get("data").is_none(), "metadata alone: {one}");
    let list = read(
        "/api/v1/namespaces/default/configmaps",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
    )
    .await;
    assert_eq!(
        (&list["kind"], &list["apiVersion"]),
        (&json!("PartialObjectMetadataList"), &json!("meta.k8s.io/v1"))
    );
    assert!(list["metadata"]["resourceVersion"].is_string(), "{list}");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(
        (&items[0]["kind"], &items[0]["apiVersion"]),
        (&json!("PartialObjectMetadata"), &json!("meta.k8s.io/v1"))
    );
    assert!(items[0].get("data").is_none(), "metadata alone: {list}");

    let version = list["metadata"]["resourceVersion"].as_str().expect("version");
    let metadata: Api<kube::core::PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), "default");
    let mut events = metadata
        .watch(&WatchParams::default(), version)
        .await
        .expect("watch")
        .boxed();
    maps.create(&PostParams::default(), &config_map("b"))
        .await
        .expect("create b");
    match events.try_next().await.expect("event") {
        Some(WatchEvent::Added(added)) => {
            let kind = added.types.map(|types| types.kind);
            assert_eq!(
                (kind.as_deref(), added.metadata.name.as_deref()),
                (Some("PartialObjectMetadata"), Some("b"))
            );
        }
        other => panic!("expected ADDED b, got {other:?}"),
    }
}

/// The HTTP status and body of a raw request to `client`.
async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt;
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .expect("request");
    let response = client.send(request).await.expect("send");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// As kube-apiserver answers: a delete that leaves the object to its finalizers is a 200, a map
/// emptied by a patch is gone (Go's JSON leaves an empty map out), and a NodePool or CapacityBuffer
/// its CRD's rules refuse is a 422 naming the field.
#[tokio::test]
async fn deletes_empty_maps_and_invalid_custom_resources_answer_as_kube_apiserver() {
    let cluster = cluster();
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .expect("crds");
    let client = cluster.client();
    let maps = "/api/v1/namespaces/default/configmaps";
    let (created, _) = raw(
        &client,
        "POST",
        maps,
        "application/json",
        r#"{"metadata":{"name":"held","labels":{"a":"b"},"finalizers":["example.com/hold"]}}"#,
    )
    .await;
    assert_eq!(created, 201);
    let (patched, body) = raw(
        &client,
        "PATCH",
        &format!("{maps}/held"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"a":null}}}"#,
    )
    .await;
    assert_eq!(patched, 200);
    assert_eq!(body.pointer("/metadata/labels"), None, "{body}");
    let (deleted, body) = raw(&client, "DELETE", &format!("{maps}/held"), "application/json", "").await;
    assert_eq!(deleted, 200);
    assert!(body.pointer("/metadata/deletionTimestamp").is_some(), "{body}");

    let (refused, body) = raw(
        &client,
        "POST",
        "/apis/karpenter.sh/v1/nodepools",
        "application/json",
        r#"{"apiVersion":"karpenter.sh/v1","kind":"NodePool","metadata":{"name":"heavy"},"spec":{"weight":1000,
            "template":{"spec":{"nodeClassRef":{"group":"karpenter.k8s.aws","kind":"EC2NodeClass","name":"d"},"requirements":[]}}}}"#,
    )
    .await;
    assert_eq!(refused, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.weight"),
        "{body}"
    );
    // So is a CapacityBuffer, of the CRD Joist serves beside Karpenter's own groups.
    let (refused, body) = raw(
        &client,
        "POST",
        "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/default/capacitybuffers",
        "application/json",
        r#"{"apiVersion":"autoscaling.x-k8s.io/v1beta1","kind":"CapacityBuffer","metadata":{"name":"both"},
            "spec":{"podTemplateRef":{"name":"t"},"scalableRef":{"apiGroup":"apps","kind":"Deployment","name":"web"},"replicas":1}}"#,
    )
    .await;
    assert_eq!(refused, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("CapacityBuffer.autoscaling.x-k8s.io \"both\" is invalid"),
        "{body}"
    );
}

/// As kube-apiserver builds an applied configuration: in each object up to its first unknown field
/// (in the order of the names), a merged list's items named by their key, a 500 with no reason.
#[tokio::test]
async fn an_applied_configuration_with_unknown_fields_is_refused_as_kube_apiserver_refuses_it() {
    let cluster = cluster();
    let client = cluster.client();
    let apply = async |body: &str| {
        raw(
            &client,
            "PATCH",
            "/apis/apps/v1/namespaces/default/deployments/x?fieldManager=test",
            "application/apply-patch+yaml",
            body,
        )
        .await
    };
    let deployment = |spec: &str| {
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"x","bogus":1}},"spec":{spec}}}"#
        )
    };
    let (code, body) = apply(&deployment(
        r#"{"foo":1,"selector":{"matchLabels":{"a":"b"}},"template":{"spec":{"containers":[{"name":"c","bar":1}]}}}"#,
    ))
    .await;
    assert_eq!(code, 500);
    assert_eq!(body.get("reason"), None, "{body}");
    assert_eq!(
        body["message"],
        "failed to create typed patch object (default/x; apps/v1, Kind=Deployment): .spec.foo: field not declared in schema"
    );
    let (_, body) = apply(&deployment(
        r#"{"selector":{"matchLabels":{"a":"b"}},"template":{"zzz":1,"spec":{"baz":2,"containers":[{"name":"c","bar":1}]}}}"#,
    ))
    .await;
    assert_eq!(
        body["message"],
        "failed to create typed patch object (default/x; apps/v1, Kind=Deployment): errors:\n  \
         .spec.template.spec.baz: field not declared in schema\n  .spec.template.zzz: field not declared in schema"
    );
    let (_, body) = apply(&deployment(
        r#"{"selector":{"matchLabels":{"a":"b"}},"template":{"spec":{"containers":[{"name":"c","bar":1}]}}}"#,
    ))
    .await;
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .ends_with(r#"): .spec.template.spec.containers[name="c"].bar: field not declared in schema"#),
        "{body}"
    );
}

/// As kube-apiserver ratchets CRD validation: an object kept from an older CRD (stored as it was)
/// can still be patched where the patch adds no problem of its own, and is refused where it does.
#[tokio::test]
async fn an_invalid_custom_resource_already_stored_takes_patches_that_add_no_problem() {
    let cluster = cluster();
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .expect("crds");
    let heavy = serde_json::json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "heavy", "finalizers": ["example.com/hold"]}, "spec": {"weight": 1000,
        "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}, "requirements": []}}}});
    cluster
        .store()
        .create(
            &joist_kubesim::resources::GroupResource::new("karpenter.sh", "nodepools"),
            "",
            heavy,
            false,
        )
        .expect("stored as an older CRD let it be");
    let client = cluster.client();
    let path = "/apis/karpenter.sh/v1/nodepools/heavy";
    let merge = "application/merge-patch+json";
    let (labelled, body) = raw(
        &client,
        "PATCH",
        path,
        merge,
        r#"{"metadata":{"labels":{"team":"a"},"finalizers":null}}"#,
    )
    .await;
    assert_eq!(labelled, 200, "{body}");
    let (refused, body) = raw(
        &client,
        "PATCH",
        path,
        merge,
        r#"{"spec":{"disruption":{"consolidateAfter":"forever"}}}"#,
    )
    .await;
    assert_eq!(refused, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("consolidateAfter") && !message.contains("spec.weight"),
        "{message}"
    );
}

//! The API faults one client can be put through, seen by kube-rs: refused and lost writes, a slow
//! server, watches that drop or may not resume. Virtual time, so minutes of faults take
//! milliseconds.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use joist_kubesim::{
    ApiServer, Clock, InProcess, Store,
    api::{ApiFailure, ApiFaults},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

use crate::api::{api_error as code, config_map};

/// A bare API server, a client through `faults` and a client without.
fn clients(faults: &ApiFaults) -> (Api<ConfigMap>, Api<ConfigMap>) {
    let store = Arc::new(Store::new(Clock::system(), 3));
    let server = Arc::new(ApiServer::new(store, "127.0.0.1:443"));
    let faulty = Client::new(
        InProcess::new(server.clone()).with_faults(faults.clone()),
        "default",
    );
    let clean = Client::new(InProcess::new(server), "default");
    (
        Api::namespaced(faulty, "default"),
        Api::namespaced(clean, "default"),
    )
}

fn patch(value: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"data": {"k": value}}))
}

#[tokio::test(start_paused = true)]
async fn conflicts_refuse_updates_without_applying_them_until_the_fault_ends() {
    let faults = ApiFaults::default();
    let (faulty, clean) = clients(&faults);
    faults.fail(ApiFailure::Conflict, Duration::from_secs(60));
    faulty
        .create(&PostParams::default(), &config_map("m"))
        .await
        .expect("a create does not conflict");
    let refused = faulty
        .patch("m", &PatchParams::default(), &patch("changed"))
        .await;
    assert_eq!(refused.map_err(code).err(), Some(409));
    let refused = faulty.delete("m", &DeleteParams::default()).await;
    assert_eq!(refused.map(|_| ()).map_err(code).err(), Some(409));
    let stored = clean.get("m").await.expect("still there");
    assert_eq!(
        stored.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v")
    );
    tokio::time::sleep(Duration::from_secs(61)).await;
    faulty
        .patch("m", &PatchParams::default(), &patch("changed"))
        .await
        .expect("the fault is over");
    assert_eq!(faults.counts().conflicts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_hides_a_write_that_happened() {
    let faults = ApiFaults::default();
    let (faulty, clean) = clients(&faults);
    faults.fail(ApiFailure::LoseReply, Duration::from_secs(60));
    let lost = faulty.create(&PostParams::default(), &config_map("m")).await;
    assert_eq!(lost.map(|_| ()).map_err(code).err(), Some(504));
    clean.get("m").await.expect("the create happened");
    assert_eq!(faults.counts().lost_replies, 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    let again = faulty.create(&PostParams::default(), &config_map("m")).await;
    assert_eq!(
        again.map(|_| ()).map_err(code).err(),
        Some(409),
        "a retry finds the name taken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_server_answers_every_request_late() {
    let faults = ApiFaults::default();
    let (faulty, clean) = clients(&faults);
    clean
        .create(&PostParams::default(), &config_map("m"))
        .await
        .expect("create");
    faults.fail(ApiFailure::Slow(Duration::from_secs(3)), Duration::from_secs(60));
    let asked = tokio::time::Instant::now();
    faulty.get("m").await.expect("answered");
    assert!(asked.elapsed() >= Duration::from_secs(3), "{:?}", asked.elapsed());
    let asked = tokio::time::Instant::now();
    clean.get("m").await.expect("answered");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "other clients are not slowed"
    );
}

/// Names in a reflector fed through `failure` while objects come and go, and in the store.
async fn mirror_through(failure: ApiFailure) -> (BTreeSet<String>, BTreeSet<String>, ApiFaults) {
    let faults = ApiFaults::default();
    let (faulty, clean) = clients(&faults);
    for i in 0..5 {
        clean
            .create(&PostParams::default(), &config_map(&format!("before-{i}")))
            .await
            .expect("create");
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let mirror = tokio::spawn(
        reflector(
            writer,
            watcher(faulty, watcher::Config::default()).default_backoff(),
        )
        .for_each(|_| async {}),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    faults.fail(failure, Duration::from_secs(120));
    for i in 0..12 {
        tokio::time::sleep(Duration::from_secs(7)).await;
        clean
            .create(&PostParams::default(), &config_map(&format!("during-{i}")))
            .await
            .expect("create");
        if i < 5 {
            clean
                .delete(&format!("before-{i}"), &DeleteParams::default())
                .await
                .expect("delete");
        }
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    let seen = reader.state().iter().map(|m| m.name_any()).collect();
    let stored = clean
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    mirror.abort();
    (seen, stored, faults)
}

#[tokio::test(start_paused = true)]
async fn a_reflector_whose_watches_drop_resumes_and_misses_nothing() {
    let (seen, stored, faults) = mirror_through(ApiFailure::DropWatches).await;
    assert_eq!(seen, stored);
    assert_eq!(stored.len(), 12);
    let counts = faults.counts();
    assert!(counts.watch_drops >= 5, "{counts:?}");
    assert_eq!(counts.gone, 0, "resumed watches are not refused: {counts:?}");
}

#[tokio::test(start_paused = true)]
async fn a_reflector_refused_with_410_relists_and_drops_what_was_deleted_meanwhile() {
    let (seen, stored, faults) = mirror_through(ApiFailure::Gone).await;
    assert_eq!(seen, stored);
    assert!(!seen.contains("before-0"), "deleted while the watch was away");
    let counts = faults.counts();
    assert!(counts.gone >= 5, "every resume was refused: {counts:?}");
}

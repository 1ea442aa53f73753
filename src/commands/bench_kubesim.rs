//! `joist bench kubesim`: kubesim at scale, with its scheduler and kubelets running. Creates the
//! nodes, then the pods (unbound, so kubesim's scheduler places every one), waits until all run,
//! then times a full list of the pods through the API (JSON included) and a watch fan-out: several
//! watchers each receiving every event of a burst of pod updates.

use std::{io, process::ExitCode, sync::Arc, time::Duration};

use bytes::Bytes;
use joist_kubesim::{
    Cluster, ClusterSettings, PhysicsSettings, Store,
    api::{ApiRequest, ApiServer},
    physics::KubeletSettings,
    resources::GroupResource,
    store::{ObjectKey, Part},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{CommandError, bench::peak_memory_mib};

/// Runs the benchmark and prints its figures.
pub fn run(
    nodes: usize,
    pods: usize,
    watchers: usize,
    out: &mut dyn io::Write,
) -> Result<ExitCode, CommandError> {
    let runtime = super::runtime()?;
    let report = runtime.block_on(measure(nodes, pods, watchers));
    writeln!(out, "{report}").map_err(CommandError::stdout)?;
    Ok(ExitCode::SUCCESS)
}

async fn measure(nodes: usize, pods: usize, watchers: usize) -> String {
    let instant = Duration::from_millis(1);
    let cluster = Cluster::start(ClusterSettings {
        physics: PhysicsSettings {
            kubelet: KubeletSettings {
                node_ready_after: instant,
                pod_running_after: instant,
                startup_taints_removed_after: instant,
            },
            ..PhysicsSettings::default()
        },
        ..ClusterSettings::default()
    });
    let store = cluster.store().clone();
    let mut lines = vec![
        format!("nodes             {nodes}"),
        format!("pods              {pods}"),
    ];

    let start = Instant::now();
    for index in 0..nodes {
        let _ = store.create(&GroupResource::new("", "nodes"), "", node(index), false);
    }
    let node_count = nodes;
    wait_until(
        &store,
        "nodes",
        |n| n.pointer("/status/conditions").is_some(),
        node_count,
    )
    .await;
    lines.push(format!(
        "nodes ready       {:.2} s",
        start.elapsed().as_secs_f64()
    ));

    let start = Instant::now();
    for index in 0..pods {
        let _ = store.create(&GroupResource::new("", "pods"), "default", pod(index), false);
    }
    let created = start.elapsed().as_secs_f64();
    wait_until(
        &store,
        "pods",
        |p| p.pointer("/status/phase").and_then(Value::as_str) == Some("Running"),
        pods,
    )
    .await;
    let running = start.elapsed().as_secs_f64();
    lines.push(format!(
        "pods created      {created:.2} s ({:.0} creates/s)",
        pods as f64 / created
    ));
    lines.push(format!(
        "pods running      {running:.2} s after the first create ({:.0} pods/s scheduled, bound and started)",
        pods as f64 / running
    ));

    let server = ApiServer::new(store.clone(), "127.0.0.1:443");
    let start = Instant::now();
    let response = server.handle(get("/api/v1/pods"));
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    lines.push(format!(
        "list all pods     {:.0} ms, {:.0} MiB of JSON",
        start.elapsed().as_secs_f64() * 1000.0,
        body.len() as f64 / 1_048_576.0
    ));

    let updates = pods.min(10_000);
    let revision = store.revision();
    let mut streams = Vec::new();
    for _ in 0..watchers {
        let response = server.handle(get(&format!(
            "/api/v1/pods?watch=true&resourceVersion={revision}"
        )));
        streams.push(tokio::spawn(count_lines(response.into_body(), updates)));
    }
    let start = Instant::now();
    for index in 0..updates {
        let key = ObjectKey::new("default", &format!("pod-{index}"));
        let _ = store.modify(
            &GroupResource::new("", "pods"),
            &key,
            Part::Main,
            false,
            |current| {
                let mut next = current.clone();
                next["metadata"]["labels"]["touched"] = json!("yes");
                Ok(next)
            },
        );
    }
    for stream in streams {
        let _ = stream.await;
    }
    lines.push(format!(
        "watch fan-out     {updates} updates to {watchers} watchers in {:.0} ms ({:.0} events/s delivered)",
        start.elapsed().as_secs_f64() * 1000.0,
        (updates * watchers) as f64 / start.elapsed().as_secs_f64()
    ));
    lines.push(match peak_memory_mib() {
        Some(mib) => format!("peak memory       {mib} MiB"),
        None => "peak memory       unknown".to_owned(),
    });
    lines.join("\n")
}

fn get(path_and_query: &str) -> ApiRequest {
    let request = http::Request::get(path_and_query)
        .body(Bytes::new())
        .unwrap_or_default();
    ApiRequest::from_http(request)
}

/// Reads a watch stream until `expected` events arrived.
async fn count_lines(mut body: joist_kubesim::api::ApiBody, expected: usize) {
    let mut seen = 0;
    while seen < expected {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(frame)) => {
                seen += frame
                    .data_ref()
                    .map_or(0, |d| d.iter().filter(|b| **b == b'\n').count())
            }
            _ => return,
        }
    }
}

/// Polls the store until `count` objects of `resource` pass `done`.
async fn wait_until(store: &Arc<Store>, resource: &str, done: impl Fn(&Value) -> bool, count: usize) {
    loop {
        let page = store.list(&GroupResource::new("", resource), None, None, None, &done);
        if page.items.len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node(index: usize) -> Value {
    let name = format!("node-{index:05}");
    let zone = ["us-west-2a", "us-west-2b", "us-west-2c"][index % 3];
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
        "status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        },
    })
}

fn pod(index: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{index}"), "labels": {"app": format!("app-{}", index % 100)}},
        "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    })
}

//! kubesim held to the real thing by real clients: kube-rs (typed API, watcher, reflector), and the
//! real kubectl and helm binaries over HTTP. One test binary, so the suite links once.

mod api;
mod clients;
mod faults;
mod kubectl;
mod physics;

use std::{sync::Arc, time::Duration};

use joist_kubesim::{
    Clock, Cluster, ClusterSettings, PhysicsSettings, Serializing, physics::KubeletSettings,
};
use joist_messages::scheduler_config::SchedulerConfig;

/// A cluster with fast physics, so tests wait milliseconds rather than seconds.
pub fn cluster() -> Cluster {
    cluster_detaching_after(Duration::from_millis(50))
}

/// `cluster`, with volumes detaching `detach_after` their last pod left.
pub fn cluster_detaching_after(detach_after: Duration) -> Cluster {
    cluster_of(detach_after, None)
}

/// `cluster`, its scheduler configured by the document `scheduler`.
pub fn cluster_scheduling_by(scheduler: &str) -> Cluster {
    let config = SchedulerConfig::parse(scheduler).expect("a valid scheduler configuration");
    cluster_of(Duration::from_millis(50), Some(Arc::new(config)))
}

fn cluster_of(detach_after: Duration, scheduler: Option<Arc<SchedulerConfig>>) -> Cluster {
    Cluster::start(ClusterSettings {
        clock: Clock::system(),
        seed: 7,
        physics: PhysicsSettings {
            kubelet: KubeletSettings {
                node_ready_after: Duration::from_millis(20),
                pod_running_after: Duration::from_millis(20),
                startup_taints_removed_after: Duration::from_millis(20),
            },
            unschedulable_retry: Duration::from_secs(300),
            detach_after,
            scheduler,
        },
        // As `joist simulate` runs it: the physics tests read versions the encoding thread makes.
        serializing: Serializing::Beside,
    })
}

/// Polls `check` every 20 ms until it gives a value, failing the test after 10 s.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..500 {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A Deployment of `replicas` pause pods asking for `cpu` each.
pub fn deployment(name: &str, replicas: i32, cpu: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "pause", "image": "public.ecr.aws/eks-distro/kubernetes/pause:3.7",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }]},
            },
        },
    })
}

/// A Ready-able node with the given cpu and zone.
pub fn node(name: &str, cpu: &str, zone: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone, "kubernetes.io/os": "linux",
        }},
        "spec": {"providerID": format!("aws:///{zone}/i-{name}")},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
        },
    })
}

//! The cluster's physics: scheduler, kubelets, workload controllers, eviction and garbage collection.

use joist_kubesim::history::Reads;
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    batch::v1::Job,
    core::v1::{Event, Node, Pod},
    policy::v1::{Eviction, PodDisruptionBudget},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use std::time::Duration;

use crate::{cluster, cluster_scheduling_by, deployment, eventually, node};

fn scheduled(pod: &Pod) -> Option<(String, String, String)> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    Some((
        condition.status.clone(),
        condition.reason.clone().unwrap_or_default(),
        condition.message.clone().unwrap_or_default(),
    ))
}

async fn create<T>(api: &Api<T>, value: serde_json::Value) -> T
where
    T: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: T = serde_json::from_value(value).expect("manifest");
    api.create(&PostParams::default(), &object).await.expect("create")
}

/// Waits until listing `api` with `params` finds nothing.
async fn until_none<K>(what: &str, api: &Api<K>, params: &ListParams)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, || async {
        api.list(params).await.ok()?.items.is_empty().then_some(())
    })
    .await;
}

/// Waits until the node `name` is Ready.
async fn until_ready(nodes: &Api<Node>, name: &str) {
    eventually(&format!("{name} to be Ready"), || async {
        let node = nodes.get(name).await.ok()?;
        node.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
}

/// A cluster with one 8-CPU node, `n1`, and a client of it.
async fn with_node_n1() -> (joist_kubesim::Cluster, kube::Client) {
    let cluster = cluster();
    let client = cluster.client();
    create(&Api::<Node>::all(client.clone()), node("n1", "8", "us-west-2a")).await;
    (cluster, client)
}

/// A cluster with two 8-CPU nodes in us-west-2a (`a1`, `a2`) and one in us-west-2b (`b1`): its
/// nodes, and the pods of the default namespace.
async fn with_zones_a_and_b() -> (joist_kubesim::Cluster, Api<Node>, Api<Pod>) {
    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, zone) in [("a1", "us-west-2a"), ("a2", "us-west-2a"), ("b1", "us-west-2b")] {
        create(&nodes, node(name, "8", zone)).await;
    }
    (cluster, nodes, Api::namespaced(client, "default"))
}

#[tokio::test]
async fn required_anti_affinity_gives_each_pod_a_node_of_its_own_and_affinity_keeps_them_together() {
    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["n1", "n2"] {
        create(&nodes, node(name, "8", "us-west-2a")).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, app: &str, affinity: serde_json::Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app, "tier": "web"}},
            "spec": {"containers": [{"name": "c", "image": "pause"}], "affinity": affinity},
        })
    };
    let alone = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "alone", "tier": "web"}}}
    ]}});
    for name in ["alone-1", "alone-2", "alone-3"] {
        create(&pods, pod(name, "alone", alone.clone())).await;
    }
    let placed = eventually("two pods placed and one unschedulable", || async {
        let list = pods.list(&ListParams::default().labels("app=alone")).await.ok()?;
        let nodes: Vec<String> = list
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        let waiting = list
            .items
            .iter()
            .filter_map(scheduled)
            .any(|(status, _, _)| status == "False");
        (nodes.len() == 2 && waiting).then_some(nodes)
    })
    .await;
    assert_ne!(placed[0], placed[1], "each pod on a node of its own: {placed:?}");
    let with = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "alone"}}}
    ]}});
    create(&pods, pod("companion", "companion", with)).await;
    let companion = eventually("the companion placed", || async {
        pods.get("companion").await.ok()?.spec?.node_name
    })
    .await;
    assert!(
        placed.contains(&companion),
        "next to a pod it selects: {companion} not in {placed:?}"
    );
}

/// Anti-affinity holds both ways, as in kube-scheduler: a bound pod's required anti-affinity keeps
/// the pods it selects out of its domain even though they state nothing themselves, and the
/// domain takes them again once it is gone.
#[tokio::test]
async fn a_bound_pods_anti_affinity_keeps_the_pods_it_selects_out_of_its_zone_until_it_leaves() {
    let (_cluster, _nodes, pods) = with_zones_a_and_b().await;
    let pod = |name: &str, app: &str, spec: serde_json::Value| {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "pause"}]);
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": spec,
        })
    };
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    let guard = json!({
        "nodeSelector": {"kubernetes.io/hostname": "a1"},
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "web"}}}
        ]}},
    });
    create(&pods, pod("guard", "guard", guard)).await;
    eventually("the guard placed", || node_of("guard")).await;
    // a2 is in the guard's zone, not on its node.
    let on_a2 = json!({"nodeSelector": {"kubernetes.io/hostname": "a2"}});
    create(&pods, pod("web-a", "web", on_a2)).await;
    create(&pods, pod("web", "web", json!({}))).await;
    assert_eq!(
        eventually("the free web pod placed", || node_of("web")).await,
        "b1",
        "out of the guard's zone"
    );
    let message = eventually("the web pod for a2 refused", || async {
        let (status, _, message) = scheduled(&pods.get("web-a").await.ok()?)?;
        (status == "False").then_some(message)
    })
    .await;
    assert!(
        message.contains("1 node(s) didn't satisfy existing pods anti-affinity rules")
            && message.contains("2 node(s) didn't match Pod's node affinity/selector"),
        "kube-scheduler's reasons: {message}"
    );
    pods.delete("guard", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    assert_eq!(
        eventually("the web pod for a2 placed", || node_of("web-a")).await,
        "a2",
        "the whole zone takes it once the guard is gone"
    );
}

/// The scheduler remembers which nodes refuse a kind of pod; what frees a node (a pod leaving
/// it, a zone emptied, a node relabelled) must be seen by the next pod of that kind.
#[tokio::test]
async fn a_pod_every_node_refused_goes_where_a_pod_left_a_zone_emptied_or_a_label_changed() {
    let (_cluster, nodes, pods) = with_zones_a_and_b().await;
    let pod = |name: &str, app: &str, cpu: &str, extra: serde_json::Value| {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu}}}]},
        });
        if let (Some(spec), Some(extra)) = (pod["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        pod
    };
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    let refused = |name: &'static str, reason: &'static str| {
        let pods = pods.clone();
        async move {
            let (status, _, message) = scheduled(&pods.get(name).await.ok()?)?;
            (status == "False" && message.contains(reason)).then_some(())
        }
    };

    // One pod per zone: the third is refused by all three nodes, then goes to the zone a pod left.
    let per_zone = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "zonal"}}}
    ]}}});
    create(&pods, pod("zonal-1", "zonal", "1", per_zone.clone())).await;
    create(&pods, pod("zonal-2", "zonal", "1", per_zone.clone())).await;
    eventually("two zonal pods placed", || async {
        Some((node_of("zonal-1").await?, node_of("zonal-2").await?))
    })
    .await;
    create(&pods, pod("zonal-3", "zonal", "1", per_zone)).await;
    eventually("the third zonal pod refused", || {
        refused("zonal-3", "3 node(s) didn't match pod anti-affinity rules")
    })
    .await;
    let in_a = if node_of("zonal-1").await.is_some_and(|n| n.starts_with('a')) {
        "zonal-1"
    } else {
        "zonal-2"
    };
    pods.delete(in_a, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    let placed = eventually("the third zonal pod placed", || node_of("zonal-3")).await;
    assert!(placed.starts_with('a'), "into the zone the pod left: {placed}");

    // A pod too big for what is left waits until a pod leaves its node.
    create(
        &pods,
        pod(
            "big-1",
            "big",
            "7",
            json!({"nodeSelector": {"kubernetes.io/hostname": "b1"}}),
        ),
    )
    .await;
    eventually("the first big pod placed", || node_of("big-1")).await;
    create(
        &pods,
        pod(
            "big-2",
            "big",
            "7",
            json!({"nodeSelector": {"kubernetes.io/hostname": "b1"}}),
        ),
    )
    .await;
    eventually("the second big pod refused", || {
        refused("big-2", "Insufficient cpu")
    })
    .await;
    pods.delete("big-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    assert_eq!(
        eventually("the second big pod placed", || node_of("big-2")).await,
        "b1"
    );

    // A pod no node's labels allow goes to the node relabelled for it.
    create(
        &pods,
        pod("gpu", "gpu", "1", json!({"nodeSelector": {"accelerator": "gpu"}})),
    )
    .await;
    eventually("the gpu pod refused", || {
        refused("gpu", "didn't match Pod's node affinity/selector")
    })
    .await;
    let label = json!({"metadata": {"labels": {"accelerator": "gpu"}}});
    nodes
        .patch(
            "a2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await
        .expect("label");
    assert_eq!(eventually("the gpu pod placed", || node_of("gpu")).await, "a2");
}

#[tokio::test]
async fn a_configured_default_spread_keeps_a_replica_sets_pods_level_across_zones() {
    let cluster = cluster_scheduling_by(
        "podTopologySpread: {defaultConstraints: [{maxSkew: 1, \
         topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}]}",
    );
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, node("a1", "8", "us-west-2a")).await;
    create(&nodes, node("b1", "1", "us-west-2b")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Four pods of one ReplicaSet, room for one in zone b: a third in zone a keeps the skew at
    // one, a fourth would make it two.
    create(
        &Api::<Deployment>::namespaced(client.clone(), "default"),
        deployment("web", 4, "1"),
    )
    .await;
    let web = ListParams::default().labels("app=web");
    let message = eventually("three web pods placed and the fourth refused", || async {
        let listed = pods.list(&web).await.ok()?.items;
        let placed = listed
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        let refused = listed
            .iter()
            .find_map(|p| scheduled(p).filter(|(status, ..)| status == "False"))?;
        (placed == 3).then_some(refused.2)
    })
    .await;
    assert!(
        message.contains("didn't match pod topology spread constraints"),
        "{message}"
    );
    // A pod nothing selects is not spread: it goes to zone a however full of web pods it is.
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "solo", "labels": {"app": "solo"}},
            "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "1"}}}]}}),
    )
    .await;
    let solo = eventually("the bare pod placed", || async {
        pods.get("solo").await.ok()?.spec?.node_name
    })
    .await;
    assert_eq!(solo, "a1");
}

#[tokio::test]
async fn pods_stay_pending_as_unschedulable_until_a_node_can_take_them() {
    let cluster = cluster();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    create(&deployments, deployment("inflate", 3, "1")).await;

    let pending = eventually("three unschedulable pods", || async {
        let list = pods
            .list(&ListParams::default().labels("app=inflate"))
            .await
            .ok()?;
        let marked: Vec<_> = list.items.iter().filter_map(scheduled).collect();
        (marked.len() == 3).then_some(marked)
    })
    .await;
    for (status, reason, message) in &pending {
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Unschedulable"));
        assert_eq!(message, "no nodes available to schedule pods");
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let failed = events
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await
        .expect("events");
    assert_eq!(failed.items.len(), 3);

    // A node too small for the pods: the message names the shortage.
    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, node("small", "500m", "us-west-2a")).await;
    eventually("an Insufficient cpu message", || async {
        let list = pods
            .list(&ListParams::default().labels("app=inflate"))
            .await
            .ok()?;
        list.items
            .iter()
            .filter_map(scheduled)
            .all(|(_, _, m)| m.contains("1 Insufficient cpu"))
            .then_some(())
    })
    .await;

    // A node that fits all three: they bind, run, and the Deployment becomes Available.
    create(&nodes, node("big", "4", "us-west-2b")).await;
    eventually("three running pods on the big node", || async {
        let list = pods
            .list(&ListParams::default().labels("app=inflate"))
            .await
            .ok()?;
        let running = list.items.iter().filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("big")
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        (running.count() == 3).then_some(())
    })
    .await;
    eventually("the Deployment to be Available", || async {
        let d = deployments.get("inflate").await.ok()?;
        let available = d
            .status?
            .conditions?
            .into_iter()
            .any(|c| c.type_ == "Available" && c.status == "True");
        available.then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pods_requests_count_its_sidecars_and_pod_level_resources_as_kube_schedulers_do() {
    let cluster = cluster();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cpu = |amount: &str| json!({"requests": {"cpu": amount}});
    let pod = |name: &str, spec: serde_json::Value| {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec});
        pod["spec"]["containers"] = json!([{"name": "app", "image": "app", "resources": cpu("1")}]);
        pod
    };
    // 1 cpu in the app and 1 in a sidecar: the whole of a 2-cpu node.
    create(
        &pods,
        pod(
            "proxied",
            json!({"initContainers": [
                {"name": "proxy", "image": "proxy", "restartPolicy": "Always", "resources": cpu("1")}
            ]}),
        ),
    )
    .await;
    // A pod-level request of 3 cpu stands for its app's 1.
    create(&pods, pod("sized", json!({"resources": cpu("3")}))).await;
    create(
        &Api::<Node>::all(client.clone()),
        node("small", "2", "us-west-2a"),
    )
    .await;
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    assert_eq!(
        eventually("the proxied pod placed", || node_of("proxied")).await,
        "small"
    );
    eventually("the sized pod refused for cpu", || async {
        let (_, reason, message) = scheduled(&pods.get("sized").await.ok()?)?;
        (reason == "Unschedulable" && message.contains("Insufficient cpu")).then_some(())
    })
    .await;
    create(&pods, pod("extra", json!({}))).await;
    eventually("the extra pod refused: the sidecar counts", || async {
        let (_, reason, message) = scheduled(&pods.get("extra").await.ok()?)?;
        (reason == "Unschedulable" && message.contains("Insufficient cpu")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn taints_selectors_and_host_ports_keep_pods_off_nodes() {
    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut tainted = node("tainted", "4", "us-west-2a");
    tainted["spec"]["taints"] = json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]);
    create(&nodes, tainted).await;
    until_ready(&nodes, "tainted").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, extra: serde_json::Value| {
        let mut pod =
            json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "pause"}]}});
        if let Some(fields) = extra.as_object() {
            for (k, v) in fields {
                pod["spec"][k] = v.clone();
            }
        }
        pod
    };
    create(&pods, pod("plain", json!({}))).await;
    create(&pods, pod("tolerant", json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}))).await;
    create(
        &pods,
        pod(
            "elsewhere",
            json!({
                "tolerations": [{"operator": "Exists"}],
                "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2c"},
            }),
        ),
    )
    .await;
    let outcome = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            let bound = pod.spec.as_ref()?.node_name.clone();
            match bound {
                Some(node) => Some(format!("bound to {node}")),
                None => scheduled(&pod).map(|(_, _, message)| message),
            }
        }
    };
    let plain = eventually("plain pod decided", || outcome("plain")).await;
    assert!(plain.contains("untolerated taint {dedicated: gpu}"), "{plain}");
    assert_eq!(
        eventually("tolerant pod decided", || outcome("tolerant")).await,
        "bound to tainted"
    );
    let elsewhere = eventually("zone-selected pod decided", || outcome("elsewhere")).await;
    assert!(
        elsewhere.contains("didn't match Pod's node affinity/selector"),
        "{elsewhere}"
    );
}

#[tokio::test]
async fn a_pod_goes_to_a_node_without_a_prefer_no_schedule_taint_it_does_not_tolerate_first() {
    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, cpu: &str, extra: serde_json::Value| {
        let mut pod = json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu}}}
        ]}});
        if let Some(fields) = extra.as_object() {
            for (k, v) in fields {
                pod["spec"][k] = v.clone();
            }
        }
        pod
    };
    let bound_to = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    create(&nodes, node("busy", "4", "us-west-2a")).await;
    create(&pods, pod("filler", "3", json!({}))).await;
    assert_eq!(eventually("filler bound", || bound_to("filler")).await, "busy");
    let mut spare = node("spare", "4", "us-west-2a");
    spare["spec"]["taints"] = json!([{"key": "leaving", "effect": "PreferNoSchedule"}]);
    create(&nodes, spare).await;
    until_ready(&nodes, "spare").await;
    create(&pods, pod("plain", "100m", json!({}))).await;
    assert_eq!(
        eventually("plain bound", || bound_to("plain")).await,
        "busy",
        "the fuller node without the taint wins over the empty one with it"
    );
    create(&pods, pod("big", "2", json!({}))).await;
    assert_eq!(
        eventually("big bound", || bound_to("big")).await,
        "spare",
        "a preference: a pod that fits only there still goes there"
    );
    create(
        &pods,
        pod(
            "tolerant",
            "100m",
            json!({"tolerations": [{"key": "leaving", "operator": "Exists"}]}),
        ),
    )
    .await;
    assert_eq!(
        eventually("tolerant bound", || bound_to("tolerant")).await,
        "spare",
        "a pod tolerating the taint goes to the least allocated node"
    );
}

#[tokio::test]
async fn evictions_honour_pod_disruption_budgets() {
    let (_cluster, client) = with_node_n1().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    create(&deployments, deployment("web", 3, "100m")).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    create(&pdbs, json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ready = |pods: Api<Pod>| async move {
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .map(|p| p.name_any())
            .collect();
        (ready.len() == 3).then_some(ready)
    };
    let names = eventually("three ready web pods", || ready(pods.clone())).await;
    eventually("the budget to allow one disruption", || async {
        let allowed = pdbs.get("web").await.ok()?.status?.disruptions_allowed;
        (allowed == 1).then_some(())
    })
    .await;
    pods.evict(&names[0], &EvictParams::default())
        .await
        .expect("the first eviction fits the budget");
    match pods.evict(&names[1], &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429);
            assert!(
                status
                    .message
                    .contains("disruption budget web needs 2 healthy pods and has 2"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 429, got {other:?}"),
    }
    let _: Option<Eviction> = None;
}

#[tokio::test]
async fn owners_collect_their_dependents_and_a_lost_node_loses_its_pods() {
    let (_cluster, client) = with_node_n1().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    create(&deployments, deployment("app", 2, "100m")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on_node = |pods: Api<Pod>, node: &'static str, count: usize| async move {
        let list = pods.list(&ListParams::default().labels("app=app")).await.ok()?;
        let matching = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .count();
        (matching == count && list.items.len() == count).then_some(())
    };
    eventually("two pods on n1", || on_node(pods.clone(), "n1", 2)).await;
    create(&nodes, node("n2", "8", "us-west-2b")).await;
    nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete node");
    eventually("the ReplicaSet to replace the pods on n2", || {
        on_node(pods.clone(), "n2", 2)
    })
    .await;
    deployments
        .delete("app", &DeleteParams::default())
        .await
        .expect("delete deployment");
    until_none(
        "the pods to be collected",
        &pods,
        &ListParams::default().labels("app=app"),
    )
    .await;
}

#[tokio::test]
async fn daemonsets_cover_each_node_and_jobs_complete() {
    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["a", "b"] {
        create(&nodes, node(name, "2", "us-west-2a")).await;
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    create(&daemonsets, json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "agent", "image": "agent", "resources": {"requests": {"cpu": "100m"}}}]},
        }},
    }))
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("one agent pod per node", || async {
        let list = pods.list(&ListParams::default().labels("app=agent")).await.ok()?;
        let mut hosts: Vec<String> = list
            .items
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        hosts.sort();
        (hosts == ["a", "b"]).then_some(())
    })
    .await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    create(
        &jobs,
        json!({
            "metadata": {"name": "batch"},
            "spec": {"completions": 2, "parallelism": 2, "template": {
                "metadata": {"annotations": {"kubesim.joist.dev/run-for": "1s"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "work", "image": "work"}]},
            }},
        }),
    )
    .await;
    eventually("the Job to complete", || async {
        let job = jobs.get("batch").await.ok()?;
        let status = job.status?;
        let complete = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        (complete && status.succeeded == Some(2)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_changed_template_rolls_within_max_surge_and_max_unavailable() {
    use joist_kubesim::{conditions, resources::GroupResource, store::EventKind};
    use kube::api::{Patch, PatchParams};
    use std::collections::HashMap;

    let (cluster, client) = with_node_n1().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let mut manifest = deployment("web", 4, "100m");
    manifest["spec"]["strategy"] = json!({"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    create(&deployments, manifest).await;
    let rolled = |generation: &'static str| {
        let deployments = deployments.clone();
        move || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("web").await.ok()?;
                let status = d.status?;
                let hash = d.spec?.template.metadata?.annotations.unwrap_or_default();
                (hash.get("generation").map_or("first", String::as_str) == generation
                    && status.updated_replicas == Some(4)
                    && status.available_replicas == Some(4)
                    && status.replicas == Some(4))
                .then_some(())
            }
        }
    };
    eventually("four available pods", rolled("first")).await;

    // The state the rollout starts from, then the template change.
    let store = cluster.store();
    let pods = GroupResource::new("", "pods");
    let revision = store.revision();
    let ready = |pod: &serde_json::Value| conditions::status(pod, "Ready") == Some("True");
    let mut live: HashMap<String, bool> = store
        .list(&pods, Some("default"), None, None, |_| true)
        .items
        .iter()
        .map(|p| (p["metadata"]["name"].to_string(), ready(p)))
        .collect();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"generation": "second"}}}}}),
            ),
        )
        .await
        .expect("patch");
    eventually("the rollout to finish", rolled("second")).await;

    // Replayed from the watch history: never more than 4 + 1 pods, never fewer than 4 ready.
    let mut cursor = store.watch(&pods, Some(revision), Reads::Objects).expect("watch");
    let events = store.poll(&mut cursor, usize::MAX).expect("poll");
    let (mut most, mut fewest_ready) = (live.len(), 4);
    for event in &events {
        let object = event.object.value().expect("a kept version parses");
        let name = object["metadata"]["name"].to_string();
        let leaving = event.kind == EventKind::Deleted || !object["metadata"]["deletionTimestamp"].is_null();
        if leaving {
            live.remove(&name);
        } else {
            live.insert(name, ready(&object));
        }
        most = most.max(live.len());
        fewest_ready = fewest_ready.min(live.values().filter(|r| **r).count());
    }
    assert_eq!(most, 5, "one pod of surge, no more");
    assert_eq!(fewest_ready, 4, "no pod missing: maxUnavailable 0");
    let running: Vec<_> = store
        .list(&pods, Some("default"), None, None, |p| {
            p["metadata"]["deletionTimestamp"].is_null()
        })
        .items
        .iter()
        .map(|p| p["metadata"]["annotations"]["generation"].clone())
        .collect();
    assert_eq!(
        running,
        vec![json!("second"); 4],
        "every pod is of the new template"
    );
}

/// The claim `data` and the pod `db` that uses it.
async fn create_pod_with_claim(client: &kube::Client) {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    create(
        &claims,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "containers": [{"name": "db", "image": "postgres"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            },
        }),
    )
    .await;
}

#[tokio::test]
async fn a_pod_with_a_claim_gets_a_volume_attached_to_its_node_until_it_leaves() {
    use k8s_openapi::api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::VolumeAttachment,
    };

    let (_cluster, client) = with_node_n1().await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create_pod_with_claim(&client).await;
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attachment = eventually("the volume to attach to n1", || async {
        attachments
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let claim = claims.get("data").await.expect("claim");
    let volume = claim
        .spec
        .and_then(|s| s.volume_name)
        .expect("the claim is bound");
    assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .expect("the provisioned volume");
    assert_eq!(
        pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.name).as_deref(),
        Some("data")
    );
    assert_eq!(attachment.spec.node_name, "n1");
    assert_eq!(
        attachment.spec.source.persistent_volume_name.as_deref(),
        Some(volume.as_str())
    );
    assert_eq!(attachment.status.map(|s| s.attached), Some(true));

    pods.delete("db", &DeleteParams::default()).await.expect("delete");
    until_none("the volume to detach", &attachments, &ListParams::default()).await;
}

/// A pod `name` of one CPU whose volume is the claim `claim`.
fn with_claim(name: &str, claim: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "app", "resources": {"requests": {"cpu": "1"}}}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}})
}

#[tokio::test]
async fn a_pod_goes_only_where_its_claims_volume_or_storage_class_allows() {
    use k8s_openapi::api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::StorageClass,
    };

    let cluster = cluster();
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, node("n-a", "8", "us-west-2a")).await;
    create(&nodes, node("n-b", "8", "us-west-2b")).await;
    let in_zone_b = json!([{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]}]}]);
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-b"},
            "spec": {
                "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-b"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": in_zone_b}},
            },
        }),
    )
    .await;
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "only-b"},
            "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
            "allowedTopologies": [{"matchLabelExpressions": [
                {"key": "topology.kubernetes.io/zone", "values": ["us-west-2b"]}]}],
        }),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = |name: &str, spec: serde_json::Value| {
        let mut spec = spec;
        spec["accessModes"] = json!(["ReadWriteOnce"]);
        spec["resources"] = json!({"requests": {"storage": "10Gi"}});
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };
    create(&claims, claim("data", json!({"volumeName": "pv-b"}))).await;
    create(&claims, claim("scratch", json!({"storageClassName": "only-b"}))).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    // Of two empty nodes n-a wins the tie, and once n-b holds a pod it is the emptier: each pod
    // lands on n-b only because its volume is there or can only be made there.
    create(&pods, with_claim("db", "data")).await;
    assert_eq!(eventually("db placed", || node_of("db")).await, "n-b");
    create(&pods, with_claim("cache", "scratch")).await;
    assert_eq!(eventually("cache placed", || node_of("cache")).await, "n-b");
    let provisioned = eventually("scratch bound", || async {
        claims.get("scratch").await.ok()?.spec?.volume_name
    })
    .await;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&provisioned)
        .await
        .expect("the provisioned volume");
    let affinity = serde_json::to_value(pv.spec.and_then(|s| s.node_affinity)).expect("json");
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"], in_zone_b,
        "provisioned in its node's zone"
    );

    create(&pods, with_claim("orphan", "nope")).await;
    eventually("the pod without its claim refused", || async {
        let (_, reason, message) = scheduled(&pods.get("orphan").await.ok()?)?;
        (reason == "Unschedulable" && message.contains("persistentvolumeclaim \"nope\" not found"))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_node_takes_no_more_volumes_than_its_csi_node_allows() {
    use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::CSINode};

    let (_cluster, client) = with_node_n1().await;
    // What the EBS CSI driver's node plugin registers: one volume fits.
    create(
        &Api::<CSINode>::all(client.clone()),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"},
            "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 1}}]}}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    for name in ["first", "second"] {
        create(
            &claims,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.spec?.node_name }
    };
    create(&pods, with_claim("a", "first")).await;
    assert_eq!(eventually("a placed", || node_of("a")).await, "n1");
    create(&pods, with_claim("b", "second")).await;
    eventually("b refused: no slot left", || async {
        let (_, reason, message) = scheduled(&pods.get("b").await.ok()?)?;
        (reason == "Unschedulable" && message.contains("node(s) exceed max volume count")).then_some(())
    })
    .await;
    // A pod of the claim already attached takes no new slot.
    create(&pods, with_claim("c", "first")).await;
    assert_eq!(eventually("c placed", || node_of("c")).await, "n1");
}

#[tokio::test]
async fn a_node_that_goes_takes_its_attachments_at_once() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;

    // Detaching takes an hour: only the node going can end it sooner.
    let cluster = crate::cluster_detaching_after(std::time::Duration::from_secs(3600));
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    create(&nodes, node("n1", "8", "us-west-2a")).await;
    create_pod_with_claim(&client).await;
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    eventually("the volume to attach", || async {
        (!attachments
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty())
        .then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("db", &DeleteParams::default())
        .await
        .expect("delete pod");
    until_none("the pod to go", &pods, &ListParams::default()).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let detaching = attachments.list(&ListParams::default()).await.expect("list");
    assert_eq!(detaching.items.len(), 1, "detaching, for an hour");
    nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete node");
    until_none(
        "the attachment to go with its node",
        &attachments,
        &ListParams::default(),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_keeps_failing_backs_off_while_nodes_keep_coming() {
    let cluster = cluster();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(
        &Api::<Deployment>::namespaced(client.clone(), "default"),
        deployment("inflate", 1, "2"),
    )
    .await;
    // Twenty nodes too small for the pod, one every 300 ms: each is a change that releases it, but
    // after its first failures it waits out a backoff of 1, 2, 4, 8, then 10 s.
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..20 {
        create(&nodes, node(&format!("small-{i}"), "1", "us-west-2a")).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let failed = events
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await
        .expect("events")
        .items;
    assert_eq!(
        failed.len(),
        1,
        "the attempts are one series, as kube-scheduler records them"
    );
    assert!(failed[0].last_timestamp > failed[0].first_timestamp);
    // A node that fits: the pod is bound once its backoff is over, within the 10 s cap.
    create(&nodes, node("big", "4", "us-west-2a")).await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    let list = pods
        .list(&ListParams::default().labels("app=inflate"))
        .await
        .expect("pods");
    let bound: Vec<_> = list
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(bound, ["big"]);
    // The series' count is written once it has ended.
    tokio::time::sleep(2 * joist_kubesim::events::SERIES_FINISH).await;
    let failed = events
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await
        .expect("events")
        .items;
    let attempts = failed[0].count.unwrap_or_default();
    assert!(
        (3..=6).contains(&attempts),
        "one failed attempt per backoff over 6 s (1, 2, then 4 s apart), not one per node: counted {attempts}"
    );
}

/// A ReplicaSet scaled to thousands creates its pods a hundred at a time between two turns of the
/// runtime, and kube-scheduler marks each turn's pods unschedulable (there are no nodes) before the
/// next hundred come: a watcher polling every turn sees every pod, and none waits behind a long
/// burst for the condition Joist reacts to.
#[tokio::test(start_paused = true)]
async fn a_replica_set_scaled_far_creates_its_pods_in_short_turns_the_scheduler_follows() {
    const PODS: usize = 2_000;
    let cluster = cluster();
    let client = cluster.client();
    let store = cluster.store().clone();
    let resource = joist_kubesim::resources::GroupResource::new("", "pods");
    let mut cursor = store.watch(&resource, None, Reads::Objects).expect("watch");
    create(
        &Api::<Deployment>::namespaced(client.clone(), "default"),
        deployment("inflate", PODS as i32, "1"),
    )
    .await;
    let (mut created, mut largest, mut marked_behind) = (0, 0, 0);
    let mut marked = std::collections::HashSet::new();
    for _ in 0..500 {
        tokio::task::yield_now().await;
        let events = store.poll(&mut cursor, usize::MAX).expect("the watcher kept up");
        let mut added = 0;
        for event in &events {
            let pod = event.object.value().expect("a pod");
            if event.kind == joist_kubesim::store::EventKind::Added {
                added += 1;
            }
            let unschedulable = pod["status"]["conditions"].as_array().is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
            });
            if unschedulable {
                marked.insert(pod["metadata"]["name"].as_str().expect("a name").to_owned());
            }
        }
        created += added;
        largest = largest.max(added);
        marked_behind = marked_behind.max(created - marked.len());
        if marked.len() == PODS {
            break;
        }
    }
    assert_eq!(
        (created, marked.len()),
        (PODS, PODS),
        "every pod created and marked"
    );
    assert!(largest <= 100, "{largest} pods created between two turns");
    assert!(
        marked_behind <= 200,
        "the scheduler fell {marked_behind} pods behind their creation"
    );
}

/// Thousands of pods bound to a node at one instant start together, and a watcher polling every
/// turn of the runtime sees them start at that instant, a thousand at most between two turns.
#[tokio::test(start_paused = true)]
async fn pods_bound_at_one_instant_start_at_it_in_bursts_a_watcher_can_follow() {
    const PODS: usize = 2_500;
    let cluster = cluster();
    let store = cluster.store().clone();
    let mut big = node("big", "4000", "us-west-2a");
    big["status"]["allocatable"]["pods"] = json!(PODS.to_string());
    let nodes = Api::<Node>::all(cluster.client());
    create(&nodes, big).await;
    until_ready(&nodes, "big").await;
    let resource = joist_kubesim::resources::GroupResource::new("", "pods");
    let mut cursor = store.watch(&resource, None, Reads::Objects).expect("watch");
    for index in 0..PODS {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("bound-{index}"), "namespace": "default"},
            "spec": {"nodeName": "big", "containers": [{"name": "pause", "image": "pause"}]},
        });
        store.create(&resource, "default", pod, false).expect("pod");
    }
    // The kubelet starts a pod 20 ms after it sees it bound to a Ready node.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut started_at = Vec::new();
    let mut largest = 0;
    for _ in 0..100 {
        let events = store.poll(&mut cursor, usize::MAX).expect("the watcher kept up");
        let started = events
            .iter()
            .filter(|e| {
                let pod = e.object.value().expect("a pod");
                e.kind == joist_kubesim::store::EventKind::Modified && pod["status"]["phase"] == "Running"
            })
            .count();
        largest = largest.max(started);
        started_at.extend(std::iter::repeat_n(tokio::time::Instant::now(), started));
        if started_at.len() == PODS {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(started_at.len(), PODS, "every pod started");
    assert!(largest <= 1_000, "{largest} pods started between two turns");
    assert!(
        started_at.iter().all(|at| *at == started_at[0]),
        "every pod started at the instant they were all due"
    );
}

/// As on a cluster: a new Node is tainted not-ready until it is Ready, then the taint goes.
#[tokio::test]
async fn a_new_node_is_not_ready_until_its_kubelet_reports_ready() {
    let cluster = cluster();
    let nodes = Api::<Node>::all(cluster.client());
    let created = create(&nodes, node("n1", "8", "us-west-2a")).await;
    let taints = |node: &Node| -> Vec<String> {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| t.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect())
            .unwrap_or_default()
    };
    assert_eq!(taints(&created), ["node.kubernetes.io/not-ready:NoSchedule"]);
    eventually("the Ready node untainted", || async {
        let node = nodes.get("n1").await.ok()?;
        let ready = node
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && taints(&node).is_empty()).then_some(())
    })
    .await;
}

/// As a node agent does: once the Node is Ready, the startup taints its NodeClaim declares (found
/// by provider ID) go, and taints the claim does not declare stay.
#[tokio::test]
async fn a_ready_node_loses_the_startup_taints_of_its_node_claim_and_keeps_others() {
    let cluster = cluster();
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .expect("CRDs");
    let client = cluster.client();
    let claims = Api::<joist_messages::apis::NodeClaim>::all(client.clone());
    let claim: joist_messages::apis::NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": "c1"},
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [],
            "startupTaints": [{"key": "agent.example.com/booting", "effect": "NoSchedule"}],
        },
    }))
    .expect("a NodeClaim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create the claim");
    claims
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"providerID": "aws:///us-west-2a/i-n1"}})),
        )
        .await
        .expect("launch the claim");
    let mut n1 = node("n1", "8", "us-west-2a");
    n1["spec"]["taints"] = json!([
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        {"key": "agent.example.com/booting", "effect": "NoSchedule"},
        {"key": "team.example.com/reserved", "effect": "NoSchedule"},
    ]);
    let nodes = Api::<Node>::all(client);
    create(&nodes, n1).await;
    eventually("the startup taint removed", || async {
        let node = nodes.get("n1").await.ok()?;
        let taints: Vec<String> = node.spec?.taints?.into_iter().map(|t| t.key).collect();
        (taints == ["team.example.com/reserved"]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_stateful_set_makes_its_pods_in_order_each_with_claims_it_keeps() {
    use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::PersistentVolumeClaim};

    let cluster = cluster();
    let client = cluster.client();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    create(
        &sets,
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "postgres"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
            },
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim_of = |pod: &Pod| -> Option<String> {
        let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
        Some(
            volumes
                .first()?
                .persistent_volume_claim
                .as_ref()?
                .claim_name
                .clone(),
        )
    };
    let first = eventually("db-0 made", || async { pods.get("db-0").await.ok() }).await;
    assert_eq!(claim_of(&first).as_deref(), Some("data-db-0"));
    // No node yet: db-0 cannot be Ready, and db-1 waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(pods.get("db-1").await.is_err(), "db-1 made before db-0 was Ready");
    create(&Api::<Node>::all(client.clone()), node("n1", "8", "us-west-2a")).await;
    eventually("both Ready", || async {
        let ready = |pod: Pod| {
            pod.status?
                .conditions?
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        };
        ready(pods.get("db-0").await.ok()?)?;
        ready(pods.get("db-1").await.ok()?)
    })
    .await;
    let second = pods.get("db-1").await.expect("db-1");
    assert_eq!(claim_of(&second).as_deref(), Some("data-db-1"));
    assert_eq!(
        second
            .labels()
            .get("statefulset.kubernetes.io/pod-name")
            .map(String::as_str),
        Some("db-1")
    );

    // A pod that goes comes back under its name, with its claim.
    let before = first.metadata.uid.clone();
    pods.delete("db-0", &DeleteParams::default())
        .await
        .expect("delete");
    let again = eventually("db-0 made again", || async {
        let pod = pods.get("db-0").await.ok()?;
        (pod.metadata.uid != before && pod.metadata.deletion_timestamp.is_none()).then_some(pod)
    })
    .await;
    assert_eq!(claim_of(&again).as_deref(), Some("data-db-0"));

    // Scaled down, the highest ordinal goes and its claim stays.
    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .expect("scale");
    eventually("db-1 gone", || async {
        pods.get("db-1").await.is_err().then_some(())
    })
    .await;
    assert!(pods.get("db-0").await.is_ok());
    let kept: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(kept, ["data-db-0", "data-db-1"]);
}

//! `joist explain` against constructed situations on kubesim: a run of `joist simulate` sets the
//! cluster up, and at its end, with the world still running, the question is answered through a
//! client of the cluster, as the command answers it. A NodePool's budgets over the next day, its
//! limits and nodes; why a node stays, under each blocker a situation produces; a dry run of a
//! removal a PodDisruptionBudget holds; the pods a node was launched for; why a pod waits (the nearest instance type, a taint) or
//! where it runs.

use std::{sync::Arc, time::Duration};

use joist::{
    commands::explain::{Answer, AnswerError, Question, answer},
    simulate::{self, Live},
};
use joist_actors::{
    effects::node_trace::NodeTracer,
    explain::{
        node::{NodeAnswer, Standing},
        pod::{PodAnswer, PodState},
    },
    settings::Settings,
};
use joist_messages::apis::NodeClaim;
use joist_provider::CloudProvider;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};

use super::{
    APART, GUARDED_PDB, NODE_CLASS, balanced_cluster, deployment, family, four_apart_scaled_to_two, pool,
    scenario_with,
};

/// The answer to the question `ask` makes of the world at the end of a run of `manifests` with
/// `steps` until `until` (under controller `settings`).
fn asked(
    settings: &str,
    run: (&str, &str, &str),
    ask: impl AsyncFnOnce(&kube::Client) -> Question,
) -> Result<Answer, AnswerError> {
    let mut answers = asked_each(settings, run, async move |client| vec![ask(client).await]);
    answers.pop().unwrap_or_else(|| panic!("no answer"))
}

/// The answers to the questions `ask` makes of the world at the end of a run (as [`asked`]),
/// in order.
fn asked_each(
    settings: &str,
    (manifests, steps, until): (&str, &str, &str),
    ask: impl AsyncFnOnce(&kube::Client) -> Vec<Question>,
) -> Vec<Result<Answer, AnswerError>> {
    let scenario = scenario_with(settings, manifests, steps, until);
    let (_, answered) = simulate::run_then(
        &scenario,
        scenario.seed,
        (NodeTracer::disabled(), None),
        async |live: Live| {
            let questions = ask(&live.client).await;
            let settings = Settings {
                capacity_buffer: settings.contains("capacityBuffer: true"),
                ..Settings::default()
            };
            let cloud: Arc<dyn CloudProvider> = Arc::new(live.cloud);
            let mut answers = Vec::new();
            for question in &questions {
                let answer = answer(
                    live.client.clone(),
                    cloud.clone(),
                    settings.clone(),
                    live.clock,
                    question,
                );
                answers.push(answer.await);
            }
            answers
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    answered
}

/// The name of a Node the pod `app` runs on.
async fn node_of(client: &kube::Client, app: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    pods.items
        .iter()
        .find_map(|p| p.spec.as_ref()?.node_name.clone())
        .unwrap_or_else(|| panic!("no {app} pod runs"))
}

/// The name of the first pod of `app`.
async fn pod_of(client: &kube::Client, app: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = pods.items.first().unwrap_or_else(|| panic!("no {app} pod"));
    format!("default/{}", pod.name_any())
}

fn node_answer(answered: Result<Answer, AnswerError>) -> NodeAnswer {
    match answered {
        Ok(Answer::Node(answer)) => *answer,
        other => panic!("not a node's answer: {other:?}"),
    }
}

fn pod_answer(answered: Result<Answer, AnswerError>) -> PodAnswer {
    match answered {
        Ok(Answer::Pod(answer)) => answer,
        other => panic!("not a pod's answer: {other:?}"),
    }
}

/// The NodePool `default` of `requirements`, consolidating what is empty or underused
/// after 30 s, and its node class.
fn consolidating_pool(requirements: &str) -> String {
    pool(
        "default",
        requirements,
        "  disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 30s}",
    ) + NODE_CLASS
}

/// Where a node of four (one `web` pod each, scaled down to two at 2 min) stands at 6 min under
/// the c5 NodePool's `disruption` fields.
fn standing_of_a_node_under(disruption: &str) -> Standing {
    let (manifests, steps) = four_apart_scaled_to_two(disruption);
    let answered = asked("{}", (&manifests, steps, "6m"), async |client| Question::Node {
        name: node_of(client, "web").await,
    });
    node_answer(answered).standing
}

/// The blocker of a standing.
fn blocker(standing: &Standing) -> Option<&str> {
    match standing {
        Standing::Stays { blocker, .. } | Standing::NotCandidate { blocker, .. } => blocker.as_deref(),
        Standing::Disrupted { .. } => None,
    }
}

#[test]
fn a_node_that_stays_is_explained_by_the_blocker_that_holds_it() {
    let budget = standing_of_a_node_under("    consolidateAfter: 30s\n    budgets: [{nodes: '0'}]");
    assert_eq!(blocker(&budget), Some("budget"), "{budget:?}");
    assert!(
        matches!(&budget, Standing::Stays { reason, .. } if reason.contains("budget")),
        "{budget:?}"
    );
    let never = standing_of_a_node_under("    consolidateAfter: Never");
    assert_eq!(blocker(&never), Some("consolidation_disabled"), "{never:?}");
    let waiting = standing_of_a_node_under("    consolidateAfter: 1h");
    assert_eq!(blocker(&waiting), Some("not_consolidatable"), "{waiting:?}");
}

#[test]
fn a_nodeclaim_still_launching_is_no_candidate_until_it_is_initialized() {
    let manifests = pool("default", &family(&["c5"]), "") + NODE_CLASS + &deployment("web", 1, "1", "");
    // Nodes boot in 40 s: at 20 s its NodeClaim is launched, and its Node not there yet.
    let answer = node_answer(asked("{}", (&manifests, "[]", "20s"), async |client| {
        let claims = Api::<NodeClaim>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let claim = claims.items.first().unwrap_or_else(|| panic!("no NodeClaim yet"));
        Question::Node {
            name: claim.name_any(),
        }
    }));
    assert_eq!(
        answer.standing,
        Standing::NotCandidate {
            reason: "its NodeClaim is not initialized yet".to_owned(),
            blocker: None
        }
    );
    assert_eq!(answer.node, "", "no Node yet");
}

#[test]
fn a_move_the_balanced_score_refuses_is_explained_by_the_score() {
    // The heavy node's one pod costs nine times a plain one to move: replacing the node by a
    // cheaper one disrupts far more than it saves.
    let manifests = balanced_cluster("Balanced", "1073741824");
    let steps = "[{at: 2m, scale: {kind: Deployment, namespace: default, name: heavy, replicas: 1}}]";
    let answer = node_answer(asked("{}", (&manifests, steps, "10m"), async |client| {
        Question::Node {
            name: node_of(client, "heavy").await,
        }
    }));
    assert_eq!(blocker(&answer.standing), Some("score"), "{answer:#?}");
    let removal = answer.removal.unwrap_or_else(|| panic!("no dry run"));
    assert_eq!(
        removal.outcome, "replace",
        "alone, the move is possible: {removal:?}"
    );
}

#[test]
fn a_node_no_cheaper_node_can_replace_stays_with_the_simulations_refusal() {
    // One 1-CPU pod on the smallest c5: its replacement would be the same type.
    let manifests = consolidating_pool(&family(&["c5"])) + &deployment("web", 1, "1", "");
    let answer = node_answer(asked("{}", (&manifests, "[]", "4m"), async |client| {
        Question::Node {
            name: node_of(client, "web").await,
        }
    }));
    assert_eq!(
        blocker(&answer.standing),
        Some("same_or_more_expensive_replacement"),
        "{answer:#?}"
    );
    let removal = answer.removal.unwrap_or_else(|| panic!("no dry run"));
    assert_eq!(removal.outcome, "stays");
    assert!(
        removal
            .refusal
            .as_deref()
            .is_some_and(|r| r.contains("is not cheaper")),
        "{removal:?}"
    );
    assert_eq!(answer.instance_type, "c5.large");
    assert_eq!(answer.nodepool.as_deref(), Some("default"));
    assert_eq!(answer.pods.len(), 1, "{:?}", answer.pods);
    assert_eq!(
        answer.launched_for.nominated, answer.pods,
        "its NodeClaim was launched for the web pod"
    );
    assert_eq!(answer.launched_for.older_pods_on_it, answer.pods);
}

#[test]
fn a_node_whose_cheaper_replacements_miss_min_values_stays_for_min_values() {
    // Three 1-CPU pods on one c5 node, scaled down to one: only c5.large is cheaper, and the
    // NodePool wants three instance types to choose from.
    let requirements = family(&["c5"])
        + "\n        - key: node.kubernetes.io/instance-type\n          operator: Exists\n          minValues: 3";
    let manifests = consolidating_pool(&requirements) + &deployment("web", 3, "1", "");
    let steps = "[{at: 2m, scale: {kind: Deployment, namespace: default, name: web, replicas: 1}}]";
    let answer = node_answer(asked("{}", (&manifests, steps, "5m"), async |client| {
        Question::Node {
            name: node_of(client, "web").await,
        }
    }));
    assert_eq!(blocker(&answer.standing), Some("min_values"), "{answer:#?}");
    let refusal = answer.removal.and_then(|r| r.refusal);
    assert_eq!(
        refusal.as_deref(),
        Some(
            "the cheaper instance types offer 1 of the 3 values of node.kubernetes.io/instance-type its minValues needs"
        )
    );
}

#[test]
fn a_node_whose_pod_is_pinned_to_it_stays_as_no_schedule_is_feasible() {
    let manifests = consolidating_pool(&family(&["c5"])) + &deployment("web", 1, "1", "");
    let answer = node_answer(asked("{}", (&manifests, "[]", "4m"), async |client| {
        // A pod then pinned to the web pod's node by its hostname can go nowhere else.
        let node = node_of(client, "web").await;
        let pinned = deployment(
            "pinned",
            1,
            "100m",
            &format!("      nodeSelector: {{kubernetes.io/hostname: {node}}}"),
        );
        let pinned: Deployment =
            serde_saphyr::from_str(pinned.trim_end_matches("---\n")).unwrap_or_else(|e| panic!("{e}"));
        Api::<Deployment>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &pinned)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_secs(120)).await;
        Question::Node { name: node }
    }));
    assert_eq!(answer.pods.len(), 2, "{answer:#?}");
    assert_eq!(
        blocker(&answer.standing),
        Some("no_feasible_schedule"),
        "{answer:#?}"
    );
    let removal = answer.removal.unwrap_or_else(|| panic!("no dry run"));
    assert_eq!(removal.outcome, "stays");
    assert!(
        removal
            .refusal
            .as_deref()
            .is_some_and(|r| r.starts_with("pod pinned-") && r.contains("would not fit")),
        "{removal:?}"
    );
}

#[test]
fn an_empty_node_a_pass_counts_on_for_a_leaving_pod_is_nominated() {
    // Four nodes, one `web` pod each, scaled down to two; a budget of no nodes keeps the two empty
    // ones, and a PodDisruptionBudget lets no web pod be evicted.
    let (manifests, steps) =
        four_apart_scaled_to_two("    consolidateAfter: 30s\n    budgets: [{nodes: '0'}]");
    let manifests = manifests + &GUARDED_PDB.replace("guarded", "web");
    let answers = asked_each("{}", (&manifests, steps, "6m"), async |client| {
        // A web pod's NodeClaim is deleted: its pod waits on the leaving node, and a provisioning
        // pass counts on one of the empty nodes for it.
        let web = node_of(client, "web").await;
        let claims = Api::<NodeClaim>::all(client.clone());
        let listed = claims
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let leaving = listed
            .items
            .iter()
            .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(web.as_str()))
            .unwrap_or_else(|| panic!("no claim of node {web}"));
        claims
            .delete(&leaving.name_any(), &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_secs(30)).await;
        let pods = Api::<Pod>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .items;
        // The controller's own pass told the leaving pod which node it counts on, as Karpenter
        // does: its NodeClaim and its Node.
        let waiting = pods
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(web.as_str()))
            .unwrap_or_else(|| panic!("the web pod left node {web}"));
        let told = Api::<Event>::namespaced(client.clone(), "default")
            .list(&ListParams::default().fields(&format!(
                "reason=Nominated,involvedObject.name={}",
                waiting.name_any()
            )))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            told.items.iter().filter_map(|e| e.message.as_deref()).any(|m| {
                m.starts_with("Pod should schedule on: nodeclaim/")
                    && m.contains(", node/")
                    && !m.contains(&web)
            }),
            "{:#?}",
            told.items
        );
        let busy: Vec<String> = pods.into_iter().filter_map(|p| p.spec?.node_name).collect();
        Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .items
            .iter()
            .filter(|n| !busy.contains(&n.name_any()))
            .map(|n| Question::Node { name: n.name_any() })
            .collect()
    });
    let mut blockers: Vec<Option<String>> = answers
        .into_iter()
        .map(|answered| blocker(&node_answer(answered).standing).map(str::to_owned))
        .collect();
    blockers.sort();
    assert_eq!(
        blockers,
        [Some("budget".to_owned()), Some("nominated".to_owned())],
        "one empty node holds the leaving pod's room; the other only the budget keeps"
    );
}

#[test]
fn a_node_holding_a_buffers_pods_is_no_candidate() {
    let manifests = consolidating_pool(&family(&["c5"]))
        + "apiVersion: v1
kind: PodTemplate
metadata: {name: spare, namespace: default}
template:
  metadata: {labels: {app: spare}}
  spec:
    containers: [{name: pause, image: pause, resources: {requests: {cpu: '1'}}}]
---
apiVersion: autoscaling.x-k8s.io/v1beta1
kind: CapacityBuffer
metadata: {name: spare, namespace: default}
spec:
  podTemplateRef: {name: spare}
  replicas: 1
---
";
    let answer = node_answer(asked(
        "{featureGates: {capacityBuffer: true}}",
        (&manifests, "[]", "4m"),
        async |client| {
            let nodes = Api::<Node>::all(client.clone())
                .list(&Default::default())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let node = nodes
                .items
                .first()
                .unwrap_or_else(|| panic!("no node for the buffer"));
            Question::Node {
                name: node.name_any(),
            }
        },
    ));
    assert_eq!(blocker(&answer.standing), Some("buffer_pods"), "{answer:#?}");
}

#[test]
fn a_dry_run_shows_where_the_pods_would_go_and_the_pdb_that_holds_them() {
    // Four guarded 1-CPU pods packed on one node, two of them deleted: a cheaper node would do,
    // but the PodDisruptionBudget lets none of them be evicted.
    let manifests = consolidating_pool(&family(&["c5"])) + GUARDED_PDB + &deployment("guarded", 4, "1", "");
    let steps = "[{at: 2m, scale: {kind: Deployment, namespace: default, name: guarded, replicas: 1}}]";
    let answer = node_answer(asked("{}", (&manifests, steps, "5m"), async |client| {
        Question::Node {
            name: node_of(client, "guarded").await,
        }
    }));
    assert!(
        matches!(&answer.standing, Standing::NotCandidate { reason, .. } if reason.contains("pdb default/guarded")),
        "{answer:#?}"
    );
    let removal = answer.removal.clone().unwrap_or_else(|| panic!("no dry run"));
    assert_eq!(removal.outcome, "replace", "{answer:#?}");
    assert_eq!(removal.moves.len(), 1);
    assert_eq!(removal.moves[0].to, "the replacement");
    let replacement = removal.replacement.unwrap_or_else(|| panic!("no replacement"));
    assert_eq!(
        replacement.instance_types.first().map(String::as_str),
        Some("c5.large")
    );
    let price = answer.price_per_hour.unwrap_or_else(|| panic!("no price"));
    let saving = removal.saving_per_hour.unwrap_or_else(|| panic!("no saving"));
    assert!(
        (price - replacement.price_per_hour - saving).abs() < 1e-9 && saving > 0.0,
        "{answer:#?}"
    );
    assert!(
        answer
            .holds
            .iter()
            .any(|h| h.starts_with("pdb default/guarded allows no eviction")),
        "{:?}",
        answer.holds
    );
    let text = Answer::Node(Box::new(answer)).to_string();
    assert!(text.contains("-> the replacement"), "{text}");
}

#[test]
fn a_nodepool_answer_gives_its_limits_nodes_and_the_next_days_budget_windows() {
    // Nothing consolidates at night from 09:00 for 8 hours; the run starts at midnight.
    let manifests = pool(
        "default",
        &family(&["c5"]),
        "  limits: {cpu: 100}
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 30s
    budgets:
      - nodes: '50%'
      - {nodes: '0', reasons: [Underutilized], schedule: '0 9 * * *', duration: 8h}",
    ) + NODE_CLASS
        + &deployment("web", 4, "1", APART);
    let answered = asked("{}", (&manifests, "[]", "3m"), async |_| Question::Nodepool {
        name: "default".to_owned(),
    });
    let Ok(Answer::Nodepool(answer)) = answered else {
        panic!("not a nodepool's answer: {answered:?}");
    };
    assert_eq!(answer.nodes.initialized, 4, "{answer:#?}");
    assert_eq!(answer.limits.len(), 1);
    assert_eq!(
        (answer.limits[0].used.as_str(), answer.limits[0].limit.as_str()),
        ("8", "100"),
        "four c5.large"
    );
    let windows: Vec<(&str, u32, u32)> = answer
        .allowed
        .iter()
        .map(|a| (&a.from[11..16], a.empty, a.underutilized))
        .collect();
    assert_eq!(
        windows,
        [("00:03", 2, 2), ("09:00", 2, 0), ("17:00", 2, 2)],
        "{answer:#?}"
    );
    assert!(
        answer
            .budgets
            .iter()
            .all(|b| b.active != b.budget.schedule.is_some())
    );
}

#[test]
fn a_pending_pod_is_told_the_nearest_type_and_what_it_lacks_and_a_running_one_its_node() {
    let manifests = pool("default", &family(&["c5"]), "")
        + NODE_CLASS
        + &deployment("huge", 1, "500", "")
        + &deployment("web", 1, "1", "");
    let pending = pod_answer(asked("{}", (&manifests, "[]", "2m"), async |client| {
        Question::Pod {
            name: pod_of(client, "huge").await,
        }
    }));
    let PodState::Pending {
        placement: None,
        nodepools,
        ..
    } = &pending.state
    else {
        panic!("not pending without a place: {pending:#?}");
    };
    let nearest = nodepools[0]
        .nearest
        .as_ref()
        .unwrap_or_else(|| panic!("{pending:#?}"));
    assert!(nearest.instance_type.starts_with("c5."), "{nearest:?}");
    assert!(
        nearest.lacks.iter().any(|l| l.starts_with("cpu: needs 500")),
        "{nearest:?}"
    );
    let running = pod_answer(asked("{}", (&manifests, "[]", "2m"), async |client| {
        Question::Pod {
            name: pod_of(client, "web").await,
        }
    }));
    let PodState::Running {
        nodepool,
        node_created_after_pod_seconds,
        ..
    } = &running.state
    else {
        panic!("not running: {running:#?}");
    };
    assert_eq!(nodepool.as_deref(), Some("default"));
    assert!(
        node_created_after_pod_seconds.is_some_and(|s| s > 0),
        "the node was launched for it: {running:#?}"
    );
}

#[test]
fn a_pod_that_does_not_tolerate_a_nodepools_taint_is_told_so_and_an_unknown_one_is_not_found() {
    let manifests = pool("default", &family(&["c5"]), "").replace(
        "      nodeClassRef:",
        "      taints: [{key: dedicated, value: batch, effect: NoSchedule}]\n      nodeClassRef:",
    ) + NODE_CLASS
        + &pool("orphan", "", "").replace("name: default}", "name: missing}")
        + &deployment("web", 1, "1", "");
    let answer = pod_answer(asked("{}", (&manifests, "[]", "1m"), async |client| {
        Question::Pod {
            name: pod_of(client, "web").await,
        }
    }));
    let PodState::Pending {
        nodepools, left_out, ..
    } = &answer.state
    else {
        panic!("not pending: {answer:#?}");
    };
    assert_eq!(
        nodepools[0].reason, "did not tolerate taint dedicated=batch:NoSchedule",
        "{answer:#?}"
    );
    assert_eq!(
        left_out,
        &["nodepool \"orphan\": not Ready"],
        "a NodePool whose node class is missing is not Ready"
    );
    let missing = asked("{}", (&manifests, "[]", "10s"), async |_| Question::Pod {
        name: "default/nope".to_owned(),
    });
    assert_eq!(
        missing.err().map(|e| e.to_string()).as_deref(),
        Some("pod \"default/nope\" not found")
    );
}

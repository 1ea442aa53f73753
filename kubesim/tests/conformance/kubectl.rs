//! The commands a user types at a cluster, with the real kubectl against kubesim: every `kubectl
//! create` generator (they send protobuf), `run` and `expose`, `rollout status`, `label`,
//! `annotate`, `taint`, `cordon`, `drain` (evictions, held by a PodDisruptionBudget) and `uncordon`, `get -w`, and `top`, which fails as on a
//! cluster without metrics-server.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::{
    clients::{WORKER, binaries, command, output, run, scratch},
    cluster,
};

/// Each generator, what kubectl prints, and a field of the stored object read back through
/// `kubectl get -o jsonpath`: the object's own fields survive the protobuf round trip.
const GENERATORS: &[(&[&str], &str, &[&str], &str)] = &[
    (
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
            "--port=80",
        ],
        "deployment.apps/web created",
        &[
            "deployment",
            "web",
            "{.spec.replicas} {.spec.template.spec.containers[0].ports[0].containerPort}",
        ],
        "2 80",
    ),
    (
        &["create", "job", "hello", "--image=busybox", "--", "echo", "hi"],
        "job.batch/hello created",
        &["job", "hello", "{.spec.template.spec.containers[0].command}"],
        r#"["echo","hi"]"#,
    ),
    (
        &[
            "create",
            "cronjob",
            "tick",
            "--image=busybox",
            "--schedule=*/5 * * * *",
        ],
        "cronjob.batch/tick created",
        &["cronjob", "tick", "{.spec.schedule}"],
        "*/5 * * * *",
    ),
    (
        &["create", "namespace", "team-a"],
        "namespace/team-a created",
        &["namespace", "team-a", "{.metadata.name}"],
        "team-a",
    ),
    (
        &["create", "serviceaccount", "bot"],
        "serviceaccount/bot created",
        &["serviceaccount", "bot", "{.metadata.name}"],
        "bot",
    ),
    (
        &[
            "create",
            "poddisruptionbudget",
            "db",
            "--selector=app=db",
            "--min-available=50%",
        ],
        "poddisruptionbudget.policy/db created",
        &[
            "pdb",
            "db",
            "{.spec.minAvailable} {.spec.selector.matchLabels.app}",
        ],
        "50% db",
    ),
    (
        &[
            "create",
            "priorityclass",
            "high",
            "--value=1000",
            "--description=urgent",
        ],
        "priorityclass.scheduling.k8s.io/high created",
        &["priorityclass", "high", "{.value} {.description}"],
        "1000 urgent",
    ),
    (
        &["create", "role", "reader", "--verb=get,list", "--resource=pods"],
        "role.rbac.authorization.k8s.io/reader created",
        &["role", "reader", "{.rules[0].verbs}"],
        r#"["get","list"]"#,
    ),
    (
        &[
            "create",
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=default:bot",
        ],
        "rolebinding.rbac.authorization.k8s.io/reader created",
        &["rolebinding", "reader", "{.roleRef.name} {.subjects[0].name}"],
        "reader bot",
    ),
    (
        &[
            "create",
            "clusterrole",
            "node-reader",
            "--verb=get",
            "--resource=nodes",
        ],
        "clusterrole.rbac.authorization.k8s.io/node-reader created",
        &["clusterrole", "node-reader", "{.rules[0].resources}"],
        r#"["nodes"]"#,
    ),
    (
        &[
            "create",
            "clusterrolebinding",
            "node-reader",
            "--clusterrole=node-reader",
            "--user=alice",
        ],
        "clusterrolebinding.rbac.authorization.k8s.io/node-reader created",
        &[
            "clusterrolebinding",
            "node-reader",
            "{.subjects[0].kind} {.subjects[0].name}",
        ],
        "User alice",
    ),
    (
        &["create", "quota", "small", "--hard=cpu=10,pods=20"],
        "resourcequota/small created",
        &["quota", "small", "{.spec.hard.cpu} {.spec.hard.pods}"],
        "10 20",
    ),
    (
        &["create", "service", "nodeport", "np", "--tcp=80:8080"],
        "service/np created",
        &[
            "service",
            "np",
            "{.spec.type} {.spec.ports[0].port} {.spec.ports[0].targetPort}",
        ],
        "NodePort 80 8080",
    ),
    (
        &[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=example.com",
        ],
        "service/ext created",
        &["service", "ext", "{.spec.externalName}"],
        "example.com",
    ),
    (
        &["create", "ingress", "web", "--rule=foo.com/bar=web:80"],
        "ingress.networking.k8s.io/web created",
        &[
            "ingress",
            "web",
            "{.spec.rules[0].host} {.spec.rules[0].http.paths[0].backend.service.port.number}",
        ],
        "foo.com 80",
    ),
    (
        &["create", "configmap", "settings", "--from-literal=greeting=hello"],
        "configmap/settings created",
        &["configmap", "settings", "{.data.greeting}"],
        "hello",
    ),
    (
        &["create", "secret", "generic", "password", "--from-literal=p=x"],
        "secret/password created",
        &["secret", "password", "{.data.p}"],
        "eA==",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectls_imperative_commands_work_as_on_a_cluster() {
    let (binary, _) = binaries();
    let cluster = cluster();
    let server = cluster.serve_http(0).await.expect("serve");
    let dir = scratch("kubectl-imperative");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let kubectl = |args: &'static [&'static str]| run(binary, &kubeconfig, args);

    for (create, printed, get, expected) in GENERATORS {
        let created = kubectl(create).await;
        assert_eq!(created.trim(), *printed, "kubectl {}", create.join(" "));
        let jsonpath = format!("jsonpath={}", get[2]);
        let read = run(binary, &kubeconfig, &["get", get[0], get[1], "-o", &jsonpath]).await;
        assert_eq!(read, *expected, "kubectl {}", create.join(" "));
    }

    // A token for the service account: a JWT whose claims name it.
    let token = kubectl(&["create", "token", "bot", "--duration=20m"]).await;
    assert_eq!(token.trim().split('.').count(), 3, "{token}");
    let refused = output(binary, &kubeconfig, &["create", "token", "bot", "--duration=1m"]).await;
    assert!(
        !refused.success && refused.stderr.contains("less than 10 minutes"),
        "{}",
        refused.stderr
    );

    // `get -w` prints the pods as they come.
    let (lines, mut watcher) = watch(binary, &kubeconfig);
    let ran = kubectl(&["run", "one", "--image=busybox", "--restart=Never"]).await;
    assert_eq!(ran.trim(), "pod/one created");
    let seen = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        while let Ok(line) = lines.recv_timeout(Duration::from_secs(20)) {
            let mut columns = line.split_whitespace();
            let added = columns.next() == Some("ADDED") && columns.next() == Some("one");
            seen.push(line);
            if added {
                return Ok(seen);
            }
        }
        Err(seen)
    })
    .await
    .expect("join");
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        seen.is_ok(),
        "kubectl get -w printed {seen:?}, not pod one being added"
    );

    let exposed = kubectl(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
        "--name=web-svc",
    ])
    .await;
    assert_eq!(exposed.trim(), "service/web-svc exposed");
    let selector = kubectl(&[
        "get",
        "service",
        "web-svc",
        "-o",
        "jsonpath={.spec.selector.app} {.spec.ports[0].targetPort}",
    ])
    .await;
    assert_eq!(selector, "web 8080");

    // The node arrives; the Deployment rolls out on it.
    std::fs::write(dir.join("node.yaml"), WORKER).expect("node manifest");
    let node = dir.join("node.yaml");
    run(
        binary,
        &kubeconfig,
        &["create", "-f", node.to_str().expect("utf-8 path")],
    )
    .await;
    let rolled = kubectl(&["rollout", "status", "deployment/web", "--timeout=30s"]).await;
    assert!(rolled.contains("successfully rolled out"), "{rolled}");

    kubectl(&["label", "node", "worker", "tier=batch"]).await;
    kubectl(&["annotate", "node", "worker", "owner=platform"]).await;
    kubectl(&["taint", "node", "worker", "dedicated=batch:NoSchedule"]).await;
    let marks = kubectl(&["get", "node", "worker", "-o", "jsonpath={.metadata.labels.tier} {.metadata.annotations.owner} {.spec.taints[0].key}={.spec.taints[0].value}:{.spec.taints[0].effect}"]).await;
    assert_eq!(marks, "batch platform dedicated=batch:NoSchedule");
    kubectl(&["taint", "node", "worker", "dedicated-"]).await;
    let taints = kubectl(&["get", "node", "worker", "-o", "jsonpath={.spec.taints}"]).await;
    assert!(!taints.contains("dedicated"), "{taints}");

    let cordoned = kubectl(&["cordon", "worker"]).await;
    assert_eq!(cordoned.trim(), "node/worker cordoned");
    // A budget that allows no disruption holds the drain until kubectl gives up.
    kubectl(&[
        "create",
        "pdb",
        "web-guard",
        "--selector=app=web",
        "--max-unavailable=0",
    ])
    .await;
    let held = output(
        binary,
        &kubeconfig,
        &["drain", "worker", "--force", "--timeout=3s"],
    )
    .await;
    assert!(
        !held.success
            && held
                .stderr
                .contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{}",
        held.stderr
    );
    kubectl(&["delete", "pdb", "web-guard"]).await;
    let drained = kubectl(&[
        "drain",
        "worker",
        "--force",
        "--ignore-daemonsets",
        "--timeout=30s",
    ])
    .await;
    assert!(
        drained.contains("evicting pod default/web-") && drained.contains("node/worker drained"),
        "{drained}"
    );
    let web = kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].status.phase}",
    ])
    .await;
    assert_eq!(
        web, "Pending Pending",
        "the replacements wait for an uncordoned node"
    );
    let uncordoned = kubectl(&["uncordon", "worker"]).await;
    assert_eq!(uncordoned.trim(), "node/worker uncordoned");
    let rolled = kubectl(&["rollout", "status", "deployment/web", "--timeout=30s"]).await;
    assert!(rolled.contains("successfully rolled out"), "{rolled}");

    // No metrics-server: kubectl says so, as it does on a cluster without one.
    let top = output(binary, &kubeconfig, &["top", "node"]).await;
    assert!(
        !top.success && top.stderr.contains("Metrics API not available"),
        "{}",
        top.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `kubectl get pods -w --output-watch-events`; returns the lines it prints, as
/// they come, and the process, to be killed.
fn watch(kubectl: &std::path::Path, kubeconfig: &std::path::Path) -> (mpsc::Receiver<String>, Child) {
    let mut child = command(
        kubectl,
        kubeconfig,
        &["get", "pods", "-w", "--output-watch-events"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("spawn kubectl get -w");
    let stdout = child.stdout.take().expect("piped stdout");
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    (receive, child)
}

//! The Helm charts (`deploy/charts`): they lint, render with the defaults and with a values file
//! written for Karpenter's chart, render only valid Kubernetes 1.35 objects, map Karpenter's
//! settings to the environment `joist run` reads, refuse what Joist cannot honour by name, and grant
//! least privilege. (Whether the grants cover what the code does is checked against kubesim's audit
//! in the `joist run` end-to-end tests.)

use joist_messages::scheduler_config::SchedulerConfig;
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{Service, ServiceAccount},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use serde_json::Value;

use super::{
    assert_kept,
    chart::{REQUIRED, defaults, grants, object, render, render_release, run_helm},
};

const KARPENTER_VALUES: &str = "tests/fixtures/helm/karpenter-values.yaml";

/// The Deployment's environment, by name (fieldRef values as `fieldRef:<path>`).
fn environment(objects: &[Value]) -> Vec<(String, String)> {
    environment_of(objects, "joist")
}

/// [`environment`] of the Deployment named `name`.
fn environment_of(objects: &[Value], name: &str) -> Vec<(String, String)> {
    let deployment = object(objects, "Deployment", name);
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap_or_else(|| panic!("no env: {deployment}"))
        .iter()
        .map(|e| {
            let value = e["value"].as_str().map(str::to_owned).unwrap_or_else(|| {
                format!(
                    "fieldRef:{}",
                    e["valueFrom"]["fieldRef"]["fieldPath"]
                        .as_str()
                        .unwrap_or_default()
                )
            });
            (e["name"].as_str().unwrap_or_default().to_owned(), value)
        })
        .collect()
}

fn env<'a>(environment: &'a [(String, String)], name: &str) -> Option<&'a str> {
    environment
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn both_charts_lint() {
    let mut args = vec!["lint", "deploy/charts/joist"];
    args.extend_from_slice(&REQUIRED);
    let (ok, out, err) = run_helm(&args);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run_helm(&["lint", "deploy/charts/joist-crd"]);
    assert!(ok, "{out}{err}");
}

#[test]
fn a_karpenter_values_file_installs_unchanged_and_becomes_joists_settings() {
    let objects = render(&["-f", KARPENTER_VALUES]).unwrap_or_else(|e| panic!("{e}"));
    let environment = environment(&objects);
    for (name, value) in [
        ("CLUSTER_NAME", "demo"),
        (
            "CLUSTER_ENDPOINT",
            "https://ABCDEF0123456789.gr7.us-west-2.eks.amazonaws.com",
        ),
        ("INTERRUPTION_QUEUE", "demo"),
        (
            "FEATURE_GATES",
            "NodeRepair=true,ReservedCapacity=true,SpotToSpotConsolidation=true,StaticCapacity=false,NodeOverlay=false,CapacityBuffer=false",
        ),
        ("LOG_LEVEL", "debug"),
        ("BATCH_IDLE_DURATION", "1s"),
        ("BATCH_MAX_DURATION", "10s"),
        ("VM_MEMORY_OVERHEAD_PERCENT", "0.075"),
        ("RESERVED_ENIS", "0"),
        ("METRICS_PORT", "8080"),
        ("HEALTH_PROBE_PORT", "8081"),
        ("SYSTEM_NAMESPACE", "fieldRef:metadata.namespace"),
        ("AWS_REGION", "us-west-2"),
    ] {
        assert_eq!(env(&environment, name), Some(value), "{name} in {environment:?}");
    }
    let account = object(&objects, "ServiceAccount", "joist");
    assert_eq!(
        account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::111122223333:role/KarpenterControllerRole-demo",
        "IRSA"
    );
    let pod = &object(&objects, "Deployment", "joist")["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(pod["volumes"][0]["name"], "aws-iam-token");
    assert_eq!(pod["tolerations"].as_array().map(Vec::len), Some(2));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    // The controller stays off the nodes it manages, and its replicas apart.
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0];
    assert_eq!(term["matchExpressions"][0]["key"], "karpenter.sh/nodepool");
    assert_eq!(term["matchExpressions"][0]["operator"], "DoesNotExist");
    let apart = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        apart["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "joist"
    );
    let container = &pod["containers"][0]["securityContext"];
    assert_eq!(container["runAsUser"], 65532);
    assert_eq!(container["readOnlyRootFilesystem"], true);
    assert_eq!(container["allowPrivilegeEscalation"], false);
    assert_eq!(container["capabilities"]["drop"][0], "ALL");
    assert_eq!(object(&objects, "Deployment", "joist")["spec"]["replicas"], 2);
    assert_eq!(
        object(&objects, "PodDisruptionBudget", "joist")["spec"]["maxUnavailable"],
        1
    );
}

#[test]
fn the_scheduler_config_reaches_the_controller_as_a_document_given_as_a_map_or_a_string() {
    let as_map = render(&[
        "-f",
        KARPENTER_VALUES,
        "-f",
        "tests/fixtures/helm/scheduler-config-values.yaml",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let document = env(&environment(&as_map), "SCHEDULER_CONFIG").map(str::to_owned);
    let document = document.unwrap_or_else(|| panic!("no SCHEDULER_CONFIG"));
    let read = SchedulerConfig::parse(&document).unwrap_or_else(|e| panic!("{e}: {document}"));
    let topology_keys: Vec<&str> = (read.default_constraints().iter())
        .map(|c| c.topology_key.as_str())
        .collect();
    assert_eq!(topology_keys, ["topology.kubernetes.io/zone"]);
    let as_string = render(&[
        "-f",
        KARPENTER_VALUES,
        "--set-string",
        "settings.schedulerConfig=podTopologySpread: {}",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        env(&environment(&as_string), "SCHEDULER_CONFIG"),
        Some("podTopologySpread: {}")
    );
    let unset = render(&["-f", KARPENTER_VALUES]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(env(&environment(&unset), "SCHEDULER_CONFIG"), None);
}

#[test]
fn karpenters_install_command_installs_joist_under_the_names_karpenters_role_trusts() {
    // Karpenter's getting-started install: the release `karpenter`, the cluster's name and its
    // interruption queue, nothing else.
    let objects = render_release(
        "karpenter",
        &[
            "--set",
            "settings.clusterName=demo",
            "--set",
            "settings.interruptionQueue=demo",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let environment = environment_of(&objects, "karpenter");
    assert_eq!(env(&environment, "CLUSTER_NAME"), Some("demo"));
    assert_eq!(env(&environment, "INTERRUPTION_QUEUE"), Some("demo"));
    assert_eq!(
        env(&environment, "CLUSTER_ENDPOINT"),
        None,
        "looked up with eks:DescribeCluster"
    );
    // The IAM role of Karpenter's install trusts system:serviceaccount:kube-system:karpenter.
    let account = object(&objects, "ServiceAccount", "karpenter");
    assert_eq!(account["metadata"]["namespace"], "kube-system");
    let pod = &object(&objects, "Deployment", "karpenter")["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "karpenter");
    // Under its own name the chart keeps its own.
    let joist = render_release("platform", &REQUIRED).unwrap_or_else(|e| panic!("{e}"));
    object(&joist, "ServiceAccount", "platform-joist");
}

/// Decodes `object` as `K` and checks that nothing it says was lost: an unknown field or a value of
/// the wrong type fails, naming its path.
fn check<K: serde::de::DeserializeOwned + serde::Serialize>(object: &Value, path: &str) {
    let typed: K = serde_path_to_error::deserialize(object.clone())
        .unwrap_or_else(|e| panic!("{path}: {e} at {}", e.path()));
    let round_trip = serde_json::to_value(&typed).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_kept(object, &round_trip, path);
}

#[test]
fn every_rendered_object_is_a_valid_kubernetes_1_35_object() {
    let defaults = defaults();
    let karpenter = render(&["-f", KARPENTER_VALUES]).unwrap_or_else(|e| panic!("{e}"));
    let (ok, crds, err) = run_helm(&[
        "template",
        "crds",
        "deploy/charts/joist-crd",
        "--set",
        "additionalAnnotations.owner=platform",
    ]);
    assert!(ok, "{err}");
    let crds: Vec<Value> = crds
        .split("\n---")
        .filter(|doc| doc.contains("kind:"))
        .map(|doc| serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert_eq!(
        crds.len(),
        5,
        "NodePool, NodeClaim, EC2NodeClass, NodeOverlay, CapacityBuffer"
    );
    for crd in &crds {
        assert_eq!(crd["metadata"]["annotations"]["owner"], "platform");
    }
    let mut kinds = std::collections::BTreeSet::new();
    for (source, object) in defaults
        .iter()
        .map(|o| ("defaults", o))
        .chain(karpenter.iter().map(|o| ("karpenter values", o)))
        .chain(crds.iter().map(|o| ("joist-crd", o)))
    {
        let kind = object["kind"].as_str().unwrap_or_default();
        let path = format!("{source}: {kind} {}", object["metadata"]["name"]);
        match kind {
            "Deployment" => check::<Deployment>(object, &path),
            "Service" => check::<Service>(object, &path),
            "ServiceAccount" => check::<ServiceAccount>(object, &path),
            "PodDisruptionBudget" => check::<PodDisruptionBudget>(object, &path),
            "ClusterRole" => check::<ClusterRole>(object, &path),
            "ClusterRoleBinding" => check::<ClusterRoleBinding>(object, &path),
            "Role" => check::<Role>(object, &path),
            "RoleBinding" => check::<RoleBinding>(object, &path),
            "CustomResourceDefinition" => check::<CustomResourceDefinition>(object, &path),
            other => panic!("{path}: no schema to check a {other} against"),
        }
        kinds.insert(kind.to_owned());
    }
    assert_eq!(kinds.len(), 9, "{kinds:?}");
}

#[test]
fn values_joist_cannot_honour_fail_the_install_naming_them() {
    let refused = [
        ("settings.clusterName=", "settings.clusterName"),
        ("settings.preferencePolicy=Ignore", "settings.preferencePolicy"),
        ("settings.minValuesPolicy=BestEffort", "settings.minValuesPolicy"),
        ("settings.enableZonalShift=true", "settings.enableZonalShift"),
        ("settings.eksControlPlane=true", "settings.eksControlPlane"),
        ("settings.ignoreDRARequests=false", "settings.ignoreDRARequests"),
        ("settings.amiRefreshInterval=5m", "settings.amiRefreshInterval"),
        (
            "settings.awsFeatureGates.nodeClassCEL=true",
            "settings.awsFeatureGates.nodeClassCEL",
        ),
        ("logOutputPaths={/var/log/joist.log}", "logOutputPaths"),
        ("logLevel=warn", "logLevel"),
    ];
    for (value, named) in refused {
        let mut args = REQUIRED.to_vec();
        args.extend(["--set", value]);
        match render(&args) {
            Ok(_) => panic!("{value} was accepted"),
            Err(message) => assert!(message.contains(named), "{value}: {message}"),
        }
    }
}

#[test]
fn the_chart_grants_least_privilege() {
    let objects = defaults();
    let controller: Vec<Value> = objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")))
        .filter(|o| o["metadata"]["name"] == "joist")
        .cloned()
        .collect();
    assert_eq!(controller.len(), 2, "the ClusterRole and the Role");
    for rule in controller
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
    {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(
                !rule[field].as_array().into_iter().flatten().any(|v| v == "*"),
                "a wildcard in {rule}"
            );
        }
    }
    let can = |verb: &str, group: &str, resource: &str, namespace: Option<&str>, name: Option<&str>| {
        grants(objects, verb, group, resource, namespace, name)
    };
    assert!(can("create", "karpenter.sh", "nodeclaims", None, None));
    assert!(can("create", "", "pods/eviction", Some("default"), Some("web")));
    assert!(
        can("delete", "", "pods", Some("default"), Some("web")),
        "a pod whose eviction would overrun terminationGracePeriod is deleted, as Karpenter does"
    );
    assert!(!can("create", "", "pods", Some("default"), None));
    assert!(can("list", "storage.k8s.io", "volumeattachments", None, None));
    assert!(
        !can("create", "", "nodes", None, None),
        "nodes register themselves"
    );
    assert!(!can("get", "", "secrets", Some("kube-system"), Some("x")));
    assert!(!can("create", "karpenter.k8s.aws", "ec2nodeclasses", None, None));
    assert!(
        can(
            "patch",
            "autoscaling.x-k8s.io",
            "capacitybuffers/status",
            Some("default"),
            Some("b")
        ) && !can(
            "patch",
            "autoscaling.x-k8s.io",
            "capacitybuffers",
            Some("default"),
            Some("b")
        ),
        "a CapacityBuffer's status is Joist's to write, its spec the user's"
    );
    // The Lease: created anywhere in the release's namespace, updated only by its name.
    let lease = "joist-leader-election";
    assert!(can(
        "create",
        "coordination.k8s.io",
        "leases",
        Some("kube-system"),
        None
    ));
    assert!(can(
        "update",
        "coordination.k8s.io",
        "leases",
        Some("kube-system"),
        Some(lease)
    ));
    assert!(!can(
        "update",
        "coordination.k8s.io",
        "leases",
        Some("kube-system"),
        Some("other")
    ));
    assert!(!can(
        "update",
        "coordination.k8s.io",
        "leases",
        Some("default"),
        Some(lease)
    ));
    // Bound to the chart's service account.
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let subject = &object(objects, binding, "joist")["subjects"][0];
        assert_eq!(
            (subject["name"].as_str(), subject["namespace"].as_str()),
            (Some("joist"), Some("kube-system"))
        );
    }
}

//! Every NodePool and EC2NodeClass field fuzzed through the controllers, on kubesim: objects the
//! CRD's schema accepts (kubesim stores them as an API server would, with no CEL rules) are read,
//! and one Joist cannot use gets `ValidationSucceeded=False` and a `ValidationFailed` warning event;
//! nothing panics, and the controllers go on provisioning for a valid NodePool beside them.

use std::{cell::Cell, collections::HashMap, sync::LazyLock, time::Duration};

use joist_actors::settings::Settings;
use joist_kubesim::{Store, resources::GroupResource, store::ObjectKey};
use joist_messages::apis::{
    EC2NodeClass, NodePool,
    schema_check::SchemaChecker,
    validation::{Validate, Violations},
};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{controllers_on_kubesim, paused_system};
use crate::mutants::{Field, Mutant, fields, mutant, schemas};

static FIELDS: LazyLock<Vec<Field>> = LazyLock::new(fields);

/// Every CRD's schema, by kind.
static SCHEMAS: LazyLock<HashMap<String, Value>> = LazyLock::new(schemas);

/// The annotation naming the field an object's fuzz changed.
const FUZZED: &str = "fuzz.joist.dev/field";

const NODE_POOL: &str = r#"{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "control"},
  "spec": {"template": {"metadata": {"labels": {"team": "a"}}, "spec": {
    "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
    "taints": [{"key": "fuzz", "effect": "NoSchedule"}], "startupTaints": [{"key": "boot", "effect": "NoSchedule"}],
    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
    "expireAfter": "720h", "terminationGracePeriod": "1h"}},
  "limits": {"cpu": 100}, "weight": 10,
  "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1m",
                 "budgets": [{"nodes": "10%", "reasons": ["Empty"], "schedule": "0 9 * * *", "duration": "8h"}]}}}"#;

const NODE_CLASS: &str = r#"{"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
  "spec": {"role": "KarpenterNodeRole-fuzz", "amiSelectorTerms": [{"alias": "al2023@latest"}],
    "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "fuzz"}}],
    "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "fuzz"}}],
    "kubelet": {"maxPods": 110, "evictionHard": {"memory.available": "5%"}},
    "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3"}}],
    "metadataOptions": {"httpTokens": "required"}, "tags": {"team": "a"}}}"#;

/// `base` with each mutant applied in turn to a copy named `{prefix}-{i}`, annotated with the
/// field it fuzzed; only those the CRD's schema accepts (a value of the wrong type never is).
fn fuzzed(base: &str, prefix: &str, mutants: &[Mutant]) -> Vec<Value> {
    let base: Value = serde_json::from_str(base).unwrap_or_else(|e| panic!("{e}"));
    let kind = base["kind"].as_str().unwrap_or_default().to_owned();
    let schema = SCHEMAS.get(&kind).unwrap_or_else(|| panic!("no CRD for {kind}"));
    let mut checker = SchemaChecker::new(schema.clone());
    mutants
        .iter()
        .enumerate()
        .filter(|(_, mutant)| !mutant.wrong)
        .filter_map(|(i, mutant)| {
            let mut object = base.clone();
            mutant.field.set(&mut object, mutant.value.clone());
            object["metadata"]["name"] = json!(format!("{prefix}-{i}"));
            object["metadata"]["annotations"] = json!({FUZZED: mutant.field.path()});
            let mut problems = Violations::default();
            checker.check(&object, &mut problems);
            problems.into_vec().is_empty().then_some(object)
        })
        .collect()
}

thread_local! {
    /// Panics on this thread (the simulated world's).
    static PANICS: Cell<usize> = const { Cell::new(0) };
}

/// Counts every panic on the thread it happens on, then reports it as usual.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            report(info);
        }));
    });
}

/// What became of one fuzzed object: its problems by Joist's rules, its `ValidationSucceeded`
/// status, and whether a `ValidationFailed` warning names it.
#[derive(Debug)]
struct Verdict {
    name: String,
    field: String,
    problems: usize,
    validation: Option<String>,
    warned: bool,
}

/// The verdict on `object`, a `resource` stored in `store`, given the cluster's `events`.
fn verdict<K: Validate + serde::de::DeserializeOwned>(
    store: &Store,
    resource: &GroupResource,
    object: &Value,
    events: &[Event],
) -> Verdict {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let problems = serde_json::from_value::<K>(object.clone())
        .map(|typed| typed.validate().len())
        .unwrap_or_else(|e| panic!("{name} does not decode: {e}"));
    let stored = store.get(resource, &ObjectKey::new("", &name)).ok();
    let validation = stored.as_ref().and_then(|stored| {
        let conditions = stored["status"]["conditions"].as_array()?;
        let condition = conditions.iter().find(|c| c["type"] == "ValidationSucceeded")?;
        condition["status"].as_str().map(str::to_owned)
    });
    let warned = events.iter().any(|e| {
        e.reason.as_deref() == Some("ValidationFailed") && e.involved_object.name.as_deref() == Some(&name)
    });
    Verdict {
        field: object["metadata"]["annotations"][FUZZED]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        name,
        problems,
        validation,
        warned,
    }
}

/// Runs the controllers over the fuzzed objects for three virtual minutes; each object's verdict,
/// whether the control NodePool got a NodeClaim, and how many panics there were.
fn run(pools: Vec<Value>, classes: Vec<Value>) -> (Vec<Verdict>, bool, usize) {
    count_panics();
    PANICS.with(|p| p.set(0));
    let system = paused_system();
    let (verdicts, provisioned) = system.block_on(async move {
        let (cluster, _controllers) = controllers_on_kubesim("fuzz", Settings::default());
        let store = cluster.store();
        let create = |resource: &GroupResource, object: &Value| {
            store
                .create(resource, "", object.clone(), false)
                .unwrap_or_else(|e| panic!("kubesim refused {object}: {e}"));
        };
        let pool_resource = GroupResource::new("karpenter.sh", "nodepools");
        let class_resource = GroupResource::new("karpenter.k8s.aws", "ec2nodeclasses");
        create(&class_resource, &serde_json::from_str(NODE_CLASS).unwrap_or_default());
        create(&pool_resource, &serde_json::from_str(NODE_POOL).unwrap_or_default());
        for pool in &pools {
            create(&pool_resource, pool);
        }
        for class in &classes {
            create(&class_resource, class);
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeSelector": {"karpenter.sh/nodepool": "control"},
                     "tolerations": [{"key": "fuzz", "operator": "Exists"}],
                     "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "1"}}}]}});
        store
            .create(&GroupResource::new("", "pods"), "default", pod, false)
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_secs(180)).await;
        let events = Api::<Event>::all(cluster.client())
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .items;
        let pool_verdicts = pools
            .iter()
            .map(|pool| verdict::<NodePool>(store, &pool_resource, pool, &events));
        let class_verdicts = classes
            .iter()
            .map(|class| verdict::<EC2NodeClass>(store, &class_resource, class, &events));
        let verdicts: Vec<Verdict> = pool_verdicts.chain(class_verdicts).collect();
        let claims = store
            .list(&GroupResource::new("karpenter.sh", "nodeclaims"), None, None, None, |c| {
                c["metadata"]["labels"]["karpenter.sh/nodepool"] == "control"
            })
            .items;
        (verdicts, !claims.is_empty())
    });
    (verdicts, provisioned, PANICS.with(Cell::get))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzzed_node_pools_and_classes_get_a_condition_and_an_event_and_never_stop_the_controllers(
        pool_mutants in prop::collection::vec(mutant(&FIELDS, Some("NodePool")), 6),
        class_mutants in prop::collection::vec(mutant(&FIELDS, Some("EC2NodeClass")), 6),
    ) {
        let pools = fuzzed(NODE_POOL, "pool", &pool_mutants);
        let classes = fuzzed(NODE_CLASS, "class", &class_mutants);
        let (verdicts, provisioned, panics) = run(pools, classes);
        prop_assert_eq!(panics, 0, "{:?}", verdicts);
        prop_assert!(provisioned, "the control NodePool got no NodeClaim: {:?}", verdicts);
        for v in &verdicts {
            let which = format!("{} (fuzzed {})", v.name, v.field);
            prop_assert!(v.validation.is_some(), "{}: no ValidationSucceeded condition", which);
            if v.problems > 0 {
                prop_assert_eq!(v.validation.as_deref(), Some("False"), "{}: {} problems", which, v.problems);
            }
            if v.validation.as_deref() == Some("False") {
                prop_assert!(v.warned, "{}: no ValidationFailed event", which);
            }
        }
    }
}

//! Joist's Helm chart as tests see it: rendered by the real `helm` (installed by
//! `scripts/kube-clients` into a cache outside the repository), parsed into objects, and its RBAC
//! rules asked whether they grant an access kubesim recorded.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;

use super::tools::{self, root};

/// The `helm` binary, installed on first use.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| tools::path(&tools::installed("kube-clients"), "kube-clients", "HELM"))
}

/// Runs helm with `args`: its exit status, standard output and standard error.
pub fn run_helm(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(helm())
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("run helm: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `helm template joist deploy/charts/joist --namespace kube-system` with `args` (values): the
/// rendered objects, or helm's error.
pub fn render(args: &[&str]) -> Result<Vec<Value>, String> {
    render_release("joist", args)
}

/// [`render`] as the release `release`.
pub fn render_release(release: &str, args: &[&str]) -> Result<Vec<Value>, String> {
    let mut all = vec![
        "template",
        release,
        "deploy/charts/joist",
        "--namespace",
        "kube-system",
    ];
    all.extend_from_slice(args);
    let (ok, out, err) = run_helm(&all);
    if !ok {
        return Err(err);
    }
    Ok(out
        .split("\n---")
        .filter(|doc| {
            doc.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("{e}\n{doc}")))
        .collect())
}

/// The values every render needs: the cluster's name and endpoint.
pub const REQUIRED: [&str; 4] = [
    "--set",
    "settings.clusterName=demo",
    "--set",
    "settings.clusterEndpoint=https://ABCDEF.gr7.us-west-2.eks.amazonaws.com",
];

/// The chart rendered with only [`REQUIRED`] set, once per test process.
pub fn defaults() -> &'static [Value] {
    static DEFAULTS: OnceLock<Vec<Value>> = OnceLock::new();
    DEFAULTS.get_or_init(|| render(&REQUIRED).unwrap_or_else(|e| panic!("{e}")))
}

/// The rendered object of `kind` named `name`.
pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// Whether the ClusterRoles and Roles in `objects` let the controller make `access` (verb, group,
/// resource, namespace, name), as the API server's RBAC authorizer decides: a ClusterRole's rule
/// anywhere, a Role's only in its namespace, `resourceNames` only for named requests.
pub fn grants(
    objects: &[Value],
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let has = |list: &Value, wanted: &str| {
        list.as_array()
            .is_some_and(|items| items.iter().any(|i| i == wanted || i == "*"))
    };
    objects
        .iter()
        .filter(|o| match o["kind"].as_str() {
            Some("ClusterRole") => !o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .ends_with("-admin"),
            Some("Role") => namespace.is_some() && o["metadata"]["namespace"].as_str() == namespace,
            _ => false,
        })
        .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
        .any(|rule| {
            let names = rule["resourceNames"].as_array().filter(|n| !n.is_empty());
            has(&rule["verbs"], verb)
                && has(&rule["apiGroups"], group)
                && has(&rule["resources"], resource)
                && names.is_none_or(|names| name.is_some_and(|n| names.iter().any(|x| x == n)))
        })
}

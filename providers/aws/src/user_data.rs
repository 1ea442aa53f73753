//! The EC2 user data of a node launched for a NodeClaim, per AMI family, merged with the
//! EC2NodeClass's own `spec.userData` in the formats Karpenter writes:
//!
//! - **AL2023**: a MIME multi-part archive (boundary `//`): the user's parts first (a MIME archive's
//!   parts copied in, a bare nodeadm `NodeConfig` or a shell script as one part), then Joist's
//!   `application/node.eks.aws` part, a nodeadm `NodeConfig` naming the cluster, the kubelet
//!   configuration (with `maxPods` and `registerWithTaints`) and a `--node-labels` flag.
//! - **AL2**: the same archive with a `/etc/eks/bootstrap.sh` shell script as the last part.
//! - **Bottlerocket**: the user's TOML with Joist's `settings.kubernetes` keys set over it; every
//!   user key Joist does not set is kept (the user's `node-taints` are replaced by the claim's).
//! - **Custom**: the user's user data, byte for byte.
//!
//! Labels, taints and map-valued kubelet settings are written sorted, so the same inputs always
//! render the same text. The text is returned plain; base64 encoding is the launcher's job.
//!
//! Fails with a [`UserDataError`]: `spec.userData` does not parse as what its family expects (TOML,
//! or a MIME archive when it starts like one), AL2023's service CIDR is not known yet, the family is
//! a Windows one (Joist does not build Windows nodes), or serializing the generated document failed.

use std::collections::BTreeMap;

use joist_messages::apis::ec2nodeclass::{AmiFamily, InstanceStorePolicy, KubeletConfiguration};
use k8s_openapi::api::core::v1::Taint;
use serde::{Serialize, de::IgnoredAny};

/// The MIME boundary of every archive Joist writes.
const BOUNDARY: &str = "//";
/// The content type of a shell-script part.
const SHELL_SCRIPT: &str = "text/x-shellscript; charset=\"us-ascii\"";
/// The content type of a nodeadm `NodeConfig` part.
const NODE_CONFIG: &str = "application/node.eks.aws";
/// The first line of Joist's NodeConfig part.
const NODE_CONFIG_COMMENT: &str = "# Joist generated NodeConfig";
/// The Bottlerocket bootstrap command that puts ephemeral storage on a RAID0 of the instance stores.
const MOUNT_INSTANCE_STORAGE: &str = "000-mount-instance-storage";

/// What a node needs to join the cluster, and what the user asked for (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Bootstrap<'a> {
    /// The EKS cluster's name.
    pub cluster_name: &'a str,
    /// The API server's URL (`https://….eks.amazonaws.com`).
    pub cluster_endpoint: &'a str,
    /// The cluster's CA bundle: base64-encoded PEM, as EKS reports it.
    pub ca_bundle: Option<&'a str>,
    /// The cluster's service CIDR; AL2023 (nodeadm) requires it.
    pub cluster_cidr: Option<&'a str>,
    /// The labels the node registers with.
    pub labels: &'a BTreeMap<String, String>,
    /// The taints the node registers with: the NodeClaim's taints and startup taints, plus
    /// `karpenter.sh/unregistered:NoExecute` (which Karpenter adds when missing; the caller does).
    pub taints: &'a [Taint],
    /// The instance type's pod capacity, used when the kubelet configuration sets no `maxPods`.
    pub max_pods: Option<u32>,
    /// The EC2NodeClass's kubelet configuration.
    pub kubelet: Option<&'a KubeletConfiguration>,
    /// The EC2NodeClass's `spec.instanceStorePolicy`.
    pub instance_store_policy: Option<InstanceStorePolicy>,
    /// The EC2NodeClass's `spec.userData`.
    pub custom: Option<&'a str>,
}

impl<'a> Bootstrap<'a> {
    /// The kubelet's `maxPods`: the user's when set, else the instance type's.
    fn effective_max_pods(&self) -> Option<i64> {
        self.kubelet
            .and_then(|k| k.max_pods)
            .map(i64::from)
            .or(self.max_pods.map(i64::from))
    }

    /// The first cluster DNS address, when the kubelet configuration names one.
    fn cluster_dns(&self) -> Option<&'a str> {
        self.kubelet
            .and_then(|k| k.cluster_dns.first())
            .map(String::as_str)
    }

    /// Whether the instance stores become a RAID0 array for ephemeral storage.
    fn raid0(&self) -> bool {
        matches!(self.instance_store_policy, Some(InstanceStorePolicy::RAID0))
    }
}

/// Why user data could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    /// `spec.userData` is not valid TOML, or a table Joist writes into is something else there.
    #[error("spec.userData is not valid Bottlerocket TOML: {reason}")]
    Toml {
        /// What is wrong.
        reason: String,
    },
    /// `spec.userData` starts like a MIME document but is not a readable multi-part archive.
    #[error("spec.userData is not a valid MIME multi-part archive: {reason}")]
    Mime {
        /// What is wrong.
        reason: String,
    },
    /// AL2023's nodeadm needs the cluster's service CIDR, which is not resolved yet.
    #[error("the cluster's service CIDR is not known yet; AL2023 (nodeadm) user data needs it")]
    ClusterCidrUnknown,
    /// The family is a Windows one.
    #[error("user data for {family:?} is not supported yet: Joist does not build Windows nodes")]
    WindowsUnsupported {
        /// The family asked for.
        family: AmiFamily,
    },
    /// Serializing the generated document failed.
    #[error("rendering the generated {what} failed: {reason}")]
    Render {
        /// The document (`NodeConfig`, `Bottlerocket settings` …).
        what: &'static str,
        /// What the serializer said.
        reason: String,
    },
}

/// Renders the user data of a node of `family` (see the module docs).
pub fn render(family: AmiFamily, bootstrap: &Bootstrap<'_>) -> Result<String, UserDataError> {
    match family {
        AmiFamily::AL2 => al2(bootstrap),
        AmiFamily::AL2023 => al2023(bootstrap),
        AmiFamily::Bottlerocket => bottlerocket(bootstrap),
        AmiFamily::Custom => Ok(bootstrap.custom.unwrap_or_default().to_owned()),
        AmiFamily::Windows2019 | AmiFamily::Windows2022 | AmiFamily::Windows2025 => {
            Err(UserDataError::WindowsUnsupported { family })
        }
    }
}

// ---------------------------------------------------------------- AL2023 (nodeadm)

/// The user's parts, then Joist's NodeConfig.
fn al2023(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    let node_config = node_config_yaml(b)?;
    let mut parts = user_parts(b.custom, nodeadm_content_type)?;
    parts.push(Part::new(NODE_CONFIG, node_config));
    Ok(write_mime(&parts))
}

/// A nodeadm `NodeConfig` (the fields Joist sets).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeConfig<'a> {
    api_version: &'static str,
    kind: &'static str,
    spec: NodeConfigSpec<'a>,
}

/// `NodeConfig.spec`.
#[derive(Serialize)]
struct NodeConfigSpec<'a> {
    cluster: ClusterDetails<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<InstanceOptions>,
    kubelet: KubeletOptions,
}

/// `NodeConfig.spec.cluster`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterDetails<'a> {
    api_server_endpoint: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_authority: Option<&'a str>,
    cidr: &'a str,
    name: &'a str,
}

/// `NodeConfig.spec.instance`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceOptions {
    local_storage: LocalStorage,
}

/// `NodeConfig.spec.instance.localStorage`.
#[derive(Serialize)]
struct LocalStorage {
    strategy: &'static str,
}

/// `NodeConfig.spec.kubelet`.
#[derive(Serialize)]
struct KubeletOptions {
    config: BTreeMap<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    flags: Vec<String>,
}

/// Joist's NodeConfig as YAML, under a comment line.
fn node_config_yaml(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    let cidr = b
        .cluster_cidr
        .filter(|cidr| !cidr.is_empty())
        .ok_or(UserDataError::ClusterCidrUnknown)?;
    let config = NodeConfig {
        api_version: "node.eks.aws/v1alpha1",
        kind: "NodeConfig",
        spec: NodeConfigSpec {
            cluster: ClusterDetails {
                api_server_endpoint: b.cluster_endpoint,
                certificate_authority: b.ca_bundle.map(str::trim).filter(|ca| !ca.is_empty()),
                cidr,
                name: b.cluster_name,
            },
            instance: b.raid0().then_some(InstanceOptions {
                local_storage: LocalStorage { strategy: "RAID0" },
            }),
            kubelet: KubeletOptions {
                config: nodeadm_kubelet_config(b)?,
                flags: node_labels_flag(b.labels).into_iter().collect(),
            },
        },
    };
    // Plain scalars, as Karpenter writes them, rather than folded blocks for long strings.
    let options = serde_saphyr::ser_options! { prefer_block_scalars: false };
    let yaml =
        serde_saphyr::to_string_with_options(&config, options).map_err(|e| render_error("NodeConfig", e))?;
    Ok(format!("{NODE_CONFIG_COMMENT}\n{yaml}"))
}

/// The kubelet configuration as nodeadm takes it: the user's fields, the effective `maxPods` and
/// the taints as `registerWithTaints` (always present, as Karpenter writes it).
fn nodeadm_kubelet_config(b: &Bootstrap<'_>) -> Result<BTreeMap<String, serde_json::Value>, UserDataError> {
    let kubelet_error = |e: serde_json::Error| render_error("kubelet configuration", e);
    let user = b
        .kubelet
        .map(serde_json::to_value)
        .transpose()
        .map_err(kubelet_error)?;
    let mut config: BTreeMap<String, serde_json::Value> = match user {
        Some(serde_json::Value::Object(fields)) => fields.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    if let Some(max_pods) = b.effective_max_pods() {
        config.insert("maxPods".to_owned(), max_pods.into());
    }
    let taints = serde_json::to_value(sorted_taints(b.taints)).map_err(kubelet_error)?;
    config.insert("registerWithTaints".to_owned(), taints);
    Ok(config)
}

/// A bare user document's part type: a YAML mapping is a NodeConfig, anything else a shell script.
fn nodeadm_content_type(text: &str) -> &'static str {
    match serde_saphyr::from_str::<Option<BTreeMap<String, IgnoredAny>>>(text) {
        Ok(Some(_)) => NODE_CONFIG,
        _ => SHELL_SCRIPT,
    }
}

// ---------------------------------------------------------------- AL2 (bootstrap.sh)

/// The user's parts, then the bootstrap script.
fn al2(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    let mut parts = user_parts(b.custom, shell_content_type)?;
    parts.push(Part::new(SHELL_SCRIPT, eks_bootstrap_script(b)));
    Ok(write_mime(&parts))
}

/// AL2 takes any bare user document as a shell script.
fn shell_content_type(_text: &str) -> &'static str {
    SHELL_SCRIPT
}

/// The script that runs `/etc/eks/bootstrap.sh`, one option per continued line.
fn eks_bootstrap_script(b: &Bootstrap<'_>) -> String {
    let mut command = format!(
        "/etc/eks/bootstrap.sh {} --apiserver-endpoint {}",
        sh_quote(b.cluster_name),
        sh_quote(b.cluster_endpoint)
    );
    if let Some(ca) = b.ca_bundle {
        command.push_str(&format!(" --b64-cluster-ca {}", sh_quote(ca)));
    }
    let mut options = Vec::new();
    if let Some(ip) = b.cluster_dns() {
        if ip.parse::<std::net::Ipv6Addr>().is_ok() {
            options.push("--ip-family ipv6".to_owned());
        }
        options.push(format!("--dns-cluster-ip {}", sh_quote(ip)));
    }
    if b.effective_max_pods().is_some() {
        options.push("--use-max-pods false".to_owned());
    }
    let args = kubelet_extra_args(b);
    if !args.is_empty() {
        options.push(format!("--kubelet-extra-args {}", sh_quote(&args.join(" "))));
    }
    if b.raid0() {
        options.push("--local-disks raid0".to_owned());
    }
    let mut script = String::from(
        "#!/bin/bash -xe\n\
         exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n",
    );
    script.push_str(&command);
    for option in options {
        script.push_str(" \\\n");
        script.push_str(&option);
    }
    script
}

/// The kubelet flags bootstrap.sh passes on, in Karpenter's order.
fn kubelet_extra_args(b: &Bootstrap<'_>) -> Vec<String> {
    let mut args: Vec<String> = [node_labels_flag(b.labels), node_taints_flag(b.taints)]
        .into_iter()
        .flatten()
        .collect();
    if let Some(max_pods) = b.effective_max_pods() {
        args.push(format!("--max-pods={max_pods}"));
    }
    let Some(k) = b.kubelet else {
        return args;
    };
    let flags = [
        k.pods_per_core.map(|n| format!("--pods-per-core={n}")),
        map_flag("--system-reserved", &k.system_reserved, "="),
        map_flag("--kube-reserved", &k.kube_reserved, "="),
        map_flag("--eviction-hard", &k.eviction_hard, "<"),
        map_flag("--eviction-soft", &k.eviction_soft, "<"),
        map_flag("--eviction-soft-grace-period", &k.eviction_soft_grace_period, "="),
        k.eviction_max_pod_grace_period
            .map(|n| format!("--eviction-max-pod-grace-period={n}")),
        k.image_gc_high_threshold_percent
            .map(|n| format!("--image-gc-high-threshold={n}")),
        k.image_gc_low_threshold_percent
            .map(|n| format!("--image-gc-low-threshold={n}")),
        k.cpu_cfs_quota.map(|on| format!("--cpu-cfs-quota={on}")),
    ];
    args.extend(flags.into_iter().flatten());
    args
}

/// `--register-with-taints="k=v:Effect,…"`, when there are taints.
fn node_taints_flag(taints: &[Taint]) -> Option<String> {
    if taints.is_empty() {
        return None;
    }
    let joined = sorted_taints(taints)
        .into_iter()
        .map(taint_string)
        .collect::<Vec<_>>()
        .join(",");
    Some(format!("--register-with-taints={joined:?}"))
}

/// `--name="k<sep>v,…"`, when the map has entries.
fn map_flag(name: &str, map: &BTreeMap<String, String>, separator: &str) -> Option<String> {
    if map.is_empty() {
        return None;
    }
    let joined = map
        .iter()
        .map(|(k, v)| format!("{k}{separator}{v}"))
        .collect::<Vec<_>>()
        .join(",");
    Some(format!("{name}={joined:?}"))
}

/// A taint as the kubelet's flag spells it: `key=value:Effect`, or `key:Effect` without a value.
fn taint_string(taint: &Taint) -> String {
    match taint.value.as_deref().filter(|v| !v.is_empty()) {
        Some(value) => format!("{}={value}:{}", taint.key, taint.effect),
        None => format!("{}:{}", taint.key, taint.effect),
    }
}

/// `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

// ---------------------------------------------------------------- Bottlerocket (TOML)

/// The user's TOML with Joist's settings over it.
fn bottlerocket(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    let mut root = parse_toml(b.custom)?;
    let kubernetes = table_at(&mut root, &["settings", "kubernetes"])?;
    kubernetes.remove("node-taints");
    for (key, value) in kubernetes_settings(b) {
        kubernetes.insert(key.to_owned(), value);
    }
    if !b.labels.is_empty() {
        let labels = table_at(&mut root, &["settings", "kubernetes", "node-labels"])?;
        for (key, value) in b.labels {
            labels.insert(key.clone(), toml::Value::String(value.clone()));
        }
    }
    if b.raid0() {
        let commands = table_at(&mut root, &["settings", "bootstrap-commands"])?;
        commands.insert(MOUNT_INSTANCE_STORAGE.to_owned(), mount_instance_storage());
    }
    toml::to_string(&root).map_err(|e| render_error("Bottlerocket settings", e))
}

/// The user's TOML document, empty when there is none.
fn parse_toml(custom: Option<&str>) -> Result<toml::Table, UserDataError> {
    match custom.filter(|text| !text.trim().is_empty()) {
        None => Ok(toml::Table::new()),
        Some(text) => toml::from_str(text).map_err(|e| UserDataError::Toml {
            reason: e.to_string(),
        }),
    }
}

/// The table at `path`, created where missing; an error when something else is there.
fn table_at<'t>(root: &'t mut toml::Table, path: &[&str]) -> Result<&'t mut toml::Table, UserDataError> {
    let mut current = root;
    for (depth, key) in path.iter().enumerate() {
        current = match current
            .entry(*key)
            .or_insert(toml::Value::Table(toml::Table::new()))
        {
            toml::Value::Table(table) => table,
            _ => {
                return Err(UserDataError::Toml {
                    reason: format!("`{}` must be a table", path[..=depth].join(".")),
                });
            }
        };
    }
    Ok(current)
}

/// The `settings.kubernetes` keys Joist sets (node labels are merged separately).
fn kubernetes_settings(b: &Bootstrap<'_>) -> Vec<(&'static str, toml::Value)> {
    let mut settings = vec![
        ("cluster-name", toml_string(b.cluster_name)),
        ("api-server", toml_string(b.cluster_endpoint)),
    ];
    if let Some(ca) = b.ca_bundle {
        settings.push(("cluster-certificate", toml_string(ca)));
    }
    if let Some(max_pods) = b.effective_max_pods() {
        settings.push(("max-pods", toml::Value::Integer(max_pods)));
    }
    if !b.taints.is_empty() {
        settings.push(("node-taints", bottlerocket_taints(b.taints)));
    }
    if let Some(kubelet) = b.kubelet {
        settings.extend(kubelet_settings(kubelet));
    }
    settings
}

/// The kubelet settings Bottlerocket takes from the kubelet configuration, when set.
fn kubelet_settings(k: &KubeletConfiguration) -> Vec<(&'static str, toml::Value)> {
    let cluster_dns = match k.cluster_dns.as_slice() {
        [] => None,
        [one] => Some(toml_string(one)),
        many => Some(toml::Value::Array(
            many.iter().map(|ip| toml_string(ip)).collect(),
        )),
    };
    let percent = |p: Option<i32>| p.map(|p| toml::Value::String(p.to_string()));
    let maps = [
        ("system-reserved", &k.system_reserved),
        ("kube-reserved", &k.kube_reserved),
        ("eviction-hard", &k.eviction_hard),
    ];
    [
        ("cluster-dns-ip", cluster_dns),
        (
            "image-gc-high-threshold-percent",
            percent(k.image_gc_high_threshold_percent),
        ),
        (
            "image-gc-low-threshold-percent",
            percent(k.image_gc_low_threshold_percent),
        ),
        (
            "cpu-cfs-quota-enforced",
            k.cpu_cfs_quota.map(toml::Value::Boolean),
        ),
    ]
    .into_iter()
    .chain(
        maps.into_iter()
            .map(|(key, map)| (key, (!map.is_empty()).then(|| string_table(map)))),
    )
    .filter_map(|(key, value)| value.map(|value| (key, value)))
    .collect()
}

/// `node-taints`: each key's `value:Effect` list.
fn bottlerocket_taints(taints: &[Taint]) -> toml::Value {
    let mut by_key: BTreeMap<&str, Vec<toml::Value>> = BTreeMap::new();
    for taint in sorted_taints(taints) {
        let value = taint.value.as_deref().unwrap_or_default();
        by_key
            .entry(taint.key.as_str())
            .or_default()
            .push(toml::Value::String(format!("{value}:{}", taint.effect)));
    }
    let mut table = toml::Table::new();
    for (key, values) in by_key {
        table.insert(key.to_owned(), toml::Value::Array(values));
    }
    toml::Value::Table(table)
}

/// The bootstrap command that builds and mounts the instance-store RAID0 array at every boot.
fn mount_instance_storage() -> toml::Value {
    let mut table = toml::Table::new();
    table.insert(
        "commands".to_owned(),
        toml::Value::Array(vec![
            toml_strings(&["apiclient", "ephemeral-storage", "init"]),
            toml_strings(&[
                "apiclient",
                "ephemeral-storage",
                "bind",
                "--dirs",
                "/var/lib/containerd",
                "/var/lib/kubelet",
                "/var/log/pods",
            ]),
        ]),
    );
    table.insert("mode".to_owned(), toml_string("always"));
    table.insert("essential".to_owned(), toml::Value::Boolean(true));
    toml::Value::Table(table)
}

/// A string map as a TOML table of strings.
fn string_table(map: &BTreeMap<String, String>) -> toml::Value {
    let mut table = toml::Table::new();
    for (key, value) in map {
        table.insert(key.clone(), toml_string(value));
    }
    toml::Value::Table(table)
}

/// A TOML string.
fn toml_string(s: &str) -> toml::Value {
    toml::Value::String(s.to_owned())
}

/// A TOML array of strings.
fn toml_strings(items: &[&str]) -> toml::Value {
    toml::Value::Array(items.iter().map(|item| toml_string(item)).collect())
}

// ---------------------------------------------------------------- shared

/// `--node-labels="k=v,…"` (sorted by key), when there are labels.
fn node_labels_flag(labels: &BTreeMap<String, String>) -> Option<String> {
    if labels.is_empty() {
        return None;
    }
    let joined = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Some(format!("--node-labels={joined:?}"))
}

/// The taints sorted by key, value and effect.
fn sorted_taints(taints: &[Taint]) -> Vec<&Taint> {
    let mut sorted: Vec<&Taint> = taints.iter().collect();
    sorted.sort_by(|a, b| (&a.key, &a.value, &a.effect).cmp(&(&b.key, &b.value, &b.effect)));
    sorted
}

// ---------------------------------------------------------------- MIME

/// One part of a MIME multi-part archive.
#[derive(Debug)]
struct Part {
    /// Header names (canonical case) and values, sorted by name.
    headers: Vec<(String, String)>,
    /// The content.
    body: String,
}

impl Part {
    /// A part with only a `Content-Type` header.
    fn new(content_type: &str, body: String) -> Self {
        Part {
            headers: vec![("Content-Type".to_owned(), content_type.to_owned())],
            body,
        }
    }
}

/// The user's user data as parts: a MIME archive's parts, or the whole text as one part whose type
/// `classify` picks; none when there is no user data. Carriage returns are dropped, as Karpenter does.
fn user_parts(custom: Option<&str>, classify: fn(&str) -> &'static str) -> Result<Vec<Part>, UserDataError> {
    let text = custom.unwrap_or_default().replace('\r', "");
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    if trimmed.starts_with("MIME-Version:") || trimmed.starts_with("Content-Type:") {
        return parse_mime(text.trim_start());
    }
    Ok(vec![Part::new(classify(&text), text)])
}

/// The parts of a MIME multi-part archive (`\n` line ends).
fn parse_mime(text: &str) -> Result<Vec<Part>, UserDataError> {
    let (head, body) = text
        .split_once("\n\n")
        .ok_or_else(|| mime_error("no blank line ends the headers".to_owned()))?;
    let boundary = multipart_boundary(&parse_headers(head)?)?;
    parse_parts(body, &boundary)
}

/// Header lines (folded lines joined), names in canonical case, sorted by name.
fn parse_headers(block: &str) -> Result<Vec<(String, String)>, UserDataError> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if line.starts_with([' ', '\t']) {
            let (_, value) = headers
                .last_mut()
                .ok_or_else(|| mime_error(format!("a continuation line opens the headers: {line:?}")))?;
            value.push(' ');
            value.push_str(line.trim());
            continue;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| mime_error(format!("malformed header line {line:?}")))?;
        headers.push((canonical_header(name.trim()), value.trim().to_owned()));
    }
    headers.sort_by(|(a, _), (b, _)| a.cmp(b));
    Ok(headers)
}

/// A header name as MIME canonicalizes it (`content-type` → `Content-Type`).
fn canonical_header(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

/// The boundary of a `multipart/*` Content-Type.
fn multipart_boundary(headers: &[(String, String)]) -> Result<String, UserDataError> {
    let content_type = headers
        .iter()
        .find(|(name, _)| name == "Content-Type")
        .map(|(_, value)| value.as_str())
        .ok_or_else(|| mime_error("no Content-Type header".to_owned()))?;
    let mut params = content_type.split(';');
    let media_type = params.next().unwrap_or_default().trim().to_ascii_lowercase();
    if !media_type.starts_with("multipart/") {
        return Err(mime_error(format!(
            "the Content-Type is {media_type:?}, not multipart"
        )));
    }
    params
        .filter_map(|param| param.split_once('='))
        .find(|(key, _)| key.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value.trim().trim_matches('"').to_owned())
        .filter(|boundary| !boundary.is_empty())
        .ok_or_else(|| mime_error("the Content-Type names no boundary".to_owned()))
}

/// The parts between `--boundary` lines, up to the closing `--boundary--` (a preamble is skipped;
/// the line break before a delimiter belongs to the delimiter).
fn parse_parts(body: &str, boundary: &str) -> Result<Vec<Part>, UserDataError> {
    let delimiter = format!("--{boundary}");
    let close = format!("{delimiter}--");
    let mut parts = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in body.split('\n') {
        let bare = line.trim_end_matches([' ', '\t']);
        if bare == close || bare == delimiter {
            if let Some(lines) = current.take() {
                let index = parts.len();
                parts.push(parse_part(&lines, index)?);
            }
            if bare == close {
                return Ok(parts);
            }
            current = Some(Vec::new());
        } else if let Some(lines) = current.as_mut() {
            lines.push(line);
        }
    }
    Err(mime_error(format!("no closing {close} line")))
}

/// One part's lines: headers, a blank line, the content.
fn parse_part(lines: &[&str], index: usize) -> Result<Part, UserDataError> {
    let blank = lines
        .iter()
        .position(|line| line.is_empty())
        .ok_or_else(|| mime_error(format!("part {} has no blank line after its headers", index + 1)))?;
    Ok(Part {
        headers: parse_headers(&lines[..blank].join("\n"))?,
        body: lines[blank + 1..].join("\n"),
    })
}

/// An archive of `parts` with Joist's fixed boundary.
fn write_mime(parts: &[Part]) -> String {
    let mut out = format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\n\n");
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        out.push_str(&format!("--{BOUNDARY}\n"));
        for (name, value) in &part.headers {
            out.push_str(&format!("{name}: {value}\n"));
        }
        out.push('\n');
        out.push_str(&part.body);
    }
    if !parts.is_empty() {
        out.push('\n');
    }
    out.push_str(&format!("--{BOUNDARY}--\n"));
    out
}

/// A MIME error about `spec.userData`.
fn mime_error(reason: String) -> UserDataError {
    UserDataError::Mime { reason }
}

/// A failure to serialize the generated `what`.
fn render_error(what: &'static str, error: impl std::fmt::Display) -> UserDataError {
    UserDataError::Render {
        what,
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "Q0E=";
    const ENDPOINT: &str = "https://example.eks.amazonaws.com";

    struct Fixture {
        labels: BTreeMap<String, String>,
        taints: Vec<Taint>,
        kubelet: KubeletConfiguration,
    }

    impl Fixture {
        fn new() -> Self {
            let labels = [("b", "2"), ("a", "1")].map(|(k, v)| (k.to_owned(), v.to_owned()));
            Fixture {
                labels: labels.into_iter().collect(),
                taints: vec![Taint {
                    key: "dedicated".to_owned(),
                    value: Some("gpu".to_owned()),
                    effect: "NoSchedule".to_owned(),
                    time_added: None,
                }],
                kubelet: KubeletConfiguration {
                    cluster_dns: vec!["10.100.0.10".to_owned()],
                    // A KubeletConfiguration field Joist does not interpret.
                    other: [("serializeImagePulls".to_owned(), serde_json::Value::Bool(false))].into(),
                    ..KubeletConfiguration::default()
                },
            }
        }

        fn bootstrap<'a>(&'a self, custom: Option<&'a str>) -> Bootstrap<'a> {
            Bootstrap {
                cluster_name: "my-cluster",
                cluster_endpoint: ENDPOINT,
                ca_bundle: Some(CA),
                cluster_cidr: Some("10.100.0.0/16"),
                labels: &self.labels,
                taints: &self.taints,
                max_pods: Some(29),
                kubelet: Some(&self.kubelet),
                instance_store_policy: None,
                custom,
            }
        }
    }

    fn rendered(family: AmiFamily, bootstrap: &Bootstrap<'_>) -> String {
        render(family, bootstrap).unwrap_or_else(|e| panic!("{e}"))
    }

    fn content_type(part: &Part) -> &str {
        part.headers
            .iter()
            .find(|(name, _)| name == "Content-Type")
            .map_or("", |(_, value)| value.as_str())
    }

    fn parts_of(user_data: &str) -> Vec<Part> {
        assert!(
            user_data.starts_with("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n"),
            "{user_data}"
        );
        parse_mime(user_data).unwrap_or_else(|e| panic!("{e}"))
    }

    fn lookup<'v>(value: &'v toml::Value, path: &[&str]) -> &'v toml::Value {
        path.iter().fold(value, |v, key| {
            v.get(*key).unwrap_or_else(|| panic!("no {key} in {v}"))
        })
    }

    #[test]
    fn al2023_puts_the_users_script_before_the_node_config() {
        let fixture = Fixture::new();
        let script = "#!/bin/bash\necho hello\n";
        let out = rendered(AmiFamily::AL2023, &fixture.bootstrap(Some(script)));
        let parts = parts_of(&out);
        assert_eq!(parts.len(), 2, "{out}");
        assert_eq!(content_type(&parts[0]), SHELL_SCRIPT);
        assert_eq!(parts[0].body, script);
        assert_eq!(content_type(&parts[1]), NODE_CONFIG);
        let config: serde_json::Value =
            serde_saphyr::from_str(&parts[1].body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config["kind"], "NodeConfig");
        assert_eq!(config["spec"]["cluster"]["name"], "my-cluster");
        assert_eq!(config["spec"]["cluster"]["apiServerEndpoint"], ENDPOINT);
        assert_eq!(config["spec"]["cluster"]["certificateAuthority"], CA);
        assert_eq!(config["spec"]["cluster"]["cidr"], "10.100.0.0/16");
        assert_eq!(config["spec"]["kubelet"]["flags"][0], "--node-labels=\"a=1,b=2\"");
        let kubelet = &config["spec"]["kubelet"]["config"];
        assert_eq!(kubelet["maxPods"], 29);
        assert_eq!(kubelet["clusterDNS"][0], "10.100.0.10");
        assert_eq!(kubelet["registerWithTaints"][0]["key"], "dedicated");
        assert_eq!(kubelet["registerWithTaints"][0]["effect"], "NoSchedule");
        assert_eq!(
            kubelet["serializeImagePulls"], false,
            "free-form fields reach the node"
        );
    }

    #[test]
    fn al2023_types_a_bare_node_config_and_copies_mime_parts_in_order() {
        let fixture = Fixture::new();
        let node_config = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\n";
        let out = rendered(AmiFamily::AL2023, &fixture.bootstrap(Some(node_config)));
        assert_eq!(content_type(&parts_of(&out)[0]), NODE_CONFIG);

        let archive = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"XYZ\"\n\n\
                       --XYZ\nContent-Type: text/x-shellscript\n\necho one\n\n\
                       --XYZ\ncontent-type: application/node.eks.aws\n\nkind: NodeConfig\n\n--XYZ--\n";
        let out = rendered(AmiFamily::AL2023, &fixture.bootstrap(Some(archive)));
        let parts = parts_of(&out);
        assert_eq!(parts.len(), 3, "{out}");
        assert_eq!(
            (content_type(&parts[0]), parts[0].body.as_str()),
            ("text/x-shellscript", "echo one\n")
        );
        assert_eq!(
            (content_type(&parts[1]), parts[1].body.as_str()),
            (NODE_CONFIG, "kind: NodeConfig\n")
        );
        assert!(parts[2].body.starts_with(NODE_CONFIG_COMMENT));
    }

    #[test]
    fn al2023_needs_the_service_cidr_and_a_readable_archive() {
        let fixture = Fixture::new();
        let no_cidr = Bootstrap {
            cluster_cidr: None,
            ..fixture.bootstrap(None)
        };
        assert_eq!(
            render(AmiFamily::AL2023, &no_cidr),
            Err(UserDataError::ClusterCidrUnknown)
        );
        let unclosed = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"XYZ\"\n\n--XYZ\n\nx\n";
        let err = render(AmiFamily::AL2023, &fixture.bootstrap(Some(unclosed))).err();
        assert!(matches!(err, Some(UserDataError::Mime { .. })), "{err:?}");
        assert!(err.is_some_and(|e| e.to_string().contains("spec.userData")));
    }

    #[test]
    fn al2_runs_bootstrap_sh_after_the_users_script() {
        let fixture = Fixture::new();
        let out = rendered(AmiFamily::AL2, &fixture.bootstrap(Some("echo hi")));
        let parts = parts_of(&out);
        assert_eq!(parts.len(), 2, "{out}");
        assert_eq!(
            (content_type(&parts[0]), parts[0].body.as_str()),
            (SHELL_SCRIPT, "echo hi")
        );
        assert_eq!(content_type(&parts[1]), SHELL_SCRIPT);
        let expected = "#!/bin/bash -xe\n\
            exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n\
            /etc/eks/bootstrap.sh 'my-cluster' --apiserver-endpoint 'https://example.eks.amazonaws.com' \
            --b64-cluster-ca 'Q0E=' \\\n\
            --dns-cluster-ip '10.100.0.10' \\\n\
            --use-max-pods false \\\n\
            --kubelet-extra-args '--node-labels=\"a=1,b=2\" \
            --register-with-taints=\"dedicated=gpu:NoSchedule\" --max-pods=29'";
        assert_eq!(parts[1].body, expected);
    }

    #[test]
    fn bottlerocket_keeps_user_keys_but_joist_settings_win() {
        let fixture = Fixture::new();
        let user = "[settings.host-containers.admin]\nenabled = true\n\n\
                    [settings.kubernetes]\ncluster-name = \"wrong\"\n\
                    allowed-unsafe-sysctls = [\"net.core.somaxconn\"]\n\n\
                    [settings.kubernetes.node-labels]\nteam = \"ml\"\n";
        let out = rendered(AmiFamily::Bottlerocket, &fixture.bootstrap(Some(user)));
        let doc = toml::Value::Table(toml::from_str(&out).unwrap_or_else(|e| panic!("{e}")));
        let kubernetes = lookup(&doc, &["settings", "kubernetes"]);
        assert_eq!(
            lookup(&doc, &["settings", "host-containers", "admin", "enabled"]).as_bool(),
            Some(true)
        );
        assert_eq!(lookup(kubernetes, &["cluster-name"]).as_str(), Some("my-cluster"));
        assert_eq!(lookup(kubernetes, &["api-server"]).as_str(), Some(ENDPOINT));
        assert_eq!(lookup(kubernetes, &["cluster-certificate"]).as_str(), Some(CA));
        assert_eq!(
            lookup(kubernetes, &["cluster-dns-ip"]).as_str(),
            Some("10.100.0.10")
        );
        assert_eq!(lookup(kubernetes, &["max-pods"]).as_integer(), Some(29));
        assert_eq!(
            lookup(kubernetes, &["allowed-unsafe-sysctls"]),
            &toml::Value::Array(vec![toml_string("net.core.somaxconn")])
        );
        assert_eq!(lookup(kubernetes, &["node-labels", "team"]).as_str(), Some("ml"));
        assert_eq!(lookup(kubernetes, &["node-labels", "a"]).as_str(), Some("1"));
        assert_eq!(
            lookup(kubernetes, &["node-taints", "dedicated"]),
            &toml::Value::Array(vec![toml_string("gpu:NoSchedule")])
        );
    }

    #[test]
    fn bottlerocket_user_data_that_does_not_parse_names_spec_user_data() {
        let fixture = Fixture::new();
        let err = render(
            AmiFamily::Bottlerocket,
            &fixture.bootstrap(Some("[settings.kubernetes\n")),
        )
        .err();
        assert!(matches!(err, Some(UserDataError::Toml { .. })), "{err:?}");
        assert!(err.is_some_and(|e| e.to_string().starts_with("spec.userData")));
    }

    #[test]
    fn custom_is_passed_through_byte_for_byte() {
        let fixture = Fixture::new();
        let user = "#!/bin/sh\r\necho 'unchanged' \r\n";
        let out = rendered(AmiFamily::Custom, &fixture.bootstrap(Some(user)));
        assert_eq!(out, user);
        let empty = rendered(AmiFamily::Custom, &fixture.bootstrap(None));
        assert_eq!(empty, "");
    }

    #[test]
    fn windows_is_refused() {
        let fixture = Fixture::new();
        assert_eq!(
            render(AmiFamily::Windows2022, &fixture.bootstrap(None)),
            Err(UserDataError::WindowsUnsupported {
                family: AmiFamily::Windows2022
            })
        );
    }
}

//! The production settings of `joist run`, read from environment variables named as Karpenter
//! names them.
//!
//! Required: `CLUSTER_NAME`. Optional: `CLUSTER_ENDPOINT`, `CLUSTER_CA_BUNDLE` (base64) and
//! `CLUSTER_CIDR` (Joist's own: the service CIDR AL2023 nodes need), each looked up on AWS with
//! `eks:DescribeCluster` when unset, as Karpenter looks them up; `INTERRUPTION_QUEUE`, `VM_MEMORY_OVERHEAD_PERCENT` (default
//! 0.075), `RESERVED_ENIS` (0), `ISOLATED_VPC` (false), `BATCH_IDLE_DURATION` (1s),
//! `BATCH_MAX_DURATION` (10s, Go duration syntax), `FEATURE_GATES` (Karpenter's
//! `Name=true,Name=false` form; Joist acts on `ReservedCapacity` (on unless turned off),
//! `SpotToSpotConsolidation`, `NodeRepair`, `StaticCapacity`, `NodeOverlay` and `CapacityBuffer`),
//! `LOG_LEVEL` (info),
//! `METRICS_PORT` (8080), `HEALTH_PROBE_PORT` (8081), `LISTEN_ADDRESS` (Joist's own: the address
//! both listen on, 0.0.0.0), and leader election's `DISABLE_LEADER_ELECTION` (false),
//! `LEADER_ELECTION_NAME` (joist-leader-election), `LEADER_ELECTION_NAMESPACE` (`SYSTEM_NAMESPACE`,
//! else the client's namespace) and `POD_NAME` (this replica's identity; the host name and process
//! id when unset). Joist's own scale and test settings: `NODEPOOL_SHARDS` (0: the NodePool actors
//! share the controllers' thread; N: spread over N threads of their own, at most 64),
//! `REPLICA_SHARDS` (0: one leader runs everything; N: the NodePools are split into N shards, each
//! held by one replica on a Lease of its own, at most 64; needs leader election) and
//! `CLOUD_PROVIDER` (`aws`, the default; `simulated`: the simulated cloud of `joist simulate` in
//! `AWS_REGION`, us-west-2 when unset, whose instances register as Nodes through the API server,
//! for kubesim's `joist sim serve --no-controllers`; or `kwok`: the same cloud on a real cluster
//! whose Nodes KWOK runs, as Karpenter's KWOK provider does, selling the types of
//! `INSTANCE_TYPES_FILE_PATH`, a file in the format of Karpenter's KWOK provider, when it is set).
//! `SCHEDULER_CONFIG` (Karpenter's, after v1.14): a YAML document of the kube-scheduler settings the
//! simulation mirrors, today `podTopologySpread.defaultConstraints`.
//! An empty variable counts as unset.
//!
//! Failure modes: the first unusable variable stops [`RunSettings::read`] with a
//! [`SettingsError`] naming it, its value and what it should be, so `joist run` fails at start
//! rather than misbehaving later.

use std::{net::IpAddr, time::Duration};

use joist_messages::scheduler_config::SchedulerConfig;

/// What to set `CLUSTER_NAME` to.
const NAME_HINT: &str = "set it to the name of the EKS cluster";
/// What `FEATURE_GATES` looks like.
const FEATURE_GATES_EXPECTED: &str = "comma-separated Name=true or Name=false pairs of Karpenter's gates \
     (SpotToSpotConsolidation, NodeRepair, ReservedCapacity, NodeOverlay, StaticCapacity, CapacityBuffer)";
/// What a valid port looks like.
const PORT_EXPECTED: &str = "a TCP port number, 0 to 65535";
/// What a valid duration looks like.
const DURATION_EXPECTED: &str = "a Go duration such as 1s, 500ms or 1m30s";

/// The most NodePool shards `NODEPOOL_SHARDS` may ask for.
const MAX_SHARDS: usize = 64;
/// The most shards `REPLICA_SHARDS` may split the NodePools into (a Lease each, renewed every
/// second by its holder).
const MAX_REPLICA_SHARDS: u32 = 64;

/// Where the controllers launch instances (`CLOUD_PROVIDER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudKind {
    /// EC2 through the default AWS credential chain (the default).
    Aws,
    /// The simulated cloud in `region`: for kubesim, never for a real cluster.
    Simulated {
        /// `AWS_REGION`, us-west-2 when unset.
        region: String,
    },
    /// The simulated cloud on a cluster whose Nodes KWOK runs: for test clusters, never for
    /// production.
    Kwok {
        /// `AWS_REGION`, us-west-2 when unset.
        region: String,
        /// A Karpenter KWOK instance-types file (`INSTANCE_TYPES_FILE_PATH`); the built-in
        /// catalog of `region` when unset.
        instance_types_file: Option<String>,
    },
}

/// Log verbosity (`LOG_LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Everything, including per-decision detail.
    Debug,
    /// Normal operation (the default).
    Info,
    /// Errors only.
    Error,
}

impl LogLevel {
    /// The matching `tracing` level.
    pub fn as_tracing(self) -> tracing::Level {
        match self {
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Error => tracing::Level::ERROR,
        }
    }

    /// Parses `debug`, `info` or `error` (any case).
    fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "debug" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "error" => Some(LogLevel::Error),
            _ => None,
        }
    }
}

/// The settings of `joist run` (see the module docs for the variables and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// The EKS cluster's name (`CLUSTER_NAME`).
    pub cluster_name: String,
    /// The API server URL nodes join (`CLUSTER_ENDPOINT`); on AWS, looked up when unset.
    pub cluster_endpoint: Option<String>,
    /// The cluster's certificate authority, base64 (`CLUSTER_CA_BUNDLE`).
    pub cluster_ca_bundle: Option<String>,
    /// The cluster's service CIDR, which AL2023 nodes need (`CLUSTER_CIDR`).
    pub cluster_cidr: Option<String>,
    /// The SQS queue of interruption events (`INTERRUPTION_QUEUE`).
    pub interruption_queue: Option<String>,
    /// The fraction of memory the hypervisor keeps, in [0, 1) (`VM_MEMORY_OVERHEAD_PERCENT`).
    pub vm_memory_overhead_percent: f64,
    /// ENIs kept for other uses than pods (`RESERVED_ENIS`).
    pub reserved_enis: u32,
    /// Whether the VPC has no internet access (`ISOLATED_VPC`).
    pub isolated_vpc: bool,
    /// How long a batch of pending pods waits for more after the last (`BATCH_IDLE_DURATION`).
    pub batch_idle: Duration,
    /// The longest a batch of pending pods waits in all (`BATCH_MAX_DURATION`).
    pub batch_max: Duration,
    /// Log verbosity (`LOG_LEVEL`).
    pub log_level: LogLevel,
    /// Karpenter's feature gates, as set (`FEATURE_GATES`).
    pub feature_gates: FeatureGates,
    /// Where Prometheus scrapes `/metrics` (`METRICS_PORT`).
    pub metrics_port: u16,
    /// Where the kubelet probes `/healthz` and `/readyz` (`HEALTH_PROBE_PORT`).
    pub health_probe_port: u16,
    /// The address both listen on (`LISTEN_ADDRESS`).
    pub listen_address: IpAddr,
    /// Whether every replica runs the controllers (`DISABLE_LEADER_ELECTION`).
    pub disable_leader_election: bool,
    /// The Lease replicas elect a leader with (`LEADER_ELECTION_NAME`).
    pub leader_election_name: String,
    /// Its namespace (`LEADER_ELECTION_NAMESPACE`, else `SYSTEM_NAMESPACE`).
    pub leader_election_namespace: Option<String>,
    /// This replica's identity in the Lease (`POD_NAME`).
    pub pod_name: Option<String>,
    /// Threads the NodePool actors are spread over; 0 keeps them on the controllers' own
    /// (`NODEPOOL_SHARDS`).
    pub node_pool_shards: usize,
    /// Shards the NodePools are split into between replicas, each held on a Lease of its own; 0
    /// keeps one leader for everything (`REPLICA_SHARDS`).
    pub replica_shards: u32,
    /// Where instances are launched (`CLOUD_PROVIDER`).
    pub cloud: CloudKind,
    /// kube-scheduler's settings the simulation mirrors (`SCHEDULER_CONFIG`).
    pub scheduler_config: Option<SchedulerConfig>,
}

/// Karpenter's feature gates (`FEATURE_GATES=SpotToSpotConsolidation=true,NodeRepair=false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    /// `ReservedCapacity`: capacity reservations selected by node classes are launched into
    /// (default on).
    pub reserved_capacity: bool,
    /// `SpotToSpotConsolidation`: spot nodes may be replaced by spot nodes (default off).
    pub spot_to_spot_consolidation: bool,
    /// `NodeRepair`: nodes broken for longer than the cloud's repair policies tolerate are
    /// replaced (default off).
    pub node_repair: bool,
    /// `StaticCapacity`: NodePools with `replicas` keep that many nodes (default off).
    pub static_capacity: bool,
    /// `NodeOverlay`: NodeOverlays change the catalog's prices and resources (default off).
    pub node_overlay: bool,
    /// `CapacityBuffer`: CapacityBuffers keep room for pods not there yet (default off).
    pub capacity_buffer: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            reserved_capacity: true,
            spot_to_spot_consolidation: false,
            node_repair: false,
            static_capacity: false,
            node_overlay: false,
            capacity_buffer: false,
        }
    }
}

impl FeatureGates {
    /// Parses `Name=bool` pairs separated by commas; `None` on anything else or an unknown gate.
    fn parse(text: &str) -> Option<Self> {
        let mut gates = FeatureGates::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=')?;
            let on = parse_bool(value.trim())?;
            match name.trim() {
                "SpotToSpotConsolidation" => gates.spot_to_spot_consolidation = on,
                "NodeRepair" => gates.node_repair = on,
                "StaticCapacity" => gates.static_capacity = on,
                "NodeOverlay" => gates.node_overlay = on,
                "ReservedCapacity" => gates.reserved_capacity = on,
                "CapacityBuffer" => gates.capacity_buffer = on,
                _ => return None,
            }
        }
        Some(gates)
    }
}

impl RunSettings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::read(&|name: &str| std::env::var(name).ok())
    }

    /// Reads the settings through `variable` (one environment variable by name; unset → None).
    /// Empty strings count as unset.
    pub fn read(variable: &dyn Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let env = Environment(variable);
        let cluster_name = env.get("CLUSTER_NAME").ok_or(SettingsError::Missing {
            variable: "CLUSTER_NAME",
            hint: NAME_HINT,
        })?;
        let cluster_endpoint = env.parse(
            "CLUSTER_ENDPOINT",
            "a URL starting with https:// or http://",
            |text| is_http_url(text).then(|| text.to_owned()),
        )?;
        let base64_expected =
            "base64 (A-Z, a-z, 0-9, + and /, = padding, a multiple of 4 long, no whitespace)";
        let cidr_expected = "an IPv4 or IPv6 CIDR such as 10.100.0.0/16 or fd00::/108";
        let overhead_expected = "a number in [0, 1): the fraction of memory the hypervisor keeps";
        let batch_idle = env.parse("BATCH_IDLE_DURATION", DURATION_EXPECTED, parse_go_duration)?;
        let batch_max = env.parse("BATCH_MAX_DURATION", DURATION_EXPECTED, parse_go_duration)?;
        let settings = RunSettings {
            cluster_name,
            cluster_endpoint,
            cluster_ca_bundle: env.parse("CLUSTER_CA_BUNDLE", base64_expected, |text| {
                is_base64(text).then(|| text.to_owned())
            })?,
            cluster_cidr: env.parse("CLUSTER_CIDR", cidr_expected, |text| {
                is_cidr(text).then(|| text.to_owned())
            })?,
            interruption_queue: env.get("INTERRUPTION_QUEUE"),
            vm_memory_overhead_percent: env
                .parse("VM_MEMORY_OVERHEAD_PERCENT", overhead_expected, |text| {
                    text.parse::<f64>()
                        .ok()
                        .filter(|fraction| (0.0..1.0).contains(fraction))
                })?
                .unwrap_or(0.075),
            reserved_enis: env
                .parse("RESERVED_ENIS", "a non-negative integer", |text| {
                    text.parse::<u32>().ok()
                })?
                .unwrap_or(0),
            isolated_vpc: env
                .parse("ISOLATED_VPC", "true or false", parse_bool)?
                .unwrap_or(false),
            batch_idle: batch_idle.unwrap_or(Duration::from_secs(1)),
            batch_max: batch_max.unwrap_or(Duration::from_secs(10)),
            log_level: env
                .parse("LOG_LEVEL", "debug, info or error", LogLevel::parse)?
                .unwrap_or(LogLevel::Info),
            feature_gates: env
                .parse("FEATURE_GATES", FEATURE_GATES_EXPECTED, FeatureGates::parse)?
                .unwrap_or_default(),
            metrics_port: env
                .parse("METRICS_PORT", PORT_EXPECTED, |text| text.parse().ok())?
                .unwrap_or(8080),
            health_probe_port: env
                .parse("HEALTH_PROBE_PORT", PORT_EXPECTED, |text| text.parse().ok())?
                .unwrap_or(8081),
            listen_address: env
                .parse(
                    "LISTEN_ADDRESS",
                    "an IPv4 or IPv6 address such as 0.0.0.0",
                    |text| text.parse().ok(),
                )?
                .unwrap_or(IpAddr::from([0, 0, 0, 0])),
            disable_leader_election: env
                .parse("DISABLE_LEADER_ELECTION", "true or false", parse_bool)?
                .unwrap_or(false),
            leader_election_name: env
                .get("LEADER_ELECTION_NAME")
                .unwrap_or_else(|| "joist-leader-election".to_owned()),
            leader_election_namespace: env
                .get("LEADER_ELECTION_NAMESPACE")
                .or_else(|| env.get("SYSTEM_NAMESPACE")),
            pod_name: env.get("POD_NAME"),
            node_pool_shards: env
                .parse(
                    "NODEPOOL_SHARDS",
                    &format!("a number of threads from 0 to {MAX_SHARDS}"),
                    |text| text.parse().ok().filter(|shards| *shards <= MAX_SHARDS),
                )?
                .unwrap_or(0),
            replica_shards: env
                .parse(
                    "REPLICA_SHARDS",
                    &format!("a number of shards from 0 (off) to {MAX_REPLICA_SHARDS}"),
                    |text| text.parse().ok().filter(|shards| *shards <= MAX_REPLICA_SHARDS),
                )?
                .unwrap_or(0),
            cloud: env
                .parse("CLOUD_PROVIDER", "aws, simulated or kwok", |text| {
                    let region = || env.get("AWS_REGION").unwrap_or_else(|| "us-west-2".to_owned());
                    match text {
                        "aws" => Some(CloudKind::Aws),
                        "simulated" => Some(CloudKind::Simulated { region: region() }),
                        "kwok" => Some(CloudKind::Kwok {
                            region: region(),
                            instance_types_file: env.get("INSTANCE_TYPES_FILE_PATH"),
                        }),
                        _ => None,
                    }
                })?
                .unwrap_or(CloudKind::Aws),
            scheduler_config: env
                .get("SCHEDULER_CONFIG")
                .map(|text| {
                    SchedulerConfig::parse(&text).map_err(|error| SettingsError::Invalid {
                        variable: "SCHEDULER_CONFIG",
                        value: text,
                        expected: format!(
                            "a document like Karpenter's (podTopologySpread.defaultConstraints): {error}"
                        ),
                    })
                })
                .transpose()?,
        };
        if settings.replica_shards > 0 && settings.disable_leader_election {
            return Err(SettingsError::Invalid {
                variable: "REPLICA_SHARDS",
                value: settings.replica_shards.to_string(),
                expected: "0 while DISABLE_LEADER_ELECTION=true: each shard is held on a Lease".to_owned(),
            });
        }
        if settings.batch_idle > settings.batch_max {
            return Err(SettingsError::Invalid {
                variable: "BATCH_IDLE_DURATION",
                value: env
                    .get("BATCH_IDLE_DURATION")
                    .unwrap_or_else(|| format!("{:?}", settings.batch_idle)),
                expected: format!("at most BATCH_MAX_DURATION ({:?})", settings.batch_max),
            });
        }
        Ok(settings)
    }

    /// The VM memory overhead in parts per thousand, rounded (0.075 → 75), as
    /// `joist_messages::model::shape::CapacitySettings` wants it.
    pub fn vm_memory_overhead_permille(&self) -> i64 {
        (self.vm_memory_overhead_percent * 1000.0).round() as i64
    }
}

/// Why the settings are unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// A required variable is unset.
    #[error("{variable} is not set: {hint}")]
    Missing {
        /// The variable's name.
        variable: &'static str,
        /// What to set it to, or why it has no fallback.
        hint: &'static str,
    },
    /// A variable's value is unusable.
    #[error("{variable}={value:?} is invalid: {expected}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: String,
    },
}

/// The environment as seen through a lookup function, with empty values counting as unset.
struct Environment<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Environment<'_> {
    /// The value of `name`, unless unset or empty.
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|value| !value.is_empty())
    }

    /// The value of `name` through `parse` (`None` when unset), or [`SettingsError::Invalid`]
    /// with `expected` when `parse` rejects it.
    fn parse<T>(
        &self,
        name: &'static str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, SettingsError> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        match parse(&value) {
            Some(parsed) => Ok(Some(parsed)),
            None => Err(SettingsError::Invalid {
                variable: name,
                value,
                expected: expected.to_owned(),
            }),
        }
    }
}

/// Whether `text` is `http://` or `https://` followed by something.
fn is_http_url(text: &str) -> bool {
    text.strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .is_some_and(|rest| !rest.is_empty())
}

/// Whether `text` is padded standard base64 (alphabet and length only; whitespace is rejected).
fn is_base64(text: &str) -> bool {
    let unpadded = text.trim_end_matches('=');
    text.len().is_multiple_of(4)
        && text.len() - unpadded.len() <= 2
        && unpadded
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'+' || byte == b'/')
}

/// Whether `text` is `address/prefix` with an IPv4 (prefix ≤ 32) or IPv6 (≤ 128) address.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(address) = address.parse::<IpAddr>() else {
        return false;
    };
    let longest = if address.is_ipv4() { 32 } else { 128 };
    !prefix.starts_with('+') && prefix.parse::<u8>().is_ok_and(|length| length <= longest)
}

/// Parses `true` or `false` in any case.
fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Parses Go's `time.ParseDuration` grammar without a sign: `0`, or decimal numbers (with an
/// optional fraction) each followed by a unit among ns, us, µs, ms, s, m and h.
fn parse_go_duration(text: &str) -> Option<Duration> {
    match text {
        "0" => return Some(Duration::ZERO),
        "" => return None,
        _ => {}
    }
    let mut rest = text;
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (whole, after_whole) = split_digits(rest);
        let (fraction, after_number) = match after_whole.strip_prefix('.') {
            Some(after_point) => split_digits(after_point),
            None => ("", after_whole),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_end = after_number
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_number.len());
        let (unit, next) = after_number.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        // Digits past the 18th of a fraction are worth less than a nanosecond.
        let fraction = fraction.get(..18).unwrap_or(fraction);
        let scale = fraction.bytes().fold(1u128, |scale, _| scale * 10);
        let whole_nanos = digits_value(whole)?.checked_mul(unit_nanos)?;
        let fraction_nanos = digits_value(fraction)? * unit_nanos / scale;
        nanos = nanos.checked_add(whole_nanos)?.checked_add(fraction_nanos)?;
        rest = next;
    }
    u64::try_from(nanos).ok().map(Duration::from_nanos)
}

/// Splits `text` after its leading ASCII digits.
fn split_digits(text: &str) -> (&str, &str) {
    text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()))
}

/// The value of a string of ASCII digits (0 when empty), unless it overflows.
fn digits_value(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |value, digit| {
        value.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENDPOINT: &str = "https://ABC.gr7.eu-west-1.eks.amazonaws.com";
    const MINIMAL: &[(&str, &str)] = &[("CLUSTER_NAME", "prod"), ("CLUSTER_ENDPOINT", ENDPOINT)];

    /// Reads settings from `pairs`; the first pair naming a variable wins.
    fn read(pairs: &[(&str, &str)]) -> Result<RunSettings, SettingsError> {
        let lookup = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        RunSettings::read(&lookup)
    }

    /// Reads settings from `overrides` on top of [`MINIMAL`].
    fn with(overrides: &[(&str, &str)]) -> Result<RunSettings, SettingsError> {
        let mut pairs = overrides.to_vec();
        pairs.extend_from_slice(MINIMAL);
        read(&pairs)
    }

    /// The error of a read that must fail.
    fn error(read: Result<RunSettings, SettingsError>) -> SettingsError {
        read.err()
            .unwrap_or_else(|| panic!("unusable settings were accepted"))
    }

    #[test]
    fn feature_gates_are_read_in_karpenters_form() {
        let gates = |text: &str| with(&[("FEATURE_GATES", text)]).map(|s| s.feature_gates);
        let on = gates("SpotToSpotConsolidation=true,NodeRepair=false").unwrap_or_else(|e| panic!("{e}"));
        assert!(on.spot_to_spot_consolidation);
        assert!(!on.node_repair);
        let repair = gates("NodeRepair=true").unwrap_or_else(|e| panic!("{e}"));
        assert!(repair.node_repair);
        let newer = gates("NodeOverlay=true,StaticCapacity=true").unwrap_or_else(|e| panic!("{e}"));
        assert!(newer.node_overlay && newer.static_capacity && !newer.capacity_buffer);
        assert!(on.reserved_capacity, "on unless turned off, as in Karpenter");
        let off = gates("ReservedCapacity=false").unwrap_or_else(|e| panic!("{e}"));
        assert!(!off.reserved_capacity);
        let buffer = gates("CapacityBuffer=true").unwrap_or_else(|e| panic!("{e}"));
        assert!(buffer.capacity_buffer);
        assert_invalid("FEATURE_GATES", "SpotToSpotConsolidation");
        assert_invalid("FEATURE_GATES", "Teleport=true");
        assert_invalid("FEATURE_GATES", "SpotToSpotConsolidation=yes");
        assert_invalid("METRICS_PORT", "80800");
        assert_invalid("HEALTH_PROBE_PORT", "http");
        assert_invalid("LISTEN_ADDRESS", "localhost:8080");
    }

    fn assert_invalid(variable: &str, value: &str) {
        match with(&[(variable, value)]) {
            Err(SettingsError::Invalid { variable: named, .. }) => assert_eq!(named, variable, "{value:?}"),
            other => panic!("{variable}={value:?}: expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn minimal_environment_takes_the_defaults() {
        let settings = read(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        let expected = RunSettings {
            cluster_name: "prod".to_owned(),
            cluster_endpoint: Some(ENDPOINT.to_owned()),
            cluster_ca_bundle: None,
            cluster_cidr: None,
            interruption_queue: None,
            vm_memory_overhead_percent: 0.075,
            reserved_enis: 0,
            isolated_vpc: false,
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            log_level: LogLevel::Info,
            feature_gates: FeatureGates::default(),
            metrics_port: 8080,
            health_probe_port: 8081,
            listen_address: IpAddr::from([0, 0, 0, 0]),
            disable_leader_election: false,
            leader_election_name: "joist-leader-election".to_owned(),
            leader_election_namespace: None,
            pod_name: None,
            node_pool_shards: 0,
            replica_shards: 0,
            cloud: CloudKind::Aws,
            scheduler_config: None,
        };
        assert_eq!(settings, expected);
        assert_eq!(settings.vm_memory_overhead_permille(), 75);
        assert_eq!(settings.log_level.as_tracing(), tracing::Level::INFO);
    }

    #[test]
    fn every_variable_is_read() {
        let settings = with(&[
            ("CLUSTER_CA_BUNDLE", "aGVsbG8="),
            ("CLUSTER_CIDR", "fd00::/108"),
            ("INTERRUPTION_QUEUE", "prod-interruptions"),
            ("VM_MEMORY_OVERHEAD_PERCENT", "0.1"),
            ("RESERVED_ENIS", "2"),
            ("ISOLATED_VPC", "TRUE"),
            ("BATCH_IDLE_DURATION", "500ms"),
            ("BATCH_MAX_DURATION", "1m30s"),
            ("LOG_LEVEL", "debug"),
            ("METRICS_PORT", "9080"),
            ("HEALTH_PROBE_PORT", "9081"),
            ("LISTEN_ADDRESS", "127.0.0.1"),
            ("SYSTEM_NAMESPACE", "kube-system"),
            ("POD_NAME", "joist-7d9c-x2"),
            ("DISABLE_LEADER_ELECTION", "true"),
            ("NODEPOOL_SHARDS", "2"),
            ("CLOUD_PROVIDER", "simulated"),
            ("AWS_REGION", "eu-west-1"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings.cluster_ca_bundle.as_deref(), Some("aGVsbG8="));
        assert_eq!(settings.cluster_cidr.as_deref(), Some("fd00::/108"));
        assert_eq!(settings.interruption_queue.as_deref(), Some("prod-interruptions"));
        assert_eq!(settings.vm_memory_overhead_permille(), 100);
        assert_eq!(settings.reserved_enis, 2);
        assert!(settings.isolated_vpc);
        assert_eq!(settings.batch_idle, Duration::from_millis(500));
        assert_eq!(settings.batch_max, Duration::from_secs(90));
        assert_eq!(settings.log_level, LogLevel::Debug);
        assert_eq!((settings.metrics_port, settings.health_probe_port), (9080, 9081));
        assert_eq!(settings.listen_address, IpAddr::from([127, 0, 0, 1]));
        assert_eq!(settings.leader_election_namespace.as_deref(), Some("kube-system"));
        assert_eq!(settings.pod_name.as_deref(), Some("joist-7d9c-x2"));
        assert!(settings.disable_leader_election);
        assert_eq!(settings.node_pool_shards, 2);
        assert_eq!(
            settings.cloud,
            CloudKind::Simulated {
                region: "eu-west-1".to_owned()
            }
        );
    }

    #[test]
    fn the_kwok_cloud_takes_karpenters_instance_types_file() {
        let settings = with(&[
            ("CLOUD_PROVIDER", "kwok"),
            ("INSTANCE_TYPES_FILE_PATH", "/etc/kwok/instance_types.json"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            settings.cloud,
            CloudKind::Kwok {
                region: "us-west-2".to_owned(),
                instance_types_file: Some("/etc/kwok/instance_types.json".to_owned()),
            }
        );
        let unknown = error(with(&[("CLOUD_PROVIDER", "gcp")]));
        assert!(
            unknown.to_string().contains("aws, simulated or kwok"),
            "{unknown}"
        );
    }

    #[test]
    fn the_scheduler_config_is_read_and_a_bad_one_is_refused_by_its_field() {
        let zone_spread = "podTopologySpread:\n  defaultConstraints:\n  - maxSkew: 1\n    \
            topologyKey: topology.kubernetes.io/zone\n    whenUnsatisfiable: DoNotSchedule\n";
        let settings = with(&[("SCHEDULER_CONFIG", zone_spread)]).unwrap_or_else(|e| panic!("{e}"));
        let config = settings
            .scheduler_config
            .unwrap_or_else(|| panic!("SCHEDULER_CONFIG was set"));
        assert_eq!(config.default_constraints().len(), 1);
        let refused = error(with(&[(
            "SCHEDULER_CONFIG",
            "podTopologySpread: {defaultConstraints: [{maxSkew: 1, topologyKey: zone, \
             whenUnsatisfiable: DoNotSchedule, labelSelector: {}}]}",
        )]));
        assert!(
            refused.to_string().starts_with("SCHEDULER_CONFIG=")
                && refused
                    .to_string()
                    .contains("defaultConstraints[0].labelSelector"),
            "{refused}"
        );
    }

    #[test]
    fn missing_or_empty_cluster_name_is_named() {
        for missing in [error(read(&MINIMAL[1..])), error(with(&[("CLUSTER_NAME", "")]))] {
            assert_eq!(
                missing,
                SettingsError::Missing {
                    variable: "CLUSTER_NAME",
                    hint: NAME_HINT
                }
            );
            assert!(
                missing.to_string().starts_with("CLUSTER_NAME is not set: "),
                "{missing}"
            );
        }
    }

    #[test]
    fn the_cluster_name_alone_is_enough_as_in_karpenters_install() {
        let settings = read(&MINIMAL[..1]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings.cluster_endpoint, None, "looked up on AWS");
    }

    #[test]
    fn unusable_values_name_their_variable() {
        assert_invalid("VM_MEMORY_OVERHEAD_PERCENT", "7.5");
        assert_invalid("VM_MEMORY_OVERHEAD_PERCENT", "abc");
        assert_invalid("RESERVED_ENIS", "-1");
        assert_invalid("ISOLATED_VPC", "yes");
        assert_invalid("BATCH_IDLE_DURATION", "1 s");
        assert_invalid("BATCH_MAX_DURATION", "-10s");
        assert_invalid("LOG_LEVEL", "verbose");
        assert_invalid("CLUSTER_ENDPOINT", "ftp://x");
        assert_invalid("CLUSTER_CA_BUNDLE", "not base64!");
        assert_invalid("CLUSTER_CA_BUNDLE", "aGVs bG8=");
        assert_invalid("CLUSTER_CIDR", "10.100.0.0/33");
        assert_invalid("CLUSTER_CIDR", "banana");
        assert_invalid("NODEPOOL_SHARDS", "65");
        assert_invalid("NODEPOOL_SHARDS", "two");
        assert_invalid("REPLICA_SHARDS", "65");
        assert_invalid("REPLICA_SHARDS", "-1");
        assert_invalid("CLOUD_PROVIDER", "gcp");
        assert_eq!(
            error(with(&[("LOG_LEVEL", "verbose")])).to_string(),
            r#"LOG_LEVEL="verbose" is invalid: debug, info or error"#
        );
    }

    #[test]
    fn replica_shards_need_leader_election() {
        let shards = with(&[("REPLICA_SHARDS", "3")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shards.replica_shards, 3);
        let without = error(with(&[
            ("REPLICA_SHARDS", "3"),
            ("DISABLE_LEADER_ELECTION", "true"),
        ]));
        assert_eq!(
            without.to_string(),
            r#"REPLICA_SHARDS="3" is invalid: 0 while DISABLE_LEADER_ELECTION=true: each shard is held on a Lease"#
        );
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration(".5h"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_go_duration("2us3ns"), Some(Duration::from_nanos(2003)));
        assert_eq!(parse_go_duration("1\u{b5}s"), Some(Duration::from_micros(1)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for text in ["", "1", "s", ".s", "-1s", "+1s", "1 s", "1d", "1s2", "6000000h"] {
            assert_eq!(parse_go_duration(text), None, "{text:?}");
        }
    }

    #[test]
    fn batch_idle_longer_than_batch_max_is_rejected() {
        assert_eq!(
            error(with(&[("BATCH_IDLE_DURATION", "20s")])).to_string(),
            r#"BATCH_IDLE_DURATION="20s" is invalid: at most BATCH_MAX_DURATION (10s)"#
        );
    }
}

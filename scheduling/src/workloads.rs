//! Benchmark problems: Karpenter's own scheduling benchmark, reproduced, and larger ones.
//!
//! - [`karpenter_diverse`]: Karpenter's `scheduling_benchmark_test.go` setup. 400 instance types
//!   (`fake-it-i`: cpu `i+1`, memory `2(i+1)Gi`, pods `10(i+1)`, 100m cpu and 10Mi kube-reserved,
//!   spot in two zones and on-demand in three, price `0.1 × cpu + 0.1 × memory GB`), one NodePool
//!   with huge limits, and the "diverse" pods in equal fifths: plain, zonal spread, hostname spread
//!   (maxSkew 1, random label and selector out of seven values), zonal self-affinity, and hostname
//!   anti-affinity among all (so nodes = pods / 5). CPU and memory are drawn from Karpenter's sets.
//! - [`existing_cluster`]: 1,000 running nodes with pods, plus pending pods.
//! - [`many_node_pools`]: 20 weighted NodePools, most tainted, over the AWS-shaped catalog.
//! - [`aws_catalog`]: about 800 instance types shaped like EC2's (families, sizes, vCPU and
//!   memory ratios, ENI pod limits, kube-reserved), in three zones with spot and on-demand offerings;
//!   prices are modelled per vCPU and family, not quoted.
//!
//! Randomness is a fixed-seed generator, so each problem is the same on every run.

use std::{collections::BTreeMap, sync::Arc};

use joist_messages::{
    cached_pod::CachedPod,
    labels::{ARCH, CAPACITY_TYPE, HOSTNAME, INSTANCE_TYPE, NODEPOOL, OS, ZONE, aws},
    model::{
        capacity::{self, DEFAULT_ROOT_VOLUME_BYTES, DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE, GIB, MIB, bytes},
        instance_type::{CapacityType, InstanceType, Offering, Overhead},
        quantity::Quantity,
        requirements::{Operator, Requirement, Requirements},
        resources::{Resources, names},
    },
};
use k8s_openapi::{
    api::core::v1::{
        Affinity, Container, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec,
        ResourceRequirements, Taint, Toleration, TopologySpreadConstraint,
    },
    apimachinery::pkg::{api::resource::Quantity as KubeQuantity, apis::meta::v1::LabelSelector},
};

use crate::{
    input::{ExistingNode, Input, NodePoolInput},
    pod::PodInfo,
};

/// A small, fixed-seed pseudo-random generator (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub const fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next value below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const LABEL_VALUES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];
const CPU_MILLIS: [i64; 5] = [100, 250, 500, 1000, 1500];
const MEMORY_MIB: [i64; 6] = [100, 256, 512, 1024, 2048, 4096];

fn requirement(key: &str, values: &[&str]) -> Requirement {
    Requirement::new(key, Operator::In, values.iter().copied())
        .unwrap_or_else(|_| unreachable!("values are non-empty"))
}

/// Karpenter's `fake.InstanceTypes(count)` (see the module docs).
pub fn karpenter_instance_types(count: usize) -> Vec<Arc<InstanceType>> {
    let offerings = [
        (CapacityType::Spot, "test-zone-1"),
        (CapacityType::Spot, "test-zone-2"),
        (CapacityType::OnDemand, "test-zone-1"),
        (CapacityType::OnDemand, "test-zone-2"),
        (CapacityType::OnDemand, "test-zone-3"),
    ];
    (0..count)
        .map(|i| {
            let cpu = i as i64 + 1;
            let memory = 2 * cpu * GIB;
            let price = 0.1 * cpu as f64 + 0.1 * memory as f64 / 1e9;
            let name = format!("fake-it-{i}");
            Arc::new(InstanceType {
                requirements: [
                    requirement(INSTANCE_TYPE, &[&name]),
                    requirement(ARCH, &["amd64"]),
                    requirement(OS, &["darwin", "linux", "windows"]),
                    requirement(ZONE, &["test-zone-1", "test-zone-2", "test-zone-3"]),
                    requirement(CAPACITY_TYPE, &["on-demand", "spot"]),
                ]
                .into_iter()
                .collect(),
                name,
                offerings: offerings
                    .iter()
                    .map(|&(capacity_type, zone)| Offering {
                        zone: zone.to_string(),
                        capacity_type,
                        price,
                        available: true,
                        reservation: None,
                    })
                    .collect(),
                capacity: Resources::new()
                    .with(names::CPU, Quantity::from_units(cpu))
                    .with(names::MEMORY, bytes(memory))
                    .with(names::PODS, Quantity::from_units(10 * cpu)),
                overhead: Overhead {
                    kube_reserved: Resources::new()
                        .with(names::CPU, Quantity::from_millis(100))
                        .with(names::MEMORY, bytes(10 * MIB)),
                    ..Overhead::default()
                },
            })
        })
        .collect()
}

fn kube_quantity(text: String) -> KubeQuantity {
    KubeQuantity(text)
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..LabelSelector::default()
    }
}

fn term(key: &str, value: &str, topology_key: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(selector(key, value)),
        topology_key: topology_key.to_string(),
        ..PodAffinityTerm::default()
    }
}

fn spread(key: &str, value: &str, topology_key: &str) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: topology_key.to_string(),
        when_unsatisfiable: "DoNotSchedule".to_string(),
        label_selector: Some(selector(key, value)),
        ..TopologySpreadConstraint::default()
    }
}

/// A pod named `name` with `labels`, requesting `cpu_millis` and `memory_mib`, shaped by `spec`.
fn pod(
    name: String,
    labels: BTreeMap<String, String>,
    cpu_millis: i64,
    memory_mib: i64,
    spec: PodSpec,
) -> PodInfo {
    let mut spec = spec;
    spec.containers = vec![Container {
        name: "app".to_string(),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), kube_quantity(format!("{cpu_millis}m"))),
                ("memory".to_string(), kube_quantity(format!("{memory_mib}Mi"))),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }];
    let mut pod = CachedPod::from(Pod {
        spec: Some(spec),
        ..Pod::default()
    });
    pod.metadata.name = Some(name.clone());
    pod.metadata.namespace = Some("default".to_string());
    pod.metadata.uid = Some(name);
    pod.metadata.labels = Some(labels);
    PodInfo::from_pod(&pod).unwrap_or_else(|e| unreachable!("benchmark pods are well-formed: {e}"))
}

fn one_label(key: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), value.to_string())])
}

/// Generated pods as a problem holds them.
fn shared(pods: Vec<PodInfo>) -> Vec<Arc<PodInfo>> {
    pods.into_iter().map(Arc::new).collect()
}

/// Karpenter's "diverse" pods, `count` of them in equal fifths (see the module docs).
pub fn diverse_pods(count: usize, rng: &mut Rng) -> Vec<PodInfo> {
    let fifth = count / 5;
    let mut pods = Vec::with_capacity(count);
    let size = |rng: &mut Rng| (*rng.pick(&CPU_MILLIS), *rng.pick(&MEMORY_MIB));
    for i in 0..count {
        let kind = if i < 5 * fifth { i / fifth } else { 0 };
        let (cpu, memory) = size(rng);
        let name = format!("pod-{i}");
        let label = *rng.pick(&LABEL_VALUES);
        let info = match kind {
            1 | 2 => {
                let key = if kind == 1 { ZONE } else { HOSTNAME };
                let wanted = *rng.pick(&LABEL_VALUES);
                pod(
                    name,
                    one_label("my-label", label),
                    cpu,
                    memory,
                    PodSpec {
                        topology_spread_constraints: Some(vec![spread("my-label", wanted, key)]),
                        ..PodSpec::default()
                    },
                )
            }
            3 => pod(
                name,
                one_label("my-affinity", label),
                cpu,
                memory,
                PodSpec {
                    affinity: Some(Affinity {
                        pod_affinity: Some(PodAffinity {
                            required_during_scheduling_ignored_during_execution: Some(vec![term(
                                "my-affinity",
                                label,
                                ZONE,
                            )]),
                            ..PodAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    ..PodSpec::default()
                },
            ),
            4 => pod(
                name,
                one_label("app", "nginx"),
                cpu,
                memory,
                PodSpec {
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: Some(vec![term(
                                "app", "nginx", HOSTNAME,
                            )]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    ..PodSpec::default()
                },
            ),
            _ => pod(
                name,
                one_label("my-label", label),
                cpu,
                memory,
                PodSpec::default(),
            ),
        };
        pods.push(info);
    }
    pods
}

fn node_pool(name: &str, weight: i32, instance_types: usize) -> NodePoolInput {
    NodePoolInput {
        name: name.to_string(),
        weight,
        requirements: Requirements::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        remaining: Some(BTreeMap::from([
            (names::CPU.to_string(), Quantity::from_units(10_000_000)),
            (names::MEMORY.to_string(), bytes(10_000_000 * GIB)),
        ])),
        instance_types: (0..instance_types).collect(),
    }
}

/// Karpenter's benchmark with `pods` diverse pods (see the module docs).
pub fn karpenter_diverse(pods: usize) -> Input {
    let instance_types = karpenter_instance_types(400);
    Input {
        node_pools: vec![node_pool("default", 0, instance_types.len())],
        instance_types,
        pods: shared(diverse_pods(pods, &mut Rng::new(42))),
        ..Input::default()
    }
}

/// One EC2-like family: name, category, generation, architecture, GiB per vCPU, price per vCPU-hour.
struct Family {
    name: &'static str,
    arch: &'static str,
    gib_per_vcpu: i64,
    od_per_vcpu: f64,
}

/// Families (name, GiB per vCPU, on-demand $ per vCPU-hour for the base family).
const FAMILIES: &[(&str, i64, f64)] = &[
    ("c5", 2, 0.0425),
    ("c5a", 2, 0.0385),
    ("c5d", 2, 0.048),
    ("c5n", 2, 0.054),
    ("c6a", 2, 0.0383),
    ("c6g", 2, 0.034),
    ("c6gd", 2, 0.0384),
    ("c6gn", 2, 0.0432),
    ("c6i", 2, 0.0425),
    ("c6id", 2, 0.0504),
    ("c6in", 2, 0.0567),
    ("c7a", 2, 0.0513),
    ("c7g", 2, 0.0363),
    ("c7gd", 2, 0.0454),
    ("c7gn", 2, 0.0624),
    ("c7i", 2, 0.0446),
    ("c8g", 2, 0.0399),
    ("m5", 4, 0.048),
    ("m5a", 4, 0.043),
    ("m5ad", 4, 0.0515),
    ("m5d", 4, 0.0565),
    ("m5dn", 4, 0.068),
    ("m5n", 4, 0.0595),
    ("m6a", 4, 0.0432),
    ("m6g", 4, 0.0385),
    ("m6gd", 4, 0.0452),
    ("m6i", 4, 0.048),
    ("m6id", 4, 0.0593),
    ("m6idn", 4, 0.0795),
    ("m6in", 4, 0.0696),
    ("m7a", 4, 0.058),
    ("m7g", 4, 0.0408),
    ("m7gd", 4, 0.0534),
    ("m7i", 4, 0.0504),
    ("m8g", 4, 0.0449),
    ("r5", 8, 0.063),
    ("r5a", 8, 0.0565),
    ("r5ad", 8, 0.0655),
    ("r5b", 8, 0.0745),
    ("r5d", 8, 0.072),
    ("r5dn", 8, 0.0835),
    ("r5n", 8, 0.0745),
    ("r6a", 8, 0.0567),
    ("r6g", 8, 0.0504),
    ("r6gd", 8, 0.0576),
    ("r6i", 8, 0.063),
    ("r6id", 8, 0.0756),
    ("r6idn", 8, 0.0977),
    ("r6in", 8, 0.0872),
    ("r7a", 8, 0.0761),
    ("r7g", 8, 0.0536),
    ("r7gd", 8, 0.068),
    ("r7i", 8, 0.0662),
    ("r8g", 8, 0.0589),
    ("x2gd", 16, 0.0835),
    ("i4i", 8, 0.0858),
    ("i3", 8, 0.078),
    ("z1d", 8, 0.093),
    ("t3", 4, 0.0416),
    ("t3a", 4, 0.0376),
    ("t4g", 4, 0.0336),
];

/// Sizes (name, vCPUs).
const SIZES: &[(&str, i64)] = &[
    ("medium", 1),
    ("large", 2),
    ("xlarge", 4),
    ("2xlarge", 8),
    ("4xlarge", 16),
    ("8xlarge", 32),
    ("12xlarge", 48),
    ("16xlarge", 64),
    ("24xlarge", 96),
    ("32xlarge", 128),
    ("48xlarge", 192),
    ("metal", 96),
];

/// The AWS-style zones of the catalog.
pub const AWS_ZONES: [&str; 3] = ["us-west-2a", "us-west-2b", "us-west-2c"];

/// EKS's ENI-limited max pods for a size (m5 shapes).
fn max_pods(vcpus: i64) -> i64 {
    let (enis, ipv4_per_eni) = match vcpus {
        1 => (2, 4),
        2 => (3, 10),
        4 | 8 => (4, 15),
        16 | 32 => (8, 30),
        _ => (15, 50),
    };
    let eni_limited = capacity::eni_limited_pods(enis, ipv4_per_eni, 0);
    capacity::max_pods(None, Some(eni_limited), None, vcpus)
}

/// About 800 EC2-shaped instance types (see the module docs).
pub fn aws_catalog() -> Vec<Arc<InstanceType>> {
    let mut out = Vec::new();
    for &(family, gib_per_vcpu, od_per_vcpu) in FAMILIES {
        let family = Family {
            name: family,
            arch: if family.contains('g') { "arm64" } else { "amd64" },
            gib_per_vcpu,
            od_per_vcpu,
        };
        let burstable = family.name.starts_with('t');
        for (s, &(size, vcpus)) in SIZES.iter().enumerate() {
            if (burstable && vcpus > 8)
                || (!burstable && vcpus < 2)
                || (family.arch == "arm64" && size == "48xlarge")
            {
                continue;
            }
            out.push(aws_type(&family, size, vcpus, s));
        }
    }
    out.into_iter().map(Arc::new).collect()
}

fn aws_type(family: &Family, size: &str, vcpus: i64, seed: usize) -> InstanceType {
    let name = format!("{}.{size}", family.name);
    let memory_mib = vcpus * family.gib_per_vcpu * 1024;
    let pods = max_pods(vcpus);
    let on_demand = family.od_per_vcpu * vcpus as f64;
    let mut rng = Rng::new(seed as u64 ^ name.len() as u64 ^ (vcpus as u64) << 8);
    let mut offerings = Vec::new();
    for zone in AWS_ZONES {
        offerings.push(Offering {
            zone: zone.to_string(),
            capacity_type: CapacityType::OnDemand,
            price: on_demand,
            available: true,
            reservation: None,
        });
        let discount = 0.25 + 0.05 * rng.below(8) as f64;
        offerings.push(Offering {
            zone: zone.to_string(),
            capacity_type: CapacityType::Spot,
            price: (on_demand * discount * 10_000.0).round() / 10_000.0,
            available: true,
            reservation: None,
        });
    }
    let category = &family.name[..1];
    let generation: String = family.name.chars().filter(char::is_ascii_digit).collect();
    let vcpu_text = vcpus.to_string();
    let memory_text = memory_mib.to_string();
    InstanceType {
        requirements: [
            requirement(INSTANCE_TYPE, &[&name]),
            requirement(ARCH, &[family.arch]),
            requirement(OS, &["linux"]),
            requirement(ZONE, &AWS_ZONES),
            requirement(CAPACITY_TYPE, &["on-demand", "spot"]),
            requirement(aws::INSTANCE_CATEGORY, &[category]),
            requirement(aws::INSTANCE_FAMILY, &[family.name]),
            requirement(aws::INSTANCE_GENERATION, &[&generation]),
            requirement(aws::INSTANCE_SIZE, &[size]),
            requirement(aws::INSTANCE_CPU, &[&vcpu_text]),
            requirement(aws::INSTANCE_MEMORY, &[&memory_text]),
        ]
        .into_iter()
        .collect(),
        name,
        offerings,
        capacity: Resources::new()
            .with(names::CPU, Quantity::from_units(vcpus))
            .with(
                names::MEMORY,
                bytes(capacity::vm_memory_mib(memory_mib, DEFAULT_VM_MEMORY_OVERHEAD_PERMILLE) * MIB),
            )
            .with(names::PODS, Quantity::from_units(pods))
            .with(names::EPHEMERAL_STORAGE, bytes(DEFAULT_ROOT_VOLUME_BYTES)),
        overhead: capacity::default_overhead(vcpus, pods, DEFAULT_ROOT_VOLUME_BYTES),
    }
}

/// Plain and zonal-spread pods of several "deployments", sized like web services.
fn service_pods(count: usize, prefix: &str, rng: &mut Rng) -> Vec<PodInfo> {
    (0..count)
        .map(|i| {
            let app = format!("{prefix}-app-{}", rng.below(50));
            let (cpu, memory) = (*rng.pick(&CPU_MILLIS), *rng.pick(&MEMORY_MIB));
            let spec = if i % 3 == 0 {
                PodSpec {
                    topology_spread_constraints: Some(vec![spread("app", &app, ZONE)]),
                    ..PodSpec::default()
                }
            } else {
                PodSpec::default()
            };
            pod(format!("{prefix}-{i}"), one_label("app", &app), cpu, memory, spec)
        })
        .collect()
}

/// Pods already running on each existing node of [`existing_cluster`] (about 5.4 of 7.9 cpu).
const PODS_PER_NODE: usize = 8;

/// The shape of every running node of the benchmark clusters.
fn running_shape(instance_types: &[Arc<InstanceType>]) -> Arc<InstanceType> {
    instance_types
        .iter()
        .find(|t| t.name == "m6i.2xlarge")
        .cloned()
        .unwrap_or_else(|| unreachable!("the catalog has m6i.2xlarge"))
}

/// The `n`th running node of the `default` NodePool, of type `shape`, holding `pods`.
fn running_node(n: usize, shape: &InstanceType, pods: Vec<Arc<PodInfo>>) -> ExistingNode {
    let zone = AWS_ZONES[n % AWS_ZONES.len()];
    let name = format!("ip-10-0-{}-{}.ec2.internal", n / 250, n % 250);
    ExistingNode {
        labels: BTreeMap::from([
            (ZONE.to_string(), zone.to_string()),
            (HOSTNAME.to_string(), name.clone()),
            (INSTANCE_TYPE.to_string(), shape.name.clone()),
            (ARCH.to_string(), "amd64".to_string()),
            (CAPACITY_TYPE.to_string(), "on-demand".to_string()),
            (NODEPOOL.to_string(), "default".to_string()),
        ]),
        name,
        taints: Vec::new(),
        allocatable: shape.allocatable(),
        pods,
        initialized: true,
        volume_limits: Default::default(),
    }
}

/// `nodes` running nodes, each filled with service pods until the next would not fit: no room
/// left but crumbs, as in a cluster that grew to its pods.
fn full_nodes(instance_types: &[Arc<InstanceType>], nodes: usize, rng: &mut Rng) -> Vec<ExistingNode> {
    let shape = running_shape(instance_types);
    let room = shape.allocatable();
    let mut pending = service_pods(nodes * PODS_PER_NODE * 2, "running", rng)
        .into_iter()
        .map(Arc::new)
        .peekable();
    (0..nodes)
        .map(|n| {
            let mut used = Resources::new();
            let mut pods = Vec::new();
            while let Some(pod) = pending.next_if(|pod| {
                let mut after = used.clone();
                after.add(&pod.requests);
                after.fits(&room)
            }) {
                used.add(&pod.requests);
                pods.push(pod);
            }
            running_node(n, &shape, pods)
        })
        .collect()
}

/// `nodes` running m6i.2xlarge nodes already holding pods, plus `pending` new pods, over the AWS-shaped
/// catalog with one NodePool.
pub fn existing_cluster(nodes: usize, pending: usize) -> Input {
    let instance_types = aws_catalog();
    let mut rng = Rng::new(7);
    let shape = running_shape(&instance_types);
    let running = service_pods(nodes * PODS_PER_NODE, "running", &mut rng);
    let nodes = running.chunks(PODS_PER_NODE).enumerate();
    Input {
        node_pools: vec![node_pool("default", 0, instance_types.len())],
        nodes: nodes
            .map(|(n, pods)| running_node(n, &shape, pods.iter().cloned().map(Arc::new).collect()))
            .collect(),
        pods: shared(service_pods(pending, "pending", &mut rng)),
        instance_types,
        ..Input::default()
    }
}

/// 20 NodePools with weights (teams' tainted pools and a shared default) over the AWS-shaped
/// catalog, with `pods` pending pods spread over the teams.
pub fn many_node_pools(pods: usize) -> Input {
    let instance_types = aws_catalog();
    let all = instance_types.len();
    let mut pools = Vec::new();
    for team in 0..19 {
        let mut pool = node_pool(&format!("team-{team}"), 10 + team, all);
        pool.taints = vec![Taint {
            key: "team".to_string(),
            value: Some(format!("t{team}")),
            effect: "NoSchedule".to_string(),
            time_added: None,
        }];
        let category = ["c", "m", "r"][team as usize % 3];
        pool.requirements
            .add(requirement(aws::INSTANCE_CATEGORY, &[category]));
        if team % 2 == 0 {
            pool.requirements.add(requirement(CAPACITY_TYPE, &["spot"]));
        }
        pools.push(pool);
    }
    pools.push(node_pool("default", 0, all));
    let mut rng = Rng::new(11);
    let mut pending = service_pods(pods, "svc", &mut rng);
    for (i, pod) in pending.iter_mut().enumerate() {
        // Four in five pods belong to a team and tolerate its taint; the rest use the default pool.
        if i % 5 != 0 {
            let team = i % 19;
            pod.change_constraints(|c| {
                c.tolerations = vec![crate::taints::Toleration::from(&Toleration {
                    key: Some("team".to_string()),
                    operator: Some("Equal".to_string()),
                    value: Some(format!("t{team}")),
                    effect: Some("NoSchedule".to_string()),
                    toleration_seconds: None,
                })]
            });
        }
    }
    Input {
        node_pools: pools,
        instance_types,
        pods: shared(pending),
        ..Input::default()
    }
}

/// The starvation check of kubernetes-sigs/karpenter #3152 (small pods left pending for hours
/// behind a solve that gave up early): [`many_node_pools`]' 20 NodePools and `pending` pods of
/// mixed sizes, with `nodes` full running nodes of the default pool beside them.
pub fn crowded_node_pools(nodes: usize, pending: usize) -> Input {
    let input = many_node_pools(pending);
    Input {
        nodes: full_nodes(&input.instance_types, nodes, &mut Rng::new(7)),
        ..input
    }
}

/// Nodes per provisioning batch of [`fragmented_cluster`].
const BATCH_NODES: usize = 2_000;

/// A fragmented cluster of `nodes` nodes for consolidation benchmarks: Karpenter's diverse workload
/// provisioned in batches of up to [`BATCH_NODES`] nodes, as a cluster grows batch by batch (pods
/// grown until a batch's simulation opens enough nodes, the first kept, each on its cheapest
/// type's cheapest on-demand offering in a zone its claim allows, labelled as it would be), then
/// a seeded `deleted` share of the pods removed. No pods are left to place. Batches keep the set-up
/// linear in the nodes: one solve that opens every node tries each pod on every claim opened so
/// far. Should a batch open no node that can be kept (none with an on-demand offering), the cluster
/// stops growing there, with fewer nodes than asked for.
pub fn fragmented_cluster(nodes: usize, deleted: f64) -> Input {
    let mut cluster = karpenter_diverse(0);
    let mut rng = Rng::new(60);
    let mut batch = 0;
    while cluster.nodes.len() < nodes.max(1) {
        let before = cluster.nodes.len();
        let wanted = (nodes.max(1) - before).min(BATCH_NODES);
        let (input, solution) = provisioned_batch(&cluster, wanted, batch);
        for claim in solution.claims.iter().take(wanted) {
            let Some(&first) = claim.instance_types.first() else {
                continue;
            };
            let it = &input.instance_types[first];
            let zone = claim.requirements.get(ZONE);
            let Some(offering) = it
                .offerings
                .iter()
                .filter(|o| o.capacity_type == CapacityType::OnDemand)
                .filter(|o| zone.is_none_or(|r| r.has(&o.zone)))
                .min_by(|a, b| a.price.total_cmp(&b.price))
            else {
                continue;
            };
            let kept = claim
                .pods
                .iter()
                .filter(|_| (rng.below(1_000) as f64) >= deleted * 1_000.0)
                .map(|&p| input.pods[p].clone())
                .collect();
            let name = format!("node-{}", cluster.nodes.len());
            cluster.nodes.push(ExistingNode::launched(
                &name,
                &claim.requirements,
                it,
                offering,
                kept,
            ));
        }
        if cluster.nodes.len() == before {
            break;
        }
        batch += 1;
    }
    cluster
}

/// Karpenter's diverse workload (pods named for `batch`, drawn from its own seed) grown until its
/// simulation opens at least `nodes` nodes; with that solution. The pools and instance types are
/// `catalog`'s; its nodes are not simulated.
fn provisioned_batch(catalog: &Input, nodes: usize, batch: u64) -> (Input, crate::Solution) {
    let mut pods = nodes.max(1) * 8;
    loop {
        let mut input = Input {
            node_pools: catalog.node_pools.clone(),
            instance_types: catalog.instance_types.clone(),
            ..Input::default()
        };
        let mut batch_pods = diverse_pods(pods, &mut Rng::new(42 + batch));
        for pod in &mut batch_pods {
            pod.name = format!("b{batch}-{}", pod.name);
            pod.uid.clone_from(&pod.name);
        }
        input.pods = shared(batch_pods);
        let solution = crate::solve(&input);
        if solution.claims.len() >= nodes || pods > nodes * 1_000 {
            return (input, solution);
        }
        pods = pods * nodes / solution.claims.len().max(1) + pods / 10 + 1;
    }
}

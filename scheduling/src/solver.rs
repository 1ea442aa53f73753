//! The first-fit-decreasing solver: where every pending pod goes.
//!
//! Pods are queued largest first (cpu, then memory, then creation time, then UID). Each pod tries,
//! in order, the existing nodes (initialized first, then by name), the NodeClaims this pass has
//! opened, and a new NodeClaim from each NodePool by descending weight; the first that can take it
//! wins. When none can, one preference is relaxed and the pod tries again; when nothing is left to
//! relax it goes to the back of the queue, and the pass ends when a full round places nothing.
//!
//! Open claims are tried oldest first, which packs large nodes tightly. Karpenter tries the claim
//! with the fewest pods first, which spreads pods thin: on its own diverse benchmark that costs
//! 19 % more at 1,000 pods and 5 % more at 20,000. Oldest first alone would fill early claims to
//! the largest type before the one-per-node pods come up in the queue, so claims keep room for
//! them while they are scarce ([`crate::reserve`]). A pod that pins its node
//! (`karpenter.sh/do-not-disrupt`) tries the open claim holding the least CPU first instead: the
//! node it lands on cannot be consolidated while it runs, so it goes where that node stays small
//! rather than onto a large node beside pods that would later move off. That pod checks every open
//! claim with room for it, so its cost grows with the claims of the pass.
//!
//! Speed comes from preparing work once: pods are grouped into scheduling classes
//! ([`crate::classes`]), NodePool × class compatibility is computed on first use, each class
//! remembers which nodes and claims rejected it for good (taints, labels, ports, anti-affinity and
//! hostname spread only get worse), claims are indexed by the zone (or other domain) they are
//! pinned to so a pod's topology rules rule them out a word at a time, and a claim's instance types
//! are a bit set narrowed in place, the types with room (or within the limits) found through an
//! index ([`crate::amounts`]). Nothing is allocated per candidate checked.
//!
//! A claim near its NodePool's limits gives up the types that would take the pool past them; a pod
//! is refused for limits only when none is left.
//!
//! Failure modes: none at run time; a pod that fits nowhere is reported with a [`Reason`] per
//! NodePool.

mod delta;
mod room;

use std::{
    cmp::Reverse,
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
};

use joist_messages::{
    labels::is_well_known,
    labels::{CAPACITY_TYPE, ZONE},
    model::{
        instance_type::{InstanceType, Offering},
        requirements::{Operator, Requirement, Requirements},
        resources::Resources,
    },
};

use crate::{
    bitset,
    catalog::{self, PoolPlan},
    classes::{self, Class},
    dims::{self, Dims, LastVector},
    input::{Input, MinValuesPolicy},
    pod::{AttachedVolume, Constraints, HostPort, Kind, PodInfo},
    reservations::Ledger,
    reserve::Reserves,
    solution::{NewClaim, Placement, Reason, Solution, Unschedulable},
    taints::{PREFER_NO_SCHEDULE, first_untolerated},
    topology::{Domain, GroupKind, Rule, Topology},
};

/// Karpenter's `MaxInstanceTypes`: a NodeClaim lists at most this many instance types.
pub const MAX_INSTANCE_TYPES: usize = 600;

/// A launch considers at most this many of a NodeClaim's cheapest options (the most instance types
/// one EC2 CreateFleet request takes), so NodePool limits are reserved for the largest of these.
pub const LAUNCH_OPTIONS: usize = 60;

pub(crate) use delta::Simulator;

/// Places `input.pods` (see the module docs).
pub fn solve(input: &Input) -> Solution {
    Solver::new(input).place()
}

/// Why a pod does not fit one node, claim or NodePool, cheaply (turned into a [`Reason`] only for
/// pods that fit nowhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Taint(usize),
    Requirements,
    HostPort(i32),
    Resources,
    Limits,
    Topology(usize),
    MinValues(usize, usize),
    /// The capacity reservations the claim could use were all taken earlier in this solve (see
    /// [`crate::reservations`]).
    ReservedCapacity,
}

/// A rejection and whether it holds for good for the whole class.
type Reject = (Why, bool);

/// A class's view of one NodePool: requirements merged and instance types filtered.
#[derive(Debug)]
struct ClassPool {
    reqs: Requirements,
    candidates: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Claim {
    pool: usize,
    reqs: Requirements,
    candidates: Vec<u64>,
    /// Capacity held against the NodePool's limits: the largest of the first [`LAUNCH_OPTIONS`].
    reserved: Vec<i64>,
    /// Counts in `Selected` groups waiting for the claim's domain on their key to be decided.
    pending: Vec<(usize, u32)>,
    /// The capacity reservations it holds a place in (numbers in the solver's [`Ledger`]).
    held: Vec<u32>,
    /// The class whose node requirements narrowed `reqs` last: narrowing by them again (the
    /// next pod of a workload) changes nothing.
    narrowed_by: Option<usize>,
}

/// An existing node or a claim opened in this pass.
#[derive(Debug, Clone)]
struct Bin {
    node: Option<usize>,
    claim: Option<Claim>,
    /// Existing node: allocatable. Claim: the element-wise largest allocatable of its candidates.
    alloc: Vec<i64>,
    used: Vec<i64>,
    ports: Vec<HostPort>,
    /// Existing node whose CSI drivers limit attachments: the volumes its pods attach.
    volumes: Vec<AttachedVolume>,
    host_counts: Vec<(usize, u32)>,
    /// Per topology key: the domain, `None` when absent (node) or undecided (claim).
    domains: Vec<Option<u32>>,
    pods: Vec<usize>,
}

impl Bin {
    fn host_count(&self, group: usize) -> u32 {
        self.host_counts
            .iter()
            .find(|(g, _)| *g == group)
            .map_or(0, |(_, n)| *n)
    }
}

/// Reusable buffers, so checks allocate nothing.
#[derive(Debug, Default)]
struct Scratch {
    narrow: Vec<(usize, u32)>,
    options: Vec<u32>,
    candidates: Vec<u64>,
    fitted: Vec<u64>,
    reserve: Vec<i64>,
    seen: Vec<bool>,
    /// (topology key, domain) pairs the pod being placed may not go to.
    forbidden: Vec<(usize, u32)>,
    /// The reservations the claim of the last fit check may hold with the pod.
    holdable: Vec<u32>,
    /// Whether the pod being placed was refused for reserved capacity taken earlier.
    deferred: bool,
}

struct Solver<'a> {
    input: &'a Input,
    /// The pods to place.
    pods: Vec<&'a PodInfo>,
    dims: Dims,
    pools: Vec<PoolPlan>,
    topology: Topology,
    classes: Vec<Class>,
    class_index: HashMap<Constraints, usize>,
    class_pools: Vec<Vec<Option<Result<ClassPool, Why>>>>,
    bins: Vec<Bin>,
    /// Per topology key and domain: the bins that lie in it, nodes from the set-up and claims once
    /// decided (bit set over bins).
    decided: Vec<Vec<Vec<u64>>>,
    reserves: Reserves,
    /// The capacity reservations and the room left in each.
    ledger: Ledger,
    pod_class: Vec<usize>,
    requests: Vec<i64>,
    prefer_no_schedule_pools: bool,
    scratch: Scratch,
    /// Existing nodes left out of this placement (bit set over bins).
    excluded: Vec<u64>,
    /// When set, each existing node's bin as it was before this placement first changed it.
    journal: Option<Vec<(usize, Bin)>>,
    /// The existing nodes' bins this placement put a pod on, in the order it first did, so the
    /// solution is read from them and the claims rather than from every bin.
    filled: Vec<usize>,
    /// Where the bins have room, so first fit passes over full ones.
    room: room::Room,
    /// With a journal, the classes whose `rejected` set grew during this placement (repeats
    /// allowed), so a simulator resets only those.
    rejections: Vec<usize>,
    /// When set, per bin, the (group, domain) counts its node's pods add outside hostname keys.
    records: Option<Vec<Vec<(usize, u32)>>>,
    /// The last pod this placement put on a bin: its class, the pod and the bin.
    last_placed: Option<(usize, usize, usize)>,
}

/// Adds a pod's volumes to a node's, each claim once.
fn attach(on_node: &mut Vec<AttachedVolume>, pods: &[AttachedVolume]) {
    for volume in pods {
        if !on_node.contains(volume) {
            on_node.push(volume.clone());
        }
    }
}

/// Whether a pod's volumes would take some CSI driver past its attach limit on a node that
/// already attaches `on_node` (a claim already attached there takes no new slot).
fn exceeds_volume_limits(
    limits: &BTreeMap<String, u32>,
    on_node: &[AttachedVolume],
    pods: &[AttachedVolume],
) -> bool {
    if limits.is_empty() || pods.is_empty() {
        return false;
    }
    limits.iter().any(|(driver, &limit)| {
        let new = pods
            .iter()
            .filter(|v| v.driver == *driver && !on_node.contains(v))
            .count();
        new > 0 && on_node.iter().filter(|v| v.driver == *driver).count() + new > limit as usize
    })
}

fn ports_conflict(a: &[HostPort], b: &[HostPort]) -> bool {
    a.iter().any(|p| b.contains(p))
}

fn and_assign(into: &mut [u64], other: &[u64]) {
    for (x, y) in into.iter_mut().zip(other) {
        *x &= y;
    }
}

/// A pod's place in the queue ([`Solver::queue_order`]).
struct QueueKey {
    cpu: Reverse<i64>,
    memory: Reverse<i64>,
    created: i64,
    /// The UID's first 16 bytes, zero-padded, as a number: ordered as the UIDs are wherever it
    /// differs (UIDs are compared whole only where it does not).
    uid_prefix: u128,
    pod: usize,
}

/// See [`QueueKey::uid_prefix`].
fn uid_prefix(uid: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let head = &uid.as_bytes()[..uid.len().min(16)];
    bytes[..head.len()].copy_from_slice(head);
    u128::from_be_bytes(bytes)
}

impl<'a> Solver<'a> {
    fn new(input: &'a Input) -> Self {
        let pods: Vec<&'a PodInfo> = input.pods.iter().map(|pod| &**pod).collect();
        let (mut solver, classes) = Self::prepare(input, &pods, false);
        let requests = solver.request_vectors(&pods);
        solver.load(pods, classes, requests);
        solver
    }

    /// Everything but the pods to place: the NodePools, the scheduling classes of `pending` (whose
    /// classes it returns, in order), the topology of their terms, and the existing nodes as bins
    /// (remembering what each adds to non-hostname counts when `keep_records`).
    fn prepare(input: &'a Input, pending: &[&'a PodInfo], keep_records: bool) -> (Self, Vec<usize>) {
        let mut dims = Dims::default();
        let node_pods = input
            .nodes
            .iter()
            .flat_map(|node| node.pods.iter().map(|pod| &**pod));
        let all_pods = pending.iter().copied().chain(&input.daemonsets).chain(node_pods);
        dims.include_each(all_pods.map(|pod| &pod.requests));
        for pool in &input.node_pools {
            for name in pool.remaining.iter().flat_map(|r| r.keys()) {
                if name != joist_messages::model::resources::names::NODES {
                    dims.include_name(name);
                }
            }
        }
        let mut pools: Vec<PoolPlan> = crate::input::pool_order(&input.node_pools)
            .into_iter()
            .map(|i| {
                PoolPlan::new(
                    i,
                    &input.node_pools[i],
                    &input.instance_types,
                    &input.daemonsets,
                    &dims,
                )
            })
            .collect();
        let ledger = Ledger::new(&input.instance_types, input.options.reserved_offerings);
        for pool in &mut pools {
            pool.index_reservations(&ledger, &input.instance_types);
        }
        let prefer_no_schedule_pools = pools
            .iter()
            .any(|p| p.taints.iter().any(|t| t.effect == PREFER_NO_SCHEDULE));

        let base = |c: &Constraints| {
            if input.options.ignore_preferences {
                classes::without_preferences(c.clone())
            } else {
                c.clone()
            }
        };
        // Pods are told apart by their kind (the hash each took once, then a pointer or a full
        // comparison), and only one pod of each kind is copied (with its preferences dropped when
        // they are ignored, which may make two kinds one).
        let mut distinct: HashMap<Kind<'_>, usize> = HashMap::new();
        let mut kinds: Vec<&Constraints> = Vec::new();
        let mut pod_kind = Vec::with_capacity(pending.len());
        for pod in pending {
            let kind = *distinct.entry(pod.kind()).or_insert_with(|| {
                kinds.push(pod.constraints());
                kinds.len() - 1
            });
            pod_kind.push(kind);
        }
        let mut unique: Vec<Constraints> = Vec::with_capacity(kinds.len());
        let mut unique_index: HashMap<Constraints, usize> = HashMap::new();
        let kind_class: Vec<usize> = kinds
            .into_iter()
            .map(|kind| {
                let c = base(kind);
                *unique_index.entry(c).or_insert_with_key(|c| {
                    unique.push(c.clone());
                    unique.len() - 1
                })
            })
            .collect();
        let pod_constraints: Vec<usize> = pod_kind.into_iter().map(|kind| kind_class[kind]).collect();
        let topology = Topology::new(
            unique.iter(),
            input
                .nodes
                .iter()
                .flat_map(|n| n.pods.iter().map(|pod| pod.constraints())),
            &pools,
            &input.instance_types,
            &input.nodes,
            &input.namespaces,
        );
        for pool in &mut pools {
            pool.index_domains(
                topology
                    .keys
                    .iter()
                    .map(|k| (k.name.as_str(), k.hostname, k.domains.as_slice())),
                &input.instance_types,
            );
        }

        let decided = topology
            .keys
            .iter()
            .map(|k| vec![Vec::new(); k.domains.len()])
            .collect();
        let mut solver = Solver {
            input,
            pods: Vec::new(),
            dims,
            pools,
            topology,
            classes: Vec::new(),
            class_index: HashMap::new(),
            class_pools: Vec::new(),
            bins: Vec::new(),
            decided,
            reserves: Reserves::default(),
            ledger,
            pod_class: Vec::new(),
            requests: Vec::new(),
            prefer_no_schedule_pools,
            scratch: Scratch::default(),
            excluded: Vec::new(),
            journal: None,
            filled: Vec::new(),
            room: room::Room::default(),
            rejections: Vec::new(),
            records: keep_records.then(Vec::new),
            last_placed: None,
        };
        let class_of: Vec<usize> = unique.into_iter().map(|c| solver.intern(c)).collect();
        let classes = pod_constraints.into_iter().map(|i| class_of[i]).collect();
        solver.add_existing_nodes();
        (solver, classes)
    }

    /// The requests of `pods` as vectors over the solver's dimensions, one after the other.
    fn request_vectors(&self, pods: &[&'a PodInfo]) -> Vec<i64> {
        let mut requests = Vec::with_capacity(pods.len() * self.dims.len());
        let mut last = LastVector::default();
        for pod in pods {
            requests.extend_from_slice(last.of(&self.dims, &pod.requests));
        }
        requests
    }

    /// Sets the pods to place, with their scheduling classes and [`Self::request_vectors`].
    fn load(&mut self, pods: Vec<&'a PodInfo>, classes: Vec<usize>, requests: Vec<i64>) {
        self.requests = requests;
        self.pods = pods;
        self.pod_class = classes;
        self.reserves = Reserves::new(
            &self.classes,
            &self.topology,
            &self.pod_class,
            &self.requests,
            self.dims.len(),
        );
    }

    fn intern(&mut self, constraints: Constraints) -> usize {
        if let Some(&c) = self.class_index.get(&constraints) {
            return c;
        }
        let class = Class::new(constraints.clone(), &self.topology);
        self.classes.push(class);
        self.class_pools
            .push((0..self.pools.len()).map(|_| None).collect());
        self.class_index.insert(constraints, self.classes.len() - 1);
        self.classes.len() - 1
    }

    fn add_existing_nodes(&mut self) {
        let nodes = &self.input.nodes;
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by(|&a, &b| {
            nodes[b]
                .initialized
                .cmp(&nodes[a].initialized)
                .then_with(|| nodes[a].name.cmp(&nodes[b].name))
        });
        let mut counted: HashMap<Kind<'_>, Vec<usize>> = HashMap::new();
        let mut records = self.records.take();
        let mut last = LastVector::default();
        // One bin per node, sized at once: grown push by push, the bins of 10,000 nodes were
        // copied a dozen times into fresh memory on every pass.
        self.bins.reserve(nodes.len());
        for i in order {
            let mut recorded = Vec::new();
            let node = &nodes[i];
            let mut bin = Bin {
                node: Some(i),
                claim: None,
                alloc: self.dims.vector(&node.allocatable),
                used: vec![0; self.dims.len()],
                ports: Vec::new(),
                volumes: Vec::new(),
                host_counts: Vec::new(),
                domains: self
                    .topology
                    .keys
                    .iter()
                    .map(|k| node.labels.get(&k.name).and_then(|v| k.domain(v)))
                    .collect(),
                pods: Vec::new(),
            };
            for pod in &node.pods {
                dims::add(&mut bin.used, last.of(&self.dims, &pod.requests));
                bin.ports.extend(pod.constraints().host_ports.iter().copied());
                if !node.volume_limits.is_empty() {
                    attach(&mut bin.volumes, &pod.volumes);
                }
                let groups = counted
                    .entry(pod.kind())
                    .or_insert_with(|| self.topology.counted_in(pod.constraints()));
                for &g in groups.iter() {
                    let key = self.topology.groups[g].key;
                    if self.topology.keys[key].hostname {
                        add_host_count(&mut bin.host_counts, g);
                        self.topology.record_host(g);
                    } else if let Some(d) = bin.domains[key] {
                        self.topology.record(g, d);
                        recorded.push((g, d));
                    }
                }
            }
            if let Some(records) = records.as_mut() {
                records.push(recorded);
            }
            for (key, domain) in bin.domains.iter().enumerate() {
                if let Some(d) = domain {
                    bitset::insert(&mut self.decided[key][*d as usize], self.bins.len());
                }
            }
            self.bins.push(bin);
        }
        self.records = records;
        let nodes = self.bins.iter().map(|bin| (&bin.alloc[..], &bin.used[..]));
        self.room = room::Room::new(self.dims.len(), nodes);
    }

    fn pod_requests(&self, pod: usize) -> &[i64] {
        let d = self.dims.len();
        &self.requests[pod * d..(pod + 1) * d]
    }

    /// The order pods are tried in: most CPU first, then most memory, then oldest, then by UID;
    /// ties in loading order. Each pod's key is taken once, into one array, so sorting 100,000
    /// pods compares neighbouring memory rather than chasing each pod's view.
    fn queue_order(&self) -> Vec<usize> {
        let cpu = self.dims.position(joist_messages::model::resources::names::CPU);
        let memory = self
            .dims
            .position(joist_messages::model::resources::names::MEMORY);
        let d = self.dims.len();
        let amount = |pod: usize, dim: Option<usize>| dim.map_or(0, |i| self.requests[pod * d + i]);
        let mut keys: Vec<QueueKey> = (self.pods.iter().enumerate())
            .map(|(pod, info)| QueueKey {
                cpu: Reverse(amount(pod, cpu)),
                memory: Reverse(amount(pod, memory)),
                created: info.created_unix,
                uid_prefix: uid_prefix(&info.uid),
                pod,
            })
            .collect();
        keys.sort_unstable_by(|a, b| {
            (a.cpu, a.memory, a.created, a.uid_prefix)
                .cmp(&(b.cpu, b.memory, b.created, b.uid_prefix))
                .then_with(|| self.pods[a.pod].uid.cmp(&self.pods[b.pod].uid))
                .then(a.pod.cmp(&b.pod))
        });
        keys.into_iter().map(|key| key.pod).collect()
    }

    /// Places the loaded pods.
    fn place(&mut self) -> Solution {
        self.last_placed = None;
        let order = self.queue_order();
        let mut queue: VecDeque<(usize, Option<usize>)> = order.into_iter().map(|p| (p, None)).collect();
        let mut placed = 0usize;
        let mut last_class = self.pod_class.clone();
        let mut failed = Vec::new();
        while let Some((pod, mark)) = queue.pop_front() {
            if mark == Some(placed) {
                failed.push(pod);
                failed.extend(queue.drain(..).map(|(p, _)| p));
                break;
            }
            match self.schedule(pod) {
                Ok(()) => placed += 1,
                Err(class) => {
                    last_class[pod] = class;
                    queue.push_back((pod, Some(placed)));
                }
            }
        }
        failed.sort_unstable();
        let unschedulable = failed
            .into_iter()
            .map(|pod| Unschedulable {
                pod,
                reasons: self.explain(last_class[pod], pod),
            })
            .collect();
        self.finish(unschedulable)
    }

    /// Places `pod`, relaxing preferences as needed; on failure returns its most relaxed class.
    fn schedule(&mut self, pod: usize) -> Result<(), usize> {
        let mut class = self.pod_class[pod];
        self.scratch.deferred = false;
        loop {
            if self.try_class(class, pod) {
                return Ok(());
            }
            // Reserved capacity may be had next batch: the pod waits as it is (Karpenter's
            // strict mode neither relaxes it nor tries lower-weight NodePools).
            if self.scratch.deferred {
                return Err(class);
            }
            let next = match self.classes[class].relaxed {
                Some(next) => next,
                None => {
                    let next =
                        classes::relax(&self.classes[class].constraints, self.prefer_no_schedule_pools)
                            .map(|c| self.intern(c));
                    self.classes[class].relaxed = Some(next);
                    next
                }
            };
            match next {
                Some(next) => class = next,
                None => return Err(class),
            }
        }
    }

    fn try_class(&mut self, class: usize, pod: usize) -> bool {
        if self.try_bins(class, pod) {
            return true;
        }
        for pool in 0..self.pools.len() {
            match self.fit_new(class, pod, pool) {
                Ok(()) => {
                    self.open_claim(class, pod, pool);
                    return true;
                }
                Err(Why::ReservedCapacity) => {
                    self.scratch.deferred = true;
                    return false;
                }
                Err(_) => {}
            }
        }
        false
    }

    /// Tries the existing nodes in order and then the claims opened so far, oldest first (the
    /// least loaded first for a pod that pins its node: [`Self::try_bins_pinning`]), skipping
    /// those that rejected the class for good and those without room for the pod.
    fn try_bins(&mut self, class: usize, pod: usize) -> bool {
        self.forbid_domains(class);
        if self.classes[class].constraints.pins_node {
            return self.try_bins_pinning(class, pod);
        }
        let mut next = self.first_bin_to_try(class, pod);
        while let Some(b) = self.next_bin_to_check(class, pod, next) {
            next = b + 1;
            if self.try_bin(class, pod, b) {
                return true;
            }
        }
        false
    }

    /// The first bin from `from` on that is open to `class` and has room for `pod`. Two ways to
    /// pass over bins, taken in turn: the bit sets skip a word of bins closed to the class at a
    /// time, the room index skips bins without room for the pod.
    fn next_bin_to_check(&self, class: usize, pod: usize, mut from: usize) -> Option<usize> {
        loop {
            let first_open = self.next_open_bin(class, from)?;
            match self.room.next_fit(first_open, self.pod_requests(pod))? {
                b if b == first_open => return Some(b),
                b => from = b,
            }
        }
    }

    /// [`Self::try_bins`] for a pod that pins its node: the existing nodes in order, then, of the
    /// open claims that can take it, the one holding the least CPU so far (the oldest of equals).
    /// What the pod pins is the node it lands on; beside a small claim's pods that node stays
    /// small, where beside large pods it would keep a large node and their room for good.
    fn try_bins_pinning(&mut self, class: usize, pod: usize) -> bool {
        let cpu = self.dims.position(joist_messages::model::resources::names::CPU);
        let mut least: Option<(i64, usize)> = None;
        let mut next = 0;
        while let Some(b) = self.next_bin_to_check(class, pod, next) {
            next = b + 1;
            if self.bins[b].claim.is_none() {
                if self.try_bin(class, pod, b) {
                    return true;
                }
            } else if self.fits(class, pod, b) {
                let held = cpu.map_or(0, |i| self.bins[b].used[i]);
                if least.is_none_or(|(least_held, _)| held < least_held) {
                    least = Some((held, b));
                }
            }
        }
        // Checked again, so the narrowing the commit applies is this claim's.
        least.is_some_and(|(_, b)| self.try_bin(class, pod, b))
    }

    /// Where the search for a bin for `pod` at `class` starts: where the pod placed last went when
    /// it is alike (the same class, the same shared requests) and that placement cannot have made
    /// a bin before that one take this pod. That holds when only room and limits changed, and
    /// only tightened (a claim giving up types gives back limits: [`Self::commit`] forgets the
    /// last placement then): the class counts in no topology group and checks none, no room is
    /// kept for exclusive pods, no capacity reservation is held, and neither pod attaches a volume
    /// (a node at its attach limit may take a pod whose volume it already holds). A run of 100,000
    /// replicas then passes over the full bins once rather than once per pod.
    fn first_bin_to_try(&self, class: usize, pod: usize) -> usize {
        let Some((last_class, last_pod, bin)) = self.last_placed else {
            return 0;
        };
        let c = &self.classes[class];
        let alike =
            last_class == class && Arc::ptr_eq(&self.pods[last_pod].requests, &self.pods[pod].requests);
        let only_room_changed = c.checks.is_empty()
            && c.counted_in.is_empty()
            && self.reserves.is_empty()
            && self.ledger.is_empty()
            && self.pods[pod].volumes.is_empty()
            && self.pods[last_pod].volumes.is_empty();
        if alike && only_room_changed { bin } else { 0 }
    }

    /// The first bin from `from` on that is open to `class`: not rejected for good, not left out,
    /// not in a domain of `self.scratch.forbidden`.
    fn next_open_bin(&self, class: usize, from: usize) -> Option<usize> {
        let end = self.bins.len();
        (from / 64..end.div_ceil(64)).find_map(|word| {
            let open = self.open_bins(class, word, from.max(word * 64), end) & !self.forbidden_in(word);
            (open != 0).then(|| word * 64 + open.trailing_zeros() as usize)
        })
    }

    /// Puts in `self.scratch.forbidden` the (topology key, domain) pairs `class` may not go to
    /// as the counts stand.
    fn forbid_domains(&mut self, class: usize) {
        let c = &self.classes[class];
        let topology = &self.topology;
        let forbidden = &mut self.scratch.forbidden;
        forbidden.clear();
        for &key in &c.keys {
            let on_key = || c.checks.iter().filter(|ch| topology.groups[ch.group].key == key);
            for d in 0..topology.keys[key].domains.len() as u32 {
                if on_key().any(|ch| !topology.allows(ch, Domain::Value(d))) {
                    forbidden.push((key, d));
                }
            }
        }
    }

    /// The bins in word `word` that lie in a domain of `self.scratch.forbidden`.
    fn forbidden_in(&self, word: usize) -> u64 {
        self.scratch
            .forbidden
            .iter()
            .map(|&(key, d)| self.decided[key][d as usize].get(word).copied().unwrap_or(0))
            .fold(0, |all, bits| all | bits)
    }

    /// The bins in word `word` that lie in `lo..hi` and have not rejected `class` for good.
    fn open_bins(&self, class: usize, word: usize, lo: usize, hi: usize) -> u64 {
        let rejected = self.classes[class].rejected.get(word).copied().unwrap_or(0)
            | self.excluded.get(word).copied().unwrap_or(0);
        let range = |bound: usize| match bound.saturating_sub(word * 64) {
            0 => 0,
            n if n >= 64 => u64::MAX,
            n => (1u64 << n) - 1,
        };
        !rejected & range(hi) & !range(lo)
    }

    /// Places `pod` on bin `b` if it fits; remembers a rejection that holds for good.
    fn try_bin(&mut self, class: usize, pod: usize, b: usize) -> bool {
        let fits = self.fits(class, pod, b);
        if fits {
            self.commit(class, pod, b);
        }
        fits
    }

    /// Whether bin `b` can take `pod` of `class`, leaving in `self.scratch` what a commit to it
    /// applies; a bin that rejects the class for good is marked so.
    fn fits(&mut self, class: usize, pod: usize, b: usize) -> bool {
        let result = if self.bins[b].claim.is_some() {
            self.fit_claim(class, pod, b)
        } else {
            self.fit_node(class, pod, b)
        };
        match result {
            Ok(()) => true,
            Err((_, true)) => {
                bitset::insert(&mut self.classes[class].rejected, b);
                if self.journal.is_some() {
                    self.rejections.push(class);
                }
                false
            }
            Err(_) => false,
        }
    }

    fn class_pool(&mut self, class: usize, pool: usize) -> Result<&ClassPool, Why> {
        if self.class_pools[class][pool].is_none() {
            let computed = self.compute_class_pool(class, pool);
            self.class_pools[class][pool] = Some(computed);
        }
        match self.class_pools[class][pool].as_ref() {
            Some(Ok(cp)) => Ok(cp),
            Some(Err(why)) => Err(*why),
            None => Err(Why::Requirements),
        }
    }

    fn compute_class_pool(&self, class: usize, pool: usize) -> Result<ClassPool, Why> {
        let (c, p) = (&self.classes[class], &self.pools[pool]);
        if let Some(t) = first_untolerated(&c.constraints.tolerations, &p.taints) {
            let i = p.taints.iter().position(|x| std::ptr::eq(x, t)).unwrap_or(0);
            return Err(Why::Taint(i));
        }
        p.requirements
            .compatible(&c.node_reqs, is_well_known)
            .map_err(|_| Why::Requirements)?;
        if ports_conflict(&c.constraints.host_ports, &p.daemon_ports) {
            let port = c
                .constraints
                .host_ports
                .iter()
                .find(|x| p.daemon_ports.contains(x));
            return Err(Why::HostPort(port.map_or(0, |x| x.port)));
        }
        let mut reqs = p.requirements.clone();
        reqs.add_all(&c.node_reqs);
        let mut candidates = p.all.clone();
        if !c.node_reqs.is_empty() {
            for t in bitset::members(&p.all) {
                if !catalog::type_allowed(&self.input.instance_types[p.types[t]], &reqs) {
                    bitset::remove(&mut candidates, t);
                }
            }
        }
        if bitset::is_empty(&candidates) {
            return Err(Why::Resources);
        }
        Ok(ClassPool { reqs, candidates })
    }

    /// Whether node bin `b` refuses `class` whatever else is placed or left out of the cluster:
    /// a taint, its labels, a host port in use, or a topology rule the bin decides alone
    /// (hostname anti-affinity and spread, which count the bin's own pods; a missing topology
    /// label). Placing pods elsewhere or leaving other nodes out changes none of these.
    fn refuses_alone(&self, class: usize, b: usize) -> bool {
        let bin = &self.bins[b];
        let Some(node) = bin.node.map(|n| &self.input.nodes[n]) else {
            return false;
        };
        let c = &self.classes[class];
        let topology = &self.topology;
        let refused_by_topology = c.checks.iter().any(|check| {
            let key = topology.groups[check.group].key;
            let domain = if topology.keys[key].hostname {
                Domain::Host(bin.host_count(check.group))
            } else {
                bin.domains[key].map_or(Domain::Absent, Domain::Value)
            };
            let decided_alone = matches!(
                (&check.rule, domain),
                (Rule::Anti | Rule::Spread { .. }, Domain::Host(_)) | (_, Domain::Absent)
            );
            decided_alone && !topology.allows(check, domain)
        });
        first_untolerated(&c.constraints.tolerations, &node.taints).is_some()
            || !c
                .node_reqs
                .matches_labels(|k| node.labels.get(k).map(String::as_str))
            || c.constraints.host_ports.iter().any(|p| bin.ports.contains(p))
            || refused_by_topology
    }

    fn fit_node(&mut self, class: usize, pod: usize, b: usize) -> Result<(), Reject> {
        let bin = &self.bins[b];
        let node = &self.input.nodes[bin.node.unwrap_or_default()];
        let c = &self.classes[class];
        if let Some(t) = first_untolerated(&c.constraints.tolerations, &node.taints) {
            let i = node.taints.iter().position(|x| std::ptr::eq(x, t)).unwrap_or(0);
            return Err((Why::Taint(i), true));
        }
        if !c
            .node_reqs
            .matches_labels(|k| node.labels.get(k).map(String::as_str))
        {
            return Err((Why::Requirements, true));
        }
        if let Some(port) = c.constraints.host_ports.iter().find(|p| bin.ports.contains(p)) {
            return Err((Why::HostPort(port.port), true));
        }
        let topology = &self.topology;
        for (i, check) in c.checks.iter().enumerate() {
            let key = topology.groups[check.group].key;
            let domain = if topology.keys[key].hostname {
                Domain::Host(bin.host_count(check.group))
            } else {
                bin.domains[key].map_or(Domain::Absent, Domain::Value)
            };
            if !topology.allows(check, domain) {
                return Err((Why::Topology(i), Topology::failure_is_permanent(check, domain)));
            }
        }
        if !dims::fits(&bin.used, self.pod_requests(pod), &bin.alloc) {
            return Err((Why::Resources, false));
        }
        // Attach slots are a node's resource too; only existing nodes know theirs.
        if exceeds_volume_limits(&node.volume_limits, &bin.volumes, &self.pods[pod].volumes) {
            return Err((Why::Resources, false));
        }
        Ok(())
    }

    /// Checks the class's topology on a claim (open, or about to be opened from `pool` with
    /// `reqs`, `candidates` in `self.scratch.candidates`), choosing domains for undecided keys
    /// into `self.scratch.narrow`.
    fn fit_claim_topology(
        &mut self,
        class: usize,
        pool: usize,
        reqs: &Requirements,
        domains: Option<&[Option<u32>]>,
        host_count: impl Fn(usize) -> u32,
    ) -> Result<(), Reject> {
        let c = &self.classes[class];
        let topology = &self.topology;
        let scratch = &mut self.scratch;
        scratch.narrow.clear();
        for (i, check) in c.checks.iter().enumerate() {
            let key = topology.groups[check.group].key;
            if topology.keys[key].hostname {
                let domain = Domain::Host(host_count(check.group));
                if !topology.allows(check, domain) {
                    return Err((Why::Topology(i), Topology::failure_is_permanent(check, domain)));
                }
            }
        }
        for &key in &c.keys {
            let k = &topology.keys[key];
            let decided = match domains {
                Some(domains) => domains[key],
                None => decided_domain(reqs, k),
            };
            let on_key = || {
                c.checks
                    .iter()
                    .enumerate()
                    .filter(move |(_, ch)| topology.groups[ch.group].key == key)
            };
            if let Some(d) = decided {
                if let Some((i, check)) = on_key().find(|(_, ch)| !topology.allows(ch, Domain::Value(d))) {
                    return Err((
                        Why::Topology(i),
                        Topology::failure_is_permanent(check, Domain::Value(d)),
                    ));
                }
                continue;
            }
            scratch.options.clear();
            let claim_req = reqs.get(&k.name);
            let class_req = c.node_reqs.get(&k.name);
            for (d, value) in k.domains.iter().enumerate() {
                if claim_req.is_none_or(|r| r.has(value))
                    && class_req.is_none_or(|r| r.has(value))
                    && bitset::intersects(&scratch.candidates, self.pools[pool].domain_set(key, d as u32))
                {
                    scratch.options.push(d as u32);
                }
            }
            let (first, first_check) = on_key().next().map_or((0, None), |(i, ch)| (i, Some(ch)));
            if let Some(check) = first_check {
                scratch.options.sort_by_key(|&d| topology.preference(check, d));
            }
            let chosen = scratch
                .options
                .iter()
                .copied()
                .find(|&d| on_key().all(|(_, ch)| topology.allows(ch, Domain::Value(d))));
            match chosen {
                Some(d) => {
                    and_assign(&mut scratch.candidates, self.pools[pool].domain_set(key, d));
                    scratch.narrow.push((key, d));
                }
                None => return Err((Why::Topology(first), false)),
            }
        }
        Ok(())
    }

    /// Puts in `self.scratch.holdable` the reservations a claim holding `held`, with requirements
    /// `reqs` and the class's, the domains in `self.scratch.narrow` and the candidates in
    /// `self.scratch.fitted`, may hold once it takes the pod; in strict mode refuses the pod when
    /// the claim could use some but may hold none (see [`crate::reservations`]).
    fn fit_reservations(
        &mut self,
        class: usize,
        pool: usize,
        reqs: &Requirements,
        held: &[u32],
    ) -> Result<(), Reject> {
        let Scratch {
            narrow,
            fitted,
            holdable,
            ..
        } = &mut self.scratch;
        if self.ledger.is_empty() {
            holdable.clear();
            return Ok(());
        }
        let node_reqs = &self.classes[class].node_reqs;
        let keys = &self.topology.keys;
        let in_narrowed_domains = |o: &Offering| {
            narrow.iter().all(|&(key, d)| {
                let k = &keys[key];
                let value = k.domains[d as usize].as_str();
                match k.name.as_str() {
                    ZONE => o.zone == value,
                    CAPACITY_TYPE => o.capacity_type.label() == value,
                    _ => true,
                }
            })
        };
        let allowed = |o: &Offering| o.allowed_by(reqs) && o.allowed_by(node_reqs) && in_narrowed_domains(o);
        let compatible =
            self.pools[pool].reservations_of(fitted, &self.input.instance_types, allowed, holdable);
        holdable.retain(|&r| self.ledger.can_hold(r, held));
        if self.ledger.allows(held, compatible, holdable) {
            Ok(())
        } else {
            Err((Why::ReservedCapacity, false))
        }
    }

    /// Keeps the candidates in `self.scratch.candidates` that fit `used + pod` (`used` empty for a
    /// new claim) into `self.scratch.fitted`, then checks `minValues`.
    fn fit_resources(&mut self, pool: usize, used: &[i64], pod: usize) -> Result<(), Reject> {
        let d = self.dims.len();
        let p = &self.pools[pool];
        let request = &self.requests[pod * d..(pod + 1) * d];
        let scratch = &mut self.scratch;
        scratch.fitted.clear();
        scratch.fitted.extend_from_slice(&scratch.candidates);
        p.keep_with_room(used, request, &mut scratch.fitted);
        if bitset::is_empty(&scratch.fitted) {
            return Err((Why::Resources, false));
        }
        if self.input.options.min_values == MinValuesPolicy::Strict
            && let Some((key, _, found)) = p.min_values_shortfall(&scratch.fitted, &mut scratch.seen)
        {
            let i = p.min_values.iter().position(|m| m.key == key).unwrap_or(0);
            return Err((Why::MinValues(i, found), false));
        }
        Ok(())
    }

    fn fit_claim(&mut self, class: usize, pod: usize, b: usize) -> Result<(), Reject> {
        let pool = self.bins[b].claim.as_ref().map_or(0, |c| c.pool);
        if let Err(why) = self.class_pool(class, pool) {
            return Err((why, true));
        }
        let bin = &self.bins[b];
        let claim = bin.claim.as_ref().ok_or((Why::Requirements, true))?;
        let c = &self.classes[class];
        if let Some(port) = c.constraints.host_ports.iter().find(|p| bin.ports.contains(p)) {
            return Err((Why::HostPort(port.port), true));
        }
        // A claim last narrowed by this class holds only what the class allows: no conflict.
        if claim.narrowed_by != Some(class) && !claim.reqs.overlaps(&c.node_reqs) {
            return Err((Why::Requirements, true));
        }
        self.scratch.candidates.clear();
        self.scratch.candidates.extend_from_slice(&claim.candidates);
        if let Some(Some(Ok(cp))) = self.class_pools[class].get(pool) {
            and_assign(&mut self.scratch.candidates, &cp.candidates);
        }
        if !self.pools[pool].keep_affordable(&claim.reserved, &mut self.scratch.candidates) {
            return Err((Why::Limits, false));
        }
        let bins = std::mem::take(&mut self.bins);
        let bin = &bins[b];
        let claim_reqs = bin.claim.as_ref().map(|c| &c.reqs).unwrap_or(&EMPTY);
        let topology = self
            .fit_claim_topology(class, pool, claim_reqs, Some(&bin.domains), |g| bin.host_count(g))
            .and_then(|()| {
                let request = self.pod_requests(pod);
                let room_kept = || {
                    self.reserves.leaves_room(
                        bins.len() - self.input.nodes.len(),
                        &self.classes[class].counted_in,
                        |g| bin.host_count(g),
                        &bin.used,
                        request,
                        &bin.alloc,
                    )
                };
                if dims::fits(&bin.used, request, &bin.alloc) && room_kept() {
                    Ok(())
                } else {
                    Err((Why::Resources, false))
                }
            });
        let held = bin.claim.as_ref().map_or(&[][..], |c| &c.held[..]);
        let resources = topology
            .and_then(|()| self.fit_resources(pool, &bin.used, pod))
            .and_then(|()| self.fit_reservations(class, pool, claim_reqs, held));
        self.bins = bins;
        resources
    }

    fn fit_new(&mut self, class: usize, pod: usize, pool: usize) -> Result<(), Why> {
        self.class_pool(class, pool)?;
        let p = &self.pools[pool];
        if p.remaining_nodes.is_some_and(|n| n < 1) {
            return Err(Why::Limits);
        }
        let Some(Some(Ok(cp))) = self.class_pools[class].get(pool) else {
            return Err(Why::Requirements);
        };
        self.scratch.candidates.clear();
        self.scratch.candidates.extend_from_slice(&cp.candidates);
        if !p.keep_affordable(&[], &mut self.scratch.candidates) {
            return Err(Why::Limits);
        }
        let reqs = std::mem::take(&mut self.class_pools[class][pool]);
        let result = match &reqs {
            Some(Ok(cp)) => self
                .fit_claim_topology(class, pool, &cp.reqs, None, |_| 0)
                .and_then(|()| self.fit_resources(pool, &[], pod))
                .and_then(|()| self.fit_reservations(class, pool, &cp.reqs, &[])),
            _ => Err((Why::Requirements, true)),
        };
        self.class_pools[class][pool] = reqs;
        result.map_err(|(why, _)| why)
    }

    fn open_claim(&mut self, class: usize, pod: usize, pool: usize) {
        let Some(Some(Ok(cp))) = self.class_pools[class].get(pool) else {
            return;
        };
        let reqs = cp.reqs.clone();
        let d = self.dims.len();
        let p = &mut self.pools[pool];
        if let Some(n) = p.remaining_nodes.as_mut() {
            *n -= 1;
        }
        let domains: Vec<Option<u32>> = self
            .topology
            .keys
            .iter()
            .map(|k| {
                if k.hostname {
                    None
                } else {
                    decided_domain(&reqs, k)
                }
            })
            .collect();
        let b = self.bins.len();
        for (key, domain) in domains.iter().enumerate() {
            if let Some(d) = domain {
                bitset::insert(&mut self.decided[key][*d as usize], b);
            }
        }
        self.bins.push(Bin {
            node: None,
            claim: Some(Claim {
                pool,
                reqs,
                candidates: Vec::new(),
                reserved: Vec::new(),
                pending: Vec::new(),
                held: Vec::new(),
                narrowed_by: None,
            }),
            alloc: vec![0; d],
            used: vec![0; d],
            ports: p.daemon_ports.clone(),
            volumes: Vec::new(),
            host_counts: Vec::new(),
            domains,
            pods: Vec::new(),
        });
        self.room.push(&[], &[]);
        self.commit(class, pod, b);
    }

    /// Adds `pod` to bin `b`, applying the narrowing and candidates the last fit check left in
    /// `self.scratch`, and records it in its topology groups.
    fn commit(&mut self, class: usize, pod: usize, b: usize) {
        // A node's bin starts a placement with no pod (the simulator's set-up places none) and
        // only this adds one: the first pod is when to note it and save it.
        if b < self.input.nodes.len() && self.bins[b].pods.is_empty() {
            self.filled.push(b);
            if let Some(journal) = self.journal.as_mut() {
                journal.push((b, self.bins[b].clone()));
            }
        }
        self.reserves.placed(self.pod_class[pod]);
        self.last_placed = Some((class, pod, b));
        let d = self.dims.len();
        let bin = &mut self.bins[b];
        dims::add(&mut bin.used, &self.requests[pod * d..(pod + 1) * d]);
        let c = &self.classes[class];
        bin.ports.extend(c.constraints.host_ports.iter().copied());
        if let Some(node) = bin.node
            && !self.input.nodes[node].volume_limits.is_empty()
        {
            attach(&mut bin.volumes, &self.pods[pod].volumes);
        }
        bin.pods.push(pod);
        if let Some(claim) = bin.claim.as_mut() {
            let p = &mut self.pools[claim.pool];
            if claim.candidates != self.scratch.fitted {
                // What a claim reserves of its NodePool's limits follows from its candidates
                // alone, so it changes only when they do (most pods joining a claim leave them as
                // they were).
                if p.remaining.is_some() {
                    let reserve = &mut self.scratch.reserve;
                    reserve.clear();
                    reserve.resize(d, 0);
                    for t in bitset::members(&self.scratch.fitted).take(LAUNCH_OPTIONS) {
                        dims::max_assign(reserve, p.capacity_of(t, d));
                    }
                    claim.reserved.resize(d, 0);
                    if reserve.iter().zip(&claim.reserved).any(|(new, old)| new < old) {
                        // The pool's limits loosen: a bin that refused the last pod on them may
                        // take the next, so its search starts over.
                        self.last_placed = None;
                    }
                    if let Some(remaining) = p.remaining.as_mut() {
                        dims::add(remaining, &claim.reserved);
                        dims::sub(remaining, reserve);
                    }
                    claim.reserved.clear();
                    claim.reserved.extend_from_slice(reserve);
                }
                claim.candidates.clear();
                claim.candidates.extend_from_slice(&self.scratch.fitted);
                bin.alloc.iter_mut().for_each(|a| *a = 0);
                for t in bitset::members(&claim.candidates) {
                    dims::max_assign(&mut bin.alloc, p.alloc_of(t, d));
                }
            }
            if !self.ledger.is_empty() {
                self.ledger.rehold(&mut claim.held, &self.scratch.holdable);
            }
            if claim.narrowed_by != Some(class) {
                claim.reqs.add_all(&c.node_reqs);
                claim.narrowed_by = Some(class);
            }
            for &(key, domain) in &self.scratch.narrow {
                let k = &self.topology.keys[key];
                if let Ok(r) = Requirement::new(&k.name, Operator::In, [k.domains[domain as usize].as_str()])
                {
                    claim.reqs.add(r);
                }
                bin.domains[key] = Some(domain);
                bitset::insert(&mut self.decided[key][domain as usize], b);
                let topology = &mut self.topology;
                claim.pending.retain(|&(g, n)| {
                    if topology.groups[g].key != key {
                        return true;
                    }
                    for _ in 0..n {
                        topology.record(g, domain);
                    }
                    false
                });
            }
        }
        self.room.update(b, &bin.alloc, &bin.used);
        for &g in &c.counted_in {
            let group = &self.topology.groups[g];
            let key = group.key;
            let kind = group.kind;
            if self.topology.keys[key].hostname {
                add_host_count(&mut bin.host_counts, g);
                self.topology.record_host(g);
                if bin.claim.is_some() && bin.host_count(g) == 1 {
                    self.reserves.claim_taken(g);
                }
                continue;
            }
            match (bin.domains[key], bin.claim.as_mut()) {
                (Some(domain), _) => self.topology.record(g, domain),
                (None, None) => {}
                (None, Some(claim)) if kind == GroupKind::Selected => add_host_count(&mut claim.pending, g),
                (None, Some(claim)) => {
                    // Anti-affinity must assume the claim may land in any domain it still allows.
                    let k = &self.topology.keys[key];
                    let allowed = &mut self.scratch.options;
                    allowed.clear();
                    allowed.extend((0..k.domains.len() as u32).filter(|&dd| {
                        claim
                            .reqs
                            .get(&k.name)
                            .is_none_or(|r| r.has(&k.domains[dd as usize]))
                    }));
                    for &dd in allowed.iter() {
                        self.topology.record(g, dd);
                    }
                }
            }
        }
    }

    /// Why `pod` (at relaxation `class`) fits no NodePool, per NodePool.
    fn explain(&mut self, class: usize, pod: usize) -> Vec<(String, Reason)> {
        (0..self.pools.len())
            .map(|pool| {
                let why = self.fit_new(class, pod, pool).err().unwrap_or(Why::Resources);
                let reason = self.reason(class, pod, pool, why);
                (self.pools[pool].name.clone(), reason)
            })
            .collect()
    }

    fn reason(&self, class: usize, pod: usize, pool: usize, why: Why) -> Reason {
        let p = &self.pools[pool];
        let c = &self.classes[class];
        match why {
            Why::Taint(i) => Reason::Taint {
                taint: p.taints.get(i).map_or_else(String::new, |t| {
                    format!(
                        "{}={}:{}",
                        t.key,
                        t.value.as_deref().unwrap_or_default(),
                        t.effect
                    )
                }),
            },
            Why::Requirements => match p.requirements.compatible(&c.node_reqs, is_well_known) {
                Err(incompatibility) => Reason::Requirements(incompatibility),
                Ok(()) => Reason::NoInstanceType {
                    requests: Resources::clone(&self.pods[pod].requests),
                },
            },
            Why::HostPort(port) => Reason::HostPort { port },
            Why::Resources => Reason::NoInstanceType {
                requests: Resources::clone(&self.pods[pod].requests),
            },
            Why::Limits => {
                let mut resources: Vec<String> = Vec::new();
                if p.remaining_nodes.is_some_and(|n| n < 1) {
                    resources.push("nodes".to_string());
                }
                if let Some(remaining) = &p.remaining {
                    let d = self.dims.len();
                    for (i, r) in remaining.iter().enumerate() {
                        if (0..p.types.len()).all(|t| p.capacity_of(t, d)[i] > *r) {
                            resources.push(self.dims.name(i).to_string());
                        }
                    }
                }
                Reason::Limits { resources }
            }
            Why::Topology(i) => Reason::Topology {
                constraint: c
                    .checks
                    .get(i)
                    .map_or_else(String::new, |check| self.topology.describe(check)),
            },
            Why::MinValues(i, found) => Reason::MinValues {
                key: p.min_values.get(i).map_or_else(String::new, |m| m.key.clone()),
                needed: p.min_values.get(i).map_or(0, |m| m.needed),
                found,
            },
            Why::ReservedCapacity => Reason::ReservedCapacity,
        }
    }

    fn finish(&self, mut unschedulable: Vec<Unschedulable>) -> Solution {
        let mut solution = Solution::default();
        let catalog: &[Arc<InstanceType>] = &self.input.instance_types;
        let mut filled = self.filled.clone();
        filled.sort_unstable();
        let claims = &self.bins[self.input.nodes.len()..];
        for bin in filled.iter().map(|&b| &self.bins[b]).chain(claims) {
            if let Some(node) = bin.node {
                solution
                    .placements
                    .extend(bin.pods.iter().map(|&pod| Placement { pod, node }));
                continue;
            }
            let Some(claim) = &bin.claim else { continue };
            let p = &self.pools[claim.pool];
            let requirements = self.ledger.narrow(&claim.reqs, &claim.held);
            let mask = p.offering_mask(&requirements);
            let mut priced: Vec<(f64, usize, usize)> = bitset::members(&claim.candidates)
                .filter_map(|t| p.price_within(t, mask).map(|price| (price, p.types[t], t)))
                .collect();
            priced.sort_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then_with(|| catalog[a.1].name.cmp(&catalog[b.1].name))
            });
            priced.truncate(MAX_INSTANCE_TYPES);
            let mut kept = vec![0u64; claim.candidates.len()];
            for &(_, _, t) in &priced {
                kept[t / 64] |= 1 << (t % 64);
            }
            let shortfall = (self.input.options.min_values == MinValuesPolicy::Strict)
                .then(|| p.min_values_shortfall(&kept, &mut Vec::new()))
                .flatten();
            if priced.is_empty() || shortfall.is_some() {
                let reason = match shortfall {
                    Some((key, needed, found)) => Reason::MinValues {
                        key: key.to_string(),
                        needed,
                        found,
                    },
                    None => Reason::NoInstanceType {
                        requests: self.dims.resources(&bin.used),
                    },
                };
                unschedulable.extend(bin.pods.iter().map(|&pod| Unschedulable {
                    pod,
                    reasons: vec![(p.name.clone(), reason.clone())],
                }));
                continue;
            }
            solution.claims.push(NewClaim {
                node_pool: p.input,
                requirements,
                instance_types: priced.iter().map(|&(_, i, _)| i).collect(),
                price: priced[0].0,
                requests: self.dims.resources(&bin.used),
                pods: bin.pods.clone(),
            });
        }
        unschedulable.sort_by_key(|u| u.pod);
        solution.unschedulable = unschedulable;
        solution
    }
}

static EMPTY: Requirements = Requirements::new();

/// The domain `reqs` pins `key` to, when it allows exactly one known value.
fn decided_domain(reqs: &Requirements, key: &crate::topology::TopologyKey) -> Option<u32> {
    let r = reqs.get(&key.name)?;
    if r.len() != Some(1) {
        return None;
    }
    r.values().next().and_then(|v| key.domain(v))
}

/// Adds one to the count of `group` in a small per-node list.
fn add_host_count(counts: &mut Vec<(usize, u32)>, group: usize) {
    match counts.iter_mut().find(|(g, _)| *g == group) {
        Some((_, n)) => *n += 1,
        None => counts.push((group, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::uid_prefix;

    #[test]
    fn uid_prefixes_order_as_the_uids_do_wherever_they_differ() {
        let uids = [
            "",
            "a",
            "ab",
            "Ab",
            "b",
            "a\u{e9}",
            "0123456789abcdef",
            "0123456789abcdeg",
            "0123456789abcdef0",
            "0123456789abcdef1",
            "9d2c6a4e-0000-4000-8000-000000000001",
            "9d2c6a4e-0000-4000-8000-000000000002",
        ];
        for a in uids {
            for b in uids {
                let (pa, pb) = (uid_prefix(a), uid_prefix(b));
                if pa != pb {
                    assert_eq!(pa.cmp(&pb), a.cmp(b), "{a:?} against {b:?}");
                } else {
                    assert_eq!(
                        a.get(..16),
                        b.get(..16),
                        "{a:?} and {b:?} share their first 16 bytes"
                    );
                }
            }
        }
    }
}

//! One cluster, many placements: the solver's set-up done once, each placement a change to it.
//!
//! Consolidation asks the same question of every candidate: where would these pods go if these
//! nodes were gone? Setting up the solver (NodePools, scheduling classes, topology groups and
//! counts, one bin per node) costs time proportional to the cluster, far more than placing a
//! candidate's few pods. A [`Simulator`] sets up once over the cluster and every pod it may be
//! asked to place, then answers each question by leaving the nodes out (their pods' topology
//! counts taken away, their bins skipped, what they held of their NodePools' limits given back),
//! placing the pods, and undoing every change: the bins the placement touched are restored from a
//! journal, opened claims dropped, and topology counts, NodePool limits and the room in capacity
//! reservations put back from the state after set-up. A placement starts with the nodes that
//! refuse a pod's class whatever is placed or left out (taints, labels, hostname anti-affinity:
//! found once per class) already rejected, so each candidate costs the nodes that might take its
//! pods, not every node.
//!
//! Nodes can also be closed for good ([`Simulator::close`]): consolidation moves no pod onto a
//! node still inside its `consolidateAfter` window, though the node stays in the cluster.
//!
//! Failure modes: none; a node left out only ever makes the simulation stricter where a domain
//! existed only through it (its zone stays a domain with no pods).

use super::Solver;
use crate::{
    bitset, consolidation::Held, dims, input::Input, pod::PodInfo, solution::Solution, topology::Counts,
};

/// The solver set up once over a cluster (see the module docs).
pub(crate) struct Simulator<'a> {
    solver: Solver<'a>,
    /// Every pod a placement may ask for, and its scheduling class.
    pending: Vec<(&'a PodInfo, usize)>,
    /// Their requests, as the solver's vectors (see [`Solver::request_vectors`]).
    requests: Vec<i64>,
    /// Per node (position in `Input::nodes`), its bin.
    bin_of_node: Vec<usize>,
    /// Topology counts after set-up.
    counts: Counts,
    /// NodePool limits after set-up: remaining resources and nodes.
    limits: Vec<(Option<Vec<i64>>, Option<i64>)>,
    /// The room in each capacity reservation after set-up.
    reservation_room: Vec<u32>,
    /// Bins no pod may be placed on in any placement (see [`Simulator::close`]).
    closed: Vec<u64>,
    /// Per scheduling class, once a placement needed it: the node bins that refuse the class
    /// whatever the placement (see [`Solver::refuses_alone`]), so that each placement starts
    /// with them rejected instead of trying every node again.
    refused_alone: Vec<Option<Vec<u64>>>,
}

impl<'a> Simulator<'a> {
    /// Sets up the solver over `input` (its `pods` are ignored) for placements of `pending`.
    pub(crate) fn new(input: &'a Input, pending: Vec<&'a PodInfo>) -> Self {
        let (mut solver, classes) = Solver::prepare(input, &pending, true);
        solver.journal = Some(Vec::new());
        let mut bin_of_node = vec![0; input.nodes.len()];
        for (b, bin) in solver.bins.iter().enumerate() {
            if let Some(node) = bin.node {
                bin_of_node[node] = b;
            }
        }
        Simulator {
            requests: solver.request_vectors(&pending),
            counts: solver.topology.counts(),
            limits: solver
                .pools
                .iter()
                .map(|p| (p.remaining.clone(), p.remaining_nodes))
                .collect(),
            reservation_room: solver.ledger.room().to_vec(),
            pending: pending.into_iter().zip(classes).collect(),
            bin_of_node,
            closed: Vec::new(),
            refused_alone: vec![None; solver.classes.len()],
            solver,
        }
    }

    /// Closes `nodes` (positions in `Input::nodes`) to every later placement: no pod goes there,
    /// while their own pods stay and keep counting for topology.
    pub(crate) fn close(&mut self, nodes: &[usize]) {
        self.closed.resize(self.solver.bins.len().div_ceil(64), 0);
        for &node in nodes {
            bitset::insert(&mut self.closed, self.bin_of_node[node]);
            self.solver.room.remove(self.bin_of_node[node]);
        }
        self.solver.excluded.clone_from(&self.closed);
    }

    /// A pod `new` was given, by position.
    pub(crate) fn pod(&self, pod: usize) -> &'a PodInfo {
        self.pending[pod].0
    }

    /// Places `pods` (positions in the pending pods) on the cluster without `excluded` (positions
    /// in `Input::nodes`), what those nodes `held` of their NodePools' limits given back; the
    /// solution's pods are positions in `pods`, its nodes positions in `Input::nodes`. The
    /// simulator is left as set up.
    pub(crate) fn place(&mut self, pods: &[usize], excluded: &[usize], held: &[&Held]) -> Solution {
        let s = &mut self.solver;
        for held in held {
            let capacity = s.dims.vector(&held.capacity);
            if let Some(pool) = s.pools.iter_mut().find(|p| p.name == held.pool) {
                if let Some(remaining) = pool.remaining.as_mut() {
                    dims::add(remaining, &capacity);
                }
                if let Some(nodes) = pool.remaining_nodes.as_mut() {
                    *nodes = nodes.saturating_add(1);
                }
            }
        }
        s.excluded.resize(s.bins.len().div_ceil(64), 0);
        for &node in excluded {
            let b = self.bin_of_node[node];
            bitset::insert(&mut s.excluded, b);
            s.room.remove(b);
            for &(group, domain) in s.records.as_ref().map_or(&[][..], |r| &r[b]) {
                s.topology.unrecord(group, domain);
            }
            for &(group, count) in &s.bins[b].host_counts {
                s.topology.unrecord_host(group, count);
            }
        }
        let mut stale = std::mem::take(&mut s.rejections);
        for &p in pods {
            let class = self.pending[p].1;
            if self.refused_alone[class].is_none() {
                let mut refused = Vec::new();
                for b in 0..s.input.nodes.len() {
                    if s.refuses_alone(class, b) {
                        bitset::insert(&mut refused, b);
                    }
                }
                self.refused_alone[class] = Some(refused);
                stale.push(class);
            }
        }
        // Only the classes whose rejections changed since they were last set need setting again.
        stale.sort_unstable();
        stale.dedup();
        for class in stale {
            match self.refused_alone.get(class) {
                Some(Some(refused)) => s.classes[class].rejected.clone_from(refused),
                _ => s.classes[class].rejected.clear(),
            }
        }
        let d = s.dims.len();
        s.load(
            pods.iter().map(|&p| self.pending[p].0).collect(),
            pods.iter().map(|&p| self.pending[p].1).collect(),
            pods.iter()
                .flat_map(|&p| &self.requests[p * d..(p + 1) * d])
                .copied()
                .collect(),
        );
        let solution = s.place();
        self.undo(excluded);
        solution
    }

    /// Puts the solver back as set up, `excluded` (positions in `Input::nodes`) open again unless
    /// closed.
    fn undo(&mut self, excluded: &[usize]) {
        let s = &mut self.solver;
        let nodes = s.input.nodes.len();
        for (b, bin) in s.journal.iter_mut().flat_map(|j| j.drain(..)) {
            s.room.update(b, &bin.alloc, &bin.used);
            s.bins[b] = bin;
        }
        for &node in excluded {
            let b = self.bin_of_node[node];
            if !bitset::contains(&self.closed, b) {
                s.room.update(b, &s.bins[b].alloc, &s.bins[b].used);
            }
        }
        s.bins.truncate(nodes);
        s.room.truncate(nodes);
        // The decided bins per domain hold nodes and the claims opened since; the claims go.
        for per_domain in &mut s.decided {
            for bins in per_domain {
                bitset::truncate(bins, nodes);
            }
        }
        s.topology.restore(&self.counts);
        for (pool, (remaining, remaining_nodes)) in s.pools.iter_mut().zip(&self.limits) {
            if let (Some(now), Some(then)) = (pool.remaining.as_mut(), remaining) {
                now.copy_from_slice(then);
            }
            pool.remaining_nodes = *remaining_nodes;
        }
        s.ledger.restore(&self.reservation_room);
        s.excluded.clone_from(&self.closed);
        s.filled.clear();
        s.pods.clear();
    }
}

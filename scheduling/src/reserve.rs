//! Room kept on open claims for pods that each need a node of their own.
//!
//! A pod with required hostname anti-affinity against its own kind (the one-per-node pattern)
//! can only join a claim that holds none of its peers. First fit fills the oldest claims up to
//! the largest instance type; when that happens before such pods come up in the queue (they are
//! smaller, so they come later), each of them opens a claim of its own and the pass ends with more
//! nodes than it needs. So while the claims without a peer are no more than the peers still
//! pending, every such claim keeps room for the largest of those peers.
//!
//! Failure modes: none; the rule only ever turns a claim down, and a pod turned down everywhere
//! opens a new claim as it would have anyway.

use crate::{
    classes::Class,
    dims,
    topology::{Rule, Topology},
};

/// One group of pods that repel each other per node.
#[derive(Debug)]
struct Exclusive {
    /// Position in [`Topology::groups`].
    group: usize,
    /// Peers not placed yet.
    pending: u32,
    /// Claims holding at least one peer.
    claims_taken: u32,
    /// The element-wise largest request among the peers.
    room: Vec<i64>,
}

/// Every exclusive group of one solve (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Reserves {
    groups: Vec<Exclusive>,
    /// Per scheduling class as first interned: the positions in `groups` its pods are peers in.
    members: Vec<Vec<usize>>,
    /// Per topology group: its position in `groups`, if exclusive.
    of_group: Vec<Option<usize>>,
}

impl Reserves {
    /// Finds the exclusive groups among `classes` (the pods' own classes) and counts their pods;
    /// `requests` holds `d` amounts per pod.
    pub(crate) fn new(
        classes: &[Class],
        topology: &Topology,
        pod_class: &[usize],
        requests: &[i64],
        d: usize,
    ) -> Self {
        let mut reserves = Reserves {
            of_group: vec![None; topology.groups.len()],
            members: vec![Vec::new(); classes.len()],
            ..Reserves::default()
        };
        for (c, class) in classes.iter().enumerate() {
            for check in &class.checks {
                let group = check.group;
                let exclusive = check.rule == Rule::Anti
                    && check.self_selects
                    && topology.keys[topology.groups[group].key].hostname;
                if !exclusive {
                    continue;
                }
                let g = *reserves.of_group[group].get_or_insert_with(|| {
                    reserves.groups.push(Exclusive {
                        group,
                        pending: 0,
                        claims_taken: 0,
                        room: vec![0; d],
                    });
                    reserves.groups.len() - 1
                });
                reserves.members[c].push(g);
            }
        }
        for (pod, &c) in pod_class.iter().enumerate() {
            for &g in &reserves.members[c] {
                let e = &mut reserves.groups[g];
                e.pending += 1;
                dims::max_assign(&mut e.room, &requests[pod * d..(pod + 1) * d]);
            }
        }
        reserves
    }

    /// True when no pod of the solve needs a node of its own: no claim keeps room.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Records the placement of a pod whose own class is `class`.
    pub(crate) fn placed(&mut self, class: usize) {
        for &g in &self.members[class] {
            self.groups[g].pending = self.groups[g].pending.saturating_sub(1);
        }
    }

    /// Records that a claim now holds its first pod counted in topology `group`.
    pub(crate) fn claim_taken(&mut self, group: usize) {
        if let Some(g) = self.of_group[group] {
            self.groups[g].claims_taken += 1;
        }
    }

    /// True when adding `request` to a claim (one of `claims`, holding `used` out of at most
    /// `alloc`, with `host_count` pods per group) leaves the room it must keep. A pod counted in
    /// an exclusive group (`counted_in`) needs no room kept for that group: it is a peer itself.
    pub(crate) fn leaves_room(
        &self,
        claims: usize,
        counted_in: &[usize],
        host_count: impl Fn(usize) -> u32,
        used: &[i64],
        request: &[i64],
        alloc: &[i64],
    ) -> bool {
        self.groups.iter().all(|e| {
            let free_claims = claims as u32 - e.claims_taken;
            e.pending == 0
                || free_claims > e.pending
                || counted_in.contains(&e.group)
                || host_count(e.group) > 0
                || used
                    .iter()
                    .zip(request)
                    .zip(&e.room)
                    .zip(alloc)
                    .all(|(((u, r), k), a)| u.saturating_add(*r).saturating_add(*k) <= *a)
        })
    }
}

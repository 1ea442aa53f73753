//! NodePools split between replicas (`REPLICA_SHARDS`): each NodePool belongs to one of a fixed
//! number of shards (an FNV-1a hash of its name, so every replica and every version agrees), and a
//! replica acts only for the NodePools of the shards it holds — their claims, their nodes'
//! disruption, the pending pods that belong to them ([`joist_scheduling::ownership`]). The holder
//! of shard 0 also runs what is cluster-wide: the garbage collector, the interruption queue, node
//! class finalizers and the events of pods no NodePool admits.
//!
//! Which shards are held is decided outside the controllers (a Lease per shard, in `joist run`)
//! and arrives on a watch channel; the set may grow while the controllers run (a shard taken over
//! from a replica that died) and the controllers follow it. A replica that loses a shard stops,
//! as a leader that loses its Lease does, so the set never shrinks under running controllers.

use std::{collections::BTreeSet, sync::Arc};

use joist_messages::{cached_pod::CachedPod, labels::NODEPOOL};
use joist_scheduling::{ownership, pod::PodInfo};
use kube::ResourceExt;
use tokio::sync::watch;

use crate::state::{read_model::ReadModel, snapshot};

/// The shards this replica holds, of how many (see the module docs).
#[derive(Debug, Clone)]
pub struct ReplicaShards {
    count: u32,
    held: watch::Receiver<BTreeSet<u32>>,
}

impl ReplicaShards {
    /// `count` shards (at least one), of which `held` says which are this replica's.
    pub fn new(count: u32, held: watch::Receiver<BTreeSet<u32>>) -> Self {
        Self {
            count: count.max(1),
            held,
        }
    }

    /// The shard the NodePool `pool` belongs to.
    pub fn shard_of(&self, pool: &str) -> u32 {
        shard_of(pool, self.count)
    }

    /// Whether this replica acts for the NodePool `pool`.
    pub fn holds_pool(&self, pool: &str) -> bool {
        self.held.borrow().contains(&self.shard_of(pool))
    }

    /// The shards this replica holds now.
    pub fn held(&self) -> BTreeSet<u32> {
        self.held.borrow().clone()
    }

    /// Whether this replica holds shard 0, and so runs the cluster-wide jobs.
    pub fn holds_first(&self) -> bool {
        self.held.borrow().contains(&0)
    }

    /// The label selector of the NodeClaims of the NodePools this replica holds, of those `read`
    /// knows: the NodePools that exist, and those named by a Node or a claim already reflected,
    /// so that a deleted NodePool's claims stay in view until they are gone. `None` when it holds
    /// none.
    pub fn claims_selector(&self, read: &ReadModel) -> Option<String> {
        let existing = read
            .node_pools()
            .iter()
            .map(|pool| pool.name_any())
            .collect::<Vec<_>>();
        let of_nodes = read
            .nodes()
            .iter()
            .filter_map(|node| node.labels().get(NODEPOOL).cloned())
            .collect::<Vec<_>>();
        let pools: BTreeSet<String> = existing
            .into_iter()
            .chain(of_nodes)
            .chain(read.pools_with_claims())
            .filter(|name| self.holds_pool(name))
            .collect();
        (!pools.is_empty()).then(|| {
            let names: Vec<String> = pools.into_iter().collect();
            format!("{NODEPOOL} in ({})", names.join(","))
        })
    }

    /// Of `pending`, the pods this replica provisions for: those whose NodePool it holds, and, on
    /// the holder of shard 0, those no NodePool admits (so that one replica tells them why).
    pub fn owned_pending(
        &self,
        read: &ReadModel,
        pending: Vec<(Arc<CachedPod>, Arc<PodInfo>)>,
    ) -> Vec<(Arc<CachedPod>, Arc<PodInfo>)> {
        let pools: Vec<_> = read
            .node_pools()
            .iter()
            .filter(|pool| pool.metadata.deletion_timestamp.is_none())
            .filter_map(|pool| snapshot::pool_input(read, pool, Vec::new()).ok())
            .collect();
        let owners = ownership::owners(&pools, pending.iter().map(|(_, info)| &**info));
        let first = self.holds_first();
        pending
            .into_iter()
            .zip(owners)
            .filter(|(_, owner)| match owner {
                Some(pool) => self.holds_pool(&pools[*pool].name),
                None => first,
            })
            .map(|(pod, _)| pod)
            .collect()
    }
}

/// The shard of the NodePool `pool` of `count`: FNV-1a (64 bits) of its name, modulo `count`.
pub fn shard_of(pool: &str, count: u32) -> u32 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = pool
        .bytes()
        .fold(OFFSET, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME));
    u32::try_from(hash % u64::from(count.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_spread_over_the_shards_the_same_way_everywhere() {
        // Fixed values: a replica of another version must agree on every pool's shard.
        assert_eq!(shard_of("default", 3), shard_of("default", 3));
        assert_eq!(
            shard_of("", 7),
            u32::try_from(0xcbf2_9ce4_8422_2325_u64 % 7).unwrap_or(9)
        );
        let mut counts = [0; 3];
        for i in 0..300 {
            counts[shard_of(&format!("pool-{i}"), 3) as usize] += 1;
        }
        assert!(counts.iter().all(|&n| n > 70), "{counts:?}");
        assert_eq!(shard_of("anything", 1), 0);
    }

    #[test]
    fn the_claims_watched_are_those_of_held_pools_existing_or_named_by_a_node() {
        use kube::runtime::watcher::Event;
        let (read, mut writers) = ReadModel::new();
        let pool: joist_messages::apis::NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "team-a"},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        writers.node_pools.apply_watcher_event(&Event::Apply(pool));
        // A node of a NodePool deleted since: its claim must stay in view until it is gone.
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ip-10-0-0-9", "labels": {NODEPOOL: "gone"}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        writers.nodes.apply_watcher_event(&Event::Apply(node));
        let (held, receiver) = watch::channel(BTreeSet::new());
        let shards = ReplicaShards::new(64, receiver);
        assert_eq!(shards.claims_selector(&read), None);
        held.send_replace(BTreeSet::from([shard_of("team-a", 64), shard_of("gone", 64)]));
        let mut names = ["gone", "team-a"];
        names.sort_unstable();
        assert_eq!(
            shards.claims_selector(&read),
            Some(format!("{NODEPOOL} in ({})", names.join(",")))
        );
    }

    #[test]
    fn a_replica_holds_the_pools_of_its_shards_and_follows_the_set() {
        let (held, receiver) = watch::channel(BTreeSet::new());
        let shards = ReplicaShards::new(3, receiver);
        let pool = "team-a";
        assert!(!shards.holds_pool(pool) && !shards.holds_first());
        held.send_replace(BTreeSet::from([shard_of(pool, 3)]));
        assert!(shards.holds_pool(pool));
        held.send_replace(BTreeSet::from([0, 1, 2]));
        assert!(shards.holds_first());
    }
}

//! NodePools split between replicas (`REPLICA_SHARDS=S`): a `coordination.k8s.io/v1` Lease per
//! shard (`{LEADER_ELECTION_NAME}-shard-{k}`), each held by one replica as leader election holds
//! its single Lease ([`leader::Elector`], the same timings), and a Lease per replica
//! (`{LEADER_ELECTION_NAME}-replica-{identity}`) that says it is alive.
//!
//! Every [`RETRY_PERIOD`] a replica lists the Leases of its namespace once, renews its own and the
//! shards it holds, and counts the replicas alive (a replica Lease that changed within a lease
//! duration, as this process's clock sees it). It takes free shards — no Lease, no holder, or a
//! holder whose Lease stopped changing for a lease duration — while it holds fewer than
//! ceil(S / replicas alive); so replicas that start together share the shards, and the shards of
//! a replica that dies are taken over by the others once its Leases expire (15 s). It takes none
//! during its first [`SETTLE`], so that replicas starting together see each other first. Shards
//! are not moved between live replicas: one that joins later takes only shards that fall free.
//!
//! A held shard that cannot be renewed for the renew deadline, or that another replica took, is
//! lost: [`ShardLeases::hold`] returns and `joist run` stops at once, as a leader that lost its
//! Lease does. On SIGTERM the replica gives up its shards and its own Lease, so the others take
//! the shards at once. A replica Lease that stopped changing for [`FORGOTTEN`] is deleted.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use joist_actors::state::replica_shards::shard_of;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{Api, ResourceExt, api::ListParams};
use tokio::{sync::watch, time::Instant};

use super::leader::{Elector, LEASE_DURATION, Look, RENEW_DEADLINE, RETRY_PERIOD};

/// How long a new replica waits before it takes shards.
const SETTLE: Duration = Duration::from_secs(3);
/// How long a replica Lease may stand still before a replica deletes it.
const FORGOTTEN: Duration = Duration::from_secs(300);

/// One replica's candidacy for every shard (see the module docs).
pub struct ShardLeases {
    api: Api<Lease>,
    /// `{LEADER_ELECTION_NAME}-replica-`: the prefix of every replica's Lease.
    replica_prefix: String,
    member: Elector,
    /// One candidate per shard, by shard.
    shards: Vec<Elector>,
    /// The order this replica tries shards in: from a place its identity picks, so replicas
    /// starting together mostly try different shards first.
    preference: Vec<u32>,
    /// Each replica Lease's spec when last seen to change, and when.
    members: HashMap<String, (Option<LeaseSpec>, Instant)>,
    /// When each held shard was last renewed.
    renewed: HashMap<u32, Instant>,
    held: watch::Sender<BTreeSet<u32>>,
    started: Instant,
}

impl ShardLeases {
    /// `count` shards named after `base`, for the replica `identity`, in the namespace `api`
    /// reaches; the set of shards held is published on the returned channel.
    pub fn new(
        api: Api<Lease>,
        base: &str,
        count: u32,
        identity: &str,
    ) -> (Self, watch::Receiver<BTreeSet<u32>>) {
        let replica_prefix = format!("{base}-replica-");
        let member = Elector::new(
            api.clone(),
            format!("{replica_prefix}{}", lease_name_part(identity)),
            identity.to_owned(),
        );
        let shards = (0..count)
            .map(|shard| Elector::new(api.clone(), format!("{base}-shard-{shard}"), identity.to_owned()))
            .collect();
        let first = shard_of(identity, count);
        let preference = (0..count).map(|i| (first + i) % count).collect();
        let (held, receiver) = watch::channel(BTreeSet::new());
        let leases = Self {
            api,
            replica_prefix,
            member,
            shards,
            preference,
            members: HashMap::new(),
            renewed: HashMap::new(),
            held,
            started: Instant::now(),
        };
        (leases, receiver)
    }

    /// Holds and takes shards until one held is lost; returns that shard's Lease name.
    pub async fn hold(&mut self) -> String {
        loop {
            let deadline = self.renewed.values().min().map_or_else(
                || Instant::now() + RENEW_DEADLINE,
                |renewed| *renewed + RENEW_DEADLINE,
            );
            match tokio::time::timeout_at(deadline, self.look()).await {
                Ok(Ok(())) => {}
                Ok(Err(Lost(lease))) => return lease,
                Err(_) => tracing::warn!("the API server did not answer in time; retrying"),
            }
            if let Some((shard, _)) = self.renewed.iter().find(|(_, at)| at.elapsed() >= RENEW_DEADLINE) {
                let lease = self.shards[*shard as usize].name().to_owned();
                tracing::error!(lease, "could not renew the shard's lease in time: shard lost");
                return lease;
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Gives up every held shard and this replica's own Lease, so the others take over at once.
    pub async fn release(&mut self) {
        let held: Vec<u32> = self.renewed.keys().copied().collect();
        for shard in held {
            self.shards[shard as usize].release().await;
        }
        self.member.release().await;
    }

    /// One look at every Lease (see the module docs).
    async fn look(&mut self) -> Result<(), Lost> {
        let leases = match self.api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "listing the shard leases failed; retrying");
                return Ok(());
            }
        };
        let mut by_name: HashMap<String, Lease> = leases.into_iter().map(|l| (l.name_any(), l)).collect();
        let own = by_name.remove(self.member.name());
        if let Err(error) = self.member.decide(own, true).await {
            tracing::warn!(%error, "renewing this replica's lease failed");
        }
        let alive = 1 + self.others_alive(&by_name).await;
        let count = u32::try_from(self.shards.len()).unwrap_or(u32::MAX);
        let share = count.div_ceil(u32::try_from(alive).unwrap_or(u32::MAX).max(1));
        let settled = self.started.elapsed() >= SETTLE;
        for shard in self.preference.clone() {
            let holding = self.renewed.contains_key(&shard);
            let held = u32::try_from(self.renewed.len()).unwrap_or(u32::MAX);
            let may_take = holding || (settled && held < share);
            let elector = &mut self.shards[shard as usize];
            let lease = by_name.remove(elector.name());
            match elector.decide(lease, may_take).await {
                Ok(Look::Leading) => {
                    if !holding {
                        tracing::info!(lease = elector.name(), shard, "took the shard");
                    }
                    self.renewed.insert(shard, Instant::now());
                }
                Ok(Look::Following(holder)) if holding => {
                    tracing::error!(lease = elector.name(), holder, "another replica took the shard");
                    return Err(Lost(elector.name().to_owned()));
                }
                Ok(Look::Following(_) | Look::Free) => {}
                Err(error) => {
                    tracing::warn!(lease = elector.name(), %error, "the shard's lease could not be written")
                }
            }
        }
        let now_held: BTreeSet<u32> = self.renewed.keys().copied().collect();
        self.held.send_if_modified(|held| {
            let changed = *held != now_held;
            *held = now_held;
            changed
        });
        Ok(())
    }

    /// How many other replicas' Leases changed within a lease duration; those that stood still
    /// for [`FORGOTTEN`] are deleted.
    async fn others_alive(&mut self, leases: &HashMap<String, Lease>) -> usize {
        let now = Instant::now();
        self.members.retain(|name, _| leases.contains_key(name));
        let mut alive = 0;
        for (name, lease) in leases
            .iter()
            .filter(|(name, _)| name.starts_with(&self.replica_prefix))
        {
            let seen = self.members.entry(name.clone()).or_insert_with(|| (None, now));
            if seen.0 != lease.spec {
                *seen = (lease.spec.clone(), now);
            }
            let still = seen.1.elapsed();
            if still < LEASE_DURATION {
                alive += 1;
            } else if still >= FORGOTTEN {
                tracing::info!(lease = name, "deleting the lease of a replica gone for good");
                let _ = self.api.delete(name, &Default::default()).await;
            }
        }
        alive
    }
}

/// A held shard was lost: its Lease's name.
struct Lost(String);

/// `identity` as part of a Lease name: lower case letters, digits and dashes.
fn lease_name_part(identity: &str) -> String {
    identity
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_becomes_a_valid_lease_name() {
        assert_eq!(lease_name_part("ip-10-0-1-2.ec2_4242"), "ip-10-0-1-2-ec2-4242");
        assert_eq!(lease_name_part("Joist-A"), "joist-a");
    }
}

//! The state layer: what the controllers know. The [`read_model`] of reflected objects and its
//! indexes, the scheduling [`snapshot`] taken from it, and the small in-memory records the actors
//! keep between passes ([`breaker`], [`registration_health`], the CapacityBuffers' virtual pods in
//! [`buffers`], the launching NodeClaim each waiting pod is [`planned`] for), kube-scheduler's default topology spread
//! as Joist mirrors it ([`default_spread`]), and which NodePools this replica acts
//! for when they are split between replicas ([`replica_shards`]), and how a watch waits to list again
//! after an error ([`watch_backoff`]). Reads never fail; a missing object
//! is `None`.

pub mod breaker;
pub mod buffers;
pub mod cached;
pub mod created;
pub mod default_spread;
pub mod planned;
pub mod read_model;
pub mod registration_health;
pub mod replica_shards;
pub mod snapshot;
pub mod watch_backoff;

use kube::{Resource, runtime::reflector::Store};

/// Whether `store` has its initial list, asked without waiting (and so without leaving a waker).
fn listed<K: Resource + Clone>(store: &Store<K>) -> bool
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some()
}

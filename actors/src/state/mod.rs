//! The state layer: what the controllers know. The [`read_model`] of reflected objects and its
//! indexes, the scheduling [`snapshot`] taken from it, and the small in-memory records the actors
//! keep between passes ([`breaker`], [`registration_health`]), and which NodePools this replica acts
//! for when they are split between replicas ([`replica_shards`]). Reads never fail; a missing object
//! is `None`.

pub mod breaker;
pub mod cached;
pub mod created;
pub mod read_model;
pub mod registration_health;
pub mod replica_shards;
pub mod snapshot;

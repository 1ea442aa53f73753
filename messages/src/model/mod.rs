//! The domain model: exact quantities, resource lists, the requirement algebra, instance types.
//!
//! Plain data with no I/O, shared by the scheduler, the providers and the actors.

pub mod capacity;
pub mod instance_type;
pub mod quantity;
pub mod requirements;
pub mod resources;
pub mod shape;

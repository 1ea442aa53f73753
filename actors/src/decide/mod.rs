//! The decisions layer: what the controllers should do, as pure functions over facts (API
//! objects, instance types, the clock's reading) with no actix, no Kubernetes client and no cloud
//! call, each unit-tested where it is written. Nothing here fails with I/O; bad input is a typed
//! outcome the caller acts on.
//!
//! Layers, bottom to top: `decide` → [`crate::state`] → [`crate::effects`] → the actors. A module
//! imports only from its own layer or those below, and no two modules import each other (a
//! contract test over the module graph keeps it so).

pub mod balanced;
pub mod budgets;
pub mod claim_template;
pub mod drift;
pub mod fold;
pub mod lifecycle;
pub mod limits;
pub mod memo;
pub mod offered;
pub mod repair;
pub mod static_capacity;
pub mod timing;

//! The `joist` binary's library: command-line commands and their wiring.
//!
//! Everything testable lives here; `main.rs` only parses arguments and sets the exit code.

pub mod commands;
pub mod simulate;
pub mod snapshot;
pub mod telemetry;

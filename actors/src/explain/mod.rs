//! Answers to "why?" about a live cluster, as `joist explain` gives them: why a NodePool may
//! disrupt what it may ([`nodepool`]), why a node exists and stays or would go ([`node`]), why a
//! pod waits or runs where it does ([`pod`]). Each reads a read model filled by
//! [`crate::observe`] and asks the same decisions the controllers make (the disruption pass's
//! candidates and budgets, the consolidation search, the scheduling simulation), without acting
//! on any answer. Each answer is plain data (serialised for `-o json`) that prints as a few lines
//! a person reads.
//!
//! An object that is not in the cluster is an [`ExplainError`] naming it; anything the answer
//! cannot know (a NodePool whose instance types could not be listed) is said in the answer.

pub mod node;
pub mod nodepool;
pub mod pod;

use joist_messages::conditions::ConditionType;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;

/// Why there is no answer.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The object asked about is not in the cluster.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// Its kind, as kubectl names it (`nodepool`, `node`, `pod`).
        kind: &'static str,
        /// Its name as asked (`namespace/name` for a pod).
        name: String,
    },
    /// A pod was named without its namespace.
    #[error("pod {0:?}: name it as NAMESPACE/NAME")]
    PodName(String),
}

/// A status condition as an answer shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionLine {
    /// Its type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message, when it has one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ConditionLine {
    /// The condition of `type_` among `conditions`, if set.
    fn of(conditions: &[Condition], type_: ConditionType) -> Option<Self> {
        let found = joist_messages::conditions::find(conditions, type_)?;
        Some(Self {
            type_: found.type_.clone(),
            status: found.status.clone(),
            reason: found.reason.clone(),
            message: found.message.clone(),
        })
    }
}

impl std::fmt::Display for ConditionLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} ({})", self.type_, self.status, self.reason)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// `seconds` (Unix time) as an RFC 3339 UTC time to the second.
fn utc(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds).map_or_else(|_| seconds.to_string(), |t| t.to_string())
}

//! `joist simulate`: a whole cluster's life on virtual time. A [`scenario::Scenario`] describes the
//! cloud, the manifests and the timed steps; [`driver::run`] plays it against kubesim, the
//! simulated cloud and Joist's actors; [`report::Report`] is what came of it, and [`html`] draws it
//! as a page.

pub mod audit;
pub mod chart;
pub mod driver;
pub mod html;
mod node_condition;
mod node_taint;
pub mod recorder;
pub mod report;
pub mod restore;
pub mod scenario;

pub use driver::{Live, Progress, Simulated, run, run_crashing, run_then};

/// Parses a scenario and checks its manifests as the API server would, without running it.
pub fn check(text: &str) -> Result<Scenario, SimulateError> {
    let scenario = Scenario::parse(text)?;
    driver::prepare(&scenario)?;
    Ok(scenario)
}
pub use report::Report;
pub use scenario::{Scenario, ScenarioError};

/// Why a simulation could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The scenario is malformed.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The runtime could not start.
    #[error("cannot start the simulation runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The simulated world could not be set up.
    #[error("cannot set up the simulation: {0}")]
    Setup(String),
    /// A step (or the initial manifests) failed.
    #[error("{field}: {message}")]
    Step {
        /// The scenario field of the step.
        field: String,
        /// What failed.
        message: String,
    },
}

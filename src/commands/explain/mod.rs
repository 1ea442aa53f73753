//! `joist explain pod|node|nodepool NAME`: answers "why?" about a live cluster, in a few lines a
//! person reads or as JSON (`-o json`), from the decisions Joist's controllers make
//! ([`joist_actors::explain`]). The cluster is the kubeconfig's (`--kubeconfig`, else
//! `KUBECONFIG`, else `~/.kube/config`), read and never written ([`read_only`]); the cloud, for
//! instance types and prices, is the one `joist run` would use, from the same environment
//! (`CLUSTER_NAME`, `CLOUD_PROVIDER`, `AWS_REGION`, `FEATURE_GATES`, …).
//!
//! Fails, naming what to fix, when the settings or the kubeconfig are unusable, when the API
//! server does not answer, when the cluster's objects are not listed within [`SYNC_DEADLINE`], and
//! when the object asked about is not there.

pub mod read_only;

use std::{fmt, io, path::Path, process::ExitCode, sync::Arc, time::Duration};

use clap::{Subcommand, ValueEnum};
use joist_actors::{
    explain::{self, ExplainError, node::NodeAnswer, nodepool::PoolAnswer, pod::PodAnswer},
    settings::Settings,
};
use joist_messages::time::Clock;
use joist_provider::CloudProvider;
use serde::Serialize;

use super::{
    CommandError,
    run::{self, settings::RunSettings},
};

/// How long the cluster's objects may take to be listed before `joist explain` gives up.
pub const SYNC_DEADLINE: Duration = Duration::from_secs(60);

/// What to explain.
#[derive(Debug, Clone, Subcommand)]
pub enum Question {
    /// A pod (NAMESPACE/NAME): why it waits, or runs where it does.
    Pod {
        /// NAMESPACE/NAME.
        name: String,
    },
    /// A Node or NodeClaim: why it exists, whether it is a disruption candidate, and a dry run of
    /// removing it.
    Node {
        /// The Node's name, or its NodeClaim's.
        name: String,
    },
    /// A NodePool: budgets now and over the next 24 hours, limits used, nodes by state, drift.
    Nodepool {
        /// The NodePool's name.
        name: String,
    },
}

/// How answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A few lines a person reads.
    Text,
    /// One JSON document.
    Json,
}

/// An answer to a [`Question`].
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// About a pod.
    Pod(PodAnswer),
    /// About a node.
    Node(Box<NodeAnswer>),
    /// About a NodePool.
    Nodepool(PoolAnswer),
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Pod(answer) => answer.fmt(f),
            Answer::Node(answer) => answer.fmt(f),
            Answer::Nodepool(answer) => answer.fmt(f),
        }
    }
}

/// Why there is no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The object is not there, or was named wrongly.
    #[error(transparent)]
    Explain(#[from] ExplainError),
    /// The cluster's objects were not listed in time.
    #[error("the cluster's objects were not listed within {}s (is the API server reachable, and may this identity list nodes, pods and Karpenter's objects?)", SYNC_DEADLINE.as_secs())]
    NotListed,
}

/// Answers `question` about the cluster `client` reaches (through a client that only reads),
/// with `cloud`'s instance types and prices, under the controllers' `settings`, as of `clock`.
/// Runs on an actix system.
pub async fn answer(
    client: kube::Client,
    cloud: Arc<dyn CloudProvider>,
    settings: Settings,
    clock: Clock,
    question: &Question,
) -> Result<Answer, AnswerError> {
    let shared = joist_actors::observe(read_only::client(client), cloud, settings, clock);
    tokio::time::timeout(SYNC_DEADLINE, shared.read.synced())
        .await
        .map_err(|_| AnswerError::NotListed)?;
    Ok(match question {
        Question::Pod { name } => Answer::Pod(explain::pod::explain(&shared, name).await?),
        Question::Node { name } => Answer::Node(Box::new(explain::node::explain(&shared, name).await?)),
        Question::Nodepool { name } => Answer::Nodepool(explain::nodepool::explain(&shared, name)?),
    })
}

/// `joist explain`: connects, answers, prints.
pub fn run(
    question: &Question,
    kubeconfig: Option<&Path>,
    output: Output,
    out: &mut dyn io::Write,
) -> Result<ExitCode, CommandError> {
    let start = |message: String| CommandError::Start { message };
    let settings = RunSettings::from_env().map_err(|e| start(e.to_string()))?;
    let runtime = super::runtime()?;
    let system = actix::System::with_tokio_rt(move || runtime);
    let answered = system.block_on(async {
        let client = run::kube_client(kubeconfig).await.map_err(start)?;
        let version = run::kubernetes_version(&client).await?;
        // The simulated clouds register and remove Nodes through their client: this one cannot.
        let (cloud, _queue) = run::cloud(&settings, &read_only::client(client.clone()), version).await?;
        let controllers = run::controller_settings(&settings);
        answer(client, cloud, controllers, Clock::system(), question)
            .await
            .map_err(|e| CommandError::Explain {
                message: e.to_string(),
            })
    })?;
    let text = match output {
        Output::Text => answered.to_string(),
        Output::Json => {
            let mut json = serde_json::to_string_pretty(&answered).map_err(|e| CommandError::Explain {
                message: format!("cannot render the answer as JSON: {e}"),
            })?;
            json.push('\n');
            json
        }
    };
    out.write_all(text.as_bytes()).map_err(CommandError::stdout)?;
    Ok(ExitCode::SUCCESS)
}

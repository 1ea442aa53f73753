//! The moto server the tests talk to: installed by `scripts/moto` (a virtualenv in the user's
//! cache), started once per test process by `tests/moto/launcher.py` on 127.0.0.1 with the EKS
//! AMI parameters seeded, and stopped when the process exits (the launcher serves until its
//! standard input, held here, closes). Tests share it and keep apart by tagging their own
//! resources with names of their own.
//!
//! The root crate's end-to-end test includes this file too (`#[path]`), so paths are found from
//! the repository root, wherever the including crate is.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::OnceLock,
};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::Credentials;
use joist_provider_aws::clients::{AwsClients, http_client};

/// The region the tests use.
pub const REGION: &str = "us-west-2";
/// The Kubernetes version whose AMI parameters are seeded.
pub const KUBERNETES: &str = "1.35";

struct Server {
    endpoint: String,
    /// Held open: the launcher exits when it closes, with this process.
    _stdin: ChildStdin,
    /// Never waited for: it outlives every test and ends with the process.
    _child: Child,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let root = repository_root();
        let install = Command::new(root.join("scripts/moto"))
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run scripts/moto: {e}"));
        let stdout = String::from_utf8_lossy(&install.stdout);
        let python = stdout
            .lines()
            .find_map(|l| l.strip_prefix("PYTHON="))
            .unwrap_or_else(|| panic!("scripts/moto failed: {stdout}"));
        let mut child = Command::new(python)
            .arg(root.join("providers/aws/tests/moto/launcher.py"))
            .args(["--region", REGION, "--kubernetes-version", KUBERNETES])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto: {e}"));
        let stdin = child.stdin.take().unwrap_or_else(|| panic!("moto has no stdin"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("moto has no stdout"));
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("moto did not start: {e}"));
        let port = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("moto did not start: {line:?}"));
        Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            _stdin: stdin,
            _child: child,
        }
    })
}

/// The repository's root: the nearest ancestor of the including crate holding `scripts/moto`.
fn repository_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("scripts/moto").is_file())
        .unwrap_or_else(|| panic!("no scripts/moto above {}", manifest.display()))
        .to_path_buf()
}

/// The shared moto server's URL (`http://127.0.0.1:PORT`), started on first use.
pub fn endpoint() -> &'static str {
    &server().endpoint
}

/// Clients talking to the shared moto server.
pub async fn clients() -> AwsClients {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint())
        .credentials_provider(Credentials::new("testing", "testing", None, None, "static"))
        .http_client(http_client())
        .load()
        .await;
    AwsClients::from_config(&config).unwrap_or_else(|e| panic!("{e}"))
}

//! `joist run` (or a peer controller) as a child process of a test: started with exactly the
//! environment the test gives (and `PATH`), its JSON log in a file, killed when dropped; the polling the tests wait with; and
//! who holds the Leases replicas elect on.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// A controller under test: `joist run`, or a peer such as Karpenter's KWOK controller; its log
/// in a file, and killed if a test fails before stopping it.
pub struct Controller {
    /// The process.
    pub child: Child,
    log: PathBuf,
}

impl Controller {
    /// Starts `joist run` with `env` and `PATH` only; its log goes to `log`.
    pub fn joist<'a>(log: PathBuf, env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_joist"));
        command
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env);
        Self::start(command, log)
    }

    /// Starts `command` (in the test's environment and whatever it adds), its output to `log`.
    pub fn start(mut command: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        Self { child, log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where `joist run` serves `what` (`metrics` or `health probes`), from its "listening" log line.
    pub async fn address(&self, what: &str) -> String {
        eventually(self, &format!("listening for {what}"), || async {
            self.log().lines().find_map(|line| {
                let entry: serde_json::Value = serde_json::from_str(line).ok()?;
                let fields = &entry["fields"];
                (fields["message"] == "listening" && fields["what"] == what)
                    .then(|| fields["address"].as_str().map(str::to_owned))?
            })
        })
        .await
    }

    /// `GET path` from the server for `what`, as Prometheus asks (OpenMetrics preferred): the
    /// status code and the body.
    pub async fn get(&self, what: &str, path: &str) -> (u16, String) {
        let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        http_get(&self.address(what).await, path, Some(accept)).await
    }

    /// Sends `signal` (`-TERM`, `-KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(sent.success(), "kill {signal} failed");
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` from `address` over HTTP/1.1, with `accept` if given: the status code and the body.
pub async fn http_get(address: &str, path: &str, accept: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .unwrap_or_else(|e| panic!("{address}: {e}"));
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{accept}Connection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned());
    (status, body.unwrap_or_default())
}

/// Polls `check` every 200 ms for up to a minute; panics with `what` and the controller's log.
pub async fn eventually<T, F, Fut>(controller: &Controller, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(Duration::from_secs(60), controller, what, check).await
}

/// Polls `check` every 200 ms for up to `limit`; panics with `what` and the controller's log.
pub async fn within<T, F, Fut>(limit: Duration, controller: &Controller, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what} did not happen within {limit:?}; the controller logged:\n{}",
        controller.log()
    )
}

/// The holder of each of the `count` shard Leases of `joist run` replicas with `REPLICA_SHARDS` in
/// kube-system (`joist-leader-election-shard-K`), `None` for a shard no one holds.
pub async fn shard_holders(client: &kube::Client, count: u32) -> Vec<Option<String>> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "kube-system");
    let mut holders = Vec::new();
    for shard in 0..count {
        let lease = leases
            .get_opt(&format!("joist-leader-election-shard-{shard}"))
            .await
            .ok()
            .flatten();
        holders.push(
            lease
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty()),
        );
    }
    holders
}

//! Faults of the API server as one client sees it, for tests and `joist simulate` scenarios that
//! check a controller survives them: writes refused with `409 Conflict`, writes applied whose reply
//! is lost (`504 Timeout`), every request slowed down, watch streams that end, watches that may
//! not resume (`410 Gone`, as after an etcd compaction) so the client must list again, and a
//! network black hole in which nothing the client sends arrives.
//!
//! An [`ApiFaults`] is given to one in-process client ([`crate::InProcess::with_faults`]); other
//! clients, kubesim's own components and the store are untouched, so the fault is what that client
//! lives through and not a change of the cluster. Each fault lasts for a window of tokio time
//! (virtual time in simulations). What the faults did is counted ([`FaultCounts`]).

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::{sync::watch, time::Instant};

use super::{ApiBody, ApiRequest, ApiServer, Route, json_response, request};
use crate::error::ApiError;

/// While a watch fault lasts, how often every open watch stream of the client is ended.
pub const WATCH_DROP_EVERY: Duration = Duration::from_secs(20);

/// How a client's requests fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFailure {
    /// Updates, patches and deletes are refused with `409 Conflict` and not applied (creates are
    /// not: a create conflicts only with a name that is taken).
    Conflict,
    /// Writes (creates included) are applied, and the client gets `504 Timeout` instead of the reply.
    LoseReply,
    /// Every request waits this long before it is served.
    Slow(Duration),
    /// Every open watch stream ends now and every [`WATCH_DROP_EVERY`]; watches resume from
    /// where they were.
    DropWatches,
    /// As `DropWatches`, and the history is compacted past what the client has seen at each drop:
    /// a watch of a collection the client has not listed since gets `410 Gone`, and the client
    /// must list again.
    Gone,
    /// A network black hole: open watch streams end, and a request made while the fault lasts is
    /// neither served nor answered until the fault ends, when it fails with `504 Timeout` (as a
    /// proxy reports a peer that never answered). Nothing the client sends is applied.
    BlackHole,
}

impl ApiFailure {
    /// The names scenarios use, with the failure (`slow` takes its delay separately).
    pub const NAMES: [(&'static str, Self); 6] = [
        ("conflict", Self::Conflict),
        ("loseReply", Self::LoseReply),
        ("slow", Self::Slow(Duration::ZERO)),
        ("dropWatches", Self::DropWatches),
        ("gone", Self::Gone),
        ("blackHole", Self::BlackHole),
    ];

    fn ends_watches(self) -> bool {
        matches!(self, Self::DropWatches | Self::Gone | Self::BlackHole)
    }
}

/// What the faults did to the client's requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Writes refused with 409.
    pub conflicts: usize,
    /// Writes applied whose reply was lost.
    pub lost_replies: usize,
    /// Requests slowed down.
    pub delayed: usize,
    /// Times every open watch was ended.
    pub watch_drops: usize,
    /// Watches refused with 410, each a relist.
    pub gone: usize,
    /// Requests lost in a black hole.
    pub black_holed: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Each fault and when it ends.
    active: Vec<(ApiFailure, Instant)>,
    /// The collections (paths) listed since the last drop; while `Gone` lasts, a watch of any
    /// other collection from a resourceVersion gets 410.
    listed_since_drop: HashSet<String>,
    counts: FaultCounts,
}

/// The faults of one client's connection; cheap to clone, clones share the faults.
#[derive(Debug, Clone)]
pub struct ApiFaults {
    state: Arc<Mutex<State>>,
    /// Bumped to end every open watch stream.
    hangups: watch::Sender<u64>,
}

impl Default for ApiFaults {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            hangups: watch::Sender::new(0),
        }
    }
}

impl ApiFaults {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the client's requests fail as `failure` says for `duration` from now. Watch faults
    /// end the open streams at once and then every [`WATCH_DROP_EVERY`] (on the current tokio
    /// runtime) while they last.
    pub fn fail(&self, failure: ApiFailure, duration: Duration) {
        let end = Instant::now() + duration;
        self.lock().active.push((failure, end));
        if !failure.ends_watches() {
            return;
        }
        let faults = self.clone();
        tokio::spawn(async move {
            loop {
                {
                    let mut state = faults.lock();
                    state.listed_since_drop.clear();
                    state.counts.watch_drops += 1;
                }
                faults.hangups.send_modify(|n| *n += 1);
                let next = Instant::now() + WATCH_DROP_EVERY;
                if next >= end {
                    return;
                }
                tokio::time::sleep_until(next).await;
            }
        });
    }

    /// What the faults have done so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    /// The faults in force now (expired ones are forgotten).
    fn now(&self) -> Vec<ApiFailure> {
        let now = Instant::now();
        let mut state = self.lock();
        state.active.retain(|(_, end)| *end > now);
        state.active.iter().map(|(failure, _)| *failure).collect()
    }

    /// When the black hole in force now ends, if there is one.
    fn black_hole_ends(&self) -> Option<Instant> {
        let now = Instant::now();
        self.lock()
            .active
            .iter()
            .filter(|(failure, end)| *failure == ApiFailure::BlackHole && *end > now)
            .map(|(_, end)| *end)
            .max()
    }

    /// Answers `request` through `server` as the faults in force make it.
    pub(crate) async fn answer(&self, server: &ApiServer, request: ApiRequest) -> Response<ApiBody> {
        if let Some(end) = self.black_hole_ends() {
            self.lock().counts.black_holed += 1;
            tokio::time::sleep_until(end).await;
            let lost =
                ApiError::Timeout("the request was lost in a network black hole (kubesim fault)".to_owned());
            return json_response(lost.code(), &lost.status());
        }
        let faults = self.now();
        let delay = faults
            .iter()
            .filter_map(|f| match f {
                ApiFailure::Slow(delay) => Some(*delay),
                _ => None,
            })
            .max();
        if let Some(delay) = delay {
            self.lock().counts.delayed += 1;
            tokio::time::sleep(delay).await;
        }
        let watch = request.method == Method::GET && request.query.flag("watch");
        let write = request.method != Method::GET;
        let updates = matches!(request.method, Method::PUT | Method::PATCH | Method::DELETE);
        if updates && faults.contains(&ApiFailure::Conflict) {
            self.lock().counts.conflicts += 1;
            return json_response(409, &conflict(server, &request).status());
        }
        // Each drop of a `Gone` fault starts the set of listed collections afresh, so it is kept
        // only while one lasts.
        if request.method == Method::GET && faults.contains(&ApiFailure::Gone) {
            if !watch {
                self.lock().listed_since_drop.insert(request.path.clone());
            } else if let Some(gone) = self.refused_resume(&request) {
                return gone;
            }
        }
        let response = server.handle(request);
        if write && faults.contains(&ApiFailure::LoseReply) {
            self.lock().counts.lost_replies += 1;
            let lost = ApiError::Timeout("the reply to this request was lost (kubesim fault)".to_owned());
            return json_response(lost.code(), &lost.status());
        }
        if watch {
            let hangups = self.hangups.subscribe();
            return response.map(|body| HangingUp::new(body, hangups).boxed());
        }
        response
    }

    /// The 410 a watch gets when it resumes from a resourceVersion and its collection was not
    /// listed since the last drop.
    fn refused_resume(&self, request: &ApiRequest) -> Option<Response<ApiBody>> {
        let requested = request.query.resource_version().ok().flatten()?;
        let mut state = self.lock();
        if requested == 0 || state.listed_since_drop.contains(&request.path) {
            return None;
        }
        state.counts.gone += 1;
        let gone = ApiError::Gone {
            requested,
            oldest: requested + 1,
        };
        Some(Response::new(super::watch::refused(&gone)))
    }
}

/// The 409 a write to the object `request` names gets.
fn conflict(server: &ApiServer, request: &ApiRequest) -> ApiError {
    let (resource, name) = match request::route(server.store(), &request.path) {
        Ok(Route::Resource(path)) => (
            path.rtype.group_resource().qualified(),
            path.name.unwrap_or_default(),
        ),
        _ => (request.path.clone(), String::new()),
    };
    ApiError::modified(resource, name)
}

/// A watch body that ends when the client's watches are hung up.
struct HangingUp {
    inner: ApiBody,
    /// Resolves at the next hang-up; none once it has (a mutex only to make the body `Sync`;
    /// never contended).
    hangup: Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>,
}

impl HangingUp {
    fn new(inner: ApiBody, mut hangups: watch::Receiver<u64>) -> Self {
        let hangup = Box::pin(async move {
            // A dropped sender (the faults are gone) never hangs up.
            if hangups.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        Self {
            inner,
            hangup: Mutex::new(Some(hangup)),
        }
    }
}

impl http_body::Body for HangingUp {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let hangup = self
            .hangup
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match hangup.as_mut().map(|h| h.as_mut().poll(cx)) {
            Some(Poll::Pending) => {}
            Some(Poll::Ready(())) | None => {
                *hangup = None;
                return Poll::Ready(None);
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }
}

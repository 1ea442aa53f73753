//! Watch streams: newline-delimited JSON events (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`)
//! as kube-apiserver sends them.
//!
//! A watch without a resourceVersion (or with "0") first sends the current objects as `ADDED`; with
//! one, it sends only what changed after it, or a 410 `ERROR` event when that version has left the
//! history. Selector watches see an object that stops matching as `DELETED` and one that starts
//! matching as `ADDED`. A stream ends at `timeoutSeconds`, when the client goes away, or with a 410
//! when the watcher falls further behind than the retained history.

use std::{
    borrow::Cow,
    convert::Infallible,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{
    ApiBody, ApiRequest, ResourcePath,
    objects::{self, Shown},
};
use crate::{
    error::ApiError,
    history::Reads,
    object::Pointer,
    resources::ResourceType,
    selector::{FieldSelector, LabelSelector},
    store::{EventKind, Store, Version, WatchEvent},
};

/// How long a watch runs when the client gives no `timeoutSeconds`.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// How often a watch that allows bookmarks gets one while nothing changes.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// Events read from the store per poll.
const EVENTS_PER_POLL: usize = 512;

/// Encoded events buffered per watch before the writer waits for the client.
const STREAM_BUFFER: usize = 64;

/// Which objects a watch shows.
struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    /// Whether the watch sees every object of its resource.
    fn everything(&self) -> bool {
        self.namespace.is_none() && self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether a version is one the watch shows: told from its metadata alone when there is no
    /// field selector, so a label selector does not parse a large object whole.
    fn matches(&self, version: &Version) -> Result<bool, ApiError> {
        if !self.fields.is_empty() {
            return Ok(self.matches_object(&*version.value()?));
        }
        let metadata = version.read::<Labelled>()?.metadata.unwrap_or_default();
        Ok(self.matches_metadata(metadata.namespace.as_deref(), metadata.labels.as_ref()))
    }

    fn matches_object(&self, object: &Value) -> bool {
        self.matches_metadata(
            object.at("/metadata/namespace").and_then(Value::as_str),
            object.at("/metadata/labels").and_then(Value::as_object),
        ) && self.fields.matches(object)
    }

    fn matches_metadata(&self, namespace: Option<&str>, labels: Option<&Map<String, Value>>) -> bool {
        self.namespace.as_deref().is_none_or(|ns| namespace == Some(ns)) && self.labels.matches(labels)
    }

    /// How an event looks to this watch, if it sees it at all (a watch of everything reads no
    /// object to tell).
    fn view(&self, event: &WatchEvent) -> Result<Option<&'static str>, ApiError> {
        let (before, now) = match self.everything() {
            true => (event.previous.is_some(), true),
            false => (
                match &event.previous {
                    Some(previous) => self.matches(previous)?,
                    None => false,
                },
                self.matches(&event.object)?,
            ),
        };
        Ok(match (event.kind, before, now) {
            (EventKind::Deleted, _, true) | (EventKind::Modified, true, false) => Some("DELETED"),
            (EventKind::Added, _, true) | (EventKind::Modified, false, true) => Some("ADDED"),
            (EventKind::Modified, true, true) => Some("MODIFIED"),
            _ => None,
        })
    }
}

/// What a selector watch reads of an object without a field selector.
#[derive(Deserialize)]
struct Labelled {
    metadata: Option<LabelledMetadata>,
}

#[derive(Deserialize, Default)]
struct LabelledMetadata {
    namespace: Option<String>,
    labels: Option<Map<String, Value>>,
}

/// Starts a watch and returns its streaming body.
pub fn serve(store: Arc<Store>, request: &ApiRequest, path: &ResourcePath) -> Result<ApiBody, ApiError> {
    let filter = Filter {
        namespace: path.rtype.namespaced.then(|| path.namespace.clone()).flatten(),
        labels: request.query.label_selector()?,
        fields: request.query.field_selector()?,
    };
    let timeout = request
        .query
        .number("timeoutSeconds")?
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let bookmarks = request.query.flag("allowWatchBookmarks");
    let initial_events_end = request.query.flag("sendInitialEvents");
    let resource = path.rtype.group_resource();
    let (mut cursor, initial) = match request.query.resource_version()? {
        Some(revision) if !initial_events_end => match store.watch(&resource, Some(revision), Reads::Json) {
            Ok(cursor) => (cursor, Vec::new()),
            Err(gone) => return Ok(refused(&gone)),
        },
        _ if filter.everything() => {
            let page = store.list_encoded(&resource, None, None, None);
            let items = page.items.into_iter().map(Version::encoded).collect();
            (store.watch(&resource, Some(page.revision), Reads::Json)?, items)
        }
        _ => {
            let page = store.list(&resource, filter.namespace.as_deref(), None, None, |o| {
                filter.matches_object(o)
            });
            let items = page
                .items
                .into_iter()
                .map(|object| Version::parsed(store.encoded(&object), object))
                .collect();
            (store.watch(&resource, Some(page.revision), Reads::Json)?, items)
        }
    };
    let shown = request.shown();
    let stored_as = objects::StoredAs::of(&path.rtype);
    let (sender, receiver) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    let rtype = path.rtype.clone();
    let busy = store.busy().clone();
    busy.spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        for version in &initial {
            if sender
                .send(object_line("ADDED", &rtype, version, shown, &stored_as, &store))
                .await
                .is_err()
            {
                return;
            }
        }
        if initial_events_end {
            let bookmark = bookmark(&rtype.api_version(), &rtype.kind, cursor.position, true);
            if sender.send(line("BOOKMARK", &bookmark)).await.is_err() {
                return;
            }
        }
        loop {
            let events = match store.poll(&mut cursor, EVENTS_PER_POLL) {
                Ok(events) => events,
                Err(gone) => {
                    let _ = sender.send(line("ERROR", &gone.status())).await;
                    return;
                }
            };
            if events.is_empty() {
                tokio::select! {
                    alive = store.changed(&mut cursor) => if !alive { return },
                    () = tokio::time::sleep_until(deadline) => return,
                    () = tokio::time::sleep(BOOKMARK_INTERVAL), if bookmarks => {
                        let bookmark = bookmark(&rtype.api_version(), &rtype.kind, cursor.position, false);
                        if sender.send(line("BOOKMARK", &bookmark)).await.is_err() {
                            return;
                        }
                    }
                    () = sender.closed() => return,
                }
                continue;
            }
            for event in &events {
                let line = match filter.view(event) {
                    Ok(Some(kind)) => object_line(kind, &rtype, &event.object, shown, &stored_as, &store),
                    Ok(None) => continue,
                    Err(error) => line("ERROR", &error.status()),
                };
                if sender.send(line).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(ChannelBody(receiver).boxed())
}

fn bookmark(api_version: &str, kind: &str, revision: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
}

/// A watch refused for `error` (a resume past the history), as kube-apiserver answers it: the
/// watch opens, and its one event is the error.
pub(super) fn refused(error: &ApiError) -> ApiBody {
    http_body_util::Full::new(line("ERROR", &error.status())).boxed()
}

/// The event of `version` as a watch of `rtype` sends it: its JSON when it is sent as stored.
fn object_line(
    kind: &str,
    rtype: &ResourceType,
    version: &Version,
    shown: Shown,
    stored_as: &objects::StoredAs,
    store: &Store,
) -> Bytes {
    if shown == Shown::Whole && stored_as.matches(version.json()) {
        return encoded_line(kind, version.json());
    }
    let object = match version.value() {
        Ok(object) => object,
        Err(error) => return line("ERROR", &error.status()),
    };
    if shown == Shown::Metadata {
        return line(kind, &objects::PartialMetadata::of(&object));
    }
    match objects::presented(rtype, &object, shown, store.clock()) {
        Cow::Borrowed(_) => encoded_line(kind, version.json()),
        Cow::Owned(presented) => line(kind, &presented),
    }
}

/// [`line`] around an object already serialized.
fn encoded_line(kind: &str, object: &[u8]) -> Bytes {
    let mut bytes = Vec::with_capacity(object.len() + kind.len() + 24);
    bytes.extend_from_slice(b"{\"type\":\"");
    bytes.extend_from_slice(kind.as_bytes());
    bytes.extend_from_slice(b"\",\"object\":");
    bytes.extend_from_slice(object);
    bytes.extend_from_slice(b"}\n");
    Bytes::from(bytes)
}

fn line(kind: &str, object: &impl serde::Serialize) -> Bytes {
    /// One event of the stream, serialized from borrowed parts.
    #[derive(serde::Serialize)]
    struct Event<'a, T> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a T,
    }
    let mut bytes = serde_json::to_vec(&Event { kind, object }).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// A response body fed by the watch task. Events already waiting when the connection asks for
/// more go out together in one chunk (a buffer's worth at most), as kube-apiserver flushes its
/// writer only when no event is waiting: a burst reaches the client in a few reads rather than one
/// per event, each of which would wake its reader.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(first) = std::task::ready!(self.0.poll_recv(cx)) else {
            return Poll::Ready(None);
        };
        let Ok(second) = self.0.try_recv() else {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        };
        let mut joined = bytes::BytesMut::with_capacity((first.len() + second.len()) * 2);
        joined.extend_from_slice(&first);
        joined.extend_from_slice(&second);
        // At most a buffer's worth: the watch task refills the channel as it empties.
        for _ in 2..STREAM_BUFFER {
            let Ok(next) = self.0.try_recv() else { break };
            joined.extend_from_slice(&next);
        }
        Poll::Ready(Some(Ok(Frame::data(joined.freeze()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_waiting_together_go_out_as_one_chunk_in_their_order() {
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let mut body = ChannelBody(receiver);
        let lines: Vec<Bytes> = (0..3)
            .map(|i| line("ADDED", &json!({"metadata": {"name": format!("pod-{i}")}})))
            .collect();
        for event in &lines {
            sender.send(event.clone()).await.expect("sent");
        }
        let chunk = body.frame().await.expect("a frame").expect("no error");
        assert_eq!(
            chunk.into_data().expect("data"),
            lines.concat(),
            "all three, in order, in one chunk"
        );
        sender.send(lines[0].clone()).await.expect("sent");
        let chunk = body.frame().await.expect("a frame").expect("no error");
        assert_eq!(chunk.into_data().expect("data"), lines[0], "one event alone");
        drop(sender);
        assert!(body.frame().await.is_none(), "the stream ends with its task");
    }

    #[test]
    fn an_event_from_an_encoded_object_is_the_event_serialized_whole() {
        let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web \"1\""}});
        let encoded = serde_json::to_vec(&object).expect("encodes");
        assert_eq!(encoded_line("MODIFIED", &encoded), line("MODIFIED", &object));
    }
}

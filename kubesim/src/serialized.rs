//! A stored version's JSON, made at once or on a thread of its own.
//!
//! The store serializes each version it commits once: the JSON is what it keeps of a live object
//! and what watches send. In a simulation, where one thread runs the whole simulated world, that
//! was a fifteenth of a 20,000-pod run, yet the JSON is seldom read at once: a watch sends it
//! moments later, and a reader parses it only after the parsed version is gone. There
//! ([`Serializing::Beside`]) a committed version is handed to the encoding thread, which makes its
//! JSON, or the first reader who needs it sooner makes it (and one who asks while the thread is at
//! it waits for it). Whoever makes them, the bytes are the same. The version is held until its JSON
//! is made, then let go of. A cluster that serves its API from threads of its own sends each
//! version as it comes, and makes its JSON at once ([`Serializing::AtOnce`]).
//!
//! It cannot fail: see [`crate::handoff`].

use std::{
    cell::RefCell,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

use bytes::Bytes;
use serde_json::Value;

use crate::handoff::Helper;

/// How many versions are handed to the thread at once: few, so that little is left for a reader
/// to serialize at the end of a burst, but enough that waking the thread costs little.
pub const BATCH: usize = 16;

/// How many batches may wait for the thread before committers serialize their own again.
pub const QUEUED: usize = 256;

/// When a committed version's JSON is made (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Serializing {
    /// At once, by the writer.
    #[default]
    AtOnce,
    /// On the encoding thread, or by the first reader who needs it sooner.
    Beside,
}

/// A version's JSON, made or to be made (see the module docs). Clones share it.
#[derive(Debug, Clone)]
pub struct Json(Made);

#[derive(Debug, Clone)]
enum Made {
    /// At once (or read back from the store).
    Now(Bytes),
    /// Beside: by the encoding thread or the first reader.
    Later(Arc<Cell>),
}

#[derive(Debug)]
struct Cell {
    bytes: OnceLock<Bytes>,
    /// The version, held until its JSON is made.
    source: Mutex<Option<Arc<Value>>>,
}

impl Json {
    /// The JSON of `version`, made as `serializing` says.
    pub fn of(version: &Arc<Value>, serializing: Serializing) -> Self {
        if serializing == Serializing::AtOnce {
            return Self::from(Bytes::from(serde_json::to_vec(&**version).unwrap_or_default()));
        }
        let json = Self(Made::Later(Arc::new(Cell {
            bytes: OnceLock::new(),
            source: Mutex::new(Some(version.clone())),
        })));
        hand_over(json.clone());
        json
    }

    /// The JSON, made now if it was not yet.
    pub fn bytes(&self) -> &Bytes {
        let cell = match &self.0 {
            Made::Now(bytes) => return bytes,
            Made::Later(cell) => cell,
        };
        cell.bytes.get_or_init(|| {
            let source = (cell.source.lock())
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            source.map_or_else(Bytes::new, |version| {
                Bytes::from(serde_json::to_vec(&*version).unwrap_or_default())
            })
        })
    }
}

impl From<Bytes> for Json {
    fn from(bytes: Bytes) -> Self {
        Self(Made::Now(bytes))
    }
}

static ENCODE: Helper<Json> = Helper::new("kubesim-encode", BATCH, QUEUED, |json| {
    json.bytes();
});

thread_local! {
    /// The versions this thread committed since it last handed a batch over.
    static PENDING: RefCell<Vec<Json>> = const { RefCell::new(Vec::new()) };
}

fn hand_over(json: Json) {
    ENCODE.hand_over(&PENDING, json);
}

#[cfg(test)]
mod tests {
    use std::{sync::Weak, time::Duration};

    use serde_json::json;

    use super::*;

    #[test]
    fn a_version_handed_over_is_serialized_by_the_thread_and_let_go_of() {
        let versions: Vec<Arc<Value>> = (0..BATCH)
            .map(|i| Arc::new(json!({"metadata": {"name": format!("pod-{i}")}, "n": i})))
            .collect();
        let held: Vec<Weak<Value>> = versions.iter().map(Arc::downgrade).collect();
        let encoded: Vec<Json> = versions
            .iter()
            .map(|version| Json::of(version, Serializing::Beside))
            .collect();
        drop(versions);
        let made = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            encoded
                .iter()
                .all(|json| matches!(&json.0, Made::Later(cell) if cell.bytes.get().is_some()))
        });
        assert!(made, "the thread makes every JSON of a handed-over batch");
        assert!(
            held.iter().all(|version| version.upgrade().is_none()),
            "and lets go of the versions"
        );
        for (i, json) in encoded.iter().enumerate() {
            let expected = json!({"metadata": {"name": format!("pod-{i}")}, "n": i});
            assert_eq!(json.bytes(), &serde_json::to_vec(&expected).expect("serializes"));
        }
    }

    #[test]
    fn a_reader_before_the_thread_makes_the_same_json() {
        let version = Arc::new(json!({"b": [1, 2], "a": "x"}));
        let json = Json::of(&version, Serializing::Beside);
        assert_eq!(json.bytes(), &Bytes::from_static(br#"{"a":"x","b":[1,2]}"#));
        assert_eq!(json.clone().bytes().as_ptr(), json.bytes().as_ptr(), "made once");
        assert_eq!(Json::of(&version, Serializing::AtOnce).bytes(), json.bytes());
        assert_eq!(
            Json::from(Bytes::from_static(b"{}")).bytes(),
            &Bytes::from_static(b"{}")
        );
    }
}

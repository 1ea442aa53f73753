//! The JSON of recent stored versions, found by the version itself, so that a version is
//! serialized once however many times it is sent: as the answer to the write that made it, then to
//! each watch of its resource. The store has each version serialized as it commits it (its JSON is
//! what the store keeps, see [`crate::store`]; it is made on a thread of its own, see
//! [`crate::serialized`]) and remembers the encoding here; a version read back from
//! its JSON is remembered too. A NodeClaim with its 600 instance types took as long to serialize for
//! its answer as for the watch, each of its seven or eight writes.
//!
//! An encoding is found by the address of the version it encodes, which a `Weak` reference keeps
//! from being reused while the entry lives. Only the newest [`RECENT`] encodings are kept: a watch
//! reads a version moments after it is written. It cannot fail: a version not found is serialized
//! again.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, Weak},
};

use bytes::Bytes;
use serde_json::Value;

use crate::serialized::Json;

/// How many encodings are kept: enough for a watch that is a burst of writes behind (a watch reads
/// up to 512 events at a time, of every resource's writes in turn).
pub const RECENT: usize = 2048;

/// The encodings of recently sent stored versions.
#[derive(Debug, Default)]
pub struct Encodings {
    recent: Mutex<Recent>,
}

/// Encodings by the address of their version, and those addresses oldest first.
#[derive(Debug, Default)]
struct Recent {
    by_version: HashMap<usize, (Weak<Value>, Json)>,
    order: VecDeque<usize>,
}

impl Encodings {
    /// The JSON of a stored version, serialized now unless it was lately.
    pub fn of(&self, version: &Arc<Value>) -> Bytes {
        let known = self
            .lock()
            .by_version
            .get(&address(version))
            .map(|(_, json)| json.clone());
        if let Some(json) = known {
            return json.bytes().clone();
        }
        let bytes = Bytes::from(serde_json::to_vec(&**version).unwrap_or_default());
        self.remember(version, Json::from(bytes.clone()));
        bytes
    }

    /// Records `json` as the JSON of `version`, forgetting the oldest encoding when full.
    pub fn remember(&self, version: &Arc<Value>, json: Json) {
        let address = address(version);
        let mut recent = self.lock();
        if recent.order.len() == RECENT
            && let Some(oldest) = recent.order.pop_front()
        {
            recent.by_version.remove(&oldest);
        }
        let entry = (Arc::downgrade(version), json);
        if recent.by_version.insert(address, entry).is_none() {
            recent.order.push_back(address);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // Entries are whole when pushed: a poisoned lock still holds good ones.
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The address that stands for a version while an entry's `Weak` keeps its allocation.
fn address(version: &Arc<Value>) -> usize {
    Arc::as_ptr(version) as usize
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_version_is_encoded_once_and_a_new_version_again() {
        let encodings = Encodings::default();
        let first = Arc::new(json!({"metadata": {"name": "a", "resourceVersion": "1"}}));
        let sent = encodings.of(&first);
        assert_eq!(sent, serde_json::to_vec(&*first).expect("encodes"));
        assert_eq!(
            encodings.of(&first).as_ptr(),
            sent.as_ptr(),
            "the same bytes, not a new encoding"
        );
        let second = Arc::new(json!({"metadata": {"name": "a", "resourceVersion": "2"}}));
        assert_eq!(
            encodings.of(&second),
            serde_json::to_vec(&*second).expect("encodes")
        );
    }

    #[test]
    fn only_the_newest_encodings_are_kept() {
        let encodings = Encodings::default();
        let versions: Vec<Arc<Value>> = (0..=RECENT).map(|n| Arc::new(json!({"n": n}))).collect();
        let oldest = encodings.of(&versions[0]);
        for version in &versions[1..] {
            encodings.of(version);
        }
        assert_eq!(encodings.lock().by_version.len(), RECENT);
        assert_ne!(
            encodings.of(&versions[0]).as_ptr(),
            oldest.as_ptr(),
            "encoded again"
        );
    }
}

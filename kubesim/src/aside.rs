//! An object read for a write that cannot change its spec (a merge patch of its status): every
//! top-level field parsed but `spec`, which stays JSON and goes back into the written object as it
//! was. A NodeClaim's spec carries up to 600 instance types; parsing it again, copying it,
//! comparing it and serializing it at each of a claim's status writes was most of what those writes
//! cost, and the parse grew with the cluster as fewer claims were still parsed when written again
//! (see [`crate::store`]).
//!
//! Fails only on stored JSON that does not parse ([`ApiError::Internal`]).

use std::collections::BTreeMap;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, value::RawValue};

use crate::error::ApiError;

/// The top-level field left as JSON.
const SPEC: &str = "spec";

/// An object with its spec set aside: see the module docs.
#[derive(Debug)]
pub struct SpecAside {
    /// Every top-level field but `spec`.
    pub view: Value,
    spec: Option<Box<RawValue>>,
}

impl SpecAside {
    /// Reads a stored object's JSON, parsing all but its spec.
    pub fn read(json: &[u8]) -> Result<Self, ApiError> {
        let unreadable =
            |error: serde_json::Error| ApiError::Internal(format!("a stored object does not parse: {error}"));
        let fields: BTreeMap<String, &RawValue> = serde_json::from_slice(json).map_err(unreadable)?;
        let mut view = Map::new();
        let mut spec = None;
        for (name, raw) in fields {
            if name == SPEC {
                spec = Some(raw.to_owned());
            } else {
                view.insert(name, serde_json::from_str(raw.get()).map_err(unreadable)?);
            }
        }
        Ok(Self {
            view: Value::Object(view),
            spec,
        })
    }

    /// The JSON of `view` (this view, or one written from it) with the spec back in its place. A
    /// `spec` in `view` is not written: the spec set aside is the object's.
    pub fn json_of(&self, view: &Value) -> Vec<u8> {
        serde_json::to_vec(&Whole {
            view,
            spec: self.spec.as_deref(),
        })
        .unwrap_or_default()
    }
}

/// A view and its spec, serialized as one object with its fields in name order, as a stored
/// object's are.
struct Whole<'a> {
    view: &'a Value,
    spec: Option<&'a RawValue>,
}

impl Serialize for Whole<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let empty = Map::new();
        let fields = self.view.as_object().unwrap_or(&empty);
        let mut map = serializer.serialize_map(None)?;
        let mut spec = self.spec;
        for (name, value) in fields.iter().filter(|(name, _)| name.as_str() != SPEC) {
            if name.as_str() > SPEC
                && let Some(raw) = spec.take()
            {
                map.serialize_entry(SPEC, raw)?;
            }
            map.serialize_entry(name, value)?;
        }
        if let Some(raw) = spec {
            map.serialize_entry(SPEC, raw)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::Version;

    fn read(object: &Value) -> SpecAside {
        SpecAside::read(&serde_json::to_vec(object).expect("serializes")).expect("reads")
    }

    fn claim() -> Value {
        json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "a", "resourceVersion": "7"},
            "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "c5.large"]}]},
            "status": {"providerID": "kwok://a"},
        })
    }

    #[test]
    fn the_view_holds_all_but_the_spec_and_writes_back_the_same_json() {
        let json = serde_json::to_vec(&claim()).expect("serializes");
        let aside = read(&claim());
        assert!(aside.view.get("spec").is_none());
        assert_eq!(aside.view["status"]["providerID"], "kwok://a");
        assert_eq!(aside.json_of(&aside.view), json);
    }

    #[test]
    fn a_changed_view_keeps_the_spec_it_was_read_with() {
        let aside = read(&claim());
        let mut written = aside.view.clone();
        written["status"]["nodeName"] = json!("node-a");
        written["spec"] = json!({"requirements": []});
        let whole: Value = serde_json::from_slice(&aside.json_of(&written)).expect("JSON");
        let mut expected = claim();
        expected["status"]["nodeName"] = json!("node-a");
        assert_eq!(whole, expected);
    }

    #[test]
    fn an_object_without_a_spec_is_written_without_one() {
        let object =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}, "metadata": {"name": "c"}});
        let aside = read(&object);
        let whole: Value = serde_json::from_slice(&aside.json_of(&aside.view)).expect("JSON");
        assert_eq!(whole, object);
    }

    #[test]
    fn a_version_read_for_all_but_its_spec_leaves_the_spec_out_only_when_it_parses_it() {
        let json = bytes::Bytes::from(serde_json::to_vec(&claim()).expect("serializes"));
        let cold = Version::encoded(json.clone()).value_but_spec().expect("reads");
        assert!(cold.get("spec").is_none());
        assert_eq!(cold["status"], claim()["status"]);
        let warm = Version::parsed(json, std::sync::Arc::new(claim()));
        assert_eq!(*warm.value_but_spec().expect("reads"), claim());
    }

    #[test]
    fn json_that_does_not_parse_is_an_internal_error() {
        assert!(matches!(
            SpecAside::read(b"{\"spec\": ["),
            Err(ApiError::Internal(_))
        ));
    }
}

//! Custom resources of Joist's CRDs (NodePool, NodeClaim, EC2NodeClass, NodeOverlay, CapacityBuffer) judged as a
//! real API server with those CRDs judges them: their OpenAPI schema and CEL rules, which are
//! `joist validate`'s checks less the few it makes beyond the CRDs
//! ([`joist_messages::apis::beyond_the_crds`]). The real-control-plane tier holds both to the real
//! server's verdicts on the same corpus.
//!
//! Checked on every write of the main resource through the API (create, update, patch, apply),
//! not on status writes; kinds of other CRDs are not judged. An update is refused only for problems
//! the stored object did not have already, as kube-apiserver ratchets CRD validation: an object
//! kept from an older CRD can still get its finalizers removed; an update that changes only
//! metadata is not judged again at all, since the schemas and rules read no metadata and its
//! verdict is the stored object's. Failure mode: a refused object is a 422 `Invalid` naming every
//! field and its problem, as kube-apiserver lists them.

use std::{
    borrow::Cow,
    sync::{LazyLock, Mutex},
};

use joist_messages::apis::{
    beyond_the_crds::beyond_the_crds,
    manifest::{Checker, Outcome},
};
use serde_json::Value;

use super::ResourcePath;
use crate::error::ApiError;
use crate::object::Pointer;

/// One checker (its schemas and patterns compiled once) for every request.
static CHECKER: LazyLock<Mutex<Checker>> = LazyLock::new(|| Mutex::new(Checker::new()));

/// Refuses `object`, a custom resource written through `path` over `stored` (`None` for a create),
/// when the API server would.
pub fn judge(path: &ResourcePath, stored: Option<&Value>, object: &Value) -> Result<(), ApiError> {
    let rtype = &path.rtype;
    if !matches!(
        rtype.group.as_str(),
        "karpenter.sh" | "karpenter.k8s.aws" | "autoscaling.x-k8s.io"
    ) {
        return Ok(());
    }
    if stored.is_some_and(|stored| same_but_metadata(stored, object)) {
        return Ok(());
    }
    let after = problems(object);
    if after.is_empty() {
        return Ok(());
    }
    let before = stored.map(problems).unwrap_or_default();
    let refused: Vec<String> = after
        .into_iter()
        .filter(|problem| !before.contains(problem))
        .collect();
    let reason = match refused.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    Err(ApiError::Invalid {
        kind: format!("{}.{}", rtype.kind, rtype.group),
        name: object
            .at("/metadata/name")
            .and_then(Value::as_str)
            .or(path.name.as_deref())
            .unwrap_or_default()
            .to_owned(),
        reason,
    })
}

/// Whether two versions of an object differ in nothing but metadata.
fn same_but_metadata(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return false;
    };
    let fields =
        |object: &serde_json::Map<String, Value>| object.keys().filter(|key| *key != "metadata").count();
    fields(a) == fields(b)
        && a.iter()
            .filter(|(key, _)| key.as_str() != "metadata")
            .all(|(key, value)| b.get(key) == Some(value))
}

/// `object` as it is validated: a create by generateName is named first (a copy); any other
/// object is judged as it is.
fn named(object: &Value) -> Cow<'_, Value> {
    if object.at("/metadata/name").is_some() {
        return Cow::Borrowed(object);
    }
    let Some(prefix) = object.at("/metadata/generateName").and_then(Value::as_str) else {
        return Cow::Borrowed(object);
    };
    let mut judged = object.clone();
    judged["metadata"]["name"] = Value::String(format!("{prefix}xxxxx"));
    Cow::Owned(judged)
}

/// What the API server refuses in `object`, each as `field: problem`; none for a valid object.
fn problems(object: &Value) -> Vec<String> {
    let judged = named(object);
    let outcome = {
        let mut checker = CHECKER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        checker.check_document(&judged).outcome
    };
    let Outcome::Invalid(violations) = outcome else {
        return Vec::new();
    };
    violations
        .iter()
        .filter(|violation| beyond_the_crds(object, violation).is_none())
        .map(ToString::to_string)
        .collect()
}

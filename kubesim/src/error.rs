//! The API server's errors, each rendered as the `Status` object and HTTP code kube-apiserver returns,
//! so clients (kube-rs, kubectl, helm) react to them as they would against a real cluster.

use serde_json::{Value, json};

/// A request the API server refuses, with the reason Kubernetes gives for it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 404: the object, resource or namespace does not exist.
    #[error("{resource} \"{name}\" not found")]
    NotFound {
        /// The qualified resource (`pods`, `nodepools.karpenter.sh`).
        resource: String,
        /// The object's name.
        name: String,
    },
    /// 404 for a path that names no served resource.
    #[error("the server could not find the requested resource")]
    NoSuchResource,
    /// 409: create of a name that is taken.
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists {
        /// The qualified resource.
        resource: String,
        /// The object's name.
        name: String,
    },
    /// 409: a write carried a stale resourceVersion or uid precondition.
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {reason}")]
    Conflict {
        /// The qualified resource.
        resource: String,
        /// The object's name.
        name: String,
        /// What did not match.
        reason: String,
    },
    /// 409: a server-side apply would change fields other field managers own.
    #[error("{message}")]
    ApplyConflict {
        /// The object's name.
        name: String,
        /// Which managers own which of the fields, as kube-apiserver words it.
        message: String,
    },
    /// 422: the object is not acceptable (a missing name, a changed immutable field …).
    #[error("{kind} \"{name}\" is invalid: {reason}")]
    Invalid {
        /// The kind of the object.
        kind: String,
        /// The object's name.
        name: String,
        /// The field and the problem.
        reason: String,
    },
    /// 400: the request itself is malformed (bad JSON, bad selector, namespace mismatch …).
    #[error("{0}")]
    BadRequest(String),
    /// 410: a watch asked for a resourceVersion older than the retained history.
    #[error("too old resource version: {requested} ({oldest})")]
    Gone {
        /// The resourceVersion asked for.
        requested: u64,
        /// The oldest resourceVersion a watch can still start from.
        oldest: u64,
    },
    /// 429: an eviction would break a PodDisruptionBudget.
    #[error("{0}")]
    TooManyRequests(String),
    /// 403: the request is refused by policy (new finalizers on a deleting object …).
    #[error("{0}")]
    Forbidden(String),
    /// 405: the verb is not supported on this path.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 500: the request cannot be served as asked (an eviction covered by two budgets …).
    #[error("{0}")]
    Internal(String),
    /// 500 with no reason: a server-side apply whose configuration cannot be typed (an unknown
    /// field), as kube-apiserver fails it.
    #[error("{0}")]
    ApplyFailed(String),
    /// 504: the request may or may not have been carried out; its answer did not come in time.
    #[error("{0}")]
    Timeout(String),
    /// 415: the PATCH content type is not one the resource accepts.
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
}

impl ApiError {
    /// The 409 a write made against an older version of the object `name` gets.
    pub fn modified(resource: String, name: String) -> Self {
        Self::Conflict {
            resource,
            name,
            reason:
                "the object has been modified; please apply your changes to the latest version and try again"
                    .to_owned(),
        }
    }

    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } | Self::NoSuchResource => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } | Self::ApplyConflict { .. } => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest(_) => 400,
            Self::Gone { .. } => 410,
            Self::TooManyRequests(_) => 429,
            Self::Forbidden(_) => 403,
            Self::MethodNotAllowed => 405,
            Self::UnsupportedMediaType(_) => 415,
            Self::Internal(_) | Self::ApplyFailed(_) => 500,
            Self::Timeout(_) => 504,
        }
    }

    /// The machine-readable reason (`NotFound`, `AlreadyExists`, …); empty when kube-apiserver
    /// gives none.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::NoSuchResource => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } | Self::ApplyConflict { .. } => "Conflict",
            Self::Invalid { .. } => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Gone { .. } => "Expired",
            Self::TooManyRequests(_) => "TooManyRequests",
            Self::Forbidden(_) => "Forbidden",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::Internal(_) => "InternalError",
            Self::ApplyFailed(_) => "",
            Self::Timeout(_) => "Timeout",
        }
    }

    /// The `Status` object sent as the response body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if self.reason().is_empty()
            && let Some(fields) = status.as_object_mut()
        {
            fields.remove("reason");
        }
        match self {
            Self::NotFound { resource, name }
            | Self::AlreadyExists { resource, name }
            | Self::Conflict { resource, name, .. } => {
                let (kind, group) = resource.split_once('.').unwrap_or((resource, ""));
                status["details"] = json!({"name": name, "group": group, "kind": kind});
            }
            Self::Invalid { kind, name, reason } => {
                // kubectl prints an Invalid status's causes after "The Kind \"name\" is invalid".
                let (field, message) = reason.split_once(": ").unwrap_or(("", reason));
                status["details"] = json!({"name": name, "kind": kind, "causes": [
                    {"reason": "FieldValueInvalid", "message": message, "field": field}
                ]});
            }
            Self::ApplyConflict { name, .. } => status["details"] = json!({"name": name}),
            _ => {}
        }
        status
    }
}

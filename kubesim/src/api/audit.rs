//! What clients asked of the API server, as RBAC names it: a verb (`get`, `list`, `watch`,
//! `create`, `update`, `patch`, `delete`, `deletecollection`), an API group, a resource with its
//! subresource (`pods/eviction`), a namespace and a name. Tests hold a controller's requests against
//! the Roles its chart grants, so the code cannot start using an API the chart does not grant
//! without a test failing.
//!
//! Every request to a resource is recorded, whether or not it succeeded (RBAC is checked before the
//! request is served). Each distinct access is kept once.

use std::{
    collections::BTreeSet,
    sync::{Mutex, PoisonError},
};

use http::Method;

use super::request::ResourcePath;

/// One access (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    /// The RBAC verb.
    pub verb: &'static str,
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource, `resource/subresource` for a subresource.
    pub resource: String,
    /// The namespace, for namespaced resources.
    pub namespace: Option<String>,
    /// The object's name, when the request names one (creates and collections do not).
    pub name: Option<String>,
}

/// The accesses seen so far.
#[derive(Debug, Default)]
pub struct Audit {
    seen: Mutex<BTreeSet<Access>>,
}

impl Audit {
    /// Records a request of `method` (a watch when `watch`) on `path`.
    pub fn record(&self, method: &Method, watch: bool, path: &ResourcePath) {
        let named = path.name.is_some();
        let verb = match (method.as_str(), named) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return,
        };
        let resource = match &path.subresource {
            Some(subresource) => format!("{}/{subresource}", path.rtype.plural),
            None => path.rtype.plural.clone(),
        };
        let access = Access {
            verb,
            group: path.rtype.group.clone(),
            resource,
            namespace: path.rtype.namespaced.then(|| path.namespace.clone()).flatten(),
            name: if verb == "create" && path.subresource.is_none() {
                None
            } else {
                path.name.clone()
            },
        };
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(access);
    }

    /// Every distinct access, in order.
    pub fn accesses(&self) -> Vec<Access> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}

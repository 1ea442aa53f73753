//! Generic object storage with kube-apiserver's write semantics, for every served resource.
//!
//! One lock guards all tables, so a write and the watch event it produces are atomic. The store
//! stamps `uid`, `creationTimestamp`, `resourceVersion` (one monotonic counter for all resources) and
//! `generation`; refuses stale writes with 409; keeps status and spec apart for resources with a
//! status subresource; turns a delete of an object with finalizers into a `deletionTimestamp`; removes
//! dependents whose owners are all gone (background garbage collection); serves CRDs the moment they
//! are created; and keeps a bounded history per resource so watches resume from a resourceVersion
//! (older than the history: 410 Gone).
//!
//! What it keeps of a live object is its JSON (a pod's is about 1.5 KB; parsed, it is a
//! `serde_json::Value` tree of about 13 KB), and the parsed version as long as anyone holds it: the
//! watch history keeps the newest, so a version just written is read without parsing, and one read
//! again after the history let go of it is parsed once more. The JSON is also what a watch or an
//! answer sends ([`Store::encoded`]). A write that cannot change the object's spec (a merge patch
//! of its status, or one that names no spec) parses all of it but the spec
//! ([`Store::modify_sparing_spec`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard, Weak},
};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::aside::SpecAside;
use crate::busy::Busy;
use crate::encoded::Encodings;
use crate::history::{History, Reader, Reads};
use crate::object::text;
use crate::serialized::{Json, Serializing};
use crate::{
    clock::Clock,
    error::ApiError,
    object::Pointer,
    resources::{GroupResource, Registry, ResourceType},
};

/// A pod's `terminationGracePeriodSeconds` when its spec does not say.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

/// Watch events kept per resource for watches that resume from a resourceVersion (besides those
/// open watches have yet to read: see [`crate::history`]).
pub const HISTORY_PER_RESOURCE: usize = 1_000;

/// The names a create by `generateName` tries before it is refused as taken: kube-apiserver's
/// first and seven retries (RetryGenerateName: on by default since 1.31, GA in 1.32).
pub const GENERATE_NAME_ATTEMPTS: usize = 8;

/// Namespaces that exist from the start, as in a new cluster.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Where an object lives within its resource: namespace (empty when cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The namespace, or empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A key from a namespace (empty for cluster-scoped) and a name.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The key of an object, from its metadata.
    pub fn of(object: &Value) -> Self {
        Self::new(
            text(object, "/metadata/namespace"),
            text(object, "/metadata/name"),
        )
    }
}

/// What a watch event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The object was created.
    Added,
    /// The object changed.
    Modified,
    /// The object is gone.
    Deleted,
}

impl EventKind {
    /// The `type` field of a watch event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change to one object.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (for deletes: as it was, with the delete's resourceVersion).
    pub object: Version,
    /// The object before the change, so selector watches can tell "stopped matching".
    pub previous: Option<Version>,
    /// The resourceVersion of the change.
    pub revision: u64,
}

impl WatchEvent {
    /// The same event holding only the JSON of its versions (see [`Version`]).
    pub(crate) fn cooled(&self) -> Self {
        Self {
            kind: self.kind,
            object: self.object.cooled(),
            previous: self.previous.as_ref().map(Version::cooled),
            revision: self.revision,
        }
    }

    /// Whether the event still holds either of its versions parsed.
    pub(crate) fn is_parsed(&self) -> bool {
        self.object.parsed.is_some()
            || self
                .previous
                .as_ref()
                .is_some_and(|previous| previous.parsed.is_some())
    }
}

/// One version of an object as a watch event carries it: its JSON, and its parsed form while the
/// event is among the newest of its resource or a controller has yet to read it
/// ([`crate::history`]). Older events, kept for watches that lag, hold only the JSON, which the
/// live object or the next event mostly shares.
#[derive(Debug, Clone)]
pub struct Version {
    json: Json,
    parsed: Option<Arc<Value>>,
}

impl Version {
    /// A version read from its JSON when asked for.
    pub fn encoded(json: impl Into<Json>) -> Self {
        Self {
            json: json.into(),
            parsed: None,
        }
    }

    /// A version at hand in both forms.
    pub fn parsed(json: impl Into<Json>, object: Arc<Value>) -> Self {
        Self {
            json: json.into(),
            parsed: Some(object),
        }
    }

    /// The version's JSON.
    pub fn json(&self) -> &Bytes {
        self.json.bytes()
    }

    /// The version parsed: at once while the event is new, parsed again from its JSON otherwise.
    pub fn value(&self) -> Result<Arc<Value>, ApiError> {
        match &self.parsed {
            Some(object) => Ok(object.clone()),
            None => serde_json::from_slice(self.json.bytes())
                .map(Arc::new)
                .map_err(|error| ApiError::Internal(format!("a stored version does not parse: {error}"))),
        }
    }

    /// The version parsed, for a reader of all but its spec: the spec is left out when the version
    /// has to be parsed from its JSON ([`SpecAside`]; a NodeClaim's is most of it).
    pub fn value_but_spec(&self) -> Result<Arc<Value>, ApiError> {
        match &self.parsed {
            Some(object) => Ok(object.clone()),
            None => SpecAside::read(self.json.bytes()).map(|aside| Arc::new(aside.view)),
        }
    }

    /// The version read as `T`: from its parsed form while the event is new, otherwise from its
    /// JSON, building only what `T` keeps.
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let result = match &self.parsed {
            Some(object) => T::deserialize(&**object),
            None => serde_json::from_slice(self.json.bytes()),
        };
        result.map_err(|error| ApiError::Internal(format!("a stored version does not read: {error}")))
    }

    fn cooled(&self) -> Self {
        Self::encoded(self.json.clone())
    }
}

/// An object as JSON, and the version (`apiVersion`) it is in.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The object's JSON.
    pub json: Bytes,
    /// Its `apiVersion`.
    pub api_version: String,
}

impl Encoded {
    fn of(json: Bytes, object: &Value) -> Self {
        Self {
            json,
            api_version: text(object, "/apiVersion").to_owned(),
        }
    }
}

/// Which part of an object an update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The object (status ignored when the resource has a status subresource).
    Main,
    /// The `/status` subresource: only status changes.
    Status,
    /// Spec and status at once: what the cluster's own components (binding, kubelets) write.
    Whole,
}

/// How a delete treats the object's dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Dependents whose owners are all gone are deleted after the owner (the default).
    #[default]
    Background,
    /// Dependents lose their owner reference and stay.
    Orphan,
}

/// Preconditions and options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// What happens to dependents.
    pub propagation: Propagation,
    /// Only delete if the uid still matches.
    pub uid: Option<String>,
    /// Only delete if the resourceVersion still matches.
    pub resource_version: Option<String>,
    /// For pods: how long the containers get to stop (`None`: the pod's
    /// `terminationGracePeriodSeconds`, 30 by default; `Some(0)`: at once).
    pub grace_period_seconds: Option<i64>,
    /// Check everything but change nothing.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// A delete with no grace period: the object goes at once (a kubelet's final delete of a
    /// stopped pod, pod garbage collection).
    pub fn immediate() -> Self {
        Self {
            grace_period_seconds: Some(0),
            ..Self::default()
        }
    }
}

/// One page of a list: the objects, parsed or as JSON.
#[derive(Debug, Clone)]
pub struct ListPage<T> {
    /// The objects, in namespace/name order.
    pub items: Vec<T>,
    /// The resourceVersion the list reflects.
    pub revision: u64,
    /// Where the next page starts, if the list was cut at `limit`.
    pub next: Option<ObjectKey>,
}

/// A watch registered with the store: the events since its start, and a way to wait for more.
#[derive(Debug)]
pub struct WatchCursor {
    resource: GroupResource,
    /// The last revision delivered.
    pub position: u64,
    changes: watch::Receiver<u64>,
    /// Holds the history this watch has not read yet.
    reader: Reader,
}

/// A live object as the store keeps it: see the module docs.
#[derive(Debug)]
struct Stored {
    json: Json,
    parsed: Weak<Value>,
}

impl Stored {
    /// Keeps `object`, serialized as `serializing` says, and remembers its encoding for those who
    /// send it.
    fn new(object: &Arc<Value>, serializing: Serializing, encodings: &Encodings) -> Self {
        let json = Json::of(object, serializing);
        encodings.remember(object, json.clone());
        Self {
            json,
            parsed: Arc::downgrade(object),
        }
    }

    /// The object as a watch event carries it: parsed while someone still holds it parsed.
    fn version(&self) -> Version {
        match self.parsed.upgrade() {
            Some(object) => Version::parsed(self.json.clone(), object),
            None => Version::encoded(self.json.clone()),
        }
    }

    /// The object: the parsed version someone still holds, or parsed again from its JSON.
    fn object(&mut self, encodings: &Encodings) -> Result<Arc<Value>, ApiError> {
        if let Some(object) = self.parsed.upgrade() {
            return Ok(object);
        }
        let object = Arc::new(
            serde_json::from_slice(self.json.bytes())
                .map_err(|error| ApiError::Internal(format!("a stored object does not parse: {error}")))?,
        );
        encodings.remember(&object, self.json.clone());
        self.parsed = Arc::downgrade(&object);
        Ok(object)
    }
}

/// What a commit knows of the version it replaces.
enum Replaced {
    /// Nothing: it is read back from the table, and the indexes move from it.
    Stored,
    /// Its JSON: an edit ([`Store::edit`]) left its metadata, which the indexes read, as it was.
    Edited(Json),
}

#[derive(Debug)]
struct Table {
    objects: BTreeMap<ObjectKey, Stored>,
    history: History,
    changed: watch::Sender<u64>,
}

impl Table {
    fn new(revision: u64) -> Self {
        Self {
            objects: BTreeMap::new(),
            // Nothing of this resource happened before its table: until history is dropped, a
            // watch resumes from any revision (a client that listed it empty, then watched).
            history: History::default(),
            changed: watch::Sender::new(revision),
        }
    }
}

#[derive(Debug)]
struct State {
    revision: u64,
    uid_counter: u64,
    tables: HashMap<GroupResource, Table>,
    registry: Registry,
    /// Every live object by uid.
    by_uid: HashMap<String, (GroupResource, ObjectKey)>,
    /// Owner uid → dependents that name it in ownerReferences.
    dependents: HashMap<String, BTreeSet<(GroupResource, ObjectKey)>>,
    /// The newest revision, for components that react to any write.
    any_change: watch::Sender<u64>,
    clock: Clock,
    history_limit: usize,
    /// When committed versions are serialized.
    serializing: Serializing,
    /// Creates still to refuse per resource (fault injection for tests and scenarios).
    failing_creates: HashMap<GroupResource, usize>,
    /// The JSON of recent versions, shared with [`Store`] for senders outside the lock.
    encodings: Arc<Encodings>,
}

/// The API server's storage. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    state: Mutex<State>,
    clock: Clock,
    uid_seed: u64,
    evictions: Mutex<()>,
    busy: Busy,
    encodings: Arc<Encodings>,
}

impl Store {
    /// An empty cluster with the built-in resources and the initial namespaces. `uid_seed` makes
    /// generated uids and names reproducible.
    pub fn new(clock: Clock, uid_seed: u64) -> Self {
        let encodings = Arc::new(Encodings::default());
        let store = Self {
            state: Mutex::new(State {
                revision: 1,
                uid_counter: 0,
                tables: HashMap::new(),
                registry: Registry::builtin(),
                by_uid: HashMap::new(),
                dependents: HashMap::new(),
                any_change: watch::Sender::new(1),
                clock,
                history_limit: HISTORY_PER_RESOURCE,
                serializing: Serializing::default(),
                failing_creates: HashMap::new(),
                encodings: encodings.clone(),
            }),
            clock,
            uid_seed,
            evictions: Mutex::new(()),
            busy: Busy::default(),
            encodings,
        };
        for namespace in INITIAL_NAMESPACES {
            let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
            if let Err(error) = store.create(&GroupResource::new("", "namespaces"), "", object, false) {
                tracing::error!(%error, namespace, "cannot create an initial namespace");
            }
        }
        store
    }

    /// Keeps only `events` watch events per resource for resumes, besides those open watches have
    /// yet to read (fewer than [`HISTORY_PER_RESOURCE`] makes resumes fail sooner, which tests of
    /// 410 Gone need).
    pub fn with_history_limit(self, events: usize) -> Self {
        self.lock().history_limit = events.max(1);
        self
    }

    /// Serializes committed versions as `serializing` says (at once unless told).
    pub fn with_serializing(self, serializing: Serializing) -> Self {
        self.lock().serializing = serializing;
        self
    }

    /// The cluster's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The meter of the work kubesim does around this store (requests, watches, physics).
    pub fn busy(&self) -> &Busy {
        &self.busy
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the data consistent (each write is applied last), so
        // a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The type served at `group/version/plural`.
    pub fn resource_type(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.lock().registry.get(group, version, plural)
    }

    /// The type of an `apiVersion`/`kind` pair.
    pub fn resource_type_of(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.lock().registry.by_kind(api_version, kind)
    }

    /// Runs `f` over the registry (discovery documents).
    pub fn with_registry<T>(&self, f: impl FnOnce(&Registry) -> T) -> T {
        f(&self.lock().registry)
    }

    /// Held while an eviction checks its budgets and deletes, so two evictions never spend the
    /// same disruption.
    pub fn eviction_guard(&self) -> MutexGuard<'_, ()> {
        self.evictions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver that sees the newest revision after every write to any resource.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.lock().any_change.subscribe()
    }

    /// The newest resourceVersion.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// The JSON of a version this store returned: kept from its write when recent, serialized
    /// again otherwise.
    pub fn encoded(&self, version: &Arc<Value>) -> Bytes {
        self.encodings.of(version)
    }

    /// One object.
    pub fn get(&self, resource: &GroupResource, key: &ObjectKey) -> Result<Arc<Value>, ApiError> {
        self.lock().current(resource, key)
    }

    /// Objects of a resource (in one namespace, or all when `namespace` is None) that pass `filter`,
    /// starting after `from` and cut at `limit`.
    pub fn list(
        &self,
        resource: &GroupResource,
        namespace: Option<&str>,
        from: Option<&ObjectKey>,
        limit: Option<usize>,
        filter: impl Fn(&Value) -> bool,
    ) -> ListPage<Arc<Value>> {
        self.page(resource, namespace, from, limit, |key, stored, encodings| {
            passing(resource, key, stored, encodings, &filter)
        })
    }

    /// Every object of a resource, in the version it is stored in, read as `T`, building only what
    /// `T` keeps; an object that does not read as `T` is logged and left out.
    pub fn list_as<T: DeserializeOwned>(&self, resource: &GroupResource) -> Vec<T> {
        let page = self.page(resource, None, None, None, |key, stored, _| {
            stored
                .version()
                .read()
                .inspect_err(|error| {
                    tracing::error!(%error, resource = %resource.qualified(), name = %key.name, "kubesim lists an object without it");
                })
                .ok()
        });
        page.items
    }

    /// [`Store::list`] of every object in range, each as the JSON the store keeps, so that a list
    /// without selectors costs neither parsing nor serializing.
    pub fn list_encoded(
        &self,
        resource: &GroupResource,
        namespace: Option<&str>,
        from: Option<&ObjectKey>,
        limit: Option<usize>,
    ) -> ListPage<Bytes> {
        self.page(resource, namespace, from, limit, |_, stored, _| {
            Some(stored.json.bytes().clone())
        })
    }

    /// The objects in range that `pick` takes, in key order, cut at `limit`.
    fn page<T>(
        &self,
        resource: &GroupResource,
        namespace: Option<&str>,
        from: Option<&ObjectKey>,
        limit: Option<usize>,
        mut pick: impl FnMut(&ObjectKey, &mut Stored, &Encodings) -> Option<T>,
    ) -> ListPage<T> {
        let mut state = self.lock();
        let state = &mut *state;
        let mut page = ListPage {
            items: Vec::new(),
            revision: state.revision,
            next: None,
        };
        let Some(table) = state.tables.get_mut(resource) else {
            return page;
        };
        let start = match (from, namespace) {
            (Some(from), _) => std::ops::Bound::Excluded(from.clone()),
            (None, Some(namespace)) => std::ops::Bound::Included(ObjectKey::new(namespace, "")),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let mut last: Option<&ObjectKey> = None;
        for (key, stored) in table.objects.range_mut((start, std::ops::Bound::Unbounded)) {
            if namespace.is_some_and(|namespace| key.namespace != namespace) {
                break;
            }
            let Some(item) = pick(key, stored, &state.encodings) else {
                continue;
            };
            if limit.is_some_and(|limit| page.items.len() == limit) {
                page.next = last.cloned();
                break;
            }
            page.items.push(item);
            last = Some(key);
        }
        page
    }

    /// Creates an object. The namespace comes from the request (empty for cluster-scoped resources).
    /// A name made from `generateName` that is taken is made again, up to
    /// [`GENERATE_NAME_ATTEMPTS`] names in all, as kube-apiserver does since 1.31; then the create
    /// is refused as `AlreadyExists`.
    pub fn create(
        &self,
        resource: &GroupResource,
        namespace: &str,
        mut object: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let rtype = state.resource_type(resource)?;
        if let Some(left) = state.failing_creates.get_mut(resource).filter(|left| **left > 0) {
            *left -= 1;
            return Err(ApiError::Internal(format!(
                "injected fault: this create of {} fails",
                resource.qualified()
            )));
        }
        refuse_invalid_crd(&rtype.kind, &object)?;
        let Some(fields) = object.as_object_mut() else {
            return Err(ApiError::BadRequest(format!(
                "the body of a {} create is not an object",
                rtype.kind
            )));
        };
        let metadata = fields.entry("metadata").or_insert_with(|| json!({}));
        let Some(metadata) = metadata.as_object_mut() else {
            return Err(ApiError::BadRequest(format!(
                "{}: metadata is not an object",
                rtype.kind
            )));
        };
        let namespace = if rtype.namespaced {
            match metadata.get("namespace").and_then(Value::as_str) {
                Some(given) if !given.is_empty() && !namespace.is_empty() && given != namespace => {
                    return Err(ApiError::BadRequest(format!(
                        "the namespace of the provided object ({given}) does not match the namespace sent on \
                         the request ({namespace})"
                    )));
                }
                Some(given) if namespace.is_empty() => given.to_owned(),
                _ if namespace.is_empty() => "default".to_owned(),
                _ => namespace.to_owned(),
            }
        } else {
            String::new()
        };
        if rtype.namespaced {
            let namespaces = GroupResource::new("", "namespaces");
            let exists = state
                .tables
                .get(&namespaces)
                .is_some_and(|t| t.objects.contains_key(&ObjectKey::new("", &namespace)));
            if !exists {
                return Err(ApiError::NotFound {
                    resource: "namespaces".to_owned(),
                    name: namespace,
                });
            }
            metadata.insert("namespace".to_owned(), json!(namespace));
        } else {
            metadata.remove("namespace");
        }
        let taken = |state: &State, name: &str| {
            state
                .tables
                .get(resource)
                .is_some_and(|t| t.objects.contains_key(&ObjectKey::new(&namespace, name)))
        };
        let name = match metadata
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(name) => name.to_owned(),
            None => match metadata.get("generateName").and_then(Value::as_str) {
                Some(prefix) => {
                    let mut name = format!("{prefix}{}", state.next_suffix(self.uid_seed));
                    for _ in 1..GENERATE_NAME_ATTEMPTS {
                        if !taken(&state, &name) {
                            break;
                        }
                        name = format!("{prefix}{}", state.next_suffix(self.uid_seed));
                    }
                    name
                }
                None => {
                    return Err(ApiError::Invalid {
                        kind: rtype.kind.clone(),
                        name: String::new(),
                        reason: "metadata.name: Required value: name or generateName is required".to_owned(),
                    });
                }
            },
        };
        let key = ObjectKey::new(&namespace, &name);
        if taken(&state, &name) {
            return Err(ApiError::AlreadyExists {
                resource: resource.qualified(),
                name,
            });
        }
        let uid = state.next_uid(self.uid_seed);
        metadata.insert("name".to_owned(), json!(name));
        metadata.insert("uid".to_owned(), json!(uid));
        metadata.insert("creationTimestamp".to_owned(), json!(self.clock.now_rfc3339()));
        metadata.insert("generation".to_owned(), json!(1));
        metadata.remove("deletionTimestamp");
        metadata.remove("deletionGracePeriodSeconds");
        fields.insert("apiVersion".to_owned(), json!(rtype.api_version()));
        fields.insert("kind".to_owned(), json!(rtype.kind));
        if rtype.status_subresource && !rtype.keeps_status_on_create {
            fields.remove("status");
        }
        initial_status(&rtype.kind, fields);
        if dry_run {
            fields
                .entry("metadata")
                .and_modify(|m| m["resourceVersion"] = json!(state.revision.to_string()));
            return Ok(Arc::new(object));
        }
        if rtype.kind == "CustomResourceDefinition" {
            establish_crd(&mut state.registry, &mut object);
        }
        Ok(state.commit(resource, key, EventKind::Added, Some(object)))
    }

    /// Replaces an object (or its status). A non-empty `metadata.resourceVersion` must match the
    /// stored one.
    pub fn update(
        &self,
        resource: &GroupResource,
        key: &ObjectKey,
        part: Part,
        object: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        self.modify(resource, key, part, dry_run, |_| Ok(object))
    }

    /// Reads an object and writes back what `change` makes of it, under one lock: the way patches
    /// are applied without lost updates.
    pub fn modify(
        &self,
        resource: &GroupResource,
        key: &ObjectKey,
        part: Part,
        dry_run: bool,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let rtype = state.resource_type(resource)?;
        let current = state.current(resource, key)?;
        let Some(mut next) = next_version(&rtype, key, &current, part, change)? else {
            return Ok(current);
        };
        if dry_run {
            return Ok(Arc::new(next));
        }
        if is_deleting(&current) && finalizers(&next).is_empty() {
            return Ok(state.remove(resource, key, Some(next), Propagation::Background));
        }
        if rtype.kind == "CustomResourceDefinition" {
            establish_crd(&mut state.registry, &mut next);
        }
        Ok(state.commit(resource, key.clone(), EventKind::Modified, Some(next)))
    }

    /// [`Store::modify`] for a write that cannot change the object's spec (a write of its status, a
    /// merge patch that names no spec), with the spec set aside ([`SpecAside`]): `change` is given
    /// the object without its spec, and the spec is written back as it was, whatever `change` made
    /// of it. Returns the object as written (as it stays when nothing changed; as it would be
    /// written on a dry run).
    pub fn modify_sparing_spec(
        &self,
        resource: &GroupResource,
        key: &ObjectKey,
        part: Part,
        dry_run: bool,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Encoded, ApiError> {
        let mut state = self.lock();
        let rtype = state.resource_type(resource)?;
        if rtype.kind == "CustomResourceDefinition" {
            // Establishing a CRD reads its spec.
            drop(state);
            let written = self.modify(resource, key, part, dry_run, change)?;
            return Ok(Encoded::of(self.encoded(&written), &written));
        }
        let (aside, json) = state.aside(resource, key)?;
        let Some(mut next) = next_version(&rtype, key, &aside.view, part, change)? else {
            return Ok(Encoded::of(json, &aside.view));
        };
        if dry_run {
            return Ok(Encoded::of(Bytes::from(aside.json_of(&next)), &next));
        }
        if is_deleting(&aside.view) && finalizers(&next).is_empty() {
            let last = serde_json::from_slice(&aside.json_of(&next))
                .map_err(|error| ApiError::Internal(format!("a written object does not parse: {error}")))?;
            let gone = state.remove(resource, key, Some(last), Propagation::Background);
            return Ok(Encoded::of(self.encoded(&gone), &gone));
        }
        let json = state.commit_aside(resource, key.clone(), &mut next, &aside);
        Ok(Encoded::of(json, &next))
    }

    /// A change one of the cluster's own components makes to an object it read (a binding, a
    /// kubelet's status, an Event's series): `edit` is given the object's metadata to read and the
    /// rest of it to change, and says whether it changed anything. The version the caller read is
    /// handed over as `held`: when no one else holds it, the change is made on it in place where
    /// [`Store::modify`] copies the object first. Metadata stays as it was, so there are no system
    /// fields to keep, no generation to count and no indexes to move. Returns the object as written,
    /// or None when nothing changed.
    pub fn edit(
        &self,
        resource: &GroupResource,
        key: &ObjectKey,
        held: Option<Arc<Value>>,
        edit: impl FnOnce(&Value, &mut Value) -> Result<bool, ApiError>,
    ) -> Result<Option<Arc<Value>>, ApiError> {
        let mut state = self.lock();
        let (current, json) = state.current_and_json(resource, key)?;
        drop(held);
        let mut object = Arc::unwrap_or_clone(current);
        let metadata = object
            .as_object_mut()
            .and_then(|fields| fields.remove("metadata"))
            .unwrap_or_else(|| json!({}));
        let changed = edit(&metadata, &mut object)?;
        object["metadata"] = metadata;
        if !changed {
            return Ok(None);
        }
        if is_deleting(&object) && finalizers(&object).is_empty() {
            return Ok(Some(state.remove(
                resource,
                key,
                Some(object),
                Propagation::Background,
            )));
        }
        Ok(Some(state.commit_replacing(
            resource,
            key.clone(),
            EventKind::Modified,
            Some(object),
            Replaced::Edited(json),
        )))
    }

    /// Deletes an object: at once when it has no finalizers, otherwise by setting its
    /// deletionTimestamp. Returns the object as the response shows it.
    pub fn delete(
        &self,
        resource: &GroupResource,
        key: &ObjectKey,
        options: &DeleteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let current = state.current(resource, key)?;
        let precondition = |field: &str, expected: &Option<String>| {
            let actual = text(&current, &format!("/metadata/{field}"));
            match expected {
                Some(expected) if expected != actual => Err(ApiError::Conflict {
                    resource: resource.qualified(),
                    name: key.name.clone(),
                    reason: format!(
                        "Precondition failed: {field} in precondition: {expected}, {field} in object meta: {actual}"
                    ),
                }),
                _ => Ok(()),
            }
        };
        precondition("uid", &options.uid)?;
        precondition("resourceVersion", &options.resource_version)?;
        if options.dry_run {
            return Ok(current);
        }
        if let Some(grace) = graceful_pod_deletion(resource, &current, options) {
            if current.at("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut next = (*current).clone();
            let deadline = joist_messages::time::rfc3339(self.clock.now_seconds() + grace);
            next["metadata"]["deletionTimestamp"] = json!(deadline);
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            return Ok(state.commit(resource, key.clone(), EventKind::Modified, Some(next)));
        }
        if !finalizers(&current).is_empty() {
            if current.at("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut next = (*current).clone();
            next["metadata"]["deletionTimestamp"] = json!(self.clock.now_rfc3339());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok(state.commit(resource, key.clone(), EventKind::Modified, Some(next)));
        }
        Ok(state.remove(resource, key, None, options.propagation))
    }

    /// Makes the next `count` creates of `resource` fail with 500 Internal Server Error, as an API
    /// server under trouble would (fault injection: the object is not created).
    pub fn fail_creates(&self, resource: &GroupResource, count: usize) {
        self.lock().failing_creates.insert(resource.clone(), count);
    }

    /// Registers a watch of a resource that starts after `revision` (None: after now), reading as
    /// `reads`. Fails with 410 when that revision has left the history.
    pub fn watch(
        &self,
        resource: &GroupResource,
        revision: Option<u64>,
        reads: Reads,
    ) -> Result<WatchCursor, ApiError> {
        let mut state = self.lock();
        let now = state.revision;
        let table = state
            .tables
            .entry(resource.clone())
            .or_insert_with(|| Table::new(now));
        let position = revision.unwrap_or(now);
        table.history.resumable(position)?;
        Ok(WatchCursor {
            resource: resource.clone(),
            position,
            changes: table.changed.subscribe(),
            reader: table.history.reader(position, reads),
        })
    }

    /// The events after the cursor's position (at most `max`), advancing it. Fails with 410 when the
    /// watcher fell behind the retained history.
    pub fn poll(&self, cursor: &mut WatchCursor, max: usize) -> Result<Vec<Arc<WatchEvent>>, ApiError> {
        let state = self.lock();
        let Some(table) = state.tables.get(&cursor.resource) else {
            return Ok(Vec::new());
        };
        let events = table.history.after(cursor.position, max)?;
        match events.last() {
            Some(last) => cursor.position = last.revision,
            // Nothing newer: the cursor is level with the resource's last change (a table made
            // after the watcher's revision starts ahead of it), so `changed` waits for the next.
            None => cursor.position = cursor.position.max(*table.changed.borrow()),
        }
        table.history.read(&cursor.reader, cursor.position);
        Ok(events)
    }

    /// Waits until the watched resource changes (or the store is dropped: then returns false).
    pub async fn changed(&self, cursor: &mut WatchCursor) -> bool {
        if *cursor.changes.borrow_and_update() > cursor.position {
            return true;
        }
        cursor.changes.changed().await.is_ok()
    }

    /// A new event name suffix, as kube-apiserver's generateName makes (5 lowercase letters and digits).
    pub fn random_suffix(&self) -> String {
        self.lock().next_suffix(self.uid_seed)
    }
}

impl State {
    /// The type of a served resource (any of its versions).
    fn resource_type(&self, resource: &GroupResource) -> Result<Arc<ResourceType>, ApiError> {
        self.registry
            .any_version(resource)
            .ok_or(ApiError::NoSuchResource)
    }

    /// The live object at `key`.
    fn current(&mut self, resource: &GroupResource, key: &ObjectKey) -> Result<Arc<Value>, ApiError> {
        self.current_and_json(resource, key).map(|(object, _)| object)
    }

    /// The live object at `key`, and its JSON.
    fn current_and_json(
        &mut self,
        resource: &GroupResource,
        key: &ObjectKey,
    ) -> Result<(Arc<Value>, Json), ApiError> {
        let stored = self
            .tables
            .get_mut(resource)
            .and_then(|table| table.objects.get_mut(key))
            .ok_or_else(|| not_found(resource, key))?;
        Ok((stored.object(&self.encodings)?, stored.json.clone()))
    }

    fn next_uid(&mut self, seed: u64) -> String {
        self.uid_counter += 1;
        let high = mix(seed ^ self.uid_counter);
        let low = mix(high ^ 0x9e37_79b9_7f4a_7c15);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0x0fff,
            0x8000 | (low >> 48) & 0x3fff,
            low & 0xffff_ffff_ffff
        )
    }

    fn next_suffix(&mut self, seed: u64) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.uid_counter += 1;
        let mut bits = mix(seed.rotate_left(17) ^ self.uid_counter);
        let alphabet_len = ALPHABET.len() as u64;
        (0..5)
            .map(|_| {
                let index = usize::try_from(bits % alphabet_len).unwrap_or(0);
                bits /= alphabet_len;
                char::from(ALPHABET[index])
            })
            .collect()
    }

    /// Stores (or with None, removes) an object at a new revision and records the event.
    fn commit(
        &mut self,
        resource: &GroupResource,
        key: ObjectKey,
        kind: EventKind,
        object: Option<Value>,
    ) -> Arc<Value> {
        self.commit_replacing(resource, key, kind, object, Replaced::Stored)
    }

    /// [`State::commit`], told what it knows of the version it replaces.
    fn commit_replacing(
        &mut self,
        resource: &GroupResource,
        key: ObjectKey,
        kind: EventKind,
        object: Option<Value>,
        replaced: Replaced,
    ) -> Arc<Value> {
        self.revision += 1;
        let revision = self.revision;
        let table = self
            .tables
            .entry(resource.clone())
            .or_insert_with(|| Table::new(revision - 1));
        let indexed_before = matches!(replaced, Replaced::Stored);
        let previous = match (replaced, table.objects.get_mut(&key)) {
            (Replaced::Edited(json), _) => Some(Version::encoded(json)),
            (Replaced::Stored, Some(stored)) => match stored.object(&self.encodings) {
                Ok(previous) => Some(Version::parsed(stored.json.clone(), previous)),
                Err(error) => {
                    tracing::error!(%error, resource = %resource.qualified(), name = %key.name, "kubesim replaces an object it cannot read");
                    None
                }
            },
            (Replaced::Stored, None) => None,
        };
        let previous_object = previous.as_ref().and_then(|version| version.parsed.clone());
        let (stored, json) = match object {
            Some(mut object) => {
                object["metadata"]["resourceVersion"] = json!(revision.to_string());
                let object = Arc::new(object);
                let stored = Stored::new(&object, self.serializing, &self.encodings);
                let json = stored.json.clone();
                table.objects.insert(key.clone(), stored);
                (object, json)
            }
            None => {
                let mut gone = previous_object.as_deref().cloned().unwrap_or_else(|| json!({}));
                table.objects.remove(&key);
                gone["metadata"]["resourceVersion"] = json!(revision.to_string());
                let gone = Arc::new(gone);
                let json = Json::of(&gone, self.serializing);
                self.encodings.remember(&gone, json.clone());
                (gone, json)
            }
        };
        self.publish(
            resource,
            WatchEvent {
                kind,
                object: Version::parsed(json, stored.clone()),
                previous,
                revision,
            },
        );
        if indexed_before {
            self.reindex(
                resource,
                &key,
                previous_object.as_deref(),
                (kind != EventKind::Deleted).then_some(&*stored),
            );
        }
        stored
    }

    /// Stores a write made with the object's spec set aside ([`Store::modify_sparing_spec`]) at a
    /// new revision, as JSON only, and records the event; returns the JSON.
    fn commit_aside(
        &mut self,
        resource: &GroupResource,
        key: ObjectKey,
        view: &mut Value,
        aside: &SpecAside,
    ) -> Bytes {
        self.revision += 1;
        let revision = self.revision;
        view["metadata"]["resourceVersion"] = json!(revision.to_string());
        let json = Bytes::from(aside.json_of(view));
        let table = self
            .tables
            .entry(resource.clone())
            .or_insert_with(|| Table::new(revision - 1));
        let stored = Stored {
            json: json.clone().into(),
            parsed: Weak::new(),
        };
        let previous = table
            .objects
            .insert(key.clone(), stored)
            .map(|previous| previous.version());
        self.publish(
            resource,
            WatchEvent {
                kind: EventKind::Modified,
                object: Version::encoded(json.clone()),
                previous,
                revision,
            },
        );
        self.reindex(resource, &key, Some(&aside.view), Some(view));
        json
    }

    /// Adds a write's event to its resource's history and wakes those waiting for it.
    fn publish(&mut self, resource: &GroupResource, event: WatchEvent) {
        let revision = event.revision;
        if let Some(table) = self.tables.get_mut(resource) {
            table.history.push(Arc::new(event), self.history_limit);
            table.changed.send_replace(revision);
        }
        self.any_change.send_replace(revision);
    }

    /// The JSON of an object as stored.
    fn stored_json(&self, resource: &GroupResource, key: &ObjectKey) -> Result<Json, ApiError> {
        self.tables
            .get(resource)
            .and_then(|table| table.objects.get(key))
            .map(|stored| stored.json.clone())
            .ok_or_else(|| not_found(resource, key))
    }

    /// The live object at `key` with its spec set aside, and its JSON.
    fn aside(&self, resource: &GroupResource, key: &ObjectKey) -> Result<(SpecAside, Bytes), ApiError> {
        let json = self.stored_json(resource, key)?.bytes().clone();
        Ok((SpecAside::read(&json)?, json))
    }

    /// Keeps the uid and owner indexes in step with a write; a write that changes neither the uid
    /// nor the owners (almost every update) leaves them as they are.
    fn reindex(
        &mut self,
        resource: &GroupResource,
        key: &ObjectKey,
        before: Option<&Value>,
        after: Option<&Value>,
    ) {
        let (owners_before, uid_before) = before.map(indexed).unwrap_or_default();
        let (owners_after, uid_after) = after.map(indexed).unwrap_or_default();
        if owners_before == owners_after && uid_before == uid_after {
            return;
        }
        let entry = (resource.clone(), key.clone());
        for owner in owners_before {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(&entry);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
        if let Some(uid) = uid_before {
            self.by_uid.remove(uid);
        }
        for owner in owners_after {
            self.dependents
                .entry(owner.to_owned())
                .or_default()
                .insert(entry.clone());
        }
        if let Some(uid) = uid_after {
            self.by_uid.insert(uid.to_owned(), entry);
        }
    }

    /// Removes an object for good (its last form is `last`, or the stored one), then collects its
    /// dependents, a namespace's contents, or a CRD's objects.
    fn remove(
        &mut self,
        resource: &GroupResource,
        key: &ObjectKey,
        last: Option<Value>,
        propagation: Propagation,
    ) -> Arc<Value> {
        // Held until the commit reads it back as the object's last form.
        let _last = last.map(|last| {
            let last = Arc::new(last);
            let table = self
                .tables
                .entry(resource.clone())
                .or_insert_with(|| Table::new(0));
            table
                .objects
                .insert(key.clone(), Stored::new(&last, self.serializing, &self.encodings));
            last
        });
        let gone = self.commit(resource, key.clone(), EventKind::Deleted, None);
        let uid = uid_of(&gone).unwrap_or_default().to_owned();
        for (dependent_resource, dependent_key) in self.dependents.get(&uid).cloned().unwrap_or_default() {
            self.release_dependent(&dependent_resource, &dependent_key, &uid, propagation);
        }
        if resource.group.is_empty() && resource.resource == "namespaces" {
            self.empty_namespace(&key.name);
        }
        if resource.group == "apiextensions.k8s.io" {
            self.drop_crd_objects(&gone, &key.name);
        }
        gone
    }

    /// Drops the reference to a deleted owner; deletes the dependent when no owner is left (unless
    /// orphaning).
    fn release_dependent(
        &mut self,
        resource: &GroupResource,
        key: &ObjectKey,
        owner_uid: &str,
        propagation: Propagation,
    ) {
        let Ok(current) = self.current(resource, key) else {
            return;
        };
        let mut next = (*current).clone();
        if let Some(references) = next
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            references.retain(|reference| reference.get("uid").and_then(Value::as_str) != Some(owner_uid));
        }
        let owners_left = indexed(&next).0.iter().any(|uid| self.by_uid.contains_key(*uid));
        if propagation == Propagation::Background && !owners_left {
            if finalizers(&current).is_empty() {
                self.remove(resource, key, None, Propagation::Background);
            } else if current.at("/metadata/deletionTimestamp").is_none() {
                next["metadata"]["deletionTimestamp"] = json!(self.clock.now_rfc3339());
                self.commit(resource, key.clone(), EventKind::Modified, Some(next));
            }
        } else {
            self.commit(resource, key.clone(), EventKind::Modified, Some(next));
        }
    }

    fn empty_namespace(&mut self, namespace: &str) {
        let mut doomed = Vec::new();
        for (resource, table) in &self.tables {
            let from = ObjectKey::new(namespace, "");
            for key in table
                .objects
                .range(from..)
                .map(|(key, _)| key)
                .take_while(|k| k.namespace == namespace)
            {
                doomed.push((resource.clone(), key.clone()));
            }
        }
        for (resource, key) in doomed {
            if self
                .tables
                .get(&resource)
                .is_some_and(|t| t.objects.contains_key(&key))
            {
                self.remove(&resource, &key, None, Propagation::Background);
            }
        }
    }

    fn drop_crd_objects(&mut self, crd: &Value, name: &str) {
        self.registry.remove_crd(name);
        let group = text(crd, "/spec/group");
        let plural = text(crd, "/spec/names/plural");
        let resource = GroupResource::new(group, plural);
        let keys: Vec<ObjectKey> = self
            .tables
            .get(&resource)
            .map(|t| t.objects.keys().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            self.remove(&resource, &key, None, Propagation::Background);
        }
    }
}

/// The object at `key`, parsed, if it passes `filter`; one that does not parse is logged and
/// left out.
fn passing(
    resource: &GroupResource,
    key: &ObjectKey,
    stored: &mut Stored,
    encodings: &Encodings,
    filter: &impl Fn(&Value) -> bool,
) -> Option<Arc<Value>> {
    match stored.object(encodings) {
        Ok(object) => filter(&object).then_some(object),
        Err(error) => {
            tracing::error!(%error, resource = %resource.qualified(), name = %key.name, "kubesim lists an object without it");
            None
        }
    }
}

/// SplitMix64: a fast, well-spread hash for reproducible ids.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn not_found(resource: &GroupResource, key: &ObjectKey) -> ApiError {
    ApiError::NotFound {
        resource: resource.qualified(),
        name: key.name.clone(),
    }
}

/// The object's uid.
pub fn uid_of(object: &Value) -> Option<&str> {
    object.at("/metadata/uid").and_then(Value::as_str)
}

/// What the uid and owner indexes read of an object: its owners' uids and its own.
fn indexed(object: &Value) -> (Vec<&str>, Option<&str>) {
    let owners = object["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default();
    (owners, uid_of(object))
}

fn finalizers(object: &Value) -> Vec<&str> {
    object
        .at("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// What `change` makes of `current` as the store would write it (system fields kept, the
/// generation counted), checked: `None` when the write changes nothing.
fn next_version(
    rtype: &ResourceType,
    key: &ObjectKey,
    current: &Value,
    part: Part,
    change: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Result<Option<Value>, ApiError> {
    let mut next = change(current)?;
    if !next.is_object() {
        return Err(ApiError::BadRequest(format!(
            "the body of a {} update is not an object",
            rtype.kind
        )));
    }
    let given_version = text(&next, "/metadata/resourceVersion");
    let current_version = text(current, "/metadata/resourceVersion");
    if !given_version.is_empty() && given_version != current_version {
        return Err(ApiError::modified(
            rtype.group_resource().qualified(),
            key.name.clone(),
        ));
    }
    let given_name = next
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(&key.name);
    if given_name != key.name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({given_name}) does not match the name on the URL ({})",
            key.name
        )));
    }
    keep_system_fields(current, &mut next, part, rtype.status_subresource);
    refuse_invalid_crd(&rtype.kind, &next)?;
    let added = added_finalizers(current, &next);
    if is_deleting(current) && !added.is_empty() {
        let quoted: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
        return Err(ApiError::Invalid {
            kind: rtype.kind.clone(),
            name: key.name.clone(),
            reason: format!(
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being \
                 deleted, found new finalizers []string{{{}}}",
                quoted.join(", ")
            ),
        });
    }
    if part == Part::Main && spec_changed(current, &next) {
        let generation = current
            .at("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        next["metadata"]["generation"] = json!(generation + 1);
    }
    Ok((!unchanged(current, &next)).then_some(next))
}

/// Whether an object is being deleted (it has a deletionTimestamp).
fn is_deleting(object: &Value) -> bool {
    object.at("/metadata/deletionTimestamp").is_some()
}

/// The finalizers `after` has that `before` has not.
fn added_finalizers<'a>(before: &Value, after: &'a Value) -> Vec<&'a str> {
    let before = finalizers(before);
    finalizers(after)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect()
}

/// Fields a client cannot change through an update: identity, timestamps, and the part the
/// request does not own.
fn keep_system_fields(current: &Value, next: &mut Value, part: Part, status_subresource: bool) {
    let current_metadata = current.get("metadata");
    let next_metadata = &mut next["metadata"];
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ] {
        match current_metadata.and_then(|metadata| metadata.get(field)) {
            // Most writes start from the stored object: a field it kept is not copied again.
            Some(value) if next_metadata.get(field) == Some(value) => {}
            Some(value) => next_metadata[field] = value.clone(),
            None => {
                if let Some(metadata) = next_metadata.as_object_mut() {
                    metadata.remove(field);
                }
            }
        }
    }
    for field in ["apiVersion", "kind"] {
        next[field] = current[field].clone();
    }
    if part == Part::Status {
        // Everything but status comes from the stored object, and of its metadata everything but
        // the resourceVersion and managedFields the write carries. Restored field by field, copying
        // only what the write changed: a status write leaves a large spec alone.
        if let (Some(next), Some(current)) = (next.as_object_mut(), current.as_object()) {
            restore(next, current, &["status", "metadata"]);
            if let (Some(next), Some(current)) = (
                next.get_mut("metadata").and_then(Value::as_object_mut),
                current.get("metadata").and_then(Value::as_object),
            ) {
                restore(next, current, &["resourceVersion", "managedFields"]);
            }
        }
    } else if part == Part::Main && status_subresource {
        match current.get("status") {
            Some(status) => next["status"] = status.clone(),
            None => {
                if let Some(fields) = next.as_object_mut() {
                    fields.remove("status");
                }
            }
        }
    }
}

/// Whether anything besides metadata and status changed: what bumps `generation`.
/// Makes `next` hold `current`'s fields, but for those named in `kept`, left as `next` has them.
fn restore(next: &mut Map<String, Value>, current: &Map<String, Value>, kept: &[&str]) {
    next.retain(|key, _| kept.contains(&key.as_str()) || current.contains_key(key));
    for (key, value) in current {
        if !kept.contains(&key.as_str()) && next.get(key) != Some(value) {
            next.insert(key.clone(), value.clone());
        }
    }
}

fn spec_changed(before: &Value, after: &Value) -> bool {
    !equal_except(before, after, &["metadata", "status"])
}

/// The grace period a pod's deletion starts, as kube-apiserver's graceful deletion does: a pod
/// bound to a node and not finished keeps running with a `deletionTimestamp` at the end of its
/// grace period until its kubelet stops it and deletes it for good. `None`: delete at once (not a
/// pod, not bound, finished, or a zero grace period). A pod already terminating keeps its deadline.
fn graceful_pod_deletion(resource: &GroupResource, pod: &Value, options: &DeleteOptions) -> Option<i64> {
    if !resource.group.is_empty() || resource.resource != "pods" || text(pod, "/spec/nodeName").is_empty() {
        return None;
    }
    if matches!(text(pod, "/status/phase"), "Succeeded" | "Failed") {
        return None;
    }
    let grace = options.grace_period_seconds.unwrap_or_else(|| {
        pod.at("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS)
    });
    (grace > 0).then_some(grace)
}

/// Whether a write changes nothing but the resourceVersion it carries (then it is a no-op).
fn unchanged(current: &Value, next: &Value) -> bool {
    equal_except(current, next, &["metadata"])
        && equal_except(&current["metadata"], &next["metadata"], &["resourceVersion"])
}

/// Whether two objects have equal fields, leaving out `skipped` (compared in place, without copies:
/// this runs on every write).
fn equal_except(a: &Value, b: &Value, skipped: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    a.keys()
        .chain(b.keys())
        .filter(|key| !skipped.contains(&key.as_str()))
        .all(|key| a.get(key) == b.get(key))
}

/// What kube-apiserver sets on create for the kinds whose status starts non-empty.
fn initial_status(kind: &str, fields: &mut Map<String, Value>) {
    match kind {
        "Pod" => {
            fields.insert(
                "status".to_owned(),
                json!({"phase": "Pending", "qosClass": qos_class(fields)}),
            );
        }
        "Namespace" => {
            fields.insert("status".to_owned(), json!({"phase": "Active"}));
        }
        "Node" => {
            // As kube-apiserver's TaintNodesByCondition admission: a new Node is not ready until
            // the node lifecycle controller sees it Ready (kubesim's kubelets take it off then).
            let taints = fields
                .entry("spec")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|spec| spec.entry("taints").or_insert_with(|| json!([])));
            if let Some(Value::Array(taints)) = taints
                && !taints.iter().any(|t| t["key"] == NOT_READY_TAINT)
            {
                taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
            }
        }
        _ => {}
    }
}

/// The taint a Node carries until it is Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// A pod's QoS class from its containers' requests and limits.
fn qos_class(pod: &Map<String, Value>) -> &'static str {
    let containers: Vec<&Value> = pod
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let resources = |c: &Value, which: &str| {
        c.at(&format!("/resources/{which}"))
            .and_then(Value::as_object)
            .cloned()
    };
    let any_set = containers
        .iter()
        .any(|c| resources(c, "requests").is_some() || resources(c, "limits").is_some());
    if !any_set {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = resources(c, "limits").unwrap_or_default();
        let requests = resources(c, "requests").unwrap_or_else(|| limits.clone());
        ["cpu", "memory"]
            .iter()
            .all(|r| limits.get(*r).is_some() && limits.get(*r) == requests.get(*r))
    });
    if guaranteed { "Guaranteed" } else { "Burstable" }
}

/// Refuses a CustomResourceDefinition (of `kind`; other kinds pass) whose versions' `metadata`
/// schemas say more than `type: object` (constraining only `name` and `generateName`), as the API
/// server does on create and update.
fn refuse_invalid_crd(kind: &str, crd: &Value) -> Result<(), ApiError> {
    if kind != "CustomResourceDefinition" {
        return Ok(());
    }
    match crd_metadata_problem(crd) {
        Some(reason) => Err(ApiError::Invalid {
            kind: kind.to_owned(),
            name: text(crd, "/metadata/name").to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Why the API server refuses `crd` for its versions' `metadata` schemas, if it does.
fn crd_metadata_problem(crd: &Value) -> Option<String> {
    let versions = crd.at("/spec/versions").and_then(Value::as_array)?;
    versions.iter().enumerate().find_map(|(i, version)| {
        let metadata = version
            .at("/schema/openAPIV3Schema/properties/metadata")?
            .as_object()?;
        let allowed = |key: &str, value: &Value| match key {
            "type" => value == "object",
            "properties" => value
                .as_object()
                .is_some_and(|p| p.keys().all(|k| k == "name" || k == "generateName")),
            _ => false,
        };
        metadata.iter().any(|(k, v)| !allowed(k, v)).then(|| {
            format!(
                "spec.versions[{i}].schema.openAPIV3Schema.properties[metadata]: Forbidden: must not specify \
                 anything other than name and generateName, but metadata is implicitly specified"
            )
        })
    })
}

/// Serves a CRD's resources and marks it Established, as kube-apiserver's CRD controller does.
fn establish_crd(registry: &mut Registry, crd: &mut Value) {
    let accepted = registry.apply_crd(crd);
    let names = crd.at("/spec/names").cloned().unwrap_or_else(|| json!({}));
    let (status, reason, message) = if accepted {
        (
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        )
    } else {
        (
            "False",
            "InvalidSpec",
            "spec.group, spec.names.kind, spec.names.plural and spec.versions are required",
        )
    };
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": crd.at("/spec/versions").and_then(Value::as_array)
            .map(|versions| versions.iter().filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>())
            .unwrap_or_default(),
        "conditions": [
            {"type": "NamesAccepted", "status": status, "reason": reason, "message": message},
            {"type": "Established", "status": status, "reason": reason, "message": message},
        ],
    });
}

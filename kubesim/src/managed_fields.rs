//! Field ownership, as kube-apiserver keeps it in `metadata.managedFields` for server-side apply.
//!
//! Every write through the API records which field manager set which fields (FieldsV1 sets):
//!
//! - An apply makes its manager the owner of exactly the fields of its configuration. A field it
//!   applied before and applies no longer is removed from the object, unless another manager owns
//!   it too. A field another manager owns with a different value is a conflict, refused with a 409
//!   naming the manager and the fields, unless the apply is forced, which takes the field over.
//! - Any other write (create, update, patch) gives its manager the fields whose values it changed,
//!   taking them from their previous owners without conflicts; fields it removed are owned by
//!   nobody any more.
//!
//! Lists are owned item by item where the Kubernetes types merge them by a key (containers by name,
//! conditions by type …), element by element for sets (finalizers), and whole otherwise, as
//! strategic merge patches treat them; the lists of custom resources are owned whole. The writes
//! kubesim's own physics make straight to the store own nothing, and the `scale` subresource is not
//! tracked.
//!
//! Failure modes: an apply with conflicts is an [`ApiError::Conflict`]; `managedFields` a client wrote
//! that do not parse are ignored (the object's ownership starts again from the write).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::{
    error::ApiError,
    object::Pointer,
    patch::{ListStrategy, list_strategy},
};

/// The fields kube-apiserver sets itself: never owned by a manager.
const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// How the lists of a kind are owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lists {
    /// By the merge keys of the built-in Kubernetes types.
    Strategic,
    /// Whole (custom resources).
    Atomic,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource: everything but `status` when the type has a status subresource.
    Main {
        /// Whether `status` belongs to a subresource of its own.
        status_subresource: bool,
    },
    /// The `status` subresource: `status` only.
    Status,
}

/// One write, as `managedFields` records it.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    /// The field manager (the `fieldManager` parameter or the client's user agent).
    pub manager: &'a str,
    /// The apiVersion the request used.
    pub api_version: String,
    /// The time of the write (RFC 3339).
    pub time: String,
    /// How the kind's lists are owned.
    pub lists: Lists,
    /// The part of the object written.
    pub scope: Scope,
}

impl Write<'_> {
    fn subresource(&self) -> Option<&'static str> {
        match self.scope {
            Scope::Main { .. } => None,
            Scope::Status => Some("status"),
        }
    }

    fn entry(&self, operation: &'static str, fields: FieldSet) -> Entry {
        Entry {
            manager: self.manager.to_owned(),
            operation: operation.to_owned(),
            api_version: self.api_version.clone(),
            time: self.time.clone(),
            subresource: self.subresource().map(str::to_owned),
            fields,
        }
    }

    /// The fields of `object` this write can own.
    fn owned_fields(&self, object: &Value) -> FieldSet {
        let mut fields = FieldSet::of_value(object, self.lists);
        self.restrict(&mut fields);
        fields
    }

    /// Drops from `fields` what this write cannot own.
    fn restrict(&self, fields: &mut FieldSet) {
        match self.scope {
            Scope::Status => fields.children.retain(|key, _| key == "f:status"),
            Scope::Main { status_subresource } => {
                fields.children.remove("f:apiVersion");
                fields.children.remove("f:kind");
                if status_subresource {
                    fields.children.remove("f:status");
                }
                if let Some(metadata) = fields.children.get_mut("f:metadata") {
                    for system in SYSTEM_METADATA {
                        metadata.children.remove(&format!("f:{system}"));
                    }
                    if metadata.is_empty() {
                        fields.children.remove("f:metadata");
                    }
                }
            }
        }
    }
}

/// A set of fields: a tree of FieldsV1 path elements (`f:name`, `k:{"name":"web"}`, `v:"value"`),
/// where `own` marks a member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    own: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    fn leaf() -> Self {
        FieldSet {
            own: true,
            children: BTreeMap::new(),
        }
    }

    /// Whether the set has no member.
    pub fn is_empty(&self) -> bool {
        !self.own && self.children.is_empty()
    }

    /// The fields of a whole object.
    pub fn of_value(value: &Value, lists: Lists) -> Self {
        match value {
            Value::Object(map) => Self::of_map(map, lists),
            _ => Self::leaf(),
        }
    }

    fn of_map(map: &Map<String, Value>, lists: Lists) -> Self {
        let children = map
            .iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| (format!("f:{key}"), Self::of_field(key, value, map, lists)))
            .collect();
        FieldSet { own: false, children }
    }

    /// The fields of the value of the field `key` of `parent`.
    fn of_field(key: &str, value: &Value, parent: &Map<String, Value>, lists: Lists) -> Self {
        match value {
            Value::Object(map) if is_field_map(key, map) => Self::of_map(map, lists),
            Value::Array(items) => match list_kind(key, parent, lists) {
                ListStrategy::Keyed(merge_key) => FieldSet {
                    own: false,
                    children: items
                        .iter()
                        .filter_map(|item| {
                            let element = keyed_element(merge_key, item)?;
                            let mut fields = Self::of_value(item, lists);
                            fields.own = true;
                            Some((element, fields))
                        })
                        .collect(),
                },
                ListStrategy::Set => FieldSet {
                    own: false,
                    children: items
                        .iter()
                        .map(|item| (format!("v:{item}"), Self::leaf()))
                        .collect(),
                },
                ListStrategy::Atomic => Self::leaf(),
            },
            _ => Self::leaf(),
        }
    }

    /// The fields `after` sets that `before` did not have, or had with another value.
    fn changed(before: &Map<String, Value>, after: &Map<String, Value>, lists: Lists) -> Self {
        let differing = after
            .iter()
            .filter(|(key, value)| before.get(*key) != Some(*value))
            .map(|(key, _)| key);
        Self::changed_in(before, after, differing, lists)
    }

    /// [`changed`](Self::changed) among the top-level fields `keys`, each known to differ.
    fn changed_in<'k>(
        before: &Map<String, Value>,
        after: &Map<String, Value>,
        keys: impl Iterator<Item = &'k String>,
        lists: Lists,
    ) -> Self {
        let mut children = BTreeMap::new();
        for (key, value) in
            keys.filter_map(|key| Some((key, after.get(key).filter(|value| !value.is_null())?)))
        {
            let old = before.get(key);
            let fields = match (old, value) {
                (Some(Value::Object(old)), Value::Object(new))
                    if !new.is_empty() && !is_atomic_map(key, new) =>
                {
                    Self::changed(old, new, lists)
                }
                (Some(Value::Array(old)), Value::Array(new)) => match list_kind(key, after, lists) {
                    ListStrategy::Keyed(merge_key) => Self::changed_items(old, new, merge_key, lists),
                    ListStrategy::Set => FieldSet {
                        own: false,
                        children: new
                            .iter()
                            .filter(|item| !old.contains(item))
                            .map(|item| (format!("v:{item}"), Self::leaf()))
                            .collect(),
                    },
                    ListStrategy::Atomic => Self::leaf(),
                },
                _ => Self::of_field(key, value, after, lists),
            };
            if !fields.is_empty() {
                children.insert(format!("f:{key}"), fields);
            }
        }
        FieldSet { own: false, children }
    }

    /// Keeps only the members `object` still has: `self ∩ of_value(object)`, worked out in place
    /// by walking this set rather than listing every field of the object, so a manager that owns a
    /// few fields costs those fields on every write.
    fn keep_present(&mut self, object: &Value, lists: Lists) {
        match object {
            Value::Object(map) => self.keep_present_in_map(map, lists),
            _ => self.children.clear(),
        }
    }

    /// [`keep_present`](Self::keep_present) under the top-level `fields` of `object` only, the
    /// rest kept as it is: what a write did not change is still there, and a status write does not
    /// read the object's spec ([`crate::aside`]).
    fn keep_present_under(&mut self, object: &Value, fields: &[String], lists: Lists) {
        let Some(map) = object.as_object() else {
            self.children.clear();
            return;
        };
        self.children.retain(|key, child| {
            let Some(name) = key
                .strip_prefix("f:")
                .filter(|name| fields.iter().any(|field| field == name))
            else {
                return true;
            };
            let Some(value) = map.get(name).filter(|value| !value.is_null()) else {
                return false;
            };
            child.keep_present_in_field(name, value, map, lists);
            !child.is_empty()
        });
    }

    /// [`keep_present`](Self::keep_present) for the fields of `map` (a map node owns nothing
    /// itself).
    fn keep_present_in_map(&mut self, map: &Map<String, Value>, lists: Lists) {
        self.own = false;
        self.children.retain(|key, child| {
            let Some((name, value)) = key
                .strip_prefix("f:")
                .and_then(|name| Some((name, map.get(name).filter(|v| !v.is_null())?)))
            else {
                return false;
            };
            child.keep_present_in_field(name, value, map, lists);
            !child.is_empty()
        });
    }

    /// [`keep_present`](Self::keep_present) for the field `key` of `parent`, whose value is
    /// `value` (mirrors [`of_field`](Self::of_field)).
    fn keep_present_in_field(&mut self, key: &str, value: &Value, parent: &Map<String, Value>, lists: Lists) {
        match value {
            Value::Object(map) if is_field_map(key, map) => self.keep_present_in_map(map, lists),
            Value::Array(items) => match list_kind(key, parent, lists) {
                ListStrategy::Keyed(merge_key) => {
                    self.own = false;
                    let by_element: HashMap<String, &Value> = items
                        .iter()
                        .filter_map(|item| Some((keyed_element(merge_key, item)?, item)))
                        .collect();
                    self.children
                        .retain(|element, child| match by_element.get(element) {
                            Some(item) => {
                                let own = child.own;
                                child.keep_present(item, lists);
                                child.own = own;
                                !child.is_empty()
                            }
                            None => false,
                        });
                }
                ListStrategy::Set => {
                    self.own = false;
                    let elements: HashSet<String> = items.iter().map(|item| format!("v:{item}")).collect();
                    self.children.retain(|element, child| {
                        child.children.clear();
                        child.own && elements.contains(element)
                    });
                }
                ListStrategy::Atomic => self.children.clear(),
            },
            _ => self.children.clear(),
        }
    }

    fn changed_items(before: &[Value], after: &[Value], merge_key: &str, lists: Lists) -> Self {
        let mut children = BTreeMap::new();
        for item in after {
            let Some(element) = keyed_element(merge_key, item) else {
                continue;
            };
            let old = before
                .iter()
                .find(|old| old.get(merge_key) == item.get(merge_key));
            let fields = match (old, item) {
                (Some(old), _) if old == item => continue,
                (Some(Value::Object(old)), Value::Object(new)) => Self::changed(old, new, lists),
                _ => {
                    let mut fields = Self::of_value(item, lists);
                    fields.own = true;
                    fields
                }
            };
            children.insert(element, fields);
        }
        FieldSet { own: false, children }
    }

    /// Adds the members of `other`.
    fn union(&mut self, other: &FieldSet) {
        self.own |= other.own;
        for (key, child) in &other.children {
            self.children.entry(key.clone()).or_default().union(child);
        }
    }

    /// The members of `self` that are not members of `other`.
    fn minus(&self, other: &FieldSet) -> FieldSet {
        let empty = FieldSet::default();
        let children = self
            .children
            .iter()
            .filter_map(|(key, child)| {
                let rest = child.minus(other.children.get(key).unwrap_or(&empty));
                (!rest.is_empty()).then(|| (key.clone(), rest))
            })
            .collect();
        FieldSet {
            own: self.own && !other.own,
            children,
        }
    }

    /// The members of both.
    fn intersection(&self, other: &FieldSet) -> FieldSet {
        let children = self
            .children
            .iter()
            .filter_map(|(key, child)| {
                let both = child.intersection(other.children.get(key)?);
                (!both.is_empty()).then(|| (key.clone(), both))
            })
            .collect();
        FieldSet {
            own: self.own && other.own,
            children,
        }
    }

    /// The paths of the members that are values, not list items that hold fields of their own.
    fn leaves(&self) -> Vec<Vec<&str>> {
        let mut out = Vec::new();
        self.collect_leaves(&mut Vec::new(), &mut out);
        out
    }

    fn collect_leaves<'s>(&'s self, path: &mut Vec<&'s str>, out: &mut Vec<Vec<&'s str>>) {
        if self.own && self.children.is_empty() {
            out.push(path.clone());
        }
        for (key, child) in &self.children {
            path.push(key);
            child.collect_leaves(path, out);
            path.pop();
        }
    }

    /// The set in the FieldsV1 encoding.
    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        if self.own && !self.children.is_empty() {
            map.insert(".".to_owned(), json!({}));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.to_fields_v1());
        }
        Value::Object(map)
    }

    /// A set read from the FieldsV1 encoding.
    pub fn from_fields_v1(value: &Value) -> FieldSet {
        let Some(map) = value.as_object() else {
            return FieldSet::default();
        };
        if map.is_empty() {
            return Self::leaf();
        }
        FieldSet {
            own: map.contains_key("."),
            children: map
                .iter()
                .filter(|(key, _)| *key != ".")
                .map(|(key, child)| (key.clone(), Self::from_fields_v1(child)))
                .collect(),
        }
    }
}

/// Whether the map value of the field `key` holds fields of its own (not empty, not atomic).
fn is_field_map(key: &str, map: &Map<String, Value>) -> bool {
    !map.is_empty() && !is_atomic_map(key, map)
}

/// Whether a map is owned whole: a label selector, as the Kubernetes types mark it atomic.
fn is_atomic_map(key: &str, map: &Map<String, Value>) -> bool {
    key.ends_with("elector") && (map.contains_key("matchLabels") || map.contains_key("matchExpressions"))
}

fn list_kind(key: &str, parent: &Map<String, Value>, lists: Lists) -> ListStrategy {
    match lists {
        Lists::Strategic => list_strategy(key, parent, parent),
        Lists::Atomic => ListStrategy::Atomic,
    }
}

/// The path element of a keyed list item (`k:{"name":"web"}`); `None` for an item without its key.
fn keyed_element(merge_key: &str, item: &Value) -> Option<String> {
    let identity = item.get(merge_key)?;
    let mut key = Map::new();
    key.insert(merge_key.to_owned(), identity.clone());
    Some(format!("k:{}", Value::Object(key)))
}

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: FieldSet,
}

impl Entry {
    fn read(value: &Value) -> Option<Entry> {
        let writer = Writer::of(value)?;
        let text = |field: &str| value.get(field).and_then(Value::as_str).map(str::to_owned);
        Some(Entry {
            manager: writer.manager.to_owned(),
            operation: writer.operation.to_owned(),
            api_version: text("apiVersion").unwrap_or_default(),
            time: text("time").unwrap_or_default(),
            subresource: writer.subresource.map(str::to_owned),
            fields: FieldSet::from_fields_v1(value.get("fieldsV1")?),
        })
    }

    fn to_value(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if let Some(subresource) = &self.subresource {
            entry["subresource"] = json!(subresource);
        }
        entry
    }

    fn is(&self, write: &Write, operation: &str) -> bool {
        let writer = Writer {
            manager: &self.manager,
            operation: &self.operation,
            subresource: self.subresource.as_deref(),
        };
        writer.is(write, operation)
    }
}

/// Who made an entry of `managedFields`, read from the stored entry without its fields.
struct Writer<'v> {
    manager: &'v str,
    operation: &'v str,
    subresource: Option<&'v str>,
}

impl<'v> Writer<'v> {
    /// The writer of a stored entry; `None` for an entry that cannot be read (it is dropped).
    fn of(entry: &'v Value) -> Option<Self> {
        entry.get("fieldsV1")?;
        let text = |field: &str| entry.get(field).and_then(Value::as_str);
        Some(Writer {
            manager: text("manager")?,
            operation: text("operation")?,
            subresource: text("subresource"),
        })
    }

    /// Whether this is `write`'s manager making `operation` through the same subresource.
    fn is(&self, write: &Write, operation: &str) -> bool {
        self.manager == write.manager
            && self.operation == operation
            && self.subresource == write.subresource()
    }
}

fn entries_of(object: &Value) -> Vec<Entry> {
    object
        .at("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| entries.iter().filter_map(Entry::read).collect())
        .unwrap_or_default()
}

fn store_entries(object: &mut Value, entries: &[Entry]) {
    let kept = entries
        .iter()
        .filter(|entry| !entry.fields.is_empty())
        .map(Entry::to_value)
        .collect();
    set_entries(object, kept);
}

/// Sets `metadata.managedFields` to `entries` (removed when there are none).
fn set_entries(object: &mut Value, entries: Vec<Value>) {
    let Some(metadata) = object
        .as_object_mut()
        .map(|fields| fields.entry("metadata").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if entries.is_empty() {
        metadata.remove("managedFields");
    } else {
        metadata.insert("managedFields".to_owned(), Value::Array(entries));
    }
}

/// Records a write that is not an apply: `before` is the stored object (`None` for a create),
/// `after` the object about to be stored, whose `managedFields` are set from `before`'s.
pub fn record_update(before: Option<&Value>, after: &mut Value, write: &Write) {
    let empty = Map::new();
    let before_map = before.and_then(Value::as_object).unwrap_or(&empty);
    let after_map = after.as_object().unwrap_or(&empty);
    let differing = differing_fields(before_map, after_map);
    let mut changed = FieldSet::changed_in(before_map, after_map, differing.iter(), write.lists);
    write.restrict(&mut changed);
    let stored = before
        .and_then(|before| before.at("/metadata/managedFields"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut entries: Vec<Recorded> = stored
        .iter()
        .filter_map(|value| {
            let writer = Writer::of(value)?;
            if (changed.is_empty() || !writer.is(write, "Update")) && !owns_any(value, &differing) {
                return Some(Recorded::Verbatim(value.clone()));
            }
            let mut entry = Entry::read(value)?;
            entry.fields = entry.fields.minus(&changed);
            entry.fields.keep_present_under(after, &differing, write.lists);
            Some(Recorded::Read(entry))
        })
        .collect();
    if !changed.is_empty() {
        let mine = entries.iter_mut().find_map(|entry| match entry {
            Recorded::Read(entry) if entry.is(write, "Update") => Some(entry),
            _ => None,
        });
        match mine {
            Some(entry) => {
                entry.fields.union(&changed);
                entry.time = write.time.clone();
                entry.api_version = write.api_version.clone();
            }
            None => entries.push(Recorded::Read(write.entry("Update", changed))),
        }
    }
    let kept = entries
        .into_iter()
        .filter_map(|entry| match entry {
            Recorded::Verbatim(value) => Some(value),
            Recorded::Read(entry) => (!entry.fields.is_empty()).then(|| entry.to_value()),
        })
        .collect();
    set_entries(after, kept);
}

/// An entry of `managedFields` as an update keeps it: as it was, when the update changed nothing
/// it owns (most writes touch one or two of an object's top-level fields, and reading and
/// re-encoding every entry was most of a write's cost for large objects), or read and worked out
/// again.
enum Recorded {
    Verbatim(Value),
    Read(Entry),
}

/// The top-level fields whose values differ between two versions of an object (a null field is
/// absent).
fn differing_fields(before: &Map<String, Value>, after: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for (key, value) in after.iter().filter(|(_, value)| !value.is_null()) {
        if before.get(key).filter(|old| !old.is_null()) != Some(value) {
            keys.push(key.clone());
        }
    }
    for (key, _) in before.iter().filter(|(_, value)| !value.is_null()) {
        if after.get(key).is_none_or(Value::is_null) {
            keys.push(key.clone());
        }
    }
    keys
}

/// Whether a stored entry owns a field under one of the top-level `fields`.
fn owns_any(entry: &Value, fields: &[String]) -> bool {
    let Some(owned) = entry.get("fieldsV1").and_then(Value::as_object) else {
        return true;
    };
    fields
        .iter()
        .any(|field| owned.contains_key(&format!("f:{field}")))
}

/// Records an apply of `config` by `write.manager` onto `current` (`None` when the apply creates the
/// object), whose merge into `current` is `merged`: removes the fields the manager no longer
/// applies that nobody else owns, and sets `merged`'s `managedFields`. Conflicts with other
/// managers are refused unless `force`.
pub fn record_apply(
    current: Option<&Value>,
    config: &Value,
    merged: &mut Value,
    write: &Write,
    force: bool,
) -> Result<(), ApiError> {
    let mut entries = current.map(entries_of).unwrap_or_default();
    let applied = write.owned_fields(config);
    let mine = entries.iter().position(|entry| entry.is(write, "Apply"));
    if let Some(current) = current {
        // What each other manager owns that this apply sets to another value: a conflict, or,
        // forced, taken over.
        let contested: Vec<FieldSet> = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| match Some(index) == mine {
                true => FieldSet::default(),
                false => differing(&entry.fields.intersection(&applied), current, config),
            })
            .collect();
        let conflicts: Vec<(&Entry, Vec<String>)> = entries
            .iter()
            .zip(&contested)
            .map(|(entry, fields)| (entry, fields.leaves().iter().map(|path| readable(path)).collect()))
            .filter(|(_, paths): &(&Entry, Vec<String>)| !paths.is_empty())
            .collect();
        if !conflicts.is_empty() && !force {
            return Err(conflict_error(&conflicts, current));
        }
        for (entry, fields) in entries.iter_mut().zip(&contested) {
            entry.fields = entry.fields.minus(fields);
        }
    }
    let previous = mine
        .map(|index| entries[index].fields.clone())
        .unwrap_or_default();
    let mut others = FieldSet::default();
    for (index, entry) in entries.iter().enumerate() {
        if Some(index) != mine {
            others.union(&entry.fields);
        }
    }
    let dropped = previous.minus(&applied).minus(&others);
    remove_fields(merged, &dropped, &others);
    match mine {
        Some(index) if entries[index].fields == applied => {}
        Some(index) => {
            entries[index].fields = applied;
            entries[index].time = write.time.clone();
            entries[index].api_version = write.api_version.clone();
        }
        None => entries.push(write.entry("Apply", applied)),
    }
    store_entries(merged, &entries);
    Ok(())
}

/// The members of `fields` whose values differ between `live` and `config`.
fn differing(fields: &FieldSet, live: &Value, config: &Value) -> FieldSet {
    let mut out = FieldSet::default();
    for path in fields.leaves() {
        if value_at(live, &path) != value_at(config, &path) {
            let mut node = &mut out;
            for element in &path {
                node = node.children.entry((*element).to_owned()).or_default();
            }
            node.own = true;
        }
    }
    out
}

/// The 409 kube-apiserver answers an apply with conflicts.
fn conflict_error(conflicts: &[(&Entry, Vec<String>)], current: &Value) -> ApiError {
    let count: usize = conflicts.iter().map(|(_, paths)| paths.len()).sum();
    let noun = if count == 1 { "conflict" } else { "conflicts" };
    let mut reason = format!("Apply failed with {count} {noun}:");
    for (entry, paths) in conflicts {
        if let [path] = paths.as_slice() {
            reason.push_str(&format!(
                " conflict with \"{}\" using {}: {path}",
                entry.manager, entry.api_version
            ));
        } else {
            reason.push_str(&format!(
                " conflicts with \"{}\" using {}:",
                entry.manager, entry.api_version
            ));
            for path in paths {
                reason.push_str(&format!("\n- {path}"));
            }
        }
    }
    let name = current
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    ApiError::ApplyConflict {
        name: name.to_owned(),
        message: reason,
    }
}

/// A path as kube-apiserver prints it in a conflict: `.spec.template.spec.containers[name="web"].image`.
fn readable(path: &[&str]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(field) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = element.strip_prefix("k:") {
            let pairs: Vec<String> = serde_json::from_str::<Map<String, Value>>(key)
                .map(|map| map.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            out.push_str(&format!("[{}]", pairs.join(",")));
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        }
    }
    out
}

/// The value at a FieldsV1 path, if the object has one.
fn value_at<'v>(value: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, element| child(node, element))
}

fn child<'v>(node: &'v Value, element: &str) -> Option<&'v Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get(field);
    }
    let items = node.as_array()?;
    items.iter().find(|item| matches_element(item, element))
}

fn matches_element(item: &Value, element: &str) -> bool {
    if let Some(key) = element.strip_prefix("k:") {
        return serde_json::from_str::<Map<String, Value>>(key)
            .is_ok_and(|key| key.iter().all(|(field, value)| item.get(field) == Some(value)));
    }
    element
        .strip_prefix("v:")
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .is_some_and(|value| *item == value)
}

/// Removes the members of `dropped` from `object`, keeping what `kept` (the other managers' fields)
/// holds inside them, and the maps and lists the removal leaves empty.
fn remove_fields(object: &mut Value, dropped: &FieldSet, kept: &FieldSet) {
    let empty = FieldSet::default();
    for (element, gone) in &dropped.children {
        let kept_child = kept.children.get(element).unwrap_or(&empty);
        if gone.own && kept_child.is_empty() {
            remove_child(object, element);
            continue;
        }
        let emptied = match child_mut(object, element) {
            Some(child) => {
                remove_fields(child, gone, kept_child);
                is_empty_container(child)
            }
            None => false,
        };
        if emptied && !kept_child.own {
            remove_child(object, element);
        }
    }
}

fn child_mut<'v>(node: &'v mut Value, element: &str) -> Option<&'v mut Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get_mut(field);
    }
    node.as_array_mut()?
        .iter_mut()
        .find(|item| matches_element(item, element))
}

fn remove_child(node: &mut Value, element: &str) {
    if let Some(field) = element.strip_prefix("f:") {
        if let Some(map) = node.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(items) = node.as_array_mut() {
        items.retain(|item| !matches_element(item, element));
    }
}

fn is_empty_container(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn write(manager: &str) -> Write<'_> {
        Write {
            manager,
            api_version: "apps/v1".to_owned(),
            time: "2026-01-01T00:00:00Z".to_owned(),
            lists: Lists::Strategic,
            scope: Scope::Main {
                status_subresource: true,
            },
        }
    }

    fn deployment(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    fn applied(
        current: Option<&Value>,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, ApiError> {
        let mut merged = current.cloned().unwrap_or_else(|| config.clone());
        crate::patch::strategic_merge_patch(&mut merged, config).unwrap();
        record_apply(current, config, &mut merged, &write(manager), force)?;
        Ok(merged)
    }

    #[test]
    fn fields_of_an_applied_deployment_are_keyed_as_kube_apiserver_keys_them() {
        let config = deployment(json!({
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx", "env": [{"name": "A", "value": "1"}]}],
                                  "tolerations": [{"key": "k", "operator": "Exists"}]}}
        }));
        let fields = write("kubectl").owned_fields(&config).to_fields_v1();
        assert_eq!(
            fields,
            json!({"f:spec": {
                "f:replicas": {},
                "f:selector": {},
                "f:template": {"f:spec": {
                    "f:containers": {"k:{\"name\":\"web\"}": {
                        ".": {}, "f:name": {}, "f:image": {},
                        "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}
                    }},
                    "f:tolerations": {}
                }}
            }})
        );
    }

    #[test]
    fn an_apply_that_drops_a_field_removes_it_and_the_maps_it_leaves_empty() {
        let with_affinity = deployment(json!({
            "replicas": 2,
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}},
                "containers": [{"name": "web", "image": "nginx"}]
            }}
        }));
        let first = applied(None, &with_affinity, "kubectl", false).unwrap();
        let without = deployment(json!({
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}
        }));
        let second = applied(Some(&first), &without, "kubectl", false).unwrap();
        assert_eq!(
            second["spec"]["template"],
            json!({"spec": {"containers": [{"name": "web", "image": "nginx"}]}})
        );
        let entries = second["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["manager"], "kubectl");
        assert_eq!(entries[0]["operation"], "Apply");
    }

    #[test]
    fn a_field_another_manager_still_owns_is_kept_when_one_manager_drops_it() {
        let config = deployment(json!({"replicas": 2, "paused": true}));
        let first = applied(None, &config, "one", false).unwrap();
        let second = applied(Some(&first), &config, "two", false).unwrap();
        let dropped = applied(Some(&second), &deployment(json!({"replicas": 2})), "one", false).unwrap();
        assert_eq!(
            dropped["spec"]["paused"],
            json!(true),
            "still applied by the manager \"two\""
        );
        let gone = applied(Some(&dropped), &deployment(json!({"replicas": 2})), "two", false).unwrap();
        assert_eq!(gone["spec"].get("paused"), None);
    }

    #[test]
    fn an_apply_over_another_managers_value_conflicts_unless_forced() {
        let first = applied(None, &deployment(json!({"replicas": 2})), "kubectl", false).unwrap();
        let mut patched = first.clone();
        patched["spec"]["replicas"] = json!(3);
        record_update(Some(&first), &mut patched, &write("kubectl-patch"));
        let owners: Vec<&str> = patched["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(
            owners,
            ["kubectl-patch"],
            "the update took replicas from the applier"
        );

        let refused = applied(
            Some(&patched),
            &deployment(json!({"replicas": 2})),
            "kubectl",
            false,
        )
        .unwrap_err();
        assert_eq!(refused.code(), 409);
        assert_eq!(
            refused.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using apps/v1: .spec.replicas"
        );
        let same = applied(
            Some(&patched),
            &deployment(json!({"replicas": 3})),
            "kubectl",
            false,
        );
        assert!(same.is_ok(), "the same value is shared ownership, not a conflict");

        let forced = applied(
            Some(&patched),
            &deployment(json!({"replicas": 2})),
            "kubectl",
            true,
        )
        .unwrap();
        assert_eq!(forced["spec"]["replicas"], json!(2));
        let entries = forced["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(
            entries.len(),
            1,
            "the forced apply took replicas over: {entries:?}"
        );
    }

    #[test]
    fn an_update_owns_what_it_changed_and_nobody_owns_what_it_removed() {
        let created = deployment(json!({"replicas": 1, "paused": false}));
        let mut stored = created.clone();
        record_update(None, &mut stored, &write("kubectl-create"));
        assert_eq!(
            stored["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}}})
        );
        let mut next = stored.clone();
        next["spec"] = json!({"replicas": 4});
        record_update(Some(&stored), &mut next, &write("kubectl-edit"));
        let entries = next["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(
            entries.len(),
            1,
            "kubectl-create owns nothing any more: {entries:?}"
        );
        assert_eq!(entries[0]["manager"], "kubectl-edit");
        assert_eq!(entries[0]["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    }

    #[test]
    fn a_manager_keeps_only_the_fields_the_object_still_has() {
        let pod = |labels: Value, conditions: Value, spec: Value| json!({"metadata": {"name": "p", "labels": labels}, "spec": spec, "status": {"conditions": conditions}});
        let ready = json!({"type": "Ready", "status": "True"});
        let launched = json!({"type": "Launched", "status": "True"});
        let spec = json!({"nodeSelector": {"zone": "a"}, "containers": [{"name": "c", "image": "x", "args": ["a"]}]});
        let mut before = pod(
            json!({"a": "1", "b": "2"}),
            json!([ready, launched]),
            spec.clone(),
        );
        before["metadata"]["finalizers"] = json!(["x", "y"]);
        let mut one_finalizer_left = before.clone();
        one_finalizer_left["metadata"]["finalizers"] = json!(["y"]);
        let afters = [
            before.clone(),
            one_finalizer_left,
            pod(json!({"a": "1"}), json!([ready]), spec),
            pod(
                json!({"a": "1", "b": "2"}),
                json!([ready, launched]),
                json!({"nodeSelector": "gone", "containers": []}),
            ),
            pod(
                json!({}),
                json!([{"type": "Ready", "status": "False"}]),
                json!({"containers": [{"name": "d"}]}),
            ),
            json!({"metadata": {"name": "p"}}),
            json!("not an object"),
        ];
        let lists = Lists::Strategic;
        // Owners of every field, of some, and of fields the object never had.
        let mut owners = vec![
            FieldSet::of_value(&before, lists),
            FieldSet::from_fields_v1(
                &json!({"f:metadata": {"f:labels": {"f:b": {}}}, "f:spec": {"f:nodeSelector": {".": {}}}}),
            ),
            FieldSet::from_fields_v1(
                &json!({"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:args": {}, "f:gone": {}}}}, "f:status": {"f:other": {}}}),
            ),
        ];
        let mut every = owners[0].clone();
        every.union(&owners[2]);
        owners.push(every);
        for after in &afters {
            for owner in &owners {
                let expected = owner.intersection(&FieldSet::of_value(after, lists));
                let mut kept = owner.clone();
                kept.keep_present(after, lists);
                assert_eq!(
                    kept.to_fields_v1(),
                    expected.to_fields_v1(),
                    "{owner:?} in {after}"
                );
            }
        }
    }

    #[test]
    fn a_status_write_owns_status_only() {
        let mut write = write("joist");
        write.scope = Scope::Status;
        let before = deployment(json!({"replicas": 1}));
        let mut after = before.clone();
        after["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        record_update(Some(&before), &mut after, &write);
        let entry = &after["metadata"]["managedFields"][0];
        assert_eq!(entry["subresource"], "status");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:type": {}, "f:status": {}}}}})
        );
    }

    #[test]
    fn fields_v1_round_trips() {
        let fields = json!({"f:a": {".": {}, "f:b": {}}, "f:c": {"v:\"x\"": {}}});
        assert_eq!(FieldSet::from_fields_v1(&fields).to_fields_v1(), fields);
    }
}

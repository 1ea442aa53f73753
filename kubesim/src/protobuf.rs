//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! client-go based clients write built-in objects as protobuf: kubectl's generators (`kubectl
//! create deployment|job|namespace|…`), helm's release records, the scheduler's bindings. The body
//! is the magic `k8s\0` followed by a `runtime.Unknown` envelope whose `typeMeta` names the object
//! and whose `raw` field holds the object's own protobuf encoding. kubesim stores JSON, so
//! [`decode_object`] turns such a body into the JSON object the API would store.
//!
//! The wire format is read by `prost-reflect` against the descriptors of Kubernetes' own
//! `generated.proto` files (`proto/`, compiled by `build.rs`), for every built-in kind kubesim
//! serves. What this module adds is the mapping from those messages to Kubernetes JSON, which is
//! not protobuf's JSON mapping:
//! - field names are the proto names, except the few Go cannot spell in proto (`$ref`,
//!   `x-kubernetes-*`, `apiGroup`), and structs Go embeds inline (a Volume's source, a Probe's
//!   handler, an IngressRule's value) are written into their parent;
//! - `Quantity` and `IntOrString` become strings and numbers; `Time` and `MicroTime` become
//!   RFC 3339 strings (a zero time is left out); `RawExtension`, `FieldsV1` and apiextensions'
//!   `JSON` hold raw JSON that is embedded as is; the schema-or-bool/array unions become the one
//!   they hold; bytes become standard padded base64, as Go writes `[]byte`.
//! - Empty strings are left out, as Go's JSON leaves them out of every field that has one.
//!   Numbers and booleans are kept as sent: protobuf cannot tell a Go pointer set to zero (a
//!   Deployment's `replicas: 0`) from a plain field at its zero value, so both stay.
//!
//! A body without the magic, an envelope or object that does not decode (a truncated field, a
//! wrong wire type, a string that is not UTF-8: prost's message names the field), a kind that is
//! not one of Kubernetes' built-in objects, embedded JSON that does not parse, and a timestamp
//! past what RFC 3339 can write are each a [`ProtobufError`]; nothing is guessed. Unknown fields
//! are skipped, as protobuf decoders do.

use std::sync::LazyLock;

use base64::Engine as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage,
    Value as Field,
};
use serde_json::{Map, Number, Value};

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8; 4] = b"k8s\0";

/// The descriptors of the `.proto` files in `proto/`, compiled by `build.rs`.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/kubernetes.fds")).as_slice())
        .expect("the descriptor set build.rs compiled decodes")
});

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";
const OBJECT_META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const JSON: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSON";
const JSON_SCHEMA_PROPS: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps";
const SCHEMA_OR_BOOL: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrBool";
const SCHEMA_OR_ARRAY: &str =
    "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrArray";
const SCHEMA_OR_STRING_ARRAY: &str =
    "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrStringArray";

/// Fields Go embeds inline (`json:",inline"`): their fields are written into the parent's object.
/// Found by comparing every message's fields with the Kubernetes OpenAPI definitions.
const INLINE: &[(&str, &str)] = &[
    ("k8s.io.api.core.v1.ConfigMapEnvSource", "localObjectReference"),
    ("k8s.io.api.core.v1.ConfigMapKeySelector", "localObjectReference"),
    ("k8s.io.api.core.v1.ConfigMapProjection", "localObjectReference"),
    ("k8s.io.api.core.v1.ConfigMapVolumeSource", "localObjectReference"),
    (
        "k8s.io.api.core.v1.EphemeralContainer",
        "ephemeralContainerCommon",
    ),
    (
        "k8s.io.api.core.v1.PersistentVolumeSpec",
        "persistentVolumeSource",
    ),
    ("k8s.io.api.core.v1.Probe", "handler"),
    ("k8s.io.api.core.v1.SecretEnvSource", "localObjectReference"),
    ("k8s.io.api.core.v1.SecretKeySelector", "localObjectReference"),
    ("k8s.io.api.core.v1.SecretProjection", "localObjectReference"),
    ("k8s.io.api.core.v1.Volume", "volumeSource"),
    ("k8s.io.api.networking.v1.IngressRule", "ingressRuleValue"),
];

/// Fields whose JSON name is not their proto name, found the same way.
const RENAMED: &[(&str, &str, &str)] = &[
    (
        "k8s.io.api.networking.v1.IngressClassParametersReference",
        "aPIGroup",
        "apiGroup",
    ),
    (JSON_SCHEMA_PROPS, "ref", "$ref"),
    (JSON_SCHEMA_PROPS, "schema", "$schema"),
    (
        JSON_SCHEMA_PROPS,
        "xKubernetesPreserveUnknownFields",
        "x-kubernetes-preserve-unknown-fields",
    ),
    (
        JSON_SCHEMA_PROPS,
        "xKubernetesEmbeddedResource",
        "x-kubernetes-embedded-resource",
    ),
    (
        JSON_SCHEMA_PROPS,
        "xKubernetesIntOrString",
        "x-kubernetes-int-or-string",
    ),
    (
        JSON_SCHEMA_PROPS,
        "xKubernetesListMapKeys",
        "x-kubernetes-list-map-keys",
    ),
    (JSON_SCHEMA_PROPS, "xKubernetesListType", "x-kubernetes-list-type"),
    (JSON_SCHEMA_PROPS, "xKubernetesMapType", "x-kubernetes-map-type"),
    (
        JSON_SCHEMA_PROPS,
        "xKubernetesValidations",
        "x-kubernetes-validations",
    ),
];

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("the body is not a Kubernetes protobuf object: it does not start with the magic bytes `k8s\\0`")]
    MissingMagic,
    /// The `runtime.Unknown` envelope after the magic does not decode.
    #[error("the runtime.Unknown envelope of the protobuf body does not decode: {0}")]
    Envelope(#[source] prost::DecodeError),
    /// The envelope names something that is not a built-in Kubernetes object kubesim knows.
    #[error(
        "{kind:?} (apiVersion {api_version:?}) is not a built-in Kubernetes object kubesim decodes from protobuf; send it as JSON"
    )]
    UnsupportedKind {
        /// The envelope's `apiVersion` (empty if it named none).
        api_version: String,
        /// The envelope's `kind` (empty if it named none).
        kind: String,
    },
    /// The object inside the envelope does not decode as its kind.
    #[error("the {kind} in the protobuf body does not decode: {source}")]
    Object {
        /// The envelope's `kind`.
        kind: String,
        /// prost's error, which names the message and field.
        #[source]
        source: prost::DecodeError,
    },
    /// A field that carries raw JSON (`RawExtension`, `FieldsV1`, apiextensions' `JSON`) holds
    /// bytes that are not JSON.
    #[error("protobuf field {field} holds bytes that are not JSON: {source}")]
    EmbeddedJson {
        /// The field, as a JSON path (`data`, `metadata.managedFields.fieldsV1`).
        field: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A timestamp outside the years RFC 3339 can write.
    #[error("timestamp {seconds} in protobuf field {field} is out of range")]
    TimestampOutOfRange {
        /// The field, as a JSON path (`metadata.creationTimestamp`).
        field: String,
        /// The seconds since the Unix epoch found.
        seconds: i64,
    },
}

impl ProtobufError {
    /// The same error with `name` prefixed to the path of the field it names.
    fn within(mut self, name: &str) -> Self {
        if let Self::EmbeddedJson { field, .. } | Self::TimestampOutOfRange { field, .. } = &mut self {
            *field = if field.is_empty() {
                name.to_owned()
            } else {
                format!("{name}.{field}")
            };
        }
        self
    }
}

/// Decodes a Kubernetes protobuf body (magic `k8s\0` + runtime.Unknown envelope) into the JSON
/// object the API would store, `apiVersion` and `kind` taken from the envelope.
pub fn decode_object(body: &[u8]) -> Result<Value, ProtobufError> {
    let payload = body.strip_prefix(MAGIC).ok_or(ProtobufError::MissingMagic)?;
    let envelope = DynamicMessage::decode(message(UNKNOWN), payload).map_err(ProtobufError::Envelope)?;
    let type_meta = envelope.get_field_by_name("typeMeta");
    let text = |name: &str| {
        type_meta
            .as_ref()
            .and_then(|meta| meta.as_message()?.get_field_by_name(name))
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let Some(descriptor) = object_descriptor(&api_version, &kind) else {
        return Err(ProtobufError::UnsupportedKind { api_version, kind });
    };
    let raw = envelope.get_field_by_name("raw");
    let raw = raw
        .as_ref()
        .and_then(|raw| raw.as_bytes())
        .map_or(&[][..], |raw| raw);
    let object = DynamicMessage::decode(descriptor, raw).map_err(|source| ProtobufError::Object {
        kind: kind.clone(),
        source,
    })?;
    let mut out = Map::new();
    out.insert("apiVersion".to_owned(), Value::String(api_version));
    out.insert("kind".to_owned(), Value::String(kind));
    write_fields(&object, &mut out)?;
    Ok(Value::Object(out))
}

/// A message of the compiled descriptors, by full name.
fn message(name: &str) -> MessageDescriptor {
    POOL.get_message_by_name(name)
        .unwrap_or_else(|| panic!("{name} is in the compiled descriptors"))
}

/// The message of a built-in object kind: `apps/v1` `Deployment` is `k8s.io.api.apps.v1.Deployment`.
/// `None` for groups outside Kubernetes' own (no dot, or ending in `.k8s.io`), kinds the
/// descriptors lack, and messages that are not objects (no `ObjectMeta` metadata: a `PodSpec`, a
/// `List`).
fn object_descriptor(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let package = match group {
        "" => "k8s.io.api.core".to_owned(),
        "apiextensions.k8s.io" => "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions".to_owned(),
        group if !group.contains('.') || group.ends_with(".k8s.io") => {
            format!("k8s.io.api.{}", group.split('.').next().unwrap_or(group))
        }
        _ => return None,
    };
    let descriptor = POOL.get_message_by_name(&format!("{package}.{version}.{kind}"))?;
    let metadata = descriptor.get_field_by_name("metadata")?;
    matches!(metadata.kind(), Kind::Message(meta) if meta.full_name() == OBJECT_META).then_some(descriptor)
}

/// One step of a path into a JSON object: a field or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A field of an object (or a key of a map).
    Field(String),
    /// An item of a list.
    Index(usize),
}

/// How unknown fields are looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Every unknown field (a decoder's strict field validation).
    Every,
    /// In each object, the fields up to the first unknown one, in the order of their names (as
    /// server-side apply builds its typed object, which stops at an object's first unknown field;
    /// kube-apiserver's order is Go's random map order, so this is one of its answers).
    UpToTheFirstUnknown,
}

/// What a walk of an object beside its kind's fields found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Fields the kind does not have.
    pub unknown: Vec<Vec<Step>>,
    /// Map fields (Go maps) that are empty, which Go's JSON leaves out.
    pub empty_maps: Vec<Vec<Step>>,
}

/// The fields of `object` (JSON) that its built-in kind does not have, and its empty map fields;
/// `None` when `apiVersion` and `kind` name no built-in object kubesim knows. `apiVersion` and
/// `kind` themselves are known; values whose JSON is free-form (quantities, times, raw extensions,
/// CRD schemas) are not looked into.
pub fn unknown_fields(api_version: &str, kind: &str, object: &Value, scan: Scan) -> Option<Findings> {
    let descriptor = object_descriptor(api_version, kind)?;
    let mut walk = Walk {
        scan,
        path: Vec::new(),
        found: Findings::default(),
    };
    if let Value::Object(map) = object {
        for (key, value) in map {
            if key == "apiVersion" || key == "kind" {
                continue;
            }
            if !walk.field(&descriptor, key, value) && scan == Scan::UpToTheFirstUnknown {
                break;
            }
        }
    }
    Some(walk.found)
}

/// The unknown fields of the object meta `value` (a custom resource's `metadata`), whose path is
/// `path`.
pub fn unknown_metadata_fields(value: &Value, path: &[Step], scan: Scan) -> Vec<Vec<Step>> {
    let mut walk = Walk {
        scan,
        path: path.to_vec(),
        found: Findings::default(),
    };
    if let Some(meta) = POOL.get_message_by_name(OBJECT_META) {
        walk.message(&meta, value);
    }
    walk.found.unknown
}

/// A walk of JSON beside a message's fields.
struct Walk {
    scan: Scan,
    path: Vec<Step>,
    found: Findings,
}

impl Walk {
    fn message(&mut self, descriptor: &MessageDescriptor, value: &Value) {
        if is_free_form(descriptor) {
            return;
        }
        let Value::Object(map) = value else {
            return;
        };
        for (key, value) in map.iter().filter(|(_, value)| !value.is_null()) {
            if !self.field(descriptor, key, value) && self.scan == Scan::UpToTheFirstUnknown {
                break;
            }
        }
    }

    /// Checks the field `key` of a message of type `parent`; false when the message has no such
    /// field.
    fn field(&mut self, parent: &MessageDescriptor, key: &str, value: &Value) -> bool {
        self.path.push(Step::Field(key.to_owned()));
        let known = match json_field(parent, key) {
            None => {
                self.found.unknown.push(self.path.clone());
                false
            }
            Some(field) => {
                self.value(&field, value);
                true
            }
        };
        self.path.pop();
        known
    }

    fn value(&mut self, field: &FieldDescriptor, value: &Value) {
        let Kind::Message(message) = field.kind() else {
            return;
        };
        if field.is_map() {
            if value.as_object().is_some_and(Map::is_empty) {
                self.found.empty_maps.push(self.path.clone());
            }
            let Some(Kind::Message(inner)) = message.get_field_by_name("value").map(|f| f.kind()) else {
                return;
            };
            for (key, item) in value.as_object().into_iter().flatten() {
                self.path.push(Step::Field(key.clone()));
                self.message(&inner, item);
                self.path.pop();
            }
        } else if field.is_list() {
            for (index, item) in value.as_array().into_iter().flatten().enumerate() {
                self.path.push(Step::Index(index));
                self.message(&message, item);
                self.path.pop();
            }
        } else {
            self.message(&message, value);
        }
    }
}

/// Whether the JSON of a message is free-form rather than an object of its fields.
fn is_free_form(descriptor: &MessageDescriptor) -> bool {
    matches!(
        descriptor.full_name(),
        QUANTITY
            | INT_OR_STRING
            | TIME
            | MICRO_TIME
            | RAW_EXTENSION
            | FIELDS_V1
            | JSON
            | JSON_SCHEMA_PROPS
            | SCHEMA_OR_BOOL
            | SCHEMA_OR_ARRAY
            | SCHEMA_OR_STRING_ARRAY
    )
}

/// The field of `parent` (or of a message Go inlines into it) whose JSON name is `key`.
fn json_field(parent: &MessageDescriptor, key: &str) -> Option<FieldDescriptor> {
    let name = parent.full_name();
    let proto_name = RENAMED
        .iter()
        .find(|(message, _, json)| *message == name && *json == key)
        .map_or(key, |(_, proto, _)| proto);
    if let Some(field) = parent.get_field_by_name(proto_name)
        && !INLINE.contains(&(name, proto_name))
    {
        return Some(field);
    }
    INLINE
        .iter()
        .filter(|(message, _)| *message == name)
        .filter_map(|(_, inline)| match parent.get_field_by_name(inline)?.kind() {
            Kind::Message(inner) => Some(inner),
            _ => None,
        })
        .find_map(|inner| json_field(&inner, key))
}

/// Writes a message's set fields into `out` under their JSON names.
fn write_fields(message: &DynamicMessage, out: &mut Map<String, Value>) -> Result<(), ProtobufError> {
    let parent = message.descriptor();
    let parent = parent.full_name();
    for (field, value) in message.fields() {
        let name = field.name();
        if INLINE.contains(&(parent, name)) {
            if let Field::Message(inner) = value {
                write_fields(inner, out)?;
            }
            continue;
        }
        // Go's JSON leaves empty string fields out; list items and map values stay.
        if matches!(value, Field::String(text) if text.is_empty()) {
            continue;
        }
        let json_name = RENAMED
            .iter()
            .find(|(message, proto, _)| *message == parent && *proto == name)
            .map_or(name, |(_, _, json)| json);
        if let Some(json) = field_json(value).map_err(|e| e.within(json_name))? {
            out.insert(json_name.to_owned(), json);
        }
    }
    Ok(())
}

/// A value as JSON; `None` when Go's JSON would leave it out (a zero time, empty raw JSON).
fn field_json(value: &Field) -> Result<Option<Value>, ProtobufError> {
    Ok(Some(match value {
        Field::Message(message) => return message_json(message),
        Field::List(items) => Value::Array(
            items
                .iter()
                .map(|item| Ok(field_json(item)?.unwrap_or_default()))
                .collect::<Result<_, ProtobufError>>()?,
        ),
        Field::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(key, item)| {
                    let key = map_key(key);
                    let value = field_json(item).map_err(|e| e.within(&key))?.unwrap_or_default();
                    Ok((key, value))
                })
                .collect::<Result<_, ProtobufError>>()?,
        ),
        Field::Bool(flag) => Value::Bool(*flag),
        Field::I32(number) => Value::from(*number),
        Field::I64(number) => Value::from(*number),
        Field::U32(number) => Value::from(*number),
        Field::U64(number) => Value::from(*number),
        Field::F32(number) => float(f64::from(*number)),
        Field::F64(number) => float(*number),
        Field::EnumNumber(number) => Value::from(*number),
        Field::String(text) => Value::String(text.clone()),
        Field::Bytes(bytes) => Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
    }))
}

fn float(number: f64) -> Value {
    Number::from_f64(number).map_or(Value::Null, Value::Number)
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::String(text) => text.clone(),
        MapKey::Bool(flag) => flag.to_string(),
        MapKey::I32(number) => number.to_string(),
        MapKey::I64(number) => number.to_string(),
        MapKey::U32(number) => number.to_string(),
        MapKey::U64(number) => number.to_string(),
    }
}

/// A message as JSON: the types whose JSON is not an object of their fields, then the rest.
fn message_json(message: &DynamicMessage) -> Result<Option<Value>, ProtobufError> {
    let descriptor = message.descriptor();
    let field = |name: &str| {
        message
            .get_field_by_name(name)
            .filter(|_| message.has_field_by_name(name))
    };
    let schema = || {
        field("schema")
            .map(|schema| field_json(&schema))
            .transpose()
            .map(Option::flatten)
    };
    Ok(match descriptor.full_name() {
        // Go writes a Quantity's canonical string, "0" for a zero one.
        QUANTITY => Some(Value::String(
            field("string")
                .and_then(|text| text.as_str().map(str::to_owned))
                .unwrap_or_else(|| "0".to_owned()),
        )),
        // type 0 is an int, 1 a string.
        INT_OR_STRING => Some(match field("type").and_then(|kind| kind.as_i64()) {
            Some(1) => Value::String(
                field("strVal")
                    .and_then(|text| text.as_str().map(str::to_owned))
                    .unwrap_or_default(),
            ),
            _ => Value::from(
                field("intVal")
                    .and_then(|number| number.as_i32())
                    .unwrap_or_default(),
            ),
        }),
        TIME => timestamp(message, false)?,
        MICRO_TIME => timestamp(message, true)?,
        RAW_EXTENSION => embedded_json(field("raw"))?,
        FIELDS_V1 => embedded_json(field("Raw"))?,
        JSON => embedded_json(field("raw"))?,
        SCHEMA_OR_BOOL => match schema()? {
            Some(schema) => Some(schema),
            None => Some(Value::Bool(
                field("allows")
                    .and_then(|allows| allows.as_bool())
                    .unwrap_or_default(),
            )),
        },
        SCHEMA_OR_ARRAY => match field("jSONSchemas") {
            Some(list) => field_json(&list)?,
            None => schema()?,
        },
        SCHEMA_OR_STRING_ARRAY => match field("property") {
            Some(list) => field_json(&list)?,
            None => schema()?,
        },
        _ => {
            let mut out = Map::new();
            write_fields(message, &mut out)?;
            Some(Value::Object(out))
        }
    })
}

/// A `Time` (RFC 3339 in seconds) or `MicroTime` (RFC 3339 with six fraction digits), both in
/// UTC as the API server writes them. Go marshals a zero time as an empty message: left out.
fn timestamp(message: &DynamicMessage, micro: bool) -> Result<Option<Value>, ProtobufError> {
    if !message.has_field_by_name("seconds") && !message.has_field_by_name("nanos") {
        return Ok(None);
    }
    let seconds = message
        .get_field_by_name("seconds")
        .and_then(|s| s.as_i64())
        .unwrap_or_default();
    let nanos = if micro {
        message
            .get_field_by_name("nanos")
            .and_then(|n| n.as_i32())
            .unwrap_or_default()
    } else {
        0
    };
    let time = jiff::Timestamp::new(seconds, nanos).map_err(|_| ProtobufError::TimestampOutOfRange {
        field: String::new(),
        seconds,
    })?;
    let format = if micro {
        "%Y-%m-%dT%H:%M:%S%.6fZ"
    } else {
        "%Y-%m-%dT%H:%M:%SZ"
    };
    Ok(Some(Value::String(time.strftime(format).to_string())))
}

/// The raw JSON a `RawExtension`, `FieldsV1` or apiextensions `JSON` carries; none when empty.
fn embedded_json(raw: Option<std::borrow::Cow<'_, Field>>) -> Result<Option<Value>, ProtobufError> {
    let Some(raw) = raw else { return Ok(None) };
    match raw.as_bytes() {
        Some(bytes) if !bytes.is_empty() => {
            serde_json::from_slice(bytes)
                .map(Some)
                .map_err(|source| ProtobufError::EmbeddedJson {
                    field: String::new(),
                    source,
                })
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::Registry;

    /// Protobuf wire types.
    const VARINT: u8 = 0;
    const LEN: u8 = 2;

    /// A protobuf message under construction: an encoder of its own, so the bodies these tests
    /// decode are not written by the library that reads them.
    #[derive(Default)]
    struct Pb(Vec<u8>);

    impl Pb {
        fn new() -> Self {
            Self::default()
        }

        fn raw_varint(&mut self, mut value: u64) {
            loop {
                let low = (value & 0x7f) as u8;
                value >>= 7;
                if value == 0 {
                    self.0.push(low);
                    return;
                }
                self.0.push(low | 0x80);
            }
        }

        fn tag(mut self, field: u64, wire_type: u8) -> Self {
            self.raw_varint((field << 3) | u64::from(wire_type));
            self
        }

        fn varint(self, field: u64, value: u64) -> Self {
            let mut this = self.tag(field, VARINT);
            this.raw_varint(value);
            this
        }

        fn bytes(self, field: u64, value: &[u8]) -> Self {
            let mut this = self.tag(field, LEN);
            this.raw_varint(value.len() as u64);
            this.0.extend_from_slice(value);
            this
        }

        fn str(self, field: u64, value: &str) -> Self {
            self.bytes(field, value.as_bytes())
        }

        fn msg(self, field: u64, message: Pb) -> Self {
            self.bytes(field, &message.0)
        }

        fn entry(self, field: u64, key: &str, value: &[u8]) -> Self {
            self.msg(field, Pb::new().str(1, key).bytes(2, value))
        }
    }

    /// A whole body: magic, then the envelope client-go writes around `raw`.
    fn envelope(api_version: &str, kind: &str, raw: Pb) -> Vec<u8> {
        let unknown = Pb::new()
            .msg(1, Pb::new().str(1, api_version).str(2, kind))
            .msg(2, raw)
            .str(3, "")
            .str(4, "");
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&unknown.0);
        body
    }

    /// ObjectMeta as Go writes it: every plain string and the generation even when empty or zero,
    /// the creation timestamp as an empty message when zero.
    fn metadata(name: &str) -> Pb {
        Pb::new()
            .str(1, name)
            .str(2, "")
            .str(3, "")
            .str(5, "")
            .str(6, "")
            .varint(7, 0)
            .msg(8, Pb::new())
    }

    fn int_or_string_int(value: u64) -> Pb {
        Pb::new().varint(1, 0).varint(2, value).str(3, "")
    }

    fn int_or_string_str(value: &str) -> Pb {
        Pb::new().varint(1, 1).varint(2, 0).str(3, value)
    }

    #[test]
    fn decodes_a_secret_with_every_metadata_field_and_skips_unknown_ones() {
        let meta = Pb::new()
            .str(1, "s1")
            .str(2, "")
            .str(3, "ns")
            .str(5, "u-1")
            .str(6, "7")
            .varint(7, 3)
            .msg(8, Pb::new().varint(1, 1_795_000_000).varint(2, 500))
            .msg(9, Pb::new())
            .varint(10, 0)
            .entry(11, "a", b"1")
            .entry(11, "empty", b"")
            .entry(12, "note", b"hi")
            .msg(
                13,
                Pb::new()
                    .str(1, "Deployment")
                    .str(3, "web")
                    .str(4, "u-0")
                    .str(5, "apps/v1")
                    .varint(6, 1),
            )
            .str(14, "f1")
            .str(14, "f2")
            .msg(
                17,
                Pb::new()
                    .str(1, "helm")
                    .str(2, "Update")
                    .msg(7, Pb::new().bytes(1, br#"{"f:data":{}}"#)),
            );
        let secret = Pb::new()
            .msg(1, meta)
            .entry(2, "bin", &[0, 1, 2, 0xff])
            .entry(2, "text", b"hello")
            .str(3, "Opaque")
            .entry(4, "x", b"y")
            .varint(5, 1)
            .varint(50, 9)
            .str(53, "ignored");
        assert_eq!(
            decode_object(&envelope("v1", "Secret", secret)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "s1",
                    "namespace": "ns",
                    "uid": "u-1",
                    "resourceVersion": "7",
                    "generation": 3,
                    "creationTimestamp": "2026-11-18T11:06:40Z",
                    "deletionGracePeriodSeconds": 0,
                    "labels": {"a": "1", "empty": ""},
                    "annotations": {"note": "hi"},
                    "ownerReferences": [{
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "web",
                        "uid": "u-0",
                        "controller": true
                    }],
                    "finalizers": ["f1", "f2"],
                    "managedFields": [{
                        "manager": "helm",
                        "operation": "Update",
                        "fieldsV1": {"f:data": {}}
                    }]
                },
                "data": {"bin": "AAEC/w==", "text": "aGVsbG8="},
                "type": "Opaque",
                "stringData": {"x": "y"},
                "immutable": true
            })
        );
    }

    /// What `kubectl create deployment` sends, plus a probe, a volume and limits: zero `replicas`
    /// stays (a Go pointer), empty strings and the zero template timestamp go, IntOrStrings and
    /// Quantities take their JSON forms, and inline structs land in their parents.
    #[test]
    fn decodes_a_deployment_with_its_special_types_and_inline_structs() {
        let probe = Pb::new()
            .msg(
                1,
                Pb::new().msg(2, Pb::new().str(1, "/healthz").msg(2, int_or_string_int(8080))),
            )
            .varint(2, 5);
        let container = Pb::new()
            .str(1, "web")
            .str(2, "nginx")
            .str(3, "sh")
            .str(3, "")
            .msg(
                8,
                Pb::new()
                    .msg(1, Pb::new().str(1, "cpu").msg(2, Pb::new().str(1, "500m")))
                    .msg(1, Pb::new().str(1, "memory").msg(2, Pb::new().str(1, "64Mi"))),
            )
            .msg(10, probe)
            .varint(16, 0);
        let volume = Pb::new().str(1, "tmp").msg(2, Pb::new().msg(2, Pb::new()));
        let template = Pb::new()
            .msg(1, metadata("").entry(11, "app", b"web"))
            .msg(2, Pb::new().msg(1, volume).msg(2, container).str(8, ""));
        let strategy = Pb::new().str(1, "RollingUpdate").msg(
            2,
            Pb::new()
                .msg(1, int_or_string_int(1))
                .msg(2, int_or_string_str("25%")),
        );
        let spec = Pb::new()
            .varint(1, 0)
            .msg(2, Pb::new().entry(1, "app", b"web"))
            .msg(3, template)
            .msg(4, strategy)
            .varint(5, 0);
        let deployment = Pb::new().msg(1, metadata("web")).msg(2, spec).msg(3, Pb::new());
        assert_eq!(
            decode_object(&envelope("apps/v1", "Deployment", deployment)).unwrap(),
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "generation": 0},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"generation": 0, "labels": {"app": "web"}},
                        "spec": {
                            "volumes": [{"name": "tmp", "emptyDir": {}}],
                            "containers": [{
                                "name": "web",
                                "image": "nginx",
                                "command": ["sh", ""],
                                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                                "livenessProbe": {
                                    "httpGet": {"path": "/healthz", "port": 8080},
                                    "initialDelaySeconds": 5
                                },
                                "stdin": false
                            }]
                        }
                    },
                    "strategy": {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"}
                    },
                    "minReadySeconds": 0
                },
                "status": {}
            })
        );
    }

    #[test]
    fn an_ingress_rule_carries_its_http_paths_inline() {
        let backend = Pb::new().msg(
            4,
            Pb::new().str(1, "web").msg(2, Pb::new().str(3, "").varint(2, 80)),
        );
        let path = Pb::new().str(1, "/bar").msg(2, backend).str(3, "Exact");
        let rule = Pb::new()
            .str(1, "foo.com")
            .msg(2, Pb::new().msg(1, Pb::new().msg(1, path)));
        let ingress = Pb::new().msg(1, metadata("web")).msg(2, Pb::new().msg(3, rule));
        let object = decode_object(&envelope("networking.k8s.io/v1", "Ingress", ingress)).unwrap();
        assert_eq!(
            object["spec"],
            json!({"rules": [{
                "host": "foo.com",
                "http": {"paths": [{
                    "path": "/bar",
                    "pathType": "Exact",
                    "backend": {"service": {"name": "web", "port": {"number": 80}}}
                }]}
            }]})
        );
    }

    #[test]
    fn micro_times_keep_microseconds_and_raw_extensions_embed_their_json() {
        let lease = Pb::new().msg(1, metadata("leader")).msg(
            2,
            Pb::new()
                .str(1, "kubesim")
                .msg(4, Pb::new().varint(1, 1_795_000_000).varint(2, 123_456_789)),
        );
        let object = decode_object(&envelope("coordination.k8s.io/v1", "Lease", lease)).unwrap();
        assert_eq!(
            object["spec"],
            json!({"holderIdentity": "kubesim", "renewTime": "2026-11-18T11:06:40.123456Z"})
        );

        let revision = |data: &[u8]| {
            envelope(
                "apps/v1",
                "ControllerRevision",
                Pb::new()
                    .msg(1, metadata("web-1"))
                    .msg(2, Pb::new().bytes(1, data))
                    .varint(3, 1),
            )
        };
        let object = decode_object(&revision(br#"{"spec":{"replicas":2}}"#)).unwrap();
        assert_eq!(object["data"], json!({"spec": {"replicas": 2}}));
        assert_eq!(object["revision"], 1);
        let error = decode_object(&revision(b"{not json")).unwrap_err();
        assert!(
            matches!(&error, ProtobufError::EmbeddedJson { field, .. } if field == "data"),
            "{error}"
        );
    }

    /// A CustomResourceDefinition's schema: `$ref`/`x-kubernetes-*` names and the unions.
    #[test]
    fn a_crd_schema_takes_its_json_names_and_unions() {
        let string_schema = Pb::new().str(5, "string");
        let schema = Pb::new()
            .str(5, "object")
            .msg(
                29,
                Pb::new()
                    .str(1, "size")
                    .msg(2, Pb::new().str(5, "integer").varint(40, 1)),
            )
            .msg(30, Pb::new().varint(1, 1))
            .msg(24, Pb::new().msg(1, string_schema))
            .msg(8, Pb::new().bytes(1, br#"{"size":1}"#))
            .varint(38, 1)
            .str(42, "atomic");
        let version = Pb::new()
            .str(1, "v1")
            .varint(2, 1)
            .varint(3, 1)
            .msg(4, Pb::new().msg(1, schema));
        let spec = Pb::new()
            .str(1, "example.com")
            .msg(3, Pb::new().str(1, "widgets").str(4, "Widget"))
            .str(4, "Namespaced")
            .msg(7, version);
        let crd = Pb::new().msg(1, metadata("widgets.example.com")).msg(2, spec);
        let object = decode_object(&envelope(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            crd,
        ))
        .unwrap();
        assert_eq!(
            object["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            json!({
                "type": "object",
                "properties": {"size": {"type": "integer", "x-kubernetes-int-or-string": true}},
                "additionalProperties": true,
                "items": {"type": "string"},
                "default": {"size": 1},
                "x-kubernetes-preserve-unknown-fields": true,
                "x-kubernetes-list-type": "atomic"
            })
        );
    }

    /// Every built-in kind kubesim serves has its message: a named object with labels decodes.
    #[test]
    fn every_built_in_kind_kubesim_serves_decodes() {
        let registry = Registry::builtin();
        let mut kinds = 0;
        for rtype in registry.all() {
            let body = envelope(
                &rtype.api_version(),
                &rtype.kind,
                Pb::new().msg(1, Pb::new().str(1, "x").entry(11, "team", b"a")),
            );
            let object = decode_object(&body)
                .unwrap_or_else(|e| panic!("{} {}: {e}", rtype.api_version(), rtype.kind));
            assert_eq!(
                object,
                json!({
                    "apiVersion": rtype.api_version(),
                    "kind": rtype.kind,
                    "metadata": {"name": "x", "labels": {"team": "a"}}
                })
            );
            kinds += 1;
        }
        assert!(kinds >= 30, "{kinds} built-in kinds");
    }

    #[test]
    fn a_body_without_the_magic_is_refused() {
        assert!(matches!(
            decode_object(br#"{"kind":"Secret"}"#),
            Err(ProtobufError::MissingMagic)
        ));
        assert!(matches!(decode_object(b"k8s"), Err(ProtobufError::MissingMagic)));
    }

    #[test]
    fn only_built_in_objects_are_decoded() {
        for (api_version, kind) in [
            ("karpenter.sh/v1", "NodePool"),
            ("apps.example.com/v1", "Deployment"),
            ("v1", "PodSpec"),
            ("v1", "List"),
            ("v1", ""),
            ("", "Pod"),
        ] {
            let error = decode_object(&envelope(api_version, kind, Pb::new())).unwrap_err();
            assert!(
                matches!(&error, ProtobufError::UnsupportedKind { api_version: a, kind: k } if a == api_version && k == kind),
                "{api_version} {kind}: {error}"
            );
        }
        let message = decode_object(&envelope("karpenter.sh/v1", "NodePool", Pb::new()))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("NodePool") && message.contains("JSON"),
            "{message}"
        );
    }

    #[test]
    fn malformed_bodies_are_refused_naming_what_broke() {
        let secret = envelope("v1", "Secret", Pb::new().msg(1, metadata("s")));
        // The envelope cut short: contentType's length is gone.
        let error = decode_object(&secret[..secret.len() - 1]).unwrap_err();
        assert!(matches!(error, ProtobufError::Envelope(_)), "{error}");

        let bad_name = envelope(
            "v1",
            "Secret",
            Pb::new().msg(1, Pb::new().bytes(1, &[0xff, 0xfe])),
        );
        let error = decode_object(&bad_name).unwrap_err();
        assert!(
            matches!(&error, ProtobufError::Object { kind, .. } if kind == "Secret"),
            "{error}"
        );
        assert!(error.to_string().contains("UTF-8"), "{error}");

        let name_as_varint = envelope("v1", "Pod", Pb::new().msg(1, Pb::new().varint(1, 5)));
        let error = decode_object(&name_as_varint).unwrap_err().to_string();
        assert!(error.contains("Pod") && error.contains("wire type"), "{error}");

        let far_future = envelope(
            "v1",
            "ConfigMap",
            Pb::new().msg(1, Pb::new().msg(8, Pb::new().varint(1, 1 << 40))),
        );
        let error = decode_object(&far_future).unwrap_err();
        assert!(
            matches!(&error, ProtobufError::TimestampOutOfRange { field, seconds } if field == "metadata.creationTimestamp" && *seconds == 1 << 40),
            "{error}"
        );
    }

    /// The body helm v4.1.4 POSTed for `helm install demo` of a one-ConfigMap chart (see
    /// tests/fixtures/README.md).
    #[test]
    fn decodes_the_release_record_helm_posts() {
        let object = decode_object(include_bytes!("../tests/fixtures/helm-release-secret.pb")).unwrap();
        assert_eq!(object["apiVersion"], "v1");
        assert_eq!(object["kind"], "Secret");
        let metadata = &object["metadata"];
        assert_eq!(metadata["name"], "sh.helm.release.v1.demo.v1");
        // helm sends empty namespace, uid and resourceVersion and a zero creationTimestamp.
        for absent in [
            "namespace",
            "generateName",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            assert!(metadata.get(absent).is_none(), "{absent}: {metadata}");
        }
        let labels = &metadata["labels"];
        assert_eq!(labels["owner"], "helm");
        assert_eq!(labels["name"], "demo");
        assert_eq!(labels["status"], "pending-install");
        assert_eq!(labels["version"], "1");
        assert_eq!(labels["createdAt"], "1795268588");
        assert_eq!(object["type"], "helm.sh/release.v1");
        // The release is helm's own base64 of a gzip stream ("H4sI…"): 656 bytes, so 876 here.
        let release = object["data"]["release"].as_str().unwrap();
        assert_eq!(release.len(), 876);
        assert!(release.starts_with("SDRzSU"), "{release}");
    }
}

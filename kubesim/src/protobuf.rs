//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! client-go based clients write some built-in objects as protobuf rather than JSON: helm v4 sends
//! its release record (a core/v1 Secret, or a ConfigMap with `HELM_DRIVER=configmap`) that way on
//! create and update. The body is the magic `k8s\0` followed by a `runtime.Unknown` envelope whose
//! `typeMeta` names the object and whose `raw` field holds the object's own protobuf encoding.
//! kubesim stores JSON, so [`decode_object`] turns such a body into the JSON object the API would
//! store, written as Go's JSON encoding writes it (empty strings, empty maps and zero timestamps
//! left out; `data` and `binaryData` values in standard padded base64).
//!
//! Only v1 Secrets and v1 ConfigMaps are understood. Any other kind, and any malformed body (no
//! magic, a varint or field cut short, a string that is not UTF-8, a group or unknown wire type),
//! is a [`ProtobufError`] that names the problem and, where it has one, the byte offset in the body
//! where it was found; nothing is guessed. Unknown fields with a valid wire type are skipped, as
//! protobuf decoders do, and so are `managedFields`.

use serde_json::{Map, Value};

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8; 4] = b"k8s\0";

/// Protobuf wire type of varint fields (ints, bools).
const VARINT: u8 = 0;
/// Protobuf wire type of 8-byte fixed-width fields.
const FIXED64: u8 = 1;
/// Protobuf wire type of length-delimited fields (strings, bytes, messages, map entries).
const LEN: u8 = 2;
/// Protobuf wire type of 4-byte fixed-width fields.
const FIXED32: u8 = 5;

/// Why a protobuf body could not be decoded. Offsets count bytes from the start of the body,
/// magic included.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("the body is not a Kubernetes protobuf object: it does not start with the magic bytes `k8s\\0`")]
    MissingMagic,
    /// A varint runs past the end of the message holding it, or is longer than 10 bytes.
    #[error("truncated protobuf: the varint at byte {offset} is cut off or longer than 10 bytes")]
    TruncatedVarint {
        /// Where the varint starts.
        offset: usize,
    },
    /// A field's value runs past the end of the message holding it.
    #[error("truncated protobuf: field {field} at byte {offset} runs past the end of its message")]
    TruncatedField {
        /// The field's number.
        field: u64,
        /// Where the field's tag starts.
        offset: usize,
    },
    /// A tag with field number 0, which protobuf does not allow.
    #[error("invalid protobuf: field number 0 at byte {offset}")]
    InvalidFieldNumber {
        /// Where the tag starts.
        offset: usize,
    },
    /// A wire type other than varint (0), fixed64 (1), length-delimited (2) and fixed32 (5): the
    /// deprecated groups (3, 4) or an undefined one (6, 7).
    #[error(
        "unsupported protobuf wire type {wire_type} for field {field} at byte {offset}: only 0 (varint), 1 (fixed64), 2 (length-delimited) and 5 (fixed32) are decoded"
    )]
    UnsupportedWireType {
        /// The wire type found.
        wire_type: u8,
        /// The field's number.
        field: u64,
        /// Where the field's tag starts.
        offset: usize,
    },
    /// A known field arrived with a wire type its declaration does not allow.
    #[error("protobuf field {field} at byte {offset} has wire type {wire_type}, expected {expected}")]
    WrongWireType {
        /// The field, as a JSON path (`metadata.name`).
        field: &'static str,
        /// The wire type found.
        wire_type: u8,
        /// The wire type the field is declared with.
        expected: u8,
        /// Where the field's tag starts.
        offset: usize,
    },
    /// The envelope names an object kubesim does not decode from protobuf.
    #[error(
        "unsupported kind {kind:?} (apiVersion {api_version:?}) in a protobuf body: only v1 Secret and v1 ConfigMap are decoded from protobuf; send other objects as JSON"
    )]
    UnsupportedKind {
        /// The envelope's `apiVersion` (empty if it named none).
        api_version: String,
        /// The envelope's `kind` (empty if it named none).
        kind: String,
    },
    /// A string field (or map key) holds bytes that are not UTF-8.
    #[error("invalid UTF-8 in protobuf field {field}")]
    InvalidUtf8 {
        /// The field, as a JSON path (`metadata.labels`).
        field: &'static str,
    },
    /// A timestamp outside the years RFC 3339 can write.
    #[error("timestamp {seconds} in protobuf field {field} is out of range")]
    TimestampOutOfRange {
        /// The field, as a JSON path (`metadata.creationTimestamp`).
        field: &'static str,
        /// The seconds since the Unix epoch found.
        seconds: i64,
    },
}

/// Decodes a Kubernetes protobuf body (magic `k8s\0` + runtime.Unknown envelope) of a Secret or ConfigMap into the JSON object the API would store.
///
/// The result carries `apiVersion` and `kind` from the envelope and always a `metadata` object;
/// other fields appear only when the body sets them to a non-empty value (`immutable` and
/// `deletionGracePeriodSeconds` whenever they are present, as they are pointers in Go).
pub fn decode_object(body: &[u8]) -> Result<Value, ProtobufError> {
    let payload = body.strip_prefix(MAGIC).ok_or(ProtobufError::MissingMagic)?;
    // runtime.Unknown: 1 typeMeta, 2 raw, 3 contentEncoding, 4 contentType. client-go leaves the
    // last two empty; they are not needed to read `raw`.
    let mut envelope = Reader::new(payload, MAGIC.len());
    let (mut api_version, mut kind) = ("", "");
    let mut raw = Reader::new(&[], body.len());
    while let Some(field) = envelope.next_field()? {
        match field.number {
            1 => {
                let mut type_meta = field.message("typeMeta")?;
                while let Some(field) = type_meta.next_field()? {
                    match field.number {
                        1 => api_version = field.string("apiVersion")?,
                        2 => kind = field.string("kind")?,
                        _ => {}
                    }
                }
            }
            2 => raw = field.message("raw")?,
            _ => {}
        }
    }

    let mut object = Map::new();
    object.insert("apiVersion".to_owned(), Value::from(api_version));
    object.insert("kind".to_owned(), Value::from(kind));
    match (api_version, kind) {
        ("v1", "Secret") => decode_secret(raw, &mut object)?,
        ("v1", "ConfigMap") => decode_config_map(raw, &mut object)?,
        _ => {
            return Err(ProtobufError::UnsupportedKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
            });
        }
    }
    Ok(Value::Object(object))
}

/// core/v1 Secret: 1 metadata, 2 data (map<string, bytes>), 3 type, 4 stringData
/// (map<string, string>), 5 immutable.
fn decode_secret(mut raw: Reader<'_>, object: &mut Map<String, Value>) -> Result<(), ProtobufError> {
    let mut metadata = Map::new();
    let mut data = Map::new();
    let mut string_data = Map::new();
    while let Some(field) = raw.next_field()? {
        match field.number {
            1 => metadata.extend(decode_object_meta(field.message("metadata")?)?),
            2 => {
                let (key, value) = map_entry(field.message("data")?, "data")?;
                data.insert(key.to_owned(), Value::String(base64(value)));
            }
            3 => set_string(object, "type", field.string("type")?),
            4 => {
                let (key, value) = string_entry(field.message("stringData")?, "stringData")?;
                string_data.insert(key.to_owned(), Value::from(value));
            }
            5 => {
                object.insert(
                    "immutable".to_owned(),
                    Value::Bool(field.varint("immutable")? != 0),
                );
            }
            _ => {}
        }
    }
    object.insert("metadata".to_owned(), Value::Object(metadata));
    insert_non_empty(object, "data", data);
    insert_non_empty(object, "stringData", string_data);
    Ok(())
}

/// core/v1 ConfigMap: 1 metadata, 2 data (map<string, string>), 3 binaryData
/// (map<string, bytes>), 4 immutable.
fn decode_config_map(mut raw: Reader<'_>, object: &mut Map<String, Value>) -> Result<(), ProtobufError> {
    let mut metadata = Map::new();
    let mut data = Map::new();
    let mut binary_data = Map::new();
    while let Some(field) = raw.next_field()? {
        match field.number {
            1 => metadata.extend(decode_object_meta(field.message("metadata")?)?),
            2 => {
                let (key, value) = string_entry(field.message("data")?, "data")?;
                data.insert(key.to_owned(), Value::from(value));
            }
            3 => {
                let (key, value) = map_entry(field.message("binaryData")?, "binaryData")?;
                binary_data.insert(key.to_owned(), Value::String(base64(value)));
            }
            4 => {
                object.insert(
                    "immutable".to_owned(),
                    Value::Bool(field.varint("immutable")? != 0),
                );
            }
            _ => {}
        }
    }
    object.insert("metadata".to_owned(), Value::Object(metadata));
    insert_non_empty(object, "data", data);
    insert_non_empty(object, "binaryData", binary_data);
    Ok(())
}

/// meta/v1 ObjectMeta. Fields 15 (clusterName) and 16 (initializers) are long removed; 17
/// (managedFields) is server bookkeeping a client's write does not decide, so it is dropped.
fn decode_object_meta(mut meta: Reader<'_>) -> Result<Map<String, Value>, ProtobufError> {
    let mut out = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut owner_references = Vec::new();
    let mut finalizers = Vec::new();
    while let Some(field) = meta.next_field()? {
        match field.number {
            1 => set_string(&mut out, "name", field.string("metadata.name")?),
            2 => set_string(&mut out, "generateName", field.string("metadata.generateName")?),
            3 => set_string(&mut out, "namespace", field.string("metadata.namespace")?),
            4 => set_string(&mut out, "selfLink", field.string("metadata.selfLink")?),
            5 => set_string(&mut out, "uid", field.string("metadata.uid")?),
            6 => set_string(
                &mut out,
                "resourceVersion",
                field.string("metadata.resourceVersion")?,
            ),
            7 => {
                // int64 travels as its two's-complement bits.
                let generation = field.varint("metadata.generation")? as i64;
                if generation == 0 {
                    out.remove("generation");
                } else {
                    out.insert("generation".to_owned(), Value::from(generation));
                }
            }
            8 => {
                let name = "metadata.creationTimestamp";
                set_time(
                    &mut out,
                    "creationTimestamp",
                    decode_time(field.message(name)?, name)?,
                );
            }
            9 => {
                let name = "metadata.deletionTimestamp";
                set_time(
                    &mut out,
                    "deletionTimestamp",
                    decode_time(field.message(name)?, name)?,
                );
            }
            10 => {
                let seconds = field.varint("metadata.deletionGracePeriodSeconds")? as i64;
                out.insert("deletionGracePeriodSeconds".to_owned(), Value::from(seconds));
            }
            11 => {
                let (key, value) = string_entry(field.message("metadata.labels")?, "metadata.labels")?;
                labels.insert(key.to_owned(), Value::from(value));
            }
            12 => {
                let name = "metadata.annotations";
                let (key, value) = string_entry(field.message(name)?, name)?;
                annotations.insert(key.to_owned(), Value::from(value));
            }
            13 => owner_references.push(decode_owner_reference(
                field.message("metadata.ownerReferences")?,
            )?),
            14 => finalizers.push(Value::from(field.string("metadata.finalizers")?)),
            _ => {}
        }
    }
    insert_non_empty(&mut out, "labels", labels);
    insert_non_empty(&mut out, "annotations", annotations);
    if !owner_references.is_empty() {
        out.insert("ownerReferences".to_owned(), Value::Array(owner_references));
    }
    if !finalizers.is_empty() {
        out.insert("finalizers".to_owned(), Value::Array(finalizers));
    }
    Ok(out)
}

/// meta/v1 OwnerReference: 1 kind, 3 name, 4 uid, 5 apiVersion, 6 controller, 7
/// blockOwnerDeletion. Go writes the four strings even when empty, the two bools when set.
fn decode_owner_reference(mut reference: Reader<'_>) -> Result<Value, ProtobufError> {
    let mut out = Map::new();
    for key in ["apiVersion", "kind", "name", "uid"] {
        out.insert(key.to_owned(), Value::String(String::new()));
    }
    while let Some(field) = reference.next_field()? {
        let (key, value) = match field.number {
            1 => (
                "kind",
                Value::from(field.string("metadata.ownerReferences.kind")?),
            ),
            3 => (
                "name",
                Value::from(field.string("metadata.ownerReferences.name")?),
            ),
            4 => ("uid", Value::from(field.string("metadata.ownerReferences.uid")?)),
            5 => (
                "apiVersion",
                Value::from(field.string("metadata.ownerReferences.apiVersion")?),
            ),
            6 => (
                "controller",
                Value::Bool(field.varint("metadata.ownerReferences.controller")? != 0),
            ),
            7 => {
                let set = field.varint("metadata.ownerReferences.blockOwnerDeletion")? != 0;
                ("blockOwnerDeletion", Value::Bool(set))
            }
            _ => continue,
        };
        out.insert(key.to_owned(), value);
    }
    Ok(Value::Object(out))
}

/// meta/v1 Time (1 seconds, 2 nanos) as the RFC 3339 second Kubernetes writes, or `None` for
/// Go's zero time, which travels as an empty message. Like kube-apiserver, it keeps whole seconds
/// (nanos are read and dropped).
fn decode_time(mut time: Reader<'_>, name: &'static str) -> Result<Option<String>, ProtobufError> {
    if time.buf.is_empty() {
        return Ok(None);
    }
    let mut seconds = 0i64;
    while let Some(field) = time.next_field()? {
        match field.number {
            1 => seconds = field.varint(name)? as i64,
            2 => {
                field.varint(name)?;
            }
            _ => {}
        }
    }
    jiff::Timestamp::from_second(seconds)
        .map(|timestamp| Some(timestamp.to_string()))
        .map_err(|_| ProtobufError::TimestampOutOfRange { field: name, seconds })
}

/// One entry of a protobuf map (`{1: key, 2: value}`), its value as bytes.
fn map_entry<'a>(mut entry: Reader<'a>, name: &'static str) -> Result<(&'a str, &'a [u8]), ProtobufError> {
    let (mut key, mut value): (&str, &[u8]) = ("", &[]);
    while let Some(field) = entry.next_field()? {
        match field.number {
            1 => key = field.string(name)?,
            2 => value = field.bytes(name)?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// One entry of a `map<string, string>`.
fn string_entry<'a>(entry: Reader<'a>, name: &'static str) -> Result<(&'a str, &'a str), ProtobufError> {
    let (key, value) = map_entry(entry, name)?;
    let value = std::str::from_utf8(value).map_err(|_| ProtobufError::InvalidUtf8 { field: name })?;
    Ok((key, value))
}

/// Sets a string as Go's `omitempty` writes it: an empty value clears the key.
fn set_string(out: &mut Map<String, Value>, key: &str, value: &str) {
    if value.is_empty() {
        out.remove(key);
    } else {
        out.insert(key.to_owned(), Value::from(value));
    }
}

/// Sets a timestamp, or clears it for the zero time.
fn set_time(out: &mut Map<String, Value>, key: &str, value: Option<String>) {
    match value {
        Some(text) => {
            out.insert(key.to_owned(), Value::String(text));
        }
        None => {
            out.remove(key);
        }
    }
}

/// Inserts a map unless it is empty, as Go's `omitempty` does.
fn insert_non_empty(out: &mut Map<String, Value>, key: &str, map: Map<String, Value>) {
    if !map.is_empty() {
        out.insert(key.to_owned(), Value::Object(map));
    }
}

/// Standard base64 (RFC 4648 §4) with padding, as Go's JSON encoding writes `[]byte`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        let symbol = |shift: u32| char::from(ALPHABET[((group >> shift) & 0x3f) as usize]);
        out.push(symbol(18));
        out.push(symbol(12));
        out.push(if chunk.len() > 1 { symbol(6) } else { '=' });
        out.push(if chunk.len() > 2 { symbol(0) } else { '=' });
    }
    out
}

/// A field's value, as far as its wire type says. Fixed-width values are checked for length but
/// not kept: no field decoded here is fixed-width.
#[derive(Debug, Clone, Copy)]
enum Payload<'a> {
    Varint(u64),
    Fixed64,
    Len(&'a [u8]),
    Fixed32,
}

/// One field of a message.
#[derive(Debug, Clone, Copy)]
struct Field<'a> {
    /// The field number from the tag.
    number: u64,
    /// Where the tag starts, in the whole body.
    offset: usize,
    /// Where the value's bytes start, in the whole body.
    value_offset: usize,
    payload: Payload<'a>,
}

impl<'a> Field<'a> {
    fn wire_type(&self) -> u8 {
        match self.payload {
            Payload::Varint(_) => VARINT,
            Payload::Fixed64 => FIXED64,
            Payload::Len(_) => LEN,
            Payload::Fixed32 => FIXED32,
        }
    }

    fn wrong_wire_type(&self, name: &'static str, expected: u8) -> ProtobufError {
        ProtobufError::WrongWireType {
            field: name,
            wire_type: self.wire_type(),
            expected,
            offset: self.offset,
        }
    }

    fn bytes(&self, name: &'static str) -> Result<&'a [u8], ProtobufError> {
        match self.payload {
            Payload::Len(bytes) => Ok(bytes),
            _ => Err(self.wrong_wire_type(name, LEN)),
        }
    }

    fn string(&self, name: &'static str) -> Result<&'a str, ProtobufError> {
        std::str::from_utf8(self.bytes(name)?).map_err(|_| ProtobufError::InvalidUtf8 { field: name })
    }

    fn varint(&self, name: &'static str) -> Result<u64, ProtobufError> {
        match self.payload {
            Payload::Varint(value) => Ok(value),
            _ => Err(self.wrong_wire_type(name, VARINT)),
        }
    }

    /// The embedded message this length-delimited field holds.
    fn message(&self, name: &'static str) -> Result<Reader<'a>, ProtobufError> {
        Ok(Reader::new(self.bytes(name)?, self.value_offset))
    }
}

/// Reads the fields of one message in turn.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Where `buf` starts in the whole body, for error offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let offset = self.base + self.pos;
        let mut value = 0u64;
        for i in 0..10u32 {
            let byte = *self
                .buf
                .get(self.pos)
                .ok_or(ProtobufError::TruncatedVarint { offset })?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProtobufError::TruncatedVarint { offset })
    }

    /// The next `len` bytes of the value of the field whose tag is at `offset`, with where they
    /// start in the whole body.
    fn take(&mut self, len: usize, field: u64, offset: usize) -> Result<(&'a [u8], usize), ProtobufError> {
        let start = self.pos;
        let bytes = start
            .checked_add(len)
            .and_then(|end| self.buf.get(start..end))
            .ok_or(ProtobufError::TruncatedField { field, offset })?;
        self.pos = start + len;
        Ok((bytes, self.base + start))
    }

    fn next_field(&mut self) -> Result<Option<Field<'a>>, ProtobufError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let offset = self.base + self.pos;
        let key = self.varint()?;
        let number = key >> 3;
        let wire_type = (key & 0x7) as u8;
        if number == 0 {
            return Err(ProtobufError::InvalidFieldNumber { offset });
        }
        let (payload, value_offset) = match wire_type {
            VARINT => {
                let value_offset = self.base + self.pos;
                (Payload::Varint(self.varint()?), value_offset)
            }
            FIXED64 => (Payload::Fixed64, self.take(8, number, offset)?.1),
            LEN => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::TruncatedField {
                    field: number,
                    offset,
                })?;
                let (bytes, value_offset) = self.take(len, number, offset)?;
                (Payload::Len(bytes), value_offset)
            }
            FIXED32 => (Payload::Fixed32, self.take(4, number, offset)?.1),
            _ => {
                return Err(ProtobufError::UnsupportedWireType {
                    wire_type,
                    field: number,
                    offset,
                });
            }
        };
        Ok(Some(Field {
            number,
            offset,
            value_offset,
            payload,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A protobuf message under construction: just enough of an encoder to write test bodies.
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

        fn fixed64(self, field: u64, value: u64) -> Self {
            let mut this = self.tag(field, FIXED64);
            this.0.extend_from_slice(&value.to_le_bytes());
            this
        }

        fn fixed32(self, field: u64, value: u32) -> Self {
            let mut this = self.tag(field, FIXED32);
            this.0.extend_from_slice(&value.to_le_bytes());
            this
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

    fn full_secret() -> Vec<u8> {
        let metadata = Pb::new()
            .str(1, "s1")
            .str(2, "")
            .str(3, "ns")
            .str(5, "u-1")
            .str(6, "7")
            .varint(7, 3)
            .msg(8, Pb::new().varint(1, 1_795_000_000).varint(2, 500))
            .msg(9, Pb::new())
            .entry(11, "a", b"1")
            .entry(11, "b", b"2")
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
            .msg(17, Pb::new().str(1, "helm").str(2, "Update"))
            .fixed32(99, 7);
        let secret = Pb::new()
            .msg(1, metadata)
            .entry(2, "bin", &[0, 1, 2, 0xff])
            .entry(2, "text", b"hello")
            .str(3, "Opaque")
            .entry(4, "x", b"y")
            .varint(5, 1)
            .varint(50, 9)
            .fixed64(51, 9)
            .fixed32(52, 9)
            .str(53, "ignored");
        envelope("v1", "Secret", secret)
    }

    #[test]
    fn decodes_every_secret_field_and_skips_unknown_ones() {
        assert_eq!(
            decode_object(&full_secret()).unwrap(),
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
                    "labels": {"a": "1", "b": "2"},
                    "annotations": {"note": "hi"},
                    "ownerReferences": [{
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "web",
                        "uid": "u-0",
                        "controller": true
                    }],
                    "finalizers": ["f1", "f2"]
                },
                "data": {"bin": "AAEC/w==", "text": "aGVsbG8="},
                "type": "Opaque",
                "stringData": {"x": "y"},
                "immutable": true
            })
        );
    }

    #[test]
    fn decodes_a_config_map() {
        let metadata = Pb::new().str(1, "cm").msg(9, Pb::new()).varint(10, 0);
        let config_map = Pb::new()
            .msg(1, metadata)
            .entry(2, "k", b"v")
            .entry(3, "b", &[0xfb, 0xff])
            .varint(4, 0);
        assert_eq!(
            decode_object(&envelope("v1", "ConfigMap", config_map)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cm", "deletionGracePeriodSeconds": 0},
                "data": {"k": "v"},
                "binaryData": {"b": "+/8="},
                "immutable": false
            })
        );
    }

    #[test]
    fn an_empty_object_keeps_only_its_type_and_metadata() {
        assert_eq!(
            decode_object(&envelope("v1", "Secret", Pb::new())).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}})
        );
    }

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
    }

    #[test]
    fn a_body_without_the_magic_is_refused() {
        assert_eq!(
            decode_object(br#"{"kind":"Secret"}"#),
            Err(ProtobufError::MissingMagic)
        );
        assert_eq!(decode_object(b"k8s"), Err(ProtobufError::MissingMagic));
    }

    #[test]
    fn only_secrets_and_config_maps_are_decoded() {
        assert_eq!(
            decode_object(&envelope("v1", "Pod", Pb::new())),
            Err(ProtobufError::UnsupportedKind {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned()
            })
        );
        assert_eq!(
            decode_object(&envelope("apps/v1", "Secret", Pb::new())),
            Err(ProtobufError::UnsupportedKind {
                api_version: "apps/v1".to_owned(),
                kind: "Secret".to_owned()
            })
        );
        let message = decode_object(&envelope("v1", "Pod", Pb::new()))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("Secret") && message.contains("ConfigMap"),
            "{message}"
        );
    }

    #[test]
    fn truncation_is_reported_with_its_offset() {
        let body = full_secret();
        // The last field is contentType's tag and its zero length; drop the length.
        let cut = &body[..body.len() - 1];
        assert_eq!(
            decode_object(cut),
            Err(ProtobufError::TruncatedVarint {
                offset: body.len() - 1
            })
        );
        // raw (field 2, tag at byte 4) claims 5 bytes and has 1.
        assert_eq!(
            decode_object(b"k8s\0\x12\x05\x01"),
            Err(ProtobufError::TruncatedField { field: 2, offset: 4 })
        );
        // A varint longer than ten bytes.
        let mut overlong = MAGIC.to_vec();
        overlong.extend_from_slice(&[
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ]);
        assert_eq!(
            decode_object(&overlong),
            Err(ProtobufError::TruncatedVarint { offset: 5 })
        );
    }

    #[test]
    fn malformed_fields_are_refused() {
        let bad_name = envelope(
            "v1",
            "Secret",
            Pb::new().msg(1, Pb::new().bytes(1, &[0xff, 0xfe])),
        );
        assert_eq!(
            decode_object(&bad_name),
            Err(ProtobufError::InvalidUtf8 {
                field: "metadata.name"
            })
        );

        let bad_label = envelope(
            "v1",
            "ConfigMap",
            Pb::new().msg(1, Pb::new().entry(11, "k", &[0xc3])),
        );
        assert_eq!(
            decode_object(&bad_label),
            Err(ProtobufError::InvalidUtf8 {
                field: "metadata.labels"
            })
        );

        // magic (4) + typeMeta (2 + 12) = 18: raw's tag, its length at 19, its content at 20.
        let group = envelope("v1", "Secret", Pb::new().tag(7, 3));
        assert_eq!(
            decode_object(&group),
            Err(ProtobufError::UnsupportedWireType {
                wire_type: 3,
                field: 7,
                offset: 20
            })
        );

        let name_as_varint = envelope("v1", "Secret", Pb::new().msg(1, Pb::new().varint(1, 5)));
        assert!(matches!(
            decode_object(&name_as_varint),
            Err(ProtobufError::WrongWireType {
                field: "metadata.name",
                wire_type: VARINT,
                expected: LEN,
                ..
            })
        ));

        let field_zero = envelope("v1", "Secret", Pb::new().varint(0, 1));
        assert_eq!(
            decode_object(&field_zero),
            Err(ProtobufError::InvalidFieldNumber { offset: 20 })
        );

        let far_future = envelope(
            "v1",
            "Secret",
            Pb::new().msg(1, Pb::new().msg(8, Pb::new().varint(1, 1 << 40))),
        );
        assert_eq!(
            decode_object(&far_future),
            Err(ProtobufError::TimestampOutOfRange {
                field: "metadata.creationTimestamp",
                seconds: 1 << 40
            })
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
        // helm sends empty namespace, uid, resourceVersion and a zero creationTimestamp.
        for absent in [
            "namespace",
            "generateName",
            "uid",
            "resourceVersion",
            "generation",
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

//! One OpenTelemetry trace per node: the trace id is the NodeClaim's UID (a UUID is exactly the
//! 128 bits a trace id holds; any other UID is hashed), a root `nodeclaim` span covers the claim
//! from creation until its finalizer is released, and one child span per lifecycle [`Phase`]
//! covers launch, registration, initialization and termination.
//!
//! Span ids derive from the UID too, so the spans of one node join the same trace across
//! controller restarts and replicas without any state, and a simulation exports the same ids on
//! every run. Spans are built when a phase has finished, from the claim's own timestamps
//! (creation, condition transitions, deletion) and the controllers' clock, and handed to a
//! [`SpanProcessor`]: batched OTLP export in production, an in-memory exporter in tests, nothing
//! when telemetry is off. Export failures are the processor's to log; they never reach the
//! lifecycle.

use std::{borrow::Cow, fmt, sync::Arc, time::SystemTime};

use joist_messages::apis::NodeClaim;
use opentelemetry::{
    InstrumentationScope, KeyValue,
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};

use crate::decide::lifecycle::Phase;

/// A phase's place among the spans, mixed into its span id.
fn phase_index(phase: Phase) -> u64 {
    match phase {
        Phase::Launch => 1,
        Phase::Registration => 2,
        Phase::Initialization => 3,
        Phase::Termination => 4,
    }
}

/// The name of the root span covering a NodeClaim's whole life.
pub const ROOT_SPAN: &str = "nodeclaim";

/// Where finished node spans go; cheap to clone. [`NodeTracer::disabled`] drops them.
#[derive(Clone, Default)]
pub struct NodeTracer {
    processor: Option<Arc<dyn SpanProcessor>>,
}

impl fmt::Debug for NodeTracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTracer")
            .field("enabled", &self.processor.is_some())
            .finish()
    }
}

impl NodeTracer {
    /// A tracer that records nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// A tracer that hands every finished span to `processor`.
    pub fn new(processor: Arc<dyn SpanProcessor>) -> Self {
        Self {
            processor: Some(processor),
        }
    }

    /// Records that `claim` finished `phase`, which ran from `start` to `end`.
    pub fn phase(
        &self,
        claim: &NodeClaim,
        phase: Phase,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
    ) {
        let Some(processor) = &self.processor else {
            return;
        };
        let ids = NodeTraceIds::of(claim);
        processor.on_end(span(
            ids.trace_id,
            ids.phase_span_id(phase),
            ids.root_span_id,
            phase.name(),
            (start, end),
            with_claim(claim, attributes),
        ));
    }

    /// Records the root span: `claim` lived from `start` until `end`, when it was released.
    pub fn finish(&self, claim: &NodeClaim, start: SystemTime, end: SystemTime, attributes: Vec<KeyValue>) {
        let Some(processor) = &self.processor else {
            return;
        };
        let ids = NodeTraceIds::of(claim);
        processor.on_end(span(
            ids.trace_id,
            ids.root_span_id,
            SpanId::INVALID,
            ROOT_SPAN,
            (start, end),
            with_claim(claim, attributes),
        ));
    }
}

/// The ids a NodeClaim's spans carry, all derived from its UID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeTraceIds {
    /// The trace: the UID's 128 bits.
    pub trace_id: TraceId,
    /// The root span.
    pub root_span_id: SpanId,
}

impl NodeTraceIds {
    /// The ids for `claim` (a claim without a UID gets the ids of the empty UID).
    pub fn of(claim: &NodeClaim) -> Self {
        Self::from_uid(claim.metadata.uid.as_deref().unwrap_or_default())
    }

    /// The ids for the UID `uid`.
    pub fn from_uid(uid: &str) -> Self {
        let bits = uuid_bits(uid).unwrap_or_else(|| hash128(uid));
        let bits = if bits == 0 { 1 } else { bits };
        Self {
            trace_id: TraceId::from(bits),
            root_span_id: span_id((bits >> 64) as u64 ^ bits as u64),
        }
    }

    /// The span of `phase`.
    pub fn phase_span_id(&self, phase: Phase) -> SpanId {
        let root = u64::from_be_bytes(self.root_span_id.to_bytes());
        span_id(root ^ phase_index(phase).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// A non-zero span id (zero is the invalid id).
fn span_id(bits: u64) -> SpanId {
    SpanId::from(if bits == 0 { 1 } else { bits })
}

/// The 128 bits of a UUID written with or without dashes.
fn uuid_bits(uid: &str) -> Option<u128> {
    let hex: String = uid.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

/// Two FNV-1a passes with different offsets: stable across builds and platforms.
fn hash128(text: &str) -> u128 {
    let fnv = |offset: u64| {
        text.bytes().fold(offset, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x8422_2325_cbf2_9ce4))
}

fn with_claim(claim: &NodeClaim, mut attributes: Vec<KeyValue>) -> Vec<KeyValue> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    attributes.insert(0, KeyValue::new("joist.nodeclaim", name));
    attributes
}

fn span(
    trace_id: TraceId,
    span_id: SpanId,
    parent_span_id: SpanId,
    name: &'static str,
    (start_time, end_time): (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(name),
        start_time,
        end_time: end_time.max(start_time),
        attributes,
        dropped_attributes_count: 0,
        events: Default::default(),
        links: Default::default(),
        status: Status::Ok,
        instrumentation_scope: InstrumentationScope::builder("joist").build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_uid_is_the_trace_id_and_every_span_id_is_distinct_and_stable() {
        let ids = NodeTraceIds::from_uid("0f8c2a64-1b3d-4e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(ids.trace_id.to_string(), "0f8c2a641b3d4e5f8a9b0c1d2e3f4a5b");
        let phases = [
            Phase::Launch,
            Phase::Registration,
            Phase::Initialization,
            Phase::Termination,
        ];
        let mut spans: Vec<SpanId> = phases.iter().map(|p| ids.phase_span_id(*p)).collect();
        spans.push(ids.root_span_id);
        spans.sort_by_key(|s| s.to_bytes());
        spans.dedup();
        assert_eq!(spans.len(), 5, "root and four phases have their own ids");
        assert_eq!(
            NodeTraceIds::from_uid("0f8c2a64-1b3d-4e5f-8a9b-0c1d2e3f4a5b"),
            ids,
            "the same UID gives the same ids"
        );
    }

    #[test]
    fn a_uid_that_is_not_a_uuid_is_hashed_to_a_valid_trace_id() {
        let a = NodeTraceIds::from_uid("claim-1");
        let b = NodeTraceIds::from_uid("claim-2");
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.trace_id, TraceId::INVALID);
        assert_ne!(NodeTraceIds::from_uid("").root_span_id, SpanId::INVALID);
    }
}

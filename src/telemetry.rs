//! OpenTelemetry export for the `joist` process. When `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, every node's trace ([`joist_actors::effects::node_trace`])
//! is batched and exported over OTLP/HTTP with protobuf bodies (the OTLP default, port 4318 on a
//! collector); when neither is set, nothing is recorded. The exporter reads the standard
//! `OTEL_EXPORTER_OTLP_*` variables (headers, timeout) itself, and the resource honours
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (the service is `joist` by default).
//!
//! Failures: a protocol other than `http/protobuf` or an exporter that cannot be built is an error
//! at start, naming the variable; an export that fails later is dropped by the batch processor
//! and never slows the controllers.

use std::sync::Arc;

use joist_actors::effects::node_trace::NodeTracer;
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::{
    Resource,
    trace::{BatchSpanProcessor, SpanProcessor},
};

/// The variables that turn export on, most specific first.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables that choose the protocol, most specific first.
const PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// The one protocol Joist exports with.
const HTTP_PROTOBUF: &str = "http/protobuf";

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The protocol asked for is not the one Joist speaks.
    #[error("{variable}={value:?} is not supported: Joist exports OTLP over HTTP ({HTTP_PROTOBUF})")]
    UnsupportedProtocol {
        /// The variable that asked for it.
        variable: &'static str,
        /// What it said.
        value: String,
    },
    /// The OTLP exporter could not be built (a malformed endpoint, say).
    #[error("cannot export traces to {variable}={endpoint:?}: {message}")]
    Exporter {
        /// The variable naming the endpoint.
        variable: &'static str,
        /// Its value.
        endpoint: String,
        /// The exporter's message.
        message: String,
    },
}

/// The process's span export, if any. Call [`Telemetry::shutdown`] before exiting so the last
/// batch is sent.
#[derive(Debug, Default)]
pub struct Telemetry {
    processor: Option<Arc<BatchSpanProcessor>>,
}

impl Telemetry {
    /// Export as the environment says (see the module docs).
    pub fn from_env() -> Result<Self, TelemetryError> {
        Self::configure(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// Export as `variable` says, `variable` reading one environment variable.
    fn configure(variable: &dyn Fn(&str) -> Option<String>) -> Result<Self, TelemetryError> {
        let Some((endpoint_variable, endpoint)) = ENDPOINT_VARIABLES
            .iter()
            .find_map(|name| variable(name).map(|value| (*name, value)))
        else {
            return Ok(Self::default());
        };
        let protocol = PROTOCOL_VARIABLES
            .iter()
            .find_map(|name| variable(name).map(|value| (*name, value)));
        if let Some((name, value)) = protocol
            && value != HTTP_PROTOBUF
        {
            return Err(TelemetryError::UnsupportedProtocol {
                variable: name,
                value,
            });
        }
        let exporter =
            SpanExporter::builder()
                .with_http()
                .build()
                .map_err(|error| TelemetryError::Exporter {
                    variable: endpoint_variable,
                    endpoint,
                    message: error.to_string(),
                })?;
        let mut resource = Resource::builder();
        if variable("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("joist");
        }
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(&resource.build());
        Ok(Self {
            processor: Some(Arc::new(processor)),
        })
    }

    /// Whether spans are exported.
    pub fn is_exporting(&self) -> bool {
        self.processor.is_some()
    }

    /// Where the controllers send node spans.
    pub fn node_tracer(&self) -> NodeTracer {
        match &self.processor {
            Some(processor) => NodeTracer::new(processor.clone()),
            None => NodeTracer::disabled(),
        }
    }

    /// Sends what is still batched and stops the exporter; a failure is reported on stderr, as
    /// there is nobody left to tell.
    pub fn shutdown(self) {
        if let Some(processor) = self.processor
            && let Err(error) = processor.shutdown()
        {
            eprintln!("joist: exporting the last traces failed: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn configure(pairs: &[(&str, &str)]) -> Result<Telemetry, TelemetryError> {
        let env: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Telemetry::configure(&|name| env.get(name).cloned())
    }

    #[test]
    fn without_an_endpoint_nothing_is_exported() {
        let telemetry =
            configure(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!telemetry.is_exporting());
    }

    #[test]
    fn grpc_is_refused_by_name() {
        let error = configure(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .err()
        .map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\" is not supported: Joist exports OTLP over HTTP \
                 (http/protobuf)"
            )
        );
    }
}

//! The interruption queue: the [`InterruptionQueue`] a cloud delivers its warnings through (the
//! SQS queue Karpenter users point `INTERRUPTION_QUEUE` at, or the simulated cloud's own), and the
//! messages on it: EventBridge events in AWS's published shapes, parsed into typed values without
//! I/O by [`parse`].
//!
//! Every event shares the envelope (`version` "0", `id`, `detail-type`, `source`, `time`,
//! `resources`, `detail`) and is dispatched on (`source`, `detail-type`) as Karpenter does:
//!
//! | source / detail-type | kind | what Joist does |
//! |---|---|---|
//! | aws.ec2 / EC2 Spot Instance Interruption Warning | [`Kind::SpotInterrupted`] | drain and replace; the offering is out of capacity |
//! | aws.ec2 / EC2 Capacity Reservation Instance Interruption Warning | [`Kind::CapacityReservationInterrupted`] | drain and replace |
//! | aws.ec2 / EC2 Instance Rebalance Recommendation | [`Kind::RebalanceRecommendation`] | an event and a metric only |
//! | aws.ec2 / EC2 Instance State-change Notification (stopping, stopped) | [`Kind::InstanceStopped`] | drain and replace |
//! | aws.ec2 / EC2 Instance State-change Notification (shutting-down, terminated) | [`Kind::InstanceTerminated`] | drain and replace |
//! | aws.health / AWS Health Event (service EC2, category scheduledChange) | [`Kind::ScheduledChange`] | drain and replace |
//!
//! A well-formed event that asks for nothing (another state, another service) is
//! [`Parsed::Ignored`]; anything else (not JSON, too large, another event, a field of the wrong
//! type) is [`Parsed::NotUnderstood`] with why. Parsing never panics: both are values, and the
//! caller deletes such messages after counting them.

use serde_json::Value;

use crate::CloudFuture;

/// A message taken from the queue, to be deleted once handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMessage {
    /// The handle that deletes it.
    pub receipt: String,
    /// Its body.
    pub body: String,
}

/// A queue of interruption events (see the module docs). A message received and not deleted is
/// delivered again after the queue's visibility timeout.
pub trait InterruptionQueue: std::fmt::Debug + Send + Sync + 'static {
    /// Up to 10 messages, waiting up to 20 s for the first (Karpenter's long poll).
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>>;

    /// Deletes a handled message.
    fn delete<'a>(&'a self, receipt: &'a str) -> CloudFuture<'a, ()>;
}

/// The largest body SQS delivers (256 KiB); anything larger is not one of these events.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What an interruption event, or an instance status check ([`crate::instance_status`]),
/// announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The spot instance will be reclaimed in two minutes.
    SpotInterrupted,
    /// The capacity reservation the instance runs in is being reclaimed.
    CapacityReservationInterrupted,
    /// EC2 recommends moving off the spot instance; nothing is reclaimed yet.
    RebalanceRecommendation,
    /// The instance is stopping or stopped.
    InstanceStopped,
    /// The instance is shutting down or terminated.
    InstanceTerminated,
    /// AWS Health scheduled maintenance for the instance.
    ScheduledChange,
    /// The instance's own status check has failed for two minutes.
    InstanceStatus,
    /// The status check of the instance's host has failed for two minutes.
    SystemStatus,
    /// EC2 scheduled a reboot, maintenance, retirement or stop of the instance.
    EventStatus,
}

impl Kind {
    /// The `message_type` label of Karpenter's interruption metrics.
    pub fn message_type(self) -> &'static str {
        match self {
            Kind::SpotInterrupted => "spot_interrupted",
            Kind::CapacityReservationInterrupted => "capacity_reservation_interrupted",
            Kind::RebalanceRecommendation => "rebalance_recommendation",
            Kind::InstanceStopped => "instance_stopped",
            Kind::InstanceTerminated => "instance_terminated",
            Kind::ScheduledChange => "scheduled_change",
            Kind::InstanceStatus => "instance_status",
            Kind::SystemStatus => "system_status",
            Kind::EventStatus => "event_status",
        }
    }

    /// Whether the NodeClaim is terminated without a graceful drain: its instance is already
    /// broken (a failed instance or system check), so pods are not evicted one by one first.
    pub fn forceful(self) -> bool {
        matches!(self, Kind::InstanceStatus | Kind::SystemStatus)
    }

    /// Whether the instance's NodeClaim is drained and deleted (all but a rebalance
    /// recommendation, which is only reported).
    pub fn drains(self) -> bool {
        self != Kind::RebalanceRecommendation
    }
}

/// One event that names instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    /// What it announces.
    pub kind: Kind,
    /// The EventBridge event id.
    pub id: String,
    /// When EventBridge emitted it (RFC 3339), for the queue-latency histogram.
    pub time: String,
    /// The EC2 instance ids it is about.
    pub instance_ids: Vec<String>,
}

/// A queue message, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// An event to act on.
    Interruption(Interruption),
    /// A well-formed event that asks for nothing, and why.
    Ignored(String),
    /// Not an event Joist reads, and why.
    NotUnderstood(String),
}

/// Reads one message body (see the module docs).
pub fn parse(body: &str) -> Parsed {
    if body.len() > MAX_BODY_BYTES {
        return not_understood(format!(
            "the body has {} bytes, more than SQS delivers",
            body.len()
        ));
    }
    let event: Value = match serde_json::from_str(body) {
        Ok(event) => event,
        Err(error) => return not_understood(format!("the body is not JSON: {error}")),
    };
    match read(&event) {
        Ok(parsed) => parsed,
        Err(why) => Parsed::NotUnderstood(why),
    }
}

fn not_understood(why: String) -> Parsed {
    Parsed::NotUnderstood(why)
}

/// A string field of `object`, or why not.
fn text<'a>(object: &'a Value, field: &str) -> Result<&'a str, String> {
    match object.get(field) {
        Some(Value::String(value)) => Ok(value),
        Some(other) => Err(format!("{field} is not a string: {other}")),
        None => Err(format!("{field} is missing")),
    }
}

fn read(event: &Value) -> Result<Parsed, String> {
    if !event.is_object() {
        return Err("the body is not a JSON object".to_owned());
    }
    let version = text(event, "version")?;
    if version != "0" {
        return Err(format!("version {version:?} is not 0"));
    }
    let source = text(event, "source")?;
    let detail_type = text(event, "detail-type")?;
    let detail = match event.get("detail") {
        Some(detail @ Value::Object(_)) => detail,
        Some(other) => return Err(format!("detail is not an object: {other}")),
        None => return Err("detail is missing".to_owned()),
    };
    let interruption = |kind: Kind, instance_ids: Vec<String>| -> Result<Parsed, String> {
        Ok(Parsed::Interruption(Interruption {
            kind,
            id: text(event, "id")?.to_owned(),
            time: text(event, "time")?.to_owned(),
            instance_ids,
        }))
    };
    let instance = || text(detail, "instance-id").map(|id| vec![id.to_owned()]);
    match (source, detail_type) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            interruption(Kind::SpotInterrupted, instance()?)
        }
        ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning") => {
            interruption(Kind::CapacityReservationInterrupted, instance()?)
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            interruption(Kind::RebalanceRecommendation, instance()?)
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let ids = instance()?;
            match text(detail, "state")?.to_ascii_lowercase().as_str() {
                "stopping" | "stopped" => interruption(Kind::InstanceStopped, ids),
                "shutting-down" | "terminated" => interruption(Kind::InstanceTerminated, ids),
                other => Ok(Parsed::Ignored(format!(
                    "instance state {other:?} needs no action"
                ))),
            }
        }
        ("aws.health", "AWS Health Event") => {
            let service = text(detail, "service")?;
            let category = text(detail, "eventTypeCategory")?;
            if service != "EC2" || category != "scheduledChange" {
                return Ok(Parsed::Ignored(format!(
                    "a health event of service {service:?}, category {category:?}, needs no action"
                )));
            }
            let entities = match detail.get("affectedEntities") {
                Some(Value::Array(entities)) => entities,
                Some(other) => return Err(format!("affectedEntities is not a list: {other}")),
                None => return Err("affectedEntities is missing".to_owned()),
            };
            let ids = entities
                .iter()
                .map(|entity| text(entity, "entityValue").map(str::to_owned))
                .collect::<Result<Vec<_>, _>>()?;
            interruption(Kind::ScheduledChange, ids)
        }
        (source, detail_type) => Err(format!("{source} / {detail_type} is not an event Joist reads")),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn envelope(source: &str, detail_type: &str, detail: Value) -> String {
        json!({
            "version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type,
            "source": source, "account": "123456789012", "time": "2026-01-01T00:00:00Z", "region": "us-west-2",
            "resources": ["arn:aws:ec2:us-west-2:instance/i-0b662ef9931388ba0"], "detail": detail,
        })
        .to_string()
    }

    fn kind_of(body: &str) -> Option<(Kind, Vec<String>)> {
        match parse(body) {
            Parsed::Interruption(i) => Some((i.kind, i.instance_ids)),
            _ => None,
        }
    }

    #[test]
    fn every_event_karpenter_reads_becomes_its_kind() {
        let id = || vec!["i-0b662ef9931388ba0".to_owned()];
        let instance = json!({"instance-id": "i-0b662ef9931388ba0", "instance-action": "terminate"});
        let cases = [
            (
                "aws.ec2",
                "EC2 Spot Instance Interruption Warning",
                instance.clone(),
                Kind::SpotInterrupted,
            ),
            (
                "aws.ec2",
                "EC2 Capacity Reservation Instance Interruption Warning",
                instance.clone(),
                Kind::CapacityReservationInterrupted,
            ),
            (
                "aws.ec2",
                "EC2 Instance Rebalance Recommendation",
                instance,
                Kind::RebalanceRecommendation,
            ),
            (
                "aws.ec2",
                "EC2 Instance State-change Notification",
                json!({"instance-id": "i-0b662ef9931388ba0", "state": "Stopping"}),
                Kind::InstanceStopped,
            ),
            (
                "aws.ec2",
                "EC2 Instance State-change Notification",
                json!({"instance-id": "i-0b662ef9931388ba0", "state": "terminated"}),
                Kind::InstanceTerminated,
            ),
            (
                "aws.health",
                "AWS Health Event",
                json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                       "affectedEntities": [{"entityValue": "i-0b662ef9931388ba0"}]}),
                Kind::ScheduledChange,
            ),
        ];
        for (source, detail_type, detail, kind) in cases {
            assert_eq!(
                kind_of(&envelope(source, detail_type, detail)),
                Some((kind, id())),
                "{detail_type}"
            );
        }
        assert!(!Kind::RebalanceRecommendation.drains() && Kind::SpotInterrupted.drains());
    }

    #[test]
    fn events_that_ask_for_nothing_are_ignored_and_others_not_understood() {
        let running = json!({"instance-id": "i-1", "state": "running"});
        let ignored = parse(&envelope(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            running,
        ));
        assert!(matches!(ignored, Parsed::Ignored(_)), "{ignored:?}");
        let rds = json!({"service": "RDS", "eventTypeCategory": "scheduledChange", "affectedEntities": []});
        assert!(matches!(
            parse(&envelope("aws.health", "AWS Health Event", rds)),
            Parsed::Ignored(_)
        ));
        for body in [
            "",
            "not json",
            "[]",
            "{}",
            &envelope("aws.s3", "Object Created", json!({})),
        ] {
            assert!(matches!(parse(body), Parsed::NotUnderstood(_)), "{body:?}");
        }
        let wrong = envelope(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            json!({"instance-id": 7}),
        );
        let Parsed::NotUnderstood(why) = parse(&wrong) else {
            panic!("a number is not an instance id")
        };
        assert!(why.contains("instance-id"), "{why}");
        assert!(matches!(
            parse(&"x".repeat(MAX_BODY_BYTES + 1)),
            Parsed::NotUnderstood(_)
        ));
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
            Just(json!("0")),
            Just(json!("aws.ec2")),
            Just(json!("EC2 Instance State-change Notification")),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("version".to_owned()),
                        Just("source".to_owned()),
                        Just("detail-type".to_owned()),
                        Just("detail".to_owned()),
                        Just("instance-id".to_owned()),
                        Just("state".to_owned()),
                        "[a-z-]{1,8}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_text_is_parsed_without_panicking(body in ".{0,300}") {
            let _ = parse(&body);
        }

        #[test]
        fn any_json_is_an_interruption_or_a_reason(value in any_json()) {
            match parse(&value.to_string()) {
                Parsed::Interruption(i) => prop_assert!(!i.instance_ids.is_empty() || i.kind == Kind::ScheduledChange),
                Parsed::Ignored(why) | Parsed::NotUnderstood(why) => prop_assert!(!why.is_empty()),
            }
        }

        #[test]
        fn a_truncated_event_is_never_misread(cut in 0usize..200) {
            let body = envelope("aws.ec2", "EC2 Spot Instance Interruption Warning", json!({"instance-id": "i-1"}));
            let truncated: String = body.chars().take(cut.min(body.len().saturating_sub(1))).collect();
            prop_assert!(matches!(parse(&truncated), Parsed::NotUnderstood(_)));
        }
    }
}

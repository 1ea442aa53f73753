//! Faults a scenario injects into the simulated cloud, and the log of the calls Joist made.
//!
//! - A cloud call ([`Operation`]) can, for a while, be throttled (`RequestLimitExceeded`, nothing
//!   done), hang (done, the reply never comes) or lose its reply (done, the caller sees a
//!   transient error): [`Failure`].
//! - Capacity outages cover one offering or, with fields left open, every offering that matches
//!   ([`OfferingPattern`]).
//! - Instances launched during a boot fault never register their Node, or register one that never
//!   becomes Ready ([`BootFault`]).
//!
//! Every call is logged with its time and whether it failed, so a benchmark can measure how hard
//! Joist pressed the cloud during a storm ([`CallLog`]).

use std::{collections::BTreeMap, time::Duration};

use joist_messages::model::instance_type::CapacityType;
use joist_provider::{CloudError, OfferingKey};
use tokio::time::Instant;

/// A cloud call a scenario can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// Resolving an EC2NodeClass (subnets, security groups, images).
    ResolveNodeClass,
    /// Launching an instance (`CreateFleet`).
    Create,
    /// Terminating an instance (`TerminateInstances`).
    Delete,
    /// Describing one instance (`DescribeInstances` by id).
    Get,
    /// Listing the cluster's instances (`DescribeInstances` by tag), as the garbage collector and
    /// the search for a lost launch do.
    List,
    /// Naming an instance after its Node (`CreateTags`).
    NameInstance,
    /// Receiving from the interruption queue (SQS `ReceiveMessage`).
    ReceiveMessages,
    /// Asking for the instances whose status checks fail (`DescribeInstanceStatus`).
    DescribeInstanceStatus,
}

impl Operation {
    /// Every EC2 call (all but the queue's).
    pub const EC2: [Self; 7] = [
        Self::ResolveNodeClass,
        Self::Create,
        Self::Delete,
        Self::Get,
        Self::List,
        Self::NameInstance,
        Self::DescribeInstanceStatus,
    ];

    /// The names a scenario uses, in order.
    pub const NAMES: [(&'static str, Self); 8] = [
        ("resolveNodeClass", Self::ResolveNodeClass),
        ("create", Self::Create),
        ("delete", Self::Delete),
        ("get", Self::Get),
        ("list", Self::List),
        ("nameInstance", Self::NameInstance),
        ("receiveMessages", Self::ReceiveMessages),
        ("describeInstanceStatus", Self::DescribeInstanceStatus),
    ];

    /// The name a scenario uses.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, op)| *op == self)
            .map_or("unknown", |(n, _)| n)
    }
}

/// How an injected fault makes a call fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `RequestLimitExceeded`: nothing is done, the caller gets a transient error.
    Throttle,
    /// The call takes effect and its reply never comes.
    Hang,
    /// The call takes effect and the caller gets a transient error instead of its reply (a
    /// connection reset after the request arrived).
    LoseReply,
}

impl Failure {
    /// The names a scenario uses.
    pub const NAMES: [(&'static str, Self); 3] = [
        ("throttle", Self::Throttle),
        ("hang", Self::Hang),
        ("loseReply", Self::LoseReply),
    ];
}

/// What becomes of a call once it got past throttling: it is answered, or it hangs, or its
/// answer is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a call's reply goes through `answer`"]
pub struct Reply {
    operation: Operation,
    failure: Option<Failure>,
}

impl Reply {
    /// `result` as the caller sees it.
    pub async fn answer<T>(self, result: Result<T, CloudError>) -> Result<T, CloudError> {
        match self.failure {
            Some(Failure::Hang) => std::future::pending().await,
            Some(Failure::LoseReply) => Err(CloudError::Transient {
                message: format!(
                    "{}: connection reset before the reply (injected fault)",
                    self.operation.name()
                ),
            }),
            Some(Failure::Throttle) | None => result,
        }
    }
}

/// Which offerings an outage covers: every field left `None` matches any value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OfferingPattern {
    /// One instance type, or all.
    pub instance_type: Option<String>,
    /// One zone, or all.
    pub zone: Option<String>,
    /// One capacity type, or all.
    pub capacity_type: Option<CapacityType>,
}

impl OfferingPattern {
    /// Whether `offering` is covered.
    pub fn matches(&self, offering: &OfferingKey) -> bool {
        self.instance_type
            .as_ref()
            .is_none_or(|t| *t == offering.instance_type)
            && self.zone.as_ref().is_none_or(|z| *z == offering.zone)
            && self.capacity_type.is_none_or(|c| c == offering.capacity_type)
    }
}

impl std::fmt::Display for OfferingPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let any = |v: Option<&str>| v.unwrap_or("any").to_owned();
        write!(
            f,
            "{} {} in {}",
            any(self.capacity_type.map(CapacityType::label)),
            any(self.instance_type.as_deref()),
            any(self.zone.as_deref())
        )
    }
}

/// How instances launched during a boot fault come up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootFault {
    /// The instance runs but its kubelet never registers a Node.
    NeverRegisters,
    /// The Node registers but its kubelet reports `Ready=False` from the start and never recovers.
    NeverReady,
}

impl BootFault {
    /// The names a scenario uses.
    pub const NAMES: [(&'static str, Self); 2] =
        [("register", Self::NeverRegisters), ("ready", Self::NeverReady)];
}

/// One logged call: seconds since the start, what, and whether it was refused or went wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Call {
    /// Seconds since the start of the simulation.
    pub at: f64,
    /// The call.
    pub operation: Operation,
    /// Whether an injected fault made it fail.
    pub failed: bool,
}

/// Every call made to the cloud, in order.
#[derive(Debug, Clone, Default)]
pub struct CallLog(pub Vec<Call>);

impl CallLog {
    /// Calls made in `[from, to)` seconds.
    pub fn between(&self, from: f64, to: f64) -> impl Iterator<Item = &Call> {
        self.0.iter().filter(move |c| c.at >= from && c.at < to)
    }

    /// Mean calls per second in `[from, to)`.
    pub fn rate(&self, from: f64, to: f64) -> f64 {
        let span = (to - from).max(f64::MIN_POSITIVE);
        self.between(from, to).count() as f64 / span
    }

    /// The most calls in any `window` seconds starting on a whole multiple of it in `[from, to)`,
    /// per second.
    pub fn peak_rate(&self, from: f64, to: f64, window: f64) -> f64 {
        let mut buckets: BTreeMap<u64, usize> = BTreeMap::new();
        for call in self.between(from, to) {
            *buckets.entry(((call.at - from) / window) as u64).or_default() += 1;
        }
        buckets.values().max().map_or(0.0, |n| *n as f64 / window)
    }
}

/// The faults in force and the call log.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    failing: BTreeMap<Operation, (Failure, Instant)>,
    outages: Vec<(OfferingPattern, Instant)>,
    boots: Option<(BootFault, Instant)>,
    pub calls: CallLog,
}

impl Faults {
    pub fn fail(&mut self, operation: Operation, failure: Failure, duration: Duration) {
        self.failing
            .insert(operation, (failure, Instant::now() + duration));
    }

    pub fn make_unavailable(&mut self, pattern: OfferingPattern, duration: Duration) {
        self.outages.push((pattern, Instant::now() + duration));
    }

    pub fn break_boots(&mut self, fault: BootFault, duration: Duration) {
        self.boots = Some((fault, Instant::now() + duration));
    }

    /// Logs a call at `at` seconds; a throttled one is refused here, any other goes on to be
    /// answered through its [`Reply`].
    pub fn call(&mut self, operation: Operation, at: f64) -> Result<Reply, CloudError> {
        let now = Instant::now();
        let failure = self
            .failing
            .get(&operation)
            .filter(|(_, until)| *until > now)
            .map(|(failure, _)| *failure);
        self.calls.0.push(Call {
            at,
            operation,
            failed: failure.is_some(),
        });
        if failure == Some(Failure::Throttle) {
            return Err(CloudError::Transient {
                message: format!("{}: RequestLimitExceeded (injected fault)", operation.name()),
            });
        }
        Ok(Reply { operation, failure })
    }

    /// Whether an offering is out of capacity right now.
    pub fn is_unavailable(&mut self, offering: &OfferingKey) -> bool {
        let now = Instant::now();
        self.outages.retain(|(_, until)| *until > now);
        self.outages.iter().any(|(p, _)| p.matches(offering))
    }

    /// The boot fault an instance launched now suffers.
    pub fn boot_fault(&self) -> Option<BootFault> {
        self.boots
            .filter(|(_, until)| *until > Instant::now())
            .map(|(fault, _)| fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offering(instance_type: &str, zone: &str, capacity_type: CapacityType) -> OfferingKey {
        OfferingKey {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity_type,
            placement_group: None,
        }
    }

    #[test]
    fn an_open_pattern_covers_every_offering_and_a_closed_one_only_its_own() {
        let any = OfferingPattern::default();
        let spot_a = OfferingPattern {
            zone: Some("us-west-2a".into()),
            capacity_type: Some(CapacityType::Spot),
            ..OfferingPattern::default()
        };
        let m5a = offering("m5.large", "us-west-2a", CapacityType::Spot);
        let m5b = offering("m5.large", "us-west-2b", CapacityType::Spot);
        let od = offering("m5.large", "us-west-2a", CapacityType::OnDemand);
        assert!(any.matches(&m5a) && any.matches(&m5b) && any.matches(&od));
        assert!(spot_a.matches(&m5a) && !spot_a.matches(&m5b) && !spot_a.matches(&od));
        assert_eq!(spot_a.to_string(), "spot any in us-west-2a");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_is_refused_and_logged_and_the_storm_ends_on_time() {
        let mut faults = Faults::default();
        faults.fail(Operation::Create, Failure::Throttle, Duration::from_secs(60));
        let refused = faults.call(Operation::Create, 0.0);
        assert!(refused.is_err_and(|e| e.to_string().contains("RequestLimitExceeded")));
        assert!(faults.call(Operation::Get, 1.0).is_ok());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(faults.call(Operation::Create, 61.0).is_ok());
        let failed: Vec<bool> = faults.calls.0.iter().map(|c| c.failed).collect();
        assert_eq!(failed, [true, false, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_reply_is_a_transient_error_and_a_hung_one_never_comes() {
        let mut faults = Faults::default();
        faults.fail(Operation::Delete, Failure::LoseReply, Duration::from_secs(60));
        faults.fail(Operation::Get, Failure::Hang, Duration::from_secs(60));
        let lost = faults.call(Operation::Delete, 0.0).map(|r| r.answer(Ok(7)));
        let Ok(lost) = lost else {
            panic!("a lost reply is not refused")
        };
        assert!(lost.await.is_err_and(|e| e.is_retryable()));
        let Ok(hung) = faults.call(Operation::Get, 0.0) else {
            panic!("a hang is not refused")
        };
        let waited = tokio::time::timeout(Duration::from_secs(3600), hung.answer(Ok(7))).await;
        assert!(waited.is_err(), "a hung call answered");
    }

    #[test]
    fn rates_count_the_calls_in_the_window() {
        let log = CallLog(
            [0.5, 1.0, 1.5, 12.0, 30.0]
                .into_iter()
                .map(|at| Call {
                    at,
                    operation: Operation::Get,
                    failed: false,
                })
                .collect(),
        );
        assert_eq!(log.rate(0.0, 20.0), 4.0 / 20.0);
        assert_eq!(log.peak_rate(0.0, 20.0, 10.0), 0.3);
        assert_eq!(log.between(20.0, 40.0).count(), 1);
    }
}

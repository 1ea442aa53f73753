//! The cloud as the controllers see it ([`GuardedCloud`]): every call under a deadline, and gated
//! by the fault points.
//!
//! A call the cloud never answers (a connection that hangs, a reply lost on the way) must not hold
//! a NodeClaim's actor, the garbage collector or a node class forever: past its deadline it fails
//! as [`CloudError::Transient`], which its caller retries with backoff as it retries a throttle. A
//! launch has until its claim's launch timeout, when liveness gives up on the claim; any other
//! call [`CLOUD_CALL_TIMEOUT`]. What a call may have done meanwhile is found later: a launch by
//! [`CloudProvider::find_launch`] before the claim launches again, or by the garbage collector
//! once the claim is gone; a termination by the next look at the instance.
//!
//! With a fault point armed ([`crate::effects::faults`]), a crash silences every call, before or after it
//! is sent; unarmed, the gate costs one branch.

use std::{future::Future, sync::Arc, time::Duration};

use joist_messages::{
    apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool},
    model::instance_type::InstanceType,
    time::Clock,
};
use joist_provider::{
    CloudError, CloudFuture, CloudProvider, Drift, Instance, Launch, instance_status::InstanceHealth,
    placement_group::PlacementGroup, repair::RepairPolicy,
};

use crate::{
    decide::lifecycle::{created_at, time_left},
    decide::timing::LAUNCH_TIMEOUT,
    effects::faults::FaultPoints,
};

/// How long any cloud call but a launch may take.
pub const CLOUD_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `call`, failed as transient when it has not answered within `limit`; `what` names it in the error.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, CloudError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(CloudError::Transient {
            message: format!("{what}: no reply from the cloud within {}s", limit.as_secs()),
        })
    })
}

/// A cloud whose calls have deadlines and pass the fault points' gate (see the module docs).
pub struct GuardedCloud {
    inner: Arc<dyn CloudProvider>,
    faults: FaultPoints,
    clock: Clock,
}

impl GuardedCloud {
    /// `inner`, guarded; `clock` dates the claims' launch timeouts.
    pub fn new(inner: Arc<dyn CloudProvider>, faults: FaultPoints, clock: Clock) -> Self {
        Self { inner, faults, clock }
    }

    fn guard<'a, T: Send + 'a>(
        &'a self,
        what: &'static str,
        limit: Duration,
        call: CloudFuture<'a, T>,
    ) -> CloudFuture<'a, T> {
        Box::pin(self.faults.gate(within(limit, what, call)))
    }

    fn call<'a, T: Send + 'a>(&'a self, what: &'static str, call: CloudFuture<'a, T>) -> CloudFuture<'a, T> {
        self.guard(what, CLOUD_CALL_TIMEOUT, call)
    }
}

impl CloudProvider for GuardedCloud {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn create<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: Option<&'a EC2NodeClass>,
        types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Launch> {
        let left = time_left(LAUNCH_TIMEOUT, self.clock.now_seconds(), created_at(claim))
            .max(Duration::from_secs(1));
        self.guard("launch", left, self.inner.create(claim, node_class, types))
    }

    fn find_launch<'a>(
        &'a self,
        claim: &'a NodeClaim,
        types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Option<Launch>> {
        self.call("find launch", self.inner.find_launch(claim, types))
    }

    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        self.call("terminate instance", self.inner.delete(provider_id))
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance> {
        self.call("describe instance", self.inner.get(provider_id))
    }

    fn list(&self) -> CloudFuture<'_, Vec<Instance>> {
        self.call("list instances", self.inner.list())
    }

    fn instance_types<'a>(
        &'a self,
        node_pool: &'a NodePool,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>> {
        self.call(
            "list instance types",
            self.inner.instance_types(node_pool, node_class),
        )
    }

    fn resolve_node_class<'a>(&'a self, node_class: &'a EC2NodeClass) -> CloudFuture<'a, EC2NodeClassStatus> {
        self.call("resolve node class", self.inner.resolve_node_class(node_class))
    }

    fn resolve_placement_group<'a>(
        &'a self,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<PlacementGroup>> {
        self.call(
            "resolve placement group",
            self.inner.resolve_placement_group(node_class),
        )
    }

    fn is_drifted<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<Drift>> {
        self.call("check drift", self.inner.is_drifted(claim, node_class))
    }

    fn name_instance<'a>(&'a self, provider_id: &'a str, node_name: &'a str) -> CloudFuture<'a, ()> {
        self.call("name instance", self.inner.name_instance(provider_id, node_name))
    }

    fn repair_policies(&self) -> &'static [RepairPolicy] {
        self.inner.repair_policies()
    }

    fn impaired_instances(&self) -> CloudFuture<'_, Vec<InstanceHealth>> {
        self.call("describe instance status", self.inner.impaired_instances())
    }

    fn reserved_capacity(&self) -> std::collections::HashMap<String, u32> {
        self.inner.reserved_capacity()
    }

    fn reservation_reclaimed(&self, id: &str) {
        self.inner.reservation_reclaimed(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_fails_as_transient_at_its_deadline() {
        let started = tokio::time::Instant::now();
        let hung = within(
            CLOUD_CALL_TIMEOUT,
            "DescribeInstances",
            std::future::pending::<Result<(), CloudError>>(),
        )
        .await;
        assert_eq!(started.elapsed(), CLOUD_CALL_TIMEOUT);
        let Err(error) = hung else {
            panic!("a hung call answered")
        };
        assert!(error.is_retryable());
        assert!(
            error.to_string().contains("DescribeInstances: no reply"),
            "{error}"
        );
        assert_eq!(
            within(CLOUD_CALL_TIMEOUT, "DescribeInstances", async { Ok(7) }).await,
            Ok(7)
        );
    }
}

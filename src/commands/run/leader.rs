//! Leader election on a `coordination.k8s.io/v1` Lease, with controller-runtime's timings (15 s
//! lease, 10 s renew deadline, retries every second here), so that of several `joist run` replicas
//! exactly one runs the controllers.
//!
//! A candidate takes the Lease when it does not exist, has no holder, or has not changed for a
//! whole lease duration as seen by this process's own clock (the holder's clock is never trusted,
//! as client-go does). Every write is an update carrying the `resourceVersion` it was decided on,
//! so of two candidates racing for an expired Lease one wins and the other sees a conflict. The
//! leader renews every retry period; if it cannot renew for the renew deadline it has lost the
//! Lease and [`Elector::hold`] returns, even while a renewing request still hangs, and `joist run`
//! stops at once rather than risk two leaders. On
//! SIGTERM the leader releases the Lease (no holder, a one-second duration), so a standby takes over
//! at once instead of after the lease duration.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use tokio::time::Instant;

/// How long a Lease that stopped changing is respected (Karpenter's chart: 15 s).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader keeps trying to renew before it considers the Lease lost.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often candidates look and leaders renew.
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);

/// One candidate (see the module docs).
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The Lease's spec when this process last saw it change, and when.
    observed: Option<(LeaseSpec, Instant)>,
}

/// What one look at the Lease found.
pub enum Look {
    /// This candidate holds it.
    Leading,
    /// Another holder's Lease is still live.
    Following(String),
    /// No one holds it (or its holder's time ran out), and this candidate did not take it.
    Free,
}

impl Elector {
    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A candidate named `identity` for the Lease `name` that `api` reaches.
    pub fn new(api: Api<Lease>, name: String, identity: String) -> Self {
        Self {
            api,
            name,
            identity,
            observed: None,
        }
    }

    /// Waits until this candidate leads.
    pub async fn acquire(&mut self) {
        let mut announced = None;
        loop {
            // A look that hangs is abandoned, so a standby keeps looking.
            let Ok(look) = tokio::time::timeout(RENEW_DEADLINE, self.try_acquire_or_renew()).await else {
                tracing::warn!(
                    lease = self.name,
                    "the API server did not answer in time; retrying"
                );
                continue;
            };
            match look {
                Ok(Look::Leading) => {
                    tracing::info!(lease = self.name, identity = self.identity, "became the leader");
                    return;
                }
                Ok(Look::Free) => {}
                Ok(Look::Following(holder)) => {
                    if announced.as_ref() != Some(&holder) {
                        tracing::info!(lease = self.name, leader = holder, "standing by");
                        announced = Some(holder);
                    }
                }
                Err(error) => tracing::warn!(lease = self.name, %error, "leader election failed; retrying"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews the Lease until it cannot for [`RENEW_DEADLINE`]; returns when leadership is lost.
    /// The deadline bounds the renewing request too: a leader whose API server stopped answering
    /// gives up when the deadline passes, not when the request ends, which on a black-holed
    /// network may be never, so it has stopped before a standby may take the Lease over
    /// ([`LEASE_DURATION`] after its last renew).
    pub async fn hold(&mut self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            let deadline = renewed + RENEW_DEADLINE;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Look::Leading)) => renewed = Instant::now(),
                Ok(Ok(Look::Free)) => {}
                Ok(Ok(Look::Following(holder))) => {
                    tracing::error!(
                        lease = self.name,
                        leader = holder,
                        "another replica took the lease"
                    );
                    return;
                }
                Ok(Err(error)) => tracing::warn!(lease = self.name, %error, "renewing the lease failed"),
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    lease = self.name,
                    "could not renew the lease in time: leadership lost"
                );
                return;
            }
        }
    }

    /// Gives the Lease up, so a standby takes over at once.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = self.name, "released the lease"),
            Err(error) => tracing::warn!(lease = self.name, %error, "releasing the lease failed"),
        }
    }

    /// One look: create, renew or take over the Lease when this candidate may.
    async fn try_acquire_or_renew(&mut self) -> Result<Look, kube::Error> {
        let lease = self.api.get_opt(&self.name).await?;
        self.decide(lease, true).await
    }

    /// Decides on the Lease as just read (`None`: it does not exist): renews it when this
    /// candidate holds it, takes it when it is free or its holder's time ran out and `may_take`,
    /// and otherwise says who holds it. Every look, taking or not, counts towards seeing a holder's
    /// time run out.
    pub async fn decide(&mut self, lease: Option<Lease>, may_take: bool) -> Result<Look, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = lease else {
            if !may_take {
                return Ok(Look::Free);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Look::Leading),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Look::Following(String::new())),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec) {
            self.observed = Some((spec.clone(), Instant::now()));
        }
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let duration = Duration::from_secs(
            spec.lease_duration_seconds
                .unwrap_or(0)
                .max(0)
                .unsigned_abs()
                .into(),
        );
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= duration);
        if !mine && !holder.is_empty() && !expired {
            return Ok(Look::Following(holder));
        }
        if !mine && !may_take {
            return Ok(Look::Free);
        }
        let (acquired, transitions) = if mine {
            (
                spec.acquire_time.map_or(now, |t| t.0),
                spec.lease_transitions.unwrap_or(0),
            )
        } else {
            (now, spec.lease_transitions.unwrap_or(0) + 1)
        };
        lease.spec = Some(self.spec(acquired, now, transitions));
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.observed = written.spec.map(|spec| (spec, Instant::now()));
                Ok(Look::Leading)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Look::Following(holder)),
            Err(error) => Err(error),
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs().try_into().unwrap_or(15)),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}

//! One actor per NodeClaim, running its lifecycle ([`crate::lifecycle`]) one step at a time: a
//! step runs as a spawned future so the mailbox keeps being served, pokes that arrive meanwhile
//! fold into one more step, and a step that asks to be woken later gets a timer.
//!
//! Supervision: a step that fails is retried with backoff ([`backoff`]); after every
//! [`MAX_CONSECUTIVE_FAILURES`] in a row the actor stops and its supervisor restarts it with fresh
//! memory, reading the claim again from the read model. The backoff outlives the restart: a
//! persistent failure is retried ever more slowly, up to [`MAX_BACKOFF`], never in a tight loop.
//! Other NodeClaims' actors are untouched. When the claim is gone the actor leaves the directory
//! and stops for good.

use std::time::Duration;

use actix::prelude::*;

use crate::{
    decide::timing::doubling_backoff,
    decide::{
        fold::Fold,
        lifecycle::{Memory, Next},
    },
    lifecycle,
    protocol::Reconcile,
    shared::Shared,
};

/// Pokes queued before senders see `Full` (one queued poke is as good as many).
pub const NODE_CLAIM_MAILBOX: usize = 8;

/// Failed steps in a row before the actor restarts.
pub const MAX_CONSECUTIVE_FAILURES: u32 = 5;

/// The longest wait between two attempts of a failing step.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The wait after `failures` failed steps in a row: 200 ms, doubling, up to [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    doubling_backoff(Duration::from_millis(200), failures, MAX_BACKOFF)
}

/// See the module docs.
pub struct NodeClaimActor {
    name: String,
    shared: Shared,
    memory: Memory,
    fold: Fold,
    failures: u32,
    restarts: u32,
    wake: Option<SpawnHandle>,
}

impl NodeClaimActor {
    /// The actor for the NodeClaim `name`.
    pub fn new(name: String, shared: Shared) -> Self {
        Self {
            name,
            shared,
            memory: Memory::default(),
            fold: Fold::default(),
            failures: 0,
            restarts: 0,
            wake: None,
        }
    }

    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.fold.start() {
            self.step(ctx);
        }
    }

    fn step(&mut self, ctx: &mut Context<Self>) {
        if let Some(wake) = self.wake.take() {
            ctx.cancel_future(wake);
        }
        let shared = self.shared.clone();
        let name = self.name.clone();
        let mut memory = self.memory.clone();
        let step = async move {
            let started = tokio::time::Instant::now();
            let next = lifecycle::step(&shared, &name, &mut memory).await;
            let result = match &next {
                Ok(Next::After(_)) => "requeue_after",
                Ok(_) => "success",
                Err(_) => "error",
            };
            let seconds = started.elapsed().as_secs_f64();
            shared.metrics.reconciled("nodeclaim.lifecycle", result, seconds);
            (next, memory)
        };
        ctx.spawn(step.into_actor(self).map(|(next, memory), actor, ctx| {
            actor.memory = memory;
            match next {
                Ok(Next::Gone) => {
                    actor.shared.directory.node_claims.remove(&actor.name);
                    ctx.stop();
                    return;
                }
                Ok(next) => {
                    actor.failures = 0;
                    if let Next::After(wait) = next {
                        actor.wake = Some(ctx.run_later(wait, |actor, ctx| actor.kick(ctx)));
                    }
                }
                Err(error) => {
                    actor.failures += 1;
                    tracing::warn!(nodeclaim = actor.name, failures = actor.failures, %error, "nodeclaim step failed");
                    if actor.failures.is_multiple_of(MAX_CONSECUTIVE_FAILURES) {
                        ctx.stop();
                        return;
                    }
                    let wait = backoff(actor.failures);
                    actor.wake = Some(ctx.run_later(wait, |actor, ctx| actor.kick(ctx)));
                }
            }
            if actor.fold.finish() {
                actor.step(ctx);
            }
        }));
    }
}

impl Actor for NodeClaimActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(NODE_CLAIM_MAILBOX);
        if self.failures == 0 {
            self.kick(ctx);
        } else {
            // Restarted after failures: the first step waits out the backoff it earned.
            let wait = backoff(self.failures);
            self.wake = Some(ctx.run_later(wait, |actor, ctx| actor.kick(ctx)));
        }
    }
}

impl Supervised for NodeClaimActor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        self.restarts += 1;
        tracing::warn!(
            nodeclaim = self.name,
            restarts = self.restarts,
            "restarting the nodeclaim actor"
        );
        self.memory = Memory::default();
        self.fold = Fold::default();
        self.wake = None;
    }
}

impl Handler<Reconcile> for NodeClaimActor {
    type Result = ();

    fn handle(&mut self, _msg: Reconcile, ctx: &mut Self::Context) {
        let _span = tracing::debug_span!("nodeclaim.reconcile", nodeclaim = self.name).entered();
        self.kick(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(5), Duration::from_millis(3_200));
        assert_eq!(backoff(12), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}

//! The Batcher: collects provisionable pods into one window and hands the window to the
//! Provisioner, so a burst of pending pods is simulated once rather than pod by pod.
//!
//! As Karpenter's batcher: the first pod opens a window; it closes when no new pod arrived for
//! `BATCH_IDLE_DURATION` or when it has been open for `BATCH_MAX_DURATION`. Pods are deduplicated
//! within a window (by a 64-bit hash of their key: the window only counts them, and closing it
//! frees no string). When the Provisioner's mailbox is full the window is kept and sent later
//! (pods are never dropped: the Provisioner lists every pending pod anyway).

use std::{
    collections::HashSet,
    hash::{BuildHasher, BuildHasherDefault, DefaultHasher},
};

use actix::prelude::*;
use tokio::time::Instant;

use crate::{
    effects::metrics::Metrics,
    protocol::{PodPending, ProvisionBatch},
    settings::Settings,
    state::read_model::PodKey,
};

/// Pod notifications the Batcher queues before senders see `Full` (and coalesce).
pub const BATCHER_MAILBOX: usize = 4096;

/// See the module docs.
pub struct Batcher {
    idle: std::time::Duration,
    max: std::time::Duration,
    provisioner: Recipient<ProvisionBatch>,
    metrics: Metrics,
    /// The hashes of the window's pods' keys.
    window: HashSet<u64>,
    opened: Option<Instant>,
    last: Option<Instant>,
    check: Option<SpawnHandle>,
}

impl Batcher {
    /// A batcher feeding `provisioner` (the Provisioner, or anything that takes batches).
    pub fn new(settings: &Settings, provisioner: Recipient<ProvisionBatch>, metrics: Metrics) -> Self {
        Self {
            idle: settings.batch_idle,
            max: settings.batch_max,
            provisioner,
            metrics,
            window: HashSet::new(),
            opened: None,
            last: None,
            check: None,
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let (Some(opened), Some(last)) = (self.opened, self.last) else {
            return;
        };
        let due = (last + self.idle).min(opened + self.max);
        if let Some(handle) = self.check.take() {
            ctx.cancel_future(handle);
        }
        let wait = due.saturating_duration_since(Instant::now());
        self.check = Some(ctx.run_later(wait, |batcher, ctx| batcher.close(ctx)));
    }

    fn close(&mut self, ctx: &mut Context<Self>) {
        self.check = None;
        let now = Instant::now();
        let (Some(opened), Some(last)) = (self.opened, self.last) else {
            return;
        };
        if now < last + self.idle && now < opened + self.max {
            self.schedule(ctx);
            return;
        }
        match self.provisioner.try_send(ProvisionBatch {
            pods: self.window.len(),
        }) {
            Ok(()) => {
                self.window.clear();
                self.opened = None;
                self.last = None;
            }
            Err(SendError::Full(batch) | SendError::Closed(batch)) => {
                self.metrics.found_full("provisioner");
                tracing::debug!(pods = batch.pods, "provisioner busy; keeping the window");
                self.opened = Some(now);
                self.last = Some(now);
                self.schedule(ctx);
            }
        }
    }
}

impl Actor for Batcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(BATCHER_MAILBOX);
    }
}

impl Handler<PodPending> for Batcher {
    type Result = ();

    fn handle(&mut self, msg: PodPending, ctx: &mut Self::Context) {
        let _span =
            tracing::debug_span!("batcher.pod_pending", pod = %format!("{}/{}", msg.pod.0, msg.pod.1))
                .entered();
        let now = Instant::now();
        if !self.window.insert(key_hash(&msg.pod)) {
            return;
        }
        self.opened.get_or_insert(now);
        self.last = Some(now);
        if self.check.is_none() {
            self.schedule(ctx);
        }
    }
}

/// A pod key's hash, the same in every run.
fn key_hash(pod: &PodKey) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(pod)
}

//! The NodeClaims Joist created that the watch has not shown yet, as Karpenter's cluster state
//! records its launches: they count (limits, in-flight capacity) from the moment they are created.
//! Each is kept until the watch shows it or [`READ_MODEL_LAG`] passes; the claims are also kept in
//! creation order, so finding those past the lag looks at the oldest only, never at every one.
//! Cannot fail; a lock poisoned by a panic elsewhere still holds a consistent record (every change
//! under it is one insert or remove in each of its two parts).

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use joist_messages::apis::NodeClaim;
use tokio::time::Instant;

use crate::decide::lifecycle::READ_MODEL_LAG;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Created(Mutex<Record>);

#[derive(Debug, Default)]
struct Record {
    by_name: HashMap<String, (Arc<NodeClaim>, Instant)>,
    /// The same creations, oldest first (those since seen are skipped when they come up).
    order: VecDeque<(Instant, String)>,
}

impl Created {
    fn lock(&self) -> MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `claim`, created now.
    pub fn insert(&self, name: String, claim: Arc<NodeClaim>) {
        let now = Instant::now();
        let mut record = self.lock();
        record.by_name.insert(name.clone(), (claim, now));
        record.order.push_back((now, name));
    }

    /// Forgets `name`: the watch shows it now.
    pub fn seen(&self, name: &str) {
        self.lock().by_name.remove(name);
    }

    /// The claim `name`, if created within the lag.
    pub fn get(&self, name: &str) -> Option<Arc<NodeClaim>> {
        let record = self.lock();
        let (claim, at) = record.by_name.get(name)?;
        (at.elapsed() < READ_MODEL_LAG).then(|| claim.clone())
    }

    /// Whether `name` is recorded.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().by_name.contains_key(name)
    }

    /// Every recorded claim.
    pub fn claims(&self) -> Vec<Arc<NodeClaim>> {
        self.lock()
            .by_name
            .values()
            .map(|(claim, _)| claim.clone())
            .collect()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().by_name.is_empty()
    }

    /// Removes and returns the claims the watch never showed within the lag.
    pub fn take_expired(&self) -> Vec<(String, Arc<NodeClaim>)> {
        let mut record = self.lock();
        let mut expired = Vec::new();
        while let Some((at, _)) = record.order.front()
            && at.elapsed() >= READ_MODEL_LAG
        {
            let Some((at, name)) = record.order.pop_front() else {
                break;
            };
            // Only the entry of that creation: the watch may have shown it since, or it may
            // have been created again.
            if record
                .by_name
                .get(&name)
                .is_some_and(|(_, created)| *created == at)
                && let Some((claim, _)) = record.by_name.remove(&name)
            {
                expired.push((name, claim));
            }
        }
        expired
    }
}

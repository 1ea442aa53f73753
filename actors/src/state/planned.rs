//! The launching NodeClaim each waiting pod was planned for, kept from one provisioning pass to
//! the next, as kube-scheduler keeps a pod's `nominatedNodeName`.
//!
//! A pass that puts a pending pod on a NodeClaim it creates, or on one still launching, counts on
//! that room. The next pass keeps the pod there while it waits, the claim's node has not
//! initialized, and the pod still fits ([`crate::state::snapshot::hold_planned`]); only the pods
//! that arrived since are simulated. Without it, each pass packed the earlier pass's pods and the
//! new ones together into the launching claims, whose instance types were chosen for the earlier
//! mix, and the pods that no longer fitted got nodes of their own.
//!
//! Each pass replaces the whole record, so it holds no more than the pods of the last pass.
//! Nothing here fails: a claim that is deleted or never registers holds no pod, and its pods are
//! simulated again.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

/// Pod UID to the name of the NodeClaim the last provisioning pass planned it for.
#[derive(Debug, Default)]
pub struct Planned(Mutex<HashMap<String, String>>);

impl Planned {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, String>> {
        // Every change is one insert or one swap: a panic elsewhere leaves a consistent map.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets every plan and keeps `plans` (pod UID to claim name) instead.
    pub fn replace(&self, plans: HashMap<String, String>) {
        *self.lock() = plans;
    }

    /// The pods with `uids` are planned for the NodeClaim `claim`, just created.
    pub fn record<'a>(&self, claim: &str, uids: impl IntoIterator<Item = &'a str>) {
        let mut plans = self.lock();
        for uid in uids {
            plans.insert(uid.to_owned(), claim.to_owned());
        }
    }

    /// `look` over every plan (pod UID to claim name), under the lock.
    pub fn with<R>(&self, look: impl FnOnce(&HashMap<String, String>) -> R) -> R {
        look(&self.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_replaces_the_plans_of_the_last() {
        let planned = Planned::default();
        planned.record("claim-a", ["pod-1", "pod-2"]);
        planned.record("claim-b", ["pod-3"]);
        let claim_of = |uid: &str| planned.with(|plans| plans.get(uid).cloned());
        assert_eq!(claim_of("pod-2").as_deref(), Some("claim-a"));
        planned.replace(HashMap::from([("pod-3".to_owned(), "claim-b".to_owned())]));
        let plans = planned.with(HashMap::clone);
        assert_eq!(plans.len(), 1, "{plans:?}");
        assert_eq!(plans.get("pod-3").map(String::as_str), Some("claim-b"));
    }
}

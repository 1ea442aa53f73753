//! The disruption commands being carried out, as Karpenter's orchestration queue holds them: the
//! planner starts a command and goes on at once, and what the command holds stays out of later
//! passes until it is done.
//!
//! A command holds its candidates' NodeClaims (no later command takes them, and the budgets count
//! them as disrupting before their taint is seen), the nodes the simulation counted on for their
//! pods and the NodeClaims launched to replace them (no later command moves pods onto those, or
//! removes them as empty, while the pods are still to come). A command holds them from its start
//! until its [`Ticket`] is dropped: after the candidates are gone, or at its rollback. Pure state
//! behind a lock; nothing fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

/// See the module docs. Cheap to clone; clones share the commands.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<Commands>>);

#[derive(Debug, Default)]
struct Commands {
    held: BTreeMap<u64, Held>,
    next: u64,
    /// Bumped by every start and end: a pass that saw one generation and found nothing must look
    /// again at another.
    generation: u64,
}

/// What one command holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Its candidates' NodeClaims.
    pub candidates: Vec<String>,
    /// The Nodes its pods were counted onto.
    pub onto: Vec<String>,
    /// The NodeClaims it launched.
    pub replacements: Vec<String>,
}

/// What every command in flight holds, together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Candidates' NodeClaims.
    pub candidates: BTreeSet<String>,
    /// Nodes counted on for pods.
    pub onto: BTreeSet<String>,
    /// Replacement NodeClaims.
    pub replacements: BTreeSet<String>,
}

/// A command's place in flight; dropping it ends the command.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    in_flight: InFlight,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, Commands> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a command holding `held`.
    pub fn start(&self, held: Held) -> Ticket {
        let mut commands = self.lock();
        let id = commands.next;
        commands.next += 1;
        commands.generation += 1;
        commands.held.insert(id, held);
        Ticket {
            id,
            in_flight: self.clone(),
        }
    }

    /// Everything the commands in flight hold.
    pub fn holding(&self) -> Holding {
        let commands = self.lock();
        let mut holding = Holding::default();
        for held in commands.held.values() {
            holding.candidates.extend(held.candidates.iter().cloned());
            holding.onto.extend(held.onto.iter().cloned());
            holding.replacements.extend(held.replacements.iter().cloned());
        }
        holding
    }

    /// Changes with every start and end.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }
}

impl Ticket {
    /// Adds a NodeClaim the command launched.
    pub fn launched(&self, replacement: String) {
        let mut commands = self.in_flight.lock();
        if let Some(held) = commands.held.get_mut(&self.id) {
            held.replacements.push(replacement);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut commands = self.in_flight.lock();
        commands.held.remove(&self.id);
        commands.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(candidate: &str, onto: &str) -> Held {
        Held {
            candidates: vec![candidate.to_owned()],
            onto: vec![onto.to_owned()],
            replacements: Vec::new(),
        }
    }

    #[test]
    fn a_command_holds_its_nodes_until_its_ticket_is_dropped() {
        let in_flight = InFlight::default();
        let first = in_flight.start(held("a", "c"));
        let second = in_flight.start(held("b", "c"));
        second.launched("r".to_owned());
        let holding = in_flight.holding();
        assert_eq!(holding.candidates, ["a".to_owned(), "b".to_owned()].into());
        assert_eq!(holding.onto, ["c".to_owned()].into());
        assert_eq!(holding.replacements, ["r".to_owned()].into());
        let generation = in_flight.generation();
        drop(second);
        assert!(in_flight.generation() > generation, "an end is a change");
        let holding = in_flight.holding();
        assert_eq!(holding.candidates, ["a".to_owned()].into());
        assert_eq!(
            holding.onto,
            ["c".to_owned()].into(),
            "the first still counts on c"
        );
        drop(first);
        assert_eq!(in_flight.holding(), Holding::default());
    }
}

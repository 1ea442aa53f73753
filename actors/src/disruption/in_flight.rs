//! The disruption commands being carried out, as Karpenter's orchestration queue holds them: the
//! planner starts a command and goes on at once, and what the command holds stays out of later
//! passes until it is done.
//!
//! A command holds its candidates' NodeClaims (no later command takes them, and the budgets count
//! them as disrupting before their taint is seen), the nodes the simulation counted on for their
//! pods and the NodeClaims launched to replace them (no later command moves pods onto those, or
//! removes them as empty, while the pods are still to come). A command holds them from its start
//! until its [`Ticket`] is dropped: after the candidates are gone, or at its rollback. A pass's
//! commands hold what they were decided with while they wait for their validation, each until its
//! own ([`InFlight::validate_in_turn`]). Pure state behind a lock; nothing fails.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
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

    /// Starts the `decided` commands of a pass that pass their validation, one after another once
    /// `wait` is over: each is validated (`validate`) with the ones validated before it in flight
    /// and the ones after it still holding what they were decided with (`held`), so none counts
    /// on the nodes or the room of a command decided beside it. One that its validation abandons
    /// holds nothing from then on. Each validated command comes with its ticket.
    pub async fn validate_in_turn<T, F: Future<Output = Option<T>>>(
        &self,
        decided: Vec<T>,
        held: impl Fn(&T) -> Held,
        wait: Duration,
        mut validate: impl FnMut(T) -> F,
    ) -> Vec<(T, Ticket)> {
        let awaiting: Vec<Ticket> = decided.iter().map(|d| self.start(held(d))).collect();
        tokio::time::sleep(wait).await;
        let mut started = Vec::new();
        for (decision, awaiting) in decided.into_iter().zip(awaiting) {
            drop(awaiting);
            if let Some(validated) = validate(decision).await {
                let ticket = self.start(held(&validated));
                started.push((validated, ticket));
            }
        }
        started
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

    #[tokio::test(start_paused = true)]
    async fn each_validation_finds_the_commands_decided_beside_it_holding_their_nodes() {
        let in_flight = InFlight::default();
        let decided = vec![held("a", "d"), held("b", "e"), held("c", "f")];
        let mut seen = Vec::new();
        let started = in_flight
            .validate_in_turn(decided, Held::clone, Duration::from_secs(15), |command| {
                seen.push(in_flight.holding());
                // The second one's validation abandons it.
                let kept = (command.candidates != ["b"]).then_some(command);
                std::future::ready(kept)
            })
            .await;
        let names = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        let candidates: Vec<BTreeSet<String>> = seen.iter().map(|h| h.candidates.clone()).collect();
        assert_eq!(
            candidates,
            [names(&["b", "c"]), names(&["a", "c"]), names(&["a"])],
            "the ones after it as decided, the ones before it as validated, none abandoned"
        );
        assert_eq!(seen[0].onto, names(&["e", "f"]), "and the room they counted on");
        let kept: Vec<&str> = started.iter().map(|(h, _)| h.candidates[0].as_str()).collect();
        assert_eq!(kept, ["a", "c"]);
        assert_eq!(in_flight.holding().candidates, names(&["a", "c"]));
        drop(started);
        assert_eq!(in_flight.holding(), Holding::default());
    }
}

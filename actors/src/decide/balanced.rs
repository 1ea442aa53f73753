//! The `Balanced` consolidation policy's score, as Karpenter v1.14 computes it (its
//! balanced-consolidation design): a move is worth making when the share of its NodePool's cost it
//! saves is at least half (1/k, k = 2) the share of its NodePool's disruption it causes.
//!
//! - A node's **disruption cost** is 1 (draining it at all) plus each pod's eviction cost that is
//!   above zero ([`node_disruption_cost`]); a NodePool's total is the sum over all its nodes,
//!   candidates or not, and its total cost the hourly price of all its nodes.
//! - A move's **savings** are what its candidates cost less the cheapest available offering of
//!   what it launches; when a move takes nodes of several Balanced pools, each pool is credited
//!   with the savings in proportion to its candidates' price, and every one must approve.
//! - Before simulating a candidate alone, [`can_pass`] asks whether deleting it outright (the best
//!   any move can do) would pass; if not, nothing is simulated for it.
//!
//! Pools with another policy always pass. A pool whose totals are zero has nothing to weigh a move
//! against, and its moves are refused (a delete-only precheck lets them through to the search).

use std::collections::BTreeMap;

/// Karpenter's `BalancedK`: a move passes when savings share / disruption share ≥ 1/k.
pub const BALANCED_K: u32 = 2;

/// What draining a node costs before any pod is counted.
pub const PER_NODE_DISRUPTION_COST: f64 = 1.0;

/// A node's disruption cost from its pods' eviction costs.
pub fn node_disruption_cost(eviction_costs: impl IntoIterator<Item = f64>) -> f64 {
    PER_NODE_DISRUPTION_COST + eviction_costs.into_iter().map(|c| c.max(0.0)).sum::<f64>()
}

/// A NodePool's denominators.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolTotals {
    /// The hourly price of every node of the pool.
    pub cost: f64,
    /// The disruption cost of every node of the pool.
    pub disruption: f64,
}

/// A move scored for one pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// The share of the pool's cost the move saves.
    pub savings_fraction: f64,
    /// The share of the pool's disruption the move causes.
    pub disruption_fraction: f64,
}

impl Score {
    /// Savings share over disruption share; 0 when nothing is saved, infinite when nothing is
    /// disrupted.
    pub fn value(&self) -> f64 {
        if self.savings_fraction <= 0.0 {
            return 0.0;
        }
        if self.disruption_fraction == 0.0 {
            return f64::INFINITY;
        }
        self.savings_fraction / self.disruption_fraction
    }

    /// The least value that passes: 1/k.
    pub fn threshold() -> f64 {
        1.0 / f64::from(BALANCED_K)
    }

    /// Whether the move passes.
    pub fn approved(&self) -> bool {
        self.value() >= Self::threshold()
    }

    /// Karpenter's words for an approved move (`ConsolidationApproved`).
    pub fn message(&self) -> String {
        format!(
            "score {:.2} >= threshold {:.2} (k: {BALANCED_K}, savings {:.1}%, disruption {:.1}%)",
            self.value(),
            Self::threshold(),
            self.savings_fraction * 100.0,
            self.disruption_fraction * 100.0
        )
    }
}

/// `savings` and `disruption` of one pool's part of a move, against its `totals`.
pub fn score(savings: f64, disruption: f64, totals: PoolTotals) -> Score {
    if totals.cost <= 0.0 || totals.disruption <= 0.0 {
        return Score {
            savings_fraction: 0.0,
            disruption_fraction: 0.0,
        };
    }
    Score {
        savings_fraction: savings / totals.cost,
        disruption_fraction: disruption / totals.disruption,
    }
}

/// One candidate of a move: its Balanced pool (`None` for another policy), hourly price and
/// disruption cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MovePart<'a> {
    /// The candidate's pool when its policy is `Balanced`.
    pub balanced_pool: Option<&'a str>,
    /// What the candidate costs per hour.
    pub price: f64,
    /// Its node's disruption cost.
    pub disruption: f64,
}

/// Scores a move that saves `savings` per hour (net of what it launches) for each Balanced pool
/// among its `parts`: whether every one approves, and each pool's score.
pub fn judge_move(
    parts: &[MovePart<'_>],
    savings: f64,
    totals: &BTreeMap<String, PoolTotals>,
) -> (bool, BTreeMap<String, Score>) {
    let source: f64 = parts.iter().map(|p| p.price).sum();
    let mut by_pool: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut pools = BTreeMap::new();
    for part in parts {
        let pool = part.balanced_pool.unwrap_or_default();
        let entry = by_pool.entry(pool).or_default();
        entry.0 += part.price;
        entry.1 += part.disruption;
        pools.insert(pool, part.balanced_pool.is_some());
    }
    let several = by_pool.len() > 1;
    let scores: BTreeMap<String, Score> = by_pool
        .into_iter()
        .filter(|(pool, _)| pools.get(pool).copied().unwrap_or_default())
        .map(|(pool, (price, disruption))| {
            let share = if several && source > 0.0 {
                price / source
            } else {
                1.0
            };
            let totals = totals.get(pool).copied().unwrap_or_default();
            (pool.to_owned(), score(savings * share, disruption, totals))
        })
        .collect();
    (scores.values().all(Score::approved), scores)
}

/// Whether deleting the candidate outright (the best any move of it can do) would pass; true for
/// other policies and for a pool without a total cost.
pub fn can_pass(part: MovePart<'_>, totals: &BTreeMap<String, PoolTotals>) -> bool {
    let Some(pool) = part.balanced_pool else {
        return true;
    };
    match totals.get(pool) {
        Some(totals) if totals.cost > 0.0 => score(part.price, part.disruption, *totals).approved(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(cost: f64, disruption: f64) -> BTreeMap<String, PoolTotals> {
        BTreeMap::from([("pool".to_owned(), PoolTotals { cost, disruption })])
    }

    fn part(price: f64, disruption: f64) -> MovePart<'static> {
        MovePart {
            balanced_pool: Some("pool"),
            price,
            disruption,
        }
    }

    #[test]
    fn a_move_passes_when_its_savings_share_is_half_its_disruption_share() {
        // Ten nodes at $1 with 5 of disruption each: removing one saves 10 % and disrupts 10 %.
        let totals = totals(10.0, 50.0);
        let (approved, scores) = judge_move(&[part(1.0, 5.0)], 1.0, &totals);
        assert!(approved);
        assert!((scores["pool"].value() - 1.0).abs() < 1e-9);
        // Saving $0.40 of it (a replacement at $0.60) is 4 % for 10 %: 0.4 < 0.5.
        let (approved, _) = judge_move(&[part(1.0, 5.0)], 0.4, &totals);
        assert!(!approved);
        // A node carrying more of the pool's pods disrupts more: $1 for 25 of 50 fails.
        assert!(!judge_move(&[part(1.0, 25.0)], 1.0, &totals).0);
    }

    #[test]
    fn other_policies_always_pass_and_a_pool_without_totals_refuses() {
        let other = MovePart {
            balanced_pool: None,
            price: 1.0,
            disruption: 100.0,
        };
        assert!(judge_move(&[other], 0.01, &BTreeMap::new()).0);
        assert!(can_pass(other, &BTreeMap::new()));
        assert!(!judge_move(&[part(1.0, 1.0)], 1.0, &totals(0.0, 0.0)).0);
        assert!(can_pass(part(1.0, 1.0), &totals(0.0, 0.0)));
    }

    #[test]
    fn a_move_across_pools_credits_each_with_its_share_of_the_savings() {
        let totals = BTreeMap::from([
            (
                "a".to_owned(),
                PoolTotals {
                    cost: 4.0,
                    disruption: 4.0,
                },
            ),
            (
                "b".to_owned(),
                PoolTotals {
                    cost: 4.0,
                    disruption: 4.0,
                },
            ),
        ]);
        let a = MovePart {
            balanced_pool: Some("a"),
            price: 3.0,
            disruption: 1.0,
        };
        let b = MovePart {
            balanced_pool: Some("b"),
            price: 1.0,
            disruption: 2.0,
        };
        // $2 saved: a gets $1.50 (37.5 % for 25 %), b $0.50 (12.5 % for 50 %): b refuses.
        let (approved, scores) = judge_move(&[a, b], 2.0, &totals);
        assert!(!approved);
        assert!(scores["a"].approved() && !scores["b"].approved());
    }

    #[test]
    fn the_delete_precheck_is_the_best_case() {
        let totals = totals(10.0, 10.0);
        assert!(can_pass(part(1.0, 2.0), &totals), "10 % for 20 %: 0.5");
        assert!(!can_pass(part(1.0, 3.0), &totals), "10 % for 30 %");
        assert!(node_disruption_cost([2.0, -3.0, 0.5]) == 3.5);
    }
}

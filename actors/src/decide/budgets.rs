//! NodePool disruption budgets, as Karpenter counts them: for a reason (`Empty`, `Underutilized`,
//! `Drifted`), the allowed disruptions are the minimum over the budgets that are active now and
//! apply to the reason (`nodes` as a count, or a percentage of the pool's nodes rounded up), less
//! the pool's nodes already being disrupted or NotReady, never below zero.
//!
//! A budget with a `schedule` is active for `duration` after each time its cron schedule (UTC)
//! fires. A schedule or `nodes` value that does not parse (the CRD rejects both, so only an object
//! written around validation has one) makes that budget allow nothing, as Karpenter treats it:
//! safety before savings.

use std::str::FromStr;

use croner::Cron;
use joist_messages::apis::{
    NodePool,
    nodepool::{Budget, BudgetNodes, DisruptionReason},
};

/// How many of a pool's nodes may be disrupted for `reason` at `now_seconds` (see the module
/// docs): `nodes` is the pool's initialized, non-deleting nodes, `disrupting` those already being
/// disrupted or NotReady.
pub fn allowed(
    pool: &NodePool,
    reason: DisruptionReason,
    nodes: u32,
    disrupting: u32,
    now_seconds: i64,
) -> u32 {
    let limit = pool
        .spec
        .disruption
        .budgets
        .iter()
        .filter(|b| b.reasons.is_empty() || b.reasons.contains(&reason))
        .filter_map(|b| match is_active(b, now_seconds) {
            Some(false) => None,
            Some(true) => Some(BudgetNodes::parse(&b.nodes).map_or(0, |n| n.allowed(nodes))),
            None => Some(0),
        })
        .min()
        .unwrap_or(u32::MAX);
    limit.saturating_sub(disrupting)
}

/// Whether `budget` applies at `now_seconds`; `None` when its schedule does not parse.
pub fn is_active(budget: &Budget, now_seconds: i64) -> Option<bool> {
    let Some(schedule) = &budget.schedule else {
        return Some(true);
    };
    let duration = budget.duration.as_ref()?.0.as_std().as_secs();
    let cron = Cron::from_str(schedule).ok()?;
    let now = jiff::Timestamp::from_second(now_seconds)
        .ok()?
        .to_zoned(jiff::tz::TimeZone::UTC);
    Some(cron.find_previous_occurrence(&now, true).is_ok_and(|fired| {
        let since = now.timestamp().as_second() - fired.timestamp().as_second();
        u64::try_from(since).is_ok_and(|since| since < duration)
    }))
}

/// Most windows of one budget looked at between two times: a schedule firing every minute opens
/// 1,440 windows a day.
const MOST_WINDOWS: usize = 2_000;

/// The times in `(from, to)` (epoch seconds) at which one of `pool`'s scheduled budgets opens or
/// closes, in order: between two of them (and `from`), what the budgets allow stays the same. A
/// schedule that does not parse has none (it allows nothing at all times).
pub fn changes_between(pool: &NodePool, from: i64, to: i64) -> Vec<i64> {
    let mut changes = std::collections::BTreeSet::new();
    for budget in &pool.spec.disruption.budgets {
        let (Some(schedule), Some(duration)) = (&budget.schedule, &budget.duration) else {
            continue;
        };
        let Ok(cron) = Cron::from_str(schedule) else {
            continue;
        };
        let length = i64::try_from(duration.0.as_std().as_secs()).unwrap_or(i64::MAX);
        // A window opened before `from` may still close after it.
        let Ok(start) = jiff::Timestamp::from_second(from.saturating_sub(length)) else {
            continue;
        };
        let mut at = start.to_zoned(jiff::tz::TimeZone::UTC);
        for _ in 0..MOST_WINDOWS {
            let Ok(fired) = cron.find_next_occurrence(&at, false) else {
                break;
            };
            let opens = fired.timestamp().as_second();
            if opens >= to {
                break;
            }
            let closes = opens.saturating_add(length);
            changes.extend([opens, closes].into_iter().filter(|t| *t > from && *t < to));
            at = fired;
        }
    }
    changes.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z, a Thursday.
    const NEW_YEAR: i64 = 1_767_225_600;

    fn pool(budgets: serde_json::Value) -> NodePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {
                "template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}}},
                "disruption": {"consolidateAfter": "0s", "budgets": budgets},
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_default_budget_allows_ten_percent_rounded_up() {
        let pool = pool(serde_json::json!([{"nodes": "10%"}]));
        assert_eq!(allowed(&pool, DisruptionReason::Empty, 25, 0, NEW_YEAR), 3);
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 25, 2, NEW_YEAR),
            1,
            "two already disrupting"
        );
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 25, 5, NEW_YEAR),
            0,
            "never below zero"
        );
    }

    #[test]
    fn the_most_restrictive_budget_for_the_reason_wins() {
        let pool = pool(serde_json::json!([
            {"nodes": "5"},
            {"nodes": "0", "reasons": ["Underutilized"]},
        ]));
        assert_eq!(
            allowed(&pool, DisruptionReason::Underutilized, 10, 0, NEW_YEAR),
            0
        );
        assert_eq!(allowed(&pool, DisruptionReason::Empty, 10, 0, NEW_YEAR), 5);
    }

    #[test]
    fn the_next_day_changes_where_scheduled_windows_open_and_close() {
        let pool = pool(serde_json::json!([
            {"nodes": "100%"},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"},
            {"nodes": "1", "schedule": "30 23 * * *", "duration": "1h", "reasons": ["Drifted"]},
        ]));
        let hour = 3600;
        // From Thursday 10:00, inside the 09:00 window, for a day.
        let from = NEW_YEAR + 10 * hour;
        assert_eq!(
            changes_between(&pool, from, from + 24 * hour),
            [
                NEW_YEAR + 17 * hour,
                NEW_YEAR + 23 * hour + 1800,
                NEW_YEAR + 24 * hour + 1800,
                NEW_YEAR + 33 * hour,
            ],
            "the open window closes at 17:00, the nightly one runs 23:30 to 00:30, Friday's opens at 09:00"
        );
        assert!(
            changes_between(&pool, NEW_YEAR + 58 * hour, NEW_YEAR + 60 * hour).is_empty(),
            "Saturday 10:00 to 12:00: nothing opens or closes"
        );
    }

    #[test]
    fn a_schedule_that_does_not_parse_allows_nothing() {
        let pool = pool(serde_json::json!([{"nodes": "5", "schedule": "every day", "duration": "1h"}]));
        assert_eq!(allowed(&pool, DisruptionReason::Empty, 10, 0, NEW_YEAR), 0);
    }

    #[test]
    fn a_scheduled_budget_applies_only_inside_its_window() {
        // No disruption from 09:00 for 8 hours, on weekdays.
        let pool = pool(serde_json::json!([
            {"nodes": "100%"},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"},
        ]));
        let at = |hour: i64| NEW_YEAR + hour * 3600;
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 4, 0, at(10)),
            0,
            "Thursday 10:00: closed"
        );
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 4, 0, at(18)),
            4,
            "17:00 ended it"
        );
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 4, 0, at(8)),
            4,
            "not yet open"
        );
        assert_eq!(
            allowed(&pool, DisruptionReason::Empty, 4, 0, at(58)),
            4,
            "Saturday 10:00"
        );
    }
}

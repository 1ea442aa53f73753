//! NodeOverlays applied to a NodePool's instance types (Karpenter's `NodeOverlay` feature gate),
//! and the overlays' status.
//!
//! An overlay applies to an instance type when its requirements fit the type's labels together with
//! the pool's (`karpenter.sh/nodepool` and the template's labels): a key the type does not have
//! fits only `NotIn` or `DoesNotExist`. The zone and capacity-type requirements pick the offerings
//! it changes; with none picked it does not apply. Overlays are taken highest `weight` first (an
//! unset weight is 0; between equal weights the later name first, as Karpenter orders them):
//!
//! - an offering's price is changed by the first overlay that picks it (no stacking);
//! - each extended resource is set by the first overlay that names it.
//!
//! Two overlays of equal weight that would both change one offering's price, or both set one
//! resource of a type, conflict: the one with the earlier name is left out everywhere, and its
//! status says `ValidationSucceeded=False`, reason `Conflict`, with a warning event. An overlay its
//! validation refuses is left out the same way, reason `ValidationFailed`.

use std::{collections::BTreeSet, sync::Arc};

use joist_messages::{
    apis::{NodeOverlay, NodePool, Validate, nodeoverlay::PriceChange},
    conditions::{self, ConditionType, ConditionUpdate},
    labels::{CAPACITY_TYPE, NODEPOOL, ZONE},
    model::{
        instance_type::InstanceType,
        requirements::{Operator, Requirement, Requirements},
    },
};
use kube::ResourceExt;

use crate::{
    effects::kube_ops::{self, set_condition},
    shared::Shared,
};

/// Instance types with the overlays applied.
pub struct Overlaid {
    /// The types, changed where an overlay applies (the others shared with the input).
    pub types: Arc<Vec<Arc<InstanceType>>>,
    /// The overlays left out for a conflict.
    pub conflicted: BTreeSet<String>,
    /// Whether an overlay changed an offering's price.
    pub repriced: bool,
}

/// `types`, the catalog's for `pool`, as the NodeOverlays change them when the `NodeOverlay` gate
/// is on (unchanged otherwise). Nothing is written: a pass gathers every pool's conflicts and
/// hands them to [`write_statuses`].
pub fn for_pool(shared: &Shared, pool: &NodePool, types: Arc<Vec<Arc<InstanceType>>>) -> Overlaid {
    let overlays = if shared.settings.node_overlay {
        shared.read.overlays()
    } else {
        Vec::new()
    };
    if overlays.is_empty() {
        return Overlaid {
            types,
            conflicted: BTreeSet::new(),
            repriced: false,
        };
    }
    apply(&types, pool, &overlays)
}

/// Writes every overlay's status from a pass over all pools: `Conflict` for those `conflicted`
/// left out, their validation for the others (so a conflict clears once its cause is gone).
pub fn write_statuses(shared: &Shared, conflicted: BTreeSet<String>) {
    let overlays = shared.read.overlays();
    if overlays.is_empty() {
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        for overlay in overlays {
            if conflicted.contains(&overlay.name_any()) {
                write_conflict(&shared, &overlay).await;
            } else {
                write_validation(&shared, &overlay).await;
            }
        }
    });
}

/// Whether `overlay`'s status already answers its current spec (a status-only change, such as
/// the writes above, needs no new answer).
pub fn answered(overlay: &NodeOverlay) -> bool {
    overlay
        .status
        .as_ref()
        .and_then(|status| conditions::find(&status.conditions, ConditionType::ValidationSucceeded))
        .is_some_and(|validation| validation.observed_generation == overlay.metadata.generation)
}

/// An overlay ready to apply: its parsed requirements and price change.
struct Usable<'a> {
    overlay: &'a NodeOverlay,
    requirements: Requirements,
    price: Option<PriceChange>,
}

/// `types` of `pool` with `overlays` applied, and the names of the overlays left out for a
/// conflict (see the module docs).
pub fn apply(types: &[Arc<InstanceType>], pool: &NodePool, overlays: &[Arc<NodeOverlay>]) -> Overlaid {
    let usable = usable(overlays);
    let context = pool_labels(pool);
    // Per type, the offerings each usable overlay picks: judged once, for conflicts and changes.
    let picked: Vec<Vec<Option<Vec<usize>>>> = types
        .iter()
        .map(|it| usable.iter().map(|u| picks(u, it, &context)).collect())
        .collect();
    let conflicted = conflicts(&usable, &picked);
    let kept: Vec<bool> = usable
        .iter()
        .map(|u| !conflicted.contains(&u.overlay.name_any()))
        .collect();
    let mut repriced = false;
    let applied = types
        .iter()
        .zip(&picked)
        .map(|(it, picks)| {
            let mut changed: Option<InstanceType> = None;
            let mut priced = vec![false; it.offerings.len()];
            let mut resources = BTreeSet::new();
            for ((overlay, picked), _) in usable.iter().zip(picks).zip(&kept).filter(|(_, kept)| **kept) {
                let Some(picked) = picked else {
                    continue;
                };
                let target = changed.get_or_insert_with(|| it.as_ref().clone());
                if let Some(change) = overlay.price {
                    for &i in picked {
                        if !priced[i] {
                            priced[i] = true;
                            target.offerings[i].price = change.apply(target.offerings[i].price);
                            repriced = true;
                        }
                    }
                }
                for (name, quantity) in &overlay.overlay.spec.capacity {
                    if resources.insert(name.clone()) {
                        target.capacity.set(name, *quantity);
                    }
                }
            }
            changed.map_or_else(|| it.clone(), Arc::new)
        })
        .collect();
    Overlaid {
        types: Arc::new(applied),
        conflicted,
        repriced,
    }
}

/// The valid overlays, highest weight first (the later name first among equals).
fn usable(overlays: &[Arc<NodeOverlay>]) -> Vec<Usable<'_>> {
    let mut usable: Vec<Usable<'_>> = overlays
        .iter()
        .filter(|o| o.validate().is_empty())
        .filter_map(|overlay| {
            let requirements = overlay
                .spec
                .requirements
                .iter()
                .map(|r| r.to_requirement())
                .collect::<Result<Requirements, _>>()
                .ok()?;
            let price = overlay.spec.price_change().ok()?;
            Some(Usable {
                overlay,
                requirements,
                price,
            })
        })
        .collect();
    usable.sort_by(|a, b| {
        (b.overlay.spec.weight(), b.overlay.name_any()).cmp(&(a.overlay.spec.weight(), a.overlay.name_any()))
    });
    usable
}

/// The pool's labels every one of its nodes has, as requirements.
fn pool_labels(pool: &NodePool) -> Requirements {
    let name = pool.name_any();
    std::iter::once((NODEPOOL, name.as_str()))
        .chain(
            pool.spec
                .template
                .metadata
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .filter_map(|(key, value)| Requirement::new(key, Operator::In, [value]).ok())
        .collect()
}

/// The positions of the offerings of `it` that `overlay` picks, `None` when it does not apply.
fn picks(overlay: &Usable<'_>, it: &InstanceType, context: &Requirements) -> Option<Vec<usize>> {
    let per_offering = |key: &str| key == ZONE || key == CAPACITY_TYPE;
    let type_fits = overlay
        .requirements
        .iter()
        .filter(|r| !per_offering(r.key()))
        .all(|wanted| {
            match it
                .requirements
                .get(wanted.key())
                .or_else(|| context.get(wanted.key()))
            {
                Some(has) => has.overlaps(wanted),
                None => wanted.allows_absent(),
            }
        });
    if !type_fits {
        return None;
    }
    let picked: Vec<usize> = it
        .offerings
        .iter()
        .enumerate()
        .filter(|(_, offering)| {
            let allows = |key: &str, value: &str| overlay.requirements.get(key).is_none_or(|r| r.has(value));
            allows(ZONE, &offering.zone) && allows(CAPACITY_TYPE, offering.capacity_type.label())
        })
        .map(|(i, _)| i)
        .collect();
    (!picked.is_empty()).then_some(picked)
}

/// Overlays of equal weight that would change one offering's price or set one resource of a
/// type: of each pair, the one with the earlier name.
/// `picked` holds, per type, what each of `usable` picks.
fn conflicts(usable: &[Usable<'_>], picked: &[Vec<Option<Vec<usize>>>]) -> BTreeSet<String> {
    let mut conflicted = BTreeSet::new();
    for picks in picked {
        for (i, a) in usable.iter().enumerate() {
            for (j, b) in usable.iter().enumerate().skip(i + 1) {
                if a.overlay.spec.weight() != b.overlay.spec.weight() {
                    continue;
                }
                let (Some(pa), Some(pb)) = (&picks[i], &picks[j]) else {
                    continue;
                };
                let same_price = a.price.is_some() && b.price.is_some() && pa.iter().any(|o| pb.contains(o));
                let same_resource = a
                    .overlay
                    .spec
                    .capacity
                    .keys()
                    .any(|k| b.overlay.spec.capacity.contains_key(k));
                if same_price || same_resource {
                    // `usable` puts the later name first: `b` has the earlier one.
                    conflicted.insert(b.overlay.name_any());
                }
            }
        }
    }
    conflicted
}

/// Writes an overlay's `ValidationSucceeded` and `Ready` from its validation, with a warning event
/// when it turns invalid.
pub async fn write_validation(shared: &Shared, overlay: &NodeOverlay) {
    let problems: Vec<String> = overlay.validate().iter().map(ToString::to_string).collect();
    let reason = if problems.is_empty() {
        None
    } else {
        Some(("ValidationFailed", problems.join("; ")))
    };
    write_conditions(shared, overlay, reason).await;
}

/// Marks `overlay` left out for a conflict.
async fn write_conflict(shared: &Shared, overlay: &NodeOverlay) {
    let message =
        "conflicts with another overlay of the same weight that changes the same offering price or resource";
    write_conditions(shared, overlay, Some(("Conflict", message.to_owned()))).await;
}

async fn write_conditions(shared: &Shared, overlay: &NodeOverlay, problem: Option<(&str, String)>) {
    let mut status = overlay.status.clone().unwrap_or_default();
    let generation = overlay.metadata.generation;
    let clock = &shared.clock;
    let newly_failed = match &problem {
        None => {
            set_condition(
                &mut status.conditions,
                clock,
                generation,
                &ConditionUpdate::holds(ConditionType::ValidationSucceeded),
            );
            set_condition(
                &mut status.conditions,
                clock,
                generation,
                &ConditionUpdate::holds(ConditionType::Ready),
            );
            false
        }
        Some((reason, message)) => kube_ops::set_validation_failed(
            &mut status.conditions,
            clock,
            generation,
            (reason, message),
            message,
        ),
    };
    if let Some((reason, message)) = problem.filter(|_| newly_failed) {
        shared.events.warn(overlay, reason, &message);
    }
    if overlay.status.as_ref() == Some(&status) {
        return;
    }
    let api = kube_ops::cluster::<NodeOverlay>(&shared.client);
    let body = serde_json::json!({"conditions": status.conditions});
    if let Err(error) = kube_ops::patch_status(&api, &overlay.name_any(), body).await {
        tracing::warn!(nodeoverlay = overlay.name_any(), %error, "writing the overlay status failed");
    }
}

#[cfg(test)]
mod tests {
    use joist_messages::model::{instance_type::CapacityType, quantity::Quantity};
    use serde_json::json;

    use super::*;

    fn types() -> Vec<Arc<InstanceType>> {
        joist_scheduling::workloads::karpenter_instance_types(3)
    }

    fn pool() -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"metadata": {"labels": {"team": "a"}}, "spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn overlay(name: &str, weight: i32, spec: serde_json::Value) -> Arc<NodeOverlay> {
        let mut spec = spec;
        spec["weight"] = json!(weight);
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": name}, "spec": spec
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn price(types: &[Arc<InstanceType>], name: &str, capacity_type: CapacityType) -> Vec<f64> {
        types
            .iter()
            .filter(|it| it.name == name)
            .flat_map(|it| &it.offerings)
            .filter(|o| o.capacity_type == capacity_type)
            .map(|o| o.price)
            .collect()
    }

    #[test]
    fn the_heaviest_overlay_prices_an_offering_and_others_do_not_stack() {
        let spot_half = overlay(
            "spot-half",
            10,
            json!({"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}],
                   "priceAdjustment": "-50%"}),
        );
        let fixed = overlay(
            "fixed",
            1,
            json!({"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["fake-it-0"]}],
                   "price": "0.01"}),
        );
        let before = types();
        let Overlaid {
            types: after,
            conflicted,
            repriced,
        } = apply(&before, &pool(), &[fixed, spot_half]);
        assert!(conflicted.is_empty() && repriced);
        let was = price(&before, "fake-it-0", CapacityType::Spot)[0];
        assert_eq!(
            price(&after, "fake-it-0", CapacityType::Spot),
            [was / 2.0, was / 2.0],
            "weight 10 wins on spot"
        );
        assert_eq!(
            price(&after, "fake-it-0", CapacityType::OnDemand),
            [0.01; 3],
            "weight 1 on the rest"
        );
        assert_eq!(
            price(&after, "fake-it-2", CapacityType::OnDemand),
            price(&before, "fake-it-2", CapacityType::OnDemand)
        );
    }

    #[test]
    fn an_overlay_applies_through_the_pools_labels_and_adds_extended_resources() {
        let hugepages = overlay(
            "hugepages",
            1,
            json!({"requirements": [{"key": "team", "operator": "In", "values": ["a"]},
                                    {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]}],
                   "capacity": {"hugepages-2Mi": "1Gi"}}),
        );
        let elsewhere = overlay(
            "elsewhere",
            1,
            json!({"requirements": [{"key": "team", "operator": "In", "values": ["b"]}], "capacity": {"example.com/x": "1"}}),
        );
        let Overlaid {
            types: after,
            repriced,
            ..
        } = apply(&types(), &pool(), &[hugepages, elsewhere]);
        assert!(!repriced, "capacity only");
        assert!(
            after
                .iter()
                .all(|it| it.capacity.get("hugepages-2Mi") == "1Gi".parse::<Quantity>().unwrap_or_default())
        );
        assert!(
            after.iter().all(|it| it.capacity.get("example.com/x").is_zero()),
            "team b is not this pool's"
        );
    }

    #[test]
    fn equal_weights_on_one_price_conflict_and_the_earlier_name_is_left_out() {
        let spec = json!({"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["fake-it-1"]}], "priceAdjustment": "+1"});
        let Overlaid {
            types: after,
            conflicted,
            ..
        } = apply(
            &types(),
            &pool(),
            &[overlay("b", 5, spec.clone()), overlay("a", 5, spec)],
        );
        assert_eq!(conflicted.into_iter().collect::<Vec<_>>(), ["a"]);
        let before = price(&types(), "fake-it-1", CapacityType::OnDemand)[0];
        assert!(
            (price(&after, "fake-it-1", CapacityType::OnDemand)[0] - (before + 1.0)).abs() < 1e-9,
            "b alone applies"
        );
    }
}

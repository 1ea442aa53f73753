//! `karpenter.sh/v1alpha1` NodeOverlay (Karpenter's `NodeOverlay` feature gate): changes what the
//! catalog says about the instance types its `requirements` select, for every NodePool: their
//! offerings' price (`price`, absolute, or `priceAdjustment`, `+0.5`, `-10%`) and extended
//! resources they provide (`capacity`). A user models a negotiated discount or a hugepage resource
//! with it. Among overlays that select the same offering the highest `weight` decides its price,
//! and per resource name its capacity; how the catalog applies them is
//! `joist_actors::overlay`'s job.
//!
//! Rules live as CEL on the CRD and in [`Validate::validate`]; a malformed price is a violation
//! naming the field.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    common::{NodeSelectorRequirementWithMinValues, validate_requirements},
    validation::{Validate, Violation, Violations},
};
use crate::model::quantity::Quantity;

/// Pattern of [`NodeOverlaySpec::price`]: an unsigned decimal.
pub const PRICE_PATTERN: &str = r"^\d+(\.\d+)?$";
/// Pattern of [`NodeOverlaySpec::price_adjustment`]: a signed decimal, `+N%`, or `-N%` below 100
/// (or exactly `-100%`).
pub const PRICE_ADJUSTMENT_PATTERN: &str =
    r"^(([+-]\d+(\.\d+)?)|(\+\d+(\.\d+)?%)|(-\d{1,2}(\.\d+)?%)|(-100%))$";
/// Resources an overlay cannot change: the ones every node's capacity math derives.
pub const FIXED_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

/// NodeOverlaySpec: what to change about the instance types `requirements` select.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "karpenter.sh",
    version = "v1alpha1",
    kind = "NodeOverlay",
    plural = "nodeoverlays",
    status = "NodeOverlayStatus",
    category = "karpenter",
    shortname = "overlays",
    derive = "PartialEq",
    doc = "NodeOverlay changes the price and extended resources of the instance types it selects",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Weight",
        type_ = "integer",
        json_path = ".spec.weight",
        priority = "1"
    )
)]
#[x_kube(validation = Rule::new("!has(self.price) || !has(self.priceAdjustment)")
    .message("price and priceAdjustment are mutually exclusive"))]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlaySpec {
    /// The instance types (and offerings: zone, capacity type) it applies to, as node selector
    /// requirements; `karpenter.sh/nodepool` selects NodePools.
    #[schemars(length(max = 100), transform = without_min_values)]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The offerings' price per hour, replacing the cloud's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = PRICE_PATTERN))]
    pub price: Option<String>,
    /// A change of the offerings' price: `+0.5` or `-0.5` dollars, `+10%` or `-10%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = PRICE_ADJUSTMENT_PATTERN))]
    pub price_adjustment: Option<String>,
    /// Extended resources the instance types provide (not cpu, memory, ephemeral-storage, pods).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, !(k in ['cpu', 'memory', 'ephemeral-storage', 'pods']))")
        .message("capacity cannot change cpu, memory, ephemeral-storage or pods"))]
    pub capacity: BTreeMap<String, Quantity>,
    /// Precedence among overlays selecting the same offering (higher wins), 1..=10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub weight: Option<i32>,
}

/// Overlay requirements are plain node selector requirements: `minValues` means nothing here.
fn without_min_values(schema: &mut schemars::Schema) {
    if let Some(properties) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(serde_json::Value::as_object_mut)
    {
        properties.remove("minValues");
    }
}

/// The observed state of a NodeOverlay.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlayStatus {
    /// `ValidationSucceeded` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::common::required_reason_conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// What an overlay does to one offering's price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PriceChange {
    /// Replace it.
    Set(f64),
    /// Add this many dollars (negative: subtract).
    Add(f64),
    /// Multiply it by one plus this share (`-10%` is -0.1).
    Scale(f64),
}

impl PriceChange {
    /// The new price of an offering priced `price`, never below zero.
    pub fn apply(self, price: f64) -> f64 {
        let changed = match self {
            PriceChange::Set(value) => value,
            PriceChange::Add(dollars) => price + dollars,
            PriceChange::Scale(share) => price * (1.0 + share),
        };
        changed.max(0.0)
    }
}

impl NodeOverlaySpec {
    /// The price change it makes, if any; `Err` names the field that does not parse.
    pub fn price_change(&self) -> Result<Option<PriceChange>, Violation> {
        let invalid = |field: &str, value: &str| Violation {
            field: format!("spec.{field}"),
            message: format!("{value:?} is not a price"),
        };
        if let Some(price) = &self.price {
            let value: f64 = price.parse().map_err(|_| invalid("price", price))?;
            if !value.is_finite() || value < 0.0 || price.starts_with(['+', '-']) {
                return Err(invalid("price", price));
            }
            return Ok(Some(PriceChange::Set(value)));
        }
        let Some(adjustment) = &self.price_adjustment else {
            return Ok(None);
        };
        let signed = adjustment.starts_with(['+', '-']);
        let (number, percent) = match adjustment.strip_suffix('%') {
            Some(number) => (number, true),
            None => (adjustment.as_str(), false),
        };
        let value: f64 = number
            .parse()
            .ok()
            .filter(|v: &f64| signed && v.is_finite())
            .ok_or_else(|| invalid("priceAdjustment", adjustment))?;
        if percent && value < -100.0 {
            return Err(invalid("priceAdjustment", adjustment));
        }
        Ok(Some(if percent {
            PriceChange::Scale(value / 100.0)
        } else {
            PriceChange::Add(value)
        }))
    }

    /// The weight, 0 when unset.
    pub fn weight(&self) -> i32 {
        self.weight.unwrap_or(0)
    }
}

impl Validate for NodeOverlay {
    fn validate(&self) -> Vec<Violation> {
        let mut out = Violations::default();
        out.require_name(self.metadata.name.as_deref(), "NodeOverlay");
        let spec = &self.spec;
        validate_requirements(&mut out, "spec.requirements", &spec.requirements, false);
        if spec.price.is_some() && spec.price_adjustment.is_some() {
            out.push("spec.price", "price and priceAdjustment are mutually exclusive");
        } else if let Err(violation) = spec.price_change() {
            out.push(violation.field, violation.message);
        }
        for key in spec
            .capacity
            .keys()
            .filter(|k| FIXED_RESOURCES.contains(&k.as_str()))
        {
            out.push(
                format!("spec.capacity[{key}]"),
                "an overlay cannot change cpu, memory, ephemeral-storage or pods",
            );
        }
        out.into_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(price: Option<&str>, adjustment: Option<&str>) -> NodeOverlaySpec {
        NodeOverlaySpec {
            requirements: Vec::new(),
            price: price.map(str::to_owned),
            price_adjustment: adjustment.map(str::to_owned),
            capacity: BTreeMap::new(),
            weight: None,
        }
    }

    #[test]
    fn prices_are_set_added_or_scaled_and_never_negative() {
        let change = |price, adjustment| spec(price, adjustment).price_change().ok().flatten();
        assert_eq!(change(Some("0.5"), None).map(|c| c.apply(2.0)), Some(0.5));
        assert_eq!(change(None, Some("+0.25")).map(|c| c.apply(1.0)), Some(1.25));
        assert_eq!(change(None, Some("-10%")).map(|c| c.apply(2.0)), Some(1.8));
        assert_eq!(change(None, Some("+50%")).map(|c| c.apply(2.0)), Some(3.0));
        assert_eq!(change(None, Some("-5")).map(|c| c.apply(2.0)), Some(0.0));
        assert_eq!(change(None, Some("-100%")).map(|c| c.apply(2.0)), Some(0.0));
        assert_eq!(change(None, None), None);
    }

    #[test]
    fn malformed_prices_name_their_field() {
        for (price, adjustment, field) in [
            (Some("-1"), None, "spec.price"),
            (Some("cheap"), None, "spec.price"),
            (None, Some("1.2"), "spec.priceAdjustment"),
            (None, Some("-150%"), "spec.priceAdjustment"),
            (None, Some("+x%"), "spec.priceAdjustment"),
        ] {
            let error = spec(price, adjustment).price_change().err();
            assert_eq!(
                error.map(|v| v.field),
                Some(field.to_owned()),
                "{price:?} {adjustment:?}"
            );
        }
    }
}

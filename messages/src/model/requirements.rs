//! The requirement algebra: what label values a node may have, per label key.
//!
//! A [`Requirement`] is a set of allowed values for one key, kept in a canonical form so that equal
//! sets compare equal: either an explicit set (`In`, or `DoesNotExist` when empty) or the complement
//! of an explicit set (`NotIn`, or `Exists` when nothing is excluded), optionally narrowed by
//! exclusive integer bounds (`Gt`, `Lt`, and `Gte`/`Lte` as `Gt n-1`/`Lt n+1`). Intersection keeps the
//! form canonical, which makes it commutative, associative and idempotent (property-tested).
//!
//! [`Requirements`] maps keys to requirements and answers the two questions the scheduler asks:
//! do two sets of requirements [`intersect`](Requirements::intersects) (could one node satisfy both?),
//! and do a node's labels [`satisfy`](Requirements::matches_labels) them.
//!
//! Failure modes: building a requirement from an operator and values can fail with
//! [`RequirementError`] (for example `Gt` with two values); incompatibilities are reported as
//! [`Incompatibility`], naming the key and both sides.

use std::{collections::BTreeMap, fmt};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels::normalize_label_key;

/// A node selector operator, including Karpenter's `Gte` and `Lte`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Operator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present, with any value.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value is an integer greater than the single value.
    Gt,
    /// The label's value is an integer less than the single value.
    Lt,
    /// The label's value is an integer greater than or equal to the single value.
    Gte,
    /// The label's value is an integer less than or equal to the single value.
    Lte,
}

impl Operator {
    /// True for the operators that take exactly one integer value.
    pub const fn is_numeric(self) -> bool {
        matches!(self, Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte)
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why an operator and its values do not form a requirement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    /// `In` was given no values.
    #[error("operator In on {key:?} needs at least one value")]
    InWithoutValues {
        /// The label key.
        key: String,
    },
    /// A numeric operator was not given exactly one integer.
    #[error("operator {operator} on {key:?} takes exactly one integer value, got {values:?}")]
    NotOneInteger {
        /// The label key.
        key: String,
        /// The operator.
        operator: Operator,
        /// What was given.
        values: Vec<String>,
    },
}

/// Closed integer ranges with at most this many members are kept as explicit sets.
const SMALL_RANGE: i128 = 64;

/// A requirement's explicit values: sorted, each once. A list, not a `BTreeSet`: most requirements
/// hold one value, and a B-tree allocates a node of eleven (some 280 bytes) for it; an instance
/// type carries twenty-odd requirements, and a catalog over a thousand types.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Values(Vec<String>);

impl Values {
    fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn first(&self) -> Option<&String> {
        self.0.first()
    }

    fn position(&self, value: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|v| v.as_str().cmp(value))
    }

    fn contains(&self, value: &str) -> bool {
        self.position(value).is_ok()
    }

    /// Removes `value`; whether it was there.
    fn remove(&mut self, value: &str) -> bool {
        self.position(value).map(|at| self.0.remove(at)).is_ok()
    }

    fn retain(&mut self, keep: impl FnMut(&String) -> bool) {
        self.0.retain(keep);
    }

    /// The values in either.
    fn union(&self, other: &Values) -> Values {
        self.iter().chain(other.iter()).cloned().collect()
    }
}

impl FromIterator<String> for Values {
    fn from_iter<I: IntoIterator<Item = String>>(values: I) -> Self {
        let mut values: Vec<String> = values.into_iter().collect();
        values.sort_unstable();
        values.dedup();
        values.shrink_to_fit();
        Values(values)
    }
}

/// The allowed values of one label key (see the module docs for the canonical form).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    complement: bool,
    values: Values,
    greater_than: Option<i64>,
    less_than: Option<i64>,
    min_values: Option<u32>,
}

impl Requirement {
    /// Builds the requirement `key operator values`; the key is normalized (legacy aliases).
    pub fn new<I, S>(key: &str, operator: Operator, values: I) -> Result<Self, RequirementError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let key = normalize_label_key(key).to_string();
        let values: Values = values.into_iter().map(Into::into).collect();
        let mut req = Requirement {
            key,
            complement: false,
            values: Values::default(),
            greater_than: None,
            less_than: None,
            min_values: None,
        };
        match operator {
            Operator::In if values.is_empty() => {
                return Err(RequirementError::InWithoutValues { key: req.key });
            }
            Operator::In => req.values = values,
            Operator::NotIn => (req.complement, req.values) = (true, values),
            Operator::Exists => req.complement = true,
            Operator::DoesNotExist => {}
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => {
                let bound = match values.iter().next().map(|v| v.parse::<i64>()) {
                    Some(Ok(n)) if values.len() == 1 => n,
                    _ => {
                        return Err(RequirementError::NotOneInteger {
                            key: req.key,
                            operator,
                            values: values.0,
                        });
                    }
                };
                req.complement = true;
                match operator {
                    Operator::Gt => req.greater_than = Some(bound),
                    Operator::Gte => req.greater_than = Some(bound.saturating_sub(1)),
                    Operator::Lt => req.less_than = Some(bound),
                    _ => req.less_than = Some(bound.saturating_add(1)),
                }
            }
        }
        Ok(req.normalized())
    }

    /// Sets the minimum number of distinct values a launch must keep for this key.
    #[must_use]
    pub fn with_min_values(mut self, min_values: Option<u32>) -> Self {
        self.min_values = min_values;
        self
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The minimum number of distinct values, when set.
    pub fn min_values(&self) -> Option<u32> {
        self.min_values
    }

    /// The operator this set reads as (`Gt`/`Lt` bounds read as `Exists` or `NotIn`, as in Karpenter).
    pub fn operator(&self) -> Operator {
        match (self.complement, self.values.is_empty()) {
            (true, true) => Operator::Exists,
            (true, false) => Operator::NotIn,
            (false, false) => Operator::In,
            (false, true) => Operator::DoesNotExist,
        }
    }

    /// The explicit values: allowed ones for `In`, excluded ones for `NotIn`.
    pub fn values(&self) -> impl ExactSizeIterator<Item = &str> {
        self.values.iter().map(String::as_str)
    }

    /// The label every node meeting this requirement carries: `key=value` for an `In` with one
    /// value, which is how a node launched for it is labelled before it registers.
    pub fn implied_label(&self) -> Option<(&str, &str)> {
        match (self.operator(), self.values.len()) {
            (Operator::In, 1) => Some((self.key.as_str(), self.values.first()?.as_str())),
            _ => None,
        }
    }

    /// True when no value is allowed (the label must be absent).
    pub fn is_empty(&self) -> bool {
        !self.complement && self.values.is_empty()
    }

    /// True when a node without this label satisfies the requirement (`NotIn`, `DoesNotExist`).
    pub fn allows_absent(&self) -> bool {
        match self.operator() {
            Operator::DoesNotExist => true,
            // A bounded set (from Gt/Lt) needs the label to exist, even with exclusions.
            Operator::NotIn => !self.has_bounds(),
            _ => false,
        }
    }

    /// True when `value` is allowed.
    pub fn has(&self, value: &str) -> bool {
        if self.complement {
            !self.values.contains(value) && self.within_bounds(value)
        } else {
            self.values.contains(value)
        }
    }

    /// The number of allowed values, `None` when unbounded (a complement set).
    pub fn len(&self) -> Option<usize> {
        (!self.complement).then_some(self.values.len())
    }

    /// One value a node's label could carry to satisfy this requirement, as Karpenter's
    /// `Requirement.Any` picks it: the smallest allowed value of an `In` set; for `Exists`, `NotIn`
    /// and integer bounds, the smallest non-negative integer allowed (Karpenter draws a random
    /// one; the smallest keeps simulations reproducible). `None` when no value is allowed.
    pub fn any_value(&self) -> Option<String> {
        if !self.complement {
            return self.values.iter().next().cloned();
        }
        let start = self.greater_than.map_or(0, |gt| gt.saturating_add(1).max(0));
        (start..=i64::MAX)
            .take(self.values.len() + 1)
            .map(|n| n.to_string())
            .find(|v| self.has(v))
    }

    /// The exclusive integer bounds `(greater_than, less_than)`.
    pub fn bounds(&self) -> (Option<i64>, Option<i64>) {
        (self.greater_than, self.less_than)
    }

    fn has_bounds(&self) -> bool {
        self.greater_than.is_some() || self.less_than.is_some()
    }

    fn within_bounds(&self, value: &str) -> bool {
        !self.has_bounds() || in_bounds(self.greater_than, self.less_than, value)
    }

    /// Puts the set in canonical form (see the module docs): exclusions outside the bounds are
    /// dropped, bounds are tightened past excluded endpoints, and a closed range with at most
    /// [`SMALL_RANGE`] members becomes the explicit set it denotes (so an empty range reads empty).
    fn normalized(mut self) -> Self {
        if !(self.complement && self.has_bounds()) {
            return self;
        }
        let (gt, lt) = (self.greater_than, self.less_than);
        self.values.retain(|v| in_bounds(gt, lt, v));
        if let Some(mut gt) = self.greater_than {
            while !self.values.is_empty()
                && let Some(next) = gt.checked_add(1)
                && self.values.remove(&next.to_string())
            {
                gt = next;
            }
            self.greater_than = Some(gt);
        }
        if let Some(mut lt) = self.less_than {
            while !self.values.is_empty()
                && let Some(next) = lt.checked_sub(1)
                && self.values.remove(&next.to_string())
            {
                lt = next;
            }
            self.less_than = Some(lt);
        }
        if let (Some(gt), Some(lt)) = (self.greater_than, self.less_than) {
            let members = i128::from(lt) - i128::from(gt) - 1 - self.values.len() as i128;
            if members <= SMALL_RANGE {
                let allowed: Values = (gt.saturating_add(1)..lt.max(gt.saturating_add(1)))
                    .map(|n| n.to_string())
                    .filter(|v| !self.values.contains(v))
                    .collect();
                self.complement = false;
                self.values = allowed;
                (self.greater_than, self.less_than) = (None, None);
            }
        }
        self
    }

    /// True when some value satisfies both `self` and `other`; allocates only when both sides are
    /// bounded complements (the rare case that needs the canonical intersection).
    pub fn overlaps(&self, other: &Requirement) -> bool {
        match (self.complement, other.complement) {
            (false, _) => self.values.iter().any(|v| other.has(v)),
            (true, false) => other.values.iter().any(|v| self.has(v)),
            (true, true) if !self.has_bounds() && !other.has_bounds() => true,
            (true, true) => !self.intersection(other).is_empty(),
        }
    }

    /// The values allowed by both `self` and `other`; `min_values` is the larger of the two.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let min_values = self.min_values.max(other.min_values);
        let mut out = match (self.complement, other.complement) {
            (true, true) => Requirement {
                key: self.key.clone(),
                complement: true,
                values: self.values.union(&other.values),
                greater_than: max_opt(self.greater_than, other.greater_than),
                less_than: min_opt(self.less_than, other.less_than),
                min_values,
            },
            (_, false) => other.filtered_by(self),
            (false, true) => self.filtered_by(other),
        };
        out.min_values = min_values;
        out.normalized()
    }

    /// `self` (an explicit set) keeping only values `filter` allows.
    fn filtered_by(&self, filter: &Requirement) -> Requirement {
        Requirement {
            key: self.key.clone(),
            complement: false,
            values: self.values.iter().filter(|v| filter.has(v)).cloned().collect(),
            greater_than: None,
            less_than: None,
            min_values: self.min_values,
        }
    }
}

fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.max(b)
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.operator())?;
        if !self.values.is_empty() {
            let values: Vec<&str> = self.values().collect();
            write!(f, " [{}]", values.join(", "))?;
        }
        if let Some(gt) = self.greater_than {
            write!(f, " >{gt}")?;
        }
        if let Some(lt) = self.less_than {
            write!(f, " <{lt}")?;
        }
        Ok(())
    }
}

/// Two requirement sets that no single node could satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatibility {
    /// Both sides constrain `key` and no value satisfies both.
    #[error("{ours} does not intersect {theirs}")]
    NoCommonValue {
        /// Our requirement on the key.
        ours: String,
        /// Their requirement on the key.
        theirs: String,
    },
    /// They require a label we do not define.
    #[error("label {key:?} is required ({theirs}) but not defined")]
    Undefined {
        /// The label key.
        key: String,
        /// Their requirement on the key.
        theirs: String,
    },
}

/// Requirements per label key (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirements {
    by_key: BTreeMap<String, Requirement>,
}

impl Requirements {
    /// No requirements: every node qualifies.
    pub const fn new() -> Self {
        Requirements {
            by_key: BTreeMap::new(),
        }
    }

    /// Narrows the requirement on `req.key()` by `req` (adds it when the key is new).
    pub fn add(&mut self, req: Requirement) {
        match self.by_key.get_mut(req.key()) {
            Some(existing) if *existing == req => {}
            Some(existing) => *existing = existing.intersection(&req),
            None => {
                self.by_key.insert(req.key.clone(), req);
            }
        }
    }

    /// Puts `req` in place of whatever the requirements held on its key.
    pub fn set(&mut self, req: Requirement) {
        self.by_key.insert(req.key.clone(), req);
    }

    /// Narrows by every requirement of `other`, cloning only keys that are new here.
    pub fn add_all(&mut self, other: &Requirements) {
        for req in other.by_key.values() {
            match self.by_key.get_mut(req.key()) {
                Some(existing) if existing == req => {}
                Some(existing) => *existing = existing.intersection(req),
                None => {
                    self.by_key.insert(req.key.clone(), req.clone());
                }
            }
        }
    }

    /// The requirement on `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.by_key.get(normalize_label_key(key))
    }

    /// The requirements, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.by_key.values()
    }

    /// The labels these requirements imply (see [`Requirement::implied_label`]), by key.
    pub fn implied_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().filter_map(Requirement::implied_label)
    }

    /// True when there are no requirements.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Checks that some node could satisfy both `self` and `other`. Keys only one side constrains
    /// are fine; a shared key needs a common value unless both sides allow the label to be absent.
    pub fn intersects(&self, other: &Requirements) -> Result<(), Incompatibility> {
        match self.first_conflict(other) {
            Some((ours, theirs)) => Err(Incompatibility::NoCommonValue {
                ours: ours.to_string(),
                theirs: theirs.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// [`intersects`](Self::intersects) as a yes or no, without describing the conflict (for hot
    /// loops that only need the answer).
    pub fn overlaps(&self, other: &Requirements) -> bool {
        self.first_conflict(other).is_none()
    }

    fn first_conflict<'a>(&'a self, other: &'a Requirements) -> Option<(&'a Requirement, &'a Requirement)> {
        self.by_key.iter().find_map(|(key, ours)| {
            let theirs = other.by_key.get(key)?;
            let conflict = !(ours.overlaps(theirs) || ours.allows_absent() && theirs.allows_absent());
            conflict.then_some((ours, theirs))
        })
    }

    /// Like [`intersects`](Self::intersects), and also requires that every label `other` needs to
    /// exist is constrained by `self`, unless `allow_undefined(key)` (for well-known labels a cloud
    /// provider fills in at launch).
    pub fn compatible(
        &self,
        other: &Requirements,
        allow_undefined: impl Fn(&str) -> bool,
    ) -> Result<(), Incompatibility> {
        for (key, theirs) in &other.by_key {
            if !self.by_key.contains_key(key) && !theirs.allows_absent() && !allow_undefined(key) {
                return Err(Incompatibility::Undefined {
                    key: key.clone(),
                    theirs: theirs.to_string(),
                });
            }
        }
        self.intersects(other)
    }

    /// The labels a NodeClaim carries so that its node meets these requirements, as Karpenter's
    /// launch writes them (`Requirements.Labels`): one value (see [`Requirement::any_value`]) for
    /// every key `is_injectable` accepts. Well-known and restricted keys are left to the cloud
    /// provider, which labels them from the instance it launched.
    pub fn labels_to_inject(&self, is_injectable: impl Fn(&str) -> bool) -> BTreeMap<String, String> {
        self.by_key
            .iter()
            .filter(|(key, _)| is_injectable(key))
            .filter_map(|(key, req)| Some((key.clone(), req.any_value()?)))
            .collect()
    }

    /// True when a node with `labels` satisfies every requirement.
    pub fn matches_labels<'a>(&self, labels: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.by_key.values().all(|req| match labels(&req.key) {
            Some(value) => req.has(value),
            None => req.allows_absent(),
        })
    }
}

impl FromIterator<Requirement> for Requirements {
    fn from_iter<I: IntoIterator<Item = Requirement>>(iter: I) -> Self {
        let mut out = Requirements::new();
        for req in iter {
            out.add(req);
        }
        out
    }
}

/// One requirement as the API writes it: a node selector requirement with `minValues`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequirementEntry {
    /// The label key.
    pub key: String,
    /// How the key relates to the values.
    pub operator: Operator,
    /// The values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// The minimum number of distinct values a launch must keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_values: Option<u32>,
}

impl Requirements {
    /// The requirements as the API writes them; a numeric bound becomes a `Gt` or `Lt` entry of
    /// its own.
    pub fn entries(&self) -> Vec<RequirementEntry> {
        let mut entries = Vec::new();
        for r in self.iter() {
            let (gt, lt) = r.bounds();
            let entry = |operator, values| RequirementEntry {
                key: r.key.clone(),
                operator,
                values,
                min_values: r.min_values,
            };
            if r.operator() != Operator::Exists || (gt, lt) == (None, None) {
                entries.push(entry(r.operator(), r.values.iter().cloned().collect()));
            }
            for (operator, bound) in [(Operator::Gt, gt), (Operator::Lt, lt)] {
                if let Some(bound) = bound {
                    entries.push(entry(operator, vec![bound.to_string()]));
                }
            }
        }
        entries
    }
}

impl Serialize for Requirements {
    /// As node selector requirements ([`Requirements::entries`]).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.entries())
    }
}

impl<'de> Deserialize<'de> for Requirements {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<RequirementEntry>::deserialize(d)?
            .into_iter()
            .map(|w| {
                Requirement::new(&w.key, w.operator, w.values)
                    .map(|r| r.with_min_values(w.min_values))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

impl fmt::Display for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(", "))
    }
}

/// True when `value` is an integer strictly between the bounds that are set.
fn in_bounds(gt: Option<i64>, lt: Option<i64>, value: &str) -> bool {
    value
        .parse::<i64>()
        .is_ok_and(|n| gt.is_none_or(|gt| n > gt) && lt.is_none_or(|lt| n < lt))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values.iter().copied()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn entries_write_a_numeric_bound_as_an_entry_of_its_own_and_read_back_the_same() {
        let mut requirements = Requirements::default();
        requirements.add(req("cpu", Operator::Gt, &["4"]));
        requirements.add(req("zone", Operator::In, &["a", "b"]).with_min_values(Some(2)));
        let entries = requirements.entries();
        let operators: Vec<(&str, Operator)> = entries.iter().map(|e| (e.key.as_str(), e.operator)).collect();
        assert_eq!(
            operators,
            [("cpu", Operator::Gt), ("zone", Operator::In)],
            "{entries:?}"
        );
        assert_eq!(entries[1].min_values, Some(2));
        let written = serde_json::to_value(&requirements).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            written,
            serde_json::to_value(&entries).unwrap_or_else(|e| panic!("{e}"))
        );
        let read: Requirements = serde_json::from_value(written).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read, requirements);
    }

    #[test]
    fn any_value_satisfies_the_requirement() {
        assert_eq!(
            req("team", Operator::In, &["b", "a"]).any_value().as_deref(),
            Some("a")
        );
        assert_eq!(
            req("tier", Operator::Exists, &[]).any_value().as_deref(),
            Some("0")
        );
        assert_eq!(
            req("tier", Operator::NotIn, &["0", "1"]).any_value().as_deref(),
            Some("2")
        );
        assert_eq!(req("gen", Operator::Gt, &["4"]).any_value().as_deref(), Some("5"));
        let bounded = req("gen", Operator::Gt, &["4"]).intersection(&req("gen", Operator::Lt, &["1000"]));
        assert_eq!(bounded.any_value().as_deref(), Some("5"));
        assert_eq!(req("gone", Operator::DoesNotExist, &[]).any_value(), None);
        for r in [
            req("a", Operator::In, &["x"]),
            req("a", Operator::NotIn, &["0", "2"]),
            req("a", Operator::Lt, &["3"]),
        ] {
            let value = r.any_value().unwrap_or_else(|| panic!("{r} has no value"));
            assert!(r.has(&value), "{r} does not allow {value}");
        }
    }

    #[test]
    fn injected_labels_cover_every_injectable_key() {
        let reqs: Requirements = [
            req("company.com/team", Operator::In, &["a"]),
            req("company.com/tier", Operator::Exists, &[]),
            req("kubernetes.io/arch", Operator::In, &["amd64"]),
            req("company.com/none", Operator::DoesNotExist, &[]),
        ]
        .into_iter()
        .collect();
        let labels = reqs.labels_to_inject(|key| key.starts_with("company.com/"));
        assert_eq!(
            labels,
            BTreeMap::from([
                ("company.com/team".to_owned(), "a".to_owned()),
                ("company.com/tier".to_owned(), "0".to_owned()),
            ])
        );
        assert!(reqs.matches_labels(|key| {
            labels
                .get(key)
                .map(String::as_str)
                .or((key == "kubernetes.io/arch").then_some("amd64"))
        }));
    }

    #[test]
    fn operators_build_the_expected_sets() {
        let r#in = req("zone", Operator::In, &["a", "b"]);
        assert!(r#in.has("a") && !r#in.has("c"));
        assert_eq!(r#in.operator(), Operator::In);
        let not_in = req("zone", Operator::NotIn, &["a"]);
        assert!(!not_in.has("a") && not_in.has("c") && not_in.allows_absent());
        let exists = req("zone", Operator::Exists, &[]);
        assert!(exists.has("anything") && !exists.allows_absent());
        let dne = req("zone", Operator::DoesNotExist, &[]);
        assert!(dne.is_empty() && dne.allows_absent());
    }

    #[test]
    fn numeric_bounds_are_exclusive_and_inclusive_variants_shift_by_one() {
        let gt = req("cpu", Operator::Gt, &["4"]);
        assert!(!gt.has("4") && gt.has("5") && !gt.has("x"));
        let gte = req("cpu", Operator::Gte, &["4"]);
        assert!(gte.has("4") && !gte.has("3"));
        let lte = req("cpu", Operator::Lte, &["4"]);
        assert!(lte.has("4") && !lte.has("5"));
        let between = gt.intersection(&req("cpu", Operator::Lt, &["6"]));
        assert!(between.has("5") && !between.has("6") && !between.has("4"));
        let none = gt.intersection(&req("cpu", Operator::Lt, &["5"]));
        assert!(none.is_empty(), "4 < x < 5 has no integer");
    }

    #[test]
    fn bounded_sets_need_the_label_and_fully_excluded_ranges_are_empty() {
        let gt_not_in = req("k", Operator::Gt, &["4"]).intersection(&req("k", Operator::NotIn, &["5"]));
        assert!(!gt_not_in.allows_absent(), "Gt 4 requires the label to exist");
        let pinned = req("k", Operator::Gte, &["5"]).intersection(&req("k", Operator::Lte, &["5"]));
        assert!(pinned.has("5") && pinned.len() == Some(1));
        assert!(pinned.intersection(&req("k", Operator::NotIn, &["5"])).is_empty());
        let a = req("k", Operator::Gt, &["4"]).intersection(&req("k", Operator::Lt, &["100"]));
        let b = req("k", Operator::Gt, &["3"]).intersection(&req("k", Operator::Lt, &["100"]));
        assert_eq!(
            a,
            b.intersection(&req("k", Operator::NotIn, &["4"])),
            "one set, one form"
        );
        let wide = req("k", Operator::Gt, &["0"]).intersection(&req("k", Operator::Lt, &["1000"]));
        assert!(
            wide.has("999") && wide.len().is_none(),
            "wide ranges stay as bounds"
        );
    }

    #[test]
    fn constructor_rejects_bad_operands() {
        assert!(matches!(
            Requirement::new("k", Operator::In, Vec::<String>::new()),
            Err(RequirementError::InWithoutValues { .. })
        ));
        assert!(matches!(
            Requirement::new("k", Operator::Gt, ["2", "3"]),
            Err(RequirementError::NotOneInteger { .. })
        ));
        assert!(matches!(
            Requirement::new("k", Operator::Lt, ["x"]),
            Err(RequirementError::NotOneInteger { .. })
        ));
    }

    #[test]
    fn legacy_keys_are_normalized() {
        let r = req("beta.kubernetes.io/arch", Operator::In, &["amd64"]);
        assert_eq!(r.key(), "kubernetes.io/arch");
    }

    #[test]
    fn only_a_single_valued_in_implies_a_label() {
        let requirements: Requirements = [
            Requirement::new("zone", Operator::In, ["a"]),
            Requirement::new("arch", Operator::In, ["amd64", "arm64"]),
            Requirement::new("team", Operator::NotIn, ["b"]),
            Requirement::new("cpu", Operator::Gt, ["4"]),
        ]
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
        assert_eq!(requirements.implied_labels().collect::<Vec<_>>(), [("zone", "a")]);
    }

    #[test]
    fn requirements_intersect_and_match_labels() {
        let pool: Requirements = [
            req("kubernetes.io/arch", Operator::In, &["amd64"]),
            req("karpenter.sh/capacity-type", Operator::In, &["spot", "on-demand"]),
        ]
        .into_iter()
        .collect();
        let pod: Requirements = [req("karpenter.sh/capacity-type", Operator::In, &["spot"])]
            .into_iter()
            .collect();
        assert!(pool.intersects(&pod).is_ok());
        let arm: Requirements = [req("kubernetes.io/arch", Operator::In, &["arm64"])]
            .into_iter()
            .collect();
        assert!(matches!(
            pool.intersects(&arm),
            Err(Incompatibility::NoCommonValue { .. })
        ));

        let team: Requirements = [req("team", Operator::In, &["a"])].into_iter().collect();
        assert!(matches!(
            pool.compatible(&team, |_| false),
            Err(Incompatibility::Undefined { .. })
        ));
        assert!(pool.compatible(&team, |k| k == "team").is_ok());

        let labels = |k: &str| match k {
            "kubernetes.io/arch" => Some("amd64"),
            "karpenter.sh/capacity-type" => Some("spot"),
            _ => None,
        };
        assert!(pool.matches_labels(labels));
        assert!(!arm.matches_labels(labels));
        let absent: Requirements = [req("gpu", Operator::DoesNotExist, &[])].into_iter().collect();
        assert!(absent.matches_labels(labels));
    }

    #[test]
    fn both_sides_allowing_absence_intersect_even_without_common_values() {
        let a: Requirements = [req("k", Operator::DoesNotExist, &[])].into_iter().collect();
        let b: Requirements = [req("k", Operator::NotIn, &["x"])].into_iter().collect();
        assert!(a.intersects(&b).is_ok());
        let c: Requirements = [req("k", Operator::In, &["x"])].into_iter().collect();
        assert!(a.intersects(&c).is_err());
    }
}

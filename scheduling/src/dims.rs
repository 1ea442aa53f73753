//! Resource amounts as fixed-width integer vectors, for the solver's inner loops.
//!
//! The resource names that any pod, daemonset or NodePool limit mentions are numbered once per
//! solve; every amount is then a slice of milli-units in that order, compared and added without
//! looking names up. Names outside the set (a capacity nobody asks for) are dropped.

use std::sync::Arc;

use joist_messages::model::{quantity::Quantity, resources::Resources};

/// The numbered resource names of one solve.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dims {
    names: Vec<String>,
}

impl Dims {
    /// Adds the names of `resources` not yet numbered.
    pub(crate) fn include(&mut self, resources: &Resources) {
        for (name, _) in resources.iter() {
            self.include_name(name);
        }
    }

    /// Adds the names of each of `requests` not yet numbered. Pods of one workload share their
    /// requests: a run of them holding one copy is read once.
    pub(crate) fn include_each<'a>(&mut self, requests: impl Iterator<Item = &'a Arc<Resources>>) {
        let mut last: Option<&Arc<Resources>> = None;
        for requests in requests {
            if !last.is_some_and(|last| Arc::ptr_eq(last, requests)) {
                self.include(requests);
                last = Some(requests);
            }
        }
    }

    /// Numbers `name` if it is not yet.
    pub(crate) fn include_name(&mut self, name: &str) {
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_string());
        }
    }

    /// The number of names.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The position of `name`, if numbered.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The name at `position`.
    pub(crate) fn name(&self, position: usize) -> &str {
        &self.names[position]
    }

    /// `resources` as a vector (appended to `out`). Each of the pod's few names is found among
    /// the numbered ones, mostly told apart by length, rather than each numbered name searched
    /// for among the pod's: 100,000 pods a pass make this a hot loop.
    pub(crate) fn extend_vector(&self, resources: &Resources, out: &mut Vec<i64>) {
        let start = out.len();
        out.resize(start + self.names.len(), 0);
        for (name, amount) in resources.iter() {
            if let Some(i) = self.position(name) {
                out[start + i] = amount.millis();
            }
        }
    }

    /// `resources` as a new vector.
    pub(crate) fn vector(&self, resources: &Resources) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_vector(resources, &mut out);
        out
    }

    /// A vector back as named resources.
    pub(crate) fn resources(&self, vector: &[i64]) -> Resources {
        self.names
            .iter()
            .zip(vector)
            .fold(Resources::new(), |r, (n, m)| r.with(n, Quantity::from_millis(*m)))
    }
}

/// The vector of the requests last asked for, kept while the next pods hold the same shared copy
/// (pods of one workload share theirs): a run of 100,000 such pods is read once, not pod by pod.
#[derive(Debug, Default)]
pub(crate) struct LastVector<'a> {
    of: Option<&'a Arc<Resources>>,
    vector: Vec<i64>,
}

impl<'a> LastVector<'a> {
    /// `requests` as a vector over `dims`.
    pub(crate) fn of(&mut self, dims: &Dims, requests: &'a Arc<Resources>) -> &[i64] {
        if !self.of.is_some_and(|last| Arc::ptr_eq(last, requests)) {
            self.vector.clear();
            dims.extend_vector(requests, &mut self.vector);
            self.of = Some(requests);
        }
        &self.vector
    }
}

/// True when `used + extra <= limit` in every dimension.
#[inline]
pub(crate) fn fits(used: &[i64], extra: &[i64], limit: &[i64]) -> bool {
    used.iter()
        .zip(extra)
        .zip(limit)
        .all(|((u, e), l)| u.saturating_add(*e) <= *l)
}

/// `into = max(into, other)`, element-wise.
pub(crate) fn max_assign(into: &mut [i64], other: &[i64]) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = (*a).max(*b);
    }
}

/// `into += other`, element-wise.
pub(crate) fn add(into: &mut [i64], other: &[i64]) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = a.saturating_add(*b);
    }
}

/// `into -= other`, element-wise.
pub(crate) fn sub(into: &mut [i64], other: &[i64]) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = a.saturating_sub(*b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_vector_is_kept_for_the_same_copy_only() {
        let mut dims = Dims::default();
        dims.include_name("cpu");
        dims.include_name("memory");
        let cpu = |m: i64| Arc::new(Resources::new().with("cpu", Quantity::from_millis(m)));
        let (one, equal_copy, two) = (cpu(1000), cpu(1000), cpu(2000));
        let mut last = LastVector::default();
        assert_eq!(last.of(&dims, &one), [1000, 0]);
        assert_eq!(last.of(&dims, &one), [1000, 0]);
        assert_eq!(
            last.of(&dims, &two),
            [2000, 0],
            "another copy is read, not the last vector"
        );
        assert_eq!(last.of(&dims, &equal_copy), [1000, 0]);
    }
}

//! Which of a NodePool's instance types offer at least, or at most, an amount: an index, not a
//! scan.
//!
//! The solver asks, for every claim a pod tries, which of the claim's candidate types could hold
//! its pods plus the new one, and which stay within the NodePool's limits. Checking each candidate
//! costs the catalog's width per try; with tens of thousands of open claims that scan was the whole
//! solve. So each dimension keeps its distinct amounts sorted, and for each amount the set of types
//! that offer at least that much: either question is then one binary search and one word-wise AND
//! per dimension.
//!
//! Failure modes: none; a bound no type meets leaves no type.

use crate::bitset;

/// Per dimension, the types offering at least each amount (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct AmountIndex {
    dims: Vec<Thresholds>,
}

/// One dimension's distinct amounts, ascending, and per amount the types with at least it.
#[derive(Debug, Clone, Default)]
struct Thresholds {
    amounts: Vec<i64>,
    /// `amounts.len()` sets of `words` words each.
    at_least: Vec<u64>,
    words: usize,
}

impl AmountIndex {
    /// Indexes `types` types whose vectors (`d` amounts each) lie in `amounts_of`.
    pub(crate) fn new(amounts_of: &[i64], types: usize, d: usize) -> Self {
        let words = bitset::words(types);
        let dims = (0..d)
            .map(|i| {
                let amount = |t: usize| amounts_of[t * d + i];
                let mut amounts: Vec<i64> = (0..types).map(amount).collect();
                amounts.sort_unstable();
                amounts.dedup();
                let mut largest_first: Vec<usize> = (0..types).collect();
                largest_first.sort_unstable_by_key(|&t| std::cmp::Reverse(amount(t)));
                let mut at_least = vec![0u64; amounts.len() * words];
                let mut offering = vec![0u64; words];
                let mut next = largest_first.iter().peekable();
                for (k, &threshold) in amounts.iter().enumerate().rev() {
                    while let Some(&&t) = next.peek()
                        && amount(t) >= threshold
                    {
                        offering[t / 64] |= 1 << (t % 64);
                        next.next();
                    }
                    at_least[k * words..(k + 1) * words].copy_from_slice(&offering);
                }
                Thresholds {
                    amounts,
                    at_least,
                    words,
                }
            })
            .collect();
        AmountIndex { dims }
    }

    /// Removes from `set` the types offering less than `base + extra` in some dimension (`base`
    /// empty for zero).
    pub(crate) fn keep_at_least(&self, base: &[i64], extra: &[i64], set: &mut [u64]) {
        for (i, th) in self.dims.iter().enumerate() {
            let bound = bound(base, extra, i);
            if th.amounts.first().is_none_or(|&least| bound <= least) {
                continue;
            }
            match th.amounts.partition_point(|&a| a < bound) {
                0 => {}
                k if k == th.amounts.len() => return set.iter_mut().for_each(|w| *w = 0),
                k => set.iter_mut().zip(th.offering(k)).for_each(|(w, o)| *w &= o),
            }
        }
    }

    /// Removes from `set` the types offering more than `base + extra` in some dimension (`base`
    /// empty for zero).
    pub(crate) fn keep_at_most(&self, base: &[i64], extra: &[i64], set: &mut [u64]) {
        for (i, th) in self.dims.iter().enumerate() {
            let bound = bound(base, extra, i);
            if th.amounts.last().is_none_or(|&most| most <= bound) {
                continue;
            }
            let k = th.amounts.partition_point(|&a| a <= bound);
            set.iter_mut().zip(th.offering(k)).for_each(|(w, o)| *w &= !o);
        }
    }
}

/// `base + extra` in dimension `i`, `base` empty for zero.
fn bound(base: &[i64], extra: &[i64], i: usize) -> i64 {
    base.get(i).copied().unwrap_or(0).saturating_add(extra[i])
}

impl Thresholds {
    /// The types offering at least `amounts[k]`.
    fn offering(&self, k: usize) -> &[u64] {
        &self.at_least[k * self.words..(k + 1) * self.words]
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn keeps_exactly_the_types_a_scan_keeps(
            d in 1usize..4,
            vectors in prop::collection::vec(0i64..40, 0..400),
            base in prop::collection::vec(0i64..30, 3),
            extra in prop::collection::vec(0i64..30, 3),
            empty_base in any::<bool>(),
        ) {
            let types = vectors.len() / d;
            let amounts = &vectors[..types * d];
            let base: &[i64] = if empty_base { &[] } else { &base[..d] };
            let bound: Vec<i64> = (0..d).map(|i| bound(base, &extra[..d], i)).collect();
            let index = AmountIndex::new(amounts, types, d);
            let of = |t: usize| &amounts[t * d..(t + 1) * d];

            let mut at_least = bitset::full(types);
            index.keep_at_least(base, &extra[..d], &mut at_least);
            let scanned: Vec<usize> =
                (0..types).filter(|&t| of(t).iter().zip(&bound).all(|(a, b)| a >= b)).collect();
            prop_assert_eq!(bitset::members(&at_least).collect::<Vec<_>>(), scanned);

            let mut at_most = bitset::full(types);
            index.keep_at_most(base, &extra[..d], &mut at_most);
            let scanned: Vec<usize> =
                (0..types).filter(|&t| of(t).iter().zip(&bound).all(|(a, b)| a <= b)).collect();
            prop_assert_eq!(bitset::members(&at_most).collect::<Vec<_>>(), scanned);
        }
    }

    #[test]
    fn a_bound_no_type_meets_leaves_none() {
        let index = AmountIndex::new(&[4, 8, 16], 3, 1);
        let mut set = bitset::full(3);
        index.keep_at_least(&[10], &[7], &mut set);
        assert!(bitset::is_empty(&set));
        let mut set = bitset::full(3);
        index.keep_at_most(&[], &[3], &mut set);
        assert!(bitset::is_empty(&set));
    }
}

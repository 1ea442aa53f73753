//! Fixed-width bit sets over instance-type positions: a NodeClaim's remaining candidates.
//!
//! A set is a `[u64]` slice whose width is fixed by its NodePool's catalog, so narrowing a claim is
//! a word-wise AND and copying one is a short memcpy, with no per-candidate allocation.

/// Words needed for `bits` members.
pub(crate) const fn words(bits: usize) -> usize {
    bits.div_ceil(64)
}

/// A set with members `0..bits`.
pub(crate) fn full(bits: usize) -> Vec<u64> {
    let mut set = vec![u64::MAX; words(bits)];
    if let Some(last) = set.last_mut()
        && !bits.is_multiple_of(64)
    {
        *last = (1u64 << (bits % 64)) - 1;
    }
    set
}

/// The members of `set`, ascending.
pub(crate) fn members(set: &[u64]) -> impl Iterator<Item = usize> + '_ {
    set.iter().enumerate().flat_map(|(w, &word)| {
        let mut rest = word;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                w * 64 + bit
            })
        })
    })
}

/// Adds `member`, growing `set` as needed.
pub(crate) fn insert(set: &mut Vec<u64>, member: usize) {
    if set.len() <= member / 64 {
        set.resize(member / 64 + 1, 0);
    }
    set[member / 64] |= 1 << (member % 64);
}

/// Whether `member` is in `set`.
pub(crate) fn contains(set: &[u64], member: usize) -> bool {
    set.get(member / 64)
        .is_some_and(|w| w & (1 << (member % 64)) != 0)
}

/// Removes `member`.
pub(crate) fn remove(set: &mut [u64], member: usize) {
    set[member / 64] &= !(1u64 << (member % 64));
}

/// Keeps only the members below `bits`.
pub(crate) fn truncate(set: &mut Vec<u64>, bits: usize) {
    set.truncate(bits.div_ceil(64));
    if let Some(last) = set.last_mut()
        && !bits.is_multiple_of(64)
    {
        *last &= (1u64 << (bits % 64)) - 1;
    }
}

/// True when `a` and `b` share a member.
pub(crate) fn intersects(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).any(|(x, y)| x & y != 0)
}

/// True when `set` has no members.
pub(crate) fn is_empty(set: &[u64]) -> bool {
    set.iter().all(|w| *w == 0)
}

/// The number of members.
#[cfg(test)]
pub(crate) fn len(set: &[u64]) -> usize {
    set.iter().map(|w| w.count_ones() as usize).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_sets_have_exactly_their_width() {
        for bits in [0, 1, 63, 64, 65, 400] {
            let set = full(bits);
            assert_eq!(len(&set), bits);
            assert_eq!(members(&set).collect::<Vec<_>>(), (0..bits).collect::<Vec<_>>());
        }
        let mut set = full(130);
        remove(&mut set, 64);
        remove(&mut set, 0);
        assert_eq!(len(&set), 128);
        assert_eq!(members(&set).next(), Some(1));
        assert!(!is_empty(&set) && is_empty(&full(0)));
        truncate(&mut set, 70);
        assert_eq!(
            members(&set).collect::<Vec<_>>(),
            (1..64).chain(65..70).collect::<Vec<_>>()
        );
        truncate(&mut set, 64);
        assert_eq!(len(&set), 63);
    }
}

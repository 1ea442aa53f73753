//! Where the bins have room: a tree over the bins (the existing nodes, then the NodeClaims a
//! placement opens) in which each tree node holds, per resource dimension, the most any bin under
//! it has free, so first fit finds the next bin with room for a pod in steps logarithmic in the
//! bins instead of trying each full one. A claim's free amounts are its largest candidate's, so a
//! claim the index passes over has no candidate the pod fits.
//!
//! A pod can fit a node only if the node's free amount (allocatable less used) is at least the
//! pod's request in every dimension, so a subtree whose largest free amounts fall short in any
//! dimension holds no node the pod fits and is passed over. The reverse does not hold (the
//! largest amounts may come from different bins), so a subtree that may fit is searched further;
//! at a single bin the test is exact.
//!
//! The solver tells the index of every change to a bin's use ([`Room::update`]), which costs the
//! bin's path to the root, of every claim it opens ([`Room::push`]; the tree doubles when full)
//! and of the claims a simulation drops ([`Room::truncate`]). Cannot fail.

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Room {
    /// Dimensions per bin.
    dims: usize,
    /// Bins indexed.
    count: usize,
    /// Leaves of the tree: a power of two, at least `count` (the tree keeps its size when a
    /// simulation's claims are dropped).
    leaves: usize,
    /// The tree, heap-ordered from 1 (children of `i` at `2i` and `2i + 1`, bin `b` at
    /// `leaves + b`), `dims` largest free amounts per tree node; padding leaves have none.
    tree: Vec<i64>,
}

impl Room {
    /// The index over node bins with these (allocatable, used) amounts, in bin order.
    pub(super) fn new<'b>(dims: usize, nodes: impl ExactSizeIterator<Item = (&'b [i64], &'b [i64])>) -> Self {
        let count = nodes.len();
        let leaves = count.next_power_of_two();
        let mut room = Room {
            dims,
            count,
            leaves,
            tree: vec![i64::MIN; 2 * leaves * dims],
        };
        for (b, (alloc, used)) in nodes.enumerate() {
            room.set_leaf(b, alloc, used);
        }
        for i in (1..leaves).rev() {
            room.summarize(i);
        }
        room
    }

    /// Bin `b` now has `alloc` and `used`.
    pub(super) fn update(&mut self, b: usize, alloc: &[i64], used: &[i64]) {
        if b >= self.count {
            return;
        }
        self.set_leaf(b, alloc, used);
        let mut i = (self.leaves + b) / 2;
        while i >= 1 {
            self.summarize(i);
            i /= 2;
        }
    }

    /// Bin `b` takes no pod (left out of a placement) until it is updated again.
    pub(super) fn remove(&mut self, b: usize) {
        self.update(b, &[], &[]);
    }

    /// Adds a bin after the others, with `alloc` and `used`.
    pub(super) fn push(&mut self, alloc: &[i64], used: &[i64]) {
        if self.count == self.leaves {
            self.grow();
        }
        self.count += 1;
        self.update(self.count - 1, alloc, used);
    }

    /// Keeps the first `count` bins.
    pub(super) fn truncate(&mut self, count: usize) {
        for b in count..self.count {
            self.remove(b);
        }
        self.count = self.count.min(count);
    }

    /// Twice the leaves, the bins kept.
    fn grow(&mut self) {
        let d = self.dims;
        let leaves = (2 * self.leaves).max(1);
        let mut tree = vec![i64::MIN; 2 * leaves * d];
        let bins = self.leaves * d..(self.leaves + self.count) * d;
        tree[leaves * d..(leaves + self.count) * d].copy_from_slice(&self.tree[bins]);
        self.tree = tree;
        self.leaves = leaves;
        for i in (1..leaves).rev() {
            self.summarize(i);
        }
    }

    /// The first bin from `from` on with room for `request`.
    pub(super) fn next_fit(&self, from: usize, request: &[i64]) -> Option<usize> {
        (from < self.count)
            .then(|| self.first_in(1, 0, self.leaves, from, request))
            .flatten()
    }

    /// The first bin from `from` on with room, under tree node `i`, which spans bins `lo..hi`.
    fn first_in(&self, i: usize, lo: usize, hi: usize, from: usize, request: &[i64]) -> Option<usize> {
        if hi <= from || lo >= self.count || !self.has_room(i, request) {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let middle = lo + (hi - lo) / 2;
        self.first_in(2 * i, lo, middle, from, request)
            .or_else(|| self.first_in(2 * i + 1, middle, hi, from, request))
    }

    fn has_room(&self, i: usize, request: &[i64]) -> bool {
        let d = self.dims;
        self.tree[i * d..(i + 1) * d]
            .iter()
            .zip(request)
            .all(|(largest, wanted)| largest >= wanted)
    }

    fn set_leaf(&mut self, b: usize, alloc: &[i64], used: &[i64]) {
        let d = self.dims;
        let at = (self.leaves + b) * d;
        for (i, free) in self.tree[at..at + d].iter_mut().enumerate() {
            let used = used.get(i).copied().unwrap_or(0);
            *free = alloc.get(i).map_or(i64::MIN, |a| a.saturating_sub(used));
        }
    }

    /// Tree node `i` holds the element-wise largest of its children.
    fn summarize(&mut self, i: usize) {
        let d = self.dims;
        let (parents, children) = self.tree.split_at_mut(2 * i * d);
        let (left, right) = children[..2 * d].split_at(d);
        for ((largest, l), r) in parents[i * d..(i + 1) * d].iter_mut().zip(left).zip(right) {
            *largest = (*l).max(*r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(free: &[[i64; 2]]) -> Room {
        let used = [0i64; 2];
        Room::new(2, free.iter().map(|a| (&a[..], &used[..])))
    }

    #[test]
    fn full_nodes_are_passed_over_and_a_freed_node_is_found_again() {
        let mut nodes = vec![[0, 0]; 300];
        nodes[205] = [4, 8];
        let mut room = room(&nodes);
        assert_eq!(room.next_fit(0, &[1, 1]), Some(205));
        assert_eq!(room.next_fit(205, &[4, 8]), Some(205));
        assert_eq!(room.next_fit(0, &[5, 1]), None, "no node has 5 free");
        assert_eq!(room.next_fit(206, &[1, 1]), None);
        room.update(65, &[2, 2], &[0, 1]);
        assert_eq!(room.next_fit(0, &[2, 1]), Some(65));
        assert_eq!(
            room.next_fit(0, &[2, 2]),
            Some(205),
            "node 65 has one free only in memory"
        );
        room.update(65, &[2, 2], &[2, 2]);
        assert_eq!(room.next_fit(0, &[2, 1]), Some(205), "node 65 is full again");
    }

    #[test]
    fn a_removed_node_has_no_room_until_updated() {
        let mut room = room(&[[1, 1], [1, 1]]);
        room.remove(0);
        assert_eq!(room.next_fit(0, &[0, 0]), Some(1));
        room.update(0, &[1, 1], &[0, 0]);
        assert_eq!(room.next_fit(0, &[1, 1]), Some(0));
    }

    #[test]
    fn room_in_different_dimensions_on_different_nodes_is_not_room() {
        let room = room(&[[4, 0], [0, 4], [1, 1], [4, 4]]);
        assert_eq!(room.next_fit(0, &[2, 2]), Some(3));
        assert_eq!(room.next_fit(0, &[1, 1]), Some(2));
        assert_eq!(room.next_fit(0, &[0, 0]), Some(0));
    }

    #[test]
    fn an_overcommitted_node_has_no_room_even_for_nothing_in_that_dimension() {
        let used = [3i64, 0];
        let alloc = [2i64, 4];
        let room = Room::new(2, std::iter::once((&alloc[..], &used[..])));
        assert_eq!(room.next_fit(0, &[0, 1]), None);
    }

    #[test]
    fn pushed_bins_are_found_past_the_first_leaves_and_truncated_ones_are_not() {
        let mut room = room(&[[0, 0]; 3]);
        for _ in 0..6 {
            room.push(&[4, 4], &[4, 4]);
        }
        assert_eq!(room.next_fit(0, &[1, 1]), None, "every bin is full");
        room.push(&[4, 4], &[1, 1]);
        assert_eq!(room.next_fit(0, &[3, 3]), Some(9));
        room.update(5, &[8, 8], &[0, 0]);
        assert_eq!(room.next_fit(0, &[3, 3]), Some(5));
        room.truncate(4);
        assert_eq!(room.next_fit(0, &[1, 1]), None, "the bins from 4 on are gone");
        room.push(&[2, 2], &[0, 0]);
        assert_eq!(
            room.next_fit(0, &[1, 1]),
            Some(4),
            "a bin pushed again starts afresh"
        );
        let mut empty = Room::new(1, std::iter::empty());
        empty.push(&[1], &[0]);
        empty.push(&[3], &[0]);
        assert_eq!(empty.next_fit(0, &[2]), Some(1));
    }

    #[test]
    fn without_dimensions_every_node_has_room_and_padding_is_no_node() {
        let room = Room::new(0, std::iter::repeat_n((&[][..], &[][..]), 3));
        assert_eq!(room.next_fit(1, &[]), Some(1));
        assert_eq!(room.next_fit(3, &[]), None);
        assert_eq!(Room::new(0, std::iter::empty()).next_fit(0, &[]), None);
    }
}

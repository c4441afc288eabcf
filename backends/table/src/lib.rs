//! # Portverbs object table
//!
//! The one object table of the device models: objects indexed by the number the device gave
//! them ([`Table`]). The transport engine keeps its QPs in one, the soft device and the
//! emulated ConnectX-3 their CQs, SRQs, EQs and QPs.
//!
//! What this crate must never do: depend on another crate, or panic on a number (an absent or
//! out-of-range number is `None`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// log2 of the numbers one page of a [`Table`] holds.
const PAGE_BITS: u32 = 6;

/// Numbers per page.
const PAGE: usize = 1 << PAGE_BITS;

/// Device objects (QPs, CQs, SRQs, EQs, memory keys …) indexed by the number the device gave
/// them, as a device keeps its contexts in a flat array. Both the soft device and the mlx4
/// model keep their per-object state in tables of this type.
///
/// Lookups are two indexes and their bounds checks. The numbers need not be dense: the table
/// keeps them in pages of 64, made when a number of theirs is first inserted, so a device whose
/// QP numbers start at a random point of a large range (as they do, so that a peer cannot guess
/// them) holds a page or two, not the whole range. Nothing here panics on a number: an absent or
/// out-of-range number is `None`.
///
/// [`Table::free_number`] remembers where its last search ended, so handing out numbers one
/// after another costs O(1) each rather than a scan from the base (60 000 QPs made one by one
/// took 150–260 µs each at the end with the scan). [`Table::next_free_in`] searches a range
/// cyclically from a cursor the caller keeps, as hardware drivers hand out QP numbers.
#[derive(Debug)]
pub struct Table<T> {
    pages: Vec<Option<Box<[Option<T>]>>>,
    /// `from << 32 | hint`: every number in `[from, hint)` is in use (the last
    /// [`Table::free_number`] search from `from` got as far as `hint`).
    scan: AtomicU64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            scan: AtomicU64::new(0),
        }
    }
}

impl<T: Clone> Clone for Table<T> {
    fn clone(&self) -> Self {
        Self {
            pages: self.pages.clone(),
            scan: AtomicU64::new(self.scan.load(Ordering::Relaxed)),
        }
    }
}

/// The page of number `n` and its place in the page.
#[inline]
fn place(n: u32) -> (usize, usize) {
    ((n >> PAGE_BITS) as usize, n as usize & (PAGE - 1))
}

impl<T> Table<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `v` at number `n`, replacing what was there.
    pub fn insert(&mut self, n: u32, v: T) {
        let (p, i) = place(n);
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, || None);
        }
        let page = self.pages[p].get_or_insert_with(|| (0..PAGE).map(|_| None).collect());
        page[i] = Some(v);
    }

    /// The object numbered `n`.
    #[inline]
    pub fn get(&self, n: u32) -> Option<&T> {
        let (p, i) = place(n);
        self.pages.get(p)?.as_deref()?.get(i)?.as_ref()
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        let (p, i) = place(n);
        self.pages.get_mut(p)?.as_deref_mut()?.get_mut(i)?.as_mut()
    }

    /// Whether number `n` is in use.
    pub fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    /// Takes the object numbered `n` out of the table.
    pub fn remove(&mut self, n: u32) -> Option<T> {
        let (p, i) = place(n);
        let taken = self.pages.get_mut(p)?.as_deref_mut()?.get_mut(i)?.take();
        let (from, hint) = unpack(self.scan.load(Ordering::Relaxed));
        if taken.is_some() && (from..hint).contains(&n) {
            // A hole below the remembered end of the search.
            self.scan.store(pack(from, n), Ordering::Relaxed);
        }
        taken
    }

    /// Number of objects in the table (counts them: for bookkeeping, not hot paths).
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// True when the table holds no object.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Forgets every object.
    pub fn clear(&mut self) {
        self.pages.clear();
        self.scan.store(0, Ordering::Relaxed);
    }

    /// Lowest free number at or above `from`.
    pub fn free_number(&self, from: u32) -> u32 {
        let (last_from, hint) = unpack(self.scan.load(Ordering::Relaxed));
        let start = if last_from == from {
            hint.max(from)
        } else {
            from
        };
        let n = (start..).find(|&n| self.get(n).is_none()).unwrap_or(from);
        self.scan.store(pack(from, n), Ordering::Relaxed);
        n
    }

    /// The first free number of `range` at or after `cursor`, going round to the start of the
    /// range after its end; `None` when every number of the range is in use. The caller keeps
    /// the cursor (the number after the last one handed out), so numbers are handed out round
    /// the range and one just freed is not handed out again at once; a search passes over the
    /// numbers in use since the cursor, so it costs O(1) while the range is mostly free.
    pub fn next_free_in(&self, range: Range<u32>, cursor: u32) -> Option<u32> {
        let cursor = if range.contains(&cursor) {
            cursor
        } else {
            range.start
        };
        (cursor..range.end)
            .chain(range.start..cursor)
            .find(|&n| self.get(n).is_none())
    }

    /// The objects with their numbers, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().flat_map(move |page| {
                page.iter()
                    .enumerate()
                    .filter_map(move |(i, v)| v.as_ref().map(|v| (number(p, i), v)))
            })
        })
    }

    /// The objects with their numbers, in increasing order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.pages.iter_mut().enumerate().flat_map(|(p, page)| {
            page.iter_mut().flat_map(move |page| {
                page.iter_mut()
                    .enumerate()
                    .filter_map(move |(i, v)| v.as_mut().map(|v| (number(p, i), v)))
            })
        })
    }

    /// The numbers in use, in increasing order.
    pub fn numbers(&self) -> Vec<u32> {
        self.iter().map(|(n, _)| n).collect()
    }

    /// Pages held (for tests of the memory a sparse table takes).
    pub fn pages_held(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }
}

/// The number of place `i` of page `p`.
fn number(p: usize, i: usize) -> u32 {
    ((p << PAGE_BITS) | i) as u32
}

fn pack(from: u32, hint: u32) -> u64 {
    (u64::from(from) << 32) | u64::from(hint)
}

fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn numbers_index_objects_and_absent_numbers_are_none() {
        let mut t = Table::new();
        assert!(t.is_empty());
        t.insert(5, "five");
        t.insert(2, "two");
        assert_eq!(t.get(5), Some(&"five"));
        assert_eq!(t.get(3), None);
        assert_eq!(t.get(u32::MAX), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.numbers(), vec![2, 5]);
        assert_eq!(t.free_number(2), 3);
        assert_eq!(t.remove(2), Some("two"));
        assert_eq!(t.remove(2), None);
        assert!(!t.contains(2));
        if let Some(v) = t.get_mut(5) {
            *v = "FIVE";
        }
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(5, &"FIVE")]);
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn free_numbers_resume_where_the_last_search_ended_and_see_holes() {
        let mut t = Table::new();
        for _ in 0..100 {
            let n = t.free_number(0x11);
            t.insert(n, ());
        }
        assert_eq!(t.numbers(), (0x11..0x11 + 100).collect::<Vec<_>>());
        assert_eq!(t.free_number(0x11), 0x11 + 100);
        // A hole below where the search got to is found again, and filled first.
        t.remove(0x20);
        assert_eq!(t.free_number(0x11), 0x20);
        t.insert(0x20, ());
        assert_eq!(t.free_number(0x11), 0x11 + 100);
        // Another base searches from its own start.
        assert_eq!(t.free_number(0), 0);
        t.insert(0, ());
        assert_eq!(t.free_number(0), 1);
        assert_eq!(t.free_number(0x11), 0x11 + 100);
        // A number taken by insert behind the search's back is skipped.
        t.insert(0x11 + 100, ());
        assert_eq!(t.free_number(0x11), 0x11 + 101);
        t.clear();
        assert_eq!(t.free_number(0x11), 0x11);
    }

    #[test]
    fn cyclic_search_goes_round_the_range_from_the_cursor() {
        let mut t = Table::new();
        let range = 0x11..0x20;
        assert_eq!(t.next_free_in(range.clone(), 0x1e), Some(0x1e));
        t.insert(0x1e, ());
        t.insert(0x1f, ());
        assert_eq!(
            t.next_free_in(range.clone(), 0x1e),
            Some(0x11),
            "round to the start"
        );
        assert_eq!(
            t.next_free_in(range.clone(), 0x5),
            Some(0x11),
            "cursor outside"
        );
        for n in range.clone() {
            t.insert(n, ());
        }
        assert_eq!(t.next_free_in(range.clone(), 0x15), None, "full");
        t.remove(0x12);
        assert_eq!(t.next_free_in(range, 0x15), Some(0x12));
    }

    #[test]
    fn sparse_numbers_hold_only_their_pages() {
        let mut t = Table::new();
        t.insert(1, 'a');
        t.insert(200_000, 'b');
        t.insert(200_001, 'c');
        assert_eq!(t.pages_held(), 2);
        assert_eq!(t.numbers(), vec![1, 200_000, 200_001]);
        assert_eq!(t.get(200_001), Some(&'c'));
        assert_eq!(t.get(199_999), None);
        assert_eq!(t.get(u32::MAX), None);
        for (_, v) in t.iter_mut() {
            *v = 'z';
        }
        assert_eq!(t.remove(200_000), Some('z'));
        assert_eq!(t.len(), 2);
        assert!(!t.is_empty());
    }
}

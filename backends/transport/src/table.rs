//! The one object table of the device models: objects indexed by their number.

use std::sync::atomic::{AtomicU64, Ordering};

/// Device objects (QPs, CQs, SRQs, EQs, memory keys …) indexed by the number the device gave
/// them, as a device keeps its contexts in a flat array. Both the soft device and the mlx4
/// model keep their per-object state in tables of this type.
///
/// Lookups are an index and a bounds check; numbers are expected to be small and dense (a
/// device hands them out from 0 or from a small reserved base), since the table grows to the
/// highest number inserted. Nothing here panics on a number: an absent or out-of-range number
/// is `None`.
///
/// [`Table::free_number`] remembers where its last search ended, so handing out numbers one
/// after another costs O(1) each rather than a scan from the base (60 000 QPs made one by one
/// took 150–260 µs each at the end with the scan).
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Option<T>>,
    /// `from << 32 | hint`: every number in `[from, hint)` is in use (the last
    /// [`Table::free_number`] search from `from` got as far as `hint`).
    scan: AtomicU64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            scan: AtomicU64::new(0),
        }
    }
}

impl<T: Clone> Clone for Table<T> {
    fn clone(&self) -> Self {
        Self {
            slots: self.slots.clone(),
            scan: AtomicU64::new(self.scan.load(Ordering::Relaxed)),
        }
    }
}

impl<T> Table<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `v` at number `n`, replacing what was there.
    pub fn insert(&mut self, n: u32, v: T) {
        let i = n as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(v);
    }

    /// The object numbered `n`.
    #[inline]
    pub fn get(&self, n: u32) -> Option<&T> {
        self.slots.get(n as usize)?.as_ref()
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.slots.get_mut(n as usize)?.as_mut()
    }

    /// Whether number `n` is in use.
    pub fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    /// Takes the object numbered `n` out of the table.
    pub fn remove(&mut self, n: u32) -> Option<T> {
        let taken = self.slots.get_mut(n as usize)?.take();
        let (from, hint) = unpack(self.scan.load(Ordering::Relaxed));
        if taken.is_some() && (from..hint).contains(&n) {
            // A hole below the remembered end of the search.
            self.scan.store(pack(from, n), Ordering::Relaxed);
        }
        taken
    }

    /// Number of objects in the table (counts them: for bookkeeping, not hot paths).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|v| v.is_some()).count()
    }

    /// True when the table holds no object.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// Forgets every object.
    pub fn clear(&mut self) {
        self.slots.clear();
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

    /// The objects with their numbers, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }

    /// The objects with their numbers, in increasing order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| v.as_mut().map(|v| (i as u32, v)))
    }

    /// The numbers in use, in increasing order.
    pub fn numbers(&self) -> Vec<u32> {
        self.iter().map(|(n, _)| n).collect()
    }
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
}

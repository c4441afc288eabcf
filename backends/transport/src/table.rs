//! The one object table of the device models: objects indexed by their number.

/// Device objects (QPs, CQs, SRQs, EQs, memory keys …) indexed by the number the device gave
/// them, as a device keeps its contexts in a flat array. Both the soft device and the mlx4
/// model keep their per-object state in tables of this type.
///
/// Lookups are an index and a bounds check; numbers are expected to be small and dense (a
/// device hands them out from 0 or from a small reserved base), since the table grows to the
/// highest number inserted. Nothing here panics on a number: an absent or out-of-range number
/// is `None`.
#[derive(Debug, Clone)]
pub struct Table<T>(Vec<Option<T>>);

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self(Vec::new())
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
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(v);
    }

    /// The object numbered `n`.
    #[inline]
    pub fn get(&self, n: u32) -> Option<&T> {
        self.0.get(n as usize)?.as_ref()
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.0.get_mut(n as usize)?.as_mut()
    }

    /// Whether number `n` is in use.
    pub fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    /// Takes the object numbered `n` out of the table.
    pub fn remove(&mut self, n: u32) -> Option<T> {
        self.0.get_mut(n as usize)?.take()
    }

    /// Number of objects in the table (counts them: for bookkeeping, not hot paths).
    pub fn len(&self) -> usize {
        self.0.iter().filter(|v| v.is_some()).count()
    }

    /// True when the table holds no object.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// Forgets every object.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Lowest free number at or above `from`.
    pub fn free_number(&self, from: u32) -> u32 {
        (from..).find(|&n| self.get(n).is_none()).unwrap_or(from)
    }

    /// The objects with their numbers, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }

    /// The objects with their numbers, in increasing order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.0
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| v.as_mut().map(|v| (i as u32, v)))
    }

    /// The numbers in use, in increasing order.
    pub fn numbers(&self) -> Vec<u32> {
        self.iter().map(|(n, _)| n).collect()
    }
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
}

//! A table of device objects indexed by their number (EQN, CQN, QPN, SRQN, MPT index).

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Table<T>(Vec<Option<T>>);

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Table<T> {
    pub(crate) fn insert(&mut self, n: u32, v: T) {
        let i = n as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(v);
    }

    #[inline]
    pub(crate) fn get(&self, n: u32) -> Option<&T> {
        self.0.get(n as usize)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.0.get_mut(n as usize)?.as_mut()
    }

    pub(crate) fn contains(&self, n: u32) -> bool {
        self.get(n).is_some()
    }

    pub(crate) fn remove(&mut self, n: u32) -> Option<T> {
        self.0.get_mut(n as usize)?.take()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.iter().filter(|v| v.is_some()).count()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }

    pub(crate) fn numbers(&self) -> Vec<u32> {
        self.iter().map(|(n, _)| n).collect()
    }
}

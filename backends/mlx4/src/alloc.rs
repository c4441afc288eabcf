//! Allocators for the numbers and ranges the driver owns: object numbers (QPN, CQN, EQN, SRQN,
//! MPT index, PD) above the firmware-reserved ones, and MTT entry ranges.

/// Numbers `first..limit`, lowest free first.
#[derive(Debug)]
pub(crate) struct Numbers {
    used: Vec<u64>,
    first: u32,
    limit: u32,
}

impl Numbers {
    pub(crate) fn new(first: u32, limit: u32) -> Self {
        Self {
            used: vec![0; (limit as usize).div_ceil(64)],
            first,
            limit,
        }
    }

    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let start = self.first as usize;
        for w in start / 64..self.used.len() {
            let mut free = !self.used[w];
            if w == start / 64 {
                free &= !0u64 << (start % 64);
            }
            if free != 0 {
                let n = w * 64 + free.trailing_zeros() as usize;
                if n >= self.limit as usize {
                    return None;
                }
                self.used[w] |= 1 << (n % 64);
                return Some(n as u32);
            }
        }
        None
    }

    /// The first free number at or after `cursor`, going round to `first` after the end (as
    /// Linux's mlx4 bitmap hands out QP numbers round its range): the caller keeps the cursor,
    /// starting at a random point so that a peer cannot guess the numbers.
    pub(crate) fn alloc_round(&mut self, cursor: u32) -> Option<u32> {
        let cursor = if (self.first..self.limit).contains(&cursor) {
            cursor
        } else {
            self.first
        };
        let used = |n: u32| self.used[n as usize / 64] & (1 << (n % 64)) != 0;
        let n = (cursor..self.limit)
            .chain(self.first..cursor)
            .find(|&n| !used(n))?;
        self.used[n as usize / 64] |= 1 << (n % 64);
        Some(n)
    }

    /// How many numbers the allocator hands out (`first..limit`).
    pub(crate) fn span(&self) -> u32 {
        self.limit.saturating_sub(self.first)
    }

    /// The first number it hands out.
    pub(crate) fn first(&self) -> u32 {
        self.first
    }

    pub(crate) fn free(&mut self, n: u32) {
        if let Some(w) = self.used.get_mut(n as usize / 64) {
            *w &= !(1 << (n % 64));
        }
    }

    pub(crate) fn in_use(&self) -> usize {
        self.used.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// Ranges of `first..limit` (first fit; freed ranges merge with their neighbours).
#[derive(Debug)]
pub(crate) struct Ranges {
    free: Vec<(u64, u64)>,
}

impl Ranges {
    pub(crate) fn new(first: u64, limit: u64) -> Self {
        Self {
            free: vec![(first, limit - first)],
        }
    }

    /// `n` consecutive entries aligned to `align` (a power of two).
    pub(crate) fn alloc(&mut self, n: u64, align: u64) -> Option<u64> {
        for i in 0..self.free.len() {
            let (start, len) = self.free[i];
            let at = start.next_multiple_of(align);
            let end = start + len;
            if at + n <= end {
                self.free.remove(i);
                if at > start {
                    self.free.insert(i, (start, at - start));
                }
                if at + n < end {
                    let j = if at > start { i + 1 } else { i };
                    self.free.insert(j, (at + n, end - at - n));
                }
                return Some(at);
            }
        }
        None
    }

    pub(crate) fn free(&mut self, at: u64, n: u64) {
        let i = self.free.partition_point(|&(s, _)| s < at);
        self.free.insert(i, (at, n));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_start_above_the_reserved_ones_and_reuse() {
        let mut n = Numbers::new(65, 130);
        assert_eq!(n.alloc(), Some(65));
        assert_eq!(n.alloc(), Some(66));
        n.free(65);
        assert_eq!(n.alloc(), Some(65));
        for _ in 67..130 {
            assert!(n.alloc().is_some());
        }
        assert_eq!(n.alloc(), None);
        assert_eq!(n.in_use(), 65);
    }

    #[test]
    fn numbers_go_round_from_a_cursor() {
        let mut n = Numbers::new(65, 130);
        assert_eq!(n.alloc_round(128), Some(128));
        assert_eq!(n.alloc_round(129), Some(129));
        assert_eq!(n.alloc_round(130), Some(65), "past the end: from the start");
        assert_eq!(n.alloc_round(128), Some(66), "taken ones are passed over");
        assert_eq!(
            n.alloc_round(3),
            Some(67),
            "below the range: from the start"
        );
        while n.alloc_round(100).is_some() {}
        assert_eq!(n.in_use(), 65);
        n.free(90);
        assert_eq!(n.alloc_round(100), Some(90));
        assert_eq!((n.first(), n.span()), (65, 65));
    }

    #[test]
    fn ranges_align_split_and_merge() {
        let mut r = Ranges::new(8, 64);
        assert_eq!(r.alloc(4, 8), Some(8));
        assert_eq!(r.alloc(8, 8), Some(16));
        assert_eq!(r.alloc(3, 1), Some(12));
        r.free(8, 4);
        r.free(12, 3);
        r.free(16, 8);
        assert_eq!(r.alloc(56, 8), Some(8));
        assert_eq!(r.alloc(1, 1), None);
    }
}

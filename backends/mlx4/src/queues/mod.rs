//! The hot-path queue objects `verbs-core` drives: send queue (WQE encoding, stamping, doorbell
//! or BlueFlame), receive queue, SRQ (free list shared with the HCA), CQ (owner-bit polling,
//! set_ci record, arming) and EQ (owner-bit polling, EQ doorbell). They touch only their own
//! DMA memory, doorbell records and UAR registers: no lock, no allocation.

pub(crate) mod cq;
pub(crate) mod eq;
pub(crate) mod rq;
pub(crate) mod sq;
pub(crate) mod srq;

/// A queue buffer in DMA memory: `cnt` entries of `1 << shift` bytes from `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) base: usize,
    pub(crate) shift: u32,
    pub(crate) cnt: u32,
}

impl Geometry {
    #[inline]
    pub(crate) fn offset(&self, counter: u32) -> usize {
        self.base + (((counter & (self.cnt - 1)) as usize) << self.shift)
    }

    /// Wrap parity of `counter` (the owner bit of pass `counter / cnt`).
    #[inline]
    pub(crate) fn parity(&self, counter: u32) -> bool {
        counter & self.cnt != 0
    }

    pub(crate) fn stride(&self) -> usize {
        1 << self.shift
    }
}

//! The hot-path queue objects of [`crate::AnyDevice`]: one enum per kind over the backends'
//! concrete types. A post or poll through the facade costs a match on the variant (a
//! well-predicted branch) instead of an indirect call, and the backend's encoder or decoder
//! inlines into verbs-core's loop.

use portverbs_hal::error::{CqeError, WqeError};
use portverbs_hal::queue::{CompletionQueue, RecvQueue, SendQueue, SharedRecvQueue};
use portverbs_hal::wc::{Cqe, WorkCompletion, WqeRef};
use portverbs_hal::wr::{SendWr, Sge};
use portverbs_mlx4::{Mlx4Cq, Mlx4Rq, Mlx4Sq, Mlx4Srq};
use portverbs_soft::{SoftCq, SoftRq, SoftSq, SoftSrq};

/// Calls the same method on whichever backend's object `$q` holds.
macro_rules! each {
    ($ty:ident, $q:expr, $x:ident => $e:expr) => {
        match $q {
            $ty::Soft($x) => $e,
            $ty::Mlx4($x) => $e,
        }
    };
}

/// A send queue of any backend.
#[derive(Debug)]
pub enum AnySq {
    /// The software device's.
    Soft(SoftSq),
    /// The mlx4 driver's.
    Mlx4(Mlx4Sq),
}

impl SendQueue for AnySq {
    #[inline]
    fn depth(&self) -> u32 {
        each!(AnySq, self, q => q.depth())
    }

    #[inline]
    fn max_sge(&self) -> u32 {
        each!(AnySq, self, q => q.max_sge())
    }

    #[inline]
    fn max_inline(&self) -> u32 {
        each!(AnySq, self, q => q.max_inline())
    }

    #[inline(always)]
    fn write_wqe(&mut self, counter: u32, wr: &SendWr<'_>, signaled: bool) -> Result<(), WqeError> {
        each!(AnySq, self, q => q.write_wqe(counter, wr, signaled))
    }

    #[inline]
    fn ring_doorbell(&mut self, from: u32, to: u32) {
        each!(AnySq, self, q => q.ring_doorbell(from, to));
    }

    #[inline]
    fn reset(&mut self) {
        each!(AnySq, self, q => q.reset());
    }
}

/// A receive queue of any backend.
#[derive(Debug)]
pub enum AnyRq {
    /// The software device's.
    Soft(SoftRq),
    /// The mlx4 driver's.
    Mlx4(Mlx4Rq),
}

impl RecvQueue for AnyRq {
    #[inline]
    fn depth(&self) -> u32 {
        each!(AnyRq, self, q => q.depth())
    }

    #[inline]
    fn max_sge(&self) -> u32 {
        each!(AnyRq, self, q => q.max_sge())
    }

    #[inline]
    fn write_wqe(&mut self, counter: u32, sges: &[Sge]) -> Result<(), WqeError> {
        each!(AnyRq, self, q => q.write_wqe(counter, sges))
    }

    #[inline]
    fn ring_doorbell(&mut self, head: u32) {
        each!(AnyRq, self, q => q.ring_doorbell(head));
    }

    #[inline]
    fn reset(&mut self) {
        each!(AnyRq, self, q => q.reset());
    }
}

/// A shared receive queue of any backend.
#[derive(Debug)]
pub enum AnySrq {
    /// The software device's.
    Soft(SoftSrq),
    /// The mlx4 driver's.
    Mlx4(Mlx4Srq),
}

impl SharedRecvQueue for AnySrq {
    #[inline]
    fn srqn(&self) -> u32 {
        each!(AnySrq, self, q => q.srqn())
    }

    #[inline]
    fn depth(&self) -> u32 {
        each!(AnySrq, self, q => q.depth())
    }

    #[inline]
    fn slots(&self) -> u32 {
        each!(AnySrq, self, q => q.slots())
    }

    #[inline]
    fn max_sge(&self) -> u32 {
        each!(AnySrq, self, q => q.max_sge())
    }

    #[inline]
    fn write_wqe(&mut self, sges: &[Sge]) -> Result<Option<u32>, WqeError> {
        each!(AnySrq, self, q => q.write_wqe(sges))
    }

    #[inline]
    fn ring_doorbell(&mut self) {
        each!(AnySrq, self, q => q.ring_doorbell());
    }

    #[inline]
    fn release(&mut self, slot: u32) -> Result<(), WqeError> {
        each!(AnySrq, self, q => q.release(slot))
    }
}

/// A completion queue of any backend.
#[derive(Debug)]
pub enum AnyCq {
    /// The software device's.
    Soft(SoftCq),
    /// The mlx4 driver's.
    Mlx4(Mlx4Cq),
}

impl CompletionQueue for AnyCq {
    #[inline]
    fn cqn(&self) -> u32 {
        each!(AnyCq, self, q => q.cqn())
    }

    #[inline]
    fn depth(&self) -> u32 {
        each!(AnyCq, self, q => q.depth())
    }

    #[inline]
    fn poll_one(&mut self) -> Result<Option<Cqe>, CqeError> {
        each!(AnyCq, self, q => q.poll_one())
    }

    #[inline]
    fn poll_with<F>(&mut self, wc: &mut [WorkCompletion], accept: F) -> (usize, Option<CqeError>)
    where
        F: FnMut(&mut WorkCompletion, WqeRef) -> bool,
    {
        each!(AnyCq, self, q => q.poll_with(wc, accept))
    }

    #[inline]
    fn publish_ci(&mut self) {
        each!(AnyCq, self, q => q.publish_ci());
    }

    #[inline]
    fn arm(&mut self, solicited_only: bool) {
        each!(AnyCq, self, q => q.arm(solicited_only));
    }

    #[inline]
    fn pending(&self) -> u32 {
        each!(AnyCq, self, q => q.pending())
    }

    #[inline]
    fn event_delivered(&mut self) {
        each!(AnyCq, self, q => q.event_delivered());
    }
}

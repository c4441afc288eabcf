//! Bookkeeping shared by a work queue's poster and the CQ that completes it: the `wr_id` of
//! every outstanding slot and the producer/consumer counters.
//!
//! The poster owns `head` and the slots it fills; the poller owns `tail`. They meet only through
//! atomics: a slot's `wr_id` is stored before the device can see the WQE (the doorbell publishes
//! it with release ordering) and read after the completion for it was observed, so plain relaxed
//! loads suffice. No lock is shared between the send queue, the receive queue and the CQs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use portverbs_hal::queue::SharedRecvQueue;

use crate::context::lock;

/// `wr_id`s of one work queue.
#[derive(Debug)]
pub(crate) struct WrRing {
    wr_ids: Box<[AtomicU64]>,
    mask: u32,
    /// Counter of the next WQE to post: the queue's one producer counter. Only the poster
    /// writes it (under its queue's lock, so it may read it back relaxed); the device objects
    /// keep no copy (the send doorbell is told both ends of each batch).
    pub(crate) head: AtomicU32,
    /// Counter of the oldest outstanding WQE (written by the poller).
    pub(crate) tail: AtomicU32,
}

impl WrRing {
    /// A ring for `depth` outstanding requests (rounded up to a power of two).
    pub(crate) fn new(depth: u32) -> Self {
        let n = depth.max(1).next_power_of_two();
        Self {
            wr_ids: (0..n).map(|_| AtomicU64::new(0)).collect(),
            mask: n - 1,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
        }
    }

    /// Outstanding requests.
    #[cfg(test)]
    fn outstanding(&self) -> u32 {
        self.head
            .load(Ordering::Relaxed)
            .wrapping_sub(self.tail.load(Ordering::Acquire))
    }

    /// Poster: takes the slot of counter `head` in a queue of `depth`. `room` carries the free
    /// slots seen so far across one post call (start it at 0): the poller's tail, whose cache
    /// line belongs to whoever polls the CQ, is re-read only when they run out. False when the
    /// queue is full.
    #[inline]
    pub(crate) fn take_slot(&self, head: u32, depth: u32, room: &mut u32) -> bool {
        if *room == 0 {
            let used = head.wrapping_sub(self.tail.load(Ordering::Acquire));
            *room = depth.saturating_sub(used);
            if *room == 0 {
                return false;
            }
        }
        *room -= 1;
        true
    }

    /// Poster: records the `wr_id` of counter `c`.
    #[inline]
    pub(crate) fn set(&self, c: u32, wr_id: u64) {
        self.wr_ids[(c & self.mask) as usize].store(wr_id, Ordering::Relaxed);
    }

    /// Poster: publishes the new head.
    #[inline]
    pub(crate) fn publish(&self, head: u32) {
        self.head.store(head, Ordering::Release);
    }

    /// Poller: a send completion for the WQE whose 16-bit counter is `index`; retires it and
    /// every unsignaled WQE before it. `None` when no outstanding WQE has that counter.
    #[inline]
    pub(crate) fn retire_through(&self, index: u16) -> Option<u64> {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        let delta = u32::from(index.wrapping_sub(tail as u16));
        if delta >= head.wrapping_sub(tail) {
            return None;
        }
        let c = tail.wrapping_add(delta);
        let wr_id = self.wr_ids[(c & self.mask) as usize].load(Ordering::Relaxed);
        self.tail.store(c.wrapping_add(1), Ordering::Release);
        Some(wr_id)
    }

    /// Poller: the next receive completed (receive WQEs complete in order).
    #[inline]
    pub(crate) fn retire_next(&self) -> Option<u64> {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail == self.head.load(Ordering::Acquire) {
            return None;
        }
        let wr_id = self.wr_ids[(tail & self.mask) as usize].load(Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        Some(wr_id)
    }

    /// Back to empty (QP reset; nothing is outstanding any more).
    pub(crate) fn reset(&self) {
        self.head.store(0, Ordering::Release);
        self.tail.store(0, Ordering::Release);
    }
}

/// An SRQ's slots: the device picks a free slot per WQE and reports it in the completion.
#[derive(Debug)]
pub(crate) struct SrqShared<S> {
    pub(crate) srqn: u32,
    /// Usable slots.
    pub(crate) depth: u32,
    pub(crate) wr_ids: Box<[AtomicU64]>,
    /// Slot is posted and not completed.
    pub(crate) busy: Box<[std::sync::atomic::AtomicBool]>,
    pub(crate) hw: Mutex<S>,
}

impl<S: SharedRecvQueue> SrqShared<S> {
    pub(crate) fn new(hw: S) -> Self {
        let n = hw.slots().max(hw.depth()) as usize;
        Self {
            srqn: hw.srqn(),
            depth: hw.depth(),
            wr_ids: (0..n).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..n)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            hw: Mutex::new(hw),
        }
    }

    /// Poller: slot `slot` completed; returns its `wr_id` and frees the slot.
    pub(crate) fn complete(&self, slot: u32) -> Option<u64> {
        let i = slot as usize;
        let busy = self.busy.get(i)?;
        if !busy.swap(false, Ordering::AcqRel) {
            return None;
        }
        let wr_id = self.wr_ids[i].load(Ordering::Relaxed);
        if let Err(e) = lock(&self.hw).release(slot) {
            tracing::warn!(srqn = self.srqn, error = %e, "releasing an SRQ slot failed");
        }
        Some(wr_id)
    }
}

/// What a CQ needs to know about a QP attached to it.
#[derive(Debug)]
pub(crate) struct QpShared<S> {
    pub(crate) qpn: u32,
    pub(crate) sq: WrRing,
    pub(crate) rq: Option<WrRing>,
    pub(crate) srq: Option<Arc<SrqShared<S>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_slot_stops_at_depth_and_sees_retired_slots() {
        let r = WrRing::new(4);
        let mut room = 0;
        let mut head = 0;
        while r.take_slot(head, 4, &mut room) {
            r.set(head, u64::from(head));
            head += 1;
        }
        assert_eq!(head, 4, "a full queue refuses the fifth");
        r.publish(head);
        assert_eq!(r.retire_through(1), Some(1));
        assert!(r.take_slot(head, 4, &mut room), "two slots came back");
        assert!(r.take_slot(head + 1, 4, &mut room));
        assert!(!r.take_slot(head + 2, 4, &mut room));
    }

    #[test]
    fn send_completion_retires_unsignaled_predecessors() {
        let r = WrRing::new(8);
        for c in 0..5 {
            r.set(c, 100 + u64::from(c));
        }
        r.publish(5);
        assert_eq!(r.retire_through(2), Some(102));
        assert_eq!(r.outstanding(), 2);
        assert_eq!(r.retire_through(2), None, "already retired");
        assert_eq!(r.retire_through(7), None, "never posted");
        assert_eq!(r.retire_through(4), Some(104));
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn counters_wrap_at_16_bits_in_completions() {
        let r = WrRing::new(4);
        let base = 0xffffu32;
        r.head.store(base, Ordering::Relaxed);
        r.tail.store(base, Ordering::Relaxed);
        r.set(base, 1);
        r.set(base + 1, 2);
        r.publish(base + 2);
        assert_eq!(
            r.retire_through(0),
            Some(2),
            "counter 0x10000 has 16-bit index 0"
        );
    }

    #[test]
    fn receives_retire_in_order() {
        let r = WrRing::new(2);
        assert_eq!(r.retire_next(), None);
        r.set(0, 7);
        r.publish(1);
        assert_eq!(r.retire_next(), Some(7));
        assert_eq!(r.retire_next(), None);
    }
}

//! The hot-path queue objects a backend hands to the core: send and receive queues (WQE encoding
//! plus doorbells), shared receive queues, completion queues (CQE decoding with ownership checks,
//! consumer-index record, arming) and event queues.
//!
//! A device names its concrete types as associated types of [`crate::device::LocalDevice`]
//! (`Sq`, `Rq`, `Srq`, `Cq`), so the core's post and poll loops are compiled per device type and
//! the backend's encoder/decoder inline into them (no indirect call per work request or
//! completion). The traits stay object-safe, and event queues (a cold path) are trait objects.
//! The core serialises calls on one object (each sits behind the owning queue's own lock);
//! objects never share a lock with other queues, and none of these methods may allocate.
//!
//! Counters are free-running `u32`s owned by the core for work queues (it decides which slot the
//! next WQE goes to, and retires WQEs from completions) and by the queue object for completion
//! and event queues.

use std::fmt::Debug;

use crate::error::{CqeError, EqeError, WqeError};
use crate::event::DeviceEvent;
use crate::wc::{Cqe, WorkCompletion, WqeRef};
use crate::wr::{SendWr, Sge};

/// A queue pair's send queue.
pub trait SendQueue: Send + Debug {
    /// Usable slots: at most this many WQEs may be outstanding.
    fn depth(&self) -> u32;

    /// Gather entries per WQE.
    fn max_sge(&self) -> u32;

    /// Inline bytes per WQE.
    fn max_inline(&self) -> u32;

    /// Encodes `wr` into the slot of producer counter `counter` and passes the slot to the device
    /// (ownership word written last, after a [`crate::barrier::to_device`]). The device may start
    /// on it at once but is only *told* by [`SendQueue::ring_doorbell`].
    ///
    /// # Errors
    /// The request has no encoding or does not fit. The slot was not passed to the device
    /// (its ownership word is untouched), though its body may have been overwritten; the core
    /// does not advance its producer counter, so the slot is written afresh next time.
    fn write_wqe(&mut self, counter: u32, wr: &SendWr<'_>, signaled: bool) -> Result<(), WqeError>;

    /// Rings the send doorbell: the WQEs of counters `from..to` (written since the last ring)
    /// are posted. The producer counter is the caller's (verbs-core keeps it once); the queue
    /// keeps no copy of it, so both ends of the batch come with the call.
    fn ring_doorbell(&mut self, from: u32, to: u32);

    /// Resets the producer side after the QP went back to RESET (the device restarts at 0).
    fn reset(&mut self);
}

/// A queue pair's own receive queue.
pub trait RecvQueue: Send + Debug {
    /// Usable slots.
    fn depth(&self) -> u32;

    /// Scatter entries per WQE.
    fn max_sge(&self) -> u32;

    /// Encodes a receive WQE into the slot of counter `counter`.
    ///
    /// # Errors
    /// Too many scatter entries; nothing was written.
    fn write_wqe(&mut self, counter: u32, sges: &[Sge]) -> Result<(), WqeError>;

    /// Publishes the producer counter `head` (receive doorbell record).
    fn ring_doorbell(&mut self, head: u32);

    /// Resets after the QP went back to RESET.
    fn reset(&mut self);
}

/// A shared receive queue. Slots are recycled through a free list that the device also follows,
/// so the queue object (not the core) chooses the slot; the core maps slots to `wr_id`s.
pub trait SharedRecvQueue: Send + Debug {
    /// SRQ number.
    fn srqn(&self) -> u32;

    /// Usable slots.
    fn depth(&self) -> u32;

    /// Slot indices [`SharedRecvQueue::write_wqe`] may return: `0..slots()`. At least
    /// `depth()`; more when the format keeps a WQE back (mlx4 keeps the free list's tail).
    fn slots(&self) -> u32 {
        self.depth()
    }

    /// Scatter entries per WQE.
    fn max_sge(&self) -> u32;

    /// Encodes a receive WQE into a free slot and returns the slot index, or `None` when
    /// every slot is in use.
    ///
    /// # Errors
    /// Too many scatter entries; nothing was written.
    fn write_wqe(&mut self, sges: &[Sge]) -> Result<Option<u32>, WqeError>;

    /// Publishes the WQEs written since the last call (SRQ doorbell record).
    fn ring_doorbell(&mut self);

    /// Returns a slot whose completion has been polled to the free list.
    ///
    /// # Errors
    /// [`WqeError::BadSlot`] for an index outside the ring.
    fn release(&mut self, slot: u32) -> Result<(), WqeError>;
}

/// A completion queue.
pub trait CompletionQueue: Send + Debug {
    /// CQ number.
    fn cqn(&self) -> u32;

    /// Usable entries (the ring keeps one spare).
    fn depth(&self) -> u32;

    /// Reads the entry at the consumer index if the host owns it, decodes it and advances the
    /// consumer index (privately: call [`CompletionQueue::publish_ci`] after a batch).
    ///
    /// # Errors
    /// A malformed entry (consumed), or the CQ is in error.
    fn poll_one(&mut self) -> Result<Option<Cqe>, CqeError>;

    /// Polls up to `wc.len()` entries as [`CompletionQueue::poll_one`] would, decoding each
    /// straight into its slot of `wc` (every field but `wr_id`) and handing it with its
    /// [`WqeRef`] to `accept`, which fills in `wr_id`. `accept` returning `false` ends the poll
    /// with that entry consumed but not counted. Publishes the consumer index if any entry was
    /// consumed. Returns the number of accepted entries and the error of a malformed entry that
    /// ended the poll (also consumed).
    ///
    /// One call per poll: a backend's version keeps its ring state in registers across the
    /// loop, and `accept` (the core's resolution) inlines into it.
    #[inline]
    fn poll_with<F>(
        &mut self,
        wc: &mut [WorkCompletion],
        mut accept: F,
    ) -> (usize, Option<CqeError>)
    where
        Self: Sized,
        F: FnMut(&mut WorkCompletion, WqeRef) -> bool,
    {
        let mut n = 0;
        let mut consumed = false;
        let mut error = None;
        while let Some(w) = wc.get_mut(n) {
            match self.poll_one() {
                Ok(Some(c)) => {
                    consumed = true;
                    *w = c.wc;
                    if !accept(w, c.wqe) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    consumed = true;
                    error = Some(e);
                    break;
                }
            }
            n += 1;
        }
        if consumed {
            self.publish_ci();
        }
        (n, error)
    }

    /// Publishes the consumer index to the device (CQ set-ci doorbell record).
    fn publish_ci(&mut self);

    /// Arms the CQ: the device raises one completion event when a CQE arrives after the current
    /// consumer index (any CQE, or with `solicited_only` a solicited receive or an error). A CQE
    /// already present beyond the consumer index fires at once.
    fn arm(&mut self, solicited_only: bool);

    /// Entries the device has written that the host has not consumed yet (a scan of the owner
    /// bits ahead of the consumer index; used before a resize).
    fn pending(&self) -> u32;

    /// Tells the queue that a completion event for it was delivered (mlx4 bumps its arm sequence
    /// number here).
    fn event_delivered(&mut self);
}

/// An event queue.
pub trait EventQueue: Send + Debug {
    /// EQ number.
    fn eqn(&self) -> u32;

    /// Reads, decodes and consumes the entry at the consumer index if the host owns it.
    ///
    /// # Errors
    /// A malformed entry (consumed).
    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError>;

    /// Publishes the consumer index without arming (long bursts).
    fn publish_ci(&mut self);

    /// Publishes the consumer index and arms the EQ: the next EQE raises the interrupt.
    fn arm(&mut self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wc::{WcFlags, WcOpcode, WcStatus};

    /// A CQ whose ring is a list of decoded entries; counts consumer-index publications.
    #[derive(Debug, Default)]
    struct ListCq {
        entries: Vec<Cqe>,
        next: usize,
        published: u32,
    }

    impl CompletionQueue for ListCq {
        fn cqn(&self) -> u32 {
            7
        }
        fn depth(&self) -> u32 {
            16
        }
        fn poll_one(&mut self) -> Result<Option<Cqe>, CqeError> {
            let c = self.entries.get(self.next).copied();
            self.next += usize::from(c.is_some());
            Ok(c)
        }
        fn publish_ci(&mut self) {
            self.published += 1;
        }
        fn arm(&mut self, _: bool) {}
        fn pending(&self) -> u32 {
            (self.entries.len() - self.next) as u32
        }
        fn event_delivered(&mut self) {}
    }

    fn entry(qpn: u32, is_send: bool, index: u16) -> Cqe {
        Cqe {
            wc: WorkCompletion {
                qp_num: qpn,
                status: WcStatus::Success,
                opcode: if is_send {
                    WcOpcode::RdmaWrite
                } else {
                    WcOpcode::Recv
                },
                byte_len: u32::from(index) * 10,
                imm_data: 0xbeef,
                wc_flags: WcFlags::WITH_IMM,
                ..WorkCompletion::default()
            },
            wqe: WqeRef { is_send, index },
        }
    }

    /// The default poll writes each entry's completion into the application's slot and hands
    /// its WQE reference to `accept` beside it; a refusal ends the poll uncounted.
    #[test]
    fn poll_with_splits_each_cqe_into_the_slot_and_the_reference() {
        let entries = vec![
            entry(0x11, true, 5),
            entry(0x12, false, 9),
            entry(0x13, true, 1),
        ];
        let mut cq = ListCq {
            entries: entries.clone(),
            ..ListCq::default()
        };
        let mut wc = [WorkCompletion::default(); 8];
        let mut seen = Vec::new();
        let (n, err) = cq.poll_with(&mut wc, |w, r| {
            seen.push((w.qp_num, w.byte_len, r));
            w.wr_id = 100 + u64::from(r.index);
            r.index != 1
        });
        assert_eq!((n, err, cq.published), (2, None, 1));
        assert_eq!(
            seen,
            entries
                .iter()
                .map(|c| (c.wc.qp_num, c.wc.byte_len, c.wqe))
                .collect::<Vec<_>>()
        );
        for (w, c) in wc.iter().zip(&entries).take(n) {
            assert_eq!(w.wr_id, 100 + u64::from(c.wqe.index));
            assert_eq!(WorkCompletion { wr_id: 0, ..*w }, c.wc);
        }
        assert_eq!(cq.poll_with(&mut wc, |_, _| true), (0, None));
        assert_eq!(cq.published, 1, "nothing consumed, nothing published");
    }
}

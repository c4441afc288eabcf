//! The completion queue (rdma-core `providers/mlx4/cq.c`): 32-byte CQEs valid when their owner bit
//! equals the wrap parity of the consumer index; the consumer index goes to the set_ci record;
//! arming writes the arm record and then the UAR CQ doorbell with the arm sequence number.

use portverbs_hal::barrier;
use portverbs_hal::error::CqeError;
use portverbs_hal::queue::CompletionQueue;
use portverbs_hal::types::SpecialQp;
use portverbs_hal::wc::{Cqe, WorkCompletion, WqeRef};

use crate::dma::{EventRing, Slots};
use crate::doorbell::DbRecord;
use crate::layout::cqe::{self, CQE_SIZE};
use crate::layout::uar::{CQ_REQ_NOT, CQ_REQ_NOT_SOL, cq_arm_word};
use crate::uar::Uar;

/// A CQ's ring: 32-byte CQEs whose owner bit is bit 7 of their last byte, and the consumer
/// index (the workspace's one event ring, [`EventRing`]).
pub(crate) type CqRing = EventRing<CQE_SIZE, { CQE_SIZE - 1 }, { cqe::OWNER_MASK }>;

/// Host side of a CQ.
#[derive(Debug)]
pub struct Mlx4Cq {
    pub(crate) cqn: u32,
    /// The CQE ring (32-byte slots) and the consumer index.
    pub(crate) buf: CqRing,
    pub(crate) db: DbRecord,
    /// The UAR page whose CQ doorbell arms this CQ.
    pub(crate) uar: Uar,
    pub(crate) arm_sn: u32,
    /// The hardware QPN of the GSI QP, which verbs know as QP 1 (Linux `mlx4/qp.c`).
    pub(crate) gsi_qpn: u32,
}

impl Mlx4Cq {
    /// The owner bit of entry `counter` (an acquire load of its last 8 bytes).
    #[inline]
    fn tail_word(&self, counter: u32) -> [u8; 8] {
        self.buf.at(counter).load8::<{ CQE_SIZE - 8 }>()
    }

    /// Whether the host owns entry `counter`, given its tail word.
    #[inline(always)]
    fn owned(&self, tail: [u8; 8], counter: u32) -> bool {
        CqRing::owns_byte(tail[7], counter, self.buf.geom().entries())
    }
}

impl Mlx4Cq {
    /// After a resize command: copies the CQEs before the RESIZE CQE into `ring` one counter
    /// later (owner bits for the new geometry), switches to it, and returns the consumer
    /// counter to continue from (the first moved CQE). `None` while the RESIZE CQE has not appeared.
    pub(crate) fn switch_to(&mut self, ring: Slots<CQE_SIZE>) -> Option<u32> {
        let geom = ring.geom();
        let ci = self.buf.tail();
        let mut c = ci;
        let mut moved = Vec::new();
        for _ in 0..self.buf.geom().cnt {
            let tail = self.tail_word(c);
            if !self.owned(tail, c) {
                return None;
            }
            barrier::from_device();
            let mut raw = [0u8; CQE_SIZE];
            raw[..CQE_SIZE - 8].copy_from_slice(&self.buf.at(c).read::<0, { CQE_SIZE - 8 }>());
            raw[CQE_SIZE - 8..].copy_from_slice(&tail);
            if raw[CQE_SIZE - 1] & cqe::OPCODE_MASK == cqe::OPCODE_RESIZE {
                for (n, mut e) in moved.into_iter().enumerate() {
                    let counter = ci.wrapping_add(n as u32).wrapping_add(1);
                    let e: &mut [u8; CQE_SIZE] = &mut e;
                    e[CQE_SIZE - 1] = CqRing::with_owner(e[CQE_SIZE - 1], geom.parity(counter));
                    ring.write(counter, 0, e);
                }
                self.buf = CqRing::new(ring, ci.wrapping_add(1));
                return Some(ci.wrapping_add(1));
            }
            moved.push(raw);
            c = c.wrapping_add(1);
        }
        None
    }
}

impl Mlx4Cq {
    /// The polling loop of [`CompletionQueue::poll_with`], without publishing the consumer
    /// index; the counter lives in a register until the loop ends.
    #[inline(always)]
    fn drain<F>(&mut self, wc: &mut [WorkCompletion], mut accept: F) -> (usize, Option<CqeError>)
    where
        F: FnMut(&mut WorkCompletion, WqeRef) -> bool,
    {
        // Ring addressing and the counter stay in registers across the loop. Every CQ ring
        // has 32-byte slots (create_cq and resize make no other), so the cursor always exists.
        let Some(ring) = self.buf.exact_cursor() else {
            return (0, Some(CqeError::CqInError { cqn: self.cqn }));
        };
        let mut ci = self.buf.tail();
        let mut n = 0;
        let mut error = None;
        let gsi = self.gsi_qpn;
        // The GSI QP's completions carry its hardware QPN; verbs know it as QP 1.
        let verbs_qpn = |w: &mut WorkCompletion| {
            if w.qp_num == gsi {
                w.qp_num = SpecialQp::GSI_QPN;
            }
        };
        while let Some(w) = wc.get_mut(n) {
            let slot = ring.at(ci);
            let tail = slot.load8::<{ CQE_SIZE - 8 }>();
            if !CqRing::owns_byte(tail[7], ci, ring.wrap_bit()) {
                break;
            }
            barrier::from_device();
            let head = slot.read::<0, { CQE_SIZE - 8 }>();
            let index = ci;
            ci = ci.wrapping_add(1);
            // The commonest entry on its own arm, where `accept` sees a constant direction.
            let accepted = match cqe::decode_plain_send(&head, &tail, w) {
                Some(index) => {
                    verbs_qpn(w);
                    accept(
                        w,
                        WqeRef {
                            is_send: true,
                            index,
                        },
                    )
                }
                None => match cqe::decode_split(&head, &tail, w) {
                    Ok(r) => {
                        verbs_qpn(w);
                        accept(w, r)
                    }
                    Err(e) => {
                        error = Some(e.at(self.cqn, index));
                        break;
                    }
                },
            };
            if !accepted {
                break;
            }
            n += 1;
        }
        self.buf.advance_to(ci);
        (n, error)
    }
}

impl CompletionQueue for Mlx4Cq {
    fn cqn(&self) -> u32 {
        self.cqn
    }

    fn depth(&self) -> u32 {
        // The HCA overruns only when every entry is unconsumed (Linux `mlx4/cq.c`); this driver
        // never needs the spare entry rdma-core keeps for the resize CQE.
        self.buf.geom().cnt
    }

    fn poll_one(&mut self) -> Result<Option<Cqe>, CqeError> {
        let mut w = [WorkCompletion::default()];
        let mut got = None;
        let (_, error) = self.drain(&mut w, |_, r| {
            got = Some(r);
            true
        });
        match (error, got) {
            (Some(e), _) => Err(e),
            (None, r) => Ok(r.map(|r| Cqe { wc: w[0], wqe: r })),
        }
    }

    #[cfg_attr(not(portverbs_split), inline(always))]
    #[cfg_attr(portverbs_split, inline(never))]
    fn poll_with<F>(&mut self, wc: &mut [WorkCompletion], accept: F) -> (usize, Option<CqeError>)
    where
        F: FnMut(&mut WorkCompletion, WqeRef) -> bool,
    {
        let start = self.buf.tail();
        let polled = self.drain(wc, accept);
        if self.buf.tail() != start {
            self.publish_ci();
        }
        polled
    }

    #[inline]
    fn publish_ci(&mut self) {
        barrier::to_device();
        self.db.store_be32(0, self.buf.tail() & 0xff_ffff);
    }

    fn arm(&mut self, solicited_only: bool) {
        let cmd = if solicited_only {
            CQ_REQ_NOT_SOL
        } else {
            CQ_REQ_NOT
        };
        let ci = self.buf.tail() & 0xff_ffff;
        self.db.store_be32(0, ci);
        self.db.store_be32(4, cq_arm_word(self.arm_sn, cmd, ci));
        barrier::to_device();
        self.uar.arm_cq(cq_arm_word(self.arm_sn, cmd, self.cqn), ci);
    }

    fn pending(&self) -> u32 {
        self.buf.pending()
    }

    fn event_delivered(&mut self) {
        self.arm_sn = self.arm_sn.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring's owner bit is where the CQE codec puts it: an entry encoded with the wrap
    /// parity of a counter is the host's at that counter and not at the next pass's.
    #[test]
    fn the_ring_reads_the_owner_bit_the_cqe_codec_writes() {
        for cnt in [1u32, 2, 64, 1 << 22] {
            for counter in [0, 1, cnt - 1, cnt, 3 * cnt - 1, u32::MAX] {
                let parity = counter & cnt != 0;
                let e = Cqe {
                    wqe: WqeRef {
                        is_send: true,
                        index: 0,
                    },
                    ..Cqe::default()
                };
                let raw = cqe::encode(&e, parity);
                assert!(
                    CqRing::owns_byte(raw[CQE_SIZE - 1], counter, cnt),
                    "{counter:#x} of {cnt}"
                );
                assert!(
                    !CqRing::owns_byte(raw[CQE_SIZE - 1], counter.wrapping_add(cnt), cnt),
                    "{counter:#x} + {cnt}"
                );
            }
        }
    }
}

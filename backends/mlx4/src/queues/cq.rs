//! The completion queue (rdma-core `providers/mlx4/cq.c`): 32-byte CQEs valid when their owner bit
//! equals the wrap parity of the consumer index; the consumer index goes to the set_ci record;
//! arming writes the arm record and then the UAR CQ doorbell with the arm sequence number.

use portverbs_hal::barrier;
use portverbs_hal::dma::DmaMemory;
use portverbs_hal::error::CqeError;
use portverbs_hal::queue::CompletionQueue;
use portverbs_hal::types::SpecialQp;
use portverbs_hal::wc::{Cqe, WorkCompletion, WqeRef};

use super::Geometry;
use crate::dma::Slots;
use crate::doorbell::DbRecord;
use crate::layout::cqe::{self, CQE_SIZE};
use crate::layout::uar::{CQ_REQ_NOT, CQ_REQ_NOT_SOL, cq_arm_word};
use crate::uar::Uar;

/// Host side of a CQ.
#[derive(Debug)]
pub struct Mlx4Cq {
    pub(crate) cqn: u32,
    /// The CQE ring (32-byte slots).
    pub(crate) buf: Slots<CQE_SIZE>,
    pub(crate) ci: u32,
    pub(crate) db: DbRecord,
    /// The UAR page whose CQ doorbell arms this CQ.
    pub(crate) uar: Uar,
    pub(crate) arm_sn: u32,
    /// The hardware QPN of the GSI QP, which verbs know as QP 1 (Linux `mlx4/qp.c`).
    pub(crate) gsi_qpn: u32,
}

/// Whether the host owns an entry whose tail word is `tail` when its counter's wrap parity is
/// `parity` (the owner bit equals the parity).
#[inline(always)]
fn host_owns(tail: [u8; 8], parity: bool) -> bool {
    host_owns_at(tail, u32::from(parity), 1)
}

/// [`host_owns`] for the entry of `counter` in a ring whose wrap parity is the `wrap` bit of
/// the counter: the owner bit, sign-extended, compared with that bit without a branch on
/// either.
#[inline(always)]
fn host_owns_at(tail: [u8; 8], counter: u32, wrap: u32) -> bool {
    const { assert!(cqe::OWNER_MASK == 0x80) };
    let owner = i32::from(tail[7] as i8 >> 7) as u32;
    (owner ^ counter) & wrap == 0
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
        host_owns(tail, self.buf.geom().parity(counter))
    }

    /// Marks every entry hardware-owned for the counters `first..first + cnt` that will use it
    /// next (a resized CQ continues its counters in the new buffer).
    pub(crate) fn init_owner_from(buf: &dyn DmaMemory, geom: Geometry, first: u32) {
        for i in 0..geom.cnt {
            let c = first.wrapping_add(i);
            let owner = if geom.parity(c) { 0 } else { cqe::OWNER_MASK };
            let _ = buf.write(geom.offset(c) + CQE_SIZE - 1, &[owner]);
        }
    }
}

impl Mlx4Cq {
    /// After a resize command: copies the CQEs before the RESIZE CQE into `ring` one counter
    /// later (owner bits for the new geometry), switches to it, and returns the consumer
    /// counter to continue from (the first moved CQE). `None` while the RESIZE CQE has not appeared.
    pub(crate) fn switch_to(&mut self, ring: Slots<CQE_SIZE>) -> Option<u32> {
        let geom = ring.geom();
        let mut c = self.ci;
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
                    let counter = self.ci.wrapping_add(n as u32).wrapping_add(1);
                    let e: &mut [u8; CQE_SIZE] = &mut e;
                    e[CQE_SIZE - 1] = (e[CQE_SIZE - 1] & !cqe::OWNER_MASK)
                        | if geom.parity(counter) {
                            cqe::OWNER_MASK
                        } else {
                            0
                        };
                    ring.write(counter, 0, e);
                }
                self.buf = ring;
                return Some(self.ci.wrapping_add(1));
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
        let mut ci = self.ci;
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
            if !host_owns_at(tail, ci, ring.wrap_bit()) {
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
        self.ci = ci;
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
            (None, r) => Ok(r.map(|r| Cqe::from_parts(&w[0], r))),
        }
    }

    #[cfg_attr(not(portverbs_split), inline(always))]
    #[cfg_attr(portverbs_split, inline(never))]
    fn poll_with<F>(&mut self, wc: &mut [WorkCompletion], accept: F) -> (usize, Option<CqeError>)
    where
        F: FnMut(&mut WorkCompletion, WqeRef) -> bool,
    {
        let start = self.ci;
        let polled = self.drain(wc, accept);
        if self.ci != start {
            self.publish_ci();
        }
        polled
    }

    #[inline]
    fn publish_ci(&mut self) {
        barrier::to_device();
        self.db.store_be32(0, self.ci & 0xff_ffff);
    }

    fn arm(&mut self, solicited_only: bool) {
        let cmd = if solicited_only {
            CQ_REQ_NOT_SOL
        } else {
            CQ_REQ_NOT
        };
        let ci = self.ci & 0xff_ffff;
        self.db.store_be32(0, ci);
        self.db.store_be32(4, cq_arm_word(self.arm_sn, cmd, ci));
        barrier::to_device();
        self.uar.arm_cq(cq_arm_word(self.arm_sn, cmd, self.cqn), ci);
    }

    fn pending(&self) -> u32 {
        let mut n = 0;
        while n < self.buf.geom().cnt {
            let c = self.ci.wrapping_add(n);
            if !self.owned(self.tail_word(c), c) {
                break;
            }
            n += 1;
        }
        n
    }

    fn event_delivered(&mut self) {
        self.arm_sn = self.arm_sn.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_branch_free_owner_test_agrees_with_the_plain_one() {
        for byte in [0x00, 0x7f, 0x80, 0xff, 0x8d, 0x0d] {
            let tail = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, byte];
            for log in 0..24 {
                let wrap = 1u32 << log;
                for counter in [
                    0,
                    1,
                    wrap - 1,
                    wrap,
                    wrap + 1,
                    2 * wrap,
                    3 * wrap - 1,
                    u32::MAX,
                ] {
                    let parity = counter & wrap != 0;
                    assert_eq!(
                        host_owns_at(tail, counter, wrap),
                        (byte & 0x80 != 0) == parity,
                        "owner byte {byte:#x}, counter {counter:#x}, wrap {wrap:#x}"
                    );
                }
            }
        }
    }
}

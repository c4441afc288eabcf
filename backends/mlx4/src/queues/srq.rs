//! The shared receive queue (rdma-core `providers/mlx4/srq.c`): WQEs start with a "next" segment,
//! and free WQEs form a list that software and the HCA both follow. The driver keeps its own copy
//! of the links (it never reads them back from DMA memory) and one WQE back as the list tail.

use std::mem::offset_of;

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::queue::SharedRecvQueue;
use portverbs_hal::wr::Sge;

use super::rq::{DATA_SEG, scatter};
use crate::dma::{HostToDevice, Producer, Slots};
use crate::doorbell::DbRecord;
use crate::layout::wqe::SrqNextSeg;

/// Bytes of the "next" segment every SRQ WQE starts with; its scatter list follows.
const NEXT_SEG: usize = size_of::<SrqNextSeg>();

/// Offset of the big-endian 16-bit index of the next free WQE.
const NEXT_AT: usize = offset_of!(SrqNextSeg, next_wqe_index);

/// The least an SRQ WQE holds: its "next" segment and one scatter entry.
pub(crate) const SRQ_WQE_MIN: usize = NEXT_SEG + DATA_SEG;

/// Host side of an SRQ.
#[derive(Debug)]
pub struct Mlx4Srq {
    pub(crate) srqn: u32,
    /// The WQE ring (geometry checked when the SRQ was made).
    pub(crate) buf: Slots<SRQ_WQE_MIN>,
    pub(crate) max_sge: u32,
    pub(crate) db: DbRecord,
    /// `next[i]` = the WQE after `i` in the free list.
    pub(crate) next: Box<[u16]>,
    pub(crate) head: u16,
    pub(crate) tail: u16,
    /// WQEs posted: the doorbell-record counter, whose low 16 bits the HCA reads. The WQEs
    /// themselves are taken from the free list, not at this counter.
    pub(crate) posted: Producer<HostToDevice>,
    /// Slots currently posted or owned by software between poll and release.
    pub(crate) in_use: Box<[bool]>,
}

impl Mlx4Srq {
    /// Scatter entries per WQE (after its "next" segment).
    #[inline(always)]
    fn entries(&self) -> usize {
        (self.buf.geom().stride() - NEXT_SEG) / DATA_SEG
    }

    /// Links every WQE to the next one (the last back to 0) and writes the links and empty
    /// scatter lists into the buffer.
    pub(crate) fn init(&mut self) {
        let cnt = self.buf.geom().cnt;
        let entries = self.entries();
        let zeros = vec![0u8; self.buf.geom().stride()];
        for i in 0..cnt {
            let next = ((i + 1) % cnt) as u16;
            self.next[i as usize] = next;
            let wqe = self.buf.at(i);
            let _ = wqe.write_at(0, &zeros);
            wqe.put::<NEXT_AT, 2>(next.to_be_bytes());
            let _ = scatter(wqe, NEXT_SEG, &[], entries);
        }
        self.head = 0;
        self.tail = (cnt - 1) as u16;
    }
}

impl SharedRecvQueue for Mlx4Srq {
    fn srqn(&self) -> u32 {
        self.srqn
    }

    fn depth(&self) -> u32 {
        self.buf.geom().cnt - 1
    }

    fn slots(&self) -> u32 {
        self.buf.geom().cnt
    }

    fn max_sge(&self) -> u32 {
        self.max_sge
    }

    fn write_wqe(&mut self, sges: &[Sge]) -> Result<Option<u32>, WqeError> {
        if sges.len() > self.max_sge as usize {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        let entries = self.entries();
        if sges.len() > entries {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: entries as u32,
            });
        }
        if self.head == self.tail {
            return Ok(None);
        }
        let slot = self.head;
        self.head = self.next[usize::from(slot)];
        self.in_use[usize::from(slot)] = true;
        // The list fits (checked above), so this writes it all.
        let _ = scatter(self.buf.at(u32::from(slot)), NEXT_SEG, sges, entries);
        self.posted.advance(1);
        Ok(Some(u32::from(slot)))
    }

    fn ring_doorbell(&mut self) {
        barrier::to_device();
        self.db.store_be32(0, self.posted.head() & 0xffff);
    }

    fn release(&mut self, slot: u32) -> Result<(), WqeError> {
        let bad = WqeError::BadSlot {
            slot,
            depth: self.buf.geom().cnt,
        };
        if slot >= self.buf.geom().cnt || !self.in_use[slot as usize] {
            return Err(bad);
        }
        self.in_use[slot as usize] = false;
        let w = slot as u16;
        // Link w after the tail, in the buffer first (the HCA follows it), then locally.
        self.buf
            .at(u32::from(self.tail))
            .put::<NEXT_AT, 2>(w.to_be_bytes());
        self.next[usize::from(self.tail)] = w;
        self.tail = w;
        if self.head == self.tail {
            // The list had only its tail: w is the next free WQE.
            self.head = w;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::layout::wqe::INVALID_LKEY;
    use crate::queues::Geometry;
    use crate::queues::rq::tests::{ring, seg};

    /// An SRQ of `cnt` WQEs of 64 bytes (three scatter entries), initialised.
    fn srq(cnt: u32) -> Mlx4Srq {
        let geom = Geometry {
            base: 0,
            shift: 6,
            cnt,
        };
        let mut srq = Mlx4Srq {
            srqn: 5,
            buf: Slots::new(ring(geom.bytes()), geom).unwrap(),
            max_sge: 3,
            db: DbRecord::in_test_region(ring(8)),
            next: vec![0; cnt as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            posted: Producer::new(geom),
            in_use: vec![false; cnt as usize].into_boxed_slice(),
        };
        srq.init();
        srq
    }

    /// The "next" segment linking to `next` (`struct mlx4_wqe_srq_next_seg`: a big-endian index at
    /// byte 2).
    fn next_seg(next: u16) -> Vec<u8> {
        let mut s = vec![0u8; 16];
        s[2..4].copy_from_slice(&next.to_be_bytes());
        s
    }

    fn wqe(srq: &Mlx4Srq, slot: u32) -> Vec<u8> {
        let mut out = vec![0u8; 64];
        assert!(srq.buf.at(slot).read_at(0, &mut out));
        out
    }

    #[test]
    fn layout_constants_follow_the_wqe_format() {
        assert_eq!((NEXT_SEG, NEXT_AT, SRQ_WQE_MIN), (16, 2, 32));
    }

    #[test]
    fn the_free_list_lives_in_the_next_segments() {
        let mut srq = srq(4);
        let terminator = seg(0, INVALID_LKEY, 0);
        for i in 0..4 {
            let want = [
                next_seg((i as u16 + 1) % 4),
                terminator.clone(),
                vec![0; 32],
            ]
            .concat();
            assert_eq!(wqe(&srq, i), want, "WQE {i} after init");
        }
        assert_eq!((srq.depth(), srq.slots()), (3, 4));
        let s = Sge {
            addr: 0xabcd,
            length: 64,
            lkey: 9,
        };
        // Three WQEs can be posted (one stays back as the list's tail).
        assert_eq!(srq.write_wqe(&[s, s]), Ok(Some(0)));
        assert_eq!(
            wqe(&srq, 0),
            [
                next_seg(1),
                seg(64, 9, 0xabcd).repeat(2),
                terminator.clone(),
            ]
            .concat()
        );
        assert_eq!(srq.write_wqe(&[s; 3]), Ok(Some(1)));
        assert_eq!(
            wqe(&srq, 1),
            [next_seg(2), seg(64, 9, 0xabcd).repeat(3)].concat()
        );
        assert_eq!(
            srq.write_wqe(&[s; 4]),
            Err(WqeError::TooManySges { given: 4, max: 3 })
        );
        assert_eq!(srq.write_wqe(&[]), Ok(Some(2)));
        assert_eq!(srq.write_wqe(&[]), Ok(None), "only the tail is left");
        srq.ring_doorbell();
        assert_eq!(srq.db.mem.read::<4>(0), Some([0, 0, 0, 3]));
        // Releasing WQE 1 links it after the tail (3) in the buffer.
        srq.release(1).unwrap();
        assert_eq!(&wqe(&srq, 3)[..16], next_seg(1));
        assert_eq!(srq.release(1), Err(WqeError::BadSlot { slot: 1, depth: 4 }));
        assert_eq!(srq.release(4), Err(WqeError::BadSlot { slot: 4, depth: 4 }));
        // ... and it is the next one posted.
        assert_eq!(srq.write_wqe(&[s]), Ok(Some(3)));
        assert_eq!(srq.write_wqe(&[]), Ok(None));
    }

    #[test]
    fn the_doorbell_counter_wraps_at_16_bits() {
        let mut srq = srq(2);
        for _ in 0..0x1_0001 {
            let slot = srq.write_wqe(&[]).unwrap().unwrap();
            srq.release(slot).unwrap();
        }
        srq.ring_doorbell();
        assert_eq!(srq.db.mem.read::<4>(0), Some([0, 0, 0, 1]));
    }
}

//! The receive queue (rdma-core `providers/mlx4/qp.c`): WQEs are arrays of data segments ended by
//! the invalid-lkey terminator; the producer counter goes to the doorbell record, with no MMIO.

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::queue::RecvQueue;
use portverbs_hal::wr::Sge;

use crate::dma::{Slot, WorkRing};
use crate::doorbell::DbRecord;
use zerocopy::transmute;

use super::sq::data_seg;
use crate::layout::wqe::{DataSeg, INVALID_LKEY};

/// Bytes of a data (scatter) segment, and the least a receive WQE holds: one entry.
pub(crate) const DATA_SEG: usize = size_of::<DataSeg>();

/// Writes a scatter list (with its terminator when shorter than `entries`) into `wqe` from
/// byte `at`, straight into the ring; returns the end. Nothing is written when the list is
/// longer than `entries`; callers size `entries` so that they fit the slot from `at` (a
/// segment past the slot's end would be dropped, never written outside it).
#[inline(always)]
pub(crate) fn scatter<const MIN: usize>(
    wqe: Slot<'_, MIN>,
    mut at: usize,
    sges: &[Sge],
    entries: usize,
) -> Result<usize, WqeError> {
    if sges.len() > entries {
        return Err(WqeError::TooManySges {
            given: sges.len(),
            max: entries as u32,
        });
    }
    for s in sges {
        let _ = wqe.put_at(at, data_seg(s));
        at += DATA_SEG;
    }
    if sges.len() < entries {
        let end: [u8; DATA_SEG] = transmute!(DataSeg {
            lkey: INVALID_LKEY.into(),
            ..DataSeg::default()
        });
        let _ = wqe.put_at(at, end);
        at += DATA_SEG;
    }
    Ok(at)
}

/// Host side of a QP's receive queue.
#[derive(Debug)]
pub struct Mlx4Rq {
    /// The WQE ring (slots of whole data segments, geometry checked when the QP was made; no
    /// owner bit: the doorbell record alone passes WQEs). Its producer counter is verbs-core's.
    pub(crate) buf: WorkRing<DATA_SEG>,
    pub(crate) max_sge: u32,
    pub(crate) db: DbRecord,
}

impl RecvQueue for Mlx4Rq {
    fn depth(&self) -> u32 {
        self.buf.geom().cnt
    }

    fn max_sge(&self) -> u32 {
        self.max_sge
    }

    fn write_wqe(&mut self, counter: u32, sges: &[Sge]) -> Result<(), WqeError> {
        if sges.len() > self.max_sge as usize {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        let wqe = self.buf.at(counter);
        scatter(wqe, 0, sges, wqe.len() / DATA_SEG)?;
        Ok(())
    }

    fn ring_doorbell(&mut self, head: u32) {
        barrier::to_device();
        self.db.store_be32(0, head & 0xffff);
    }

    fn reset(&mut self) {
        self.db.store_be32(0, 0);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::layout::wqe::INLINE_SEG;

    use std::sync::Arc;

    use portverbs_dma::SoftDma;

    use crate::dma::{HostMapped, Ring, Slots};
    use crate::queues::Geometry;

    /// A zeroed ring of `bytes` bytes.
    pub(crate) fn ring(bytes: usize) -> Ring {
        Ring::new(SoftDma::alloc(bytes).unwrap() as Arc<dyn HostMapped>)
    }

    /// The 16 bytes of a data segment as `struct mlx4_wqe_data_seg` lays it out (all big-endian).
    pub(crate) fn seg(count: u32, lkey: u32, addr: u64) -> Vec<u8> {
        [
            &count.to_be_bytes()[..],
            &lkey.to_be_bytes(),
            &addr.to_be_bytes(),
        ]
        .concat()
    }

    fn rq(cnt: u32, shift: u32) -> Mlx4Rq {
        let geom = Geometry {
            base: 0,
            shift,
            cnt,
        };
        Mlx4Rq {
            buf: WorkRing::new(Slots::new(ring(geom.bytes()), geom).unwrap()),
            max_sge: (geom.stride() / DATA_SEG) as u32,
            db: DbRecord::in_test_region(ring(8)),
        }
    }

    fn bytes(rq: &Mlx4Rq, counter: u32) -> Vec<u8> {
        let mut out = vec![0u8; rq.buf.geom().stride()];
        assert!(rq.buf.at(counter).read_at(0, &mut out));
        out
    }

    #[test]
    fn receive_wqes_are_scatter_lists_with_a_terminator_when_short() {
        // Two 64-byte WQEs of four entries each; counter 3 is slot 1.
        let mut rq = rq(2, 6);
        let a = Sge {
            addr: 0x1122_3344_5566_7788,
            length: 100,
            lkey: 7,
        };
        let empty = Sge {
            addr: 0x10,
            length: 0,
            lkey: 8,
        };
        rq.write_wqe(3, &[a, empty]).unwrap();
        let want = [
            seg(100, 7, 0x1122_3344_5566_7788),
            seg(INLINE_SEG, 8, 0x10),
            seg(0, INVALID_LKEY, 0),
            vec![0; 16],
        ]
        .concat();
        assert_eq!(bytes(&rq, 1), want);
        assert_eq!(bytes(&rq, 0), vec![0; 64], "other slots untouched");
        // A full list has no terminator.
        rq.write_wqe(0, &[a; 4]).unwrap();
        assert_eq!(bytes(&rq, 0), seg(100, 7, 0x1122_3344_5566_7788).repeat(4));
        // Too long a list is refused and nothing is written.
        assert_eq!(
            rq.write_wqe(1, &[empty; 5]),
            Err(WqeError::TooManySges { given: 5, max: 4 })
        );
        assert_eq!(bytes(&rq, 1), want);
        // The doorbell record takes the low 16 bits of the head, big-endian.
        rq.ring_doorbell(0x1_2345);
        assert_eq!(rq.db.mem.read::<4>(0), Some([0, 0, 0x23, 0x45]));
        rq.reset();
        assert_eq!(rq.db.mem.read::<4>(0), Some([0; 4]));
        assert_eq!(rq.depth(), 2);
    }

    #[test]
    fn a_one_entry_wqe_holds_exactly_one_segment() {
        let mut rq = rq(1, 4);
        rq.write_wqe(0, &[]).unwrap();
        assert_eq!(bytes(&rq, 0), seg(0, INVALID_LKEY, 0));
        let s = Sge {
            addr: 1,
            length: 2,
            lkey: 3,
        };
        rq.write_wqe(0, &[s]).unwrap();
        assert_eq!(bytes(&rq, 0), seg(2, 3, 1));
    }
}

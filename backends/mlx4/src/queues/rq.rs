//! The receive queue (facts §5.6): WQEs are arrays of data segments ended by the invalid-lkey
//! terminator; the producer counter goes to the doorbell record, with no MMIO.

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::queue::RecvQueue;
use portverbs_hal::wr::Sge;

use super::Geometry;
use crate::dma::Ring;
use crate::doorbell::DbRecord;
use crate::layout::wqe::{INLINE_SEG, INVALID_LKEY};

/// Writes a scatter list (with its terminator when shorter than `slots`) into `out`; returns
/// the bytes used.
pub(crate) fn scatter(out: &mut [u8], sges: &[Sge], slots: usize) -> Result<usize, WqeError> {
    if sges.len() > slots {
        return Err(WqeError::TooManySges {
            given: sges.len(),
            max: slots as u32,
        });
    }
    let mut at = 0;
    for s in sges {
        let count = if s.length == 0 { INLINE_SEG } else { s.length };
        out[at..at + 4].copy_from_slice(&count.to_be_bytes());
        out[at + 4..at + 8].copy_from_slice(&s.lkey.to_be_bytes());
        out[at + 8..at + 16].copy_from_slice(&s.addr.to_be_bytes());
        at += 16;
    }
    if sges.len() < slots {
        out[at..at + 16].fill(0);
        out[at + 4..at + 8].copy_from_slice(&INVALID_LKEY.to_be_bytes());
        at += 16;
    }
    Ok(at)
}

/// Host side of a QP's receive queue.
#[derive(Debug)]
pub struct Mlx4Rq {
    pub(crate) buf: Ring,
    pub(crate) geom: Geometry,
    pub(crate) max_sge: u32,
    pub(crate) db: DbRecord,
    pub(crate) scratch: Box<[u8]>,
}

impl RecvQueue for Mlx4Rq {
    fn depth(&self) -> u32 {
        self.geom.cnt
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
        let n = scatter(&mut self.scratch, sges, self.geom.stride() / 16)?;
        let _ = self
            .buf
            .write(self.geom.offset(counter), &self.scratch[..n]);
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

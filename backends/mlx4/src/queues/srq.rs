//! The shared receive queue (facts §5.7): WQEs start with a "next" segment, and free WQEs form a
//! list that software and the HCA both follow. The driver keeps its own copy of the links (it
//! never reads them back from DMA memory) and one WQE back as the list tail.

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::queue::SharedRecvQueue;
use portverbs_hal::wr::Sge;

use super::Geometry;
use super::rq::scatter;
use crate::dma::Ring;
use crate::doorbell::DbRecord;

/// Host side of an SRQ.
#[derive(Debug)]
pub struct Mlx4Srq {
    pub(crate) srqn: u32,
    pub(crate) buf: Ring,
    pub(crate) geom: Geometry,
    pub(crate) max_sge: u32,
    pub(crate) db: DbRecord,
    /// next[i] = the WQE after i in the free list.
    pub(crate) next: Box<[u16]>,
    pub(crate) head: u16,
    pub(crate) tail: u16,
    /// WQEs posted (the doorbell-record counter).
    pub(crate) counter: u16,
    /// Slots currently posted or owned by software between poll and release.
    pub(crate) in_use: Box<[bool]>,
    pub(crate) scratch: Box<[u8]>,
}

impl Mlx4Srq {
    /// Links every WQE to the next one (the last back to 0) and writes the links and empty
    /// scatter lists into the buffer.
    pub(crate) fn init(&mut self) {
        let cnt = self.geom.cnt;
        for i in 0..cnt {
            let next = ((i + 1) % cnt) as u16;
            self.next[i as usize] = next;
            let mut wqe = vec![0u8; self.geom.stride()];
            wqe[2..4].copy_from_slice(&next.to_be_bytes());
            let _ = scatter(&mut wqe[16..], &[], (self.geom.stride() - 16) / 16);
            let _ = self.buf.write(self.geom.offset(i), &wqe);
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
        self.geom.cnt - 1
    }

    fn slots(&self) -> u32 {
        self.geom.cnt
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
        let n = scatter(&mut self.scratch, sges, (self.geom.stride() - 16) / 16)?;
        if self.head == self.tail {
            return Ok(None);
        }
        let slot = self.head;
        self.head = self.next[usize::from(slot)];
        self.in_use[usize::from(slot)] = true;
        let _ = self
            .buf
            .write(self.geom.offset(u32::from(slot)) + 16, &self.scratch[..n]);
        self.counter = self.counter.wrapping_add(1);
        Ok(Some(u32::from(slot)))
    }

    fn ring_doorbell(&mut self) {
        barrier::to_device();
        self.db.store_be32(0, u32::from(self.counter));
    }

    fn release(&mut self, slot: u32) -> Result<(), WqeError> {
        let bad = WqeError::BadSlot {
            slot,
            depth: self.geom.cnt,
        };
        if slot >= self.geom.cnt || !self.in_use[slot as usize] {
            return Err(bad);
        }
        self.in_use[slot as usize] = false;
        let w = slot as u16;
        // Link w after the tail, in the buffer first (the HCA follows it), then locally.
        let tail_off = self.geom.offset(u32::from(self.tail));
        let _ = self.buf.write(tail_off + 2, &w.to_be_bytes());
        self.next[usize::from(self.tail)] = w;
        self.tail = w;
        if self.head == self.tail {
            // The list had only its tail: w is the next free WQE.
            self.head = w;
        }
        Ok(())
    }
}

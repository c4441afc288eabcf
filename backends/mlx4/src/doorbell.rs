//! Doorbell records in host memory (Linux `mlx4_db_alloc`, rdma-core `providers/mlx4/dbrec.c`):
//! 8-byte slots carved out of DMA pages, one per CQ (set_ci + arm), RQ or SRQ. The HCA reads them
//! at the bus address given in the context.

use std::sync::Mutex;

use portverbs_hal::error::CommandError;

use crate::dma::Ring;
use crate::pci::PciFunction;

const SLOTS_PER_PAGE: usize = 4096 / 8;

/// One record: a region and the offset of its 8 bytes.
#[derive(Debug, Clone)]
pub(crate) struct DbRecord {
    pub(crate) mem: Ring,
    pub(crate) offset: usize,
    page: usize,
}

impl DbRecord {
    /// Bus address of the record.
    pub(crate) fn bus_addr(&self) -> u64 {
        self.mem.mem().device_addr() + self.offset as u64
    }

    /// The record at byte 0 of `mem`, outside any allocator (unit tests of the queues).
    #[cfg(test)]
    pub(crate) fn in_test_region(mem: Ring) -> Self {
        Self {
            mem,
            offset: 0,
            page: 0,
        }
    }

    /// Stores a big-endian dword at `+at` (0 or 4).
    #[inline]
    pub(crate) fn store_be32(&self, at: usize, v: u32) {
        let _ = self.mem.store4(self.offset + at, v.to_be_bytes());
    }
}

/// A page of records and its free slots.
type Page = (Ring, Vec<usize>);

/// The allocator.
#[derive(Debug, Default)]
pub(crate) struct DbPages {
    pages: Mutex<Vec<Page>>,
}

impl DbPages {
    pub(crate) fn alloc(&self, pci: &dyn PciFunction) -> Result<DbRecord, CommandError> {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        for (page, (mem, free)) in pages.iter_mut().enumerate() {
            if let Some(slot) = free.pop() {
                mem.mem().fill(slot * 8, 8, 0)?;
                return Ok(DbRecord {
                    mem: mem.clone(),
                    offset: slot * 8,
                    page,
                });
            }
        }
        let mem = pci.alloc_dma(4096)?;
        mem.fill(0, 4096, 0)?;
        let mem = Ring::new(mem);
        let mut free: Vec<usize> = (1..SLOTS_PER_PAGE).rev().collect();
        free.shrink_to_fit();
        pages.push((mem.clone(), free));
        Ok(DbRecord {
            mem,
            offset: 0,
            page: pages.len() - 1,
        })
    }

    pub(crate) fn free(&self, rec: &DbRecord) {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, free)) = pages.get_mut(rec.page) {
            free.push(rec.offset / 8);
        }
    }
}

//! How the device side reaches memory: [`Buf`], a checked window onto one DMA region (queue
//! buffers, doorbell records, mailboxes), and [`Icm`], the ICM-virtual → bus page map that
//! MAP_ICM builds, through which contexts and MTT entries are read and written.
//!
//! Every access is bounds-checked and returns `false`/`None` instead of panicking.

use std::collections::HashMap;
use std::sync::Arc;

use portverbs_dma::SoftDma;
use portverbs_hal::dma::DmaMemory;

use crate::iova::{IovaTable, PAGE};

/// Most pages one MAP_ICM chunk may map (1 GiB).
const MAX_MAP_PAGES: u64 = 1 << 18;

/// `len` bytes at `off` of one DMA region.
#[derive(Debug, Clone)]
pub(crate) struct Buf {
    pub(crate) mem: Arc<SoftDma>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Buf {
    /// Resolves `len` bytes at bus address `bus`.
    pub(crate) fn at(iova: &IovaTable, bus: u64, len: usize) -> Option<Self> {
        let (mem, off) = iova.translate(bus, len as u64)?;
        Some(Self { mem, off, len })
    }

    /// The sub-window `at..at + len`.
    pub(crate) fn sub(&self, at: usize, len: usize) -> Option<Self> {
        let end = at.checked_add(len)?;
        (end <= self.len).then(|| Self {
            mem: self.mem.clone(),
            off: self.off + at,
            len,
        })
    }

    fn check(&self, at: usize, n: usize) -> Option<usize> {
        let end = at.checked_add(n)?;
        (end <= self.len).then_some(self.off + at)
    }

    pub(crate) fn read(&self, at: usize, out: &mut [u8]) -> bool {
        self.check(at, out.len())
            .is_some_and(|o| self.mem.read(o, out).is_ok())
    }

    pub(crate) fn write(&self, at: usize, data: &[u8]) -> bool {
        self.check(at, data.len())
            .is_some_and(|o| self.mem.write(o, data).is_ok())
    }

    pub(crate) fn store_u8(&self, at: usize, v: u8) -> bool {
        self.check(at, 1)
            .is_some_and(|o| self.mem.store_u8(o, v).is_ok())
    }

    /// A big-endian dword (atomic when aligned: doorbell records).
    pub(crate) fn be32(&self, at: usize) -> Option<u32> {
        let o = self.check(at, 4)?;
        if o % 4 == 0 {
            return self.mem.load_u32(o).ok().map(u32::from_be);
        }
        let mut b = [0u8; 4];
        self.mem.read(o, &mut b).ok()?;
        Some(u32::from_be_bytes(b))
    }

    pub(crate) fn vec(&self, at: usize, n: usize) -> Option<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.read(at, &mut v).then_some(v)
    }
}

/// The ICM map: ICM virtual page → bus address of its 4 KiB page.
#[derive(Debug, Default)]
pub(crate) struct Icm {
    pages: HashMap<u64, u64>,
}

impl Icm {
    /// Mapped pages.
    pub(crate) fn pages(&self) -> usize {
        self.pages.len()
    }

    pub(crate) fn clear(&mut self) {
        self.pages.clear();
    }

    pub(crate) fn is_mapped(&self, virt: u64) -> bool {
        self.pages.contains_key(&(virt / PAGE))
    }

    /// Maps `bytes` of ICM at `virt` to bus `bus` (both page aligned). False when a page is
    /// already mapped (nothing changes then).
    pub(crate) fn map(&mut self, virt: u64, bus: u64, bytes: u64) -> bool {
        let first = virt / PAGE;
        let n = bytes / PAGE;
        // A chunk larger than the model will ever back (1 GiB) is refused before any page is
        // looked at: a hostile page list must not make the device loop for hours.
        if n > MAX_MAP_PAGES || first.checked_add(n).is_none() {
            return false;
        }
        if (0..n).any(|i| self.pages.contains_key(&(first + i))) {
            return false;
        }
        for i in 0..n {
            self.pages.insert(first + i, bus + i * PAGE);
        }
        true
    }

    /// Unmaps `pages` pages at `virt`; returns how many were mapped.
    pub(crate) fn unmap(&mut self, virt: u64, pages: u64) -> u64 {
        let first = virt / PAGE;
        let end = first.saturating_add(pages);
        // Walk whichever is smaller: the range asked for, or the pages actually mapped (an
        // UNMAP_ICM of 2^32 pages must not take 2^32 steps).
        if pages > self.pages.len() as u64 {
            let before = self.pages.len();
            self.pages.retain(|&p, _| p < first || p >= end);
            return (before - self.pages.len()) as u64;
        }
        (0..pages)
            .filter(|i| self.pages.remove(&(first + i)).is_some())
            .count() as u64
    }

    fn each_page(
        &self,
        iova: &IovaTable,
        virt: u64,
        len: usize,
        mut f: impl FnMut(&SoftDma, usize, std::ops::Range<usize>) -> bool,
    ) -> bool {
        let mut done = 0usize;
        while done < len {
            let v = virt + done as u64;
            let in_page = (PAGE - v % PAGE) as usize;
            let n = in_page.min(len - done);
            let Some(&bus) = self.pages.get(&(v / PAGE)) else {
                return false;
            };
            let Some((mem, off)) = iova.translate(bus + v % PAGE, n as u64) else {
                return false;
            };
            if !f(&mem, off, done..done + n) {
                return false;
            }
            done += n;
        }
        true
    }

    /// Reads ICM bytes; false when a page is not mapped (or its memory is gone).
    pub(crate) fn read(&self, iova: &IovaTable, virt: u64, out: &mut [u8]) -> bool {
        let len = out.len();
        self.each_page(iova, virt, len, |mem, off, r| {
            mem.read(off, &mut out[r]).is_ok()
        })
    }

    /// Writes ICM bytes; false when a page is not mapped.
    pub(crate) fn write(&self, iova: &IovaTable, virt: u64, data: &[u8]) -> bool {
        self.each_page(iova, virt, data.len(), |mem, off, r| {
            mem.write(off, &data[r]).is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icm_reads_and_writes_across_pages_and_refuses_holes() {
        let iova = Arc::new(IovaTable::default());
        let a = iova.alloc(8192).unwrap();
        let mut icm = Icm::default();
        assert!(icm.map(0x10_000, a.device_addr(), 8192));
        assert!(!icm.map(0x11_000, a.device_addr(), 4096), "already mapped");
        assert_eq!(icm.pages(), 2);
        assert!(icm.write(&iova, 0x10_ffc, &[1, 2, 3, 4, 5, 6, 7, 8]));
        let mut b = [0u8; 8];
        a.read(0xffc, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(icm.read(&iova, 0x10_ffc, &mut b));
        assert!(
            !icm.read(&iova, 0x11_ffc, &mut b),
            "runs into an unmapped page"
        );
        assert_eq!(icm.unmap(0x10_000, 4), 2);
        assert!(!icm.read(&iova, 0x10_000, &mut b));
    }

    #[test]
    fn bufs_check_bounds() {
        let iova = Arc::new(IovaTable::default());
        let a = iova.alloc(4096).unwrap();
        let b = Buf::at(&iova, a.device_addr() + 64, 128).unwrap();
        assert!(b.write(124, &[0, 0, 0, 7]));
        assert_eq!(b.be32(124), Some(7));
        assert!(!b.write(125, &[0; 4]));
        assert!(b.sub(64, 64).is_some() && b.sub(65, 64).is_none());
        assert!(Buf::at(&iova, a.device_addr() + 4000, 128).is_none());
    }
}

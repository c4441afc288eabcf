//! The model's IOMMU: DMA regions handed to the driver live at bus addresses (IOVAs) that are
//! deliberately unlike their host addresses, and every device access to memory is translated
//! through this table. An address the table does not know, or a range that runs off the end of
//! its region, is refused — the caller turns that into a command status or a QP/CQ error, never
//! a panic.
//!
//! Bus addresses start at [`IOVA_BASE`], are never reused, are naturally aligned to the region's
//! size rounded up to a power of two (up to 1 GiB, so a driver can describe a region as one
//! MAP_ICM chunk), and are separated by an unmapped guard page.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use portverbs_dma::SoftDma;
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};

/// First bus address handed out (far from any host heap address).
pub(crate) const IOVA_BASE: u64 = 0x1_0000_0000;
/// Largest alignment given to a region.
const MAX_ALIGN: u64 = 1 << 30;
/// DMA page.
pub(crate) const PAGE: u64 = 4096;

#[derive(Debug)]
struct Region {
    len: u64,
    mem: Arc<SoftDma>,
}

#[derive(Debug)]
struct Map {
    regions: BTreeMap<u64, Region>,
    next: u64,
}

/// Bus address → region.
#[derive(Debug)]
pub(crate) struct IovaTable {
    map: Mutex<Map>,
}

impl Default for IovaTable {
    fn default() -> Self {
        Self {
            map: Mutex::new(Map {
                regions: BTreeMap::new(),
                next: IOVA_BASE,
            }),
        }
    }
}

impl IovaTable {
    fn lock(&self) -> MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates a zeroed region of `len` bytes rounded up to pages and maps it.
    pub(crate) fn alloc(self: &Arc<Self>, len: usize) -> Result<Arc<ModelDma>, DmaError> {
        let size = (len.max(1) as u64).div_ceil(PAGE) * PAGE;
        let bytes = usize::try_from(size).map_err(|_| DmaError::AllocFailed {
            len,
            reason: "larger than the address space".into(),
        })?;
        let mem = SoftDma::alloc(bytes)?;
        let align = size.next_power_of_two().clamp(PAGE, MAX_ALIGN);
        let bus = {
            let mut map = self.lock();
            let bus = map.next.next_multiple_of(align);
            map.next = bus + size + PAGE;
            map.regions.insert(
                bus,
                Region {
                    len: size,
                    mem: mem.clone(),
                },
            );
            bus
        };
        Ok(Arc::new(ModelDma {
            mem,
            bus,
            table: self.clone(),
        }))
    }

    /// Maps memory the application owns. Its bus address keeps the memory's offset in its
    /// page (the driver's MTT entries describe whole pages), and the region covers exactly the
    /// memory: the rest of its first and last pages is not reachable.
    pub(crate) fn map_host(
        self: &Arc<Self>,
        memory: HostMemory,
    ) -> Result<Arc<HostDma>, MapHostError> {
        let in_page = memory.addr() as u64 % PAGE;
        let size = (in_page + memory.len() as u64).div_ceil(PAGE).max(1) * PAGE;
        let mem = SoftDma::from_host(memory, None)?;
        let align = size.next_power_of_two().clamp(PAGE, MAX_ALIGN);
        let bus = {
            let mut map = self.lock();
            let page = map.next.next_multiple_of(align);
            map.next = page + size + PAGE;
            let bus = page + in_page;
            map.regions.insert(
                bus,
                Region {
                    len: mem.len() as u64,
                    mem: mem.clone(),
                },
            );
            bus
        };
        Ok(Arc::new(HostDma(ModelDma {
            mem,
            bus,
            table: self.clone(),
        })))
    }

    /// The region and offset behind `len` bytes at bus address `bus`, if they lie in one region.
    pub(crate) fn translate(&self, bus: u64, len: u64) -> Option<(Arc<SoftDma>, usize)> {
        let map = self.lock();
        let (&start, region) = map.regions.range(..=bus).next_back()?;
        let off = bus - start;
        let end = off.checked_add(len)?;
        if end > region.len {
            return None;
        }
        Some((region.mem.clone(), usize::try_from(off).ok()?))
    }

    /// Mapped regions.
    pub(crate) fn count(&self) -> usize {
        self.lock().regions.len()
    }

    fn unmap(&self, bus: u64) {
        self.lock().regions.remove(&bus);
    }
}

/// A DMA region of the model: host memory with a bus address of its own. Dropping the last
/// handle unmaps it (later device accesses to its bus range fail).
#[derive(Debug)]
pub(crate) struct ModelDma {
    mem: Arc<SoftDma>,
    bus: u64,
    table: Arc<IovaTable>,
}

impl Drop for ModelDma {
    fn drop(&mut self) {
        self.table.unmap(self.bus);
    }
}

// SAFETY: a ModelDma owns (through its Arc) a SoftDma: one page-aligned heap allocation of
// `len()` bytes at `host_addr()`, freed only when the last owner drops, that SoftDma and the
// emulated HCA reach only through raw copies and atomics.
#[allow(unsafe_code)]
unsafe impl portverbs_dma::HostMapped for ModelDma {}

/// Application memory mapped into the model's IOMMU ([`IovaTable::map_host`]). Not
/// [`portverbs_dma::HostMapped`]: the driver never makes rings of it (it need not be aligned).
#[derive(Debug)]
pub(crate) struct HostDma(ModelDma);

impl DmaMemory for HostDma {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn host_addr(&self) -> u64 {
        self.0.host_addr()
    }

    fn device_addr(&self) -> u64 {
        self.0.device_addr()
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.0.read(offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.0.write(offset, src)
    }

    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        self.0.fill(offset, len, byte)
    }

    fn load_u64(&self, offset: usize) -> Result<u64, DmaError> {
        self.0.load_u64(offset)
    }

    fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError> {
        self.0.store_u64(offset, value)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn is_host(&self) -> bool {
        true
    }

    fn owns_host(&self) -> bool {
        self.0.mem.owns_host()
    }

    fn into_host(self: Arc<Self>) -> Option<HostMemory> {
        let Self(region) = Arc::into_inner(self)?;
        let mem = region.mem.clone();
        // Unmaps the bus range (and drops the table's handle on the memory).
        drop(region);
        mem.take_host()
    }
}

impl DmaMemory for ModelDma {
    fn len(&self) -> usize {
        self.mem.len()
    }

    fn host_addr(&self) -> u64 {
        self.mem.host_addr()
    }

    fn device_addr(&self) -> u64 {
        self.bus
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.mem.read(offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.mem.write(offset, src)
    }

    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        self.mem.fill(offset, len, byte)
    }

    fn load_u64(&self, offset: usize) -> Result<u64, DmaError> {
        self.mem.load_u64(offset)
    }

    fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError> {
        self.mem.store_u64(offset, value)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_get_aligned_bus_addresses_unlike_host_ones() {
        let t = Arc::new(IovaTable::default());
        let a = t.alloc(100).unwrap();
        let b = t.alloc(256 * 1024).unwrap();
        assert_eq!(a.len(), 4096, "rounded to a page");
        assert!(a.device_addr() >= IOVA_BASE);
        assert_ne!(a.device_addr(), a.host_addr());
        assert_eq!(b.device_addr() % (256 * 1024), 0, "naturally aligned");
        assert_eq!(t.count(), 2);
        let (mem, off) = t.translate(b.device_addr() + 8, 16).unwrap();
        assert_eq!((mem.host_addr(), off), (b.host_addr(), 8));
        assert!(
            t.translate(a.device_addr() + 4090, 8).is_none(),
            "runs off the end"
        );
        assert!(
            t.translate(a.device_addr() + 4096, 1).is_none(),
            "guard page"
        );
        assert!(t.translate(0x1000, 8).is_none());
        let bus = a.device_addr();
        drop(a);
        assert!(t.translate(bus, 8).is_none(), "unmapped when dropped");
        assert_eq!(t.count(), 1);
    }

    #[test]
    fn host_memory_keeps_its_page_offset_and_comes_back() {
        let t = Arc::new(IovaTable::default());
        let mut v = vec![0u8; 5000];
        v[100] = 7;
        let addr = v.as_ptr() as u64;
        let mut memory = HostMemory::from(v);
        // An odd start inside the buffer, as an application's own allocation may have.
        let r = t.map_host(memory).unwrap();
        assert_eq!(r.host_addr(), addr);
        assert_eq!(
            r.device_addr() % PAGE,
            addr % PAGE,
            "the page offset is kept"
        );
        let (mem, off) = t.translate(r.device_addr() + 100, 1).unwrap();
        assert_eq!((mem.host_addr(), off), (addr, 100));
        drop(mem);
        assert!(
            t.translate(r.device_addr() + 5000, 1).is_none(),
            "past its end"
        );
        assert!(
            t.translate(r.device_addr() - 1, 1).is_none(),
            "before its start"
        );
        r.write(101, &[9]).unwrap();
        let bus = r.device_addr();
        memory = (r as Arc<dyn DmaMemory>)
            .into_host()
            .expect("the last handle");
        assert!(t.translate(bus, 1).is_none(), "unmapped");
        let v = memory.into_vec().unwrap();
        assert_eq!((v.len(), v[100], v[101]), (5000, 7, 9));
    }
}

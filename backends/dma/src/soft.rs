//! Host memory that the software device treats as DMA-visible: queue rings, doorbell records and
//! registered buffers.
//!
//! A [`SoftDma`] owns a zeroed,
//! page-aligned heap allocation — or memory the application handed over ([`SoftDma::from_host`],
//! a [`HostMemory`], whose contract says the same thing) — and never hands out a Rust reference
//! into it: every access is a
//! raw-pointer copy or an atomic operation, because the "device" (the engine, possibly on another
//! thread) and the application access the same bytes concurrently, exactly as a real HCA and its
//! driver do. Synchronisation between the two sides goes through the atomic accessors (owner
//! bytes, doorbell records) with acquire/release ordering; bulk payload copies are plain
//! raw-pointer copies, ordered by those atomics. Every access goes through the region's
//! [`RawRegion`]; the `unsafe` here is allocation, freeing and the promise made to it. An application that touches a
//! buffer while the device is using it (a programming error in any RDMA API) sees torn data but
//! never makes the process unsound through a reference.

#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory};

use crate::RawRegion;

/// Alignment of every region (a page, as for real DMA memory).
pub const DMA_ALIGN: usize = 4096;

/// Where a region's bytes come from.
#[derive(Debug)]
enum Storage {
    /// Allocated here with this layout (freed on drop).
    Allocated(Layout),
    /// The application's memory, kept until the region drops or gives it back.
    Host(Option<HostMemory>),
}

/// A software "DMA" region. See the module documentation.
#[derive(Debug)]
pub struct SoftDma {
    /// The bytes (allocated here, or the application's).
    raw: RawRegion,
    storage: Storage,
    /// Count of live regions of the owning device (resource accounting).
    tracker: Option<Arc<AtomicUsize>>,
}

impl SoftDma {
    /// Allocates `len` zeroed bytes (at least one page is reserved, so a zero-length region still
    /// has a valid, unique address).
    ///
    /// # Errors
    /// [`DmaError::AllocFailed`] when the allocator refuses.
    pub fn alloc(len: usize) -> Result<Arc<Self>, DmaError> {
        Self::alloc_tracked(len, None)
    }

    /// Like [`SoftDma::alloc`], counting the region in `tracker` while it lives.
    ///
    /// # Errors
    /// [`DmaError::AllocFailed`] when the allocator refuses.
    pub fn alloc_tracked(
        len: usize,
        tracker: Option<Arc<AtomicUsize>>,
    ) -> Result<Arc<Self>, DmaError> {
        let size = len.max(1).next_multiple_of(DMA_ALIGN);
        let layout =
            Layout::from_size_align(size, DMA_ALIGN).map_err(|e| DmaError::AllocFailed {
                len,
                reason: e.to_string(),
            })?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| DmaError::AllocFailed {
            len,
            reason: "the allocator returned no memory".into(),
        })?;
        if let Some(t) = &tracker {
            t.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Arc::new(Self {
            // SAFETY: a fresh allocation of `size >= len` bytes owned by the value, freed only
            // in `Drop`; no reference into it is ever made.
            raw: unsafe { RawRegion::new(ptr.as_ptr(), len) },
            storage: Storage::Allocated(layout),
            tracker,
        }))
    }

    /// A region over memory the application owns: its bytes are the memory's own (no copy),
    /// its address is the memory's address. [`DmaMemory::into_host`] gives it back.
    ///
    /// # Errors
    /// A null address (only possible for empty memory given by raw parts); the memory comes
    /// back.
    pub fn from_host(
        memory: HostMemory,
        tracker: Option<Arc<AtomicUsize>>,
    ) -> Result<Arc<Self>, portverbs_hal::dma::MapHostError> {
        let Some(ptr) = NonNull::new(memory.addr() as *mut u8) else {
            return Err(portverbs_hal::dma::MapHostError {
                error: DmaError::AllocFailed {
                    len: memory.len(),
                    reason: "host memory at address 0".into(),
                },
                memory,
            });
        };
        if let Some(t) = &tracker {
            t.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Arc::new(Self {
            // SAFETY: `HostMemory`'s contract: the memory stays valid, unmoved and reached only
            // through the region's raw copies until the region drops or gives it back.
            raw: unsafe { RawRegion::new(ptr.as_ptr(), memory.len()) },
            storage: Storage::Host(Some(memory)),
            tracker,
        }))
    }

    /// For a region made by [`SoftDma::from_host`] and held by its last handle: the memory
    /// back (the region is gone). `None` otherwise (the region, if this was the last handle,
    /// is dropped and the memory with it).
    pub fn take_host(self: Arc<Self>) -> Option<HostMemory> {
        let mut region = Arc::into_inner(self)?;
        match &mut region.storage {
            Storage::Host(memory) => memory.take(),
            Storage::Allocated(_) => None,
        }
    }

    /// Raw access to the region's bytes.
    #[inline(always)]
    pub fn raw(&self) -> RawRegion {
        self.raw
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off` (regions may be the same
    /// and the ranges may overlap).
    ///
    /// # Errors
    /// Either range outside its region.
    #[inline]
    pub fn copy(
        src: &Self,
        src_off: usize,
        dst: &Self,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DmaError> {
        RawRegion::copy(&src.raw, src_off, &dst.raw, dst_off, len)
    }

    /// Atomically loads a byte (acquire): owner bytes of ring entries.
    ///
    /// # Errors
    /// Out of bounds.
    #[inline(always)]
    pub fn load_u8(&self, offset: usize) -> Result<u8, DmaError> {
        self.raw.load_u8(offset)
    }

    /// Atomically stores a byte (release): publishes a ring entry written before it.
    ///
    /// # Errors
    /// Out of bounds.
    #[inline(always)]
    pub fn store_u8(&self, offset: usize, value: u8) -> Result<(), DmaError> {
        self.raw.store_u8(offset, value)
    }

    /// Atomically loads a naturally aligned `u32` (acquire): doorbell records.
    ///
    /// # Errors
    /// Out of bounds or misaligned.
    #[inline(always)]
    pub fn load_u32(&self, offset: usize) -> Result<u32, DmaError> {
        self.raw.load_u32(offset)
    }

    /// Atomically stores a naturally aligned `u32` (release).
    ///
    /// # Errors
    /// Out of bounds or misaligned.
    #[inline(always)]
    pub fn store_u32(&self, offset: usize, value: u32) -> Result<(), DmaError> {
        self.raw.store_u32(offset, value)
    }

    /// 64-bit compare-and-swap on native-endian memory; returns the original value
    /// (an IB CMP_AND_SWP executed by the responder).
    ///
    /// # Errors
    /// Out of bounds or misaligned.
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, DmaError> {
        self.raw.compare_swap_u64(offset, compare, swap)
    }

    /// 64-bit fetch-and-add on native-endian memory; returns the original value.
    ///
    /// # Errors
    /// Out of bounds or misaligned.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, DmaError> {
        self.raw.fetch_add_u64(offset, add)
    }
}

impl Drop for SoftDma {
    fn drop(&mut self) {
        if let Some(t) = &self.tracker {
            t.fetch_sub(1, Ordering::Relaxed);
        }
        if let Storage::Allocated(layout) = self.storage {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout and is
            // freed once.
            unsafe { alloc::dealloc(self.raw.base() as *mut u8, layout) };
        }
        // Host memory is the application's: an owned buffer drops with `storage`, memory given
        // by raw parts stays where it is.
    }
}

// SAFETY: the bytes are a heap allocation owned by the value (freed in `Drop`), or application
// memory whose `HostMemory` contract keeps it valid, unmoved and unreferenced until the region
// drops or gives it back (`take_host` needs the last handle, so no ring made of it is left);
// the region's own accessors use only raw copies and atomics.
unsafe impl crate::HostMapped for SoftDma {}

impl DmaMemory for SoftDma {
    crate::raw_accessors!(raw);

    fn device_addr(&self) -> u64 {
        // The software device has no IOMMU: bus address = host address.
        self.host_addr()
    }

    fn into_host(self: Arc<Self>) -> Option<HostMemory> {
        self.take_host()
    }

    fn is_host(&self) -> bool {
        matches!(self.storage, Storage::Host(_))
    }

    fn owns_host(&self) -> bool {
        matches!(&self.storage, Storage::Host(Some(m)) if m.is_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_page_aligned_and_bounded() {
        let r = SoftDma::alloc(100).unwrap();
        assert_eq!(r.len(), 100);
        assert_eq!(r.host_addr() % DMA_ALIGN as u64, 0);
        let mut buf = [0xaau8; 100];
        r.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert!(matches!(
            r.read(1, &mut buf),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(r.write(99, &[1, 2]).is_err());
    }

    #[test]
    fn copy_between_and_within_regions() {
        let a = SoftDma::alloc(64).unwrap();
        let b = SoftDma::alloc(64).unwrap();
        a.write(0, b"hello world").unwrap();
        SoftDma::copy(&a, 0, &b, 10, 11).unwrap();
        let mut out = [0u8; 11];
        b.read(10, &mut out).unwrap();
        assert_eq!(&out, b"hello world");
        SoftDma::copy(&a, 0, &a, 2, 11).unwrap(); // overlapping
        let mut out = [0u8; 13];
        a.read(0, &mut out).unwrap();
        assert_eq!(&out, b"hehello world");
        assert!(SoftDma::copy(&a, 60, &b, 0, 8).is_err());
    }

    #[test]
    fn atomics_check_alignment_and_return_originals() {
        let r = SoftDma::alloc(64).unwrap();
        r.store_u64(8, 5).unwrap();
        assert_eq!(r.compare_swap_u64(8, 5, 9).unwrap(), 5);
        assert_eq!(r.load_u64(8).unwrap(), 9);
        assert_eq!(
            r.compare_swap_u64(8, 5, 1).unwrap(),
            9,
            "unequal compare leaves memory"
        );
        assert_eq!(r.fetch_add_u64(8, 3).unwrap(), 9);
        assert_eq!(r.load_u64(8).unwrap(), 12);
        assert!(matches!(
            r.fetch_add_u64(4, 1),
            Err(DmaError::Misaligned { .. })
        ));
        assert!(r.load_u32(62).is_err());
        r.store_u32(60, 0xdead_beef).unwrap();
        assert_eq!(r.load_u32(60).unwrap(), 0xdead_beef);
    }

    #[test]
    fn host_memory_is_used_in_place_and_given_back() {
        let mut v = vec![0u8; 64];
        v[0] = 1;
        let addr = v.as_ptr() as u64;
        let region = SoftDma::from_host(HostMemory::from(v), None).unwrap();
        assert_eq!((region.host_addr(), region.len()), (addr, 64));
        assert!(region.is_host() && region.owns_host());
        region.write(1, &[2, 3]).unwrap();
        let other = region.clone();
        assert!(other.take_host().is_none(), "not the last handle");
        let v = region.take_host().unwrap().into_vec().unwrap();
        assert_eq!(&v[..3], &[1, 2, 3]);
    }

    #[test]
    fn atomics_check_the_address_not_the_offset() {
        // 8-aligned offsets of a region that starts 4 bytes into an aligned block.
        let mut bytes = vec![0u8; 64];
        let base = bytes.as_mut_ptr() as usize;
        let skew = (8 - base % 8) % 8 + 4;
        // SAFETY: `bytes` outlives `region` and is not touched while it lives.
        let memory = unsafe { HostMemory::from_raw_parts(bytes.as_mut_ptr().add(skew), 32) };
        let region = SoftDma::from_host(memory, None).unwrap();
        assert!(matches!(
            region.load_u64(0),
            Err(DmaError::Misaligned { .. })
        ));
        assert!(
            region.load_u64(4).is_ok(),
            "offset 4 is an aligned address here"
        );
        drop(region);
        drop(bytes);
    }
}

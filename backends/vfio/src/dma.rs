//! DMA memory for a VFIO device: anonymous, page-aligned, zeroed memory that the IOMMU maps at
//! an IOVA from the device's allocator, implementing the HAL's [`DmaMemory`] — or the
//! application's own memory ([`VfioDevice::map_host`], a [`HostMemory`]), whose pages the IOMMU
//! maps the same way, its offset in its first page kept in the device address.
//!
//! `VFIO_IOMMU_MAP_DMA` pins the pages (charging them to `RLIMIT_MEMLOCK`, checked first by
//! `memlock`) and lets the device read and write them at any time. So, as vfio-ioctls'
//! `vfio_dma_map` safety contract demands, no Rust reference to this memory ever exists: every
//! access is a raw-pointer copy or an atomic operation of the region's
//! [`portverbs_dma::RawRegion`] (the workspace's one implementation of DMA-region access), and
//! the mapping is only reachable through this module.
//!
//! A region is unmapped from the IOMMU before it is unmapped from the process: on drop, or
//! earlier with [`VfioDma::unmap`] (after which the device's accesses fault in the IOMMU and
//! the memory stays readable by the host). Its IOVA returns to the allocator only on drop, so a
//! stale device address never aliases a newer region.
//!
//! This is one of the three modules of the crate allowed `unsafe` (with `bar` and `sys`).
#![allow(unsafe_code)]

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use memmap2::{MmapOptions, MmapRaw};
use portverbs_dma::RawRegion;
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};

use crate::device::{DeviceInner, VfioDevice};
use crate::error::VfioError;
use crate::memlock::Memlock;

/// The memory behind a region.
pub trait Backing: Send + Sync + std::fmt::Debug + 'static {
    /// Host address of the first mapped IOMMU page.
    fn page_base(&self) -> *mut u8;

    /// The application's memory, if that is what it is.
    fn host(&self) -> Option<&HostMemory> {
        None
    }
}

/// Anonymous memory this crate mapped (zeroed, page aligned): queue rings and buffers a
/// backend allocates.
#[derive(Debug)]
pub struct Anon(MmapRaw);

impl Backing for Anon {
    fn page_base(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
}

/// The application's memory ([`HostMemory`]): the IOMMU maps the pages it lies in.
#[derive(Debug)]
pub struct Host {
    memory: HostMemory,
    page_base: usize,
}

impl Backing for Host {
    fn page_base(&self) -> *mut u8 {
        self.page_base as *mut u8
    }

    fn host(&self) -> Option<&HostMemory> {
        Some(&self.memory)
    }
}

/// One IOMMU-mapped DMA region. See the module documentation.
#[derive(Debug)]
pub struct VfioDma<B: Backing = Anon> {
    dev: Arc<DeviceInner>,
    backing: B,
    /// Offset of byte 0 in the first mapped page (0 for [`Anon`]).
    in_page: usize,
    /// Bytes mapped (whole IOMMU pages).
    mapped_len: u64,
    /// IOVA of the first mapped page.
    iova: u64,
    /// Still mapped in the IOMMU.
    mapped: Mutex<bool>,
    /// Byte 0 and the bytes asked for (what `len()` reports): every host access goes
    /// through it.
    raw: RawRegion,
}

impl VfioDevice {
    /// Allocates `len` bytes of zeroed DMA memory mapped for this device (the HAL's form).
    ///
    /// # Errors
    /// [`DmaError::AllocFailed`] whose reason is the [`VfioError`] text (IOVA space, locked
    /// memory limit, mmap or `VFIO_IOMMU_MAP_DMA`).
    pub fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError> {
        match self.alloc_vfio_dma(len) {
            Ok(region) => Ok(region),
            Err(e) => Err(DmaError::AllocFailed {
                len,
                reason: e.to_string(),
            }),
        }
    }

    /// Allocates `len` bytes of zeroed DMA memory mapped for this device and returns the
    /// concrete type (with [`VfioDma::iova`] and [`VfioDma::unmap`]).
    ///
    /// # Errors
    /// [`VfioError::IovaExhausted`], [`VfioError::MemlockLimit`], [`VfioError::DmaAlloc`] or
    /// [`VfioError::DmaMap`].
    pub fn alloc_vfio_dma(&self, len: usize) -> Result<Arc<VfioDma>, VfioError> {
        VfioDma::new(&self.inner, len).map(Arc::new)
    }

    /// Maps memory the application owns for this device (the HAL's `map_host`): the IOMMU
    /// pages it lies in, at an IOVA whose offset in its page is the memory's. The region keeps
    /// the memory until it drops or gives it back ([`DmaMemory::into_host`]).
    ///
    /// # Errors
    /// IOVA space, the locked-memory limit or `VFIO_IOMMU_MAP_DMA`; the memory comes back.
    pub fn map_host(&self, memory: HostMemory) -> Result<Arc<VfioDma<Host>>, MapHostError> {
        VfioDma::map_host(&self.inner, memory).map(Arc::new)
    }
}

/// Reserves IOVA space for `len64` bytes (whole IOMMU pages); returns its start and size.
fn reserve(dev: &DeviceInner, len64: u64) -> Result<(u64, u64), VfioError> {
    let mut alloc = dev.iova();
    let exhausted = || VfioError::IovaExhausted {
        addr: dev.addr.clone(),
        len: len64,
    };
    let size = alloc.round(len64).ok_or_else(exhausted)?;
    let iova = alloc.alloc(size).ok_or_else(exhausted)?;
    Ok((iova, size))
}

impl VfioDma<Host> {
    fn map_host(dev: &Arc<DeviceInner>, memory: HostMemory) -> Result<Self, MapHostError> {
        let page = dev.iova().page() as usize;
        let addr = memory.addr();
        let page_base = addr - addr % page;
        let in_page = addr - page_base;
        let span = (in_page + memory.len()).max(1) as u64;
        let backing = Host { memory, page_base };
        Self::map(dev, backing, in_page, span).map_err(|(e, backing)| MapHostError {
            error: DmaError::AllocFailed {
                len: backing.memory.len(),
                reason: e.to_string(),
            },
            memory: backing.memory,
        })
    }
}

impl VfioDma<Anon> {
    fn new(dev: &Arc<DeviceInner>, len: usize) -> Result<Self, VfioError> {
        let len64 = len as u64;
        let size = dev
            .iova()
            .round(len64)
            .ok_or_else(|| VfioError::IovaExhausted {
                addr: dev.addr.clone(),
                len: len64,
            })?;
        let map_len = usize::try_from(size).map_err(|_| VfioError::IovaExhausted {
            addr: dev.addr.clone(),
            len: len64,
        })?;
        let map: MmapRaw = MmapOptions::new()
            .len(map_len)
            .map_anon()
            .map_err(|source| VfioError::DmaAlloc {
                addr: dev.addr.clone(),
                len: size,
                source,
            })?
            .into();
        Self::map(dev, Anon(map), 0, len64).map_err(|(e, _)| e)
    }
}

impl<B: Backing> VfioDma<B> {
    /// Maps the IOMMU pages of `backing` holding `span` bytes from its page base; on failure
    /// the backing comes back with the error.
    fn map(
        dev: &Arc<DeviceInner>,
        backing: B,
        in_page: usize,
        span: u64,
    ) -> Result<Self, (VfioError, B)> {
        let addr = || dev.addr.clone();
        let (iova, mapped_len) = match reserve(dev, span) {
            Ok(r) => r,
            Err(e) => return Err((e, backing)),
        };
        let give_back = |e: VfioError| {
            // NOTE: `iova` came from this allocator a moment ago, so the free cannot fail.
            let _ = dev.iova().free(iova);
            e
        };

        let memlock = Memlock::current();
        if let Err(short) = memlock.check(mapped_len) {
            let e = give_back(VfioError::MemlockLimit {
                addr: addr(),
                len: mapped_len,
                limit: short.limit,
                locked: short.locked,
            });
            return Err((e, backing));
        }
        let Ok(map_len) = usize::try_from(mapped_len) else {
            let e = give_back(VfioError::IovaExhausted {
                addr: addr(),
                len: span,
            });
            return Err((e, backing));
        };

        // SAFETY: `backing` holds `map_len` bytes from its page base for as long as the value
        // we are building lives — a fresh anonymous mapping it owns, or the pages of the
        // application's memory, whose `HostMemory` contract keeps them valid and reached only
        // through raw pointers and atomics until the region drops. No reference into them
        // exists (see the module documentation). They are unmapped from the IOMMU (in `Drop`,
        // or `unmap`) before `backing` is dropped, since it is a field of the value whose
        // `Drop` does the IOMMU unmap.
        let mapped = unsafe {
            dev.container
                .vfio_dma_map(iova, map_len, backing.page_base())
        };
        if let Err(source) = mapped {
            // ENOMEM from the pinning code means the locked-memory limit, whatever our check
            // thought (another thread may have locked memory meanwhile).
            let now = Memlock::current();
            let enomem = matches!(&source, vfio_ioctls::VfioError::IommuDmaMap(e)
                if e.errno() == rustix::io::Errno::NOMEM.raw_os_error());
            let err = match now.limit {
                Some(limit) if enomem && !now.cap_ipc_lock => VfioError::MemlockLimit {
                    addr: addr(),
                    len: mapped_len,
                    limit,
                    locked: now.locked,
                },
                _ => VfioError::DmaMap {
                    addr: addr(),
                    iova,
                    len: mapped_len,
                    source: source.into(),
                },
            };
            return Err((give_back(err), backing));
        }
        tracing::trace!(addr = %dev.addr, iova, len = mapped_len, "mapped DMA region");
        let len = span as usize - in_page;
        // SAFETY: `in_page + len == span <= map_len` bytes from the page base are the backing's
        // (see the SAFETY comment of the IOMMU map above): valid for reads and writes while the
        // value lives, which owns `backing`, and never covered by a reference.
        let raw = unsafe { RawRegion::new(backing.page_base().wrapping_add(in_page), len) };
        Ok(Self {
            dev: dev.clone(),
            backing,
            in_page,
            mapped_len,
            iova,
            mapped: Mutex::new(true),
            raw,
        })
    }

    /// The device address of byte 0 (also [`DmaMemory::device_addr`]).
    pub fn iova(&self) -> u64 {
        self.iova + self.in_page as u64
    }

    /// True until [`VfioDma::unmap`] (or drop) removed the IOMMU mapping.
    pub fn is_mapped(&self) -> bool {
        *self.mapped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes the IOMMU mapping now: from here on the device's accesses to this region's IOVAs
    /// fault, while the host can still read and write the memory. Idempotent.
    ///
    /// # Errors
    /// [`VfioError::DmaUnmap`]; the region then counts as still mapped.
    pub fn unmap(&self) -> Result<(), VfioError> {
        let mut mapped = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        if !*mapped {
            return Ok(());
        }
        let size = self.mapped_len as usize;
        self.dev
            .container
            .vfio_dma_unmap(self.iova, size)
            .map_err(|e| VfioError::DmaUnmap {
                addr: self.dev.addr.clone(),
                iova: self.iova,
                len: self.mapped_len,
                source: e.into(),
            })?;
        *mapped = false;
        Ok(())
    }
}

impl<B: Backing> Drop for VfioDma<B> {
    fn drop(&mut self) {
        if let Err(err) = self.unmap() {
            // The pages stay pinned by the kernel until the container closes, so the device
            // cannot reach memory that is reused; only the IOVA is lost.
            tracing::error!(%err, "dropping a DMA region whose IOMMU unmap failed; IOVA leaked");
            return;
        }
        if let Err(err) = self.dev.iova().free(self.iova) {
            tracing::error!(addr = %self.dev.addr, %err, "IOVA allocator out of step");
        }
        // `map` is munmapped after this, when the fields drop.
    }
}

// SAFETY: a VfioDma owns an anonymous shared mapping (`MmapRaw`) of at least `len()` bytes at
// `host_addr()`, page aligned, unmapped only when the value drops; its own accessors use raw
// copies and atomics. Unmapping it from the IOMMU leaves the host mapping in place.
unsafe impl portverbs_dma::HostMapped for VfioDma<Anon> {}

impl<B: Backing> DmaMemory for VfioDma<B> {
    portverbs_dma::raw_accessors!(raw);

    fn device_addr(&self) -> u64 {
        self.iova()
    }

    fn is_host(&self) -> bool {
        self.backing.host().is_some()
    }

    fn owns_host(&self) -> bool {
        self.backing.host().is_some_and(HostMemory::is_owned)
    }

    fn into_host(self: Arc<Self>) -> Option<HostMemory> {
        let any: Arc<dyn Any + Send + Sync> = self;
        let host = any.downcast::<VfioDma<Host>>().ok()?;
        let mut region = Arc::into_inner(host)?;
        // The IOMMU mapping must go before the memory is handed back; if it cannot, the
        // memory stays with the region (pinned, never reused by the device's IOVA).
        region.unmap().ok()?;
        // An empty owned placeholder stays behind for the region's drop.
        Some(std::mem::replace(
            &mut region.backing.memory,
            HostMemory::from(Vec::new()),
        ))
    }
}

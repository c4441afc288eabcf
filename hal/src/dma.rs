//! DMA-visible memory: regions with a host address, a length and a device address (IOVA).
//!
//! A region is memory that a device may read or write at any moment. The rule of the whole
//! project (vfio-ioctls' `vfio_dma_map` safety contract) is that **no Rust reference
//! is ever made into it**: neither `&[u8]` nor `&mut T`. Instead, the backends implement this
//! trait on top of `portverbs_dma::RawRegion` (the workspace's one implementation of raw-pointer
//! copies and atomic loads/stores over DMA memory), and every other layer reaches the bytes
//! through [`DmaMemory::read`]/[`DmaMemory::write`] (copy out / copy in).
//!
//! Regions are allocated by the device that will use them ([`crate::device::LocalDevice::alloc_dma`]):
//! a VFIO backend must map them into the IOMMU, a software device just needs stable host memory.
//! A region handed to a device command must have been allocated by that same device; backends
//! find their own concrete type again through [`DmaMemory::as_any`] and refuse anything else with
//! [`DmaError::Foreign`].

use std::any::Any;
use std::fmt::{self, Debug};
use std::sync::Arc;

use thiserror::Error;

/// Failures of DMA memory operations.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DmaError {
    /// An access outside the region.
    #[error("access of {len} bytes at offset {offset} is outside a region of {region_len} bytes")]
    OutOfBounds {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Length of the region.
        region_len: usize,
    },
    /// An atomic access that is not naturally aligned.
    #[error("offset {offset} is not {align}-byte aligned")]
    Misaligned {
        /// Offset asked for.
        offset: usize,
        /// Required alignment.
        align: usize,
    },
    /// The allocation failed.
    #[error("cannot allocate {len} bytes of DMA memory: {reason}")]
    AllocFailed {
        /// Size asked for.
        len: usize,
        /// Why (e.g. "RLIMIT_MEMLOCK is 64 KiB; raise it with ulimit -l").
        reason: String,
    },
    /// The region was not allocated by the device it was handed to.
    #[error("the DMA region was allocated by another device")]
    Foreign,
}

/// A region of DMA-visible memory. See the module documentation for the access rules.
pub trait DmaMemory: Send + Sync + Debug + 'static {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Host virtual address of byte 0: the address work requests and memory keys use.
    fn host_addr(&self) -> u64;

    /// Device (bus / IOVA) address of byte 0.
    fn device_addr(&self) -> u64;

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] if the range is not inside the region.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError>;

    /// Copies `src` into the region at `offset`.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] if the range is not inside the region.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError>;

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] if the range is not inside the region.
    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError>;

    /// Atomically loads the naturally aligned native-endian `u64` at `offset` (acquire ordering).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    fn load_u64(&self, offset: usize) -> Result<u64, DmaError>;

    /// Atomically stores the naturally aligned native-endian `u64` at `offset` (release ordering).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError>;

    /// The concrete type, so that the allocating backend can find its own region again.
    fn as_any(&self) -> &dyn Any;

    /// Owned variant of [`DmaMemory::as_any`], for `Arc::downcast`.
    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;

    /// For a region made from application memory ([`crate::device::LocalDevice::map_host`]),
    /// held by its last handle: unmaps it and gives the memory back. `None` for a region the
    /// device allocated, or when other handles still exist (the memory then stays mapped until
    /// the last one drops).
    fn into_host(self: Arc<Self>) -> Option<HostMemory> {
        None
    }

    /// True for a region made from application memory ([`crate::device::LocalDevice::map_host`]).
    fn is_host(&self) -> bool {
        false
    }

    /// True for a region made from application memory it owns (a `Vec` or `Box`), false for
    /// memory given by raw parts or allocated by the device.
    fn owns_host(&self) -> bool {
        false
    }
}

/// Memory the application owns, handed to a device to use for DMA (the verbs' registration of
/// the application's own buffer, as `ibv_reg_mr` does): the device maps it
/// ([`crate::device::LocalDevice::map_host`]) — through the IOMMU where there is one — and the
/// mapped region keeps it until the region is dropped or gives it back
/// ([`DmaMemory::into_host`]).
///
/// Two kinds: memory the value owns (from a `Vec<u8>` or `Box<[u8]>`, safe: nobody else can
/// reach it while it is mapped, and [`HostMemory::into_vec`] returns it), and memory the caller
/// vouches for ([`HostMemory::from_raw_parts`], `unsafe`). Nothing here reads or writes the
/// bytes: the device's region does, with raw copies and atomics only (so `Debug` shows the
/// address and length, never the contents).
pub struct HostMemory {
    /// Address of byte 0. Kept as an integer: the bytes are reached only by the backends'
    /// `dma` modules, through raw pointers made from it.
    addr: usize,
    len: usize,
    /// The owned buffer (its heap block does not move when the `Vec` value moves); `None` for
    /// memory given by raw parts.
    owned: Option<Vec<u8>>,
}

impl HostMemory {
    /// Memory given by address and length, owned by the caller.
    ///
    /// # Safety
    /// From this call until the region the device makes of it is dropped (which deregisters
    /// every MR in it first), `addr..addr + len` must stay valid for reads and writes, must
    /// not be freed or moved, and must not be read or written by the application except
    /// through the region's own copy methods: the device may write any byte of it at any
    /// moment (received data, RDMA WRITEs and atomics from a peer that has the rkey) and read
    /// any byte (SENDs, RDMA READs by a peer). A Rust reference (`&[u8]`, `&mut [u8]`) to any
    /// of it during that time is undefined behaviour.
    #[allow(unsafe_code)]
    pub unsafe fn from_raw_parts(addr: *mut u8, len: usize) -> Self {
        Self {
            addr: addr as usize,
            len,
            owned: None,
        }
    }

    /// Address of byte 0.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for empty memory.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the value owns the memory (made from a `Vec` or a `Box`).
    pub fn is_owned(&self) -> bool {
        self.owned.is_some()
    }

    /// The owned buffer back, unchanged in length, holding whatever the device wrote; `None`
    /// for memory given by raw parts (the caller owns it already).
    pub fn into_vec(self) -> Option<Vec<u8>> {
        self.owned
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

impl From<Vec<u8>> for HostMemory {
    fn from(mut v: Vec<u8>) -> Self {
        Self {
            addr: v.as_mut_ptr() as usize,
            len: v.len(),
            owned: Some(v),
        }
    }
}

impl From<Box<[u8]>> for HostMemory {
    fn from(b: Box<[u8]>) -> Self {
        Self::from(b.into_vec())
    }
}

/// A device could not map host memory; the memory comes back with the reason.
#[derive(Debug, Error)]
#[error("{error}")]
pub struct MapHostError {
    /// Why.
    pub error: DmaError,
    /// The memory, unchanged.
    pub memory: HostMemory,
}

/// Checks that `offset..offset + len` lies inside a region of `region_len` bytes.
///
/// # Errors
/// [`DmaError::OutOfBounds`], also when the end overflows.
pub fn check_range(offset: usize, len: usize, region_len: usize) -> Result<(), DmaError> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(DmaError::OutOfBounds {
            offset,
            len,
            region_len,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_rejects_overflow_and_overrun() {
        assert!(check_range(0, 16, 16).is_ok());
        assert!(check_range(16, 0, 16).is_ok());
        assert!(check_range(1, 16, 16).is_err());
        assert!(check_range(usize::MAX, 2, 16).is_err());
    }
}

//! BAR access: the HAL's [`Mmio`] over a VFIO region, plus little-endian accessors for devices
//! whose registers are little-endian (NVMe, QEMU's `edu`; mlx4's are big-endian).
//!
//! A region is mmapped where VFIO allows it: the whole BAR when it has the MMAP flag and no
//! sparse-mmap capability, only the listed areas when it has one (older kernels cut the MSI-X
//! table out this way), nothing without the flag. Accesses inside a mapped area are single
//! volatile loads and stores through raw pointers — no Rust reference to device memory is ever
//! made. Accesses outside every area go to the region through `pread`/`pwrite` on the device
//! fd, which the kernel turns into the same-sized MMIO access.
//!
//! vfio-pci maps BARs uncached (it offers no write-combining mapping), so [`Mmio::write_wc`]
//! is a run of 64-bit stores followed by [`portverbs_hal::barrier::wc_flush`]: correct, but
//! without the burst a WC mapping gives BlueFlame on bare metal.
//!
//! This is one of the three modules of the crate allowed `unsafe` (with `dma` and `sys`).
#![allow(unsafe_code)]

use std::io;
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use portverbs_hal::barrier;
use portverbs_hal::mmio::{Mmio, MmioError, check_access};
use vfio_bindings::bindings::vfio::{
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_ioctls::VfioRegionInfoCap;

use crate::device::{DeviceInner, VfioDevice};
use crate::error::VfioError;
use crate::sys;

/// One mapped BAR. Keeps the opened device alive; unmapped when dropped.
#[derive(Debug)]
pub struct VfioBar {
    dev: Arc<DeviceInner>,
    index: u8,
    len: usize,
    /// Offset of the region in the device fd.
    file_offset: u64,
    flags: u32,
    areas: Vec<Area>,
}

/// One mmapped part of the BAR.
#[derive(Debug)]
struct Area {
    start: usize,
    len: usize,
    map: MmapRaw,
}

/// The parts of a region of `size` bytes that may be mmapped, as `(offset, len)` sorted by
/// offset: none without `VFIO_REGION_INFO_FLAG_MMAP`, the sparse areas when the region lists
/// them (those not inside the region are dropped), else the whole region.
pub(crate) fn mappable_areas(
    size: u64,
    flags: u32,
    sparse: Option<&[(u64, u64)]>,
) -> Vec<(u64, u64)> {
    if flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || size == 0 {
        return Vec::new();
    }
    let mut areas: Vec<(u64, u64)> = match sparse {
        None => vec![(0, size)],
        Some(list) => list
            .iter()
            .copied()
            .filter(|&(off, len)| len > 0 && off.checked_add(len).is_some_and(|end| end <= size))
            .collect(),
    };
    areas.sort_unstable();
    areas
}

impl VfioDevice {
    /// Maps BAR `index` (0..=5) as the HAL's register block (big-endian accessors).
    ///
    /// # Errors
    /// As [`VfioDevice::map_bar`].
    pub fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, VfioError> {
        Ok(self.map_bar(index)?)
    }

    /// Maps BAR `index` (0..=5) and returns the concrete type, which adds little-endian
    /// accessors and the layout of the mapping.
    ///
    /// # Errors
    /// [`VfioError::NoSuchBar`] for an index above 5 or an unimplemented BAR,
    /// [`VfioError::BarMap`] when an mmap fails.
    pub fn map_bar(&self, index: u8) -> Result<Arc<VfioBar>, VfioError> {
        VfioBar::map(&self.inner, index).map(Arc::new)
    }
}

impl VfioBar {
    fn map(dev: &Arc<DeviceInner>, index: u8) -> Result<Self, VfioError> {
        let no_bar = || VfioError::NoSuchBar {
            addr: dev.addr.clone(),
            index,
        };
        if index > 5 {
            return Err(no_bar());
        }
        let region = u32::from(index);
        let size = dev.dev.get_region_size(region);
        let len = usize::try_from(size).map_err(|_| no_bar())?;
        if len == 0 {
            return Err(no_bar());
        }
        let flags = dev.dev.get_region_flags(region);
        let file_offset = dev.dev.get_region_offset(region);
        let sparse: Option<Vec<(u64, u64)>> =
            dev.dev
                .get_region_caps(region)
                .into_iter()
                .find_map(|cap| match cap {
                    VfioRegionInfoCap::SparseMmap(s) => {
                        Some(s.areas.iter().map(|a| (a.offset, a.size)).collect())
                    }
                    _ => None,
                });
        let mut areas = Vec::new();
        for (off, alen) in mappable_areas(size, flags, sparse.as_deref()) {
            let map_err = |source: io::Error| VfioError::BarMap {
                addr: dev.addr.clone(),
                index,
                offset: off,
                len: alen,
                source,
            };
            let (Ok(start), Ok(area_len)) = (usize::try_from(off), usize::try_from(alen)) else {
                return Err(map_err(io::ErrorKind::InvalidInput.into()));
            };
            let map = MmapOptions::new()
                .offset(file_offset + off)
                .len(area_len)
                .map_raw(&sys::device_fd(&dev.dev))
                .map_err(map_err)?;
            areas.push(Area {
                start,
                len: area_len,
                map,
            });
        }
        tracing::debug!(
            addr = %dev.addr, index, size, flags,
            areas = ?areas.iter().map(|a| (a.start, a.len)).collect::<Vec<_>>(),
            "mapped BAR"
        );
        Ok(Self {
            dev: dev.clone(),
            index,
            len,
            file_offset,
            flags,
            areas,
        })
    }

    /// The BAR index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The mmapped parts as `(offset, len)`; the rest goes through `pread`/`pwrite`.
    pub fn mapped_areas(&self) -> Vec<(usize, usize)> {
        self.areas.iter().map(|a| (a.start, a.len)).collect()
    }

    /// The host address of `offset..offset + len` when that range lies inside one mmapped
    /// area (for typed register blocks over the mapping; valid while this `VfioBar` lives).
    /// `None` when any of it is reached through the device fd instead.
    pub fn mapped_ptr(&self, offset: usize, len: usize) -> Option<std::ptr::NonNull<u8>> {
        std::ptr::NonNull::new(self.mapped(offset, len)?)
    }

    /// Reads the little-endian 32-bit register at `offset`.
    ///
    /// # Errors
    /// Out of bounds, misaligned, or the access failed ([`MmioError::Removed`]).
    pub fn read32_le(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len)?;
        Ok(u32::from_le(self.load32(offset)?))
    }

    /// Writes the little-endian 32-bit register at `offset`.
    ///
    /// # Errors
    /// As [`VfioBar::read32_le`].
    pub fn write32_le(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len)?;
        self.store32(offset, value.to_le())
    }

    /// Reads the little-endian 64-bit register at `offset` with one 64-bit load.
    ///
    /// # Errors
    /// As [`VfioBar::read32_le`].
    pub fn read64_le(&self, offset: usize) -> Result<u64, MmioError> {
        check_access(offset, 8, self.len)?;
        Ok(u64::from_le(self.load64(offset)?))
    }

    /// Writes the little-endian 64-bit register at `offset` with one 64-bit store.
    ///
    /// # Errors
    /// As [`VfioBar::read32_le`].
    pub fn write64_le(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        check_access(offset, 8, self.len)?;
        self.store64(offset, value.to_le())
    }

    /// A pointer to `width` bytes at `offset` when they lie inside one mapped area.
    fn mapped(&self, offset: usize, width: usize) -> Option<*mut u8> {
        self.areas
            .iter()
            .find(|a| offset >= a.start && offset + width <= a.start + a.len)
            .map(|a| a.map.as_mut_ptr().wrapping_add(offset - a.start))
    }

    /// The value of the 4 bytes at `offset` as they lie in device memory (native order).
    /// `offset` was checked against the length and alignment.
    fn load32(&self, offset: usize) -> Result<u32, MmioError> {
        if let Some(p) = self.mapped(offset, 4) {
            // SAFETY: `p` points at 4 bytes inside a live shared mapping of the BAR that this
            // value owns; it is 4-byte aligned (areas start page-aligned, `offset` is a
            // multiple of 4). A volatile load through a raw pointer creates no reference.
            return Ok(unsafe { p.cast::<u32>().read_volatile() });
        }
        let mut b = [0u8; 4];
        self.pread(offset, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    fn load64(&self, offset: usize) -> Result<u64, MmioError> {
        if let Some(p) = self.mapped(offset, 8) {
            // SAFETY: as in `load32`, with 8 bytes and 8-byte alignment.
            return Ok(unsafe { p.cast::<u64>().read_volatile() });
        }
        let mut b = [0u8; 8];
        self.pread(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    fn store32(&self, offset: usize, raw: u32) -> Result<(), MmioError> {
        if let Some(p) = self.mapped(offset, 4) {
            // SAFETY: as in `load32`; the mapping is writable (PROT_WRITE, shared).
            unsafe { p.cast::<u32>().write_volatile(raw) };
            return Ok(());
        }
        self.pwrite(offset, &raw.to_ne_bytes())
    }

    fn store64(&self, offset: usize, raw: u64) -> Result<(), MmioError> {
        if let Some(p) = self.mapped(offset, 8) {
            // SAFETY: as in `load64`; the mapping is writable.
            unsafe { p.cast::<u64>().write_volatile(raw) };
            return Ok(());
        }
        self.pwrite(offset, &raw.to_ne_bytes())
    }

    fn pread(&self, offset: usize, buf: &mut [u8]) -> Result<(), MmioError> {
        if self.flags & VFIO_REGION_INFO_FLAG_READ == 0 {
            return Err(self.failed("read", offset, io::ErrorKind::PermissionDenied.into()));
        }
        sys::pread_exact(
            sys::device_fd(&self.dev.dev),
            buf,
            self.file_offset + offset as u64,
        )
        .map_err(|e| self.failed("read", offset, e))
    }

    fn pwrite(&self, offset: usize, buf: &[u8]) -> Result<(), MmioError> {
        if self.flags & VFIO_REGION_INFO_FLAG_WRITE == 0 {
            return Err(self.failed("write", offset, io::ErrorKind::PermissionDenied.into()));
        }
        sys::pwrite_all(
            sys::device_fd(&self.dev.dev),
            buf,
            self.file_offset + offset as u64,
        )
        .map_err(|e| self.failed("write", offset, e))
    }

    /// The HAL's MMIO errors carry no OS error: log it here, with the address, and report the
    /// device as gone (the only cause of a failing region access on a healthy system).
    fn failed(&self, op: &str, offset: usize, err: io::Error) -> MmioError {
        tracing::error!(
            addr = %self.dev.addr, bar = self.index, offset, %err,
            "BAR {op} through the device fd failed"
        );
        MmioError::Removed
    }
}

impl Mmio for VfioBar {
    fn len(&self) -> usize {
        self.len
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len)?;
        Ok(u32::from_be(self.load32(offset)?))
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len)?;
        self.store32(offset, value.to_be())
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        check_access(offset, 8, self.len)?;
        self.store64(offset, value.to_be())
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        check_access(offset, block.len().max(8), self.len)?;
        if block.len() % 8 != 0 {
            return Err(MmioError::Misaligned {
                offset: offset + block.len(),
                width: 8,
            });
        }
        for (i, chunk) in block.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            // The block is already in device byte order: store its bytes as they are.
            self.store64(offset + i * 8, u64::from_ne_bytes(word))?;
        }
        barrier::wc_flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RWM: u32 =
        VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP;

    #[test]
    fn whole_region_without_sparse_capability() {
        assert_eq!(mappable_areas(0x4000, RWM, None), [(0, 0x4000)]);
    }

    #[test]
    fn nothing_without_the_mmap_flag_or_size() {
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        assert!(mappable_areas(0x4000, rw, None).is_empty());
        assert!(mappable_areas(0, RWM, None).is_empty());
    }

    #[test]
    fn sparse_areas_are_honoured_and_bad_ones_dropped() {
        // An MSI-X table at 0x2000..0x3000 cut out of a 16 KiB BAR, listed out of order, plus
        // an empty area and one that overruns the region.
        let sparse = [
            (0x3000, 0x1000),
            (0x0, 0x2000),
            (0x1000, 0),
            (0x3000, 0x2000),
            (u64::MAX, 2),
        ];
        assert_eq!(
            mappable_areas(0x4000, RWM, Some(&sparse)),
            [(0, 0x2000), (0x3000, 0x1000)]
        );
        assert!(mappable_areas(0x4000, RWM, Some(&[])).is_empty());
    }
}

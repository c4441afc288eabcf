//! [`RawRegion`]: bounds-checked raw copies and atomics over host memory that a device may
//! reach by DMA — the one implementation behind every backend's [`DmaMemory`] accessors.
//!
//! A region is a base address and a length. It never makes a Rust reference into the bytes:
//! copies are `ptr::copy`/`copy_nonoverlapping` between the region and ordinary memory, and
//! words that the device and the host both write (owner bytes, doorbell records, atomics of
//! the transport) are reached through the `Atomic*` types for the duration of one operation.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use portverbs_hal::dma::{DmaError, check_range};

/// Raw access to `len` bytes at a host address. See the module documentation.
///
/// The address is kept as an integer, so the type is `Send + Sync` and `Copy`: its safety rests
/// on the promise made to [`RawRegion::new`], which its owner (a [`crate::SoftDma`], a VFIO
/// region) keeps for as long as it holds the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRegion {
    base: usize,
    len: usize,
}

impl RawRegion {
    /// The region of `len` bytes at `base`.
    ///
    /// # Safety
    /// For as long as this value (or a copy of it) is used, `base..base + len` must be memory of
    /// this process valid for reads and writes, and must not be covered by a Rust reference
    /// (other parties reach it only through raw pointers and atomics).
    #[inline(always)]
    pub unsafe fn new(base: *mut u8, len: usize) -> Self {
        Self {
            base: base as usize,
            len,
        }
    }

    /// Host address of byte 0.
    #[inline(always)]
    pub const fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    #[inline(always)]
    pub const fn len(&self) -> usize {
        self.len
    }

    /// True for an empty region.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `offset..offset + len` lies inside the region (no overflow possible).
    #[inline(always)]
    pub const fn fits(&self, offset: usize, len: usize) -> bool {
        offset <= self.len && len <= self.len - offset
    }

    /// Pointer to byte `offset`; callers check `offset <= len` first.
    #[inline(always)]
    fn at(&self, offset: usize) -> *mut u8 {
        // Integer arithmetic: `offset <= len`, so the sum is inside (or one past) the region.
        (self.base + offset) as *mut u8
    }

    /// Checks bounds and the natural alignment of the *address* (memory the application
    /// handed over need not start on a page).
    #[inline(always)]
    fn check_atomic(&self, offset: usize, width: usize) -> Result<*mut u8, DmaError> {
        check_range(offset, width, self.len)?;
        let p = self.at(offset);
        if (p as usize) % width != 0 {
            return Err(DmaError::Misaligned {
                offset,
                align: width,
            });
        }
        Ok(p)
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`].
    #[inline(always)]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the source range is inside the region (checked above; `new`'s promise makes
        // it readable); `dst` is ordinary, exclusively borrowed memory, so the ranges cannot
        // overlap. A concurrent device write makes the copy torn, not unsound: no reference
        // into the region exists.
        unsafe { std::ptr::copy_nonoverlapping(self.at(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`].
    #[inline(always)]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: the destination range is inside the region, writable by `new`'s promise;
        // `src` is an ordinary slice, which cannot alias memory reached only by raw pointers.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.at(offset), src.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`].
    #[inline(always)]
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        check_range(offset, len, self.len)?;
        // SAFETY: the range is inside the region, writable by `new`'s promise.
        unsafe { std::ptr::write_bytes(self.at(offset), byte, len) };
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`; the regions may be the
    /// same and the ranges may overlap.
    ///
    /// # Errors
    /// Either range outside its region.
    #[inline(always)]
    pub fn copy(
        src: &Self,
        src_off: usize,
        dst: &Self,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DmaError> {
        check_range(src_off, len, src.len)?;
        check_range(dst_off, len, dst.len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked to lie inside their regions (readable and writable
        // by `new`'s promise); `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src.at(src_off), dst.at(dst_off), len) };
        Ok(())
    }

    /// Atomically loads a byte (acquire): owner bytes of ring entries.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`].
    #[inline(always)]
    pub fn load_u8(&self, offset: usize) -> Result<u8, DmaError> {
        check_range(offset, 1, self.len)?;
        // SAFETY: in bounds; `AtomicU8` has alignment 1; the memory is only ever accessed
        // through raw pointers and atomics (`new`'s promise).
        Ok(unsafe { AtomicU8::from_ptr(self.at(offset)) }.load(Ordering::Acquire))
    }

    /// Atomically stores a byte (release): publishes a ring entry written before it.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`].
    #[inline(always)]
    pub fn store_u8(&self, offset: usize, value: u8) -> Result<(), DmaError> {
        check_range(offset, 1, self.len)?;
        // SAFETY: as in `load_u8`.
        unsafe { AtomicU8::from_ptr(self.at(offset)) }.store(value, Ordering::Release);
        Ok(())
    }

    /// Atomically loads a naturally aligned `u32` (acquire): doorbell records.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn load_u32(&self, offset: usize) -> Result<u32, DmaError> {
        let p = self.check_atomic(offset, 4)?;
        // SAFETY: in bounds and 4-aligned (`check_atomic` checks the address); only raw
        // pointers and atomics reach the memory.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::Acquire))
    }

    /// Atomically stores a naturally aligned `u32` (release).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn store_u32(&self, offset: usize, value: u32) -> Result<(), DmaError> {
        let p = self.check_atomic(offset, 4)?;
        // SAFETY: as in `load_u32`.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(value, Ordering::Release);
        Ok(())
    }

    /// The 8-byte atomic cell at `offset`, for one operation.
    #[inline(always)]
    fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, DmaError> {
        let p = self.check_atomic(offset, 8)?;
        // SAFETY: in bounds and 8-aligned; the reference is to an *atomic* cell, whose
        // concurrent modification by other parties (the device) is permitted; callers use it
        // for one operation while the region's owner keeps the memory alive.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Atomically loads a naturally aligned native-endian `u64` (acquire).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn load_u64(&self, offset: usize) -> Result<u64, DmaError> {
        Ok(self.atomic_u64(offset)?.load(Ordering::Acquire))
    }

    /// Atomically stores a naturally aligned native-endian `u64` (release).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError> {
        self.atomic_u64(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    /// 64-bit compare-and-swap on native-endian memory; returns the original value (an IB
    /// CMP_AND_SWP executed by the responder).
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, DmaError> {
        let cell = self.atomic_u64(offset)?;
        Ok(
            match cell.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// 64-bit fetch-and-add on native-endian memory; returns the original value.
    ///
    /// # Errors
    /// [`DmaError::OutOfBounds`] or [`DmaError::Misaligned`].
    #[inline(always)]
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, DmaError> {
        Ok(self.atomic_u64(offset)?.fetch_add(add, Ordering::AcqRel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region over a boxed array of atomics (8-aligned), for the tests.
    fn heap(words: usize) -> (Box<[AtomicU64]>, RawRegion) {
        let b: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        // SAFETY: the box outlives every use of the region in the tests and is reached only
        // through it.
        let r = unsafe { RawRegion::new(b.as_ptr() as *mut u8, words * 8) };
        (b, r)
    }

    #[test]
    fn copies_are_bounded() {
        let (_b, r) = heap(4);
        r.write(3, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 4];
        r.read(2, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3]);
        assert!(matches!(
            r.write(30, &[0; 3]),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(r.write(usize::MAX, &[0]).is_err(), "overflowing offset");
        assert!(r.write(32, &[]).is_ok(), "an empty copy at the end fits");
        r.fill(8, 8, 0xaa).unwrap();
        assert_eq!(r.load_u64(8).unwrap(), u64::from_ne_bytes([0xaa; 8]));
        assert!(r.fill(30, 3, 0).is_err());
        assert!(r.fits(0, 32) && !r.fits(1, 32) && !r.fits(33, 0));
    }

    #[test]
    fn atomics_check_bounds_and_alignment() {
        let (_b, r) = heap(4);
        r.store_u8(31, 7).unwrap();
        assert_eq!(r.load_u8(31).unwrap(), 7);
        assert!(r.load_u8(32).is_err());
        r.store_u32(28, 0xdead_beef).unwrap();
        assert_eq!(r.load_u32(28).unwrap(), 0xdead_beef);
        assert!(matches!(
            r.load_u32(26),
            Err(DmaError::Misaligned { align: 4, .. })
        ));
        assert_eq!(r.compare_swap_u64(8, 0, 5).unwrap(), 0);
        assert_eq!(
            r.compare_swap_u64(8, 0, 9).unwrap(),
            5,
            "unequal: unchanged"
        );
        assert_eq!(r.fetch_add_u64(8, 3).unwrap(), 5);
        assert_eq!(r.load_u64(8).unwrap(), 8);
        assert!(matches!(
            r.store_u64(4, 1),
            Err(DmaError::Misaligned { align: 8, .. })
        ));
        assert!(r.load_u64(32).is_err());
    }

    #[test]
    fn copy_within_and_between_regions() {
        let (_a, a) = heap(8);
        let (_b, b) = heap(8);
        a.write(0, b"hello world").unwrap();
        RawRegion::copy(&a, 0, &b, 10, 11).unwrap();
        let mut out = [0u8; 11];
        b.read(10, &mut out).unwrap();
        assert_eq!(&out, b"hello world");
        RawRegion::copy(&a, 0, &a, 2, 11).unwrap();
        let mut out = [0u8; 13];
        a.read(0, &mut out).unwrap();
        assert_eq!(&out, b"hehello world");
        assert!(RawRegion::copy(&a, 60, &b, 0, 8).is_err());
        assert!(RawRegion::copy(&a, 0, &b, 60, 8).is_err());
    }
}

//! Direct access to the driver's own rings and doorbell records: the one module of this crate
//! with `unsafe` code (DESIGN.md §6: `unsafe` lives in named `mmio`/`dma`/`sys` modules).
//!
//! Every other part of the driver reaches DMA memory through the HAL's [`DmaMemory`] copies:
//! a trait-object call, a bounds check and a `memcpy` per access. The hot paths (a WQE, its
//! ownership dword and its stamp per post; an owner byte and a CQE per poll; the set_ci record)
//! made a dozen such calls per operation. [`Ring`] keeps the region's host base address and
//! length instead and does the same bounds-checked raw copies and atomic loads inline. It never
//! makes a Rust reference into the region.
//!
//! Raw access needs a promise the safe [`DmaMemory`] trait cannot carry, so the PCI seam hands
//! out [`HostMapped`] regions: an `unsafe` trait whose implementors (the VFIO function's
//! IOMMU-mapped memory, the emulated HCA's memory) vouch for the host mapping.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portverbs_hal::dma::DmaMemory;

use crate::queues::Geometry;

/// DMA memory whose host mapping the driver may read and write through raw pointers.
///
/// # Safety
/// For as long as the value lives, `host_addr()..host_addr() + len()` must be memory of this
/// process that is valid for reads and writes, never moves, is at least 8-byte aligned, and is
/// never covered by a Rust reference (other parties — the device, the region's own
/// [`DmaMemory`] methods — reach it only through raw pointers or atomics, as this module does).
pub unsafe trait HostMapped: DmaMemory {}

#[cfg(target_os = "linux")]
// SAFETY: a VfioDma owns an anonymous shared mapping (`MmapRaw`) of at least `len()` bytes at
// `host_addr()`, page aligned, unmapped only when the value drops; its own accessors use raw
// copies and atomics. Unmapping it from the IOMMU leaves the host mapping in place.
unsafe impl HostMapped for portverbs_vfio::VfioDma {}

/// A DMA region plus its raw base, for hot-path access. Cloning shares the region.
#[derive(Clone)]
pub(crate) struct Ring {
    mem: Arc<dyn HostMapped>,
    /// `mem.host_addr()`, kept as an integer so that the type stays `Send + Sync` without
    /// further `unsafe`.
    base: usize,
    len: usize,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field(
                "device_addr",
                &format_args!("{:#x}", self.mem.device_addr()),
            )
            .field("len", &self.len)
            .finish()
    }
}

impl Ring {
    pub(crate) fn new(mem: Arc<dyn HostMapped>) -> Self {
        Self {
            base: mem.host_addr() as usize,
            len: mem.len(),
            mem,
        }
    }

    /// The region, for commands (bus address, MTT entries) and cold-path copies.
    pub(crate) fn mem(&self) -> &dyn DmaMemory {
        &*self.mem
    }

    /// Whether `offset..offset + len` lies inside the region.
    #[inline(always)]
    fn fits(&self, offset: usize, len: usize) -> bool {
        offset <= self.len && len <= self.len - offset
    }

    /// Copies `src` into the region at `offset`; false (and nothing written) when it does not fit.
    #[inline(always)]
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> bool {
        if !self.fits(offset, src.len()) {
            return false;
        }
        // SAFETY: `offset..offset + src.len()` is inside the region (checked above), which
        // `HostMapped` guarantees is live, writable and never referenced; `src` is ordinary
        // memory, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.base + offset) as *mut u8, src.len());
        }
        true
    }

    /// Stores the 4 bytes `bytes` at `offset` as one aligned store (an ownership dword or a
    /// stamp must not tear); false when it does not fit or is misaligned.
    #[inline(always)]
    pub(crate) fn store4(&self, offset: usize, bytes: [u8; 4]) -> bool {
        if !self.fits(offset, 4) || offset % 4 != 0 {
            return false;
        }
        // SAFETY: in bounds and 4-byte aligned (the base is 8-byte aligned, `HostMapped`);
        // a volatile store is neither elided nor split.
        unsafe {
            std::ptr::write_volatile((self.base + offset) as *mut u32, u32::from_ne_bytes(bytes))
        };
        true
    }

    /// Copies `dst.len()` bytes at `offset` out of the region; false (and `dst` untouched) when
    /// they are not inside it.
    #[inline(always)]
    pub(crate) fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !self.fits(offset, dst.len()) {
            return false;
        }
        // SAFETY: in bounds of a live region; `dst` is ordinary, exclusively borrowed memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + offset) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }

    /// Copies `N` bytes at `offset` out of the region.
    #[cfg(test)]
    pub(crate) fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        if !self.fits(offset, N) {
            return None;
        }
        let mut out = [0u8; N];
        // SAFETY: in bounds of a live region; `out` is a local array.
        unsafe {
            std::ptr::copy_nonoverlapping((self.base + offset) as *const u8, out.as_mut_ptr(), N);
        }
        Some(out)
    }

    /// Acquire-loads the naturally aligned 8 bytes at `offset` (an entry's ownership word: what
    /// is read after it is at least as new).
    #[inline(always)]
    pub(crate) fn load8(&self, offset: usize) -> Option<[u8; 8]> {
        if !self.fits(offset, 8) || offset % 8 != 0 {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned inside a live region that nothing references;
        // the device writes it concurrently, hence an atomic.
        let word = unsafe { AtomicU64::from_ptr((self.base + offset) as *mut u64) };
        Some(word.load(Ordering::Acquire).to_ne_bytes())
    }
}

/// A ring of equal slots inside a [`Ring`] (a queue's entries: CQEs, WQEs), whose geometry is
/// checked once at construction — power-of-two count, slots of at least `MIN` bytes and a
/// multiple of 8, all inside the region, 8-byte aligned — so that per-entry accesses at offsets
/// below `MIN` need no run-time bounds check (the offset is a constant checked at compile time).
#[derive(Debug, Clone)]
pub(crate) struct Slots<const MIN: usize> {
    /// Keeps the region alive (every access goes through `first`).
    #[cfg_attr(not(test), allow(dead_code))]
    ring: Ring,
    geom: Geometry,
    /// Addressing: slot 0's host address, `cnt - 1` and the shift.
    first: usize,
    mask: u32,
}

/// A ring's addressing without the region's reference count: a plain copyable value, so that a
/// loop over the ring keeps it in registers. Only a [`Slots`] makes one, borrowed from it (the
/// region stays mapped for `'a`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor<'a, const MIN: usize> {
    first: usize,
    mask: u32,
    shift: u32,
    _slots: std::marker::PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> Cursor<'a, MIN> {
    #[inline(always)]
    fn addr(self, c: u32) -> usize {
        self.first + (((c & self.mask) as usize) << self.shift)
    }

    /// Slot `c`.
    #[inline(always)]
    pub(crate) fn at(self, c: u32) -> Slot<'a, MIN> {
        Slot {
            addr: self.addr(c),
            _slots: std::marker::PhantomData,
        }
    }

    /// Wrap parity of counter `c` (the owner bit of pass `c / cnt`).
    #[inline(always)]
    pub(crate) fn parity(self, c: u32) -> bool {
        c & (self.mask + 1) != 0
    }
}

impl<const MIN: usize> Slots<MIN> {
    /// `geom`'s slots of `ring`; `None` when the geometry does not fit the promise above.
    pub(crate) fn new(ring: Ring, geom: Geometry) -> Option<Self> {
        let stride = 1usize.checked_shl(geom.shift)?;
        let bytes = (geom.cnt as usize).checked_mul(stride)?;
        let fits = geom.cnt.is_power_of_two()
            && stride >= MIN
            && stride % 8 == 0
            && geom.base % 8 == 0
            && ring.fits(geom.base, bytes);
        fits.then(|| Self {
            first: ring.base + geom.base,
            mask: geom.cnt - 1,
            ring,
            geom,
        })
    }

    /// The slots' geometry.
    #[inline(always)]
    pub(crate) fn geom(&self) -> Geometry {
        self.geom
    }

    /// The whole region.
    #[cfg(test)]
    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Host address of counter `c`'s slot (in bounds by construction).
    #[inline(always)]
    fn slot(&self, c: u32) -> usize {
        self.cursor().addr(c)
    }

    /// Counter `c`'s slot, for several accesses with one address computation.
    #[inline(always)]
    pub(crate) fn at(&self, c: u32) -> Slot<'_, MIN> {
        self.cursor().at(c)
    }

    /// The ring's addressing as a copyable value (see [`Cursor`]).
    #[inline(always)]
    pub(crate) fn cursor(&self) -> Cursor<'_, MIN> {
        Cursor {
            first: self.first,
            mask: self.mask,
            shift: self.geom.shift,
            _slots: std::marker::PhantomData,
        }
    }

    /// Stores the 4 bytes `v` at offset `AT` of counter `c`'s slot as one aligned store (an
    /// ownership dword must not tear).
    #[inline(always)]
    pub(crate) fn store4<const AT: usize>(&self, c: u32, v: [u8; 4]) {
        const { assert!(AT + 4 <= MIN && AT % 4 == 0) };
        // SAFETY: the slot is inside the live region (`new`), `AT + 4 <= MIN <= stride`, and
        // slot and `AT` are 4-byte aligned; volatile: neither elided nor split.
        unsafe { std::ptr::write_volatile((self.slot(c) + AT) as *mut u32, u32::from_ne_bytes(v)) };
    }

    /// [`Slots::store4`] at a run-time offset; false (nothing written) when `at` is misaligned
    /// or the 4 bytes would leave the slot.
    #[inline(always)]
    pub(crate) fn store4_at(&self, c: u32, at: usize, v: [u8; 4]) -> bool {
        if at % 4 != 0 || at >= (1usize << self.geom.shift) {
            return false;
        }
        // SAFETY: 4-byte aligned and, the stride being a multiple of 8, `at + 4 <= stride`:
        // inside the slot, inside the live region (`new`).
        unsafe { std::ptr::write_volatile((self.slot(c) + at) as *mut u32, u32::from_ne_bytes(v)) };
        true
    }

    /// Copies `src` to offset `at` of counter `c`'s slot; false (nothing written) when it would
    /// leave the slot.
    #[inline(always)]
    pub(crate) fn write(&self, c: u32, at: usize, src: &[u8]) -> bool {
        let stride = 1usize << self.geom.shift;
        if at > stride || src.len() > stride - at {
            return false;
        }
        // SAFETY: `at..at + src.len()` lies inside the slot (checked above), which lies inside
        // the live region (`new`); `src` is ordinary memory, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.slot(c) + at) as *mut u8, src.len());
        }
        true
    }
}

/// One slot of a [`Slots`] (borrowed from it, so the region outlives it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot<'a, const MIN: usize> {
    addr: usize,
    _slots: std::marker::PhantomData<&'a Slots<MIN>>,
}

impl<const MIN: usize> Slot<'_, MIN> {
    /// Acquire-loads the 8 bytes at offset `AT` (an ownership word).
    #[inline(always)]
    pub(crate) fn load8<const AT: usize>(self) -> [u8; 8] {
        const { assert!(AT + 8 <= MIN && AT % 8 == 0) };
        // SAFETY: the address came from `Slots::at`, so the slot is inside a live region (the
        // borrow keeps it alive; `Slots::new` checked the geometry), `AT + 8 <= MIN <= stride`,
        // and slot and `AT` are 8-byte aligned; the device writes the word concurrently, hence
        // an atomic.
        let word = unsafe { AtomicU64::from_ptr((self.addr + AT) as *mut u64) };
        word.load(Ordering::Acquire).to_ne_bytes()
    }

    /// Copies the `N` bytes at offset `AT`.
    #[inline(always)]
    pub(crate) fn read<const AT: usize, const N: usize>(self) -> [u8; N] {
        const { assert!(AT + N <= MIN) };
        let mut out = [0u8; N];
        // SAFETY: inside the slot (`AT + N <= MIN <= stride`), inside a live region (as in
        // `load8`); `out` is a local array.
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr + AT) as *const u8, out.as_mut_ptr(), N);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use portverbs_hal::DmaError;
    use portverbs_hal::dma::check_range;

    /// A heap region for the tests (the crate's real regions come from the PCI seam). Its own
    /// accessors work byte by byte on the atomic words, so the tests can check that `Ring` and
    /// the region see the same bytes.
    #[derive(Debug)]
    struct Heap(Box<[AtomicU64]>);

    impl Heap {
        fn byte(&self, i: usize) -> u8 {
            self.0[i / 8].load(Ordering::Acquire).to_ne_bytes()[i % 8]
        }

        fn set_byte(&self, i: usize, v: u8) {
            let w = &self.0[i / 8];
            let mut b = w.load(Ordering::Acquire).to_ne_bytes();
            b[i % 8] = v;
            w.store(u64::from_ne_bytes(b), Ordering::Release);
        }

        fn word(&self, offset: usize) -> Result<&AtomicU64, DmaError> {
            check_range(offset, 8, self.len())?;
            if offset % 8 != 0 {
                return Err(DmaError::Misaligned { offset, align: 8 });
            }
            Ok(&self.0[offset / 8])
        }
    }

    impl DmaMemory for Heap {
        fn len(&self) -> usize {
            self.0.len() * 8
        }
        fn host_addr(&self) -> u64 {
            self.0.as_ptr() as u64
        }
        fn device_addr(&self) -> u64 {
            0x1000
        }
        fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
            check_range(offset, dst.len(), self.len())?;
            for (i, d) in dst.iter_mut().enumerate() {
                *d = self.byte(offset + i);
            }
            Ok(())
        }
        fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
            check_range(offset, src.len(), self.len())?;
            for (i, &v) in src.iter().enumerate() {
                self.set_byte(offset + i, v);
            }
            Ok(())
        }
        fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
            check_range(offset, len, self.len())?;
            (offset..offset + len).for_each(|i| self.set_byte(i, byte));
            Ok(())
        }
        fn load_u64(&self, offset: usize) -> Result<u64, DmaError> {
            Ok(self.word(offset)?.load(Ordering::Acquire))
        }
        fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError> {
            self.word(offset)?.store(value, Ordering::Release);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn into_any_arc(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
            self
        }
    }

    // SAFETY: the boxed atomics live as long as the value, are 8-byte aligned and only reached
    // through raw pointers by `Ring`.
    unsafe impl HostMapped for Heap {}

    fn ring(words: usize) -> Ring {
        Ring::new(Arc::new(Heap(
            (0..words).map(|_| AtomicU64::new(0)).collect(),
        )))
    }

    #[test]
    fn accesses_round_trip_and_stay_inside() {
        let r = ring(4);
        assert!(r.write(3, &[1, 2, 3]));
        assert_eq!(r.read::<4>(2), Some([0, 1, 2, 3]));
        assert!(r.store4(8, [9, 8, 7, 6]));
        assert_eq!(r.load8(8), Some([9, 8, 7, 6, 0, 0, 0, 0]));
        assert!(!r.write(30, &[0; 3]), "past the end");
        assert!(!r.write(usize::MAX, &[0]), "overflowing offset");
        assert!(r.write(32, &[]), "an empty copy at the end fits");
        assert!(!r.store4(30, [0; 4]), "past the end");
        assert!(!r.store4(2, [0; 4]), "misaligned");
        assert_eq!(r.read::<8>(25), None);
        assert_eq!(r.load8(4), None, "misaligned");
        assert_eq!(r.load8(32), None, "past the end");
    }

    #[test]
    fn ring_and_region_see_the_same_bytes() {
        let r = ring(2);
        assert!(r.write(5, &[1, 2, 3, 4]));
        let mut got = [0u8; 4];
        r.mem().read(5, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4], "the region reads what Ring wrote");
        r.mem().write(12, &[9, 8, 7, 6]).unwrap();
        assert_eq!(
            r.read::<4>(12),
            Some([9, 8, 7, 6]),
            "Ring reads what the region wrote"
        );
        r.mem().store_u64(8, u64::from_ne_bytes([5; 8])).unwrap();
        assert_eq!(r.load8(8), Some([5; 8]));
    }

    #[test]
    fn slots_check_their_geometry_once_and_address_each_slot() {
        let g = |base, shift, cnt| Geometry { base, shift, cnt };
        // 8 words = 64 bytes.
        assert!(Slots::<32>::new(ring(8), g(0, 5, 2)).is_some());
        assert!(
            Slots::<32>::new(ring(8), g(0, 5, 4)).is_none(),
            "past the end"
        );
        assert!(
            Slots::<32>::new(ring(8), g(0, 5, 3)).is_none(),
            "not a power of two"
        );
        assert!(
            Slots::<32>::new(ring(8), g(0, 4, 2)).is_none(),
            "slots below MIN"
        );
        assert!(
            Slots::<32>::new(ring(8), g(4, 5, 1)).is_none(),
            "misaligned base"
        );
        assert!(
            Slots::<32>::new(ring(8), g(0, 70, 1)).is_none(),
            "overflowing stride"
        );
        let s = Slots::<32>::new(ring(8), g(32, 4 + 1, 1)).unwrap();
        // Counter 5 wraps to the only slot, at byte 32.
        s.store4::<4>(5, [1, 2, 3, 4]);
        assert_eq!(s.at(0).read::<4, 4>(), [1, 2, 3, 4]);
        assert_eq!(s.ring().read::<4>(36), Some([1, 2, 3, 4]));
        assert!(s.write(0, 24, &[7; 8]));
        assert_eq!(s.at(1).load8::<24>(), [7; 8]);
        assert!(!s.write(0, 25, &[7; 8]), "past the slot");
        assert!(!s.write(0, usize::MAX, &[]), "overflowing offset");
        assert!(s.write(0, 32, &[]), "an empty copy at the slot's end fits");
        assert!(s.store4_at(0, 28, [3; 4]));
        assert_eq!(s.at(0).read::<28, 4>(), [3; 4]);
        assert!(!s.store4_at(0, 32, [3; 4]), "past the slot");
        assert!(!s.store4_at(0, 6, [3; 4]), "misaligned");
    }
}

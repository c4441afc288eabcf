//! Direct access to the driver's own rings and doorbell records: the one module of this crate
//! with `unsafe` code (DESIGN.md §6: `unsafe` lives in named `mmio`/`dma`/`sys` modules).
//!
//! Every other part of the driver reaches DMA memory through the HAL's [`DmaMemory`] copies:
//! a trait-object call, a bounds check and a `memcpy` per access. The hot paths (a WQE, its
//! ownership dword and its stamp per post; an owner byte and a CQE per poll; the set_ci record)
//! made a dozen such calls per operation. `Ring` keeps the region's host base address and
//! length instead and does the same bounds-checked raw copies and atomic loads inline. It makes
//! a Rust reference into the region in one place only: `Slot::write_wc_from` lends a finished
//! send WQE, which nobody writes while the BlueFlame copy runs, to the BAR's `write_wc`.
//!
//! Raw access needs a promise the safe [`DmaMemory`] trait cannot carry, so the PCI seam hands
//! out [`HostMapped`] regions: an `unsafe` trait whose implementors (the VFIO function's
//! IOMMU-mapped memory, the emulated HCA's memory) vouch for the host mapping.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::mmio::{Mmio, MmioError};

use crate::queues::Geometry;

pub use portverbs_dma::HostMapped;

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
            len: 1 << self.shift,
            _slots: std::marker::PhantomData,
        }
    }

    /// Wrap parity of counter `c` (the owner bit of pass `c / cnt`).
    #[inline(always)]
    pub(crate) fn parity(self, c: u32) -> bool {
        c & (self.mask + 1) != 0
    }
}

/// A [`Cursor`] over slots of exactly `MIN` bytes (a CQ's 32-byte entries): the address of a
/// slot is a shift by a constant, so a loop needs one register less and no variable shift.
/// Only [`Slots::exact_cursor`] makes one, after checking the stride.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExactCursor<'a, const MIN: usize> {
    first: usize,
    mask: u32,
    _slots: std::marker::PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> ExactCursor<'a, MIN> {
    /// Slot `c`.
    #[inline(always)]
    pub(crate) fn at(self, c: u32) -> Slot<'a, MIN> {
        Slot {
            addr: self.first + (c & self.mask) as usize * MIN,
            len: MIN,
            _slots: std::marker::PhantomData,
        }
    }

    /// The counter bit that is the wrap parity (the slot count): counter `c` is in an odd
    /// pass when `c & wrap_bit() != 0`.
    #[inline(always)]
    pub(crate) fn wrap_bit(self) -> u32 {
        self.mask + 1
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

    /// The addressing of slots exactly `MIN` bytes long; `None` when the stride is larger.
    #[inline(always)]
    pub(crate) fn exact_cursor(&self) -> Option<ExactCursor<'_, MIN>> {
        (1usize << self.geom.shift == MIN).then_some(ExactCursor {
            first: self.first,
            mask: self.mask,
            _slots: std::marker::PhantomData,
        })
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
    /// Bytes in the slot (the stride, at least `MIN`).
    len: usize,
    _slots: std::marker::PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> Slot<'a, MIN> {
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

    /// Reads the byte at offset `AT`.
    #[inline(always)]
    pub(crate) fn byte<const AT: usize>(self) -> u8 {
        self.read::<AT, 1>()[0]
    }

    /// Stores `v` at offset `AT` (plain stores: WQE bodies, published later by
    /// [`Slot::publish4`]).
    #[inline(always)]
    pub(crate) fn put<const AT: usize, const N: usize>(self, v: [u8; N]) {
        const { assert!(AT + N <= MIN) };
        // SAFETY: inside the slot (`AT + N <= MIN <= stride`), inside a live region (as in
        // `load8`); unaligned stores of bytes the device only reads.
        unsafe { std::ptr::write_unaligned((self.addr + AT) as *mut [u8; N], v) };
    }

    /// Stores `v` at a run-time offset; false (nothing stored) past the slot's end.
    #[inline(always)]
    pub(crate) fn put_at<const N: usize>(self, at: usize, v: [u8; N]) -> bool {
        if N > self.len || at > self.len - N {
            return false;
        }
        // SAFETY: `at + N <= len`, the slot's size, inside a live region (as in `load8`).
        unsafe { std::ptr::write_unaligned((self.addr + at) as *mut [u8; N], v) };
        true
    }

    /// Writes `data` from offset `AT` as inline-data segments (facts §5.4): each a big-endian
    /// header `flag | bytes` and then its bytes, none crossing a 64-byte boundary (the first
    /// fills the rest of `AT`'s block, each further one starts a block). The first segment is
    /// written even for empty data. Returns the end; `None` when the segments would leave the
    /// slot (those that fit may have been written).
    #[inline(always)]
    pub(crate) fn inline_segments<const AT: usize>(self, flag: u32, data: &[u8]) -> Option<usize> {
        const BLOCK: usize = 64;
        let first_room = const { BLOCK - 4 - AT % BLOCK };
        let (first, rest) = data.split_at(data.len().min(first_room));
        let mut at = self.segment(AT, flag, first)?;
        // Data that ends in the next block (a 64-byte payload after a remote-address segment)
        // needs one more segment and no loop.
        if rest.len() <= BLOCK - 4 {
            if !rest.is_empty() {
                at = self.segment(at, flag, rest)?;
            }
            return Some(at);
        }
        for piece in rest.chunks(BLOCK - 4) {
            at = self.segment(at, flag, piece)?;
        }
        Some(at)
    }

    /// One inline segment of at most 60 bytes at `at`; its end, or `None` (nothing written)
    /// past the slot's end.
    #[inline(always)]
    fn segment(self, at: usize, flag: u32, piece: &[u8]) -> Option<usize> {
        if piece.len() > 60 || at > self.len || 4 + piece.len() > self.len - at {
            return None;
        }
        // SAFETY: `at + 4 + piece.len() <= len`: inside the slot of a live region (as in
        // `load8`); `piece` is at most 60 bytes.
        unsafe {
            let header = (flag | piece.len() as u32).to_be_bytes();
            let d = (self.addr + at) as *mut u8;
            std::ptr::write_unaligned(d.cast::<[u8; 4]>(), header);
            copy_small(d.add(4), piece);
        }
        Some(at + 4 + piece.len())
    }

    /// Stores `word` at the start of every 64-byte block after the first below `size` (a
    /// WQE's stamp, facts §5.2); blocks past the slot's end are left alone.
    #[inline(always)]
    pub(crate) fn stamp_blocks(self, size: usize, word: [u8; 4]) {
        const { assert!(MIN >= 64 && MIN % 64 == 0) };
        let end = size.min(self.len);
        let word = u32::from_ne_bytes(word);
        let mut b = 64;
        // A WQE of up to 128 bytes (the commonest) has one block to stamp: it is the first
        // test, before any loop set-up.
        while b < end {
            // SAFETY: `b < end <= len`, and `len` (the stride) is a multiple of 64 (a power of
            // two at least `MIN`), so `b + 4 <= len`: inside the slot of a live region, 4-byte
            // aligned. Volatile: one plain store per block, never merged or vectorised.
            unsafe { std::ptr::write_volatile((self.addr + b) as *mut u32, word) };
            if b + 64 >= end {
                break;
            }
            b += 64;
        }
    }

    /// Passes the first `n` bytes of the slot, in place, to `bar.write_wc(offset, ..)` (a
    /// BlueFlame copy straight from a send-queue ring); `None` past the slot's end.
    ///
    /// Only for rings the device never writes, and while no other party writes this slot: the
    /// bytes are lent to the MMIO write as a shared slice for the duration of the call (the
    /// one place a reference covers ring memory; see [`HostMapped`]).
    #[inline(always)]
    pub(crate) fn write_wc_from(
        self,
        n: usize,
        bar: &dyn Mmio,
        offset: usize,
    ) -> Option<Result<(), MmioError>> {
        if n > self.len {
            return None;
        }
        // SAFETY: `n <= len`, inside a live region (as in `load8`). Nothing writes it while
        // the slice lives: the device only reads send-queue memory, and the caller holds the
        // queue whose slot this is (the host writes a slot only under it).
        let block = unsafe { std::slice::from_raw_parts(self.addr as *const u8, n) };
        Some(bar.write_wc(offset, block))
    }

    /// Volatile store of the dword at offset `AT` (an ownership word, after a barrier).
    #[inline(always)]
    pub(crate) fn publish4<const AT: usize>(self, v: [u8; 4]) {
        const { assert!(AT + 4 <= MIN && AT % 4 == 0) };
        // SAFETY: inside the slot, 4-byte aligned (slots are 8-aligned), inside a live region.
        unsafe { std::ptr::write_volatile((self.addr + AT) as *mut u32, u32::from_ne_bytes(v)) };
    }
}

/// Copies at most 64 bytes to `d` with overlapping fixed-size moves (no call to `memcpy`).
///
/// # Safety
/// `d..d + src.len()` is valid for writes and does not overlap `src`; `src.len() <= 64`.
#[inline(always)]
unsafe fn copy_small(d: *mut u8, src: &[u8]) {
    /// # Safety
    /// `from..from + W` is inside both buffers.
    #[inline(always)]
    unsafe fn mv<const W: usize>(s: *const u8, d: *mut u8, from: usize) {
        // SAFETY: as the caller promises.
        unsafe {
            let v = std::ptr::read_unaligned(s.add(from).cast::<[u8; W]>());
            std::ptr::write_unaligned(d.add(from).cast::<[u8; W]>(), v);
        }
    }
    let n = src.len();
    let s = src.as_ptr();
    debug_assert!(n <= 64);
    // SAFETY: every move reads inside `src` and writes inside `d..d + n` (as the caller
    // promises for `d`).
    unsafe {
        if n >= 16 {
            // Head and tail 16 bytes (and for more than 32 the two in between) cover every
            // byte, overlapping where n is not a multiple of 16.
            mv::<16>(s, d, 0);
            mv::<16>(s, d, n - 16);
            if n > 32 {
                mv::<16>(s, d, 16);
                mv::<16>(s, d, n - 32);
            }
        } else if n >= 8 {
            mv::<8>(s, d, 0);
            mv::<8>(s, d, n - 8);
        } else if n >= 4 {
            mv::<4>(s, d, 0);
            mv::<4>(s, d, n - 4);
        } else {
            for i in 0..n {
                mv::<1>(s, d, i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use portverbs_hal::DmaError;
    use portverbs_hal::dma::check_range;
    use portverbs_hal::mmio::MemRegisters;

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
        s.at(5).publish4::<4>([1, 2, 3, 4]);
        assert_eq!(s.at(0).read::<4, 4>(), [1, 2, 3, 4]);
        assert_eq!(s.ring().read::<4>(36), Some([1, 2, 3, 4]));
        assert!(s.write(0, 24, &[7; 8]));
        assert_eq!(s.at(1).load8::<24>(), [7; 8]);
        assert!(!s.write(0, 25, &[7; 8]), "past the slot");
        assert!(!s.write(0, usize::MAX, &[]), "overflowing offset");
        assert!(s.write(0, 32, &[]), "an empty copy at the slot's end fits");
        let slot = s.at(0);
        slot.put::<8, 4>([6; 4]);
        assert_eq!(slot.byte::<9>(), 6);
        assert!(slot.put_at(28, [3; 4]));
        assert_eq!(slot.read::<28, 4>(), [3; 4]);
        assert!(!slot.put_at(29, [3; 4]), "past the slot");
        assert!(!slot.put_at(usize::MAX, [3; 4]), "overflowing offset");
        assert!(!slot.put_at(0, [3; 40]), "larger than the slot");
        assert_eq!(slot.segment(24, 0x8000_0000, &[4, 5]), Some(30));
        assert_eq!(slot.read::<24, 8>(), [0x80, 0, 0, 2, 4, 5, 3, 3]);
        assert_eq!(slot.segment(27, 0, &[4, 5]), None, "past the slot");
        assert_eq!(
            slot.segment(28, 0, &[]),
            Some(32),
            "an empty segment's header at the slot's end fits"
        );
        // A BlueFlame-style copy lends the slot's bytes, in place, to the MMIO write.
        let bar = MemRegisters::new(64);
        assert_eq!(slot.write_wc_from(32, &bar, 32), Some(Ok(())));
        let mut out = [0u8; 32];
        bar.bytes(32, &mut out).unwrap();
        assert_eq!(out[24..], [0x80, 0, 0, 2, 0, 0, 0, 0]);
        assert_eq!(
            slot.write_wc_from(33, &bar, 0),
            None,
            "longer than the slot"
        );
        assert!(
            matches!(slot.write_wc_from(32, &bar, 40), Some(Err(_))),
            "the BAR's own refusal is passed on"
        );
        // The exact cursor addresses the same slots as the general one, and exists only for
        // slots of exactly `MIN` bytes.
        let four = Slots::<32>::new(ring(16), g(0, 5, 4)).unwrap();
        let exact = four.exact_cursor().unwrap();
        for c in [0, 1, 3, 4, 7, 0xffff_ffff] {
            exact.at(c).publish4::<0>(c.to_ne_bytes());
            assert_eq!(four.at(c).read::<0, 4>(), c.to_ne_bytes(), "counter {c}");
            assert_eq!(
                c & exact.wrap_bit() != 0,
                four.geom().parity(c),
                "counter {c}"
            );
        }
        let wide = Slots::<32>::new(ring(16), g(0, 6, 2)).unwrap();
        assert!(wide.exact_cursor().is_none(), "64-byte slots");
    }

    /// A one-slot ring of 256-byte slots filled with 0xee.
    fn slot256() -> Slots<64> {
        let s = Slots::<64>::new(
            ring(32),
            Geometry {
                base: 0,
                shift: 8,
                cnt: 1,
            },
        )
        .unwrap();
        assert!(s.write(0, 0, &[0xee; 256]));
        s
    }

    fn bytes(s: &Slots<64>) -> [u8; 256] {
        let mut out = [0u8; 256];
        assert!(s.ring().read_into(0, &mut out));
        out
    }

    #[test]
    fn segments_write_exactly_their_header_and_bytes() {
        let src: Vec<u8> = (1..=60).collect();
        for n in 0..=60 {
            for at in [0, 4, 36, 252 - n] {
                let s = slot256();
                assert_eq!(
                    s.at(0).segment(at, 0x8000_0000, &src[..n]),
                    Some(at + 4 + n),
                    "n {n} at {at}"
                );
                let out = bytes(&s);
                assert!(
                    out[..at].iter().all(|&b| b == 0xee),
                    "before, n {n} at {at}"
                );
                assert_eq!(out[at..at + 4], (0x8000_0000 | n as u32).to_be_bytes());
                assert_eq!(out[at + 4..at + 4 + n], src[..n], "n {n} at {at}");
                assert!(
                    out[at + 4 + n..].iter().all(|&b| b == 0xee),
                    "after, n {n} at {at}"
                );
            }
        }
        let s = slot256();
        let slot = s.at(0);
        assert_eq!(slot.segment(0, 0, &[0; 61]), None, "more than 60 bytes");
        assert_eq!(slot.segment(248, 0, &[0; 5]), None, "past the slot");
        assert_eq!(slot.segment(usize::MAX, 0, &[]), None, "overflowing offset");
    }

    /// Parses the inline segments from `at` to `end` back into their bytes, checking that
    /// none crosses a 64-byte boundary and each carries the flag.
    fn parse_segments(out: &[u8], mut at: usize, end: usize) -> Vec<u8> {
        let mut data = Vec::new();
        while at < end {
            let h = u32::from_be_bytes(out[at..at + 4].try_into().unwrap());
            assert_eq!(h & 0x8000_0000, 0x8000_0000, "flag at {at}");
            let n = (h & 0x7fff_ffff) as usize;
            assert!(
                at / 64 == (at + 3 + n) / 64,
                "segment at {at} of {n} crosses a block"
            );
            data.extend_from_slice(&out[at + 4..at + 4 + n]);
            at += 4 + n;
        }
        assert_eq!(at, end);
        data
    }

    #[test]
    fn inline_segments_split_at_64_byte_blocks_and_stop_at_the_slot_end() {
        let src: Vec<u8> = (0..=255).map(|i: u32| (i * 7 + 1) as u8).collect();
        for n in 0..=220 {
            let s = slot256();
            let end = s.at(0).inline_segments::<32>(0x8000_0000, &src[..n]);
            // 28 bytes fit in the first block after offset 32, then 60 per block.
            let rest = n.saturating_sub(28);
            let want = 32 + 4 + n + 4 * rest.div_ceil(60);
            if want > 256 {
                assert_eq!(end, None, "n {n}");
                continue;
            }
            assert_eq!(end, Some(want), "n {n}");
            let out = bytes(&s);
            assert_eq!(parse_segments(&out, 32, want), src[..n], "n {n}");
            assert!(out[want..].iter().all(|&b| b == 0xee), "after, n {n}");
        }
        // From a block boundary (a UD WQE's payload) the first segment takes 60 bytes.
        let s = slot256();
        assert_eq!(
            s.at(0).inline_segments::<64>(0x8000_0000, &src[..61]),
            Some(64 + 4 + 60 + 4 + 1)
        );
        assert_eq!(parse_segments(&bytes(&s), 64, 133), src[..61]);
    }

    #[test]
    fn stamps_go_to_every_block_after_the_first_inside_the_slot() {
        for size in [0, 64, 65, 128, 200, 1008] {
            let s = slot256();
            s.at(0).stamp_blocks(size, [0xff; 4]);
            let out = bytes(&s);
            for b in (0..256).step_by(64) {
                let stamped = b > 0 && b < size;
                let want = if stamped { [0xff; 4] } else { [0xee; 4] };
                assert_eq!(out[b..b + 4], want, "size {size} block {b}");
                assert!(out[b + 4..b + 64].iter().all(|&x| x == 0xee));
            }
        }
    }
}

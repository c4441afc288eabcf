//! Device rings in DMA memory: the one ring/slot abstraction of the workspace, used by the mlx4
//! driver's queues, by both sides of the software device's queues and (for [`Geometry`]) by
//! the emulated ConnectX-3. The queue-level rings built on it — slots paired with their one
//! counter and ownership rule — are in [`crate::queue`].
//!
//! Every queue is a power-of-two ring of equal entries addressed by a free-running 32-bit
//! counter ([`Geometry`]). The types split the work so that each check happens once:
//!
//! * [`Ring`] — a [`HostMapped`] region and its raw base: bounds-checked raw copies and
//!   atomics at run-time offsets, for records and cold paths;
//! * [`Slots<MIN>`](Slots) — a ring's entries inside a [`Ring`], whose geometry is checked once
//!   when it is made (power-of-two count, entries of at least `MIN` bytes and a multiple of 8,
//!   8-byte aligned, all inside the region). After that, an entry's address is a mask and a
//!   shift, and an access at a constant offset below `MIN` has no run-time bounds check (the
//!   offset is checked at compile time);
//! * [`Cursor`]/[`ExactCursor`] — a ring's addressing as a copyable value that a loop keeps in
//!   registers, and [`Slot`] — one entry;
//! * [`Producer<D>`](Producer)/[`Consumer<D>`](Consumer) — one side's counter, the ring's
//!   direction ([`HostToDevice`] for work queues, [`DeviceToHost`] for completion and event
//!   queues) in its type: a producer only advances the head, a consumer only the tail.
//!
//! Ownership of an entry in a device-to-host ring follows the *wrap parity* rule of mlx4 and the
//! software device: the producer writes each entry with an owner bit equal to the parity of its
//! pass through the ring (`counter & cnt != 0`), and the consumer owns the entry at its counter
//! when that bit equals the parity of *its* counter ([`Consumer::owns`]).
//!
//! Nothing here knows an entry's format: the backends encode and decode WQEs, CQEs and EQEs in
//! place through [`Slot`]'s accessors.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::mmio::{Mmio, MmioError};

use crate::{HostMapped, RawRegion};

/// A ring's place in its region: `cnt` entries of `1 << shift` bytes from byte `base`.
///
/// A plain description; [`Slots::new`] checks it against the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Offset of entry 0 in the region.
    pub base: usize,
    /// log2 of the entry size.
    pub shift: u32,
    /// Number of entries (a power of two for a valid ring).
    pub cnt: u32,
}

impl Geometry {
    /// The smallest ring at offset 0 holding at least `entries` entries of at least `stride`
    /// bytes; `None` beyond 2^24 entries (the 24-bit counters of IB devices) or when its bytes
    /// would not fit in `usize`.
    pub fn for_at_least(entries: u32, stride: usize) -> Option<Self> {
        let cnt = entries.max(1).checked_next_power_of_two()?;
        let stride = stride.max(1).checked_next_power_of_two()?;
        if cnt > 1 << 24 {
            return None;
        }
        (cnt as usize).checked_mul(stride)?;
        Some(Self {
            base: 0,
            shift: stride.trailing_zeros(),
            cnt,
        })
    }

    /// Offset in the region of counter `counter`'s entry (untrusted counters are masked).
    #[inline(always)]
    pub fn offset(&self, counter: u32) -> usize {
        self.base + (((counter & (self.cnt - 1)) as usize) << self.shift)
    }

    /// Slot index of a counter (masks untrusted counters too).
    #[inline(always)]
    pub fn slot(&self, counter: u32) -> u32 {
        counter & (self.cnt - 1)
    }

    /// Wrap parity of `counter` (the owner bit of pass `counter / cnt`).
    #[inline(always)]
    pub fn parity(&self, counter: u32) -> bool {
        counter & self.cnt != 0
    }

    /// Entry size in bytes.
    #[inline(always)]
    pub fn stride(&self) -> usize {
        1 << self.shift
    }

    /// Number of entries.
    #[inline(always)]
    pub fn entries(&self) -> u32 {
        self.cnt
    }

    /// Bytes of the entries (from `base`).
    pub fn bytes(&self) -> usize {
        (self.cnt as usize) << self.shift
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A ring's direction: [`HostToDevice`] or [`DeviceToHost`].
pub trait Direction: sealed::Sealed + fmt::Debug + Copy + Send + Sync + 'static {}

/// Marker: the host produces and the device consumes (work queues: SQ, RQ, SRQ).
#[derive(Debug, Clone, Copy)]
pub enum HostToDevice {}

/// Marker: the device produces and the host consumes (completion and event queues).
#[derive(Debug, Clone, Copy)]
pub enum DeviceToHost {}

impl sealed::Sealed for HostToDevice {}
impl sealed::Sealed for DeviceToHost {}
impl Direction for HostToDevice {}
impl Direction for DeviceToHost {}

/// The producing side's counter of a ring going in direction `D`.
#[derive(Debug, Clone)]
pub struct Producer<D: Direction> {
    geometry: Geometry,
    head: u32,
    _dir: PhantomData<D>,
}

impl<D: Direction> Producer<D> {
    /// A producer at counter 0.
    pub fn new(geometry: Geometry) -> Self {
        Self {
            geometry,
            head: 0,
            _dir: PhantomData,
        }
    }

    /// Geometry of the ring.
    #[inline(always)]
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Counter of the next entry to produce.
    #[inline(always)]
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Offset in the region of the next entry.
    #[inline(always)]
    pub fn offset(&self) -> usize {
        self.geometry.offset(self.head)
    }

    /// Owner bit to write into the next entry (wrap parity of the head).
    #[inline(always)]
    pub fn owner_bit(&self) -> bool {
        self.geometry.parity(self.head)
    }

    /// True when `head - consumer_tail` has reached `capacity` (free-running counters wrap).
    #[inline(always)]
    pub fn is_full(&self, consumer_tail: u32, capacity: u32) -> bool {
        self.head.wrapping_sub(consumer_tail) >= capacity
    }

    /// Produces `n` entries.
    #[inline(always)]
    pub fn advance(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
    }

    /// Back to counter 0 (queue reset).
    pub fn reset(&mut self) {
        self.head = 0;
    }
}

/// The consuming side's counter of a ring going in direction `D`.
#[derive(Debug, Clone)]
pub struct Consumer<D: Direction> {
    geometry: Geometry,
    tail: u32,
    _dir: PhantomData<D>,
}

impl<D: Direction> Consumer<D> {
    /// A consumer at counter 0.
    pub fn new(geometry: Geometry) -> Self {
        Self {
            geometry,
            tail: 0,
            _dir: PhantomData,
        }
    }

    /// Geometry of the ring.
    #[inline(always)]
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Counter of the next entry to consume.
    #[inline(always)]
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Offset in the region of the next entry.
    #[inline(always)]
    pub fn offset(&self) -> usize {
        self.geometry.offset(self.tail)
    }

    /// True when an entry whose owner bit is `owner_bit` belongs to the consumer now.
    #[inline(always)]
    pub fn owns(&self, owner_bit: bool) -> bool {
        owner_bit == self.geometry.parity(self.tail)
    }

    /// Consumes `n` entries.
    #[inline(always)]
    pub fn advance(&mut self, n: u32) {
        self.tail = self.tail.wrapping_add(n);
    }

    /// Back to counter 0 (queue reset).
    pub fn reset(&mut self) {
        self.tail = 0;
    }
}

/// A DMA region plus its raw base, for hot-path access. Cloning shares the region.
#[derive(Clone)]
pub struct Ring {
    mem: Arc<dyn HostMapped>,
    raw: RawRegion,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field(
                "device_addr",
                &format_args!("{:#x}", self.mem.device_addr()),
            )
            .field("len", &self.raw.len())
            .finish()
    }
}

impl Ring {
    /// The ring memory `mem`.
    pub fn new(mem: Arc<dyn HostMapped>) -> Self {
        // SAFETY: `HostMapped`'s promise: `host_addr()..host_addr() + len()` is valid for reads
        // and writes, never moves and is never referenced while `mem` lives, and `self` keeps
        // `mem` for as long as the raw region is used.
        let raw = unsafe { RawRegion::new(mem.host_addr() as usize as *mut u8, mem.len()) };
        Self { mem, raw }
    }

    /// The region, for commands (bus address, MTT entries) and cold-path copies.
    pub fn mem(&self) -> &dyn DmaMemory {
        &*self.mem
    }

    /// Raw access to the whole region (bounds-checked copies and atomics).
    #[inline(always)]
    pub fn raw(&self) -> &RawRegion {
        &self.raw
    }

    /// Whether `offset..offset + len` lies inside the region.
    #[inline(always)]
    fn fits(&self, offset: usize, len: usize) -> bool {
        self.raw.fits(offset, len)
    }

    /// Address of byte `offset` (callers check bounds first).
    #[inline(always)]
    fn addr(&self, offset: usize) -> usize {
        self.raw.base() + offset
    }

    /// Copies `src` into the region at `offset`; false (and nothing written) when it does not fit.
    #[inline(always)]
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        if !self.fits(offset, src.len()) {
            return false;
        }
        // SAFETY: `offset..offset + src.len()` is inside the region (checked above), which
        // `HostMapped` guarantees is live, writable and never referenced; `src` is ordinary
        // memory, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr(offset) as *mut u8, src.len());
        }
        true
    }

    /// Stores the 4 bytes `bytes` at `offset` as one aligned store (an ownership dword or a
    /// stamp must not tear); false when it does not fit or its address is misaligned.
    #[inline(always)]
    pub fn store4(&self, offset: usize, bytes: [u8; 4]) -> bool {
        if !self.fits(offset, 4) || self.addr(offset) % 4 != 0 {
            return false;
        }
        // SAFETY: in bounds and 4-byte aligned (checked above); a volatile store is neither
        // elided nor split.
        unsafe {
            std::ptr::write_volatile(self.addr(offset) as *mut u32, u32::from_ne_bytes(bytes))
        };
        true
    }

    /// Copies `dst.len()` bytes at `offset` out of the region; false (and `dst` untouched) when
    /// they are not inside it.
    #[inline(always)]
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !self.fits(offset, dst.len()) {
            return false;
        }
        // SAFETY: in bounds of a live region; `dst` is ordinary, exclusively borrowed memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr(offset) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }

    /// Copies `N` bytes at `offset` out of the region.
    #[inline(always)]
    pub fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        self.read_into(offset, &mut out).then_some(out)
    }

    /// Acquire-loads the naturally aligned 8 bytes at `offset` (an entry's ownership word: what
    /// is read after it is at least as new).
    #[inline(always)]
    pub fn load8(&self, offset: usize) -> Option<[u8; 8]> {
        if !self.fits(offset, 8) || self.addr(offset) % 8 != 0 {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned inside a live region that nothing references;
        // the device writes it concurrently, hence an atomic.
        let word = unsafe { AtomicU64::from_ptr(self.addr(offset) as *mut u64) };
        Some(word.load(Ordering::Acquire).to_ne_bytes())
    }
}

/// A ring of equal slots inside a [`Ring`] (a queue's entries: CQEs, WQEs), whose geometry is
/// checked once at construction — power-of-two count, slots of at least `MIN` bytes and a
/// multiple of 8, all inside the region, slot 0 at an 8-byte aligned address — so that
/// per-entry accesses at offsets below `MIN` need no run-time bounds check (the offset is a
/// constant checked at compile time).
#[derive(Debug, Clone)]
pub struct Slots<const MIN: usize> {
    /// Keeps the region alive (every access goes through `first`).
    ring: Ring,
    geom: Geometry,
    /// Addressing: slot 0's host address and `cnt - 1`.
    first: usize,
    mask: u32,
}

/// A ring's addressing without the region's reference count: a plain copyable value, so that a
/// loop over the ring keeps it in registers. Only a [`Slots`] makes one, borrowed from it (the
/// region stays mapped for `'a`).
#[derive(Debug, Clone, Copy)]
pub struct Cursor<'a, const MIN: usize> {
    first: usize,
    mask: u32,
    shift: u32,
    _slots: PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> Cursor<'a, MIN> {
    #[inline(always)]
    fn addr(self, c: u32) -> usize {
        self.first + (((c & self.mask) as usize) << self.shift)
    }

    /// Slot `c`.
    #[inline(always)]
    pub fn at(self, c: u32) -> Slot<'a, MIN> {
        Slot {
            addr: self.addr(c),
            len: 1 << self.shift,
            _slots: PhantomData,
        }
    }

    /// Wrap parity of counter `c` (the owner bit of pass `c / cnt`).
    #[inline(always)]
    pub fn parity(self, c: u32) -> bool {
        c & (self.mask + 1) != 0
    }
}

/// A [`Cursor`] over slots of exactly `MIN` bytes (a CQ's 32-byte entries): the address of a
/// slot is a shift by a constant, so a loop needs one register less and no variable shift.
/// Only [`Slots::exact_cursor`] makes one, after checking the stride.
#[derive(Debug, Clone, Copy)]
pub struct ExactCursor<'a, const MIN: usize> {
    first: usize,
    mask: u32,
    _slots: PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> ExactCursor<'a, MIN> {
    /// Slot `c`.
    #[inline(always)]
    pub fn at(self, c: u32) -> Slot<'a, MIN> {
        Slot {
            addr: self.first + (c & self.mask) as usize * MIN,
            len: MIN,
            _slots: PhantomData,
        }
    }

    /// The counter bit that is the wrap parity (the slot count): counter `c` is in an odd
    /// pass when `c & wrap_bit() != 0`.
    #[inline(always)]
    pub fn wrap_bit(self) -> u32 {
        self.mask + 1
    }
}

impl<const MIN: usize> Slots<MIN> {
    /// `geom`'s slots of `ring`; `None` when the geometry does not fit the promise above.
    pub fn new(ring: Ring, geom: Geometry) -> Option<Self> {
        let stride = 1usize.checked_shl(geom.shift)?;
        let bytes = (geom.cnt as usize).checked_mul(stride)?;
        let fits = geom.cnt.is_power_of_two()
            && stride >= MIN
            && stride % 8 == 0
            && ring.fits(geom.base, bytes)
            && ring.addr(geom.base) % 8 == 0;
        fits.then(|| Self {
            first: ring.addr(geom.base),
            mask: geom.cnt - 1,
            ring,
            geom,
        })
    }

    /// The slots' geometry.
    #[inline(always)]
    pub fn geom(&self) -> Geometry {
        self.geom
    }

    /// The whole region.
    #[inline(always)]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Counter `c`'s slot, for several accesses with one address computation.
    #[inline(always)]
    pub fn at(&self, c: u32) -> Slot<'_, MIN> {
        self.cursor().at(c)
    }

    /// The ring's addressing as a copyable value (see [`Cursor`]).
    #[inline(always)]
    pub fn cursor(&self) -> Cursor<'_, MIN> {
        Cursor {
            first: self.first,
            mask: self.mask,
            shift: self.geom.shift,
            _slots: PhantomData,
        }
    }

    /// The addressing of slots exactly `MIN` bytes long; `None` when the stride is larger.
    #[inline(always)]
    pub fn exact_cursor(&self) -> Option<ExactCursor<'_, MIN>> {
        (1usize << self.geom.shift == MIN).then_some(ExactCursor {
            first: self.first,
            mask: self.mask,
            _slots: PhantomData,
        })
    }

    /// Copies `src` to offset `at` of counter `c`'s slot; false (nothing written) when it would
    /// leave the slot.
    #[inline(always)]
    pub fn write(&self, c: u32, at: usize, src: &[u8]) -> bool {
        self.at(c).write_at(at, src)
    }
}

/// One slot of a [`Slots`] (borrowed from it, so the region outlives it).
///
/// Guarantee, on which backends may build their own raw accessors: while the slot value is
/// usable, `addr()..addr() + len()` lies inside a live [`HostMapped`] region, is 8-byte
/// aligned at `addr()`, and `len()` is a power of two at least `MIN` and a multiple of 8.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a, const MIN: usize> {
    addr: usize,
    /// Bytes in the slot (the stride, at least `MIN`).
    len: usize,
    _slots: PhantomData<&'a Slots<MIN>>,
}

impl<'a, const MIN: usize> Slot<'a, MIN> {
    /// Host address of the slot's byte 0 (see the type's guarantee).
    #[inline(always)]
    pub fn addr(self) -> usize {
        self.addr
    }

    /// Bytes in the slot (the ring's stride).
    #[inline(always)]
    pub fn len(self) -> usize {
        self.len
    }

    /// Always false: a slot has at least `MIN` bytes, and at least 8.
    #[inline(always)]
    pub fn is_empty(self) -> bool {
        false
    }

    /// Acquire-loads the 8 bytes at offset `AT` (an ownership word).
    #[inline(always)]
    pub fn load8<const AT: usize>(self) -> [u8; 8] {
        const { assert!(AT + 8 <= MIN && AT % 8 == 0) };
        // SAFETY: the address came from `Slots::at`, so the slot is inside a live region (the
        // borrow keeps it alive; `Slots::new` checked the geometry), `AT + 8 <= MIN <= stride`,
        // and slot and `AT` are 8-byte aligned; the device writes the word concurrently, hence
        // an atomic.
        let word = unsafe { AtomicU64::from_ptr((self.addr + AT) as *mut u64) };
        word.load(Ordering::Acquire).to_ne_bytes()
    }

    /// Acquire-loads the byte at offset `AT` (an owner byte written last by its producer).
    #[inline(always)]
    pub fn load1<const AT: usize>(self) -> u8 {
        const { assert!(AT < MIN) };
        // SAFETY: inside the slot (`AT < MIN <= stride`), inside a live region (as in `load8`);
        // `AtomicU8` has alignment 1; the other side writes the byte concurrently.
        unsafe { AtomicU8::from_ptr((self.addr + AT) as *mut u8) }.load(Ordering::Acquire)
    }

    /// Release-stores the byte at offset `AT` (an owner byte: publishes what was written
    /// before it).
    #[inline(always)]
    pub fn store1<const AT: usize>(self, v: u8) {
        const { assert!(AT < MIN) };
        // SAFETY: as in `load1`.
        unsafe { AtomicU8::from_ptr((self.addr + AT) as *mut u8) }.store(v, Ordering::Release);
    }

    /// Copies the `N` bytes at offset `AT`.
    #[inline(always)]
    pub fn read<const AT: usize, const N: usize>(self) -> [u8; N] {
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
    pub fn byte<const AT: usize>(self) -> u8 {
        self.read::<AT, 1>()[0]
    }

    /// Copies `dst.len()` bytes from offset `at`; false (and `dst` untouched) past the slot's
    /// end.
    #[inline(always)]
    pub fn read_at(self, at: usize, dst: &mut [u8]) -> bool {
        if at > self.len || dst.len() > self.len - at {
            return false;
        }
        // SAFETY: `at..at + dst.len()` lies inside the slot (checked above), inside a live
        // region (as in `load8`); `dst` is ordinary, exclusively borrowed memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr + at) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }

    /// Copies `src` to offset `at`; false (nothing written) past the slot's end.
    #[inline(always)]
    pub fn write_at(self, at: usize, src: &[u8]) -> bool {
        if at > self.len || src.len() > self.len - at {
            return false;
        }
        // SAFETY: `at..at + src.len()` lies inside the slot (checked above), inside a live
        // region (as in `load8`); `src` is ordinary memory, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.addr + at) as *mut u8, src.len());
        }
        true
    }

    /// Stores `v` at offset `AT` (plain stores: WQE bodies, published later by
    /// [`Slot::publish4`]).
    #[inline(always)]
    pub fn put<const AT: usize, const N: usize>(self, v: [u8; N]) {
        const { assert!(AT + N <= MIN) };
        // SAFETY: inside the slot (`AT + N <= MIN <= stride`), inside a live region (as in
        // `load8`); unaligned stores of bytes the device only reads.
        unsafe { std::ptr::write_unaligned((self.addr + AT) as *mut [u8; N], v) };
    }

    /// Stores `v` at a run-time offset; false (nothing stored) past the slot's end.
    #[inline(always)]
    pub fn put_at<const N: usize>(self, at: usize, v: [u8; N]) -> bool {
        if N > self.len || at > self.len - N {
            return false;
        }
        // SAFETY: `at + N <= len`, the slot's size, inside a live region (as in `load8`).
        unsafe { std::ptr::write_unaligned((self.addr + at) as *mut [u8; N], v) };
        true
    }

    /// Passes the first `n` bytes of the slot, in place, to `bar.write_wc(offset, ..)` (a
    /// BlueFlame-style copy straight from a send-queue ring); `None` past the slot's end. The
    /// same rules as [`Slot::lend`].
    #[inline(always)]
    pub fn write_wc_from(
        self,
        n: usize,
        bar: &dyn Mmio,
        offset: usize,
    ) -> Option<Result<(), MmioError>> {
        self.lend(n, |block| bar.write_wc(offset, block))
    }

    /// Lends the first `n` bytes of the slot, in place, to `f` (a BlueFlame copy straight from
    /// a send-queue ring, through a BAR or a typed doorbell handle); `None` past the slot's end.
    ///
    /// Only for rings the device never writes, and while no other party writes this slot: the
    /// bytes are lent as a shared slice for the duration of the call (the one place a
    /// reference covers ring memory; see [`HostMapped`]).
    #[inline(always)]
    pub fn lend<R>(self, n: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if n > self.len {
            return None;
        }
        // SAFETY: `n <= len`, inside a live region (as in `load8`). Nothing writes it while
        // the slice lives: the device only reads send-queue memory, and the caller holds the
        // queue whose slot this is (the host writes a slot only under it).
        let block = unsafe { std::slice::from_raw_parts(self.addr as *const u8, n) };
        Some(f(block))
    }

    /// Lends the whole slot, in place, to `f` to encode an entry into (a work request encoded
    /// straight into its ring slot, with no copy through a buffer of its own).
    ///
    /// Only for a work-ring slot the host holds: the device has released it and will not read
    /// it until the host passes it on (its ownership byte, then the doorbell); the bytes are
    /// lent as an exclusive slice for the duration of the call, so nothing else may read or
    /// write the slot meanwhile (see [`HostMapped`]). `f` should leave the ownership byte
    /// alone and the caller store it last ([`Slot::store1`]).
    #[inline(always)]
    pub fn lend_mut<R>(self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // SAFETY: the slot's `len` bytes lie inside a live region (as in `load8`). Nobody
        // else touches them while the slice lives: the caller holds the queue whose slot this
        // is, and the device reads a work-ring slot only after the host passed it on.
        let block = unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) };
        f(block)
    }

    /// Volatile store of the dword at offset `AT` (an ownership word, after a barrier).
    #[inline(always)]
    pub fn publish4<const AT: usize>(self, v: [u8; 4]) {
        const { assert!(AT + 4 <= MIN && AT % 4 == 0) };
        // SAFETY: inside the slot, 4-byte aligned (slots are 8-aligned), inside a live region.
        unsafe { std::ptr::write_volatile((self.addr + AT) as *mut u32, u32::from_ne_bytes(v)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use portverbs_hal::mmio::MemRegisters;

    use crate::SoftDma;

    fn ring(words: usize) -> Ring {
        Ring::new(SoftDma::alloc(words * 8).unwrap())
    }

    fn g(base: usize, shift: u32, cnt: u32) -> Geometry {
        Geometry { base, shift, cnt }
    }

    #[test]
    fn geometry_rounds_up_and_refuses_what_counters_cannot_address() {
        let geom = Geometry::for_at_least(100, 48).unwrap();
        assert_eq!((geom.entries(), geom.stride()), (128, 64));
        assert_eq!(geom.bytes(), 128 * 64);
        assert_eq!(geom.offset(129), 64);
        assert_eq!(geom.slot(u32::MAX), 127);
        assert_eq!(Geometry::for_at_least(0, 0).unwrap().entries(), 1);
        assert!(Geometry::for_at_least(1 << 24, 8).is_some());
        assert!(
            Geometry::for_at_least((1 << 24) + 1, 8).is_none(),
            "2^25 entries"
        );
        assert!(Geometry::for_at_least(u32::MAX, 8).is_none());
        assert!(
            Geometry::for_at_least(2, usize::MAX).is_none(),
            "overflowing stride"
        );
        assert!(
            Geometry::for_at_least(1 << 20, 1 << 60).is_none(),
            "overflowing bytes"
        );
    }

    #[test]
    fn wrap_parity_flips_each_pass_and_decides_ownership() {
        let geom = g(0, 5, 4);
        let mut p = Producer::<DeviceToHost>::new(geom);
        let mut c = Consumer::<DeviceToHost>::new(geom);
        // Entries initialised with owner = 1 are not the consumer's on pass 0.
        assert!(!c.owns(true));
        for _ in 0..4 {
            assert!(!p.owner_bit());
            assert!(c.owns(p.owner_bit()));
            p.advance(1);
            c.advance(1);
        }
        assert!(p.owner_bit());
        assert!(c.owns(true));
        assert!(!c.owns(false), "a stale entry of pass 0 is not consumed");
        assert_eq!((p.offset(), c.offset()), (0, 0));
        // The counter wraps at 2^32: 2^32 is a multiple of any count, so parity stays exact.
        let mut c = Consumer::<DeviceToHost>::new(geom);
        c.advance(u32::MAX);
        assert!(c.owns(true), "pass 2^30 - 1 is odd");
        c.advance(1);
        assert_eq!(c.tail(), 0);
        assert!(c.owns(false));
        p.reset();
        c.reset();
        assert_eq!((p.head(), c.tail()), (0, 0));
    }

    #[test]
    fn owner_bytes_hand_entries_over_across_passes() {
        // A device-to-host ring of four 16-byte entries, owner byte last, initialised "not
        // yet written" (owner 1 on pass 0), as the software device's CQs and EQs are.
        let slots = Slots::<16>::new(ring(8), g(0, 4, 4)).unwrap();
        for i in 0..4 {
            slots.at(i).store1::<15>(1);
        }
        let mut p = Producer::<DeviceToHost>::new(slots.geom());
        let mut c = Consumer::<DeviceToHost>::new(slots.geom());
        let owned = |c: &Consumer<DeviceToHost>| c.owns(slots.at(c.tail()).load1::<15>() & 1 == 1);
        for pass in 0..3u8 {
            for i in 0..4u8 {
                assert!(!owned(&c), "pass {pass} entry {i}: not written yet");
                let slot = slots.at(p.head());
                assert!(slot.write_at(0, &[pass * 4 + i; 15]));
                slot.store1::<15>(u8::from(p.owner_bit()));
                p.advance(1);
                assert!(owned(&c), "pass {pass} entry {i}: written");
                assert_eq!(slots.at(c.tail()).byte::<14>(), pass * 4 + i);
                c.advance(1);
            }
            assert!(p.is_full(c.tail().wrapping_sub(4), 4));
        }
    }

    #[test]
    fn full_check_survives_counter_wrap() {
        let mut p = Producer::<HostToDevice>::new(g(0, 6, 8));
        p.advance(u32::MAX - 2);
        let tail = u32::MAX - 6;
        assert!(!p.is_full(tail, 8));
        p.advance(4);
        assert!(p.is_full(tail, 8));
        assert_eq!(p.geometry(), g(0, 6, 8));
    }

    #[test]
    fn ring_accesses_round_trip_and_stay_inside() {
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
        // The region's own accessors see the same bytes.
        let mut got = [0u8; 3];
        r.mem().read(3, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3]);
        r.mem().store_u64(16, u64::from_ne_bytes([5; 8])).unwrap();
        assert_eq!(r.load8(16), Some([5; 8]));
        assert_eq!(r.raw().len(), 32);
    }

    #[test]
    fn slots_refuse_bad_geometry_once() {
        // 8 words = 64 bytes.
        assert!(Slots::<32>::new(ring(8), g(0, 5, 2)).is_some());
        assert!(
            Slots::<32>::new(ring(8), g(0, 5, 4)).is_none(),
            "past the end"
        );
        assert!(
            Slots::<32>::new(ring(8), g(32, 5, 2)).is_none(),
            "base + bytes past the end"
        );
        assert!(
            Slots::<32>::new(ring(8), g(0, 5, 3)).is_none(),
            "not a power of two"
        );
        assert!(Slots::<32>::new(ring(8), g(0, 5, 0)).is_none(), "no slots");
        assert!(
            Slots::<32>::new(ring(8), g(0, 4, 2)).is_none(),
            "slots below MIN"
        );
        assert!(
            Slots::<4>::new(ring(8), g(0, 2, 2)).is_none(),
            "stride not a multiple of 8"
        );
        assert!(
            Slots::<32>::new(ring(8), g(4, 5, 1)).is_none(),
            "misaligned base"
        );
        assert!(
            Slots::<32>::new(ring(8), g(0, 70, 1)).is_none(),
            "overflowing stride"
        );
        assert!(
            Slots::<32>::new(ring(8), g(usize::MAX, 5, 1)).is_none(),
            "overflowing base"
        );
        // A region whose own address is misaligned (application memory) is refused too.
        let mut v = vec![0u8; 80];
        let skew = (8 - v.as_mut_ptr() as usize % 8) % 8 + 4;
        // SAFETY: `v` outlives the region and is not touched while it lives.
        let memory =
            unsafe { portverbs_hal::dma::HostMemory::from_raw_parts(v.as_mut_ptr().add(skew), 64) };
        let odd = Ring::new(SoftDma::from_host(memory, None).unwrap());
        assert!(
            Slots::<32>::new(odd.clone(), g(0, 5, 2)).is_none(),
            "misaligned region"
        );
        assert!(Slots::<32>::new(odd.clone(), g(4, 5, 1)).is_some());
        drop(odd);
        drop(v);
    }

    #[test]
    fn slots_address_each_slot_and_bound_run_time_offsets() {
        let s = Slots::<32>::new(ring(8), g(32, 5, 1)).unwrap();
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
        assert_eq!((slot.len(), slot.addr()), (32, s.ring().raw().base() + 32));
        slot.put::<8, 4>([6; 4]);
        assert_eq!(slot.byte::<9>(), 6);
        assert!(slot.put_at(28, [3; 4]));
        assert_eq!(slot.read::<28, 4>(), [3; 4]);
        assert!(!slot.put_at(29, [3; 4]), "past the slot");
        assert!(!slot.put_at(usize::MAX, [3; 4]), "overflowing offset");
        assert!(!slot.put_at(0, [3; 40]), "larger than the slot");
        slot.store1::<31>(0x81);
        assert_eq!(slot.load1::<31>(), 0x81);
        let mut out = [0u8; 4];
        assert!(slot.read_at(28, &mut out));
        assert_eq!(out, [3, 3, 3, 0x81]);
        assert!(!slot.read_at(29, &mut out), "past the slot");
        assert!(!slot.read_at(usize::MAX, &mut []), "overflowing offset");
        assert!(slot.write_at(0, &[1; 32]));
        assert!(!slot.write_at(1, &[1; 32]), "past the slot");
        // A BlueFlame-style copy lends the slot's bytes, in place, to the MMIO write.
        slot.put::<24, 8>([0x80, 0, 0, 2, 0, 0, 0, 0]);
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
        // `lend` hands the same bytes to a closure.
        assert_eq!(
            slot.lend(32, |b| b[24..].to_vec()),
            Some(out[24..].to_vec())
        );
        assert_eq!(slot.lend(33, |b| b.len()), None, "longer than the slot");
    }

    #[test]
    fn cursors_address_the_same_slots() {
        // The exact cursor addresses the same slots as the general one, and exists only for
        // slots of exactly `MIN` bytes.
        let four = Slots::<32>::new(ring(16), g(0, 5, 4)).unwrap();
        let exact = four.exact_cursor().unwrap();
        let cursor = four.cursor();
        for c in [0, 1, 3, 4, 7, 0xffff_ffff] {
            exact.at(c).publish4::<0>(c.to_ne_bytes());
            assert_eq!(four.at(c).read::<0, 4>(), c.to_ne_bytes(), "counter {c}");
            assert_eq!(cursor.at(c).addr(), exact.at(c).addr(), "counter {c}");
            assert_eq!(
                c & exact.wrap_bit() != 0,
                four.geom().parity(c),
                "counter {c}"
            );
            assert_eq!(cursor.parity(c), four.geom().parity(c), "counter {c}");
        }
        let wide = Slots::<32>::new(ring(16), g(0, 6, 2)).unwrap();
        assert!(wide.exact_cursor().is_none(), "64-byte slots");
    }
}

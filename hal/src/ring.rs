//! Ring geometry and index ownership.
//!
//! Every queue is a power-of-two ring of fixed-size entries addressed by a free-running counter.
//! One side produces, the other consumes, and which side is which is part of the *type*:
//!
//! | ring | direction | host holds | device holds |
//! |---|---|---|---|
//! | SQ, RQ, SRQ | [`HostToDevice`] | `Producer<HostToDevice>` | `Consumer<HostToDevice>` |
//! | CQ, EQ | [`DeviceToHost`] | `Consumer<DeviceToHost>` | `Producer<DeviceToHost>` |
//!
//! A [`Producer`] can only advance the head and a [`Consumer`] only the tail, so "advance the
//! other side's index" does not compile. Each side keeps a private copy of its own counter and
//! publishes it (doorbell record, owner bit); the peer's counter is untrusted and must be masked
//! before use ([`RingGeometry::slot`]).
//!
//! Ownership of an entry in a device-to-host ring uses the *wrap parity* rule shared by mlx4 and
//! the software device: the producer writes each entry with an owner bit equal to the parity of
//! the pass it is on, `(counter >> log_entries) & 1`; the consumer owns the entry at its counter
//! iff the bit equals the parity of *its* counter.

use std::marker::PhantomData;

/// Marker: the host produces and the device consumes (work queues).
#[derive(Debug, Clone, Copy)]
pub enum HostToDevice {}

/// Marker: the device produces and the host consumes (completion and event queues).
#[derive(Debug, Clone, Copy)]
pub enum DeviceToHost {}

/// Size and stride of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    log_entries: u8,
    log_stride: u8,
}

impl RingGeometry {
    /// A ring of `2^log_entries` entries of `2^log_stride` bytes.
    ///
    /// # Panics
    /// If the ring would not fit in `usize` bytes or exceeds 2^24 entries (the 24-bit counters of
    /// IB devices); these are programming errors, never device input.
    pub fn new(log_entries: u8, log_stride: u8) -> Self {
        assert!(log_entries <= 24, "ring of 2^{log_entries} entries");
        assert!(
            u32::from(log_entries) + u32::from(log_stride) < usize::BITS,
            "ring too large"
        );
        Self {
            log_entries,
            log_stride,
        }
    }

    /// The smallest ring holding at least `entries` entries of at least `stride` bytes.
    pub fn for_at_least(entries: u32, stride: usize) -> Self {
        let log_entries = entries.max(1).next_power_of_two().trailing_zeros() as u8;
        let log_stride = stride.max(1).next_power_of_two().trailing_zeros() as u8;
        Self::new(log_entries, log_stride)
    }

    /// Number of entries.
    pub fn entries(self) -> u32 {
        1 << self.log_entries
    }

    /// log2 of the number of entries.
    pub fn log_entries(self) -> u8 {
        self.log_entries
    }

    /// Entry size in bytes.
    pub fn stride(self) -> usize {
        1 << self.log_stride
    }

    /// log2 of the entry size.
    pub fn log_stride(self) -> u8 {
        self.log_stride
    }

    /// Total bytes.
    pub fn bytes(self) -> usize {
        self.stride() << self.log_entries
    }

    /// Slot index of a counter (masks untrusted counters too).
    pub fn slot(self, counter: u32) -> u32 {
        counter & (self.entries() - 1)
    }

    /// Byte offset of the entry for `counter`.
    pub fn offset(self, counter: u32) -> usize {
        (self.slot(counter) as usize) << self.log_stride
    }

    /// Wrap parity of a counter: which pass through the ring it is on, modulo 2.
    pub fn parity(self, counter: u32) -> bool {
        (counter >> self.log_entries) & 1 == 1
    }
}

/// The producing side's cursor.
#[derive(Debug, Clone)]
pub struct Producer<D> {
    geometry: RingGeometry,
    head: u32,
    _dir: PhantomData<D>,
}

impl<D> Producer<D> {
    /// A producer at counter 0.
    pub fn new(geometry: RingGeometry) -> Self {
        Self {
            geometry,
            head: 0,
            _dir: PhantomData,
        }
    }

    /// Geometry of the ring.
    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Counter of the next entry to produce.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Byte offset of the next entry.
    pub fn offset(&self) -> usize {
        self.geometry.offset(self.head)
    }

    /// Owner bit to write into the next entry (wrap parity of the head).
    pub fn owner_bit(&self) -> bool {
        self.geometry.parity(self.head)
    }

    /// True when `head - consumer_tail` has reached `capacity` (the consumer counter is masked
    /// arithmetic: counters are free-running and wrap).
    pub fn is_full(&self, consumer_tail: u32, capacity: u32) -> bool {
        self.head.wrapping_sub(consumer_tail) >= capacity
    }

    /// Produces `n` entries.
    pub fn advance(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
    }

    /// Resets to counter 0 (queue reset).
    pub fn reset(&mut self) {
        self.head = 0;
    }
}

/// The consuming side's cursor.
#[derive(Debug, Clone)]
pub struct Consumer<D> {
    geometry: RingGeometry,
    tail: u32,
    _dir: PhantomData<D>,
}

impl<D> Consumer<D> {
    /// A consumer at counter 0.
    pub fn new(geometry: RingGeometry) -> Self {
        Self {
            geometry,
            tail: 0,
            _dir: PhantomData,
        }
    }

    /// Geometry of the ring.
    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Counter of the next entry to consume.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Byte offset of the next entry.
    pub fn offset(&self) -> usize {
        self.geometry.offset(self.tail)
    }

    /// True when an entry whose owner bit is `owner_bit` belongs to the consumer now.
    pub fn owns(&self, owner_bit: bool) -> bool {
        owner_bit == self.geometry.parity(self.tail)
    }

    /// Consumes `n` entries.
    pub fn advance(&mut self, n: u32) {
        self.tail = self.tail.wrapping_add(n);
    }

    /// Resets to counter 0 (queue reset).
    pub fn reset(&mut self) {
        self.tail = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_rounds_up_to_powers_of_two() {
        let g = RingGeometry::for_at_least(100, 48);
        assert_eq!(g.entries(), 128);
        assert_eq!(g.stride(), 64);
        assert_eq!(g.bytes(), 128 * 64);
        assert_eq!(g.offset(129), 64);
        assert_eq!(g.slot(u32::MAX), 127);
    }

    #[test]
    fn owner_parity_flips_each_pass() {
        let g = RingGeometry::new(2, 5);
        let mut p = Producer::<DeviceToHost>::new(g);
        let mut c = Consumer::<DeviceToHost>::new(g);
        // Freshly initialised entries carry owner = 1: not owned by the consumer on pass 0.
        assert!(!c.owns(true));
        for _ in 0..4 {
            assert!(!p.owner_bit());
            assert!(c.owns(p.owner_bit()));
            p.advance(1);
            c.advance(1);
        }
        assert!(p.owner_bit());
        assert!(c.owns(true));
        assert!(
            !c.owns(false),
            "stale entry from pass 0 must not be consumed"
        );
    }

    #[test]
    fn full_check_survives_counter_wrap() {
        let g = RingGeometry::new(3, 6);
        let mut p = Producer::<HostToDevice>::new(g);
        p.advance(u32::MAX - 2);
        let tail = u32::MAX - 6;
        assert!(!p.is_full(tail, 8));
        p.advance(4); // wraps past zero
        assert!(p.is_full(tail, 8));
    }
}

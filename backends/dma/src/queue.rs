//! Queue-level rings: a ring's [`Slots`] paired with its one counter and its one ownership
//! rule, so that no backend writes ring arithmetic or owner-bit handling of its own.
//!
//! * [`WorkRing`] — a host-to-device ring (send and receive queues). Its producer counter is
//!   not kept here: verbs-core owns the one producer counter of each work queue and passes it
//!   to every call (the HAL's `write_wqe(counter, ..)` and `ring_doorbell(from, to)`). What is
//!   here is the rule the producer follows: the owner bit of counter `c` is its wrap parity
//!   ([`WorkRing::owner_bit`]), and before the first pass every slot holds the format's "not
//!   yet valid" bytes ([`WorkRing::init`], written once here for every format: mlx4's control
//!   segment with owner 1 and stamped blocks, the software device's owner byte). The device
//!   side consumes such a ring with a [`Consumer<HostToDevice>`](Consumer).
//! * [`EventRing`] — a device-to-host ring (completion and event queues): the slots, the
//!   consumer counter, and the ownership test, parametrised once per format by the byte that
//!   carries the owner bit (`AT`) and the bit's mask (`MASK`). [`EventRing::poll`] returns the
//!   entry at the consumer counter when the host owns it; [`EventRing::owns_byte`] is the same
//!   test without a branch, for a loop that keeps its counter in a register; and
//!   [`EventRing::init_owner`] marks every entry "not yet written" for the counters that will
//!   use it next. The device side produces with a [`Producer<DeviceToHost>`](Producer) and
//!   [`EventRing::with_owner`] (or, in memory that is not a [`Slots`], the same rule through
//!   [`EventRing::not_valid_byte`] and [`Geometry`]).
//!
//! Ownership follows the wrap-parity rule of [`crate::ring`]: the producer of pass `p` writes
//! owner bit `p & 1`, and the consumer owns the entry at its counter when the bit equals its
//! counter's parity. An entry is therefore "not yet written" for counter `c` when its bit is
//! the *opposite* of `c`'s parity.

use std::ops::Deref;

use crate::ring::{Consumer, DeviceToHost, Geometry, Slot, Slots};

#[cfg(doc)]
use crate::ring::{HostToDevice, Producer};

/// A host-to-device ring: slots the host fills at the counter its caller keeps.
#[derive(Debug, Clone)]
pub struct WorkRing<const MIN: usize> {
    slots: Slots<MIN>,
}

impl<const MIN: usize> WorkRing<MIN> {
    /// The ring over `slots` (not yet initialised: see [`WorkRing::init`]).
    pub fn new(slots: Slots<MIN>) -> Self {
        Self { slots }
    }

    /// Writes `not_valid` — the format's bytes of a slot the device must not take on pass 0
    /// (its owner bit set, and whatever else the format wants, such as stamps) — from byte 0 of
    /// every slot. False (nothing written) when it is longer than a slot. Only while the device
    /// does not read the ring (queue creation or reset).
    pub fn init(&self, not_valid: &[u8]) -> bool {
        if not_valid.len() > self.slots.geom().stride() {
            return false;
        }
        for c in 0..self.slots.geom().entries() {
            let _ = self.slots.write(c, 0, not_valid);
        }
        true
    }

    /// The owner bit a WQE written at counter `counter` carries (its wrap parity): the device
    /// takes the slot when the bit equals the parity of *its* consumer counter.
    #[inline(always)]
    pub fn owner_bit(&self, counter: u32) -> bool {
        self.slots.geom().parity(counter)
    }

    /// The slots.
    #[inline(always)]
    pub fn slots(&self) -> &Slots<MIN> {
        &self.slots
    }
}

impl<const MIN: usize> Deref for WorkRing<MIN> {
    type Target = Slots<MIN>;

    #[inline(always)]
    fn deref(&self) -> &Slots<MIN> {
        &self.slots
    }
}

/// A device-to-host ring whose entries carry their owner bit in byte `AT` under `MASK`: the
/// slots, the host's consumer counter and the ownership test.
#[derive(Debug, Clone)]
pub struct EventRing<const MIN: usize, const AT: usize, const MASK: u8> {
    slots: Slots<MIN>,
    consumer: Consumer<DeviceToHost>,
}

impl<const MIN: usize, const AT: usize, const MASK: u8> EventRing<MIN, AT, MASK> {
    /// The ring over `slots`, consuming from counter `tail` (0 for a new queue; a resized CQ
    /// continues its counters in its new buffer). The entries are left as they are (see
    /// [`EventRing::init_owner`]).
    pub fn new(slots: Slots<MIN>, tail: u32) -> Self {
        const { assert!(AT < MIN && MASK != 0) };
        let mut consumer = Consumer::new(slots.geom());
        consumer.advance(tail);
        Self { slots, consumer }
    }

    /// The owner byte (`MASK` set or clear, other bits 0) of an entry not yet written for
    /// counter `counter` of a ring of geometry `geom`: the bit opposite to the counter's parity.
    #[inline(always)]
    pub fn not_valid_byte(geom: Geometry, counter: u32) -> u8 {
        if geom.parity(counter) { 0 } else { MASK }
    }

    /// Marks every entry of `slots` not yet written for the counters `first..first + cnt` that
    /// will use it next (byte `AT` of each becomes [`EventRing::not_valid_byte`]). Before the
    /// ring is given to the device.
    pub fn init_owner(slots: &Slots<MIN>, first: u32) {
        Self::init_owner_with(slots.geom(), first, |at, byte| {
            let _ = slots.ring().write(at, &[byte]);
        });
    }

    /// [`EventRing::init_owner`] for ring memory that is not a [`Slots`] (the emulated HCA's
    /// view of a driver's buffer): calls `store(offset, byte)` with the region offset of every
    /// entry's owner byte and the byte that marks it not yet written for the counter of
    /// `first..first + cnt` that uses it next.
    pub fn init_owner_with(geom: Geometry, first: u32, mut store: impl FnMut(usize, u8)) {
        for i in 0..geom.entries() {
            let c = first.wrapping_add(i);
            store(geom.offset(c) + AT, Self::not_valid_byte(geom, c));
        }
    }

    /// `byte` with its owner bit replaced by `owner` (what a producer writes as an entry's
    /// owner byte, with [`Producer::owner_bit`]).
    #[inline(always)]
    pub fn with_owner(byte: u8, owner: bool) -> u8 {
        (byte & !MASK) | if owner { MASK } else { 0 }
    }

    /// The ownership test, without a branch: whether the host owns the entry of counter
    /// `counter` whose owner byte is `byte`, in a ring whose wrap parity is the `wrap_bit` of
    /// the counter ([`crate::ring::Cursor::parity`]'s bit, `ExactCursor::wrap_bit`).
    #[inline(always)]
    pub fn owns_byte(byte: u8, counter: u32, wrap_bit: u32) -> bool {
        if MASK == 0x80 {
            // The sign bit, sign-extended to all ones or all zeros, compared with the
            // counter's wrap bit in one mask.
            let owner = i32::from(byte as i8 >> 7) as u32;
            (owner ^ counter) & wrap_bit == 0
        } else {
            (byte & MASK != 0) == (counter & wrap_bit != 0)
        }
    }

    /// Whether the host owns the entry of counter `counter` (an acquire load of its owner
    /// byte).
    #[inline(always)]
    pub fn owned_at(&self, counter: u32) -> bool {
        let wrap = self.slots.geom().entries();
        Self::owns_byte(self.slots.at(counter).load1::<AT>(), counter, wrap)
    }

    /// The entry at the consumer counter when the host owns it (its owner byte acquire-loaded,
    /// so the rest of it may be read after a `from_device` barrier); `None` while the device
    /// has not written it. The counter does not move (see [`EventRing::advance`]).
    #[inline(always)]
    pub fn poll(&self) -> Option<Slot<'_, MIN>> {
        // Everything but the owner byte is read before its acquire load, which later loads
        // may not move above.
        let tail = self.consumer.tail();
        let wrap = self.slots.geom().entries();
        let slot = self.slots.at(tail);
        Self::owns_byte(slot.load1::<AT>(), tail, wrap).then_some(slot)
    }

    /// Entries the host owns from the consumer counter on, at most the ring's size.
    pub fn pending(&self) -> u32 {
        let entries = self.slots.geom().entries();
        let tail = self.consumer.tail();
        (0..entries)
            .find(|&n| !self.owned_at(tail.wrapping_add(n)))
            .unwrap_or(entries)
    }

    /// Counter of the next entry to consume.
    #[inline(always)]
    pub fn tail(&self) -> u32 {
        self.consumer.tail()
    }

    /// Consumes `n` entries.
    #[inline(always)]
    pub fn advance(&mut self, n: u32) {
        self.consumer.advance(n);
    }

    /// Consumes the entries from [`EventRing::tail`] up to (not including) `counter`: for a
    /// polling loop that kept the counter in a register, starting from `tail()` (so `counter`
    /// is never behind it). One store, where [`EventRing::advance`] would reload the tail.
    #[inline(always)]
    pub fn advance_to(&mut self, counter: u32) {
        // No check: what a device wrote decided how far the loop went, and that never panics.
        self.consumer
            .advance(counter.wrapping_sub(self.consumer.tail()));
    }

    /// The slots.
    #[inline(always)]
    pub fn slots(&self) -> &Slots<MIN> {
        &self.slots
    }
}

impl<const MIN: usize, const AT: usize, const MASK: u8> Deref for EventRing<MIN, AT, MASK> {
    type Target = Slots<MIN>;

    #[inline(always)]
    fn deref(&self) -> &Slots<MIN> {
        &self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::SoftDma;
    use crate::ring::{Consumer, HostToDevice, Producer, Ring};

    /// 16-byte entries, owner bit 0x80 of the last byte (as mlx4's CQEs and EQEs).
    type High = EventRing<16, 15, 0x80>;
    /// 16-byte entries, owner bit 0x01 of the last byte (as the software device's).
    type Low = EventRing<16, 15, 0x01>;

    fn slots(cnt: u32) -> Slots<16> {
        let geom = Geometry {
            base: 0,
            shift: 4,
            cnt,
        };
        Slots::new(Ring::new(SoftDma::alloc(geom.bytes()).unwrap()), geom).unwrap()
    }

    /// The device side: writes entry `p.head()` with payload `v` and the producer's owner bit.
    fn produce<const M: u8>(s: &Slots<16>, p: &mut Producer<DeviceToHost>, v: u8) {
        let slot = s.at(p.head());
        assert!(slot.write_at(0, &[v; 15]));
        slot.store1::<15>(EventRing::<16, 15, M>::with_owner(v, p.owner_bit()));
        p.advance(1);
    }

    fn ownership_across_passes<const M: u8>(first: u32) {
        let s = slots(4);
        EventRing::<16, 15, M>::init_owner(&s, first);
        let mut ring = EventRing::<16, 15, M>::new(s.clone(), first);
        let mut p = Producer::<DeviceToHost>::new(s.geom());
        p.advance(first);
        for pass in 0..3u8 {
            for i in 0..4u8 {
                assert!(ring.poll().is_none(), "pass {pass} entry {i}: not written");
                assert_eq!(ring.pending(), 0);
                let v = pass * 4 + i;
                produce::<M>(&s, &mut p, v);
                assert_eq!(ring.pending(), 1);
                let slot = ring.poll().expect("written");
                assert_eq!(slot.byte::<3>(), v);
                ring.advance(1);
            }
            // The device fills the whole ring before the host looks: all four are owned.
            for i in 0..4 {
                produce::<M>(&s, &mut p, 100 + i);
            }
            assert_eq!(ring.pending(), 4, "a full ring");
            ring.advance(4);
        }
        assert_eq!(ring.tail(), first.wrapping_add(3 * 8));
        ring.advance_to(first.wrapping_add(3 * 8 + 2));
        assert_eq!(
            ring.tail(),
            first.wrapping_add(3 * 8 + 2),
            "a loop's own counter"
        );
    }

    #[test]
    fn event_rings_hand_entries_over_across_passes_for_both_owner_bits() {
        ownership_across_passes::<0x80>(0);
        ownership_across_passes::<0x01>(0);
        // Counters running through 2^32 (a multiple of every ring size): parity stays exact.
        ownership_across_passes::<0x80>(u32::MAX - 5);
        ownership_across_passes::<0x01>(u32::MAX - 5);
        // A ring whose first counter is not 0 (a resized CQ continues its counters).
        ownership_across_passes::<0x80>(6);
    }

    #[test]
    fn owner_init_marks_each_entry_for_the_counter_that_uses_it_next() {
        let s = slots(4);
        // Counters 6..10 use slots 2, 3 (pass 1: parity 1) and 0, 1 (pass 2: parity 0).
        High::init_owner(&s, 6);
        let bytes: Vec<u8> = (0..4).map(|i| s.at(i).byte::<15>()).collect();
        assert_eq!(bytes, [0x80, 0x80, 0, 0]);
        Low::init_owner(&s, 0);
        let bytes: Vec<u8> = (0..4).map(|i| s.at(i).byte::<15>()).collect();
        assert_eq!(bytes, [1; 4]);
        assert_eq!(Low::not_valid_byte(s.geom(), 4), 0);
        // The same rule for memory reached by offset.
        let mut seen = Vec::new();
        High::init_owner_with(s.geom(), 6, |at, b| seen.push((at, b)));
        assert_eq!(seen, [(47, 0), (63, 0), (15, 0x80), (31, 0x80)]);
        assert_eq!(High::not_valid_byte(s.geom(), 3), 0x80);
        // A zeroed ring without the init would look owned on pass 0.
        let fresh = High::new(slots(4), 0);
        assert!(fresh.poll().is_some());
        assert_eq!(fresh.pending(), 4);
    }

    #[test]
    fn the_branch_free_test_agrees_with_the_parity_rule() {
        for byte in [0x00, 0x01, 0x7f, 0x80, 0x81, 0xfe, 0xff] {
            for log in 0..24 {
                let wrap = 1u32 << log;
                for counter in [0, 1, wrap - 1, wrap, wrap + 1, 3 * wrap - 1, u32::MAX] {
                    let parity = counter & wrap != 0;
                    assert_eq!(
                        High::owns_byte(byte, counter, wrap),
                        (byte & 0x80 != 0) == parity,
                        "{byte:#x} {counter:#x} {wrap:#x}"
                    );
                    assert_eq!(
                        Low::owns_byte(byte, counter, wrap),
                        (byte & 0x01 != 0) == parity,
                        "{byte:#x} {counter:#x} {wrap:#x}"
                    );
                }
            }
        }
        assert_eq!(High::with_owner(0x7f, true), 0xff);
        assert_eq!(High::with_owner(0xff, false), 0x7f);
        assert_eq!(Low::with_owner(0xfe, true), 0xff);
    }

    #[test]
    fn work_ring_init_writes_every_slot_and_refuses_what_does_not_fit() {
        let ring = WorkRing::new(slots(4));
        assert!(ring.init(&[1, 2, 3]));
        for c in 0..4 {
            assert_eq!(ring.at(c).read::<0, 4>(), [1, 2, 3, 0], "slot {c}");
        }
        assert!(!ring.init(&[9; 17]), "longer than a slot");
        assert_eq!(ring.at(0).byte::<0>(), 1, "nothing written");
        assert!(ring.init(&[7; 16]));
        assert_eq!(ring.slots().at(3).byte::<15>(), 7);
    }

    #[test]
    fn work_ring_owner_bits_and_the_device_side_consumer_agree_across_the_wrap() {
        // The host writes owner = wrap parity of the caller's counter; the device's consumer
        // takes the slot when that bit equals its own counter's parity, and full/empty follow
        // from the free-running counters, also where they wrap at 2^32.
        let ring = WorkRing::new(slots(4));
        let mut p = Producer::<HostToDevice>::new(ring.geom());
        let mut c = Consumer::<HostToDevice>::new(ring.geom());
        let start = u32::MAX - 9;
        p.advance(start);
        c.advance(start);
        for _ in 0..5 {
            for _ in 0..4 {
                assert!(!p.is_full(c.tail(), 4));
                let owner = ring.owner_bit(p.head());
                ring.at(p.head()).store1::<0>(u8::from(owner));
                p.advance(1);
            }
            assert!(p.is_full(c.tail(), 4), "four posted, none consumed");
            for _ in 0..4 {
                let owner = ring.at(c.tail()).load1::<0>() == 1;
                assert!(c.owns(owner), "counter {:#x}", c.tail());
                c.advance(1);
            }
            assert_eq!(p.head(), c.tail(), "empty");
            // A slot of the last pass is not the device's on the next one.
            let stale = ring.at(c.tail()).load1::<0>() == 1;
            assert!(!c.owns(stale));
        }
        assert!(p.head() < start, "the counters wrapped");
    }
}

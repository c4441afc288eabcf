//! The endpoint table: a slab indexed by the low bits of the local communication ID, each slot
//! INVALID (free), RESERVED (owned by the application but invisible to the wire: IDLE or
//! LISTEN) or VALID (messages may match it). A slot's generation is bumped when it is freed,
//! and the ID carries it, so a stale handle or message never reaches the slot's next owner.

use super::conn::Conn;
use super::types::{CmId, CmState};

/// Bits of the communication ID that index the slab (up to 2^20 endpoints per agent).
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Generation bits above the index.
const GEN_MASK: u16 = (1 << (32 - INDEX_BITS)) - 1;

/// A slot's occupancy (Linux: the xarray entry absent, reserved, or pointing at the id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Occupancy {
    Invalid,
    Reserved,
    Valid,
}

#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) generation: u16,
    pub(crate) occupancy: Occupancy,
    pub(crate) conn: Conn,
}

#[derive(Debug)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
    salt: u32,
    live: usize,
}

impl Table {
    pub(crate) fn new(salt: u32) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            salt,
            live: 0,
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Bytes the slab holds (slots and free list, by capacity).
    pub(crate) fn bytes(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<Slot>()
            + self.free.capacity() * core::mem::size_of::<u32>()
    }

    fn id_of(&self, index: u32, generation: u16) -> u32 {
        ((u32::from(generation) << INDEX_BITS) | index) ^ self.salt
    }

    /// The communication ID of slot `index` as it is now.
    pub(crate) fn comm_id(&self, index: u32) -> CmId {
        let generation = self.slots.get(index as usize).map_or(0, |s| s.generation);
        CmId(self.id_of(index, generation))
    }

    /// Takes a free slot (RESERVED, IDLE). `None` when 2^20 endpoints are live.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).ok()?;
                if i > INDEX_MASK {
                    return None;
                }
                self.slots.push(Slot {
                    generation: 0,
                    occupancy: Occupancy::Invalid,
                    conn: Conn::default(),
                });
                i
            }
        };
        let salt = self.salt;
        let slot = self.slots.get_mut(index as usize)?;
        // Communication ID 0 means "not known yet" on the wire: skip the generation giving it.
        if ((u32::from(slot.generation) << INDEX_BITS) | index) ^ salt == 0 {
            slot.generation = slot.generation.wrapping_add(1) & GEN_MASK;
        }
        slot.occupancy = Occupancy::Reserved;
        slot.conn.reset();
        self.live += 1;
        Some(index)
    }

    /// Returns slot `index` to the free list with the next generation.
    pub(crate) fn free(&mut self, index: u32) {
        if let Some(slot) = self.slots.get_mut(index as usize) {
            if slot.occupancy != Occupancy::Invalid {
                slot.occupancy = Occupancy::Invalid;
                slot.generation = slot.generation.wrapping_add(1) & GEN_MASK;
                slot.conn.reset();
                self.live -= 1;
                self.free.push(index);
            }
        }
    }

    /// The slot a communication ID names, if it is allocated with that generation.
    fn decode(&self, id: u32) -> Option<u32> {
        let raw = id ^ self.salt;
        let index = raw & INDEX_MASK;
        let generation = (raw >> INDEX_BITS) as u16;
        let slot = self.slots.get(index as usize)?;
        (slot.generation == generation && slot.occupancy != Occupancy::Invalid).then_some(index)
    }

    /// The slot of an application handle (not destroyed).
    pub(crate) fn by_handle(&self, id: CmId) -> Option<u32> {
        let index = self.decode(id.0)?;
        self.conn(index).filter(|c| c.user).map(|_| index)
    }

    /// Linux's `cm_acquire_id(local, remote)`: a VALID slot whose remote ID matches.
    pub(crate) fn by_wire(&self, local: u32, remote: u32) -> Option<u32> {
        let index = self.decode(local)?;
        let slot = self.slots.get(index as usize)?;
        (slot.occupancy == Occupancy::Valid && slot.conn.remote_id == remote).then_some(index)
    }

    pub(crate) fn conn(&self, index: u32) -> Option<&Conn> {
        self.slots.get(index as usize).map(|s| &s.conn)
    }

    pub(crate) fn conn_mut(&mut self, index: u32) -> Option<&mut Conn> {
        self.slots.get_mut(index as usize).map(|s| &mut s.conn)
    }

    /// Sets the state and the occupancy that follows from it.
    pub(crate) fn set_state(&mut self, index: u32, state: CmState) {
        if let Some(slot) = self.slots.get_mut(index as usize) {
            slot.conn.state = state;
            slot.occupancy = match state {
                CmState::Idle | CmState::Listen => Occupancy::Reserved,
                _ => Occupancy::Valid,
            };
        }
    }

    #[cfg(test)]
    pub(crate) fn occupancy(&self, index: u32) -> Option<Occupancy> {
        self.slots.get(index as usize).map(|s| s.occupancy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_slot_comes_back_with_another_id() {
        let mut t = Table::new(0x5a5a_1234);
        let i = t.alloc().expect("slot");
        let first = t.comm_id(i);
        assert_eq!(t.occupancy(i), Some(Occupancy::Reserved));
        t.set_state(i, CmState::ReqSent);
        assert_eq!(t.occupancy(i), Some(Occupancy::Valid));
        assert_eq!(t.by_wire(first.0, 0), Some(i));
        t.free(i);
        assert_eq!(t.occupancy(i), Some(Occupancy::Invalid));
        assert_eq!(t.live(), 0);
        let j = t.alloc().expect("slot");
        assert_eq!(i, j, "the slot is reused");
        let second = t.comm_id(j);
        assert_ne!(first, second);
        t.set_state(j, CmState::ReqSent);
        assert_eq!(t.by_wire(first.0, 0), None, "the old ID misses");
        assert_eq!(t.by_wire(second.0, 0), Some(j));
    }

    #[test]
    fn no_endpoint_gets_comm_id_zero() {
        // With salt 0, slot 0 generation 0 would be ID 0.
        let mut t = Table::new(0);
        let i = t.alloc().expect("slot");
        assert_ne!(t.comm_id(i).0, 0);
        assert_eq!(t.decode(t.comm_id(i).0), Some(i));
    }
}

#[cfg(test)]
mod size {
    use super::Slot;

    /// The CM's budget is at most 2 KiB of CM state per connection; the slot (inline
    /// MAD buffers included) takes a third of that, leaving room for the lookup maps.
    #[test]
    fn a_slot_is_compact() {
        assert!(
            core::mem::size_of::<Slot>() <= 700,
            "{}",
            core::mem::size_of::<Slot>()
        );
    }
}

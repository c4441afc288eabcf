//! Memory protection: the table of memory regions and memory windows behind every lkey and rkey,
//! with the IBTA checks (IBA 10.6) the engine applies before touching memory.
//!
//! Keys work as on mlx4 and rxe: one index space shared by MRs and MWs, and
//! `key = index << 8 | tag`. The tag byte is drawn from the table's generator (seeded per device
//! from the OS's randomness, `portverbs_hal::rng`) every time an index is used again, never
//! equal to the one before, as rxe draws its key byte (`rxe_get_next_key` in Linux's
//! `drivers/infiniband/sw/rxe/rxe_mr.c`): a peer cannot guess a key from the ones it has seen,
//! and stale keys stop matching. A rebound window takes the tag its consumer chose. Index 0 is
//! never used, so key 0 is invalid.
//!
//! Checks return a [`Span`] (where the bytes live) or a [`KeyError`] saying which rule failed; the
//! engine turns that into the IBTA completion status on the right side (local protection error,
//! remote access NAK …). Nothing is touched before a check succeeds.
//!
//! The table itself, its keys and lookups are here; the rules live beside it: registering and
//! changing MRs in `mr`, allocating and invalidating windows in `mw`, binding them in `bind`,
//! and the local and remote access checks in `access`. [`pd`] walks every object a work request
//! names against the protection-domain rules (IBA 10.2.3, chapters 10 and 11) and says which of
//! these checks enforces each.

use std::sync::Arc;

use portverbs_hal::error::CommandError;
use portverbs_hal::rng::SplitMix64;
use portverbs_hal::types::{AccessFlags, MwType};

use crate::dma::SoftDma;

mod access;
mod bind;
mod mr;
mod mw;
pub mod pd;

/// Where a checked access lands: `len` bytes at `offset` of `mem`.
#[derive(Debug, Clone)]
pub struct Span {
    /// Backing memory.
    pub mem: Arc<SoftDma>,
    /// Offset of the first byte.
    pub offset: usize,
}

/// Why a key check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No MR or MW answers to the key (wrong index, stale tag, freed).
    InvalidKey,
    /// The object belongs to another protection domain.
    PdMismatch,
    /// The access lies outside the region or window.
    OutOfRange,
    /// The rights do not allow the access.
    AccessDenied,
    /// A type-2 window bound to another QP.
    QpMismatch,
    /// A window whose MR is gone or invalid.
    Unbound,
    /// A type-2 window bound with length 0 (only a type-1 window may be unbound that way,
    /// IBA 10.6.7.2.1; a type-2 window is invalidated instead).
    ZeroLength,
    /// A zero-based bind: type-1 windows cannot be zero-based (IBA), and this device has no
    /// zero-based addressing at all (`QuirkId::NoZeroBasedAddressing`).
    ZeroBased,
}

#[derive(Debug)]
struct MrEntry {
    pd: u32,
    access: AccessFlags,
    va: u64,
    len: u64,
    mem: Arc<SoftDma>,
    mem_offset: usize,
    bound_mws: u32,
}

#[derive(Debug, Clone, Copy)]
struct MwBinding {
    mr_index: u32,
    va: u64,
    len: u64,
    access: AccessFlags,
    qpn: Option<u32>,
}

#[derive(Debug)]
struct MwEntry {
    pd: u32,
    mw_type: MwType,
    binding: Option<MwBinding>,
}

#[derive(Debug)]
enum Object {
    Free,
    Mr(MrEntry),
    Mw(MwEntry),
}

#[derive(Debug)]
struct Slot {
    tag: u8,
    object: Object,
}

/// The MR/MW table of one device.
#[derive(Debug)]
pub struct MemoryTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    max: u32,
    /// Draws the tag bytes.
    rng: SplitMix64,
}

/// Parameters of a registration.
#[derive(Debug, Clone)]
pub struct MrSpec {
    /// Protection domain.
    pub pd: u32,
    /// Rights.
    pub access: AccessFlags,
    /// Virtual address of the first byte.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Backing memory.
    pub mem: Arc<SoftDma>,
    /// Offset of the first byte in `mem`.
    pub mem_offset: usize,
}

#[inline]
fn split(key: u32) -> (u32, u8) {
    (key >> 8, key as u8)
}

fn make_key(index: u32, tag: u8) -> u32 {
    (index << 8) | u32::from(tag)
}

#[inline]
fn in_range(start: u64, len: u64, va: u64, n: u64) -> bool {
    va >= start && va.checked_add(n).is_some_and(|end| end <= start + len)
}
impl MemoryTable {
    /// A table with room for `max` objects, drawing its tag bytes from a generator seeded
    /// with `seed` (the device's: from the OS, or pinned for a deterministic run).
    pub fn new(max: u32, seed: u64) -> Self {
        Self {
            // Slot 0 is never handed out.
            slots: vec![Slot {
                tag: 0,
                object: Object::Free,
            }],
            free: Vec::new(),
            max,
            rng: SplitMix64::new(seed),
        }
    }

    /// Forgets every region and window (a device reset); the generator goes on, so keys made
    /// after the reset are not those made before it.
    pub fn clear(&mut self) {
        self.slots.truncate(1);
        self.free.clear();
    }

    /// Number of live MRs and MWs.
    pub fn live(&self) -> (usize, usize) {
        let mrs = self
            .slots
            .iter()
            .filter(|s| matches!(s.object, Object::Mr(_)))
            .count();
        let mws = self
            .slots
            .iter()
            .filter(|s| matches!(s.object, Object::Mw(_)))
            .count();
        (mrs, mws)
    }

    fn allocate(&mut self, object: Object) -> Result<u32, CommandError> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i > self.max || i >= 1 << 24 {
                    return Err(CommandError::ResourceExhausted {
                        resource: "memory keys",
                    });
                }
                self.slots.push(Slot {
                    tag: 0,
                    object: Object::Free,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.tag = self.rng.other_byte(slot.tag);
        slot.object = object;
        Ok(make_key(index, slot.tag))
    }

    /// Puts `object` at the index and tag of a key the caller chose (mlx4: the driver forms
    /// keys from MPT indices, as Linux `mlx4/mr.c`). The index must be free.
    fn place(&mut self, key: u32, object: Object) -> Result<u32, CommandError> {
        let (index, tag) = split(key);
        if index == 0 || index > self.max {
            return Err(CommandError::InvalidArgument {
                what: format!("key {key:#x}: index {index:#x} outside 1..={:#x}", self.max),
            });
        }
        let i = index as usize;
        while self.slots.len() <= i {
            let n = self.slots.len() as u32;
            self.slots.push(Slot {
                tag: 0,
                object: Object::Free,
            });
            if n != index {
                self.free.push(n);
            }
        }
        if !matches!(self.slots[i].object, Object::Free) {
            return Err(CommandError::BadState {
                object: "memory key",
                number: index,
                reason: "index already holds a region or window".into(),
            });
        }
        self.free.retain(|&f| f != index);
        let slot = &mut self.slots[i];
        slot.tag = tag;
        slot.object = object;
        Ok(key)
    }

    /// The key the object at `index` answers to now (windows change it when bound), or `None`
    /// when the index is free.
    pub fn key_at(&self, index: u32) -> Option<u32> {
        self.slots
            .get(index as usize)
            .filter(|s| index != 0 && !matches!(s.object, Object::Free))
            .map(|s| make_key(index, s.tag))
    }

    #[inline]
    fn slot(&self, key: u32) -> Option<&Slot> {
        let (index, tag) = split(key);
        self.slots
            .get(index as usize)
            .filter(|s| index != 0 && s.tag == tag && !matches!(s.object, Object::Free))
    }

    fn mr_at(&self, index: u32) -> Option<&MrEntry> {
        match &self.slots.get(index as usize)?.object {
            Object::Mr(mr) => Some(mr),
            _ => None,
        }
    }

    fn unbind_from_mr(&mut self, mr_index: u32) {
        if let Some(Slot {
            object: Object::Mr(mr),
            ..
        }) = self.slots.get_mut(mr_index as usize)
        {
            mr.bound_mws = mr.bound_mws.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portverbs_hal::wr::MwBind;

    pub(super) fn table_with_mr(access: AccessFlags) -> (MemoryTable, u32, Arc<SoftDma>) {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1024, 1);
        let key = t
            .register(MrSpec {
                pd: 1,
                access,
                va: 0x10_000,
                len: 4096,
                mem: mem.clone(),
                mem_offset: 0,
            })
            .unwrap();
        (t, key, mem)
    }

    pub(super) fn bind(new: u32, mr: u32, addr: u64, length: u64, ty: MwType) -> MwBind {
        MwBind {
            new_rkey: new,
            mw_type: ty,
            mr_lkey: mr,
            addr,
            length,
            access: AccessFlags::REMOTE_WRITE,
        }
    }

    pub(super) fn spec(mem: &Arc<SoftDma>) -> MrSpec {
        MrSpec {
            pd: 1,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            va: 0x10_000,
            len: 4096,
            mem: mem.clone(),
            mem_offset: 0,
        }
    }

    #[test]
    fn tag_bytes_follow_the_seed_and_change_on_every_reuse() {
        let mem = SoftDma::alloc(4096).unwrap();
        let keys = |seed: u64| {
            let mut t = MemoryTable::new(1 << 10, seed);
            let mut keys = Vec::new();
            for _ in 0..32 {
                let k = t.register(spec(&mem)).unwrap();
                keys.push(k);
                t.deregister(k).unwrap();
            }
            // A reset keeps drawing: the first key after it is not the first key before.
            t.clear();
            keys.push(t.register(spec(&mem)).unwrap());
            keys
        };
        let (a, b, c) = (keys(3), keys(3), keys(4));
        assert_eq!(a, b, "same seed, same keys");
        assert_ne!(a, c);
        assert!(a.iter().all(|k| k >> 8 == 1), "one slot: {a:x?}");
        assert!(a.windows(2).all(|w| w[0] != w[1]), "{a:x?}");
        assert!(
            !a.windows(2)
                .all(|w| w[1] as u8 == (w[0] as u8).wrapping_add(1)),
            "not a counter: {a:x?}"
        );
    }

    #[test]
    fn caller_chosen_keys_are_placed_and_refused_when_taken() {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1 << 10, 1);
        // mlx4 style: MPT index 0x21 with tag 0x77.
        let key = t.register_at(0x2177, spec(&mem)).unwrap();
        assert_eq!(key, 0x2177);
        assert_eq!(t.key_at(0x21), Some(0x2177));
        assert!(t.local(0x2177, 1, 0x10_000, 8, true).is_ok());
        assert_eq!(
            t.local(0x2100, 1, 0x10_000, 8, true).unwrap_err(),
            KeyError::InvalidKey,
            "the tag must match"
        );
        assert!(matches!(
            t.register_at(0x2100, spec(&mem)),
            Err(CommandError::BadState { .. })
        ));
        assert!(matches!(
            t.alloc_mw_at(0x2105, 1, MwType::Type2),
            Err(CommandError::BadState { .. })
        ));
        assert!(t.register_at(0x00ff, spec(&mem)).is_err(), "index 0");
        assert!(
            t.register_at(0x40100, spec(&mem)).is_err(),
            "beyond the table"
        );
        // Indices skipped over stay usable by the allocator, and the chosen one is not reused.
        let auto: Vec<u32> = (0..0x20)
            .map(|_| t.register(spec(&mem)).unwrap() >> 8)
            .collect();
        assert!(!auto.contains(&0x21));
        assert_eq!(t.live(), (0x21, 0));
        t.deregister(0x2177).unwrap();
        assert_eq!(t.key_at(0x21), None);
    }
}

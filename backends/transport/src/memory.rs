//! Memory protection: the table of memory regions and memory windows behind every lkey and rkey,
//! with the IBTA checks (IBA 10.6) the engine applies before touching memory.
//!
//! Keys work as on mlx4 (facts/mlx4-hardware.md §8): one index space shared by MRs and MWs, and
//! `key = index << 8 | tag`. The tag byte changes every time an index is reused and every time a
//! window is rebound, so stale keys stop matching. Index 0 is never used, so key 0 is invalid.
//!
//! Checks return a [`Span`] (where the bytes live) or a [`KeyError`] saying which rule failed; the
//! engine turns that into the IBTA completion status on the right side (local protection error,
//! remote access NAK …). Nothing is touched before a check succeeds.

use std::sync::Arc;

use portverbs_hal::error::CommandError;
use portverbs_hal::types::{AccessFlags, MwType};
use portverbs_hal::wr::MwBind;

use crate::dma::SoftDma;

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

fn split(key: u32) -> (u32, u8) {
    (key >> 8, key as u8)
}

fn make_key(index: u32, tag: u8) -> u32 {
    (index << 8) | u32::from(tag)
}

fn in_range(start: u64, len: u64, va: u64, n: u64) -> bool {
    va >= start && va.checked_add(n).is_some_and(|end| end <= start + len)
}

impl MemoryTable {
    /// A table with room for `max` objects.
    pub fn new(max: u32) -> Self {
        Self {
            // Slot 0 is never handed out.
            slots: vec![Slot {
                tag: 0,
                object: Object::Free,
            }],
            free: Vec::new(),
            max,
        }
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
        slot.tag = slot.tag.wrapping_add(1);
        slot.object = object;
        Ok(make_key(index, slot.tag))
    }

    /// Puts `object` at the index and tag of a key the caller chose (mlx4: the driver forms
    /// keys from MPT indices, facts §8). The index must be free.
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

    /// Registers memory; returns the key (lkey = rkey).
    ///
    /// # Errors
    /// Out of keys.
    pub fn register(&mut self, spec: MrSpec) -> Result<u32, CommandError> {
        self.allocate(Object::Mr(MrEntry {
            pd: spec.pd,
            access: spec.access,
            va: spec.va,
            len: spec.len,
            mem: spec.mem,
            mem_offset: spec.mem_offset,
            bound_mws: 0,
        }))
    }

    /// Registers memory at a key chosen by the caller (`index << 8 | tag`); refuses an index
    /// that is in use.
    ///
    /// # Errors
    /// Index 0, beyond the table, or in use.
    pub fn register_at(&mut self, key: u32, spec: MrSpec) -> Result<u32, CommandError> {
        self.place(
            key,
            Object::Mr(MrEntry {
                pd: spec.pd,
                access: spec.access,
                va: spec.va,
                len: spec.len,
                mem: spec.mem,
                mem_offset: spec.mem_offset,
                bound_mws: 0,
            }),
        )
    }

    /// Changes a registration in place (the key stays the same, so work requests already posted
    /// with it are checked against the new attributes).
    ///
    /// # Errors
    /// Unknown key, or windows are bound to it.
    pub fn rereg(
        &mut self,
        key: u32,
        pd: Option<u32>,
        access: Option<AccessFlags>,
        range: Option<(u64, u64, Arc<SoftDma>, usize)>,
    ) -> Result<u32, CommandError> {
        let (index, _) = split(key);
        if self.slot(key).is_none() {
            return Err(CommandError::NoSuchObject {
                object: "MR",
                number: key,
            });
        }
        let Object::Mr(mr) = &mut self.slots[index as usize].object else {
            return Err(CommandError::NoSuchObject {
                object: "MR",
                number: key,
            });
        };
        if mr.bound_mws > 0 && (pd.is_some() || range.is_some()) {
            return Err(CommandError::Busy {
                object: "MR",
                reason: format!("{} memory windows are bound to it", mr.bound_mws),
            });
        }
        if let Some(pd) = pd {
            mr.pd = pd;
        }
        if let Some(access) = access {
            mr.access = access;
        }
        if let Some((va, len, mem, off)) = range {
            mr.va = va;
            mr.len = len;
            mr.mem = mem;
            mr.mem_offset = off;
        }
        Ok(key)
    }

    /// Deregisters memory.
    ///
    /// # Errors
    /// Unknown key; windows still bound (`QuirkId::DeregMrWithBoundMwRefused`).
    pub fn deregister(&mut self, key: u32) -> Result<(), CommandError> {
        let (index, _) = split(key);
        match self.slot(key).map(|s| &s.object) {
            Some(Object::Mr(mr)) if mr.bound_mws > 0 => Err(CommandError::Busy {
                object: "MR",
                reason: format!("{} memory windows are bound to it", mr.bound_mws),
            }),
            Some(Object::Mr(_)) => {
                self.slots[index as usize].object = Object::Free;
                self.free.push(index);
                Ok(())
            }
            _ => Err(CommandError::NoSuchObject {
                object: "MR",
                number: key,
            }),
        }
    }

    /// Virtual address of the first byte of the MR answering to `key`.
    pub fn local_addr(&self, key: u32) -> Option<u64> {
        match &self.slot(key)?.object {
            Object::Mr(mr) => Some(mr.va),
            _ => None,
        }
    }

    /// Frees the memory window at `index` whatever its current key (binds change the tag).
    ///
    /// # Errors
    /// No window at that index.
    pub fn dealloc_mw_index(&mut self, index: u32) -> Result<(), CommandError> {
        let tag = match self.slots.get(index as usize) {
            Some(Slot {
                tag,
                object: Object::Mw(_),
            }) => *tag,
            _ => {
                return Err(CommandError::NoSuchObject {
                    object: "MW",
                    number: index,
                });
            }
        };
        self.dealloc_mw(make_key(index, tag))
    }

    /// Allocates an unbound memory window; returns its key.
    ///
    /// # Errors
    /// Out of keys.
    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> Result<u32, CommandError> {
        self.allocate(Object::Mw(MwEntry {
            pd,
            mw_type,
            binding: None,
        }))
    }

    /// Allocates an unbound memory window at a key chosen by the caller; refuses an index that
    /// is in use.
    ///
    /// # Errors
    /// Index 0, beyond the table, or in use.
    pub fn alloc_mw_at(&mut self, key: u32, pd: u32, mw_type: MwType) -> Result<u32, CommandError> {
        self.place(
            key,
            Object::Mw(MwEntry {
                pd,
                mw_type,
                binding: None,
            }),
        )
    }

    /// Frees a memory window (its binding, if any, ends).
    ///
    /// # Errors
    /// Unknown key.
    pub fn dealloc_mw(&mut self, key: u32) -> Result<(), CommandError> {
        let (index, _) = split(key);
        let binding = match self.slot(key).map(|s| &s.object) {
            Some(Object::Mw(mw)) => mw.binding,
            _ => {
                return Err(CommandError::NoSuchObject {
                    object: "MW",
                    number: key,
                });
            }
        };
        if let Some(b) = binding {
            self.unbind_from_mr(b.mr_index);
        }
        self.slots[index as usize].object = Object::Free;
        self.free.push(index);
        Ok(())
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

    /// Checks a local access through an lkey (gather needs local read, always granted; scatter
    /// needs `LOCAL_WRITE`) and returns where the bytes are.
    ///
    /// # Errors
    /// The [`KeyError`] of the failed rule.
    pub fn local(
        &self,
        lkey: u32,
        pd: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> Result<Span, KeyError> {
        let mr = self.local_mr(lkey, pd, va, len, write)?;
        Ok(Span {
            mem: mr.mem.clone(),
            offset: mr.mem_offset + (va - mr.va) as usize,
        })
    }

    /// The checks of [`Self::local`] alone (no reference to the memory is taken).
    ///
    /// # Errors
    /// The [`KeyError`] of the failed rule.
    pub fn check_local(
        &self,
        lkey: u32,
        pd: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> Result<(), KeyError> {
        self.local_mr(lkey, pd, va, len, write).map(|_| ())
    }

    fn local_mr(
        &self,
        lkey: u32,
        pd: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> Result<&MrEntry, KeyError> {
        let Some(Slot {
            object: Object::Mr(mr),
            ..
        }) = self.slot(lkey)
        else {
            return Err(KeyError::InvalidKey);
        };
        if mr.pd != pd {
            return Err(KeyError::PdMismatch);
        }
        if write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(KeyError::AccessDenied);
        }
        if !in_range(mr.va, mr.len, va, len) {
            return Err(KeyError::OutOfRange);
        }
        Ok(mr)
    }

    /// Checks a remote access through an rkey arriving on QP `qpn` of domain `pd`; `need` is the
    /// single remote right the operation requires.
    ///
    /// # Errors
    /// The [`KeyError`] of the failed rule.
    pub fn remote(
        &self,
        rkey: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Span, KeyError> {
        let slot = self.slot(rkey).ok_or(KeyError::InvalidKey)?;
        let mr = match &slot.object {
            Object::Mr(mr) => {
                if mr.pd != pd {
                    return Err(KeyError::PdMismatch);
                }
                if !mr.access.contains(need) {
                    return Err(KeyError::AccessDenied);
                }
                if !in_range(mr.va, mr.len, va, len) {
                    return Err(KeyError::OutOfRange);
                }
                mr
            }
            Object::Mw(mw) => {
                let b = mw.binding.ok_or(KeyError::InvalidKey)?;
                match mw.mw_type {
                    MwType::Type1 if mw.pd != pd => return Err(KeyError::PdMismatch),
                    MwType::Type2 if b.qpn != Some(qpn) => return Err(KeyError::QpMismatch),
                    _ => {}
                }
                if !b.access.contains(need) {
                    return Err(KeyError::AccessDenied);
                }
                if !in_range(b.va, b.len, va, len) {
                    return Err(KeyError::OutOfRange);
                }
                self.mr_at(b.mr_index).ok_or(KeyError::Unbound)?
            }
            Object::Free => return Err(KeyError::InvalidKey),
        };
        if !in_range(mr.va, mr.len, va, len) {
            return Err(KeyError::Unbound);
        }
        Ok(Span {
            mem: mr.mem.clone(),
            offset: mr.mem_offset + (va - mr.va) as usize,
        })
    }

    /// Executes a bind (IBA 10.6.7.2): checks the window, the MR and the rights, then makes the
    /// window answer to `bind.new_rkey` over the given range.
    ///
    /// # Errors
    /// The [`KeyError`] of the failed rule (the requester completes with `MW_BIND_ERR`).
    pub fn bind(&mut self, qp_pd: u32, qpn: u32, bind: &MwBind) -> Result<(), KeyError> {
        let (mw_index, new_tag) = split(bind.new_rkey);
        let Some(Object::Mw(mw)) = self
            .slots
            .get(mw_index as usize)
            .filter(|_| mw_index != 0)
            .map(|s| &s.object)
        else {
            return Err(KeyError::InvalidKey);
        };
        if mw.mw_type != bind.mw_type {
            return Err(KeyError::InvalidKey);
        }
        if mw.pd != qp_pd {
            return Err(KeyError::PdMismatch);
        }
        if mw.mw_type == MwType::Type2 && mw.binding.is_some() {
            // A type-2 window must be invalidated before it can be bound again.
            return Err(KeyError::AccessDenied);
        }
        if mw.mw_type == MwType::Type2 && bind.length == 0 {
            return Err(KeyError::ZeroLength);
        }
        if bind.access.contains(AccessFlags::ZERO_BASED) {
            return Err(KeyError::ZeroBased);
        }
        let old = mw.binding;
        let unbind = bind.length == 0 && bind.mw_type == MwType::Type1;
        let mut mr_index = 0;
        if !unbind {
            let (index, _) = split(bind.mr_lkey);
            let Some(Object::Mr(mr)) = self.slot(bind.mr_lkey).map(|s| &s.object) else {
                return Err(KeyError::InvalidKey);
            };
            if mr.pd != qp_pd {
                return Err(KeyError::PdMismatch);
            }
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(KeyError::AccessDenied);
            }
            let needs_local_write = bind
                .access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
            if needs_local_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(KeyError::AccessDenied);
            }
            if !in_range(mr.va, mr.len, bind.addr, bind.length) {
                return Err(KeyError::OutOfRange);
            }
            mr_index = index;
        }
        if let Some(b) = old {
            self.unbind_from_mr(b.mr_index);
        }
        let binding = (!unbind).then_some(MwBinding {
            mr_index,
            va: bind.addr,
            len: bind.length,
            access: bind.access,
            qpn: (bind.mw_type == MwType::Type2).then_some(qpn),
        });
        if !unbind {
            if let Some(Slot {
                object: Object::Mr(mr),
                ..
            }) = self.slots.get_mut(mr_index as usize)
            {
                mr.bound_mws += 1;
            }
        }
        let slot = &mut self.slots[mw_index as usize];
        slot.tag = new_tag;
        if let Object::Mw(mw) = &mut slot.object {
            mw.binding = binding;
        }
        Ok(())
    }

    /// Invalidates every type-2 window bound to QP `qpn` (the QP is being destroyed: its
    /// windows must not answer to a later QP that gets the same number). Returns how many.
    pub fn unbind_qp(&mut self, qpn: u32) -> usize {
        let bound: Vec<(usize, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.object {
                Object::Mw(MwEntry {
                    binding: Some(b), ..
                }) if b.qpn == Some(qpn) => Some((i, b.mr_index)),
                _ => None,
            })
            .collect();
        for &(i, mr_index) in &bound {
            self.unbind_from_mr(mr_index);
            if let Object::Mw(mw) = &mut self.slots[i].object {
                mw.binding = None;
            }
        }
        bound.len()
    }

    /// Invalidates a type-2 window on behalf of QP `qpn` of domain `pd`: a LOCAL_INV posted
    /// on that QP, or a SEND_WITH_INV arriving on it. A type-2 window belongs to the QP it is
    /// bound to (IBA 10.6.7.2.2), so only that QP may invalidate it.
    ///
    /// # Errors
    /// Unknown key, not a bound type-2 window, other PD, or bound to another QP.
    pub fn invalidate(&mut self, rkey: u32, pd: u32, qpn: u32) -> Result<(), KeyError> {
        let (index, _) = split(rkey);
        let binding = match self.slot(rkey).map(|s| &s.object) {
            Some(Object::Mw(mw)) if mw.mw_type == MwType::Type2 => {
                if mw.pd != pd {
                    return Err(KeyError::PdMismatch);
                }
                let b = mw.binding.ok_or(KeyError::Unbound)?;
                if b.qpn != Some(qpn) {
                    return Err(KeyError::QpMismatch);
                }
                b
            }
            // MRs here are not fast-registration MRs; their keys cannot be invalidated.
            _ => return Err(KeyError::InvalidKey),
        };
        self.unbind_from_mr(binding.mr_index);
        if let Object::Mw(mw) = &mut self.slots[index as usize].object {
            mw.binding = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with_mr(access: AccessFlags) -> (MemoryTable, u32, Arc<SoftDma>) {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1024);
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

    #[test]
    fn keys_encode_index_and_tag() {
        let (mut t, key, _) = table_with_mr(AccessFlags::LOCAL_WRITE);
        assert_eq!(key, (1 << 8) | 1);
        t.deregister(key).unwrap();
        let mem = SoftDma::alloc(16).unwrap();
        let key2 = t
            .register(MrSpec {
                pd: 1,
                access: AccessFlags::empty(),
                va: 0,
                len: 16,
                mem,
                mem_offset: 0,
            })
            .unwrap();
        assert_eq!(key2 >> 8, 1, "index reused");
        assert_ne!(key2, key, "tag changed");
        assert_eq!(
            t.local(key, 1, 0, 1, false).unwrap_err(),
            KeyError::InvalidKey,
            "stale key rejected"
        );
    }

    #[test]
    fn local_checks_pd_rights_and_range() {
        let (t, key, _) = table_with_mr(AccessFlags::empty());
        assert!(t.local(key, 1, 0x10_000, 4096, false).is_ok());
        assert_eq!(
            t.local(key, 2, 0x10_000, 1, false).unwrap_err(),
            KeyError::PdMismatch
        );
        assert_eq!(
            t.local(key, 1, 0x10_000, 1, true).unwrap_err(),
            KeyError::AccessDenied
        );
        assert_eq!(
            t.local(key, 1, 0x10_001, 4096, false).unwrap_err(),
            KeyError::OutOfRange
        );
        assert_eq!(
            t.local(key, 1, u64::MAX, 2, false).unwrap_err(),
            KeyError::OutOfRange
        );
        assert_eq!(
            t.local(0, 1, 0, 0, false).unwrap_err(),
            KeyError::InvalidKey
        );
    }

    #[test]
    fn remote_needs_the_specific_right() {
        let (t, key, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        let span = t
            .remote(key, 1, 5, 0x10_010, 8, AccessFlags::REMOTE_READ)
            .unwrap();
        assert_eq!(span.offset, 0x10);
        assert_eq!(
            t.remote(key, 1, 5, 0x10_010, 8, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::AccessDenied
        );
    }

    fn bind(new: u32, mr: u32, addr: u64, length: u64, ty: MwType) -> MwBind {
        MwBind {
            new_rkey: new,
            mw_type: ty,
            mr_lkey: mr,
            addr,
            length,
            access: AccessFlags::REMOTE_WRITE,
        }
    }

    #[test]
    fn type1_window_binds_rebinds_and_unbinds() {
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let mw = t.alloc_mw(1, MwType::Type1).unwrap();
        let new = (mw & !0xff) | ((mw + 1) & 0xff);
        t.bind(1, 9, &bind(new, mr, 0x10_100, 256, MwType::Type1))
            .unwrap();
        assert!(
            t.remote(new, 1, 77, 0x10_100, 256, AccessFlags::REMOTE_WRITE)
                .is_ok()
        );
        assert_eq!(
            t.remote(mw, 1, 77, 0x10_100, 1, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::InvalidKey,
            "the old key no longer works"
        );
        assert_eq!(
            t.remote(new, 1, 77, 0x10_100, 257, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::OutOfRange
        );
        assert!(matches!(t.deregister(mr), Err(CommandError::Busy { .. })));
        let newer = (new & !0xff) | ((new + 1) & 0xff);
        t.bind(1, 9, &bind(newer, mr, 0, 0, MwType::Type1)).unwrap();
        assert!(
            t.remote(newer, 1, 77, 0x10_100, 1, AccessFlags::REMOTE_WRITE)
                .is_err()
        );
        t.deregister(mr).unwrap();
    }

    #[test]
    fn type2_window_is_tied_to_its_qp_and_invalidated() {
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let mw = t.alloc_mw(1, MwType::Type2).unwrap();
        let new = (mw & !0xff) | 0x42;
        t.bind(1, 9, &bind(new, mr, 0x10_000, 64, MwType::Type2))
            .unwrap();
        assert!(
            t.remote(new, 1, 9, 0x10_000, 8, AccessFlags::REMOTE_WRITE)
                .is_ok()
        );
        assert_eq!(
            t.remote(new, 1, 10, 0x10_000, 8, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::QpMismatch
        );
        assert_eq!(
            t.bind(1, 9, &bind(new, mr, 0x10_000, 8, MwType::Type2))
                .unwrap_err(),
            KeyError::AccessDenied,
            "bound type-2 windows must be invalidated first"
        );
        assert_eq!(
            t.invalidate(new, 1, 10).unwrap_err(),
            KeyError::QpMismatch,
            "only the QP the window is bound to may invalidate it"
        );
        assert_eq!(t.invalidate(new, 2, 9).unwrap_err(), KeyError::PdMismatch);
        t.invalidate(new, 1, 9).unwrap();
        assert!(
            t.remote(new, 1, 9, 0x10_000, 8, AccessFlags::REMOTE_WRITE)
                .is_err()
        );
        assert_eq!(
            t.invalidate(new, 1, 9).unwrap_err(),
            KeyError::Unbound,
            "a window is invalidated once"
        );
        assert_eq!(t.invalidate(mr, 1, 9).unwrap_err(), KeyError::InvalidKey);
    }

    #[test]
    fn type2_window_cannot_be_bound_with_zero_length() {
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let mw = t.alloc_mw(1, MwType::Type2).unwrap();
        let new = (mw & !0xff) | 0x42;
        assert_eq!(
            t.bind(1, 9, &bind(new, mr, 0x10_000, 0, MwType::Type2))
                .unwrap_err(),
            KeyError::ZeroLength
        );
        assert_eq!(
            t.key_at(mw >> 8),
            Some(mw),
            "a refused bind changes nothing"
        );
        t.bind(1, 9, &bind(new, mr, 0x10_000, 1, MwType::Type2))
            .unwrap();
    }

    #[test]
    fn bind_requires_mw_bind_right_and_local_write_for_remote_write() {
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE);
        let mw = t.alloc_mw(1, MwType::Type1).unwrap();
        assert_eq!(
            t.bind(1, 9, &bind(mw, mr, 0x10_000, 8, MwType::Type1))
                .unwrap_err(),
            KeyError::AccessDenied
        );
        let (mut t, mr, _) = table_with_mr(AccessFlags::MW_BIND);
        let mw = t.alloc_mw(1, MwType::Type1).unwrap();
        assert_eq!(
            t.bind(1, 9, &bind(mw, mr, 0x10_000, 8, MwType::Type1))
                .unwrap_err(),
            KeyError::AccessDenied
        );
        assert_eq!(
            t.bind(2, 9, &bind(mw, mr, 0x10_000, 8, MwType::Type1))
                .unwrap_err(),
            KeyError::PdMismatch
        );
    }

    fn spec(mem: &Arc<SoftDma>) -> MrSpec {
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
    fn caller_chosen_keys_are_placed_and_refused_when_taken() {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1 << 10);
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

    #[test]
    fn windows_at_chosen_keys_bind_through_key_at() {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1 << 10);
        let mr = t.register_at(0x1100, spec(&mem)).unwrap();
        let mw = t.alloc_mw_at(0x1200, 1, MwType::Type2).unwrap();
        let new = 0x1242;
        let current = t.key_at(new >> 8).unwrap();
        assert_eq!(current, mw);
        t.bind(1, 9, &bind(new, mr, 0x10_000, 64, MwType::Type2))
            .unwrap();
        assert_eq!(t.key_at(0x12), Some(new));
        assert!(t.deregister(mr).is_err(), "a window is bound");
        t.dealloc_mw_index(0x12).unwrap();
        t.deregister(mr).unwrap();
        assert_eq!(t.live(), (0, 0));
    }

    #[test]
    fn dealloc_of_bound_window_releases_the_mr() {
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let mw = t.alloc_mw(1, MwType::Type1).unwrap();
        t.bind(1, 9, &bind(mw, mr, 0x10_000, 8, MwType::Type1))
            .unwrap();
        t.dealloc_mw(mw).unwrap();
        t.deregister(mr).unwrap();
        assert_eq!(t.live(), (0, 0));
    }
}

//! Memory regions: registration, re-registration, deregistration.

use std::sync::Arc;

use portverbs_hal::error::CommandError;
use portverbs_hal::types::AccessFlags;

use super::{MemoryTable, MrEntry, MrSpec, Object, split};
use crate::dma::SoftDma;

impl MemoryTable {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::KeyError;
    use crate::memory::tests::table_with_mr;

    #[test]
    fn keys_encode_index_and_tag() {
        let (mut t, key, _) = table_with_mr(AccessFlags::LOCAL_WRITE);
        assert_eq!(key >> 8, 1, "the first index is 1");
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
}

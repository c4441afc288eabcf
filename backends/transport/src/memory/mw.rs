//! Memory windows: allocation and freeing, and the invalidation rules (a QP going away, LOCAL_INV
//! and SEND_WITH_INV).

use portverbs_hal::error::CommandError;
use portverbs_hal::types::MwType;

use super::{KeyError, MemoryTable, MwEntry, Object, Slot, make_key, split};

impl MemoryTable {
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
    use crate::dma::SoftDma;
    use crate::memory::tests::{bind, spec, table_with_mr};
    use portverbs_hal::types::AccessFlags;

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
    fn windows_at_chosen_keys_bind_through_key_at() {
        let mem = SoftDma::alloc(4096).unwrap();
        let mut t = MemoryTable::new(1 << 10, 1);
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

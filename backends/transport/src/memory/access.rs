//! The local (lkey) and remote (rkey) access checks.

use portverbs_hal::types::{AccessFlags, MwType};

use super::{KeyError, MemoryTable, MrEntry, Object, Slot, Span, in_range};

impl MemoryTable {
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
    #[inline(always)]
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
                // Every window belongs to a domain (as rxe's `rxe_lookup_mw` checks for both
                // types); a type-2 window also to the QP it is bound to (IBA 10.6.7.2.2).
                if mw.pd != pd {
                    return Err(KeyError::PdMismatch);
                }
                if mw.mw_type == MwType::Type2 && b.qpn != Some(qpn) {
                    return Err(KeyError::QpMismatch);
                }
                if !b.access.contains(need) {
                    return Err(KeyError::AccessDenied);
                }
                if !in_range(b.va, b.len, va, len) {
                    return Err(KeyError::OutOfRange);
                }
                // The window's range must still lie in its MR (an MR's own range was
                // checked above).
                let mr = self.mr_at(b.mr_index).ok_or(KeyError::Unbound)?;
                if !in_range(mr.va, mr.len, va, len) {
                    return Err(KeyError::Unbound);
                }
                mr
            }
            Object::Free => return Err(KeyError::InvalidKey),
        };
        Ok(Span {
            mem: mr.mem.clone(),
            offset: mr.mem_offset + (va - mr.va) as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tests::table_with_mr;

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

    #[test]
    fn remote_checks_the_domain_of_both_window_types() {
        use crate::memory::tests::bind;
        let (mut t, mr, _) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
        let w = AccessFlags::REMOTE_WRITE;
        for ty in [MwType::Type1, MwType::Type2] {
            let mw = t.alloc_mw(1, ty).unwrap();
            let key = (mw & !0xff) | ((mw + 1) & 0xff);
            t.bind(1, 9, &bind(key, mr, 0x10_000, 64, ty)).unwrap();
            assert!(t.remote(key, 1, 9, 0x10_000, 8, w).is_ok(), "{ty:?}");
            assert_eq!(
                t.remote(key, 2, 9, 0x10_000, 8, w).unwrap_err(),
                KeyError::PdMismatch,
                "{ty:?} through a QP of another domain"
            );
        }
    }
}

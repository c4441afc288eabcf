//! Binding memory windows (IBA 10.6.7.2).

use portverbs_hal::types::{AccessFlags, MwType};
use portverbs_hal::wr::MwBind;

use super::{KeyError, MemoryTable, MwBinding, Object, Slot, in_range, split};

impl MemoryTable {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tests::{bind, table_with_mr};
    use portverbs_hal::error::CommandError;

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
}

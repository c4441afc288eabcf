//! Memory windows (IBA 10.6.7): type 1 bound with [`crate::Qp::bind_mw`], type 2 bound with a
//! `BindMw` send work request built by [`Mw::bind`], invalidated by LOCAL_INV or
//! SEND_WITH_INV.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use portverbs_hal::caps::DeviceCapFlags;
use portverbs_hal::device::Device;
use portverbs_hal::types::{AccessFlags, MwType};
use portverbs_hal::wr::MwBind;
use portverbs_hal::{BlockingDevice, block_on};

use crate::error::MwError;
use crate::mr::Mr;
use crate::pd::Pd;

pub(crate) struct MwInner<D: Device> {
    pd: Pd<D>,
    handle: u32,
    mw_type: MwType,
    rkey: AtomicU32,
}

/// A memory window (`struct ibv_mw`). Cheap to clone.
pub struct Mw<D: Device> {
    inner: Arc<MwInner<D>>,
}

impl<D: Device> Clone for Mw<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Mw<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.inner.mw_type)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// The next key of a window: same index, tag byte incremented (`ibv_inc_rkey`).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl<D: Device> Pd<D> {
    /// Allocates a memory window (`ibv_alloc_mw`).
    ///
    /// # Errors
    /// The device lacks windows of that type, or refused.
    pub async fn alloc_mw(&self, mw_type: MwType) -> Result<Mw<D>, MwError> {
        let ctx = &self.inner.ctx;
        let caps = ctx.attr.device_cap_flags;
        let supported = match mw_type {
            MwType::Type1 => caps.contains(DeviceCapFlags::MEM_WINDOW),
            MwType::Type2 => caps.intersects(
                DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
            ),
        };
        if !supported {
            return Err(MwError::Unsupported {
                mw_type: mw_type as u8,
            });
        }
        let keys = ctx.device().alloc_mw(self.pdn(), mw_type).await?;
        ctx.counts.mws.fetch_add(1, Ordering::Relaxed);
        Ok(Mw {
            inner: Arc::new(MwInner {
                pd: self.clone(),
                handle: keys.handle,
                mw_type,
                rkey: AtomicU32::new(keys.rkey),
            }),
        })
    }

    /// Blocking form of [`Pd::alloc_mw`].
    ///
    /// # Errors
    /// As [`Pd::alloc_mw`].
    pub fn alloc_mw_blocking(&self, mw_type: MwType) -> Result<Mw<D>, MwError> {
        block_on(self.alloc_mw(mw_type))
    }

    /// `ibv_alloc_mw` with a raw type number: anything but 1 and 2 is refused (IBA has no
    /// type 3), as rdma-core's `test_mr` expects.
    ///
    /// # Errors
    /// [`MwError::Unsupported`] for other types.
    pub fn alloc_mw_raw_blocking(&self, mw_type: u8) -> Result<Mw<D>, MwError> {
        let t = MwType::from_u8(mw_type).ok_or(MwError::Unsupported { mw_type })?;
        self.alloc_mw_blocking(t)
    }
}

impl<D: Device> Mw<D> {
    /// The key remote peers use now.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey.load(Ordering::Acquire)
    }

    /// The window type.
    pub fn mw_type(&self) -> MwType {
        self.inner.mw_type
    }

    /// The PD of the window.
    pub fn pd(&self) -> &Pd<D> {
        &self.inner.pd
    }

    /// Builds a bind of this window to `len` bytes at `addr` inside `mr`, with a fresh rkey,
    /// and records that rkey as the window's (as `ibv_bind_mw` does). Post it with
    /// `SendOp::BindMw`; a length of 0 on a type-1 window unbinds it.
    pub fn bind(&self, mr: &Mr<D>, addr: u64, len: u64, access: AccessFlags) -> MwBind {
        let old = self.rkey();
        let new = inc_rkey(old);
        self.inner.rkey.store(new, Ordering::Release);
        MwBind {
            new_rkey: new,
            mw_type: self.inner.mw_type,
            mr_lkey: mr.lkey(),
            addr,
            length: len,
            access,
        }
    }
}

impl<D: Device> Drop for MwInner<D> {
    fn drop(&mut self) {
        let ctx = &self.pd.inner.ctx;
        ctx.counts.mws.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = ctx.device().dealloc_mw_blocking(self.handle) {
            tracing::warn!(handle = self.handle, error = %e, "freeing a memory window failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn inc_rkey_keeps_the_index_and_wraps_the_tag() {
        assert_eq!(super::inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(super::inc_rkey(0x100), 0x101);
    }
}

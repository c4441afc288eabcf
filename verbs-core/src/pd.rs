//! Protection domains.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use portverbs_hal::BlockingDevice;
use portverbs_hal::device::Device;

use crate::context::ContextInner;
use crate::error::{PdError, Refused};

pub(crate) struct PdInner<D: Device> {
    pub(crate) ctx: Arc<ContextInner<D>>,
    pub(crate) pdn: u32,
}

/// A protection domain (`struct ibv_pd`). Cheap to clone; every object created in it holds a
/// reference, so it lives until the last of them is gone.
pub struct Pd<D: Device> {
    pub(crate) inner: Arc<PdInner<D>>,
}

impl<D: Device> Clone for Pd<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Pd<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd").field("pdn", &self.inner.pdn).finish()
    }
}

impl<D: Device> Pd<D> {
    pub(crate) async fn alloc(ctx: &Arc<ContextInner<D>>) -> Result<Self, PdError> {
        let pdn = ctx.device().alloc_pd().await?;
        ctx.counts.pds.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            inner: Arc::new(PdInner {
                ctx: ctx.clone(),
                pdn,
            }),
        })
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> crate::Context<D> {
        crate::Context {
            inner: self.inner.ctx.clone(),
        }
    }

    /// The device's PD number.
    pub fn pdn(&self) -> u32 {
        self.inner.pdn
    }

    /// Frees the PD now (`ibv_dealloc_pd`). Fails with [`PdError::Busy`] while MRs, MWs, QPs,
    /// SRQs, AHs or other handles still use it (rdma-unit-test's EBUSY rule); the handle is
    /// given back so nothing is lost.
    ///
    /// # Errors
    /// [`PdError::Busy`] with the PD handed back.
    pub fn dealloc(self) -> Result<(), Refused<Self, PdError>> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let users = Arc::strong_count(&inner) - 1;
                let pdn = inner.pdn;
                Err(Refused::new(PdError::Busy { pdn, users }, Self { inner }))
            }
        }
    }

    pub(crate) fn same_device(&self, ctx: &Arc<ContextInner<D>>) -> bool {
        ContextInner::ptr_eq(&self.inner.ctx, ctx)
    }
}

impl<D: Device> Drop for PdInner<D> {
    fn drop(&mut self) {
        self.ctx.counts.pds.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = self.ctx.device().dealloc_pd_blocking(self.pdn) {
            tracing::warn!(pdn = self.pdn, error = %e, "freeing a PD failed");
        }
    }
}

//! Address handles: validated address vectors for UD sends (`struct ibv_ah`). The HCA needs no
//! command for them (the vector travels in each UD WQE), so they are checked here against the
//! port: RoCE ports require a GRH, the source GID index must name a non-empty entry.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use portverbs_hal::attr::AddressVector;
use portverbs_hal::block_on;
use portverbs_hal::device::Device;
use portverbs_hal::types::LinkLayer;
use portverbs_hal::wr::UdDest;

use crate::error::{AhError, QueryError, Refused};
use crate::pd::Pd;

pub(crate) struct AhInner<D: Device> {
    pd: Pd<D>,
    av: AddressVector,
}

/// An address handle. Cheap to clone.
pub struct AddressHandle<D: Device> {
    inner: Arc<AhInner<D>>,
}

impl<D: Device> Clone for AddressHandle<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for AddressHandle<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("av", &self.inner.av)
            .finish()
    }
}

impl<D: Device> Pd<D> {
    /// Creates an address handle (`ibv_create_ah`).
    ///
    /// # Errors
    /// No such port; no GRH on a RoCE port; a bad source GID index; an empty destination GID.
    pub async fn create_ah(&self, av: AddressVector) -> Result<AddressHandle<D>, AhError> {
        let ctx = &self.inner.ctx;
        let port = av.port_num;
        let pattr = port
            .checked_sub(1)
            .and_then(|i| ctx.port_attrs.get(usize::from(i)))
            .ok_or(AhError::NoSuchPort { port })?;
        if pattr.link_layer == LinkLayer::Ethernet {
            if !av.is_global {
                return Err(AhError::GrhRequired { port });
            }
            if av.dgid.is_zero() {
                return Err(AhError::EmptyDgid);
            }
        }
        if av.is_global {
            let c = crate::Context { inner: ctx.clone() };
            match c.query_gid(port, u32::from(av.sgid_index)).await {
                Ok(_) => {}
                Err(QueryError::Device(e)) => return Err(AhError::Device(e)),
                Err(_) => {
                    return Err(AhError::BadSgidIndex {
                        port,
                        index: av.sgid_index,
                    });
                }
            }
        }
        ctx.counts.ahs.fetch_add(1, Ordering::Relaxed);
        Ok(AddressHandle {
            inner: Arc::new(AhInner {
                pd: self.clone(),
                av,
            }),
        })
    }

    /// Blocking form of [`Pd::create_ah`].
    ///
    /// # Errors
    /// As [`Pd::create_ah`].
    pub fn create_ah_blocking(&self, av: AddressVector) -> Result<AddressHandle<D>, AhError> {
        block_on(self.create_ah(av))
    }
}

impl<D: Device> AddressHandle<D> {
    /// The address vector.
    pub fn av(&self) -> &AddressVector {
        &self.inner.av
    }

    /// The PD it was created in.
    pub fn pd(&self) -> &Pd<D> {
        &self.inner.pd
    }

    /// Destroys the handle now (`ibv_destroy_ah`), releasing its PD. Refused while other
    /// handles of it exist; the handle is given back. Posted sends carry their own copy of
    /// the address, so none is affected.
    ///
    /// # Errors
    /// [`AhError::Busy`], with the handle handed back.
    pub fn destroy(self) -> Result<(), Refused<Self, AhError>> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let users = Arc::strong_count(&inner) - 1;
                Err(Refused::new(AhError::Busy { users }, Self { inner }))
            }
        }
    }

    /// The destination of a UD send through this handle to QP `remote_qpn` with Q_Key
    /// `remote_qkey` (for [`crate::SendWr::ud`]). It carries the handle's protection domain:
    /// posting it on a QP of another domain is refused
    /// ([`crate::PostErrorKind::AhOfAnotherPd`]).
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest<'_> {
        UdDest {
            ah_pd: Some(self.inner.pd.pdn()),
            av: &self.inner.av,
            remote_qpn,
            remote_qkey,
        }
    }
}

impl<D: Device> Drop for AhInner<D> {
    fn drop(&mut self) {
        self.pd.inner.ctx.counts.ahs.fetch_sub(1, Ordering::Relaxed);
    }
}

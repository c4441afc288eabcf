//! Multicast attachments of a UD QP (`ibv_attach_mcast`, `ibv_detach_mcast`; IBA 10.5.2.4 and
//! 11.3.1.1).
//!
//! The rules checked here, before the device is asked, are the ones every backend shares:
//! * only a UD QP that is not a special QP attaches (Linux's `ib_attach_mcast` in
//!   `drivers/infiniband/core/verbs.c` returns EINVAL for any other; so does QP1);
//! * the GID must be a multicast GID ([`Gid::is_multicast`]: `ff00::/8`, or the
//!   IPv4-mapped form of an IPv4 group, which is how rdma_cm names IPv4 groups on RoCEv2);
//! * the device must have multicast (`max_mcast_grp > 0`);
//! * attaching a QP to a group it is already in succeeds and changes nothing, as Linux's
//!   mlx4 (`mlx4_qp_attach_common` in `drivers/net/ethernet/mellanox/mlx4/mcg.c`) and rxe
//!   do: the attachment is not counted twice against any limit;
//! * detaching a group the QP is not in is [`McastError::NotAttached`] (mlx4 and rxe answer
//!   EINVAL).
//!
//! The device enforces its limits (`max_mcast_grp`, `max_mcast_qp_attach` per group,
//! `max_total_mcast_qp_attach`), which span every QP of the device; a refusal comes back as
//! [`McastError::LimitReached`] naming the field. The LID is passed to the device as given:
//! it addresses the group on an InfiniBand port; RoCE ports ignore it (as Linux's
//! `is_valid_mcast_lid` does for Ethernet ports). Destroying a QP detaches it from its
//! groups (Linux refuses to destroy an attached QP with EBUSY instead; dropping a handle here
//! cannot fail).

use portverbs_hal::device::Device;
use portverbs_hal::error::mcast_resource;
use portverbs_hal::types::{Gid, QpType};
use portverbs_hal::{CommandError, block_on};

use super::Qp;
use crate::context::lock;
use crate::error::McastError;

impl<D: Device> Qp<D> {
    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`): datagrams sent
    /// to the group (destination QP 0xFFFFFF, an address handle with the group's GID) are
    /// delivered to it, as to every QP attached to the group on any device of the network,
    /// when their Q_Key matches the QP's and a receive is posted. Attaching again to a group
    /// the QP is in succeeds and changes nothing. `lid` is the group's multicast LID on an
    /// InfiniBand port; RoCE ports ignore it.
    ///
    /// # Errors
    /// [`McastError`]: not a UD QP, not a multicast GID, a device without multicast, a
    /// device limit reached, or the device refused.
    pub async fn attach_mcast(&self, gid: Gid, lid: u16) -> Result<(), McastError> {
        let qpn = self.inner.qpn;
        self.check_mcast(gid)?;
        let attr = &self.ctx().attr;
        let attached = {
            let groups = lock(&self.inner.mcast);
            if groups.contains(&gid) {
                return Ok(());
            }
            groups.len()
        };
        if attached >= attr.max_mcast_grp as usize {
            return Err(McastError::LimitReached {
                qpn,
                gid,
                limit: "max_mcast_grp",
                max: attr.max_mcast_grp,
            });
        }
        self.ctx()
            .device()
            .attach_mcast(qpn, gid, lid)
            .await
            .map_err(|source| match source {
                CommandError::ResourceExhausted { resource } => {
                    let (limit, max) = match resource {
                        mcast_resource::GROUPS => ("max_mcast_grp", attr.max_mcast_grp),
                        mcast_resource::QPS_PER_GROUP => {
                            ("max_mcast_qp_attach", attr.max_mcast_qp_attach)
                        }
                        mcast_resource::ATTACHMENTS => {
                            ("max_total_mcast_qp_attach", attr.max_total_mcast_qp_attach)
                        }
                        _ => {
                            return McastError::Device {
                                qpn,
                                source: CommandError::ResourceExhausted { resource },
                            };
                        }
                    };
                    McastError::LimitReached {
                        qpn,
                        gid,
                        limit,
                        max,
                    }
                }
                CommandError::Unsupported { .. } => McastError::Unsupported,
                source => McastError::Device { qpn, source },
            })?;
        // The device attaches idempotently too, so two racing attaches of one group leave one
        // attachment and one record.
        let mut groups = lock(&self.inner.mcast);
        if !groups.contains(&gid) {
            groups.push(gid);
        }
        drop(groups);
        tracing::debug!(qpn, %gid, "attached to multicast group");
        Ok(())
    }

    /// Blocking form of [`Qp::attach_mcast`].
    ///
    /// # Errors
    /// As [`Qp::attach_mcast`].
    pub fn attach_mcast_blocking(&self, gid: Gid, lid: u16) -> Result<(), McastError> {
        block_on(self.attach_mcast(gid, lid))
    }

    /// Detaches this QP from the multicast group `gid` (`ibv_detach_mcast`): datagrams to the
    /// group no longer reach it.
    ///
    /// # Errors
    /// [`McastError::NotAttached`] when the QP is not in the group; the checks of
    /// [`Qp::attach_mcast`]; or the device refused.
    pub async fn detach_mcast(&self, gid: Gid, lid: u16) -> Result<(), McastError> {
        let qpn = self.inner.qpn;
        self.check_mcast(gid)?;
        if !lock(&self.inner.mcast).contains(&gid) {
            return Err(McastError::NotAttached { qpn, gid });
        }
        self.ctx()
            .device()
            .detach_mcast(qpn, gid, lid)
            .await
            .map_err(|source| McastError::Device { qpn, source })?;
        lock(&self.inner.mcast).retain(|g| *g != gid);
        tracing::debug!(qpn, %gid, "detached from multicast group");
        Ok(())
    }

    /// Blocking form of [`Qp::detach_mcast`].
    ///
    /// # Errors
    /// As [`Qp::detach_mcast`].
    pub fn detach_mcast_blocking(&self, gid: Gid, lid: u16) -> Result<(), McastError> {
        block_on(self.detach_mcast(gid, lid))
    }

    /// The multicast groups the QP is attached to, in no particular order.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        lock(&self.inner.mcast).clone()
    }

    fn check_mcast(&self, gid: Gid) -> Result<(), McastError> {
        let inner = &self.inner;
        if inner.qp_type != QpType::Ud || inner.special.is_some() {
            return Err(McastError::NotUd {
                qpn: inner.qpn,
                qp_type: inner.qp_type,
                special: inner.special.is_some(),
            });
        }
        if !gid.is_multicast() {
            return Err(McastError::NotMulticast { gid });
        }
        if self.ctx().attr.max_mcast_grp == 0 {
            return Err(McastError::Unsupported);
        }
        Ok(())
    }
}

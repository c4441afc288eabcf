//! Multicast joins as rdma_cm makes them on a RoCEv2 port (`rdma_join_multicast`,
//! `rdma_leave_multicast`; Linux `drivers/infiniband/core/cma.c`, `cma_iboe_join_multicast`
//! and `cma_iboe_set_mgid`).
//!
//! On Ethernet there is no subnet administrator to ask: a join names the group by its IP
//! address and attaches the QP; the IP layer's group membership (IGMP) is what makes the
//! group's datagrams arrive, and a UDP-bound port joins the IP group on its socket when its
//! first QP attaches. What rdma_cm reports with `RDMA_CM_EVENT_MULTICAST_JOIN` is what
//! [`McastJoin`] holds:
//!
//! * the MGID: an IPv4 group as its IPv4-mapped GID `::ffff:a.b.c.d` (on RoCEv2 `cma.c`
//!   leaves the first two bytes 0; RoCEv1 would make them `ff0e`), an IPv6 group verbatim;
//! * the address handle: the MGID as DGID with a GRH, the device's GID as source, hop limit
//!   64 (`IPV6_DEFAULT_HOPLIMIT`, what `cma.c` sets for IPv4 groups on RoCEv2), traffic
//!   class 0, no LID and SL 0 (mckey prints `mlid 0x0 sl 0` on RoCE);
//! * the remote QPN 0xFFFFFF (IBA 10.5.2.4: datagrams to a group go to the multicast QPN)
//!   and the Q_Key [`RDMA_UDP_QKEY`], which `cma.c` gives every group of the `RDMA_PS_UDP`
//!   port space.
//!
//! rdma_cm also sets that Q_Key on the QP when it creates it for a `RDMA_PS_UDP` id; here the
//! application brings its UD QP up itself, and must give it [`RDMA_UDP_QKEY`] (the datagrams
//! of a C peer carry it) — a join does not change the QP's Q_Key.
//!
//! Where this differs from Linux: an IPv6 group is joined on a RoCEv2 port (Linux answers
//! `ENOTSUPP` there); its address handle is as an IPv4 group's.

use std::net::IpAddr;

use portverbs_hal::Device;
use portverbs_hal::Gid;
use portverbs_hal::types::QpType;
use portverbs_verbs::{AddressVector, McastError, Qp};

use crate::{CmDevice, RDMA_UDP_QKEY, ServiceError};

/// The destination QPN of a datagram to a multicast group (IBA 10.5.2.4).
pub const MCAST_QPN: u32 = 0x00FF_FFFF;

/// The hop limit of a group's address handle (`IPV6_DEFAULT_HOPLIMIT`).
pub const MCAST_HOP_LIMIT: u8 = 64;

/// What a join returns: where to send to reach the group (librdmacm's `rdma_ud_param` of
/// `RDMA_CM_EVENT_MULTICAST_JOIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McastJoin {
    /// The group's IP address, as given.
    pub group: IpAddr,
    /// Its MGID.
    pub mgid: Gid,
    /// The address handle's attributes: create one with `Pd::create_ah` to send to the group.
    pub av: AddressVector,
    /// The remote QPN of a send to the group ([`MCAST_QPN`]).
    pub remote_qpn: u32,
    /// The remote Q_Key of a send to the group ([`RDMA_UDP_QKEY`]).
    pub qkey: u32,
}

/// The MGID of an IP multicast group on a RoCEv2 port (`cma_iboe_set_mgid`), or why the
/// address names no group.
///
/// # Errors
/// [`ServiceError::NotMulticast`] for a unicast or unspecified address.
pub fn mgid_of(group: IpAddr) -> Result<Gid, ServiceError> {
    if !group.is_multicast() {
        return Err(ServiceError::NotMulticast(group));
    }
    Ok(Gid::from_ip(group))
}

impl<D: Device> CmDevice<D> {
    fn join_params(&self, qp: &Qp<D>, group: IpAddr) -> Result<McastJoin, ServiceError> {
        if qp.qp_type() != QpType::Ud || qp.special().is_some() {
            return Err(ServiceError::NotUd(qp.qp_num()));
        }
        let mgid = mgid_of(group)?;
        let local = self.local_ip();
        if local.is_ipv4() != group.is_ipv4() {
            return Err(ServiceError::FamilyMismatch(local, group));
        }
        let av = AddressVector {
            dgid: mgid,
            sgid_index: self.gid_index(),
            flow_label: 0,
            hop_limit: MCAST_HOP_LIMIT,
            traffic_class: 0,
            is_global: true,
            port_num: self.port(),
            ..AddressVector::default()
        };
        Ok(McastJoin {
            group,
            mgid,
            av,
            remote_qpn: MCAST_QPN,
            qkey: RDMA_UDP_QKEY,
        })
    }

    /// Joins `qp` (a UD QP of this device, brought up with Q_Key [`RDMA_UDP_QKEY`]) to the IP
    /// multicast group `group` (`rdma_join_multicast`): attaches it to the group's MGID, and
    /// returns the address handle attributes, remote QPN and Q_Key that send to the group.
    /// Joining a group the QP is in already attaches nothing and succeeds.
    ///
    /// # Errors
    /// [`ServiceError::NotUd`], [`ServiceError::NotMulticast`],
    /// [`ServiceError::FamilyMismatch`] (a group of the other IP version than the device's
    /// address), or [`ServiceError::Multicast`] from the attach: the device has no
    /// multicast, or one of its limits (`max_mcast_grp`, `max_mcast_qp_attach`,
    /// `max_total_mcast_qp_attach`) is reached.
    pub async fn join_multicast(
        &self,
        qp: &Qp<D>,
        group: IpAddr,
    ) -> Result<McastJoin, ServiceError> {
        let join = self.join_params(qp, group)?;
        if !qp.mcast_groups().contains(&join.mgid) {
            qp.attach_mcast(join.mgid, 0).await?;
        }
        Ok(join)
    }

    /// A send-only join (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`): what sends to the group,
    /// without attaching `qp` to it, so nothing sent to the group is received on it (librdmacm
    /// attaches the QP only for a full join, and Linux sends no IGMP report for this one).
    /// Nothing to wait for, and nothing to leave.
    ///
    /// # Errors
    /// As [`CmDevice::join_multicast`] for the arguments.
    pub fn join_multicast_send_only(
        &self,
        qp: &Qp<D>,
        group: IpAddr,
    ) -> Result<McastJoin, ServiceError> {
        self.join_params(qp, group)
    }

    /// Blocking form of [`CmDevice::join_multicast`].
    ///
    /// # Errors
    /// As [`CmDevice::join_multicast`].
    pub fn join_multicast_blocking(
        &self,
        qp: &Qp<D>,
        group: IpAddr,
    ) -> Result<McastJoin, ServiceError> {
        portverbs_hal::block_on(self.join_multicast(qp, group))
    }

    /// Leaves the group (`rdma_leave_multicast`): detaches `qp` from it. The port leaves the
    /// IP group when its last QP in it detaches.
    ///
    /// # Errors
    /// As [`CmDevice::join_multicast`] for the arguments; [`ServiceError::Multicast`] with
    /// [`McastError::NotAttached`] when the QP is not in the group.
    pub async fn leave_multicast(&self, qp: &Qp<D>, group: IpAddr) -> Result<(), ServiceError> {
        let join = self.join_params(qp, group)?;
        qp.detach_mcast(join.mgid, 0).await?;
        Ok(())
    }

    /// Blocking form of [`CmDevice::leave_multicast`].
    ///
    /// # Errors
    /// As [`CmDevice::leave_multicast`].
    pub fn leave_multicast_blocking(&self, qp: &Qp<D>, group: IpAddr) -> Result<(), ServiceError> {
        portverbs_hal::block_on(self.leave_multicast(qp, group))
    }
}

impl From<McastError> for ServiceError {
    fn from(e: McastError) -> Self {
        Self::Multicast(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_groups_map_as_rdma_cm_maps_them_on_rocev2() {
        let g = mgid_of("239.1.2.3".parse().unwrap()).unwrap();
        assert_eq!(
            g.0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3]
        );
        let v6: IpAddr = "ff0e::1234".parse().unwrap();
        assert_eq!(mgid_of(v6).unwrap().to_ip(), v6);
    }

    #[test]
    fn unicast_and_unspecified_addresses_are_no_groups() {
        for a in [
            "10.0.0.1",
            "0.0.0.0",
            "240.0.0.1",
            "::",
            "fe80::1",
            "::ffff:239.1.2.3",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert!(
                matches!(mgid_of(ip), Err(ServiceError::NotMulticast(x)) if x == ip),
                "{a}"
            );
        }
    }
}

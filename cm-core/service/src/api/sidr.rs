//! UD services through the CM (`RDMA_PS_UDP`): service ID resolution, SIDR_REQ / SIDR_REP
//! (IBA 12.11), as rdma_cm makes it on a RoCE port (Linux `drivers/infiniband/core/cma.c`).
//!
//! The passive side binds with [`Listener::bind_udp`], takes each request with
//! [`Listener::get_service_request`] (the requester's address and private data from the
//! SIDR_REQ's CMA header, [`ServiceRequest::remote_addr`], [`ServiceRequest::private_data`])
//! and answers with its UD QP ([`ServiceRequest::reply_with`]). The active side calls
//! [`Connector::resolve_service`] and gets a [`UdService`]: the QPN, the Q_Key, the
//! SIDR_REP's private data, and the address vector a send to the service needs.
//!
//! What rdma_cm does and this does too:
//! * the Q_Key of the port space is [`RDMA_UDP_QKEY`] ([`UdParam::default`]); a Linux active
//!   side whose QP has it already treats a SIDR_REP naming another as an address error;
//! * private data: 180 bytes to the service (the SIDR_REQ's 216 after the 36-byte CMA header,
//!   [`SIDR_REQ_USER_DATA`]), 136 back ([`SIDR_REP_USER_DATA`]); both sides see the whole
//!   field, zero-padded, as librdmacm's `private_data_len` reports it;
//! * the address vector toward the service carries a GRH from the device's GID to the
//!   service's, traffic class 0 and hop limit [`ROUTE_HOP_LIMIT`]: rdma_cm takes the hop
//!   limit of a RoCE route from the IP route (`cma_resolve_iboe_route`, the route's TTL,
//!   64 with Linux's default `net.ipv4.ip_default_ttl`);
//! * a SIDR_REQ whose CMA header is unreadable, or names another address than the one the
//!   listener is bound to, is answered "rejected", as Linux answers a request its passive
//!   checks refuse.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use portverbs_cm::wire::{
    CMA_HEADER_LEN, CmaHeader, PortSpace, SIDR_REP_PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA, SidrStatus,
    service_id,
};
use portverbs_cm::{CmId, SidrParams};
use portverbs_hal::{Device, Gid};
use portverbs_verbs::{AddressHandle, AddressVector, AhError, Pd, Qp};

use super::{Connector, Listener, take};
use crate::engine::{ListenState, SidrPending, State};
use crate::{CmDevice, RdmaCmEvent, ServiceError, addr};

/// The Q_Key of rdma_cm's UD port space (`RDMA_UDP_QKEY`, librdmacm `rdma_cma.h` and Linux
/// `include/rdma/rdma_cm.h`): a kernel rdma_cm gives its UD QPs of `RDMA_PS_UDP` this Q_Key
/// and names it in its SIDR_REPs (Linux `drivers/infiniband/core/cma.c`, `cma_set_qkey`). A UD
/// service that talks to librdmacm's tools (`udaddy`) receives with it and replies with it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The hop limit (IPv4 TTL) of the address vector toward a resolved UD service: what rdma_cm
/// takes from the IP route on RoCE (64, Linux's default TTL).
pub const ROUTE_HOP_LIMIT: u8 = 64;

/// Private data the requester sends a UD service: the SIDR_REQ's 216 bytes after the CMA
/// header (librdmacm: 180).
pub const SIDR_REQ_USER_DATA: usize = SIDR_REQ_PRIVATE_DATA - CMA_HEADER_LEN;

/// Private data a UD service sends back: the SIDR_REP's 136 bytes.
pub const SIDR_REP_USER_DATA: usize = SIDR_REP_PRIVATE_DATA;

/// How a UD service answers ([`ServiceRequest::reply_with`]): librdmacm's `rdma_conn_param`
/// of an accept on a `RDMA_PS_UDP` id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The Q_Key the service's QP receives with, named in the SIDR_REP.
    pub qkey: u32,
    /// At most [`SIDR_REP_USER_DATA`] bytes.
    pub private_data: Vec<u8>,
}

impl Default for UdParam {
    /// [`RDMA_UDP_QKEY`] and no private data: what a librdmacm service answers.
    fn default() -> Self {
        Self {
            qkey: RDMA_UDP_QKEY,
            private_data: Vec::new(),
        }
    }
}

/// Where a UD service is: what [`Connector::resolve_service`] returns (librdmacm's
/// `rdma_ud_param` of the `ESTABLISHED` event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdService {
    /// The service's GID (its IP's RoCEv2 GID): the address handle's destination.
    pub gid: Gid,
    /// Its UD QPN.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The address vector that reaches it: GRH to [`UdService::gid`] from this device's GID,
    /// hop limit [`ROUTE_HOP_LIMIT`], traffic class 0, the CM's port ([`CmDevice::port`]).
    /// Ready for [`Pd::create_ah`] ([`UdService::create_ah`]).
    pub av: AddressVector,
    /// The SIDR_REP's private data: all [`SIDR_REP_USER_DATA`] bytes, zero-padded.
    pub private_data: Vec<u8>,
}

impl UdService {
    /// An address handle in `pd` toward the service ([`UdService::av`]); send with
    /// `ah.dest(svc.qpn, svc.qkey)`.
    ///
    /// # Errors
    /// As [`Pd::create_ah`].
    pub async fn create_ah<D: Device>(&self, pd: &Pd<D>) -> Result<AddressHandle<D>, AhError> {
        pd.create_ah(self.av).await
    }

    /// Blocking form of [`UdService::create_ah`].
    ///
    /// # Errors
    /// As [`UdService::create_ah`].
    pub fn create_ah_blocking<D: Device>(&self, pd: &Pd<D>) -> Result<AddressHandle<D>, AhError> {
        pd.create_ah_blocking(self.av)
    }
}

/// The address vector toward a UD service at `gid`, sent from the GID at `sgid_index` of
/// `port`.
fn service_av(gid: Gid, port: u8, sgid_index: u8) -> AddressVector {
    AddressVector {
        dgid: gid,
        sgid_index,
        flow_label: 0,
        hop_limit: ROUTE_HOP_LIMIT,
        traffic_class: 0,
        is_global: true,
        port_num: port,
        ..AddressVector::default()
    }
}

/// The outcome of a SIDR request, as a result.
fn sidr_outcome(
    dst: SocketAddr,
    port: u8,
    sgid_index: u8,
) -> impl FnMut(&RdmaCmEvent) -> Option<Result<UdService, ServiceError>> {
    move |e| match e {
        RdmaCmEvent::ServiceResolved {
            status: SidrStatus::Success,
            qpn,
            qkey,
            private_data,
        } => {
            let gid = addr::ip_to_gid(dst.ip());
            Some(Ok(UdService {
                gid,
                qpn: *qpn,
                qkey: *qkey,
                av: service_av(gid, port, sgid_index),
                private_data: private_data.clone(),
            }))
        }
        RdmaCmEvent::ServiceResolved { status, .. } => {
            Some(Err(ServiceError::ServiceRejected(*status)))
        }
        RdmaCmEvent::Unreachable => Some(Err(ServiceError::Unreachable)),
        _ => None,
    }
}

/// The requester's and the service's addresses from the CMA header at the start of `pd`,
/// when the header passes the checks a connection request's does here (the engine's
/// `admit`): readable, one IP version throughout, sent to the listener's address (or any,
/// for an unspecified bind, as Linux's `cma_match_private_data` matches), from a unicast
/// source.
fn cma_addresses(bound: SocketAddr, pd: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let h = CmaHeader::parse(pd).ok()?;
    let ip = bound.ip();
    if h.src.is_ipv4() != h.dst.is_ipv4() || ip.is_ipv4() != h.dst.is_ipv4() {
        return None;
    }
    if !ip.is_unspecified() && ip != h.dst {
        return None;
    }
    let broadcast = matches!(h.src, IpAddr::V4(v4) if v4.is_broadcast());
    if h.src.is_unspecified() || h.src.is_multicast() || broadcast {
        return None;
    }
    Some((
        SocketAddr::new(h.src, h.src_port),
        SocketAddr::new(h.dst, bound.port()),
    ))
}

/// A SIDR_REQ a listener takes into its queue, or `None` when it must be refused: not a UDP
/// listener, its backlog full, or its CMA header refused ([`cma_addresses`]).
pub(crate) fn admit_sidr(l: &ListenState, id: CmId, pd: &[u8]) -> Option<SidrPending> {
    if !l.udp || l.sidr.len() >= l.backlog {
        return None;
    }
    let (remote, local) = cma_addresses(l.bound, pd)?;
    Some(SidrPending {
        id,
        remote,
        local,
        private_data: pd.get(CMA_HEADER_LEN..).unwrap_or_default().to_vec(),
    })
}

impl<D: Device> Listener<D> {
    fn pop_sidr(&self, st: &mut State<D>) -> Option<ServiceRequest<D>> {
        let p = st.listeners.get_mut(&self.id)?.sidr.pop_front()?;
        Some(ServiceRequest {
            dev: Some(self.dev.clone()),
            p,
        })
    }

    /// The next UD service resolution request (a SIDR_REQ on an `RDMA_PS_UDP` listener).
    ///
    /// # Errors
    /// The device failed.
    pub async fn get_service_request(&self) -> Result<ServiceRequest<D>, ServiceError> {
        self.dev.wait_async(|st| self.pop_sidr(st)).await
    }

    /// Blocking form of [`Listener::get_service_request`], with an optional timeout.
    ///
    /// # Errors
    /// As [`Listener::get_service_request`], or [`ServiceError::TimedOut`].
    pub fn get_service_request_blocking(
        &self,
        timeout: Option<Duration>,
    ) -> Result<ServiceRequest<D>, ServiceError> {
        self.dev.wait_blocking(timeout, |st| self.pop_sidr(st))
    }
}

/// A UD service resolution request: answer it with a UD QP and Q_Key, or drop it (SIDR_REP
/// "rejected").
pub struct ServiceRequest<D: Device> {
    dev: Option<CmDevice<D>>,
    p: SidrPending,
}

impl<D: Device> fmt::Debug for ServiceRequest<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceRequest")
            .field("id", &self.p.id)
            .field("remote", &self.p.remote)
            .field("local", &self.p.local)
            .finish()
    }
}

impl<D: Device> ServiceRequest<D> {
    /// The requester's address: its IP and rdma_cm port, from the SIDR_REQ's CMA header.
    pub fn remote_addr(&self) -> SocketAddr {
        self.p.remote
    }

    /// The address the request was sent to: the IP the CMA header names, the listener's port.
    pub fn local_addr(&self) -> SocketAddr {
        self.p.local
    }

    /// The requester's private data: the [`SIDR_REQ_USER_DATA`] bytes after the CMA header,
    /// zero-padded.
    pub fn private_data(&self) -> &[u8] {
        &self.p.private_data
    }

    /// Answers with `qp` (a UD QP) and the Q_Key it receives with, and no private data
    /// ([`ServiceRequest::reply_with`]; a librdmacm peer expects [`RDMA_UDP_QKEY`]).
    ///
    /// # Errors
    /// As [`ServiceRequest::reply_with`].
    pub fn reply(self, qp: &Qp<D>, qkey: u32) -> Result<(), ServiceError> {
        let param = UdParam {
            qkey,
            private_data: Vec::new(),
        };
        self.reply_with(qp, &param)
    }

    /// Answers with `qp` (a UD QP): the SIDR_REP names its QPN, `param.qkey` (default
    /// [`RDMA_UDP_QKEY`]) and carries `param.private_data`.
    ///
    /// # Errors
    /// [`ServiceError::NotUd`]; [`ServiceError::PrivateDataTooLong`] beyond
    /// [`SIDR_REP_USER_DATA`] bytes. Either way the request is gone, refused as a dropped one
    /// is (SIDR_REP "rejected").
    pub fn reply_with(mut self, qp: &Qp<D>, param: &UdParam) -> Result<(), ServiceError> {
        if qp.qp_type() != portverbs_hal::types::QpType::Ud {
            return Err(ServiceError::NotUd(qp.qp_num()));
        }
        if param.private_data.len() > SIDR_REP_USER_DATA {
            return Err(ServiceError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: SIDR_REP_USER_DATA,
            });
        }
        let Some(dev) = self.dev.take() else {
            return Err(ServiceError::Closed);
        };
        let now = dev.now();
        let mut st = dev.state();
        let id = self.p.id;
        let r = st.agent.sidr_reply(
            id,
            SidrStatus::Success,
            qp.qp_num(),
            param.qkey,
            &param.private_data,
        );
        let _ = st.agent.destroy(now, id);
        dev.drain(&mut st)?;
        r.map_err(Into::into)
    }
}

impl<D: Device> Drop for ServiceRequest<D> {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            dev.destroy_endpoints(&mut dev.state(), [self.p.id]);
        }
    }
}

impl<D: Device> Connector<D> {
    fn start_sidr(&mut self, dst: SocketAddr, private_data: &[u8]) -> Result<(), ServiceError> {
        let local = self.dev.local_ip();
        if local.is_ipv4() != dst.ip().is_ipv4() {
            return Err(ServiceError::FamilyMismatch(local, dst.ip()));
        }
        if private_data.len() > SIDR_REQ_USER_DATA {
            return Err(ServiceError::PrivateDataTooLong {
                len: private_data.len(),
                max: SIDR_REQ_USER_DATA,
            });
        }
        self.dst = Some(dst);
        let mut pd = vec![0u8; CMA_HEADER_LEN + private_data.len()];
        CmaHeader {
            src_port: self.src_port,
            src: local,
            dst: dst.ip(),
        }
        .emit(&mut pd)?;
        pd[CMA_HEADER_LEN..].copy_from_slice(private_data);
        // rdma_cm's SIDR timer: 4.3 s (code 20), 15 retries (Linux `cma.c`, `cma_resolve_ib_udp`).
        let p = SidrParams {
            service_id: service_id(PortSpace::Udp, dst.port()),
            pkey: 0xFFFF,
            timeout: 20,
            max_retries: 15,
        };
        let now = self.dev.now();
        let mut st = self.dev.state();
        st.agent
            .sidr_request(now, self.id, addr::ip_to_gid(dst.ip()), &p, &pd)?;
        self.dev.drain(&mut st)?;
        Ok(())
    }

    /// UD service resolution (`RDMA_PS_UDP`, SIDR): asks `dst` for the QPN and Q_Key of its
    /// UD service; the answer comes with the address vector that reaches it.
    ///
    /// # Errors
    /// [`ServiceError::ServiceRejected`] with the SIDR_REP status (nobody listens, or the
    /// listener refused), [`ServiceError::Unreachable`].
    pub async fn resolve_service(&mut self, dst: SocketAddr) -> Result<UdService, ServiceError> {
        self.resolve_service_with(dst, &[]).await
    }

    /// Blocking form of [`Connector::resolve_service`].
    ///
    /// # Errors
    /// As [`Connector::resolve_service`].
    pub fn resolve_service_blocking(&mut self, dst: SocketAddr) -> Result<UdService, ServiceError> {
        self.resolve_service_with_blocking(dst, &[])
    }

    /// [`Connector::resolve_service`] with `private_data` for the service (at most
    /// [`SIDR_REQ_USER_DATA`] bytes, after the CMA header).
    ///
    /// # Errors
    /// As [`Connector::resolve_service`], or [`ServiceError::PrivateDataTooLong`] (nothing
    /// is sent).
    pub async fn resolve_service_with(
        &mut self,
        dst: SocketAddr,
        private_data: &[u8],
    ) -> Result<UdService, ServiceError> {
        self.start_sidr(dst, private_data)?;
        let (id, port, index) = (self.id, self.dev.port(), self.dev.gid_index());
        self.dev
            .wait_async(|st| take(st, id, sidr_outcome(dst, port, index)))
            .await?
    }

    /// Blocking form of [`Connector::resolve_service_with`].
    ///
    /// # Errors
    /// As [`Connector::resolve_service_with`].
    pub fn resolve_service_with_blocking(
        &mut self,
        dst: SocketAddr,
        private_data: &[u8],
    ) -> Result<UdService, ServiceError> {
        self.start_sidr(dst, private_data)?;
        let (id, port, index) = (self.id, self.dev.port(), self.dev.gid_index());
        self.dev
            .wait_blocking(None, |st| take(st, id, sidr_outcome(dst, port, index)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(src: &str, dst: &str, port: u16) -> Vec<u8> {
        let mut pd = vec![0u8; SIDR_REQ_PRIVATE_DATA];
        CmaHeader {
            src_port: port,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
        }
        .emit(&mut pd)
        .unwrap();
        pd
    }

    #[test]
    fn the_cma_header_gives_both_addresses() {
        let bound: SocketAddr = "0.0.0.0:7174".parse().unwrap();
        let pd = header("10.0.0.2", "10.0.0.1", 0xC001);
        assert_eq!(
            cma_addresses(bound, &pd),
            Some((
                "10.0.0.2:49153".parse().unwrap(),
                "10.0.0.1:7174".parse().unwrap()
            ))
        );
    }

    #[test]
    fn requests_the_passive_checks_refuse() {
        let bound: SocketAddr = "10.0.0.1:7174".parse().unwrap();
        // To another address than the bound one.
        assert_eq!(
            cma_addresses(bound, &header("10.0.0.2", "10.0.0.9", 1)),
            None
        );
        // From a broadcast, multicast or unspecified source.
        for src in ["255.255.255.255", "224.0.0.1", "0.0.0.0"] {
            assert_eq!(
                cma_addresses(bound, &header(src, "10.0.0.1", 1)),
                None,
                "{src}"
            );
        }
        // Of the other IP version.
        assert_eq!(cma_addresses(bound, &header("::2", "::1", 1)), None);
        // Unreadable: too short, or a bad version.
        assert_eq!(cma_addresses(bound, &[0u8; 10]), None);
        let mut pd = header("10.0.0.2", "10.0.0.1", 1);
        pd[0] = 1;
        assert_eq!(cma_addresses(bound, &pd), None);
    }

    #[test]
    fn the_service_address_vector_is_ready_to_route() {
        let gid = addr::ip_to_gid("10.0.0.1".parse().unwrap());
        let av = service_av(gid, 2, 3);
        assert!(av.is_global);
        assert_eq!((av.dgid, av.sgid_index, av.port_num), (gid, 3, 2));
        assert_eq!((av.hop_limit, av.traffic_class, av.flow_label), (64, 0, 0));
        assert_eq!(UdParam::default().qkey, 0x0123_4567);
        assert_eq!((SIDR_REQ_USER_DATA, SIDR_REP_USER_DATA), (180, 136));
    }
}

//! The application's API: [`Listener`], [`ConnectionRequest`] and [`Connector`], each
//! call async with a `_blocking` twin.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use portverbs_hal::Device;
use portverbs_hal::types::Mtu;
use portverbs_verbs::Qp;

use crate::engine::{CmDevice, ListenState, Pending, State};
use crate::{RdmaCmEvent, ServiceError, addr};
use portverbs_cm::wire::{CMA_HEADER_LEN, CmaHeader, PortSpace, REQ_PRIVATE_DATA, service_id};
use portverbs_cm::{CmId, CmState, PathParams};
use portverbs_hal::Gid;

mod sidr;
pub(crate) use sidr::admit_sidr;
pub use sidr::{
    RDMA_UDP_QKEY, ROUTE_HOP_LIMIT, SIDR_REP_USER_DATA, SIDR_REQ_USER_DATA, ServiceRequest,
    UdParam, UdService,
};

/// Private data after the CMA header in a REQ.
pub const REQ_USER_DATA: usize = REQ_PRIVATE_DATA - CMA_HEADER_LEN;

/// Connection parameters, as librdmacm's `rdma_conn_param` plus the `rdma_set_option`
/// settings of an ID (TOS, ACK timeout) and its path MTU.
///
/// Everything is checked before anything goes on the wire: a depth above the device's
/// limit, an ACK timeout above 31 or private data too long fail `connect`/`accept` with a
/// typed error ([`ServiceError::InvalidParam`], as librdmacm's `EINVAL`), the QP untouched.
///
/// librdmacm's `qp_num` (the QPN a REQ or REP names when the ID has no QP) has no field:
/// `connect` and `accept` always take the QP, because this CM moves it through INIT, RTR and
/// RTS itself (rdma_cm without a QP leaves those transitions to the application, through
/// `rdma_init_qp_attr`, which this layer does not offer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data: at most 56 bytes on connect (after the CMA header), 196 on accept, 148
    /// on reject.
    pub private_data: Vec<u8>,
    /// READ/ATOMIC operations we accept as responder: the QP's `max_dest_rd_atomic`, at most
    /// the device's `max_qp_rd_atom`. `None`: that maximum (accept: capped by the request's
    /// initiator depth), as librdmacm's `RDMA_MAX_RESP_RES` or a NULL `conn_param`. With 0
    /// the QP grants remote WRITE only, no remote READ or atomics (as Linux's CM), and the
    /// peer's initiator depth becomes 0 too: a READ the peer posts then completes in error
    /// at once, never reaching us (`LOC_QP_OP_ERR` on the soft device; see the crate docs).
    pub responder_resources: Option<u8>,
    /// READ/ATOMIC operations we issue at once: the QP's `max_rd_atomic`, at most the
    /// device's `max_qp_init_rd_atom`. `None`: that maximum (accept: capped by the request's
    /// responder resources), as librdmacm's `RDMA_MAX_INIT_DEPTH` or a NULL `conn_param`.
    pub initiator_depth: Option<u8>,
    /// End-to-end flow control: the REQ's (connect) or REP's (accept) bit.
    pub flow_control: bool,
    /// Transport retries (connect; at most 7).
    pub retry_count: u8,
    /// RNR retries asked of the peer (at most 7 = infinite).
    pub rnr_retry_count: u8,
    /// Whether our QP receives through an SRQ: the REQ's or REP's SRQ bit. Set for us when
    /// the QP given has an SRQ (as librdmacm does from `id->qp->srq`).
    pub srq: bool,
    /// Connect: the traffic class of the path (rdma_cm's TOS, `RDMA_OPTION_ID_TOS`): the
    /// REQ's primary path carries it and both QPs' address vectors get it. Accept: unused,
    /// the REQ's traffic class is the connection's.
    pub tos: u8,
    /// Our QP's local ACK timeout (5-bit exponent, 4.096 µs · 2^n; 0 disables the timer), as
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: our QP only, not negotiated. `None`:
    /// the path's (from the packet life time and the peer's ACK delay).
    pub ack_timeout: Option<u8>,
    /// The path MTU, at most the port's active MTU (a larger one is cut to it). `None`: the
    /// port's active MTU ([`CmDevice::port_mtu`], queried when the CM was opened; rdma_cm
    /// takes the netdev's MTU, rounded down to an IB MTU). Connect: the REQ's path MTU.
    /// Accept: the QP gets the smaller of this and the REQ's. The REP carries no MTU, so the
    /// active side keeps the one it asked for: where the two ports' MTUs differ, a connect
    /// from the larger one leaves the QPs with different path MTUs, and messages of more than
    /// one packet may then fail (the soft device's responder expects packets of its own
    /// MTU). Keep the ports' MTUs equal, as on one Ethernet segment, or connect with the
    /// smaller one here.
    pub path_mtu: Option<Mtu>,
    /// Connect: how long the peer may take to answer the REQ, as the REQ's 5-bit "remote CM
    /// response timeout" (4.096 µs · 2^n; rdma_cm's `CMA_CM_RESPONSE_TIMEOUT`, 20 ≈ 4.3 s).
    pub cm_response_timeout: u8,
    /// Connect: how many times an unanswered REQ is sent again (4 bits; rdma_cm's
    /// `CMA_MAX_CM_RETRIES`, 15).
    pub max_cm_retries: u8,
    /// Connect: the application's limit on the whole wait for an answer; `None`: the retry
    /// budget alone. Either way an unanswered connect ends in [`ServiceError::Unreachable`]
    /// with its QP in ERR, as one whose retries ran out; [`ConnParam::connect_budget`] says
    /// when.
    pub timeout: Option<Duration>,
}

impl Default for ConnParam {
    /// What `rdma_connect(id, NULL)` uses: the device's maximum READ/ATOMIC depths each way
    /// (librdmacm `cma.c`: `max_responder_resources`, `max_initiator_depth`), 7 retries, no
    /// flow control, TOS 0, the path's ACK timeout, the port's MTU, and the kernel CM's REQ
    /// timers (response timeout 20, 15 CM retries: 73.7 s on RoCE).
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: None,
            initiator_depth: None,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            tos: 0,
            ack_timeout: None,
            path_mtu: None,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            timeout: None,
        }
    }
}

/// The depths and limits `connect`/`accept` resolved against the device and port.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    responder_resources: u8,
    initiator_depth: u8,
    /// IB enum.
    path_mtu: u8,
}

impl ConnParam {
    /// How long a connect with these parameters waits for a peer that never answers before
    /// it ends in [`ServiceError::Unreachable`]: `max_cm_retries + 1` REQs, each waited for
    /// twice the RoCE path's packet life time plus `cm_response_timeout` (Linux's rounding
    /// of the 5-bit times to 2^(n−8) ms), at most five minutes, and at most `timeout`. With
    /// the defaults, 16 × (2 × 256 + 4 096) ms = 73.7 s, what rdma_cm takes.
    ///
    /// A peer whose CM is up but has nobody listening answers at once with REJ 8
    /// ([`ServiceError::Rejected`]); the budget is for a peer that does not answer at all.
    pub fn connect_budget(&self) -> Duration {
        let budget = Duration::from_nanos(self.cm_params().retry_budget_ns());
        self.timeout.map_or(budget, |t| t.min(budget))
    }

    /// The agent's parameters these fields set (the rest of them are the caller's; the
    /// depths and the MTU are resolved against the device by [`ConnParam::resolve`]).
    fn cm_params(&self) -> portverbs_cm::ConnectParams {
        let mut path = PathParams::roce(Gid::default(), Gid::default());
        path.traffic_class = self.tos;
        portverbs_cm::ConnectParams {
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            max_cm_retries: self.max_cm_retries,
            remote_cm_response_timeout: self.cm_response_timeout,
            flow_control: self.flow_control,
            ack_timeout: self.ack_timeout,
            ..portverbs_cm::ConnectParams::new(0, 0, 0, path)
        }
    }

    /// Checks these parameters against the device (librdmacm's `ucma_valid_param`) and the
    /// CM's port, and resolves the depths and the path MTU left to them; nothing is sent and no
    /// QP is touched.
    fn resolve<D: Device>(&self, dev: &CmDevice<D>) -> Result<Resolved, ServiceError> {
        let attr = dev.context().attr();
        let depth = |name, asked: Option<u8>, max: u32| {
            let max8 = u8::try_from(max).unwrap_or(u8::MAX);
            match asked {
                None => Ok(max8),
                Some(v) if u32::from(v) <= max => Ok(v),
                Some(v) => Err(ServiceError::InvalidParam {
                    name,
                    value: v.into(),
                    max,
                }),
            }
        };
        let responder_resources = depth(
            "responder_resources",
            self.responder_resources,
            attr.max_qp_rd_atom,
        )?;
        let initiator_depth = depth(
            "initiator_depth",
            self.initiator_depth,
            attr.max_qp_init_rd_atom,
        )?;
        if let Some(t) = self.ack_timeout.filter(|t| *t > 31) {
            return Err(ServiceError::InvalidParam {
                name: "ack_timeout",
                value: t.into(),
                max: 31,
            });
        }
        let port = dev.port_mtu();
        let mtu = self.path_mtu.map_or(port, |m| m.min(port));
        Ok(Resolved {
            responder_resources,
            initiator_depth,
            path_mtu: mtu as u8,
        })
    }
}

/// Parameters of `connect`.
pub type ConnectParams = ConnParam;
/// Parameters of `accept`.
pub type AcceptParams = ConnParam;

/// The first event of `id`'s queue that `pick` takes; events before it are kept.
fn take<D: Device, T>(
    st: &mut State<D>,
    id: CmId,
    mut pick: impl FnMut(&RdmaCmEvent) -> Option<T>,
) -> Option<T> {
    let q = st.events.get_mut(&id)?;
    let at = q.iter().position(|e| pick(e).is_some())?;
    q.remove(at).and_then(|e| pick(&e))
}

/// The outcome of connect/accept, as a result.
fn outcome(e: &RdmaCmEvent) -> Option<Result<Vec<u8>, ServiceError>> {
    match e {
        RdmaCmEvent::Established { private_data } => Some(Ok(private_data.clone())),
        RdmaCmEvent::Rejected {
            reason,
            private_data,
        } => Some(Err(ServiceError::Rejected {
            reason: *reason,
            private_data: private_data.clone(),
        })),
        RdmaCmEvent::Unreachable => Some(Err(ServiceError::Unreachable)),
        RdmaCmEvent::ConnectError { detail } => {
            Some(Err(ServiceError::ConnectError(detail.clone())))
        }
        RdmaCmEvent::Disconnected => Some(Err(ServiceError::Closed)),
        _ => None,
    }
}

/// The passive side: bound to an address, listening for connection requests.
pub struct Listener<D: Device> {
    dev: CmDevice<D>,
    id: CmId,
    addr: SocketAddr,
    udp: bool,
}

impl<D: Device> fmt::Debug for Listener<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("id", &self.id)
            .field("addr", &self.addr)
            .finish()
    }
}

impl<D: Device> Listener<D> {
    /// Binds to `addr` (the device's IP or the unspecified address of its family; port not
    /// 0) in the `RDMA_PS_TCP` port space. The port is this listener's until it is dropped:
    /// as `rdma_bind_addr` without `SO_REUSEADDR`, a second bind to it (the same address, or
    /// the unspecified one, which this device's single IP makes the same) fails.
    ///
    /// # Errors
    /// [`ServiceError::AddressNotLocal`], [`ServiceError::PortZero`],
    /// [`ServiceError::AddressInUse`] (librdmacm's `EADDRINUSE`), or the agent's table is
    /// full.
    pub fn bind(dev: &CmDevice<D>, addr: SocketAddr) -> Result<Self, ServiceError> {
        Self::bind_in(dev, addr, false)
    }

    fn bind_in(dev: &CmDevice<D>, addr: SocketAddr, udp: bool) -> Result<Self, ServiceError> {
        let ip = addr.ip();
        if !ip.is_unspecified() && ip != dev.local_ip() {
            return Err(ServiceError::AddressNotLocal(ip));
        }
        if addr.port() == 0 {
            return Err(ServiceError::PortZero);
        }
        let mut st = dev.state();
        if st.bound.contains(&(udp, addr.port())) {
            return Err(ServiceError::AddressInUse(addr));
        }
        let id = st.agent.create_id()?;
        st.bound.insert((udp, addr.port()));
        Ok(Self {
            dev: dev.clone(),
            id,
            addr,
            udp,
        })
    }

    /// Binds to `addr` in the `RDMA_PS_UDP` port space: after [`Listener::listen`], UD
    /// service resolution requests (SIDR) arrive through
    /// [`Listener::get_service_request`].
    ///
    /// # Errors
    /// As [`Listener::bind`] (the UDP port space is apart from the TCP one).
    pub fn bind_udp(dev: &CmDevice<D>, addr: SocketAddr) -> Result<Self, ServiceError> {
        Self::bind_in(dev, addr, true)
    }

    /// Listens: up to `backlog` requests wait for [`Listener::get_request`]; beyond that a
    /// request is refused (REJ 28) as when any other passive check fails.
    ///
    /// # Errors
    /// Another listener of this device holds the port, or this one listens already.
    pub fn listen(&mut self, backlog: usize) -> Result<(), ServiceError> {
        let mut st = self.dev.state();
        let ps = if self.udp {
            PortSpace::Udp
        } else {
            PortSpace::Tcp
        };
        st.agent.listen(self.id, service_id(ps, self.addr.port()))?;
        st.listeners.insert(
            self.id,
            ListenState {
                bound: self.addr,
                backlog: backlog.max(1),
                pending: Default::default(),
                udp: self.udp,
                sidr: Default::default(),
            },
        );
        Ok(())
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn pop(&self, st: &mut State<D>) -> Option<ConnectionRequest<D>> {
        let p = st.listeners.get_mut(&self.id)?.pending.pop_front()?;
        st.events.insert(p.id, Default::default());
        Some(ConnectionRequest {
            dev: Some(self.dev.clone()),
            p,
        })
    }

    /// The next connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`).
    ///
    /// # Errors
    /// The device failed.
    pub async fn get_request(&self) -> Result<ConnectionRequest<D>, ServiceError> {
        self.dev.wait_async(|st| self.pop(st)).await
    }

    /// Blocking form of [`Listener::get_request`], with an optional timeout.
    ///
    /// # Errors
    /// As [`Listener::get_request`], or [`ServiceError::TimedOut`].
    pub fn get_request_blocking(
        &self,
        timeout: Option<Duration>,
    ) -> Result<ConnectionRequest<D>, ServiceError> {
        self.dev.wait_blocking(timeout, |st| self.pop(st))
    }
}

impl<D: Device> Drop for Listener<D> {
    fn drop(&mut self) {
        let mut st = self.dev.state();
        st.bound.remove(&(self.udp, self.addr.port()));
        let (pending, sidr) = match st.listeners.remove(&self.id) {
            Some(l) => (l.pending, l.sidr),
            None => Default::default(),
        };
        let ids = pending.into_iter().map(|p| p.id);
        let ids = ids.chain(sidr.into_iter().map(|s| s.id));
        self.dev.destroy_endpoints(&mut st, ids.chain([self.id]));
    }
}

/// A connection request taken from a listener: accept it, reject it, or drop it (REJ 28).
pub struct ConnectionRequest<D: Device> {
    dev: Option<CmDevice<D>>,
    p: Pending,
}

impl<D: Device> fmt::Debug for ConnectionRequest<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionRequest")
            .field("remote", &self.p.remote)
            .field("local", &self.p.local)
            .field("private_data", &self.p.private_data.len())
            .finish()
    }
}

impl<D: Device> ConnectionRequest<D> {
    /// The active side's address (from the CMA header).
    pub fn remote_addr(&self) -> SocketAddr {
        self.p.remote
    }

    /// The address it was sent to.
    pub fn local_addr(&self) -> SocketAddr {
        self.p.local
    }

    /// The consumer's private data (the 56 bytes after the CMA header).
    pub fn private_data(&self) -> &[u8] {
        &self.p.private_data
    }

    /// Makes `qp` (an RC QP in RESET) this request's QP and moves it to INIT, as librdmacm's
    /// `rdma_create_qp` leaves a new QP: receives can be posted on it before
    /// [`ConnectionRequest::accept`] with the same QP, so that a peer which sends as soon as
    /// it is connected finds them (a QP in RESET refuses receives). Nothing is sent.
    ///
    /// # Errors
    /// The QP is not RC or belongs to a connection already, or the INIT transition failed.
    pub async fn init_qp(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        let dev = self.dev.as_ref().ok_or(ServiceError::Closed)?;
        dev.associate(self.p.id, qp).await
    }

    /// Blocking form of [`ConnectionRequest::init_qp`].
    ///
    /// # Errors
    /// As [`ConnectionRequest::init_qp`].
    pub fn init_qp_blocking(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        portverbs_hal::block_on(self.init_qp(qp))
    }

    /// Accepts on `qp`: the CM takes it through RTR and RTS with the request's attributes,
    /// sends the REP, and completes when the RTU arrives. `qp` is an RC QP in RESET, which
    /// the CM first moves to INIT, or the QP given to [`ConnectionRequest::init_qp`] (with
    /// the receives posted since). Remote access is set at RTR as Linux's CM sets it: remote
    /// WRITE, and remote READ and atomics only with responder resources.
    ///
    /// # Errors
    /// The QP is not RC or belongs to a connection already, a transition failed, the
    /// private data is too long, or the peer rejected, went away or did not answer.
    pub async fn accept(
        mut self,
        qp: &Qp<D>,
        param: &AcceptParams,
    ) -> Result<Connector<D>, ServiceError> {
        let conn = self.start_accept(qp, param).await?;
        let id = conn.id;
        conn.dev.wait_async(|st| take(st, id, outcome)).await??;
        Ok(conn)
    }

    /// Blocking form of [`ConnectionRequest::accept`].
    ///
    /// # Errors
    /// As [`ConnectionRequest::accept`].
    pub fn accept_blocking(
        mut self,
        qp: &Qp<D>,
        param: &AcceptParams,
    ) -> Result<Connector<D>, ServiceError> {
        let conn = portverbs_hal::block_on(self.start_accept(qp, param))?;
        let id = conn.id;
        conn.dev.wait_blocking(None, |st| take(st, id, outcome))??;
        Ok(conn)
    }

    async fn start_accept(
        &mut self,
        qp: &Qp<D>,
        param: &AcceptParams,
    ) -> Result<Connector<D>, ServiceError> {
        let Some(dev) = self.dev.take() else {
            return Err(ServiceError::Closed);
        };
        // From here the connector owns the endpoint: dropping it on an error destroys it.
        let conn = Connector {
            dev,
            id: self.p.id,
            dst: Some(self.p.remote),
            src_port: self.p.local.port(),
        };
        let r = param.resolve(&conn.dev)?;
        conn.dev.associate(conn.id, qp).await?;
        let p = portverbs_cm::AcceptParams {
            responder_resources: r.responder_resources.min(self.p.initiator_depth),
            initiator_depth: r.initiator_depth.min(self.p.responder_resources),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq || qp.srq().is_some(),
            flow_control: param.flow_control,
            ack_timeout: param.ack_timeout,
            path_mtu: r.path_mtu,
            ..portverbs_cm::AcceptParams::new(qp.qp_num(), conn.dev.psn(conn.id))
        };
        let now = conn.dev.now();
        let mut st = conn.dev.state();
        // The device's own progress may have seen the peer withdraw its request (a REJ)
        // before this call: that is the accept's outcome (the connector, dropped, releases
        // the QP).
        let withdrawn = |e: &RdmaCmEvent| match e {
            RdmaCmEvent::Rejected { .. } | RdmaCmEvent::Unreachable => outcome(e),
            _ => None,
        };
        if let Some(r) = take(&mut st, conn.id, withdrawn) {
            drop(st);
            r?;
            return Err(ServiceError::Closed);
        }
        st.agent.accept(now, conn.id, &p, &param.private_data)?;
        conn.dev.drain(&mut st)?;
        drop(st);
        Ok(conn)
    }

    /// Refuses with REJ reason 28 (consumer reject) and `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// The private data is too long.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), ServiceError> {
        let Some(dev) = self.dev.take() else {
            return Err(ServiceError::Closed);
        };
        let now = dev.now();
        let mut st = dev.state();
        let r = st.agent.reject(now, self.p.id, private_data);
        let _ = st.agent.destroy(now, self.p.id);
        st.events.remove(&self.p.id);
        dev.drain(&mut st)?;
        r.map_err(Into::into)
    }
}

impl<D: Device> Drop for ConnectionRequest<D> {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            dev.destroy_endpoints(&mut dev.state(), [self.p.id]);
        }
    }
}

/// A connection endpoint (librdmacm's connected `rdma_cm_id`): made with
/// [`Connector::new`] and connected, or returned by [`ConnectionRequest::accept`].
/// Dropping it destroys the endpoint in whatever state: REJ while being set up, DREQ when
/// connected, and its QP goes to ERR and is released.
pub struct Connector<D: Device> {
    dev: CmDevice<D>,
    id: CmId,
    dst: Option<SocketAddr>,
    src_port: u16,
}

impl<D: Device> fmt::Debug for Connector<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("id", &self.id)
            .field("dst", &self.dst)
            .finish()
    }
}

impl<D: Device> Connector<D> {
    /// A new endpoint on `dev`.
    ///
    /// # Errors
    /// The agent's table is full.
    pub fn new(dev: &CmDevice<D>) -> Result<Self, ServiceError> {
        let mut st = dev.state();
        let id = st.agent.create_id()?;
        st.events.insert(id, Default::default());
        st.next_port = st.next_port.wrapping_add(1) | 0xC000;
        let src_port = st.next_port;
        drop(st);
        Ok(Self {
            dev: dev.clone(),
            id,
            dst: None,
            src_port,
        })
    }

    /// Makes `qp` (an RC QP in RESET) this endpoint's QP and moves it to INIT, as librdmacm's
    /// `rdma_create_qp` leaves a new QP: receives can be posted on it before
    /// [`Connector::connect`] with the same QP, so that a peer which sends as soon as it is
    /// connected finds them (a QP in RESET refuses receives). Nothing is sent.
    ///
    /// # Errors
    /// The QP is not RC or belongs to a connection already, this endpoint has another QP, or
    /// the INIT transition failed.
    pub async fn init_qp(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        self.dev.associate(self.id, qp).await
    }

    /// Blocking form of [`Connector::init_qp`].
    ///
    /// # Errors
    /// As [`Connector::init_qp`].
    pub fn init_qp_blocking(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        portverbs_hal::block_on(self.init_qp(qp))
    }

    /// The CM state of this endpoint.
    pub fn cm_state(&self) -> Option<CmState> {
        self.dev.state().agent.state(self.id)
    }

    /// Resolves `dst`: its GID is its IP's RoCEv2 GID, the route is the CM's port
    /// ([`CmDevice::port`]). Queues `ADDR_RESOLVED` and `ROUTE_RESOLVED`. Nothing goes on the wire and nothing is
    /// waited for (no neighbour or path query: the UDP socket's routing does that job), so
    /// resolution takes no timeout; whether anything answers at `dst` is learnt by
    /// [`Connector::connect`], within [`ConnParam::connect_budget`].
    ///
    /// # Errors
    /// [`ServiceError::FamilyMismatch`] when `dst` is not of the device address's family.
    pub async fn resolve(&mut self, dst: SocketAddr) -> Result<(), ServiceError> {
        let local = self.dev.local_ip();
        if local.is_ipv4() != dst.ip().is_ipv4() {
            return Err(ServiceError::FamilyMismatch(local, dst.ip()));
        }
        self.dst = Some(dst);
        let mut st = self.dev.state();
        if let Some(q) = st.events.get_mut(&self.id) {
            q.push_back(RdmaCmEvent::AddrResolved);
            q.push_back(RdmaCmEvent::RouteResolved);
        }
        Ok(())
    }

    /// Blocking form of [`Connector::resolve`].
    ///
    /// # Errors
    /// As [`Connector::resolve`].
    pub fn resolve_blocking(&mut self, dst: SocketAddr) -> Result<(), ServiceError> {
        portverbs_hal::block_on(self.resolve(dst))
    }

    async fn start_connect(
        &mut self,
        qp: &Qp<D>,
        param: &ConnectParams,
    ) -> Result<(), ServiceError> {
        let dst = self.dst.ok_or(ServiceError::NotResolved)?;
        if param.private_data.len() > REQ_USER_DATA {
            return Err(ServiceError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: REQ_USER_DATA,
            });
        }
        let mut pd = vec![0u8; CMA_HEADER_LEN + param.private_data.len()];
        CmaHeader {
            src_port: self.src_port,
            src: self.dev.local_ip(),
            dst: dst.ip(),
        }
        .emit(&mut pd)?;
        pd[CMA_HEADER_LEN..].copy_from_slice(&param.private_data);
        let r = param.resolve(&self.dev)?;
        self.dev.associate(self.id, qp).await?;
        let now = self.dev.now();
        let base = param.cm_params();
        let path = PathParams {
            path_mtu: r.path_mtu,
            ..PathParams::roce(self.dev.local_gid(), addr::ip_to_gid(dst.ip()))
        };
        let p = portverbs_cm::ConnectParams {
            service_id: service_id(PortSpace::Tcp, dst.port()),
            qpn: qp.qp_num(),
            starting_psn: self.dev.psn(self.id),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            srq: param.srq || qp.srq().is_some(),
            path: PathParams {
                traffic_class: base.path.traffic_class,
                ..path
            },
            give_up_at: param
                .timeout
                .map(|t| now.saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))),
            ..base
        };
        let mut st = self.dev.state();
        if let Err(e) = st.agent.connect(now, self.id, &p, &pd) {
            self.dev.release_qp(&mut st, self.id);
            return Err(e.into());
        }
        self.dev.drain(&mut st)?;
        Ok(())
    }

    /// Connects `qp` to the resolved destination: REQ with the CMA header and `param`; the
    /// CM takes the QP to RTS when the REP arrives and answers with RTU. Returns the REP's
    /// private data. `qp` is an RC QP in RESET, which the CM first moves to INIT, or the QP
    /// given to [`Connector::init_qp`] (with the receives posted since). Remote access is set
    /// at RTR as Linux's CM sets it: remote WRITE, and remote READ and atomics only with
    /// responder resources.
    ///
    /// # Errors
    /// [`ServiceError::Rejected`] (e.g. reason 8 when nobody listens on the port),
    /// [`ServiceError::Unreachable`] when nothing answered within
    /// [`ConnParam::connect_budget`] (the retries, or `param.timeout`), a QP that is not RC
    /// or already in use, a failed transition.
    pub async fn connect(
        &mut self,
        qp: &Qp<D>,
        param: &ConnectParams,
    ) -> Result<Vec<u8>, ServiceError> {
        self.start_connect(qp, param).await?;
        let id = self.id;
        self.dev.wait_async(|st| take(st, id, outcome)).await?
    }

    /// Blocking form of [`Connector::connect`].
    ///
    /// # Errors
    /// As [`Connector::connect`].
    pub fn connect_blocking(
        &mut self,
        qp: &Qp<D>,
        param: &ConnectParams,
    ) -> Result<Vec<u8>, ServiceError> {
        portverbs_hal::block_on(self.start_connect(qp, param))?;
        let id = self.id;
        self.dev.wait_blocking(None, |st| take(st, id, outcome))?
    }

    /// Disconnects: DREQ (or DREP when the peer disconnected first), and `qp` goes to ERR so
    /// every request still posted on it completes with a flush error. Returns once the QP is
    /// in ERR (at once where the device's commands complete at once), without waiting for
    /// the peer; [`Connector::notify_disconnect`] waits for the end.
    ///
    /// # Errors
    /// `qp` is not this connection's QP, or the connection is not up.
    pub fn disconnect(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        if self.start_disconnect(qp)? {
            let id = self.id;
            self.dev
                .wait_blocking(None, |st| (!st.transition_pending(id)).then_some(()))?;
        }
        Ok(())
    }

    /// Async twin of [`Connector::disconnect`].
    ///
    /// # Errors
    /// As [`Connector::disconnect`].
    pub async fn disconnect_async(&self, qp: &Qp<D>) -> Result<(), ServiceError> {
        if self.start_disconnect(qp)? {
            let id = self.id;
            self.dev
                .wait_async(|st| (!st.transition_pending(id)).then_some(()))
                .await?;
        }
        Ok(())
    }

    /// Sends the DREQ/DREP and starts the QP's move to ERR; true while the device has not
    /// finished that move.
    fn start_disconnect(&self, qp: &Qp<D>) -> Result<bool, ServiceError> {
        let now = self.dev.now();
        let mut st = self.dev.state();
        match st.qps.get(&qp.qp_num()) {
            Some((owner, _)) if *owner == self.id => {}
            _ => return Err(ServiceError::WrongQp(qp.qp_num())),
        }
        st.agent.disconnect(now, self.id, &[])?;
        self.dev.drain(&mut st)?;
        Ok(st.transition_pending(self.id))
    }

    /// Waits for `RDMA_CM_EVENT_DISCONNECTED`: the peer's DREQ, or the end of ours.
    ///
    /// # Errors
    /// The device failed.
    pub async fn notify_disconnect(&self) -> Result<(), ServiceError> {
        let id = self.id;
        self.dev
            .wait_async(|st| {
                take(st, id, |e| {
                    matches!(e, RdmaCmEvent::Disconnected).then_some(())
                })
            })
            .await
    }

    /// Blocking form of [`Connector::notify_disconnect`], with an optional timeout.
    ///
    /// # Errors
    /// As [`Connector::notify_disconnect`], or [`ServiceError::TimedOut`].
    pub fn notify_disconnect_blocking(
        &self,
        timeout: Option<Duration>,
    ) -> Result<(), ServiceError> {
        let id = self.id;
        self.dev.wait_blocking(timeout, |st| {
            take(st, id, |e| {
                matches!(e, RdmaCmEvent::Disconnected).then_some(())
            })
        })
    }

    /// The next event of this endpoint, in order (`ADDR_RESOLVED` … `TIMEWAIT_EXIT`).
    ///
    /// # Errors
    /// The device failed.
    pub async fn next_event(&self) -> Result<RdmaCmEvent, ServiceError> {
        let id = self.id;
        self.dev
            .wait_async(|st| st.events.get_mut(&id).and_then(|q| q.pop_front()))
            .await
    }

    /// Blocking form of [`Connector::next_event`], with an optional timeout.
    ///
    /// # Errors
    /// As [`Connector::next_event`], or [`ServiceError::TimedOut`].
    pub fn next_event_blocking(
        &self,
        timeout: Option<Duration>,
    ) -> Result<RdmaCmEvent, ServiceError> {
        let id = self.id;
        self.dev.wait_blocking(timeout, |st| {
            st.events.get_mut(&id).and_then(|q| q.pop_front())
        })
    }

    /// The peer's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.dst
    }

    /// This endpoint's address: the device's IP and the rdma_cm port its requests name in
    /// their CMA header (what the peer sees as its remote address).
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.dev.local_ip(), self.src_port)
    }
}

impl<D: Device> Drop for Connector<D> {
    fn drop(&mut self) {
        self.dev.destroy_endpoints(&mut self.dev.state(), [self.id]);
    }
}

/// Calls that never wait for the peer and never drive the device (they wait only for a QP's
/// RESET → INIT command where the device takes time over it): an application that keeps many
/// connections in flight from one thread (`portverbs cmtime`) starts them all, drives the
/// device with [`CmDevice::progress`](crate::CmDevice::progress), and collects the outcomes
/// as they arrive.
impl<D: Device> Listener<D> {
    /// The next connection request if one is queued; does not drive the device.
    pub fn try_get_request(&self) -> Option<ConnectionRequest<D>> {
        self.pop(&mut self.dev.state())
    }
}

impl<D: Device> ConnectionRequest<D> {
    /// Starts [`ConnectionRequest::accept`] and returns at once: the REP is sent (or queued)
    /// and [`Connector::try_connected`] reports the RTU (or the failure) when it comes.
    ///
    /// # Errors
    /// As the start of [`ConnectionRequest::accept`]: a QP that is not RC or is in use, a
    /// failed transition, private data too long.
    pub fn accept_nowait(
        mut self,
        qp: &Qp<D>,
        param: &AcceptParams,
    ) -> Result<Connector<D>, ServiceError> {
        portverbs_hal::block_on(self.start_accept(qp, param))
    }
}

impl<D: Device> Connector<D> {
    /// Starts [`Connector::connect`] and returns at once: the REQ is sent (or queued) and
    /// [`Connector::try_connected`] reports the outcome when it comes.
    ///
    /// # Errors
    /// As the start of [`Connector::connect`]: not resolved, private data too long, a QP that
    /// is not RC or is in use.
    pub fn connect_nowait(
        &mut self,
        qp: &Qp<D>,
        param: &ConnectParams,
    ) -> Result<(), ServiceError> {
        portverbs_hal::block_on(self.start_connect(qp, param))
    }

    /// The outcome of a started connect or accept, once it has come: the peer's private data
    /// when established, or why it failed. `None` while it is still under way.
    pub fn try_connected(&self) -> Option<Result<Vec<u8>, ServiceError>> {
        let id = self.id;
        take(&mut self.dev.state(), id, outcome)
    }

    /// The endpoint's handle, as [`CmDevice::take_ready`](crate::CmDevice::take_ready)
    /// reports it.
    pub fn cm_id(&self) -> CmId {
        self.id
    }

    /// Whether `RDMA_CM_EVENT_DISCONNECTED` has come (and takes it).
    pub fn try_disconnected(&self) -> bool {
        let id = self.id;
        take(&mut self.dev.state(), id, |e| {
            matches!(e, RdmaCmEvent::Disconnected).then_some(())
        })
        .is_some()
    }
}

//! `perf -R`: perftest's rdma_cm mode, where the connection manager connects the test's QPs
//! and the side channel runs over an RC QP of its own instead of TCP.
//!
//! What perftest (4.5-0.17 and later, read off its sources) puts on the wire with `-R`, as
//! this module speaks it:
//!
//! - Two kinds of CM connection, both on the RDMA_PS_TCP port space at the `-p` port
//!   (18515): first the *side channel* (one RC QP each side, SENDs only), then, after the
//!   parameters are exchanged, one connection per test QP (`-q`). The server listens on the
//!   port for both; perftest's server makes a new listener for the test QPs, so a client may
//!   find none for a moment and be rejected: it tries again (perftest: 10 tries, 100 ms
//!   apart).
//! - Every side channel exchange is one SEND each way, the client sending first and the
//!   server answering. perftest keeps one receive posted and re-posts it after each message;
//!   its receive buffer is larger than any message, and the reader copies out the bytes it
//!   expects. The messages are those of the TCP exchange, byte for byte — version (16
//!   bytes), cycle buffer and cache line (4 bytes each, big-endian), MTU (2 bytes), the BW
//!   report (five 8-byte messages) — except the destinations.
//! - A destination is perftest's `struct pingpong_dest` in binary
//!   (`portverbs::oob::perftest::BinaryForm` has the layout): 56 bytes, or 64 from perftest
//!   6.28 on. This side sends the form of the peer's version and reads either by the length
//!   that arrived.
//! - Order: connect the side channel; versions, cycle buffer, cache line, MTU (as over TCP;
//!   announcing version 6.10 keeps perftest's parameter negotiation of 6.28 out); a hand
//!   shake (a destination each way, its content unused: perftest sends zeros); the test QPs'
//!   connections, one after the other; a second hand shake; then the test's own hand shakes
//!   as over TCP, with no `ctx_connect` and no GID check — the CM did it. At the end
//!   perftest's closing hand shake sends no `done`.
//! - Disconnect: perftest (4.5-0.17, RC) disconnects nothing itself: it destroys the test
//!   QPs' IDs, then the side channel's, and the kernel sends for each one DREQ that is never
//!   retransmitted (or the DREP, when the peer's DREQ came first); it waits for no answer.
//!   Here the server disconnects every test QP (DREQ) and waits for the DREPs, and the client
//!   waits for the DREQs and answers them; then each side disconnects the side channel and
//!   lingers briefly for the answer. Against perftest as client our DREQ for a test QP often
//!   crosses the one its kernel sends: that DREQ ends our disconnect (we answer it; the
//!   kernel, its ID gone, does not answer ours), so no CM timer runs out.
//! - UD test QPs (`-c UD`) are not connected: the client resolves the server's UD service once
//!   per QP with SIDR on the RDMA_PS_UDP port space at the same port (see [`UdPeers`]);
//!   nothing is disconnected at the end.
//! - The server's test QPs get RNR timer code 12 once connected (the CM's is 0, 655 ms).
//! - The REQ of a test QP asks for no RDMA read resources unless the test reads
//!   (`responder_resources` = `initiator_depth` = `-o`'s outstanding reads), with 7 retries
//!   and 7 RNR retries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs::cm::service::{
    CmDevice, ConnParam, Connector, Listener, RDMA_UDP_QKEY, ServiceError,
};
use portverbs::oob::channel::{ChannelConfig, ChannelError, MessageChannel};
use portverbs::prelude::*;
use portverbs::{AddressHandle, AnyDevice};

use super::setup::{GRH_BYTES, Side};
use crate::error::{CliError, Context as _};
use crate::events::SLICE;
use crate::verbs;
use crate::wait::{PeerWatch, Waiter};

/// Bytes of each side channel message slot (more than any message).
const SLOT: usize = 1024;

/// Receives kept posted on the side channel QP.
const RECVS: usize = 4;

/// How long a client keeps trying to connect (the server may not listen yet).
const CONNECT_TRIES: u32 = 50;

/// Pause between connection tries.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// perftest's RNR timer code on the server's test QPs.
const MIN_RNR_TIMER: u8 = 12;

/// How long the end of a connection is awaited.
const DISCONNECT_WAIT: Duration = Duration::from_secs(5);

/// Opens the CM on `ctx`, at the IP of its port's GID `gid`.
pub(crate) fn open(ctx: &Context, gid: Gid) -> Result<CmDevice<AnyDevice>, CliError> {
    CmDevice::open_blocking(ctx, gid.to_ip()).ctx(format_args!("opening the CM on {}", ctx.name()))
}

/// Resolves a host name or address to the first address of the CM's family.
pub(crate) fn resolve_host(
    cm: &CmDevice<AnyDevice>,
    host: &str,
    port: u16,
) -> Result<SocketAddr, CliError> {
    let v4 = cm.local_ip().is_ipv4();
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| CliError::Failed(format!("couldn't resolve {host}: {e}")))?;
    addrs
        .into_iter()
        .find(|a| a.is_ipv4() == v4)
        .ok_or_else(|| {
            CliError::Failed(format!(
                "{host} has no {} address (the device's is {})",
                if v4 { "IPv4" } else { "IPv6" },
                cm.local_ip()
            ))
        })
}

/// Words for a failed CM call.
fn cm_error(what: &str, e: ServiceError) -> CliError {
    match e {
        ServiceError::Rejected { reason, .. } => CliError::Failed(format!(
            "{what}: the peer rejected the connection (RDMA_CM_EVENT_REJECTED, reason {})",
            reason.to_u16()
        )),
        ServiceError::Unreachable => {
            CliError::Failed(format!("{what}: the peer did not answer (UNREACHABLE)"))
        }
        other => CliError::Failed(format!("{what}: {other}")),
    }
}

/// The RC QP of perftest's side channel, connected by the CM: the library's
/// [`MessageChannel`], with this tool's policy around it. Its waits sleep in the channel's
/// completion channel in slices, looking at the CM and the peer watch between them (perftest
/// spins on `ibv_poll_cq`).
#[derive(Debug)]
pub(crate) struct CommQp {
    cm: CmDevice<AnyDevice>,
    conn: Option<Connector<AnyDevice>>,
    chan: MessageChannel,
}

/// Words for a failed channel call.
fn chan_error(what: &str, e: ChannelError) -> CliError {
    CliError::Failed(format!("{what}: {e}"))
}

impl CommQp {
    /// The QP, in INIT with receives posted, ready for the CM.
    fn new(cm: &CmDevice<AnyDevice>) -> Result<Self, CliError> {
        let opts = ConnectOptions {
            port: 1,
            access: AccessFlags::empty(),
            ..ConnectOptions::default()
        };
        let config = ChannelConfig {
            slot: SLOT,
            ring: RECVS,
        };
        let chan = MessageChannel::new_blocking(cm.context(), &opts, config)
            .map_err(|e| chan_error("creating the side channel", e))?;
        Ok(Self {
            cm: cm.clone(),
            conn: None,
            chan,
        })
    }

    /// Client: connects to perftest's server at `dst` (trying again while it is not listening).
    pub(crate) fn connect(cm: &CmDevice<AnyDevice>, dst: SocketAddr) -> Result<Self, CliError> {
        // A fresh QP for every try: a rejection leaves the last one in ERR.
        with_retries(
            "side channel",
            dst,
            || {
                let mut comm = Self::new(cm)?;
                Ok(
                    try_connect(cm, comm.chan.qp(), dst, &ConnParam::default()).map(|conn| {
                        comm.conn = Some(conn);
                        comm
                    }),
                )
            },
            || Ok(()),
        )
    }

    /// Server: accepts the first connection request on `listener`, waiting until one comes
    /// or `abort` is set.
    pub(crate) fn accept(
        cm: &CmDevice<AnyDevice>,
        listener: &Listener<AnyDevice>,
        abort: &AtomicBool,
    ) -> Result<(Self, IpAddr), CliError> {
        let req = next_request(listener, Some(abort))?;
        let peer = req.remote_addr().ip();
        let mut comm = Self::new(cm)?;
        let conn = req
            .accept_blocking(comm.chan.qp(), &ConnParam::default())
            .map_err(|e| cm_error("accepting the side channel", e))?;
        comm.conn = Some(conn);
        Ok((comm, peer))
    }

    /// Sends `msg` as one SEND and waits for its completion (at most `watch`'s limit).
    pub(crate) fn send(&self, msg: &[u8], watch: &mut PeerWatch) -> Result<(), CliError> {
        const WHAT: &str = "sending on the side channel";
        self.chan
            .post_message(msg)
            .map_err(|e| chan_error(WHAT, e))?;
        self.wait(WHAT, watch, false, || self.chan.wait_sent(Some(SLICE)))
    }

    /// Waits for the next message and returns its bytes; `long` while the peer runs its
    /// part of the test (see [`PeerWatch`]).
    pub(crate) fn recv(&self, watch: &mut PeerWatch, long: bool) -> Result<Vec<u8>, CliError> {
        self.wait("reading the side channel", watch, long, || {
            self.chan.recv_blocking(Some(SLICE))
        })
    }

    /// Runs `slice` (a wait of the channel, one slice long) until it yields; between slices
    /// the peer's disconnect, or no sign of it for `watch`'s limit, ends the wait with an
    /// error.
    fn wait<T>(
        &self,
        what: &str,
        watch: &mut PeerWatch,
        long: bool,
        mut slice: impl FnMut() -> Result<T, ChannelError>,
    ) -> Result<T, CliError> {
        loop {
            match slice() {
                Ok(t) => return Ok(t),
                Err(ChannelError::TimedOut) => {}
                Err(e) => return Err(chan_error(what, e)),
            }
            if let Some(conn) = &self.conn {
                match conn.notify_disconnect_blocking(Some(Duration::ZERO)) {
                    Ok(()) => {
                        return Err(CliError::Failed(format!(
                            "{what}: the peer disconnected the side channel"
                        )));
                    }
                    Err(ServiceError::TimedOut) => {}
                    Err(e) => return Err(cm_error(what, e)),
                }
            }
            watch.check(what, long)?;
        }
    }

    /// Disconnects the side channel, lingers for the peer's answer (unless `linger` is unset:
    /// a peer that stopped responding will not answer), and lets QP1's last MADs leave.
    pub(crate) fn close(mut self, linger: bool) {
        if let Some(conn) = self.conn.take() {
            end_connection(&conn, self.chan.qp(), false, linger);
        }
        let _ = self.cm.flush(Duration::from_secs(1));
    }
}

fn check_wc(wc: &WorkCompletion, what: &str) -> Result<(), CliError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{what}: completion with status {:?}",
            wc.status
        )))
    }
}

/// The next connection request of `listener`, waiting until `abort` is set (if given).
fn next_request(
    listener: &Listener<AnyDevice>,
    abort: Option<&AtomicBool>,
) -> Result<portverbs::cm::service::ConnectionRequest<AnyDevice>, CliError> {
    loop {
        match listener.get_request_blocking(Some(Duration::from_millis(50))) {
            Ok(req) => return Ok(req),
            Err(ServiceError::TimedOut) => {
                if abort.is_some_and(|a| a.load(Ordering::Acquire)) {
                    return Err(CliError::PeerStopped("waiting for a client to connect"));
                }
            }
            Err(e) => return Err(cm_error("waiting for a connection request", e)),
        }
    }
}

/// One try at connecting `qp` (in INIT) to `dst`.
fn try_connect(
    cm: &CmDevice<AnyDevice>,
    qp: &Qp,
    dst: SocketAddr,
    param: &ConnParam,
) -> Result<Connector<AnyDevice>, ServiceError> {
    let mut conn = Connector::new(cm)?;
    conn.resolve_blocking(dst)?;
    conn.connect_blocking(qp, param)?;
    Ok(conn)
}

/// Runs `attempt` until it connects; a rejection (the server not listening yet) is tried
/// again after a pause, up to [`CONNECT_TRIES`] times, `again` preparing the next try.
fn with_retries<T>(
    what: &str,
    dst: SocketAddr,
    mut attempt: impl FnMut() -> Result<Result<T, ServiceError>, CliError>,
    mut again: impl FnMut() -> Result<(), CliError>,
) -> Result<T, CliError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt()? {
            Ok(t) => return Ok(t),
            Err(ServiceError::Rejected { .. }) if tries < CONNECT_TRIES => {
                std::thread::sleep(RETRY_PAUSE);
                again()?;
            }
            Err(e) => return Err(cm_error(&format!("connecting the {what} to {dst}"), e)),
        }
    }
}

/// RESET, then INIT with `opts` again (after a rejected connect left the QP in ERR).
fn reinit(qp: &Qp, opts: &ConnectOptions) -> Result<(), CliError> {
    let attr = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify_blocking(&attr, QpAttrMask::STATE)
        .ctx("modifying the QP to RESET")?;
    verbs::init(qp, opts)
}

/// The test QPs' connections.
#[derive(Debug)]
pub(crate) struct DataConns {
    conns: Vec<Connector<AnyDevice>>,
    client: bool,
}

/// Connection parameters of the test QPs: read resources only for read tests, and the MTU
/// the two sides agreed on (the CM cuts it to the port's).
pub(crate) fn data_param(outs: Option<u8>, mtu: Mtu) -> ConnParam {
    ConnParam {
        responder_resources: Some(outs.unwrap_or(0)),
        initiator_depth: Some(outs.unwrap_or(0)),
        path_mtu: Some(mtu),
        ..ConnParam::default()
    }
}

impl DataConns {
    /// Client: connects every QP (in INIT with `opts`) to the server at `dst`, one after the
    /// other.
    pub(crate) fn connect(
        cm: &CmDevice<AnyDevice>,
        qps: &[Qp],
        opts: &ConnectOptions,
        dst: SocketAddr,
        param: &ConnParam,
    ) -> Result<Self, CliError> {
        let conns = qps
            .iter()
            .enumerate()
            .map(|(i, qp)| {
                with_retries(
                    &format!("test QP {i}"),
                    dst,
                    || Ok(try_connect(cm, qp, dst, param)),
                    || reinit(qp, opts),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            conns,
            client: true,
        })
    }

    /// Server: accepts one request per QP on `listener`, in the order they come, each
    /// within `limit` (`None`: however long it takes).
    pub(crate) fn accept(
        listener: &Listener<AnyDevice>,
        qps: &[Qp],
        param: &ConnParam,
        limit: Option<Duration>,
    ) -> Result<Self, CliError> {
        let mut conns = Vec::with_capacity(qps.len());
        for (i, qp) in qps.iter().enumerate() {
            let deadline = limit.map(|l| Instant::now() + l);
            let req = loop {
                match listener.get_request_blocking(Some(Duration::from_millis(100))) {
                    Ok(req) => break req,
                    Err(ServiceError::TimedOut) if deadline.is_none_or(|d| Instant::now() < d) => {}
                    Err(e) => {
                        return Err(cm_error(
                            &format!("waiting for the connection of test QP {i}"),
                            e,
                        ));
                    }
                }
            };
            let conn = req
                .accept_blocking(qp, param)
                .map_err(|e| cm_error(&format!("accepting test QP {i}"), e))?;
            // The CM's RNR timer is the slowest (code 0: 655 ms); perftest's server sets its
            // own (code 12: 0.64 ms) once connected, so senders that find no receive posted
            // yet retry soon.
            let attr = QpAttr {
                min_rnr_timer: MIN_RNR_TIMER,
                ..QpAttr::default()
            };
            qp.modify_blocking(&attr, QpAttrMask::MIN_RNR_TIMER)
                .ctx(format_args!("setting test QP {i}'s RNR timer"))?;
            conns.push(conn);
        }
        Ok(Self {
            conns,
            client: false,
        })
    }

    /// Ends the connections as perftest does: the server disconnects each and waits for the
    /// answer, the client waits for the server's disconnect and answers it. Without `linger`
    /// (the run failed: the peer may be gone) each side disconnects at once and waits for
    /// nothing.
    pub(crate) fn close(self, qps: &[Qp], linger: bool) {
        for (conn, qp) in self.conns.iter().zip(qps) {
            end_connection(conn, qp, self.client, linger);
        }
    }
}

/// Ends one connection: `wait_first` waits for the peer's DREQ before answering it; otherwise
/// this side sends the DREQ and waits for the DREP (the peer's own DREQ ends it too). Without
/// `linger`, only the DREQ.
fn end_connection(conn: &Connector<AnyDevice>, qp: &Qp, wait_first: bool, linger: bool) {
    if !linger {
        let _ = conn.disconnect(qp);
    } else if wait_first {
        let _ = conn.notify_disconnect_blocking(Some(DISCONNECT_WAIT));
        let _ = conn.disconnect(qp);
    } else if conn.disconnect(qp).is_ok() {
        let _ = conn.notify_disconnect_blocking(Some(DISCONNECT_WAIT));
    }
}

/// The listening address of a server on `cm`'s family at `port`.
pub(crate) fn listen(cm: &CmDevice<AnyDevice>, port: u16) -> Result<Listener<AnyDevice>, CliError> {
    let any = if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let mut l = Listener::bind(cm, SocketAddr::new(any, port))
        .map_err(|e| cm_error(&format!("binding port {port}"), e))?;
    l.listen(16)
        .map_err(|e| cm_error(&format!("listening on port {port}"), e))?;
    Ok(l)
}

/// How many times a client asks for the UD service before giving up (the server may not
/// listen on `RDMA_PS_UDP` yet: its CM then answers "service not supported").
const SIDR_TRIES: u32 = 50;

/// Bytes of the QPN message's receive: the 40-byte GRH area and the 4-byte payload.
const QPN_RECV: usize = GRH_BYTES as usize + 4;

/// The UD test QPs' peers, found as perftest's rdma_cm finds them (its
/// `src/perftest_communication.c`, `rdma_cm_establish_ud_connection` and
/// `rdma_cm_initialize_ud_connection_parameters`): the client resolves the server's UD
/// service on `RDMA_PS_UDP` at the `-p` port with one SIDR exchange per test QP (IBTA 12.11),
/// which names the server QP's number and Q_Key; the server answers each SIDR_REQ with its
/// QP and the Q_Key rdma_cm gives UD QPs of that port space ([`RDMA_UDP_QKEY`]). Where the
/// server sends too (latency, `-b`), the client then sends one SEND with immediate data
/// carrying its QPN to each server QP, and the server addresses its replies from that
/// completion: the source GID in the GRH, the QPN in the immediate data, and its own QP's
/// Q_Key.
#[derive(Debug)]
pub(crate) struct UdPeers {
    /// Toward the peer's GID (`None`: a server that never sends).
    pub(crate) ah: Option<AddressHandle>,
    /// Per test QP: the peer QP's number and Q_Key.
    pub(crate) qps: Vec<(u32, u32)>,
    /// The client's IDs, kept while the test runs (SIDR leaves no connection to end).
    _ids: Vec<Connector<AnyDevice>>,
}

/// An address handle in `side`'s PD for `av` (the CM's, toward a resolved service, or one
/// made from a client's datagram), with the test's service level.
fn ah_with(
    side: &Side,
    opts: &ConnectOptions,
    av: AddressVector,
) -> Result<AddressHandle, CliError> {
    side.pd
        .create_ah_blocking(AddressVector { sl: opts.sl, ..av })
        .ctx("creating the address handle")
}

/// Waits for one completion of `cq`, giving up after `limit` without one.
fn next_wc(
    cq: &Cq,
    what: &'static str,
    limit: Option<Duration>,
) -> Result<WorkCompletion, CliError> {
    let mut waiter = Waiter::new(what, None).limit(limit);
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).ctx(format_args!("{what}: polling"))? == 1 {
            check_wc(&wc[0], what)?;
            return Ok(wc[0]);
        }
        waiter.idle()?;
    }
}

impl UdPeers {
    /// Client: resolves the server's UD service at `dst` once per QP of `side` (all in RTS
    /// with `opts`' Q_Key); with `send_qpn`, tells each server QP this side's QPN.
    pub(crate) fn resolve(
        cm: &CmDevice<AnyDevice>,
        side: &Side,
        opts: &ConnectOptions,
        dst: SocketAddr,
        send_qpn: bool,
        limit: Option<Duration>,
    ) -> Result<Self, CliError> {
        let mut peers = Self {
            ah: None,
            qps: Vec::with_capacity(side.qps.len()),
            _ids: Vec::with_capacity(side.qps.len()),
        };
        for (i, qp) in side.qps.iter().enumerate() {
            let mut tries = 0;
            let (id, svc) = loop {
                tries += 1;
                let mut id = Connector::new(cm).map_err(|e| cm_error("creating a CM ID", e))?;
                match id.resolve_service_blocking(dst) {
                    Ok(svc) => break (id, svc),
                    Err(ServiceError::ServiceRejected(_)) if tries < SIDR_TRIES => {
                        std::thread::sleep(RETRY_PAUSE);
                    }
                    Err(e) => {
                        return Err(cm_error(
                            &format!("resolving the UD service of test QP {i} at {dst}"),
                            e,
                        ));
                    }
                }
            };
            if peers.ah.is_none() {
                peers.ah = Some(ah_with(side, opts, svc.av)?);
            }
            if send_qpn && let Some(ah) = &peers.ah {
                let qpn = qp.qp_num();
                let off = side.send_off(i);
                side.mr
                    .write(off, &qpn.to_be_bytes())
                    .ctx("writing the QPN message")?;
                let sge = [side.mr.sge(off, 4).ctx("the QPN message's buffer")?];
                qp.post_send(&[SendWr::new(0, SendOp::SendWithImm { imm: qpn })
                    .sges(&sge)
                    .flags(SendFlags::SIGNALED)
                    .ud(ah.dest(svc.qpn, svc.qkey))])
                    .ctx("posting the QPN message")?;
                next_wc(&side.send_cq, "sending this side's QPN", limit)?;
            }
            peers.qps.push((svc.qpn, svc.qkey));
            peers._ids.push(id);
        }
        Ok(peers)
    }

    /// Server: answers one SIDR_REQ per QP of `side` (all in RTS with [`RDMA_UDP_QKEY`]) on
    /// `listener`, each within `limit`; with `recv_qpn`, learns each client QP from its QPN
    /// message.
    pub(crate) fn answer(
        cm: &CmDevice<AnyDevice>,
        listener: &Listener<AnyDevice>,
        side: &Side,
        opts: &ConnectOptions,
        recv_qpn: bool,
        limit: Option<Duration>,
    ) -> Result<Self, CliError> {
        let mut peers = Self {
            ah: None,
            qps: Vec::with_capacity(side.qps.len()),
            _ids: Vec::new(),
        };
        for (i, qp) in side.qps.iter().enumerate() {
            let deadline = limit.map(|l| Instant::now() + l);
            let req = loop {
                match listener.get_service_request_blocking(Some(Duration::from_millis(100))) {
                    Ok(req) => break req,
                    Err(ServiceError::TimedOut) if deadline.is_none_or(|d| Instant::now() < d) => {}
                    Err(e) => {
                        return Err(cm_error(
                            &format!("waiting for the service request of test QP {i}"),
                            e,
                        ));
                    }
                }
            };
            let off = side.recv_off(i);
            if recv_qpn {
                let sge = side.mr.sge(off, QPN_RECV).ctx("the QPN message's buffer")?;
                qp.post_recv(&[RecvWr {
                    wr_id: 0,
                    sges: &[sge],
                }])
                .ctx("posting the QPN message's receive")?;
            }
            req.reply(qp, RDMA_UDP_QKEY)
                .map_err(|e| cm_error(&format!("answering test QP {i}'s service request"), e))?;
            if !recv_qpn {
                peers.qps.push((0, RDMA_UDP_QKEY));
                continue;
            }
            let wc = next_wc(&side.recv_cq, "waiting for the client's QPN", limit)?;
            if !wc.wc_flags.contains(WcFlags::GRH) || !wc.wc_flags.contains(WcFlags::WITH_IMM) {
                return Err(CliError::Failed(
                    "the client's QPN message came without a GRH or immediate data".into(),
                ));
            }
            let mut grh = [0u8; GRH_BYTES as usize];
            side.mr.read(off, &mut grh).ctx("reading the GRH")?;
            if peers.ah.is_none() {
                let av = cm
                    .context()
                    .init_ah_from_wc_blocking(1, &wc, &grh)
                    .ctx("the client's address, from its QPN message")?;
                peers.ah = Some(ah_with(side, opts, av)?);
            }
            peers.qps.push((wc.imm_data & 0x00ff_ffff, RDMA_UDP_QKEY));
        }
        Ok(peers)
    }
}

/// A server's `RDMA_PS_UDP` listener at `port`, where perftest's client resolves UD test QPs.
pub(crate) fn listen_udp(
    cm: &CmDevice<AnyDevice>,
    port: u16,
) -> Result<Listener<AnyDevice>, CliError> {
    let any = if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let mut l = Listener::bind_udp(cm, SocketAddr::new(any, port))
        .map_err(|e| cm_error(&format!("binding UDP port space port {port}"), e))?;
    l.listen(16)
        .map_err(|e| cm_error(&format!("listening on UDP port space port {port}"), e))?;
    Ok(l)
}

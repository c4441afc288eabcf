//! The CM device: QP1, the agent, and progress driven by the application's calls.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use portverbs_hal::Device;
use portverbs_hal::Gid;
use portverbs_verbs::{
    AccessFlags, AddressHandle, AddressVector, Context, Cq, CqInit, Mr, NotifyKind, Pd, Qp, QpAttr,
    QpAttrMask, QpInit, QpState, RecvWr, SendOp, SendWr, SpecialQp, UdDest, WaitError, WcStatus,
    WeakQp, WorkCompletion,
};

use crate::timer::Sleep;
use crate::{CmTimer, RdmaCmEvent, ServiceError, addr};
use portverbs_cm::wire::{CmaHeader, MAD_LEN};
use portverbs_cm::{
    AgentConfig, CmAgent, CmEvent, CmId, CmOutput, CmState, OutMad, QpAction, QpTarget,
};

/// The longest a blocking wait sleeps before driving the device again.
pub const MAX_SLEEP: Duration = Duration::from_millis(5);

/// Receive buffers on QP1: as many as Linux's MAD layer keeps posted (512). A UD datagram
/// that finds none is dropped, and a burst of CM messages (a client disconnecting hundreds of
/// connections at once) is then recovered only by the sender's retransmissions, seconds
/// later; with 128, 300 DREQs at once took 20 s to 60 s to settle.
const RECV_SLOTS: usize = 512;
/// Send buffers on QP1.
const SEND_SLOTS: usize = 64;
/// The GRH area in front of a UD receive.
const GRH: usize = 40;
const RECV_SLOT: usize = GRH + MAD_LEN;
const SEND_BASE: usize = RECV_SLOTS * RECV_SLOT;

/// QP1's traffic counters ([`CmDevice::mad_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MadCounts {
    /// MADs received and handed to the agent.
    pub received: u64,
    /// MADs posted.
    pub sent: u64,
    /// Receives that completed in error (other than the flush of a removed device).
    pub recv_errors: u64,
    /// Sends that completed in error.
    pub send_errors: u64,
}

/// A connection request waiting in a listener's queue.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) id: CmId,
    pub(super) remote: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) private_data: Vec<u8>,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
}

/// A listener's queue and what its requests must match.
#[derive(Debug)]
pub(super) struct ListenState {
    pub(super) bound: SocketAddr,
    pub(super) backlog: usize,
    pub(super) pending: VecDeque<Pending>,
    /// `RDMA_PS_UDP` listeners: SIDR requests waiting for [`crate::Listener::get_service_request`].
    pub(super) udp: bool,
    pub(super) sidr: VecDeque<CmId>,
}

/// Everything behind the device lock.
pub(super) struct State<D: Device> {
    pub(super) agent: CmAgent,
    ahs: HashMap<Gid, AddressHandle<D>>,
    /// QPN → the connection it belongs to: one entry per QP, set and cleared under this lock.
    /// Weak: the application's `Qp::destroy` is not refused because the CM tracks the QP;
    /// a QP found gone aborts its connection ([`CmDevice::progress`]).
    pub(super) qps: HashMap<u32, (CmId, WeakQp<D>)>,
    /// Event queues of the application's endpoints.
    pub(super) events: HashMap<CmId, VecDeque<RdmaCmEvent>>,
    pub(super) listeners: HashMap<CmId, ListenState>,
    free_send: Vec<usize>,
    unsent: VecDeque<OutMad>,
    pub(super) next_port: u16,
    pub(super) removed: bool,
    mads_in: u64,
    mads_out: u64,
    recv_errors: u64,
    send_errors: u64,
}

impl<D: Device> fmt::Debug for State<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("live_endpoints", &self.agent.live_endpoints())
            .field("qps", &self.qps.len())
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

struct Shared<D: Device> {
    ctx: Context<D>,
    pd: Pd<D>,
    cq: Cq<D>,
    qp1: Qp<D>,
    mr: Mr<D>,
    gid_index: u8,
    local_ip: IpAddr,
    epoch: Instant,
    state: Mutex<State<D>>,
    wakers: Mutex<Vec<Waker>>,
    wake_gen: AtomicU64,
    /// The application's timer for async waits ([`crate::CmTimer`]).
    timer: Mutex<Option<Arc<dyn CmTimer>>>,
}

/// The CM of one device port (port 1) for one local IP address. Cheap to clone; the
/// listeners and connectors made from it share it.
pub struct CmDevice<D: Device> {
    shared: Arc<Shared<D>>,
}

impl<D: Device> Clone for CmDevice<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for CmDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmDevice")
            .field("device", &self.shared.ctx.name())
            .field("ip", &self.shared.local_ip)
            .field("gid_index", &self.shared.gid_index)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: Device> CmDevice<D> {
    /// Opens the CM on port 1 of `ctx` for `ip`, whose RoCE GID must be in the port's GID
    /// table: creates QP1 and posts its receive buffers.
    ///
    /// # Errors
    /// [`ServiceError::AddressNotLocal`], or a verbs error (e.g. the device has no QP1).
    pub async fn open(ctx: &Context<D>, ip: IpAddr) -> Result<Self, ServiceError> {
        let gid_index = addr::local_gid_index(ctx, 1, ip)?;
        let pd = ctx
            .alloc_pd()
            .await
            .map_err(|e| ServiceError::verbs("allocating a PD", e))?;
        let entries = u32::try_from(RECV_SLOTS + SEND_SLOTS).unwrap_or(u32::MAX);
        let cq = ctx
            .create_cq(CqInit {
                entries,
                ..CqInit::default()
            })
            .await
            .map_err(|e| ServiceError::verbs("creating QP1's CQ", e))?;
        let mut init = QpInit::gsi(&cq);
        init.caps.max_send_wr = SEND_SLOTS as u32;
        init.caps.max_recv_wr = RECV_SLOTS as u32;
        let qp1 = pd
            .create_qp(init)
            .await
            .map_err(|e| ServiceError::verbs("creating QP1", e))?;
        qp1.ready_ud(&portverbs_verbs::ConnectOptions::default())
            .await
            .map_err(|e| ServiceError::verbs("readying QP1", e))?;
        let mr = pd
            .reg_vec(
                vec![0u8; SEND_BASE + SEND_SLOTS * MAD_LEN],
                AccessFlags::LOCAL_WRITE,
            )
            .await
            .map_err(|e| ServiceError::verbs("registering QP1's buffers", e))?;
        let epoch = Instant::now();
        let nanos = u64::try_from(
            std::time::SystemTime::UNIX_EPOCH
                .elapsed()
                .map_or(0, |d| d.as_nanos()),
        )
        .unwrap_or(0);
        let ca_guid = ctx.attr().node_guid;
        let cfg = AgentConfig::new(ca_guid, (nanos as u32) ^ (nanos >> 32) as u32);
        let dev = Self {
            shared: Arc::new(Shared {
                ctx: ctx.clone(),
                pd,
                cq,
                qp1,
                mr,
                gid_index,
                local_ip: ip,
                epoch,
                state: Mutex::new(State {
                    agent: CmAgent::new(cfg),
                    ahs: HashMap::new(),
                    qps: HashMap::new(),
                    events: HashMap::new(),
                    listeners: HashMap::new(),
                    free_send: (0..SEND_SLOTS).rev().collect(),
                    unsent: VecDeque::new(),
                    next_port: 0xC000 | (nanos as u16 & 0x3FFF),
                    removed: false,
                    mads_in: 0,
                    mads_out: 0,
                    recv_errors: 0,
                    send_errors: 0,
                }),
                wakers: Mutex::new(Vec::new()),
                wake_gen: AtomicU64::new(0),
                timer: Mutex::new(None),
            }),
        };
        for slot in 0..RECV_SLOTS {
            dev.post_recv(slot)?;
        }
        Ok(dev)
    }

    /// Blocking form of [`CmDevice::open`].
    ///
    /// # Errors
    /// As [`CmDevice::open`].
    pub fn open_blocking(ctx: &Context<D>, ip: IpAddr) -> Result<Self, ServiceError> {
        portverbs_hal::block_on(Self::open(ctx, ip))
    }

    /// The opened device.
    pub fn context(&self) -> &Context<D> {
        &self.shared.ctx
    }

    /// The local IP address.
    pub fn local_ip(&self) -> IpAddr {
        self.shared.local_ip
    }

    /// The GID table index of the local IP address on port 1.
    pub fn gid_index(&self) -> u8 {
        self.shared.gid_index
    }

    /// The local GID.
    pub fn local_gid(&self) -> Gid {
        addr::ip_to_gid(self.shared.local_ip)
    }

    /// Endpoints the agent holds (connections, listeners, and destroyed connections still in
    /// TIMEWAIT): zero once everything is dropped and TIMEWAIT has passed.
    pub fn live_endpoints(&self) -> usize {
        lock(&self.shared.state).agent.live_endpoints()
    }

    /// What the agent dropped, answered on its own, or retransmitted.
    pub fn stats(&self) -> portverbs_cm::AgentStats {
        lock(&self.shared.state).agent.stats()
    }

    /// QP1's traffic: MADs received, MADs posted, receives and sends that completed in
    /// error.
    pub fn mad_counts(&self) -> MadCounts {
        let st = lock(&self.shared.state);
        MadCounts {
            received: st.mads_in,
            sent: st.mads_out,
            recv_errors: st.recv_errors,
            send_errors: st.send_errors,
        }
    }

    /// Drives the device until every MAD it has queued or posted has left QP1 (each send
    /// completed), or `timeout` passes; `Ok(true)` when everything left. This layer has no
    /// thread, so a process about to exit calls it: a DREP or REJ its last call queued would
    /// otherwise go with the process.
    ///
    /// # Errors
    /// QP1 failed (the device is gone).
    pub fn flush(&self, timeout: Duration) -> Result<bool, ServiceError> {
        // The wait every blocking call uses: on QP1's CQ, driving the device on each wake.
        let sent = |st: &mut State<D>| {
            (st.unsent.is_empty() && st.free_send.len() == SEND_SLOTS).then_some(())
        };
        match self.wait_blocking(Some(timeout), sent) {
            Ok(()) => Ok(true),
            Err(ServiceError::TimedOut) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// QPs associated with a connection.
    pub fn associated_qps(&self) -> usize {
        lock(&self.shared.state).qps.len()
    }

    /// Nanoseconds since the device was opened: the agent's clock.
    pub(super) fn now(&self) -> u64 {
        u64::try_from(self.shared.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State<D>> {
        lock(&self.shared.state)
    }

    /// The instant of an agent time (nanoseconds since the device was opened).
    pub(super) fn instant_of(&self, nanos: u64) -> Instant {
        self.shared.epoch + Duration::from_nanos(nanos)
    }

    pub(super) fn replace_timer(&self, timer: Option<Arc<dyn CmTimer>>) {
        *lock(&self.shared.timer) = timer;
        // Waits under way pick the timer up (or drop theirs) on their next round.
        self.wake_all();
    }

    /// A sleep until the agent's next deadline, when the application lent a timer.
    fn timer_sleep(&self, next: Option<u64>) -> Option<Sleep> {
        let timer = lock(&self.shared.timer).clone()?;
        Some(timer.sleep_until(self.instant_of(next?)))
    }

    fn post_recv(&self, slot: usize) -> Result<(), ServiceError> {
        let sge = self
            .shared
            .mr
            .sge(slot * RECV_SLOT, RECV_SLOT)
            .map_err(|e| ServiceError::verbs("QP1 receive buffer", e))?;
        self.shared
            .qp1
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sges: &[sge],
            }])
            .map_err(|e| ServiceError::verbs("posting a QP1 receive", e))
    }

    /// Drives the CM once: QP1's completions into the agent, due timers, and the agent's
    /// outputs acted on. Every call and wait of this layer does this; an application that
    /// holds connections and makes no calls may call it to keep timers running.
    ///
    /// # Errors
    /// QP1 failed (the device is gone).
    pub fn progress(&self) -> Result<(), ServiceError> {
        let mut st = self.state();
        let now = self.now();
        let mut wcs = [WorkCompletion::default(); 32];
        let mut woke = false;
        loop {
            let n = self
                .shared
                .cq
                .poll(&mut wcs)
                .map_err(|e| ServiceError::verbs("polling QP1's CQ", e))?;
            for wc in &wcs[..n] {
                self.completion(&mut st, now, wc)?;
            }
            if n < wcs.len() {
                break;
            }
        }
        if st.agent.poll_timeout().is_some_and(|t| t <= now) {
            st.agent.handle_timeout(now);
        }
        woke |= self.reap_dead(&mut st);
        woke |= self.drain(&mut st)?;
        self.flush_unsent(&mut st)?;
        drop(st);
        if woke {
            self.wake_all();
        }
        Ok(())
    }

    fn completion(
        &self,
        st: &mut State<D>,
        now: u64,
        wc: &WorkCompletion,
    ) -> Result<(), ServiceError> {
        let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if slot >= RECV_SLOTS {
            if wc.status != WcStatus::Success {
                st.send_errors += 1;
            }
            st.free_send.push(slot - RECV_SLOTS);
            return Ok(());
        }
        match wc.status {
            WcStatus::Success => {
                let mut buf = [0u8; RECV_SLOT];
                self.shared
                    .mr
                    .read(slot * RECV_SLOT, &mut buf)
                    .map_err(|e| ServiceError::verbs("reading a MAD", e))?;
                let mut grh = [0u8; GRH];
                grh.copy_from_slice(&buf[..GRH]);
                st.mads_in += 1;
                // Malformed MADs are counted by the agent and dropped.
                let _ = st
                    .agent
                    .handle_mad(now, addr::source_gid(&grh), &buf[GRH..]);
            }
            WcStatus::WrFlushErr => {
                // QP1 went to ERR: the device is gone (or failed). Every endpoint hears it
                // once, and every wait returns.
                if !st.removed {
                    st.removed = true;
                    for q in st.events.values_mut() {
                        q.push_back(RdmaCmEvent::DeviceRemoval);
                    }
                }
                return Ok(());
            }
            other => {
                st.recv_errors += 1;
                tracing::debug!(?other, "QP1 receive failed");
            }
        }
        self.post_recv(slot)
    }

    /// Acts on the agent's outputs in order; true when an application event was queued.
    pub(super) fn drain(&self, st: &mut State<D>) -> Result<bool, ServiceError> {
        let mut woke = false;
        while let Some(out) = st.agent.poll_output() {
            match out {
                CmOutput::Send(m) => st.unsent.push_back(m),
                CmOutput::Qp(a) => {
                    self.flush_unsent(st)?;
                    self.apply(st, a);
                }
                CmOutput::Event(e) => {
                    self.route(st, e);
                    woke = true;
                }
            }
        }
        self.flush_unsent(st)?;
        Ok(woke)
    }

    fn flush_unsent(&self, st: &mut State<D>) -> Result<(), ServiceError> {
        while !st.unsent.is_empty() {
            let Some(slot) = st.free_send.pop() else {
                return Ok(());
            };
            let Some(m) = st.unsent.pop_front() else {
                st.free_send.push(slot);
                return Ok(());
            };
            if let Err(e) = self.send_mad(st, slot, &m) {
                st.free_send.push(slot);
                return Err(e);
            }
        }
        Ok(())
    }

    fn send_mad(&self, st: &mut State<D>, slot: usize, m: &OutMad) -> Result<(), ServiceError> {
        let ah = match st.ahs.entry(m.to) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(
                self.shared
                    .pd
                    .create_ah_blocking(AddressVector {
                        dgid: m.to,
                        is_global: true,
                        sgid_index: self.shared.gid_index,
                        hop_limit: 64,
                        port_num: 1,
                        ..AddressVector::default()
                    })
                    .map_err(|e| ServiceError::verbs("address handle to a CM peer", e))?,
            ),
        };
        let at = SEND_BASE + slot * MAD_LEN;
        self.shared
            .mr
            .write(at, &m.mad)
            .map_err(|e| ServiceError::verbs("writing a MAD", e))?;
        let sge = [self
            .shared
            .mr
            .sge(at, MAD_LEN)
            .map_err(|e| ServiceError::verbs("QP1 send buffer", e))?];
        let dest = UdDest {
            av: ah.av(),
            remote_qpn: SpecialQp::GSI_QPN,
            remote_qkey: SpecialQp::GSI_QKEY,
        };
        let wr = SendWr::new((RECV_SLOTS + slot) as u64, SendOp::Send)
            .sges(&sge)
            .ud(dest)
            .signaled();
        self.shared
            .qp1
            .post_send(&[wr])
            .map_err(|e| ServiceError::verbs("posting a MAD", e))?;
        st.mads_out += 1;
        Ok(())
    }

    /// Applies a QP transition the agent asked for to the QP associated with its connection.
    fn apply(&self, st: &mut State<D>, a: QpAction) {
        let Some((id, weak)) = st.qps.get(&a.qpn) else {
            return;
        };
        if *id != a.id {
            return;
        }
        // A QP already destroyed is reaped (and its connection aborted) by progress.
        let Some(qp) = weak.upgrade() else {
            return;
        };
        let id = *id;
        let result = match a.target {
            QpTarget::Rtr(r) => {
                let attr = QpAttr {
                    qp_state: QpState::Rtr,
                    path_mtu: portverbs_hal::types::Mtu::from_code(r.path_mtu)
                        .unwrap_or(portverbs_hal::types::Mtu::Mtu1024),
                    dest_qp_num: r.dest_qpn,
                    rq_psn: r.rq_psn,
                    max_dest_rd_atomic: r.max_dest_rd_atomic,
                    min_rnr_timer: r.min_rnr_timer,
                    ah_attr: AddressVector {
                        dgid: r.dgid,
                        is_global: true,
                        sgid_index: self.shared.gid_index,
                        flow_label: r.flow_label,
                        hop_limit: r.hop_limit,
                        traffic_class: r.traffic_class,
                        sl: r.sl,
                        port_num: 1,
                        ..AddressVector::default()
                    },
                    ..QpAttr::default()
                };
                let mask = QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER;
                qp.modify_blocking(&attr, mask)
            }
            QpTarget::Rts(r) => {
                let attr = QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: r.sq_psn,
                    retry_cnt: r.retry_cnt,
                    rnr_retry: r.rnr_retry,
                    max_rd_atomic: r.max_rd_atomic,
                    timeout: r.timeout,
                    ..QpAttr::default()
                };
                let mask = QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC
                    | QpAttrMask::TIMEOUT;
                qp.modify_blocking(&attr, mask)
            }
            QpTarget::Error => to_error(&qp),
        };
        if let Err(e) = result {
            tracing::debug!(?id, error = %e, "QP transition for the CM failed");
            if let Some(q) = st.events.get_mut(&id) {
                q.push_back(RdmaCmEvent::ConnectError {
                    detail: e.to_string(),
                });
            }
        }
    }

    /// Puts an agent event where the application finds it.
    fn route(&self, st: &mut State<D>, e: CmEvent) {
        let now = self.now();
        let (id, ev) = match e {
            CmEvent::ConnectRequest { id, request } => {
                let admitted = st
                    .listeners
                    .get(&request.listener)
                    .and_then(|l| admit(l, &request));
                match (admitted, st.listeners.get_mut(&request.listener)) {
                    (Some(p), Some(l)) => l.pending.push_back(Pending { id, ..p }),
                    // What a Linux passive side does when its checks fail: the new ID is
                    // destroyed in REQ_RCVD, which sends REJ 28 with no private data.
                    _ => {
                        let _ = st.agent.destroy(now, id);
                    }
                }
                return;
            }
            CmEvent::SidrRequest { id, listener, .. } => {
                match st.listeners.get_mut(&listener) {
                    Some(l) if l.udp && l.sidr.len() < l.backlog => l.sidr.push_back(id),
                    // Not a UDP listener, or its backlog is full: SIDR_REP "rejected".
                    _ => {
                        let _ = st.agent.destroy(now, id);
                    }
                }
                return;
            }
            CmEvent::SidrResolved {
                id,
                status,
                qpn,
                qkey,
            } => (id, RdmaCmEvent::ServiceResolved { status, qpn, qkey }),
            CmEvent::Established { id, private_data } => {
                (id, RdmaCmEvent::Established { private_data })
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => (
                id,
                RdmaCmEvent::Rejected {
                    reason,
                    private_data,
                },
            ),
            CmEvent::Unreachable { id } => (id, RdmaCmEvent::Unreachable),
            CmEvent::Disconnected { id } => (id, RdmaCmEvent::Disconnected),
            CmEvent::TimewaitExit { id } => (id, RdmaCmEvent::TimewaitExit),
        };
        if matches!(
            ev,
            RdmaCmEvent::Rejected { .. } | RdmaCmEvent::Unreachable | RdmaCmEvent::TimewaitExit
        ) {
            // The connection is over: its QP is flushed and free for another.
            release_qp(st, id);
        }
        if let Some(q) = st.events.get_mut(&id) {
            q.push_back(ev);
        }
    }

    /// Aborts the connections whose QP the application destroyed (decision 7 of DESIGN §3):
    /// the endpoint is destroyed in the agent, which sends the REJ or DREQ its state calls
    /// for, and the application's endpoint gets DISCONNECTED (it was connected) or
    /// CONNECT_ERROR (it was being set up). True when an event was queued.
    fn reap_dead(&self, st: &mut State<D>) -> bool {
        let dead: Vec<(u32, CmId)> = st
            .qps
            .iter()
            .filter(|(_, (_, weak))| weak.upgrade().is_none())
            .map(|(qpn, (id, _))| (*qpn, *id))
            .collect();
        let now = self.now();
        for &(qpn, id) in &dead {
            st.qps.remove(&qpn);
            let connected = matches!(
                st.agent.state(id),
                Some(CmState::Established | CmState::DreqSent | CmState::DreqRcvd)
            );
            let _ = st.agent.destroy(now, id);
            if let Some(q) = st.events.get_mut(&id) {
                q.push_back(if connected {
                    RdmaCmEvent::Disconnected
                } else {
                    RdmaCmEvent::ConnectError {
                        detail: format!("QP {qpn:#x} was destroyed"),
                    }
                });
            }
        }
        !dead.is_empty()
    }

    fn wake_all(&self) {
        self.shared.wake_gen.fetch_add(1, Ordering::AcqRel);
        let wakers = std::mem::take(&mut *lock(&self.shared.wakers));
        for w in wakers {
            w.wake();
        }
    }

    /// Blocks, driving the device, until `f` finds what it waits for or `timeout` passes.
    pub(super) fn wait_blocking<T>(
        &self,
        timeout: Option<Duration>,
        mut f: impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<T, ServiceError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let mut req = self.shared.cq.notify(NotifyKind::Any);
            self.progress()?;
            let next = {
                let mut st = self.state();
                if let Some(v) = f(&mut st) {
                    return Ok(v);
                }
                if st.removed {
                    return Err(ServiceError::Closed);
                }
                st.agent.poll_timeout()
            };
            let mut sleep = MAX_SLEEP;
            if let Some(t) = next {
                let left = Duration::from_nanos(t.saturating_sub(self.now()));
                sleep = sleep.min(left);
            }
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Err(ServiceError::TimedOut);
                }
                sleep = sleep.min(d - now);
            }
            match self.shared.cq.wait_notify(&mut req, Some(sleep)) {
                Ok(()) | Err(WaitError::TimedOut) | Err(WaitError::BadEvent(_)) => {}
                // Among them a context whose sinks only poll: this layer does not sleep in
                // their place (open the context with blocking sinks).
                Err(e) => return Err(ServiceError::verbs("waiting on QP1's CQ", e)),
            }
        }
    }

    /// Awaits, driving the device on every wake, until `f` finds what it waits for: QP1's CQ
    /// notification, another waiter's wake, or (with a [`CmTimer`] lent) the next CM
    /// deadline.
    pub(super) async fn wait_async<T>(
        &self,
        mut f: impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<T, ServiceError> {
        loop {
            let notified = self.shared.cq.notified(NotifyKind::Any);
            let gen_before = self.shared.wake_gen.load(Ordering::Acquire);
            self.progress()?;
            let next = {
                let mut st = self.state();
                if let Some(v) = f(&mut st) {
                    return Ok(v);
                }
                if st.removed {
                    return Err(ServiceError::Closed);
                }
                st.agent.poll_timeout()
            };
            // Every timer the agent arms comes with a MAD sent or received on QP1, whose
            // completion wakes this wait again: a deadline armed by another call is slept for
            // from that round on.
            let mut sleep = self.timer_sleep(next);
            let mut notified = pin!(notified);
            let woke = poll_fn(|cx| {
                if self.shared.wake_gen.load(Ordering::Acquire) != gen_before {
                    return Poll::Ready(Ok(()));
                }
                // The next CM timer is due: go round, and progress fires it.
                if let Some(s) = sleep.as_mut() {
                    if s.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                }
                {
                    let mut w = lock(&self.shared.wakers);
                    if !w.iter().any(|x| x.will_wake(cx.waker())) {
                        w.push(cx.waker().clone());
                    }
                }
                notified.as_mut().poll(cx)
            })
            .await;
            if let Err(e) = woke {
                return Err(ServiceError::verbs("awaiting QP1's CQ", e));
            }
        }
    }

    /// Associates `qp` with connection `id` and takes it to INIT; atomic with respect to
    /// every other association of this device.
    pub(super) fn associate(&self, id: CmId, qp: &Qp<D>) -> Result<(), ServiceError> {
        let qpn = qp.qp_num();
        if qp.qp_type() != portverbs_hal::types::QpType::Rc {
            return Err(ServiceError::NotRc(qpn));
        }
        let mut st = self.state();
        if let Some((_, weak)) = st.qps.get(&qpn) {
            if weak.upgrade().is_some() {
                return Err(ServiceError::QpInUse(qpn));
            }
            // The QP number of a destroyed QP, reused: that connection is over.
            self.reap_dead(&mut st);
        }
        if qp.state() == QpState::Reset {
            let attr = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS;
            qp.modify_blocking(&attr, mask)
                .map_err(|e| ServiceError::ConnectError(e.to_string()))?;
        }
        st.qps.insert(qpn, (id, qp.downgrade()));
        Ok(())
    }

    /// A pseudo-random 24-bit starting PSN (rdma_cm draws one per ID).
    pub(super) fn psn(&self, id: CmId) -> u32 {
        let x = self.now() ^ u64::from(id.comm_id()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x ^ (x >> 24) ^ (x >> 48)) as u32 & 0x00FF_FFFF
    }
}

/// Moves a QP to ERR (every posted request flushed), unless it is already there or in RESET.
pub(super) fn to_error<D: Device>(qp: &Qp<D>) -> Result<(), portverbs_verbs::ModifyQpError> {
    if matches!(qp.state(), QpState::Err | QpState::Reset) {
        return Ok(());
    }
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify_blocking(&attr, QpAttrMask::STATE)
}

/// Ends the association of `id`'s QP: ERR and forgotten.
pub(super) fn release_qp<D: Device>(st: &mut State<D>, id: CmId) {
    let qpn = st
        .qps
        .iter()
        .find(|(_, (owner, _))| *owner == id)
        .map(|(qpn, _)| *qpn);
    if let Some(qpn) = qpn {
        if let Some(qp) = st.qps.remove(&qpn).and_then(|(_, weak)| weak.upgrade()) {
            if let Err(e) = to_error(&qp) {
                tracing::debug!(?id, error = %e, "moving a released QP to ERR");
            }
        }
    }
}

/// The passive side's checks on a REQ (facts §4.3): a CMA header of version 0 with IP
/// version 4 or 6, whose destination matches the listener's bound address and family, a
/// source address that is not unspecified or multicast, and room in the backlog.
fn admit(l: &ListenState, r: &portverbs_cm::ConnectRequest) -> Option<Pending> {
    let h = CmaHeader::parse(&r.private_data).ok()?;
    if l.pending.len() >= l.backlog {
        return None;
    }
    let bound = l.bound.ip();
    if h.src.is_ipv4() != h.dst.is_ipv4() || bound.is_ipv4() != h.dst.is_ipv4() {
        return None;
    }
    if !bound.is_unspecified() && bound != h.dst {
        return None;
    }
    if h.src.is_unspecified() || h.src.is_multicast() {
        return None;
    }
    if let IpAddr::V4(v4) = h.src {
        if v4.is_broadcast() {
            return None;
        }
    }
    Some(Pending {
        id: r.listener,
        remote: SocketAddr::new(h.src, h.src_port),
        local: SocketAddr::new(h.dst, l.bound.port()),
        private_data: r.private_data[portverbs_cm::wire::CMA_HEADER_LEN..].to_vec(),
        responder_resources: r.responder_resources,
        initiator_depth: r.initiator_depth,
    })
}

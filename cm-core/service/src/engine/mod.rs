//! The CM device: QP1, the agent, and progress driven by the application's calls.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::task::{Poll, Wake, Waker};
use std::time::{Duration, Instant};

use portverbs_hal::Gid;
use portverbs_hal::types::Mtu;
use portverbs_hal::{Device, ProgressAgent};
use portverbs_verbs::{
    AccessFlags, AddressVector, Context, Cq, CqInit, Mr, NotifyKind, Pd, Qp, QpInit, QpState,
    RecvWr, SendOp, SendWr, SpecialQp, UdDest, WaitError, WcStatus, WeakQp, WorkCompletion,
};

use crate::ahcache::AhCache;
use crate::pacing::Pacer;
use crate::timer::Sleep;
use crate::transition::{self, Transition};
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
/// The longest a destroyed QP goes unnoticed when the context's QP count alone does not
/// show it ([`CmDevice::reap_due`]).
const REAP_EVERY: Duration = Duration::from_millis(100);
/// Send buffers on QP1.
const SEND_SLOTS: usize = 64;
/// The GRH area in front of a UD receive.
const GRH: usize = 40;
const RECV_SLOT: usize = GRH + MAD_LEN;
const SEND_BASE: usize = RECV_SLOTS * RECV_SLOT;

/// QP1's traffic counters ([`CmDevice::mad_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MadCounts {
    /// Datagrams QP1 received (malformed ones and those not from a QP1 included).
    pub received: u64,
    /// MADs posted.
    pub sent: u64,
    /// Receives that completed in error (other than the flush of a removed device).
    pub recv_errors: u64,
    /// Sends that completed in error.
    pub send_errors: u64,
    /// QP transitions the device did not finish when the CM started them: each held the
    /// agent's later outputs back until it was done (crate docs: "QP transitions").
    pub deferred_transitions: u64,
    /// MADs that waited for their peer's send window before leaving (see the crate docs:
    /// pacing).
    pub paced: u64,
    /// MADs dropped instead of waiting, because the caps on waiting MADs were reached (see
    /// the crate docs: pacing): each is recovered as a MAD lost on the wire is, by a
    /// retransmission.
    pub pace_dropped: u64,
    /// Datagrams dropped because they did not come from a QP1: a CM MAD's source QP is 1
    /// (Linux's CM never redirects, so neither does this one).
    pub not_from_qp1: u64,
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

/// A SIDR request waiting in a UDP listener's queue.
#[derive(Debug, Clone)]
pub(super) struct SidrPending {
    pub(super) id: CmId,
    /// The requester's address, from the CMA header.
    pub(super) remote: SocketAddr,
    /// The address it was sent to.
    pub(super) local: SocketAddr,
    /// The private data after the CMA header.
    pub(super) private_data: Vec<u8>,
}

/// A listener's queue and what its requests must match.
#[derive(Debug)]
pub(super) struct ListenState {
    pub(super) bound: SocketAddr,
    pub(super) backlog: usize,
    pub(super) pending: VecDeque<Pending>,
    /// `RDMA_PS_UDP` listeners: SIDR requests waiting for [`crate::Listener::get_service_request`].
    pub(super) udp: bool,
    pub(super) sidr: VecDeque<SidrPending>,
}

/// Everything behind the device lock.
pub(super) struct State<D: Device> {
    pub(super) agent: CmAgent,
    /// QP1's address handles, one per recent peer ([`crate::ahcache`]).
    ahs: AhCache<D>,
    /// QPN → the connection it belongs to: one entry per QP, set and cleared under this lock.
    /// Weak: the application's `Qp::destroy` is not refused because the CM tracks the QP;
    /// a QP found gone aborts its connection ([`CmDevice::progress`]).
    pub(super) qps: HashMap<u32, (CmId, WeakQp<D>)>,
    /// The reverse of `qps`: connection → QPN, so that releasing one costs no scan.
    qp_of: HashMap<CmId, u32>,
    /// Event queues of the application's endpoints.
    pub(super) events: HashMap<CmId, VecDeque<RdmaCmEvent>>,
    pub(super) listeners: HashMap<CmId, ListenState>,
    /// The ports the live [`crate::Listener`]s are bound to, by port space (UDP or not).
    pub(super) bound: HashSet<(bool, u16)>,
    free_send: Vec<usize>,
    unsent: VecDeque<OutMad>,
    /// A QP transition the agent asked for that the device has not finished: the agent's
    /// later outputs wait behind it ([`crate::transition`]).
    gate: Option<Transition>,
    /// Released QPs on their way to ERR; nothing waits for them.
    background: Vec<Transition>,
    deferred: u64,
    /// The send windows, one per peer: requests the peers have yet to answer, and what waits
    /// behind them.
    pacer: Pacer,
    /// Endpoints that got an event since [`CmDevice::take_ready`] last ran; `None` until an
    /// application first asks.
    ready: Option<Vec<CmId>>,
    /// The context's live QPs at the last look, and when the associations were last all
    /// checked ([`CmDevice::reap_due`]).
    qps_seen: usize,
    reaped_at: u64,
    pub(super) next_port: u16,
    pub(super) removed: bool,
    mads_in: u64,
    mads_out: u64,
    recv_errors: u64,
    send_errors: u64,
    not_from_qp1: u64,
}

impl<D: Device> State<D> {
    /// Whether a QP transition for `id` is still in flight on the device.
    pub(super) fn transition_pending(&self, id: CmId) -> bool {
        self.gate.as_ref().is_some_and(|t| t.id == id)
    }
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
    /// Port 1's active MTU, as queried at open.
    port_mtu: Mtu,
    local_ip: IpAddr,
    epoch: Instant,
    state: Mutex<State<D>>,
    wakers: Mutex<Vec<Waker>>,
    wake_gen: AtomicU64,
    /// The application's timer for async waits ([`crate::CmTimer`]).
    timer: Mutex<Option<Arc<dyn CmTimer>>>,
    /// Given to the device commands the CM starts ([`WakeWaiters`]).
    waker: Waker,
    /// This device's work as an agent of the verbs device ([`DeviceAgent`]); the device holds
    /// it weakly, so it goes (and is detached) with the CM device.
    agent: Arc<dyn ProgressAgent>,
    /// Whether the verbs device runs the agent (it progresses on its own, or inside every
    /// call of a manual application).
    served: std::sync::atomic::AtomicBool,
}

impl<D: Device> Shared<D> {
    /// Every async waiter re-drives the device.
    fn wake_all(&self) {
        self.wake_gen.fetch_add(1, Ordering::AcqRel);
        let wakers = std::mem::take(&mut *lock(&self.wakers));
        for w in wakers {
            w.wake();
        }
    }
}

/// What one round of a wait found: the value, or the agent's next timer to sleep toward.
enum Round<T> {
    Done(T),
    Wait(Option<u64>),
}

/// The waker given to device commands the CM starts: their completion wakes the device's
/// async waiters, whose next progress polls the command again. Blocking waiters poll it
/// within [`MAX_SLEEP`].
struct WakeWaiters<D: Device>(Weak<Shared<D>>);

impl<D: Device> Wake for WakeWaiters<D> {
    fn wake(self: Arc<Self>) {
        if let Some(shared) = self.0.upgrade() {
            shared.wake_all();
        }
    }
}

/// The CM's work as a progress agent of its verbs device: the device runs it after rounds
/// with work and when the CM's next timer is due, from its progress thread (auto) or inside
/// the application's calls (manual), so that peers are answered (REJ for a REQ to no
/// listener, DREP, MRA, retransmissions) without the application calling into the CM.
struct DeviceAgent<D: Device>(Weak<Shared<D>>);

/// How soon an agent round that found the CM busy (another thread in a call or a wait)
/// asks to run again.
const BUSY_RETRY: Duration = Duration::from_millis(1);

impl<D: Device> ProgressAgent for DeviceAgent<D> {
    fn run(&self, now: Instant) -> Option<Instant> {
        let shared = self.0.upgrade()?;
        CmDevice { shared }.agent_round(now)
    }
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
        let port_mtu = ctx
            .query_port(1)
            .await
            .map_err(|e| ServiceError::verbs("querying port 1", e))?
            .active_mtu;
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
        // The comm-ID salt and the first ephemeral port from the OS's randomness, as Linux's
        // CM draws its random ID operand: a peer cannot guess this device's IDs.
        let random = portverbs_hal::rng::os_random();
        let ca_guid = ctx.attr().node_guid;
        let cfg = AgentConfig::new(ca_guid, random as u32);
        let dev = Self {
            shared: Arc::new_cyclic(|me| Shared {
                ctx: ctx.clone(),
                pd,
                cq,
                qp1,
                mr,
                gid_index,
                port_mtu,
                local_ip: ip,
                epoch,
                state: Mutex::new(State {
                    agent: CmAgent::new(cfg),
                    ahs: AhCache::default(),
                    qps: HashMap::new(),
                    qp_of: HashMap::new(),
                    events: HashMap::new(),
                    listeners: HashMap::new(),
                    bound: HashSet::new(),
                    free_send: (0..SEND_SLOTS).rev().collect(),
                    unsent: VecDeque::new(),
                    gate: None,
                    background: Vec::new(),
                    deferred: 0,
                    pacer: Pacer::default(),
                    ready: None,
                    qps_seen: 0,
                    reaped_at: 0,
                    next_port: 0xC000 | ((random >> 32) as u16 & 0x3FFF),
                    removed: false,
                    mads_in: 0,
                    mads_out: 0,
                    recv_errors: 0,
                    send_errors: 0,
                    not_from_qp1: 0,
                }),
                wakers: Mutex::new(Vec::new()),
                wake_gen: AtomicU64::new(0),
                timer: Mutex::new(None),
                waker: Waker::from(Arc::new(WakeWaiters(me.clone()))),
                agent: Arc::new(DeviceAgent(me.clone())),
                served: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        for slot in 0..RECV_SLOTS {
            dev.post_recv(slot)?;
        }
        // From here on the device runs the CM whenever it progresses (where it can).
        let served = ctx.attach_agent(&dev.shared.agent);
        dev.shared.served.store(served, Ordering::Release);
        Ok(dev)
    }

    /// Whether the verbs device runs this CM whenever it progresses
    /// ([`Context::attach_agent`]): on its progress thread (auto progress) or inside the
    /// application's calls on the device (manual). Then peers are answered without calls into
    /// the CM; otherwise (a stepped test fabric, hardware behind VFIO) only the CM's own calls
    /// and waits, and [`CmDevice::progress`], drive it.
    pub fn served_by_device(&self) -> bool {
        self.shared.served.load(Ordering::Acquire)
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

    /// Port 1's active MTU (queried when the CM was opened): the path MTU of its connections
    /// unless [`crate::ConnParam::path_mtu`] asks for less.
    pub fn port_mtu(&self) -> Mtu {
        self.shared.port_mtu
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
            deferred_transitions: st.deferred,
            paced: st.pacer.paced(),
            pace_dropped: st.pacer.dropped(),
            not_from_qp1: st.not_from_qp1,
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
            (st.pacer.held() == 0 && st.unsent.is_empty() && st.free_send.len() == SEND_SLOTS)
                .then_some(())
        };
        match self.wait_blocking(Some(timeout), sent) {
            Ok(()) => Ok(true),
            Err(ServiceError::TimedOut) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves into `out` the endpoints that got an event from the peer since the last call
    /// (an endpoint may appear more than once), so that an application with thousands of
    /// connections in flight looks only at those ([`crate::Connector::try_connected`]).
    /// The first call starts the tracking and finds nothing; it does not drive the device.
    pub fn take_ready(&self, out: &mut Vec<CmId>) {
        let mut st = self.state();
        match st.ready.as_mut() {
            Some(r) => out.append(r),
            None => st.ready = Some(Vec::new()),
        }
    }

    /// The CM's table bytes, an upper estimate by capacity: the agent's
    /// ([`CmAgent::state_bytes`]) plus this layer's maps (QP associations, event queues, the
    /// send window, MADs waiting for a send slot, the address-handle cache). QP1's buffers,
    /// of fixed size, are not counted.
    pub fn state_bytes(&self) -> usize {
        use std::mem::size_of;
        fn map<K, V>(m: &HashMap<K, V>) -> usize {
            m.capacity() * 8 / 7 * (size_of::<(K, V)>() + 1)
        }
        let st = self.state();
        let queues: usize = st
            .events
            .values()
            .map(|q| q.capacity() * size_of::<RdmaCmEvent>())
            .sum();
        st.agent.state_bytes()
            + map(&st.qps)
            + map(&st.qp_of)
            + map(&st.events)
            + queues
            + st.pacer.bytes()
            + st.unsent.capacity() * size_of::<OutMad>()
            + st.ahs.bytes()
            + st.ready
                .as_ref()
                .map_or(0, |r| r.capacity() * size_of::<CmId>())
    }

    /// Address handles QP1's sends keep (one per recent peer, at most 256: see the crate
    /// docs, "What is bounded").
    pub fn address_handles(&self) -> usize {
        lock(&self.shared.state).ahs.len()
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
        self.progress_locked(self.state())
    }

    /// One round of the device agent (see [`DeviceAgent`]): [`CmDevice::progress`] unless
    /// another thread holds the CM (it drives it then), and when to run next: the next CM
    /// timer, the periodic looks for destroyed QPs and idle send windows, and soon while a QP
    /// transition is in flight (its completion only wakes async waiters).
    fn agent_round(&self, now: Instant) -> Option<Instant> {
        let st = match self.shared.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(now + BUSY_RETRY),
        };
        if let Err(e) = self.progress_locked(st) {
            tracing::debug!(error = %e, "the CM's device agent stops");
            return None;
        }
        let mut st = match self.shared.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(now + BUSY_RETRY),
        };
        if st.removed {
            return None;
        }
        let mut next = st.agent.poll_timeout().map(|t| self.instant_of(t));
        let mut sooner = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        if !st.qps.is_empty() {
            sooner(now + REAP_EVERY);
        }
        if st.pacer.has_peers() {
            sooner(now + Duration::from_secs(1));
        }
        if st.gate.is_some() || !st.background.is_empty() || !st.unsent.is_empty() {
            sooner(now + BUSY_RETRY);
        }
        next
    }

    fn progress_locked(&self, mut st: MutexGuard<'_, State<D>>) -> Result<(), ServiceError> {
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
            // What one batch brought is acted on before the next is taken: a burst of
            // requests from strangers then holds at most a batch of endpoints at once (each
            // refused or queued by the listener's backlog), not a receive queue's worth.
            woke |= self.drain(&mut st)?;
            if n < wcs.len() {
                break;
            }
        }
        if st.agent.poll_timeout().is_some_and(|t| t <= now) {
            st.agent.handle_timeout(now);
        }
        if self.reap_due(&mut st, now) {
            woke |= self.reap_dead(&mut st);
        }
        self.poll_background(&mut st);
        woke |= self.drain(&mut st)?;
        let State { pacer, agent, .. } = &mut *st;
        pacer.tick(agent, now);
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
                // Only the bytes that arrived: a UD receive's byte count covers the GRH area
                // and the datagram. The rest of the buffer is what an earlier MAD left there.
                let len = usize::try_from(wc.byte_len).map_or(RECV_SLOT, |n| n.min(RECV_SLOT));
                let mut buf = [0u8; RECV_SLOT];
                self.shared
                    .mr
                    .read(slot * RECV_SLOT, &mut buf[..len])
                    .map_err(|e| ServiceError::verbs("reading a MAD", e))?;
                st.mads_in += 1;
                let mut grh = [0u8; GRH];
                grh.copy_from_slice(&buf[..GRH]);
                if wc.src_qp == SpecialQp::GSI_QPN {
                    // Exactly the datagram: anything but a whole 256-byte MAD is malformed,
                    // counted by the agent and dropped.
                    let _ = st.agent.handle_mad(
                        now,
                        addr::source_gid(&grh),
                        buf.get(GRH..len).unwrap_or_default(),
                    );
                } else {
                    st.not_from_qp1 += 1;
                }
                // Nothing of this MAD stays for the next one to be read with.
                self.shared
                    .mr
                    .write(slot * RECV_SLOT, &[0u8; RECV_SLOT][..len])
                    .map_err(|e| ServiceError::verbs("clearing a QP1 receive buffer", e))?;
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

    /// Destroys the endpoints `ids` in whatever state (the agent sends the REJ, DREQ or DREP
    /// Linux would), forgets their QP associations and queued events, and acts on the agent's
    /// outputs. For handles being dropped: nothing is reported, as a drop cannot report.
    pub(super) fn destroy_endpoints(&self, st: &mut State<D>, ids: impl IntoIterator<Item = CmId>) {
        let now = self.now();
        for id in ids {
            let _ = st.agent.destroy(now, id);
            self.release_qp(st, id);
            st.events.remove(&id);
        }
        let _ = self.drain(st);
    }

    /// Acts on the agent's outputs in order; true when an application event was queued.
    /// Outputs after a transition still in flight stay queued in the agent until it is done.
    pub(super) fn drain(&self, st: &mut State<D>) -> Result<bool, ServiceError> {
        let mut woke = false;
        // The agent moved (a call, MADs, timers): answered requests free window places.
        st.pacer.agent_moved();
        st.pacer.release(&st.agent, &mut st.unsent);
        loop {
            if let Some(mut t) = st.gate.take() {
                match t.poll(self.waker()) {
                    Poll::Ready(r) => woke |= self.transition_done(st, t.id, r),
                    Poll::Pending => {
                        st.gate = Some(t);
                        break;
                    }
                }
            }
            let Some(out) = st.agent.poll_output() else {
                break;
            };
            match out {
                CmOutput::Send(m) => {
                    if let Some(m) = st.pacer.offer(&st.agent, m) {
                        st.unsent.push_back(m);
                    }
                }
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
        if st.unsent.is_empty() && st.unsent.capacity() > SEND_SLOTS {
            // A burst of answers (a flood of DREQs from strangers) leaves no lasting
            // footprint.
            st.unsent.shrink_to(SEND_SLOTS);
        }
        let mut posted = false;
        while !st.unsent.is_empty() {
            let Some(slot) = st.free_send.pop() else {
                break;
            };
            let Some(m) = st.unsent.pop_front() else {
                st.free_send.push(slot);
                break;
            };
            if let Err(e) = self.send_mad(st, slot, &m) {
                st.free_send.push(slot);
                return Err(e);
            }
            posted = true;
        }
        if posted && self.shared.ctx.progress() == portverbs_hal::Progress::Manual {
            // A manual device may hold what a post produced for its caller's next poll: the
            // MADs leave now, whether or not the application calls again (a DREP, a REJ).
            self.shared.ctx.dispatch();
        }
        Ok(())
    }

    fn send_mad(&self, st: &mut State<D>, slot: usize, m: &OutMad) -> Result<(), ServiceError> {
        let ah = st.ahs.get(m.to, || {
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
                .map_err(|e| ServiceError::verbs("address handle to a CM peer", e))
        })?;
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

    /// Starts the QP transition the agent asked for on the QP associated with its
    /// connection; one the device does not finish at once becomes the gate.
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
        let (attr, mask) = match a.target {
            QpTarget::Rtr(r) => transition::rtr(&r, self.shared.gid_index),
            QpTarget::Rts(r) => transition::rts(&r),
            QpTarget::Error => match transition::error(&qp) {
                Some(x) => x,
                None => return,
            },
        };
        let mut t = Transition::start(a.id, qp, attr, mask);
        match t.poll(self.waker()) {
            Poll::Ready(r) => {
                self.transition_done(st, a.id, r);
            }
            Poll::Pending => {
                st.deferred += 1;
                st.gate = Some(t);
            }
        }
    }

    /// A transition for `id` finished: a failure is the connection's CONNECT_ERROR. True
    /// when an event was queued.
    fn transition_done(
        &self,
        st: &mut State<D>,
        id: CmId,
        r: Result<(), portverbs_verbs::ModifyQpError>,
    ) -> bool {
        let Err(e) = r else {
            return false;
        };
        tracing::debug!(?id, error = %e, "QP transition for the CM failed");
        let Some(q) = st.events.get_mut(&id) else {
            return false;
        };
        q.push_back(RdmaCmEvent::ConnectError {
            detail: e.to_string(),
        });
        if let Some(r) = st.ready.as_mut() {
            r.push(id);
        }
        true
    }

    /// Polls the released QPs' moves to ERR.
    fn poll_background(&self, st: &mut State<D>) {
        if st.background.is_empty() {
            return;
        }
        let waker = self.waker();
        st.background.retain_mut(|t| match t.poll(waker) {
            Poll::Pending => true,
            Poll::Ready(r) => {
                if let Err(e) = r {
                    tracing::debug!(qpn = t.qpn(), error = %e, "moving a released QP to ERR");
                }
                false
            }
        });
    }

    /// Ends the association of `id`'s QP: forgotten, and moved to ERR without waiting.
    pub(super) fn release_qp(&self, st: &mut State<D>, id: CmId) {
        let qpn = st
            .qp_of
            .remove(&id)
            .filter(|qpn| st.qps.get(qpn).is_some_and(|(owner, _)| *owner == id));
        let Some(qp) = qpn
            .and_then(|qpn| st.qps.remove(&qpn))
            .and_then(|(_, weak)| weak.upgrade())
        else {
            return;
        };
        if let Some((attr, mask)) = transition::error(&qp) {
            st.background.push(Transition::start(id, qp, attr, mask));
            self.poll_background(st);
        }
    }

    /// A waker that wakes this device's async waiters (for device commands in flight).
    fn waker(&self) -> &Waker {
        &self.shared.waker
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
            CmEvent::SidrRequest {
                id,
                listener,
                private_data,
                ..
            } => {
                let admitted = st
                    .listeners
                    .get(&listener)
                    .and_then(|l| crate::api::admit_sidr(l, id, &private_data));
                match (admitted, st.listeners.get_mut(&listener)) {
                    (Some(p), Some(l)) => l.sidr.push_back(p),
                    // Not a UDP listener, its backlog full, or its CMA header refused: the
                    // endpoint goes, which answers SIDR_REP "rejected" as Linux does.
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
                private_data,
            } => (
                id,
                RdmaCmEvent::ServiceResolved {
                    status,
                    qpn,
                    qkey,
                    private_data,
                },
            ),
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
        if matches!(ev, RdmaCmEvent::Rejected { .. }) && !st.events.contains_key(&id) {
            // A request still in a listener's queue (the application never took it) that its
            // sender withdrew, or that the agent withdrew once its sender must have given up:
            // it leaves the backlog, and its endpoint goes.
            let mut queued = false;
            for l in st.listeners.values_mut() {
                let before = l.pending.len() + l.sidr.len();
                l.pending.retain(|p| p.id != id);
                l.sidr.retain(|s| s.id != id);
                queued |= l.pending.len() + l.sidr.len() != before;
            }
            if queued {
                let _ = st.agent.destroy(now, id);
                return;
            }
        }
        if matches!(
            ev,
            RdmaCmEvent::Rejected { .. } | RdmaCmEvent::Unreachable | RdmaCmEvent::TimewaitExit
        ) {
            // The connection is over: its QP is flushed and free for another.
            self.release_qp(st, id);
        }
        if let Some(q) = st.events.get_mut(&id) {
            q.push_back(ev);
            if let Some(r) = st.ready.as_mut() {
                r.push(id);
            }
        }
    }

    /// Aborts the connections whose QP the application destroyed (the CM holds only weak handles):
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
            if st.qp_of.get(&id) == Some(&qpn) {
                st.qp_of.remove(&id);
            }
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
                if let Some(r) = st.ready.as_mut() {
                    r.push(id);
                }
            }
        }
        !dead.is_empty()
    }

    /// Whether [`CmDevice::reap_dead`] should look at every association now: when the
    /// context has fewer live QPs than at the last look (one was destroyed), and at least
    /// every [`REAP_EVERY`] besides (a QP destroyed and another created between two looks
    /// leave the count as it was). Checking all of them on every progress made each call
    /// cost as much as the connections held.
    fn reap_due(&self, st: &mut State<D>, now: u64) -> bool {
        let live = self.shared.ctx.object_counts().qps;
        let fewer = live < st.qps_seen;
        st.qps_seen = live;
        if fewer || now.saturating_sub(st.reaped_at) >= REAP_EVERY.as_nanos() as u64 {
            st.reaped_at = now;
            return !st.qps.is_empty();
        }
        false
    }

    fn wake_all(&self) {
        self.shared.wake_all();
    }

    /// One round of a wait: drives the device, then asks `f`; a removed device ends the wait.
    fn round<T>(
        &self,
        f: &mut impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<Round<T>, ServiceError> {
        self.progress()?;
        let mut st = self.state();
        if let Some(v) = f(&mut st) {
            return Ok(Round::Done(v));
        }
        if st.removed {
            return Err(ServiceError::Closed);
        }
        Ok(Round::Wait(st.agent.poll_timeout()))
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
            let next = match self.round(&mut f)? {
                Round::Done(v) => return Ok(v),
                Round::Wait(next) => next,
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
            let next = match self.round(&mut f)? {
                Round::Done(v) => return Ok(v),
                Round::Wait(next) => next,
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

    /// Associates `qp` with connection `id` (atomic with respect to every other
    /// association of this device) and takes it to INIT if it is in RESET; a QP associated
    /// with `id` already is left as it is. The INIT command
    /// runs outside the device lock, so other connections' progress does not wait for it;
    /// if it fails, the association is undone.
    pub(super) async fn associate(&self, id: CmId, qp: &Qp<D>) -> Result<(), ServiceError> {
        let qpn = qp.qp_num();
        if qp.qp_type() != portverbs_hal::types::QpType::Rc {
            return Err(ServiceError::NotRc(qpn));
        }
        {
            let mut st = self.state();
            if let Some((owner, weak)) = st.qps.get(&qpn) {
                if weak.upgrade().is_some() {
                    if *owner == id && st.qp_of.get(&id) == Some(&qpn) {
                        // Associated already ([`crate::Connector::init_qp`]).
                        return Ok(());
                    }
                    return Err(ServiceError::QpInUse(qpn));
                }
                // The QP number of a destroyed QP, reused: that connection is over.
                self.reap_dead(&mut st);
            }
            if let Some(&other) = st.qp_of.get(&id) {
                // The endpoint has another QP, alive ([`crate::Connector::init_qp`]).
                let live =
                    |(owner, weak): &(CmId, WeakQp<D>)| *owner == id && weak.upgrade().is_some();
                if other != qpn && st.qps.get(&other).is_some_and(live) {
                    return Err(ServiceError::WrongQp(qpn));
                }
            }
            st.qps.insert(qpn, (id, qp.downgrade()));
            st.qp_of.insert(id, qpn);
        }
        if qp.state() != QpState::Reset {
            return Ok(());
        }
        let (attr, mask) = transition::init();
        if let Err(e) = qp.modify(&attr, mask).await {
            let mut st = self.state();
            if st.qps.get(&qpn).is_some_and(|(owner, _)| *owner == id) {
                st.qps.remove(&qpn);
                st.qp_of.remove(&id);
            }
            return Err(ServiceError::ConnectError(e.to_string()));
        }
        Ok(())
    }

    /// A random 24-bit starting PSN from the OS (rdma_cm draws one per ID, with
    /// `get_random_u32`).
    pub(super) fn psn(&self, _id: CmId) -> u32 {
        portverbs_hal::rng::random_psn()
    }
}

/// The passive side's checks on a REQ (as Linux `cma.c`'s `cma_ib_req_handler`): a CMA header
/// of version 0 with IP
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

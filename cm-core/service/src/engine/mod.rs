//! The CM device: QP1, the agent, and progress driven by the application's calls.
//!
//! This file holds the device's core: [`CmDevice`], the [`State`] behind its one lock, what
//! it shares with its device agent ([`DeviceAgent`]), and the progress loop
//! ([`CmDevice::progress`]) that feeds QP1's completions to the agent, fires due timers,
//! looks for destroyed QPs and acts on the agent's outputs. Each job of that loop has a file
//! of its own, adding methods to [`CmDevice`] and keeping its state in [`State`]:
//!
//! * `qp1`: the MAD transport on QP1 (receive buffers, posted sends, address handles per
//!   peer, the traffic counters).
//! * `dispatch`: the agent's outputs acted on in order, and its events routed to endpoints
//!   and listeners.
//! * `assoc`: which QP belongs to which connection (weak handles), and noticing the QPs the
//!   application destroyed.
//! * `gate`: the RTR, RTS and ERR transitions the agent asks for, and the outputs parked
//!   behind one the device has not finished.
//! * `wait`: blocking and async waits, the wakers of async waiters, the lent timer.
//!
//! Neighbours that overlap these jobs stay modules of their own: `crate::transition` builds
//! and polls a single QP transition (`gate` decides what waits for it); `crate::pacing` holds
//! MADs back per peer before they reach QP1 (`dispatch` offers them, `qp1` posts what it
//! lets through); `crate::timer` is the public side of the wait machinery
//! ([`CmDevice::set_timer`], [`CmDevice::next_deadline`], [`CmDevice::run`]); and
//! `crate::ahcache` is the address-handle cache `qp1` sends through.
//!
//! What none of these files may do: keep state outside [`State`] (one lock orders every
//! call, wait and device-agent round), or wait for a QP transition or sleep while holding
//! that lock. (One exception stands: `qp1` creates a new peer's address handle under it,
//! with verbs-core's blocking call.)

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use portverbs_hal::Gid;
use portverbs_hal::types::Mtu;
use portverbs_hal::{Device, ProgressAgent};
use portverbs_verbs::{
    AccessFlags, Context, Cq, CqInit, Mr, Pd, Qp, QpInit, WeakQp, WorkCompletion,
};

use crate::ahcache::AhCache;
use crate::pacing::Pacer;
use crate::transition::Transition;
use crate::{CmTimer, RdmaCmEvent, ServiceError, addr};
use portverbs_cm::wire::MAD_LEN;
use portverbs_cm::{AgentConfig, CmAgent, CmId, OutMad};

mod assoc;
mod dispatch;
mod gate;
mod qp1;
mod wait;

use assoc::REAP_EVERY;
use qp1::{RECV_SLOTS, SEND_BASE, SEND_SLOTS};
pub use wait::MAX_SLEEP;
use wait::WakeWaiters;

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
    /// The port whose GID table holds the local IP: QP1, the connections' QPs, SIDR and
    /// multicast address vectors all name it.
    port: u8,
    gid_index: u8,
    /// The port's active MTU, as queried at open.
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

/// The CM of one device port (the one whose GID table holds the local IP address) for that
/// address. Cheap to clone; the
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
    /// Opens the CM of `ctx` for `ip` on the first port whose GID table holds `ip`'s RoCE GID
    /// (as `rdma_bind_addr` binds an ID to that port): creates the device's QP1 on it and
    /// posts its receive buffers. QP1 is one per device, so a second CM on another address of
    /// the same device fails while this one lives.
    ///
    /// # Errors
    /// [`ServiceError::AddressNotLocal`], or a verbs error (e.g. the device has no QP1).
    pub async fn open(ctx: &Context<D>, ip: IpAddr) -> Result<Self, ServiceError> {
        let (port, gid_index) = addr::local_port_gid_index(ctx, ip)?;
        let port_mtu = ctx
            .query_port(port)
            .await
            .map_err(|e| ServiceError::verbs("querying the CM's port", e))?
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
        qp1.ready_ud(&portverbs_verbs::ConnectOptions {
            port,
            ..portverbs_verbs::ConnectOptions::default()
        })
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
                port,
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

    /// The port the CM runs on (from 1): the one whose GID table holds the local IP address.
    pub fn port(&self) -> u8 {
        self.shared.port
    }

    /// The GID table index of the local IP address on [`CmDevice::port`].
    pub fn gid_index(&self) -> u8 {
        self.shared.gid_index
    }

    /// The port's active MTU (queried when the CM was opened): the path MTU of its connections
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

    /// A random 24-bit starting PSN from the OS (rdma_cm draws one per ID, with
    /// `get_random_u32`).
    pub(super) fn psn(&self, _id: CmId) -> u32 {
        portverbs_hal::rng::random_psn()
    }
}

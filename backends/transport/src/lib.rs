//! # Portverbs transport engine
//!
//! The RC/UC/UD transport engine, independent of any queue format: the layer between the wire
//! formats (`portverbs-wire`) and the devices that use it (the soft device, the mlx4 model),
//! which reach each other through the in-process fabric (`portverbs-fabric`). It keeps its QPs
//! in the object table the devices share (`portverbs-table`).
//!
//! What this crate must never do: I/O, threads, locks or reading a clock (time is passed in);
//! know a queue format (that is the [`Hca`] seam's job) or the fabric; depend on `verbs-core`;
//! touch memory except through [`portverbs_dma`] and the checks of [`memory::MemoryTable`];
//! panic on anything a packet or a WQE carries (bad input becomes a NAK, a drop counted in
//! [`EngineStats`], or a completion error).
//!
//! One [`Engine`] is the transport core of one device. It is sans-IO and clock-free: a driver
//! (the fabric's simulation loop) feeds it doorbells ([`Engine::doorbell`]), packets
//! ([`Engine::receive`]) and the time, asks it for its next deadline ([`Engine::poll_timeout`])
//! and fires timers ([`Engine::handle_timeout`]); packets to send come out in a caller-owned
//! `Vec`. Everything device-format specific goes through the [`Hca`] trait, so the software
//! device and the mlx4 model share this code.
//!
//! Per QP there are three small machines (IBA chapter 9, with rxe's structure as a model):
//! * the **requester** (`requester.rs`) fetches send WQEs, checks local keys, segments messages
//!   into MTU-sized packets with PSNs, honours the fence, the READ/atomic depth and the PSN
//!   window, and sets AckReq on the last packet of each message and every 64 packets;
//! * the **completer** (`completer.rs`) consumes ACKs, NAKs, READ responses and atomic ACKs,
//!   completes WQEs in order, goes back N on a sequence NAK or a timeout (bounded by `retry_cnt`),
//!   backs off on RNR NAKs (bounded by `rnr_retry`, 7 = infinite), and moves the QP to ERR
//!   (RC) or SQE (UC/UD) on an error completion;
//! * the **responder** (`responder/`) checks PSNs (one sequence NAK per gap, duplicates
//!   re-ACKed, duplicate READs restarted from the PSN they ask for and duplicate atomics
//!   answered from the cached result), opcode sequences, keys and rights, consumes receive
//!   WQEs, and coalesces ACKs until the end of a burst ([`Engine::flush_acks`]). READ and
//!   atomic responses come from a ring of `max_dest_rd_atomic` responder resources and leave
//!   as the engine's work turns drain them, in PSN order, an ACK or NAK for a later request
//!   behind them (`responder/read.rs`).
//!
//! Work per call is bounded: a doorbell, a packet or a work turn ([`Engine::run_work`]) makes
//! a QP emit at most [`EngineConfig::burst`] packets (or trains) from its requester and as
//! many READ or atomic responses, and leaves the QP on the work list ([`Engine::has_work`])
//! for the rest. A QP's memory does not grow with what its peer asks for: a READ of any size
//! is a resource and a cursor.
//!
//! Congestion control ([`congestion`]) sits between the requester and the wire: before each
//! packet an RC requester asks its path (local port, destination GID) for room in the
//! window all QPs to that peer share; ACKs, round trips, sequence NAKs, probe timeouts and
//! CNPs move the window. A CE-marked packet draws a CNP from the QP it reached. Each path
//! also paces what its window grants (`pacing`: a token bucket at 1.25 windows per round
//! trip, woken by a pace timer), so a window's packets do not leave in one burst.
//!
//! A QP's state changes in one place, `modify::set_state`, whether a modify command, the
//! completer, the responder or a device error asks for it: it does the work entering each
//! state implies (flushing both queues on ERR, the send queue on SQE, the drain on SQD,
//! forgetting everything on RESET). `modify.rs` also applies modify-QP commands.
//!
//! Memory is protected by [`memory::MemoryTable`]; nothing is read or written before its check
//! passes, and every violation becomes the IBTA completion status on both sides.
//!
//! Each machine has sans-IO unit tests in `tests/` (one engine, one QP, a test [`Hca`] whose
//! queues are vectors; the test plays the peer with packets built from the wire types, or a
//! second engine does). The `fuzzing` module (with the `fuzzing` feature) drives two engines
//! back to back from arbitrary bytes — hostile packets, loss, duplication, reordering,
//! timers — checking bounded work per call and that every send completes; the `engine`
//! target in `fuzz/` runs it under libFuzzer, `tests/fuzz.rs` on seeded inputs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod congestion;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod hca;
pub mod mcast;
pub mod memory;
mod pacing;
pub mod packet;
pub mod qp;
pub mod timers;
mod vec_hca;

mod completer;
mod modify;
mod requester;
mod responder;

use std::collections::VecDeque;

use portverbs_hal::attr::{QpAttr, QpAttrMask};
use portverbs_hal::error::CommandError;
use portverbs_hal::types::{Gid, Mtu, QpState, QpType};
use portverbs_table::Table;

pub use congestion::{CcConfig, CcStats, PathInfo};
pub use hca::{Hca, RecvSource, RecvWqe, SendWqe, UdTarget, WqeFault};
pub use mcast::{MCAST_QPN, McastLimits, Membership};
pub use memory::MemoryTable;
pub use packet::{INLINE_PAYLOAD, MemSeg, Packet, PayloadData};
pub use qp::QpInit;
pub use vec_hca::VecHca;

// The engine's modules name their neighbours as `crate::wire` and `crate::dma`.
use portverbs_dma as dma;
use portverbs_wire as wire;

use qp::QpCtx;
use timers::{TimerHeap, TimerKind};

/// Tunables of the transport.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Highest QP number + 1.
    pub max_qp: u32,
    /// Size of the MR/MW key space.
    pub max_keys: u32,
    /// Unacknowledged PSNs allowed in flight per QP.
    pub psn_window: u32,
    /// Set AckReq at least every this many packets.
    pub ack_req_every: u32,
    /// Packets (or trains) one QP's requester, and as many of its READ and atomic
    /// responses, may emit per call: a doorbell, a packet or a work turn (bounded work per
    /// call; the rest waits for [`Engine::run_work`]).
    pub burst: u32,
    /// Seed of the generator behind the key bytes of the MR/MW table: the device's seed
    /// (`portverbs_hal::rng`: from the OS, or pinned for a deterministic run).
    pub seed: u64,
    /// Congestion control ([`congestion`]).
    pub cc: CcConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_qp: 1 << 16,
            max_keys: 1 << 20,
            psn_window: 128,
            ack_req_every: 64,
            burst: 64,
            seed: 0,
            cc: CcConfig::default(),
        }
    }
}

/// One port as the engine sees it.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// GID table (index = sgid_index).
    pub gids: Vec<Gid>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Port is up.
    pub active: bool,
}

/// Counters of the transport (for tests and tools).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Packets emitted.
    pub tx_packets: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets retransmitted (go-back-N and timeouts).
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Sequence NAKs sent.
    pub seq_naks: u64,
    /// RNR NAKs sent.
    pub rnr_naks: u64,
    /// Duplicate requests seen.
    pub duplicates: u64,
    /// Packets dropped (bad Q_Key, unknown QP, wrong state …).
    pub dropped: u64,
    /// Of those dropped, packets to an RC or UC QP from an address that is not the QP's
    /// path: another sender using the QP's number.
    pub misaddressed: u64,
    /// Of those dropped, packets whose P_Key is not the port's (requests and responses).
    pub bad_pkey: u64,
    /// Of those dropped, UD datagrams whose Q_Key is not the QP's.
    pub bad_qkey: u64,
    /// Of those dropped, responses (ACK, NAK, READ response, atomic ACK) whose PSN is outside
    /// the requests in flight: stale, or forged.
    pub psn_out_of_window: u64,
}

/// A port's violation counters (IBA PortInfo P_KeyViolations and Q_KeyViolations; what
/// `ibv_query_port` reports as `bad_pkey_cntr` and `qkey_viol_cntr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortViolations {
    /// Packets received on the port whose P_Key is not in its table.
    pub bad_pkey: u64,
    /// UD datagrams received on the port whose Q_Key is not their QP's.
    pub bad_qkey: u64,
}

/// Everything of an engine except the QP table, so one QP and the rest can be borrowed together.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) cfg: EngineConfig,
    pub(crate) memory: MemoryTable,
    pub(crate) ports: Vec<PortInfo>,
    pub(crate) timers: TimerHeap,
    pub(crate) work: VecDeque<u32>,
    pub(crate) acks: Vec<u32>,
    pub(crate) stats: EngineStats,
    /// Per port (index = port − 1), grown as violations are counted.
    pub(crate) violations: Vec<PortViolations>,
    pub(crate) timer_generation: u64,
    /// Packets of one message that may travel as one train (1 = no trains).
    pub(crate) max_train: u32,
    /// The congestion state of every destination path.
    pub(crate) cc: congestion::Paths,
    /// QPs their path woke (it has room for them again): scheduled by [`Engine::settle`].
    pub(crate) woken: Vec<u32>,
}

/// Most QPs of one multicast group a packet is delivered to: bounds the copy of the member
/// list a delivery walks (a device's `qps_per_group` above it is cut to it).
pub const MAX_MCAST_QPS_PER_GROUP: u32 = 256;

impl Core {
    #[inline]
    pub(crate) fn port_mtu(&self, port: u8) -> u32 {
        self.port(port)
            .map_or(Mtu::Mtu1024.bytes(), |p| p.mtu.bytes())
    }

    /// The violation counters of `port`, to count one more.
    pub(crate) fn violations_mut(&mut self, port: u8) -> &mut PortViolations {
        let i = usize::from(port.max(1)) - 1;
        if self.violations.len() <= i {
            self.violations.resize(i + 1, PortViolations::default());
        }
        &mut self.violations[i]
    }

    pub(crate) fn port(&self, port: u8) -> Option<&PortInfo> {
        self.ports.get(usize::from(port).wrapping_sub(1))
    }

    pub(crate) fn sgid(&self, port: u8, index: u8) -> Gid {
        self.port(port)
            .and_then(|p| p.gids.get(usize::from(index)))
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn arm_timer(&mut self, qpn: u32, kind: TimerKind, at: u64) -> u64 {
        self.timer_generation += 1;
        let generation = self.timer_generation;
        self.timers.push(timers::TimerEntry {
            at,
            qpn,
            kind,
            generation,
        });
        generation
    }

    pub(crate) fn schedule(&mut self, qp: &mut QpCtx) {
        if !qp.scheduled {
            qp.scheduled = true;
            self.work.push_back(qp.qpn);
        }
    }
}

/// The transport core of one device. See the module documentation.
#[derive(Debug)]
pub struct Engine {
    /// QP contexts by number (the numbers are sparse: a device starts them at a random point).
    qps: Table<Box<QpCtx>>,
    core: Core,
    mcast: mcast::McastTable,
}

impl Engine {
    /// An engine with the given ports.
    pub fn new(cfg: EngineConfig, ports: Vec<PortInfo>) -> Self {
        Self {
            qps: Table::new(),
            core: Core {
                cfg,
                memory: MemoryTable::new(cfg.max_keys, cfg.seed),
                ports,
                timers: TimerHeap::default(),
                work: VecDeque::new(),
                acks: Vec::new(),
                stats: EngineStats::default(),
                violations: Vec::new(),
                timer_generation: 0,
                max_train: 1,
                cc: congestion::Paths::new(cfg.cc),
                woken: Vec::new(),
            },
            mcast: mcast::McastTable::default(),
        }
    }

    /// Sets the device's multicast limits (zero, the default, for a device without
    /// multicast); `qps_per_group` is cut to [`MAX_MCAST_QPS_PER_GROUP`]. Existing
    /// attachments stay.
    pub fn set_mcast_limits(&mut self, limits: McastLimits) {
        self.mcast.limits = McastLimits {
            qps_per_group: limits.qps_per_group.min(MAX_MCAST_QPS_PER_GROUP),
            ..limits
        };
    }

    /// The multicast limits in force.
    pub fn mcast_limits(&self) -> McastLimits {
        self.mcast.limits
    }

    /// Attaches UD QP `qpn` to multicast group `gid` (IBA 10.5.2.4); attaching again is a
    /// no-op. Says whether the device joined the group with it.
    ///
    /// # Errors
    /// No such QP, or not a UD QP; [`CommandError::Unsupported`] without multicast;
    /// [`CommandError::ResourceExhausted`] past a limit (named as in
    /// [`portverbs_hal::error::mcast_resource`]).
    pub fn mcast_attach(&mut self, qpn: u32, gid: Gid) -> Result<Membership, CommandError> {
        let qp = self.qps.get(qpn).ok_or_else(|| no_qp(qpn))?;
        if qp.init.qp_type != QpType::Ud {
            return Err(CommandError::InvalidArgument {
                what: format!("QP {qpn:#x} is not a UD QP: it cannot join a multicast group"),
            });
        }
        self.mcast.attach(qpn, gid)
    }

    /// Detaches QP `qpn` from multicast group `gid`. Says whether the device left the group.
    ///
    /// # Errors
    /// [`CommandError::NoSuchObject`] when the QP is not attached to the group.
    pub fn mcast_detach(&mut self, qpn: u32, gid: Gid) -> Result<Membership, CommandError> {
        self.mcast.detach(qpn, gid)
    }

    /// Detaches QP `qpn` from every group (it is being destroyed); returns the groups the
    /// device left.
    pub fn mcast_forget_qp(&mut self, qpn: u32) -> Vec<Gid> {
        self.mcast.forget_qp(qpn)
    }

    /// The multicast groups with a QP of this device attached.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        self.mcast.groups().copied().collect()
    }

    /// The QPs attached to multicast group `gid`.
    pub fn mcast_members(&self, gid: &Gid) -> &[u32] {
        self.mcast.members(gid)
    }

    /// The MR/MW table.
    pub fn memory(&self) -> &MemoryTable {
        &self.core.memory
    }

    /// The MR/MW table, for registration commands.
    pub fn memory_mut(&mut self) -> &mut MemoryTable {
        &mut self.core.memory
    }

    /// The ports.
    pub fn ports(&self) -> &[PortInfo] {
        &self.core.ports
    }

    /// The ports, for link state changes.
    pub fn ports_mut(&mut self) -> &mut Vec<PortInfo> {
        &mut self.core.ports
    }

    /// Allows up to `n` packets of one message to travel as one train (segmentation offload on
    /// a fault-free link); 1 disables trains. The fabric sets this from its link settings.
    pub fn set_max_train(&mut self, n: u32) {
        self.core.max_train = n.max(1);
    }

    /// Transport counters.
    pub fn stats(&self) -> EngineStats {
        self.core.stats
    }

    /// Congestion-control counters.
    pub fn cc_stats(&self) -> CcStats {
        self.core.cc.stats
    }

    /// The congestion state of every path in use.
    pub fn paths(&self) -> Vec<PathInfo> {
        self.core.cc.infos()
    }

    /// `port`'s violation counters (zero for a port that never saw one).
    pub fn port_violations(&self, port: u8) -> PortViolations {
        self.core
            .violations
            .get(usize::from(port).wrapping_sub(1))
            .copied()
            .unwrap_or_default()
    }

    /// Forgets every QP, memory region, window and timer (a device reset), keeping the
    /// configuration, the ports and the statistics.
    pub fn reset(&mut self) {
        self.qps.clear();
        self.mcast.clear();
        self.core.memory.clear();
        self.core.timers = TimerHeap::default();
        self.core.work.clear();
        self.core.acks.clear();
        self.core.woken.clear();
        self.core.cc = congestion::Paths::new(self.core.cfg.cc);
    }

    /// Number of live QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Creates a QP in RESET.
    ///
    /// # Errors
    /// The number is out of range or taken.
    pub fn create_qp(&mut self, qpn: u32, init: QpInit) -> Result<(), CommandError> {
        if qpn >= self.core.cfg.max_qp {
            return Err(CommandError::ResourceExhausted { resource: "QPs" });
        }
        if self.qps.contains(qpn) {
            return Err(CommandError::BadState {
                object: "QP",
                number: qpn,
                reason: "number already in use".into(),
            });
        }
        self.qps.insert(qpn, Box::new(QpCtx::new(qpn, init)));
        Ok(())
    }

    /// Destroys a QP without generating completions; the type-2 windows bound to it become
    /// invalid (they belong to the QP, IBA 10.6.7.2.2), as they do when it goes to RESET.
    ///
    /// # Errors
    /// No such QP.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), CommandError> {
        match self.qps.remove(qpn) {
            Some(mut qp) => {
                self.core.cc.detach(qpn, &mut qp.cc, &mut self.core.woken);
                self.mcast.forget_qp(qpn);
                self.core.memory.unbind_qp(qpn);
                self.core.timers.forget_qp(qpn);
                self.core.work.retain(|&q| q != qpn);
                self.core.acks.retain(|&q| q != qpn);
                self.settle();
                Ok(())
            }
            None => Err(no_qp(qpn)),
        }
    }

    /// Queries a QP.
    ///
    /// # Errors
    /// No such QP.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, CommandError> {
        self.qps
            .get(qpn)
            .map(|q| q.query())
            .ok_or_else(|| no_qp(qpn))
    }

    /// The state of a QP as the device sees it.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(qpn).map(|q| q.state)
    }

    /// Applies a modify (the core validated the transition and mask; the device re-checks that
    /// the QP really is in the state the caller believes).
    ///
    /// # Errors
    /// No such QP, or the QP is not in `attr.cur_qp_state` (e.g. the device moved it to ERR).
    pub fn modify_qp<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) -> Result<(), CommandError> {
        let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) else {
            return Err(no_qp(qpn));
        };
        let done = modify::modify(qp, &mut self.core, hca, now, attr, mask, out);
        self.settle();
        done
    }

    /// The host rang the send doorbell of `qpn` (or posted receives to a QP in error).
    pub fn doorbell<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        qpn: u32,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) {
        let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) else {
            return;
        };
        match qp.state {
            QpState::Err => {
                modify::flush_new(qp, &mut self.core, hca);
                return;
            }
            QpState::Sqe => {
                modify::flush_new_sends(qp, hca);
                return;
            }
            _ => {}
        }
        requester::transmit(qp, &mut self.core, hca, now, out);
        self.settle();
    }

    /// Schedules the QPs their path woke, each once (its `scheduled` flag keeps it from
    /// being queued twice). Every entry point that may free room on a path ends with it.
    fn settle(&mut self) {
        if self.core.woken.is_empty() {
            return;
        }
        let mut woken = std::mem::take(&mut self.core.woken);
        for qpn in woken.drain(..) {
            if let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) {
                self.core.schedule(qp);
            }
        }
        self.core.woken = woken;
    }

    /// True when some QP has work left over from a bounded turn.
    pub fn has_work(&self) -> bool {
        !self.core.work.is_empty()
    }

    /// Runs one turn for every QP that had work left over: the READ and atomic responses its
    /// responder owes, then its requester's transmission, each at most `burst` packets (or
    /// trains).
    pub fn run_work<H: Hca + ?Sized>(&mut self, now: u64, hca: &mut H, out: &mut Vec<Packet>) {
        for _ in 0..self.core.work.len() {
            let Some(qpn) = self.core.work.pop_front() else {
                break;
            };
            if let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) {
                qp.scheduled = false;
                responder::respond(qp, &mut self.core, hca, out);
                requester::transmit(qp, &mut self.core, hca, now, out);
            }
        }
        self.settle();
    }

    /// A packet arrived on `port`.
    pub fn receive<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        port: u8,
        pkt: &Packet,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) {
        self.core.stats.rx_packets += 1;
        if !self.core.port(port).is_some_and(|p| p.active) {
            self.core.stats.dropped += 1;
            return;
        }
        let qpn = pkt.hdr.bth.dest_qp;
        if pkt.hdr.bth.opcode == wire::Opcode::Cnp {
            self.receive_cnp(port, pkt);
        } else if qpn == MCAST_QPN {
            self.receive_mcast(now, port, pkt, hca, out);
        } else {
            self.deliver(now, port, qpn, pkt, hca, out);
        }
        self.settle();
    }

    /// A datagram to a multicast group (destination QP 0xFFFFFF, IBA 10.5.2.4): a copy to
    /// every QP of this device attached to the group its destination GID names, each checked
    /// as a unicast datagram to it would be (its transport, state, P_Key and Q_Key) and each
    /// taking a receive of its own; with none attached, dropped. Like Linux rxe
    /// (`rxe_rcv_mcast_pkt`), the sending QP gets a copy when it is attached itself, and
    /// none otherwise.
    fn receive_mcast<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        port: u8,
        pkt: &Packet,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) {
        let members: smallvec::SmallVec<[u32; 8]> =
            self.mcast.members(&pkt.dst_gid).iter().copied().collect();
        if members.is_empty() || !pkt.dst_gid.is_multicast() {
            self.core.stats.dropped += 1;
            return;
        }
        for qpn in members {
            self.deliver(now, port, qpn, pkt, hca, out);
        }
    }

    /// A congestion notification (RoCEv2's CNP) for one of our QPs: its path slows down. Taken
    /// only by a connected RC QP from its own path; anything else is dropped, so a spoofed
    /// CNP from elsewhere cannot throttle a connection.
    fn receive_cnp(&mut self, port: u8, pkt: &Packet) {
        let qp = self.qps.get(pkt.hdr.bth.dest_qp).map(|q| &**q);
        let ours = qp.is_some_and(|qp| {
            qp.init.qp_type == QpType::Rc
                && matches!(qp.state, QpState::Rts | QpState::Sqd)
                && qp.attr.port_num == port
                && pkt.src_gid == qp.attr.ah_attr.dgid
        });
        match qp {
            Some(qp) if ours => self.core.cc.on_cnp(&qp.cc),
            _ => {
                self.core.stats.dropped += 1;
                self.core.stats.misaddressed += u64::from(qp.is_some());
            }
        }
    }

    /// A packet for QP `qpn` of this device: the transport's header checks, then the QP's
    /// responder or completer.
    fn deliver<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        port: u8,
        qpn: u32,
        pkt: &Packet,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) {
        let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) else {
            self.core.stats.dropped += 1;
            return;
        };
        if qp.attr.port_num != port && qp.state != QpState::Reset {
            self.core.stats.dropped += 1;
            return;
        }
        let opcode = pkt.hdr.bth.opcode;
        // A packet of another transport (a UD datagram to an RC QP's number, RC traffic to a
        // UD QP) is not this QP's: dropped, as IBTA's transport header checks require (the
        // opcode's transport must be the destination QP's).
        if opcode.service() != requester::service(qp.init.qp_type) {
            self.core.stats.dropped += 1;
            return;
        }
        // RC and UC: a connected QP takes packets from its path only (IBTA 9.6.1.1's source
        // checks; rxe's address check does the same for RoCEv2). On a real wire anyone can
        // send to a QP's number; such a packet is not this connection's.
        if qp.init.qp_type != QpType::Ud
            && !matches!(qp.state, QpState::Reset | QpState::Init)
            && pkt.src_gid != qp.attr.ah_attr.dgid
        {
            self.core.stats.dropped += 1;
            self.core.stats.misaddressed += 1;
            return;
        }
        // The port's one P_Key is the default full-membership 0xFFFF: a packet matches when
        // its low 15 bits agree (full or limited membership; IBTA 10.9.3).
        if pkt.hdr.bth.pkey & 0x7fff != 0x7fff {
            self.core.stats.dropped += 1;
            self.core.stats.bad_pkey += 1;
            self.core.violations_mut(port).bad_pkey += 1;
            return;
        }
        if pkt.traffic_class & congestion::ECN_MASK == congestion::ECN_CE
            && !pkt.dst_gid.is_multicast()
            && self.core.cc.should_notify(&mut qp.cc, now)
        {
            out.push(congestion::cnp(&self.core, qp, port, pkt));
        }
        if matches!(
            opcode.kind(),
            Some(
                wire::OpKind::Acknowledge
                    | wire::OpKind::AtomicAcknowledge
                    | wire::OpKind::ReadResponse
            )
        ) {
            completer::on_response(qp, &mut self.core, hca, now, pkt, out);
        } else {
            responder::on_request(qp, &mut self.core, hca, now, pkt, out);
        }
    }

    /// Sends the ACKs coalesced during the current burst.
    pub fn flush_acks(&mut self, out: &mut Vec<Packet>) {
        let acks = std::mem::take(&mut self.core.acks);
        for qpn in &acks {
            if let Some(qp) = self.qps.get_mut(*qpn).map(|q| &mut **q) {
                responder::flush_ack(qp, &mut self.core, out);
            }
        }
        self.core.acks = acks;
        self.core.acks.clear();
    }

    /// Earliest timer deadline (the QPs' timers and the paths' pace timers).
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.core.timers.next_deadline(), self.core.cc.next_pace()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout<H: Hca + ?Sized>(
        &mut self,
        now: u64,
        hca: &mut H,
        out: &mut Vec<Packet>,
    ) {
        let core = &mut self.core;
        core.cc.on_pace_timers(now, &mut core.woken);
        while let Some(t) = self.core.timers.pop_due(now) {
            let Some(qp) = self.qps.get_mut(t.qpn).map(|q| &mut **q) else {
                continue;
            };
            match t.kind {
                TimerKind::Retransmit => {
                    if qp.req.rto_generation != t.generation {
                        continue;
                    }
                    qp.req.rto_queued = None;
                    if !qp.req.rto_armed {
                        continue;
                    }
                    if qp.req.rto_deadline > now {
                        // Re-armed since this entry was queued: wait for the new deadline.
                        let at = qp.req.rto_deadline;
                        qp.req.rto_generation =
                            self.core.arm_timer(qp.qpn, TimerKind::Retransmit, at);
                        qp.req.rto_queued = Some(at);
                    } else {
                        completer::on_retransmit_timeout(qp, &mut self.core, hca, now, out);
                    }
                }
                TimerKind::Probe => {
                    let core = &mut self.core;
                    if qp
                        .cc
                        .pto
                        .due(&mut core.timers, &mut core.timer_generation, &t, now)
                    {
                        completer::on_probe_timeout(qp, core, hca, now, out);
                    }
                }
                TimerKind::Rnr => {
                    if qp.req.rnr_wait && qp.req.rnr_generation == t.generation {
                        qp.req.rnr_wait = false;
                        requester::transmit(qp, &mut self.core, hca, now, out);
                    }
                }
            }
        }
        self.settle();
    }

    /// Moves every QP to ERR (device fatal error) and flushes them.
    pub fn fail_all<H: Hca + ?Sized>(&mut self, hca: &mut H) {
        for (_, qp) in self.qps.iter_mut() {
            modify::set_state(qp, &mut self.core, hca, QpState::Err);
        }
        self.settle();
    }

    /// Moves one QP to ERR with a catastrophic-error event (a malformed WQE, or injected).
    pub fn qp_fatal<H: Hca + ?Sized>(&mut self, qpn: u32, hca: &mut H) {
        let Some(qp) = self.qps.get_mut(qpn).map(|q| &mut **q) else {
            return;
        };
        hca.post_event(portverbs_hal::event::DeviceEvent::Qp {
            qpn,
            kind: portverbs_hal::event::QpEventKind::Fatal,
        });
        modify::set_state(qp, &mut self.core, hca, QpState::Err);
        self.settle();
    }
}

fn no_qp(qpn: u32) -> CommandError {
    CommandError::NoSuchObject {
        object: "QP",
        number: qpn,
    }
}

#[cfg(test)]
mod tests;

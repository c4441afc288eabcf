//! Congestion control: one window per destination path, shared by every RC QP to it.
//!
//! A RoCE NIC relies on a lossless fabric (PFC) and on DCQCN's rate control; a software device
//! on ordinary Ethernet has neither, and a go-back-N requester that keeps its whole PSN window
//! in flight resends all of it into the queue that just overflowed. So the requester of every
//! RC QP asks its path (the local port and the destination GID) before each packet:
//!
//! * the path keeps a **congestion window** in packets (`cwnd`) and the packets in flight of all
//!   its QPs; a packet leaves only while the path is under its window, and a QP holding packets
//!   in flight only while it is under its fair share (`cwnd` over the QPs that want to send, at
//!   least one packet). A QP the path turns away waits in the path's FIFO and is woken, in turn,
//!   as ACKs free the window: QPs to one peer share it fairly however many there are;
//! * the window grows as ACKs arrive (slow start to `ssthresh`, then one packet per window,
//!   additive increase) and is cut: on a PSN-sequence NAK, by half, at most once per round
//!   trip (until the packets in flight at the last cut are acknowledged), so that one burst
//!   of loss is one cut; on every timeout, by half (with no ACK coming back, nothing else
//!   would shrink a burst that a shallow queue drops whole); on congestion notifications
//!   (CNPs), by a factor that follows how often they come (DCQCN's reaction point: `alpha`,
//!   an average of the windows that saw a CNP, and a cut of `cwnd · alpha / 2`); and, where
//!   [`CcConfig::target_delay_ns`] is set, to 0.7 when a round trip exceeds the path's base
//!   by more than the target (the delay signal of Swift and TIMELY; the base is the lowest
//!   round trip of the last two epochs of 16 round trips, so that every sender through a
//!   queue converges on the same base). A device behind the host's sockets has no target
//!   ([`CcConfig::host_sockets`]);
//! * round trips come from one timed PSN per QP at a time (never a retransmission: Karn's
//!   rule); from them a **probe timeout** (RFC 6298's estimator) goes back N when no ACK
//!   came for a few round trips — a lost tail, which no later packet would make the responder
//!   NAK — without charging a retry, doubling each time and stopping at the local ACK
//!   timeout, which alone counts against `retry_cnt` (IBTA 9.7.6.1.3). The go-back sends
//!   two packets and the rest once the responder answers, so that a probe
//!   that fires while a slow responder is still answering costs two duplicates, not a
//!   window;
//! * a QP waiting for the window has nothing of its own in flight and its retransmission
//!   timer does not run: only packets that really left are timed, so a path-wide stall is not
//!   charged to the retry budget of every QP behind it. The timer itself backs off (doubling,
//!   up to 8×) while timeouts follow each other without progress;
//! * once a congestion signal has cut its window, what the window grants leaves paced
//!   (`crate::pacing`): a token bucket per path, refilled at 1.25 windows per round trip,
//!   lets [`CcConfig::pace_burst`] packets (or one [`CcConfig::pace_tick_ns`]'s worth) go back
//!   to back and holds the rest until a pace timer; a QP the bucket turns away waits in the
//!   path's queue as for the window.
//!
//! Nothing on the wire changes for the peer: it sees go-back-N, ACK requests and PSNs exactly
//! as IBTA chapter 9 defines them, only fewer at a time. The notification point is the
//! receiver's: a request or response that arrives marked Congestion Experienced (ECN `11` in the
//! IP traffic class, RFC 3168) makes the QP send a CNP (BTH opcode 0x81, BECN set, the RoCEv2
//! annex's congestion notification packet) to the QP that sent it, at most one per QP per
//! [`CcConfig::cnp_interval_ns`]. With [`CcConfig::ecn`] the RC requests leave ECN-capable
//! (ECT(0)), as a DCQCN NIC sends them.
//!
//! UC and UD have no acknowledgements to clock a window with: they are not throttled, and so
//! they leave Not-ECT (RFC 3168 section 5: only a transport that slows down on marks may ask
//! switches to mark instead of drop; and the traffic class a UD application set reaches the
//! receiver's GRH unchanged). They answer CE marks with CNPs all the same, so that a peer's
//! rate controller can act on them. An RC responder's ACKs and READ responses leave Not-ECT
//! too: a READ's responses are paced by the requester's window, which counts their PSNs.

use std::collections::{HashMap, VecDeque};

use portverbs_hal::types::{Gid, QpType};

use crate::Core;
use crate::pacing::{PaceTimers, Pacer, Rate};
use crate::packet::{Packet, PayloadData, psn};
use crate::qp::QpCtx;
use crate::wire::{Bth, Opcode, TransportHdr};

/// Congestion-control settings of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcConfig {
    /// Throttle RC requesters by a window per path. Off: every QP keeps up to its PSN window
    /// in flight, as before congestion control existed.
    pub enabled: bool,
    /// Window of a new path, in packets.
    pub initial_window: u32,
    /// Smallest window a cut leaves, in packets.
    pub min_window: u32,
    /// Largest window, in packets.
    pub max_window: u32,
    /// Send RC requests ECN-capable (ECT(0)) and answer CE-marked packets with CNPs.
    pub ecn: bool,
    /// Least time between two CNPs of one QP (DCQCN's notification point sends at most one
    /// per interval; 50 µs is the interval of the DCQCN paper).
    pub cnp_interval_ns: u64,
    /// Queueing delay the path may build before its window is cut, at least: the target
    /// round trip is the path's base one plus the larger of this and a quarter of it. 0: no
    /// delay target (the window reacts to loss and CNPs only; [`CcConfig::host_sockets`]).
    pub target_delay_ns: u64,
    /// Probe timeout of a path without a round-trip sample yet (its first packets were lost).
    pub initial_pto_ns: u64,
    /// Shortest probe timeout, however short the round trips.
    pub min_pto_ns: u64,
    /// Most packets a path sends back to back (its pacing bucket; see the crate's `pacing`
    /// module docs). 0: no pacing, a path sends what its window grants at once.
    pub pace_burst: u32,
    /// The finest wake-up the device can count on, in nanoseconds: the bucket holds at least
    /// what accrues in one, and a paced path is woken once per tick, not once per packet.
    pub pace_tick_ns: u64,
}

impl Default for CcConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_window: 16,
            min_window: 2,
            max_window: 8192,
            ecn: true,
            cnp_interval_ns: 50_000,
            target_delay_ns: 20_000,
            initial_pto_ns: 500_000,
            min_pto_ns: 1_000,
            pace_burst: 4,
            pace_tick_ns: 1_000,
        }
    }
}

impl CcConfig {
    /// For a device on the host's clock (the UDP-bound device, a soft device on a free-running
    /// fabric), whose packets go through the host's sockets or threads: no
    /// delay target. Its round trips are measured in userspace and carry the host's own
    /// delays — GSO and GRO batches, a progress thread's wake-ups, the scheduler — tens to
    /// hundreds of microseconds that come and go with no queue behind them: a target tight
    /// enough to keep a switch queue short cuts on that noise (on loopback it halved
    /// `perf write_bw`), and one loose enough not to never fires before the queue drops or
    /// marks. So such a device reacts to loss (sequence NAKs, probe and ACK timeouts) and to
    /// ECN; a device with exact timing (on a stepped fabric's virtual clock) uses the target
    /// as well.
    ///
    /// For the same reason its probe timeout is never under 500 µs, and 5 ms before the first
    /// round trip is measured: a probe that fires while a slow host (a debug build, a busy
    /// machine) is still answering resends what was not lost, and every such duplicate costs
    /// the responder work and the peer an answer (an extra RNR NAK, a duplicate ACK).
    ///
    /// Its pacing tick is 100 µs on Linux, where a thread sleeping in poll(2) wakes within
    /// tens of microseconds of its deadline: a tick's worth of packets per wake-up keeps the
    /// bursts short without a wake-up per packet. On Windows, whose waits (a completion
    /// port's, a condition variable's) are counted in milliseconds and end on the system
    /// timer's tick (15.6 ms unless an application raised its resolution), the tick is that
    /// period ([`CcConfig::with_timer_period`]): pacing then never waits for a wake-up the
    /// device cannot have, and in effect leaves the window alone.
    pub fn host_sockets() -> Self {
        let cc = Self {
            target_delay_ns: 0,
            initial_pto_ns: 5_000_000,
            min_pto_ns: 500_000,
            pace_tick_ns: 100_000,
            ..Self::default()
        };
        if cfg!(windows) {
            cc.with_timer_period(WINDOWS_TIMER_PERIOD_NS)
        } else {
            cc
        }
    }

    /// These settings for a device that can only be woken every `period_ns` (its timer's
    /// resolution): the pacing tick is that period, so that a paced path never waits for a
    /// wake-up finer than the device can have, and the bucket holds what a period accrues.
    pub fn with_timer_period(self, period_ns: u64) -> Self {
        Self {
            pace_tick_ns: self.pace_tick_ns.max(period_ns),
            ..self
        }
    }
}

/// The Windows system timer's default period (64 Hz).
const WINDOWS_TIMER_PERIOD_NS: u64 = 15_625_000;

/// Fixed-point scale of `alpha` (1.0).
const ALPHA_ONE: u32 = 1024;
/// Weight of a new sample in `alpha` (DCQCN's g = 1/16).
const ALPHA_G_SHIFT: u32 = 4;
/// Largest back-off of the retransmission timer, as a shift (8×).
pub(crate) const MAX_RTO_BACKOFF: u8 = 3;
/// Smoothed round trips per epoch of the base round trip (see `Paths::acked_to`).
const EPOCH_RTTS: u64 = 16;
/// Largest back-off of the probe timeout, as a shift (it stops earlier, at the local ACK
/// timeout: `requester::arm_probe`).
pub(crate) const MAX_PTO_BACKOFF: u8 = 30;
/// Packets a probe timeout sends again before the responder answers: enough to learn where
/// the responder stands (it acknowledges what it has, or takes the packets it lacked), few
/// enough that a probe that fires while a slow peer is still answering costs two duplicates,
/// not a window's worth. The answer resumes the go-back with the whole window (RFC 8985's
/// tail loss probe sends one packet; QUIC's probe timeout, RFC 9002 6.2.4, up to two).
pub(crate) const PROBE_PACKETS: u32 = 2;

/// Counters of congestion control, for tests and tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CcStats {
    /// Window cuts on loss (sequence NAK or timeout).
    pub loss_cuts: u64,
    /// Window cuts on CNPs.
    pub cnp_cuts: u64,
    /// CNPs received (for a QP of this device, from its path).
    pub cnps_received: u64,
    /// CNPs sent.
    pub cnps_sent: u64,
    /// Window cuts on round trips above the delay target.
    pub delay_cuts: u64,
    /// Probe timeouts: no ACK for a few round trips, gone back without charging a retry
    /// (two packets at most until the responder answers).
    pub probe_timeouts: u64,
    /// Packets received marked Congestion Experienced.
    pub ce_received: u64,
    /// Times a QP waited for its path's window.
    pub waits: u64,
    /// Times a path's pacing bucket ran dry with room left in its window.
    pub pace_waits: u64,
}

/// A path's congestion state, as tests and tools see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathInfo {
    /// Local port.
    pub port: u8,
    /// Destination GID.
    pub dgid: Gid,
    /// Congestion window, in packets.
    pub cwnd: u32,
    /// Slow-start threshold, in packets.
    pub ssthresh: u32,
    /// Packets in flight of all its QPs.
    pub in_flight: u32,
    /// QPs using it.
    pub qps: u32,
    /// QPs waiting for its window.
    pub waiting: u32,
    /// Smoothed round trip, in nanoseconds (0 before the first sample).
    pub srtt_ns: u64,
    /// Lowest round trip seen, in nanoseconds (0 before the first sample).
    pub min_rtt_ns: u64,
}

/// Congestion state of one QP.
#[derive(Debug, Default)]
pub(crate) struct QpCc {
    /// Index of its path in [`Paths`], once its requester first asked.
    path: Option<u32>,
    /// Packets in flight this QP counts in its path's total.
    charged: u32,
    /// Back-off shift of its retransmission timer.
    pub(crate) rto_backoff: u8,
    /// When it last sent a CNP.
    last_cnp: Option<u64>,
    /// The PSN whose acknowledgement times the path's round trip, and when it left (one
    /// at a time; forgotten when the QP goes back, so a retransmission is never timed).
    probe: Option<(u32, u64)>,
    /// The probe timeout: no ACK for a few round trips.
    pub(crate) pto: crate::timers::Lazy,
    /// Back-off shift of the probe timeout.
    pub(crate) pto_shift: u8,
    /// A probe timeout went back and the responder has not answered since: at most
    /// [`PROBE_PACKETS`] in flight until it does.
    pub(crate) probing: bool,
    /// In its path's queue of QPs waiting for room.
    queued: bool,
}

#[derive(Debug)]
struct Path {
    /// Unique among the engine's paths, past and present (tells a pace timer of a path that
    /// left its slot from one of the path there now).
    id: u64,
    port: u8,
    dgid: Gid,
    qps: u32,
    cwnd: u32,
    ssthresh: u32,
    /// Acknowledged packets towards the next additive increase.
    acc: u32,
    in_flight: u32,
    /// QPs with packets in flight.
    busy: u32,
    /// QPs waiting for room, in turn, each with whether it was woken (scheduled to run) and
    /// has not run since.
    waiting: VecDeque<(u32, bool)>,
    /// Packets acknowledged since the last cut (one cut per round trip: see [`Path::cut`]).
    since_cut: u32,
    /// Packets in flight (or the window, if larger) at the last cut.
    guard: u32,
    /// Packets acknowledged in the current window (for `alpha`).
    window_acked: u32,
    /// DCQCN's alpha, scaled by [`ALPHA_ONE`].
    alpha: u32,
    /// A CNP arrived in the current window.
    cnp_this_window: bool,
    /// Smoothed round trip and its mean deviation (RFC 6298's estimators), 0 when unknown.
    srtt: u64,
    rttvar: u64,
    /// Lowest round trip seen.
    min_rtt: u64,
    /// When the current epoch of round-trip samples began, the lowest of them, and the lowest
    /// of the epoch before.
    epoch_start: u64,
    epoch_min: u64,
    prev_epoch_min: u64,
    /// The pacing bucket, and the deadline of its pace timer while one is queued.
    pacer: Pacer,
    pace_at: Option<u64>,
    /// A congestion signal has cut the window: the path is paced from then on.
    congested: bool,
}

impl Path {
    fn rate(&self) -> Rate {
        Rate {
            cwnd: self.cwnd,
            srtt_ns: self.srtt,
            slow_start: self.cwnd < self.ssthresh,
            congested: self.congested,
        }
    }

    fn info(&self) -> PathInfo {
        PathInfo {
            port: self.port,
            dgid: self.dgid,
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            in_flight: self.in_flight,
            qps: self.qps,
            waiting: self.waiting.len() as u32,
            srtt_ns: self.srtt,
            min_rtt_ns: self.min_rtt,
        }
    }

    /// Cuts the window to `to` (not below `min`) unless it was cut within the last round
    /// trip: until every packet in flight at the last cut was acknowledged, the signals that
    /// arrive are still about the window before it.
    fn cut(&mut self, to: u32, min: u32) -> bool {
        if self.since_cut < self.guard {
            return false;
        }
        self.guard = self.in_flight.max(self.cwnd);
        self.congested = true;
        self.cwnd = to.max(min);
        self.ssthresh = self.cwnd;
        self.acc = 0;
        self.since_cut = 0;
        true
    }
}

/// The paths of one engine: as many as there are distinct destinations of its RC QPs (a path
/// lives while a QP uses it, so a peer cannot make the engine keep more).
#[derive(Debug, Default)]
pub(crate) struct Paths {
    pub(crate) cfg: CcConfig,
    index: HashMap<(u8, Gid), u32>,
    slots: Vec<Option<Path>>,
    free: Vec<u32>,
    pub(crate) stats: CcStats,
    pace_timers: PaceTimers,
    next_id: u64,
}

/// What the requester may send now.
pub(crate) enum Grant {
    /// Up to this many packets (at least one).
    Packets(u32),
    /// Nothing: the QP waits (for its path's window, or for its own ACKs).
    Wait,
}

impl Paths {
    pub(crate) fn new(cfg: CcConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    /// Every path's state.
    pub(crate) fn infos(&self) -> Vec<PathInfo> {
        self.slots.iter().flatten().map(Path::info).collect()
    }

    fn attach(&mut self, cc: &mut QpCc, port: u8, dgid: Gid) -> u32 {
        if let Some(i) = cc.path {
            return i;
        }
        let i = match self.index.get(&(port, dgid)) {
            Some(&i) => i,
            None => {
                let w = self.cfg.initial_window.clamp(1, self.cfg.max_window.max(1));
                self.next_id += 1;
                let path = Path {
                    id: self.next_id,
                    port,
                    dgid,
                    qps: 0,
                    cwnd: w,
                    ssthresh: self.cfg.max_window,
                    acc: 0,
                    in_flight: 0,
                    busy: 0,
                    waiting: VecDeque::new(),
                    since_cut: 0,
                    guard: 0,
                    window_acked: 0,
                    alpha: ALPHA_ONE,
                    cnp_this_window: false,
                    srtt: 0,
                    rttvar: 0,
                    min_rtt: 0,
                    epoch_start: 0,
                    epoch_min: u64::MAX,
                    prev_epoch_min: u64::MAX,
                    pacer: Pacer::default(),
                    pace_at: None,
                    congested: false,
                };
                let i = match self.free.pop() {
                    Some(i) => {
                        self.slots[i as usize] = Some(path);
                        i
                    }
                    None => {
                        self.slots.push(Some(path));
                        (self.slots.len() - 1) as u32
                    }
                };
                self.index.insert((port, dgid), i);
                i
            }
        };
        if let Some(p) = self.path_mut(i) {
            p.qps += 1;
        }
        cc.path = Some(i);
        i
    }

    fn path_mut(&mut self, i: u32) -> Option<&mut Path> {
        self.slots.get_mut(i as usize).and_then(Option::as_mut)
    }

    /// The QP leaves its path (it went to RESET or ERR, or is destroyed): its packets in
    /// flight no longer count and it waits no more.
    pub(crate) fn detach(&mut self, qpn: u32, cc: &mut QpCc, woken: &mut Vec<u32>) {
        cc.pto.armed = false;
        cc.probe = None;
        cc.probing = false;
        let Some(i) = cc.path.take() else {
            return;
        };
        let charged = std::mem::take(&mut cc.charged);
        let Some(p) = self.path_mut(i) else {
            return;
        };
        p.in_flight = p.in_flight.saturating_sub(charged);
        if charged > 0 {
            p.busy = p.busy.saturating_sub(1);
        }
        if std::mem::take(&mut cc.queued) {
            p.waiting.retain(|&(q, _)| q != qpn);
        }
        p.qps = p.qps.saturating_sub(1);
        if p.qps > 0 {
            self.wake(i, woken);
        } else {
            let key = (p.port, p.dgid);
            self.slots[i as usize] = None;
            self.index.remove(&key);
            self.free.push(i);
        }
    }

    /// How many packets QP `qpn` (with `in_flight` packets out, on `port` towards `dgid`) may
    /// send now: what the path's window has room for beyond the QPs waiting ahead of it, and
    /// at most its fair share. Turned away by a full window, the QP is queued to be woken.
    pub(crate) fn grant(
        &mut self,
        qpn: u32,
        cc: &mut QpCc,
        (port, dgid): (u8, Gid),
        in_flight: u32,
        now: u64,
        woken: &mut Vec<u32>,
    ) -> Grant {
        if !self.cfg.enabled {
            return Grant::Packets(u32::MAX);
        }
        let i = self.attach(cc, port, dgid);
        let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
            return Grant::Packets(u32::MAX);
        };
        let window_room = p.cwnd.saturating_sub(p.in_flight);
        let rate = p.rate();
        let path_room = if Pacer::active(&self.cfg, rate) {
            window_room.min(p.pacer.available(&self.cfg, rate, now))
        } else {
            window_room
        };
        // QPs that wait go first: a newcomer queues behind them unless there is room for all.
        let queued = p.waiting.iter().position(|&(q, _)| q == qpn);
        let ahead = queued.unwrap_or(p.waiting.len()) as u32;
        if path_room <= ahead {
            match queued {
                // It ran and is turned away again: no longer scheduled.
                Some(at) => p.waiting[at].1 = false,
                None => {
                    p.waiting.push_back((qpn, false));
                    cc.queued = true;
                    self.stats.waits += 1;
                }
            }
            let paced = path_room < window_room;
            if paced {
                self.stats.pace_waits += 1;
            }
            if paced || p.in_flight == 0 {
                // Nothing is out to bring an ACK that would wake the QPs ahead, or the
                // bucket is what holds them: wake them now, or when it has refilled.
                self.wake(i, woken);
            }
            return Grant::Wait;
        }
        if let Some(at) = queued {
            p.waiting.remove(at);
            cc.queued = false;
        }
        // Its fair share: the window over the QPs that hold packets or wait for room (itself
        // included: counted as busy when it has packets out).
        let wanting = p.busy + p.waiting.len() as u32 + u32::from(in_flight == 0);
        let share = (p.cwnd / wanting.max(1)).max(1);
        if in_flight >= share {
            // It has packets out: its own ACKs bring it back.
            return Grant::Wait;
        }
        Grant::Packets((path_room - ahead).min(share - in_flight))
    }

    /// The QP stopped wanting room (it has nothing to send, or cannot send: a go-back whose
    /// packets were acknowledged after all, an error, an RNR wait): it leaves its path's
    /// queue, or it would hold its place there, and with it room the QPs behind it wait for.
    pub(crate) fn withdraw(&mut self, qpn: u32, cc: &mut QpCc, woken: &mut Vec<u32>) {
        if !std::mem::take(&mut cc.queued) {
            return;
        }
        let Some(p) = cc
            .path
            .and_then(|i| self.slots.get_mut(i as usize)?.as_mut())
        else {
            return;
        };
        p.waiting.retain(|&(q, _)| q != qpn);
        if let Some(i) = cc.path {
            self.wake(i, woken);
        }
    }

    /// Brings the QP's count in its path's total to `in_flight` packets; room it frees wakes
    /// waiting QPs (added to `woken`).
    pub(crate) fn charge(&mut self, cc: &mut QpCc, in_flight: u32, woken: &mut Vec<u32>) {
        let Some(i) = cc.path else {
            return;
        };
        let before = cc.charged;
        if before == in_flight {
            return;
        }
        cc.charged = in_flight;
        let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
            return;
        };
        p.in_flight = p.in_flight.saturating_sub(before).saturating_add(in_flight);
        match (before, in_flight) {
            (0, _) => p.busy += 1,
            (_, 0) => p.busy = p.busy.saturating_sub(1),
            _ => {}
        }
        if in_flight > before {
            // Packets left (new or sent again): each spends a token of the bucket.
            p.pacer.spend(&self.cfg, in_flight - before);
        } else {
            self.wake(i, woken);
        }
    }

    /// `acked` packets of the QP were acknowledged: the window grows (the QP's count in the
    /// path's total is brought down by [`Paths::charge`], which wakes waiting QPs).
    pub(crate) fn on_ack(&mut self, cc: &QpCc, acked: u32) {
        let Some(i) = cc.path else {
            return;
        };
        let max = self.cfg.max_window;
        let Some(p) = self.path_mut(i) else {
            return;
        };
        p.since_cut = p.since_cut.saturating_add(acked);
        p.window_acked = p.window_acked.saturating_add(acked);
        if p.window_acked >= p.cwnd {
            // A whole window went by: DCQCN lowers alpha for a window without a CNP.
            if !p.cnp_this_window {
                p.alpha -= p.alpha >> ALPHA_G_SHIFT;
            }
            p.cnp_this_window = false;
            p.window_acked = 0;
        }
        if p.cwnd < p.ssthresh {
            p.cwnd = p.cwnd.saturating_add(acked).min(p.ssthresh).min(max);
        } else {
            p.acc = p.acc.saturating_add(acked);
            while p.acc >= p.cwnd && p.cwnd < max {
                p.acc -= p.cwnd;
                p.cwnd += 1;
            }
        }
    }

    /// Wakes (adds to `woken`, for the engine to schedule) as many of path `i`'s waiting QPs
    /// as its window, and its pacing bucket, have room for: each is woken once and keeps its
    /// place in the queue until its requester is granted room. When the bucket holds back QPs
    /// the window has room for, a pace timer wakes them once it has refilled.
    fn wake(&mut self, i: u32, woken: &mut Vec<u32>) {
        let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
            return;
        };
        if p.waiting.is_empty() {
            return;
        }
        let window_room = p.cwnd.saturating_sub(p.in_flight);
        let rate = p.rate();
        let paced = Pacer::active(&self.cfg, rate);
        let room = if paced {
            window_room.min(p.pacer.whole())
        } else {
            window_room
        };
        for (q, was_woken) in p.waiting.iter_mut().take(room as usize) {
            if !*was_woken {
                *was_woken = true;
                woken.push(*q);
            }
        }
        let held = (p.waiting.len() as u32).min(window_room);
        if paced && held > room {
            let Some(at) = p.pacer.ready_at(&self.cfg, rate, held) else {
                return;
            };
            if p.pace_at.is_none_or(|t| t > at) {
                p.pace_at = Some(at);
                self.pace_timers.push(at, i, p.id);
            }
        }
    }

    /// The earliest pace timer's deadline (stale ones included: firing one is a no-op).
    pub(crate) fn next_pace(&self) -> Option<u64> {
        self.pace_timers.next_deadline()
    }

    /// Fires the pace timers due at `now`: each path whose bucket has refilled wakes the QPs
    /// it held back.
    pub(crate) fn on_pace_timers(&mut self, now: u64, woken: &mut Vec<u32>) {
        while let Some((at, i, id)) = self.pace_timers.pop_due(now) {
            let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
                continue;
            };
            if p.id != id || p.pace_at != Some(at) {
                continue;
            }
            p.pace_at = None;
            let rate = p.rate();
            p.pacer.available(&self.cfg, rate, now);
            self.wake(i, woken);
        }
    }

    /// The QP saw a loss: a PSN-sequence NAK it acted on (`timeout` false), halving the
    /// path's window at most once per round trip; or its packets went unanswered until a
    /// timeout, the probe timeout or the local ACK timeout (`timeout` true), halving it every
    /// time — with no ACK coming back, the once-per-round-trip rule would never let the window
    /// shrink to what the path can take (a burst bigger than a shallow queue, dropped whole
    /// every time).
    pub(crate) fn on_loss(&mut self, cc: &QpCc, timeout: bool) {
        let Some(i) = cc.path else {
            return;
        };
        let min = self.cfg.min_window;
        let Some(p) = self.path_mut(i) else {
            return;
        };
        if timeout {
            p.since_cut = p.guard;
        }
        let half = p.cwnd / 2;
        if p.cut(half, min) {
            self.stats.loss_cuts += 1;
        }
    }

    /// A CNP arrived for the QP (its peer saw our packets marked Congestion Experienced).
    pub(crate) fn on_cnp(&mut self, cc: &QpCc) {
        self.stats.cnps_received += 1;
        let Some(i) = cc.path else {
            return;
        };
        let min = self.cfg.min_window;
        let Some(p) = self.path_mut(i) else {
            return;
        };
        p.alpha = p.alpha - (p.alpha >> ALPHA_G_SHIFT) + (ALPHA_ONE >> ALPHA_G_SHIFT);
        p.cnp_this_window = true;
        let cut = (u64::from(p.cwnd) * u64::from(p.alpha) / u64::from(2 * ALPHA_ONE)) as u32;
        let to = p.cwnd - cut.max(1).min(p.cwnd);
        if p.cut(to, min) {
            self.stats.cnp_cuts += 1;
        }
    }

    /// The QP sent PSNs up to `last` at `now`: unless one is being timed, time this one.
    pub(crate) fn sent(&mut self, cc: &mut QpCc, last: u32, now: u64) {
        if cc.probe.is_none() && cc.path.is_some() {
            cc.probe = Some((last, now));
        }
    }

    /// The QP goes back N: what it sends next may be a retransmission, which is never timed
    /// (Karn's rule).
    pub(crate) fn went_back(&mut self, cc: &mut QpCc) {
        cc.probe = None;
    }

    /// Everything before `una` was acknowledged at `now`: a round-trip sample when the timed
    /// PSN is among it; a round trip above the path's target cuts its window (once per
    /// window, by how far above it is: the delay-based decrease of Swift and TIMELY).
    pub(crate) fn acked_to(&mut self, cc: &mut QpCc, una: u32, now: u64) {
        let Some((p, at)) = cc.probe else {
            return;
        };
        if psn::diff(una, p) <= 0 {
            return;
        }
        cc.probe = None;
        let (Some(i), sample) = (cc.path, now.saturating_sub(at).max(1)) else {
            return;
        };
        let (min, floor) = (self.cfg.min_window, self.cfg.target_delay_ns);
        let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
            return;
        };
        if p.srtt == 0 {
            p.srtt = sample;
            p.rttvar = sample / 2;
        } else {
            p.rttvar = p.rttvar - p.rttvar / 4 + p.srtt.abs_diff(sample) / 4;
            p.srtt = p.srtt - p.srtt / 8 + sample / 8;
        }
        // The base round trip is the lowest of the last two epochs of samples, not of all
        // time: a path that started behind another sender's standing queue measured that
        // queue into its base, and would hold it (and the link) for ever; with epochs every
        // path's base follows what the queue drains to now, the same for all of them.
        p.epoch_min = p.epoch_min.min(sample);
        if now.saturating_sub(p.epoch_start) >= EPOCH_RTTS * p.srtt {
            p.prev_epoch_min = p.epoch_min;
            p.epoch_min = u64::MAX;
            p.epoch_start = now;
        }
        p.min_rtt = p.epoch_min.min(p.prev_epoch_min);
        if floor == 0 {
            return; // no delay target: the samples serve the probe timeout only
        }
        // The queueing the target allows is small beside the round trip (a quarter of it),
        // so that a cut to 0.7 drains the queue of every path through it: the next epoch
        // then sees the real base.
        let target = p.min_rtt + floor.max(p.min_rtt / 4);
        if sample > target {
            // A fixed cut (to 0.7), not one in proportion to the excess: every path through
            // the queue sees the excess at once and cuts by the same factor (AIMD's
            // convergence to fair shares), and the queue drains each time.
            let to = (u64::from(p.cwnd) * 7 / 10) as u32;
            if p.cut(to, min) {
                self.stats.delay_cuts += 1;
            }
        }
    }

    /// How long the QP waits for an ACK before it goes back N on its own (a probe timeout):
    /// RFC 6298's retransmission timeout from its path's round trips (twice the smoothed one
    /// plus four deviations, at least twice the lowest and [`CcConfig::min_pto_ns`];
    /// [`CcConfig::initial_pto_ns`] before
    /// the first sample), doubled for each probe timeout in a row; `None` for a QP without a
    /// path.
    pub(crate) fn pto_ns(&self, cc: &QpCc) -> Option<u64> {
        let p = self.slots.get(cc.path? as usize)?.as_ref()?;
        let base = if p.srtt == 0 {
            self.cfg.initial_pto_ns
        } else {
            (2 * p.srtt + 4 * p.rttvar)
                .max(2 * p.min_rtt)
                .max(self.cfg.min_pto_ns)
        };
        Some(base.saturating_mul(1 << cc.pto_shift))
    }

    /// Whether the QP, which received a packet marked Congestion Experienced at `now`, sends a
    /// CNP for it (at most one per [`CcConfig::cnp_interval_ns`]).
    pub(crate) fn should_notify(&mut self, cc: &mut QpCc, now: u64) -> bool {
        self.stats.ce_received += 1;
        if !self.cfg.ecn {
            return false;
        }
        if cc
            .last_cnp
            .is_some_and(|t| now.saturating_sub(t) < self.cfg.cnp_interval_ns)
        {
            return false;
        }
        cc.last_cnp = Some(now);
        self.stats.cnps_sent += 1;
        true
    }

    /// The traffic class a packet leaves with: ECT(0) in its ECN bits when ECN is on.
    #[inline]
    pub(crate) fn traffic_class(&self, tclass: u8) -> u8 {
        if self.cfg.ecn {
            (tclass & !ECN_MASK) | ECN_ECT0
        } else {
            tclass
        }
    }
}

/// The ECN bits of the IP traffic class (RFC 3168).
pub const ECN_MASK: u8 = 0b11;
/// ECN-Capable Transport, codepoint ECT(0).
pub const ECN_ECT0: u8 = 0b10;
/// Congestion Experienced.
pub const ECN_CE: u8 = 0b11;

/// Packets in flight of a requester: from its oldest unacknowledged PSN to the next it sends.
#[inline]
pub(crate) fn in_flight(una: u32, next_psn: u32) -> u32 {
    psn::diff(next_psn, una).max(0) as u32
}

/// The CNP QP `qp` sends for `pkt`, which arrived on `port` marked Congestion Experienced: to
/// the QP that sent it (the connected peer, or a datagram's source QP), from the address it
/// arrived at. Its BTH has BECN set, P_Key 0xFFFF, PSN 0; 16 reserved bytes follow (the wire
/// format adds them). It leaves Not-ECT, so that no switch marks a notification.
pub(crate) fn cnp(core: &Core, qp: &QpCtx, port: u8, pkt: &Packet) -> Packet {
    let dest_qp = match (qp.init.qp_type, pkt.hdr.deth) {
        (QpType::Ud, Some(deth)) => deth.src_qp,
        _ => qp.attr.dest_qp_num,
    };
    let hdr = TransportHdr::new(Bth {
        becn: true,
        ..Bth::new(Opcode::Cnp, dest_qp, 0)
    });
    let src = if pkt.dst_gid == Gid::default() {
        core.sgid(port, qp.attr.ah_attr.sgid_index)
    } else {
        pkt.dst_gid
    };
    let mut out = Packet::new(src, pkt.src_gid, hdr, PayloadData::Empty);
    out.traffic_class = pkt.traffic_class & !ECN_MASK;
    out.hop_limit = qp.attr.ah_attr.hop_limit.max(1);
    out.udp_sport = crate::wire::udp_source_port(0, qp.qpn, dest_qp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgid() -> Gid {
        Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2])
    }

    fn paths(window: u32) -> Paths {
        Paths::new(CcConfig {
            initial_window: window,
            ..CcConfig::default()
        })
    }

    impl Paths {
        fn grant_t(
            &mut self,
            qpn: u32,
            cc: &mut QpCc,
            port: u8,
            dgid: Gid,
            in_flight: u32,
        ) -> Grant {
            let mut woken = Vec::new();
            self.grant(qpn, cc, (port, dgid), in_flight, 0, &mut woken)
        }
    }

    /// QP 0 takes the whole window (`paths(window)`), QPs 1..n find it full and queue.
    fn first_fills_the_rest_queue(p: &mut Paths, n: usize, window: u32) -> Vec<QpCc> {
        let mut cc: Vec<QpCc> = (0..n).map(|_| QpCc::default()).collect();
        assert_eq!(granted(p.grant_t(0, &mut cc[0], 1, dgid(), 0)), window);
        p.charge(&mut cc[0], window, &mut Vec::new());
        for (q, c) in cc.iter_mut().enumerate().skip(1) {
            let g = p.grant_t(q as u32, c, 1, dgid(), 0);
            assert!(matches!(g, Grant::Wait), "QP {q} queues");
        }
        cc
    }

    fn granted(g: Grant) -> u32 {
        match g {
            Grant::Packets(n) => n,
            Grant::Wait => 0,
        }
    }

    #[test]
    fn qps_wait_in_turn_and_are_woken_as_the_window_frees() {
        let mut p = paths(4);
        // The first QP alone: the whole window is its share; three more queue in order.
        let mut cc = first_fills_the_rest_queue(&mut p, 4, 4);
        let mut woken = Vec::new();
        assert_eq!(p.infos()[0].waiting, 3);
        // Two of the first QP's packets are acknowledged: slow start makes the window 6,
        // with 2 in flight there is room for four, so all three waiting QPs are woken once.
        p.on_ack(&cc[0], 2);
        p.charge(&mut cc[0], 2, &mut woken);
        assert_eq!(woken, [1, 2, 3]);
        p.charge(&mut cc[0], 1, &mut woken);
        assert_eq!(woken, [1, 2, 3], "woken once until they run");
        // Each gets its share of the window (7 over four QPs: one each), the first QP none
        // until its own packet is answered.
        for q in 1..4 {
            assert_eq!(granted(p.grant_t(q, &mut cc[q as usize], 1, dgid(), 0)), 1);
            p.charge(&mut cc[q as usize], 1, &mut woken);
        }
        assert!(matches!(
            p.grant_t(0, &mut cc[0], 1, dgid(), 1),
            Grant::Wait
        ));
        let info = p.infos()[0];
        assert_eq!((info.in_flight, info.waiting, info.qps), (4, 0, 4));
    }

    #[test]
    fn a_newcomer_queues_behind_waiting_qps() {
        let mut p = paths(2);
        let mut cc = first_fills_the_rest_queue(&mut p, 2, 2);
        cc.push(QpCc::default());
        let mut woken = Vec::new();
        // One packet no longer counts (its QP went back N), the window is still 2: room for
        // one, which is QP 1's.
        p.charge(&mut cc[0], 1, &mut woken);
        assert_eq!(woken, [1]);
        assert!(matches!(
            p.grant_t(2, &mut cc[2], 1, dgid(), 0),
            Grant::Wait
        ));
        assert!(granted(p.grant_t(1, &mut cc[1], 1, dgid(), 0)) >= 1);
    }

    #[test]
    fn a_qp_that_stops_wanting_room_leaves_the_queue_and_wakes_the_next() {
        let mut p = paths(2);
        let mut cc = first_fills_the_rest_queue(&mut p, 4, 2);
        let mut woken = Vec::new();
        // Room for two: QPs 1 and 2 are woken; both find they have nothing to send any more
        // (their go-back was acknowledged after all) and withdraw. QP 3, behind them, must
        // not wait for places nobody will take.
        p.charge(&mut cc[0], 0, &mut woken);
        assert_eq!(woken, [1, 2]);
        woken.clear();
        p.withdraw(1, &mut cc[1], &mut woken);
        p.withdraw(2, &mut cc[2], &mut woken);
        assert_eq!(woken, [3]);
        assert!(granted(p.grant_t(3, &mut cc[3], 1, dgid(), 0)) >= 1);
        assert_eq!(p.infos()[0].waiting, 0);
        // Withdrawing when not queued changes nothing.
        p.withdraw(1, &mut cc[1], &mut woken);
        assert_eq!(woken, [3]);
    }

    #[test]
    fn a_path_lives_while_a_qp_uses_it_and_leaving_frees_its_room() {
        let mut p = paths(2);
        let mut a = QpCc::default();
        let mut b = QpCc::default();
        let mut woken = Vec::new();
        assert_eq!(granted(p.grant_t(7, &mut a, 1, dgid(), 0)), 2);
        p.charge(&mut a, 2, &mut woken);
        assert!(matches!(p.grant_t(8, &mut b, 1, dgid(), 0), Grant::Wait));
        // The first QP goes to ERR with its packets out: they no longer count, and the QP
        // waiting behind it is woken.
        p.detach(7, &mut a, &mut woken);
        assert_eq!(woken, [8]);
        assert_eq!(p.infos()[0].in_flight, 0);
        p.detach(8, &mut b, &mut woken);
        assert!(p.infos().is_empty(), "no QP, no path");
    }

    #[test]
    fn cnps_cut_by_alpha_which_decays_over_quiet_windows() {
        let mut p = paths(100);
        let mut cc = QpCc::default();
        let mut woken = Vec::new();
        p.grant_t(1, &mut cc, 1, dgid(), 0);
        p.on_cnp(&cc);
        let first = p.infos()[0].cwnd;
        assert_eq!(first, 50, "alpha starts at 1: the first cut halves");
        // Quiet windows lower alpha: a later CNP cuts less.
        for _ in 0..40 {
            p.charge(&mut cc, 50, &mut woken);
            p.on_ack(&cc, 50);
            p.charge(&mut cc, 0, &mut woken);
        }
        let before = p.infos()[0].cwnd;
        p.on_cnp(&cc);
        let after = p.infos()[0].cwnd;
        assert!(after > before / 2 && after < before, "{before} -> {after}");
    }

    #[test]
    fn disabled_grants_everything() {
        let mut p = Paths::new(CcConfig {
            enabled: false,
            ..CcConfig::default()
        });
        let mut cc = QpCc::default();
        assert_eq!(granted(p.grant_t(1, &mut cc, 1, dgid(), 1000)), u32::MAX);
        assert!(p.infos().is_empty());
    }
}

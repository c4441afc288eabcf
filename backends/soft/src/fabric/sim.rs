//! The simulation: every device's engine and device-side state, the packets in flight, the
//! clock, and the loop that moves them. One `Sim` sits behind the fabric's lock; the same
//! [`Sim::step`] runs on virtual time (stepped mode, advanced by [`Sim::advance_to_next`]) and
//! on the real clock (free-running mode, on the engine thread).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Receiver;
use portverbs_hal::types::Gid;

use super::faults::{FabricStats, LinkFaults};
use super::foreign::ForeignDevice;
use super::rng::SplitMix64;
use crate::device::doorbell::{Kick, KickKind};
use crate::device::hw::Hw;
use crate::device::state::DevState;
use crate::engine::{Engine, Packet};

/// Hashes GIDs (16 bytes that are already well spread) with two multiply-xorshift rounds
/// instead of SipHash: the routing table is looked up once per packet.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GidHasher(u64);

impl Hasher for GidHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(w)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            self.0 ^= self.0 >> 29;
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Which device a route or a packet leads to: a software device, or a foreign device model
/// (the mlx4 model) attached through [`super::Fabric::attach_foreign`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Node {
    /// Index into [`Sim::devices`].
    Soft(usize),
    /// Index into [`Sim::foreign`].
    Foreign(usize),
}

/// The routing table: GID → (device, port).
pub(crate) type Routes = HashMap<Gid, (Node, u8), BuildHasherDefault<GidHasher>>;

/// Longest train (packets of one message delivered as one unit) on a fault-free fabric.
pub(crate) const MAX_TRAIN: u32 = 64;

/// A device on the fabric.
#[derive(Debug)]
pub(crate) struct SimDevice {
    pub(crate) engine: Engine,
    pub(crate) hw: Hw,
    pub(crate) state: DevState,
}

/// A foreign device model on the fabric: its engine and its [`ForeignDevice`] (the `Hca` the
/// engine drives through dynamic dispatch; soft devices stay monomorphic).
#[derive(Debug)]
pub(crate) struct ForeignSlot {
    pub(crate) name: String,
    pub(crate) engine: Engine,
    pub(crate) dev: Box<dyn ForeignDevice>,
}

#[derive(Debug)]
struct Delivery {
    dev: Node,
    port: u8,
    pkt: Packet,
}

#[derive(Debug)]
struct Timed {
    at: u64,
    seq: u64,
    delivery: Delivery,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// All simulated state of one fabric.
#[derive(Debug)]
pub(crate) struct Sim {
    pub(crate) now: u64,
    pub(crate) devices: Vec<SimDevice>,
    /// Foreign device models; `None` once detached (indices are never reused).
    pub(crate) foreign: Vec<Option<ForeignSlot>>,
    pub(crate) routes: Routes,
    ready: VecDeque<Delivery>,
    /// Fault-free fast path: packets delivered in order, by reference, from the buffer the
    /// engines wrote them into (no per-packet moves).
    batch: Vec<Packet>,
    spare: Vec<Packet>,
    delayed: BinaryHeap<Reverse<Timed>>,
    seq: u64,
    pub(crate) faults: LinkFaults,
    rng: SplitMix64,
    pub(crate) out: Vec<Packet>,
    frame: Vec<u8>,
    pub(crate) stats: FabricStats,
}

impl Sim {
    pub(crate) fn new(seed: u64, faults: LinkFaults) -> Self {
        Self {
            now: 0,
            devices: Vec::new(),
            foreign: Vec::new(),
            routes: Routes::default(),
            ready: VecDeque::new(),
            batch: Vec::with_capacity(256),
            spare: Vec::with_capacity(256),
            delayed: BinaryHeap::new(),
            seq: 0,
            faults,
            rng: SplitMix64::new(seed),
            out: Vec::with_capacity(256),
            frame: Vec::with_capacity(4200),
            stats: FabricStats::default(),
        }
    }

    /// Packets still travelling.
    pub(crate) fn in_flight(&self) -> usize {
        self.ready.len() + self.delayed.len() + self.batch.len()
    }

    /// Hands every packet the engines produced to the links.
    pub(crate) fn route_out(&mut self) {
        if self.out.is_empty() {
            return;
        }
        if self.faults == LinkFaults::NONE && self.ready.is_empty() {
            if self.batch.is_empty() {
                std::mem::swap(&mut self.batch, &mut self.out);
            } else {
                self.batch.append(&mut self.out);
            }
            return;
        }
        let mut out = std::mem::take(&mut self.out);
        for pkt in out.drain(..) {
            self.route(pkt);
        }
        self.out = out;
    }

    fn route(&mut self, pkt: Packet) {
        let Some(&(dev, port)) = self.routes.get(&pkt.dst_gid) else {
            self.stats.unroutable += 1;
            return;
        };
        let f = self.faults;
        if f == LinkFaults::NONE {
            self.ready.push_back(Delivery { dev, port, pkt });
            return;
        }
        if pkt.train > 1 {
            // Faults hit real packets: take the train apart first.
            for part in pkt.split() {
                self.route(part);
            }
            return;
        }
        if self.rng.chance(f.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(f.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let mut pkt = Some(pkt);
        for i in 0..copies {
            let Some(pkt) = (if i + 1 == copies {
                pkt.take()
            } else {
                pkt.clone()
            }) else {
                break;
            };
            let pkt = if self.rng.chance(f.corrupt) {
                match self.corrupt(&pkt) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                pkt
            };
            let mut delay = f.delay_ns + self.rng.below(f.jitter_ns);
            if self.rng.chance(f.reorder) {
                self.stats.reordered += 1;
                delay += self.rng.below(f.reorder_window_ns.max(1));
            }
            let delivery = Delivery { dev, port, pkt };
            if delay == 0 {
                self.ready.push_back(delivery);
            } else {
                self.seq += 1;
                self.delayed.push(Reverse(Timed {
                    at: self.now + delay,
                    seq: self.seq,
                    delivery,
                }));
            }
        }
    }

    /// Serialises the packet to a RoCEv2 frame, flips one bit, and parses it back as the
    /// receiver would: `None` when the ICRC (or the frame parser) rejects it.
    fn corrupt(&mut self, pkt: &Packet) -> Option<Packet> {
        self.stats.corrupted += 1;
        let mut frame = std::mem::take(&mut self.frame);
        let result = match pkt.to_frame(&mut frame) {
            Ok(()) if !frame.is_empty() => {
                let bit = self.rng.below(frame.len() as u64 * 8);
                frame[(bit / 8) as usize] ^= 1 << (bit % 8);
                match Packet::from_frame(&frame) {
                    Ok(Some(mut p)) => {
                        p.flow_label = pkt.flow_label;
                        p.traffic_class = pkt.traffic_class;
                        p.hop_limit = pkt.hop_limit;
                        Some(p)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        self.frame = frame;
        if result.is_none() {
            self.stats.icrc_drops += 1;
        }
        result
    }

    fn kick(&mut self, k: Kick) {
        let now = self.now;
        if let KickKind::Foreign(what) = k.kind {
            if let Some(Some(f)) = self.foreign.get_mut(usize::from(k.dev)) {
                f.dev.kick(&mut f.engine, now, what, &mut self.out);
            }
            return;
        }
        let Some(d) = self.devices.get_mut(usize::from(k.dev)) else {
            return;
        };
        match k.kind {
            KickKind::Qp(qpn) => {
                if let Some(qp) = d.hw.qps.get(qpn) {
                    // A read-modify-write, not a plain store: it orders this clear before the
                    // head read below against the host's head store and `scheduled` swap
                    // (a store could pass the head load, and a post seeing `scheduled` still
                    // set would then be lost until the next kick).
                    qp.sq.db.scheduled.swap(false, Ordering::AcqRel);
                }
                d.engine.doorbell(now, qpn, &mut d.hw, &mut self.out);
            }
            KickKind::Cq(cqn) => d.hw.check_arm(cqn),
            KickKind::Foreign(_) => {}
        }
    }

    /// Hands one packet to the engine of the device it was routed to.
    #[inline]
    fn deliver(&mut self, node: Node, port: u8, pkt: &Packet) {
        let now = self.now;
        match node {
            Node::Soft(dev) => {
                if let Some(d) = self.devices.get_mut(dev) {
                    d.engine.receive(now, port, pkt, &mut d.hw, &mut self.out);
                }
            }
            Node::Foreign(i) => {
                if let Some(Some(f)) = self.foreign.get_mut(i) {
                    f.engine.receive(now, port, pkt, &mut *f.dev, &mut self.out);
                }
            }
        }
    }

    /// Does every piece of work that is due now. Returns whether anything happened.
    pub(crate) fn step(&mut self, kicks: &Receiver<Kick>, overflow: &AtomicBool) -> bool {
        let mut did = false;
        while let Ok(k) = kicks.try_recv() {
            did = true;
            self.kick(k);
        }
        if overflow.swap(false, Ordering::AcqRel) {
            did = true;
            self.rescan();
        }
        let now = self.now;
        for d in &mut self.devices {
            if d.engine.has_work() {
                did = true;
                d.engine.run_work(now, &mut d.hw, &mut self.out);
            }
        }
        for f in self.foreign.iter_mut().flatten() {
            if f.engine.has_work() {
                did = true;
                f.engine.run_work(now, &mut *f.dev, &mut self.out);
            }
            did |= f.dev.poll(&mut f.engine, now, &mut self.out);
        }
        self.route_out();
        while self.delayed.peek().is_some_and(|Reverse(t)| t.at <= now) {
            if let Some(Reverse(t)) = self.delayed.pop() {
                self.ready.push_back(t.delivery);
            }
        }
        let n = self.ready.len();
        for _ in 0..n {
            let Some(Delivery { dev, port, pkt }) = self.ready.pop_front() else {
                break;
            };
            did = true;
            self.stats.delivered += 1;
            self.deliver(dev, port, &pkt);
        }
        if !self.batch.is_empty() {
            did = true;
            let batch = std::mem::replace(&mut self.batch, std::mem::take(&mut self.spare));
            for pkt in &batch {
                let Some(&(dev, port)) = self.routes.get(&pkt.dst_gid) else {
                    self.stats.unroutable += 1;
                    continue;
                };
                self.stats.delivered += 1;
                self.deliver(dev, port, pkt);
            }
            let mut batch = batch;
            batch.clear();
            self.spare = batch;
        }
        for d in &mut self.devices {
            d.engine.flush_acks(&mut self.out);
            if d.engine.poll_timeout().is_some_and(|t| t <= now) {
                did = true;
                d.engine.handle_timeout(now, &mut d.hw, &mut self.out);
            }
        }
        for f in self.foreign.iter_mut().flatten() {
            f.engine.flush_acks(&mut self.out);
            if f.engine.poll_timeout().is_some_and(|t| t <= now) {
                did = true;
                f.engine.handle_timeout(now, &mut *f.dev, &mut self.out);
            }
        }
        self.route_out();
        did
    }

    /// The kick channel overflowed: look at every QP and CQ once.
    fn rescan(&mut self) {
        let now = self.now;
        for d in &mut self.devices {
            let qpns: Vec<u32> = d.hw.qps.iter_mut().map(|(n, _)| n).collect();
            for qpn in qpns {
                d.engine.doorbell(now, qpn, &mut d.hw, &mut self.out);
            }
            let cqns: Vec<u32> = d.hw.cqs.iter_mut().map(|(n, _)| n).collect();
            for cqn in cqns {
                d.hw.check_arm(cqn);
            }
        }
        for f in self.foreign.iter_mut().flatten() {
            f.dev.rescan(&mut f.engine, now, &mut self.out);
        }
    }

    /// The earliest future event (delayed packet or timer).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let packets = self.delayed.peek().map(|Reverse(t)| t.at);
        let timers = self
            .devices
            .iter()
            .map(|d| &d.engine)
            .chain(self.foreign.iter().flatten().map(|f| &f.engine))
            .filter_map(Engine::poll_timeout)
            .min();
        match (packets, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Stepped mode: jumps virtual time to the next event. False when nothing is scheduled.
    pub(crate) fn advance_to_next(&mut self) -> bool {
        if !self.ready.is_empty() || !self.batch.is_empty() {
            return true;
        }
        match self.next_deadline() {
            Some(t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Packets of one message that may travel as one train on this fabric's links.
    pub(crate) fn max_train(&self) -> u32 {
        if self.faults == LinkFaults::NONE {
            MAX_TRAIN
        } else {
            1
        }
    }

    /// Changes the link behaviour (and whether engines may form trains).
    pub(crate) fn set_faults(&mut self, faults: LinkFaults) {
        self.faults = faults;
        let n = self.max_train();
        for d in &mut self.devices {
            d.engine.set_max_train(n);
        }
        for f in self.foreign.iter_mut().flatten() {
            f.engine.set_max_train(n);
        }
    }

    /// Registers the GIDs of a device's ports for routing.
    pub(crate) fn add_routes(&mut self, dev: Node, gids: &[(u8, Gid)]) {
        for &(port, gid) in gids {
            self.routes.insert(gid, (dev, port));
        }
    }

    /// The name of a device on the fabric.
    pub(crate) fn name(&self, node: Node) -> &str {
        match node {
            Node::Soft(i) => self.devices.get(i).map_or("", |d| &d.state.info.name),
            Node::Foreign(i) => self
                .foreign
                .get(i)
                .and_then(Option::as_ref)
                .map_or("", |f| &f.name),
        }
    }
}

//! The simulation: every node on the fabric, the packets in flight, the clock, and the loop
//! that moves them. One `Sim` sits behind the fabric's lock; the same [`Sim::step`] runs on
//! virtual time (stepped mode, advanced by [`Sim::advance_to_next`]) and on the real clock
//! (free-running mode, on the engine thread).
//!
//! Nodes sit in `Arc<Mutex<dyn Node>>` so that each node's typed handle can reach its own
//! state ([`crate::NodeHandle::with`]). Those mutexes are only ever taken with the fabric lock
//! held, so they are never contended; a step takes each node's once and drives the node
//! through the guard (one dynamic call per kick, packet or phase, no lock per packet).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::BufWriter;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crossbeam_channel::Receiver;
use portverbs_hal::types::Gid;
use portverbs_transport::Packet;
use smallvec::SmallVec;

use crate::bottleneck::{self, Bottleneck, PortQueue};
use crate::capture::{CaptureError, PcapCapture};
use crate::faults::{self, FabricStats, Fate, LinkFaults};
use crate::kick::Kick;
use crate::node::Node;
use crate::rng::SplitMix64;

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

/// A node's number on its fabric: its index in [`Sim::nodes`] (never reused).
pub(crate) type NodeId = usize;

/// The routing table: GID → (node, port).
pub(crate) type Routes = HashMap<Gid, (NodeId, u8), BuildHasherDefault<GidHasher>>;

/// The multicast groups: group GID → the (node, port)s with a QP attached to it (each node
/// joins once per port, however many of its QPs are attached; at most one entry per port of
/// the fabric).
pub(crate) type Groups = HashMap<Gid, SmallVec<[(NodeId, u8); 4]>, BuildHasherDefault<GidHasher>>;

/// Where one packet goes: one port (or nowhere), or a copy to every member of a multicast
/// group and the uplink.
enum Targets {
    One(Option<(NodeId, u8)>),
    Many(SmallVec<[(NodeId, u8); 4]>),
}

/// Longest train (packets of one message delivered as one unit) on a fault-free fabric.
pub(crate) const MAX_TRAIN: u32 = 64;

/// A node on the fabric.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Shown by [`crate::Fabric::gids`].
    pub(crate) name: String,
    /// The node; its typed handle holds the same `Arc`.
    pub(crate) node: Arc<Mutex<dyn Node>>,
}

/// Locks a node. Node locks are only ever taken with the fabric lock held, so they are never
/// contended: a `parking_lot` mutex makes each an inline compare-and-swap, without poison
/// bookkeeping (a panic on another thread leaves the node usable: it is plain data that every
/// step re-validates).
#[inline]
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// Every node's guard for one step (`None` for a detached node).
type Guards<'a> = SmallVec<[Option<MutexGuard<'a, dyn Node>>; 8]>;

#[derive(Debug)]
struct Delivery {
    dev: NodeId,
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
    /// Nodes in attach order; `None` once detached (numbers are never reused).
    pub(crate) nodes: Vec<Option<Slot>>,
    /// The kind of every node ever attached, by number (numbers default names per kind).
    pub(crate) kinds: Vec<&'static str>,
    pub(crate) routes: Routes,
    /// The multicast groups the nodes joined ([`crate::NodeCtx::join_mcast`]).
    pub(crate) groups: Groups,
    /// Where packets for GIDs no node owns go: the port that leads off this fabric (a UDP
    /// port onto a real network), if a node claimed it.
    pub(crate) uplink: Option<(NodeId, u8)>,
    ready: VecDeque<Delivery>,
    /// Fault-free fast path: packets delivered in order, by reference, from the buffer the
    /// engines wrote them into (no per-packet moves).
    batch: Vec<Packet>,
    spare: Vec<Packet>,
    delayed: BinaryHeap<Reverse<Timed>>,
    seq: u64,
    pub(crate) faults: LinkFaults,
    /// The output queue model in front of every destination port, if any.
    pub(crate) bottleneck: Option<Bottleneck>,
    /// The output queue of every destination port a packet went to under the bottleneck.
    queues: HashMap<(NodeId, u8), PortQueue>,
    rng: SplitMix64,
    /// The seed the nodes' identifier seeds derive from (a stepped fabric's own seed), or
    /// `None`: each node's is drawn from the OS.
    pub(crate) node_seed: Option<u64>,
    pub(crate) out: Vec<Packet>,
    frame: Vec<u8>,
    pub(crate) stats: FabricStats,
    /// The running packet capture: every packet that leaves a node, written at routing time.
    pub(crate) capture: Option<PcapCapture<BufWriter<File>>>,
    /// Why the last capture stopped on its own (kept until the next start or stop).
    pub(crate) capture_failure: Option<CaptureError>,
    /// Nodes flush their wires at the end of every step (free-running and stepped fabrics);
    /// a manual fabric flushes at the end of a dispatch instead ([`Sim::flush`]).
    pub(crate) flush_each_step: bool,
}

impl Sim {
    pub(crate) fn new(seed: u64, faults: LinkFaults) -> Self {
        Self {
            now: 0,
            nodes: Vec::new(),
            kinds: Vec::new(),
            routes: Routes::default(),
            groups: Groups::default(),
            uplink: None,
            ready: VecDeque::new(),
            batch: Vec::with_capacity(256),
            spare: Vec::with_capacity(256),
            delayed: BinaryHeap::new(),
            seq: 0,
            faults,
            bottleneck: None,
            queues: HashMap::new(),
            rng: SplitMix64::new(seed),
            node_seed: None,
            out: Vec::with_capacity(256),
            frame: Vec::with_capacity(4200),
            stats: FabricStats::default(),
            capture: None,
            capture_failure: None,
            flush_each_step: true,
        }
    }

    /// Every node sends what it batched for a wire of its own ([`Node::flush`]).
    pub(crate) fn flush(&mut self) {
        for s in self.nodes.iter().flatten() {
            lock(&*s.node).flush();
        }
    }

    /// Packets still travelling.
    pub(crate) fn in_flight(&self) -> usize {
        self.ready.len() + self.delayed.len() + self.batch.len()
    }

    /// Hands every packet the engines produced to the links (capturing them first when a
    /// capture runs: what is put on the wire, before the links' faults).
    pub(crate) fn route_out(&mut self) {
        if self.out.is_empty() {
            return;
        }
        if self.capture.is_some() {
            self.capture_out();
        }
        if self.faults == LinkFaults::NONE && self.bottleneck.is_none() && self.ready.is_empty() {
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

    /// Writes every packet of `out` to the capture and flushes it, so that the file is whole
    /// after every routing pass (the embedded fabric of a process is never dropped). A failure
    /// ends the capture and is kept for [`crate::Fabric::capture_error`].
    #[cold]
    #[inline(never)]
    fn capture_out(&mut self) {
        let Some(capture) = self.capture.as_mut() else {
            return;
        };
        let now = self.now;
        let written = self
            .out
            .iter()
            .try_for_each(|pkt| capture.write_packet(now, pkt))
            .and_then(|()| capture.flush());
        if let Err(e) = written {
            self.capture = None;
            self.capture_failure = Some(e);
        }
    }

    /// Where a packet to `gid` goes: the port that owns it (or the uplink); for a multicast
    /// GID (IBA 10.5.2.4), every port that joined the group — the sender's own device
    /// included, whose engine delivers to its attached QPs — and the uplink, which puts the
    /// packet on its network for the group's members there.
    fn targets(&self, gid: &Gid) -> Targets {
        if let Some(&route) = self.routes.get(gid) {
            return Targets::One(Some(route));
        }
        if !gid.is_multicast() {
            return Targets::One(self.uplink);
        }
        let mut all = self.groups.get(gid).cloned().unwrap_or_default();
        if let Some(up) = self.uplink {
            if !all.contains(&up) {
                all.push(up);
            }
        }
        Targets::Many(all)
    }

    fn route(&mut self, pkt: Packet) {
        match self.targets(&pkt.dst_gid) {
            Targets::One(Some((dev, port))) => self.route_to(dev, port, pkt),
            Targets::One(None) => self.stats.unroutable += 1,
            Targets::Many(all) => {
                if all.is_empty() {
                    self.stats.unroutable += 1;
                }
                for (dev, port) in all {
                    self.route_to(dev, port, pkt.clone());
                }
            }
        }
    }

    fn route_to(&mut self, dev: NodeId, port: u8, pkt: Packet) {
        let f = self.faults;
        if f == LinkFaults::NONE && self.bottleneck.is_none() {
            self.ready.push_back(Delivery { dev, port, pkt });
            return;
        }
        if pkt.train > 1 {
            // Faults and queues hit real packets: take the train apart first.
            for part in pkt.split() {
                self.route_to(dev, port, part);
            }
            return;
        }
        let fate = f.decide(&mut self.rng);
        match fate {
            Fate::Lost => {
                self.stats.lost += 1;
                return;
            }
            Fate::Once(_) => {}
            Fate::Twice(..) => self.stats.duplicated += 1,
        }
        let mut pkt = Some(pkt);
        let last = fate.copies().count();
        for (i, copy) in fate.copies().enumerate() {
            let Some(pkt) = (if i + 1 == last {
                pkt.take()
            } else {
                pkt.clone()
            }) else {
                break;
            };
            let pkt = match copy.corrupt {
                Some(draw) => match self.corrupt(&pkt, draw) {
                    Some(p) => p,
                    None => continue,
                },
                None => pkt,
            };
            if copy.reordered {
                self.stats.reordered += 1;
            }
            self.schedule(Delivery { dev, port, pkt }, copy.delay_ns);
        }
    }

    /// Delivers a packet the links' faults let through after `delay` ns: at once, later, or —
    /// behind a bottleneck — through its destination port's output queue, where it may be
    /// dropped (tail drop) or CE-marked, and leaves once the link has serialised it.
    fn schedule(&mut self, mut delivery: Delivery, delay: u64) {
        let at = match self.bottleneck {
            None if delay == 0 => {
                self.ready.push_back(delivery);
                return;
            }
            None => self.now + delay,
            Some(b) => {
                let now = self.now;
                let len = Bottleneck::frame_len(&delivery.pkt);
                let queue = self
                    .queues
                    .entry((delivery.dev, delivery.port))
                    .or_default();
                let queued = queue.backlog(now, &b);
                if queued.saturating_add(len) > b.queue_bytes {
                    self.stats.queue_drops += 1;
                    return;
                }
                let done = queue.push(now, len, &b);
                self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(queued + len);
                if let Some(ecn) = b.ecn {
                    if bottleneck::ecn_capable(&delivery.pkt)
                        && self.rng.chance(ecn.probability(queued))
                    {
                        delivery.pkt.traffic_class |= bottleneck::CE;
                        self.stats.ce_marked += 1;
                    }
                }
                done + delay
            }
        };
        self.seq += 1;
        self.delayed.push(Reverse(Timed {
            at,
            seq: self.seq,
            delivery,
        }));
    }

    /// Corrupts one copy ([`faults::corrupt_packet`]), counting it: `None` when the receiver's
    /// ICRC check (or the frame parser) would drop it.
    fn corrupt(&mut self, pkt: &Packet, draw: u64) -> Option<Packet> {
        self.stats.corrupted += 1;
        let result = faults::corrupt_packet(pkt, draw, &mut self.frame);
        if result.is_none() {
            self.stats.icrc_drops += 1;
        }
        result
    }

    /// Does every piece of work that is due now. Returns whether anything happened.
    ///
    /// Nodes are driven in attach order in every phase: kicks (in the order they were sent),
    /// a rescan after a kick overflow, each node's scheduled work, packet delivery, then each
    /// node's coalesced ACKs and due timers.
    pub(crate) fn step(&mut self, kicks: &Receiver<Kick>, overflow: &AtomicBool) -> bool {
        // The nodes leave `self` for the step, so that their guards and the links can be
        // borrowed together (moving a `Vec` does not allocate).
        let slots = std::mem::take(&mut self.nodes);
        let did = {
            let mut nodes: Guards<'_> = slots
                .iter()
                .map(|s| s.as_ref().map(|s| lock(&*s.node)))
                .collect();
            self.step_nodes(&mut nodes, kicks, overflow)
        };
        self.nodes = slots;
        did
    }

    fn step_nodes(
        &mut self,
        nodes: &mut Guards<'_>,
        kicks: &Receiver<Kick>,
        overflow: &AtomicBool,
    ) -> bool {
        let now = self.now;
        let mut did = false;
        while let Ok(k) = kicks.try_recv() {
            did = true;
            if let Some(Some(n)) = nodes.get_mut(usize::from(k.node)) {
                n.kick(now, k.what, &mut self.out);
            }
        }
        if overflow.swap(false, Ordering::AcqRel) {
            did = true;
            for n in nodes.iter_mut().flatten() {
                n.rescan(now, &mut self.out);
            }
        }
        for n in nodes.iter_mut().flatten() {
            did |= n.run_work(now, &mut self.out);
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
            if let Some(Some(node)) = nodes.get_mut(dev) {
                node.receive(now, port, &pkt, &mut self.out);
            }
        }
        if !self.batch.is_empty() {
            did = true;
            let batch = std::mem::replace(&mut self.batch, std::mem::take(&mut self.spare));
            // Packets of a batch mostly go where the one before went: the route of the last
            // destination is kept (the table cannot change during a step).
            let mut last: Option<(Gid, Option<(NodeId, u8)>)> = None;
            for pkt in &batch {
                let route = match last {
                    Some((gid, route)) if gid == pkt.dst_gid => route,
                    _ => match self.targets(&pkt.dst_gid) {
                        Targets::One(route) => {
                            last = Some((pkt.dst_gid, route));
                            route
                        }
                        Targets::Many(all) => {
                            if all.is_empty() {
                                self.stats.unroutable += 1;
                            }
                            for (dev, port) in all {
                                self.stats.delivered += 1;
                                if let Some(Some(node)) = nodes.get_mut(dev) {
                                    node.receive(now, port, pkt, &mut self.out);
                                }
                            }
                            continue;
                        }
                    },
                };
                let Some((dev, port)) = route else {
                    self.stats.unroutable += 1;
                    continue;
                };
                self.stats.delivered += 1;
                if let Some(Some(node)) = nodes.get_mut(dev) {
                    node.receive(now, port, pkt, &mut self.out);
                }
            }
            let mut batch = batch;
            batch.clear();
            self.spare = batch;
        }
        for n in nodes.iter_mut().flatten() {
            did |= n.run_timers(now, &mut self.out);
        }
        self.route_out();
        if self.flush_each_step {
            for n in nodes.iter_mut().flatten() {
                n.flush();
            }
        }
        // Packets the timers phase produced (coalesced ACKs, retransmissions) are delivered by
        // the next step: say so, or a free-running engine would wait for a kick first.
        did || !self.ready.is_empty() || !self.batch.is_empty()
    }

    /// The earliest future event (delayed packet or timer).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let packets = self.delayed.peek().map(|Reverse(t)| t.at);
        let timers = self
            .nodes
            .iter()
            .flatten()
            .filter_map(|s| lock(&*s.node).next_deadline())
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
        if self.faults == LinkFaults::NONE && self.bottleneck.is_none() {
            MAX_TRAIN
        } else {
            1
        }
    }

    /// Changes the link behaviour (and whether engines may form trains).
    pub(crate) fn set_faults(&mut self, faults: LinkFaults) {
        self.faults = faults;
        self.tell_max_train();
    }

    /// Sets or removes the bottleneck (and whether engines may form trains). The queues start
    /// empty; packets already on their way arrive as scheduled.
    pub(crate) fn set_bottleneck(&mut self, bottleneck: Option<Bottleneck>) {
        self.bottleneck = bottleneck;
        self.queues.clear();
        self.tell_max_train();
    }

    fn tell_max_train(&self) {
        let n = self.max_train();
        for s in self.nodes.iter().flatten() {
            lock(&*s.node).set_max_train(n);
        }
    }

    /// The name of a node on the fabric.
    pub(crate) fn name(&self, node: NodeId) -> &str {
        self.nodes
            .get(node)
            .and_then(Option::as_ref)
            .map_or("", |s| &s.name)
    }
}

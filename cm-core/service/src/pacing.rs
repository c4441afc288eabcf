//! Pacing of the CM's own sends, so that a burst never overruns a peer's QP1 receive queue,
//! and a peer that never answers holds back nobody else's messages.
//!
//! QP1 is UD: a MAD that finds no posted receive at the peer is dropped, and only the
//! sender's retransmission (seconds later) recovers it. A send queue alone does not prevent
//! that (a UD send completes once the datagram has left, whether or not the peer had room),
//! so a window counts what the peer still has to answer: every *request* this device puts on
//! the wire (REQ, REP, DREQ, SIDR_REQ, LAP: the messages the agent waits an answer for) takes
//! a place until the agent's endpoint leaves the state that waits for it (the answer came,
//! or the agent gave up).
//!
//! The window is per peer (per destination GID): at most [`WINDOW`] (128) requests to one
//! peer are on the wire at once, a quarter of the 512 receives a QP1 keeps posted (Linux's
//! MAD layer and this crate alike). The others wait in that peer's queue, in order, and leave
//! as its answers free places. Answers (RTU, DREP, REJ, MRA, SIDR_REP, APR) are never held
//! back, except behind an earlier held MAD of their own endpoint, so the peer sees each
//! connection's messages in the order the agent made them; a new request to a peer that has
//! MADs waiting queues behind them. What sits in a peer's receive queue from us is then at
//! most our window of requests plus the answers to its own window: with both windows at a
//! quarter of QP1's receives, a pair of CMs never overruns each other, whatever the burst.
//! Strangers that never answer (forged requests the application accepted, whose REPs wait
//! for RTUs that never come) fill only their own windows.
//!
//! What is bounded, and what it costs:
//!
//! * Held MADs: at most [`HELD_MAX`] (2^17, about 35 MiB) in all, and of those at most
//!   [`HELD_ANSWERS_MAX`] (1024, about 280 KiB) answers. Requests are the application's own
//!   (its connects, accepts and disconnects: one per endpoint, each with a QP of its own;
//!   `portverbs cmtime -c 100000` holds nearly 100 000 REQs at once); answers are what a
//!   peer's repeated messages can make the agent queue behind a held request. A MAD beyond
//!   either cap is dropped instead of held and counted (`MadCounts::pace_dropped`), as if
//!   lost on the wire: the agent's retransmission (a request) or the peer's (what an answer
//!   answers) recovers it. A retransmission of a request that is still held is merged into
//!   it: the held copy leaves first anyway.
//! * Per-peer tables: a peer has an entry only while it has requests counted in its window
//!   or MADs held. An entry whose window has emptied and which holds nothing is freed when
//!   its last held MAD leaves, else by a sweep, which runs every second and whenever the
//!   number of entries has doubled since the last one (at least 64): an entry outlives its
//!   last answer by about a second, and the entries are at most twice the peers with a
//!   request in flight at the last sweep, plus 64, however fast strangers come. An entry
//!   costs about 130 bytes (with its window's slot in the map of requests on the wire), and
//!   280 bytes per held MAD while it has a queue.
//! * Work: a MAD offered costs a few hash lookups. On each release (each time the device
//!   acts on the agent's outputs) only the peers with held MADs are looked at (a ready
//!   list). A peer's answered requests are freed from the oldest of its window first
//!   (answers mostly come in the order the requests left, so this costs what it frees), and
//!   while a full window's oldest request is still unanswered, one look in 64 goes through
//!   the whole window (at most 128 requests), so a peer that answers out of order, or not at
//!   all, does not keep places that its other answers freed. A sweep looks at the oldest
//!   request of every entry: on growth, its cost is amortised over the entries made since
//!   the last one; once a second, it is at most that many looks.
//!
//! What this does not bound: many peers sending to one device at once (each has its own
//! window toward us), and the peer's own speed at reposting (it reposts each receive as soon
//! as it has handed the MAD to its agent).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::mem::size_of;

use portverbs_cm::wire::{AttrId, MAD_HEADER_LEN, MAD_LEN};
use portverbs_cm::{CmAgent, CmId, CmState, OutMad};
use portverbs_hal::Gid;

/// Requests on the wire at once, per peer.
pub(crate) const WINDOW: usize = 128;

/// Held MADs at most, in all: more than the 100 000 connects `portverbs cmtime -c 100000`
/// starts at once.
pub(crate) const HELD_MAX: usize = 1 << 17;

/// Held answers at most, in all.
pub(crate) const HELD_ANSWERS_MAX: usize = 1024;

/// While a peer's window is full and its oldest request is still unanswered, every this many
/// looks go through all of its requests.
const FULL_SCAN_EVERY: u32 = 64;

/// Peer entries below which no sweep runs on growth.
const SWEEP_FLOOR: usize = 64;

/// The longest between two sweeps, in nanoseconds (one second).
const SWEEP_EVERY_NS: u64 = 1_000_000_000;

/// Where the attribute ID sits in the MAD header.
const ATTR_ID: usize = 16;

/// A MAD held back, classified once.
#[derive(Debug)]
struct Held {
    mad: OutMad,
    /// Its endpoint's local communication ID.
    id: u32,
    /// Its attribute ID.
    attr: u16,
    /// Whether the agent waits an answer for it.
    request: bool,
}

/// What one endpoint has held in its peer's queue.
#[derive(Debug, Clone, Copy, Default)]
struct HeldOf {
    mads: u32,
    /// The attribute of the request among them, if one is (an endpoint waits for one answer
    /// at a time).
    request: Option<u16>,
}

/// One peer's window and queue.
#[derive(Debug, Default)]
struct Peer {
    /// Local communication IDs whose request to this peer is on the wire and may still be
    /// unanswered, oldest first (each also in [`Pacer::on_wire`]).
    order: VecDeque<u32>,
    /// The MADs held back for this peer; none (and no allocation) while nothing waits, so a
    /// stranger's entry is its window alone.
    queue: Option<Box<Queue>>,
    /// Looks at a full window since its last full scan.
    looks: u32,
    /// The agent's move ([`Pacer::moves`]) this window was last pruned at.
    pruned: u64,
}

/// MADs held back for one peer.
#[derive(Debug, Default)]
struct Queue {
    /// Oldest first.
    held: VecDeque<Held>,
    /// Per endpoint, what it has in `held`.
    held_of: HashMap<u32, HeldOf>,
}

/// The send windows and the MADs waiting behind them.
#[derive(Debug)]
pub(crate) struct Pacer {
    peers: HashMap<Gid, Peer>,
    /// Every request counted in a window: its endpoint's local communication ID, and the peer.
    on_wire: HashMap<u32, Gid>,
    /// The peers with held MADs, each once.
    ready: Vec<Gid>,
    tally: Tally,
    /// Counts the times the agent may have moved (a call, a MAD, a timer): a window pruned at
    /// the current count needs no look.
    moves: u64,
    /// Peer entries at which the next sweep runs.
    sweep_at: usize,
    /// When the last sweep ran (the caller's clock, nanoseconds).
    swept_at: u64,
}

/// What is held, and what was.
#[derive(Debug, Default)]
struct Tally {
    /// MADs held now, and answers among them.
    held: usize,
    answers: usize,
    /// MADs that had to wait for a window (a counter, never reset).
    paced: u64,
    /// MADs dropped at the caps on held MADs (a counter, never reset).
    dropped: u64,
}

impl Default for Pacer {
    fn default() -> Self {
        Self {
            peers: HashMap::new(),
            on_wire: HashMap::new(),
            ready: Vec::new(),
            tally: Tally::default(),
            moves: 1,
            sweep_at: SWEEP_FLOOR,
            swept_at: 0,
        }
    }
}

/// Whether the MAD is a request the agent waits an answer for, its attribute ID, and its
/// endpoint's local communication ID (the first word after the header in every CM message).
fn classify(mad: &[u8; MAD_LEN]) -> (bool, u16, u32) {
    let attr = u16::from_be_bytes([mad[ATTR_ID], mad[ATTR_ID + 1]]);
    let request = matches!(
        AttrId::from_u16(attr),
        Some(AttrId::Req | AttrId::Rep | AttrId::Dreq | AttrId::SidrReq | AttrId::Lap)
    );
    let at = MAD_HEADER_LEN;
    let id = u32::from_be_bytes([mad[at], mad[at + 1], mad[at + 2], mad[at + 3]]);
    (request, attr, id)
}

/// Whether an endpoint in `state` still waits for the peer to answer its last request.
fn waits(state: Option<CmState>) -> bool {
    matches!(
        state,
        Some(
            CmState::ReqSent
                | CmState::MraReqRcvd
                | CmState::RepSent
                | CmState::MraRepRcvd
                | CmState::DreqSent
                | CmState::SidrReqSent
        )
    )
}

fn waits_id(agent: &CmAgent, id: u32) -> bool {
    waits(agent.state(CmId::from_comm_id(id)))
}

/// A hash map's bytes by capacity (one control byte per bucket, 8/7 of the capacity).
fn map_bytes<K, V>(m: &HashMap<K, V>) -> usize {
    m.capacity() * 8 / 7 * (size_of::<(K, V)>() + 1)
}

/// Queues `h` for `peer`, unless a cap is reached (then it is dropped and counted).
fn hold(peer: &mut Peer, ready: &mut Vec<Gid>, t: &mut Tally, h: Held) {
    if t.held >= HELD_MAX || (!h.request && t.answers >= HELD_ANSWERS_MAX) {
        t.dropped += 1;
        return;
    }
    let queue = peer.queue.get_or_insert_with(|| {
        ready.push(h.mad.to);
        Box::default()
    });
    let of = queue.held_of.entry(h.id).or_default();
    of.mads += 1;
    if h.request {
        of.request = Some(h.attr);
    } else {
        t.answers += 1;
    }
    t.held += 1;
    t.paced += 1;
    queue.held.push_back(h);
}

impl Peer {
    /// Frees the places of this peer's answered requests: the oldest ones first, and all of
    /// them one look in [`FULL_SCAN_EVERY`] while the window stays full.
    fn prune(&mut self, agent: &CmAgent, on_wire: &mut HashMap<u32, Gid>, moves: u64) {
        if self.pruned == moves {
            return;
        }
        self.prune_front(agent, on_wire);
        if self.order.len() < WINDOW {
            self.pruned = moves;
            return;
        }
        self.looks += 1;
        if self.looks >= FULL_SCAN_EVERY {
            self.looks = 0;
            self.order.retain(|&id| {
                let w = waits_id(agent, id);
                if !w {
                    on_wire.remove(&id);
                }
                w
            });
            self.pruned = moves;
        }
    }

    /// Frees the places of answered requests at the front of the window.
    fn prune_front(&mut self, agent: &CmAgent, on_wire: &mut HashMap<u32, Gid>) {
        while let Some(&id) = self.order.front() {
            if waits_id(agent, id) {
                break;
            }
            self.order.pop_front();
            on_wire.remove(&id);
        }
    }

    /// Takes a window place for a request of endpoint `id`, if there is one.
    fn admit(
        &mut self,
        gid: Gid,
        agent: &CmAgent,
        on_wire: &mut HashMap<u32, Gid>,
        moves: u64,
        id: u32,
    ) -> bool {
        if self.order.len() >= WINDOW {
            self.prune(agent, on_wire, moves);
            if self.order.len() >= WINDOW {
                return false;
            }
        }
        self.order.push_back(id);
        on_wire.insert(id, gid);
        true
    }

    fn bytes(&self) -> usize {
        self.order.capacity() * size_of::<u32>()
            + self.queue.as_ref().map_or(0, |q| {
                size_of::<Queue>() + q.held.capacity() * size_of::<Held>() + map_bytes(&q.held_of)
            })
    }

    /// Whether MADs are held for this peer.
    fn holds(&self) -> bool {
        self.queue.is_some()
    }
}

impl Pacer {
    /// Bytes held by the windows' tables and queues, by capacity.
    pub(crate) fn bytes(&self) -> usize {
        map_bytes(&self.peers)
            + map_bytes(&self.on_wire)
            + self.ready.capacity() * size_of::<Gid>()
            + self.peers.values().map(Peer::bytes).sum::<usize>()
    }

    /// MADs held back now.
    pub(crate) fn held(&self) -> usize {
        self.tally.held
    }

    /// MADs that had to wait for a window, since the device was opened.
    pub(crate) fn paced(&self) -> u64 {
        self.tally.paced
    }

    /// MADs dropped at the caps on held MADs, since the device was opened.
    pub(crate) fn dropped(&self) -> u64 {
        self.tally.dropped
    }

    /// Whether a peer has an entry that a later [`Pacer::tick`] may sweep.
    pub(crate) fn has_peers(&self) -> bool {
        !self.peers.is_empty()
    }

    /// Peers with an entry now (a window with requests in it, or MADs held).
    #[cfg(test)]
    fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Notes that the agent handled input (a MAD, a timer, a call): requests may have been
    /// answered since.
    pub(crate) fn agent_moved(&mut self) {
        self.moves += 1;
    }

    /// A MAD the agent wants sent: `Some` when it may go now, `None` when it is held (or
    /// merged into a held copy, or dropped at a cap).
    pub(crate) fn offer(&mut self, agent: &CmAgent, m: OutMad) -> Option<OutMad> {
        let (request, attr, id) = classify(&m.mad);
        let to = m.to;
        let Some(peer) = self.peers.get_mut(&to) else {
            // No window and nothing held for this peer: an answer goes, and so does a
            // request, which opens the window.
            if request && !self.on_wire.contains_key(&id) {
                let mut peer = Peer::default();
                peer.order.push_back(id);
                self.on_wire.insert(id, to);
                self.peers.insert(to, peer);
            }
            return Some(m);
        };
        let held = Held {
            mad: m,
            id,
            attr,
            request,
        };
        if let Some(of) = peer.queue.as_ref().and_then(|q| q.held_of.get(&id)) {
            if request && of.request == Some(attr) {
                // A retransmission of a request that has not left yet.
                return None;
            }
            // Behind its endpoint's earlier MADs.
            hold(peer, &mut self.ready, &mut self.tally, held);
            return None;
        }
        if !request || self.on_wire.contains_key(&id) {
            // An answer, or a retransmission whose place is taken already.
            return Some(held.mad);
        }
        if !peer.holds() && peer.admit(to, agent, &mut self.on_wire, self.moves, id) {
            return Some(held.mad);
        }
        hold(peer, &mut self.ready, &mut self.tally, held);
        None
    }

    /// Moves the held MADs that may go now to `out`: for each peer with MADs held, oldest
    /// first, up to the first request its window has no room for. Then frees the entries of
    /// peers that have nothing left, when a sweep is due.
    pub(crate) fn release(&mut self, agent: &CmAgent, out: &mut VecDeque<OutMad>) {
        let mut i = 0;
        while let Some(&gid) = self.ready.get(i) {
            let Some(peer) = self.peers.get_mut(&gid) else {
                self.ready.swap_remove(i);
                continue;
            };
            let Some(mut queue) = peer.queue.take() else {
                self.ready.swap_remove(i);
                continue;
            };
            while let Some(front) = queue.held.front() {
                let (request, id) = (front.request, front.id);
                if request
                    && !self.on_wire.contains_key(&id)
                    && !peer.admit(gid, agent, &mut self.on_wire, self.moves, id)
                {
                    break;
                }
                let Some(h) = queue.held.pop_front() else {
                    break;
                };
                if let Entry::Occupied(mut e) = queue.held_of.entry(h.id) {
                    let of = e.get_mut();
                    of.mads = of.mads.saturating_sub(1);
                    if h.request {
                        of.request = None;
                    }
                    if of.mads == 0 {
                        e.remove();
                    }
                }
                self.tally.held -= 1;
                if !h.request {
                    self.tally.answers -= 1;
                }
                out.push_back(h.mad);
            }
            if queue.held.is_empty() {
                // The queue and its memory go with its last MAD.
                self.ready.swap_remove(i);
                if peer.order.is_empty() {
                    self.peers.remove(&gid);
                }
            } else {
                peer.queue = Some(queue);
                i += 1;
            }
        }
        if self.peers.len() >= self.sweep_at {
            self.sweep(agent);
        }
    }

    /// Sweeps when the last sweep is a second old (`now` in nanoseconds, any monotonic
    /// origin), so that a peer's entry outlives its last answer by about a second at most,
    /// for the cost of a look at each entry per second.
    pub(crate) fn tick(&mut self, agent: &CmAgent, now: u64) {
        if now.saturating_sub(self.swept_at) >= SWEEP_EVERY_NS {
            self.swept_at = now;
            if !self.peers.is_empty() {
                self.sweep(agent);
            }
        }
    }

    /// Frees the answered requests at the front of every window, and the entries of peers
    /// left with nothing.
    fn sweep(&mut self, agent: &CmAgent) {
        let on_wire = &mut self.on_wire;
        self.peers.retain(|_, peer| {
            peer.prune_front(agent, on_wire);
            !peer.order.is_empty() || peer.holds()
        });
        let live = self.peers.len();
        self.sweep_at = (2 * live).max(SWEEP_FLOOR);
        if self.peers.capacity() > 2 * self.sweep_at {
            self.peers.shrink_to(self.sweep_at);
        }
        if self.on_wire.capacity() > 4 * (self.on_wire.len() + SWEEP_FLOOR) {
            self.on_wire
                .shrink_to(2 * (self.on_wire.len() + SWEEP_FLOOR));
        }
        if self.ready.capacity() > 4 * (self.ready.len() + SWEEP_FLOOR) {
            self.ready.shrink_to(2 * (self.ready.len() + SWEEP_FLOOR));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portverbs_cm::wire::AttrId;
    use portverbs_cm::{AcceptParams, AgentConfig, CmEvent, CmOutput, ConnectParams, PathParams};

    const SERVICE: u64 = 0x0000_0000_0106_1d2f;
    const MS: u64 = 1_000_000;

    fn gid(n: u32) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&(0x0a00_0000 | n).to_be_bytes());
        Gid(g)
    }

    const ME: u32 = 1;

    fn agent(n: u32) -> CmAgent {
        CmAgent::new(AgentConfig::new(
            0x0200_00ff_fe00_0000 | u64::from(n),
            0x3c5a_0000 ^ n,
        ))
    }

    /// The MADs the agent wants sent, in order (other outputs dropped).
    fn sends(a: &mut CmAgent) -> Vec<OutMad> {
        let mut v = Vec::new();
        while let Some(o) = a.poll_output() {
            if let CmOutput::Send(m) = o {
                v.push(m);
            }
        }
        v
    }

    fn params(from: u32, to: u32, qpn: u32) -> ConnectParams {
        ConnectParams::new(SERVICE, qpn, 0x100, PathParams::roce(gid(from), gid(to)))
    }

    /// Starts a connect from us to `peer`; its endpoint and REQ.
    fn connect(a: &mut CmAgent, now: u64, peer: u32, qpn: u32) -> (CmId, OutMad) {
        let id = a.create_id().unwrap();
        a.connect(now, id, &params(ME, peer, qpn), &[]).unwrap();
        let mut m = sends(a);
        assert_eq!(m.len(), 1);
        (id, m.remove(0))
    }

    fn attr(m: &OutMad) -> u16 {
        classify(&m.mad).1
    }

    /// The pacer as the engine drives it: what the agent moved is released, then its MADs
    /// are offered; what may go is returned.
    fn drive(p: &mut Pacer, a: &mut CmAgent) -> Vec<OutMad> {
        let mut out = VecDeque::new();
        p.agent_moved();
        p.release(a, &mut out);
        for m in sends(a) {
            if let Some(m) = p.offer(a, m) {
                out.push_back(m);
            }
        }
        out.into()
    }

    /// A silent peer (its REQs never answered) has its window full and REQs waiting; another
    /// peer's REQ and a REP to a third leave at once, and the silent peer's queue does not
    /// move until one of its own requests is done with.
    #[test]
    fn a_peer_that_never_answers_delays_nobody_else() {
        const SILENT: u32 = 7;
        let mut me = agent(ME);
        let mut p = Pacer::default();
        let mut ids = Vec::new();
        for i in 0..WINDOW as u32 + 20 {
            let (id, req) = connect(&mut me, 0, SILENT, 0x1000 + i);
            ids.push(id);
            let went = p.offer(&me, req).is_some();
            assert_eq!(went, (i as usize) < WINDOW, "REQ {i}");
        }
        assert_eq!((p.held(), p.paced()), (20, 20));
        // Another peer's REQ goes at once.
        let (_, req) = connect(&mut me, 0, 8, 0x2000);
        assert!(
            p.offer(&me, req).is_some(),
            "a REQ to another peer was held"
        );
        // So does a REP to a third peer that connects to us.
        let listener = me.create_id().unwrap();
        me.listen(listener, SERVICE).unwrap();
        let mut c = agent(9);
        let cid = c.create_id().unwrap();
        c.connect(0, cid, &params(9, ME, 0x3000), &[]).unwrap();
        let creq = sends(&mut c).remove(0);
        me.handle_mad(0, gid(9), &creq.mad).unwrap();
        let mut incoming = None;
        while let Some(o) = me.poll_output() {
            if let CmOutput::Event(CmEvent::ConnectRequest { id, .. }) = o {
                incoming = Some(id);
            }
        }
        me.accept(0, incoming.unwrap(), &AcceptParams::new(0x3001, 0x200), &[])
            .unwrap();
        let out = drive(&mut p, &mut me);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((attr(&out[0]), out[0].to), (AttrId::Rep.to_u16(), gid(9)));
        assert_eq!(p.held(), 20, "the silent peer's queue moved");
        // One of the silent peer's requests is done with (here: given up): one waiting REQ
        // takes its place.
        me.destroy(0, ids[0]).unwrap();
        let out = drive(&mut p, &mut me);
        let attrs: Vec<u16> = out.iter().map(attr).collect();
        assert_eq!(
            attrs,
            [AttrId::Req.to_u16(), AttrId::Rej.to_u16()],
            "{out:?}"
        );
        assert_eq!(classify(&out[0].mad).2, ids[WINDOW].comm_id());
        assert_eq!(p.held(), 19);
    }

    /// An endpoint's answer never overtakes its own held request, and a retransmission of a
    /// held request is merged into it.
    #[test]
    fn an_endpoints_messages_leave_in_order() {
        const PEER: u32 = 7;
        let mut me = agent(ME);
        let mut p = Pacer::default();
        let mut ids = Vec::new();
        for i in 0..WINDOW as u32 + 2 {
            let (id, req) = connect(&mut me, 0, PEER, 0x1000 + i);
            ids.push(id);
            let _ = p.offer(&me, req);
        }
        assert_eq!(p.held(), 2);
        // Every REQ is retransmitted: the held ones are not held twice.
        let later = 60_000 * MS;
        me.handle_timeout(later);
        let out = drive(&mut p, &mut me);
        assert_eq!(out.len(), WINDOW, "the REQs on the wire are retransmitted");
        assert_eq!(p.held(), 2);
        // The last endpoint gives up while its REQ is held: its REJ waits behind it.
        let last = ids[WINDOW + 1];
        me.destroy(later, last).unwrap();
        assert!(drive(&mut p, &mut me).is_empty());
        assert_eq!(p.held(), 3);
        // Two places free up: the two held REQs leave, then the REJ, in the agent's order.
        me.destroy(later, ids[0]).unwrap();
        me.destroy(later, ids[1]).unwrap();
        let out = drive(&mut p, &mut me);
        let got: Vec<(u16, u32)> = out.iter().map(|m| (attr(m), classify(&m.mad).2)).collect();
        let (req, rej) = (AttrId::Req.to_u16(), AttrId::Rej.to_u16());
        let want = [
            (req, ids[WINDOW].comm_id()),
            (req, last.comm_id()),
            (rej, last.comm_id()),
        ];
        for w in want {
            assert!(got.contains(&w), "{w:?} missing from {got:?}");
        }
        let at = |w| got.iter().position(|g| *g == w).unwrap();
        assert!(at(want[1]) < at(want[2]), "{got:?}");
        assert_eq!(p.held(), 0);
    }

    /// Answers held behind held requests stop at their cap; past it they are dropped and
    /// counted.
    #[test]
    fn held_answers_are_capped() {
        let mut me = agent(ME);
        let mut p = Pacer::default();
        let mut held_req = None;
        for i in 0..=WINDOW as u32 {
            let (_, req) = connect(&mut me, 0, 7, 0x1000 + i);
            if p.offer(&me, req.clone()).is_none() {
                held_req = Some(req);
            }
        }
        let mut rtu = held_req.unwrap();
        rtu.mad[ATTR_ID..ATTR_ID + 2].copy_from_slice(&AttrId::Rtu.to_u16().to_be_bytes());
        for _ in 0..HELD_ANSWERS_MAX + 10 {
            assert!(p.offer(&me, rtu.clone()).is_none());
        }
        assert_eq!(p.held(), 1 + HELD_ANSWERS_MAX);
        assert_eq!(p.dropped(), 10);
    }

    /// Entries of peers whose requests are done with are freed: 200 strangers each with a
    /// request on the wire, all given up, then 100 more: what is left is the newcomers', and
    /// nothing a second after theirs are done with too.
    #[test]
    fn peers_that_are_done_leave_no_entry() {
        let mut me = agent(ME);
        let mut p = Pacer::default();
        let mut ids = Vec::new();
        for k in 0..200u32 {
            ids.push(me.create_id().unwrap());
            let id = ids[ids.len() - 1];
            me.connect(0, id, &params(ME, 1000 + k, 0x1000 + k), &[])
                .unwrap();
            assert_eq!(drive(&mut p, &mut me).len(), 1);
        }
        assert_eq!(p.peers(), 200);
        let busy = p.bytes();
        for id in ids {
            me.destroy(0, id).unwrap();
        }
        drive(&mut p, &mut me);
        let mut newcomers = Vec::new();
        for k in 0..100u32 {
            let (id, req) = connect(&mut me, 0, 5000 + k, 0x5000 + k);
            newcomers.push(id);
            assert!(p.offer(&me, req).is_some());
            drive(&mut p, &mut me);
        }
        assert!(p.peers() <= 100, "{} peer entries", p.peers());
        assert!(
            p.bytes() <= busy,
            "{} bytes after, {busy} before",
            p.bytes()
        );
        // Once their requests are done with, a second later nothing is left.
        for id in newcomers {
            me.destroy(0, id).unwrap();
        }
        drive(&mut p, &mut me);
        p.tick(&me, 999 * MS);
        assert!(p.peers() > 0, "a sweep before the second was up");
        p.tick(&me, 1000 * MS);
        assert_eq!((p.peers(), p.on_wire.len()), (0, 0));
    }
}

//! Pacing of the CM's own sends, so that a burst never overruns a peer's QP1 receive queue.
//!
//! QP1 is UD: a MAD that finds no posted receive at the peer is dropped, and only the
//! sender's retransmission (seconds later) recovers it. A send queue alone does not prevent
//! that (a UD send completes once the datagram has left, whether or not the peer had room),
//! so the window here counts what the peer still has to answer: every *request* this device
//! puts on the wire (REQ, REP, DREQ, SIDR_REQ, LAP: the messages the agent waits an answer
//! for) takes a place until the agent's endpoint leaves the state that waits for it (the
//! answer came, or the agent gave up). At most [`WINDOW`] requests are on the wire at once;
//! the others wait here, in order, and leave as answers free places. Answers (RTU, DREP,
//! REJ, MRA, SIDR_REP, APR) are never held back, except behind an earlier held MAD of their
//! own endpoint, so the peer sees each connection's messages in the order the agent made
//! them. What sits in a peer's receive queue from us is then at most our window of requests
//! plus the answers to its own window: with both windows at a quarter of QP1's 512
//! receives, a pair of CMs never overruns each other, whatever the burst.
//!
//! What this does not bound: many peers sending to one device at once (each has its own
//! window), and the peer's own speed at reposting (it reposts each receive as soon as it has
//! handed the MAD to its agent).

use std::collections::{HashMap, HashSet, VecDeque};

use portverbs_cm::wire::{AttrId, MAD_HEADER_LEN};
use portverbs_cm::{CmAgent, CmId, CmState, OutMad};

/// Requests on the wire at once, per device.
pub(crate) const WINDOW: usize = 128;

/// While the window is full and its oldest request is still unanswered, every this many
/// looks go through all of its requests (a peer that answers out of order, or not at all,
/// must not hold the others' places).
const FULL_SCAN_EVERY: u32 = 64;

/// Held MADs whose room an empty queue keeps after a burst.
const SHRINK_ABOVE: usize = 256;

/// Where the attribute ID sits in the MAD header.
const ATTR_ID: usize = 16;

/// The send window and the MADs waiting behind it.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// Local communication IDs whose request is on the wire and not yet answered.
    awaiting: HashSet<u32>,
    /// The same, oldest first (entries already gone from `awaiting` are skipped).
    order: VecDeque<u32>,
    /// Looks at a full window since the last full scan.
    looks: u32,
    /// MADs held back, oldest first.
    held: VecDeque<OutMad>,
    /// How many MADs of each endpoint are in `held`.
    held_per_id: HashMap<u32, u32>,
    /// Whether the agent may have changed since `awaiting` was last pruned.
    stale: bool,
    /// MADs that had to wait for the window (a counter, never reset).
    pub(crate) paced: u64,
}

/// Whether the MAD is a request the agent waits an answer for, and its endpoint's local
/// communication ID (the first word after the header in every CM message).
fn classify(m: &OutMad) -> (bool, u32) {
    let attr = u16::from_be_bytes([m.mad[ATTR_ID], m.mad[ATTR_ID + 1]]);
    let request = matches!(
        AttrId::from_u16(attr),
        Some(AttrId::Req | AttrId::Rep | AttrId::Dreq | AttrId::SidrReq | AttrId::Lap)
    );
    let at = MAD_HEADER_LEN;
    let id = u32::from_be_bytes([m.mad[at], m.mad[at + 1], m.mad[at + 2], m.mad[at + 3]]);
    (request, id)
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

impl Pacer {
    /// Bytes held by the window's tables and queue, by capacity.
    pub(crate) fn bytes(&self) -> usize {
        use std::mem::size_of;
        self.awaiting.capacity() * 8 / 7 * (size_of::<u32>() + 1)
            + self.order.capacity() * size_of::<u32>()
            + self.held.capacity() * size_of::<OutMad>()
            + self.held_per_id.capacity() * 8 / 7 * (size_of::<(u32, u32)>() + 1)
    }

    /// MADs held back now.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Notes that the agent handled input (a MAD, a timer, a call): requests may have been
    /// answered since.
    pub(crate) fn agent_moved(&mut self) {
        self.stale = true;
    }

    /// Frees the places of answered requests: the oldest ones first (answers mostly come in
    /// the order the requests left, so this costs what it frees), and all of them now and
    /// then while the oldest is still waiting.
    fn prune(&mut self, agent: &CmAgent) {
        if !self.stale {
            return;
        }
        while let Some(&id) = self.order.front() {
            if self.awaiting.contains(&id) && waits(agent.state(CmId::from_comm_id(id))) {
                break;
            }
            self.order.pop_front();
            self.awaiting.remove(&id);
        }
        if self.awaiting.len() < WINDOW {
            self.stale = false;
            return;
        }
        self.looks += 1;
        if self.looks >= FULL_SCAN_EVERY {
            self.looks = 0;
            self.awaiting
                .retain(|&id| waits(agent.state(CmId::from_comm_id(id))));
            let awaiting = &self.awaiting;
            self.order.retain(|id| awaiting.contains(id));
            self.stale = false;
        }
    }

    /// Whether a request of endpoint `id` may go on the wire now; takes its place if so.
    fn admit(&mut self, agent: &CmAgent, id: u32) -> bool {
        if self.awaiting.contains(&id) {
            // A retransmission: its place is taken already.
            return true;
        }
        if self.awaiting.len() >= WINDOW {
            self.prune(agent);
        }
        if self.awaiting.len() < WINDOW && self.awaiting.insert(id) {
            self.order.push_back(id);
            return true;
        }
        false
    }

    fn hold(&mut self, m: OutMad, id: u32) {
        *self.held_per_id.entry(id).or_insert(0) += 1;
        self.held.push_back(m);
        self.paced += 1;
    }

    /// A MAD the agent wants sent: `Some` when it may go now, `None` when it is held.
    pub(crate) fn offer(&mut self, agent: &CmAgent, m: OutMad) -> Option<OutMad> {
        let (request, id) = classify(&m);
        if self.held_per_id.contains_key(&id) || (request && !self.admit(agent, id)) {
            self.hold(m, id);
            return None;
        }
        Some(m)
    }

    /// Moves the held MADs that may go now to `out`, oldest first, stopping at the first
    /// request the window has no room for.
    pub(crate) fn release(&mut self, agent: &CmAgent, out: &mut VecDeque<OutMad>) {
        if self.held.is_empty() && self.held.capacity() > SHRINK_ABOVE {
            // A burst is over: its queue does not keep the memory.
            self.held.shrink_to(SHRINK_ABOVE);
            self.held_per_id.shrink_to(SHRINK_ABOVE);
        }
        while let Some(m) = self.held.front() {
            let (request, id) = classify(m);
            if request && !self.admit(agent, id) {
                return;
            }
            if let Some(m) = self.held.pop_front() {
                out.push_back(m);
            }
            if let Some(n) = self.held_per_id.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.held_per_id.remove(&id);
                }
            }
        }
    }
}

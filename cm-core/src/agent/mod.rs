//! The CM agent of one port: the endpoint table, the lookup maps Linux keeps (listeners by
//! service ID, passive connections by remote communication ID + CA GUID and by remote QPN +
//! CA GUID, SIDR requests by request ID + source), the timer heap and the output queue.
//!
//! Driving it: feed API calls, received MADs ([`CmAgent::handle_mad`]) and expired timers
//! ([`CmAgent::handle_timeout`]) with the current time in nanoseconds (never going backwards);
//! after each, drain [`CmAgent::poll_output`] in order; then sleep until
//! [`CmAgent::poll_timeout`].

mod api;
mod conn;
mod recv;
mod table;
mod teardown;
mod timer;
mod types;

pub use types::{
    AcceptParams, CmEvent, CmId, CmOutput, CmState, ConnectParams, ConnectRequest, OutMad,
    PathParams, QpAction, QpTarget, RtrAttrs, RtsAttrs, SidrParams, Transport,
};

use std::collections::{BinaryHeap, HashMap, VecDeque};

use portverbs_hal::Gid;

use crate::wire::{CmMessage, MAD_LEN, Mad};
use table::Table;

/// Outputs whose room an empty output queue keeps after a burst.
const OUT_KEEP: usize = 64;

/// Per-port settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentConfig {
    /// Our CA (node) GUID, sent in REQ/REP and as the ARI of a REJ Timeout.
    pub ca_guid: u64,
    /// XORed into every communication ID (Linux uses a random value chosen at load, so IDs
    /// differ across restarts). The caller supplies it: the core has no randomness.
    pub comm_id_salt: u32,
    /// Our CA ACK delay (REP Target ACK Delay; rxe: 15).
    pub ca_ack_delay: u8,
    /// `Some(t)`: answer a REQ with a delayed MRA of service timeout `t`, as rdma_cm does
    /// (sent only when a duplicate REQ shows the peer is waiting; state MRA_REQ_SENT).
    /// `None`: no MRA (state REQ_RCVD).
    pub request_mra_timeout: Option<u8>,
}

impl AgentConfig {
    /// rdma_cm's behaviour: CA ACK delay 15, delayed MRA with service timeout 20.
    pub const fn new(ca_guid: u64, comm_id_salt: u32) -> Self {
        Self {
            ca_guid,
            comm_id_salt,
            ca_ack_delay: 15,
            request_mra_timeout: Some(20),
        }
    }
}

/// Counters of what the agent dropped or answered on its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// MADs that failed to parse.
    pub malformed: u64,
    /// Well-formed messages that matched no endpoint in a state that takes them.
    pub unmatched: u64,
    /// Duplicates recognised (REQ, REP, RTU, DREQ, MRA).
    pub duplicates: u64,
    /// Retransmissions sent.
    pub retransmits: u64,
    /// Messages that matched an endpoint by their communication IDs but came from another
    /// source GID than the endpoint's peer: dropped (a forged or misrouted MAD).
    pub foreign_source: u64,
    /// Connection requests withdrawn unanswered once their sender must have given up (see
    /// the crate docs: what is bounded).
    pub withdrawn: u64,
}

/// The IB CM of one port, sans-IO.
///
/// Calling order: feed API calls, received MADs ([`CmAgent::handle_mad`]) and expired timers
/// ([`CmAgent::handle_timeout`]) with the current time in nanoseconds, which must never go
/// backwards; after each, drain [`CmAgent::poll_output`] and act on the outputs in order
/// (send the MAD, apply the QP transition, deliver the event); then wait until
/// [`CmAgent::poll_timeout`] or the next MAD. Endpoints are addressed by [`CmId`] handles;
/// each call does work bounded by its own endpoint, except `handle_timeout`, bounded by the
/// timers due.
#[derive(Debug)]
pub struct CmAgent {
    cfg: AgentConfig,
    table: Table,
    listeners: HashMap<u64, u32>,
    /// Passive endpoints by (remote communication ID, remote CA GUID): duplicate REQs.
    by_remote: HashMap<(u32, u64), u32>,
    /// Connections by (remote QPN, remote CA GUID): stale connections.
    by_remote_qpn: HashMap<(u32, u64), u32>,
    /// SIDR_REQs being answered by (request ID, source GID).
    by_sidr: HashMap<(u32, Gid), u32>,
    timers: BinaryHeap<core::cmp::Reverse<(u64, u32, u32)>>,
    out: VecDeque<CmOutput>,
    hi_tid: u32,
    stats: AgentStats,
}

impl CmAgent {
    /// An agent with no endpoints.
    pub fn new(cfg: AgentConfig) -> Self {
        Self {
            cfg,
            table: Table::new(cfg.comm_id_salt),
            listeners: HashMap::new(),
            by_remote: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            by_sidr: HashMap::new(),
            timers: BinaryHeap::new(),
            out: VecDeque::new(),
            hi_tid: 1,
            stats: AgentStats::default(),
        }
    }

    /// The next output, in the order the caller must act on them.
    pub fn poll_output(&mut self) -> Option<CmOutput> {
        let next = self.out.pop_front();
        if next.is_none() && self.out.capacity() > OUT_KEEP {
            // A burst (hundreds of MADs handled in one round) leaves no lasting footprint.
            self.out.shrink_to(OUT_KEEP);
        }
        next
    }

    /// Endpoints held: everything not destroyed, plus destroyed endpoints still in TIMEWAIT.
    pub fn live_endpoints(&self) -> usize {
        self.table.live()
    }

    /// Entries in the lookup maps (listeners, duplicate, stale and SIDR keys): zero when
    /// nothing is live.
    pub fn map_entries(&self) -> usize {
        self.listeners.len() + self.by_remote.len() + self.by_remote_qpn.len() + self.by_sidr.len()
    }

    /// An upper estimate of the memory the agent's tables hold, in bytes: the slab, the
    /// lookup maps, the timer heap and the output queue, by capacity (the CM's budget is
    /// 2 KiB per connection).
    pub fn state_bytes(&self) -> usize {
        use core::mem::size_of;
        // hashbrown: one control byte per bucket besides the entry; capacity() is 7/8 of the
        // buckets, so count 8/7 of it.
        fn map<K, V>(m: &HashMap<K, V>) -> usize {
            m.capacity() * 8 / 7 * (size_of::<(K, V)>() + 1)
        }
        self.table.bytes()
            + map(&self.listeners)
            + map(&self.by_remote)
            + map(&self.by_remote_qpn)
            + map(&self.by_sidr)
            + self.timers.capacity() * size_of::<(u64, u32, u32)>()
            + self.out.capacity() * size_of::<CmOutput>()
    }

    /// What was dropped or answered without the application.
    pub fn stats(&self) -> AgentStats {
        self.stats
    }

    /// The state of a live endpoint.
    pub fn state(&self, id: CmId) -> Option<CmState> {
        let index = self.table.by_handle(id)?;
        self.table.conn(index).map(|c| c.state)
    }

    fn next_tid(&mut self, local: CmId) -> u64 {
        let hi = self.hi_tid;
        self.hi_tid = self.hi_tid.wrapping_add(1);
        (u64::from(hi) << 32) | u64::from(local.0)
    }

    fn send(&mut self, to: Gid, tid: u64, msg: CmMessage) -> [u8; MAD_LEN] {
        let mad = Mad::new(tid, msg).emit();
        self.out
            .push_back(CmOutput::Send(types::OutMad { to, mad }));
        mad
    }

    fn send_raw(&mut self, to: Gid, mad: [u8; MAD_LEN]) {
        self.out
            .push_back(CmOutput::Send(types::OutMad { to, mad }));
    }

    /// Delivers `ev` unless the application destroyed the endpoint it is about.
    fn event(&mut self, index: u32, ev: CmEvent) {
        if self.table.conn(index).is_some_and(|c| c.user) {
            self.out.push_back(CmOutput::Event(ev));
        }
    }

    fn qp(&mut self, index: u32, target: QpTarget) {
        let Some(c) = self.table.conn(index) else {
            return;
        };
        if c.user {
            let action = QpAction {
                id: self.table.comm_id(index),
                qpn: c.local_qpn,
                target,
            };
            self.out.push_back(CmOutput::Qp(action));
        }
    }

    /// The one transition funnel: every state change goes through here.
    fn set_state(&mut self, index: u32, new: CmState) {
        let Some(c) = self.table.conn(index) else {
            return;
        };
        let (old, user) = (c.state, c.user);
        tracing::trace!(id = ?self.table.comm_id(index), "{old} => {new}");
        self.table.set_state(index, new);
        // Like Linux, an endpoint leaves the duplicate/stale lookups when it enters TIMEWAIT
        // or is freed: one that fell back to IDLE still swallows duplicates of its REQ. A
        // SIDR request leaves its lookup once answered.
        if new == CmState::Timewait || old == CmState::SidrReqRcvd {
            self.unmap(index);
        }
        if new == CmState::Idle && !user {
            self.release(index);
        }
    }

    /// Removes an endpoint from the duplicate / stale / SIDR maps.
    fn unmap(&mut self, index: u32) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        let (remote, qpn, guid, peer) =
            (c.remote_id, c.remote_qpn, c.remote_guid, c.path.remote_gid);
        let (in_remote, in_qpn, in_sidr) = (c.in_remote_map, c.in_qpn_map, c.in_sidr_map);
        (c.in_remote_map, c.in_qpn_map, c.in_sidr_map) = (false, false, false);
        if in_remote && self.by_remote.get(&(remote, guid)) == Some(&index) {
            self.by_remote.remove(&(remote, guid));
        }
        if in_qpn && self.by_remote_qpn.get(&(qpn, guid)) == Some(&index) {
            self.by_remote_qpn.remove(&(qpn, guid));
        }
        if in_sidr && self.by_sidr.get(&(remote, peer)) == Some(&index) {
            self.by_sidr.remove(&(remote, peer));
        }
    }

    /// Frees the slot for good (after destroy, once nothing on the wire needs it).
    fn release(&mut self, index: u32) {
        self.unmap(index);
        if let Some(c) = self.table.conn(index) {
            if c.listener {
                let sid = c.service_id;
                if self.listeners.get(&sid) == Some(&index) {
                    self.listeners.remove(&sid);
                }
            }
        }
        self.table.free(index);
    }
}

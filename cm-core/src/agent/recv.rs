//! Received MADs: matching by communication IDs, the per-state handling and the answers to
//! duplicates and unmatched messages, all as Linux `drivers/infiniband/core/cm.c` does them.

use portverbs_hal::Gid;

use super::conn::TimerKind;
use super::{CmAgent, CmEvent, CmState, ConnectRequest, QpTarget, RtrAttrs, RtsAttrs};
use crate::MadError;
use crate::time::{MAX_WAIT_NS, ack_timeout, from_peer, timeout_ns};
use crate::wire::{
    AttrId, CmMessage, Drep, Dreq, Mad, Mra, MsgKind, Rej, RejReason, Rep, Req, Rtu, SidrRep,
    SidrReq, SidrStatus,
};

impl CmAgent {
    /// Takes one MAD received from `from` (the peer's GID). `bytes` are exactly the bytes
    /// that arrived (a UD receive's byte count less its 40-byte GRH area), never a whole
    /// receive buffer: a datagram of any other length than 256 bytes is malformed. A MAD that
    /// does not parse is dropped with its [`MadError`] and counted
    /// ([`AgentStats::malformed`](super::AgentStats)); nothing changes then. Anything
    /// well-formed is handled or silently dropped as Linux would.
    pub fn handle_mad(&mut self, now: u64, from: Gid, bytes: &[u8]) -> Result<(), MadError> {
        let mad = Mad::parse(bytes).inspect_err(|_| self.stats.malformed += 1)?;
        let tid = mad.tid;
        match mad.msg {
            CmMessage::Req(m) => self.on_req(now, from, tid, &m),
            CmMessage::Mra(m) => self.on_mra(now, from, &m),
            CmMessage::Rej(m) => self.on_rej(now, from, &m),
            CmMessage::Rep(m) => self.on_rep(now, from, &m),
            CmMessage::Rtu(m) => self.on_rtu(from, &m),
            CmMessage::Dreq(m) => self.on_dreq(now, from, tid, &m),
            CmMessage::Drep(m) => self.on_drep(now, from, &m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, from, tid, &m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(from, &m),
            // LAP and APR: ignored on RoCE ports, as Linux does.
            CmMessage::AltPath { .. } => self.stats.unmatched += 1,
        }
        Ok(())
    }

    fn state_of(&self, index: u32) -> CmState {
        self.table.conn(index).map_or(CmState::Idle, |c| c.state)
    }

    /// Whether `from` is the peer of endpoint `index`. A message that found an endpoint by
    /// its communication IDs is taken only from the address the endpoint talks to (the REQ's
    /// source, or the GID our REQ or SIDR_REQ went to): communication IDs travel in the
    /// clear and can be learnt or guessed, a source address can be forged only by a host on
    /// the path. Linux matches by the IDs alone; this CM also checks the source, and drops
    /// and counts ([`super::AgentStats::foreign_source`]) what fails.
    fn sent_by_peer(&mut self, index: u32, from: Gid) -> bool {
        let ok = self
            .table
            .conn(index)
            .is_some_and(|c| c.path.remote_gid == from);
        if !ok {
            self.stats.foreign_source += 1;
            tracing::debug!(id = ?self.table.comm_id(index), ?from, "MAD from a stranger dropped");
        }
        ok
    }

    /// A REJ to a REQ that created no endpoint (no listener, stale, unsupported).
    fn reject_req(&mut self, from: Gid, tid: u64, req: &Req, reason: RejReason) {
        let rej = Rej {
            // Linux copies the REQ's bytes 4..8 (reserved + ECE vendor ID, normally 0) here:
            // it reads the "remote communication ID" slot every other message has there.
            local_comm_id: req.vendor_id,
            remote_comm_id: req.local_comm_id,
            msg_rejected: MsgKind::Req,
            ari_len: 0,
            reason,
            ari: [0; 72],
            private_data: [0; 148],
        };
        self.send(from, tid, CmMessage::Rej(rej));
    }

    fn on_req(&mut self, now: u64, from: Gid, tid: u64, r: &Req) {
        if let Some(&index) = self.by_remote.get(&(r.local_comm_id, r.local_ca_guid)) {
            if !self.sent_by_peer(index, from) {
                return;
            }
            self.stats.duplicates += 1;
            // Only MRA_REQ_SENT answers (with the MRA); REQ_RCVD, REP_SENT and later stay
            // silent: the REP is re-sent by its own timer, never on a duplicate REQ.
            let mra = self.cfg.request_mra_timeout.unwrap_or(0);
            if let Some(c) = self.table.conn_mut(index) {
                if c.state == CmState::MraReqSent && c.has_reply {
                    let (to, mad) = (c.path.remote_gid, c.reply);
                    // The MRA pushes the sender's give-up out once: so is the request's
                    // withdrawal (once, whatever the duplicates).
                    let withdraw = match c.timer {
                        Some((at, TimerKind::Withdraw)) if !c.mra_extended => Some(at),
                        _ => None,
                    };
                    c.mra_extended = true;
                    let extra = timeout_ns(mra).saturating_add(timeout_ns(c.av_timeout));
                    self.send_raw(to, mad);
                    if let Some(at) = withdraw {
                        self.arm(index, at.saturating_add(extra), TimerKind::Withdraw);
                    }
                }
            }
            return;
        }
        if let Some(&old) = self.by_remote_qpn.get(&(r.local_qpn, r.local_ca_guid)) {
            // Stale only when it comes from that connection's peer: anyone else naming its
            // QPN and CA GUID would otherwise tear it down.
            if !self.sent_by_peer(old, from) {
                return;
            }
            self.reject_req(from, tid, r, RejReason::StaleConnection);
            self.drop_stale(old, now);
            return;
        }
        let Some(&listener) = self.listeners.get(&r.service_id) else {
            self.stats.unmatched += 1;
            self.reject_req(from, tid, r, RejReason::InvalidServiceId);
            return;
        };
        if r.transport > 1 {
            self.reject_req(from, tid, r, RejReason::InvalidTransportType);
            return;
        }
        let Some(index) = self.table.alloc() else {
            self.reject_req(from, tid, r, RejReason::NoResources);
            return;
        };
        let id = self.table.comm_id(index);
        let mra = self.cfg.request_mra_timeout.map(|t| {
            let mra = Mra {
                local_comm_id: id.0,
                remote_comm_id: r.local_comm_id,
                msg_mraed: MsgKind::Req,
                service_timeout: t,
                private_data: [0; 222],
            };
            Mad::new(tid, CmMessage::Mra(mra)).emit()
        });
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.user = true;
        c.remote_id = r.local_comm_id;
        c.remote_guid = r.local_ca_guid;
        c.remote_qpn = r.local_qpn;
        c.service_id = r.service_id;
        c.tid = tid;
        c.path.local_gid = r.primary.remote_gid;
        c.path.remote_gid = from;
        c.path.flow_label = r.primary.flow_label;
        c.path.traffic_class = r.primary.traffic_class;
        c.path.hop_limit = r.primary.hop_limit;
        c.path.sl = r.primary.sl;
        c.path.path_mtu = r.path_mtu;
        c.path.pkey = r.pkey;
        c.sq_psn = r.starting_psn;
        c.retry_count = r.retry_count;
        c.rnr_retry = r.rnr_retry_count;
        c.max_cm_retries = r.max_cm_retries;
        // Every timeout the REQ proposes is clamped (crate docs: what is bounded).
        let av_timeout = from_peer(r.primary.local_ack_timeout);
        c.av_timeout = av_timeout;
        c.packet_life_time = av_timeout.saturating_sub(1);
        c.peer_response_timeout = from_peer(r.local_cm_response_timeout);
        // How long the sender waits for our answer (its REQ interval, 2·PLT plus the
        // response timeout it gave us, times its tries), at most MAX_WAIT_NS: unanswered by
        // then, the request is withdrawn.
        let interval = timeout_ns(c.packet_life_time)
            .saturating_mul(2)
            .saturating_add(timeout_ns(from_peer(r.remote_cm_response_timeout)));
        let patience = interval
            .saturating_mul(u64::from(r.max_cm_retries) + 1)
            .min(MAX_WAIT_NS);
        c.in_remote_map = true;
        c.in_qpn_map = true;
        if let Some(mad) = mra {
            c.reply = mad;
            c.has_reply = true;
        }
        self.by_remote
            .insert((r.local_comm_id, r.local_ca_guid), index);
        self.by_remote_qpn
            .insert((r.local_qpn, r.local_ca_guid), index);
        let next = if mra.is_some() {
            CmState::MraReqSent
        } else {
            CmState::ReqRcvd
        };
        self.set_state(index, next);
        self.arm(index, now.saturating_add(patience), TimerKind::Withdraw);
        let request = ConnectRequest {
            listener: self.table.comm_id(listener),
            service_id: r.service_id,
            peer: from,
            remote_qpn: r.local_qpn,
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            srq: r.srq,
            private_data: r.private_data,
        };
        self.event(
            index,
            CmEvent::ConnectRequest {
                id,
                request: Box::new(request),
            },
        );
    }

    /// A new REQ or REP names the QP of a connection we still hold: that connection is
    /// stale; Linux disconnects it (DREQ) if it is established.
    fn drop_stale(&mut self, old: u32, now: u64) {
        if self.state_of(old) == CmState::Established {
            self.qp(old, QpTarget::Error);
            self.send_dreq(old, now, [0; 220], true);
            self.report_disconnect(old);
        }
    }

    fn on_rep(&mut self, now: u64, from: Gid, r: &Rep) {
        let waiting = self
            .table
            .by_wire(r.remote_comm_id, 0)
            .filter(|&i| matches!(self.state_of(i), CmState::ReqSent | CmState::MraReqRcvd));
        if let Some(index) = waiting {
            if !self.sent_by_peer(index, from) {
                return;
            }
        }
        let Some(index) = waiting else {
            // Duplicate REP: the RTU was lost. Answer from ESTABLISHED with the stored RTU.
            match self.table.by_wire(r.remote_comm_id, r.local_comm_id) {
                Some(i) if self.state_of(i) == CmState::Established => {
                    if !self.sent_by_peer(i, from) {
                        return;
                    }
                    self.stats.duplicates += 1;
                    if let Some(c) = self.table.conn(i) {
                        if c.has_reply {
                            let (to, mad) = (c.path.remote_gid, c.reply);
                            self.send_raw(to, mad);
                        }
                    }
                }
                _ => self.stats.unmatched += 1,
            }
            return;
        };
        let id = self.table.comm_id(index);
        self.cancel(index);
        let stale = self
            .by_remote_qpn
            .get(&(r.local_qpn, r.local_ca_guid))
            .copied()
            .filter(|&old| {
                old != index
                    && self
                        .table
                        .conn(old)
                        .is_some_and(|c| c.path.remote_gid == from)
            });
        if let Some(old) = stale {
            let Some(c) = self.table.conn_mut(index) else {
                return;
            };
            c.remote_id = r.local_comm_id;
            let rej = Rej {
                local_comm_id: id.0,
                remote_comm_id: r.local_comm_id,
                msg_rejected: MsgKind::Rep,
                ari_len: 0,
                reason: RejReason::StaleConnection,
                ari: [0; 72],
                private_data: [0; 148],
            };
            let tid = c.tid;
            self.send(from, tid, CmMessage::Rej(rej));
            self.qp(index, QpTarget::Error);
            let reason = RejReason::StaleConnection;
            let private_data = Vec::new();
            let ev = CmEvent::Rejected {
                id,
                reason,
                private_data,
            };
            self.finish_outcome(index, ev);
            self.drop_stale(old, now);
            self.enter_timewait(index, now);
            return;
        }
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.remote_id = r.local_comm_id;
        c.remote_guid = r.local_ca_guid;
        c.remote_qpn = r.local_qpn;
        c.sq_psn = r.starting_psn;
        c.rnr_retry = r.rnr_retry_count;
        c.av_timeout = from_peer(ack_timeout(
            from_peer(r.target_ack_delay),
            c.packet_life_time,
        ));
        c.in_qpn_map = true;
        // The REP's depths may not exceed what the REQ offered (its initiator depth at most
        // our responder resources, and the other way round); Linux's perftest server answers
        // with its device's maximum (128 on rxe) whatever the REQ said, more than this side
        // may have, so the QP gets the smaller of the two.
        let dest_rd_atomic = r.initiator_depth.min(c.responder_resources);
        let rd_atomic = r.responder_resources.min(c.initiator_depth);
        let rtr = RtrAttrs {
            dest_qpn: r.local_qpn,
            rq_psn: c.rq_psn,
            path_mtu: c.path.path_mtu,
            max_dest_rd_atomic: dest_rd_atomic,
            min_rnr_timer: 0,
            remote_read_atomic: dest_rd_atomic > 0,
            sgid: c.path.local_gid,
            dgid: c.path.remote_gid,
            flow_label: c.path.flow_label,
            traffic_class: c.path.traffic_class,
            hop_limit: c.path.hop_limit,
            sl: c.path.sl,
        };
        let rts = RtsAttrs {
            sq_psn: r.starting_psn,
            retry_cnt: c.retry_count,
            rnr_retry: r.rnr_retry_count,
            max_rd_atomic: rd_atomic,
            timeout: c.qp_timeout.unwrap_or(c.av_timeout),
        };
        let rtu = Rtu {
            local_comm_id: id.0,
            remote_comm_id: r.local_comm_id,
            private_data: [0; 224],
        };
        let (to, tid) = (c.path.remote_gid, c.tid);
        self.by_remote_qpn
            .insert((r.local_qpn, r.local_ca_guid), index);
        self.set_state(index, CmState::RepRcvd);
        // rdma_cm's active side: QP to RTR and RTS, then the RTU, at once.
        self.qp(index, QpTarget::Rtr(rtr));
        self.qp(index, QpTarget::Rts(rts));
        let mad = self.send(to, tid, CmMessage::Rtu(rtu));
        if let Some(c) = self.table.conn_mut(index) {
            c.reply = mad;
            c.has_reply = true;
        }
        self.set_state(index, CmState::Established);
        let private_data = r.private_data.to_vec();
        self.finish_outcome(index, CmEvent::Established { id, private_data });
    }

    fn on_rtu(&mut self, from: Gid, r: &Rtu) {
        let Some(index) = self.table.by_wire(r.remote_comm_id, r.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        match self.state_of(index) {
            CmState::RepSent | CmState::MraRepRcvd => {
                self.cancel(index);
                self.set_state(index, CmState::Established);
                let id = self.table.comm_id(index);
                let private_data = r.private_data.to_vec();
                self.finish_outcome(index, CmEvent::Established { id, private_data });
            }
            CmState::Established => self.stats.duplicates += 1,
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_mra(&mut self, now: u64, from: Gid, m: &Mra) {
        let (key_remote, want, next) = match m.msg_mraed {
            MsgKind::Req => (0, CmState::ReqSent, CmState::MraReqRcvd),
            MsgKind::Rep => (m.local_comm_id, CmState::RepSent, CmState::MraRepRcvd),
            MsgKind::Other | MsgKind::Reserved => {
                self.stats.unmatched += 1;
                return;
            }
        };
        let Some(index) = self.table.by_wire(m.remote_comm_id, key_remote) else {
            self.stats.unmatched += 1;
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        let state = self.state_of(index);
        if state == next {
            self.stats.duplicates += 1;
            return;
        }
        if state != want {
            self.stats.unmatched += 1;
            return;
        }
        // The peer needs longer: the outstanding message's timer is pushed out by the
        // service timeout plus the path's ACK timeout; its retries are not reset.
        // Linux extends the deadline of the MAD it acknowledges as well: so does this CM (once
        // per message: a second MRA finds the MRA_*_RCVD state and is a duplicate).
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        let extra =
            timeout_ns(from_peer(m.service_timeout)).saturating_add(timeout_ns(c.av_timeout));
        c.give_up_at = c.give_up_at.saturating_add(extra).min(c.req_deadline);
        let at = now.saturating_add(extra).min(c.give_up_at);
        self.set_state(index, next);
        self.arm(index, at, TimerKind::Retransmit);
    }

    fn on_rej(&mut self, now: u64, from: Gid, r: &Rej) {
        let index = if r.reason == RejReason::Timeout {
            // The active side gave up before knowing our ID: find us by its ID and GUID.
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&r.ari[..8]);
            self.by_remote
                .get(&(r.local_comm_id, u64::from_be_bytes(guid)))
                .copied()
        } else if r.msg_rejected == MsgKind::Req {
            self.table.by_wire(r.remote_comm_id, 0)
        } else {
            self.table.by_wire(r.remote_comm_id, r.local_comm_id)
        };
        let Some(index) = index else {
            self.stats.unmatched += 1;
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        let id = self.table.comm_id(index);
        let reason = r.reason;
        let state = self.state_of(index);
        match state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepRcvd
            | CmState::MraRepSent => {
                self.cancel(index);
                let bound = !matches!(state, CmState::ReqRcvd | CmState::MraReqSent);
                if bound {
                    self.qp(index, QpTarget::Error);
                }
                let pending = self.table.conn(index).is_some_and(|c| c.outcome_pending);
                let ev = CmEvent::Rejected {
                    id,
                    reason,
                    private_data: r.private_data.to_vec(),
                };
                if pending {
                    self.finish_outcome(index, ev);
                } else {
                    // A request the application has not answered yet was withdrawn.
                    self.event(index, ev);
                }
                if reason == RejReason::StaleConnection {
                    self.enter_timewait(index, now);
                } else {
                    self.set_state(index, CmState::Idle);
                }
            }
            CmState::Established | CmState::DreqSent => {
                self.cancel(index);
                self.qp(index, QpTarget::Error);
                self.report_disconnect(index);
                self.enter_timewait(index, now);
            }
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_dreq(&mut self, now: u64, from: Gid, tid: u64, d: &Dreq) {
        let Some(index) = self.table.by_wire(d.remote_comm_id, d.local_comm_id) else {
            // Linux answers a DREQ for an unknown connection with a DREP all the same.
            self.stats.unmatched += 1;
            let drep = Drep {
                local_comm_id: d.remote_comm_id,
                remote_comm_id: d.local_comm_id,
                private_data: [0; 224],
            };
            self.send(from, tid, CmMessage::Drep(drep));
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        if c.local_qpn != d.remote_qpn {
            self.stats.unmatched += 1;
            return;
        }
        let state = c.state;
        match state {
            CmState::RepSent | CmState::MraRepRcvd | CmState::Established => {
                c.dreq_tid = tid;
                self.cancel(index);
                if state != CmState::Established {
                    // The RTU was lost but the peer is connected (it disconnects): the
                    // accept completed before the teardown.
                    self.set_state(index, CmState::Established);
                    let id = self.table.comm_id(index);
                    let private_data = Vec::new();
                    self.finish_outcome(index, CmEvent::Established { id, private_data });
                }
                self.set_state(index, CmState::DreqRcvd);
                self.report_disconnect(index);
            }
            CmState::DreqSent => {
                // Both sides disconnect at once: answer, and our disconnect is complete.
                c.dreq_tid = tid;
                self.cancel(index);
                self.send_drep(index, [0; 224]);
                self.report_disconnect(index);
                self.enter_timewait(index, now);
            }
            CmState::DreqRcvd => self.stats.duplicates += 1,
            CmState::Timewait => {
                // Our DREP was lost: send it again (a fresh one if we never sent one).
                self.stats.duplicates += 1;
                let stored = c.has_reply
                    && u16::from_be_bytes([c.reply[16], c.reply[17]]) == AttrId::Drep.to_u16();
                if stored {
                    let (to, mad) = (c.path.remote_gid, c.reply);
                    self.send_raw(to, mad);
                } else {
                    c.dreq_tid = tid;
                    self.send_drep(index, [0; 224]);
                }
            }
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_drep(&mut self, now: u64, from: Gid, d: &Drep) {
        let Some(index) = self.table.by_wire(d.remote_comm_id, d.local_comm_id) else {
            self.stats.unmatched += 1;
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        match self.state_of(index) {
            CmState::DreqSent => {
                self.cancel(index);
                self.report_disconnect(index);
                self.enter_timewait(index, now);
            }
            CmState::Established => {
                // The peer answers a DREQ this side never sent: someone disconnected it in our
                // name, and the peer's side is gone. Linux drops such a DREP and its
                // connection then waits for nothing that will come; here the connection ends
                // and its owner hears DISCONNECTED.
                self.cancel(index);
                self.qp(index, QpTarget::Error);
                self.report_disconnect(index);
                self.enter_timewait(index, now);
            }
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_sidr_req(&mut self, now: u64, from: Gid, tid: u64, r: &SidrReq) {
        if self.by_sidr.contains_key(&(r.request_id, from)) {
            self.stats.duplicates += 1;
            return;
        }
        let Some(&listener) = self.listeners.get(&r.service_id) else {
            self.stats.unmatched += 1;
            let rep = SidrRep {
                request_id: r.request_id,
                status: SidrStatus::ServiceNotSupported,
                info_len: 0,
                vendor_id: 0,
                qpn: 0,
                service_id: r.service_id,
                qkey: 0,
                info: [0; 72],
                private_data: [0; 136],
            };
            self.send(from, tid, CmMessage::SidrRep(rep));
            return;
        };
        let Some(index) = self.table.alloc() else {
            return;
        };
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.user = true;
        c.remote_id = r.request_id;
        c.path.remote_gid = from;
        c.service_id = r.service_id;
        c.tid = tid;
        c.in_sidr_map = true;
        self.by_sidr.insert((r.request_id, from), index);
        self.set_state(index, CmState::SidrReqRcvd);
        // A SIDR_REQ carries no timeout of its sender's (rdma_cm gives up after 16 × 4 s):
        // unanswered, it is withdrawn after the CM's longest wait for a peer.
        self.arm(index, now.saturating_add(MAX_WAIT_NS), TimerKind::Withdraw);
        let id = self.table.comm_id(index);
        let listener = self.table.comm_id(listener);
        let service_id = r.service_id;
        self.event(
            index,
            CmEvent::SidrRequest {
                id,
                listener,
                service_id,
                peer: from,
                private_data: r.private_data.to_vec(),
            },
        );
    }

    fn on_sidr_rep(&mut self, from: Gid, r: &SidrRep) {
        let index = self
            .table
            .by_wire(r.request_id, 0)
            .filter(|&i| self.state_of(i) == CmState::SidrReqSent);
        let Some(index) = index else {
            self.stats.unmatched += 1;
            return;
        };
        if !self.sent_by_peer(index, from) {
            return;
        }
        self.cancel(index);
        let id = self.table.comm_id(index);
        let ev = CmEvent::SidrResolved {
            id,
            status: r.status,
            qpn: r.qpn,
            qkey: r.qkey,
            private_data: r.private_data.to_vec(),
        };
        self.finish_outcome(index, ev);
        self.set_state(index, CmState::Idle);
    }
}

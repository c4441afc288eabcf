//! The application's calls: create, listen, connect, accept, reject, disconnect, SIDR.

use portverbs_hal::Gid;

use super::conn::PathState;
use super::{
    AcceptParams, CmAgent, CmId, CmState, ConnectParams, QpTarget, RtrAttrs, RtsAttrs, SidrParams,
    Transport,
};
use crate::CmError;
use crate::time::{NS_PER_MS, ack_timeout, timeout_ms, timeout_ns};
use crate::wire::{
    CmMessage, Drep, Dreq, Mad, MsgKind, Rej, RejReason, Rep, Req, ReqPath, SidrRep, SidrReq,
    SidrStatus,
};

/// Private data padded to the message's fixed size, or a typed error when it is too long.
pub(super) fn pdata<const N: usize>(msg: &'static str, data: &[u8]) -> Result<[u8; N], CmError> {
    let mut out = [0u8; N];
    let dst = out.get_mut(..data.len()).ok_or(CmError::PrivateData {
        msg,
        len: data.len(),
        max: N,
    })?;
    dst.copy_from_slice(data);
    Ok(out)
}

fn fits(name: &'static str, value: u64, bits: u32) -> Result<(), CmError> {
    if value >> bits == 0 {
        Ok(())
    } else {
        Err(CmError::Param { name, value })
    }
}

impl CmAgent {
    /// Looks up a live handle and checks that its state is one of `allowed`.
    fn handle(&self, op: &'static str, id: CmId, allowed: &[CmState]) -> Result<u32, CmError> {
        let index = self.table.by_handle(id).ok_or(CmError::UnknownId(id))?;
        let state = self.table.conn(index).map_or(CmState::Idle, |c| c.state);
        if allowed.contains(&state) {
            Ok(index)
        } else {
            Err(CmError::State { op, id, state })
        }
    }

    /// A new endpoint in IDLE.
    pub fn create_id(&mut self) -> Result<CmId, CmError> {
        let index = self.table.alloc().ok_or(CmError::NoFreeId)?;
        if let Some(c) = self.table.conn_mut(index) {
            c.user = true;
        }
        Ok(self.table.comm_id(index))
    }

    /// Listens for REQs and SIDR_REQs carrying `service_id` (exact match, as rdma_cm
    /// registers it).
    pub fn listen(&mut self, id: CmId, service_id: u64) -> Result<(), CmError> {
        let index = self.handle("listen", id, &[CmState::Idle])?;
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::ServiceInUse(service_id));
        }
        self.listeners.insert(service_id, index);
        if let Some(c) = self.table.conn_mut(index) {
            c.listener = true;
            c.service_id = service_id;
        }
        self.set_state(index, CmState::Listen);
        Ok(())
    }

    /// Sends a REQ (retransmitted every 2·PLT + remote response timeout, `max_cm_retries`
    /// times: [`ConnectParams::retry_budget_ns`], or until [`ConnectParams::give_up_at`]).
    /// Ends in exactly one of Established, Rejected or Unreachable, unless the endpoint is
    /// destroyed first.
    pub fn connect(
        &mut self,
        now: u64,
        id: CmId,
        p: &ConnectParams,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let index = self.handle("connect", id, &[CmState::Idle])?;
        fits("qpn", p.qpn.into(), 24)?;
        fits("starting_psn", p.starting_psn.into(), 24)?;
        fits("retry_count", p.retry_count.into(), 3)?;
        fits("rnr_retry_count", p.rnr_retry_count.into(), 3)?;
        fits("max_cm_retries", p.max_cm_retries.into(), 4)?;
        fits(
            "remote_cm_response_timeout",
            p.remote_cm_response_timeout.into(),
            5,
        )?;
        fits(
            "local_cm_response_timeout",
            p.local_cm_response_timeout.into(),
            5,
        )?;
        fits("packet_life_time", p.path.packet_life_time.into(), 5)?;
        fits("path_mtu", p.path.path_mtu.into(), 4)?;
        fits("sl", p.path.sl.into(), 4)?;
        fits("flow_label", p.path.flow_label.into(), 20)?;
        if let Some(t) = p.ack_timeout {
            fits("ack_timeout", t.into(), 5)?;
        }
        let private_data = pdata("REQ", private_data)?;
        let tid = self.next_tid(id);
        let plt = p.path.packet_life_time;
        let req = Req {
            local_comm_id: id.0,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport: match p.transport {
                Transport::Rc => 0,
                Transport::Uc => 1,
            },
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.path.pkey,
            path_mtu: p.path.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport: 0,
            primary: ReqPath {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: p.path.local_gid,
                remote_gid: p.path.remote_gid,
                flow_label: p.path.flow_label,
                packet_rate: 0,
                traffic_class: p.path.traffic_class,
                hop_limit: p.path.hop_limit,
                sl: p.path.sl,
                subnet_local: false,
                local_ack_timeout: ack_timeout(self.cfg.ca_ack_delay, plt),
            },
            alternate: ReqPath::default(),
            sap_supported: false,
            private_data,
        };
        let Some(c) = self.table.conn_mut(index) else {
            return Err(CmError::UnknownId(id));
        };
        c.local_qpn = p.qpn;
        c.service_id = p.service_id;
        c.tid = tid;
        c.path = PathState {
            local_gid: p.path.local_gid,
            remote_gid: p.path.remote_gid,
            flow_label: p.path.flow_label,
            traffic_class: p.path.traffic_class,
            hop_limit: p.path.hop_limit,
            sl: p.path.sl,
            path_mtu: p.path.path_mtu,
            pkey: p.path.pkey,
        };
        c.rq_psn = p.starting_psn;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.max_cm_retries = p.max_cm_retries;
        c.packet_life_time = plt;
        c.av_timeout = (plt + 1).min(31);
        c.qp_timeout = p.ack_timeout;
        c.outcome_pending = true;
        c.req_deadline = p.give_up_at.unwrap_or(u64::MAX);
        c.retx = Mad::new(tid, CmMessage::Req(req)).emit();
        self.set_state(index, CmState::ReqSent);
        let interval = (2 * timeout_ms(plt) + timeout_ms(p.remote_cm_response_timeout)) * NS_PER_MS;
        self.start_retx(index, now, interval, p.max_cm_retries);
        Ok(())
    }

    /// Accepts a connection request: moves the QP to RTR and RTS (as [`super::QpAction`]s)
    /// and sends a REP (retransmitted every `convert(REQ local response timeout)`). Ends in
    /// exactly one of Established, Rejected or Unreachable, unless destroyed first.
    pub fn accept(
        &mut self,
        now: u64,
        id: CmId,
        p: &AcceptParams,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let index = self.handle("accept", id, &[CmState::ReqRcvd, CmState::MraReqSent])?;
        fits("qpn", p.qpn.into(), 24)?;
        fits("starting_psn", p.starting_psn.into(), 24)?;
        fits("rnr_retry_count", p.rnr_retry_count.into(), 3)?;
        fits("path_mtu", p.path_mtu.into(), 4)?;
        if let Some(t) = p.ack_timeout {
            fits("ack_timeout", t.into(), 5)?;
        }
        let private_data = pdata("REP", private_data)?;
        let Some(c) = self.table.conn_mut(index) else {
            return Err(CmError::UnknownId(id));
        };
        c.local_qpn = p.qpn;
        c.rq_psn = p.starting_psn;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.qp_timeout = p.ack_timeout;
        c.outcome_pending = true;
        // The path MTU: the REQ's, at most what our port takes (the REP carries none). A REQ
        // with no valid MTU (0, or above 4096) gets 1024 at most.
        let req_mtu = c.path.path_mtu;
        let req_mtu = if (1..=5).contains(&req_mtu) {
            req_mtu
        } else {
            3
        };
        c.path.path_mtu = req_mtu.min(p.path_mtu.clamp(1, 5));
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            vendor_id: 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: self.cfg.ca_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data,
        };
        c.retx = Mad::new(c.tid, CmMessage::Rep(rep)).emit();
        let rtr = RtrAttrs {
            dest_qpn: c.remote_qpn,
            rq_psn: p.starting_psn,
            path_mtu: c.path.path_mtu,
            max_dest_rd_atomic: p.responder_resources,
            min_rnr_timer: 0,
            remote_read_atomic: p.responder_resources > 0,
            sgid: c.path.local_gid,
            dgid: c.path.remote_gid,
            flow_label: c.path.flow_label,
            traffic_class: c.path.traffic_class,
            hop_limit: c.path.hop_limit,
            sl: c.path.sl,
        };
        let rts = RtsAttrs {
            sq_psn: c.sq_psn,
            retry_cnt: c.retry_count,
            rnr_retry: c.rnr_retry,
            max_rd_atomic: p.initiator_depth,
            timeout: p.ack_timeout.unwrap_or(c.av_timeout),
        };
        let (interval, retries) = (timeout_ns(c.peer_response_timeout), c.max_cm_retries);
        c.retx_interval_ns = interval;
        self.qp(index, QpTarget::Rtr(rtr));
        self.qp(index, QpTarget::Rts(rts));
        self.set_state(index, CmState::RepSent);
        self.start_retx(index, now, interval, retries);
        Ok(())
    }

    /// Refuses a connection request with REJ reason 28 (consumer reject); the endpoint goes
    /// back to IDLE and stays the application's to destroy.
    pub fn reject(&mut self, _now: u64, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        let index = self.handle("reject", id, &[CmState::ReqRcvd, CmState::MraReqSent])?;
        let private_data = pdata("REJ", private_data)?;
        let Some(c) = self.table.conn(index) else {
            return Err(CmError::UnknownId(id));
        };
        // Linux leaves its own ID out when it rejects from REQ_RCVD.
        let local = if c.state == CmState::ReqRcvd { 0 } else { id.0 };
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: c.remote_id,
            msg_rejected: MsgKind::Req,
            ari_len: 0,
            reason: RejReason::ConsumerReject,
            ari: [0; 72],
            private_data,
        };
        let (to, tid) = (c.path.remote_gid, c.tid);
        self.send(to, tid, CmMessage::Rej(rej));
        self.set_state(index, CmState::Idle);
        Ok(())
    }

    /// Disconnects: from ESTABLISHED moves the QP to ERROR and sends a DREQ (retransmitted;
    /// ends in one Disconnected event); from DREQ_RCVD (Disconnected already delivered)
    /// moves the QP to ERROR and answers with a DREP, entering TIMEWAIT.
    pub fn disconnect(&mut self, now: u64, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        let index = self.handle("disconnect", id, &[CmState::Established, CmState::DreqRcvd])?;
        let state = self.table.conn(index).map_or(CmState::Idle, |c| c.state);
        if state == CmState::Established {
            let private_data = pdata("DREQ", private_data)?;
            self.qp(index, QpTarget::Error);
            self.send_dreq(index, now, private_data, true);
        } else {
            let private_data = pdata("DREP", private_data)?;
            self.qp(index, QpTarget::Error);
            self.send_drep(index, private_data);
            self.enter_timewait(index, now);
        }
        Ok(())
    }

    /// Sends a DREQ for an established endpoint: retransmitted (DREQ_SENT) or once.
    pub(super) fn send_dreq(&mut self, index: u32, now: u64, private_data: [u8; 220], retx: bool) {
        let id = self.table.comm_id(index);
        let tid = self.next_tid(id);
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        let dreq = Dreq {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data,
        };
        let mad = Mad::new(tid, CmMessage::Dreq(dreq)).emit();
        if retx {
            c.retx = mad;
            let (interval, retries) = (c.retx_interval_ns, c.max_cm_retries);
            self.set_state(index, CmState::DreqSent);
            self.start_retx(index, now, interval, retries);
        } else {
            let to = c.path.remote_gid;
            self.send_raw(to, mad);
        }
    }

    /// Sends a DREP answering the stored DREQ and keeps it for duplicates.
    pub(super) fn send_drep(&mut self, index: u32, private_data: [u8; 224]) {
        let id = self.table.comm_id(index);
        let Some(c) = self.table.conn(index) else {
            return;
        };
        let drep = Drep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data,
        };
        let (to, tid) = (c.path.remote_gid, c.dreq_tid);
        let mad = self.send(to, tid, CmMessage::Drep(drep));
        if let Some(c) = self.table.conn_mut(index) {
            c.reply = mad;
            c.has_reply = true;
        }
    }

    /// Sends a SIDR_REQ to `to` (retransmitted). Ends in SidrResolved or Unreachable.
    pub fn sidr_request(
        &mut self,
        now: u64,
        id: CmId,
        to: Gid,
        p: &SidrParams,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let index = self.handle("sidr_request", id, &[CmState::Idle])?;
        fits("timeout", p.timeout.into(), 5)?;
        let private_data = pdata("SIDR_REQ", private_data)?;
        let tid = self.next_tid(id);
        let Some(c) = self.table.conn_mut(index) else {
            return Err(CmError::UnknownId(id));
        };
        let req = SidrReq {
            request_id: id.0,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data,
        };
        c.path.remote_gid = to;
        c.service_id = p.service_id;
        c.tid = tid;
        c.outcome_pending = true;
        c.retx = Mad::new(tid, CmMessage::SidrReq(req)).emit();
        self.set_state(index, CmState::SidrReqSent);
        self.start_retx(index, now, timeout_ns(p.timeout), p.max_retries);
        Ok(())
    }

    /// Answers a SidrRequest; the endpoint goes back to IDLE.
    pub fn sidr_reply(
        &mut self,
        id: CmId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let index = self.handle("sidr_reply", id, &[CmState::SidrReqRcvd])?;
        fits("qpn", qpn.into(), 24)?;
        let private_data = pdata("SIDR_REP", private_data)?;
        self.send_sidr_rep(index, status, qpn, qkey, private_data);
        self.set_state(index, CmState::Idle);
        Ok(())
    }

    pub(super) fn send_sidr_rep(
        &mut self,
        index: u32,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: [u8; 136],
    ) {
        let Some(c) = self.table.conn(index) else {
            return;
        };
        let rep = SidrRep {
            request_id: c.remote_id,
            status,
            info_len: 0,
            vendor_id: 0,
            qpn,
            service_id: c.service_id,
            qkey,
            info: [0; 72],
            private_data,
        };
        let (to, tid) = (c.path.remote_gid, c.tid);
        self.send(to, tid, CmMessage::SidrRep(rep));
    }
}

//! QP transitions (Linux `mlx4_qp_modify`): each command checked against the HAL's one transition
//! table, the modify mailbox (optparam mask and context) mapped onto the engine's `QpInit` /
//! `QpAttr` at each transition, 2ERR / 2RST, and QUERY_QP.
//!
//! A QPN in RESET has no state here. RST2INIT resolves the QP buffer through its MTT range
//! (send and receive queues inside it by the layouts' `queue_offsets` rule), the RQ doorbell
//! record, the CQs and the SRQ, and creates the engine QP; 2RST destroys it again (so the queue
//! counters restart at 0, as after RST2INIT on the hardware).

use std::cell::Cell;

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::error::CommandError;
use portverbs_hal::qp_state::{Transition, transition};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpState, QpType};
use portverbs_mlx4_layout::ctx::{
    AddressPath, PM_MIGRATED, QpContext, QpMailbox, mtt_join, optpar, params2, qp_state, service,
};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_mlx4_layout::wqe::queue_offsets;
use portverbs_transport::{Engine, Packet, QpInit};
use zerocopy::{FromBytes, IntoBytes};

use super::mem::Buf;
use super::wqe::Wq;
use super::{CmdResult, Command, Hw, check_number};
use crate::caps;

/// Offset of port 1's GSI QP in the special block (Linux `mlx4/qp.c`).
const GSI_OFFSET: u32 = 2;

/// A QP that is not in RESET.
#[derive(Debug)]
pub(super) struct Qp {
    pub(super) qp_type: QpType,
    /// A special QP (service type MLX): its send WQEs carry the packet headers (`hw/mlx4/qp.c`).
    pub(super) mlx: bool,
    /// The RST2INIT context: the fields that never change afterwards.
    ctx: QpContext,
    /// The engine holds the QP (false only for RESET → ERR without a context).
    pub(super) in_engine: bool,
    pub(super) usr_page: u32,
    pub(super) sq: Option<Wq>,
    pub(super) rq: Option<Wq>,
    srqn: Option<u32>,
    /// RQ doorbell record.
    pub(super) db: Option<Buf>,
    send_cqn: u32,
    recv_cqn: u32,
    /// Send WQEs known to be posted (counter one past the last).
    pub(super) sq_valid: Cell<u32>,
    /// Counter of the next send WQE the engine reads.
    pub(super) sq_read: u32,
    /// Receive WQEs consumed.
    pub(super) rq_ci: u32,
}

impl Qp {
    pub(super) fn uses_cq(&self, cqn: u32) -> bool {
        self.in_engine && (self.send_cqn == cqn || self.recv_cqn == cqn)
    }

    pub(super) fn srqn(&self) -> Option<u32> {
        self.srqn.filter(|_| self.in_engine)
    }
}

/// The transport of a service type, and whether it is MLX (a special QP, which the engine runs
/// as UD: its datagrams are what the WQE headers describe).
fn qp_type(flags: u32) -> Result<(QpType, bool), Status> {
    match (flags >> 16) & 0xf {
        service::RC => Ok((QpType::Rc, false)),
        service::UC => Ok((QpType::Uc, false)),
        service::UD => Ok((QpType::Ud, false)),
        service::MLX => Ok((QpType::Ud, true)),
        _ => Err(Status::BadParam),
    }
}

fn remote_access(p2: u32) -> AccessFlags {
    let mut a = AccessFlags::empty();
    for (bit, f) in [
        (params2::RRE, AccessFlags::REMOTE_READ),
        (params2::RWE, AccessFlags::REMOTE_WRITE),
        (params2::RAE, AccessFlags::REMOTE_ATOMIC),
    ] {
        if p2 & bit != 0 {
            a |= f;
        }
    }
    a
}

fn av(p: &AddressPath) -> AddressVector {
    let tf = p.tclass_flowlabel.get();
    AddressVector {
        dgid: Gid(p.rgid),
        sgid_index: p.mgid_index,
        flow_label: tf & 0xf_ffff,
        hop_limit: p.hop_limit,
        traffic_class: (tf >> 20) as u8,
        is_global: p.grh_mylmc & 0x80 != 0,
        dlid: p.rlid.get(),
        sl: (p.sched_queue >> 2) & 0xf,
        src_path_bits: p.grh_mylmc & 0x7f,
        static_rate: p.static_rate,
        port_num: p.port(),
    }
}

/// The engine attributes a transition takes from its mailbox: the fields IBTA makes mandatory
/// for it, plus the optional ones the optparam mask names.
fn attrs(
    t: QpType,
    opcode: u16,
    opt: u32,
    c: &QpContext,
    ports: u8,
) -> Result<(QpAttr, QpAttrMask), Status> {
    let mut a = QpAttr::default();
    let mut m = QpAttrMask::empty();
    let path = &c.pri_path;
    let p1 = c.params1.get();
    let p2 = c.params2.get();
    let rc = t == QpType::Rc;
    let connected = t != QpType::Ud;
    let take_av = (opcode == op::INIT2RTR_QP && connected) || opt & optpar::PRIMARY_ADDR_PATH != 0;
    if take_av || opt & optpar::SCHED_QUEUE != 0 {
        if path.port() > ports {
            return Err(Status::BadParam);
        }
        a.port_num = path.port();
        m |= QpAttrMask::PORT;
    }
    if take_av {
        a.ah_attr = av(path);
        m |= QpAttrMask::AV;
    }
    if opcode == op::INIT2RTR_QP && connected {
        a.path_mtu = Mtu::from_code(c.mtu_msgmax >> 5).ok_or(Status::BadParam)?;
        a.dest_qp_num = c.remote_qpn.get() & 0xff_ffff;
        a.rq_psn = c.rnr_nextrecvpsn.get() & 0xff_ffff;
        m |= QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
    }
    if (opcode == op::INIT2RTR_QP && rc) || opt & optpar::RNR_TIMEOUT != 0 {
        a.min_rnr_timer = ((c.rnr_nextrecvpsn.get() >> 24) & 0x1f) as u8;
        m |= QpAttrMask::MIN_RNR_TIMER;
    }
    if (opcode == op::INIT2RTR_QP && rc) || opt & optpar::RRA_MAX != 0 {
        a.max_dest_rd_atomic = 1 << ((p2 >> 21) & 7).min(u32::from(caps::LOG_MAX_RA));
        m |= QpAttrMask::MAX_DEST_RD_ATOMIC;
    }
    if opcode == op::RTR2RTS_QP {
        a.sq_psn = c.next_send_psn.get() & 0xff_ffff;
        m |= QpAttrMask::SQ_PSN;
    }
    if (opcode == op::RTR2RTS_QP && rc) || opt & optpar::ACK_TIMEOUT != 0 {
        a.timeout = path.ackto >> 3;
        m |= QpAttrMask::TIMEOUT;
    }
    if (opcode == op::RTR2RTS_QP && rc) || opt & optpar::RETRY_COUNT != 0 {
        a.retry_cnt = ((p1 >> 16) & 7) as u8;
        m |= QpAttrMask::RETRY_CNT;
    }
    if (opcode == op::RTR2RTS_QP && rc) || opt & optpar::RNR_RETRY != 0 {
        a.rnr_retry = ((p1 >> 13) & 7) as u8;
        m |= QpAttrMask::RNR_RETRY;
    }
    if (opcode == op::RTR2RTS_QP && rc) || opt & optpar::SRA_MAX != 0 {
        a.max_rd_atomic = 1 << ((p1 >> 21) & 7).min(u32::from(caps::LOG_MAX_RA));
        m |= QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    if connected && opt & (optpar::RRE | optpar::RWE | optpar::RAE) != 0 {
        a.qp_access_flags = remote_access(p2);
        m |= QpAttrMask::ACCESS_FLAGS;
    }
    if opt & optpar::PKEY_INDEX != 0 {
        a.pkey_index = u16::from(path.pkey_index);
        m |= QpAttrMask::PKEY_INDEX;
    }
    if opt & optpar::Q_KEY != 0 {
        a.qkey = c.qkey.get();
        m |= QpAttrMask::QKEY;
    }
    Ok((a, m))
}

fn engine_err(e: &CommandError) -> Status {
    match e {
        CommandError::BadState { .. } => Status::BadQpState,
        CommandError::NoSuchObject { .. } => Status::BadResState,
        _ => Status::BadParam,
    }
}

impl Hw {
    /// The engine's number of hardware QPN `hw`: 1 for the GSI QP of port 1 (the special
    /// block's base + 2, as in Linux `mlx4/qp.c`), `hw` itself for every other QP.
    pub(super) fn engine_qpn(&self, hw: u32) -> u32 {
        match self.special_qp_base {
            Some(base) if hw == base + GSI_OFFSET => portverbs_hal::types::SpecialQp::GSI_QPN,
            _ => hw,
        }
    }

    /// The hardware QPN of engine QP `qpn` (what CQEs and contexts carry).
    pub(super) fn hw_qpn(&self, qpn: u32) -> u32 {
        match self.special_qp_base {
            Some(base) if qpn == portverbs_hal::types::SpecialQp::GSI_QPN => base + GSI_OFFSET,
            _ => qpn,
        }
    }

    fn qpc_addr(&self, qpn: u32) -> Result<u64, Status> {
        let l = self.layout()?;
        check_number(qpn, l.log_qp, 1 << caps::LOG_RSVD_QP)?;
        Ok(l.qpc + u64::from(qpn) * u64::from(caps::QPC_ENTRY))
    }

    /// The mlx4 state of a QPN.
    fn qp_state(&self, engine: &Engine, qpn: u32) -> u32 {
        match self.qps.get(qpn) {
            None => qp_state::RST,
            Some(qp) if qp.in_engine => engine.qp_state(qpn).map_or(qp_state::RST, qp_state::code),
            Some(_) => qp_state::ERR,
        }
    }

    pub(super) fn qp_command(
        &mut self,
        engine: &mut Engine,
        now: u64,
        out: &mut Vec<Packet>,
        cmd: &Command,
    ) -> CmdResult {
        let hw_qpn = cmd.in_mod & 0xff_ffff;
        let at = self.qpc_addr(hw_qpn)?;
        if !self.icm.is_mapped(at) {
            return Err(Status::IcmError);
        }
        // The engine knows a special QP by the number its packets carry.
        let qpn = self.engine_qpn(hw_qpn);
        if cmd.opcode == op::QUERY_QP {
            let mut mb = QpMailbox {
                ctx: self.qp_context(engine, qpn, at)?,
                ..QpMailbox::default()
            };
            mb.optpar = 0.into();
            return self.outbox(cmd.out_param, mb.as_bytes()).map(|()| None);
        }
        let tr = op::qp_transition(cmd.opcode).ok_or(Status::BadOp)?;
        let cur = qp_state::from_code(self.qp_state(engine, qpn)).ok_or(Status::BadQpState)?;
        let t = self.qps.get(qpn).map_or(QpType::Rc, |q| q.qp_type);
        // The HAL's one table decides, with one firmware difference: like Linux's mlx4 command
        // table, the HCA takes 2ERR from RESET, which the IBTA verbs table (and so verbs-core)
        // refuses before a command is ever issued.
        let firmware_only = tr == Transition::ToErr && cur == QpState::Reset;
        if !firmware_only && transition(t, cur, tr.to()) != Some(tr) {
            return Err(Status::BadQpState);
        }
        let mb = if op::qp_command_has_mailbox(tr) {
            let mb: QpMailbox = self.inbox(cmd.in_param)?;
            if mb.ctx.flags.get() >> 28 != qp_state::code(tr.to()) {
                return Err(Status::BadQpState);
            }
            Some(mb)
        } else {
            None
        };
        match (cmd.opcode, mb) {
            (op::RST_QP, _) => {
                if self.qps.remove(qpn).is_some_and(|q| q.in_engine) {
                    let _ = engine.destroy_qp(qpn);
                }
                Ok(None)
            }
            (op::ERR_QP, _) if !self.qps.get(qpn).is_some_and(|q| q.in_engine) => {
                // From RESET (or already there that way): nothing to flush.
                self.qps.insert(qpn, Qp::errored());
                Ok(None)
            }
            (op::RST2INIT_QP, Some(mb)) => self.rst2init(engine, now, out, hw_qpn, at, &mb),
            (_, mb) => {
                let t = self.qps.get(qpn).map_or(QpType::Rc, |q| q.qp_type);
                let (mut a, mut m) = match &mb {
                    Some(mb) => attrs(t, cmd.opcode, mb.optpar.get(), &mb.ctx, self.ports)?,
                    None => (QpAttr::default(), QpAttrMask::empty()),
                };
                a.qp_state = tr.to();
                m |= QpAttrMask::STATE;
                if cmd.opcode == op::RTS2SQD_QP && cmd.in_mod & (1 << 31) != 0 {
                    a.en_sqd_async_notify = true;
                    m |= QpAttrMask::EN_SQD_ASYNC_NOTIFY;
                }
                engine
                    .modify_qp(now, qpn, &a, m, self, out)
                    .map_err(|e| engine_err(&e))?;
                let ctx = self.qp_context(engine, qpn, at)?;
                self.icm_write(at, ctx.as_bytes())?;
                Ok(None)
            }
        }
    }

    fn rst2init(
        &mut self,
        engine: &mut Engine,
        now: u64,
        out: &mut Vec<Packet>,
        hw_qpn: u32,
        at: u64,
        mb: &QpMailbox,
    ) -> CmdResult {
        let c = &mb.ctx;
        let (t, mlx) = qp_type(c.flags.get())?;
        let qpn = self.engine_qpn(hw_qpn);
        // Service type MLX belongs to the special QPs CONF_SPECIAL_QP set aside, and only to
        // them; this HCA runs the GSI QP of port 1 (QP0 and port 2 are not modelled).
        if mlx != (qpn != hw_qpn) {
            return Err(Status::BadParam);
        }
        let pd = c.pd.get() & 0xff_ffff;
        let srq = c.srqn.get();
        let srqn = (srq & (1 << 24) != 0).then_some(srq & 0xff_ffff);
        let usr_page = c.usr_page.get() & 0xff_ffff;
        let port = c.pri_path.port();
        let send_cqn = c.cqn_send.get() & 0xff_ffff;
        let recv_cqn = c.cqn_recv.get() & 0xff_ffff;
        let sq_log = u32::from((c.sq_size_stride >> 3) & 0xf);
        let sq_shift = u32::from(c.sq_size_stride & 7) + 4;
        let rq_log = u32::from((c.rq_size_stride >> 3) & 0xf);
        let rq_shift = u32::from(c.rq_size_stride & 7) + 4;
        let max_log = u32::from(caps::LOG_MAX_QP_SZ);
        if usr_page as usize >= caps::NUM_UARS
            || port > self.ports
            || sq_shift < 6
            || sq_log > max_log
            || rq_log > max_log
        {
            return Err(Status::BadParam);
        }
        if !self.cqs.contains(send_cqn)
            || !self.cqs.contains(recv_cqn)
            || srqn.is_some_and(|s| !self.srqs.contains(s))
        {
            return Err(Status::BadResState);
        }
        let sq_cnt = 1u32 << sq_log;
        let rq_cnt = if srqn.is_some() { 0 } else { 1u32 << rq_log };
        let (sq_off, rq_off) = queue_offsets(sq_cnt, sq_shift, rq_cnt, rq_shift);
        let sq_bytes = (sq_cnt as usize) << sq_shift;
        let rq_bytes = (rq_cnt as usize) << rq_shift;
        let first = mtt_join(c.mtt_base_hi, c.mtt_base_lo.get());
        let buf = self.resolve(
            first,
            12 + u32::from(c.log_page_size & 0x3f),
            0,
            (sq_bytes + rq_bytes) as u64,
        )?;
        let sub = |off, len| buf.sub(off, len).ok_or(Status::BadParam);
        let sq = Wq::new(sub(sq_off, sq_bytes)?, sq_log, sq_shift);
        let (rq, db) = if rq_cnt > 0 {
            let addr = c.db_rec_addr.get();
            if addr % 4 != 0 {
                return Err(Status::BadParam);
            }
            let rq = Wq::new(sub(rq_off, rq_bytes)?, rq_log, rq_shift);
            (Some(rq), Some(self.mailbox(addr, 4)?))
        } else {
            (None, None)
        };
        engine
            .create_qp(
                qpn,
                QpInit {
                    qp_type: t,
                    pd,
                    send_cqn,
                    recv_cqn,
                    srqn,
                    sq_entries: sq_cnt,
                    caps: QpCaps {
                        max_send_wr: sq_cnt,
                        max_recv_wr: rq_cnt,
                        max_send_sge: u32::from(caps::MAX_SG_SQ),
                        max_recv_sge: u32::from(caps::MAX_SG_RQ),
                        max_inline_data: 0,
                    },
                },
            )
            .map_err(|e| engine_err(&e))?;
        self.qps.insert(
            qpn,
            Qp {
                qp_type: t,
                mlx,
                ctx: c.to_owned(),
                in_engine: true,
                usr_page,
                sq: Some(sq),
                rq,
                srqn,
                db,
                send_cqn,
                recv_cqn,
                sq_valid: Cell::new(0),
                sq_read: 0,
                rq_ci: 0,
            },
        );
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: port,
            pkey_index: u16::from(c.pri_path.pkey_index),
            ..QpAttr::default()
        };
        let mut m = QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX;
        if t == QpType::Ud {
            a.qkey = c.qkey.get();
            m |= QpAttrMask::QKEY;
        } else {
            a.qp_access_flags = remote_access(c.params2.get());
            m |= QpAttrMask::ACCESS_FLAGS;
        }
        let done = engine
            .modify_qp(now, qpn, &a, m, self, out)
            .map_err(|e| engine_err(&e))
            .and_then(|()| self.qp_context(engine, qpn, at))
            .and_then(|ctx| self.icm_write(at, ctx.as_bytes()));
        if let Err(s) = done {
            self.qps.remove(qpn);
            let _ = engine.destroy_qp(qpn);
            return Err(s);
        }
        Ok(None)
    }

    /// The context QUERY_QP returns: the RST2INIT context with the state and the attributes
    /// the engine holds now.
    fn qp_context(&self, engine: &Engine, qpn: u32, at: u64) -> Result<QpContext, Status> {
        let state = self.qp_state(engine, qpn);
        let Some(qp) = self.qps.get(qpn).filter(|q| q.in_engine) else {
            let raw = self.icm_read(at, size_of::<QpContext>())?;
            let mut c = QpContext::read_from_bytes(&raw).map_err(|_| Status::IcmError)?;
            c.flags = ((c.flags.get() & 0x0fff_ffff) | (state << 28)).into();
            return Ok(c);
        };
        let a = engine.query_qp(qpn).map_err(|e| engine_err(&e))?;
        let mut c = qp.ctx;
        let svc = (c.flags.get() >> 16) & 0xf;
        // SQD while the send queue still drains reads back as the SQ_DRAINING state.
        let state = if state == qp_state::SQD && a.sq_draining {
            qp_state::SQ_DRAINING
        } else {
            state
        };
        c.flags = ((state << 28) | (svc << 16) | PM_MIGRATED).into();
        c.mtu_msgmax = ((a.path_mtu as u8) << 5) | (c.mtu_msgmax & 0x1f);
        c.local_qpn = self.hw_qpn(qpn).into();
        c.remote_qpn = a.dest_qp_num.into();
        let av = a.ah_attr;
        let p = &mut c.pri_path;
        p.pkey_index = a.pkey_index as u8;
        p.grh_mylmc = (u8::from(av.is_global) << 7) | (av.src_path_bits & 0x7f);
        p.rlid = av.dlid.into();
        p.ackto = (a.timeout << 3) | 1;
        p.mgid_index = av.sgid_index;
        p.static_rate = av.static_rate;
        p.hop_limit = av.hop_limit;
        p.tclass_flowlabel =
            ((u32::from(av.traffic_class) << 20) | (av.flow_label & 0xf_ffff)).into();
        p.rgid = av.dgid.0;
        p.sched_queue = AddressPath::sched_queue_for(a.port_num, av.sl);
        let log2 = |v: u8| u32::from(v.max(1)).next_power_of_two().trailing_zeros();
        c.params1 = ((8 << 28)
            | (log2(a.max_rd_atomic) << 21)
            | (u32::from(a.retry_cnt & 7) << 16)
            | (u32::from(a.rnr_retry & 7) << 13))
            .into();
        c.next_send_psn = a.sq_psn.into();
        let mut p2 = log2(a.max_dest_rd_atomic) << 21;
        for (f, bit) in [
            (AccessFlags::REMOTE_READ, params2::RRE),
            (AccessFlags::REMOTE_WRITE, params2::RWE),
            (AccessFlags::REMOTE_ATOMIC, params2::RAE),
        ] {
            if a.qp_access_flags.contains(f) {
                p2 |= bit;
            }
        }
        if qp.srqn.is_some() {
            p2 |= params2::RIC;
        }
        c.params2 = p2.into();
        c.rnr_nextrecvpsn = ((u32::from(a.min_rnr_timer & 0x1f) << 24) | a.rq_psn).into();
        c.qkey = a.qkey.into();
        c.rq_wqe_counter = (qp.rq_ci as u16).into();
        c.sq_wqe_counter = (qp.sq_read as u16).into();
        Ok(c)
    }
}

impl Qp {
    /// A QP moved from RESET straight to ERR: no queues, nothing to flush.
    fn errored() -> Self {
        Self {
            qp_type: QpType::Rc,
            mlx: false,
            ctx: QpContext::default(),
            in_engine: false,
            usr_page: u32::MAX,
            sq: None,
            rq: None,
            srqn: None,
            db: None,
            send_cqn: u32::MAX,
            recv_cqn: u32::MAX,
            sq_valid: Cell::new(0),
            sq_read: 0,
            rq_ci: 0,
        }
    }
}

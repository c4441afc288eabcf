//! QP contexts per transition (Linux `__mlx4_ib_modify_qp`): which command a transition uses, the
//! full context built from the QP's merged attributes, and the optparam mask of the optional fields
//! the modify changes. QUERY_QP's context back into attributes.

use portverbs_hal::attr::{QpAttr, QpAttrMask};
use portverbs_hal::types::{AccessFlags, Mtu, QpState, QpType};

use super::objects::QpRec;
use crate::layout::ctx::{
    AddressPath, PM_MIGRATED, QpContext, QpMailbox, mtt_split, optpar, params2, qp_state, service,
};
use crate::layout::opcode;

/// The firmware command of `from → to` on transport `t`, from the HAL's one transition table;
/// `None` when the transition does not exist.
pub(crate) fn transition_opcode(t: QpType, from: QpState, to: QpState) -> Option<u16> {
    portverbs_hal::qp_state::transition(t, from, to).map(opcode::qp_command)
}

/// The QP state a context's flags encode.
pub(crate) fn state_of(flags: u32) -> Option<QpState> {
    qp_state::from_code(flags >> 28)
}

fn access_bits(a: AccessFlags) -> u32 {
    let mut v = 0;
    if a.contains(AccessFlags::REMOTE_READ) {
        v |= params2::RRE;
    }
    if a.contains(AccessFlags::REMOTE_WRITE) {
        v |= params2::RWE;
    }
    if a.contains(AccessFlags::REMOTE_ATOMIC) {
        v |= params2::RAE;
    }
    v
}

/// log2 rounded up of `n` (≥ 1), as Linux's fls(n − 1).
fn log_ceil(n: u8) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - u32::from(n - 1).leading_zeros()
    }
}

/// Everything a context needs besides the attributes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpEnv {
    pub(crate) qpn: u32,
    pub(crate) uar: u32,
    pub(crate) db_addr: u64,
    pub(crate) mtt_first: u64,
    pub(crate) log_max_msg: u8,
}

/// The modify mailbox for a transition to `a.qp_state`, `a` being the QP's whole record after
/// the modify (verbs-core's one copy), with `mask` telling which optional fields this modify
/// sets.
pub(crate) fn build(qp: &QpRec, a: &QpAttr, env: &QpEnv, mask: QpAttrMask) -> QpMailbox {
    let mut c = QpContext::default();
    let st = match qp.qp_type {
        _ if qp.special => service::MLX,
        QpType::Rc => service::RC,
        QpType::Uc => service::UC,
        QpType::Ud => service::UD,
    };
    c.flags = ((qp_state::code(a.qp_state) << 28) | (st << 16) | PM_MIGRATED).into();
    c.pd = qp.pd.into();
    let log = |n: u32| n.trailing_zeros() as u8;
    c.sq_size_stride = (log(qp.sq.cnt) << 3) | (qp.sq.shift as u8 - 4);
    if let Some(rq) = qp.rq {
        c.rq_size_stride = (log(rq.cnt) << 3) | (rq.shift as u8 - 4);
    }
    c.usr_page = env.uar.into();
    c.local_qpn = env.qpn.into();
    c.cqn_send = qp.send_cqn.into();
    c.cqn_recv = qp.recv_cqn.into();
    c.db_rec_addr = env.db_addr.into();
    let (hi, lo) = mtt_split(env.mtt_first);
    c.log_page_size = 0;
    c.mtt_base_hi = hi;
    c.mtt_base_lo = lo.into();
    // A responder without READ/atomic resources gets no remote read or atomic rights (the
    // rra_max field cannot say "none"; Linux does the same).
    let connected_state = !matches!(a.qp_state, QpState::Reset | QpState::Init);
    let rights = if a.max_dest_rd_atomic == 0 && connected_state {
        a.qp_access_flags & !(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
    } else {
        a.qp_access_flags
    };
    let mut p2 = access_bits(rights);
    if let Some(srqn) = qp.srqn {
        c.srqn = ((1 << 24) | srqn).into();
        p2 |= params2::RIC;
    }
    let mtu = if qp.qp_type == QpType::Ud {
        Mtu::Mtu4096
    } else {
        a.path_mtu
    };
    // UD: 8 KiB messages; the GSI QP: 2 KiB (as Linux `hw/mlx4/qp.c`); connected QPs: the device's.
    c.mtu_msgmax = ((mtu as u8) << 5)
        | match qp.qp_type {
            _ if qp.special => 11,
            QpType::Ud => 13,
            _ => env.log_max_msg,
        };
    c.qkey = a.qkey.into();
    c.remote_qpn = (a.dest_qp_num & 0xff_ffff).into();
    // Primary path: port, P_Key index, and (connected QPs) the destination.
    let av = &a.ah_attr;
    let mut path = AddressPath {
        pkey_index: a.pkey_index as u8,
        sched_queue: AddressPath::sched_queue_for(a.port_num.max(1), av.sl),
        // Link type 1 = Ethernet (RoCE), local ACK timeout above it.
        ackto: (a.timeout << 3) | 1,
        ..Default::default()
    };
    if qp.qp_type != QpType::Ud {
        path.grh_mylmc = (if av.is_global { 0x80 } else { 0 }) | (av.src_path_bits & 0x7f);
        path.rlid = av.dlid.into();
        path.mgid_index = av.sgid_index;
        path.static_rate = av.static_rate;
        path.hop_limit = av.hop_limit;
        path.tclass_flowlabel =
            ((u32::from(av.traffic_class) << 20) | (av.flow_label & 0xf_ffff)).into();
        path.rgid = av.dgid.0;
    }
    c.pri_path = path;
    let sra = log_ceil(a.max_rd_atomic);
    let rra = log_ceil(a.max_dest_rd_atomic);
    c.params1 = ((8 << 28)
        | (sra << 21)
        | (u32::from(a.retry_cnt & 7) << 16)
        | (u32::from(a.rnr_retry & 7) << 13))
        .into();
    c.params2 = (p2 | (rra << 21)).into();
    c.next_send_psn = (a.sq_psn & 0xff_ffff).into();
    c.rnr_nextrecvpsn = ((u32::from(a.min_rnr_timer & 0x1f) << 24) | (a.rq_psn & 0xff_ffff)).into();

    let mut opt = 0;
    let m = |f: QpAttrMask, bits: u32, opt: &mut u32| {
        if mask.contains(f) {
            *opt |= bits;
        }
    };
    m(
        QpAttrMask::ACCESS_FLAGS,
        optpar::RRE | optpar::RWE | optpar::RAE,
        &mut opt,
    );
    // The rights depend on max_dest_rd_atomic too (above): resend them when it changes.
    m(
        QpAttrMask::MAX_DEST_RD_ATOMIC,
        optpar::RRE | optpar::RWE | optpar::RAE,
        &mut opt,
    );
    m(QpAttrMask::PKEY_INDEX, optpar::PKEY_INDEX, &mut opt);
    m(QpAttrMask::QKEY, optpar::Q_KEY, &mut opt);
    m(QpAttrMask::MIN_RNR_TIMER, optpar::RNR_TIMEOUT, &mut opt);
    m(QpAttrMask::AV, optpar::PRIMARY_ADDR_PATH, &mut opt);
    m(QpAttrMask::PORT, optpar::SCHED_QUEUE, &mut opt);
    m(QpAttrMask::MAX_QP_RD_ATOMIC, optpar::SRA_MAX, &mut opt);
    m(QpAttrMask::MAX_DEST_RD_ATOMIC, optpar::RRA_MAX, &mut opt);
    m(QpAttrMask::RETRY_CNT, optpar::RETRY_COUNT, &mut opt);
    m(QpAttrMask::RNR_RETRY, optpar::RNR_RETRY, &mut opt);
    m(QpAttrMask::TIMEOUT, optpar::ACK_TIMEOUT, &mut opt);
    m(QpAttrMask::PATH_MIG_STATE, optpar::PM_STATE, &mut opt);
    QpMailbox {
        optpar: opt.into(),
        ctx: c,
        ..Default::default()
    }
}

/// Attributes from a QUERY_QP context, on top of what the driver knows (`known`): the state
/// and the sequence numbers come from the HCA.
pub(crate) fn parse_query(ctx: &QpContext, known: &QpAttr) -> Option<QpAttr> {
    let mut a = *known;
    let flags = ctx.flags.get();
    a.qp_state = state_of(flags)?;
    a.cur_qp_state = a.qp_state;
    a.sq_draining = flags >> 28 == qp_state::SQ_DRAINING;
    a.sq_psn = ctx.next_send_psn.get() & 0xff_ffff;
    a.rq_psn = ctx.rnr_nextrecvpsn.get() & 0xff_ffff;
    a.dest_qp_num = ctx.remote_qpn.get() & 0xff_ffff;
    a.qkey = ctx.qkey.get();
    Some(a)
}

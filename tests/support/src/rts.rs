//! Bringing a QP from RESET to RTS with the attributes and masks the IBTA table asks of each
//! transport (rdma-core's pyverbs masks), through any modify function: a device's
//! `modify_qp_blocking`, or an engine's `modify_qp` in a fabric node.

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpState, QpType};

/// The path and parameters of a bring-up. [`RtsParams::new`] gives the usual values; tests
/// that need others set the fields.
#[derive(Debug, Clone, Copy)]
pub struct RtsParams {
    /// The remote QP (unused for UD).
    pub dest_qpn: u32,
    /// The remote port's GID (unused for UD).
    pub dgid: Gid,
    /// Both the send PSN and the expected receive PSN.
    pub psn: u32,
    /// Remote access the QP grants (RC/UC).
    pub access: AccessFlags,
    /// The Q_Key (UD).
    pub qkey: u32,
    /// Outstanding READ/atomic requests, each way.
    pub rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
}

impl RtsParams {
    /// The usual bring-up towards `dest_qpn` at `dgid`: PSN `psn`, MTU 1024, remote write,
    /// read and atomic access, Q_Key 0x1111, 4 outstanding reads, timeout 14, 7 retries.
    pub fn new(dest_qpn: u32, dgid: Gid, psn: u32) -> Self {
        Self {
            dest_qpn,
            dgid,
            psn,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: 0x1111,
            rd_atomic: 4,
            min_rnr_timer: 1,
            timeout: 14,
        }
    }
}

/// Moves a QP of type `qp_type` RESET → INIT → RTR → RTS by calling `modify` three times.
pub fn to_rts(qp_type: QpType, p: &RtsParams, mut modify: impl FnMut(QpAttr, QpAttrMask)) {
    let connected = qp_type != QpType::Ud;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: p.access,
        port_num: 1,
        qkey: p.qkey,
        ..QpAttr::default()
    };
    let init_extra = if connected {
        QpAttrMask::ACCESS_FLAGS
    } else {
        QpAttrMask::QKEY
    };
    modify(
        a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | init_extra,
    );

    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = p.dest_qpn;
    a.rq_psn = p.psn;
    a.max_dest_rd_atomic = p.rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr = AddressVector {
        dgid: p.dgid,
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let rtr_extra = if connected {
        QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER
    } else {
        QpAttrMask::empty()
    };
    modify(a, QpAttrMask::STATE | rtr_extra);

    a.qp_state = QpState::Rts;
    a.sq_psn = p.psn;
    a.timeout = p.timeout;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = p.rd_atomic;
    let rts_extra = if connected {
        QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC
    } else {
        QpAttrMask::empty()
    };
    modify(a, QpAttrMask::STATE | QpAttrMask::SQ_PSN | rts_extra);
}

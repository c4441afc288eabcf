//! Bringing a QP from RESET to RTS with the attributes and masks the IBTA table asks of each
//! transport (`portverbs_verbs::bringup`, which decides them for every layer), through any
//! modify function: a device's `modify_qp_blocking`, or an engine's `modify_qp` in a fabric
//! node.

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpType};
use portverbs_verbs::bringup::{self, InitStep, RtrStep, RtsStep};

/// The port the helpers bring QPs up on.
const PORT: u8 = 1;

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

/// Moves a QP of type `qp_type` RESET → INIT → RTR → RTS on port 1 by calling `modify` three
/// times, with the attributes and masks of `portverbs_verbs::bringup`.
pub fn to_rts(qp_type: QpType, p: &RtsParams, mut modify: impl FnMut(QpAttr, QpAttrMask)) {
    let (attr, mask) = bringup::init(&InitStep {
        qp_type,
        port: PORT,
        pkey_index: 0,
        access: p.access,
        qkey: p.qkey,
    });
    modify(attr, mask);
    let (attr, mask) = bringup::rtr(&RtrStep {
        qp_type,
        av: AddressVector {
            dgid: p.dgid,
            is_global: true,
            hop_limit: 64,
            port_num: PORT,
            ..AddressVector::default()
        },
        path_mtu: Mtu::Mtu1024,
        dest_qpn: p.dest_qpn,
        rq_psn: p.psn,
        max_dest_rd_atomic: p.rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        access: None,
    });
    modify(attr, mask);
    let (attr, mask) = bringup::rts(&RtsStep {
        qp_type,
        sq_psn: p.psn,
        timeout: p.timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: p.rd_atomic,
    });
    modify(attr, mask);
}

//! Object contexts passed in SW2HW_* and QP-modify mailboxes (Linux `mlx4/mlx4.h`,
//! `include/linux/mlx4/qp.h`): EQ, CQ, SRQ and QP contexts, the QP address path, the modify mailbox
//! with its optparam mask, and the MPT entry. Queue buffers are described by an MTT range:
//! `mtt_base` = first MTT entry index × 8, split
//! into a high byte and a low dword, plus `log_page_size` = page shift − 12.

#![allow(missing_docs)]

use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;

/// Splits an MTT byte offset (entry index × 8) into the (high byte, low dword) pair.
pub fn mtt_split(first_entry: u64) -> (u8, u32) {
    let v = first_entry * 8;
    ((v >> 32) as u8, v as u32)
}

/// Joins the pair back into the first MTT entry index.
pub fn mtt_join(hi: u8, lo: u32) -> u64 {
    ((u64::from(hi) << 32) | u64::from(lo & !7)) / 8
}

/// EQ context, 64 bytes (Linux `struct mlx4_eq_context`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct EqContext {
    /// bits 31:28 status, bit18 EC, bit17 OI, bits 11:8 state.
    pub flags: U32,
    pub _r0: [u8; 4],
    pub page_offset: U32,
    /// log2(entries) in bits 4:0.
    pub log_eq_size: u8,
    pub _r1: [u8; 3],
    pub eq_period: U16,
    pub eq_max_count: U16,
    pub _r2: [u8; 2],
    /// MSI-X vector (10 bits).
    pub intr: U16,
    pub log_page_size: u8,
    pub _r3: [u8; 2],
    pub mtt_base_hi: u8,
    pub mtt_base_lo: U32,
    pub _r4: [u8; 8],
    pub consumer_index: U32,
    pub producer_index: U32,
    pub _r5: [u8; 0x10],
}
layout!(EqContext, 64, {
    flags: 0x00, page_offset: 0x08, log_eq_size: 0x0c, eq_period: 0x10, eq_max_count: 0x12,
    intr: 0x16, log_page_size: 0x18, mtt_base_hi: 0x1b, mtt_base_lo: 0x1c,
    consumer_index: 0x28, producer_index: 0x2c,
});

/// EQ state "armed" (EQC flags bits 11:8).
pub const EQ_STATE_ARMED: u32 = 0x9 << 8;
/// EQ state "fired".
pub const EQ_STATE_FIRED: u32 = 0xa << 8;

/// CQ context, 64 bytes (Linux `struct mlx4_cq_context`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CqContext {
    /// bits 31:28 status, bits 11:8 state, bit19 timestamps, bit18 collapsed, bit17 OI.
    pub flags: U32,
    pub _r0: [u8; 6],
    pub page_offset: U16,
    /// bits 28:24 log2(entries), bits 23:0 UAR index.
    pub logsize_usrpage: U32,
    pub cq_period: U16,
    pub cq_max_count: U16,
    /// 9-bit completion EQ number.
    pub comp_eqn: U32,
    pub log_page_size: u8,
    pub _r1: [u8; 2],
    pub mtt_base_hi: u8,
    pub mtt_base_lo: U32,
    pub last_notified_index: U32,
    pub solicit_producer_index: U32,
    pub consumer_index: U32,
    pub producer_index: U32,
    pub _r2: [u8; 8],
    /// Bus address of the CQ doorbell record.
    pub db_rec_addr: U64,
}
layout!(CqContext, 64, {
    flags: 0x00, page_offset: 0x0a, logsize_usrpage: 0x0c, cq_period: 0x10, cq_max_count: 0x12,
    comp_eqn: 0x14, log_page_size: 0x18, mtt_base_hi: 0x1b, mtt_base_lo: 0x1c,
    last_notified_index: 0x20, solicit_producer_index: 0x24, consumer_index: 0x28,
    producer_index: 0x2c, db_rec_addr: 0x38,
});

/// CQ flags: collapsed CQ (every CQE to entry 0).
pub const CQ_FLAG_COLLAPSED: u32 = 1 << 18;
/// CQ flags: overrun ignore.
pub const CQ_FLAG_OI: u32 = 1 << 17;

/// SRQ context, 48 bytes (Linux `struct mlx4_srq_context`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct SrqContext {
    /// bits 31:28 state, 27:24 log2(WQEs), 23:0 srqn.
    pub state_logsize_srqn: U32,
    /// wqe_shift − 4.
    pub logstride: u8,
    pub _r0: u8,
    pub xrcd: U16,
    /// bits 23:0 CQN (XRC).
    pub pg_offset_cqn: U32,
    pub _r1: [u8; 4],
    pub log_page_size: u8,
    pub _r2: [u8; 2],
    pub mtt_base_hi: u8,
    pub mtt_base_lo: U32,
    pub pd: U32,
    pub limit_watermark: U16,
    pub wqe_cnt: U16,
    pub _r3: [u8; 2],
    pub wqe_counter: U16,
    pub _r4: [u8; 4],
    pub db_rec_addr: U64,
}
layout!(SrqContext, 48, {
    state_logsize_srqn: 0x00, logstride: 0x04, xrcd: 0x06, pg_offset_cqn: 0x08,
    log_page_size: 0x10, mtt_base_hi: 0x13, mtt_base_lo: 0x14, pd: 0x18, limit_watermark: 0x1c,
    wqe_cnt: 0x1e, wqe_counter: 0x22, db_rec_addr: 0x28,
});

/// QP address path, 0x2c bytes (Linux `struct mlx4_qp_path`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct AddressPath {
    pub fl: u8,
    pub vlan_control: u8,
    pub disable_pkey_check: u8,
    pub pkey_index: u8,
    pub counter_index: u8,
    /// bit7 GRH present, bits 6:0 source path bits.
    pub grh_mylmc: u8,
    pub rlid: U16,
    /// bits 7:3 local ACK timeout, bits 2:0 link type.
    pub ackto: u8,
    pub mgid_index: u8,
    pub static_rate: u8,
    pub hop_limit: u8,
    /// bits 27:20 traffic class, 19:0 flow label.
    pub tclass_flowlabel: U32,
    pub rgid: [u8; 16],
    /// 0x83 | (port − 1) << 6 | SL << 2 for IB data QPs.
    pub sched_queue: u8,
    pub vlan_index: u8,
    pub feup: u8,
    pub fvl_rx: u8,
    pub _r0: [u8; 2],
    pub dmac: [u8; 6],
}
layout!(AddressPath, 0x2c, {
    fl: 0x00, vlan_control: 0x01, disable_pkey_check: 0x02, pkey_index: 0x03,
    counter_index: 0x04, grh_mylmc: 0x05, rlid: 0x06, ackto: 0x08, mgid_index: 0x09,
    static_rate: 0x0a, hop_limit: 0x0b, tclass_flowlabel: 0x0c, rgid: 0x10, sched_queue: 0x20,
    vlan_index: 0x21, feup: 0x22, fvl_rx: 0x23, dmac: 0x26,
});

impl AddressPath {
    /// The port (1-based) encoded in `sched_queue` bit 6.
    pub fn port(&self) -> u8 {
        ((self.sched_queue >> 6) & 1) + 1
    }

    /// `sched_queue` for an IB data QP on `port` with service level `sl`.
    pub fn sched_queue_for(port: u8, sl: u8) -> u8 {
        0x83 | ((port.wrapping_sub(1) & 1) << 6) | ((sl & 0xf) << 2)
    }
}

/// QP context, 0xf8 bytes (Linux `struct mlx4_qp_context`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct QpContext {
    /// bits 31:28 state, 19:16 service type, 12:11 path-migration state.
    pub flags: U32,
    pub pd: U32,
    /// bits 7:5 path MTU, 4:0 log2 max message.
    pub mtu_msgmax: u8,
    /// bits 6:3 log2 RQ WQEs, 2:0 RQ stride − 4.
    pub rq_size_stride: u8,
    /// bit7 no prefetch, 6:3 log2 SQ WQEs, 2:0 SQ stride − 4.
    pub sq_size_stride: u8,
    pub rlkey_roce_mode: u8,
    /// UAR index of the send doorbell.
    pub usr_page: U32,
    pub local_qpn: U32,
    pub remote_qpn: U32,
    pub pri_path: AddressPath,
    pub alt_path: AddressPath,
    /// bits 31:28 ack_req_freq, 23:21 sra_max, 18:16 retry_cnt, 15:13 rnr_retry.
    pub params1: U32,
    pub _r0: [u8; 4],
    pub next_send_psn: U32,
    pub cqn_send: U32,
    pub _r1: [u8; 8],
    pub last_acked_psn: U32,
    pub ssn: U32,
    /// bits 23:21 rra_max, bit15 RRE, bit14 RWE, bit13 RAE, bit4 RIC.
    pub params2: U32,
    /// bits 28:24 min_rnr_timer, 23:0 RQ PSN.
    pub rnr_nextrecvpsn: U32,
    pub xrcd: U32,
    pub cqn_recv: U32,
    /// Bus address of the RQ doorbell record.
    pub db_rec_addr: U64,
    pub qkey: U32,
    /// bit24 use SRQ, 23:0 SRQN.
    pub srqn: U32,
    pub msn: U32,
    pub rq_wqe_counter: U16,
    pub sq_wqe_counter: U16,
    pub _r2: [u8; 4],
    pub rate_limit_params: U16,
    pub _r3: u8,
    pub qos_vport: u8,
    pub param3: U32,
    pub nummmcpeers_basemkey: U32,
    pub log_page_size: u8,
    pub _r4: [u8; 2],
    pub mtt_base_hi: u8,
    pub mtt_base_lo: U32,
    pub _r5: [u8; 0x28],
}
layout!(QpContext, 0xf8, {
    flags: 0x00, pd: 0x04, mtu_msgmax: 0x08, rq_size_stride: 0x09, sq_size_stride: 0x0a,
    rlkey_roce_mode: 0x0b, usr_page: 0x0c, local_qpn: 0x10, remote_qpn: 0x14, pri_path: 0x18,
    alt_path: 0x44, params1: 0x70, next_send_psn: 0x78, cqn_send: 0x7c, last_acked_psn: 0x88,
    ssn: 0x8c, params2: 0x90, rnr_nextrecvpsn: 0x94, xrcd: 0x98, cqn_recv: 0x9c,
    db_rec_addr: 0xa0, qkey: 0xa8, srqn: 0xac, msn: 0xb0, rq_wqe_counter: 0xb4,
    sq_wqe_counter: 0xb6, rate_limit_params: 0xbc, qos_vport: 0xbf, param3: 0xc0,
    nummmcpeers_basemkey: 0xc4, log_page_size: 0xc8, mtt_base_hi: 0xcb, mtt_base_lo: 0xcc,
});

impl Default for QpContext {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// QP states as the context encodes them (Linux `enum mlx4_qp_state`).
pub mod qp_state {
    pub const RST: u32 = 0;
    pub const INIT: u32 = 1;
    pub const RTR: u32 = 2;
    pub const RTS: u32 = 3;
    pub const SQER: u32 = 4;
    pub const SQD: u32 = 5;
    pub const ERR: u32 = 6;
    pub const SQ_DRAINING: u32 = 7;

    use portverbs_hal::types::QpState;

    /// The code of a state (QPC flags bits 31:28).
    pub fn code(s: QpState) -> u32 {
        match s {
            QpState::Reset => RST,
            QpState::Init => INIT,
            QpState::Rtr => RTR,
            QpState::Rts => RTS,
            QpState::Sqd => SQD,
            QpState::Sqe => SQER,
            QpState::Err => ERR,
        }
    }

    /// The state a code names (SQ-draining reads as SQD); `None` for the reserved codes.
    pub fn from_code(code: u32) -> Option<QpState> {
        Some(match code {
            RST => QpState::Reset,
            INIT => QpState::Init,
            RTR => QpState::Rtr,
            RTS => QpState::Rts,
            SQER => QpState::Sqe,
            SQD | SQ_DRAINING => QpState::Sqd,
            ERR => QpState::Err,
            _ => return None,
        })
    }
}

/// Service types (QPC flags bits 19:16).
pub mod service {
    pub const RC: u32 = 0x0;
    pub const UC: u32 = 0x1;
    pub const UD: u32 = 0x3;
    pub const MLX: u32 = 0x7;
}

/// Path-migration state "migrated" (QPC flags bits 12:11 = 3).
pub const PM_MIGRATED: u32 = 3 << 11;

/// params2 bits.
pub mod params2 {
    pub const RRE: u32 = 1 << 15;
    pub const RWE: u32 = 1 << 14;
    pub const RAE: u32 = 1 << 13;
    pub const RIC: u32 = 1 << 4;
}

/// The QP modify mailbox: optparam mask, then the context at +8 (Linux `mlx4_qp_modify`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct QpMailbox {
    pub optpar: U32,
    pub _r: [u8; 4],
    pub ctx: QpContext,
}
layout!(QpMailbox, 0x100, { optpar: 0x00, ctx: 0x08 });

/// Optparam bits (Linux `enum mlx4_qp_optpar`).
pub mod optpar {
    pub const ALT_ADDR_PATH: u32 = 1 << 0;
    pub const RRE: u32 = 1 << 1;
    pub const RAE: u32 = 1 << 2;
    pub const RWE: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const Q_KEY: u32 = 1 << 5;
    pub const RNR_TIMEOUT: u32 = 1 << 6;
    pub const PRIMARY_ADDR_PATH: u32 = 1 << 7;
    pub const SRA_MAX: u32 = 1 << 8;
    pub const RRA_MAX: u32 = 1 << 9;
    pub const PM_STATE: u32 = 1 << 10;
    pub const RETRY_COUNT: u32 = 1 << 12;
    pub const RNR_RETRY: u32 = 1 << 13;
    pub const ACK_TIMEOUT: u32 = 1 << 14;
    pub const SCHED_QUEUE: u32 = 1 << 16;
}

/// MPT entry, 64 bytes (Linux `struct mlx4_mpt_entry`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct Mpt {
    /// bits 31:28 status, access bits 14:10, bit9 PHYSICAL, bit8 REGION, bit15 BIND.
    pub flags: U32,
    /// bits 31:8 QPN of a bound type-2 window, bit7 "bound to QP".
    pub qpn: U32,
    /// rotr8(key).
    pub key: U32,
    /// bits 23:0 PD, bit24/25 invalidate enables.
    pub pd_flags: U32,
    pub start: U64,
    pub length: U64,
    pub lkey: U32,
    pub win_cnt: U32,
    /// bit22 len64.
    pub mtt_rep: U32,
    pub mtt_addr: U64,
    pub mtt_sz: U32,
    pub entity_size: U32,
    pub first_byte_offset: U32,
}
layout!(Mpt, 64, {
    flags: 0x00, qpn: 0x04, key: 0x08, pd_flags: 0x0c, start: 0x10, length: 0x18, lkey: 0x20,
    win_cnt: 0x24, mtt_rep: 0x28, mtt_addr: 0x2c, mtt_sz: 0x34, entity_size: 0x38,
    first_byte_offset: 0x3c,
});

/// MPT flag bits (Linux `mlx4/mr.c`, `MLX4_MPT_FLAG_*` and `MLX4_PERM_*`).
pub mod mpt_flag {
    pub const STATUS_SW: u32 = 0xf << 28;
    pub const STATUS_FREE: u32 = 0x3 << 28;
    pub const MIO: u32 = 1 << 17;
    pub const BIND_ENABLE: u32 = 1 << 15;
    pub const ATOMIC: u32 = 1 << 14;
    pub const REMOTE_WRITE: u32 = 1 << 13;
    pub const REMOTE_READ: u32 = 1 << 12;
    pub const LOCAL_WRITE: u32 = 1 << 11;
    pub const LOCAL_READ: u32 = 1 << 10;
    pub const PHYSICAL: u32 = 1 << 9;
    pub const REGION: u32 = 1 << 8;
    /// pd_flags: remote invalidate and invalidate enables.
    pub const EN_INV: u32 = 3 << 24;
    /// qpn dword: type-2 window ("bound to QP").
    pub const QP_BOUND: u32 = 1 << 7;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cq_context_worked_encoding() {
        // A worked encoding: 256 CQEs, UAR 130, EQ 1, MTT index 16, 4 KiB pages.
        let (hi, lo) = mtt_split(16);
        let ctx = CqContext {
            logsize_usrpage: ((8u32 << 24) | 130).into(),
            comp_eqn: 1.into(),
            log_page_size: 0,
            mtt_base_hi: hi,
            mtt_base_lo: lo.into(),
            ..Default::default()
        };
        let b = ctx.as_bytes();
        assert_eq!(&b[0x0c..0x10], &0x0800_0082u32.to_be_bytes());
        assert_eq!(b[0x17], 1);
        assert_eq!(b[0x18], 0);
        assert_eq!(b[0x1b], 0);
        assert_eq!(&b[0x1c..0x20], &0x80u32.to_be_bytes());
        assert_eq!(mtt_join(hi, lo), 16);
    }

    #[test]
    fn sched_queue_holds_the_port() {
        let p = AddressPath {
            sched_queue: AddressPath::sched_queue_for(2, 3),
            ..Default::default()
        };
        assert_eq!(p.sched_queue, 0x83 | 0x40 | 0x0c);
        assert_eq!(p.port(), 2);
    }
}

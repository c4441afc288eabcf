//! Completion queue entries (Linux `include/linux/mlx4/cq.h`, rdma-core `providers/mlx4/cq.c`):
//! the 32-byte CQE and its error form, opcodes and syndromes, ownership, and the translation to and
//! from the portable [`Cqe`].
//!
//! One decoder per format: [`decode_split`] for a CQE (its commonest entries through its first
//! arm, [`decode_plain_send`], which a poll loop may also call on its own) and
//! `error_completion` for an error CQE; [`decode`] runs them over a local copy. They are the
//! driver's side and treat the entry as hostile: an unknown opcode is an error, an unknown
//! syndrome becomes `GeneralErr` (as rdma-core does), nothing panics. [`encode`] is the
//! emulated HCA's side.

#![allow(missing_docs)]

use portverbs_hal::error::CqeError;
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus, WorkCompletion, WqeRef};
use zerocopy::byteorder::big_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;
use super::wqe::opcode as op;

/// Bytes per CQE.
pub const CQE_SIZE: usize = 32;

/// The CQE (`struct mlx4_cqe`).
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
pub struct CqeLayout {
    /// bits 23:0 local QPN.
    pub vlan_my_qpn: U32,
    /// Immediate data, invalidated rkey, or P_Key index.
    pub immed_rss_invalid: U32,
    /// bit31 GRH, 30:24 path bits, 23:0 source QPN.
    pub g_mlpath_rqpn: U32,
    /// SL in bits 15:12 (IB).
    pub sl_vid: U16,
    pub rlid: U16,
    pub status: U32,
    pub byte_cnt: U32,
    pub wqe_index: U16,
    pub checksum: U16,
    pub reserved3: u8,
    pub ts_15_8: u8,
    pub ts_7_0: u8,
    /// bit7 owner, bit6 is_send, 4:0 opcode.
    pub owner_sr_opcode: u8,
}
layout!(CqeLayout, 32, {
    vlan_my_qpn: 0, immed_rss_invalid: 4, g_mlpath_rqpn: 8, sl_vid: 12, rlid: 14, status: 16,
    byte_cnt: 20, wqe_index: 24, checksum: 26, reserved3: 28, ts_15_8: 29, ts_7_0: 30,
    owner_sr_opcode: 31,
});

/// The error CQE (`struct mlx4_err_cqe`).
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
pub struct ErrCqeLayout {
    pub vlan_my_qpn: U32,
    pub _r0: [u8; 20],
    pub wqe_index: U16,
    pub vendor_err: u8,
    pub syndrome: u8,
    pub _r1: [u8; 3],
    pub owner_sr_opcode: u8,
}
layout!(ErrCqeLayout, 32, { vlan_my_qpn: 0, wqe_index: 24, vendor_err: 26, syndrome: 27, owner_sr_opcode: 31 });

/// Owner bit of byte 31.
pub const OWNER_MASK: u8 = 0x80;
/// is_send bit of byte 31.
pub const IS_SEND_MASK: u8 = 0x40;
/// Opcode bits of byte 31.
pub const OPCODE_MASK: u8 = 0x1f;
/// QPN bits of dword 0.
pub const QPN_MASK: u32 = 0xff_ffff;
/// Error CQE opcode.
pub const OPCODE_ERROR: u8 = 0x1e;
/// Resize CQE opcode.
pub const OPCODE_RESIZE: u8 = 0x16;

/// Receive-side opcodes (rdma-core `providers/mlx4/cq.c`).
pub mod recv_opcode {
    pub const RDMA_WRITE_IMM: u8 = 0x00;
    pub const SEND: u8 = 0x01;
    pub const SEND_IMM: u8 = 0x02;
    pub const SEND_INVAL: u8 = 0x03;
}

/// Error syndromes (Linux `hw/mlx4/cq.c`, rdma-core `providers/mlx4/cq.c`).
pub mod syndrome {
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    pub const WR_FLUSH_ERR: u8 = 0x05;
    pub const MW_BIND_ERR: u8 = 0x06;
    pub const BAD_RESP_ERR: u8 = 0x10;
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    pub const REMOTE_OP_ERR: u8 = 0x14;
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;
    /// What the model writes for statuses mlx4 has no syndrome for (decoded as GeneralErr).
    pub const GENERAL: u8 = 0xff;
}

/// The completion status of a syndrome; unknown ones are `GeneralErr`.
pub fn status_of(s: u8) -> WcStatus {
    use syndrome::*;
    match s {
        LOCAL_LENGTH_ERR => WcStatus::LocLenErr,
        LOCAL_QP_OP_ERR => WcStatus::LocQpOpErr,
        LOCAL_PROT_ERR => WcStatus::LocProtErr,
        WR_FLUSH_ERR => WcStatus::WrFlushErr,
        MW_BIND_ERR => WcStatus::MwBindErr,
        BAD_RESP_ERR => WcStatus::BadRespErr,
        LOCAL_ACCESS_ERR => WcStatus::LocAccessErr,
        REMOTE_INVAL_REQ_ERR => WcStatus::RemInvReqErr,
        REMOTE_ACCESS_ERR => WcStatus::RemAccessErr,
        REMOTE_OP_ERR => WcStatus::RemOpErr,
        TRANSPORT_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        REMOTE_ABORTED_ERR => WcStatus::RemAbortErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The syndrome of a completion status.
pub fn syndrome_of(s: WcStatus) -> u8 {
    use syndrome::*;
    match s {
        WcStatus::LocLenErr => LOCAL_LENGTH_ERR,
        WcStatus::LocQpOpErr => LOCAL_QP_OP_ERR,
        WcStatus::LocProtErr => LOCAL_PROT_ERR,
        WcStatus::WrFlushErr => WR_FLUSH_ERR,
        WcStatus::MwBindErr => MW_BIND_ERR,
        WcStatus::BadRespErr => BAD_RESP_ERR,
        WcStatus::LocAccessErr => LOCAL_ACCESS_ERR,
        WcStatus::RemInvReqErr => REMOTE_INVAL_REQ_ERR,
        WcStatus::RemAccessErr => REMOTE_ACCESS_ERR,
        WcStatus::RemOpErr => REMOTE_OP_ERR,
        WcStatus::RetryExcErr => TRANSPORT_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => RNR_RETRY_EXC_ERR,
        WcStatus::RemAbortErr => REMOTE_ABORTED_ERR,
        _ => GENERAL,
    }
}

/// The owner bit of a raw entry (byte 31 bit 7).
#[inline]
pub fn owner(entry: &[u8]) -> bool {
    entry.get(CQE_SIZE - 1).is_some_and(|b| b & OWNER_MASK != 0)
}

/// Decodes a CQE whose ownership was checked, out of a local copy: [`decode_split`] over its
/// two parts, for callers that want a [`Cqe`]. `cqn` and `index` only label errors.
///
/// # Errors
/// Too short, or an opcode unknown for its direction.
pub fn decode(entry: &[u8], cqn: u32, index: u32) -> Result<Cqe, CqeError> {
    let (Some(head), Some(tail)) = (
        entry.first_chunk::<TAIL_AT>(),
        entry
            .get(TAIL_AT..CQE_SIZE)
            .and_then(|t| t.first_chunk::<8>()),
    ) else {
        return Err(CqeError::Malformed {
            cqn,
            index,
            what: "entry shorter than 32 bytes",
        });
    };
    let mut w = WorkCompletion::default();
    let r = decode_split(head, tail, &mut w).map_err(|e| e.at(cqn, index))?;
    Ok(Cqe { wc: w, wqe: r })
}

/// Where the tail (the 8 bytes whose load proves ownership) starts.
const TAIL_AT: usize = CQE_SIZE - 8;

/// Offsets of the fields the decoders read, from the layouts: in the head (bytes 0..24) for
/// those below [`TAIL_AT`], else in the tail.
mod at {
    use core::mem::offset_of;

    use super::{CqeLayout, ErrCqeLayout, TAIL_AT};

    pub(super) const QPN: usize = offset_of!(CqeLayout, vlan_my_qpn);
    pub(super) const IMM: usize = offset_of!(CqeLayout, immed_rss_invalid);
    pub(super) const G_MLPATH_RQPN: usize = offset_of!(CqeLayout, g_mlpath_rqpn);
    pub(super) const SL_VID: usize = offset_of!(CqeLayout, sl_vid);
    pub(super) const RLID: usize = offset_of!(CqeLayout, rlid);
    pub(super) const BYTE_CNT: usize = offset_of!(CqeLayout, byte_cnt);
    pub(super) const WQE_INDEX: usize = offset_of!(CqeLayout, wqe_index) - TAIL_AT;
    pub(super) const OWNER_SR_OPCODE: usize = offset_of!(CqeLayout, owner_sr_opcode) - TAIL_AT;
    pub(super) const VENDOR_ERR: usize = offset_of!(ErrCqeLayout, vendor_err) - TAIL_AT;
    pub(super) const SYNDROME: usize = offset_of!(ErrCqeLayout, syndrome) - TAIL_AT;
    const _: () = {
        assert!(offset_of!(ErrCqeLayout, vlan_my_qpn) == QPN);
        assert!(offset_of!(ErrCqeLayout, wqe_index) - TAIL_AT == WQE_INDEX);
        assert!(offset_of!(ErrCqeLayout, owner_sr_opcode) - TAIL_AT == OWNER_SR_OPCODE);
        assert!(BYTE_CNT + 4 <= TAIL_AT && RLID + 2 <= TAIL_AT);
    };
}

#[inline(always)]
fn be32(b: &[u8; TAIL_AT], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The WQE counter of either CQE format.
#[inline(always)]
fn wqe_index(tail: &[u8; 8]) -> u16 {
    u16::from_be_bytes([tail[at::WQE_INDEX], tail[at::WQE_INDEX + 1]])
}

/// An opcode with no meaning in its direction (the one way a CQE whose ownership was checked
/// fails to decode); [`UnknownOpcode::at`] names the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownOpcode {
    pub is_send: bool,
    pub opcode: u8,
}

impl UnknownOpcode {
    /// The error for entry `index` of CQ `cqn`.
    #[cold]
    pub fn at(self, cqn: u32, index: u32) -> CqeError {
        CqeError::BadOpcode {
            cqn,
            index,
            dir: if self.is_send { "send" } else { "receive" },
            opcode: self.opcode,
        }
    }
}

/// The commonest entry, decoded with two compares: a successful RDMA WRITE or SEND send
/// completion (no byte count, flags or receive fields). Returns its WQE counter, or `None` for
/// any other entry (then [`decode_split`] decodes it, `w` untouched). Its caller knows at
/// compile time that the entry is a send completion.
#[inline(always)]
pub fn decode_plain_send(
    head: &[u8; TAIL_AT],
    tail: &[u8; 8],
    w: &mut WorkCompletion,
) -> Option<u16> {
    let opcode = match tail[at::OWNER_SR_OPCODE] & (IS_SEND_MASK | OPCODE_MASK) {
        x if x == IS_SEND_MASK | op::RDMA_WRITE => WcOpcode::RdmaWrite,
        x if x == IS_SEND_MASK | op::SEND => WcOpcode::Send,
        _ => return None,
    };
    w.qp_num = be32(head, at::QPN) & QPN_MASK;
    w.byte_len = 0;
    w.status = WcStatus::Success;
    w.opcode = opcode;
    w.sl = 0;
    w.dlid_path_bits = 0;
    w.wc_flags = WcFlags::empty();
    w.vendor_err = 0;
    w.imm_data = 0;
    w.src_qp = 0;
    w.pkey_index = 0;
    w.slid = 0;
    Some(wqe_index(tail))
}

/// The CQE decoder (it hands an error CQE to that format's decoder, `error_completion`):
/// decodes the entry read as its first 24 bytes and its last 8 (the word whose acquire load
/// proved ownership), so that the entry is never reassembled, straight into the application's work completion (`wr_id` left
/// for the core), and returns which work request it completes; the caller names the entry in
/// the error. The commonest entries are [`decode_plain_send`]'s, tried first.
///
/// # Errors
/// An opcode unknown for its direction.
#[inline(always)]
pub fn decode_split(
    head: &[u8; TAIL_AT],
    tail: &[u8; 8],
    w: &mut WorkCompletion,
) -> Result<WqeRef, UnknownOpcode> {
    if let Some(index) = decode_plain_send(head, tail, w) {
        return Ok(WqeRef {
            is_send: true,
            index,
        });
    }
    let osr = tail[at::OWNER_SR_OPCODE];
    let is_send = osr & IS_SEND_MASK != 0;
    let opcode = osr & OPCODE_MASK;
    let r = WqeRef {
        is_send,
        index: wqe_index(tail),
    };
    let qp_num = be32(head, at::QPN) & QPN_MASK;
    if opcode == OPCODE_ERROR {
        *w = error_completion(qp_num, tail);
        return Ok(r);
    }
    if is_send {
        let (opcode, wc_flags, byte_len) = send_completion(opcode, be32(head, at::BYTE_CNT))
            .ok_or(UnknownOpcode {
                is_send: true,
                opcode,
            })?;
        *w = WorkCompletion {
            qp_num,
            opcode,
            wc_flags,
            byte_len,
            ..WorkCompletion::default()
        };
        return Ok(r);
    }
    let imm = be32(head, at::IMM);
    let g = be32(head, at::G_MLPATH_RQPN);
    let mut wc_flags = if g & (1 << 31) != 0 {
        WcFlags::GRH
    } else {
        WcFlags::empty()
    };
    let mut imm_data = 0;
    let mut pkey_index = 0;
    let opcode = match opcode {
        recv_opcode::RDMA_WRITE_IMM => {
            wc_flags |= WcFlags::WITH_IMM;
            imm_data = imm;
            WcOpcode::RecvRdmaWithImm
        }
        recv_opcode::SEND => {
            pkey_index = (imm & 0x7f) as u16;
            WcOpcode::Recv
        }
        recv_opcode::SEND_IMM => {
            wc_flags |= WcFlags::WITH_IMM;
            imm_data = imm;
            WcOpcode::Recv
        }
        recv_opcode::SEND_INVAL => {
            wc_flags |= WcFlags::WITH_INV;
            imm_data = imm;
            WcOpcode::Recv
        }
        _ => {
            return Err(UnknownOpcode {
                is_send: false,
                opcode,
            });
        }
    };
    *w = WorkCompletion {
        qp_num,
        opcode,
        wc_flags,
        byte_len: be32(head, at::BYTE_CNT),
        imm_data,
        src_qp: g & QPN_MASK,
        dlid_path_bits: ((g >> 24) & 0x7f) as u8,
        pkey_index,
        slid: u16::from_be_bytes([head[at::RLID], head[at::RLID + 1]]),
        sl: head[at::SL_VID] >> 4,
        ..WorkCompletion::default()
    };
    Ok(r)
}

/// Opcode, flags and byte count of a send completion other than a plain RDMA WRITE or SEND
/// (those are [`decode_plain_send`]'s; kept out of line so that they stay two compares instead
/// of a jump table).
#[inline(never)]
fn send_completion(opcode: u8, byte_cnt: u32) -> Option<(WcOpcode, WcFlags, u32)> {
    Some(match opcode {
        op::SEND_INVAL => (WcOpcode::Send, WcFlags::empty(), 0),
        op::SEND_IMM => (WcOpcode::Send, WcFlags::WITH_IMM, 0),
        op::RDMA_WRITE_IMM => (WcOpcode::RdmaWrite, WcFlags::WITH_IMM, 0),
        op::RDMA_READ => (WcOpcode::RdmaRead, WcFlags::empty(), byte_cnt),
        op::ATOMIC_CS => (WcOpcode::CompSwap, WcFlags::empty(), 8),
        op::ATOMIC_FA => (WcOpcode::FetchAdd, WcFlags::empty(), 8),
        op::BIND_MW => (WcOpcode::BindMw, WcFlags::empty(), 0),
        op::LOCAL_INVAL => (WcOpcode::LocalInv, WcFlags::empty(), 0),
        _ => return None,
    })
}

/// The error CQE decoder (`struct mlx4_err_cqe`, its vendor error and syndrome in the tail):
/// the completion of QP `qp_num`. A success syndrome inside an error CQE would complete a WR
/// that failed.
#[cold]
fn error_completion(qp_num: u32, tail: &[u8; 8]) -> WorkCompletion {
    WorkCompletion {
        qp_num,
        status: match status_of(tail[at::SYNDROME]) {
            WcStatus::Success => WcStatus::GeneralErr,
            s => s,
        },
        vendor_err: u32::from(tail[at::VENDOR_ERR]),
        ..WorkCompletion::default()
    }
}

/// Encodes a completion as the HCA writes it, with `owner` as the wrap parity of its producer
/// counter.
pub fn encode(cqe: &Cqe, owner: bool) -> [u8; CQE_SIZE] {
    let mut out = [0u8; CQE_SIZE];
    let own = if owner { OWNER_MASK } else { 0 };
    let send = if cqe.wqe.is_send { IS_SEND_MASK } else { 0 };
    if cqe.wc.status != WcStatus::Success {
        let e = ErrCqeLayout {
            vlan_my_qpn: (cqe.wc.qp_num & QPN_MASK).into(),
            wqe_index: cqe.wqe.index.into(),
            vendor_err: cqe.wc.vendor_err as u8,
            syndrome: syndrome_of(cqe.wc.status),
            owner_sr_opcode: own | send | OPCODE_ERROR,
            ..Default::default()
        };
        out.copy_from_slice(e.as_bytes());
        return out;
    }
    let imm_flag = cqe.wc.wc_flags.contains(WcFlags::WITH_IMM);
    let opcode = if cqe.wqe.is_send {
        match cqe.wc.opcode {
            WcOpcode::Send if imm_flag => op::SEND_IMM,
            WcOpcode::RdmaWrite if imm_flag => op::RDMA_WRITE_IMM,
            WcOpcode::RdmaWrite => op::RDMA_WRITE,
            WcOpcode::RdmaRead => op::RDMA_READ,
            WcOpcode::CompSwap => op::ATOMIC_CS,
            WcOpcode::FetchAdd => op::ATOMIC_FA,
            WcOpcode::BindMw => op::BIND_MW,
            WcOpcode::LocalInv => op::LOCAL_INVAL,
            _ => op::SEND,
        }
    } else if cqe.wc.opcode == WcOpcode::RecvRdmaWithImm {
        recv_opcode::RDMA_WRITE_IMM
    } else if cqe.wc.wc_flags.contains(WcFlags::WITH_INV) {
        recv_opcode::SEND_INVAL
    } else if imm_flag {
        recv_opcode::SEND_IMM
    } else {
        recv_opcode::SEND
    };
    let imm = if cqe
        .wc
        .wc_flags
        .intersects(WcFlags::WITH_IMM | WcFlags::WITH_INV)
    {
        cqe.wc.imm_data
    } else {
        u32::from(cqe.wc.pkey_index & 0x7f)
    };
    let grh = if cqe.wc.wc_flags.contains(WcFlags::GRH) {
        1 << 31
    } else {
        0
    };
    let c = CqeLayout {
        vlan_my_qpn: (cqe.wc.qp_num & QPN_MASK).into(),
        immed_rss_invalid: imm.into(),
        g_mlpath_rqpn: (grh
            | (u32::from(cqe.wc.dlid_path_bits & 0x7f) << 24)
            | (cqe.wc.src_qp & QPN_MASK))
            .into(),
        sl_vid: (u16::from(cqe.wc.sl & 0xf) << 12).into(),
        rlid: cqe.wc.slid.into(),
        byte_cnt: cqe.wc.byte_len.into(),
        wqe_index: cqe.wqe.index.into(),
        owner_sr_opcode: own | send | opcode,
        ..Default::default()
    };
    out.copy_from_slice(c.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_encodings_of_facts_10_1() {
        // Send CQE of a signaled RDMA WRITE, first pass, counter 0.
        let cqe = Cqe {
            wc: WorkCompletion {
                qp_num: 0x48,
                opcode: WcOpcode::RdmaWrite,
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send: true,
                ..WqeRef::default()
            },
        };
        let b = encode(&cqe, false);
        assert_eq!(&b[0..4], &0x48u32.to_be_bytes());
        assert_eq!(&b[0x18..0x1a], &[0, 0]);
        assert_eq!(b[0x1f], 0x48);
        // Receive CQE for SEND_WITH_IMM on the second pass.
        let rcqe = Cqe {
            wc: WorkCompletion {
                qp_num: 0x49,
                opcode: WcOpcode::Recv,
                wc_flags: WcFlags::WITH_IMM,
                imm_data: 0x1234_5678,
                byte_len: 64,
                ..WorkCompletion::default()
            },
            ..Cqe::default()
        };
        let b = encode(&rcqe, true);
        assert_eq!(b[0x1f], 0x82);
        assert!(owner(&b));
        assert_eq!(decode(&b, 1, 0).unwrap(), rcqe);
    }

    #[test]
    fn error_cqes_round_trip_every_syndrome() {
        for s in [
            0x01, 0x02, 0x04, 0x05, 0x06, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x22,
        ] {
            let status = status_of(s);
            assert_ne!(status, WcStatus::GeneralErr);
            assert_eq!(syndrome_of(status), s);
            let cqe = Cqe {
                wc: WorkCompletion {
                    qp_num: 7,
                    status,
                    vendor_err: 0x33,
                    ..WorkCompletion::default()
                },
                wqe: WqeRef {
                    is_send: true,
                    index: 9,
                },
            };
            let d = decode(&encode(&cqe, false), 1, 0).unwrap();
            assert_eq!(
                (d.wc.status, d.wqe.index, d.wc.vendor_err),
                (status, 9, 0x33)
            );
        }
        assert_eq!(status_of(0x77), WcStatus::GeneralErr);
    }

    #[test]
    fn unknown_opcodes_are_errors_not_panics() {
        let mut b = [0u8; 32];
        b[31] = IS_SEND_MASK | 0x1d;
        assert!(matches!(
            decode(&b, 3, 4),
            Err(CqeError::BadOpcode { dir: "send", .. })
        ));
        b[31] = 0x07;
        assert!(matches!(
            decode(&b, 3, 4),
            Err(CqeError::BadOpcode { dir: "receive", .. })
        ));
        assert!(decode(&b[..10], 3, 4).is_err());
    }

    #[test]
    fn the_plain_send_arm_takes_exactly_successful_writes_and_sends() {
        // Every direction/opcode byte (owner bit both ways) over an entry with every other
        // byte set: the fast arm takes exactly successful RDMA WRITE and SEND send completions,
        // filling every field but `wr_id` (the core's); `decode_split` gives the same.
        let mut taken = 0;
        for osr in 0..=u8::MAX {
            let mut b = [0xa5u8; CQE_SIZE];
            b[CQE_SIZE - 1] = osr;
            let (head, tail) = (b.first_chunk().unwrap(), b.last_chunk().unwrap());
            let stale = WorkCompletion {
                wr_id: 0x77,
                byte_len: 9,
                imm_data: 9,
                slid: 9,
                ..WorkCompletion::default()
            };
            let mut fast = stale;
            let expected = match osr & (IS_SEND_MASK | OPCODE_MASK) {
                x if x == IS_SEND_MASK | op::RDMA_WRITE => Some(WcOpcode::RdmaWrite),
                x if x == IS_SEND_MASK | op::SEND => Some(WcOpcode::Send),
                _ => None,
            };
            match (decode_plain_send(head, tail, &mut fast), expected) {
                (Some(index), Some(opcode)) => {
                    taken += 1;
                    assert_eq!(index, 0xa5a5, "{osr:#x}");
                    let want = WorkCompletion {
                        wr_id: 0x77,
                        qp_num: 0xa5_a5a5,
                        opcode,
                        ..WorkCompletion::default()
                    };
                    assert_eq!(fast, want, "{osr:#x}");
                    let mut full = stale;
                    assert_eq!(
                        decode_split(head, tail, &mut full),
                        Ok(WqeRef {
                            is_send: true,
                            index
                        })
                    );
                    assert_eq!(full, want, "{osr:#x}");
                }
                (None, None) => assert_eq!(fast, stale, "{osr:#x}: untouched"),
                (got, want) => panic!("{osr:#x}: took {got:?}, expected {want:?}"),
            }
        }
        assert_eq!(
            taken, 8,
            "two opcodes, owner bit and reserved bit 5 either way"
        );
    }
}

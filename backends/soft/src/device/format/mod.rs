//! The software device's own queue formats. They are deliberately *not* mlx4's: little-endian,
//! fixed headers, one owner byte per entry. Both directions live here, as plain functions and inherent
//! methods: the host-side encoders and decoders the queue objects call, and the device-side WQE
//! decoders and CQE/EQE encoders the engine uses through the `Hca` adapter. The rings they are
//! copied into and out of are [`portverbs_dma::ring`]'s.
//!
//! | entry | size | layout |
//! |---|---|---|
//! | send WQE | stride ≥ 64 | [`SendHeader`] (64 B), then on UD a [`DatagramSeg`] (48 B), then SGEs (16 B each) or inline bytes |
//! | receive WQE | stride ≥ 32 | [`RecvHeader`] (16 B), then SGEs |
//! | CQE | 32 | [`SoftCqe`] |
//! | EQE | 16 | [`SoftEqe`] |
//!
//! Ownership: byte 0 of a WQE and the last byte of a CQE/EQE hold the owner bit (bit 0), equal
//! to the wrap parity of the producer's counter (see [`portverbs_dma::ring`]). WQE slots start
//! with owner = 1 (not valid on pass 0); the device initialises CQ/EQ entries the same way.
//!
//! The code is split by entry: [`SendFormat`] and the send strides in `send`, the device-side
//! [`decode_send`] in `send_decode`, receive WQEs in `recv`, [`CqeCodec`] in `cqe` and
//! [`EqeCodec`] in `eqe`. This file holds what they share: the sizes, the `repr(C)` layouts,
//! the opcode and event codes, and the SGE helpers.

use portverbs_hal::types::QpType;
use portverbs_hal::wr::Sge;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

mod cqe;
mod eqe;
mod recv;
mod send;
mod send_decode;

pub use cqe::CqeCodec;
pub use eqe::{EqeCodec, EventType};
pub use recv::{RecvFormat, decode_recv, recv_stride};
pub use send::{EncodeContext, SendFormat, send_stride};
pub use send_decode::{decode_send, send_owner};

/// Bytes of the send WQE header.
pub const SEND_HEADER: usize = 64;
/// Bytes of the UD datagram segment.
pub const DATAGRAM_SEG: usize = 48;
/// Bytes of the receive WQE header.
pub const RECV_HEADER: usize = 16;
/// Bytes of one scatter/gather entry.
pub const SGE_SIZE: usize = 16;
/// Smallest receive WQE slot (a header and one SGE): the `MIN` of the work-queue rings.
pub const RECV_MIN: usize = RECV_HEADER + SGE_SIZE;
/// Bytes of a CQE.
pub const CQE_SIZE: usize = 32;
/// Bytes of an EQE.
pub const EQE_SIZE: usize = 16;

/// Send WQE header.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SendHeader {
    /// Bit 0: owner.
    pub owner: u8,
    /// [`SoftOp`] code.
    pub opcode: u8,
    /// Bit 0 signaled, 1 solicited, 2 fence, 3 inline.
    pub flags: u8,
    /// Number of SGEs that follow.
    pub num_sge: u8,
    /// Immediate data / rkey to invalidate.
    pub imm: U32,
    /// Inline byte count.
    pub inline_len: U32,
    /// Remote key.
    pub rkey: U32,
    /// Remote address (bind: window start).
    pub raddr: U64,
    /// Compare value (bind: window length).
    pub compare: U64,
    /// Swap or add value.
    pub swap_add: U64,
    /// Reserved (the window is named by the index of `new_rkey`).
    pub reserved_mw: U32,
    /// Bind: the new rkey.
    pub new_rkey: U32,
    /// Bind: the MR's lkey.
    pub mr_lkey: U32,
    /// Bind: access flags (low 16 bits) and window type (bits 16..24).
    pub bind_info: U32,
    /// Reserved.
    pub reserved: [u8; 8],
}

/// UD datagram segment.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DatagramSeg {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QP.
    pub remote_qpn: U32,
    /// Q_Key.
    pub qkey: U32,
    /// Flow label.
    pub flow_label: U32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Destination LID.
    pub dlid: U16,
    /// Port.
    pub port: u8,
    /// GRH present.
    pub is_global: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Reserved.
    pub reserved: [u8; 10],
}

/// One SGE as stored in a WQE.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SgeSeg {
    /// Address.
    pub addr: U64,
    /// Length.
    pub length: U32,
    /// Local key.
    pub lkey: U32,
}

/// Receive WQE header.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RecvHeader {
    /// Number of SGEs.
    pub num_sge: u8,
    /// Reserved.
    pub reserved: [u8; 15],
}

/// Completion queue entry.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SoftCqe {
    /// Local QP.
    pub qpn: U32,
    /// Bytes.
    pub byte_len: U32,
    /// Immediate data or invalidated rkey.
    pub imm: U32,
    /// Source QP.
    pub src_qp: U32,
    /// WQE counter / SRQ slot.
    pub wqe_index: U16,
    /// `ibv_wc_status` value.
    pub status: u8,
    /// `ibv_wc_opcode` value (receive opcodes 128/129 fit in a byte).
    pub opcode: u8,
    /// `ibv_wc_flags` (low byte).
    pub flags: u8,
    /// Service level.
    pub sl: u8,
    /// Source LID.
    pub slid: U16,
    /// P_Key index.
    pub pkey_index: U16,
    /// 1 for send completions.
    pub is_send: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Vendor syndrome.
    pub vendor_err: U16,
    /// Reserved.
    pub reserved: u8,
    /// Bit 0: owner.
    pub owner: u8,
}

/// Event queue entry.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SoftEqe {
    /// [`EventType`] code.
    pub event_type: u8,
    /// Subtype (which QP/SRQ/port event; CQ error syndrome).
    pub subtype: u8,
    /// Reserved.
    pub reserved: [u8; 2],
    /// Object number (CQN, QPN, SRQN, port).
    pub number: U32,
    /// Extra data.
    pub aux: U32,
    /// Reserved.
    pub reserved2: [u8; 3],
    /// Bit 0: owner.
    pub owner: u8,
}

const _: () = {
    assert!(size_of::<SendHeader>() == SEND_HEADER);
    assert!(size_of::<DatagramSeg>() == DATAGRAM_SEG);
    assert!(size_of::<SgeSeg>() == SGE_SIZE);
    assert!(size_of::<RecvHeader>() == RECV_HEADER);
    assert!(size_of::<SoftCqe>() == CQE_SIZE);
    assert!(size_of::<SoftEqe>() == EQE_SIZE);
    assert!(std::mem::offset_of!(SoftCqe, owner) == CQE_SIZE - 1);
    assert!(std::mem::offset_of!(SoftEqe, owner) == EQE_SIZE - 1);
};

/// Send opcodes of the soft format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SoftOp {
    /// SEND.
    Send = 1,
    /// SEND with immediate.
    SendImm = 2,
    /// SEND with invalidate.
    SendInv = 3,
    /// RDMA WRITE.
    Write = 4,
    /// RDMA WRITE with immediate.
    WriteImm = 5,
    /// RDMA READ.
    Read = 6,
    /// Compare and swap.
    CmpSwp = 7,
    /// Fetch and add.
    FetchAdd = 8,
    /// Memory-window bind.
    BindMw = 9,
    /// Local invalidate.
    LocalInv = 10,
}

const FLAG_SIGNALED: u8 = 1;
const FLAG_SOLICITED: u8 = 1 << 1;
const FLAG_FENCE: u8 = 1 << 2;
const FLAG_INLINE: u8 = 1 << 3;

fn data_offset(qp_type: QpType) -> usize {
    SEND_HEADER
        + if qp_type == QpType::Ud {
            DATAGRAM_SEG
        } else {
            0
        }
}

fn put_sge(out: &mut [u8], sge: &Sge) {
    let seg = SgeSeg {
        addr: U64::new(sge.addr),
        length: U32::new(sge.length),
        lkey: U32::new(sge.lkey),
    };
    out.copy_from_slice(seg.as_bytes());
}

fn get_sge(bytes: &[u8]) -> Option<Sge> {
    let seg = SgeSeg::read_from_bytes(bytes.get(..SGE_SIZE)?).ok()?;
    Some(Sge {
        addr: seg.addr.get(),
        length: seg.length.get(),
        lkey: seg.lkey.get(),
    })
}

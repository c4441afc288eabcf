//! Work-queue entries (Linux `include/linux/mlx4/qp.h`, rdma-core `providers/mlx4/wqe.h`): the
//! control segment every send WQE starts with, the segments that follow it, receive/SRQ WQEs, and
//! the sizing rules (stride, spare WQEs, stamping).

#![allow(missing_docs)]

use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::av::Av;
use super::layout;

/// Control segment, 16 bytes (`struct mlx4_wqe_ctrl_seg`).
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
pub struct CtrlSeg {
    /// bit31 owner, bits 23:8 WQE counter (BlueFlame), bits 4:0 opcode.
    pub owner_opcode: U32,
    /// vlan_tag / BlueFlame qpn << 8 overlay (bits 31:8 of the dword with ins_vlan).
    pub vlan_tag: U16,
    pub ins_vlan: u8,
    /// bit6 fence, bits 5:0 ds (WQE size in 16-byte units).
    pub fence_size: u8,
    /// bits 7:0 flags: SE bit1, C (= 3) bits 3:2.
    pub srcrb_flags: U32,
    /// Immediate data (network order as given) or rkey to invalidate.
    pub imm: U32,
}
layout!(CtrlSeg, 16, { owner_opcode: 0, vlan_tag: 4, ins_vlan: 6, fence_size: 7, srcrb_flags: 8, imm: 12 });

/// Remote address segment (16 B).
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
pub struct RaddrSeg {
    pub raddr: U64,
    pub rkey: U32,
    pub _r: U32,
}
layout!(RaddrSeg, 16, { raddr: 0, rkey: 8 });

/// Atomic segment (16 B).
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
pub struct AtomicSeg {
    pub swap_add: U64,
    pub compare: U64,
}
layout!(AtomicSeg, 16, { swap_add: 0, compare: 8 });

/// Datagram segment of UD sends (48 B).
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
pub struct DatagramSeg {
    pub av: Av,
    pub dqpn: U32,
    pub qkey: U32,
    pub vlan: U16,
    pub mac: [u8; 6],
}
layout!(DatagramSeg, 48, { av: 0, dqpn: 32, qkey: 36, vlan: 40, mac: 42 });

/// Data (pointer) segment (16 B).
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
pub struct DataSeg {
    /// bit31 must be 0; rdma-core writes 0x8000_0000 for a zero-length entry.
    pub byte_count: U32,
    pub lkey: U32,
    pub addr: U64,
}
layout!(DataSeg, 16, { byte_count: 0, lkey: 4, addr: 8 });

/// Inline segment header (4 B): `INLINE_SEG | length`.
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
pub struct InlineSeg {
    pub byte_count: U32,
}
layout!(InlineSeg, 4, { byte_count: 0 });

/// Memory-window bind segment (32 B).
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
pub struct BindSeg {
    /// bit31 remote atomic, bit30 remote write, bit29 remote read.
    pub flags1: U32,
    /// bit31 type-2 window, bit30 zero-based.
    pub flags2: U32,
    pub new_rkey: U32,
    pub lkey: U32,
    pub addr: U64,
    pub length: U64,
}
layout!(BindSeg, 32, { flags1: 0, flags2: 4, new_rkey: 8, lkey: 12, addr: 16, length: 24 });

/// Local-invalidate segment (32 B).
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
pub struct LocalInvalSeg {
    pub _r0: U64,
    pub mem_key: U32,
    pub _r1: [u8; 20],
}
layout!(LocalInvalSeg, 32, { mem_key: 8 });

/// SRQ "next" segment (16 B) at the start of every SRQ WQE.
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
pub struct SrqNextSeg {
    pub _r0: U16,
    pub next_wqe_index: U16,
    pub _r1: [u8; 12],
}
layout!(SrqNextSeg, 16, { next_wqe_index: 2 });

/// Send opcodes (Linux's and rdma-core's `MLX4_OPCODE_*`).
pub mod opcode {
    pub const NOP: u8 = 0x00;
    pub const SEND_INVAL: u8 = 0x01;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const LSO: u8 = 0x0e;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
    pub const MASKED_ATOMIC_CS: u8 = 0x14;
    pub const MASKED_ATOMIC_FA: u8 = 0x15;
    pub const BIND_MW: u8 = 0x18;
    pub const FMR: u8 = 0x19;
    pub const LOCAL_INVAL: u8 = 0x1b;
    pub const CONFIG_CMD: u8 = 0x1f;
}

/// Control-segment bits.
pub mod ctrl {
    /// owner_opcode bit 31.
    pub const OWNER: u32 = 1 << 31;
    /// owner_opcode opcode mask.
    pub const OPCODE_MASK: u32 = 0x1f;
    /// srcrb_flags: solicited event.
    pub const SOLICIT: u32 = 1 << 1;
    /// srcrb_flags: generate a CQE.
    pub const CQ_UPDATE: u32 = 3 << 2;
    /// srcrb_flags: IP header checksum offload.
    pub const IP_HDR_CSUM: u32 = 1 << 4;
    /// srcrb_flags: TCP/UDP checksum offload.
    pub const TCP_UDP_CSUM: u32 = 1 << 5;
    /// srcrb_flags: strong ordering.
    pub const STRONG_ORDER: u32 = 1 << 7;
    /// fence_size: fence bit.
    pub const FENCE: u8 = 1 << 6;
    /// fence_size: ds mask.
    pub const DS_MASK: u8 = 0x3f;
}

/// Inline segment marker (byte_count bit 31).
pub const INLINE_SEG: u32 = 1 << 31;
/// Inline segments never cross this boundary inside a WQE.
pub const INLINE_ALIGN: usize = 64;
/// Scatter-list terminator lkey.
pub const INVALID_LKEY: u32 = 0x100;
/// Stamp written into the first dword of every 64-byte block after the first.
pub const STAMP: u32 = 0xffff_ffff;

/// Bind-segment bits.
pub mod bind {
    pub const TYPE_2: u32 = 1 << 31;
    pub const ZERO_BASED: u32 = 1 << 30;
    pub const REMOTE_ATOMIC: u32 = 1 << 31;
    pub const REMOTE_WRITE: u32 = 1 << 30;
    pub const REMOTE_READ: u32 = 1 << 29;
}

/// Spare (headroom) WQEs of a send queue with stride `1 << wqe_shift` (Linux `hw/mlx4/qp.c`): the
/// HCA prefetches up to 2 KiB beyond the WQE it executes.
pub fn sq_spare(wqe_shift: u32) -> u32 {
    (2048 >> wqe_shift) + 1
}

/// Offsets of the send and receive queues inside one QP buffer (Linux `hw/mlx4/qp.c`): the queue
/// with the larger stride first, the send queue first on equal strides.
pub fn queue_offsets(sq_cnt: u32, sq_shift: u32, rq_cnt: u32, rq_shift: u32) -> (usize, usize) {
    if rq_cnt > 0 && rq_shift > sq_shift {
        ((rq_cnt as usize) << rq_shift, 0)
    } else {
        (0, (sq_cnt as usize) << sq_shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_and_order_rules() {
        assert_eq!(sq_spare(6), 33);
        assert_eq!(sq_spare(11), 2);
        // Equal strides: SQ first.
        assert_eq!(queue_offsets(64, 6, 32, 6), (0, 64 << 6));
        // Larger RQ stride: RQ first.
        assert_eq!(queue_offsets(64, 6, 32, 7), (32 << 7, 0));
        // No RQ (SRQ): SQ at 0.
        assert_eq!(queue_offsets(64, 6, 0, 7), (0, 64 << 6));
    }
}

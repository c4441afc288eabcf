//! Base Transport Header (BTH, 12 bytes; IBA 9.2).
//!
//! ```text
//! byte 0      opcode
//! byte 1      SE(0x80) M(0x40) PadCnt(0x30) TVer(0x0F)
//! bytes 2-3   P_Key
//! byte 4      FECN(0x80) BECN(0x40) reserved(0x3F)
//! bytes 5-7   DestQP (24 bits)
//! byte 8      AckReq(0x80) reserved(0x7F)
//! bytes 9-11  PSN (24 bits)
//! ```
//!
//! Reserved bits are written as zero and ignored when parsing. Fields narrower than their Rust
//! type (`pad_count` 2 bits, `tver` 4 bits, `dest_qp` and `psn` 24 bits) are **masked** on emit:
//! the upper bits are silently dropped, never an error.

use super::Opcode;
use super::WireError;
use super::bytes::{
    check_len, check_room, read_u8, read_u16, read_u24, write_u8, write_u16, write_u24,
};

/// Byte offsets of the BTH fields.
mod field {
    use core::ops::Range;

    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: Range<usize> = 2..4;
    pub(super) const ECN: usize = 4;
    pub(super) const DEST_QP: Range<usize> = 5..8;
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: Range<usize> = 9..12;
}

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x03;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// Mask of a 24-bit field (QPN, PSN, MSN).
pub const MASK_24: u32 = 0x00FF_FFFF;

/// The default partition key (full membership, default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Base Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// Operation code.
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request.
    pub mig_req: bool,
    /// PadCnt: 0..=3 pad bytes after the payload (2 bits, masked on emit).
    pub pad_count: u8,
    /// TVer: transport header version, must be 0 (4 bits, masked on emit).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number (24 bits, masked on emit).
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits, masked on emit).
    pub psn: u32,
}

impl Bth {
    /// Encoded size in bytes.
    pub const LEN: usize = 12;

    /// A BTH with the given opcode, destination QP and PSN, P_Key [`DEFAULT_PKEY`] and every
    /// flag, the pad count and the version zero.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses the first [`Bth::LEN`] bytes of `buf` (extra bytes are ignored). Unknown opcodes
    /// and non-zero versions are preserved here; [`super::TransportHdr::parse`] rejects them.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        let flags = read_u8(buf, field::FLAGS)?;
        let ecn = read_u8(buf, field::ECN)?;
        Ok(Self {
            opcode: Opcode::from_u8(read_u8(buf, field::OPCODE)?),
            solicited: flags & SE != 0,
            mig_req: flags & MIG != 0,
            pad_count: (flags >> PAD_SHIFT) & PAD_MASK,
            tver: flags & TVER_MASK,
            pkey: read_u16(buf, field::PKEY)?,
            fecn: ecn & FECN != 0,
            becn: ecn & BECN != 0,
            dest_qp: read_u24(buf, field::DEST_QP)?,
            ack_req: read_u8(buf, field::ACK_REQ)? & ACK_REQ != 0,
            psn: read_u24(buf, field::PSN)?,
        })
    }

    /// Writes the header into the first [`Bth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        let flags = flag(self.solicited, SE)
            | flag(self.mig_req, MIG)
            | ((self.pad_count & PAD_MASK) << PAD_SHIFT)
            | (self.tver & TVER_MASK);
        write_u8(out, field::OPCODE, self.opcode.to_u8())?;
        write_u8(out, field::FLAGS, flags)?;
        write_u16(out, field::PKEY, self.pkey)?;
        write_u8(
            out,
            field::ECN,
            flag(self.fecn, FECN) | flag(self.becn, BECN),
        )?;
        write_u24(out, field::DEST_QP, self.dest_qp)?;
        write_u8(out, field::ACK_REQ, flag(self.ack_req, ACK_REQ))?;
        write_u24(out, field::PSN, self.psn)
    }
}

/// `bit` when `on`, else 0.
const fn flag(on: bool, bit: u8) -> u8 {
    if on { bit } else { 0 }
}

/// Number of pad bytes needed after a payload of `payload_len` bytes (`(-len) & 3`).
pub const fn pad_len(payload_len: usize) -> u8 {
    (payload_len.wrapping_neg() & 3) as u8
}

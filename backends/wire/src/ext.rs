//! Fixed-size extended transport headers: RETH, DETH, AtomicETH and AtomicAckETH (IBA chapter 9).
//!
//! ```text
//! RETH (16)          VA (64) · R_Key (32) · DMA length (32)
//! DETH (8)           Q_Key (32) · reserved (8) · source QP (24)
//! AtomicETH (28)     VA (64) · R_Key (32) · swap-or-add (64) · compare (64)
//! AtomicAckETH (8)   original remote data (64)
//! ```
//!
//! Each `parse` reads the first `LEN` bytes of its input (extra bytes are ignored) and each
//! `emit` writes the first `LEN` bytes of its output. The 24-bit DETH source QP is masked on
//! emit; the reserved DETH byte is written as zero and ignored when parsing.
//! ImmDt and IETH are plain `u32` values and need no type of their own.

use super::WireError;
use super::bytes::{
    check_len, check_room, read_u24, read_u32, read_u64, write_u8, write_u24, write_u32, write_u64,
};

/// RDMA Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length: the whole message length in a WRITE_FIRST / WRITE_ONLY / READ_REQUEST.
    pub dma_len: u32,
}

mod reth_field {
    use core::ops::Range;

    pub(super) const VA: Range<usize> = 0..8;
    pub(super) const RKEY: Range<usize> = 8..12;
    pub(super) const DMA_LEN: Range<usize> = 12..16;
}

impl Reth {
    /// Encoded size in bytes.
    pub const LEN: usize = 16;

    /// Parses the first [`Reth::LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        Ok(Self {
            va: read_u64(buf, reth_field::VA)?,
            rkey: read_u32(buf, reth_field::RKEY)?,
            dma_len: read_u32(buf, reth_field::DMA_LEN)?,
        })
    }

    /// Writes the header into the first [`Reth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u64(out, reth_field::VA, self.va)?;
        write_u32(out, reth_field::RKEY, self.rkey)?;
        write_u32(out, reth_field::DMA_LEN, self.dma_len)
    }
}

/// Datagram Extended Transport Header (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits, masked on emit).
    pub src_qp: u32,
}

mod deth_field {
    use core::ops::Range;

    pub(super) const QKEY: Range<usize> = 0..4;
    pub(super) const RESERVED: usize = 4;
    pub(super) const SRC_QP: Range<usize> = 5..8;
}

impl Deth {
    /// Encoded size in bytes.
    pub const LEN: usize = 8;

    /// Parses the first [`Deth::LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        Ok(Self {
            qkey: read_u32(buf, deth_field::QKEY)?,
            src_qp: read_u24(buf, deth_field::SRC_QP)?,
        })
    }

    /// Writes the header into the first [`Deth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u32(out, deth_field::QKEY, self.qkey)?;
        write_u8(out, deth_field::RESERVED, 0)?;
        write_u24(out, deth_field::SRC_QP, self.src_qp)
    }
}

/// Atomic Extended Transport Header (compare-and-swap / fetch-and-add requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Remote virtual address (should be 8-byte aligned; not checked here).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (compare-and-swap) or addend (fetch-and-add).
    pub swap_add: u64,
    /// Compare value (compare-and-swap; ignored for fetch-and-add).
    pub compare: u64,
}

mod atomic_field {
    use core::ops::Range;

    pub(super) const VA: Range<usize> = 0..8;
    pub(super) const RKEY: Range<usize> = 8..12;
    pub(super) const SWAP_ADD: Range<usize> = 12..20;
    pub(super) const COMPARE: Range<usize> = 20..28;
}

impl AtomicEth {
    /// Encoded size in bytes.
    pub const LEN: usize = 28;

    /// Parses the first [`AtomicEth::LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        Ok(Self {
            va: read_u64(buf, atomic_field::VA)?,
            rkey: read_u32(buf, atomic_field::RKEY)?,
            swap_add: read_u64(buf, atomic_field::SWAP_ADD)?,
            compare: read_u64(buf, atomic_field::COMPARE)?,
        })
    }

    /// Writes the header into the first [`AtomicEth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u64(out, atomic_field::VA, self.va)?;
        write_u32(out, atomic_field::RKEY, self.rkey)?;
        write_u64(out, atomic_field::SWAP_ADD, self.swap_add)?;
        write_u64(out, atomic_field::COMPARE, self.compare)
    }
}

/// Atomic Acknowledge Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEth {
    /// The remote value before the atomic operation.
    pub orig: u64,
}

mod atomic_ack_field {
    use core::ops::Range;

    pub(super) const ORIG: Range<usize> = 0..8;
}

impl AtomicAckEth {
    /// Encoded size in bytes.
    pub const LEN: usize = 8;

    /// Parses the first [`AtomicAckEth::LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        Ok(Self {
            orig: read_u64(buf, atomic_ack_field::ORIG)?,
        })
    }

    /// Writes the header into the first [`AtomicAckEth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u64(out, atomic_ack_field::ORIG, self.orig)
    }
}

/// Length of an ImmDt or IETH header (a single big-endian `u32`).
pub const IMM_LEN: usize = 4;

/// Parses an ImmDt or IETH value from the first 4 bytes of `buf`.
pub(crate) fn parse_u32(buf: &[u8]) -> Result<u32, WireError> {
    check_len(buf, IMM_LEN)?;
    read_u32(buf, 0..IMM_LEN)
}

/// Writes an ImmDt or IETH value into the first 4 bytes of `out`.
pub(crate) fn emit_u32(v: u32, out: &mut [u8]) -> Result<(), WireError> {
    check_room(out, IMM_LEN)?;
    write_u32(out, 0..IMM_LEN, v)
}

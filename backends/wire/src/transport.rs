//! The whole IB transport header (BTH plus extension headers) and packet parsing.
//!
//! Header order on the wire (IBA chapter 9): BTH, DETH, RETH / AtomicETH / AETH, AtomicAckETH,
//! ImmDt / IETH, payload, pad. Which headers are present is decided by the opcode table
//! ([`Opcode::headers`]), never by the bytes themselves. A CNP carries 16 reserved bytes after
//! its BTH; they are written as zeros and skipped when parsing.

use super::bytes::{check_room, tail, tail_mut, write_bytes};
use super::ext::{IMM_LEN, emit_u32, parse_u32};
use super::headerset::CNP_RESERVED_LEN;
use super::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, HeaderSet, Opcode, Reth, WireError};

/// BTH and the extension headers of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportHdr {
    /// Base transport header.
    pub bth: Bth,
    /// Datagram ETH (UD).
    pub deth: Option<Deth>,
    /// RDMA ETH (WRITE first/only, READ request).
    pub reth: Option<Reth>,
    /// Atomic ETH (compare-and-swap, fetch-and-add).
    pub atomic: Option<AtomicEth>,
    /// ACK ETH (ACK, atomic ACK, READ response first/last/only).
    pub aeth: Option<Aeth>,
    /// Atomic ACK ETH.
    pub atomic_ack: Option<AtomicAckEth>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Invalidate ETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
}

/// A parsed transport packet borrowing its payload from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// The decoded headers.
    pub hdr: TransportHdr,
    /// Bytes taken by the BTH and extension headers.
    pub header_len: usize,
    /// Payload with the pad removed (the ICRC is never part of the input).
    pub payload: &'a [u8],
}

/// Checks that an optional header is present exactly when the opcode's header set says so.
fn check_presence(
    set: HeaderSet,
    flag: HeaderSet,
    present: bool,
    name: &'static str,
) -> Result<(), WireError> {
    match (set.contains(flag), present) {
        (true, false) => Err(WireError::MissingHeader(name)),
        (false, true) => Err(WireError::UnexpectedHeader(name)),
        _ => Ok(()),
    }
}

/// Size of an optional header: `len` when present, else 0.
fn opt_len<T>(h: &Option<T>, len: usize) -> usize {
    if h.is_some() { len } else { 0 }
}

#[allow(clippy::len_without_is_empty)] // a transport header is never empty (BTH is mandatory)
impl TransportHdr {
    /// A header with the given BTH and no extension headers; fill in the ones the opcode needs.
    pub const fn new(bth: Bth) -> Self {
        Self {
            bth,
            deth: None,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
        }
    }

    /// Encoded length: BTH plus the extension headers that are present (plus the 16 reserved
    /// bytes of a CNP).
    pub fn len(&self) -> usize {
        let cnp = if self.bth.opcode.headers().contains(HeaderSet::CNP_RESERVED) {
            CNP_RESERVED_LEN
        } else {
            0
        };
        Bth::LEN
            + opt_len(&self.deth, Deth::LEN)
            + opt_len(&self.reth, Reth::LEN)
            + opt_len(&self.atomic, AtomicEth::LEN)
            + opt_len(&self.aeth, Aeth::LEN)
            + opt_len(&self.atomic_ack, AtomicAckEth::LEN)
            + opt_len(&self.imm, IMM_LEN)
            + opt_len(&self.ieth, IMM_LEN)
            + cnp
    }

    /// Checks that the optional headers match what `bth.opcode` requires.
    pub fn validate(&self) -> Result<(), WireError> {
        let op = self.bth.opcode;
        if !op.is_known() {
            return Err(WireError::UnknownOpcode(op.to_u8()));
        }
        let set = op.headers();
        check_presence(set, HeaderSet::DETH, self.deth.is_some(), "DETH")?;
        check_presence(set, HeaderSet::RETH, self.reth.is_some(), "RETH")?;
        check_presence(
            set,
            HeaderSet::ATOMIC_ETH,
            self.atomic.is_some(),
            "AtomicETH",
        )?;
        check_presence(set, HeaderSet::AETH, self.aeth.is_some(), "AETH")?;
        check_presence(
            set,
            HeaderSet::ATOMIC_ACK_ETH,
            self.atomic_ack.is_some(),
            "AtomicAckETH",
        )?;
        check_presence(set, HeaderSet::IMM, self.imm.is_some(), "ImmDt")?;
        check_presence(set, HeaderSet::IETH, self.ieth.is_some(), "IETH")
    }

    /// Writes BTH and extension headers (not the payload) to the start of `out` and returns
    /// the number of bytes written ([`TransportHdr::len`]).
    ///
    /// Fails with [`WireError::UnknownOpcode`] for an unknown opcode,
    /// [`WireError::MissingHeader`] / [`WireError::UnexpectedHeader`] when the optional
    /// fields do not match the opcode, and [`WireError::BufferTooSmall`] when `out` is short.
    /// Nothing is written on error.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        self.validate()?;
        let len = self.len();
        check_room(out, len)?;
        self.bth.emit(out)?;
        let mut off = Bth::LEN;
        if let Some(h) = &self.deth {
            h.emit(tail_mut(out, off))?;
            off += Deth::LEN;
        }
        if let Some(h) = &self.reth {
            h.emit(tail_mut(out, off))?;
            off += Reth::LEN;
        }
        if let Some(h) = &self.atomic {
            h.emit(tail_mut(out, off))?;
            off += AtomicEth::LEN;
        }
        if let Some(h) = &self.aeth {
            h.emit(tail_mut(out, off))?;
            off += Aeth::LEN;
        }
        if let Some(h) = &self.atomic_ack {
            h.emit(tail_mut(out, off))?;
            off += AtomicAckEth::LEN;
        }
        if let Some(v) = self.imm {
            emit_u32(v, tail_mut(out, off))?;
            off += IMM_LEN;
        }
        if let Some(v) = self.ieth {
            emit_u32(v, tail_mut(out, off))?;
            off += IMM_LEN;
        }
        if self.bth.opcode.headers().contains(HeaderSet::CNP_RESERVED) {
            write_bytes(out, off, &[0; CNP_RESERVED_LEN])?;
            off += CNP_RESERVED_LEN;
        }
        debug_assert_eq!(off, len);
        Ok(off)
    }

    /// Parses IB transport bytes **without** the ICRC: BTH, extension headers, payload, pad.
    ///
    /// Checks, in this order: at least a BTH ([`WireError::Truncated`]), a known opcode
    /// ([`WireError::UnknownOpcode`]), TVer 0 ([`WireError::BadVersion`]), every extension
    /// header present ([`WireError::Truncated`]), no bytes after the headers when the opcode
    /// carries no payload ([`WireError::UnexpectedPayload`]), and PadCnt not larger than the
    /// bytes after the headers ([`WireError::BadPad`]; for an opcode without payload any
    /// non-zero PadCnt is bad). Pad byte values are not checked.
    pub fn parse(packet: &[u8]) -> Result<ParsedPacket<'_>, WireError> {
        let bth = Bth::parse(packet)?;
        let op = bth.opcode;
        if !op.is_known() {
            return Err(WireError::UnknownOpcode(op.to_u8()));
        }
        if bth.tver != 0 {
            return Err(WireError::BadVersion(bth.tver));
        }
        let set = op.headers();
        let header_len = op.header_len();
        if packet.len() < header_len {
            return Err(WireError::Truncated {
                need: header_len,
                have: packet.len(),
            });
        }

        let mut hdr = Self::new(bth);
        let mut off = Bth::LEN;
        if set.contains(HeaderSet::DETH) {
            hdr.deth = Some(Deth::parse(tail(packet, off))?);
            off += Deth::LEN;
        }
        if set.contains(HeaderSet::RETH) {
            hdr.reth = Some(Reth::parse(tail(packet, off))?);
            off += Reth::LEN;
        }
        if set.contains(HeaderSet::ATOMIC_ETH) {
            hdr.atomic = Some(AtomicEth::parse(tail(packet, off))?);
            off += AtomicEth::LEN;
        }
        if set.contains(HeaderSet::AETH) {
            hdr.aeth = Some(Aeth::parse(tail(packet, off))?);
            off += Aeth::LEN;
        }
        if set.contains(HeaderSet::ATOMIC_ACK_ETH) {
            hdr.atomic_ack = Some(AtomicAckEth::parse(tail(packet, off))?);
            off += AtomicAckEth::LEN;
        }
        if set.contains(HeaderSet::IMM) {
            hdr.imm = Some(parse_u32(tail(packet, off))?);
            off += IMM_LEN;
        }
        if set.contains(HeaderSet::IETH) {
            hdr.ieth = Some(parse_u32(tail(packet, off))?);
            off += IMM_LEN;
        }
        if set.contains(HeaderSet::CNP_RESERVED) {
            off += CNP_RESERVED_LEN;
        }
        debug_assert_eq!(off, header_len);

        let rest = tail(packet, header_len);
        if !set.contains(HeaderSet::PAYLOAD) && !rest.is_empty() {
            return Err(WireError::UnexpectedPayload);
        }
        let pad = usize::from(bth.pad_count);
        let payload_len = rest.len().checked_sub(pad).ok_or(WireError::BadPad {
            pad: bth.pad_count,
            payload: rest.len(),
        })?;
        let payload = rest.get(..payload_len).ok_or(WireError::BadPad {
            pad: bth.pad_count,
            payload: rest.len(),
        })?;
        Ok(ParsedPacket {
            hdr,
            header_len,
            payload,
        })
    }
}

impl TransportHdr {
    /// Emits the headers followed by `payload` and the zero pad into `out` (cleared first),
    /// setting the BTH pad count from the payload length. Returns the header length.
    /// Convenient for tests and for callers that want one contiguous buffer.
    pub fn emit_packet(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<usize, WireError> {
        let mut hdr = *self;
        let pad = super::pad_len(payload.len());
        hdr.bth.pad_count = pad;
        if !payload.is_empty() && !hdr.bth.opcode.headers().contains(HeaderSet::PAYLOAD) {
            return Err(WireError::UnexpectedPayload);
        }
        out.clear();
        out.resize(hdr.len(), 0);
        let n = hdr.emit(out)?;
        out.extend_from_slice(payload);
        out.extend(core::iter::repeat_n(0u8, usize::from(pad)));
        Ok(n)
    }

    /// The opcode of this header (shorthand for `self.bth.opcode`).
    pub const fn opcode(&self) -> Opcode {
        self.bth.opcode
    }
}

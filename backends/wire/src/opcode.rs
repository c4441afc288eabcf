//! BTH opcodes and the single table that says what each one means.
//!
//! The list in the `opcodes!` invocation below is the only place where opcode bytes, names,
//! services and header compositions are written down (Linux `ib_pack.h`, `rxe_opcode.c`). From it
//! the macro generates the [`Opcode`] enum, its byte mapping, and a 256-entry `const` table
//! indexed by the opcode byte. Every query ([`Opcode::headers`], [`Opcode::position`], the
//! predicates and the builders) reads that table instead of matching on opcodes.
//!
//! Naming: RC operations use plain names (`SendFirst`, `ReadRequest`, `Acknowledge`, ...),
//! UC operations carry a `Uc` prefix (`UcSendFirst`, ...), UD ones a `Ud` prefix.

use core::fmt;

use super::HeaderSet;

/// Transport service an opcode belongs to (top three bits of the opcode byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// RoCEv2 congestion notification packet.
    Cnp,
    /// Anything else (unknown opcodes).
    Other,
}

/// Place of a packet within a multi-packet SEND, RDMA WRITE or RDMA READ response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a message of two or more packets.
    First,
    /// Neither the first nor the last packet.
    Middle,
    /// Last packet of a message of two or more packets.
    Last,
    /// The message fits in this single packet.
    Only,
}

/// The operation family of a known opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (any position, with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (any position, with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Atomic compare-and-swap request.
    CompareSwap,
    /// Atomic fetch-and-add request.
    FetchAdd,
    /// ACK / NAK.
    Acknowledge,
    /// Atomic acknowledge (carries the original value).
    AtomicAcknowledge,
    /// Congestion notification packet.
    Cnp,
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy)]
struct OpInfo {
    op: Option<Opcode>,
    service: Service,
    kind: Option<OpKind>,
    position: Option<Position>,
    headers: HeaderSet,
    name: &'static str,
}

impl OpInfo {
    const UNKNOWN: Self = Self {
        op: None,
        service: Service::Other,
        kind: None,
        position: None,
        headers: HeaderSet::empty(),
        name: "UNKNOWN",
    };
}

/// Unions a list of header flags (usable in `const` context).
const fn hs(mut flags: &[HeaderSet]) -> HeaderSet {
    let mut acc = HeaderSet::empty();
    while let [first, rest @ ..] = flags {
        acc = acc.union(*first);
        flags = rest;
    }
    acc
}

const RETH: HeaderSet = HeaderSet::RETH;
const AETH: HeaderSet = HeaderSet::AETH;
const DETH: HeaderSet = HeaderSet::DETH;
const ATOMIC: HeaderSet = HeaderSet::ATOMIC_ETH;
const ATOMIC_ACK: HeaderSet = HeaderSet::ATOMIC_ACK_ETH;
const IMM: HeaderSet = HeaderSet::IMM;
const IETH: HeaderSet = HeaderSet::IETH;
const PAY: HeaderSet = HeaderSet::PAYLOAD;
const CNP_RESV: HeaderSet = HeaderSet::CNP_RESERVED;

/// Generates [`Opcode`], [`Opcode::to_u8`] and the lookup table from one list of rows
/// `Variant = byte => (service, kind, position, [headers], "name")`.
macro_rules! opcodes {
    ($( $variant:ident = $byte:literal =>
        ($service:ident, $kind:ident, $pos:expr, [$($h:ident),*], $name:literal); )*) => {
        /// A BTH opcode: the byte itself, so every query is one table index. Bytes without a
        /// meaning here are kept as they are ([`Opcode::is_known`] says which).
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct Opcode(u8);

        /// The known opcodes, named as the IBTA operation (CamelCase, so they read like the
        /// enum variants they replace).
        #[allow(non_upper_case_globals)]
        impl Opcode {
            $(
                #[doc = concat!($name, " (opcode ", stringify!($byte), ")")]
                pub const $variant: Self = Self($byte);
            )*
        }

        /// The opcode table, indexed by opcode byte.
        const TABLE: [OpInfo; 256] = {
            let mut t = [OpInfo::UNKNOWN; 256];
            $(
                t[$byte] = OpInfo {
                    op: Some(Opcode($byte)),
                    service: Service::$service,
                    kind: Some(OpKind::$kind),
                    position: $pos,
                    headers: hs(&[$($h),*]),
                    name: $name,
                };
            )*
            t
        };
    };
}

const FIRST: Option<Position> = Some(Position::First);
const MIDDLE: Option<Position> = Some(Position::Middle);
const LAST: Option<Position> = Some(Position::Last);
const ONLY: Option<Position> = Some(Position::Only);
const NONE: Option<Position> = None;

opcodes! {
    SendFirst = 0x00 => (Rc, Send, FIRST, [PAY], "RC SEND_FIRST");
    SendMiddle = 0x01 => (Rc, Send, MIDDLE, [PAY], "RC SEND_MIDDLE");
    SendLast = 0x02 => (Rc, Send, LAST, [PAY], "RC SEND_LAST");
    SendLastWithImmediate = 0x03 => (Rc, Send, LAST, [IMM, PAY], "RC SEND_LAST_WITH_IMMEDIATE");
    SendOnly = 0x04 => (Rc, Send, ONLY, [PAY], "RC SEND_ONLY");
    SendOnlyWithImmediate = 0x05 => (Rc, Send, ONLY, [IMM, PAY], "RC SEND_ONLY_WITH_IMMEDIATE");
    WriteFirst = 0x06 => (Rc, Write, FIRST, [RETH, PAY], "RC RDMA_WRITE_FIRST");
    WriteMiddle = 0x07 => (Rc, Write, MIDDLE, [PAY], "RC RDMA_WRITE_MIDDLE");
    WriteLast = 0x08 => (Rc, Write, LAST, [PAY], "RC RDMA_WRITE_LAST");
    WriteLastWithImmediate = 0x09 =>
        (Rc, Write, LAST, [IMM, PAY], "RC RDMA_WRITE_LAST_WITH_IMMEDIATE");
    WriteOnly = 0x0A => (Rc, Write, ONLY, [RETH, PAY], "RC RDMA_WRITE_ONLY");
    WriteOnlyWithImmediate = 0x0B =>
        (Rc, Write, ONLY, [RETH, IMM, PAY], "RC RDMA_WRITE_ONLY_WITH_IMMEDIATE");
    ReadRequest = 0x0C => (Rc, ReadRequest, NONE, [RETH], "RC RDMA_READ_REQUEST");
    ReadResponseFirst = 0x0D =>
        (Rc, ReadResponse, FIRST, [AETH, PAY], "RC RDMA_READ_RESPONSE_FIRST");
    ReadResponseMiddle = 0x0E =>
        (Rc, ReadResponse, MIDDLE, [PAY], "RC RDMA_READ_RESPONSE_MIDDLE");
    ReadResponseLast = 0x0F => (Rc, ReadResponse, LAST, [AETH, PAY], "RC RDMA_READ_RESPONSE_LAST");
    ReadResponseOnly = 0x10 => (Rc, ReadResponse, ONLY, [AETH, PAY], "RC RDMA_READ_RESPONSE_ONLY");
    Acknowledge = 0x11 => (Rc, Acknowledge, NONE, [AETH], "RC ACKNOWLEDGE");
    AtomicAcknowledge = 0x12 =>
        (Rc, AtomicAcknowledge, NONE, [AETH, ATOMIC_ACK], "RC ATOMIC_ACKNOWLEDGE");
    CompareSwap = 0x13 => (Rc, CompareSwap, NONE, [ATOMIC], "RC COMPARE_SWAP");
    FetchAdd = 0x14 => (Rc, FetchAdd, NONE, [ATOMIC], "RC FETCH_ADD");
    SendLastWithInvalidate = 0x16 =>
        (Rc, Send, LAST, [IETH, PAY], "RC SEND_LAST_WITH_INVALIDATE");
    SendOnlyWithInvalidate = 0x17 =>
        (Rc, Send, ONLY, [IETH, PAY], "RC SEND_ONLY_WITH_INVALIDATE");
    UcSendFirst = 0x20 => (Uc, Send, FIRST, [PAY], "UC SEND_FIRST");
    UcSendMiddle = 0x21 => (Uc, Send, MIDDLE, [PAY], "UC SEND_MIDDLE");
    UcSendLast = 0x22 => (Uc, Send, LAST, [PAY], "UC SEND_LAST");
    UcSendLastWithImmediate = 0x23 =>
        (Uc, Send, LAST, [IMM, PAY], "UC SEND_LAST_WITH_IMMEDIATE");
    UcSendOnly = 0x24 => (Uc, Send, ONLY, [PAY], "UC SEND_ONLY");
    UcSendOnlyWithImmediate = 0x25 =>
        (Uc, Send, ONLY, [IMM, PAY], "UC SEND_ONLY_WITH_IMMEDIATE");
    UcWriteFirst = 0x26 => (Uc, Write, FIRST, [RETH, PAY], "UC RDMA_WRITE_FIRST");
    UcWriteMiddle = 0x27 => (Uc, Write, MIDDLE, [PAY], "UC RDMA_WRITE_MIDDLE");
    UcWriteLast = 0x28 => (Uc, Write, LAST, [PAY], "UC RDMA_WRITE_LAST");
    UcWriteLastWithImmediate = 0x29 =>
        (Uc, Write, LAST, [IMM, PAY], "UC RDMA_WRITE_LAST_WITH_IMMEDIATE");
    UcWriteOnly = 0x2A => (Uc, Write, ONLY, [RETH, PAY], "UC RDMA_WRITE_ONLY");
    UcWriteOnlyWithImmediate = 0x2B =>
        (Uc, Write, ONLY, [RETH, IMM, PAY], "UC RDMA_WRITE_ONLY_WITH_IMMEDIATE");
    UdSendOnly = 0x64 => (Ud, Send, ONLY, [DETH, PAY], "UD SEND_ONLY");
    UdSendOnlyWithImmediate = 0x65 =>
        (Ud, Send, ONLY, [DETH, IMM, PAY], "UD SEND_ONLY_WITH_IMMEDIATE");
    Cnp = 0x81 => (Cnp, Cnp, NONE, [CNP_RESV], "CNP");
}

impl Opcode {
    /// The opcode byte as carried in BTH byte 0.
    #[inline]
    pub const fn to_u8(self) -> u8 {
        self.0
    }

    /// Decodes an opcode byte (unknown bytes are kept; see [`Opcode::is_known`]).
    #[inline]
    pub const fn from_u8(b: u8) -> Self {
        Self(b)
    }

    /// The table row for this opcode ([`Opcode::Unknown`] always gets the "unknown" row).
    #[inline]
    const fn info(self) -> &'static OpInfo {
        &TABLE[self.0 as usize]
    }

    /// Iterates over every known opcode in byte order.
    pub fn all_known() -> impl Iterator<Item = Self> {
        TABLE.iter().filter_map(|i| i.op)
    }

    /// Whether this opcode has a table entry.
    #[inline]
    pub const fn is_known(self) -> bool {
        self.info().op.is_some()
    }

    /// The transport service of the opcode ([`Service::Other`] when unknown).
    #[inline]
    pub const fn service(self) -> Service {
        self.info().service
    }

    /// The operation family, or `None` when unknown.
    #[inline]
    pub const fn kind(self) -> Option<OpKind> {
        self.info().kind
    }

    /// The extension headers (and payload permission) that follow the BTH.
    /// Empty for unknown opcodes.
    #[inline]
    pub const fn headers(self) -> HeaderSet {
        self.info().headers
    }

    /// BTH plus extension header length in bytes (payload and pad excluded).
    #[inline]
    pub const fn header_len(self) -> usize {
        super::Bth::LEN + self.headers().ext_len()
    }

    /// Position within a message for SEND / RDMA WRITE / RDMA READ response opcodes.
    #[inline]
    pub const fn position(self) -> Option<Position> {
        self.info().position
    }

    /// Human-readable name such as `"RC SEND_ONLY"` (`"UNKNOWN"` for unknown opcodes).
    #[inline]
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    const fn kind_is(self, kind: OpKind) -> bool {
        matches!(self.info().kind, Some(k) if k as u8 == kind as u8)
    }

    /// Any SEND opcode (RC, UC or UD).
    #[inline]
    pub const fn is_send(self) -> bool {
        self.kind_is(OpKind::Send)
    }

    /// Any RDMA WRITE opcode (RC or UC).
    #[inline]
    pub const fn is_write(self) -> bool {
        self.kind_is(OpKind::Write)
    }

    /// RDMA READ request.
    #[inline]
    pub const fn is_read_request(self) -> bool {
        self.kind_is(OpKind::ReadRequest)
    }

    /// Any RDMA READ response opcode.
    #[inline]
    pub const fn is_read_response(self) -> bool {
        self.kind_is(OpKind::ReadResponse)
    }

    /// Atomic request: compare-and-swap or fetch-and-add.
    #[inline]
    pub const fn is_atomic(self) -> bool {
        self.kind_is(OpKind::CompareSwap) || self.kind_is(OpKind::FetchAdd)
    }

    /// ACKNOWLEDGE or ATOMIC_ACKNOWLEDGE.
    #[inline]
    pub const fn is_ack(self) -> bool {
        self.kind_is(OpKind::Acknowledge) || self.kind_is(OpKind::AtomicAcknowledge)
    }

    /// Carries immediate data.
    #[inline]
    pub const fn has_imm(self) -> bool {
        self.headers().contains(HeaderSet::IMM)
    }

    /// Carries an IETH (SEND with invalidate).
    #[inline]
    pub const fn has_inv(self) -> bool {
        self.headers().contains(HeaderSet::IETH)
    }

    /// Sent by a requester: SEND, RDMA WRITE, RDMA READ request or atomic request.
    #[inline]
    pub const fn is_request(self) -> bool {
        self.is_send() || self.is_write() || self.is_read_request() || self.is_atomic()
    }

    /// Sent by a responder: RDMA READ response, ACK or atomic ACK.
    #[inline]
    pub const fn is_response(self) -> bool {
        self.is_read_response() || self.is_ack()
    }

    /// The first known opcode whose table row satisfies `pred`.
    /// The SEND opcode for `service` and `position`, with immediate data and/or invalidate.
    /// `None` when no such opcode exists (e.g. UD SEND_FIRST, UC SEND with invalidate, or
    /// both `imm` and `inv`).
    #[inline]
    pub fn send(service: Service, position: Position, imm: bool, inv: bool) -> Option<Self> {
        // IBA table 38: SEND opcodes are FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM at
        // offsets 0..=5 of the service's block; RC adds LAST_INV (0x16) and ONLY_INV (0x17).
        let base = match service {
            Service::Rc => 0x00,
            Service::Uc if !inv => 0x20,
            Service::Ud if !inv && position == Position::Only => {
                return Some(Self::from_u8(if imm { 0x65 } else { 0x64 }));
            }
            _ => return None,
        };
        let off = match (position, imm, inv) {
            (_, true, true) => return None,
            (Position::First, false, false) => 0,
            (Position::Middle, false, false) => 1,
            (Position::Last, false, false) => 2,
            (Position::Last, true, false) => 3,
            (Position::Only, false, false) => 4,
            (Position::Only, true, false) => 5,
            (Position::Last, false, true) => return Some(Self::from_u8(0x16)),
            (Position::Only, false, true) => return Some(Self::from_u8(0x17)),
            _ => return None,
        };
        Some(Self::from_u8(base + off))
    }

    /// The RDMA WRITE opcode with these properties, if IBTA defines one.
    #[inline]
    pub fn write(service: Service, position: Position, imm: bool) -> Option<Self> {
        // RDMA WRITE opcodes follow the SEND ones: FIRST, MIDDLE, LAST, LAST_IMM, ONLY,
        // ONLY_IMM at offsets 6..=0xB of the RC and UC blocks.
        let base = match service {
            Service::Rc => 0x06,
            Service::Uc => 0x26,
            _ => return None,
        };
        let off = match (position, imm) {
            (Position::First, false) => 0,
            (Position::Middle, false) => 1,
            (Position::Last, false) => 2,
            (Position::Last, true) => 3,
            (Position::Only, false) => 4,
            (Position::Only, true) => 5,
            _ => return None,
        };
        Some(Self::from_u8(base + off))
    }

    /// The (RC) RDMA READ response opcode for `position`.
    #[inline]
    pub fn read_response(position: Position) -> Option<Self> {
        Some(Self::from_u8(match position {
            Position::First => 0x0d,
            Position::Middle => 0x0e,
            Position::Last => 0x0f,
            Position::Only => 0x10,
        }))
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_known() {
            f.write_str(self.name())
        } else {
            write!(f, "UNKNOWN(0x{:02x})", self.0)
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<u8> for Opcode {
    fn from(b: u8) -> Self {
        Self::from_u8(b)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> Self {
        op.to_u8()
    }
}

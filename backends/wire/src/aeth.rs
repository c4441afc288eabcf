//! ACK Extended Transport Header (AETH, 4 bytes) and its syndrome byte (IBA chapter 9).
//!
//! ```text
//! byte 0      syndrome: bit 7 reserved, bits 6..5 kind (00 ACK, 01 RNR NAK, 10 reserved,
//!             11 NAK), bits 4..0 credit code / RNR timer code / NAK code
//! bytes 1-3   MSN (24 bits, masked on emit)
//! ```
//!
//! Every syndrome byte decodes to an [`AethSyndrome`] that encodes back to the same byte.

use core::fmt;
use core::time::Duration;

use super::WireError;
use super::bytes::{check_len, check_room, read_u8, read_u24, write_u8, write_u24};

/// Byte offsets of the AETH fields.
mod field {
    use core::ops::Range;

    pub(super) const SYNDROME: usize = 0;
    pub(super) const MSN: Range<usize> = 1..4;
}

const KIND_MASK: u8 = 0x60;
const CODE_MASK: u8 = 0x1F;
const KIND_ACK: u8 = 0x00;
const KIND_RNR: u8 = 0x20;
const KIND_NAK: u8 = 0x60;

/// Credit count code meaning "no end-to-end credits / unlimited" (what rxe always sends).
pub const ACK_UNLIMITED_CREDITS: u8 = 0x1F;

/// NAK code carried in the low five bits of a NAK syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (syndrome 0x60).
    PsnSequenceError,
    /// 1: invalid request (0x61).
    InvalidRequest,
    /// 2: remote access error (0x62).
    RemoteAccessError,
    /// 3: remote operational error (0x63).
    RemoteOperationalError,
    /// 4: invalid RD request (0x64).
    InvalidRdRequest,
    /// Any other 5-bit code (reserved); kept as-is.
    Unknown(u8),
}

impl NakCode {
    /// Decodes the low five bits of `code` (upper bits are ignored).
    pub const fn from_u8(code: u8) -> Self {
        match code & CODE_MASK {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            other => Self::Unknown(other),
        }
    }

    /// The 5-bit NAK code (an `Unknown` value is masked to five bits).
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Unknown(c) => c & CODE_MASK,
        }
    }

    /// A short description such as `"PSN sequence error"`.
    pub const fn description(self) -> &'static str {
        match self {
            Self::PsnSequenceError => "PSN sequence error",
            Self::InvalidRequest => "invalid request",
            Self::RemoteAccessError => "remote access error",
            Self::RemoteOperationalError => "remote operational error",
            Self::InvalidRdRequest => "invalid RD request",
            Self::Unknown(_) => "unknown NAK code",
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(c) => write!(f, "unknown NAK code {c}"),
            known => f.write_str(known.description()),
        }
    }
}

/// The AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement; `credits` is the 5-bit credit count code
    /// ([`ACK_UNLIMITED_CREDITS`] = 0x1F means unlimited).
    Ack {
        /// Credit count code (0..=31, masked on encode).
        credits: u8,
    },
    /// Receiver-not-ready NAK; `timer` is the 5-bit RNR timer code.
    RnrNak {
        /// RNR timer code (0..=31, masked on encode); see [`rnr_timer_duration`].
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A reserved syndrome (bit 7 set, or kind bits `10`); holds the whole byte.
    Reserved(u8),
}

impl AethSyndrome {
    /// The syndrome rxe sends for every ACK: credits unlimited (0x1F).
    pub const ACK_UNLIMITED: Self = Self::Ack {
        credits: ACK_UNLIMITED_CREDITS,
    };

    /// Decodes a syndrome byte. Never fails; `from_u8(b).to_u8() == b` for every byte.
    pub const fn from_u8(b: u8) -> Self {
        if b & 0x80 != 0 {
            return Self::Reserved(b);
        }
        match b & KIND_MASK {
            KIND_ACK => Self::Ack {
                credits: b & CODE_MASK,
            },
            KIND_RNR => Self::RnrNak {
                timer: b & CODE_MASK,
            },
            KIND_NAK => Self::Nak(NakCode::from_u8(b)),
            _ => Self::Reserved(b),
        }
    }

    /// Encodes the syndrome byte. Codes are masked to five bits; a `Reserved` value is
    /// written as stored.
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::Ack { credits } => KIND_ACK | (credits & CODE_MASK),
            Self::RnrNak { timer } => KIND_RNR | (timer & CODE_MASK),
            Self::Nak(code) => KIND_NAK | code.to_u8(),
            Self::Reserved(b) => b,
        }
    }

    /// Whether this is a positive acknowledgement.
    pub const fn is_ack(self) -> bool {
        matches!(self, Self::Ack { .. })
    }
}

impl fmt::Display for AethSyndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Ack { credits } if credits & CODE_MASK == ACK_UNLIMITED_CREDITS => {
                f.write_str("ACK")
            }
            Self::Ack { credits } => write!(f, "ACK credits={credits}"),
            Self::RnrNak { timer } => write!(f, "RNR NAK timer={timer}"),
            Self::Nak(NakCode::Unknown(c)) => write!(f, "NAK(code {c})"),
            Self::Nak(code) => write!(f, "NAK({code})"),
            Self::Reserved(b) => write!(f, "RESERVED(0x{b:02x})"),
        }
    }
}

/// Credits of ACK credit codes 0..=30 (Linux rdmavt's `credit_table`); code 31 means "invalid /
/// unlimited".
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// Number of credits a credit count code stands for; `None` for code 31 ("invalid" /
/// unlimited) and codes above 31.
pub fn credit_count(code: u8) -> Option<u32> {
    CREDITS.get(usize::from(code)).copied()
}

/// Minimum delay an RNR timer code asks for (code 0 = 655.36 ms, 1 = 10 µs, ... 31 =
/// 491.52 ms). Only the low five bits of `code` are used. Same table as
/// [`portverbs_hal::attr::rnr_timer_ns`].
pub fn rnr_timer_duration(code: u8) -> Duration {
    Duration::from_nanos(portverbs_hal::attr::rnr_timer_ns(code))
}

/// ACK Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// Syndrome: ACK, RNR NAK or NAK.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits, masked on emit).
    pub msn: u32,
}

impl Aeth {
    /// Encoded size in bytes.
    pub const LEN: usize = 4;

    /// Parses the first [`Aeth::LEN`] bytes of `buf` (extra bytes are ignored).
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        Ok(Self {
            syndrome: AethSyndrome::from_u8(read_u8(buf, field::SYNDROME)?),
            msn: read_u24(buf, field::MSN)?,
        })
    }

    /// Writes the header into the first [`Aeth::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u8(out, field::SYNDROME, self.syndrome.to_u8())?;
        write_u24(out, field::MSN, self.msn)
    }
}

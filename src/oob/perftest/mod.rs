//! perftest's side channel (`src/perftest_communication.c` of linux-rdma/perftest), so that a
//! Portverbs program and `ib_write_bw`, `ib_read_lat` … can be each other's peer. The exchange
//! is the same in perftest 4.5-0.17 (protocol version 6.06), 4.5-0.20 (6.10) and later
//! releases, which add messages only for options or peer versions this side does not use.
//!
//! Every exchange is one message each way of a size both sides know, the client writing
//! first ([`Role`](super::Role)); in order:
//!
//! 1. **versions** ([`version_msg`], [`parse_version`]): [`VERSION_LEN`] bytes of NUL-padded
//!    text. perftest refuses a peer older than [`MIN_PEER_VERSION`]; one from 6.28 on
//!    negotiates the test parameters only with peers of 6.28 or later, so announcing
//!    [`PROTOCOL_VERSION`] keeps that negotiation out.
//! 2. **system data** ([`int_msg`], [`parse_int`]): the page size used as the cycle buffer,
//!    then the cache line size, each a 4-byte big-endian integer; each side keeps the larger
//!    cycle buffer.
//! 3. **MTU** ([`mtu_msg`], [`parse_mtu`]): the `ibv_mtu` value (1 = 256 … 5 = 4096) as a
//!    decimal digit and a NUL; each side uses the smaller (and its own when the peer's is not
//!    one).
//! 4. **destinations** ("hand shakes", [`Dest`]): one `struct pingpong_dest` per message. Over
//!    TCP it is text ([`Dest::encode_text`]) of [`TEXT_LEN`] bytes, or [`TEXT_LEN_GID`] with
//!    the GID — a side uses the GID form when it uses a GID index, as RoCE always does, and
//!    reads the form it sends. Over the RC QP of perftest's rdma_cm mode (`-R`) it is binary
//!    ([`Dest::encode_binary`], [`BinaryForm`]). The same message also serves as a barrier
//!    between the test's phases.
//! 5. **bandwidth reports** (`xchg_bw_reports`, [`BwReport`]): the client's result in five
//!    8-byte big-endian messages, each answered by the server's.
//! 6. **closing** (`ctx_close_connection`): a last hand shake, then over TCP [`DONE`] from
//!    each side.
//!
//! [`negotiate`] runs steps 1 to 3, [`hand_shake`] one destination each way,
//! [`bw_reports`] step 5, on any transport that implements [`Exchange`]; [`StreamExchange`]
//! is that transport for a blocking stream (TCP), with [`StreamExchange::close`] for step 6,
//! and with feature `tokio` `AsyncStreamExchange` does all of it on a tokio stream.
//!
//! With `-R`, the messages travel as SENDs on an RC QP that the CM connected, each exchange
//! one SEND each way, the client first. perftest keeps a receive larger than any message
//! posted and copies out of it the bytes it expects; every message but the destination is as
//! over TCP.

mod binary;
mod exchange;
mod params;
mod text;

use portverbs_hal::Gid;

pub use binary::BinaryForm;
#[cfg(feature = "tokio")]
pub use exchange::AsyncStreamExchange;
pub use exchange::{
    Exchange, ExchangeError, Step, StreamExchange, bw_reports, hand_shake, negotiate,
};
pub use params::{
    BwReport, PeerParams, int_msg, mtu_msg, parse_int, parse_mtu, parse_version, version_msg,
};

/// The protocol version this side announces (perftest 4.5-0.20's).
pub const PROTOCOL_VERSION: &str = "6.10";

/// perftest refuses peers older than this ("not compatible with versions older than 5.70").
pub const MIN_PEER_VERSION: f64 = 5.70;

/// Bytes of the version message (perftest's `MAX_VERSION`).
pub const VERSION_LEN: usize = 16;

/// Bytes of a text destination without GID: 58 characters and a NUL (`KEY_MSG_SIZE`).
pub const TEXT_LEN: usize = 59;

/// Bytes of a text destination with GID: 107 characters and a NUL (`KEY_MSG_SIZE_GID`).
pub const TEXT_LEN_GID: usize = 108;

/// Each side's last message over TCP: the C string `done`, NUL included.
pub const DONE: &[u8; 5] = b"done\0";

/// The cache line size announced in the system data (perftest's usual value).
pub const CACHE_LINE_SIZE: i32 = 64;

/// The page size announced as the cycle buffer, and the smallest one taken from a peer.
pub const PAGE_SIZE: i32 = 4096;

/// One QP's `struct pingpong_dest`, as the destination messages carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA reads and atomics the side accepts (perftest's `-o`).
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// R_Key of the side's buffer.
    pub rkey: u32,
    /// Address of the side's buffer for this QP (where the peer writes and reads).
    pub vaddr: u64,
    /// The GID: in the text form, present exactly in the GID form of the message; the binary
    /// form always has one.
    pub gid: Option<Gid>,
    /// SRQ number (XRC and DC; 0 otherwise).
    pub srqn: u32,
}

/// Why a message from the peer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A text destination has the wrong number of `:`-separated fields.
    #[error("expected {want} ':'-separated fields, found {found}")]
    Fields {
        /// Fields expected.
        want: usize,
        /// Fields found.
        found: usize,
    },
    /// A text field is not a hex number that fits its width; holds the field's name.
    #[error("{0} is not a hex number of its width")]
    Field(&'static str),
    /// A text destination is longer than its form.
    #[error("a destination has at most {max} bytes, found {found}")]
    TextLength {
        /// The length of the form read.
        max: usize,
        /// The length found.
        found: usize,
    },
    /// A binary destination has neither length of [`BinaryForm`]; holds the length found.
    #[error(
        "the peer's destination has {0} bytes; perftest's has {plain} (or {tail} from version \
         6.28)",
        plain = BinaryForm::Plain.size(),
        tail = BinaryForm::TailMarkers.size()
    )]
    BinaryLength(usize),
    /// A 32-bit field of a binary destination does not fit the 16 bits of [`Dest`]'s.
    #[error("the peer's destination has {field} {value}, above 65535")]
    Wide {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// The version text does not start with a number; holds the text (at most 16 bytes).
    #[error("'{0}' is not a perftest version")]
    Version(String),
    /// The MTU message is not an `ibv_mtu` value (1 ..= 5); holds its text.
    #[error("'{0}' is not an MTU value (1 ..= 5)")]
    Mtu(String),
}

#[cfg(test)]
mod tests;

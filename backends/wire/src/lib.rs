//! # Portverbs wire formats
//!
//! RoCEv2 / InfiniBand transport wire formats: the lowest layer of the transport stack
//! (`wire` → `transport` → `fabric` → the soft device and the mlx4 model). The transport engine
//! (`portverbs-transport`) builds and parses packets with it; the fabric uses it to serialise a
//! packet it corrupts on purpose; `portverbs-mlx4-layout` composes the mlx4 special QPs'
//! packet headers from [`Lrh`], [`Grh`], [`Bth`] and [`Deth`].
//!
//! What this crate must never do: I/O of any kind, keep state, allocate on a parse, panic on
//! input bytes, or depend on any crate of ours but `portverbs-hal`.
//!
//! Two layers, in the style of smoltcp:
//!
//! * **Representations** of each header ([`Bth`], [`Reth`], [`Aeth`], [`Deth`],
//!   [`AtomicEth`], [`AtomicAckEth`], and the native InfiniBand link and global route headers
//!   [`Lrh`] and [`Grh`] that an HCA's special QPs send) with `LEN`, `parse` and `emit`, and the whole transport
//!   header [`TransportHdr`] whose [`TransportHdr::parse`] yields a [`ParsedPacket`]. All
//!   fields are big-endian on the wire; byte offsets live in private `field` modules.
//! * **The opcode table** behind [`Opcode`]: one `const` table indexed by the opcode byte
//!   tells which extension headers follow the BTH ([`HeaderSet`]) and what the packet means
//!   ([`Service`], [`Position`], [`OpKind`]).
//!
//! On top of that, RoCEv2 framing: [`build_frame`] / [`parse_frame`] (IP + UDP + transport +
//! [`icrc`]) and [`udp_source_port`].
//!
//! Nothing here panics on input bytes: every parser returns [`WireError`]. Values that do not
//! fit their wire field (24-bit QPNs, PSNs and MSNs, the 2-bit pad count, the 4-bit version)
//! are masked on emit, never rejected.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod aeth;
mod bth;
mod bytes;
mod datagram;
mod error;
mod ext;
mod frame;
mod frame_parse;
mod grh;
mod headerset;
mod icrc;
mod lrh;
mod opcode;
mod pretty;
mod transport;

#[cfg(test)]
mod tests;

pub use aeth::{
    ACK_UNLIMITED_CREDITS, Aeth, AethSyndrome, NakCode, credit_count, rnr_timer_duration,
};
pub use bth::{Bth, DEFAULT_PKEY, MASK_24, pad_len};
pub use datagram::{
    Datagram, Ipv4IdShift, datagram_frame, datagram_icrc, gf2, open_datagram, seal_datagram,
};
pub use error::WireError;
pub use ext::{AtomicAckEth, AtomicEth, Deth, IMM_LEN, Reth};
pub use frame::{
    FrameOptions, ICRC_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, ROCEV2_UDP_PORT, UDP_HEADER_LEN,
    build_frame, build_frame_with, ipv4_header_checksum,
};
pub use frame_parse::{FrameView, parse_frame};
pub use grh::Grh;
pub use headerset::HeaderSet;
pub use icrc::{
    FLOW_LABEL_MASK, flow_label_from_qpns, flow_label_to_udp_port, icrc, udp_source_port,
};
pub use lrh::{Lrh, lnh};
pub use opcode::{OpKind, Opcode, Position, Service};
pub use pretty::pretty;
pub use transport::{ParsedPacket, TransportHdr};

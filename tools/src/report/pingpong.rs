//! `ibv_rc_pingpong` conventions for `portverbs pingpong`.
//!
//! * The TCP exchange: each side sends one ASCII message `LLLL:QQQQQQ:PPPPPP:GGGG…` — LID as 4
//!   hex digits, QPN and PSN as 6 hex digits each, the GID as 32 hex digits (its 16 bytes in
//!   order) — followed by a NUL byte, [`WIRE_MSG_LEN`] bytes in all. Speaking this format lets
//!   `portverbs pingpong` talk to the C binary.
//! * The address lines: `  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::`
//!   (note the two spaces after `local address:`, which line it up with `remote address:`);
//!   the GID is printed as IPv6 text the way `inet_ntop` writes it.
//! * The result lines: `<bytes> bytes in <s> seconds = <x> Mbit/sec` and
//!   `<n> iters in <s> seconds = <y> usec/iter`, with two decimals, where `bytes` counts both
//!   directions (size × iterations × 2).

use std::fmt;
use std::time::Duration;

use super::gid::{Gid, gid_inet6, gid_wire};
use super::numfmt::finite_or_zero;

/// Bytes `ibv_rc_pingpong` sends for one exchange message: 51 characters and a NUL.
pub(crate) const WIRE_MSG_LEN: usize = 52;

/// One side's connection data as exchanged over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Dest {
    /// Port LID (0 on RoCE).
    pub(crate) lid: u16,
    /// Queue pair number (24 bits).
    pub(crate) qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub(crate) psn: u32,
    /// GID (all zero when no GID index is used).
    pub(crate) gid: Gid,
}

/// Why an exchange message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParseDestError {
    /// The message does not have four `:`-separated fields; holds the number found.
    FieldCount(usize),
    /// A field is empty or holds something other than hex digits; holds the field name.
    NotHex(&'static str),
    /// A numeric field does not fit its width (LID 16 bits, QPN and PSN 24 bits).
    OutOfRange(&'static str),
    /// The GID field is not 32 hex digits; holds its length.
    GidLength(usize),
}

impl fmt::Display for ParseDestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FieldCount(n) => write!(f, "expected 4 ':'-separated fields, found {n}"),
            Self::NotHex(field) => write!(f, "{field} is not a hex number"),
            Self::OutOfRange(field) => write!(f, "{field} is out of range"),
            Self::GidLength(n) => write!(f, "GID must be 32 hex digits, found {n} characters"),
        }
    }
}

impl std::error::Error for ParseDestError {}

/// Formats the exchange message (without the trailing NUL the C tool also sends):
/// `format!("{lid:04x}:{qpn:06x}:{psn:06x}:{gid}")`. Values wider than the field print in full,
/// as C's `%06x` does.
pub(crate) fn format_dest(dest: &Dest) -> String {
    format!(
        "{:04x}:{:06x}:{:06x}:{}",
        dest.lid,
        dest.qpn,
        dest.psn,
        gid_wire(&dest.gid)
    )
}

/// Parses an exchange message.
///
/// Trailing NUL bytes and ASCII whitespace are ignored (the C tool sends a NUL-terminated
/// buffer). The LID, QPN and PSN fields must be 1 to 8 hex digits whose value fits 16, 24 and
/// 24 bits; the GID must be exactly 32 hex digits.
pub(crate) fn parse_dest(msg: &str) -> Result<Dest, ParseDestError> {
    let msg = msg.trim_end_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
    let fields: Vec<&str> = msg.split(':').collect();
    let [lid, qpn, psn, gid] = fields.as_slice() else {
        return Err(ParseDestError::FieldCount(fields.len()));
    };
    let lid = parse_hex_field(lid, "LID", 0xffff)?;
    let qpn = parse_hex_field(qpn, "QPN", 0xff_ffff)?;
    let psn = parse_hex_field(psn, "PSN", 0xff_ffff)?;
    if gid.len() != 32 {
        return Err(ParseDestError::GidLength(gid.len()));
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        let pair = gid
            .get(2 * i..2 * i + 2)
            .ok_or(ParseDestError::NotHex("GID"))?;
        *b = parse_hex(pair).ok_or(ParseDestError::NotHex("GID"))? as u8;
    }
    Ok(Dest {
        lid: u16::try_from(lid).map_err(|_| ParseDestError::OutOfRange("LID"))?,
        qpn: u32::try_from(qpn).map_err(|_| ParseDestError::OutOfRange("QPN"))?,
        psn: u32::try_from(psn).map_err(|_| ParseDestError::OutOfRange("PSN"))?,
        gid: bytes,
    })
}

/// Parses 1 to 8 hex digits (nothing else) into a value no larger than `max`.
fn parse_hex_field(text: &str, name: &'static str, max: u64) -> Result<u64, ParseDestError> {
    if text.len() > 8 {
        return Err(ParseDestError::OutOfRange(name));
    }
    let value = parse_hex(text).ok_or(ParseDestError::NotHex(name))?;
    if value > max {
        return Err(ParseDestError::OutOfRange(name));
    }
    Ok(value)
}

/// Parses a non-empty string of hex digits (at most 16) without sign or prefix.
fn parse_hex(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// Which end an address line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PingpongSide {
    /// `  local address:  …`.
    Local,
    /// `  remote address: …`.
    Remote,
}

/// Formats an address line (ends with `\n`):
/// `  local address:  LID 0x0001, QPN 0x000011, PSN 0x123456, GID fe80::1`.
pub(crate) fn format_address(side: PingpongSide, dest: &Dest) -> String {
    let label = match side {
        PingpongSide::Local => "local address: ",
        PingpongSide::Remote => "remote address:",
    };
    format!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}\n",
        dest.lid,
        dest.qpn,
        dest.psn,
        gid_inet6(&dest.gid)
    )
}

/// Formats the two result lines printed at the end of a run (each ends with `\n`):
///
/// `<bytes> bytes in <s> seconds = <mbit> Mbit/sec` with `bytes = size × iters × 2` and
/// `mbit = bytes × 8 / elapsed_usec`, then `<iters> iters in <s> seconds = <usec> usec/iter` with
/// `usec = elapsed_usec / iters`. Zero elapsed time or zero iterations print `0.00`.
pub(crate) fn format_results(size: u64, iters: u64, elapsed: Duration) -> String {
    let usec = elapsed.as_secs_f64() * 1e6;
    let secs = elapsed.as_secs_f64();
    let bytes = size.saturating_mul(iters).saturating_mul(2);
    let mbit = if usec > 0.0 {
        bytes as f64 * 8.0 / usec
    } else {
        0.0
    };
    let per_iter = if iters > 0 { usec / iters as f64 } else { 0.0 };
    format!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec\n\
         {iters} iters in {secs:.2} seconds = {:.2} usec/iter\n",
        finite_or_zero(mbit),
        finite_or_zero(per_iter)
    )
}

#[cfg(test)]
#[path = "pingpong_tests.rs"]
mod tests;

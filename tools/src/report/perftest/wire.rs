//! perftest's TCP side channel (its default, non-rdma_cm exchange), as pure encode/decode
//! functions, so that `portverbs perf` and a real `ib_write_bw` can be each other's peer: the
//! exchange is the same in perftest 4.5-0.17 (Debian 12's package, protocol version 6.06),
//! 4.5-0.20 (6.10) and later releases (which add messages only for options or peer versions
//! this side does not use).
//!
//! The conversation, always the client first in every exchange (the client writes then reads,
//! the server reads then writes, each message a fixed number of bytes):
//!
//! 1. versions: [`VERSION_LEN`] bytes each way, the version as NUL-padded text
//!    ([`version_msg`], [`parse_version`]); a peer older than [`MIN_PEER_VERSION`] is refused
//!    (perftest refuses it too). A peer from 6.28 on negotiates the test parameters only with
//!    peers that are 6.28 or newer themselves, so announcing [`PROTOCOL_VERSION`] keeps it out
//!    of that exchange.
//! 2. system data: the page size used as the cycle buffer and the cache line size, each a
//!    4-byte big-endian integer ([`int_msg`], [`parse_int`]); each side keeps the larger.
//! 3. MTU: the `ibv_mtu` enum value (1 = 256 … 5 = 4096) as decimal text in 2 bytes
//!    ([`mtu_msg`], [`parse_mtu`]); each side uses the smaller.
//! 4. destinations ("hand shakes"): a `struct pingpong_dest` per message in the text format of
//!    [`format_keys`] — [`KEY_MSG_SIZE`] bytes without GID, [`KEY_MSG_SIZE_GID`] bytes with the
//!    GID (a side uses the GID form when it uses a GID index, as RoCE always does; the reader
//!    expects the form its own side uses). The same message also serves as a barrier between
//!    the test's phases.
//! 5. BW reports (`xchg_bw_reports`): the client's result in five messages, each answered by
//!    the server's: size and iterations as 8-byte big-endian integers, then peak bandwidth,
//!    average bandwidth and message rate as big-endian IEEE doubles ([`BwReport`]).
//! 6. closing: a last hand shake, then [`DONE`] from each side.

use std::fmt;

/// The protocol version this implementation speaks (perftest 4.5-0.20's).
pub(crate) const PROTOCOL_VERSION: &str = "6.10";

/// perftest refuses peers older than this ("not compatible with versions older than 5.70").
pub(crate) const MIN_PEER_VERSION: f64 = 5.70;

/// Bytes of the version message (`MAX_VERSION`).
pub(crate) const VERSION_LEN: usize = 16;

/// Bytes of a destination message without GID (58 characters and a NUL).
pub(crate) const KEY_MSG_SIZE: usize = 59;

/// Bytes of a destination message with GID (107 characters and a NUL).
pub(crate) const KEY_MSG_SIZE_GID: usize = 108;

/// The closing message of each side.
pub(crate) const DONE: &[u8; 5] = b"done\0";

/// The cache line size announced in the system data (perftest's usual value).
pub(crate) const CACHE_LINE_SIZE: i32 = 64;

/// The page size announced as the cycle buffer.
pub(crate) const PAGE_SIZE: i32 = 4096;

/// One QP's `struct pingpong_dest` as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyMsg {
    /// Port LID (0 on RoCE).
    pub(crate) lid: u16,
    /// Outstanding RDMA reads/atomics the side accepts (`-o`).
    pub(crate) out_reads: u16,
    /// QP number (24 bits).
    pub(crate) qpn: u32,
    /// First PSN (24 bits).
    pub(crate) psn: u32,
    /// R_Key of the side's buffer.
    pub(crate) rkey: u32,
    /// Address of the side's buffer for this QP (where the peer writes and reads).
    pub(crate) vaddr: u64,
    /// The GID, in the GID form of the message.
    pub(crate) gid: Option<[u8; 16]>,
    /// SRQ number (XRC and DC; 0 otherwise).
    pub(crate) srqn: u32,
}

/// Why a message from the peer could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The message does not have the expected number of `:`-separated fields.
    Fields {
        /// Fields expected.
        want: usize,
        /// Fields found.
        found: usize,
    },
    /// A field is not a hex number that fits its width; holds the field's name.
    Field(&'static str),
    /// The version text does not start with a number.
    Version(String),
    /// The MTU text is not an `ibv_mtu` value (1 ..= 5).
    Mtu(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fields { want, found } => {
                write!(f, "expected {want} ':'-separated fields, found {found}")
            }
            Self::Field(name) => write!(f, "{name} is not a hex number of its width"),
            Self::Version(text) => write!(f, "'{text}' is not a perftest version"),
            Self::Mtu(text) => write!(f, "'{text}' is not an MTU value (1 ..= 5)"),
        }
    }
}

impl std::error::Error for WireError {}

/// The destination message, NUL included: [`KEY_MSG_SIZE`] bytes, or [`KEY_MSG_SIZE_GID`]
/// with a GID. The text is
/// `LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:SSSSSSSS` (LID, outstanding reads, QPN,
/// PSN, R_Key, address, SRQ number in zero-padded lower-case hex), or with a GID
/// `LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:gg:gg:…:gg:SSSSSSSS:` (the 16 GID bytes
/// as two hex digits each, then the SRQ number and a closing `:`). QPN and PSN are masked to
/// their 24 bits so that the message has its exact size.
pub(crate) fn format_keys(k: &KeyMsg) -> Vec<u8> {
    let mut text = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
        k.lid,
        k.out_reads,
        k.qpn & 0xff_ffff,
        k.psn & 0xff_ffff,
        k.rkey,
        k.vaddr
    );
    match &k.gid {
        None => text += &format!("{:08x}", k.srqn),
        Some(gid) => {
            for b in gid {
                text += &format!("{b:02x}:");
            }
            text += &format!("{:08x}:", k.srqn);
        }
    }
    let mut bytes = text.into_bytes();
    bytes.push(0);
    bytes
}

/// Parses a destination message; `with_gid` says which form (the reader's own). Trailing NUL
/// bytes are ignored; every field is hex and must fit its width.
///
/// # Errors
/// A missing or malformed field.
pub(crate) fn parse_keys(msg: &[u8], with_gid: bool) -> Result<KeyMsg, WireError> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = String::from_utf8_lossy(&msg[..end]);
    let mut fields: Vec<&str> = text.split(':').collect();
    let want = if with_gid { 6 + 16 + 1 } else { 7 };
    if with_gid && fields.last() == Some(&"") {
        fields.pop();
    }
    if fields.len() != want {
        return Err(WireError::Fields {
            want,
            found: fields.len(),
        });
    }
    let num = |i: usize, name: &'static str, max: u64| -> Result<u64, WireError> {
        let f = fields[i];
        if f.is_empty() || f.len() > 16 || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(WireError::Field(name));
        }
        u64::from_str_radix(f, 16)
            .ok()
            .filter(|&v| v <= max)
            .ok_or(WireError::Field(name))
    };
    let gid = if with_gid {
        let mut g = [0u8; 16];
        for (j, b) in g.iter_mut().enumerate() {
            *b = num(6 + j, "GID", 0xff)? as u8;
        }
        Some(g)
    } else {
        None
    };
    Ok(KeyMsg {
        lid: num(0, "LID", 0xffff)? as u16,
        out_reads: num(1, "OUT_READS", 0xffff)? as u16,
        qpn: num(2, "QPN", 0xff_ffff)? as u32,
        psn: num(3, "PSN", 0xff_ffff)? as u32,
        rkey: num(4, "RKEY", 0xffff_ffff)? as u32,
        vaddr: num(5, "VADDR", u64::MAX)?,
        gid,
        srqn: num(want - 1, "SRQN", 0xffff_ffff)? as u32,
    })
}

/// The version message: `version` NUL-padded to [`VERSION_LEN`] bytes (cut to 15 bytes).
pub(crate) fn version_msg(version: &str) -> [u8; VERSION_LEN] {
    let mut msg = [0u8; VERSION_LEN];
    let n = version.len().min(VERSION_LEN - 1);
    msg[..n].copy_from_slice(&version.as_bytes()[..n]);
    msg
}

/// The peer's version as perftest compares it (`atof`: the leading decimal number).
///
/// # Errors
/// The text does not start with a number.
pub(crate) fn parse_version(msg: &[u8]) -> Result<f64, WireError> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = String::from_utf8_lossy(&msg[..end]);
    let t = text.trim_start();
    let mut len = 0;
    let mut dot = false;
    for c in t.chars() {
        match c {
            '0'..='9' => len += 1,
            '.' if !dot => {
                dot = true;
                len += 1;
            }
            _ => break,
        }
    }
    t[..len]
        .parse::<f64>()
        .map_err(|_| WireError::Version(text.into_owned()))
}

/// A 4-byte big-endian integer message (`hton_int`).
pub(crate) fn int_msg(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

/// Reads a 4-byte big-endian integer message.
pub(crate) fn parse_int(msg: [u8; 4]) -> i32 {
    i32::from_be_bytes(msg)
}

/// The MTU message: the `ibv_mtu` value (1 ..= 5) as one decimal digit and a NUL.
pub(crate) fn mtu_msg(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// Reads the MTU message (`strtol`: the leading decimal digits).
///
/// # Errors
/// Not a value of 1 ..= 5.
pub(crate) fn parse_mtu(msg: [u8; 2]) -> Result<u8, WireError> {
    let digits: Vec<u8> = msg.iter().copied().take_while(u8::is_ascii_digit).collect();
    let text = String::from_utf8_lossy(&digits).into_owned();
    match text.parse::<u8>() {
        Ok(v @ 1..=5) => Ok(v),
        _ => Err(WireError::Mtu(
            String::from_utf8_lossy(&msg)
                .trim_end_matches('\0')
                .to_owned(),
        )),
    }
}

/// A bandwidth report as `xchg_bw_reports` exchanges it (without the per-port fields).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct BwReport {
    /// Message size.
    pub(crate) size: u64,
    /// Messages counted.
    pub(crate) iters: u64,
    /// Peak bandwidth, in the report's unit.
    pub(crate) bw_peak: f64,
    /// Average bandwidth, in the report's unit.
    pub(crate) bw_avg: f64,
    /// Message rate in Mpps.
    pub(crate) msg_rate: f64,
}

impl BwReport {
    /// The five messages, in order, each 8 bytes big-endian.
    pub(crate) fn messages(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The report from its five messages.
    pub(crate) fn from_messages(m: &[[u8; 8]; 5]) -> Self {
        let f = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        Self {
            size: u64::from_be_bytes(m[0]),
            iters: u64::from_be_bytes(m[1]),
            bw_peak: f(m[2]),
            bw_avg: f(m[3]),
            msg_rate: f(m[4]),
        }
    }
}

/// Whether a GID is an IPv4-mapped address (`::ffff:a.b.c.d`), as perftest's check that both
/// sides use the same IP version reads it.
pub(crate) fn gid_is_v4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(gid: Option<[u8; 16]>) -> KeyMsg {
        KeyMsg {
            lid: 0x1,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_dead_beef,
            gid,
            srqn: 0,
        }
    }

    /// The bytes `sprintf(msg, KEY_PRINT_FMT, …)` writes into its 59-byte buffer.
    #[test]
    fn keys_without_gid_are_byte_exact() {
        let msg = format_keys(&keys(None));
        let want = b"0001:0010:000011:abcdef:00001234:00007f00deadbeef:00000000\0";
        assert_eq!(msg.len(), KEY_MSG_SIZE);
        assert_eq!(&msg[..], &want[..]);
        assert_eq!(parse_keys(&msg, false), Ok(keys(None)));
    }

    /// The bytes of `KEY_PRINT_FMT_GID` for the RoCE GID of 10.0.0.2.
    #[test]
    fn keys_with_gid_are_byte_exact() {
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        let msg = format_keys(&keys(Some(gid)));
        let want = b"0001:0010:000011:abcdef:00001234:00007f00deadbeef:\
                     00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02:00000000:\0";
        assert_eq!(msg.len(), KEY_MSG_SIZE_GID);
        assert_eq!(&msg[..], &want[..]);
        assert_eq!(parse_keys(&msg, true), Ok(keys(Some(gid))));
        assert!(gid_is_v4_mapped(&gid));
        assert!(!gid_is_v4_mapped(&[
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1
        ]));
    }

    #[test]
    fn keys_round_trip_at_the_field_limits() {
        for gid in [None, Some([0xff; 16])] {
            let k = KeyMsg {
                lid: u16::MAX,
                out_reads: u16::MAX,
                qpn: 0xff_ffff,
                psn: 0xff_ffff,
                rkey: u32::MAX,
                vaddr: u64::MAX,
                gid,
                srqn: u32::MAX,
            };
            let msg = format_keys(&k);
            assert_eq!(msg.len(), if gid.is_some() { 108 } else { 59 });
            assert_eq!(parse_keys(&msg, gid.is_some()), Ok(k));
        }
    }

    #[test]
    fn malformed_keys_are_refused() {
        let msg = format_keys(&keys(None));
        // Read in the other form.
        assert!(matches!(
            parse_keys(&msg, true),
            Err(WireError::Fields { want: 23, .. })
        ));
        assert_eq!(
            parse_keys(b"0001:0010:1000000:0:0:0:0\0", false),
            Err(WireError::Field("QPN"))
        );
        assert_eq!(
            parse_keys(b"0001:zz:1:0:0:0:0", false),
            Err(WireError::Field("OUT_READS"))
        );
        assert_eq!(
            parse_keys(b"", false),
            Err(WireError::Fields { want: 7, found: 1 })
        );
    }

    #[test]
    fn versions() {
        let msg = version_msg(PROTOCOL_VERSION);
        assert_eq!(&msg, b"6.10\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(parse_version(&msg), Ok(6.10));
        assert_eq!(parse_version(b"6.29\0garbage\0\0\0\0"), Ok(6.29));
        assert_eq!(parse_version(b"5.70-beta\0"), Ok(5.70));
        assert!(parse_version(b"\0").is_err());
        assert!(parse_version(b"x6\0").is_err());
        assert_eq!(version_msg("0123456789abcdefgh")[15], 0);
    }

    #[test]
    fn integers_and_mtu() {
        assert_eq!(int_msg(4096), [0, 0, 0x10, 0]);
        assert_eq!(parse_int(int_msg(-2)), -2);
        assert_eq!(mtu_msg(3), *b"3\0");
        assert_eq!(parse_mtu(*b"5\0"), Ok(5));
        assert!(parse_mtu(*b"0\0").is_err());
        assert!(parse_mtu(*b"\0\0").is_err());
    }

    /// Whatever a peer sends, reading it never panics.
    #[test]
    fn garbage_never_panics() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"0123456789abcdefABCDEF:.\0xg\xff";
        for _ in 0..20_000 {
            let len = (next() % 120) as usize;
            let msg: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            for with_gid in [false, true] {
                if let Ok(k) = parse_keys(&msg, with_gid) {
                    // What parses, formats back into a message that parses the same.
                    assert_eq!(parse_keys(&format_keys(&k), with_gid), Ok(k));
                }
            }
            let _ = parse_version(&msg);
            let _ = parse_mtu([
                msg.first().copied().unwrap_or(0),
                msg.get(1).copied().unwrap_or(0),
            ]);
        }
    }

    #[test]
    fn bw_reports_are_big_endian() {
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.02,
        };
        let m = r.messages();
        assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(m[1], [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
        // 1.5 = 0x3FF8_0000_0000_0000.
        assert_eq!(m[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(BwReport::from_messages(&m), r);
    }
}

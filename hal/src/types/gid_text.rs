//! The text forms of a [`Gid`], as the RDMA tools print and exchange them.
//!
//! | form | example | who writes it |
//! |---|---|---|
//! | [`Gid::inet6`] (also `Display`) | `fe80::202:c9ff:fe0a:b0c`, `::ffff:10.0.0.1` | glibc's `inet_ntop(AF_INET6, …)`: `ibv_rc_pingpong`'s address lines, `ibv_devinfo` for RoCE v2 GIDs |
//! | [`Gid::hex_groups`] | `fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c` | `ibv_devinfo` for IB and RoCE v1 GIDs |
//! | [`Gid::wire_hex`] | `fe800000000000000202c9fffe0a0b0c` | the TCP exchange of rdma-core's pingpong examples (`gid_to_wire_gid` in `libibverbs/examples/pingpong.c`) |
//! | [`Gid::decimal_bytes`] | `254:128:00:00:…:12` | perftest's ` GID:` address line |
//!
//! Every form reads the GID as its 16 bytes in network order. [`Gid`]'s `FromStr` takes IPv6
//! text (IPv4 text too, as the RoCEv2 GID of that address) and the 32-digit wire form.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::str::FromStr;

use super::Gid;

/// Why a text is not a GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GidParseError {
    /// The wire form is not 32 characters long; holds the length found, in bytes.
    #[error("GID must be 32 hex digits, found {0} characters")]
    WireLength(usize),
    /// The wire form holds something other than hex digits.
    #[error("GID is not a hex number")]
    WireNotHex,
    /// Neither IP text nor the wire form.
    #[error("not a GID: neither IPv6 or IPv4 text nor 32 hex digits")]
    Unrecognized,
}

/// Which text form a [`GidText`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Inet6,
    HexGroups,
    WireHex,
    DecimalBytes,
}

/// A [`Gid`] in one of its text forms, written without allocating; width and alignment flags
/// (`{:>40}`) pad it as they pad a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidText {
    gid: Gid,
    form: Form,
}

impl Gid {
    /// IPv6 text exactly as glibc's `inet_ntop(AF_INET6, …)` writes it, which is not always
    /// what Rust's `Ipv6Addr` writes: lowercase hex groups without leading zeros, the first
    /// longest run of two or more zero groups as `::`, and the last four bytes as a dotted
    /// IPv4 address when the GID starts with six zero groups or with five and `ffff`
    /// (`::1.2.3.4`, `::ffff:10.0.0.1`). This is also what `Display` writes.
    pub fn inet6(self) -> GidText {
        self.text(Form::Inet6)
    }

    /// Eight colon-separated groups of four lowercase hex digits
    /// (`fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c`), as `ibv_devinfo -v` prints IB GIDs.
    pub fn hex_groups(self) -> GidText {
        self.text(Form::HexGroups)
    }

    /// 32 lowercase hex digits, the bytes in order: the GID field of the `LID:QPN:PSN:GID`
    /// message of `ibv_rc_pingpong` and its siblings. [`Gid::from_wire_hex`] reads it back.
    pub fn wire_hex(self) -> GidText {
        self.text(Form::WireHex)
    }

    /// 16 colon-separated decimal bytes, each at least two digits wide
    /// (`254:128:00:00:…`), as perftest's address lines print it (`%02d`).
    pub fn decimal_bytes(self) -> GidText {
        self.text(Form::DecimalBytes)
    }

    fn text(self, form: Form) -> GidText {
        GidText { gid: self, form }
    }

    /// Reads the 32-hex-digit wire form (either case).
    ///
    /// # Errors
    /// [`GidParseError::WireLength`] unless the text is 32 bytes long,
    /// [`GidParseError::WireNotHex`] for anything but hex digits.
    pub fn from_wire_hex(text: &str) -> Result<Self, GidParseError> {
        let text = text.as_bytes();
        if text.len() != 32 {
            return Err(GidParseError::WireLength(text.len()));
        }
        let digit = |c: u8| char::from(c).to_digit(16).ok_or(GidParseError::WireNotHex);
        let mut gid = [0u8; 16];
        for (byte, pair) in gid.iter_mut().zip(text.chunks_exact(2)) {
            *byte = ((digit(pair[0])? << 4) | digit(pair[1])?) as u8;
        }
        Ok(Self(gid))
    }
}

impl FromStr for Gid {
    type Err = GidParseError;

    /// IPv6 text (any form `Ipv6Addr` reads, the eight groups of `ibv_devinfo` included),
    /// IPv4 text (its RoCEv2 GID, `::ffff:a.b.c.d`), or the 32-hex-digit wire form.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self::from_ip(ip));
        }
        if text.len() == 32 && !text.contains(':') {
            return Self::from_wire_hex(text);
        }
        Err(GidParseError::Unrecognized)
    }
}

impl fmt::Display for Gid {
    /// The IPv6 form ([`Gid::inet6`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inet6().fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.hex_groups())
    }
}

impl fmt::Display for GidText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Buf::new();
        let bytes = &self.gid.0;
        match self.form {
            Form::Inet6 => write_inet6(bytes, &mut out)?,
            Form::HexGroups => {
                for (i, pair) in bytes.chunks_exact(2).enumerate() {
                    let sep = if i == 0 { "" } else { ":" };
                    write!(out, "{sep}{:02x}{:02x}", pair[0], pair[1])?;
                }
            }
            Form::WireHex => bytes.iter().try_for_each(|b| write!(out, "{b:02x}"))?,
            Form::DecimalBytes => {
                for (i, b) in bytes.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ":" };
                    write!(out, "{sep}{b:02}")?;
                }
            }
        }
        f.pad(out.as_str())
    }
}

/// Writes `gid` as glibc's `inet_ntop` does (the algorithm of BIND's `inet_ntop6`).
fn write_inet6(gid: &[u8; 16], out: &mut Buf) -> fmt::Result {
    let words: [u16; 8] = std::array::from_fn(|i| u16::from_be_bytes([gid[2 * i], gid[2 * i + 1]]));
    // The first longest run of zero words; one of length one is not shortened.
    let (mut run_at, mut run_len) = (0, 0);
    let mut i = 0;
    while i < words.len() {
        let start = i;
        while i < words.len() && words[i] == 0 {
            i += 1;
        }
        if i - start > run_len {
            (run_at, run_len) = (start, i - start);
        }
        i += 1;
    }
    let run = (run_len >= 2).then_some(run_at..run_at + run_len);
    let v4_tail = run_at == 0 && (run_len == 6 || (run_len == 5 && words[5] == 0xffff));
    for (i, word) in words.iter().enumerate() {
        if let Some(run) = run.as_ref().filter(|r| r.contains(&i)) {
            if i == run.start {
                out.write_char(':')?;
            }
            continue;
        }
        if i != 0 {
            out.write_char(':')?;
        }
        if i == 6 && v4_tail {
            return write!(out, "{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
        }
        write!(out, "{word:x}")?;
    }
    if run.is_some_and(|r| r.end == words.len()) {
        out.write_char(':')?;
    }
    Ok(())
}

/// Room for the longest form (16 decimal bytes and 15 colons: 63 characters).
struct Buf {
    bytes: [u8; 64],
    len: usize,
}

impl Buf {
    fn new() -> Self {
        Self {
            bytes: [0; 64],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only `write_str` fills it, with whole strings.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(hex: &str) -> Gid {
        Gid::from_wire_hex(hex).unwrap()
    }

    /// The expected strings are what glibc's `inet_ntop` returns for the same bytes (through
    /// Python's `socket.inet_ntop`, which calls it).
    #[test]
    fn inet6_is_glibcs() {
        let cases = [
            ("00000000000000000000000000000000", "::"),
            ("00000000000000000000000000000001", "::1"),
            ("00000000000000000000ffff0a000001", "::ffff:10.0.0.1"),
            ("00000000000000000000000001020304", "::1.2.3.4"),
            (
                "fe800000000000000202c9fffe0a0b0c",
                "fe80::202:c9ff:fe0a:b0c",
            ),
            ("20010db8000000010000000000000001", "2001:db8:0:1::1"),
            ("20010db8000000000001000000000001", "2001:db8::1:0:0:1"),
            ("00010000000000000000000000000000", "1::"),
            ("00000000000000000000ffff00000000", "::ffff:0.0.0.0"),
            ("0000000000000000000000000000ffff", "::ffff"),
            ("00000000000000000001000000000000", "::1:0:0:0"),
            ("000000000000000000000000000a0001", "::0.10.0.1"),
            ("fe80000000000000000000000000abcd", "fe80::abcd"),
            ("00000000000000000000fffe0a000001", "::fffe:a00:1"),
            (
                "11112222333344445555666677778888",
                "1111:2222:3333:4444:5555:6666:7777:8888",
            ),
            ("00010000000100000000000100010000", "1:0:1::1:1:0"),
            ("00010000000200000003000000040000", "1:0:2:0:3:0:4:0"),
        ];
        for (hex, want) in cases {
            let g = gid(hex);
            assert_eq!(g.inet6().to_string(), want, "bytes {hex}");
            assert_eq!(g.to_string(), want, "Display of {hex}");
            assert_eq!(want.parse::<Gid>(), Ok(g), "{want} read back");
        }
    }

    #[test]
    fn the_other_forms() {
        let g = gid("fe800000000000000202c9fffe0a0b0c");
        assert_eq!(
            g.hex_groups().to_string(),
            "fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c"
        );
        assert_eq!(g.wire_hex().to_string(), "fe800000000000000202c9fffe0a0b0c");
        assert_eq!(
            g.decimal_bytes().to_string(),
            "254:128:00:00:00:00:00:00:02:02:201:255:254:10:11:12"
        );
        let widest = Gid([255; 16]).decimal_bytes().to_string();
        assert_eq!(widest.len(), 63);
        assert_eq!(
            format!("{g:?}"),
            "Gid(fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c)"
        );
        assert_eq!(format!("[{:>10}]", Gid::ZERO), "[        ::]");
        assert_eq!(format!("[{:<6}]", Gid::ZERO.inet6()), "[::    ]");
    }

    #[test]
    fn text_is_read_back() {
        let g = gid("fe800000000000000202c9fffe0a0b0c");
        assert_eq!("FE800000000000000202C9FFFE0A0B0C".parse::<Gid>(), Ok(g));
        assert_eq!(g.hex_groups().to_string().parse::<Gid>(), Ok(g));
        assert_eq!(
            "10.0.0.1".parse::<Gid>(),
            Ok(gid("00000000000000000000ffff0a000001"))
        );
        assert_eq!(
            Gid::from_wire_hex("abcd"),
            Err(GidParseError::WireLength(4))
        );
        let z = "0000000000000000000000000000000z";
        assert_eq!(Gid::from_wire_hex(z), Err(GidParseError::WireNotHex));
        assert_eq!(z.parse::<Gid>(), Err(GidParseError::WireNotHex));
        // 32 bytes that are not 32 characters must not panic.
        let wide = "0ééééééééééééééé0";
        assert_eq!(wide.len(), 32);
        assert_eq!(Gid::from_wire_hex(wide), Err(GidParseError::WireNotHex));
        assert_eq!(
            Gid::from_wire_hex("+0000000000000000000000000000000"),
            Err(GidParseError::WireNotHex)
        );
        for bad in ["", "::g", "1.2.3", "fe80::1::2", "0000"] {
            assert_eq!(
                bad.parse::<Gid>(),
                Err(GidParseError::Unrecognized),
                "{bad:?}"
            );
        }
    }

    /// Every GID of a spread of shapes survives the IPv6 and the wire form.
    #[test]
    fn forms_round_trip() {
        let mut x = 0x0123_4567_89ab_cdefu64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Zero some words so that runs of every length and place occur.
            let mut g = [0u8; 16];
            for (i, w) in g.chunks_exact_mut(2).enumerate() {
                if x >> (i + 8) & 1 == 1 {
                    w.copy_from_slice(&((x >> (4 * i)) as u16).to_be_bytes());
                }
            }
            let g = Gid(g);
            assert_eq!(g.to_string().parse::<Gid>(), Ok(g), "{g:?}");
            assert_eq!(Gid::from_wire_hex(&g.wire_hex().to_string()), Ok(g));
            assert_eq!(g.hex_groups().to_string().parse::<Gid>(), Ok(g));
        }
    }
}

//! Text forms of a 128-bit GID, as the different tools print it.
//!
//! * [`gid_inet6`]: IPv6 text as glibc's `inet_ntop(AF_INET6, …)` renders it (used by
//!   `ibv_rc_pingpong` for every GID and by `ibv_devinfo` for RoCE v2 GIDs).
//! * [`gid_hex_groups`]: eight 4-digit hex groups (`ibv_devinfo` for IB and RoCE v1 GIDs).
//! * [`gid_wire`]: 32 hex digits, no separators (the `ibv_rc_pingpong` TCP exchange).
//! * [`gid_decimal_bytes`]: 16 colon-separated decimal bytes (perftest's ` GID:` line).
//!
//! All of them read the GID as its 16 bytes in network (wire) order.

use std::fmt::Write as _;

/// A GID as its 16 bytes in network order (the layout of `union ibv_gid`).
pub(crate) type Gid = [u8; 16];

/// Renders `gid` as IPv6 text exactly like glibc's `inet_ntop(AF_INET6, …)`.
///
/// Rules (they differ from Rust's `Ipv6Addr` display in a few corners, hence our own code):
/// the 16-bit groups print as lowercase hex without leading zeros; the first longest run of at
/// least two zero groups becomes `::`; and when that run starts at group 0 and is either six
/// groups long, or five groups long followed by `ffff`, the last four bytes print as a dotted
/// IPv4 address (`::1.2.3.4`, `::ffff:10.0.0.1`).
pub(crate) fn gid_inet6(gid: &Gid) -> String {
    let words: [u16; 8] = std::array::from_fn(|i| u16::from_be_bytes([gid[2 * i], gid[2 * i + 1]]));

    // Find the first longest run of zero words (start, length).
    let mut best: Option<(usize, usize)> = None;
    let mut run: Option<(usize, usize)> = None;
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            run = Some(run.map_or((i, 1), |(start, len)| (start, len + 1)));
        } else if let Some(r) = run.take() {
            if best.is_none_or(|b| r.1 > b.1) {
                best = Some(r);
            }
        }
    }
    if let Some(r) = run {
        if best.is_none_or(|b| r.1 > b.1) {
            best = Some(r);
        }
    }
    let best = best.filter(|&(_, len)| len >= 2);

    let mut out = String::with_capacity(46);
    let mut i = 0;
    while i < 8 {
        if let Some((start, len)) = best {
            if i == start {
                out.push(':');
                i += len;
                continue;
            }
        }
        if i != 0 {
            out.push(':');
        }
        let embeds_v4 = i == 6
            && match best {
                Some((0, 6)) => true,
                Some((0, 5)) => words[5] == 0xffff,
                _ => false,
            };
        if embeds_v4 {
            let _ = write!(out, "{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
            return out;
        }
        let _ = write!(out, "{:x}", words[i]);
        i += 1;
    }
    if let Some((start, len)) = best {
        if start + len == 8 {
            out.push(':');
        }
    }
    out
}

/// Renders `gid` as eight colon-separated groups of four lowercase hex digits
/// (`fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c`).
pub(crate) fn gid_hex_groups(gid: &Gid) -> String {
    let mut out = String::with_capacity(39);
    for (i, pair) in gid.chunks_exact(2).enumerate() {
        if i != 0 {
            out.push(':');
        }
        let _ = write!(out, "{:02x}{:02x}", pair[0], pair[1]);
    }
    out
}

/// Renders `gid` as 32 lowercase hex digits, bytes in order (the `ibv_rc_pingpong` wire form).
pub(crate) fn gid_wire(gid: &Gid) -> String {
    let mut out = String::with_capacity(32);
    for b in gid {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Renders `gid` as 16 colon-separated decimal bytes, each zero-padded to at least two digits
/// (perftest's `%02d` style: `254:128:00:00:…`).
pub(crate) fn gid_decimal_bytes(gid: &Gid) -> String {
    let mut out = String::with_capacity(63);
    for (i, b) in gid.iter().enumerate() {
        if i != 0 {
            out.push(':');
        }
        let _ = write!(out, "{b:02}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(hex: &str) -> Gid {
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        g
    }

    /// Expected strings were produced by glibc's `inet_ntop` (through Python's
    /// `socket.inet_ntop`, which calls it) for the same bytes.
    #[test]
    fn inet6_matches_glibc() {
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
        ];
        for (hex, want) in cases {
            assert_eq!(gid_inet6(&gid(hex)), want, "bytes {hex}");
        }
    }

    #[test]
    fn other_renderings() {
        let g = gid("fe800000000000000202c9fffe0a0b0c");
        assert_eq!(
            gid_hex_groups(&g),
            "fe80:0000:0000:0000:0202:c9ff:fe0a:0b0c"
        );
        assert_eq!(gid_wire(&g), "fe800000000000000202c9fffe0a0b0c");
        assert_eq!(
            gid_decimal_bytes(&g),
            "254:128:00:00:00:00:00:00:02:02:201:255:254:10:11:12"
        );
    }
}

//! RoCEv2 through a kernel UDP socket: the datagram (BTH … payload, pad, ICRC) without the IP
//! and UDP headers, which the kernel builds on send and strips on receive (udp(7)).
//!
//! The ICRC still covers those headers, so both directions rebuild them:
//! * **sending** ([`seal_datagram`]): the header the kernel will build for an *unconnected*
//!   socket with `IP_PMTUDISC_DO` set is fully predictable — IPv4 identification 0, DF set,
//!   TTL/TOS/checksums masked anyway — so the ICRC is computed for it in advance;
//! * **receiving** ([`open_datagram`]): a UDP socket does not show an IPv4 packet's
//!   identification and flags, and Linux rxe picks a pseudo-random identification. The CRC is
//!   linear, so the unknown 16 identification bits and the DF bit are *solved for*: the
//!   difference between the ICRC found and the one computed for identification 0 with DF set
//!   must be a combination of those 17 bits' contributions (see [`gf2`]). A datagram whose
//!   difference is not such a combination is corrupt. This leaves 15 of the ICRC's 32 bits of
//!   protection for IPv4 datagrams from a peer that does not send identification 0 (a
//!   corruption passes with probability 2^-15 instead of 2^-32); datagrams with
//!   identification 0 (Portverbs' own) and IPv6 datagrams (every covered field is known) keep
//!   all 32.

use std::net::{IpAddr, SocketAddr};

use super::frame::{FrameOptions, IpHeader, udp_header};
use super::{Bth, ICRC_LEN, UDP_HEADER_LEN, WireError, icrc};

/// A received RoCEv2 datagram whose ICRC checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// Sender's address.
    pub src: IpAddr,
    /// Our address.
    pub dst: IpAddr,
    /// Sender's UDP port (flow entropy; receivers do not answer to it).
    pub udp_sport: u16,
    /// The IB transport packet: BTH, extension headers, payload and pad (no ICRC).
    pub ib: &'a [u8],
    /// IPv4: the identification the sender used, as the ICRC check recovered it.
    pub ipv4_id: Option<u16>,
    /// IPv4: whether the sender set DF, as the ICRC check recovered it.
    pub ipv4_df: bool,
}

/// Appends the ICRC to `ib` (BTH, extension headers, payload and pad), computed for the IP and
/// UDP headers a Linux kernel builds when an unconnected UDP socket bound to `src` with
/// `IP_PMTUDISC_DO` sends it to `dst` (IPv4 identification 0, DF set).
///
/// # Errors
/// A datagram too long for an IP packet, addresses of different families, or fewer bytes
/// than a BTH.
pub fn seal_datagram(src: SocketAddr, dst: SocketAddr, ib: &mut Vec<u8>) -> Result<(), WireError> {
    let crc = datagram_icrc(src, dst, ib)?;
    ib.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The ICRC [`seal_datagram`] appends: for `ib` (BTH … pad) sent from `src` to `dst` by an
/// unconnected socket with DF set.
///
/// # Errors
/// As [`seal_datagram`].
pub fn datagram_icrc(src: SocketAddr, dst: SocketAddr, ib: &[u8]) -> Result<u32, WireError> {
    Bth::parse(ib)?;
    icrc_with(src, dst, ib, FrameOptions::default())
}

/// The ICRC of a datagram of one length when the kernel gives its IPv4 packet an
/// identification other than 0.
///
/// A UDP GSO send (`UDP_SEGMENT`) is one IPv4 header that the kernel copies into every
/// segment, numbering the copies: segment `k` of a message sent with identification 0 leaves
/// with identification `k`. Its ICRC must cover that number, so [`seal_datagram`]'s value
/// (identification 0) is corrected for it; the CRC is linear, so the correction depends only
/// on the identification and the datagram's length, and costs one GF(2) product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdShift {
    /// x^(8·n) mod P, n the number of covered bytes after the identification.
    factor: u32,
}

impl Ipv4IdShift {
    /// For datagrams of `len` bytes (BTH … pad and the ICRC, without IP and UDP headers).
    pub fn new(len: usize) -> Self {
        // After the 2 identification bytes: the rest of the IPv4 header (bytes 6 to 19), the
        // UDP header and the IB packet without its ICRC.
        let after = 14 + UDP_HEADER_LEN + len.saturating_sub(ICRC_LEN);
        Self {
            factor: gf2::advance(gf2::ONE, after),
        }
    }

    /// The ICRC for identification `id`, from `icrc0`, the ICRC for identification 0.
    pub fn icrc(&self, icrc0: u32, id: u16) -> u32 {
        icrc0 ^ gf2::mul(gf2::raw_crc(&id.to_be_bytes()), self.factor)
    }
}

/// The whole frame (IP and UDP headers, then `datagram` with its ICRC) that carried
/// `datagram` from `src` to `dst`, for packet captures: the IP fields of `opts` (traffic
/// class, hop limit, IPv4 identification, IPv6 flow label) and, for IPv4, the DF flag given.
///
/// # Errors
/// As [`seal_datagram`].
pub fn datagram_frame(
    src: SocketAddr,
    dst: SocketAddr,
    opts: &FrameOptions,
    ipv4_df: bool,
    datagram: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let udp_len = UDP_HEADER_LEN + datagram.len();
    let mut ip = IpHeader::new(opts, src.ip(), dst.ip(), udp_len)?;
    if let IpHeader::V4(h) = &mut ip {
        if !ipv4_df {
            if let Some(b) = h.get_mut(6) {
                *b &= !0x40;
            }
            let sum = super::ipv4_header_checksum(h).to_be_bytes();
            h[10..12].copy_from_slice(&sum);
        }
    }
    let udp = udp_header(src.port(), dst.port(), udp_len)?;
    out.clear();
    out.extend_from_slice(ip.as_bytes());
    out.extend_from_slice(&udp);
    out.extend_from_slice(datagram);
    Ok(())
}

fn icrc_with(
    src: SocketAddr,
    dst: SocketAddr,
    ib: &[u8],
    opts: FrameOptions,
) -> Result<u32, WireError> {
    let udp_len = UDP_HEADER_LEN + ib.len() + ICRC_LEN;
    let ip = IpHeader::new(&opts, src.ip(), dst.ip(), udp_len)?;
    let udp = udp_header(src.port(), dst.port(), udp_len)?;
    Ok(icrc(ip.as_bytes(), &udp, &[ib]))
}

/// Checks a datagram that arrived on our socket `dst` from `src` and splits off its ICRC.
///
/// # Errors
/// [`WireError::Truncated`] below a BTH and an ICRC; [`WireError::BadIcrc`] when the ICRC
/// does not match (for IPv4: for any identification and DF flag, see the module docs);
/// [`WireError::BadIpHeader`] for mixed address families.
pub fn open_datagram(
    src: SocketAddr,
    dst: SocketAddr,
    datagram: &[u8],
) -> Result<Datagram<'_>, WireError> {
    let min = Bth::LEN + ICRC_LEN;
    let split = datagram
        .len()
        .checked_sub(ICRC_LEN)
        .filter(|_| datagram.len() >= min)
        .ok_or(WireError::Truncated {
            need: min,
            have: datagram.len(),
        })?;
    let (ib, tail) = datagram.split_at(split);
    let found = <[u8; ICRC_LEN]>::try_from(tail)
        .map(u32::from_le_bytes)
        .map_err(|_| WireError::Truncated {
            need: min,
            have: datagram.len(),
        })?;
    let computed = icrc_with(src, dst, ib, FrameOptions::default())?;
    let (ipv4_id, ipv4_df) = match src.ip() {
        IpAddr::V6(_) if computed == found => (None, false),
        IpAddr::V4(_) if computed == found => (Some(0), true),
        IpAddr::V4(_) => {
            // Bytes covered after the identification and the flags byte: the rest of the IPv4
            // header (its bytes 7 to 19), UDP, and the IB packet.
            let after = 13 + UDP_HEADER_LEN + ib.len();
            let (id, df) = gf2::solve_id_df(computed ^ found, after)
                .ok_or(WireError::BadIcrc { computed, found })?;
            (Some(id), df)
        }
        IpAddr::V6(_) => return Err(WireError::BadIcrc { computed, found }),
    };
    Ok(Datagram {
        src: src.ip(),
        dst: dst.ip(),
        udp_sport: src.port(),
        ib,
        ipv4_id,
        ipv4_df,
    })
}

/// Arithmetic on CRC-32 values as polynomials over GF(2), in the reflected form the CRC
/// register uses (bit 31 is the coefficient of x^0, bit 0 that of x^31).
///
/// The CRC is affine in its input: for two messages of the same length the CRCs differ by
/// the CRC (zero start, no final inversion) of their XOR. A difference confined to a few bytes
/// `k` bytes before the end is the CRC of those bytes, multiplied by x^(8k). So the ICRC
/// difference caused by an IPv4 identification `id` and DF flag is
/// `(Σ id bits · c_bit) · x^(8k)`, with `c_bit` the CRC of a 3-byte string with that one bit
/// set. [`gf2::solve_id_df`] undoes the multiplication and reads the bits off.
pub mod gf2 {
    /// The CRC-32 polynomial, reflected.
    const POLY: u32 = 0xEDB8_8320;
    /// x^0.
    pub const ONE: u32 = 0x8000_0000;

    /// `a · x mod P`.
    fn times_x(a: u32) -> u32 {
        if a & 1 == 1 { (a >> 1) ^ POLY } else { a >> 1 }
    }

    /// `a · x^-1 mod P` (P has a constant term, so x is invertible): the step that undoes
    /// [`times_x`].
    fn times_x_inv(a: u32) -> u32 {
        if a & ONE != 0 {
            ((a ^ POLY) << 1) | 1
        } else {
            a << 1
        }
    }

    /// `a · b mod P`.
    pub fn mul(a: u32, mut b: u32) -> u32 {
        let mut product = 0;
        let mut bit = ONE;
        while bit != 0 {
            if a & bit != 0 {
                product ^= b;
            }
            b = times_x(b);
            bit >>= 1;
        }
        product
    }

    /// `base^n mod P`.
    fn pow(mut base: u32, mut n: u64) -> u32 {
        let mut acc = ONE;
        while n != 0 {
            if n & 1 == 1 {
                acc = mul(acc, base);
            }
            base = mul(base, base);
            n >>= 1;
        }
        acc
    }

    /// The CRC register after `n` more zero bytes: `r · x^(8n) mod P`.
    pub fn advance(r: u32, n: usize) -> u32 {
        mul(r, pow(times_x(ONE), 8 * n as u64))
    }

    /// Undoes [`advance`]: `r · x^(-8n) mod P`, from a table of `x^(-8·2^i)` made once (one
    /// multiplication per set bit of `n`: it runs for every IPv4 datagram received).
    pub fn retreat(r: u32, n: usize) -> u32 {
        let t = tables();
        let mut acc = r;
        let mut n = n as u64;
        let mut i = 0;
        while n != 0 {
            if n & 1 == 1 {
                acc = mul(acc, t.back[i]);
            }
            n >>= 1;
            i += 1;
        }
        acc
    }

    /// What [`retreat`] and [`solve_id_df`] need on every call, made on first use: the powers
    /// `x^(-8·2^i)`, and the reduced basis of the identification's and DF flag's contributions
    /// (the same for every datagram).
    struct Tables {
        back: [u32; 64],
        basis: [Option<(u32, u32)>; 32],
    }

    fn tables() -> &'static Tables {
        static TABLES: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
        TABLES.get_or_init(|| {
            let mut back = [ONE; 64];
            let mut p = pow(times_x_inv(ONE), 8);
            for b in &mut back {
                *b = p;
                p = mul(p, p);
            }
            Tables {
                back,
                basis: basis(),
            }
        })
    }

    /// The raw CRC (zero start, no final inversion) of `bytes`: each bit fed multiplies the
    /// register by x.
    pub fn raw_crc(bytes: &[u8]) -> u32 {
        let mut r = 0u32;
        for b in bytes {
            r ^= u32::from(*b);
            for _ in 0..8 {
                r = times_x(r);
            }
        }
        r
    }

    /// The 17 unknowns of an IPv4 header seen through a UDP socket, as 3-byte strings
    /// (identification high, identification low, flags): identification bit `i` for
    /// `i < 16`, DF for 16.
    fn unknown(i: u32) -> [u8; 3] {
        if i < 16 {
            let id = (1u16 << i).to_be_bytes();
            [id[0], id[1], 0]
        } else {
            [0, 0, 0x40]
        }
    }

    /// Gaussian elimination over the 17 contributions: `basis[b]` holds a vector whose highest
    /// set bit is `b`, with the unknowns it combines.
    fn basis() -> [Option<(u32, u32)>; 32] {
        let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
        for i in 0..17u32 {
            let mut v = (raw_crc(&unknown(i)), 1u32 << i);
            while v.0 != 0 {
                let top = 31 - v.0.leading_zeros() as usize;
                match basis.get(top).copied().flatten() {
                    Some(b) => v = (v.0 ^ b.0, v.1 ^ b.1),
                    None => {
                        if let Some(slot) = basis.get_mut(top) {
                            *slot = Some(v);
                        }
                        break;
                    }
                }
            }
        }
        basis
    }

    /// Solves `diff = (Σ bits · c_bit) · x^(8 after)` for the IPv4 identification and the DF
    /// flag's change, where `diff` is the ICRC found XOR the ICRC computed for identification 0
    /// with DF set, and `after` the number of covered bytes after the flags byte. Returns the
    /// identification and whether DF was set, or `None` when no identification and flag
    /// explain the difference (the datagram is corrupt).
    pub fn solve_id_df(diff: u32, after: usize) -> Option<(u16, bool)> {
        let target = retreat(diff, after);
        let basis = &tables().basis;
        let mut rest = (target, 0u32);
        while rest.0 != 0 {
            let top = 31 - rest.0.leading_zeros() as usize;
            let b = basis.get(top).copied().flatten()?;
            rest = (rest.0 ^ b.0, rest.1 ^ b.1);
        }
        let id = (rest.1 & 0xFFFF) as u16;
        // The bit says DF *changed* from the assumed "set".
        let df = rest.1 & (1 << 16) == 0;
        Some((id, df))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::field;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// An RC SEND_ONLY with AckReq carrying "hello" (hand-built, as in `tests/frame.rs`).
    fn hello() -> Vec<u8> {
        let mut ib = vec![
            0x04, 0xb0, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56,
        ];
        ib.extend_from_slice(b"hello\0\0\0");
        ib
    }

    #[test]
    fn the_register_arithmetic_matches_bytewise_crc() {
        for n in [0usize, 1, 3, 64, 4133] {
            let r = 0x1234_5678u32;
            let mut stepped = r;
            for _ in 0..n {
                for _ in 0..8 {
                    stepped = gf2::mul(stepped, 0x4000_0000);
                }
            }
            assert_eq!(gf2::advance(r, n), stepped, "n = {n}");
            assert_eq!(gf2::retreat(gf2::advance(r, n), n), r);
        }
        let a = crc32fast::hash(&[1, 2, 3, 0, 0]) ^ crc32fast::hash(&[0, 0, 0, 0, 0]);
        assert_eq!(a, gf2::advance(gf2::raw_crc(&[1, 2, 3]), 2));
    }

    #[test]
    fn the_facts_worked_example_seals_to_the_known_icrc() {
        let mut ib = hello();
        seal_datagram(sa("192.168.1.1:49152"), sa("192.168.1.2:4791"), &mut ib).unwrap();
        // That frame has identification 0x1234; ours has 0, so compare against a frame
        // built the same way.
        let mut frame = Vec::new();
        crate::build_frame(
            "192.168.1.1".parse().unwrap(),
            "192.168.1.2".parse().unwrap(),
            49152,
            &ib[..12],
            b"hello",
            &mut frame,
        )
        .unwrap();
        assert_eq!(&frame[28..], &ib[..]);
    }

    /// Segment `k` of a GSO send leaves with identification `k`: its shifted ICRC checks in
    /// the whole frame the kernel builds, for short and long datagrams.
    #[test]
    fn the_identification_shift_seals_gso_segments() {
        let (src, dst) = (sa("10.77.0.1:49458"), sa("10.77.0.2:4791"));
        for payload in [0usize, 5, 1024, 4096] {
            let mut ib = hello();
            ib.resize(12 + payload, 0x7b);
            let len = ib.len() + ICRC_LEN;
            let icrc0 = datagram_icrc(src, dst, &ib).unwrap();
            let shift = Ipv4IdShift::new(len);
            assert_eq!(shift.icrc(icrc0, 0), icrc0);
            for id in [1u16, 2, 63, 0x8000, 0xffff] {
                let mut datagram = ib.clone();
                datagram.extend_from_slice(&shift.icrc(icrc0, id).to_le_bytes());
                let opts = FrameOptions {
                    ipv4_id: id,
                    ..FrameOptions::default()
                };
                let mut frame = Vec::new();
                datagram_frame(src, dst, &opts, true, &datagram, &mut frame).unwrap();
                let view = crate::parse_frame(&frame).unwrap();
                assert!(view.icrc_ok, "payload {payload}, id {id}");
                let opened = open_datagram(src, dst, &datagram).unwrap();
                assert_eq!((opened.ipv4_id, opened.ipv4_df), (Some(id), true));
            }
        }
    }

    /// A frame as another stack would send it (any identification, DF or not), seen through a
    /// UDP socket.
    fn received(id: u16, df: bool) -> (Vec<u8>, SocketAddr, SocketAddr) {
        let mut frame = Vec::new();
        let opts = FrameOptions {
            ipv4_id: id,
            traffic_class: 0x2e,
            hop_limit: 3,
            ..FrameOptions::default()
        };
        let ib = hello();
        crate::build_frame_with(
            &opts,
            "10.77.0.2".parse().unwrap(),
            "10.77.0.1".parse().unwrap(),
            0xc8e3,
            &ib[..12],
            b"hello",
            &mut frame,
        )
        .unwrap();
        if !df {
            frame[field::V4_FLAGS_FRAG.start] &= !0x40;
        }
        // Re-seal the ICRC for the changed flags, as the sender would have.
        let end = frame.len() - 4;
        let crc = icrc(&frame[..20], &frame[20..28], &[&frame[28..end]]);
        frame[end..].copy_from_slice(&crc.to_le_bytes());
        (
            frame[28..].to_vec(),
            sa("10.77.0.2:51427"),
            sa("10.77.0.1:4791"),
        )
    }

    #[test]
    fn any_ipv4_identification_is_recovered_and_corruption_is_caught() {
        for (id, df) in [
            (0, true),
            (1, true),
            (0x9f50, true),
            (0xffff, false),
            (7, false),
        ] {
            let (d, src, dst) = received(id, df);
            let got = open_datagram(src, dst, &d).unwrap();
            assert_eq!((got.ipv4_id, got.ipv4_df), (Some(id), df));
            let mut frame = Vec::new();
            let opts = FrameOptions {
                ipv4_id: id,
                ..FrameOptions::default()
            };
            datagram_frame(src, dst, &opts, df, &d, &mut frame).unwrap();
            let view = crate::parse_frame(&frame).unwrap();
            assert!(view.icrc_ok, "the rebuilt frame carries a valid ICRC");
            assert_eq!(got.ib, &hello()[..]);
            for bit in [0usize, 13, 100, d.len() * 8 - 1] {
                let mut bad = d.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                if bit / 8 == 4 {
                    continue; // BTH byte 4 is masked
                }
                assert!(
                    matches!(
                        open_datagram(src, dst, &bad),
                        Err(WireError::BadIcrc { .. })
                    ),
                    "id {id:#x} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn ipv6_datagrams_check_all_32_bits() {
        let (src, dst) = (sa("[fd00::1]:49153"), sa("[fd00::2]:4791"));
        let mut d = hello();
        seal_datagram(src, dst, &mut d).unwrap();
        assert_eq!(open_datagram(src, dst, &d).unwrap().ipv4_id, None);
        let mut bad = d.clone();
        bad[15] ^= 0x10;
        assert!(matches!(
            open_datagram(src, dst, &bad),
            Err(WireError::BadIcrc { .. })
        ));
        assert!(matches!(
            open_datagram(src, dst, &d[..10]),
            Err(WireError::Truncated { .. })
        ));
    }
}

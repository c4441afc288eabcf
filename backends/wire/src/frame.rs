//! RoCEv2 framing: IPv4/IPv6 + UDP (port 4791) + IB transport packet + ICRC (IBTA Annex A17).
//!
//! A frame here starts at the IP header (no Ethernet). [`build_frame`] produces the frames
//! the simulated fabric carries; the receive side lives in `frame_parse.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bytes::{write_bytes, write_u8, write_u16, write_u32};
use super::{Bth, WireError, icrc, pad_len};

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// IPv4 header length without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// ICRC length.
pub const ICRC_LEN: usize = 4;

pub(crate) const IP_PROTO_UDP: u8 = 17;
const IPV4_DONT_FRAGMENT: u16 = 0x4000;
pub(crate) const IPV4_FRAG_MASK: u16 = 0x3FFF; // MF flag + fragment offset

/// Byte offsets in the IP and UDP headers.
pub(crate) mod field {
    use core::ops::Range;

    pub(crate) const V4_TOS: usize = 1;
    pub(crate) const V4_TOTAL_LEN: Range<usize> = 2..4;
    pub(crate) const V4_ID: Range<usize> = 4..6;
    pub(crate) const V4_FLAGS_FRAG: Range<usize> = 6..8;
    pub(crate) const V4_TTL: usize = 8;
    pub(crate) const V4_PROTO: usize = 9;
    pub(crate) const V4_CHECKSUM: Range<usize> = 10..12;
    pub(crate) const V4_SRC: Range<usize> = 12..16;
    pub(crate) const V4_DST: Range<usize> = 16..20;

    pub(crate) const V6_VTC_FLOW: Range<usize> = 0..4;
    pub(crate) const V6_PAYLOAD_LEN: Range<usize> = 4..6;
    pub(crate) const V6_NEXT_HDR: usize = 6;
    pub(crate) const V6_HOP_LIMIT: usize = 7;
    pub(crate) const V6_SRC: Range<usize> = 8..24;
    pub(crate) const V6_DST: Range<usize> = 24..40;

    pub(crate) const UDP_SPORT: Range<usize> = 0..2;
    pub(crate) const UDP_DPORT: Range<usize> = 2..4;
    pub(crate) const UDP_LEN: Range<usize> = 4..6;
}

/// Outer-header choices for [`build_frame_with`]; [`Default`] gives what [`build_frame`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameOptions {
    /// IPv4 TOS / IPv6 traffic class (DSCP + ECN). Default 0.
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit. Default 64.
    pub hop_limit: u8,
    /// IPv4 identification (covered by the ICRC). Default 0, as Linux sends with DF set.
    pub ipv4_id: u16,
    /// IPv6 flow label (20 bits). Default 0.
    pub flow_label: u32,
}

impl Default for FrameOptions {
    fn default() -> Self {
        Self {
            traffic_class: 0,
            hop_limit: 64,
            ipv4_id: 0,
            flow_label: 0,
        }
    }
}

/// The IPv4 header checksum (one's complement of the one's complement sum of the 16-bit
/// words) of `header`, computed with its checksum field taken as zero.
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for (i, word) in header.chunks(2).enumerate() {
        if i == 5 {
            continue; // the checksum field itself
        }
        let hi = word.first().copied().unwrap_or(0);
        let lo = word.get(1).copied().unwrap_or(0);
        // Fold the carry at every step so the sum never exceeds 17 bits.
        sum += u32::from(u16::from_be_bytes([hi, lo]));
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    // The folding above leaves at most 16 bits.
    !(sum as u16)
}

fn ipv4_header(
    opts: &FrameOptions,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_len: usize,
) -> Result<[u8; IPV4_HEADER_LEN], WireError> {
    let total = u16::try_from(IPV4_HEADER_LEN + udp_len)
        .map_err(|_| WireError::BadIpHeader("packet too long for an IPv4 total length"))?;
    let mut h = [0u8; IPV4_HEADER_LEN];
    write_u8(&mut h, 0, 0x45)?;
    write_u8(&mut h, field::V4_TOS, opts.traffic_class)?;
    write_u16(&mut h, field::V4_TOTAL_LEN, total)?;
    write_u16(&mut h, field::V4_ID, opts.ipv4_id)?;
    write_u16(&mut h, field::V4_FLAGS_FRAG, IPV4_DONT_FRAGMENT)?;
    write_u8(&mut h, field::V4_TTL, opts.hop_limit)?;
    write_u8(&mut h, field::V4_PROTO, IP_PROTO_UDP)?;
    write_bytes(&mut h, field::V4_SRC.start, &src.octets())?;
    write_bytes(&mut h, field::V4_DST.start, &dst.octets())?;
    let sum = ipv4_header_checksum(&h);
    write_u16(&mut h, field::V4_CHECKSUM, sum)?;
    Ok(h)
}

fn ipv6_header(
    opts: &FrameOptions,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_len: usize,
) -> Result<[u8; IPV6_HEADER_LEN], WireError> {
    let payload_len = u16::try_from(udp_len)
        .map_err(|_| WireError::BadIpHeader("packet too long for an IPv6 payload length"))?;
    let mut h = [0u8; IPV6_HEADER_LEN];
    let vtc_flow = (6u32 << 28)
        | (u32::from(opts.traffic_class) << 20)
        | (opts.flow_label & super::FLOW_LABEL_MASK);
    write_u32(&mut h, field::V6_VTC_FLOW, vtc_flow)?;
    write_u16(&mut h, field::V6_PAYLOAD_LEN, payload_len)?;
    write_u8(&mut h, field::V6_NEXT_HDR, IP_PROTO_UDP)?;
    write_u8(&mut h, field::V6_HOP_LIMIT, opts.hop_limit)?;
    write_bytes(&mut h, field::V6_SRC.start, &src.octets())?;
    write_bytes(&mut h, field::V6_DST.start, &dst.octets())?;
    Ok(h)
}

/// An IPv4 or IPv6 header, built on the stack.
pub(crate) enum IpHeader {
    V4([u8; IPV4_HEADER_LEN]),
    V6([u8; IPV6_HEADER_LEN]),
}

impl IpHeader {
    /// The header of a datagram of `udp_len` bytes (UDP header included) from `src` to `dst`.
    pub(crate) fn new(
        opts: &FrameOptions,
        src: IpAddr,
        dst: IpAddr,
        udp_len: usize,
    ) -> Result<Self, WireError> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ok(Self::V4(ipv4_header(opts, s, d, udp_len)?)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Ok(Self::V6(ipv6_header(opts, s, d, udp_len)?)),
            _ => Err(WireError::BadIpHeader(
                "source and destination addresses are of different IP families",
            )),
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::V4(h) => h,
            Self::V6(h) => h,
        }
    }
}

/// The UDP header of a RoCEv2 datagram of `udp_len` bytes (checksum left zero: the ICRC masks
/// it, and the kernel or the NIC fills it).
pub(crate) fn udp_header(
    sport: u16,
    dport: u16,
    udp_len: usize,
) -> Result<[u8; UDP_HEADER_LEN], WireError> {
    let udp_len16 = u16::try_from(udp_len)
        .map_err(|_| WireError::BadUdpHeader("packet too long for a UDP length"))?;
    let mut udp = [0u8; UDP_HEADER_LEN];
    write_u16(&mut udp, field::UDP_SPORT, sport)?;
    write_u16(&mut udp, field::UDP_DPORT, dport)?;
    write_u16(&mut udp, field::UDP_LEN, udp_len16)?;
    Ok(udp)
}

/// Builds a RoCEv2 frame with default outer headers (IPv4: ID 0, DF, TTL 64, TOS 0;
/// IPv6: hop limit 64, traffic class and flow label 0; UDP checksum 0). See
/// [`build_frame_with`].
pub fn build_frame(
    src: IpAddr,
    dst: IpAddr,
    udp_sport: u16,
    ib_headers: &[u8],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    build_frame_with(
        &FrameOptions::default(),
        src,
        dst,
        udp_sport,
        ib_headers,
        payload,
        out,
    )
}

/// Builds IP + UDP (destination port 4791, checksum 0) + `ib_headers` + `payload` + zero pad
/// to a multiple of 4 + ICRC (least-significant byte first) into `out`, which is cleared
/// first.
///
/// `ib_headers` must start with a BTH whose PadCnt equals the pad this payload needs
/// ([`WireError::BadPad`] otherwise, [`WireError::Truncated`] if there is no BTH). `src` and
/// `dst` must be of one IP family ([`WireError::BadIpHeader`] otherwise).
pub fn build_frame_with(
    opts: &FrameOptions,
    src: IpAddr,
    dst: IpAddr,
    udp_sport: u16,
    ib_headers: &[u8],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let bth = Bth::parse(ib_headers)?;
    let pad = pad_len(payload.len());
    if bth.pad_count != pad {
        return Err(WireError::BadPad {
            pad: bth.pad_count,
            payload: payload.len(),
        });
    }
    let pad_bytes = [0u8; 3].get(..usize::from(pad)).unwrap_or(&[]);
    let udp_len = UDP_HEADER_LEN + ib_headers.len() + payload.len() + pad_bytes.len() + ICRC_LEN;

    let ip = IpHeader::new(opts, src, dst, udp_len)?;
    let ip = ip.as_bytes();
    let udp = udp_header(udp_sport, ROCEV2_UDP_PORT, udp_len)?;
    let crc = icrc(ip, &udp, &[ib_headers, payload, pad_bytes]);
    out.clear();
    out.reserve(ip.len() + udp_len);
    out.extend_from_slice(ip);
    out.extend_from_slice(&udp);
    out.extend_from_slice(ib_headers);
    out.extend_from_slice(payload);
    out.extend_from_slice(pad_bytes);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

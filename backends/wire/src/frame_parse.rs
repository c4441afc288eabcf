//! Receiving RoCEv2 frames: [`parse_frame`] validates the IP and UDP headers, locates the
//! IB transport bytes and checks the ICRC, producing a [`FrameView`].
//!
//! The IPv4 header checksum is not verified: it is masked out of the ICRC, which covers every
//! other IPv4 field, and TTL/TOS rewrites on the way must not make a frame invalid.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bytes::{check_len, read_4, read_16, read_u8, read_u16, tail};
use super::frame::{IP_PROTO_UDP, IPV4_FRAG_MASK, field};
use super::{
    Bth, ICRC_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, ParsedPacket, ROCEV2_UDP_PORT, TransportHdr,
    UDP_HEADER_LEN, WireError, icrc,
};

/// A validated RoCEv2 frame, borrowing the transport bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameView<'a> {
    /// IP source address.
    pub src: IpAddr,
    /// IP destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub udp_sport: u16,
    /// IB transport bytes (BTH ... payload, pad) without the ICRC.
    pub ib: &'a [u8],
    /// ICRC value carried by the frame (decoded least-significant byte first).
    pub icrc: u32,
    /// Whether `icrc` equals the value computed over the frame.
    pub icrc_ok: bool,
    /// ICRC value computed over the received frame.
    pub icrc_computed: u32,
    /// IPv4 TOS / IPv6 traffic class (DSCP + ECN bits).
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits); 0 for IPv4.
    pub flow_label: u32,
}

impl<'a> FrameView<'a> {
    /// `Ok(())` when the ICRC matched, else [`WireError::BadIcrc`].
    pub fn check_icrc(&self) -> Result<(), WireError> {
        if self.icrc_ok {
            Ok(())
        } else {
            Err(WireError::BadIcrc {
                computed: self.icrc_computed,
                found: self.icrc,
            })
        }
    }

    /// Parses the transport bytes (see [`TransportHdr::parse`]); the ICRC is not consulted.
    pub fn transport(&self) -> Result<ParsedPacket<'a>, WireError> {
        TransportHdr::parse(self.ib)
    }
}

/// The parts of the IP header [`parse_frame`] needs.
struct IpInfo<'a> {
    header: &'a [u8],
    datagram: &'a [u8],
    src: IpAddr,
    dst: IpAddr,
    traffic_class: u8,
    hop_limit: u8,
    flow_label: u32,
}

fn parse_ipv4(frame: &[u8]) -> Result<IpInfo<'_>, WireError> {
    check_len(frame, IPV4_HEADER_LEN)?;
    let ihl = read_u8(frame, 0)? & 0x0F;
    if ihl < 5 {
        return Err(WireError::BadIpHeader("IPv4 header length below 20 bytes"));
    }
    if ihl > 5 {
        return Err(WireError::BadIpHeader("IPv4 options are not supported"));
    }
    let total = usize::from(read_u16(frame, field::V4_TOTAL_LEN)?);
    if total < IPV4_HEADER_LEN + UDP_HEADER_LEN {
        return Err(WireError::BadIpHeader(
            "IPv4 total length too small for UDP",
        ));
    }
    check_len(frame, total)?;
    if read_u16(frame, field::V4_FLAGS_FRAG)? & IPV4_FRAG_MASK != 0 {
        return Err(WireError::BadIpHeader("IPv4 fragments are not supported"));
    }
    if read_u8(frame, field::V4_PROTO)? != IP_PROTO_UDP {
        return Err(WireError::BadIpHeader("IP protocol is not UDP"));
    }
    Ok(IpInfo {
        header: frame.get(..IPV4_HEADER_LEN).unwrap_or(&[]),
        datagram: frame.get(IPV4_HEADER_LEN..total).unwrap_or(&[]),
        src: IpAddr::V4(Ipv4Addr::from(read_4(frame, field::V4_SRC)?)),
        dst: IpAddr::V4(Ipv4Addr::from(read_4(frame, field::V4_DST)?)),
        traffic_class: read_u8(frame, field::V4_TOS)?,
        hop_limit: read_u8(frame, field::V4_TTL)?,
        flow_label: 0,
    })
}

fn parse_ipv6(frame: &[u8]) -> Result<IpInfo<'_>, WireError> {
    check_len(frame, IPV6_HEADER_LEN)?;
    if read_u8(frame, field::V6_NEXT_HDR)? != IP_PROTO_UDP {
        return Err(WireError::BadIpHeader(
            "IPv6 next header is not UDP (extension headers are not supported)",
        ));
    }
    let total = IPV6_HEADER_LEN + usize::from(read_u16(frame, field::V6_PAYLOAD_LEN)?);
    check_len(frame, total)?;
    let vtc = read_u16(frame, 0..2)?;
    let flow = read_u16(frame, 2..4)?;
    Ok(IpInfo {
        header: frame.get(..IPV6_HEADER_LEN).unwrap_or(&[]),
        datagram: frame.get(IPV6_HEADER_LEN..total).unwrap_or(&[]),
        src: IpAddr::V6(Ipv6Addr::from(read_16(frame, field::V6_SRC)?)),
        dst: IpAddr::V6(Ipv6Addr::from(read_16(frame, field::V6_DST)?)),
        traffic_class: ((vtc >> 4) & 0xFF) as u8,
        hop_limit: read_u8(frame, field::V6_HOP_LIMIT)?,
        flow_label: (u32::from(vtc & 0x000F) << 16) | u32::from(flow),
    })
}

/// Validates an IP + UDP + IB frame and checks its ICRC.
///
/// Requirements: IP version 4 without options and not fragmented, or IPv6 with UDP as the
/// next header; IP protocol UDP; the IP length within the frame (bytes after it, such as
/// link-layer padding, are ignored); UDP length equal to the IP payload length; UDP
/// destination port 4791; room for a BTH and the ICRC. An ICRC mismatch is **not** an error:
/// it is reported through [`FrameView::icrc_ok`] (see [`FrameView::check_icrc`]).
pub fn parse_frame(frame: &[u8]) -> Result<FrameView<'_>, WireError> {
    let ip = match read_u8(frame, 0)? >> 4 {
        4 => parse_ipv4(frame)?,
        6 => parse_ipv6(frame)?,
        _ => return Err(WireError::BadIpHeader("IP version is neither 4 nor 6")),
    };
    let udp_and_ib = ip.datagram;
    if udp_and_ib.len() < UDP_HEADER_LEN {
        return Err(WireError::BadUdpHeader(
            "IP payload shorter than a UDP header",
        ));
    }
    if usize::from(read_u16(udp_and_ib, field::UDP_LEN)?) != udp_and_ib.len() {
        return Err(WireError::BadUdpHeader(
            "UDP length does not match the IP payload length",
        ));
    }
    if read_u16(udp_and_ib, field::UDP_DPORT)? != ROCEV2_UDP_PORT {
        return Err(WireError::BadUdpHeader(
            "destination port is not 4791 (RoCEv2)",
        ));
    }
    let udp_sport = read_u16(udp_and_ib, field::UDP_SPORT)?;
    let udp = udp_and_ib.get(..UDP_HEADER_LEN).unwrap_or(&[]);
    let ib_and_icrc = tail(udp_and_ib, UDP_HEADER_LEN);
    let min = Bth::LEN + ICRC_LEN;
    if ib_and_icrc.len() < min {
        let before = ip.header.len() + UDP_HEADER_LEN;
        return Err(WireError::Truncated {
            need: before + min,
            have: before + ib_and_icrc.len(),
        });
    }
    let split = ib_and_icrc.len() - ICRC_LEN;
    let (ib, icrc_bytes) = ib_and_icrc
        .split_at_checked(split)
        .ok_or(WireError::Truncated {
            need: min,
            have: ib_and_icrc.len(),
        })?;
    let found = <[u8; ICRC_LEN]>::try_from(icrc_bytes)
        .map(u32::from_le_bytes)
        .map_err(|_| WireError::Truncated {
            need: min,
            have: ib_and_icrc.len(),
        })?;
    let computed = icrc(ip.header, udp, &[ib]);
    Ok(FrameView {
        src: ip.src,
        dst: ip.dst,
        udp_sport,
        ib,
        icrc: found,
        icrc_ok: computed == found,
        icrc_computed: computed,
        traffic_class: ip.traffic_class,
        hop_limit: ip.hop_limit,
        flow_label: ip.flow_label,
    })
}

//! Winsock control messages as bytes: the layout `WSASendMsg` reads and `WSARecvMsg` writes
//! (`ws2def.h`: a `WSACMSGHDR` of `cmsg_len` (`SIZE_T`), `cmsg_level` and `cmsg_type` (`INT`),
//! the data after the header rounded up to pointer alignment, each message starting at the
//! next pointer-aligned offset). Plain byte parsing, no pointers: what the system wrote is
//! read only within the length it reported.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use windows_sys::Win32::Networking::WinSock::{
    IP_ECN, IP_HOPLIMIT, IP_PKTINFO, IP_TOS, IP_TTL, IPPROTO_IP, IPPROTO_IPV6, IPPROTO_UDP,
    IPV6_ECN, IPV6_HOPLIMIT, IPV6_PKTINFO, IPV6_TCLASS, UDP_COALESCED_INFO, UDP_SEND_MSG_SIZE,
};

use super::IpFields;

/// Bytes of a `WSACMSGHDR` on a 64-bit target (pointer-aligned size: 8 + 4 + 4).
const HDR: usize = 16;
/// The alignment of headers and data (`MAX_NATURAL_ALIGNMENT`).
const ALIGN: usize = 8;

const fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// `WSA_CMSG_SPACE(len)`: the room one message with `len` bytes of data takes.
pub(crate) const fn space(len: usize) -> usize {
    HDR + align(len)
}

/// A control buffer, aligned as the system expects it.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Control<const N: usize>(pub(crate) [u8; N]);

impl<const N: usize> Default for Control<N> {
    fn default() -> Self {
        Self([0; N])
    }
}

impl<const N: usize> std::fmt::Debug for Control<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Control<{N}>")
    }
}

/// Writes one message (`level`, `ty`, `data`) at the start of `out`; returns the bytes it
/// takes (its `WSA_CMSG_SPACE`), 0 when `out` is too small.
pub(crate) fn write(out: &mut [u8], level: i32, ty: i32, data: &[u8]) -> usize {
    let need = space(data.len());
    let Some(room) = out.get_mut(..need) else {
        return 0;
    };
    room.fill(0);
    room[..8].copy_from_slice(&((HDR + data.len()) as u64).to_le_bytes());
    room[8..12].copy_from_slice(&level.to_le_bytes());
    room[12..16].copy_from_slice(&ty.to_le_bytes());
    room[HDR..HDR + data.len()].copy_from_slice(data);
    need
}

/// The message that asks for UDP send offload (USO): `UDP_SEND_MSG_SIZE`, the size of each
/// datagram the buffer is cut into (the last may be shorter).
pub(crate) fn write_segment_size(out: &mut [u8], segment: u16) -> usize {
    write(
        out,
        IPPROTO_UDP,
        UDP_SEND_MSG_SIZE,
        &u32::from(segment).to_le_bytes(),
    )
}

/// The messages in `bytes`, as (level, type, data).
pub(crate) fn messages(bytes: &[u8]) -> impl Iterator<Item = (i32, i32, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let hdr = bytes.get(at..at + HDR)?;
        let len = usize::try_from(u64::from_le_bytes(hdr[..8].try_into().ok()?)).ok()?;
        let level = i32::from_le_bytes(hdr[8..12].try_into().ok()?);
        let ty = i32::from_le_bytes(hdr[12..16].try_into().ok()?);
        // A length below the header would never advance: stop there.
        if len < HDR {
            return None;
        }
        let data = bytes.get(at + HDR..at.checked_add(len)?)?;
        at += align(len);
        Some((level, ty, data))
    })
}

/// What the receive control messages say about one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Parsed {
    /// Traffic class and hop limit (flow label: Windows reports none).
    pub(crate) ip: IpFields,
    /// With URO: the size of the datagrams the buffer holds back to back.
    pub(crate) segment: Option<usize>,
    /// The address the datagram was sent to (`IP_PKTINFO` / `IPV6_PKTINFO`).
    pub(crate) dst: Option<IpAddr>,
}

fn int(data: &[u8]) -> Option<i64> {
    match data.len() {
        1 => Some(i64::from(data[0])),
        4.. => Some(i64::from(i32::from_le_bytes(data[..4].try_into().ok()?))),
        _ => None,
    }
}

/// Reads the messages `WSARecvMsg` wrote: the traffic class (`IP_TOS`, `IPV6_TCLASS`, or only
/// its ECN bits from `IP_ECN` / `IPV6_ECN`), the hop limit (`IP_HOPLIMIT`, or `IP_TTL`, which
/// Wine reports instead), the URO segment size (`UDP_COALESCED_INFO`) and the destination
/// (`IP_PKTINFO`, `IPV6_PKTINFO`). Unknown messages are skipped.
pub(crate) fn parse(bytes: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    let mut tos_seen = false;
    for (level, ty, data) in messages(bytes) {
        match (level, ty) {
            (IPPROTO_IP, IP_TOS) | (IPPROTO_IPV6, IPV6_TCLASS) => {
                if let Some(v) = int(data) {
                    out.ip.traffic_class = v as u8;
                    tos_seen = true;
                }
            }
            (IPPROTO_IP, IP_ECN) | (IPPROTO_IPV6, IPV6_ECN) if !tos_seen => {
                if let Some(v) = int(data) {
                    out.ip.traffic_class = (out.ip.traffic_class & !3) | (v as u8 & 3);
                }
            }
            (IPPROTO_IP, IP_HOPLIMIT | IP_TTL) | (IPPROTO_IPV6, IPV6_HOPLIMIT) => {
                if let Some(v) = int(data) {
                    out.ip.hop_limit = u8::try_from(v).unwrap_or(u8::MAX);
                }
            }
            (IPPROTO_UDP, t) if t as u32 == UDP_COALESCED_INFO => {
                out.segment = int(data)
                    .and_then(|v| usize::try_from(v).ok())
                    .filter(|&s| s > 0);
            }
            (IPPROTO_IP, IP_PKTINFO) => {
                if let Some(a) = data.get(..4) {
                    let octets: [u8; 4] = a.try_into().unwrap_or_default();
                    out.dst = Some(IpAddr::V4(Ipv4Addr::from(octets)));
                }
            }
            (IPPROTO_IPV6, IPV6_PKTINFO) => {
                if let Some(a) = data.get(..16) {
                    let octets: [u8; 16] = a.try_into().unwrap_or_default();
                    out.dst = Some(IpAddr::V6(Ipv6Addr::from(octets)));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_the_system_layout() {
        let mut buf = Control::<128>::default();
        let mut at = write(&mut buf.0, IPPROTO_IP, IP_TOS, &0xb8i32.to_le_bytes());
        assert_eq!(at, 24, "16-byte header, 4 bytes of data padded to 8");
        at += write(
            &mut buf.0[at..],
            IPPROTO_IP,
            IP_HOPLIMIT,
            &17i32.to_le_bytes(),
        );
        at += write(
            &mut buf.0[at..],
            IPPROTO_IP,
            IP_PKTINFO,
            &[127, 0, 0, 2, 1, 0, 0, 0],
        );
        at += write(
            &mut buf.0[at..],
            IPPROTO_UDP,
            UDP_COALESCED_INFO as i32,
            &1100u32.to_le_bytes(),
        );
        let p = parse(&buf.0[..at]);
        assert_eq!(p.ip.traffic_class, 0xb8);
        assert_eq!(p.ip.hop_limit, 17);
        assert_eq!(p.segment, Some(1100));
        assert_eq!(p.dst, Some("127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn ecn_alone_gives_the_low_two_bits_and_tos_wins() {
        let mut buf = Control::<64>::default();
        let at = write(&mut buf.0, IPPROTO_IPV6, IPV6_ECN, &3i32.to_le_bytes());
        assert_eq!(parse(&buf.0[..at]).ip.traffic_class, 3);
        let mut at = write(&mut buf.0, IPPROTO_IP, IP_TOS, &[0x20]);
        at += write(&mut buf.0[at..], IPPROTO_IP, IP_ECN, &1i32.to_le_bytes());
        assert_eq!(parse(&buf.0[..at]).ip.traffic_class, 0x20);
    }

    #[test]
    fn a_lying_length_ends_the_walk() {
        let mut buf = Control::<64>::default();
        let at = write(&mut buf.0, IPPROTO_IP, IP_TOS, &5i32.to_le_bytes());
        // Longer than the buffer, then shorter than a header.
        buf.0[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(parse(&buf.0[..at]), Parsed::default());
        buf.0[..8].copy_from_slice(&3u64.to_le_bytes());
        assert_eq!(messages(&buf.0[..at]).count(), 0);
        assert_eq!(write(&mut buf.0[..20], IPPROTO_IP, IP_TOS, &[0; 8]), 0);
    }

    #[test]
    fn the_uso_message_names_udp_send_msg_size() {
        let mut buf = Control::<32>::default();
        let n = write_segment_size(&mut buf.0, 1100);
        let (level, ty, data) = messages(&buf.0[..n]).next().unwrap();
        assert_eq!(
            (level, ty, data),
            (IPPROTO_UDP, UDP_SEND_MSG_SIZE, &1100u32.to_le_bytes()[..])
        );
    }
}

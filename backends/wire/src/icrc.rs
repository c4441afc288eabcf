//! RoCEv2 invariant CRC (IBTA Annex A17, Linux `rxe_icrc.c`) and UDP source-port entropy
//! (Linux `rdma_get_udp_sport`).
//!
//! The ICRC is the ordinary zlib CRC-32 over: eight `0xFF` bytes (standing in for the IB LRH),
//! the IP header with its variant fields set to all ones, the UDP header with its checksum set
//! to all ones, the BTH with byte 4 (FECN/BECN/reserved) set to all ones, and the rest of the
//! transport packet (extension headers, payload, pad). It travels least-significant byte
//! first.

use crc32fast::Hasher;

/// Bytes hashed before the IP header in place of the IB local route header.
const LRH_STANDIN: [u8; 8] = [0xFF; 8];

/// Which bytes of a header are replaced by `0xFF` before hashing, by offset.
type MaskFn = fn(usize) -> bool;

/// IPv4: TOS (1), TTL (8), header checksum (10, 11).
fn ipv4_masked(i: usize) -> bool {
    matches!(i, 1 | 8 | 10 | 11)
}

/// IPv6: traffic class and flow label (low nibble of 0, bytes 1..=3) and hop limit (7).
/// Byte 0 is handled specially (only its low nibble is masked).
fn ipv6_masked(i: usize) -> bool {
    matches!(i, 1..=3 | 7)
}

/// UDP: checksum (6, 7).
fn udp_masked(i: usize) -> bool {
    matches!(i, 6 | 7)
}

/// BTH: byte 4 (FECN, BECN, reserved).
/// The BTH byte the ICRC masks (FECN, BECN and the reserved bits).
const BTH_MASKED_BYTE: usize = 4;

/// Feeds `bytes` (found at offset `base` of its header) to `h`, replacing masked bytes.
/// Works through a small stack buffer so no allocation is needed.
fn feed_masked(h: &mut Hasher, bytes: &[u8], base: usize, masked: MaskFn) {
    let mut scratch = [0u8; 64];
    let mut off = base;
    for chunk in bytes.chunks(scratch.len()) {
        for (i, (dst, src)) in scratch.iter_mut().zip(chunk).enumerate() {
            *dst = if masked(off + i) { 0xFF } else { *src };
        }
        h.update(scratch.get(..chunk.len()).unwrap_or(&[]));
        off += chunk.len();
    }
}

/// Computes the ICRC value (not yet byte-swapped for the wire).
///
/// * `ip_header`: the IPv4 (any IHL) or IPv6 header as transmitted. The masking is chosen by
///   the version nibble; a header of another version is hashed unmasked.
/// * `udp_header`: the 8-byte UDP header.
/// * `ib`: the transport packet without the ICRC, possibly in several pieces (headers,
///   payload, pad); byte 4 of the concatenation (in the BTH) is masked.
///
/// Write the result with `to_le_bytes()`.
pub fn icrc(ip_header: &[u8], udp_header: &[u8], ib: &[&[u8]]) -> u32 {
    let mut h = Hasher::new();
    h.update(&LRH_STANDIN);
    match ip_header.first().map(|b| b >> 4) {
        Some(4) => feed_masked(&mut h, ip_header, 0, ipv4_masked),
        Some(6) => {
            let first = ip_header.first().copied().unwrap_or(0x60);
            h.update(&[first | 0x0F]);
            feed_masked(&mut h, ip_header.get(1..).unwrap_or(&[]), 1, ipv6_masked);
        }
        _ => h.update(ip_header),
    }
    feed_masked(&mut h, udp_header, 0, udp_masked);
    // Of the IB bytes only BTH byte 4 is masked: everything else (the payload above all)
    // goes to the CRC as it is, at the CRC's full speed.
    let mut off = 0;
    for piece in ib {
        match BTH_MASKED_BYTE
            .checked_sub(off)
            .filter(|&i| i < piece.len())
        {
            Some(i) => {
                h.update(piece.get(..i).unwrap_or(&[]));
                h.update(&[0xFF]);
                h.update(piece.get(i + 1..).unwrap_or(&[]));
            }
            None => h.update(piece),
        }
        off += piece.len();
    }
    h.finalize()
}

/// Mask of a 20-bit IPv6 / GRH flow label.
pub const FLOW_LABEL_MASK: u32 = 0x000F_FFFF;

/// Derives a flow label from a QP pair the way Linux does when the address vector carries
/// none: `v = lqpn * rqpn; v ^= v >> 20; v ^= v >> 40;` then the low 20 bits.
pub fn flow_label_from_qpns(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    // Masked to 20 bits, so the narrowing cannot lose anything.
    (v & u64::from(FLOW_LABEL_MASK)) as u32
}

/// Folds a 20-bit flow label into a RoCEv2 UDP source port:
/// `0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))` (bits above 20 are ignored).
pub fn flow_label_to_udp_port(fl: u32) -> u16 {
    let fl = fl & FLOW_LABEL_MASK;
    let folded = (fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14);
    // `folded` fits in 14 bits.
    0xC000 | (folded & 0x3FFF) as u16
}

/// UDP source port for an RC/UC flow between `lqpn` and `rqpn` (Linux `rdma_get_udp_sport`): the
/// flow label if its 20 bits are non-zero, otherwise one derived from the QP numbers
/// ([`flow_label_from_qpns`]), folded into `0xC000..=0xFFFF` ([`flow_label_to_udp_port`]).
pub fn udp_source_port(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label & FLOW_LABEL_MASK == 0 {
        flow_label_from_qpns(lqpn, rqpn)
    } else {
        flow_label
    };
    flow_label_to_udp_port(fl)
}

//! ICRC worked examples (a ConnectX-4 Lx CNP from scapy's `test/contrib/roce.uts`, and a
//! hand-built RC SEND whose ICRC Wireshark accepts), RoCEv2 frame build/parse, and UDP source
//! ports (Linux `rdma_get_udp_sport`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::hex;
use crate::*;

const CNP_IP: &str = "45 c2 00 3c 71 8c 40 00 40 11 91 61 0a 00 11 01 0a 00 12 01";
const CNP_UDP: &str = "00 00 12 b7 00 28 00 00";
const HELLO_IP: &str = "45 00 00 34 12 34 40 00 40 11 a5 31 c0 a8 01 01 c0 a8 01 02";
const HELLO_UDP: &str = "c0 00 12 b7 00 20 00 00";
const HELLO_BTH: &str = "04 b0 ff ff 00 00 00 11 80 12 34 56";

fn cnp_ib() -> Vec<u8> {
    let mut ib = hex("81 00 ff ff 40 00 01 18 00 00 00 00");
    ib.extend([0u8; 16]);
    ib
}

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

#[test]
fn icrc_connectx4_cnp() {
    let crc = icrc(&hex(CNP_IP), &hex(CNP_UDP), &[&cnp_ib()]);
    assert_eq!(crc, 0x2a00_fd82);
    assert_eq!(crc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
}

#[test]
fn icrc_hello_in_pieces() {
    let bth = hex(HELLO_BTH);
    let crc = icrc(
        &hex(HELLO_IP),
        &hex(HELLO_UDP),
        &[&bth, b"hello", &[0, 0, 0]],
    );
    assert_eq!(crc, 0xa31f_aed6);
    assert_eq!(crc.to_le_bytes(), [0xd6, 0xae, 0x1f, 0xa3]);
    // Any split of the transport bytes gives the same value (the mask follows byte 4).
    let mut whole = bth.clone();
    whole.extend(b"hello\0\0\0");
    for cut in 0..=whole.len() {
        let (a, b) = whole.split_at(cut);
        assert_eq!(icrc(&hex(HELLO_IP), &hex(HELLO_UDP), &[a, &[], b]), crc);
    }
    let singles: Vec<&[u8]> = whole.chunks(1).collect();
    assert_eq!(icrc(&hex(HELLO_IP), &hex(HELLO_UDP), &singles), crc);
}

#[test]
fn build_frame_reproduces_hello_frame_exactly() {
    let opts = FrameOptions {
        ipv4_id: 0x1234,
        ..FrameOptions::default()
    };
    let (src, dst) = (v4([192, 168, 1, 1]), v4([192, 168, 1, 2]));
    let mut out = Vec::new();
    build_frame_with(&opts, src, dst, 0xC000, &hex(HELLO_BTH), b"hello", &mut out).unwrap();
    let want = hex(&format!(
        "{HELLO_IP} {HELLO_UDP} {HELLO_BTH} 68 65 6c 6c 6f 00 00 00 d6 ae 1f a3"
    ));
    assert_eq!(out, want);
    assert_eq!(ipv4_header_checksum(&want[..20]), 0xa531);

    let v = parse_frame(&out).unwrap();
    assert!(v.icrc_ok);
    assert_eq!((v.src, v.dst, v.udp_sport), (src, dst, 0xC000));
    assert_eq!((v.icrc, v.icrc_computed), (0xa31f_aed6, 0xa31f_aed6));
    assert_eq!((v.traffic_class, v.hop_limit), (0, 64));
    assert_eq!(v.check_icrc(), Ok(()));
    let p = v.transport().unwrap();
    assert_eq!(p.payload, b"hello");
}

#[test]
fn parse_connectx4_cnp_frame() {
    let mut frame = hex(&format!("{CNP_IP} {CNP_UDP}"));
    frame.extend(cnp_ib());
    frame.extend([0x82, 0xfd, 0x00, 0x2a]);
    let v = parse_frame(&frame).unwrap();
    assert!(v.icrc_ok);
    assert_eq!((v.src, v.dst), (v4([10, 0, 17, 1]), v4([10, 0, 18, 1])));
    assert_eq!((v.udp_sport, v.traffic_class), (0, 0xc2));
    let p = v.transport().unwrap();
    assert_eq!(p.hdr.bth.opcode, Opcode::Cnp);
    assert!(p.hdr.bth.becn);
}

/// IPv4 frame offsets whose bytes are masked out of the ICRC: TOS, TTL, IP checksum, UDP
/// checksum, BTH byte 4.
const V4_MASKED: [usize; 7] = [1, 8, 10, 11, 26, 27, 32];

fn default_v4_frame() -> Vec<u8> {
    let mut h = TransportHdr::new(Bth::new(Opcode::WriteOnly, 0x42, 0x10));
    h.reth = Some(Reth {
        va: 0x1000,
        rkey: 7,
        dma_len: 6,
    });
    let mut ib = Vec::new();
    h.emit_packet(&[], &mut ib).unwrap();
    ib[1] |= 0x20; // pad 2 for the 6-byte payload
    let mut out = Vec::new();
    let sport = udp_source_port(0, 0x42, 0x43);
    build_frame(
        v4([10, 0, 0, 1]),
        v4([10, 0, 0, 2]),
        sport,
        &ib,
        b"abcdef",
        &mut out,
    )
    .unwrap();
    out
}

#[test]
fn build_frame_defaults_and_round_trip() {
    let f = default_v4_frame();
    assert_eq!(f.len(), 20 + 8 + 28 + 6 + 2 + 4);
    assert_eq!(&f[..10], &hex("45 00 00 44 00 00 40 00 40 11")[..]);
    assert_eq!(
        ipv4_header_checksum(&f[..20]),
        u16::from_be_bytes([f[10], f[11]])
    );
    assert_eq!(&f[22..28], &[0x12, 0xb7, 0x00, 0x30, 0x00, 0x00]);
    let v = parse_frame(&f).unwrap();
    assert!(v.icrc_ok);
    assert_eq!(v.udp_sport, udp_source_port(0, 0x42, 0x43));
    assert_eq!(v.transport().unwrap().payload, b"abcdef");
    // Link-layer padding after the IP datagram is ignored.
    let mut padded = f.clone();
    padded.extend([0u8; 6]);
    assert_eq!(parse_frame(&padded).unwrap(), v);
}

#[test]
fn flipping_any_covered_byte_breaks_the_icrc() {
    let f = default_v4_frame();
    for i in 0..f.len() {
        let mut g = f.clone();
        g[i] ^= 0xFF;
        let r = parse_frame(&g);
        if V4_MASKED.contains(&i) {
            assert!(r.unwrap().icrc_ok, "masked byte {i}");
        } else {
            assert!(!matches!(r, Ok(v) if v.icrc_ok), "covered byte {i}");
        }
    }
    // Fields that do not affect framing must parse but fail the ICRC.
    for i in (4..6).chain(12..22).chain(28..32).chain(33..f.len()) {
        let mut g = f.clone();
        g[i] ^= 0x01;
        let v = parse_frame(&g).unwrap();
        assert!(!v.icrc_ok, "byte {i}");
        assert!(matches!(v.check_icrc(), Err(WireError::BadIcrc { .. })));
    }
}

#[test]
fn ttl_and_tos_changes_keep_the_icrc() {
    let f = default_v4_frame();
    let mut g = f.clone();
    g[1] = 0x03; // ECN CE
    g[8] = 1;
    let sum = ipv4_header_checksum(&g[..20]).to_be_bytes();
    g[10..12].copy_from_slice(&sum);
    let v = parse_frame(&g).unwrap();
    assert!(v.icrc_ok);
    assert_eq!((v.traffic_class, v.hop_limit), (0x03, 1));
}

#[test]
fn ipv6_frame_round_trip_and_masking() {
    let src = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 1, 2, 3, 4));
    let dst = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9));
    let ib = hex("04 b0 ff ff 00 00 00 11 80 12 34 56");
    let mut f = Vec::new();
    build_frame(src, dst, 0xC123, &ib, b"hello", &mut f).unwrap();
    assert_eq!(f.len(), 40 + 8 + 12 + 8 + 4);
    assert_eq!(&f[..8], &hex("60 00 00 00 00 20 11 40")[..]);
    let v = parse_frame(&f).unwrap();
    assert!(v.icrc_ok);
    assert_eq!((v.src, v.dst, v.udp_sport), (src, dst, 0xC123));
    // Traffic class, flow label and hop limit are masked; the version nibble is covered.
    let masked = [1usize, 2, 3, 7, 46, 47, 52];
    for i in 0..f.len() {
        let mut g = f.clone();
        g[i] ^= if i == 0 { 0x0F } else { 0xFF };
        let r = parse_frame(&g);
        if i == 0 || masked.contains(&i) {
            assert!(r.unwrap().icrc_ok, "masked byte {i}");
        } else {
            assert!(!matches!(r, Ok(v) if v.icrc_ok), "covered byte {i}");
        }
    }
    let opts = FrameOptions {
        traffic_class: 0xAB,
        hop_limit: 3,
        flow_label: 0xC_DEF1,
        ..FrameOptions::default()
    };
    let mut g = Vec::new();
    build_frame_with(&opts, src, dst, 0xC123, &ib, b"hello", &mut g).unwrap();
    assert_eq!(&g[..8], &hex("6a bc de f1 00 20 11 03")[..]);
    let w = parse_frame(&g).unwrap();
    assert_eq!((w.traffic_class, w.hop_limit, w.icrc), (0xAB, 3, v.icrc));
}

#[test]
fn build_frame_errors() {
    let ib = hex(HELLO_BTH); // pad 3
    let mut out = Vec::new();
    let (a4, a6) = (v4([1, 2, 3, 4]), IpAddr::V6(Ipv6Addr::LOCALHOST));
    assert!(matches!(
        build_frame(a4, a6, 1, &ib, b"hello", &mut out),
        Err(WireError::BadIpHeader(_))
    ));
    assert_eq!(
        build_frame(a4, a4, 1, &ib, b"hell", &mut out),
        Err(WireError::BadPad { pad: 3, payload: 4 })
    );
    assert_eq!(
        build_frame(a4, a4, 1, &ib[..11], b"", &mut out),
        Err(WireError::Truncated { need: 12, have: 11 })
    );
    let huge = vec![0u8; 70_000];
    let mut ib0 = ib.clone();
    ib0[1] = 0;
    assert!(matches!(
        build_frame(a4, a4, 1, &ib0, &huge, &mut out),
        Err(WireError::BadIpHeader(_))
    ));
}

#[test]
fn parse_frame_rejects_bad_outer_headers() {
    let f = default_v4_frame();
    let bad_ip = |mutate: &dyn Fn(&mut Vec<u8>)| {
        let mut g = f.clone();
        mutate(&mut g);
        parse_frame(&g).map(|v| v.icrc_ok)
    };
    assert!(matches!(parse_frame(&[]), Err(WireError::Truncated { .. })));
    assert!(matches!(
        parse_frame(&f[..19]),
        Err(WireError::Truncated { .. })
    ));
    assert!(matches!(
        bad_ip(&|g| g[0] = 0x55),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[0] = 0x46),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[0] = 0x44),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[9] = 6),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[6] = 0x20),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[7] = 0x01),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[3] = 0x10),
        Err(WireError::BadIpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[3] = 0xFF),
        Err(WireError::Truncated { .. })
    ));
    assert!(matches!(
        bad_ip(&|g| g[23] = 0xb8),
        Err(WireError::BadUdpHeader(_))
    ));
    assert!(matches!(
        bad_ip(&|g| g[25] = 0x31),
        Err(WireError::BadUdpHeader(_))
    ));
    // Too short for BTH + ICRC after the UDP header.
    let mut short = f[..20 + 8 + 15].to_vec();
    short[2..4].copy_from_slice(&43u16.to_be_bytes());
    short[24..26].copy_from_slice(&23u16.to_be_bytes());
    assert_eq!(
        parse_frame(&short),
        Err(WireError::Truncated { need: 44, have: 43 })
    );
}

#[test]
fn udp_source_port_from_flow_label() {
    // Linux `rdma_flow_label_to_udp_sport`: flow label 0x308EF → 0xC000 | (0x08EF ^ 0xC) = 0xC8E3.
    assert_eq!(flow_label_to_udp_port(0x308EF), 0xC8E3);
    assert_eq!(udp_source_port(0x308EF, 5, 6), 0xC8E3);
    assert_eq!(flow_label_to_udp_port(0), 0xC000);
    assert_eq!(flow_label_to_udp_port(0xFFFFF), 0xC000 | (0x3FFF ^ 0x3F));
    assert_eq!(flow_label_to_udp_port(0x1_00000 | 0x5), 0xC005); // bits above 20 ignored
}

#[test]
fn udp_source_port_from_qpns() {
    // 0x11 * 0x12 = 0x132; both shifts are zero; fl = 0x132 → 0xC000 | 0x132.
    assert_eq!(flow_label_from_qpns(0x11, 0x12), 0x132);
    assert_eq!(udp_source_port(0, 0x11, 0x12), 0xC132);
    // 0x123456 * 0xABCDEF = 0xC379A59BA4A; ^= >>20 (0xC379A5) → 0xC379A9AC3EF;
    // ^= >>40 (0xC) → 0xC379A9AC3E3; low 20 bits 0xAC3E3;
    // fold: 0x03E3 ^ 0x2B = 0x03C8 → 0xC3C8.
    assert_eq!(flow_label_from_qpns(0x123456, 0xABCDEF), 0xAC3E3);
    assert_eq!(udp_source_port(0, 0x123456, 0xABCDEF), 0xC3C8);
    // 0xFFFFFF² = 0xFFFFFE000001; ^= 0xFFFFFE0 → 0xFFFFF1FFFFE1; ^= 0xFF → 0xFFFFF1FFFF1E;
    // fl = 0xFFF1E; fold: 0x3F1E ^ 0x3F = 0x3F21 → 0xFF21.
    assert_eq!(flow_label_from_qpns(0xFFFFFF, 0xFFFFFF), 0xFFF1E);
    assert_eq!(udp_source_port(0, 0xFFFFFF, 0xFFFFFF), 0xFF21);
}

//! Property tests: parsers never panic on arbitrary bytes, and valid headers round-trip.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::*;

fn known_opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::all_known().collect::<Vec<_>>())
}

fn arb_bth() -> impl Strategy<Value = Bth> {
    (
        known_opcode(),
        any::<[bool; 5]>(),
        any::<u16>(),
        0..=MASK_24,
        0..=MASK_24,
    )
        .prop_map(|(opcode, [se, m, f, b, a], pkey, dest_qp, psn)| Bth {
            opcode,
            solicited: se,
            mig_req: m,
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: f,
            becn: b,
            dest_qp,
            ack_req: a,
            psn,
        })
}

/// Every extension header with random contents; the ones the opcode lacks are dropped later.
fn arb_ext() -> impl Strategy<Value = (Deth, Reth, AtomicEth, Aeth, AtomicAckEth, u32, u32)> {
    (
        (any::<u32>(), 0..=MASK_24).prop_map(|(qkey, src_qp)| Deth { qkey, src_qp }),
        any::<(u64, u32, u32)>().prop_map(|(va, rkey, dma_len)| Reth { va, rkey, dma_len }),
        any::<(u64, u32, u64, u64)>().prop_map(|(va, rkey, swap_add, compare)| AtomicEth {
            va,
            rkey,
            swap_add,
            compare,
        }),
        (any::<u8>(), 0..=MASK_24).prop_map(|(s, msn)| Aeth {
            syndrome: AethSyndrome::from_u8(s),
            msn,
        }),
        any::<u64>().prop_map(|orig| AtomicAckEth { orig }),
        any::<u32>(),
        any::<u32>(),
    )
}

/// A valid header (options matching the opcode, pad set) and a payload it may carry.
fn arb_packet() -> impl Strategy<Value = (TransportHdr, Vec<u8>)> {
    (
        arb_bth(),
        arb_ext(),
        proptest::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(
            |(bth, (deth, reth, atomic, aeth, ack, imm, ieth), mut payload)| {
                let set = bth.opcode.headers();
                let pick = |flag: HeaderSet| set.contains(flag);
                let mut h = TransportHdr::new(bth);
                h.deth = pick(HeaderSet::DETH).then_some(deth);
                h.reth = pick(HeaderSet::RETH).then_some(reth);
                h.atomic = pick(HeaderSet::ATOMIC_ETH).then_some(atomic);
                h.aeth = pick(HeaderSet::AETH).then_some(aeth);
                h.atomic_ack = pick(HeaderSet::ATOMIC_ACK_ETH).then_some(ack);
                h.imm = pick(HeaderSet::IMM).then_some(imm);
                h.ieth = pick(HeaderSet::IETH).then_some(ieth);
                if !pick(HeaderSet::PAYLOAD) {
                    payload.clear();
                }
                h.bth.pad_count = pad_len(payload.len());
                (h, payload)
            },
        )
}

fn arb_addrs() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        any::<([u8; 4], [u8; 4])>()
            .prop_map(|(a, b)| (IpAddr::V4(Ipv4Addr::from(a)), IpAddr::V4(Ipv4Addr::from(b)))),
        any::<([u8; 16], [u8; 16])>()
            .prop_map(|(a, b)| (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b)))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn transport_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(p) = TransportHdr::parse(&bytes) {
            let _ = pretty(&p);
            prop_assert!(p.header_len + p.payload.len() <= bytes.len());
        }
    }

    #[test]
    fn transport_parse_never_panics_on_known_opcodes(
        op in known_opcode(),
        flags in any::<u8>(),
        rest in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        // Steer random input past the opcode and version checks.
        let mut bytes = vec![op.to_u8(), flags & 0xF0];
        bytes.extend(rest);
        if let Ok(p) = TransportHdr::parse(&bytes) {
            prop_assert_eq!(p.hdr.bth.opcode, op);
            let _ = pretty(&p);
        }
    }

    #[test]
    fn datagram_open_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        v6 in any::<bool>(),
        sport in any::<u16>(),
    ) {
        let (src, dst): (std::net::SocketAddr, std::net::SocketAddr) = if v6 {
            (([0xfd, 0, 0, 0, 0, 0, 0, 1], sport).into(), ([0xfd, 0, 0, 0, 0, 0, 0, 2], 4791).into())
        } else {
            (([10, 0, 0, 1], sport).into(), ([10, 0, 0, 2], 4791).into())
        };
        if let Ok(d) = crate::open_datagram(src, dst, &bytes) {
            prop_assert!(d.ib.len() + 4 == bytes.len());
            let _ = TransportHdr::parse(d.ib);
        }
    }

    #[test]
    fn frame_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(v) = parse_frame(&bytes) {
            let _ = v.transport();
        }
    }

    #[test]
    fn frame_parse_never_panics_on_mutated_frames(
        (hdr, payload) in arb_packet(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut ib = Vec::new();
        hdr.emit_packet(&payload, &mut ib).unwrap();
        let header_len = hdr.len();
        let mut frame = Vec::new();
        let (src, dst) = (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST));
        build_frame(src, dst, 0xC000, &ib[..header_len], &payload, &mut frame).unwrap();
        for (at, x) in flips {
            let n = frame.len();
            frame[at % n] ^= x;
        }
        frame.truncate(cut % (frame.len() + 1));
        if let Ok(v) = parse_frame(&frame) {
            if let Ok(p) = v.transport() {
                let _ = pretty(&p);
            }
        }
    }

    #[test]
    fn transport_emit_parse_round_trip((hdr, payload) in arb_packet()) {
        let mut buf = vec![0u8; hdr.len()];
        prop_assert_eq!(hdr.emit(&mut buf), Ok(hdr.len()));
        buf.extend_from_slice(&payload);
        buf.extend(std::iter::repeat_n(0u8, usize::from(hdr.bth.pad_count)));
        let p = TransportHdr::parse(&buf).unwrap();
        prop_assert_eq!(p.hdr, hdr);
        prop_assert_eq!(p.header_len, hdr.len());
        prop_assert_eq!(p.payload, &payload[..]);

        let mut again = Vec::new();
        prop_assert_eq!(hdr.emit_packet(&payload, &mut again), Ok(hdr.len()));
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn frame_build_parse_round_trip(
        (hdr, payload) in arb_packet(),
        (src, dst) in arb_addrs(),
        sport in any::<u16>(),
    ) {
        let mut ib = vec![0u8; hdr.len()];
        hdr.emit(&mut ib).unwrap();
        let mut frame = Vec::new();
        build_frame(src, dst, sport, &ib, &payload, &mut frame).unwrap();
        let v = parse_frame(&frame).unwrap();
        prop_assert!(v.icrc_ok);
        prop_assert_eq!((v.src, v.dst, v.udp_sport), (src, dst, sport));
        let p = v.transport().unwrap();
        prop_assert_eq!(p.hdr, hdr);
        prop_assert_eq!(p.payload, &payload[..]);
    }

    #[test]
    fn bth_round_trip(bth in arb_bth(), pad in 0u8..4) {
        let bth = Bth { pad_count: pad, ..bth };
        let mut out = [0u8; Bth::LEN];
        bth.emit(&mut out).unwrap();
        prop_assert_eq!(Bth::parse(&out).unwrap(), bth);
    }

    /// Any bytes parse as an LRH and a GRH (or are too short), and emitting what was parsed
    /// gives the bytes back except the reserved bits, which come back zero.
    #[test]
    fn lrh_and_grh_parse_emit_keep_every_field(
        bytes in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        match Lrh::parse(&bytes) {
            Ok(lrh) => {
                let mut out = [0u8; Lrh::LEN];
                lrh.emit(&mut out).unwrap();
                let mut want: [u8; Lrh::LEN] = bytes[..Lrh::LEN].try_into().unwrap();
                want[1] &= 0xf3;
                want[4] &= 0x07;
                prop_assert_eq!(out, want);
            }
            Err(e) => prop_assert!(bytes.len() < Lrh::LEN, "{e}"),
        }
        match Grh::parse(&bytes) {
            Ok(grh) => {
                let mut out = [0u8; Grh::LEN];
                grh.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], &bytes[..Grh::LEN]);
            }
            Err(e) => prop_assert!(bytes.len() < Grh::LEN, "{e}"),
        }
    }
}

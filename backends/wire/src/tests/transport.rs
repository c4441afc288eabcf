//! `TransportHdr` emit/parse: layouts, header order, every error path, and `pretty`.

use super::hex;
use crate::*;

/// The hand-built "hello" packet of `tests/frame.rs` (transport part, no ICRC).
fn hello_ib() -> Vec<u8> {
    hex("04 b0 ff ff 00 00 00 11 80 12 34 56 68 65 6c 6c 6f 00 00 00")
}

/// A header for `op` with every extension header the opcode needs filled in.
fn full_hdr(op: Opcode) -> TransportHdr {
    let mut h = TransportHdr::new(Bth::new(op, 0x11, 0x22));
    let set = op.headers();
    if set.contains(HeaderSet::DETH) {
        h.deth = Some(Deth {
            qkey: 0x1111_1111,
            src_qp: 0x22,
        });
    }
    if set.contains(HeaderSet::RETH) {
        h.reth = Some(Reth {
            va: 0x3333,
            rkey: 0x44,
            dma_len: 0x55,
        });
    }
    if set.contains(HeaderSet::ATOMIC_ETH) {
        h.atomic = Some(AtomicEth {
            va: 0x66,
            rkey: 0x77,
            swap_add: 0x88,
            compare: 0x99,
        });
    }
    if set.contains(HeaderSet::AETH) {
        h.aeth = Some(Aeth {
            syndrome: AethSyndrome::ACK_UNLIMITED,
            msn: 0xAA,
        });
    }
    if set.contains(HeaderSet::ATOMIC_ACK_ETH) {
        h.atomic_ack = Some(AtomicAckEth { orig: 0xBB });
    }
    if set.contains(HeaderSet::IMM) {
        h.imm = Some(0xCCDD_EEFF);
    }
    if set.contains(HeaderSet::IETH) {
        h.ieth = Some(0x0102_0304);
    }
    h
}

fn emit_vec(h: &TransportHdr) -> Vec<u8> {
    let mut out = vec![0u8; h.len()];
    assert_eq!(h.emit(&mut out), Ok(h.len()));
    out
}

#[test]
fn parse_hello_packet() {
    let ib = hello_ib();
    let p = TransportHdr::parse(&ib).unwrap();
    assert_eq!(p.header_len, 12);
    assert_eq!(p.payload, b"hello");
    assert_eq!(p.hdr.bth.opcode, Opcode::SendOnly);
    assert_eq!((p.hdr.bth.dest_qp, p.hdr.bth.psn), (0x11, 0x123456));
    assert!(p.hdr.bth.solicited && p.hdr.bth.ack_req);
    assert_eq!(p.hdr, TransportHdr::new(p.hdr.bth));
    assert_eq!(
        pretty(&p),
        "RC SEND_ONLY qp=0x000011 psn=0x123456 A SE pad=3 len=5"
    );

    let mut again = Vec::new();
    let mut hdr = p.hdr;
    hdr.bth.pad_count = 0; // emit_packet computes it
    assert_eq!(hdr.emit_packet(b"hello", &mut again), Ok(12));
    assert_eq!(again, ib);
}

#[test]
fn every_known_opcode_round_trips_with_expected_length() {
    for op in Opcode::all_known() {
        let h = full_hdr(op);
        assert_eq!(h.len(), op.header_len(), "{op}");
        let bytes = emit_vec(&h);
        let p = TransportHdr::parse(&bytes).unwrap();
        assert_eq!(p.hdr, h, "{op}");
        assert_eq!(p.header_len, h.len());
        assert!(p.payload.is_empty());
    }
}

#[test]
fn header_order_on_the_wire() {
    let bth = "ff ff 00 00 00 11 00 00 00 22";
    let reth = "00 00 00 00 00 00 33 33 00 00 00 44 00 00 00 55";
    let cases = [
        (
            Opcode::WriteOnlyWithImmediate,
            format!("0b 00 {bth} {reth} cc dd ee ff"),
        ),
        (
            Opcode::UdSendOnlyWithImmediate,
            format!("65 00 {bth} 11 11 11 11 00 00 00 22 cc dd ee ff"),
        ),
        (
            Opcode::AtomicAcknowledge,
            format!("12 00 {bth} 1f 00 00 aa 00 00 00 00 00 00 00 bb"),
        ),
        (
            Opcode::SendLastWithInvalidate,
            format!("16 00 {bth} 01 02 03 04"),
        ),
        (Opcode::ReadRequest, format!("0c 00 {bth} {reth}")),
        (
            Opcode::FetchAdd,
            format!(
                "14 00 {bth} 00 00 00 00 00 00 00 66 00 00 00 77 \
                 00 00 00 00 00 00 00 88 00 00 00 00 00 00 00 99"
            ),
        ),
    ];
    for (op, want) in cases {
        assert_eq!(emit_vec(&full_hdr(op)), hex(&want), "{op}");
    }
}

#[test]
fn cnp_matches_connectx4_capture() {
    let mut bth = Bth::new(Opcode::Cnp, 0x118, 0);
    bth.becn = true;
    let bytes = emit_vec(&TransportHdr::new(bth));
    let mut want = hex("81 00 ff ff 40 00 01 18 00 00 00 00");
    want.extend([0u8; 16]);
    assert_eq!(bytes, want);
    let p = TransportHdr::parse(&want).unwrap();
    assert_eq!((p.header_len, p.payload.len()), (28, 0));
    assert_eq!(pretty(&p), "CNP qp=0x000118 psn=0x000000 BECN pad=0 len=0");
}

#[test]
fn truncated_at_every_shorter_length() {
    let ops = [
        Opcode::SendOnly,
        Opcode::WriteOnlyWithImmediate,
        Opcode::ReadRequest,
        Opcode::CompareSwap,
        Opcode::AtomicAcknowledge,
        Opcode::UdSendOnlyWithImmediate,
        Opcode::Cnp,
    ];
    for op in ops {
        let bytes = emit_vec(&full_hdr(op));
        let full = bytes.len();
        for n in 0..full {
            let need = if n < Bth::LEN { Bth::LEN } else { full };
            assert_eq!(
                TransportHdr::parse(&bytes[..n]),
                Err(WireError::Truncated { need, have: n }),
                "{op} cut at {n}"
            );
        }
        assert!(TransportHdr::parse(&bytes).is_ok());
    }
}

#[test]
fn unknown_opcode_and_bad_version() {
    for op in (0..=u8::MAX).map(Opcode::from_u8).filter(|o| !o.is_known()) {
        let mut b = [0u8; 40];
        b[0] = op.to_u8();
        assert_eq!(
            TransportHdr::parse(&b),
            Err(WireError::UnknownOpcode(op.to_u8()))
        );
    }
    let mut ib = hello_ib();
    ib[1] |= 0x01;
    assert_eq!(TransportHdr::parse(&ib), Err(WireError::BadVersion(1)));
    ib[1] |= 0x0F;
    assert_eq!(TransportHdr::parse(&ib), Err(WireError::BadVersion(15)));
}

#[test]
fn bad_pad_and_unexpected_payload() {
    // SEND_ONLY claiming 3 pad bytes with only 2 bytes after the BTH.
    let ib = hex("04 30 ff ff 00 00 00 11 00 00 00 01 aa bb");
    assert_eq!(
        TransportHdr::parse(&ib),
        Err(WireError::BadPad { pad: 3, payload: 2 })
    );
    // Pad may consume everything after the headers (zero-length payload).
    let ib = hex("04 30 ff ff 00 00 00 11 00 00 00 01 00 00 00");
    assert_eq!(TransportHdr::parse(&ib).unwrap().payload, b"");
    // ACK with a pad count but no bytes.
    let mut ack = emit_vec(&full_hdr(Opcode::Acknowledge));
    ack[1] = 0x10;
    assert_eq!(
        TransportHdr::parse(&ack),
        Err(WireError::BadPad { pad: 1, payload: 0 })
    );
    // ACK followed by data.
    let mut ack = emit_vec(&full_hdr(Opcode::Acknowledge));
    ack.extend([1, 2, 3, 4]);
    assert_eq!(TransportHdr::parse(&ack), Err(WireError::UnexpectedPayload));
    let mut cnp = emit_vec(&full_hdr(Opcode::Cnp));
    cnp.push(0);
    assert_eq!(TransportHdr::parse(&cnp), Err(WireError::UnexpectedPayload));
    // emit_packet refuses a payload on an opcode without one.
    assert_eq!(
        full_hdr(Opcode::ReadRequest).emit_packet(b"x", &mut Vec::new()),
        Err(WireError::UnexpectedPayload)
    );
}

#[test]
fn emit_checks_headers_against_opcode() {
    let mut out = [0u8; 64];
    let mut h = full_hdr(Opcode::WriteOnly);
    h.reth = None;
    assert_eq!(h.emit(&mut out), Err(WireError::MissingHeader("RETH")));
    let mut h = full_hdr(Opcode::SendOnly);
    h.imm = Some(1);
    assert_eq!(h.emit(&mut out), Err(WireError::UnexpectedHeader("ImmDt")));
    let mut h = full_hdr(Opcode::UdSendOnly);
    h.deth = None;
    assert_eq!(h.emit(&mut out), Err(WireError::MissingHeader("DETH")));
    let mut h = full_hdr(Opcode::Acknowledge);
    h.atomic_ack = Some(AtomicAckEth { orig: 1 });
    assert_eq!(
        h.emit(&mut out),
        Err(WireError::UnexpectedHeader("AtomicAckETH"))
    );
    let mut h = full_hdr(Opcode::AtomicAcknowledge);
    h.aeth = None;
    assert_eq!(h.emit(&mut out), Err(WireError::MissingHeader("AETH")));
    let mut h = full_hdr(Opcode::SendOnlyWithInvalidate);
    h.reth = Some(Reth::default());
    assert_eq!(h.emit(&mut out), Err(WireError::UnexpectedHeader("RETH")));
    let mut h = full_hdr(Opcode::CompareSwap);
    h.atomic = None;
    assert_eq!(h.emit(&mut out), Err(WireError::MissingHeader("AtomicETH")));
    let mut h = full_hdr(Opcode::SendOnly);
    h.ieth = Some(3);
    assert_eq!(h.emit(&mut out), Err(WireError::UnexpectedHeader("IETH")));

    let h = TransportHdr::new(Bth::new(Opcode::from_u8(0x15), 1, 1));
    assert_eq!(h.emit(&mut out), Err(WireError::UnknownOpcode(0x15)));
    let h = full_hdr(Opcode::WriteFirst);
    assert_eq!(
        h.emit(&mut out[..27]),
        Err(WireError::BufferTooSmall { need: 28, have: 27 })
    );
}

#[test]
fn pretty_shows_extension_headers() {
    let show = |h: &TransportHdr, payload: &[u8]| {
        let mut buf = Vec::new();
        h.emit_packet(payload, &mut buf).unwrap();
        pretty(&TransportHdr::parse(&buf).unwrap())
    };
    let mut h = full_hdr(Opcode::WriteFirst);
    h.bth.pkey = 0x8001;
    assert_eq!(
        show(&h, &[0; 8]),
        "RC RDMA_WRITE_FIRST qp=0x000011 psn=0x000022 pkey=0x8001 pad=0 len=8 \
         reth va=0x0000000000003333 rkey=0x00000044 len=85"
    );
    let mut h = full_hdr(Opcode::Acknowledge);
    h.aeth = Some(Aeth {
        syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
        msn: 7,
    });
    assert_eq!(
        show(&h, &[]),
        "RC ACKNOWLEDGE qp=0x000011 psn=0x000022 pad=0 len=0 aeth NAK(PSN sequence error) msn=0x000007"
    );
    h.aeth = Some(Aeth {
        syndrome: AethSyndrome::RnrNak { timer: 12 },
        msn: 7,
    });
    assert!(show(&h, &[]).ends_with("aeth RNR NAK timer=12 msn=0x000007"));
    let h = full_hdr(Opcode::UdSendOnlyWithImmediate);
    assert_eq!(
        show(&h, b"abcdef"),
        "UD SEND_ONLY_WITH_IMMEDIATE qp=0x000011 psn=0x000022 pad=2 len=6 \
         deth qkey=0x11111111 src_qp=0x000022 imm=0xccddeeff"
    );
    let h = full_hdr(Opcode::AtomicAcknowledge);
    assert!(show(&h, &[]).ends_with("aeth ACK msn=0x0000aa atomic_ack orig=0x00000000000000bb"));
    let h = full_hdr(Opcode::CompareSwap);
    assert!(show(&h, &[]).contains(
        "atomic va=0x0000000000000066 rkey=0x00000077 swap_add=0x0000000000000088 compare=0x0000000000000099"
    ));
    let mut h = full_hdr(Opcode::SendOnlyWithInvalidate);
    h.bth.mig_req = true;
    h.bth.fecn = true;
    assert_eq!(
        show(&h, b"x"),
        "RC SEND_ONLY_WITH_INVALIDATE qp=0x000011 psn=0x000022 M FECN pad=3 len=1 ieth rkey=0x01020304"
    );
    assert_eq!(
        h.to_string(),
        "RC SEND_ONLY_WITH_INVALIDATE qp=0x000011 psn=0x000022 M FECN pad=0 ieth rkey=0x01020304"
    );
}

#[test]
fn error_messages_say_what_is_wrong() {
    assert_eq!(
        WireError::Truncated { need: 12, have: 3 }.to_string(),
        "truncated input: need 12 bytes, have 3"
    );
    assert_eq!(
        WireError::UnknownOpcode(0x15).to_string(),
        "unknown transport opcode 0x15"
    );
    assert_eq!(
        WireError::MissingHeader("RETH").to_string(),
        "opcode requires a RETH header that is missing"
    );
    assert_eq!(
        WireError::BadIcrc {
            computed: 1,
            found: 2
        }
        .to_string(),
        "bad ICRC: computed 0x00000001, found 0x00000002"
    );
}

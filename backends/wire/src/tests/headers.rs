//! Byte layouts and round trips of the individual headers (BTH, RETH, AETH, DETH, atomics).

use core::time::Duration;

use super::hex;
use crate::*;

#[test]
fn bth_known_layout() {
    let bth = Bth {
        opcode: Opcode::SendOnly,
        solicited: true,
        mig_req: false,
        pad_count: 3,
        tver: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: 0x11,
        ack_req: true,
        psn: 0x123456,
    };
    let mut out = [0u8; Bth::LEN];
    bth.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("04 b0 ff ff 00 00 00 11 80 12 34 56"));
    assert_eq!(Bth::parse(&out).unwrap(), bth);
}

#[test]
fn bth_all_flags_and_cnp_layout() {
    // The BTH of the ConnectX-4 CNP (scapy `test/contrib/roce.uts`): BECN set, DestQP 0x118.
    let b = Bth::parse(&hex("81 00 ff ff 40 00 01 18 00 00 00 00")).unwrap();
    assert_eq!(b.opcode, Opcode::Cnp);
    assert!(b.becn && !b.fecn && !b.solicited && !b.ack_req && !b.mig_req);
    assert_eq!(
        (b.dest_qp, b.psn, b.pkey, b.pad_count, b.tver),
        (0x118, 0, 0xFFFF, 0, 0)
    );

    let all = Bth {
        opcode: Opcode::UcWriteLast,
        solicited: true,
        mig_req: true,
        pad_count: 2,
        tver: 0,
        pkey: 0x8001,
        fecn: true,
        becn: true,
        dest_qp: 0xABCDEF,
        ack_req: true,
        psn: 0xFEDCBA,
    };
    let mut out = [0u8; 12];
    all.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("28 e0 80 01 c0 ab cd ef 80 fe dc ba"));
    assert_eq!(Bth::parse(&out).unwrap(), all);
}

#[test]
fn bth_masks_wide_fields_and_ignores_reserved_bits() {
    let mut b = Bth::new(Opcode::SendFirst, 0xFF12_3456, 0x0100_0001);
    b.pad_count = 0xFD; // only the low two bits (1) fit
    b.tver = 0x1F; // only the low four bits (0xF) fit
    let mut out = [0u8; 12];
    b.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("00 1f ff ff 00 12 34 56 00 00 00 01"));
    let back = Bth::parse(&out).unwrap();
    assert_eq!(
        (back.dest_qp, back.psn, back.pad_count, back.tver),
        (0x123456, 1, 1, 0xF)
    );

    // Reserved bits (byte 4 low six, byte 8 low seven) are ignored and re-emitted as zero.
    let b = Bth::parse(&hex("04 00 ff ff 3f 00 00 11 7f 00 00 01")).unwrap();
    assert!(!b.fecn && !b.becn && !b.ack_req);
    b.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("04 00 ff ff 00 00 00 11 00 00 00 01"));
}

#[test]
fn bth_length_errors_and_trailing_bytes() {
    assert_eq!(
        Bth::parse(&[0; 11]),
        Err(WireError::Truncated { need: 12, have: 11 })
    );
    let mut small = [0u8; 11];
    assert_eq!(
        Bth::new(Opcode::SendOnly, 1, 1).emit(&mut small),
        Err(WireError::BufferTooSmall { need: 12, have: 11 })
    );
    // Extra bytes after the header are not the header's concern.
    let long = hex("04 00 ff ff 00 00 00 11 00 00 00 07 aa bb");
    assert_eq!(Bth::parse(&long).unwrap().psn, 7);
    // Unknown opcodes survive the BTH layer.
    assert_eq!(
        Bth::parse(&[0x15; 12]).unwrap().opcode,
        Opcode::from_u8(0x15)
    );
}

#[test]
fn reth_layout_and_round_trip() {
    let r = Reth {
        va: 0x0102_0304_0506_0708,
        rkey: 0x0A0B_0C0D,
        dma_len: 0x1000,
    };
    let mut out = [0u8; Reth::LEN];
    r.emit(&mut out).unwrap();
    assert_eq!(
        out.to_vec(),
        hex("01 02 03 04 05 06 07 08 0a 0b 0c 0d 00 00 10 00")
    );
    assert_eq!(Reth::parse(&out).unwrap(), r);
    assert_eq!(
        Reth::parse(&out[..15]),
        Err(WireError::Truncated { need: 16, have: 15 })
    );
    assert_eq!(
        r.emit(&mut [0u8; 3]),
        Err(WireError::BufferTooSmall { need: 16, have: 3 })
    );
}

#[test]
fn deth_layout_masking_and_reserved_byte() {
    let d = Deth {
        qkey: 0x8001_0000,
        src_qp: 0x0100_0001, // bit 24 is dropped on emit
    };
    let mut out = [0u8; Deth::LEN];
    d.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("80 01 00 00 00 00 00 01"));
    assert_eq!(
        Deth::parse(&out).unwrap(),
        Deth {
            qkey: 0x8001_0000,
            src_qp: 1
        }
    );
    let with_resv = hex("00 00 00 2a ff 12 34 56");
    assert_eq!(
        Deth::parse(&with_resv).unwrap(),
        Deth {
            qkey: 42,
            src_qp: 0x123456
        }
    );
    assert_eq!(
        Deth::parse(&with_resv[..7]),
        Err(WireError::Truncated { need: 8, have: 7 })
    );
}

#[test]
fn atomic_eth_layout_and_round_trip() {
    let a = AtomicEth {
        va: 0x1000,
        rkey: 0x1234_5678,
        swap_add: 0x1111_2222_3333_4444,
        compare: 0x5555_6666_7777_8888,
    };
    let mut out = [0u8; AtomicEth::LEN];
    a.emit(&mut out).unwrap();
    assert_eq!(
        out.to_vec(),
        hex(
            "00 00 00 00 00 00 10 00 12 34 56 78 11 11 22 22 33 33 44 44 \
             55 55 66 66 77 77 88 88"
        )
    );
    assert_eq!(AtomicEth::parse(&out).unwrap(), a);
    assert_eq!(
        AtomicEth::parse(&out[..27]),
        Err(WireError::Truncated { need: 28, have: 27 })
    );
}

#[test]
fn atomic_ack_eth_layout_and_round_trip() {
    let a = AtomicAckEth {
        orig: 0xDEAD_BEEF_0000_0001,
    };
    let mut out = [0u8; AtomicAckEth::LEN];
    a.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("de ad be ef 00 00 00 01"));
    assert_eq!(AtomicAckEth::parse(&out).unwrap(), a);
    assert_eq!(
        AtomicAckEth::parse(&[]),
        Err(WireError::Truncated { need: 8, have: 0 })
    );
}

#[test]
fn aeth_layout_and_round_trip() {
    let a = Aeth {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: 0x0100_0005, // masked to 0x000005
    };
    let mut out = [0u8; Aeth::LEN];
    a.emit(&mut out).unwrap();
    assert_eq!(out.to_vec(), hex("1f 00 00 05"));
    assert_eq!(
        Aeth::parse(&out).unwrap(),
        Aeth {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn: 5
        }
    );
    let nak = Aeth::parse(&hex("60 ab cd ef")).unwrap();
    assert_eq!(nak.syndrome, AethSyndrome::Nak(NakCode::PsnSequenceError));
    assert_eq!(nak.msn, 0xABCDEF);
    assert_eq!(
        Aeth::parse(&[0x1f, 0, 0]),
        Err(WireError::Truncated { need: 4, have: 3 })
    );
}

#[test]
fn aeth_syndrome_decoding() {
    assert_eq!(
        AethSyndrome::from_u8(0x1F),
        AethSyndrome::Ack { credits: 31 }
    );
    assert_eq!(
        AethSyndrome::from_u8(0x00),
        AethSyndrome::Ack { credits: 0 }
    );
    assert_eq!(
        AethSyndrome::from_u8(0x20 | 12),
        AethSyndrome::RnrNak { timer: 12 }
    );
    let naks = [
        (0x60, NakCode::PsnSequenceError),
        (0x61, NakCode::InvalidRequest),
        (0x62, NakCode::RemoteAccessError),
        (0x63, NakCode::RemoteOperationalError),
        (0x64, NakCode::InvalidRdRequest),
        (0x65, NakCode::Unknown(5)),
        (0x7F, NakCode::Unknown(31)),
    ];
    for (b, code) in naks {
        assert_eq!(AethSyndrome::from_u8(b), AethSyndrome::Nak(code), "{b:#x}");
        assert_eq!(NakCode::from_u8(b & 0x1F), code);
        assert_eq!(NakCode::from_u8(b).to_u8(), b & 0x1F);
    }
    // Kind bits 10 and anything with bit 7 set are reserved.
    assert_eq!(AethSyndrome::from_u8(0x40), AethSyndrome::Reserved(0x40));
    assert_eq!(AethSyndrome::from_u8(0x9F), AethSyndrome::Reserved(0x9F));
    assert_eq!(AethSyndrome::from_u8(0xE0), AethSyndrome::Reserved(0xE0));
    assert!(AethSyndrome::from_u8(0x1F).is_ack());
    assert!(!AethSyndrome::from_u8(0x60).is_ack());
}

#[test]
fn aeth_syndrome_round_trips_all_256_values() {
    for b in 0..=u8::MAX {
        let s = AethSyndrome::from_u8(b);
        assert_eq!(s.to_u8(), b, "syndrome {b:#04x} decoded as {s:?}");
        let mut out = [0u8; 4];
        Aeth {
            syndrome: s,
            msn: 9,
        }
        .emit(&mut out)
        .unwrap();
        assert_eq!(Aeth::parse(&out).unwrap().syndrome, s);
    }
}

#[test]
fn aeth_syndrome_encoding_masks_codes() {
    assert_eq!(AethSyndrome::Ack { credits: 0xFF }.to_u8(), 0x1F);
    assert_eq!(AethSyndrome::RnrNak { timer: 0x2C }.to_u8(), 0x2C);
    assert_eq!(AethSyndrome::Nak(NakCode::Unknown(0x25)).to_u8(), 0x65);
}

#[test]
fn syndrome_and_nak_display() {
    assert_eq!(AethSyndrome::from_u8(0x1F).to_string(), "ACK");
    assert_eq!(AethSyndrome::from_u8(0x03).to_string(), "ACK credits=3");
    assert_eq!(AethSyndrome::from_u8(0x2C).to_string(), "RNR NAK timer=12");
    assert_eq!(
        AethSyndrome::from_u8(0x60).to_string(),
        "NAK(PSN sequence error)"
    );
    assert_eq!(
        AethSyndrome::from_u8(0x62).to_string(),
        "NAK(remote access error)"
    );
    assert_eq!(AethSyndrome::from_u8(0x6A).to_string(), "NAK(code 10)");
    assert_eq!(AethSyndrome::from_u8(0x40).to_string(), "RESERVED(0x40)");
}

#[test]
fn credit_and_rnr_tables() {
    assert_eq!(credit_count(0), Some(0));
    assert_eq!(credit_count(5), Some(6));
    assert_eq!(credit_count(13), Some(96));
    assert_eq!(credit_count(30), Some(32768));
    assert_eq!(credit_count(31), None);
    assert_eq!(credit_count(200), None);
    assert_eq!(rnr_timer_duration(0), Duration::from_micros(655_360));
    assert_eq!(rnr_timer_duration(1), Duration::from_micros(10));
    assert_eq!(rnr_timer_duration(12), Duration::from_micros(640));
    assert_eq!(rnr_timer_duration(25), Duration::from_micros(61_440));
    assert_eq!(rnr_timer_duration(31), Duration::from_micros(491_520));
}

#[test]
fn pad_len_values() {
    let got: Vec<u8> = (0..9).map(pad_len).collect();
    assert_eq!(got, vec![0, 3, 2, 1, 0, 3, 2, 1, 0]);
}

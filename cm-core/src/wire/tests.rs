//! Codec tests: every message round-trips, sits at the offsets of `ibta_vol1_c12.h`, and malformed
//! MADs give typed errors.

use super::*;
use portverbs_hal::Gid;

fn gid(last: u8) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, last]);
    Gid(g)
}

fn filled<const N: usize>(seed: u8) -> [u8; N] {
    let mut a = [0u8; N];
    for (i, b) in a.iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    a
}

pub(crate) fn sample_req() -> Req {
    Req {
        local_comm_id: 0x1122_3344,
        vendor_id: 0x00ab_cdef,
        service_id: 0x0000_0000_0106_1d2f,
        local_ca_guid: 0x0202_03ff_fe04_0506,
        local_qkey: 0x8001_0000,
        local_qpn: 0x00_0011,
        responder_resources: 4,
        local_eecn: 0x12_3456,
        initiator_depth: 3,
        remote_eecn: 0x65_4321,
        remote_cm_response_timeout: 20,
        transport: 1,
        end_to_end_flow_control: true,
        starting_psn: 0xab_cdef,
        local_cm_response_timeout: 19,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: true,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        srq: true,
        extended_transport: 5,
        primary: ReqPath {
            local_lid: 0xffff,
            remote_lid: 0xfffe,
            local_gid: gid(1),
            remote_gid: gid(2),
            flow_label: 0xabcde,
            packet_rate: 0x2a,
            traffic_class: 0x10,
            hop_limit: 64,
            sl: 9,
            subnet_local: true,
            local_ack_timeout: 17,
        },
        alternate: ReqPath {
            local_lid: 1,
            remote_lid: 2,
            local_gid: gid(3),
            remote_gid: gid(4),
            flow_label: 0x12345,
            packet_rate: 3,
            traffic_class: 4,
            hop_limit: 5,
            sl: 6,
            subnet_local: false,
            local_ack_timeout: 31,
        },
        sap_supported: true,
        private_data: filled(7),
    }
}

fn samples() -> Vec<CmMessage> {
    vec![
        CmMessage::Req(sample_req()),
        CmMessage::Mra(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            msg_mraed: MsgKind::Rep,
            service_timeout: 24,
            private_data: filled(1),
        }),
        CmMessage::Rej(Rej {
            local_comm_id: 3,
            remote_comm_id: 4,
            msg_rejected: MsgKind::Other,
            ari_len: 8,
            reason: RejReason::Timeout,
            ari: filled(2),
            private_data: filled(3),
        }),
        CmMessage::Rep(Rep {
            local_comm_id: 5,
            remote_comm_id: 6,
            local_qkey: 7,
            local_qpn: 0xfe_dcba,
            local_eecn: 0x11_2233,
            starting_psn: 0x44_5566,
            vendor_id: 0x77_8899,
            responder_resources: 16,
            initiator_depth: 8,
            target_ack_delay: 15,
            failover_accepted: 2,
            end_to_end_flow_control: true,
            rnr_retry_count: 5,
            srq: true,
            local_ca_guid: 0x0102_0304_0506_0708,
            private_data: filled(4),
        }),
        CmMessage::Rtu(Rtu {
            local_comm_id: 9,
            remote_comm_id: 10,
            private_data: filled(5),
        }),
        CmMessage::Dreq(Dreq {
            local_comm_id: 11,
            remote_comm_id: 12,
            remote_qpn: 0x12_3456,
            private_data: filled(6),
        }),
        CmMessage::Drep(Drep {
            local_comm_id: 13,
            remote_comm_id: 14,
            private_data: filled(7),
        }),
        CmMessage::SidrReq(SidrReq {
            request_id: 15,
            pkey: 0x7fff,
            service_id: 0x0000_0000_0111_1234,
            private_data: filled(8),
        }),
        CmMessage::SidrRep(SidrRep {
            request_id: 16,
            status: SidrStatus::Other(9),
            info_len: 72,
            vendor_id: 0xab_cdef,
            qpn: 0x00_0042,
            service_id: 0x0000_0000_0111_1234,
            qkey: 0x0123_4567,
            info: filled(9),
            private_data: filled(10),
        }),
        CmMessage::AltPath {
            attr: AttrId::Lap,
            local_comm_id: 17,
            remote_comm_id: 18,
        },
    ]
}

#[test]
fn every_message_round_trips() {
    for msg in samples() {
        let mad = Mad {
            tid: 0x0000_0001_1122_3344,
            attr_mod: 0x55,
            msg,
        };
        let bytes = mad.emit();
        assert_eq!(Mad::parse(&bytes), Ok(mad.clone()), "{:?}", mad.msg.attr());
        // The emitted bytes are canonical: emitting the parsed MAD gives them again.
        assert_eq!(Mad::parse(&bytes).map(|m| m.emit()), Ok(bytes));
    }
}

#[test]
fn header_bytes_are_a_cm_send() {
    let bytes = Mad::new(0x0102_0304_0506_0708, CmMessage::Req(sample_req())).emit();
    assert_eq!(&bytes[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&bytes[4..8], &[0; 4]);
    assert_eq!(&bytes[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&bytes[16..18], &[0x00, 0x10]);
    let view = MadView::new_checked(&bytes).expect("256 bytes");
    assert_eq!(view.header().check_cm(), Ok(AttrId::Req));
}

#[test]
fn req_fields_sit_at_the_documented_offsets() {
    let b = Mad::new(0, CmMessage::Req(sample_req())).emit();
    let p = &b[MAD_HEADER_LEN..];
    assert_eq!(&p[0..4], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&p[5..8], &[0xab, 0xcd, 0xef], "ECE vendor ID");
    assert_eq!(
        &p[8..16],
        &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f],
        "service ID"
    );
    assert_eq!(&p[32..36], &[0, 0, 0x11, 4], "QPN then responder resources");
    assert_eq!(p[39], 3, "initiator depth");
    // 20 << 3 | RC/UC 1 << 1 | EE flow control.
    assert_eq!(p[43], (20 << 3) | (1 << 1) | 1);
    assert_eq!(&p[44..47], &[0xab, 0xcd, 0xef]);
    assert_eq!(p[47], (19 << 3) | 7);
    assert_eq!(&p[48..50], &[0xff, 0xff]);
    assert_eq!(p[50], (3 << 4) | 0x08 | 6);
    assert_eq!(p[51], (15 << 4) | 0x08 | 5);
    assert_eq!(&p[52..56], &[0xff, 0xff, 0xff, 0xfe]);
    assert_eq!(&p[56 + 12..72], &[10, 0, 0, 1], "primary local GID");
    assert_eq!(&p[72 + 12..88], &[10, 0, 0, 2], "primary remote GID");
    // Flow label 0xABCDE in bits 31..12 of the word at 88, packet rate in byte 91.
    assert_eq!(&p[88..92], &[0xab, 0xcd, 0xe0, 0x2a]);
    assert_eq!(&p[92..96], &[0x10, 64, (9 << 4) | 0x08, 17 << 3]);
    assert_eq!(p[139], (31 << 3) | 0x04, "alternate ACK timeout and SAP");
    assert_eq!(&p[140..143], &[7, 8, 9], "private data");
}

#[test]
fn other_messages_sit_at_the_documented_offsets() {
    let s = samples();
    let payload = |m: &CmMessage| Mad::new(0, m.clone()).emit()[MAD_HEADER_LEN..].to_vec();
    let mra = payload(&s[1]);
    assert_eq!(&mra[..10], &[0, 0, 0, 1, 0, 0, 0, 2, 1 << 6, 24 << 3]);
    let rej = payload(&s[2]);
    assert_eq!(&rej[8..12], &[2 << 6, 8 << 1, 0, 4]);
    assert_eq!(rej[12], 2, "ARI");
    assert_eq!(rej[84], 3, "private data");
    let rep = payload(&s[3]);
    assert_eq!(
        &rep[12..24],
        &[
            0xfe, 0xdc, 0xba, 0x77, 0x11, 0x22, 0x33, 0x88, 0x44, 0x55, 0x66, 0x99
        ]
    );
    assert_eq!(
        &rep[24..28],
        &[16, 8, (15 << 3) | (2 << 1) | 1, (5 << 5) | 0x10]
    );
    assert_eq!(&rep[28..36], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let dreq = payload(&s[5]);
    assert_eq!(&dreq[8..12], &[0x12, 0x34, 0x56, 0]);
    let sidr_req = payload(&s[7]);
    assert_eq!(&sidr_req[4..8], &[0x7f, 0xff, 0, 0]);
    let sidr_rep = payload(&s[8]);
    assert_eq!(&sidr_rep[4..12], &[9, 72, 0xab, 0xcd, 0, 0, 0x42, 0xef]);
    assert_eq!(&sidr_rep[20..24], &[0x01, 0x23, 0x45, 0x67]);
}

#[test]
fn wide_values_are_masked_on_emit() {
    let mut req = sample_req();
    req.local_qpn = 0xff12_3456;
    req.remote_cm_response_timeout = 0xff;
    req.primary.flow_label = 0xfff_ffff;
    let parsed = Mad::parse(&Mad::new(0, CmMessage::Req(req)).emit()).expect("parses");
    let CmMessage::Req(r) = parsed.msg else {
        panic!("a REQ comes back as a REQ");
    };
    assert_eq!(r.local_qpn, 0x12_3456);
    assert_eq!(r.remote_cm_response_timeout, 31);
    assert_eq!(r.primary.flow_label, 0xf_ffff);
    assert_eq!(r.transport, 1, "the neighbouring bits are untouched");
}

fn good() -> [u8; MAD_LEN] {
    Mad::new(1, CmMessage::Req(sample_req())).emit()
}

#[test]
fn malformed_mads_give_typed_errors() {
    assert_eq!(
        Mad::parse(&good()[..255]),
        Err(MadError::Length { len: 255 })
    );
    assert_eq!(Mad::parse(&[0; 257]), Err(MadError::Length { len: 257 }));
    assert_eq!(Mad::parse(&[]), Err(MadError::Length { len: 0 }));
    let cases: [(usize, u8, MadError); 5] = [
        (0, 2, MadError::BaseVersion(2)),
        (1, 0x04, MadError::NotCm(0x04)),
        (2, 1, MadError::ClassVersion(1)),
        (3, 0x83, MadError::Method(0x83)),
        (3, 0x01, MadError::Method(0x01)),
    ];
    for (at, value, err) in cases {
        let mut b = good();
        b[at] = value;
        assert_eq!(Mad::parse(&b), Err(err));
    }
    let mut b = good();
    b[16..18].copy_from_slice(&[0, 1]);
    assert_eq!(
        Mad::parse(&b),
        Err(MadError::Attribute(0x0001)),
        "ClassPortInfo"
    );
    b[16..18].copy_from_slice(&[0, 0x1b]);
    assert_eq!(Mad::parse(&b), Err(MadError::Attribute(0x001b)));
}

#[test]
fn oversized_lengths_in_rej_and_sidr_rep_are_errors() {
    let s = samples();
    let mut rej = Mad::new(0, s[2].clone()).emit();
    rej[MAD_HEADER_LEN + 9] = 73 << 1;
    assert_eq!(Mad::parse(&rej), Err(MadError::AriLength(73)));
    let mut rep = Mad::new(0, s[8].clone()).emit();
    rep[MAD_HEADER_LEN + 5] = 200;
    assert_eq!(Mad::parse(&rep), Err(MadError::InfoLength(200)));
}

#[test]
fn unknown_codes_are_preserved() {
    for v in 0..=u16::MAX {
        assert_eq!(RejReason::from_u16(v).to_u16(), v);
    }
    for v in 0..=u8::MAX {
        assert_eq!(SidrStatus::from_u8(v).to_u8(), v);
        assert_eq!(MsgKind::from_bits(v & 3).to_bits(), v & 3);
    }
    for v in 0..0x40 {
        if let Some(a) = AttrId::from_u16(v) {
            assert_eq!(a.to_u16(), v);
        }
    }
}

//! perftest's messages against the bytes its format strings and structs give, their round
//! trips and refusals, and the exchanges over real sockets.

use std::io::{Read as _, Write as _};

use portverbs_hal::Gid;
use proptest::prelude::*;

use super::*;
use crate::oob::{Role, socket_pair};

const V4_GID: Gid = Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]);

fn dest(gid: Option<Gid>) -> Dest {
    Dest {
        lid: 0x1,
        out_reads: 0x10,
        qpn: 0x11,
        psn: 0xab_cdef,
        rkey: 0x1234,
        vaddr: 0x7f00_dead_beef,
        gid,
        srqn: 0,
    }
}

/// The bytes `sprintf(msg, KEY_PRINT_FMT, …)` writes into its 59-byte buffer.
#[test]
fn text_without_gid_is_byte_exact() {
    let msg = dest(None).encode_text();
    let want = b"0001:0010:000011:abcdef:00001234:00007f00deadbeef:00000000\0";
    assert_eq!(msg.len(), TEXT_LEN);
    assert_eq!(&msg[..], &want[..]);
    assert_eq!(Dest::decode_text(&msg, false), Ok(dest(None)));
}

/// The bytes of `KEY_PRINT_FMT_GID` for the RoCE GID of 10.0.0.2.
#[test]
fn text_with_gid_is_byte_exact() {
    let msg = dest(Some(V4_GID)).encode_text();
    let want = b"0001:0010:000011:abcdef:00001234:00007f00deadbeef:\
                 00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02:00000000:\0";
    assert_eq!(msg.len(), TEXT_LEN_GID);
    assert_eq!(&msg[..], &want[..]);
    assert_eq!(Dest::decode_text(&msg, true), Ok(dest(Some(V4_GID))));
}

#[test]
fn bad_text_is_a_typed_error() {
    let msg = dest(None).encode_text();
    // Read in the other form.
    assert!(matches!(
        Dest::decode_text(&msg, true),
        Err(DecodeError::Fields { want: 23, found: 7 })
    ));
    let cases: [(&[u8], bool, DecodeError); 7] = [
        (
            b"0001:0010:1000000:0:0:0:0\0",
            false,
            DecodeError::Field("QPN"),
        ),
        (b"0001:zz:1:0:0:0:0", false, DecodeError::Field("OUT_READS")),
        (b"0001:0010:1:0:0:0:", false, DecodeError::Field("SRQN")),
        (b"", false, DecodeError::Fields { want: 7, found: 1 }),
        (b"", true, DecodeError::Fields { want: 23, found: 0 }),
        (
            b"1:1:1:1:1:1:1:1",
            false,
            DecodeError::Fields { want: 7, found: 8 },
        ),
        (
            &[0xff; 20],
            false,
            DecodeError::Fields { want: 7, found: 1 },
        ),
    ];
    for (msg, with_gid, want) in cases {
        assert_eq!(Dest::decode_text(msg, with_gid), Err(want), "{msg:?}");
    }
    // Cut short: fewer fields.
    let msg = dest(Some(V4_GID)).encode_text();
    assert!(matches!(
        Dest::decode_text(&msg[..60], true),
        Err(DecodeError::Fields { want: 23, .. })
    ));
    assert_eq!(
        Dest::decode_text(&[b'1'; TEXT_LEN + 1], false),
        Err(DecodeError::TextLength { max: 59, found: 60 })
    );
    // Many separators cost nothing and are counted.
    let colons = [b':'; TEXT_LEN_GID];
    assert_eq!(
        Dest::decode_text(&colons, true),
        Err(DecodeError::Fields {
            want: 23,
            found: 108
        })
    );
}

/// The binary destination as perftest's struct lies in memory, big-endian.
#[test]
fn binary_is_perftests_struct() {
    let d = Dest {
        lid: 0x1234,
        out_reads: 16,
        qpn: 0x00ab_cdef,
        psn: 0x0012_3456,
        rkey: 0xdead_beef,
        vaddr: 0x0102_0304_0506_0708,
        gid: Some(Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1,
        ])),
        srqn: 7,
    };
    let m = d.encode_binary(3, BinaryForm::Plain);
    assert_eq!(m.len(), 56);
    assert_eq!(m[0..4], [0, 0, 0x12, 0x34]);
    assert_eq!(m[4..8], [0, 0, 0, 16]);
    assert_eq!(m[8..12], [0, 0xab, 0xcd, 0xef]);
    assert_eq!(m[12..16], [0, 0x12, 0x34, 0x56]);
    assert_eq!(m[16..20], [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(m[20..24], [0; 4], "padding before the 8-byte vaddr");
    assert_eq!(m[24..32], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(m[42..48], [0xff, 0xff, 10, 77, 0, 1]);
    assert_eq!(m[48..52], [0, 0, 0, 7]);
    assert_eq!(m[52..56], [0, 0, 0, 3]);
    assert_eq!(Dest::decode_binary(&m), Ok(d));

    let m = d.encode_binary(3, BinaryForm::TailMarkers);
    assert_eq!(m.len(), 64);
    assert_eq!(m[32..40], [0; 8], "tail_markers_vaddr");
    assert_eq!(m[50..56], [0xff, 0xff, 10, 77, 0, 1]);
    assert_eq!(m[60..64], [0, 0, 0, 3]);
    assert_eq!(Dest::decode_binary(&m), Ok(d));
    assert_eq!(BinaryForm::for_version(6.10), BinaryForm::Plain);
    assert_eq!(BinaryForm::for_version(6.29), BinaryForm::TailMarkers);
    // No GID goes as zeros, and comes back as the zero GID.
    let none = Dest { gid: None, ..d }.encode_binary(0, BinaryForm::Plain);
    assert_eq!(Dest::decode_binary(&none).unwrap().gid, Some(Gid::ZERO));
}

#[test]
fn bad_binary_is_a_typed_error() {
    for n in [0, 55, 57, 63, 65, 108] {
        let e = Dest::decode_binary(&vec![0u8; n]).unwrap_err();
        assert_eq!(e, DecodeError::BinaryLength(n));
        assert_eq!(
            e.to_string(),
            format!(
                "the peer's destination has {n} bytes; perftest's has 56 (or 64 from version 6.28)"
            )
        );
    }
    let mut m = Dest::default().encode_binary(0, BinaryForm::Plain);
    m[0..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    let e = Dest::decode_binary(&m).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Wide {
            field: "LID",
            value: 65536
        }
    );
    assert_eq!(
        e.to_string(),
        "the peer's destination has LID 65536, above 65535"
    );
}

#[test]
fn versions() {
    let msg = version_msg(PROTOCOL_VERSION);
    assert_eq!(&msg, b"6.10\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(parse_version(&msg), Ok(6.10));
    assert_eq!(parse_version(b"6.29\0garbage\0\0\0\0"), Ok(6.29));
    assert_eq!(parse_version(b" 5.70-beta\0"), Ok(5.70));
    assert_eq!(
        parse_version(b"\0"),
        Err(DecodeError::Version(String::new()))
    );
    assert_eq!(
        parse_version(b"x6\0"),
        Err(DecodeError::Version("x6".into()))
    );
    assert_eq!(version_msg("0123456789abcdefgh")[15], 0);
    // Only the message's 16 bytes are read.
    let long = [b'7'; 40];
    assert_eq!(
        parse_version(&long),
        Ok("7".repeat(16).parse::<f64>().unwrap())
    );
}

#[test]
fn integers_and_mtu() {
    assert_eq!(int_msg(4096), [0, 0, 0x10, 0]);
    assert_eq!(parse_int(int_msg(-2)), -2);
    assert_eq!(mtu_msg(3), *b"3\0");
    assert_eq!(parse_mtu(*b"5\0"), Ok(5));
    assert_eq!(parse_mtu(*b"0\0"), Err(DecodeError::Mtu("0".into())));
    assert_eq!(parse_mtu(*b"\0\0"), Err(DecodeError::Mtu(String::new())));
    assert_eq!(parse_mtu(*b"6x"), Err(DecodeError::Mtu("6x".into())));
}

#[test]
fn bw_reports_are_big_endian() {
    let r = BwReport {
        size: 65536,
        iters: 5000,
        bw_peak: 1.5,
        bw_avg: 1.25,
        msg_rate: 0.02,
    };
    let m = r.messages();
    assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
    assert_eq!(m[1], [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
    // 1.5 = 0x3FF8_0000_0000_0000.
    assert_eq!(m[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    assert_eq!(BwReport::from_messages(&m), r);
}

fn any_dest(gid: bool) -> impl Strategy<Value = Dest> {
    (
        (
            any::<u16>(),
            any::<u16>(),
            0..=0xff_ffffu32,
            0..=0xff_ffffu32,
        ),
        (any::<u32>(), any::<u64>(), any::<[u8; 16]>(), any::<u32>()),
    )
        .prop_map(
            move |((lid, out_reads, qpn, psn), (rkey, vaddr, g, srqn))| Dest {
                lid,
                out_reads,
                qpn,
                psn,
                rkey,
                vaddr,
                gid: gid.then_some(Gid(g)),
                srqn,
            },
        )
}

proptest! {
    #[test]
    fn text_round_trips(d in any::<bool>().prop_flat_map(any_dest)) {
        let with_gid = d.gid.is_some();
        let msg = d.encode_text();
        prop_assert_eq!(msg.len(), Dest::text_len(with_gid));
        prop_assert_eq!(Dest::decode_text(&msg, with_gid), Ok(d));
    }

    #[test]
    fn binary_round_trips(d in any_dest(true), index: u32, tail: bool) {
        let form = if tail { BinaryForm::TailMarkers } else { BinaryForm::Plain };
        let msg = d.encode_binary(index, form);
        prop_assert_eq!(msg.len(), form.size());
        prop_assert_eq!(Dest::decode_binary(&msg), Ok(d));
    }

    #[test]
    fn reports_round_trip(size: u64, iters: u64, peak in -1e300..1e300f64, avg: u32, rate: u16) {
        let r = BwReport { size, iters, bw_peak: peak, bw_avg: f64::from(avg), msg_rate: f64::from(rate) };
        prop_assert_eq!(BwReport::from_messages(&r.messages()), r);
    }

    #[test]
    fn small_messages_round_trip(v in 0u16..10_000, n: i32, mtu in 1u8..=5) {
        let text = format!("{}.{:02}", v / 100, v % 100);
        let parsed = parse_version(&version_msg(&text)).unwrap();
        prop_assert!((parsed - text.parse::<f64>().unwrap()).abs() < 1e-9);
        prop_assert_eq!(parse_int(int_msg(n)), n);
        prop_assert_eq!(parse_mtu(mtu_msg(mtu)), Ok(mtu));
    }

    /// Whatever a peer sends, reading it answers without panicking; what parses formats back
    /// into a message that parses the same.
    #[test]
    fn any_bytes_are_read_or_refused(
        msg in proptest::collection::vec(
            prop_oneof![Just(b':'), Just(0u8), Just(0xffu8), b'0'..=b'9', b'a'..=b'g'],
            0..130,
        ),
    ) {
        for with_gid in [false, true] {
            if let Ok(d) = Dest::decode_text(&msg, with_gid) {
                prop_assert_eq!(Dest::decode_text(&d.encode_text(), with_gid), Ok(d));
            }
        }
        if let Ok(d) = Dest::decode_binary(&msg) {
            let form = BinaryForm::of_size(msg.len()).unwrap();
            prop_assert_eq!(Dest::decode_binary(&d.encode_binary(0, form)), Ok(d));
        }
        let _ = parse_version(&msg);
        let _ = parse_mtu([msg.first().copied().unwrap_or(0), msg.get(1).copied().unwrap_or(0)]);
    }
}

/// Negotiation, two hand shakes, the reports and the close, both sides of ours; the bytes the
/// client sent are perftest's, in its order.
#[test]
fn a_whole_exchange_between_two_stream_sides() {
    let (c, s) = socket_pair();
    let (c_dest, s_dest) = (
        dest(Some(V4_GID)),
        Dest {
            qpn: 0x22,
            ..dest(Some(V4_GID))
        },
    );
    let server = std::thread::spawn(move || {
        let mut x = StreamExchange::new(s, Role::Server);
        let params = negotiate(&mut x, 3).unwrap();
        let theirs = hand_shake(&mut x, &s_dest).unwrap();
        let report = bw_reports(&mut x, &BwReport::default()).unwrap();
        let mut s = x.close(&s_dest).unwrap();
        let mut done = [0u8; 5];
        s.read_exact(&mut done).unwrap();
        (params, theirs, report, done)
    });
    let mut x = StreamExchange::new(&c, Role::Client);
    let params = negotiate(&mut x, 5).unwrap();
    assert_eq!(
        params,
        PeerParams {
            version: 6.10,
            cycle_buffer: 4096,
            mtu_enum: 3
        }
    );
    assert_eq!(hand_shake(&mut x, &c_dest).unwrap(), s_dest);
    let mine = BwReport {
        size: 8,
        iters: 9,
        bw_peak: 1.0,
        bw_avg: 0.5,
        msg_rate: 0.25,
    };
    assert_eq!(bw_reports(&mut x, &mine).unwrap(), BwReport::default());
    x.close(&c_dest).unwrap();
    let mut done = [0u8; 5];
    (&c).read_exact(&mut done).unwrap();
    assert_eq!(&done, DONE);
    let (params, theirs, report, done) = server.join().unwrap();
    assert_eq!(params.mtu_enum, 3);
    assert_eq!(theirs, c_dest);
    assert_eq!(report, mine);
    assert_eq!(&done, DONE);
}

/// A peer of another version, or none at all.
#[test]
fn a_peer_that_is_not_perftest_or_too_old_is_refused() {
    for (version, want) in [
        (
            "5.60",
            "the peer speaks perftest version 5.6; versions older than 5.7 are not supported",
        ),
        (
            "nope",
            "the peer's version message is not perftest's: 'nope' is not a perftest version",
        ),
    ] {
        let (c, mut s) = socket_pair();
        let peer = std::thread::spawn(move || {
            let mut v = [0u8; VERSION_LEN];
            s.read_exact(&mut v).unwrap();
            s.write_all(&version_msg(version)).unwrap();
        });
        let e = negotiate(&mut StreamExchange::new(&c, Role::Client), 5).unwrap_err();
        assert_eq!(e.to_string(), want);
        peer.join().unwrap();
    }
    // A peer that hangs up in the middle of a destination.
    let (c, mut s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut v = [0u8; TEXT_LEN];
        s.read_exact(&mut v).unwrap();
        s.write_all(&dest(None).encode_text()[..30]).unwrap();
    });
    let e = hand_shake(&mut StreamExchange::new(&c, Role::Client), &dest(None)).unwrap_err();
    assert!(
        matches!(&e, ExchangeError::Transport(io) if io.kind() == std::io::ErrorKind::UnexpectedEof),
        "{e}"
    );
    peer.join().unwrap();
    // A peer whose destination is garbage.
    let (c, mut s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut v = [0u8; TEXT_LEN];
        s.read_exact(&mut v).unwrap();
        s.write_all(&[b'q'; TEXT_LEN]).unwrap();
    });
    let e = hand_shake(&mut StreamExchange::new(&c, Role::Client), &dest(None)).unwrap_err();
    assert!(
        matches!(
            &e,
            ExchangeError::Destination {
                error: DecodeError::Fields { want: 7, found: 1 },
                ..
            }
        ),
        "{e}"
    );
    peer.join().unwrap();
}

/// A transport of one's own: here a script of the peer's messages.
#[test]
fn a_transport_of_ones_own() {
    struct Script(Vec<(Step, Vec<u8>)>);
    impl Exchange for Script {
        type Error = String;
        fn exchange(&mut self, step: Step, _: &[u8], theirs: &mut [u8]) -> Result<(), String> {
            let (want, msg) = self.0.remove(0);
            assert_eq!(step, want);
            let part = msg.get(..theirs.len()).ok_or(format!("short {step}"))?;
            theirs.copy_from_slice(part);
            Ok(())
        }
    }
    let mut x = Script(vec![
        (Step::Version, version_msg("6.29").to_vec()),
        (Step::CycleBuffer, int_msg(1 << 30).to_vec()),
        (Step::CacheLine, int_msg(128).to_vec()),
        (Step::Mtu, b"9\0".to_vec()),
        (Step::Destination, vec![b'0'; 4]),
    ]);
    let params = negotiate(&mut x, 4).unwrap();
    // The cycle buffer at most 16 MiB; a bad MTU leaves ours.
    assert_eq!(
        params,
        PeerParams {
            version: 6.29,
            cycle_buffer: 1 << 24,
            mtu_enum: 4
        }
    );
    let e = hand_shake(&mut x, &dest(None)).unwrap_err();
    assert_eq!(e.to_string(), "short destination");
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn the_async_exchange_is_the_same() {
    let (c, s) = tokio::io::duplex(1024);
    let c_dest = dest(Some(V4_GID));
    let server = tokio::spawn(async move {
        let mut x = AsyncStreamExchange::new(s, Role::Server);
        let params = x.negotiate(2).await.unwrap();
        let theirs = x.hand_shake(&dest(Some(Gid::ZERO))).await.unwrap();
        let report = x.bw_reports(&BwReport::default()).await.unwrap();
        // Each side writes `done` last: the stream stays open until both have.
        let stream = x.close(&dest(Some(Gid::ZERO))).await.unwrap();
        (params, theirs, report, stream)
    });
    let mut x = AsyncStreamExchange::new(c, Role::Client);
    assert_eq!(x.negotiate(5).await.unwrap().mtu_enum, 2);
    assert_eq!(x.hand_shake(&c_dest).await.unwrap(), dest(Some(Gid::ZERO)));
    let mine = BwReport {
        size: 1,
        ..BwReport::default()
    };
    x.bw_reports(&mine).await.unwrap();
    let _stream = x.close(&c_dest).await.unwrap();
    let (params, theirs, report, _) = server.await.unwrap();
    assert_eq!(params.mtu_enum, 2);
    assert_eq!(theirs, c_dest);
    assert_eq!(report, mine);
}

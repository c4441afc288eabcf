//! The pingpong message against what the C tools' format strings give for the same values,
//! its round trips, its refusals, and the exchange over real sockets.

use proptest::prelude::*;

use super::*;
use crate::oob::socket_pair;

fn gid(hex: &str) -> Gid {
    Gid::from_wire_hex(hex).unwrap()
}

fn ep(lid: u16, qpn: u32, psn: u32, gid: Gid) -> QpEndpoint {
    QpEndpoint { lid, qpn, psn, gid }
}

#[test]
fn the_message_is_the_c_tools() {
    let e = ep(
        0x1a,
        0x2b3c,
        0xab_cdef,
        gid("fe800000000000000202c9fffe0a0b0c"),
    );
    let text = format(&e);
    assert_eq!(text, "001a:002b3c:abcdef:fe800000000000000202c9fffe0a0b0c");
    let msg = encode(&e);
    assert_eq!(&msg[..51], text.as_bytes());
    assert_eq!(msg[51], 0);
    assert_eq!(decode(&msg), Ok(e));
    assert_eq!(parse(&text), Ok(e));
    // Upper-case digits and short fields are what `sscanf("%x")` accepts too.
    let loose = parse("1A:2B3C:ABCDEF:FE800000000000000202C9FFFE0A0B0C\n").unwrap();
    assert_eq!(loose, e);
    // Wider numbers are cut to their 24 bits: the message keeps its size.
    let wide = encode(&ep(1, 0x0100_0011, 0xff12_3456, Gid::ZERO));
    assert_eq!(decode(&wide), Ok(ep(1, 0x11, 0x12_3456, Gid::ZERO)));
}

#[test]
fn gid_bytes_keep_wire_order() {
    let e = parse("0000:000000:000000:000102030405060708090a0b0c0d0e0f").unwrap();
    assert_eq!(e.gid.0, std::array::from_fn(|i| i as u8));
}

#[test]
fn bad_and_short_messages_are_typed_errors() {
    let g = "00000000000000000000ffff0a000001";
    let cases: [(String, ParseError); 16] = [
        (String::new(), ParseError::FieldCount(1)),
        ("0001:000011:000022".into(), ParseError::FieldCount(3)),
        (
            format!("0001:000011:000022:{g}:x"),
            ParseError::FieldCount(5),
        ),
        (format!(":000011:000022:{g}"), ParseError::NotHex("LID")),
        (format!("00g1:000011:000022:{g}"), ParseError::NotHex("LID")),
        (format!("0001:-00011:000022:{g}"), ParseError::NotHex("QPN")),
        (format!("0001:000011:0x0022:{g}"), ParseError::NotHex("PSN")),
        (format!("0001:000011: 00022:{g}"), ParseError::NotHex("PSN")),
        (
            format!("10000:000011:000022:{g}"),
            ParseError::OutOfRange("LID"),
        ),
        (
            format!("0001:1000000:000022:{g}"),
            ParseError::OutOfRange("QPN"),
        ),
        (
            format!("0001:000011:123456789:{g}"),
            ParseError::OutOfRange("PSN"),
        ),
        ("0001:000011:000022:abcd".into(), ParseError::GidLength(4)),
        ("0001:000011:000022:".into(), ParseError::GidLength(0)),
        (
            "0001:000011:000022:0000000000000000000000000000000z".into(),
            ParseError::NotHex("GID"),
        ),
        // 32 bytes that are not 32 characters.
        (
            "0001:000011:000022:0ééééééééééééééé0".into(),
            ParseError::NotHex("GID"),
        ),
        (
            format!("0001:000011:000022:{g}\0x"),
            ParseError::GidLength(34),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse(&text), Err(want), "{text:?}");
    }
    // As bytes from the socket: cut short, too long, not UTF-8.
    let msg = encode(&ep(1, 2, 3, gid(g)));
    assert_eq!(decode(&msg[..20]), Err(ParseError::GidLength(1)));
    assert_eq!(decode(&msg[..10]), Err(ParseError::FieldCount(2)));
    assert_eq!(decode(&[0; MSG_LEN + 1]), Err(ParseError::TooLong(53)));
    let mut bad = msg;
    bad[0] = 0xff;
    assert_eq!(decode(&bad), Err(ParseError::NotHex("LID")));
    assert_eq!(
        ParseError::GidLength(4).to_string(),
        "GID must be 32 hex digits, found 4 characters"
    );
}

proptest! {
    #[test]
    fn endpoints_round_trip(lid: u16, qpn in 0..=MASK_24, psn in 0..=MASK_24, g: [u8; 16]) {
        let e = ep(lid, qpn, psn, Gid(g));
        prop_assert_eq!(decode(&encode(&e)), Ok(e));
        prop_assert_eq!(parse(&format(&e)), Ok(e));
    }

    /// Whatever arrives, decoding answers without panicking, and what it accepts encodes
    /// back into a message that decodes the same.
    #[test]
    fn any_bytes_decode_or_are_refused(msg in proptest::collection::vec(any::<u8>(), 0..80)) {
        if let Ok(e) = decode(&msg) {
            prop_assert_eq!(decode(&encode(&e)), Ok(e));
        }
    }

    /// The same over text made mostly of the message's own characters.
    #[test]
    fn near_messages_parse_or_are_refused(text in "[0-9a-fA-F:xz \\x00é-]{0,64}") {
        if let Ok(e) = parse(&text) {
            prop_assert_eq!(parse(&format(&e)), Ok(e));
        }
    }
}

#[test]
fn client_and_server_exchange_endpoints() {
    let (c, s) = socket_pair();
    let mine = ep(0, 0x11, 0x22, gid("00000000000000000000ffff0a000001"));
    let theirs = ep(0, 0x33, 0x44, gid("00000000000000000000ffff0a000002"));
    let server = std::thread::spawn(move || {
        serve(&s, |client: &QpEndpoint| {
            assert_eq!(*client, mine);
            Ok::<_, Infallible>(theirs)
        })
        .unwrap()
    });
    assert_eq!(client(&c, &mine).unwrap(), theirs);
    assert_eq!(server.join().unwrap(), mine);
}

/// What travels, byte for byte: the client's message, the server's, then `done`.
#[test]
fn the_bytes_on_the_wire() {
    let (c, mut s) = socket_pair();
    let mine = ep(1, 2, 3, Gid::ZERO);
    let peer = std::thread::spawn(move || {
        let mut got = [0u8; MSG_LEN];
        s.read_exact(&mut got).unwrap();
        s.write_all(&encode(&ep(4, 5, 6, Gid::ZERO))).unwrap();
        let mut done = [0u8; 5];
        s.read_exact(&mut done).unwrap();
        (got, done)
    });
    assert_eq!(client(&c, &mine).unwrap(), ep(4, 5, 6, Gid::ZERO));
    let (got, done) = peer.join().unwrap();
    assert_eq!(got, encode(&mine));
    assert_eq!(&done, DONE);
}

#[test]
fn a_peer_that_sends_garbage_or_hangs_up_is_a_typed_error() {
    let (c, mut s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut got = [0u8; MSG_LEN];
        s.read_exact(&mut got).unwrap();
        s.write_all(&[b'z'; MSG_LEN]).unwrap();
    });
    let e = client(&c, &ep(1, 2, 3, Gid::ZERO)).unwrap_err();
    assert!(
        matches!(&e, ExchangeError::Malformed { text, error: ParseError::FieldCount(1) }
            if text.len() == MSG_LEN),
        "{e}"
    );
    peer.join().unwrap();

    // A client that sends half a message and closes.
    let (c, s) = socket_pair();
    let peer = std::thread::spawn(move || {
        (&c).write_all(&encode(&QpEndpoint::default())[..30])
            .unwrap();
    });
    let e = serve(&s, |_: &QpEndpoint| {
        Ok::<_, Infallible>(QpEndpoint::default())
    })
    .unwrap_err();
    assert!(
        matches!(&e, ExchangeError::Io { stage: Stage::ReceiveEndpoint, source }
            if source.kind() == io::ErrorKind::UnexpectedEof),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("reading the remote address: "),
        "{e}"
    );
    peer.join().unwrap();
}

#[test]
fn the_servers_connect_error_comes_back() {
    let (c, s) = socket_pair();
    let peer = std::thread::spawn(move || client(&c, &QpEndpoint::default()));
    let e = serve(&s, |_: &QpEndpoint| Err::<QpEndpoint, _>("no QP")).unwrap_err();
    assert!(matches!(e, ExchangeError::Connect("no QP")), "{e}");
    drop(s);
    assert!(
        peer.join().unwrap().is_err(),
        "the client hears nothing back"
    );
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn the_async_exchange_is_the_same() {
    let (c, s) = tokio::io::duplex(256);
    let mine = ep(0, 0x11, 0x22, gid("fe800000000000000000000000000001"));
    let theirs = ep(0, 0x33, 0x44, gid("fe800000000000000000000000000002"));
    let server = tokio::spawn(async move {
        serve_async(s, |client| async move {
            assert_eq!(client, mine);
            Ok::<_, Infallible>(theirs)
        })
        .await
    });
    assert_eq!(client_async(c, &mine).await.unwrap(), theirs);
    assert_eq!(server.await.unwrap().unwrap(), mine);

    // A server that closes after half its answer.
    let (c, s) = tokio::io::duplex(256);
    let half = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = s;
        let mut got = [0u8; MSG_LEN];
        s.read_exact(&mut got).await.unwrap();
        s.write_all(&encode(&theirs)[..MSG_LEN / 2]).await.unwrap();
    });
    let e = client_async(c, &mine).await.unwrap_err();
    assert!(
        matches!(
            &e,
            ExchangeError::Io {
                stage: Stage::ReceiveEndpoint,
                ..
            }
        ),
        "{e}"
    );
    half.await.unwrap();
}

/// `srq_pingpong`'s exchange: every endpoint of each side (its QPs', then zero padding up to
/// [`SRQ_MESSAGES`]) travels as one message, the client's first, and `done` ends it.
#[test]
fn many_endpoints_each_way() {
    let pad = |eps: Vec<QpEndpoint>| {
        let mut eps = eps;
        eps.resize(SRQ_MESSAGES, QpEndpoint::default());
        eps
    };
    let g = gid("00000000000000000000ffff0a000001");
    let mine = pad((0..16).map(|i| ep(0, 0x100 + i, 0x200 + i, g)).collect());
    let theirs = pad((0..16).map(|i| ep(0, 0x300 + i, 0x400 + i, g)).collect());
    let (c, s) = socket_pair();
    let (want, answer) = (mine.clone(), theirs.clone());
    let server = std::thread::spawn(move || {
        serve_many(&s, SRQ_MESSAGES, |client: &[QpEndpoint]| {
            assert_eq!(client, &want[..]);
            Ok::<_, Infallible>(answer)
        })
        .unwrap()
    });
    assert_eq!(client_many(&c, &mine).unwrap(), theirs);
    assert_eq!(server.join().unwrap(), mine);

    // On the wire: the messages back to back, the padding as zero endpoints, then `done`.
    let (c, mut s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut got = vec![0u8; 3 * MSG_LEN];
        s.read_exact(&mut got).unwrap();
        for i in 0..3 {
            s.write_all(&encode(&ep(0, 0x20 + i, 0, Gid::ZERO)))
                .unwrap();
        }
        let mut done = [0u8; 5];
        s.read_exact(&mut done).unwrap();
        (got, done)
    });
    let sent = [ep(1, 2, 3, g), QpEndpoint::default(), QpEndpoint::default()];
    let back = client_many(&c, &sent).unwrap();
    assert_eq!(
        back.iter().map(|e| e.qpn).collect::<Vec<_>>(),
        [0x20, 0x21, 0x22]
    );
    let (got, done) = peer.join().unwrap();
    assert_eq!(&got[..MSG_LEN], &encode(&sent[0])[..]);
    assert_eq!(
        &got[MSG_LEN..2 * MSG_LEN],
        b"0000:000000:000000:00000000000000000000000000000000\0"
    );
    assert_eq!(&done, DONE);
}

/// A peer that stops in the middle of its list, or sends a bad one, is a typed error.
#[test]
fn a_short_or_bad_list_is_a_typed_error() {
    let (c, s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut msgs = encode_all(&[QpEndpoint::default(); 2]);
        msgs.extend_from_slice(&encode(&QpEndpoint::default())[..10]);
        (&c).write_all(&msgs).unwrap();
    });
    let e = serve_many(&s, 4, |_: &[QpEndpoint]| Ok::<_, Infallible>(Vec::new())).unwrap_err();
    assert!(
        matches!(&e, ExchangeError::Io { stage: Stage::ReceiveEndpoint, source }
            if source.kind() == io::ErrorKind::UnexpectedEof),
        "{e}"
    );
    peer.join().unwrap();

    let (c, mut s) = socket_pair();
    let peer = std::thread::spawn(move || {
        let mut got = [0u8; 2 * MSG_LEN];
        s.read_exact(&mut got).unwrap();
        s.write_all(&encode(&QpEndpoint::default())).unwrap();
        s.write_all(&[b'q'; MSG_LEN]).unwrap();
    });
    let e = client_many(&c, &[QpEndpoint::default(); 2]).unwrap_err();
    assert!(matches!(&e, ExchangeError::Malformed { .. }), "{e}");
    peer.join().unwrap();
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn the_async_exchange_of_many_is_the_same() {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let mine = vec![ep(0, 0x11, 0x22, Gid::ZERO); 5];
    let theirs = vec![ep(0, 0x33, 0x44, Gid::ZERO); 5];
    let answer = theirs.clone();
    let server = tokio::spawn(async move {
        serve_many_async(s, 5, |client| async move {
            assert_eq!(client.len(), 5);
            Ok::<_, Infallible>(answer)
        })
        .await
    });
    assert_eq!(client_many_async(c, &mine).await.unwrap(), theirs);
    assert_eq!(server.await.unwrap().unwrap(), mine);
}

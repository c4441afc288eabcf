//! Tests for the `ibv_rc_pingpong` formats. Expected lines were checked against the C tool's
//! format strings fed with the same values.

use super::*;

fn gid(hex: &str) -> Gid {
    parse_dest(&format!("0000:000000:000000:{hex}"))
        .unwrap()
        .gid
}

#[test]
fn wire_message_round_trip() {
    let dest = Dest {
        lid: 0x1a,
        qpn: 0x2b3c,
        psn: 0xabcdef,
        gid: gid("fe800000000000000202c9fffe0a0b0c"),
    };
    let msg = format_dest(&dest);
    assert_eq!(msg, "001a:002b3c:abcdef:fe800000000000000202c9fffe0a0b0c");
    assert_eq!(msg.len() + 1, WIRE_MSG_LEN);
    assert_eq!(parse_dest(&msg), Ok(dest));
    // As read from the socket: NUL-terminated.
    assert_eq!(parse_dest(&format!("{msg}\0")), Ok(dest));
    // Upper-case digits and short fields are accepted, as C's sscanf("%x") does.
    let loose = parse_dest("1A:2B3C:ABCDEF:FE800000000000000202C9FFFE0A0B0C").unwrap();
    assert_eq!(loose, dest);
}

#[test]
fn gid_bytes_keep_wire_order() {
    let d = parse_dest("0000:000000:000000:000102030405060708090a0b0c0d0e0f").unwrap();
    assert_eq!(
        d.gid,
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}

#[test]
fn parse_errors() {
    let g = "00000000000000000000ffff0a000001";
    assert_eq!(parse_dest(""), Err(ParseDestError::FieldCount(1)));
    assert_eq!(
        parse_dest("0001:000011:000022"),
        Err(ParseDestError::FieldCount(3))
    );
    assert_eq!(
        parse_dest(&format!("0001:000011:000022:{g}:extra")),
        Err(ParseDestError::FieldCount(5))
    );
    assert_eq!(
        parse_dest(&format!(":000011:000022:{g}")),
        Err(ParseDestError::NotHex("LID"))
    );
    assert_eq!(
        parse_dest(&format!("00g1:000011:000022:{g}")),
        Err(ParseDestError::NotHex("LID"))
    );
    assert_eq!(
        parse_dest(&format!("0001:-00011:000022:{g}")),
        Err(ParseDestError::NotHex("QPN"))
    );
    assert_eq!(
        parse_dest(&format!("0001:000011:0x0022:{g}")),
        Err(ParseDestError::NotHex("PSN"))
    );
    assert_eq!(
        parse_dest(&format!("10000:000011:000022:{g}")),
        Err(ParseDestError::OutOfRange("LID"))
    );
    assert_eq!(
        parse_dest(&format!("0001:1000000:000022:{g}")),
        Err(ParseDestError::OutOfRange("QPN"))
    );
    assert_eq!(
        parse_dest(&format!("0001:000011:123456789012345678:{g}")),
        Err(ParseDestError::OutOfRange("PSN"))
    );
    assert_eq!(
        parse_dest("0001:000011:000022:abcd"),
        Err(ParseDestError::GidLength(4))
    );
    assert_eq!(
        parse_dest("0001:000011:000022:0000000000000000000000000000000z"),
        Err(ParseDestError::NotHex("GID"))
    );
    // 32 bytes but not on character boundaries: must not panic.
    assert_eq!(
        parse_dest("0001:000011:000022:0ééééééééééééééé0"),
        Err(ParseDestError::NotHex("GID"))
    );
    assert_eq!(
        ParseDestError::GidLength(4).to_string(),
        "GID must be 32 hex digits, found 4 characters"
    );
}

#[test]
fn address_lines() {
    let local = Dest {
        lid: 1,
        qpn: 0x11,
        psn: 0x123456,
        gid: [0; 16],
    };
    assert_eq!(
        format_address(PingpongSide::Local, &local),
        "  local address:  LID 0x0001, QPN 0x000011, PSN 0x123456, GID ::\n"
    );
    let remote = Dest {
        lid: 0,
        qpn: 0xabcdef,
        psn: 0x42,
        gid: gid("00000000000000000000ffff0a000001"),
    };
    assert_eq!(
        format_address(PingpongSide::Remote, &remote),
        "  remote address: LID 0x0000, QPN 0xabcdef, PSN 0x000042, GID ::ffff:10.0.0.1\n"
    );
}

#[test]
fn result_lines() {
    assert_eq!(
        format_results(4096, 1000, Duration::from_micros(123_456)),
        "8192000 bytes in 0.12 seconds = 530.84 Mbit/sec\n\
         1000 iters in 0.12 seconds = 123.46 usec/iter\n"
    );
    assert_eq!(
        format_results(1, 100_000, Duration::from_micros(2_500_000)),
        "200000 bytes in 2.50 seconds = 0.64 Mbit/sec\n\
         100000 iters in 2.50 seconds = 25.00 usec/iter\n"
    );
    assert_eq!(
        format_results(4096, 0, Duration::ZERO),
        "0 bytes in 0.00 seconds = 0.00 Mbit/sec\n0 iters in 0.00 seconds = 0.00 usec/iter\n"
    );
    assert_eq!(
        format_results(4096, 10, Duration::ZERO),
        "81920 bytes in 0.00 seconds = 0.00 Mbit/sec\n10 iters in 0.00 seconds = 0.00 usec/iter\n"
    );
}

#[test]
fn garbage_never_panics_and_accepted_input_round_trips() {
    // Deterministic pseudo-random strings over an alphabet with separators, hex digits,
    // non-hex letters, NUL and multi-byte characters.
    let alphabet: Vec<char> = "0123456789abcdefABCDEFxyz:: \0é€-".chars().collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..5000 {
        let mut s = String::new();
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let len = (state >> 58) as usize + (state >> 40) as usize % 40;
        for _ in 0..len {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            s.push(alphabet[(state >> 33) as usize % alphabet.len()]);
        }
        if let Ok(dest) = parse_dest(&s) {
            assert_eq!(parse_dest(&format_dest(&dest)), Ok(dest));
        }
    }
}

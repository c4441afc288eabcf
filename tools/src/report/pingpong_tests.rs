//! Tests for the `ibv_rc_pingpong` lines. Expected lines were checked against the C tool's
//! format strings fed with the same values.

use portverbs::hal::Gid;

use super::*;

#[test]
fn address_lines() {
    let local = QpEndpoint {
        lid: 1,
        qpn: 0x11,
        psn: 0x123456,
        gid: Gid::ZERO,
    };
    assert_eq!(
        format_address(PingpongSide::Local, &local),
        "  local address:  LID 0x0001, QPN 0x000011, PSN 0x123456, GID ::\n"
    );
    let remote = QpEndpoint {
        lid: 0,
        qpn: 0xabcdef,
        psn: 0x42,
        gid: "::ffff:10.0.0.1".parse().unwrap(),
    };
    assert_eq!(
        format_address(PingpongSide::Remote, &remote),
        "  remote address: LID 0x0000, QPN 0xabcdef, PSN 0x000042, GID ::ffff:10.0.0.1\n"
    );
    // ud_pingpong.c's local line: a colon before the GID.
    assert_eq!(
        format_ud_local_address(&remote),
        "  local address:  LID 0x0000, QPN 0xabcdef, PSN 0x000042: GID ::ffff:10.0.0.1\n"
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

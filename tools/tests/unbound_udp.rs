//! A `PORTVERBS_UDP` address that will not bind (another process holds UDP port 4791 on it,
//! or it is not this host's) is an error with the reason wherever its device is asked for.

mod common;

use std::net::UdpSocket;

use common::portverbs_with;

/// Holds UDP port 4791 on `ip`, as another Portverbs process on that address would.
fn hold(ip: &str) -> UdpSocket {
    UdpSocket::bind((ip, 4791)).expect("the test binds port 4791 of its own loopback address")
}

fn env(udp: &str) -> [(&str, &str); 2] {
    [("PORTVERBS_UDP", udp), ("PORTVERBS_NO_VFIO", "1")]
}

#[test]
fn devices_lists_the_rest_and_fails_naming_the_held_address() {
    let _held = hold("127.0.212.1");
    let run = portverbs_with(&["devices", "-l"], None, &env("127.0.212.1")).failed();
    assert!(run.stdout.contains("soft0"), "{}", run.stdout);
    assert!(
        run.stderr.contains("skipped udp0")
            && run.stderr.contains("127.0.212.1:4791")
            && run.stderr.contains("one address serves one process"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("PORTVERBS_UDP: udp0 (127.0.212.1)"),
        "{}",
        run.stderr
    );
}

#[test]
#[cfg_attr(
    windows,
    ignore = "Wine reports WSAEADDRINUSE for a bind to an address that is not local, and for a \
              second loopback address while another test holds port 4791 on one"
)]
fn devices_names_an_address_that_is_not_this_hosts() {
    let run = portverbs_with(&["devices"], None, &env("192.0.2.77")).failed();
    assert!(
        run.stderr.contains("192.0.2.77") && run.stderr.contains("not one of this host's"),
        "{}",
        run.stderr
    );
}

#[test]
#[cfg_attr(
    windows,
    ignore = "Wine reports WSAEADDRINUSE for a bind to an address that is not local, and for a \
              second loopback address while another test holds port 4791 on one"
)]
fn devices_exits_zero_when_every_address_binds() {
    let run = portverbs_with(&["devices", "-l"], None, &env("127.0.212.2")).ok();
    assert!(run.stdout.contains("udp0"), "{}", run.stdout);
    assert!(!run.stderr.contains("skipped"), "{}", run.stderr);
}

#[test]
#[cfg_attr(
    windows,
    ignore = "Wine reports WSAEADDRINUSE for a bind to an address that is not local, and for a \
              second loopback address while another test holds port 4791 on one"
)]
fn perf_pingpong_and_rping_give_the_reason_not_a_missing_device() {
    let _held = hold("127.0.212.3");
    let e = env("127.0.212.3");
    for args in [
        &["perf", "write_bw", "-d", "udp0", "127.0.0.1"][..],
        &["pingpong", "-d", "udp0", "127.0.0.1"],
        &["devices", "-d", "udp0"],
        &["rping", "-s", "-a", "127.0.212.3", "-C", "1"],
    ] {
        let run = portverbs_with(args, None, &e).failed();
        assert!(
            run.stderr.contains("udp0 could not be opened")
                && run.stderr.contains("Address already in use"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("wasn't found"),
            "{args:?}: {}",
            run.stderr
        );
    }
}

//! The cross-process CLI with both processes' devices in manual progress
//! (`PORTVERBS_PROGRESS=manual`: no thread of Portverbs'; the CLI's own posts, polls and
//! waits drive each device and its CM). Each run is a server and a client process on
//! UDP-bound devices of their own loopback addresses, and both must finish with their
//! results: every loop of the CLI that waits must drive the device, including the latency
//! tests' spin on memory that an RDMA WRITE lands in with no completion to poll.

#![cfg(target_os = "linux")]

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{finish, spawn, table_rows};

const MANUAL: (&str, &str) = ("PORTVERBS_PROGRESS", "manual");

/// A port nobody listens on right now.
fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string()
}

/// Runs `server` on 127.0.<net>.1 and `client` (given the server's address by `client`
/// itself) on 127.0.<net>.2, both in manual progress; both must exit 0. Returns the
/// client's and the server's stdout.
fn pair(net: u8, server: &[&str], client: &[&str]) -> (String, String) {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let mut s = spawn(server, &[("PORTVERBS_UDP", server_ip.as_str()), MANUAL]);
    std::thread::sleep(Duration::from_millis(500));
    let c = spawn(client, &[("PORTVERBS_UDP", client_ip.as_str()), MANUAL]);
    let (ccode, cout, cerr) = finish(c);
    if ccode != Some(0) {
        // A server whose client failed would wait for another one.
        let _ = s.kill();
    }
    let (scode, sout, serr) = finish(s);
    assert_eq!(
        ccode,
        Some(0),
        "client:\n{cout}\n{cerr}\nserver:\n{sout}\n{serr}"
    );
    assert_eq!(
        scode,
        Some(0),
        "server:\n{sout}\n{serr}\nclient:\n{cout}\n{cerr}"
    );
    (cout, sout)
}

/// `perf <test> <flags>` as server and client; the client's row has `size` and `iters`.
fn perf(net: u8, test: &str, flags: &[&str], size: f64, iters: f64) {
    let p = free_port();
    let server_ip = format!("127.0.{net}.1");
    let args = [
        &["perf", test, "-d", "udp0", "-p", &p, "--timeout", "20"][..],
        flags,
    ]
    .concat();
    let client = [&args[..], &[server_ip.as_str()]].concat();
    let (cout, sout) = pair(net, &args, &client);
    let rows = table_rows(&cout);
    assert_eq!(rows.len(), 1, "{cout}");
    assert_eq!(rows[0][..2], [size, iters], "{cout}\n{sout}");
}

#[test]
fn perf_latency_tests_in_manual_progress() {
    perf(121, "write_lat", &["-s", "64", "-n", "200"], 64.0, 200.0);
    perf(121, "send_lat", &["-s", "2", "-n", "200"], 2.0, 200.0);
    perf(
        121,
        "write_lat",
        &["-R", "-s", "64", "-n", "200"],
        64.0,
        200.0,
    );
    perf(
        121,
        "send_lat",
        &["-R", "-s", "64", "-n", "200"],
        64.0,
        200.0,
    );
}

#[test]
fn perf_bandwidth_tests_in_manual_progress() {
    perf(
        122,
        "write_bw",
        &["-s", "65536", "-n", "200"],
        65536.0,
        200.0,
    );
    perf(
        122,
        "read_bw",
        &["-R", "-s", "65536", "-n", "100"],
        65536.0,
        100.0,
    );
    perf(
        122,
        "send_bw",
        &["-R", "-s", "4096", "-n", "200"],
        4096.0,
        200.0,
    );
}

#[test]
fn pingpong_and_rping_in_manual_progress() {
    let p = free_port();
    let flags = [
        "pingpong", "-d", "udp0", "-c", "-s", "10000", "-n", "200", "-p", &p,
    ];
    let client = [&flags[..], &["127.0.123.1"]].concat();
    let (cout, sout) = pair(123, &flags, &client);
    for out in [&cout, &sout] {
        assert!(out.contains("4000000 bytes in "), "{out}");
        assert!(out.contains("200 iters in "), "{out}");
    }
    let p = free_port();
    let (cout, sout) = pair(
        124,
        &[
            "rping",
            "-s",
            "-a",
            "127.0.124.1",
            "-p",
            &p,
            "-v",
            "-S",
            "100",
        ],
        &[
            "rping",
            "-c",
            "-a",
            "127.0.124.1",
            "-p",
            &p,
            "-v",
            "-V",
            "-S",
            "100",
            "-C",
            "5",
        ],
    );
    assert_eq!(cout.matches("ping data: rdma-ping-").count(), 5, "{cout}");
    assert_eq!(
        sout.matches("server ping data: rdma-ping-").count(),
        5,
        "{sout}"
    );
}

#[test]
fn perf_ud_over_the_cm_in_manual_progress() {
    // SIDR on the UDP port space; latency adds the client's QPN message.
    perf(
        126,
        "send_lat",
        &["-R", "-c", "UD", "-s", "64", "-n", "100"],
        64.0,
        100.0,
    );
    perf(
        126,
        "send_bw",
        &["-R", "-c", "UD", "-s", "1024", "-n", "100"],
        1024.0,
        100.0,
    );
}

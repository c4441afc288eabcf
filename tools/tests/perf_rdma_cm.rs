//! `perf -R` (perftest's rdma_cm mode) as a server process and a client process on
//! UDP-bound soft devices: the connection manager connects the exchange's QP and the test's
//! QPs, the exchange runs over SENDs, and both print perftest's table.

#![cfg(target_os = "linux")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{finish, spawn, table_rows};

/// Runs `perf <line> -R -d udp0 -p <port>` as a server on 127.0.<net>.1 and as its client on
/// 127.0.<net>.2 (one `net` per test: tests run at the same time); both must succeed.
/// Returns the client's and the server's stdout.
fn pair(line: &[&str], net: u8, port: u16) -> (String, String) {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let p = port.to_string();
    let args = [&["perf"][..], line, &["-R", "-d", "udp0", "-p", &p]].concat();
    let server = spawn(&args, &[("PORTVERBS_UDP", &server_ip)]);
    // The client tries again while the server is not listening; a head start keeps the
    // retries few.
    std::thread::sleep(Duration::from_millis(300));
    let client = spawn(
        &[&args[..], &[server_ip.as_str()]].concat(),
        &[("PORTVERBS_UDP", &client_ip)],
    );
    let (ccode, cout, cerr) = finish(client);
    let (scode, sout, serr) = finish(server);
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
    for out in [&cout, &sout] {
        assert!(out.contains(" rdma_cm QPs\t : ON\n"), "{out}");
        assert!(out.contains(" Data ex. method : rdma_cm\n"), "{out}");
    }
    (cout, sout)
}

#[test]
fn write_bw_over_the_cm_in_two_processes() {
    let (cout, sout) = pair(&["write_bw", "-s", "65536", "-n", "200"], 92, 18611);
    assert!(
        sout.contains("* Waiting for client to connect... *"),
        "{sout}"
    );
    let (c, s) = (table_rows(&cout), table_rows(&sout));
    assert_eq!(c.len(), 1, "{cout}");
    assert_eq!(c[0][..2], [65536.0, 200.0], "{cout}");
    assert!(c[0][3] > 0.0, "an average bandwidth: {cout}");
    // perftest's server prints the client's row, sent over the CM-connected exchange.
    assert_eq!(c, s, "{cout}\n{sout}");
}

#[test]
fn several_qps_and_other_tests_over_the_cm_in_two_processes() {
    let (cout, sout) = pair(
        &["write_bw", "-s", "8192", "-n", "50", "-q", "3"],
        93,
        18612,
    );
    assert_eq!(cout.matches(" local address: LID").count(), 3, "{cout}");
    assert_eq!(table_rows(&cout)[0][..2], [8192.0, 150.0], "{cout}");
    assert_eq!(table_rows(&cout), table_rows(&sout));
    let (cout, sout) = pair(&["send_bw", "-s", "1024", "-n", "100"], 93, 18613);
    for out in [&cout, &sout] {
        assert_eq!(table_rows(out)[0][..2], [1024.0, 100.0], "{out}");
    }
    let (cout, sout) = pair(&["write_lat", "-s", "64", "-n", "100"], 93, 18614);
    for out in [&cout, &sout] {
        let r = table_rows(out);
        assert_eq!(r[0][..2], [64.0, 100.0], "{out}");
        assert!(r[0][2] > 0.0, "{out}");
    }
}

#[test]
fn rdma_cm_refuses_uc() {
    let out = Command::new(env!("CARGO_BIN_EXE_portverbs"))
        .args(["perf", "write_bw", "-R", "-c", "UC", "-d", "soft0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UC is not supported in librdmacm"), "{err}");
}

/// UD through the CM: the client resolves each server QP with SIDR on the UDP port space;
/// send_bw's server only receives, so no QPN message goes its way.
#[test]
fn ud_send_bw_over_the_cm_in_two_processes() {
    let (cout, sout) = pair(
        &["send_bw", "-c", "UD", "-s", "512", "-n", "100"],
        97,
        18615,
    );
    for out in [&cout, &sout] {
        assert!(out.contains(" Connection type : UD"), "{out}");
        let r = table_rows(out);
        assert_eq!(r.len(), 1, "{out}");
        assert_eq!(r[0][..2], [512.0, 100.0], "{out}");
    }
    // Several QPs: one SIDR exchange each.
    let (cout, sout) = pair(
        &["send_bw", "-c", "UD", "-s", "256", "-n", "40", "-q", "2"],
        97,
        18616,
    );
    assert_eq!(cout.matches(" local address: LID").count(), 2, "{cout}");
    for out in [&cout, &sout] {
        assert_eq!(table_rows(out)[0][..2], [256.0, 80.0], "{out}");
    }
}

/// UD latency through the CM: the server learns the client's QP from its QPN message (SEND
/// with immediate data) and answers every ping.
#[test]
fn ud_send_lat_over_the_cm_in_two_processes() {
    let (cout, sout) = pair(
        &["send_lat", "-c", "UD", "-s", "64", "-n", "100"],
        98,
        18617,
    );
    for out in [&cout, &sout] {
        assert!(out.contains(" Connection type : UD"), "{out}");
        let r = table_rows(out);
        assert_eq!(r.len(), 1, "{out}");
        assert_eq!(r[0][..2], [64.0, 100.0], "{out}");
        assert!(r[0][2] > 0.0, "{out}");
    }
}

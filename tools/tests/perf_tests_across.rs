//! The rest of perftest's tests as a server process and a client process on UDP-bound soft
//! devices (each on a loopback address of its own): atomics, read latency, UC and UD, duration
//! mode, `-a`, and some of them through the CM (`-R`). The rows' sizes and iteration counts are
//! checked, never their timings.

#![cfg(target_os = "linux")]

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{finish, spawn, table_rows};

/// A port nobody listens on right now.
fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string()
}

/// Runs `perf <line> -d udp0 -p <port>` as a server on 127.0.<net>.1 and as its client on
/// 127.0.<net>.2 (one `net` per test: tests run at the same time); both must succeed.
/// Returns the client's and the server's stdout.
fn pair(line: &[&str], net: u8) -> (String, String) {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let p = free_port();
    let args = [&["perf"][..], line, &["-d", "udp0", "-p", &p]].concat();
    let server = spawn(&args, &[("PORTVERBS_UDP", &server_ip)]);
    std::thread::sleep(Duration::from_millis(400));
    let client = spawn(
        &[&args[..], &[server_ip.as_str()]].concat(),
        &[("PORTVERBS_UDP", &client_ip)],
    );
    let (ccode, cout, cerr) = finish(client);
    let mut server = server;
    if ccode != Some(0) {
        let _ = server.kill();
    }
    let (scode, sout, serr) = finish(server);
    assert_eq!(
        ccode,
        Some(0),
        "{line:?} client:\n{cout}\n{cerr}\nserver:\n{sout}\n{serr}"
    );
    assert_eq!(
        scode,
        Some(0),
        "{line:?} server:\n{sout}\n{serr}\nclient:\n{cout}\n{cerr}"
    );
    (cout, sout)
}

/// The first row's size and iterations.
fn first(out: &str) -> [f64; 2] {
    let rows = table_rows(out);
    assert!(!rows.is_empty(), "no row:\n{out}");
    [rows[0][0], rows[0][1]]
}

#[test]
fn atomic_bw_both_types_in_two_processes() {
    let (c, s) = pair(&["atomic_bw", "-n", "100"], 150);
    assert_eq!(first(&c), [8.0, 100.0], "{c}");
    assert!(c.contains("Atomic FETCH_AND_ADD BW Test"), "{c}");
    // perftest's server prints the client's row.
    assert_eq!(table_rows(&c), table_rows(&s), "{c}\n{s}");
    let (c, s) = pair(
        &["atomic_bw", "-n", "50", "-A", "CMP_AND_SWAP", "-q", "2"],
        150,
    );
    assert_eq!(first(&c), [8.0, 100.0], "two QPs of 50: {c}");
    assert!(c.contains("Atomic CMP_AND_SWAP BW Test"), "{c}");
    assert_eq!(table_rows(&c), table_rows(&s), "{c}\n{s}");
}

#[test]
fn read_and_atomic_latency_in_two_processes() {
    for (line, size) in [
        (&["read_lat", "-s", "256", "-n", "50"][..], 256.0),
        (&["atomic_lat", "-n", "50"], 8.0),
        (&["atomic_lat", "-n", "50", "-A", "CMP_AND_SWAP"], 8.0),
    ] {
        let (c, s) = pair(line, 151);
        assert_eq!(table_rows(&c).len(), 1, "{c}");
        assert_eq!(first(&c), [size, 50.0], "{c}");
        // The server posts nothing and prints no table, as perftest's.
        assert!(!s.contains(" #bytes"), "{s}");
        assert!(s.contains(" remote address: LID"), "{s}");
    }
    // (-a, up to 8 MiB, runs in the crate's unit tests on the in-process devices: over
    // loopback UDP on a loaded machine its megabyte reads can lose enough packets to exhaust
    // the retries.)
}

#[test]
fn uc_write_and_send_in_two_processes() {
    let (c, s) = pair(&["write_bw", "-c", "UC", "-s", "4096", "-n", "100"], 152);
    assert_eq!(first(&c), [4096.0, 100.0], "{c}");
    assert_eq!(table_rows(&c), table_rows(&s), "{c}\n{s}");
    assert!(c.contains("Connection type : UC"), "{c}");
    // Fewer messages than receives posted: none can find the receive queue empty.
    let (c, s) = pair(&["send_bw", "-c", "UC", "-s", "2048", "-n", "100"], 152);
    assert_eq!(first(&c), [2048.0, 100.0], "{c}");
    assert_eq!(first(&s), [2048.0, 100.0], "{s}");
    for test in ["write_lat", "send_lat"] {
        let (c, s) = pair(&[test, "-c", "UC", "-s", "32", "-n", "50"], 152);
        assert_eq!(first(&c), [32.0, 50.0], "{c}");
        assert_eq!(first(&s), [32.0, 50.0], "{s}");
    }
}

#[test]
fn ud_send_in_two_processes() {
    let (c, s) = pair(&["send_bw", "-c", "UD", "-s", "1024", "-n", "100"], 153);
    assert_eq!(first(&c), [1024.0, 100.0], "{c}");
    assert_eq!(first(&s), [1024.0, 100.0], "{s}");
    assert!(c.contains("Connection type : UD"), "{c}");
    let (c, s) = pair(&["send_lat", "-c", "UD", "-s", "64", "-n", "50"], 153);
    assert_eq!(first(&c), [64.0, 50.0], "{c}");
    assert_eq!(first(&s), [64.0, 50.0], "{s}");
    // -a on UD: every size up to the MTU, a message each being one packet.
    let (c, s) = pair(&["send_bw", "-c", "UD", "-a", "-n", "20"], 153);
    let (cr, sr) = (table_rows(&c), table_rows(&s));
    assert_eq!(cr.len(), sr.len(), "{c}\n{s}");
    assert!(cr.len() >= 8, "2 B up to at least the 256 B MTU: {c}");
    assert!(cr.iter().all(|r| r[1] == 20.0), "{c}");
}

#[test]
fn duration_mode_in_two_processes() {
    let (c, s) = pair(&["write_bw", "-s", "1024", "-D", "2"], 154);
    assert!(c.contains("WARNING: BW peak won't be measured"), "{c}");
    let rows = table_rows(&c);
    assert_eq!(rows.len(), 1, "{c}");
    assert_eq!(rows[0][0], 1024.0, "{c}");
    assert!(rows[0][1] > 0.0, "iterations counted: {c}");
    assert_eq!(rows, table_rows(&s), "{c}\n{s}");
    let (c, _) = pair(&["read_lat", "-s", "64", "-D", "2"], 154);
    assert!(c.contains("t_avg[usec]"), "{c}");
    assert_eq!(table_rows(&c).len(), 1, "{c}");
    // send_bw: the server's clock starts at its first arrival; each side prints its row.
    let (c, s) = pair(&["send_bw", "-s", "1024", "-D", "2"], 154);
    for out in [&c, &s] {
        let rows = table_rows(out);
        assert_eq!(rows.len(), 1, "{out}");
        assert_eq!(rows[0][0], 1024.0, "{out}");
        assert!(rows[0][1] > 0.0, "{out}");
    }
    // Ping-pong: each side stops on its own clock and prints its own row.
    for test in ["write_lat", "send_lat"] {
        let (c, s) = pair(&[test, "-s", "32", "-D", "2"], 154);
        for out in [&c, &s] {
            let rows = table_rows(out);
            assert_eq!(rows.len(), 1, "{out}");
            assert_eq!(rows[0][0], 32.0, "{out}");
            assert!(rows[0][1] > 0.0, "{out}");
        }
    }
}

#[test]
fn read_and_atomic_tests_over_the_cm_in_two_processes() {
    let (c, s) = pair(&["atomic_bw", "-R", "-n", "60"], 155);
    assert_eq!(first(&c), [8.0, 60.0], "{c}");
    assert_eq!(table_rows(&c), table_rows(&s), "{c}\n{s}");
    assert!(s.contains(" rdma_cm QPs\t : ON\n"), "{s}");
    for line in [
        &["atomic_lat", "-R", "-n", "40"][..],
        &["read_lat", "-R", "-s", "128", "-n", "40"],
    ] {
        let (c, s) = pair(line, 155);
        assert_eq!(table_rows(&c)[0][1], 40.0, "{c}");
        assert!(!s.contains(" #bytes"), "{s}");
    }
}

/// `send_bw -b -D`: both sides send and receive for the duration; each prints its own row
/// (perftest's send_bw.c exchanges the reports only in iterations mode).
#[test]
fn bidirectional_send_for_a_duration_in_two_processes() {
    let (c, s) = pair(&["send_bw", "-b", "-s", "2048", "-D", "2"], 156);
    for out in [&c, &s] {
        assert!(out.contains("Bidirectional BW Test"), "{out}");
        let rows = table_rows(out);
        assert_eq!(rows.len(), 1, "{out}");
        assert_eq!(rows[0][0], 2048.0, "{out}");
        assert!(rows[0][1] > 0.0, "iterations counted: {out}");
    }
}

/// perftest's `-a`: every power of two from 2 bytes to 8 MiB.
fn all_sizes() -> Vec<f64> {
    (1..=23).map(|k| f64::from(1u32 << k)).collect()
}

/// `-a` of write_bw: the client prints a row per size; the server, which posts nothing,
/// prints the client's last row, as perftest's write_bw server does.
#[test]
fn write_bw_every_size_in_two_processes() {
    let (c, s) = pair(&["write_bw", "-a", "-n", "5"], 160);
    let rows = table_rows(&c);
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, all_sizes(), "{c}");
    assert!(rows.iter().all(|r| r[1] == 5.0), "{c}");
    assert_eq!(table_rows(&s), rows[rows.len() - 1..], "{c}\n{s}");
}

/// `-a` of send_lat: both sides ping-pong every size and print a row each.
#[test]
fn send_lat_every_size_in_two_processes() {
    let (c, s) = pair(&["send_lat", "-a", "-n", "5"], 161);
    for out in [&c, &s] {
        let rows = table_rows(out);
        let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
        assert_eq!(sizes, all_sizes(), "{out}");
        assert!(rows.iter().all(|r| r[1] == 5.0), "{out}");
    }
}

#[test]
fn bidirectional_bw_in_two_processes() {
    for line in [
        &["write_bw", "-b", "-s", "4096", "-n", "100"][..],
        &["read_bw", "-b", "-s", "2048", "-n", "100"],
        &["atomic_bw", "-b", "-n", "100"],
        &["send_bw", "-b", "-s", "4096", "-n", "100"],
    ] {
        let (c, s) = pair(line, 157);
        for out in [&c, &s] {
            assert!(out.contains("Bidirectional BW Test"), "{out}");
            assert_eq!(table_rows(out).len(), 1, "{out}");
            assert_eq!(table_rows(out)[0][1], 100.0, "{out}");
        }
    }
    // Duration mode, bidirectional.
    let (c, s) = pair(&["write_bw", "-b", "-s", "1024", "-D", "2"], 157);
    for out in [&c, &s] {
        assert_eq!(table_rows(out).len(), 1, "{out}");
        assert_eq!(table_rows(out)[0][0], 1024.0, "{out}");
    }
}

/// `--run_infinitely -D 1`: a row every second until stopped. The write_bw server waits for
/// its client for ever, as perftest's; the send_bw server prints its own arrivals' rows.
#[test]
fn run_infinitely_reports_every_interval() {
    for (test, net) in [("write_bw", 158u8), ("send_bw", 159)] {
        let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
        let p = free_port();
        let args = [
            "perf",
            test,
            "-s",
            "2048",
            "--run_infinitely",
            "-D",
            "1",
            "-d",
            "udp0",
            "-p",
            &p,
        ];
        let mut server = spawn(&args, &[("PORTVERBS_UDP", &server_ip)]);
        std::thread::sleep(Duration::from_millis(400));
        let mut client = spawn(
            &[&args[..], &[server_ip.as_str()]].concat(),
            &[("PORTVERBS_UDP", &client_ip)],
        );
        std::thread::sleep(Duration::from_millis(4500));
        assert!(
            client.try_wait().expect("the client's state").is_none(),
            "{test}: the client runs until stopped"
        );
        let _ = client.kill();
        let _ = server.kill();
        let (_, out, err) = finish(client);
        let (_, sout, serr) = finish(server);
        let rows = table_rows(&out);
        assert!(rows.len() >= 2, "{test}: a row a second:\n{out}\n{err}");
        for r in &rows {
            assert_eq!(r[0], 2048.0, "{out}");
            assert!(r[1] > 0.0, "{out}");
        }
        if test == "send_bw" {
            let rows = table_rows(&sout);
            assert!(rows.len() >= 2, "{test}: a row a second:\n{sout}\n{serr}");
            assert!(rows.iter().all(|r| r[0] == 2048.0 && r[1] > 0.0), "{sout}");
        }
    }
}

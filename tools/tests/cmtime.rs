//! `portverbs cmtime`: connections through the connection manager on the embedded fabric,
//! timed per step in cmtime's table, and between a server and a client in two processes
//! over UDP-bound devices.

mod common;

use common::portverbs;

#[test]
fn every_connection_is_made_and_timed_in_cmtimes_table() {
    let run = portverbs(&["cmtime", "-c", "20"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3 + 17, "{}", run.stdout);
    assert_eq!(lines[0], "cm_conn                20");
    assert_eq!(lines[1], "threads                 1");
    assert!(lines[2].starts_with("step             avg/conn  total(us)"));
    let row = |name: &str| -> Vec<u64> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in {}", run.stdout));
        line[13..]
            .split_whitespace()
            .map(|f| f.parse().expect("a number"))
            .collect()
    };
    let connect = row("cm connect");
    assert_eq!(connect.len(), 6);
    let [avg, total, per, sum, max, min] = connect[..] else {
        unreachable!()
    };
    assert!(total > 0 && sum > 0, "{connect:?}");
    assert_eq!(avg, total / 20);
    assert_eq!(per, sum / 20);
    assert!(min <= per && per <= max, "{connect:?}");
    // All connects are in flight at once: each one's span lies within the step's.
    assert!(max <= total, "{connect:?}");
    // The CM moves the QP itself: cmtime's separate transition steps read 0.
    assert_eq!(row("rtr qp"), [0; 6]);
    assert_eq!(
        row("full connect")[3],
        0,
        "cmtime prints no sum for the full connect"
    );
}

#[test]
fn cmtime_needs_a_connection() {
    let run = portverbs(&["cmtime", "-c", "0"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
}

#[test]
fn a_window_bounds_the_connects_in_flight() {
    let run = portverbs(&["cmtime", "-c", "50", "-w", "4"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.lines().next(), Some("cm_conn                50"));
    let zero = portverbs(&["cmtime", "-c", "5", "-w", "0"]);
    assert_eq!(zero.code, Some(2), "{}", zero.stderr);
    let bind_alone = portverbs(&["cmtime", "-c", "5", "-b", "10.0.0.1"]);
    assert_eq!(bind_alone.code, Some(2), "{}", bind_alone.stderr);
}

/// `cmtime -L` in one process and `cmtime -s` in another, each on its own UDP-bound device
/// (`PORTVERBS_UDP`, a loopback address of its own): every connection is made and torn
/// down through the two processes' CMs over real sockets, and both print their table.
#[cfg(target_os = "linux")]
#[test]
fn server_and_client_in_two_processes_over_udp() {
    use std::io::{BufRead as _, BufReader, Read as _};
    use std::process::{Command, Stdio};
    let (server_ip, client_ip) = ("127.0.91.1", "127.0.91.2");
    let bin = env!("CARGO_BIN_EXE_portverbs");
    let mut server = Command::new(bin)
        .args(["cmtime", "-L", "-b", server_ip, "-c", "200", "-p", "7491"])
        .env("PORTVERBS_UDP", server_ip)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the server starts");
    // The server listens before the client's first REQ (a REQ to a port nobody listens on
    // is rejected, and cmtime's client does not retry): it says so on stderr.
    let mut serr = BufReader::new(server.stderr.take().expect("the server's stderr"));
    let mut first = String::new();
    serr.read_line(&mut first).expect("the server's first line");
    assert_eq!(first.trim_end(), "cmtime: listening on 127.0.91.1:7491");
    let client = Command::new(bin)
        .args([
            "cmtime", "-s", server_ip, "-c", "200", "-p", "7491", "--stats",
        ])
        .env("PORTVERBS_UDP", client_ip)
        .output()
        .expect("the client runs");
    let server = server.wait_with_output().expect("the server ends");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (cout, cerr) = (text(&client.stdout), text(&client.stderr));
    let mut rest = String::new();
    serr.read_to_string(&mut rest).expect("the server's stderr");
    let (sout, serr) = (text(&server.stdout), rest);
    assert_eq!(
        client.status.code(),
        Some(0),
        "{cout}{cerr}\nserver: {sout}{serr}"
    );
    assert_eq!(
        server.status.code(),
        Some(0),
        "{sout}{serr}\nclient: {cout}{cerr}"
    );
    for out in [&cout, &sout] {
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3 + 17, "{out}");
        assert_eq!(lines[0], "cm_conn               200");
        let connect = lines
            .iter()
            .find(|l| l.starts_with("cm connect"))
            .expect("a cm connect row");
        let fields: Vec<u64> = connect[13..]
            .split_whitespace()
            .map(|f| f.parse().expect("a number"))
            .collect();
        assert!(fields[1] > 0 && fields[3] > 0, "{connect}");
    }
    // The burst of 200 REQs and 200 DREQs went through the window without a resend.
    assert!(cerr.contains("cm retransmits  0"), "{cerr}");
}

//! `perf` and `pingpong` as a server in one process and a client in another.
//!
//! Two processes share a network through devices reachable from outside: UDP-bound soft
//! devices (`PORTVERBS_UDP`), on loopback addresses of their own, run end to end here on
//! Linux. (Under Wine two Windows processes cannot both hold port 4791 on loopback — Wine
//! binds any address but 127.0.0.1 as the wildcard — so the Windows build is run against the
//! Linux one instead: `wine_interop.rs`.)
//! On every OS a server process's side of the TCP exchange is also checked against a hand-made
//! peer that speaks the C tools' formats. (Server and client threads of one process are tested in the
//! crate's unit tests, on the in-process devices.)

mod common;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
use common::table_rows;
use common::{finish, spawn};

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Connects to a server process that may still be starting.
fn connect(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(20)))
                    .expect("timeout");
                return s;
            }
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the server never listened on {port}: {e}"),
        }
    }
}

/// `perf write_bw --server` listens on -p and answers a perftest client's version message
/// with its own (perftest 4.5-0.20's 6.10, NUL-padded to 16 bytes); a client that hangs up
/// then fails the server cleanly.
#[test]
fn perf_server_answers_perftests_version_exchange() {
    let port = free_port();
    let p = port.to_string();
    let child = spawn(&["perf", "write_bw", "--server", "-p", &p], &[]);
    let mut s = connect(port);
    s.write_all(b"6.29\0\0\0\0\0\0\0\0\0\0\0\0").expect("send");
    let mut version = [0u8; 16];
    s.read_exact(&mut version).expect("the server's version");
    assert_eq!(&version, b"6.10\0\0\0\0\0\0\0\0\0\0\0\0");
    // The system data: page size and cache line, big-endian.
    s.write_all(&4096i32.to_be_bytes()).expect("send");
    let mut int = [0u8; 4];
    s.read_exact(&mut int).expect("the server's page size");
    assert_eq!(i32::from_be_bytes(int), 4096);
    drop(s);
    let (code, stdout, stderr) = finish(child);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("* Waiting for client to connect... *"),
        "{stdout}"
    );
    assert!(stderr.starts_with("portverbs: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `pingpong --server` reads a client's `LID:QPN:PSN:GID` message and answers with its own in
/// the same 52-byte format.
#[test]
fn pingpong_server_answers_the_c_tools_message() {
    let port = free_port();
    let p = port.to_string();
    let child = spawn(&["pingpong", "--server", "-p", &p, "--timeout", "2"], &[]);
    let mut s = connect(port);
    let mut msg = b"0000:000099:000123:00000000000000000000ffff0a000009".to_vec();
    msg.push(0);
    s.write_all(&msg).expect("send");
    let mut answer = [0u8; 52];
    s.read_exact(&mut answer).expect("the server's message");
    let text = String::from_utf8_lossy(&answer[..51]).into_owned();
    let fields: Vec<&str> = text.split(':').collect();
    assert_eq!(fields.len(), 4, "{text}");
    assert_eq!(
        fields.iter().map(|f| f.len()).collect::<Vec<_>>(),
        [4, 6, 6, 32],
        "{text}"
    );
    assert_eq!(answer[51], 0);
    drop(s);
    let (code, stdout, stderr) = finish(child);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    // The local address is printed before the server waits, as ibv_rc_pingpong does.
    assert!(stdout.starts_with("  local address:  LID 0x"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The UDP-bound devices of two processes on one machine: each process binds its
/// own loopback address (`127.0.<net>.1` the server, `.2` the client; one `net` per test, as
/// tests run at the same time), and both call their device `udp0`. The client reaches the
/// server's TCP side channel at the server's address.
#[cfg(target_os = "linux")]
fn udp_pair(net: u8) -> [String; 2] {
    [format!("127.0.{net}.1"), format!("127.0.{net}.2")]
}

#[cfg(target_os = "linux")]
#[test]
fn pingpong_server_and_client_in_two_processes() {
    let [server_ip, client_ip] = udp_pair(88);
    let server_host = &server_ip;
    let (server_udp, client_udp) = (
        ("PORTVERBS_UDP", server_ip.as_str()),
        ("PORTVERBS_UDP", client_ip.as_str()),
    );
    for size in ["4096", "10000"] {
        let p = free_port().to_string();
        let flags = ["-c", "-s", size, "-n", "500", "-p", &p];
        let server = spawn(
            &[&["pingpong", "-d", "udp0"][..], &flags].concat(),
            &[server_udp],
        );
        // Let the server listen before the client connects (ibv_rc_pingpong's client does
        // not retry either).
        std::thread::sleep(Duration::from_millis(500));
        let client = spawn(
            &[
                &["pingpong", "-d", "udp0"][..],
                &flags,
                &[server_host.as_str()],
            ]
            .concat(),
            &[client_udp],
        );
        let (ccode, cout, cerr) = finish(client);
        let (scode, sout, serr) = finish(server);
        assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
        assert_eq!(scode, Some(0), "{sout}\n{serr}");
        let bytes = format!("{} bytes in ", size.parse::<u64>().unwrap() * 500 * 2);
        for out in [&cout, &sout] {
            assert!(out.contains("  local address:  LID"), "{out}");
            assert!(out.contains("  remote address: LID"), "{out}");
            assert!(out.contains(&bytes), "{out}");
            assert!(out.contains("500 iters in "), "{out}");
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn perf_write_bw_server_and_client_in_two_processes() {
    let [server_ip, client_ip] = udp_pair(89);
    let server_host = &server_ip;
    let (server_udp, client_udp) = (
        ("PORTVERBS_UDP", server_ip.as_str()),
        ("PORTVERBS_UDP", client_ip.as_str()),
    );
    let p = free_port().to_string();
    let server = spawn(
        &[
            "perf", "write_bw", "-d", "udp0", "-s", "65536", "-n", "200", "-p", &p,
        ],
        &[server_udp],
    );
    std::thread::sleep(Duration::from_millis(500));
    let client = spawn(
        &[
            "perf",
            "write_bw",
            "-d",
            "udp0",
            "-s",
            "65536",
            "-n",
            "200",
            "-p",
            &p,
            server_host,
        ],
        &[client_udp],
    );
    let (ccode, cout, cerr) = finish(client);
    let (scode, sout, serr) = finish(server);
    assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
    assert_eq!(scode, Some(0), "{sout}\n{serr}");
    assert!(
        sout.contains("* Waiting for client to connect... *"),
        "{sout}"
    );
    let (c, s) = (table_rows(&cout), table_rows(&sout));
    assert_eq!(c.len(), 1, "{cout}");
    assert_eq!(c[0][..2], [65536.0, 200.0], "{cout}");
    // perftest's server prints the client's row.
    assert_eq!(c, s, "{cout}\n{sout}");
}

/// rping: a server process and a client process on UDP-bound devices, connected by
/// the connection manager; the client validates every ping (-V) and both print rping's lines.
#[cfg(target_os = "linux")]
#[test]
fn rping_server_and_client_in_two_processes() {
    let [server_ip, client_ip] = udp_pair(90);
    let p = free_port().to_string();
    let server = spawn(
        &["rping", "-s", "-a", &server_ip, "-p", &p, "-v", "-S", "100"],
        &[("PORTVERBS_UDP", server_ip.as_str())],
    );
    std::thread::sleep(Duration::from_millis(500));
    let client = spawn(
        &[
            "rping", "-c", "-a", &server_ip, "-p", &p, "-v", "-V", "-S", "100", "-C", "5",
        ],
        &[("PORTVERBS_UDP", client_ip.as_str())],
    );
    let (ccode, cout, cerr) = finish(client);
    let mut server = server;
    if ccode != Some(0) {
        // A server whose client failed would wait for another one.
        let _ = server.kill();
    }
    let (scode, sout, serr) = finish(server);
    assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
    assert_eq!(scode, Some(0), "{sout}\n{serr}");
    for (out, prefix) in [(&cout, "ping data: "), (&sout, "server ping data: ")] {
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
        assert_eq!(lines.len(), 5, "{out}");
        for (n, line) in lines.iter().enumerate() {
            let text = &line[prefix.len()..];
            assert!(text.starts_with(&format!("rdma-ping-{n}: ")), "{line}");
            assert_eq!(text.len(), 99, "the 100-byte ping less its NUL: {line}");
        }
    }
    assert!(serr.contains("server DISCONNECT EVENT..."), "{serr}");
    assert!(
        cerr.contains("client DISCONNECT EVENT..."),
        "the DREP arrived: {cerr}"
    );
}

/// A client whose server does not exist: the CM's REJ (invalid service ID: nobody listens on
/// the port) ends the run with rping's words and a failure exit.
#[cfg(target_os = "linux")]
#[test]
fn rping_to_a_port_nobody_listens_on_is_rejected() {
    let [server_ip, client_ip] = udp_pair(91);
    // A server process for the address, listening on another port.
    let p = free_port().to_string();
    let server = spawn(
        &["rping", "-s", "-a", &server_ip, "-p", &p],
        &[("PORTVERBS_UDP", server_ip.as_str())],
    );
    std::thread::sleep(Duration::from_millis(500));
    let other = (p.parse::<u16>().unwrap() ^ 1).to_string();
    let client = spawn(
        &["rping", "-c", "-a", &server_ip, "-p", &other, "-C", "1"],
        &[("PORTVERBS_UDP", client_ip.as_str())],
    );
    let (ccode, _, cerr) = finish(client);
    assert_eq!(ccode, Some(1), "{cerr}");
    assert!(
        cerr.contains("cma event RDMA_CM_EVENT_REJECTED, error 8"),
        "{cerr}"
    );
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
}

//! Two ends that do not match: a server on a device no other process can reach, a perf
//! server whose client runs another test, and rping ends of different sizes. Each side that
//! fails says why, naming the right peer.

#![cfg(target_os = "linux")]

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{finish, portverbs, spawn};

/// A port nobody listens on right now.
fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string()
}

#[test]
fn servers_on_the_embedded_fabric_are_refused_naming_portverbs_udp() {
    for args in [
        &["rping", "-s", "-C", "1"][..],
        &["rping", "-s", "-a", "10.0.0.1", "-C", "1"],
        &["cmtime", "-L", "-c", "1"],
        &["ucmatose"],
        &["rdma_server"],
    ] {
        let run = portverbs(args).failed();
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("embedded fabric") && run.stderr.contains("PORTVERBS_UDP"),
            "{args:?}: {}",
            run.stderr
        );
    }
}

/// How a process ended: its exit code, stdout and stderr.
type Ended = (Option<i32>, String, String);

/// Runs `perf <server_test>` as a server on 127.0.<net>.1 and `perf <client_test>` as its
/// client on 127.0.<net>.2: the client's and the server's (exit code, stdout, stderr).
fn perf_pair(server_test: &str, client_test: &str, net: u8) -> (Ended, Ended) {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let p = free_port();
    let common = ["-d", "udp0", "-p", &p, "-n", "100", "-s", "4096"];
    let server = spawn(
        &[&["perf", server_test][..], &common].concat(),
        &[("PORTVERBS_UDP", &server_ip)],
    );
    std::thread::sleep(Duration::from_millis(400));
    let client = spawn(
        &[&["perf", client_test][..], &common, &[server_ip.as_str()]].concat(),
        &[("PORTVERBS_UDP", &client_ip)],
    );
    let client = finish(client);
    let mut server = server;
    if client.0 != Some(0) {
        let _ = server.kill();
    }
    (client, finish(server))
}

#[test]
fn a_write_bw_server_refuses_a_read_bw_client() {
    let (client, server) = perf_pair("write_bw", "read_bw", 215);
    assert_eq!(server.0, Some(1), "server:\n{}\n{}", server.1, server.2);
    assert!(
        server.2.contains("write_bw server") && server.2.contains("same test"),
        "{}",
        server.2
    );
    // No result row under the write title.
    assert!(!server.1.contains(" 4096 "), "{}", server.1);
    assert_eq!(client.0, Some(0), "client:\n{}\n{}", client.1, client.2);
}

#[test]
fn a_read_bw_server_refuses_a_write_bw_client() {
    let (_, server) = perf_pair("read_bw", "write_bw", 216);
    assert_eq!(server.0, Some(1), "server:\n{}\n{}", server.1, server.2);
    assert!(
        server.2.contains("read_bw server") && server.2.contains("same test"),
        "{}",
        server.2
    );
    assert!(!server.1.contains(" 4096 "), "{}", server.1);
}

#[test]
fn a_write_bw_server_accepts_a_write_bw_client() {
    let (client, server) = perf_pair("write_bw", "write_bw", 217);
    assert_eq!(client.0, Some(0), "client:\n{}\n{}", client.1, client.2);
    assert_eq!(server.0, Some(0), "server:\n{}\n{}", server.1, server.2);
    assert!(server.1.contains(" 4096 "), "{}", server.1);
}

#[test]
fn rping_ends_of_different_sizes_name_each_other() {
    let (server_ip, client_ip) = ("127.0.218.1", "127.0.218.2");
    let p = free_port();
    let server = spawn(
        &[
            "rping", "-s", "-a", server_ip, "-p", &p, "-S", "64", "-C", "1",
        ],
        &[("PORTVERBS_UDP", server_ip)],
    );
    std::thread::sleep(Duration::from_millis(400));
    let client = finish(spawn(
        &[
            "rping", "-c", "-a", server_ip, "-p", &p, "-S", "200", "-C", "1",
        ],
        &[("PORTVERBS_UDP", client_ip)],
    ));
    let mut server = server;
    if client.0 == Some(0) {
        let _ = server.kill();
    }
    let (scode, _, serr) = finish(server);
    assert_eq!(scode, Some(1), "{serr}");
    assert!(serr.contains("larger than this server's 64"), "{serr}");
    // The peer the server names is its client, never itself.
    assert!(serr.contains(&format!("(peer {client_ip}:")), "{serr}");
    assert!(!serr.contains(&format!("peer {server_ip}")), "{serr}");
    assert_ne!(client.0, Some(0), "{}", client.2);
    assert!(
        client.2.contains(&format!("peer {server_ip}:{p}")),
        "{}",
        client.2
    );
}

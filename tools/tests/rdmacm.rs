//! librdmacm's example programs (`ucmatose`, `udaddy`, `rdma_server` / `rdma_client`): a
//! server process and a client process on UDP-bound devices of their own loopback addresses,
//! connected by the connection manager; both print the C programs' lines.

#![cfg(target_os = "linux")]

mod common;

use std::time::Duration;

use common::{finish, spawn};

/// Runs a server, then its client (with `retry`, again while the server is not listening
/// yet: the CM refuses a request for a service nobody listens on), and returns both runs'
/// exit codes and outputs, server first. `SERVER` in the arguments is the server's address.
fn pair(
    net: u8,
    server: &[&str],
    client: &[&str],
    retry: bool,
) -> [(Option<i32>, String, String); 2] {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let server_ip_arg = |args: &[&str]| -> Vec<String> {
        args.iter()
            .map(|a| a.replace("SERVER", &server_ip))
            .collect()
    };
    let sargs = server_ip_arg(server);
    let cargs = server_ip_arg(client);
    let sargs: Vec<&str> = sargs.iter().map(String::as_str).collect();
    let cargs: Vec<&str> = cargs.iter().map(String::as_str).collect();
    let mut srv = spawn(&sargs, &[("PORTVERBS_UDP", server_ip.as_str())]);
    if !retry {
        // Let the server's device come up: a request to an address nobody holds yet is
        // lost, not refused.
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut tries = 0;
    let client = loop {
        tries += 1;
        let run = finish(spawn(&cargs, &[("PORTVERBS_UDP", client_ip.as_str())]));
        let refused = run.1.contains("RDMA_CM_EVENT_REJECTED, error: 8")
            || run.1.contains("RDMA_CM_EVENT_UNREACHABLE, error: 1")
            || run.2.contains("RDMA_CM_EVENT_REJECTED, status 8");
        if !retry || !refused || tries == 40 {
            break run;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if client.0 != Some(0) {
        // A server whose client failed would wait for another one.
        let _ = srv.kill();
    }
    [finish(srv), client]
}

fn lines(out: &str) -> Vec<&str> {
    out.lines().collect()
}

#[test]
fn ucmatose_server_and_client_exchange_messages_on_two_connections() {
    let [(scode, sout, serr), (ccode, cout, cerr)] = pair(
        140,
        &[
            "ucmatose", "-b", "SERVER", "-c", "2", "-C", "5", "-S", "200",
        ],
        &[
            "ucmatose", "-s", "SERVER", "-c", "2", "-C", "5", "-S", "200",
        ],
        true,
    );
    assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
    assert_eq!(scode, Some(0), "{sout}\n{serr}");
    assert_eq!(
        lines(&sout),
        [
            "cmatose: starting server",
            "initiating data transfers",
            "completing sends",
            "receiving data transfers",
            "data transfers complete",
            "cmatose: disconnecting",
            "disconnected",
            "test complete",
            "return status 0",
        ]
    );
    assert_eq!(
        lines(&cout),
        [
            "cmatose: starting client",
            "cmatose: connecting",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
}

#[test]
fn udaddy_server_and_client_exchange_datagrams_through_sidr() {
    let [(scode, sout, serr), (ccode, cout, cerr)] = pair(
        141,
        &["udaddy", "-b", "SERVER", "-C", "5", "-S", "300"],
        &["udaddy", "-s", "SERVER", "-C", "5", "-S", "300"],
        true,
    );
    assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
    assert_eq!(scode, Some(0), "{sout}\n{serr}");
    assert_eq!(
        lines(&sout),
        [
            "udaddy: starting server",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
    assert_eq!(
        lines(&cout),
        [
            "udaddy: starting client",
            "udaddy: connecting",
            "initiating data transfers",
            "receiving data transfers",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    );
}

#[test]
fn udaddy_refuses_a_datagram_larger_than_the_mtu() {
    let run = common::portverbs_with(
        &["udaddy", "-s", "127.0.143.1", "-S", "5000"],
        None,
        &[("PORTVERBS_UDP", "127.0.143.2")],
    );
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("udaddy: message_size 5000 is larger than active mtu"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.ends_with("return status 1\n"), "{}", run.stdout);
}

#[test]
fn rdma_server_answers_rdma_clients_message() {
    let [(scode, sout, serr), (ccode, cout, cerr)] = pair(
        142,
        &["rdma_server", "-p", "7472"],
        &["rdma_client", "-s", "SERVER", "-p", "7472"],
        true,
    );
    assert_eq!(ccode, Some(0), "{cout}\n{cerr}");
    assert_eq!(scode, Some(0), "{sout}\n{serr}");
    assert_eq!(lines(&sout), ["rdma_server: start", "rdma_server: end 0"]);
    assert_eq!(lines(&cout), ["rdma_client: start", "rdma_client: end 0"]);
}

#[test]
fn rdma_client_without_a_server_is_refused() {
    // A server on the address, listening on another port: its CM refuses (REJ 8).
    let [_, (ccode, cout, cerr)] = pair(
        144,
        &["rdma_server", "-p", "7473"],
        &["rdma_client", "-s", "SERVER", "-p", "7474"],
        false,
    );
    assert_eq!(ccode, Some(1), "{cout}\n{cerr}");
    assert_eq!(lines(&cout), ["rdma_client: start", "rdma_client: end -1"]);
    assert!(
        cerr.contains("rdma_connect: RDMA_CM_EVENT_REJECTED, status 8"),
        "{cerr}"
    );
}

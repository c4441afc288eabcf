//! `portverbs rping` on the embedded fabric (both ends in this process, connected by the
//! connection manager over QP1): rping's lines, validation, and its usage errors.

mod common;

use common::portverbs;

#[test]
fn pings_are_validated_and_printed_as_rping_prints_them() {
    let run = portverbs(&["rping", "-v", "-V", "-C", "4", "-S", "40"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    for (n, line) in lines.iter().enumerate() {
        let text = line.strip_prefix("ping data: ").expect("rping's prefix");
        assert!(text.starts_with(&format!("rdma-ping-{n}: ")), "{line}");
        assert_eq!(text.len(), 39, "a 40-byte ping less its NUL: {line}");
    }
    // Ping 1 starts its pattern one character after ping 0.
    assert!(
        lines[0].ends_with(": ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].ends_with(": BCDEFGHIJKLMNOPQRSTUVWXYZ["),
        "{}",
        lines[1]
    );
    assert!(
        run.stderr.contains("server DISCONNECT EVENT..."),
        "{}",
        run.stderr
    );
}

#[test]
fn sizes_and_modes_rping_refuses_are_usage_errors() {
    let small = portverbs(&["rping", "-c", "-a", "10.0.0.2", "-S", "10"]);
    assert_eq!(small.code, Some(2), "{}", small.stderr);
    assert!(
        small
            .stderr
            .contains("Invalid size 10 (valid range is 26 to 65536)"),
        "{}",
        small.stderr
    );
    let no_addr = portverbs(&["rping", "-c"]);
    assert_eq!(no_addr.code, Some(2), "{}", no_addr.stderr);
    assert!(no_addr.stderr.contains("-a"), "{}", no_addr.stderr);
    let both = portverbs(&["rping", "-s", "-c"]);
    assert_eq!(both.code, Some(2), "{}", both.stderr);
}

/// `rping -s -P` keeps serving when a connection fails: a client (this test, on a UDP-bound
/// device of its own) sends its REQ and vanishes mid-connect once the server has taken the
/// request (its endpoint is destroyed, which sends the REJ a killed rdma_cm process's kernel
/// sends); the server reports the failed connection and serves the next client, an `rping
/// -c` process that pings and validates. (Before, the server exited on that one failure.)
#[cfg(target_os = "linux")]
#[test]
fn a_persistent_server_survives_a_client_that_vanishes_mid_connect() {
    use std::io::{BufRead, BufReader};
    use std::net::{IpAddr, SocketAddr};
    use std::sync::mpsc;
    use std::time::Duration;

    use common::{finish, spawn};
    use portverbs::cm::service::{CmDevice, ConnParam, Connector};
    use portverbs::prelude::*;
    use portverbs::udp_port::UdpConfig;

    let (server_ip, vanishing_ip, client_ip) = ("127.0.92.1", "127.0.92.2", "127.0.92.3");
    let port = "7292";
    /// Ends the server however the test ends.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = Server(spawn(
        &[
            "rping", "-s", "-P", "-d", "-a", server_ip, "-p", port, "-S", "64",
        ],
        &[("PORTVERBS_UDP", server_ip)],
    ));
    // The server's stderr, line by line, as it comes.
    let (tx, lines) = mpsc::channel::<String>();
    let stderr = server.0.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = |what: &str| loop {
        match lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                let hit = line.contains(what);
                seen.push(line);
                if hit {
                    return;
                }
            }
            Err(e) => panic!("the server never said {what:?} ({e}): {seen:?}"),
        }
    };
    wait_for("rdma_listen on");
    // The vanishing client.
    let ip: IpAddr = vanishing_ip.parse().unwrap();
    let dev = portverbs::udp_device("rping_vanish", UdpConfig::new(ip)).unwrap();
    let ctx = portverbs::open(dev.any()).unwrap();
    let cm = CmDevice::open_blocking(&ctx, ip).unwrap();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap();
    let mut conn = Connector::new(&cm).unwrap();
    let dst = SocketAddr::new(server_ip.parse().unwrap(), port.parse().unwrap());
    conn.resolve_blocking(dst).unwrap();
    conn.connect_nowait(&qp, &ConnParam::default()).unwrap();
    wait_for("RDMA_CM_EVENT_CONNECT_REQUEST");
    drop(conn);
    assert!(cm.flush(Duration::from_secs(5)).unwrap());
    drop((qp, cq, pd, cm, ctx, dev));
    wait_for("failed");
    // The next client is served.
    let client = spawn(
        &[
            "rping", "-c", "-a", server_ip, "-p", port, "-S", "64", "-C", "3", "-V",
        ],
        &[("PORTVERBS_UDP", client_ip)],
    );
    let (code, cout, cerr) = finish(client);
    drop(server);
    let _ = reader.join();
    seen.extend(lines.try_iter());
    assert_eq!(code, Some(0), "{cout}\n{cerr}\nserver: {seen:?}");
    assert!(
        seen.iter()
            .any(|l| l.contains("server DISCONNECT EVENT...")),
        "{seen:?}"
    );
}

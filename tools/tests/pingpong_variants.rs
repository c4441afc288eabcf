//! `uc_pingpong`, `ud_pingpong` and `srq_pingpong`: their output lines in one process and
//! between a server and a client process on UDP-bound devices, and the options they refuse.

mod common;

use common::portverbs;
#[cfg(target_os = "linux")]
use common::{finish, spawn};

/// Checks a side's lines: `qps` local and `qps` remote address lines (UD's local line has a
/// colon before the GID), then the bytes and iterations lines of `size` × `iters`.
fn check_output(out: &str, ud: bool, qps: usize, size: u64, iters: u64) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * qps + 2, "{out}");
    let gid_sep = if ud { ": GID " } else { ", GID " };
    for line in &lines[..qps] {
        assert!(line.starts_with("  local address:  LID 0x"), "{out}");
        assert!(line.contains(gid_sep), "{out}");
    }
    for line in &lines[qps..2 * qps] {
        assert!(line.starts_with("  remote address: LID 0x"), "{out}");
        assert!(line.contains(", GID "), "{out}");
    }
    let bytes = format!("{} bytes in ", size * iters * 2);
    assert!(lines[2 * qps].starts_with(&bytes), "{out}");
    assert!(lines[2 * qps].ends_with(" Mbit/sec"), "{out}");
    let iters_line = format!("{iters} iters in ");
    assert!(lines[2 * qps + 1].starts_with(&iters_line), "{out}");
    assert!(lines[2 * qps + 1].ends_with(" usec/iter"), "{out}");
}

/// Both sides in this process, on the embedded fabric: polling in auto progress, and with
/// events in manual progress (no thread of Portverbs': the tool's own calls drive the device).
#[test]
fn each_tool_runs_both_sides_here() {
    for events in [false, true] {
        let e: &[&str] = if events {
            &["-e", "--progress", "manual"]
        } else {
            &[]
        };
        let run = |args: &[&str]| portverbs(&[args, e].concat()).ok().stdout;
        check_output(
            &run(&["uc_pingpong", "-n", "100", "-c"]),
            false,
            1,
            4096,
            100,
        );
        check_output(
            &run(&["ud_pingpong", "-n", "100", "-c"]),
            true,
            1,
            1024,
            100,
        );
        let out = run(&["ud_pingpong", "-n", "20", "-s", "100"]);
        check_output(&out, true, 1, 100, 20);
        check_output(&run(&["srq_pingpong", "-n", "300"]), false, 16, 4096, 300);
        let out = run(&["srq_pingpong", "-q", "3", "-r", "8", "-n", "100", "-c"]);
        check_output(&out, false, 3, 4096, 100);
        // -n below -q: every QP still sends once, as in the C tool.
        let out = run(&["srq_pingpong", "-q", "4", "-n", "2", "-s", "64"]);
        check_output(&out, false, 4, 64, 2);
    }
}

#[test]
fn options_the_tools_refuse() {
    let err = portverbs(&["ud_pingpong", "-s", "5000"]).failed().stderr;
    assert!(
        err.starts_with("portverbs: Requested size larger than port MTU ("),
        "{err}"
    );
    let err = portverbs(&["srq_pingpong", "-q", "20", "-r", "10"])
        .failed()
        .stderr;
    assert!(err.contains("rx_depth 10 is too small for 20 QPs"), "{err}");
    for args in [
        &["srq_pingpong", "-q", "0"][..],
        &["srq_pingpong", "-q", "256", "-r", "600"],
        &["ud_pingpong", "-m", "1024"],
        &["uc_pingpong", "-m", "100"],
        &["uc_pingpong", "-r", "1"],
        &["ud_pingpong", "-n", "0"],
    ] {
        portverbs(args).failed();
    }
    let help = portverbs(&["srq_pingpong", "--help"]).ok().stdout;
    assert!(
        help.contains("ibv_srq_pingpong") && help.contains("--num-qp"),
        "{help}"
    );
}

/// A server and a client process on UDP-bound devices of their own loopback addresses.
#[cfg(target_os = "linux")]
fn two_processes(
    net: u8,
    server_args: &[&str],
    client_args: &[&str],
) -> [(Option<i32>, String, String); 2] {
    let server_ip = format!("127.0.{net}.1");
    let client_ip = format!("127.0.{net}.2");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let common = ["-d", "udp0", "-p", port.as_str(), "--timeout", "20"];
    let server = spawn(
        &[server_args, &common].concat(),
        &[("PORTVERBS_UDP", server_ip.as_str())],
    );
    // Let the server listen before the client connects (the C clients do not retry either).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let client = spawn(
        &[client_args, &common, &[server_ip.as_str()]].concat(),
        &[("PORTVERBS_UDP", client_ip.as_str())],
    );
    let c = finish(client);
    let s = finish(server);
    [s, c]
}

/// One two-process case: the loopback net, the flags of both sides, whether UD, the QPs, the
/// size and the iterations.
#[cfg(target_os = "linux")]
type Case<'a> = (u8, &'a [&'a str], bool, usize, u64, u64);

#[cfg(target_os = "linux")]
#[test]
fn each_tool_between_two_processes() {
    let cases: [Case<'_>; 4] = [
        (
            140,
            &["uc_pingpong", "-c", "-s", "10000", "-n", "200"],
            false,
            1,
            10000,
            200,
        ),
        (141, &["ud_pingpong", "-c", "-n", "200"], true, 1, 1024, 200),
        (
            142,
            &["srq_pingpong", "-c", "-q", "4", "-n", "200"],
            false,
            4,
            4096,
            200,
        ),
        (
            143,
            &["srq_pingpong", "-e", "-s", "100", "-n", "500"],
            false,
            16,
            100,
            500,
        ),
    ];
    for (net, args, ud, qps, size, iters) in cases {
        for (code, out, err) in two_processes(net, args, args) {
            assert_eq!(code, Some(0), "{args:?}: {out}\n{err}");
            check_output(&out, ud, qps, size, iters);
        }
    }
}

/// `srq_pingpong` sides with different -q: the side with more QPs says so; neither panics.
#[cfg(target_os = "linux")]
#[test]
fn srq_sides_with_different_qp_counts_fail_cleanly() {
    let [server, client] = two_processes(
        144,
        &["srq_pingpong", "-q", "4", "-n", "10"],
        &["srq_pingpong", "-q", "2", "-n", "10"],
    );
    for (code, out, err) in [&server, &client] {
        assert_eq!(*code, Some(1), "{out}\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(
        server.2.contains("the peer has 2 QP(s), this side 4"),
        "{}",
        server.2
    );
}

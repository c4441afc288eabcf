//! A peer whose process dies mid-run: the survivor gives up after its deadline (`--timeout`,
//! set small here) and exits non-zero with a message that names the peer's address, instead
//! of waiting for ever. Each run is two processes on UDP-bound soft devices (Linux), on
//! loopback addresses of their own; the killed process gets SIGKILL, so it says goodbye to
//! nobody, as a crashed host would not.
//!
//! No timing is asserted: the harness only bounds each wait generously, so that a survivor
//! that never gives up fails the test instead of hanging it.

#![cfg(target_os = "linux")]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::mpsc::{Receiver, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::spawn;

/// How long the harness lets a survivor take before it calls the test failed.
const BOUND: Duration = Duration::from_secs(60);

/// A spawned process whose stdout lines arrive on a channel as they are printed.
struct Watched {
    child: Child,
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: JoinHandle<String>,
}

impl Watched {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = spawn(args, env);
        let out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Self {
            child,
            lines,
            stdout: Vec::new(),
            stderr,
        }
    }

    /// Waits until a stdout line satisfies `ready` (the run is under way).
    fn wait_for(&mut self, what: &str, ready: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let done = ready(&line);
                    self.stdout.push(line);
                    if done {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("never saw {what}; stdout:\n{}", self.stdout.join("\n"));
                }
            }
        }
    }

    /// Kills the process (SIGKILL: no goodbye to its peer).
    fn kill(mut self) {
        self.child.kill().expect("kill");
        let _ = self.child.wait();
    }

    /// Waits (at most [`BOUND`]) for the process to end: its exit code and stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = self.stderr.join().unwrap_or_default();
                panic!("still waiting after {BOUND:?}; stderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status.code(), self.stderr.join().unwrap_or_default())
    }
}

/// Asserts that a survivor failed with a message naming `peer`, and did not panic.
fn failed_naming(code: Option<i32>, stderr: &str, peer: &str) {
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {stderr}");
    assert!(stderr.contains(peer), "the message names {peer}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_rping_client_whose_server_dies_gives_up_naming_the_server() {
    let (server_ip, client_ip) = ("127.0.94.1", "127.0.94.2");
    let p = "7394";
    let mut server = Watched::start(
        &["rping", "-s", "-a", server_ip, "-p", p, "-v"],
        &[("PORTVERBS_UDP", server_ip)],
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut client = Watched::start(
        &[
            "rping",
            "-c",
            "-a",
            server_ip,
            "-p",
            p,
            "-v",
            "-C",
            "0",
            "--timeout",
            "2",
        ],
        &[("PORTVERBS_UDP", client_ip)],
    );
    client.wait_for("the client's pings", |l| l.starts_with("ping data: "));
    server.wait_for("the server's pings", |l| {
        l.starts_with("server ping data: ")
    });
    server.kill();
    let (code, stderr) = client.finish();
    failed_naming(code, &stderr, server_ip);
}

#[test]
fn an_rping_server_whose_client_dies_gives_up_naming_the_client() {
    let (server_ip, client_ip) = ("127.0.95.1", "127.0.95.2");
    let p = "7395";
    let mut server = Watched::start(
        &[
            "rping",
            "-s",
            "-a",
            server_ip,
            "-p",
            p,
            "-v",
            "--timeout",
            "2",
        ],
        &[("PORTVERBS_UDP", server_ip)],
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut client = Watched::start(
        &["rping", "-c", "-a", server_ip, "-p", p, "-v", "-C", "0"],
        &[("PORTVERBS_UDP", client_ip)],
    );
    server.wait_for("the server's pings", |l| {
        l.starts_with("server ping data: ")
    });
    client.wait_for("the client's pings", |l| l.starts_with("ping data: "));
    client.kill();
    let (code, stderr) = server.finish();
    failed_naming(code, &stderr, client_ip);
}

/// A `perf` server (`-R`: the exchange and the QPs through the CM, or the TCP exchange) whose
/// client dies while it runs the test: the server, waiting for the client's result, gives up.
fn perf_server_whose_client_dies(cm: bool, net: u8, port: &str) {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let mode: &[&str] = if cm { &["-R"] } else { &[] };
    // A run far longer than the test waits: the client is killed in the middle of it.
    let line = [
        &[
            "perf", "write_bw", "-d", "udp0", "-p", port, "-n", "5000000", "-s", "4096",
        ][..],
        mode,
    ]
    .concat();
    let mut server = Watched::start(
        &[&line[..], &["--timeout", "2"]].concat(),
        &[("PORTVERBS_UDP", &server_ip)],
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut client = Watched::start(
        &[&line[..], &[server_ip.as_str()]].concat(),
        &[("PORTVERBS_UDP", &client_ip)],
    );
    // Both print the table header once the test QPs are connected and the run starts.
    server.wait_for("the server's table header", |l| l.starts_with(" #bytes"));
    client.wait_for("the client's table header", |l| l.starts_with(" #bytes"));
    std::thread::sleep(Duration::from_millis(500));
    client.kill();
    let (code, stderr) = server.finish();
    failed_naming(code, &stderr, &client_ip);
    assert!(
        !stderr.contains(&format!("{server_ip} ")) && !stderr.contains("127.0.0.1"),
        "the server names its client, not itself: {stderr}"
    );
}

#[test]
fn a_perf_cm_server_whose_client_dies_gives_up_naming_the_client() {
    perf_server_whose_client_dies(true, 96, "18696");
}

#[test]
fn a_perf_tcp_server_whose_client_dies_names_the_client() {
    perf_server_whose_client_dies(false, 97, "18697");
}

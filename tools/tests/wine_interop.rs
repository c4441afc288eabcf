//! The Windows build against the Linux build: a Windows `portverbs.exe` run under Wine and
//! this build's native `portverbs`, each on a UDP-bound device (`PORTVERBS_UDP`) on a
//! loopback address of its own, exchange RoCEv2 traffic in both directions — `perf
//! write_bw`, `pingpong -c` and `rping` (connected by the two processes' CMs), each with the
//! Windows process as the server and then as the client.
//!
//! Wine's sockets are the Linux host's, so loopback works as between two Linux processes,
//! with one difference: Wine binds a UDP socket asked for any IPv4 address but 127.0.0.1 to
//! the wildcard address (it emulates Windows' per-interface binding that way; `ss` shows
//! `0.0.0.0:4791`), which would take port 4791 from every other address. So the Windows
//! process always takes 127.0.0.1 and the Linux one 127.0.0.2; for IPv6 the Windows process
//! takes ::1, which Wine binds as asked. And since the datagrams leave through Linux
//! sockets, the IPv4 identification is Linux's (0): these runs say nothing about what a real
//! Windows stack puts there (see the `portverbs-udp` crate docs).
//!
//! Needs `wine` and the Windows build of the CLI: `.ci/run` builds it with
//! `cargo build --release --target x86_64-pc-windows-gnu -p portverbs-cli` and runs these
//! tests with `--ignored`. The binary is found in `target/x86_64-pc-windows-gnu/{release,
//! debug}/portverbs.exe` (the newer of the two) or at `PORTVERBS_WINDOWS_CLI`; Rust's std
//! needs the `ProcessPrng` stand-in on Wine 8, taken from `WINEPATH` or, when that is unset,
//! from `target/wine-stub` (where `.ci/run` builds it).
#![cfg(target_os = "linux")]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::table_rows;

/// Every test binds 127.0.0.1:4791 and 127.0.0.2:4791 (or ::1 and fd00:77::2): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a process may take to get ready or to finish (Wine starts slowly; nothing is
/// timed, this only keeps a hung run from hanging the test).
const PATIENCE: Duration = Duration::from_secs(120);

/// The Windows process's address and the Linux one's.
const WIN_V4: &str = "127.0.0.1";
const LIN_V4: &str = "127.0.0.2";

/// The Windows `portverbs.exe` to run.
fn windows_cli() -> PathBuf {
    if let Some(p) = std::env::var_os("PORTVERBS_WINDOWS_CLI") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let newest = ["release", "debug"]
        .iter()
        .map(|p| {
            target
                .join("x86_64-pc-windows-gnu")
                .join(p)
                .join("portverbs.exe")
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "no Windows build of the CLI under {}: run `cargo build --release --target \
             x86_64-pc-windows-gnu -p portverbs-cli` first, or set PORTVERBS_WINDOWS_CLI",
            target.display()
        ),
    }
}

/// `WINEPATH` for the `ProcessPrng` stand-in, when the environment has none.
fn wine_path() -> Option<String> {
    if std::env::var_os("WINEPATH").is_some() {
        return None;
    }
    let stub = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()?
        .join("target/wine-stub");
    stub.join("bcryptprimitives.dll")
        .exists()
        .then(|| format!("Z:{}", stub.display().to_string().replace('/', "\\")))
}

/// A running process of either build, its output collected line by line as it comes.
struct Proc {
    name: &'static str,
    child: Child,
    lines: Receiver<String>,
    readers: Vec<JoinHandle<()>>,
    seen: Vec<String>,
}

impl Proc {
    fn start(name: &'static str, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let (tx, lines) = channel();
        let mut readers = Vec::new();
        let outs: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("piped")),
            Box::new(child.stderr.take().expect("piped")),
        ];
        for out in outs {
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            }));
        }
        Self {
            name,
            child,
            lines,
            readers,
            seen: Vec::new(),
        }
    }

    /// The Windows build under Wine.
    fn windows(args: &[&str], udp: &str) -> Self {
        let mut cmd = Command::new("wine");
        cmd.arg(windows_cli())
            .args(args)
            .env("PORTVERBS_UDP", udp)
            .env("WINEDEBUG", "-all");
        if let Some(p) = wine_path() {
            cmd.env("WINEPATH", p);
        }
        Self::start("windows", cmd)
    }

    /// This build.
    fn linux(args: &[&str], udp: &str) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portverbs"));
        cmd.args(args).env("PORTVERBS_UDP", udp);
        Self::start("linux", cmd)
    }

    /// Waits until a line containing `what` was printed (the process is ready for its peer).
    fn wait_for(&mut self, what: &str) {
        let start = Instant::now();
        while !self.seen.iter().any(|l| l.contains(what)) {
            let left = PATIENCE.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(e) => {
                    // Its output closed or the patience ran out. A process whose output
                    // closed is exiting: give it a moment to be reaped, so that the status
                    // says whether Wine or the program failed.
                    let mut status = self.child.try_wait().ok().flatten();
                    if e == RecvTimeoutError::Disconnected {
                        let until = Instant::now() + Duration::from_secs(5);
                        while status.is_none() && Instant::now() < until {
                            std::thread::sleep(Duration::from_millis(50));
                            status = self.child.try_wait().ok().flatten();
                        }
                    }
                    panic!(
                        "{} never printed {what:?} (exit status: {status:?}):\n{}",
                        self.name,
                        self.seen.join("\n")
                    )
                }
            }
        }
    }

    /// Waits for the exit: its code and everything it printed.
    fn finish(mut self) -> (Option<i32>, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self
                .child
                .try_wait()
                .expect("the process can be waited for")
            {
                break s;
            }
            if start.elapsed() > PATIENCE {
                let _ = self.child.kill();
                break self.child.wait().expect("the killed process ends");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.seen.extend(self.lines.try_iter());
        (status.code(), self.seen.join("\n"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A test that failed half-way leaves no process behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string()
}

/// Which side runs the Windows build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowsIs {
    Server,
    Client,
}

/// Starts `args` as the server (on `server_udp`), waits for `ready`, then the client with
/// `client_args` (on `client_udp`); returns (server, client) exit codes and output.
fn run_pair(
    windows_is: WindowsIs,
    args: &[&str],
    client_args: &[&str],
    ready: &str,
    [win_udp, lin_udp]: [&str; 2],
) -> [(Option<i32>, String); 2] {
    let (mut server, client_of) = match windows_is {
        WindowsIs::Server => (
            Proc::windows(args, win_udp),
            Proc::linux as fn(&[&str], &str) -> Proc,
        ),
        WindowsIs::Client => (
            Proc::linux(args, lin_udp),
            Proc::windows as fn(&[&str], &str) -> Proc,
        ),
    };
    server.wait_for(ready);
    let client_udp = match windows_is {
        WindowsIs::Server => lin_udp,
        WindowsIs::Client => win_udp,
    };
    let client = client_of(client_args, client_udp);
    let c = client.finish();
    let s = server.finish();
    [s, c]
}

fn perf_write_bw_with(windows_is: WindowsIs, udp: [&str; 2], server_host: &str, progress: &str) {
    let p = free_port();
    let args = [
        "perf",
        "write_bw",
        "--progress",
        progress,
        "-d",
        "udp0",
        "-s",
        "65536",
        "-n",
        "200",
        "-p",
        &p,
        "--timeout",
        "60",
    ];
    let client: Vec<&str> = args.iter().copied().chain([server_host]).collect();
    let [(scode, sout), (ccode, cout)] = run_pair(
        windows_is,
        &args,
        &client,
        "Waiting for client to connect",
        udp,
    );
    assert_eq!(
        ccode,
        Some(0),
        "client ({windows_is:?} is Windows):\n{cout}\nserver:\n{sout}"
    );
    assert_eq!(scode, Some(0), "server:\n{sout}\nclient:\n{cout}");
    let (c, s) = (table_rows(&cout), table_rows(&sout));
    assert_eq!(c.len(), 1, "{cout}");
    assert_eq!(c[0][..2], [65536.0, 200.0], "{cout}");
    // perftest's server prints the client's row.
    assert_eq!(c, s, "{cout}\n{sout}");
    // A smoke figure only (Wine, loopback, one machine): the log says what it was.
    eprintln!(
        "perf write_bw, {progress} progress, Windows {}: {} MiB/s average",
        if windows_is == WindowsIs::Server {
            "server"
        } else {
            "client"
        },
        c[0][3]
    );
}

/// `perf write_bw`: the Windows build as the server, then as the client.
#[test]
#[ignore = "needs wine and the Windows build"]
fn perf_write_bw_between_windows_and_linux_both_ways() {
    let _one = serial();
    perf_write_bw_with(WindowsIs::Server, [WIN_V4, LIN_V4], WIN_V4, "auto");
    perf_write_bw_with(WindowsIs::Client, [WIN_V4, LIN_V4], LIN_V4, "auto");
}

/// `perf write_bw` with both processes in manual progress: no thread of ours on either side,
/// the Windows side receiving by its requests' status on the thread that polls.
#[test]
#[ignore = "needs wine and the Windows build"]
fn perf_write_bw_in_manual_progress_both_ways() {
    let _one = serial();
    perf_write_bw_with(WindowsIs::Server, [WIN_V4, LIN_V4], WIN_V4, "manual");
    perf_write_bw_with(WindowsIs::Client, [WIN_V4, LIN_V4], LIN_V4, "manual");
}

/// `pingpong -c` (ibv_rc_pingpong with every received buffer checked), 4 KiB and 10 000-byte
/// messages (several packets each at the 4096-byte path MTU of loopback).
#[test]
#[ignore = "needs wine and the Windows build"]
fn pingpong_checked_between_windows_and_linux_both_ways() {
    let _one = serial();
    for (windows_is, server_host) in [(WindowsIs::Server, WIN_V4), (WindowsIs::Client, LIN_V4)] {
        for size in ["4096", "10000"] {
            let p = free_port();
            let args = [
                "pingpong",
                "-d",
                "udp0",
                "-c",
                "-s",
                size,
                "-n",
                "500",
                "-p",
                &p,
                "--timeout",
                "60",
            ];
            let client: Vec<&str> = args.iter().copied().chain([server_host]).collect();
            let [(scode, sout), (ccode, cout)] = run_pair(
                windows_is,
                &args,
                &client,
                "local address:",
                [WIN_V4, LIN_V4],
            );
            assert_eq!(
                ccode,
                Some(0),
                "client ({windows_is:?} is Windows):\n{cout}\nserver:\n{sout}"
            );
            assert_eq!(scode, Some(0), "server:\n{sout}\nclient:\n{cout}");
            let bytes = format!("{} bytes in ", size.parse::<u64>().unwrap() * 500 * 2);
            for out in [&cout, &sout] {
                assert!(out.contains("  remote address: LID"), "{out}");
                assert!(out.contains(&bytes), "{out}");
                assert!(out.contains("500 iters in "), "{out}");
            }
        }
    }
}

/// `rping`: the two processes' connection managers connect over QP1, five pings are
/// validated (-V), and both sides see the disconnect.
#[test]
#[ignore = "needs wine and the Windows build"]
fn rping_between_windows_and_linux_both_ways() {
    let _one = serial();
    for (windows_is, server_ip) in [(WindowsIs::Server, WIN_V4), (WindowsIs::Client, LIN_V4)] {
        let p = free_port();
        let server = [
            "rping",
            "-s",
            "-d",
            "-a",
            server_ip,
            "-p",
            &p,
            "-v",
            "-S",
            "100",
            "--timeout",
            "60",
        ];
        let client = [
            "rping",
            "-c",
            "-a",
            server_ip,
            "-p",
            &p,
            "-v",
            "-V",
            "-S",
            "100",
            "-C",
            "5",
            "--timeout",
            "60",
        ];
        let [(scode, sout), (ccode, cout)] = run_pair(
            windows_is,
            &server,
            &client,
            "rdma_listen on",
            [WIN_V4, LIN_V4],
        );
        assert_eq!(
            ccode,
            Some(0),
            "client ({windows_is:?} is Windows):\n{cout}\nserver:\n{sout}"
        );
        assert_eq!(scode, Some(0), "server:\n{sout}\nclient:\n{cout}");
        for (out, prefix) in [(&cout, "ping data: "), (&sout, "server ping data: ")] {
            let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
            assert_eq!(lines.len(), 5, "{out}");
            for (n, line) in lines.iter().enumerate() {
                assert!(
                    line[prefix.len()..].starts_with(&format!("rdma-ping-{n}: ")),
                    "{line}"
                );
            }
        }
        assert!(sout.contains("server DISCONNECT EVENT..."), "{sout}");
        assert!(cout.contains("client DISCONNECT EVENT..."), "{cout}");
    }
}

/// IPv6, the family to use on Windows when the peer checks the ICRC against the header it
/// got (no identification field): `perf write_bw` both ways between ::1 (Windows) and
/// fd00:77::2 (Linux, added to lo), the TCP side channel on IPv4 loopback.
#[test]
#[ignore = "needs wine, the Windows build and root (adds fd00:77::2 to lo)"]
fn perf_write_bw_over_ipv6_between_windows_and_linux_both_ways() {
    let _one = serial();
    let out = Command::new("ip")
        .args([
            "-6",
            "addr",
            "replace",
            "fd00:77::2/128",
            "dev",
            "lo",
            "nodad",
        ])
        .output()
        .expect("iproute2's ip runs");
    assert!(
        out.status.success(),
        "adding fd00:77::2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The exchange's TCP listener is IPv4 (as perftest's): the client names it by 127.0.0.1,
    // whichever side listens, and the GIDs it exchanges are the IPv6 ones.
    perf_write_bw_with(
        WindowsIs::Server,
        ["::1", "fd00:77::2"],
        "127.0.0.1",
        "auto",
    );
    perf_write_bw_with(
        WindowsIs::Client,
        ["::1", "fd00:77::2"],
        "127.0.0.1",
        "auto",
    );
}

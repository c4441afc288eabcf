//! Runs every program in `examples/` (built by `cargo test` next to this test) on both
//! backends of the embedded fabric and checks what it prints: the examples are documentation
//! that must keep working.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the programs finish in well under a second, but CI machines are shared.
const PATIENCE: Duration = Duration::from_secs(120);

/// `target/<profile>/examples/<name>`: this test runs from `target/<profile>/deps`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// Runs example `name` with `args`; returns its standard output, after checking that it
/// exited with success within [`PATIENCE`].
fn run(name: &str, args: &[&str]) -> String {
    let path = example(name);
    assert!(
        path.exists(),
        "{} is missing: cargo test builds the examples",
        path.display()
    );
    let mut child = Command::new(&path)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
    let start = Instant::now();
    while child.try_wait().expect("waiting for the example").is_none() {
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("{name} {args:?} ran past {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("the example's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The device pairs every example runs on: two software devices, two emulated ConnectX-3s.
const PAIRS: [[&str; 2]; 2] = [["soft0", "soft1"], ["mlx4_0", "mlx4_1"]];

#[test]
fn rc_write() {
    for pair in PAIRS {
        assert_eq!(
            run("rc_write", &pair),
            "b holds: written by RDMA\n",
            "{pair:?}"
        );
    }
}

#[test]
fn send_recv_events() {
    for pair in PAIRS {
        let want: String = (0..3)
            .map(|i| format!("received \"message {i}\" with immediate {}\n", 100 + i))
            .collect();
        assert_eq!(run("send_recv_events", &pair), want, "{pair:?}");
    }
}

#[test]
fn ud_send() {
    for pair in PAIRS {
        let out = run("ud_send", &pair);
        assert!(
            out.starts_with("b got \"a datagram\" from QP 0x")
                && out.ends_with(" (50 bytes with the GRH)\n"),
            "{pair:?}: {out}"
        );
    }
}

#[test]
fn srq_server() {
    for pair in PAIRS {
        let out = run("srq_server", &pair);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{pair:?}: {out}");
        for (i, line) in lines[..3].iter().enumerate() {
            assert!(
                line.ends_with(&format!(", buffer {i}: hello from client {i}")),
                "{pair:?}: {line}"
            );
        }
        assert!(
            lines[3].starts_with("SrqLimitReached on Srq("),
            "{pair:?}: {}",
            lines[3]
        );
    }
}

#[cfg(feature = "tokio")]
#[test]
fn tokio_echo() {
    for pair in PAIRS {
        assert_eq!(
            run("tokio_echo", &pair),
            "echo: ping 0\necho: ping 1\necho: ping 2\n",
            "{pair:?}"
        );
    }
}

/// The CM needs QP1, which mlx4 does not have yet: the soft pair only.
#[test]
fn cm_connect() {
    assert_eq!(
        run("cm_connect", &["soft0", "soft1"]),
        "client: connected, reply \"welcome\"\n\
         client: after disconnect the receive completed with Work Request Flushed Error\n\
         server: request said \"hello\", received \"ping\"\n",
    );
}

/// A multicast join through the CM (which needs QP1, which mlx4 does not have yet): the soft
/// pair only.
#[test]
fn mcast_join() {
    assert_eq!(
        run("mcast_join", &["soft0", "soft1"]),
        "receiver joined 239.1.2.3: MGID ::ffff:239.1.2.3, send to QPN 0xffffff with Q_Key 0x1234567\n\
         sender: send completed with success\n\
         receiver: \"hello, group\" from QP the sender's\n\
         both left 239.1.2.3\n",
    );
}

/// Runs example `name` as a server (`server`) on a UDP-bound device of `127.0.<net>.1`, then
/// as its client (`client 127.0.<net>.1`) on `127.0.<net>.2` — again while the server is not
/// listening yet — and returns both outputs, server first.
#[cfg(target_os = "linux")]
fn server_and_client(name: &str, net: u8) -> [String; 2] {
    let (server_ip, client_ip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let mut server = Command::new(example(name))
        .arg("server")
        .env("PORTVERBS_UDP", &server_ip)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the server starts");
    let mut tries = 0;
    let client = loop {
        tries += 1;
        let out = Command::new(example(name))
            .args(["client", &server_ip])
            .env("PORTVERBS_UDP", &client_ip)
            .output()
            .expect("the client runs");
        let err = String::from_utf8_lossy(&out.stderr);
        // Refused (REJ 8, or a SIDR_REP without a service): nobody listens yet.
        let refused = err.contains("Rejected") || err.contains("ServiceRejected");
        if out.status.success() || !refused || tries == 40 {
            break out;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !client.status.success() {
        let _ = server.kill();
    }
    let server = server.wait_with_output().expect("the server ends");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        client.status.success() && server.status.success(),
        "{name}: client {}: {}{}\nserver {}: {}{}",
        client.status,
        text(&client.stdout),
        text(&client.stderr),
        server.status,
        text(&server.stdout),
        text(&server.stderr)
    );
    [text(&server.stdout), text(&client.stdout)]
}

/// librdmacm's `ucmatose`, `udaddy` and `rdma_server`/`rdma_client` as examples: each run as
/// server and client in two processes (they interoperate with the C programs the same way).
#[cfg(target_os = "linux")]
#[test]
fn librdmacm_examples_between_two_processes() {
    let [s, c] = server_and_client("ucmatose", 150);
    assert!(
        s.starts_with("server: 10 messages of 100 bytes each way with 127.0.150.2:"),
        "{s}"
    );
    assert_eq!(
        c,
        "client: 10 messages of 100 bytes each way, disconnected\n"
    );
    let [s, c] = server_and_client("udaddy", 151);
    assert!(
        s.starts_with("server: 10 datagrams from 127.0.151.2 QP 0x"),
        "{s}"
    );
    assert!(c.starts_with("client: 10 datagrams to QP 0x"), "{c}");
    let [s, c] = server_and_client("rdma_pair", 152);
    assert!(s.starts_with("server: answered 127.0.152.2:"), "{s}");
    assert_eq!(c, "client: sent 16 bytes, got 16 back\n");
}

/// Every file in `examples/` has a test here (a new example without one fails this).
#[test]
fn every_example_is_run() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.strip_suffix(".rs").map(str::to_owned))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cm_connect",
            "mcast_join",
            "rc_write",
            "rdma_pair",
            "send_recv_events",
            "srq_server",
            "tokio_echo",
            "ucmatose",
            "ud_send",
            "udaddy"
        ]
    );
}

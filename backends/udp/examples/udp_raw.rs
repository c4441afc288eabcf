//! The raw UDP baseline of BENCHMARKS.md's UDP figures, one side per process:
//!
//! ```text
//! udp_raw sink  <addr:port> [--gro] [--secs N]           # prints what arrived
//! udp_raw blast <from:port> <to:port> <size> [--gso] [--secs N]
//! udp_raw pong  <addr:port> --iters N                     # returns N datagrams
//! udp_raw ping  <from:port> <to:port> <size> --iters N    # prints one-way latency
//! ```
//!
//! sink and blast print `<role> datagrams=<n> bytes=<n> secs=<s> mpps=<x> gbps=<x>`; ping
//! prints `ping iters=<n> min_us=<x> typical_us=<x> p999_us=<x>` (half of each round trip,
//! both sides busy-polling, as perftest's latency tests do).
//! `benches/udp.sh` runs the pairs next to Portverbs' own.

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use portverbs_udp::baseline::{RawFigures, blast, ping, pong, sink};

    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    let iters = args
        .iter()
        .position(|a| a == "--iters")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(10_000);
    let addr = |i: usize| -> Option<SocketAddr> { args.get(i)?.parse().ok() };
    let print = |role: &str, f: RawFigures| {
        println!(
            "{role} datagrams={} bytes={} secs={:.3} mpps={:.3} gbps={:.3}",
            f.datagrams,
            f.bytes,
            f.elapsed.as_secs_f64(),
            f.mpps(),
            f.gbit_per_s()
        );
    };
    let result = match args.first().map(String::as_str) {
        Some("sink") => match addr(1) {
            Some(at) => {
                // Runs until the sender has been quiet for the whole of a `secs + 2` window.
                let stop = Arc::new(AtomicBool::new(false));
                sink(at, flag("--gro"), stop, Duration::from_secs_f64(secs + 2.0))
                    .map(|f| print("sink", f))
            }
            None => Err(std::io::Error::other("sink <addr:port>")),
        },
        Some("blast") => match (addr(1), addr(2), args.get(3).and_then(|s| s.parse().ok())) {
            (Some(from), Some(to), Some(size)) => {
                blast(from, to, size, flag("--gso"), Duration::from_secs_f64(secs))
                    .map(|f| print("blast", f))
            }
            _ => Err(std::io::Error::other("blast <from:port> <to:port> <size>")),
        },
        Some("pong") => match addr(1) {
            Some(at) => pong(at, iters),
            None => Err(std::io::Error::other("pong <addr:port>")),
        },
        Some("ping") => match (addr(1), addr(2), args.get(3).and_then(|s| s.parse().ok())) {
            (Some(from), Some(to), Some(size)) => ping(from, to, size, iters).map(|l| {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                println!(
                    "ping iters={} min_us={:.2} typical_us={:.2} p999_us={:.2}",
                    l.iters,
                    us(l.min),
                    us(l.typical),
                    us(l.p99_9)
                );
            }),
            _ => Err(std::io::Error::other("ping <from:port> <to:port> <size>")),
        },
        _ => Err(std::io::Error::other(
            "usage: udp_raw sink <addr:port> [--gro] | blast <from> <to> <size> [--gso] | \
             pong <addr:port> | ping <from> <to> <size>",
        )),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp_raw: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {}

//! Congestion control off and on, side by side (`cargo bench --bench congestion`): N RC QPs
//! on a few sender devices push RDMA WRITEs through one 10 Gbit/s bottleneck (an RTT of about
//! 50 µs, a queue of one bandwidth-delay product) on a stepped fabric, with the transport's
//! congestion control off, on, and on with ECN marking at the queue; and a 64-byte `send_lat`
//! probe (perftest's `ib_send_lat` ping-pong) sharing the bottleneck with 32 of those QPs;
//! and one QP behind a queue of a quarter of a BDP, its path paced and not.
//! Prints Markdown tables (`BENCHMARKS.md`, "Congestion: many QPs through one bottleneck").
//!
//! Every figure is in the fabric's virtual time, so a run repeats exactly: the machine's load
//! changes only how long the bench takes. The harness is the congestion tests'
//! (`tests/util/congestion/mod.rs`).

#[path = "../tests/util/congestion/mod.rs"]
mod congestion_util;

use congestion_util::{Config, Figures, run_bottleneck};
use portverbs::prelude::*;

/// The fabric's seed of every run.
const SEED: u64 = 1;

/// A mode of the transport and the queue.
#[derive(Clone, Copy)]
enum Cc {
    Off,
    On,
    OnEcn,
}

impl Cc {
    fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
            Self::OnEcn => "on + ECN",
        }
    }

    fn apply(self, c: Config) -> Config {
        match self {
            Self::Off => c.without_cc(),
            Self::On => c,
            Self::OnEcn => c.with_ecn(),
        }
    }
}

/// Virtual time the drain may take: long enough for a QP without progress to run out of
/// retries (8 local ACK timeouts of 67 ms, backed off up to 8×), so that it is counted as
/// RETRY_EXC_ERR rather than as incomplete.
const DRAIN_NS: u64 = 10_000_000_000;

/// The configurations of `tests/congestion.rs` for N = 1, 8, 32 and 256 QPs.
fn bulk(qps: usize) -> Config {
    let c = match qps {
        1 => Config::new(SEED, 1, 1, 64 << 10, Mtu::Mtu4096),
        8 => Config::new(SEED, 2, 8, 64 << 10, Mtu::Mtu4096),
        32 => Config {
            depth: 8,
            ..Config::new(SEED, 4, 32, 4 << 10, Mtu::Mtu1024)
        },
        _ => Config {
            depth: 2,
            duration_ns: 12_000_000,
            warmup_ns: 4_000_000,
            ..Config::new(SEED, 4, qps, 4 << 10, Mtu::Mtu1024)
        },
    };
    Config {
        drain_ns: DRAIN_NS,
        ..c
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn main() {
    let modes = [Cc::Off, Cc::On, Cc::OnEcn];
    let mut rows = Vec::new();
    for mode in modes {
        for n in [1, 8, 32, 256] {
            let c = mode.apply(bulk(n));
            let f = run_bottleneck(&c);
            eprintln!("{}", f.line(mode.name(), &c));
            rows.push((mode, c, f));
        }
    }
    let mut probes: Vec<(Cc, Config, Figures)> = Vec::new();
    for mode in modes {
        let c = mode.apply(bulk(32)).with_probe();
        let f = run_bottleneck(&c);
        eprintln!("{}", f.line(mode.name(), &c));
        probes.push((mode, c, f));
    }

    println!(
        "| CC | N QPs (senders) | goodput | Jain | retransmitted | drops | CE marks | \
         RETRY_EXC_ERR | incomplete |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, c, f) in &rows {
        println!(
            "| {} | {} ({}) | {:.1} % | {:.3} | {:.1} % | {} | {} | {} | {} |",
            mode.name(),
            c.qps,
            c.senders,
            f.goodput * 100.0,
            f.jain,
            f.retransmit_fraction * 100.0,
            f.queue_drops,
            f.ce_marked,
            f.retry_exceeded(),
            f.incomplete.len(),
        );
    }
    let mut paced = Vec::new();
    for queue in [16u64 << 10, 24 << 10] {
        for burst in [0, 4] {
            let mut c = Config {
                queue_bytes: queue,
                depth: 8,
                ..bulk(1)
            };
            c.cc.pace_burst = burst;
            let f = run_bottleneck(&c);
            eprintln!("{}", f.line("pacing", &c));
            paced.push((c, f));
        }
    }
    println!();
    println!("| 1 QP behind a shallow queue | pacing burst | goodput | retransmitted | drops |");
    println!("|---|---|---|---|---|");
    for (c, f) in &paced {
        let burst = match c.cc.pace_burst {
            0 => "none (window only)".to_string(),
            n => format!("{n} packets"),
        };
        println!(
            "| {} KiB | {burst} | {:.1} % | {:.1} % | {} |",
            c.queue_bytes >> 10,
            f.goodput * 100.0,
            f.retransmit_fraction * 100.0,
            f.queue_drops,
        );
    }
    println!();
    println!(
        "| CC | send_lat 64 B beside 32 QPs: round trips | p50 | p99 | max | lost | \
         resent | local ACK timeouts | bulk goodput |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, _, f) in &probes {
        println!(
            "| {} | {} | {:.1} µs | {:.1} µs | {:.1} µs | {} | {} | {} | {:.1} % |",
            mode.name(),
            f.probe_rtts_ns.len(),
            us(f.probe_p50_ns),
            us(f.probe_p99_ns),
            us(f.probe_max_ns),
            f.probe_lost,
            f.probe_retransmits,
            f.probe_timeouts,
            f.goodput * 100.0,
        );
    }
}

//! Congestion in the deterministic simulator: N RC QPs on M sender devices push RDMA WRITEs
//! through one bottleneck (the output queue and link in front of the receiver's port,
//! [`Bottleneck`]) on a stepped fabric, and the run is judged as a congestion-controlled
//! transport should pass it: every completion successful with the data in place, goodput of at
//! least 90 % of the bottleneck's rate, a fair share per QP (Jain's index ≥ 0.9), few
//! retransmissions with a queue of one bandwidth-delay product, and — with ECN marking
//! (RFC 3168) — no drops at all once the senders have reacted.
//!
//! Without congestion control the senders overrun the queue, lose the tail of their bursts and
//! go back N (IBA 9.7.5.1.3) into the same full queue, and QPs end in RETRY_EXC_ERR. The
//! transport's congestion control (`backends/transport/src/congestion.rs`: a window per path
//! cut on round trips above target, on loss and on CNPs, with probe timeouts for lost tails)
//! is what these tests hold to the figures above.
//!
//! The harness is `tests/util/congestion/mod.rs` (shared with `benches/congestion.rs`):
//! [`run_bottleneck`] runs one configuration and returns its [`Figures`]; every test prints
//! them (`cargo test --test congestion -- --nocapture`).

#[path = "util/congestion/mod.rs"]
mod congestion_util;

use congestion_util::{Config, Figures, PROBE_BYTES, jain, run_bottleneck};
use portverbs::prelude::*;

/// Runs `configs`, prints every run's figures, then checks them all: every completion
/// successful with its data in place, goodput ≥ 90 % of the bottleneck, Jain ≥ 0.9,
/// retransmitted bytes ≤ 5 % of goodput, and with ECN marking no drops in the window.
fn check(name: &str, configs: &[Config]) {
    let runs: Vec<(Config, Figures)> = configs.iter().map(|c| (*c, run_bottleneck(c))).collect();
    for (c, f) in &runs {
        eprintln!("{}", f.line(name, c));
    }
    for (c, f) in &runs {
        let tag = format!("{name} seed {}", c.seed);
        assert!(
            f.failures.is_empty(),
            "{tag}: failed completions {:?}",
            f.failures
        );
        assert!(
            f.incomplete.is_empty(),
            "{tag}: QPs whose WRITEs never completed {:?}",
            f.incomplete
        );
        assert!(
            f.bad_data.is_empty(),
            "{tag}: wrong data on QPs {:?}",
            f.bad_data
        );
        assert_eq!(f.unchecked, 0, "{tag}: QPs that completed nothing");
        assert!(
            f.max_queue_bytes <= c.queue_bytes,
            "{tag}: the queue overflowed silently"
        );
        assert!(
            f.goodput >= 0.9,
            "{tag}: goodput {:.1} % of the bottleneck",
            f.goodput * 100.0
        );
        assert!(f.jain >= 0.9, "{tag}: Jain's index {:.3}", f.jain);
        assert!(
            f.retransmit_fraction <= 0.05,
            "{tag}: retransmitted {:.1} % of goodput",
            f.retransmit_fraction * 100.0
        );
        if c.ecn.is_some() {
            assert_eq!(
                f.window_drops, 0,
                "{tag}: drops at steady state with ECN marking"
            );
        }
    }
}

const SEEDS: [u64; 4] = [1, 2, 3, 4];

#[test]
fn one_qp_fills_the_bottleneck() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| Config::new(s, 1, 1, 64 << 10, Mtu::Mtu4096))
        .collect();
    check("1 QP", &configs);
}

#[test]
fn eight_qps_on_two_senders_share_the_bottleneck() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| Config::new(s, 2, 8, 64 << 10, Mtu::Mtu4096))
        .collect();
    check("8 QPs", &configs);
}

#[test]
fn thirty_two_qps_on_four_senders_share_the_bottleneck() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| Config {
            depth: 8,
            ..Config::new(s, 4, 32, 4 << 10, Mtu::Mtu1024)
        })
        .collect();
    check("32 QPs", &configs);
}

#[test]
fn two_hundred_fifty_six_qps_on_four_senders_share_the_bottleneck() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| Config {
            depth: 2,
            duration_ns: 12_000_000,
            warmup_ns: 4_000_000,
            ..Config::new(s, 4, 256, 4 << 10, Mtu::Mtu1024)
        })
        .collect();
    check("256 QPs", &configs);
}

#[test]
fn eight_qps_with_ecn_marking_do_not_drop_at_steady_state() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| Config::new(s, 2, 8, 64 << 10, Mtu::Mtu4096).with_ecn())
        .collect();
    check("8 QPs ECN", &configs);
}

#[test]
fn thirty_two_qps_with_ecn_marking_do_not_drop_at_steady_state() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .map(|&s| {
            Config {
                depth: 8,
                ..Config::new(s, 4, 32, 4 << 10, Mtu::Mtu1024)
            }
            .with_ecn()
        })
        .collect();
    check("32 QPs ECN", &configs);
}

#[test]
fn jain_index_of_equal_and_skewed_shares() {
    assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
    assert!((jain(&[1, 0, 0, 0]) - 0.25).abs() < 1e-12);
    assert!(jain(&[0, 0]) == 0.0);
}

/// The control experiment: with a queue that holds every WRITE the senders can have
/// outstanding, nothing is dropped and the same checks pass today, so a failure of the tests
/// above is the transport's, not the harness's.
#[test]
fn a_queue_that_holds_every_outstanding_write_passes_the_same_checks() {
    let configs: Vec<Config> = SEEDS
        .iter()
        .flat_map(|&s| {
            let big = Config::new(s, 2, 8, 64 << 10, Mtu::Mtu4096);
            let small = Config {
                depth: 8,
                ..Config::new(s, 4, 32, 4 << 10, Mtu::Mtu1024)
            };
            [big, small].map(|c| Config {
                queue_bytes: 2 * (c.qps as u64) * u64::from(c.depth * c.msg_bytes),
                ..c
            })
        })
        .collect();
    check("control", &configs);
}

/// A `send_lat` probe (perftest's `ib_send_lat`: 64-byte SENDs in ping-pong, RC) shares the
/// bottleneck with 32 bulk QPs. Without congestion control the WRITEs keep the queue full and
/// overflowing, and the probe's packets queue behind them or are dropped and wait for a
/// retransmission; with it the queue stays near the delay target. Every probe message must
/// arrive in both runs, and the probe's 99th-percentile round trip with congestion control
/// must be at most a fifth of the same seed's without.
#[test]
fn congestion_control_keeps_a_send_lat_probe_fast_beside_thirty_two_qps() {
    assert_eq!(PROBE_BYTES, 64);
    for seed in [1, 2] {
        let on = Config {
            depth: 8,
            ..Config::new(seed, 4, 32, 4 << 10, Mtu::Mtu1024)
        }
        .with_probe();
        let off = on.without_cc();
        let (f_on, f_off) = (run_bottleneck(&on), run_bottleneck(&off));
        eprintln!("{}", f_on.line("probe", &on));
        eprintln!("{}", f_off.line("probe", &off));
        let tag = format!("probe seed {seed}");
        for (f, cc) in [(&f_on, "on"), (&f_off, "off")] {
            assert_eq!(f.probe_lost, 0, "{tag}: probe messages lost with CC {cc}");
            assert!(
                !f.probe_rtts_ns.is_empty(),
                "{tag}: no probe round trip with CC {cc}"
            );
        }
        assert!(
            f_on.probe_rtts_ns.len() >= 100,
            "{tag}: only {} probe round trips with CC on",
            f_on.probe_rtts_ns.len()
        );
        assert!(
            f_off.probe_p99_ns >= 5 * f_on.probe_p99_ns,
            "{tag}: probe p99 {} ns with CC on, {} ns without: not 5x apart",
            f_on.probe_p99_ns,
            f_off.probe_p99_ns
        );
    }
}

/// Pacing: behind a queue of a quarter of a bandwidth-delay product (four to six packets of
/// 4 KiB), a window that leaves in bursts loses their tails. Each path's pacing bucket (four
/// packets back to back, refilled at 1.25 windows per round trip) must at least halve the
/// drops and raise goodput, one QP alone on the path, against the same run without pacing.
#[test]
fn pacing_spreads_a_window_over_a_shallow_queue() {
    for (queue, seed) in [(16 << 10, 1), (16 << 10, 2), (24 << 10, 1), (24 << 10, 2)] {
        let paced = Config {
            queue_bytes: queue,
            depth: 8,
            ..Config::new(seed, 1, 1, 64 << 10, Mtu::Mtu4096)
        };
        assert_eq!(paced.cc.pace_burst, 4);
        let mut bursty = paced;
        bursty.cc.pace_burst = 0;
        let (f_paced, f_bursty) = (run_bottleneck(&paced), run_bottleneck(&bursty));
        eprintln!("{}", f_paced.line("paced", &paced));
        eprintln!("{}", f_bursty.line("bursty", &bursty));
        let tag = format!("queue {queue} B seed {seed}");
        for f in [&f_paced, &f_bursty] {
            assert!(f.failures.is_empty(), "{tag}: {:?}", f.failures);
            assert!(f.bad_data.is_empty() && f.incomplete.is_empty(), "{tag}");
        }
        assert!(
            2 * f_paced.queue_drops <= f_bursty.queue_drops,
            "{tag}: {} drops paced, {} without",
            f_paced.queue_drops,
            f_bursty.queue_drops
        );
        assert!(
            f_paced.goodput > f_bursty.goodput,
            "{tag}: goodput {:.3} paced, {:.3} without",
            f_paced.goodput,
            f_bursty.goodput
        );
    }
}

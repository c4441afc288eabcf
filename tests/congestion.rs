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
//! [`run_bottleneck`] runs one configuration and returns its [`Figures`]; every test prints
//! them (`cargo test --test congestion -- --nocapture`).

#![allow(unreachable_pub)]

use std::time::{Duration, Instant};

use portverbs::prelude::*;
use portverbs::soft::{
    Bottleneck, DeviceConfig, EcnMarking, Fabric, FabricConfig, LinkFaults, Mode, SoftDevice,
};
use portverbs::verbs::ContextOptions;

/// One bottleneck experiment.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Seed of the fabric (marking draws, the devices' identifiers).
    pub seed: u64,
    /// Sender devices (M); the QPs are spread over them round-robin.
    pub senders: usize,
    /// RC QPs (N), each connected to a QP of its own on the receiver.
    pub qps: usize,
    /// Bytes of each RDMA WRITE.
    pub msg_bytes: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// WRITEs each QP keeps outstanding (its send queue is kept this full).
    pub depth: u32,
    /// Bottleneck rate, bits per second.
    pub rate_bps: u64,
    /// One-way link delay (the RTT is twice this plus serialisation and queueing).
    pub delay_ns: u64,
    /// Queue in front of each port, bytes.
    pub queue_bytes: u64,
    /// CE marking, if any (the engines send RC requests ECT(0), as RoCE NICs running DCQCN
    /// do, so they are marked instead of dropped).
    pub ecn: Option<EcnMarking>,
    /// Virtual time the senders keep their queues full.
    pub duration_ns: u64,
    /// Start of the measurement window: goodput, fairness and "drops at steady state" count
    /// from here to `duration_ns`. QPs start within the first [`START_SPREAD`] poll rounds.
    pub warmup_ns: u64,
    /// Local ACK timeout code (IBA 9.7.6.1.3: 4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retries of a request before RETRY_EXC_ERR.
    pub retry_cnt: u8,
    /// How often (virtual ns) the application polls its CQs and refills the send queues.
    pub poll_ns: u64,
}

/// 10 Gbit/s.
pub const RATE: u64 = 10_000_000_000;
/// One-way delay: an RTT of about 50 µs.
pub const DELAY: u64 = 25_000;
/// One bandwidth-delay product at [`RATE`] and an RTT of 2 × [`DELAY`]: 62.5 KB.
pub const BDP: u64 = RATE / 8 * 2 * DELAY / 1_000_000_000;

impl Config {
    /// `qps` QPs on `senders` devices writing `msg_bytes` at a time, through a 10 Gbit/s
    /// bottleneck with a one-BDP queue, for 20 ms of virtual time (5 ms warm-up), with
    /// perftest's QP parameters (timeout 14, retry_cnt 7).
    pub fn new(seed: u64, senders: usize, qps: usize, msg_bytes: u32, mtu: Mtu) -> Self {
        Self {
            seed,
            senders,
            qps,
            msg_bytes,
            mtu,
            depth: 16,
            rate_bps: RATE,
            delay_ns: DELAY,
            queue_bytes: BDP,
            ecn: None,
            duration_ns: 20_000_000,
            warmup_ns: 5_000_000,
            timeout: 14,
            retry_cnt: 7,
            poll_ns: 5_000,
        }
    }

    /// The same with RED-like CE marking from a tenth of the queue, rising to 10 % at half of
    /// it.
    pub fn with_ecn(mut self) -> Self {
        self.ecn = Some(EcnMarking {
            min_bytes: self.queue_bytes / 10,
            max_bytes: self.queue_bytes / 2,
            max_probability: 0.1,
        });
        self
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Bytes each QP completed successfully inside the measurement window.
    pub per_qp_bytes: Vec<u64>,
    /// Bytes completed successfully over the whole run (window, warm-up and drain).
    pub total_bytes: u64,
    /// Goodput in the window as a fraction of the bottleneck rate.
    pub goodput: f64,
    /// Jain's fairness index over `per_qp_bytes`: (Σx)² / (n Σx²).
    pub jain: f64,
    /// Packets the senders' engines retransmitted.
    pub retransmits: u64,
    /// Retransmitted bytes (packets × MTU) over `total_bytes`.
    pub retransmit_fraction: f64,
    /// Packets the bottleneck dropped, over the whole run.
    pub queue_drops: u64,
    /// Of those, dropped inside the measurement window.
    pub window_drops: u64,
    /// Packets the bottleneck CE-marked.
    pub ce_marked: u64,
    /// The fullest any queue got, bytes.
    pub max_queue_bytes: u64,
    /// The first unsuccessful completion of every QP that had one: (QP index, status).
    pub failures: Vec<(usize, WcStatus)>,
    /// QPs with WRITEs still outstanding when the drain gave up (neither completed nor
    /// failed after 2 s of virtual time).
    pub incomplete: Vec<usize>,
    /// QPs whose written data did not match their source on the receiver.
    pub bad_data: Vec<usize>,
    /// QPs that completed no WRITE at all (their data could not be checked).
    pub unchecked: usize,
    /// Virtual time at the end of the drain.
    pub end_ns: u64,
    /// Wall-clock time of the run (reported, never asserted).
    pub wall: Duration,
}

impl Figures {
    /// One line for the test log.
    pub fn line(&self, name: &str, c: &Config) -> String {
        format!(
            "{name} seed {}: N={} M={} msg={} goodput {:.1} % jain {:.3} retrans {} pkts \
             ({:.1} % of goodput) drops {} (window {}) ce {} maxq {} B of {} failures {} \
             (first {:?}) incomplete {} bad data {} unchecked {} end {:.1} ms wall {:.2?}{}",
            c.seed,
            c.qps,
            c.senders,
            c.msg_bytes,
            self.goodput * 100.0,
            self.jain,
            self.retransmits,
            self.retransmit_fraction * 100.0,
            self.queue_drops,
            self.window_drops,
            self.ce_marked,
            self.max_queue_bytes,
            c.queue_bytes,
            self.failures.len(),
            self.failures.first(),
            self.incomplete.len(),
            self.bad_data.len(),
            self.unchecked,
            self.end_ns as f64 / 1e6,
            self.wall,
            {
                // QP q runs on sender q % M.
                let mut per_sender = vec![0u64; c.senders];
                for (q, b) in self.per_qp_bytes.iter().enumerate() {
                    per_sender[q % c.senders] += b >> 10;
                }
                let mut s = format!(" per-sender KiB {per_sender:?}");
                if self.per_qp_bytes.len() <= 32 {
                    let kib: Vec<u64> = self.per_qp_bytes.iter().map(|b| b >> 10).collect();
                    s += &format!(" per-QP KiB {kib:?}");
                }
                s
            },
        )
    }
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one has everything.
pub fn jain(x: &[u64]) -> f64 {
    let sum: f64 = x.iter().map(|&v| v as f64).sum();
    let squares: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

/// QPs start posting in one of this many poll rounds, drawn from the seed: the only thing a
/// seed changes when nothing is marked (the fabric is otherwise deterministic).
const START_SPREAD: u64 = 8;

/// SplitMix64's output function: a seeded, well-spread hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Deterministic data of slot `slot` of QP `qp`.
fn pattern(qp: usize, slot: u32, len: usize) -> Vec<u8> {
    let seed = (qp as u32).wrapping_mul(0x9e37_79b9) ^ slot.wrapping_mul(0x85eb_ca6b);
    (0..len)
        .map(|i| {
            (i as u32).wrapping_mul(31).wrapping_add(seed).to_le_bytes()[0] ^ (seed >> 8) as u8
        })
        .collect()
}

/// One QP of the experiment: where it lives and how far it got.
struct Flow {
    sender: usize,
    qp: Qp,
    /// Offset of its region in its sender's buffer and in the receiver's.
    src_off: usize,
    dst_off: usize,
    /// The poll round at which it starts posting (seeded, so that seeds differ).
    starts_at: u64,
    posted: u64,
    outstanding: u32,
    completed: u64,
    window_bytes: u64,
    failed: bool,
}

/// Runs one experiment on a fresh stepped fabric.
///
/// # Panics
/// When a device, QP or memory region cannot be made (a broken set-up, not a finding).
pub fn run_bottleneck(c: &Config) -> Figures {
    let wall = Instant::now();
    let fabric = Fabric::new(FabricConfig {
        mode: Mode::Stepped,
        seed: c.seed,
        faults: LinkFaults {
            delay_ns: c.delay_ns,
            ..LinkFaults::NONE
        },
        capture: None,
        bottleneck: Some(Bottleneck {
            rate_bps: c.rate_bps,
            queue_bytes: c.queue_bytes,
            ecn: c.ecn,
        }),
    });
    let attach = |ip: String| {
        SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap()
    };
    let receiver_dev = attach("10.0.1.1".into());
    let sender_devs: Vec<SoftDevice> = (0..c.senders)
        .map(|i| attach(format!("10.0.0.{}", i + 1)))
        .collect();
    let open = |d: &SoftDevice| {
        Context::open_blocking(AnyDevice::Soft(d.clone()), ContextOptions::default()).unwrap()
    };
    let rx_ctx = open(&receiver_dev);
    let tx_ctxs: Vec<Context> = sender_devs.iter().map(open).collect();

    let region = (c.depth * c.msg_bytes) as usize;
    let per_sender = c.qps.div_ceil(c.senders);
    let rx_pd = rx_ctx.alloc_pd_blocking().unwrap();
    let rx_buf = rx_ctx.alloc_buffer(region * c.qps).unwrap();
    let rx_mr = rx_pd
        .reg_mr_blocking(
            &rx_buf,
            0..region * c.qps,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let rx_cq = rx_ctx
        .create_cq_blocking(CqInit {
            entries: 64,
            ..CqInit::default()
        })
        .unwrap();
    let tx_pds: Vec<Pd> = tx_ctxs
        .iter()
        .map(|x| x.alloc_pd_blocking().unwrap())
        .collect();
    let tx_bufs: Vec<Buffer> = tx_ctxs
        .iter()
        .map(|x| x.alloc_buffer(region * per_sender).unwrap())
        .collect();
    let tx_mrs: Vec<Mr> = tx_pds
        .iter()
        .zip(&tx_bufs)
        .map(|(pd, b)| {
            pd.reg_mr_blocking(b, 0..region * per_sender, AccessFlags::LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    let tx_cqs: Vec<Cq> = tx_ctxs
        .iter()
        .map(|x| {
            x.create_cq_blocking(CqInit {
                entries: (per_sender as u32 * c.depth).max(64),
                ..CqInit::default()
            })
            .unwrap()
        })
        .collect();
    let caps = QpCaps {
        max_send_wr: c.depth,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let opts = ConnectOptions {
        psn: 0,
        mtu: Some(c.mtu),
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: 7,
        // Traffic class 0: the engine itself sends RC requests ECT(0).
        ..ConnectOptions::default()
    };
    let mut rx_qps = Vec::with_capacity(c.qps);
    let mut flows = Vec::with_capacity(c.qps);
    for q in 0..c.qps {
        let sender = q % c.senders;
        let slot = q / c.senders;
        let qp_init = |pd: &Pd, cq: &Cq| {
            pd.create_qp_blocking(QpInit {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                caps,
                sq_sig_all: false,
                special: None,
            })
            .unwrap()
        };
        let tx = qp_init(&tx_pds[sender], &tx_cqs[sender]);
        let rx = qp_init(&rx_pd, &rx_cq);
        let (etx, erx) = (
            tx.endpoint_blocking(&opts).unwrap(),
            rx.endpoint_blocking(&opts).unwrap(),
        );
        tx.connect_rc_blocking(&erx, &opts).unwrap();
        rx.connect_rc_blocking(&etx, &opts).unwrap();
        let src_off = slot * region;
        for s in 0..c.depth {
            let off = src_off + (s * c.msg_bytes) as usize;
            tx_bufs[sender]
                .write(off, &pattern(q, s, c.msg_bytes as usize))
                .unwrap();
        }
        rx_qps.push(rx);
        flows.push(Flow {
            sender,
            qp: tx,
            src_off,
            dst_off: q * region,
            starts_at: mix(c.seed ^ mix(q as u64)) % START_SPREAD,
            posted: 0,
            outstanding: 0,
            completed: 0,
            window_bytes: 0,
            failed: false,
        });
    }
    fabric.run_until_idle().unwrap();

    let remote_base = rx_mr.addr();
    let rkey = rx_mr.rkey().expect("remote write access");
    let post = |f: &mut Flow, q: usize, round: u64| {
        while f.outstanding < c.depth && !f.failed && round >= f.starts_at {
            let s = (f.posted % u64::from(c.depth)) as u32;
            let off = (s * c.msg_bytes) as usize;
            let sge = [tx_mrs[f.sender]
                .sge(f.src_off + off, c.msg_bytes as usize)
                .unwrap()];
            let wr = SendWr::new(
                (q as u64) << 32 | f.posted,
                SendOp::RdmaWrite {
                    remote: RemoteAddr {
                        addr: remote_base + (f.dst_off + off) as u64,
                        rkey,
                    },
                },
            )
            .sges(&sge)
            .signaled();
            if f.qp.post_send(&[wr]).is_err() {
                break;
            }
            f.posted += 1;
            f.outstanding += 1;
        }
    };
    let mut failures: Vec<(usize, WcStatus)> = Vec::new();
    let mut total_bytes = 0u64;
    let mut poll = |flows: &mut Vec<Flow>, in_window: bool| {
        let mut wc = [WorkCompletion::default(); 64];
        for cq in &tx_cqs {
            loop {
                let n = cq.poll(&mut wc).expect("poll");
                for w in &wc[..n] {
                    let q = (w.wr_id >> 32) as usize;
                    let f = &mut flows[q];
                    f.outstanding -= 1;
                    if w.status == WcStatus::Success {
                        f.completed += 1;
                        total_bytes += u64::from(c.msg_bytes);
                        if in_window {
                            f.window_bytes += u64::from(c.msg_bytes);
                        }
                    } else if !f.failed {
                        f.failed = true;
                        failures.push((q, w.status));
                    }
                }
                if n < wc.len() {
                    break;
                }
            }
        }
    };

    let start = fabric.now_ns();
    for (q, f) in flows.iter_mut().enumerate() {
        post(f, q, 0);
    }
    let mut drops_at_warmup = None;
    let end = start + c.duration_ns;
    let mut round = 0;
    while fabric.now_ns() < end {
        fabric.run_for(c.poll_ns).unwrap();
        round += 1;
        let now = fabric.now_ns();
        let in_window = now > start + c.warmup_ns;
        if in_window && drops_at_warmup.is_none() {
            drops_at_warmup = Some(fabric.stats().queue_drops);
        }
        poll(&mut flows, in_window);
        for (q, f) in flows.iter_mut().enumerate() {
            post(f, q, round);
        }
    }
    let window_drops = fabric.stats().queue_drops - drops_at_warmup.unwrap_or(0);
    // Drain: no new WRITEs; what is outstanding completes, or fails (retries run out after
    // 8 × 67 ms at timeout 14).
    let drain_until = fabric.now_ns() + 2_000_000_000;
    while flows.iter().any(|f| f.outstanding > 0) && fabric.now_ns() < drain_until {
        fabric.run_for(1_000_000).unwrap();
        poll(&mut flows, false);
    }

    let incomplete: Vec<usize> = flows
        .iter()
        .enumerate()
        .filter(|(_, f)| f.outstanding > 0)
        .map(|(q, _)| q)
        .collect();
    let per_qp_bytes: Vec<u64> = flows.iter().map(|f| f.window_bytes).collect();
    let window = (c.duration_ns - c.warmup_ns) as f64;
    let window_total: u64 = per_qp_bytes.iter().sum();
    let goodput = window_total as f64 * 8.0 * 1e9 / window / c.rate_bps as f64;
    let retransmits: u64 = sender_devs
        .iter()
        .map(|d| d.engine_stats().retransmits)
        .sum();
    let mtu = u64::from(c.mtu.bytes());
    let retransmit_fraction = if total_bytes == 0 {
        f64::INFINITY
    } else {
        (retransmits * mtu) as f64 / total_bytes as f64
    };
    let mut bad_data = Vec::new();
    let mut unchecked = 0;
    for (q, f) in flows.iter().enumerate() {
        // Every slot that a successful WRITE went to holds its source.
        let slots = f.completed.min(u64::from(c.depth)) as u32;
        if slots == 0 {
            unchecked += 1;
        }
        for s in 0..slots {
            let off = (s * c.msg_bytes) as usize;
            let got = rx_buf
                .to_vec(f.dst_off + off, c.msg_bytes as usize)
                .unwrap();
            if got != pattern(q, s, c.msg_bytes as usize) {
                bad_data.push(q);
                break;
            }
        }
    }
    let stats = fabric.stats();
    Figures {
        jain: jain(&per_qp_bytes),
        per_qp_bytes,
        total_bytes,
        goodput,
        retransmits,
        retransmit_fraction,
        queue_drops: stats.queue_drops,
        window_drops,
        ce_marked: stats.ce_marked,
        max_queue_bytes: stats.max_queue_bytes,
        failures,
        incomplete,
        bad_data,
        unchecked,
        end_ns: fabric.now_ns(),
        wall: wall.elapsed(),
    }
}

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

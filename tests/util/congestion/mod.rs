//! The bottleneck harness the congestion tests (`tests/congestion.rs`) and the congestion
//! benchmark (`benches/congestion.rs`) share: N RC QPs on M sender devices push RDMA WRITEs
//! through one bottleneck (the output queue and link in front of the receiver's port,
//! [`Bottleneck`]) on a stepped fabric, so every figure is in the fabric's virtual time and a
//! run is repeatable from its seed.
//!
//! [`run_bottleneck`] runs one configuration and returns its [`Figures`]: goodput against the
//! bottleneck's rate, Jain's fairness index over the QPs, retransmissions, the queue's drops and
//! CE marks (RFC 3168), every failed completion and a check of the written data. With
//! [`Config::probe`], one more sender device runs a latency probe through the same
//! bottleneck while the WRITEs run: one RC QP doing perftest's `ib_send_lat` ping-pong of
//! 64-byte SENDs (send; the receiver's side answers each SEND it receives with a SEND of its
//! own; the next SEND leaves when the answer arrives), each round trip timed on the fabric's
//! clock. [`Config::cc`] chooses the congestion control of every device (the transport's,
//! `backends/transport/src/congestion.rs`), so one harness measures the transport with and
//! without it.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use portverbs::prelude::*;
use portverbs::soft::{
    Bottleneck, CcConfig, DeviceConfig, EcnMarking, Fabric, FabricConfig, LinkFaults, Mode,
    SoftDevice,
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
    /// Virtual time the drain waits, at most, for outstanding WRITEs to complete or fail
    /// (2 s; the local ACK timer backs off up to 8× while retries make no progress, so a QP
    /// that runs out of retries at timeout 14 may need about 3.2 s to say so).
    pub drain_ns: u64,
    /// Congestion control of every device of the run (senders, receiver, probe).
    pub cc: CcConfig,
    /// Run the latency probe ([`PROBE_BYTES`]-byte SEND ping-pong on a device of its own)
    /// beside the WRITEs.
    pub probe: bool,
    /// How often (virtual ns) the probe's two ends poll their CQs: the resolution of its
    /// round trips (a divisor of `poll_ns`).
    pub probe_poll_ns: u64,
}

/// Bytes of each SEND of the latency probe (perftest's `ib_send_lat -s 64`).
pub const PROBE_BYTES: u32 = 64;

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
            drain_ns: 2_000_000_000,
            cc: CcConfig::default(),
            probe: false,
            probe_poll_ns: 500,
        }
    }

    /// The same without congestion control: every RC QP keeps its whole PSN window in flight.
    pub fn without_cc(mut self) -> Self {
        self.cc.enabled = false;
        self
    }

    /// The same with the latency probe.
    pub fn with_probe(mut self) -> Self {
        self.probe = true;
        self
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
    /// failed after [`Config::drain_ns`] of virtual time).
    pub incomplete: Vec<usize>,
    /// QPs whose written data did not match their source on the receiver.
    pub bad_data: Vec<usize>,
    /// QPs that completed no WRITE at all (their data could not be checked).
    pub unchecked: usize,
    /// Round trips of the latency probe that ended after the warm-up, virtual ns, in the
    /// order taken (empty without the probe). Pings leave until `duration_ns`; one still out
    /// then is timed when its answer comes in the drain (to within about 2 % of its length),
    /// so that a ping stalled behind a retransmission timeout counts in full.
    pub probe_rtts_ns: Vec<u64>,
    /// The median, 99th percentile (nearest rank) and largest of `probe_rtts_ns` (0 when
    /// there are none).
    pub probe_p50_ns: u64,
    pub probe_p99_ns: u64,
    pub probe_max_ns: u64,
    /// Packets the probe's pinging device retransmitted, and its local ACK timeouts, over the
    /// whole run.
    pub probe_retransmits: u64,
    pub probe_timeouts: u64,
    /// Round trips the probe completed over the whole run.
    pub probe_round_trips: u64,
    /// Probe messages lost: SENDs of either end that completed in error, plus the ping
    /// outstanding when the drain gave up, if any.
    pub probe_lost: u64,
    /// Virtual time at the end of the drain.
    pub end_ns: u64,
    /// Wall-clock time of the run (reported, never asserted).
    pub wall: Duration,
}

impl Figures {
    /// QPs whose first failed completion was RETRY_EXC_ERR (the retry budget ran out).
    pub fn retry_exceeded(&self) -> usize {
        self.failures
            .iter()
            .filter(|(_, s)| *s == WcStatus::RetryExcErr)
            .count()
    }

    /// One line for the test log.
    pub fn line(&self, name: &str, c: &Config) -> String {
        format!(
            "{name} seed {}: N={} M={} msg={} goodput {:.1} % jain {:.3} retrans {} pkts \
             ({:.1} % of goodput) drops {} (window {}) ce {} maxq {} B of {} failures {} \
             (first {:?}) incomplete {} bad data {} unchecked {} cc {} end {:.1} ms wall \
             {:.2?}{}{}",
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
            if c.cc.enabled { "on" } else { "off" },
            self.end_ns as f64 / 1e6,
            self.wall,
            if c.probe {
                format!(
                    " probe {} samples p50 {:.1} us p99 {:.1} us max {:.1} us lost {} \
                     retrans {} timeouts {}",
                    self.probe_rtts_ns.len(),
                    self.probe_p50_ns as f64 / 1e3,
                    self.probe_p99_ns as f64 / 1e3,
                    self.probe_max_ns as f64 / 1e3,
                    self.probe_lost,
                    self.probe_retransmits,
                    self.probe_timeouts,
                )
            } else {
                String::new()
            },
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

/// The `p`-th percentile of `sorted` (ascending), by nearest rank; 0 when empty.
pub fn percentile(sorted: &[u64], p: u32) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p as usize).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
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
        let config = DeviceConfig {
            congestion: Some(c.cc),
            ..DeviceConfig::with_ip(ip.parse().unwrap())
        };
        SoftDevice::attach(&fabric, config).unwrap()
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
    let probe_dev = c.probe.then(|| attach("10.0.3.1".into()));
    let mut probe = probe_dev
        .as_ref()
        .map(|dev| Probe::new(&open(dev), &rx_ctx, c));
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
    let end = start + c.duration_ns;
    if let Some(p) = probe.as_mut() {
        p.ping(start);
    }
    let mut drops_at_warmup = None;
    let mut round = 0;
    while fabric.now_ns() < end {
        match probe.as_mut() {
            None => fabric.run_for(c.poll_ns).unwrap(),
            Some(p) => {
                let round_end = fabric.now_ns() + c.poll_ns;
                while fabric.now_ns() < round_end {
                    let step = c.probe_poll_ns.clamp(1, round_end - fabric.now_ns());
                    fabric.run_for(step).unwrap();
                    p.poll(fabric.now_ns(), start + c.warmup_ns, end);
                }
            }
        }
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
    // 8 timeouts of 67 ms at timeout 14, each backed off up to 8×).
    let drain_until = fabric.now_ns() + c.drain_ns;
    let probe_busy = |p: &Option<Probe>| p.as_ref().is_some_and(Probe::busy);
    while (flows.iter().any(|f| f.outstanding > 0) || probe_busy(&probe))
        && fabric.now_ns() < drain_until
    {
        // 1 ms steps; while a ping is out, steps of a 64th of its wait so far (at least the
        // probe's poll interval), so that its round trip is timed to within about 2 %.
        let step = match probe.as_ref().and_then(|p| p.sent_at) {
            Some(t) => ((fabric.now_ns() - t) / 64).clamp(c.probe_poll_ns.max(1), 1_000_000),
            None => 1_000_000,
        };
        fabric.run_for(step).unwrap();
        poll(&mut flows, false);
        if let Some(p) = probe.as_mut() {
            p.poll(fabric.now_ns(), start + c.warmup_ns, end);
        }
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
    let (probe_rtts_ns, probe_round_trips, probe_lost) = match probe {
        None => (Vec::new(), 0, 0),
        Some(p) => {
            let lost = p.lost + u64::from(p.busy());
            (p.samples, p.round_trips, lost)
        }
    };
    let mut sorted = probe_rtts_ns.clone();
    sorted.sort_unstable();
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
        probe_p50_ns: percentile(&sorted, 50),
        probe_p99_ns: percentile(&sorted, 99),
        probe_max_ns: sorted.last().copied().unwrap_or(0),
        probe_rtts_ns,
        probe_round_trips,
        probe_lost,
        probe_retransmits: probe_dev
            .as_ref()
            .map_or(0, |d| d.engine_stats().retransmits),
        probe_timeouts: probe_dev.as_ref().map_or(0, |d| d.engine_stats().timeouts),
        end_ns: fabric.now_ns(),
        wall: wall.elapsed(),
    }
}

/// `wr_id` bit of a receive (clear: a SEND).
const RECV: u64 = 1 << 63;

/// One end of the latency probe: an RC QP with its CQ, and a buffer of two
/// [`PROBE_BYTES`] slots (what it sends, where it receives).
struct ProbeEnd {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    /// SENDs posted and not yet completed.
    sends_out: u32,
    /// Work requests posted (their `wr_id`s).
    posted: u64,
    /// A SEND or receive completed in error: the end stops.
    failed: bool,
}

impl ProbeEnd {
    fn new(ctx: &Context) -> (Self, Buffer) {
        let len = 2 * PROBE_BYTES as usize;
        let pd = ctx.alloc_pd_blocking().unwrap();
        let buf = ctx.alloc_buffer(len).unwrap();
        buf.write(0, &[0x5a; PROBE_BYTES as usize]).unwrap();
        let mr = pd
            .reg_mr_blocking(&buf, 0..len, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 16,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd
            .create_qp_blocking(QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                special: None,
            })
            .unwrap();
        (
            Self {
                qp,
                cq,
                mr,
                sends_out: 0,
                posted: 0,
                failed: false,
            },
            buf,
        )
    }

    /// Posts a receive into the second slot.
    fn post_recv(&mut self) {
        let sge = [self
            .mr
            .sge(PROBE_BYTES as usize, PROBE_BYTES as usize)
            .unwrap()];
        self.posted += 1;
        if self
            .qp
            .post_recv(&[RecvWr {
                wr_id: RECV | self.posted,
                sges: &sge,
            }])
            .is_err()
        {
            self.failed = true;
        }
    }

    /// Posts a signaled SEND of the first slot.
    fn post_send(&mut self) {
        let sge = [self.mr.sge(0, PROBE_BYTES as usize).unwrap()];
        self.posted += 1;
        let wr = SendWr::new(self.posted, SendOp::Send).sges(&sge).signaled();
        if self.qp.post_send(&[wr]).is_err() {
            self.failed = true;
        } else {
            self.sends_out += 1;
        }
    }

    /// Polls the CQ: the number of receives that completed, and of completions in error.
    fn poll(&mut self) -> (u32, u64) {
        let mut wc = [WorkCompletion::default(); 16];
        let (mut received, mut errors) = (0, 0);
        loop {
            let n = self.cq.poll(&mut wc).expect("poll");
            for w in &wc[..n] {
                if w.wr_id & RECV == 0 {
                    self.sends_out = self.sends_out.saturating_sub(1);
                }
                if w.status != WcStatus::Success {
                    // A flushed receive after the QP went to error is no lost message.
                    if w.status != WcStatus::WrFlushErr || w.wr_id & RECV == 0 {
                        errors += 1;
                    }
                    self.failed = true;
                } else if w.wr_id & RECV != 0 {
                    received += 1;
                }
            }
            if n < wc.len() {
                return (received, errors);
            }
        }
    }
}

/// The latency probe: `ib_send_lat`'s ping-pong between a device of its own (the pinging
/// end) and the receiver (the answering end), through the bottleneck.
struct Probe {
    ping: ProbeEnd,
    pong: ProbeEnd,
    /// When the outstanding ping left (virtual ns), if one is out.
    sent_at: Option<u64>,
    samples: Vec<u64>,
    round_trips: u64,
    lost: u64,
    _bufs: [Buffer; 2],
}

impl Probe {
    /// Both ends connected (perftest's QP parameters of the run), each with a receive posted.
    fn new(ping_ctx: &Context, pong_ctx: &Context, c: &Config) -> Self {
        let (mut ping, ping_buf) = ProbeEnd::new(ping_ctx);
        let (mut pong, pong_buf) = ProbeEnd::new(pong_ctx);
        let opts = ConnectOptions {
            psn: 0,
            mtu: Some(c.mtu),
            access: AccessFlags::LOCAL_WRITE,
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: 7,
            ..ConnectOptions::default()
        };
        let (a, b) = (
            ping.qp.endpoint_blocking(&opts).unwrap(),
            pong.qp.endpoint_blocking(&opts).unwrap(),
        );
        ping.qp.connect_rc_blocking(&b, &opts).unwrap();
        pong.qp.connect_rc_blocking(&a, &opts).unwrap();
        ping.post_recv();
        pong.post_recv();
        Self {
            ping,
            pong,
            sent_at: None,
            samples: Vec::new(),
            round_trips: 0,
            lost: 0,
            _bufs: [ping_buf, pong_buf],
        }
    }

    /// Sends the next ping at `now`.
    fn ping(&mut self, now: u64) {
        if !self.ping.failed {
            self.sent_at = Some(now);
            self.ping.post_send();
        }
    }

    /// Whether a ping or an answer is still on its way.
    fn busy(&self) -> bool {
        !self.ping.failed && !self.pong.failed && self.sent_at.is_some()
    }

    /// Answers what the answering end received, times what came back, and sends the next
    /// ping while `now < end`; round trips that end after `measure_from` are samples.
    fn poll(&mut self, now: u64, measure_from: u64, end: u64) {
        let (answered, errors) = self.pong.poll();
        self.lost += errors;
        for _ in 0..answered {
            self.pong.post_recv();
            self.pong.post_send();
        }
        let (back, errors) = self.ping.poll();
        self.lost += errors;
        if back > 0 {
            if let Some(t) = self.sent_at.take() {
                self.round_trips += 1;
                if now > measure_from {
                    self.samples.push(now - t);
                }
            }
            self.ping.post_recv();
            if now < end {
                self.ping(now);
            }
        }
    }
}

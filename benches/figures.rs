//! The headline figures of the software device, printed as a table (`cargo bench --bench
//! figures`): RDMA-write bandwidth at 64 KiB as a ratio to memcpy of the same buffers in the
//! same run, and the 8-byte RDMA-write message rate with batched posting. Each figure is the
//! median of several runs after a warm-up; the machine is shared and noisy, so read them as
//! orders of magnitude and compare ratios, not absolute values across machines.

mod common;

use std::time::Instant;

use portverbs::prelude::*;
use portverbs::soft::{Fabric, Mode, SoftDma};

const RUNS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// memcpy of `len` bytes between the two registered buffers, GB/s.
fn memcpy_gbs(p: &common::Pair, len: usize, iters: usize) -> f64 {
    let src =
        p.a.buf
            .dma()
            .as_any()
            .downcast_ref::<SoftDma>()
            .expect("soft memory");
    let dst =
        p.b.buf
            .dma()
            .as_any()
            .downcast_ref::<SoftDma>()
            .expect("soft memory");
    let t = Instant::now();
    for i in 0..iters {
        let off = (i % 4) * len;
        SoftDma::copy(src, off, dst, off, len).expect("copy");
    }
    (len * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// One RDMA-write load: `iters` writes of `len` bytes, at most `depth` outstanding, posted in
/// lists of `batch`, one signalled completion per `signal` writes.
#[derive(Clone, Copy)]
struct Load {
    len: u32,
    iters: u64,
    depth: u64,
    signal: u64,
    batch: u64,
    inline: bool,
    /// RDMA READs from the peer's buffer instead of writes to it.
    read: bool,
}

impl Load {
    /// 64 KiB writes from the registered buffer.
    const BW: Self = Self {
        len: 64 << 10,
        iters: 20_000,
        depth: 128,
        signal: 16,
        batch: 16,
        inline: false,
        read: false,
    };
    /// 8-byte inline writes in lists of 32, one completion per list.
    const RATE: Self = Self {
        len: 8,
        iters: 500_000,
        depth: 512,
        signal: 32,
        batch: 32,
        inline: true,
        read: false,
    };

    fn iters(self, iters: u64) -> Self {
        Self { iters, ..self }
    }

    /// The same load as RDMA READs of `len` bytes (at most `max_rd_atomic`, 16, in flight).
    fn read(self, len: u32) -> Self {
        Self {
            len,
            read: true,
            ..self
        }
    }
}

/// Posting and polling go through these two so that callgrind (`--profile-calls`) can
/// attribute instructions to them: they are never inlined.
#[inline(never)]
fn post(qp: &Qp, wrs: &[SendWr<'_>]) {
    qp.post_send(wrs).expect("post");
}

#[inline(never)]
fn poll(cq: &Cq, wc: &mut [WorkCompletion]) -> usize {
    cq.poll(wc).expect("poll")
}

/// Runs `load` on the pair; `drive` runs the device when the fabric is stepped. Returns GB/s
/// and Mops/s. A READ load reads the peer's buffer into the same slots a write load sends
/// from.
fn write_rate(p: &common::Pair, load: Load, drive: &dyn Fn()) -> (f64, f64) {
    let Load {
        len,
        iters,
        depth,
        signal,
        batch,
        inline,
        read,
    } = load;
    let remote = RemoteAddr {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey().expect("rkey"),
    };
    // Source and destination rotate through the same four slots as `memcpy_gbs` uses.
    let sges: Vec<[Sge; 1]> = (0..4usize)
        .map(|k| {
            let len = len as usize;
            [p.a.mr.sge(k * len, len).expect("inside the MR")]
        })
        .collect();
    let payload = [0x5au8; 64];
    let mut wc = [WorkCompletion::default(); 64];
    let mut wrs = Vec::with_capacity(batch as usize);
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Instant::now();
    while done < iters {
        while posted < iters && posted - done + batch <= depth {
            wrs.clear();
            for _ in 0..batch.min(iters - posted) {
                let off = (posted % 4) * u64::from(len);
                let remote = RemoteAddr {
                    addr: remote.addr + off,
                    ..remote
                };
                let op = if read {
                    SendOp::RdmaRead { remote }
                } else {
                    SendOp::RdmaWrite { remote }
                };
                let mut wr = SendWr::new(posted, op);
                wr = if inline {
                    wr.inline(&payload[..len as usize])
                } else {
                    wr.sges(&sges[(posted % 4) as usize])
                };
                posted += 1;
                if posted % signal == 0 || posted == iters {
                    wr = wr.signaled();
                }
                wrs.push(wr);
            }
            post(&p.a.qp, &wrs);
        }
        drive();
        let n = poll(&p.a.cq, &mut wc);
        if n == 0 {
            // What a well-behaved busy-polling application does: tell the core it is waiting.
            std::hint::spin_loop();
        }
        for w in &wc[..n] {
            assert!(w.is_ok(), "{w:?}");
            done = w.wr_id + 1;
        }
    }
    let s = t.elapsed().as_secs_f64();
    (
        (u64::from(len) * iters) as f64 / s / 1e9,
        iters as f64 / s / 1e6,
    )
}

/// `--profile-rate N`: only the one-core 8-byte scenario, N writes (for callgrind).
fn profile_rate(n: u64) {
    let p = common::pair(Fabric::stepped(1), 4096, 1024);
    let fabric = p.fabric.clone();
    let drive = move || {
        fabric.run_until_idle().expect("idle");
    };
    let (_, mops) = write_rate(&p, Load::RATE.iters(n), &drive);
    println!("{n} writes, {mops:.2} Mops/s");
}

/// RDMA READ bandwidth: 64 KiB READs (one response train each) on both fabrics, and 16 MiB
/// READs on the stepped one, whose responses take more than one engine turn. Medians over
/// rounds, as the write figures (`--read` prints only these rows).
fn read_rows(quick: bool) {
    let rounds = if quick { 3 } else { 15 };
    for (label, threaded, len, iters) in [
        ("64 KiB, threaded engine", true, 64u32 << 10, 5_000u64),
        ("64 KiB, stepped, one core", false, 64 << 10, 5_000),
        ("16 MiB, stepped, one core", false, 16 << 20, 40),
    ] {
        let fabric = if threaded {
            Fabric::threaded()
        } else {
            Fabric::stepped(1)
        };
        let p = common::pair(fabric, 4 * len as usize, 256);
        let f = p.fabric.clone();
        let drive = move || {
            if !threaded {
                f.run_until_idle().expect("idle");
            }
        };
        let load = Load::BW.iters(iters).read(len);
        let _ = write_rate(&p, load, &drive);
        let bw: Vec<f64> = (0..rounds)
            .map(|_| write_rate(&p, load, &drive).0)
            .collect();
        println!("| RDMA READ {label} | {:.2} GB/s |", median(bw));
    }
}

/// `--profile-bw N [--threaded]`: only the 64 KiB write scenario, N writes (for profilers).
fn profile_bw(n: u64, threaded: bool) {
    let len = 64 << 10;
    let fabric = if threaded {
        Fabric::threaded()
    } else {
        Fabric::stepped(1)
    };
    let p = common::pair(fabric, 4 * len, 256);
    let fabric = p.fabric.clone();
    let drive = move || {
        if !threaded {
            fabric.run_until_idle().expect("idle");
        }
    };
    let (gbs, _) = write_rate(&p, Load::BW.iters(n), &drive);
    println!("{n} writes, {gbs:.2} GB/s");
}

/// `--profile-calls N`: N signalled 8-byte inline writes posted in lists of 32 and polled in
/// arrays of 64, so that callgrind's inclusive counts of `post` and `poll` divided by N give
/// instructions per posted work request and per polled completion (`benches/callgrind.sh`).
fn profile_calls(n: u64) {
    let p = common::pair(Fabric::stepped(1), 4096, 1024);
    let fabric = p.fabric.clone();
    let drive = move || {
        fabric.run_until_idle().expect("idle");
    };
    let load = Load {
        signal: 1,
        ..Load::RATE.iters(n)
    };
    let _ = write_rate(&p, load, &drive);
    println!("{n} work requests posted, {n} completions polled");
}

#[inline(never)]
fn post_bf(qp: &Qp, wrs: &[SendWr<'_>]) {
    qp.post_send(wrs).expect("post");
}

#[inline(never)]
fn post_db(qp: &Qp, wrs: &[SendWr<'_>]) {
    qp.post_send(wrs).expect("post");
}

#[inline(never)]
fn poll_mlx4(cq: &Cq, wc: &mut [WorkCompletion]) -> usize {
    cq.poll(wc).expect("poll")
}

/// Two emulated ConnectX-3s on a stepped fabric, the sender with or without BlueFlame.
fn mlx4_pair(blueflame: bool) -> common::Pair {
    let fabric = Fabric::stepped(1);
    let mut devs = Vec::new();
    let mut models = Vec::new();
    for (i, ip) in ["10.0.0.3", "10.0.0.4"].iter().enumerate() {
        let (model, function) = portverbs::mlx4_model::Mlx4Model::attach(
            &fabric,
            portverbs::mlx4_model::ModelConfig::default(),
        )
        .expect("model");
        let mut config = portverbs::mlx4::Mlx4Config::new(
            format!("mlx4_{i}"),
            vec![vec![Gid::from_ip(ip.parse().expect("ip"))]],
        );
        config.blueflame = blueflame;
        let dev = portverbs::mlx4::Mlx4Device::open(function, config).expect("open");
        models.push(model);
        devs.push(AnyDevice::Mlx4(dev));
    }
    common::connected(fabric, devs, models, 4096, 1024)
}

/// `--profile-mlx4 N`: on the mlx4 driver over the emulated HCA, N signalled 64-byte inline RDMA
/// writes posted one per call through BlueFlame (`post_bf`), then N more one per call with
/// BlueFlame off, so each post rings the UAR doorbell (`post_db`); every completion is polled
/// through `poll_mlx4`. `benches/callgrind.sh` divides the inclusive counts by N and subtracts
/// the emulated HCA's own work behind the BAR writes.
fn profile_mlx4(n: u64) {
    let payload = [0x5au8; 64];
    let mut wc = [WorkCompletion::default(); 64];
    for (blueflame, post) in [(true, post_bf as fn(&Qp, &[SendWr<'_>])), (false, post_db)] {
        let p = mlx4_pair(blueflame);
        let remote = RemoteAddr {
            addr: p.b.mr.addr(),
            rkey: p.b.mr.rkey().expect("rkey"),
        };
        let mut done = 0;
        for i in 0..n {
            let wr = SendWr::new(i, SendOp::RdmaWrite { remote })
                .inline(&payload)
                .signaled();
            post(&p.a.qp, &[wr]);
            if i % 32 == 31 || i + 1 == n {
                p.fabric.run_until_idle().expect("idle");
                while done <= i {
                    let got = poll_mlx4(&p.a.cq, &mut wc);
                    assert!(got > 0, "completions arrive");
                    for w in &wc[..got] {
                        assert!(w.is_ok(), "{w:?}");
                    }
                    done += got as u64;
                }
            }
        }
    }
    println!(
        "{n} work requests posted per path, {} completions polled",
        2 * n
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--profile-mlx4") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        return profile_mlx4(n);
    }
    if let Some(i) = args.iter().position(|a| a == "--profile-calls") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        return profile_calls(n);
    }
    if let Some(i) = args.iter().position(|a| a == "--profile-bw") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000);
        return profile_bw(n, args.iter().any(|a| a == "--threaded"));
    }
    if let Some(i) = args.iter().position(|a| a == "--profile-rate") {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        return profile_rate(n);
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--read") {
        println!("| figure | value |");
        println!("|---|---|");
        return read_rows(quick);
    }
    let runs = if quick { 1 } else { RUNS };
    println!("# portverbs soft device — figures (medians)");
    println!();

    println!("| figure | value |");
    println!("|---|---|");
    // Bandwidth at 64 KiB. The shared host's memory bandwidth drifts from one moment to the
    // next, so memcpy and RDMA WRITE alternate in many short rounds (5,000 messages each) and
    // the ratio is taken per round; the table gives the medians over the rounds.
    let len = 64 << 10;
    let rounds = if quick { 5 } else { 41 };
    let bandwidth = |label: &str, fabric: Fabric| {
        let p = common::pair(fabric, 4 * len, 256);
        let f = p.fabric.clone();
        let stepped = f.mode() == Mode::Stepped;
        let drive = move || {
            if stepped {
                f.run_until_idle().expect("idle");
            }
        };
        let load = Load::BW.iters(5_000);
        let _ = write_rate(&p, load, &drive);
        let (mut bw, mut mc, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let m = memcpy_gbs(&p, len, load.iters as usize);
            let w = write_rate(&p, load, &drive).0;
            mc.push(m);
            bw.push(w);
            ratio.push(w / m);
        }
        println!(
            "| memcpy 64 KiB, same buffers ({label} rounds) | {:.2} GB/s |",
            median(mc)
        );
        println!("| RDMA WRITE 64 KiB, {label} | {:.2} GB/s |", median(bw));
        println!(
            "| ratio write / memcpy, {label} | {:.2} (goal ≥ 0.7) |",
            median(ratio)
        );
    };
    // The free-running fabric: the app thread posts and polls, the engine thread moves the
    // data (one copy from source MR to destination MR).
    bandwidth("threaded engine", Fabric::threaded());
    // A stepped fabric: one core does post, transport, copy and poll.
    bandwidth("stepped, one core", Fabric::stepped(1));
    read_rows(quick);

    // 8-byte inline writes, batches of 32, one completion per batch, one core.
    let p = common::pair(Fabric::stepped(1), 4096, 1024);
    let fabric = p.fabric.clone();
    let drive = move || {
        fabric.run_until_idle().expect("idle");
    };
    let _ = write_rate(&p, Load::RATE.iters(50_000), &drive);
    let mut rate = Vec::new();
    for _ in 0..runs {
        rate.push(write_rate(&p, Load::RATE, &drive).1);
    }
    println!(
        "| 8-byte RDMA WRITE, post lists of 32, one core | {:.2} Mops/s (goal ≥ 5) |",
        median(rate)
    );
    drop(p);

    // The same with the engine on its own thread.
    let p = common::pair(Fabric::threaded(), 4096, 1024);
    let mut rate = Vec::new();
    for _ in 0..runs {
        rate.push(write_rate(&p, Load::RATE, &|| {}).1);
    }
    println!(
        "| 8-byte RDMA WRITE, post lists of 32, threaded engine | {:.2} Mops/s |",
        median(rate)
    );
}

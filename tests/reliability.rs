//! RC reliability in the deterministic simulator: for 210 seeds with 0–20 % loss, duplication,
//! reordering and corruption, every posted request completes exactly once and in order; sends
//! arrive intact and in order, writes land, reads return the right bytes, and each atomic is
//! executed exactly once (the originals it returns are the exact prefix sums). When retries run
//! out, the request in flight completes with `RETRY_EXC_ERR` and everything after it is flushed.

#![allow(unreachable_pub)]

#[allow(dead_code)]
mod conformance {
    pub mod env;
    pub mod util;
}

use conformance::env::{Backend, Env};
use conformance::util::*;
use portverbs::prelude::*;
use portverbs::soft::LinkFaults;

/// One send-queue work request of the workload.
#[derive(Debug, Clone, Copy)]
enum Op {
    Send { len: u32, slot: u32 },
    Write { len: u32 },
    Read { len: u32, from: u64 },
    FetchAdd { add: u64 },
}

const MSGS: usize = 36;
const BUF: usize = 512 << 10;
// Layout of A's buffer.
const A_SRC: u64 = 0;
const A_READ_DST: u64 = 0x2_0000;
const A_ATOMIC_RES: u64 = 0x7_f000;
// Layout of B's buffer.
const B_READ_SRC: u64 = 0;
const B_WRITE_DST: u64 = 0x1_0000;
const B_RECV: u64 = 0x4_0000;
const B_COUNTER: u64 = 0x7_f000;
const SLOT: u64 = 6000;
const STRIDE: u64 = 5000;

fn src_off(i: usize) -> u64 {
    A_SRC + (i as u64 * 100) % 0x3000
}

fn workload(seed: u64) -> Vec<Op> {
    let mut sends = 0;
    (0..MSGS)
        .map(|i| {
            let len = [0, 7, 1024, 1500, 5000][(seed as usize + i * 3) % 5];
            match (seed as usize + i * 7) % 5 {
                0 | 1 => {
                    sends += 1;
                    Op::Send {
                        len,
                        slot: sends - 1,
                    }
                }
                2 => Op::Write { len },
                3 => Op::Read {
                    len,
                    from: B_READ_SRC + (i as u64 % 3) * STRIDE,
                },
                _ => Op::FetchAdd { add: 1 + i as u64 },
            }
        })
        .collect()
}

/// Fields drop in order: the sides before the environment (which checks for leaks).
struct Run {
    a: Side,
    b: Side,
    ops: Vec<Op>,
    env: Env,
}

fn setup(seed: u64, p: &Params) -> Run {
    let env = Env::with_faults(Backend::Soft, seed, LinkFaults::NONE);
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..CAPS
    };
    let a = Side::new(env.a(), QpType::Rc, caps, BUF, FULL_ACCESS);
    let b = Side::new(env.b(), QpType::Rc, caps, BUF, FULL_ACCESS);
    to_init(&a.qp, p);
    to_init(&b.qp, p);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), p);
    to_rts(&b.qp, a.qp.qp_num(), Env::gid(env.a()), p);
    a.buf.write(0, &pattern(seed as u8, 0x4000)).unwrap();
    b.buf.write(0, &pattern(!(seed as u8), 0x4000)).unwrap();
    b.buf.store_u64(B_COUNTER as usize, 0).unwrap();
    Run {
        a,
        b,
        ops: workload(seed),
        env,
    }
}

/// Posts the workload (receives first), runs the fabric, returns (send, receive) completions.
fn execute(r: &Run) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
    let (a, b) = (&r.a, &r.b);
    for op in &r.ops {
        if let Op::Send { slot, .. } = *op {
            b.post_recv(
                u64::from(slot),
                B_RECV + u64::from(slot) * SLOT,
                SLOT as u32,
            );
        }
    }
    for (i, op) in r.ops.iter().enumerate() {
        let sge = [match *op {
            Op::Send { len, .. } | Op::Write { len } => a.sge(src_off(i), len),
            Op::Read { len, .. } => a.sge(A_READ_DST + i as u64 * STRIDE, len),
            Op::FetchAdd { .. } => a.sge(A_ATOMIC_RES + i as u64 * 8, 8),
        }];
        let sop = match *op {
            Op::Send { .. } => SendOp::Send,
            Op::Write { .. } => SendOp::RdmaWrite {
                remote: b.remote(B_WRITE_DST + i as u64 * STRIDE),
            },
            Op::Read { from, .. } => SendOp::RdmaRead {
                remote: b.remote(from),
            },
            Op::FetchAdd { add } => SendOp::AtomicFetchAdd {
                remote: b.remote(B_COUNTER),
                add,
            },
        };
        a.qp.post_send(&[SendWr::new(i as u64, sop).sges(&sge).signaled()])
            .unwrap();
    }
    let sends = r.env.poll(&a.cq, r.ops.len());
    let recvs = r.env.poll(&b.cq, 0);
    (sends, recvs)
}

/// Checks everything that completed; returns whether all requests succeeded.
fn check(seed: u64, r: &Run, sends: &[WorkCompletion], recvs: &[WorkCompletion]) -> bool {
    let (a, b) = (&r.a, &r.b);
    assert_eq!(
        sends.len(),
        r.ops.len(),
        "seed {seed}: every request completes exactly once"
    );
    let first_err = sends.iter().position(|c| c.status != WcStatus::Success);
    for (i, c) in sends.iter().enumerate() {
        assert_eq!(c.wr_id, i as u64, "seed {seed}: completions come in order");
        let expected = match first_err {
            Some(e) if i > e => WcStatus::WrFlushErr,
            // The only failure a lossy link may cause is running out of retries.
            Some(e) if i == e => WcStatus::RetryExcErr,
            _ => WcStatus::Success,
        };
        assert_eq!(c.status, expected, "seed {seed}: request {i}: {c:?}");
    }
    let done = first_err.unwrap_or(r.ops.len());
    let mut recvs = recvs.iter().filter(|w| w.is_ok());
    let mut sum = 0u64;
    for (i, op) in r.ops[..done].iter().enumerate() {
        match *op {
            Op::Send { len, slot } => {
                let w = recvs.next().expect("a receive per completed send");
                assert_eq!(
                    w.wr_id,
                    u64::from(slot),
                    "seed {seed}: sends arrive in order"
                );
                assert_eq!(w.byte_len, len);
                let got = b
                    .buf
                    .to_vec((B_RECV + u64::from(slot) * SLOT) as usize, len as usize);
                let want = a.buf.to_vec(src_off(i) as usize, len as usize);
                assert_eq!(got.unwrap(), want.unwrap(), "seed {seed}: send {i} intact");
            }
            Op::Write { len } => {
                let got = b
                    .buf
                    .to_vec((B_WRITE_DST + i as u64 * STRIDE) as usize, len as usize);
                let want = a.buf.to_vec(src_off(i) as usize, len as usize);
                assert_eq!(got.unwrap(), want.unwrap(), "seed {seed}: write {i} landed");
            }
            Op::Read { len, from } => {
                assert_eq!(sends[i].byte_len, len);
                let got = a
                    .buf
                    .to_vec((A_READ_DST + i as u64 * STRIDE) as usize, len as usize);
                let want = b.buf.to_vec(from as usize, len as usize);
                assert_eq!(got.unwrap(), want.unwrap(), "seed {seed}: read {i} intact");
            }
            Op::FetchAdd { add } => {
                let orig = a
                    .buf
                    .load_u64((A_ATOMIC_RES + i as u64 * 8) as usize)
                    .unwrap();
                assert_eq!(orig, sum, "seed {seed}: atomic {i} executed exactly once");
                sum += add;
            }
        }
    }
    if first_err.is_none() {
        assert_eq!(b.buf.load_u64(B_COUNTER as usize).unwrap(), sum);
    }
    first_err.is_none()
}

fn params() -> Params {
    Params {
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        ..Params::default()
    }
}

#[test]
fn rc_survives_loss_duplication_reordering_and_corruption_over_210_seeds() {
    let mut exhausted = Vec::new();
    let mut retransmits = 0;
    for seed in 0..210u64 {
        let p = (seed % 21) as f64 / 100.0;
        let r = setup(seed, &params());
        r.env.set_faults(LinkFaults::lossy(p));
        let (sends, recvs) = execute(&r);
        if !check(seed, &r, &sends, &recvs) {
            exhausted.push(seed);
        }
        retransmits += r.env.devs[0].engine_stats().retransmits;
    }
    assert!(
        retransmits > 10_000,
        "the faults really forced retransmissions"
    );
    // Loss and corruption both apply, so at p = 20 % about 36 % of packets die in each
    // direction, and 8 consecutive failed rounds (retry_cnt = 7) happen now and then; at low
    // rates they must not. Every exhausted seed still passed `check`: exactly-once, in-order
    // completions, intact data, RETRY_EXC_ERR then flush.
    let low_rate: Vec<_> = exhausted.iter().filter(|&&s| s % 21 <= 5).collect();
    assert!(
        low_rate.is_empty(),
        "retries exhausted at ≤ 5 %: {low_rate:?}"
    );
    assert!(
        exhausted.len() <= 21,
        "too many seeds exhausted their retries: {exhausted:?}"
    );
}

#[test]
fn rc_exhausted_retries_give_retry_exc_err_and_flush_the_rest() {
    let r = setup(3, &params());
    r.env.set_faults(LinkFaults {
        loss: 1.0,
        ..LinkFaults::NONE
    });
    let (sends, recvs) = execute(&r);
    assert!(!check(3, &r, &sends, &recvs));
    assert_eq!(sends[0].status, WcStatus::RetryExcErr);
    assert!(recvs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    let q = r.a.qp.query_blocking().unwrap();
    assert_eq!(q.qp_state, QpState::Err);
}

/// Diagnosis aid: `SEED=n cargo test --release --test reliability debug_seed -- --ignored
/// --nocapture` prints the fate of every request of one seed and the transport counters.
#[test]
#[ignore = "diagnosis aid, prints instead of asserting"]
fn debug_seed() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let p = (seed % 21) as f64 / 100.0;
    let r = setup(seed, &params());
    r.env.set_faults(LinkFaults::lossy(p));
    let (sends, recvs) = execute(&r);
    for (i, op) in r.ops.iter().enumerate() {
        eprintln!(
            "{i}: {op:?} -> {:?}",
            sends.get(i).map(|c| (c.wr_id, c.status))
        );
    }
    eprintln!("recvs {}", recvs.len());
    eprintln!("A {:?}", r.env.devs[0].engine_stats());
    eprintln!("B {:?}", r.env.devs[1].engine_stats());
    eprintln!("fabric {:?}", r.env.fabric.stats());
    eprintln!("qp a {:?}", r.a.qp.query_blocking().map(|q| q.qp_state));
}

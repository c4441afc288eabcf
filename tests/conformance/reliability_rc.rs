//! RC reliability (IBA chapter 9; Linux rxe's `rxe_resp.c`, `rxe_comp.c`): over a link that loses,
//! duplicates and reorders packets every message arrives once and in order, duplicate atomics are
//! not re-executed, READs are re-requested; a responder without READ resources refuses READs.

use portverbs::hal::QuirkId;
use portverbs::prelude::*;
use portverbs::soft::LinkFaults;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

const SENDS: u64 = 16;
const SLOT: u64 = 2900;
const WRITES_AT: u64 = SENDS * SLOT;
const READS_AT: u64 = WRITES_AT + 10 * 1200;
const COUNTER_AT: u64 = 64_000;

fn mixed_traffic_survives(env: &Env, seed: u64) {
    // 4 ms ACK timeouts keep the stepped fabrics' virtual time short. Where time is real (a
    // manual UDP device pair, hardware), seven retries of 4 ms are 30 ms, which a loaded
    // machine that does not schedule the test thread for that long exhausts with no fault of
    // the transport's: 67 ms there.
    let real_time = matches!(env.backend, Backend::UdpManual | Backend::Mlx4Hw);
    let params = Params {
        timeout: if real_time { 14 } else { 10 },
        ..Params::default()
    };
    let p = Pair::with(env, QpType::Rc, &params, FULL_ACCESS);
    let src = pattern(seed as u8, 3000);
    p.a.buf.write(0, &src).unwrap();
    let remote_data = pattern(seed as u8 + 100, 5000);
    p.b.buf.write(READS_AT as usize, &remote_data).unwrap();
    p.b.buf.store_u64(COUNTER_AT as usize, 0).unwrap();
    for i in 0..SENDS {
        p.b.post_recv(i, i * SLOT, SLOT as u32);
    }
    let send_len = |i: u64| (1000 + 97 * i) as u32;
    let mut sges = Vec::new();
    let mut ops = Vec::new();
    for i in 0..SENDS {
        sges.push([p.a.sge(i, send_len(i))]);
        ops.push(SendOp::Send);
        if i < 10 {
            sges.push([p.a.sge(i, 1200)]);
            ops.push(SendOp::RdmaWrite {
                remote: p.b.remote(WRITES_AT + i * 1200),
            });
            sges.push([p.a.sge(10_000 + i * 500, 500)]);
            ops.push(SendOp::RdmaRead {
                remote: p.b.remote(READS_AT + i * 500),
            });
            sges.push([p.a.sge(20_000 + i * 8, 8)]);
            ops.push(SendOp::AtomicFetchAdd {
                remote: p.b.remote(COUNTER_AT),
                add: 1,
            });
        }
    }
    let wrs: Vec<SendWr<'_>> = ops
        .iter()
        .zip(&sges)
        .zip(0..)
        .map(|((op, s), id)| SendWr::new(id, *op).sges(s).signaled())
        .collect();
    p.a.qp.post_send(&wrs).unwrap();
    let wcs = poll_exact(env, &p.a.cq, wrs.len());
    for (wc, (id, op)) in wcs.iter().zip(ops.iter().enumerate()) {
        let opcode = match op {
            SendOp::Send => WcOpcode::Send,
            SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            _ => WcOpcode::FetchAdd,
        };
        check_wc(wc, id as u64, WcStatus::Success, opcode);
    }
    let got = poll_exact(env, &p.b.cq, SENDS as usize);
    for (i, wc) in (0..).zip(&got) {
        check_wc(wc, i, WcStatus::Success, WcOpcode::Recv);
        assert_eq!(wc.byte_len, send_len(i));
        let at = (i * SLOT) as usize;
        let len = send_len(i) as usize;
        let want = &src[i as usize..i as usize + len];
        assert_eq!(
            p.b.buf.to_vec(at, len).unwrap(),
            want,
            "seed {seed} send {i}"
        );
    }
    for i in 0..10usize {
        let w = p.b.buf.to_vec(WRITES_AT as usize + i * 1200, 1200).unwrap();
        assert_eq!(w, src[i..i + 1200], "seed {seed} write {i}");
        let r = p.a.buf.to_vec(10_000 + i * 500, 500).unwrap();
        assert_eq!(
            r,
            remote_data[i * 500..(i + 1) * 500],
            "seed {seed} read {i}"
        );
        let orig = p.a.buf.load_u64(20_000 + i * 8).unwrap();
        assert_eq!(
            orig, i as u64,
            "seed {seed}: FAA {i} saw every earlier add once"
        );
    }
    assert_eq!(
        p.b.buf.load_u64(COUNTER_AT as usize).unwrap(),
        10,
        "seed {seed}: duplicate atomics were not re-executed"
    );
}

fn rc_lossy_duplicating_reordering_link_delivers_everything_once_in_order(backend: Backend) {
    let faults = LinkFaults {
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        reorder_window_ns: 30_000,
        delay_ns: 2_000,
        jitter_ns: 1_000,
        ..LinkFaults::NONE
    };
    let (mut lost, mut duplicated, mut reordered) = (0, 0, 0);
    for seed in 1..=6 {
        let env = Env::with_faults(backend, seed, faults);
        mixed_traffic_survives(&env, seed);
        let s = env.fabric.stats();
        lost += s.lost;
        duplicated += s.duplicated;
        reordered += s.reordered;
    }
    assert!(
        lost > 0 && duplicated > 0 && reordered > 0,
        "the faults happened: {lost} lost, {duplicated} duplicated, {reordered} reordered"
    );
}

fn rc_read_to_a_responder_without_read_resources_is_rem_inv_req(backend: Backend) {
    let env = Env::new(backend);
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let b = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let p = Params::default();
    let none = Params { rd_atomic: 0, ..p };
    to_init(&a.qp, &p);
    to_init(&b.qp, &p);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &p);
    // b: max_dest_rd_atomic 0.
    to_rtr(&b.qp, a.qp.qp_num(), Env::gid(env.a()), &none);
    rtr_to_rts(&b.qp, &none);
    assert_eq!(b.qp.query_blocking().unwrap().max_dest_rd_atomic, 0);
    let sge = [a.sge(0, 64)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote: b.remote(0),
        },
    )
    .sges(&sge)
    .signaled();
    a.qp.post_send(&[wr]).unwrap();
    let wc = poll_one(&env, &a.cq);
    // IBTA: NAK invalid request. A device that removes the rights instead says so.
    let expected = if has_quirk(env.b(), QuirkId::ZeroRdAtomicIsAccessError) {
        WcStatus::RemAccessErr
    } else {
        WcStatus::RemInvReqErr
    };
    assert_eq!((wc.wr_id, wc.status), (1, expected), "{wc:?}");
    assert_err_and_flushes(&env, &a);
}

cases!(
    manual;
    rc_lossy_duplicating_reordering_link_delivers_everything_once_in_order,
    rc_read_to_a_responder_without_read_resources_is_rem_inv_req,
);

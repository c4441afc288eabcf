//! RC error completions (rdma-unit-test access_test/rc_test, pyverbs test_atomic): remote and
//! local protection, lengths, RNR and transport retries; after each, the QP is in ERR and later
//! requests flush.

use portverbs::prelude::*;
use portverbs::soft::LinkFaults;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

/// Posts `wr` and a signaled follower in one call; the first completes with `status`, the
/// follower is flushed, the QP ends in ERR.
fn expect_error(env: &Env, side: &Side, wr: SendWr<'_>, status: WcStatus) {
    let id = wr.wr_id;
    let follower = SendWr::new(id + 1000, SendOp::Send).signaled();
    side.qp.post_send(&[wr.signaled(), follower]).unwrap();
    let wcs = poll_exact(env, &side.cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (id, status), "{:?}", wcs[0]);
    assert_eq!(wcs[0].qp_num, side.qp.qp_num());
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status),
        (id + 1000, WcStatus::WrFlushErr),
        "{:?}",
        wcs[1]
    );
    assert_err_and_flushes(env, side);
}

fn faa(id: u64, sge: &[Sge], remote: RemoteAddr) -> SendWr<'_> {
    SendWr::new(id, SendOp::AtomicFetchAdd { remote, add: 1 }).sges(sge)
}

fn rc_atomic_to_an_unaligned_address_is_rem_inv_req(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(0, 1).unwrap();
    let remote = p.b.remote(4);
    expect_error(
        &env,
        &p.a,
        faa(1, &[p.a.sge(0, 8)], remote),
        WcStatus::RemInvReqErr,
    );
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 1, "memory untouched");
}

fn rc_atomic_without_remote_atomic_on_the_mr_is_rem_access(backend: Backend) {
    let env = Env::new(backend);
    let access = FULL_ACCESS - AccessFlags::REMOTE_ATOMIC;
    let p = Pair::with(&env, QpType::Rc, &Params::default(), access);
    let remote = p.b.remote(0);
    expect_error(
        &env,
        &p.a,
        faa(1, &[p.a.sge(0, 8)], remote),
        WcStatus::RemAccessErr,
    );
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 0);
}

fn rc_atomic_without_remote_atomic_on_the_qp_is_rem_access(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        access: Params::default().access - AccessFlags::REMOTE_ATOMIC,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    let remote = p.b.remote(0);
    expect_error(
        &env,
        &p.a,
        faa(1, &[p.a.sge(0, 8)], remote),
        WcStatus::RemAccessErr,
    );
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 0);
}

fn rc_read_and_write_without_remote_rights_are_rem_access(backend: Backend) {
    let env = Env::new(backend);
    for (missing, read) in [
        (AccessFlags::REMOTE_READ, true),
        (AccessFlags::REMOTE_WRITE, false),
    ] {
        // The right missing on the responder's QP, then on its MR.
        for on_qp in [true, false] {
            let mut params = Params::default();
            let mut mr_access = FULL_ACCESS;
            if on_qp {
                params.access -= missing;
            } else {
                mr_access -= missing;
            }
            let p = Pair::with(&env, QpType::Rc, &params, mr_access);
            p.b.buf.fill(0, 8, 0x33).unwrap();
            let remote = p.b.remote(0);
            let op = if read {
                SendOp::RdmaRead { remote }
            } else {
                SendOp::RdmaWrite { remote }
            };
            let sge = [p.a.sge(0, 8)];
            let wr = SendWr::new(1, op).sges(&sge);
            expect_error(&env, &p.a, wr, WcStatus::RemAccessErr);
            assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), [0x33; 8], "{missing:?}");
            assert_eq!(queried_state(&p.b.qp), QpState::Err);
        }
    }
}

fn rc_receive_into_memory_without_local_write_is_loc_prot_and_rem_op(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let ro =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..4096, AccessFlags::empty())
            .unwrap();
    let rsge = [ro.sge_at(0, 64)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 3,
            sges: &rsge,
        }])
        .unwrap();
    let sge = [p.a.sge(0, 16)];
    let wr = SendWr::new(1, SendOp::Send).sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::RemOpErr);
    let wc = poll_one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::LocProtErr), "{wc:?}");
}

fn rc_write_with_a_wrong_rkey_is_rem_access(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let remote = RemoteAddr {
        rkey: p.b.mr.rkey().unwrap().wrapping_add(0x100),
        ..p.b.remote(0)
    };
    let sge = [p.a.sge(0, 16)];
    let wr = SendWr::new(1, SendOp::RdmaWrite { remote }).sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::RemAccessErr);
}

fn rc_write_beyond_the_mr_is_rem_access(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let len = p.b.mr.len() as u64;
    p.b.buf.fill(0, len as usize, 0).unwrap();
    let sge = [p.a.sge(0, 100)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: p.b.remote(len - 10),
        },
    )
    .sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(len as usize - 10, 10).unwrap(), [0; 10]);
}

fn rc_wrong_lkey_is_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let sge = [Sge {
        lkey: p.a.mr.lkey() ^ 0x0100_0000,
        ..p.a.sge(0, 16)
    }];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: p.b.remote(0),
        },
    )
    .sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::LocProtErr);
}

fn rc_read_into_memory_without_local_write_is_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let ro =
        p.a.pd
            .reg_mr_blocking(&p.a.buf, 0..4096, AccessFlags::empty())
            .unwrap();
    p.a.buf.fill(0, 64, 0x11).unwrap();
    p.b.buf.fill(0, 64, 0x22).unwrap();
    let sge = [ro.sge_at(0, 64)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote: p.b.remote(0),
        },
    )
    .sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::LocProtErr);
    assert_eq!(p.a.buf.to_vec(0, 64).unwrap(), [0x11; 64]);
}

fn rc_receive_too_small_is_rem_inv_req_and_loc_len(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.post_recv(7, 0, 100);
    let sge = [p.a.sge(0, 200)];
    let wr = SendWr::new(1, SendOp::Send).sges(&sge);
    expect_error(&env, &p.a, wr, WcStatus::RemInvReqErr);
    let wc = poll_one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::LocLenErr), "{wc:?}");
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
}

fn rc_no_receive_exhausts_rnr_retries(backend: Backend) {
    let env = Env::new(backend);
    for rnr_retry in 0..=3u8 {
        let params = Params {
            rnr_retry,
            min_rnr_timer: 1,
            ..Params::default()
        };
        let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
        let before = env.devs[1].engine_stats().rnr_naks;
        // One request alone, so that only its retries meet the responder.
        p.a.qp
            .post_send(&[SendWr::new(1, SendOp::Send)
                .sges(&[p.a.sge(0, 8)])
                .signaled()])
            .unwrap();
        let wc = poll_one(&env, &p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (1, WcStatus::RnrRetryExcErr),
            "{wc:?}"
        );
        assert_err_and_flushes(&env, &p.a);
        let naks = env.devs[1].engine_stats().rnr_naks - before;
        assert_eq!(naks, u64::from(rnr_retry) + 1, "rnr_retry {rnr_retry}");
        // The responder is unharmed.
        assert_eq!(queried_state(&p.b.qp), QpState::Rts);
    }
}

fn rc_infinite_rnr_retry_succeeds_once_a_receive_is_posted(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    p.a.buf.write(0, b"late").unwrap();
    let sge = [p.a.sge(0, 4)];
    let wr = SendWr::new(1, SendOp::Send).sges(&sge).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    env.run_for(50_000_000);
    assert!(env.devs[1].engine_stats().rnr_naks > 10);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(p.a.cq.poll(&mut wc).unwrap(), 0, "still retrying");
    p.b.post_recv(2, 0, 64);
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let got = poll_one(&env, &p.b.cq);
    check_wc(&got, 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(p.b.buf.to_vec(0, 4).unwrap(), b"late");
}

fn rc_lost_packets_exhaust_transport_retries(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        retry_cnt: 3,
        timeout: 10,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    env.set_faults(LinkFaults {
        loss: 1.0,
        ..LinkFaults::NONE
    });
    let before = env.devs[0].engine_stats();
    let start = env.fabric.now_ns();
    let sge = [p.a.sge(0, 8)];
    let wr = write_wr(1, &p.b, 0).sges(&sge);
    p.a.qp.post_send(&[wr]).unwrap();
    let wc = poll_one(&env, &p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr), "{wc:?}");
    let after = env.devs[0].engine_stats();
    // Each retry is one local ACK timeout (the last one fails the WQE). The retransmissions
    // are more: congestion control also goes back N at its probe timeouts, which cost no
    // retry.
    assert_eq!(
        after.timeouts - before.timeouts,
        4,
        "retry_cnt retries, then the timeout that exhausts them"
    );
    assert!(after.retransmits - before.retransmits >= 3);
    let timeout = 4096u64 << 10;
    assert!(
        env.fabric.now_ns() - start >= 4 * timeout,
        "four timeouts elapsed"
    );
    env.set_faults(LinkFaults::NONE);
    assert_err_and_flushes(&env, &p.a);
}

fn rc_more_reads_than_max_rd_atomic_all_complete(backend: Backend) {
    // 1 is the edge where a READ queued behind the only outstanding one must still start.
    for rd_atomic in [1, 2] {
        more_reads_than(backend, rd_atomic);
    }
}

fn more_reads_than(backend: Backend, rd_atomic: u8) {
    let env = Env::new(backend);
    let params = Params {
        rd_atomic,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    let data = pattern(11, 16 * 3000);
    p.b.buf.write(0, &data).unwrap();
    p.b.buf.store_u64(60_000, 0).unwrap();
    let sges: Vec<[Sge; 1]> = (0..16u64).map(|i| [p.a.sge(i * 3000, 3000)]).collect();
    let mut wrs: Vec<SendWr<'_>> = sges
        .iter()
        .zip(0..)
        .map(|(s, i)| {
            SendWr::new(
                i,
                SendOp::RdmaRead {
                    remote: p.b.remote(i * 3000),
                },
            )
            .sges(s)
            .signaled()
        })
        .collect();
    let fsge = [p.a.sge(60_000, 8)];
    for i in 16..20 {
        wrs.push(
            SendWr::new(
                i,
                SendOp::AtomicFetchAdd {
                    remote: p.b.remote(60_000),
                    add: 1,
                },
            )
            .sges(&fsge)
            .signaled(),
        );
    }
    p.a.qp.post_send(&wrs).unwrap();
    let wcs = poll_exact(&env, &p.a.cq, 20);
    for (i, wc) in wcs.iter().enumerate() {
        let op = if i < 16 {
            WcOpcode::RdmaRead
        } else {
            WcOpcode::FetchAdd
        };
        check_wc(wc, i as u64, WcStatus::Success, op);
    }
    assert_eq!(p.a.buf.to_vec(0, data.len()).unwrap(), data);
    assert_eq!(p.b.buf.load_u64(60_000).unwrap(), 4);
    assert_eq!(p.a.buf.load_u64(60_000).unwrap(), 3, "the last add saw 3");
}

cases!(
    manual;
    rc_atomic_to_an_unaligned_address_is_rem_inv_req,
    rc_atomic_without_remote_atomic_on_the_mr_is_rem_access,
    rc_atomic_without_remote_atomic_on_the_qp_is_rem_access,
    rc_read_and_write_without_remote_rights_are_rem_access,
    rc_receive_into_memory_without_local_write_is_loc_prot_and_rem_op,
    rc_write_with_a_wrong_rkey_is_rem_access,
    rc_write_beyond_the_mr_is_rem_access,
    rc_wrong_lkey_is_loc_prot,
    rc_read_into_memory_without_local_write_is_loc_prot,
    rc_receive_too_small_is_rem_inv_req_and_loc_len,
    rc_no_receive_exhausts_rnr_retries,
    rc_infinite_rnr_retry_succeeds_once_a_receive_is_posted,
    rc_lost_packets_exhaust_transport_retries,
    rc_more_reads_than_max_rd_atomic_all_complete,
);

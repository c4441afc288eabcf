//! RC error classes beyond the single-fault cases of `errors_rc` (IBA 9.9.3, 10.7.3.1;
//! rdma-unit-test `rc_test`, `access_test`, `buffer_test`, `pd_test`): which side reports which
//! status when a request meets a bad key on both ends, a receive that cannot take the message, a
//! memory region of another protection domain, or no receive at all; that failed requests
//! complete even unsignaled; that zero-length operations need no valid key; and that a class C
//! error (a NAK) moves both QPs to ERR.

use portverbs::prelude::*;

use super::env::{Backend, Env};
use super::obj_util::{restate_pair, side_on};
use super::tx_util::*;
use super::util::*;

/// Posts `wr` signaled on `side` and returns its single completion.
fn complete(env: &Env, side: &Side, wr: SendWr<'_>) -> WorkCompletion {
    side.qp.post_send(&[wr.signaled()]).unwrap();
    poll_one(env, &side.cq)
}

fn bad_lkey(s: &Side, offset: u64, len: u32) -> Sge {
    Sge {
        lkey: s.mr.lkey() ^ 0x80,
        ..s.sge(offset, len)
    }
}

fn bad_rkey(s: &Side, offset: u64) -> RemoteAddr {
    RemoteAddr {
        rkey: s.mr.rkey().unwrap() ^ 0x80,
        ..s.remote(offset)
    }
}

fn rc_write_with_imm_and_a_bad_rkey_fails_both_sides(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 3,
            sges: &[],
        }])
        .unwrap();
    let sge = [p.a.sge(0, 64)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote: bad_rkey(&p.b, 0),
            imm: 9,
        },
    )
    .sges(&sge);
    let wc = complete(&env, &p.a, wr);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
    let rwc = poll_one(&env, &p.b.cq);
    assert_eq!(
        (rwc.wr_id, rwc.status),
        (3, WcStatus::LocAccessErr),
        "the receive the WRITE with immediate took reports the protection error"
    );
    assert_eq!(p.b.buf.to_vec(0, 64).unwrap(), vec![0; 64]);
    assert_eq!(queried_state(&p.a.qp), QpState::Err);
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
}

fn rc_receive_with_a_bad_lkey_is_rem_op_and_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 3,
            sges: &[bad_lkey(&p.b, 0, 256)],
        }])
        .unwrap();
    let wc = complete(
        &env,
        &p.a,
        SendWr::new(1, SendOp::Send).sges(&[p.a.sge(0, 32)]),
    );
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemOpErr));
    let rwc = poll_one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (3, WcStatus::LocProtErr));
    assert_eq!(queried_state(&p.a.qp), QpState::Err);
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
}

fn rc_receive_outside_its_mr_is_rem_op_and_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let small =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 4096..4096 + 128, AccessFlags::LOCAL_WRITE)
            .unwrap();
    // One byte before the MR, then a list that runs past its end.
    let before = Sge {
        addr: small.addr() - 1,
        ..small.sge_at(0, 64)
    };
    // Mr::sge refuses an entry that leaves the MR: this one is built by hand.
    let past = Sge {
        length: 128,
        ..small.sge_at(64, 1)
    };
    // Each message fits its receive's length; only the MR's bounds are broken.
    for (id, sge, len) in [(3u64, before, 32u32), (4, past, 100)] {
        p.b.qp
            .post_recv(&[RecvWr {
                wr_id: id,
                sges: &[sge],
            }])
            .unwrap();
        let wc = complete(
            &env,
            &p.a,
            SendWr::new(id, SendOp::Send).sges(&[p.a.sge(0, len)]),
        );
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::RemOpErr));
        let rwc = poll_one(&env, &p.b.cq);
        assert_eq!((rwc.wr_id, rwc.status), (id, WcStatus::LocProtErr));
        restate_pair(&env, &p, &Params::default());
    }
}

fn rc_receive_on_a_deregistered_mr_fails_after_dereg_succeeds(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mr =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 3,
            sges: &[mr.sge_at(0, 256)],
        }])
        .unwrap();
    mr.dereg().expect("a posted receive does not hold its MR");
    assert!(env.poll(&p.b.cq, 0).is_empty());
    let wc = complete(
        &env,
        &p.a,
        SendWr::new(1, SendOp::Send).sges(&[p.a.sge(0, 16)]),
    );
    assert_eq!(wc.status, WcStatus::RemOpErr);
    let rwc = poll_one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (3, WcStatus::LocProtErr));
}

fn send_and_write_need_no_local_write_on_the_source(backend: Backend) {
    // Gather needs local read only; a SEND needs no remote right at the destination.
    let env = Env::new(backend);
    let p = Pair::with(
        &env,
        QpType::Rc,
        &Params::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    let ro =
        p.a.pd
            .reg_mr_blocking(&p.a.buf, 0..4096, AccessFlags::empty())
            .unwrap();
    let data = pattern(7, 128);
    p.a.buf.write(0, &data).unwrap();
    let src = [ro.sge_at(0, 128)];
    let write = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: p.b.remote(0),
        },
    )
    .sges(&src);
    assert_eq!(complete(&env, &p.a, write).status, WcStatus::Success);
    assert_eq!(p.b.buf.to_vec(0, 128).unwrap(), data);
    let local_only =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 8192..12288, AccessFlags::LOCAL_WRITE)
            .unwrap();
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 5,
            sges: &[local_only.sge_at(0, 256)],
        }])
        .unwrap();
    let send = SendWr::new(2, SendOp::Send).sges(&src);
    assert_eq!(complete(&env, &p.a, send).status, WcStatus::Success);
    let rwc = poll_one(&env, &p.b.cq);
    check_wc(&rwc, 5, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(p.b.buf.to_vec(8192, 128).unwrap(), data);
}

fn unsignaled_failing_requests_still_complete(backend: Backend) {
    // IBA 10.7.3.1: an error completion is generated whether or not the request was
    // signaled.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let one_byte = [bad_lkey(&p.a, 0, 8)];
    let good = [p.a.sge(0, 8)];
    let cases = [
        (
            SendWr::new(1, SendOp::Send).sges(&one_byte),
            WcStatus::LocProtErr,
        ),
        (
            SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote: bad_rkey(&p.b, 0),
                },
            )
            .sges(&good),
            WcStatus::RemAccessErr,
        ),
        (
            SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote: p.b.remote(0),
                },
            )
            .sges(&one_byte),
            WcStatus::LocProtErr,
        ),
        (
            SendWr::new(
                4,
                SendOp::AtomicFetchAdd {
                    remote: p.b.remote(0),
                    add: 1,
                },
            )
            .sges(&one_byte),
            WcStatus::LocProtErr,
        ),
    ];
    for (wr, status) in cases {
        p.a.qp.post_send(&[wr]).unwrap();
        let wc = poll_one(&env, &p.a.cq);
        assert_eq!((wc.wr_id, wc.status), (wr.wr_id, status), "{:?}", wr.op);
        restate_pair(&env, &p, &Params::default());
    }
}

fn write_with_both_keys_bad_is_loc_prot_read_and_atomics_are_rem_access(backend: Backend) {
    // A WRITE gathers before it sends (the local key fails first); a READ or an atomic is
    // checked at the responder before its response meets the local key.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(0, 40).unwrap();
    let local = [bad_lkey(&p.a, 0, 8)];
    let remote = bad_rkey(&p.b, 0);
    let wr = SendWr::new(1, SendOp::RdmaWrite { remote }).sges(&local);
    assert_eq!(complete(&env, &p.a, wr).status, WcStatus::LocProtErr);
    assert_eq!(queried_state(&p.b.qp), QpState::Rts, "nothing was sent");
    restate_pair(&env, &p, &Params::default());
    let ops = [
        SendOp::RdmaRead { remote },
        SendOp::AtomicFetchAdd { remote, add: 1 },
        SendOp::AtomicCmpSwp {
            remote,
            compare: 40,
            swap: 41,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let wc = complete(&env, &p.a, SendWr::new(10 + i as u64, op).sges(&local));
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{op:?}");
        restate_pair(&env, &p, &Params::default());
    }
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 40);
}

fn rc_read_error_cases_match_write(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let len = p.b.mr.len() as u64;
    p.a.buf.fill(0, 256, 0x5a).unwrap();
    let before_mr = RemoteAddr {
        addr: p.b.mr.addr() - 1,
        ..p.b.remote(0)
    };
    let targets = [bad_rkey(&p.b, 0), p.b.remote(len - 16), before_mr];
    let dst = [p.a.sge(0, 64)];
    for (i, remote) in targets.into_iter().enumerate() {
        let wr = SendWr::new(i as u64, SendOp::RdmaRead { remote }).sges(&dst);
        let wc = complete(&env, &p.a, wr);
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{remote:x?}");
        assert_eq!(p.a.buf.to_vec(0, 64).unwrap(), vec![0x5a; 64], "untouched");
        assert_eq!(queried_state(&p.b.qp), QpState::Err);
        let evs = drain_events(env.b());
        assert_eq!(
            count_events(
                &evs,
                portverbs::verbs::AsyncEventKind::QpAccessErr,
                portverbs::verbs::EventElement::Qp(p.b.qp.qp_num())
            ),
            1,
            "{evs:?}"
        );
        restate_pair(&env, &p, &Params::default());
    }
}

fn rc_key_of_an_mr_in_another_pd_is_rem_access(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let foreign = other_pd
        .reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS)
        .unwrap();
    let remote = RemoteAddr {
        addr: foreign.addr(),
        rkey: foreign.rkey().unwrap(),
    };
    p.b.buf.store_u64(0, 3).unwrap();
    let sge = [p.a.sge(0, 8)];
    let ops = [
        SendOp::RdmaWrite { remote },
        SendOp::RdmaRead { remote },
        SendOp::AtomicFetchAdd { remote, add: 1 },
        SendOp::AtomicCmpSwp {
            remote,
            compare: 3,
            swap: 4,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let wc = complete(&env, &p.a, SendWr::new(i as u64, op).sges(&sge));
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{op:?}");
        restate_pair(&env, &p, &Params::default());
    }
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 3, "memory unchanged");
}

fn rc_zero_length_read_and_write_need_no_valid_key(backend: Backend) {
    // A zero-length READ or WRITE touches no memory, so its key and address are not checked
    // (IBA 9.7.4.1.3/9.7.5.1.3; rxe skips the check too).
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let nowhere = RemoteAddr {
        addr: 0xdead_0000,
        rkey: 0xdead_beef,
    };
    let ops = [
        SendOp::RdmaWrite { remote: nowhere },
        SendOp::RdmaRead { remote: nowhere },
        SendOp::RdmaWrite {
            remote: bad_rkey(&p.b, 0),
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let wc = complete(&env, &p.a, SendWr::new(i as u64, op));
        assert_eq!(wc.status, WcStatus::Success, "{op:?}");
        assert_eq!(wc.byte_len, 0);
    }
    assert_eq!(queried_state(&p.a.qp), QpState::Rts);
    assert_eq!(queried_state(&p.b.qp), QpState::Rts);
}

fn rc_write_with_imm_without_a_receive_is_rnr(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    p.a.buf.fill(0, 64, 0x77).unwrap();
    let src = [p.a.sge(0, 64)];
    let wr = SendWr::new(
        1,
        SendOp::RdmaWriteWithImm {
            remote: p.b.remote(0),
            imm: 5,
        },
    )
    .sges(&src);
    let wc = complete(&env, &p.a, wr);
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
    assert_eq!(
        p.b.buf.to_vec(0, 64).unwrap(),
        vec![0; 64],
        "nothing is written before a receive is found"
    );
    assert_eq!(
        queried_state(&p.b.qp),
        QpState::Rts,
        "RNR is not fatal to the responder"
    );
}

fn class_c_error_moves_both_qps_to_err_and_nothing_else_completes(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.post_recv(9, 0, 64);
    let sge = [p.a.sge(0, 8)];
    let cas = SendWr::new(
        1,
        SendOp::AtomicCmpSwp {
            remote: p.b.remote(4),
            compare: 0,
            swap: 1,
        },
    )
    .sges(&sge)
    .signaled();
    let next = SendWr::new(2, SendOp::Send).sges(&sge).signaled();
    p.a.qp.post_send(&[cas, next]).unwrap();
    let wcs = poll_exact(&env, &p.a.cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemInvReqErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(queried_state(&p.a.qp), QpState::Err);
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
    // The responder's posted receive is flushed, nothing else.
    let rwc = poll_one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (9, WcStatus::WrFlushErr));
}

fn rc_requests_to_a_responder_in_reset_init_or_err_exhaust_retries(backend: Backend) {
    // A responder that does not take requests (not yet RTR, or in ERR) drops them silently;
    // the requester's transport retries run out.
    let env = Env::new(backend);
    let params = Params {
        retry_cnt: 1,
        timeout: 8,
        ..Params::default()
    };
    for state in [QpState::Reset, QpState::Init, QpState::Err] {
        let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
        let b = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
        to_init(&a.qp, &params);
        to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &params);
        if state != QpState::Reset {
            to_init(&b.qp, &params);
        }
        if state == QpState::Err {
            b.qp.modify_blocking(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            )
            .unwrap();
        }
        let src = [a.sge(0, 8)];
        let wr = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote: b.remote(0),
            },
        )
        .sges(&src);
        let wc = complete(&env, &a, wr);
        assert_eq!(wc.status, WcStatus::RetryExcErr, "responder in {state}");
        assert_eq!(b.buf.to_vec(0, 8).unwrap(), vec![0; 8]);
        assert!(env.poll(&b.cq, 0).is_empty(), "the responder saw nothing");
    }
}

fn rc_responder_in_rtr_serves_reads_writes_and_atomics(backend: Backend) {
    let env = Env::new(backend);
    let params = Params::default();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let b = side_on(env.b(), cq(env.b(), 16), FULL_ACCESS);
    to_init(&a.qp, &params);
    to_init(&b.qp, &params);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &params);
    to_rtr(&b.qp, a.qp.qp_num(), Env::gid(env.a()), &params);
    b.buf.store_u64(64, 10).unwrap();
    let data = pattern(3, 32);
    a.buf.write(0, &data).unwrap();
    let sge = [a.sge(0, 32)];
    let wc = complete(
        &env,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote: b.remote(0),
            },
        )
        .sges(&sge),
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(0, 32).unwrap(), data);
    let wc = complete(
        &env,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote: b.remote(64),
            },
        )
        .sges(&[a.sge(512, 8)]),
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(a.buf.load_u64(512).unwrap(), 10);
    let wc = complete(
        &env,
        &a,
        SendWr::new(
            3,
            SendOp::AtomicFetchAdd {
                remote: b.remote(64),
                add: 5,
            },
        )
        .sges(&[a.sge(1024, 8)]),
    );
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(b.buf.load_u64(64).unwrap(), 15);
    assert_eq!(queried_state(&b.qp), QpState::Rtr);
}

cases!(
    manual;
    rc_write_with_imm_and_a_bad_rkey_fails_both_sides,
    rc_receive_with_a_bad_lkey_is_rem_op_and_loc_prot,
    rc_receive_outside_its_mr_is_rem_op_and_loc_prot,
    rc_receive_on_a_deregistered_mr_fails_after_dereg_succeeds,
    send_and_write_need_no_local_write_on_the_source,
    unsignaled_failing_requests_still_complete,
    write_with_both_keys_bad_is_loc_prot_read_and_atomics_are_rem_access,
    rc_read_error_cases_match_write,
    rc_key_of_an_mr_in_another_pd_is_rem_access,
    rc_zero_length_read_and_write_need_no_valid_key,
    rc_write_with_imm_without_a_receive_is_rnr,
    class_c_error_moves_both_qps_to_err_and_nothing_else_completes,
    rc_requests_to_a_responder_in_reset_init_or_err_exhaust_retries,
    rc_responder_in_rtr_serves_reads_writes_and_atomics,
);

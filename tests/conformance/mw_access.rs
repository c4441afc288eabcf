//! Access through memory windows (rdma-unit-test `mw_test` and `buffer_test` window cases,
//! `ibv_bind_mw(3)`): which rights and bounds a window enforces, which QP or PD may use and
//! rebind it, and what becomes of windows when their QP or MR changes.

use portverbs::prelude::*;
use portverbs::verbs::{MrError, inc_rkey};

use super::env::{Backend, Env};
use super::mw_util::*;
use super::obj_util::*;
use super::tx_util::*;
use super::util::*;

/// Runs `op` signaled from a with an 8-byte local buffer; returns its completion.
fn remote_op(env: &Env, p: &Pair, id: u64, op: SendOp) -> WorkCompletion {
    let sge = [p.a.sge(0, 8)];
    run(env, &p.a, SendWr::new(id, op).sges(&sge))
}

const ALL: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn atomics_work_through_windows_of_both_types(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    p.b.buf.store_u64(64, 100).unwrap();
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, ALL).is_ok());
        let faa = SendOp::AtomicFetchAdd {
            remote: remote(&p, 64, mw.rkey()),
            add: 1,
        };
        let wc = remote_op(&env, &p, 1, faa);
        assert_eq!(wc.status, WcStatus::Success, "{t:?}");
        let cas = SendOp::AtomicCmpSwp {
            remote: remote(&p, 64, mw.rkey()),
            compare: p.b.buf.load_u64(64).unwrap(),
            swap: 7,
        };
        let wc = remote_op(&env, &p, 2, cas);
        assert_eq!(wc.status, WcStatus::Success, "{t:?}");
        assert_eq!(p.b.buf.load_u64(64).unwrap(), 7);
        p.b.buf.store_u64(64, 100).unwrap();
    }
}

fn windows_enforce_each_remote_right(backend: Backend) {
    // A window grants only what its bind asked for: no READ without REMOTE_READ, no atomic
    // without REMOTE_ATOMIC (rdma-unit-test's READ case drops the wrong flag; this one does not).
    let env = Env::new(backend);
    let p = mw_pair(&env);
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, AccessFlags::REMOTE_WRITE).is_ok());
        let rkey = mw.rkey();
        let wc = remote_op(
            &env,
            &p,
            1,
            SendOp::RdmaRead {
                remote: remote(&p, 0, rkey),
            },
        );
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{t:?} READ");
        restate_pair(&env, &p, &mw_params());
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        assert!(
            bind_wr(
                &env,
                &p.b,
                &mw,
                &p.b.mr,
                0,
                4096,
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
            )
            .is_ok()
        );
        let faa = SendOp::AtomicFetchAdd {
            remote: remote(&p, 0, mw.rkey()),
            add: 1,
        };
        assert_eq!(
            remote_op(&env, &p, 2, faa).status,
            WcStatus::RemAccessErr,
            "{t:?} atomic"
        );
        restate_pair(&env, &p, &mw_params());
    }
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 0);
}

fn windows_refuse_access_before_their_start_and_binds_before_the_mr(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mr =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 4096..8192, FULL_ACCESS)
            .unwrap();
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        assert!(bind_wr(&env, &p.b, &mw, &mr, 1024, 1024, ALL).is_ok());
        let one_before = RemoteAddr {
            addr: mr.addr() + 1023,
            rkey: mw.rkey(),
        };
        let wc = remote_op(&env, &p, 1, SendOp::RdmaRead { remote: one_before });
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{t:?}");
        restate_pair(&env, &p, &mw_params());
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let b = mw.bind(&mr, mr.addr() - 1, 64, ALL);
        let wc = run(&env, &p.b, SendWr::new(901, SendOp::BindMw { bind: b }));
        assert_eq!(
            wc.status,
            WcStatus::MwBindErr,
            "{t:?}: a bind 1 byte before its MR"
        );
        restate_pair(&env, &p, &mw_params());
    }
}

fn zero_length_access_through_a_window_succeeds_anywhere(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 4096, 1024, ALL).is_ok());
    for (i, offset) in [4096u64, 0, 60_000].into_iter().enumerate() {
        let remote = remote(&p, offset, mw.rkey());
        for op in [SendOp::RdmaRead { remote }, SendOp::RdmaWrite { remote }] {
            let wc = run(&env, &p.a, SendWr::new(i as u64, op));
            assert_eq!(wc.status, WcStatus::Success, "{op:?} at {offset}");
        }
    }
    assert_eq!(queried_state(&p.b.qp), QpState::Rts);
}

fn remote_atomic_window_needs_local_write_on_its_mr(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let bind_only =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..4096, AccessFlags::MW_BIND)
            .unwrap();
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(
        &env,
        &p.b,
        &mw,
        &bind_only,
        0,
        4096,
        AccessFlags::REMOTE_ATOMIC,
    );
    assert_eq!(wc.status, WcStatus::MwBindErr);
    restate_pair(&env, &p, &mw_params());
    let wc = bind_wr(
        &env,
        &p.b,
        &mw,
        &p.b.mr,
        0,
        4096,
        AccessFlags::REMOTE_ATOMIC,
    );
    assert_eq!(wc.status, WcStatus::Success, "with LOCAL_WRITE on the MR");
    let wc = bind_wr(
        &env,
        &p.b,
        &p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap(),
        &bind_only,
        0,
        64,
        AccessFlags::empty(),
    );
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "a window with no rights needs MW_BIND only"
    );
}

fn type1_window_can_be_rebound_from_another_qp_of_its_pd(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let first =
        p.b.qp
            .bind_mw(&mw, &p.b.mr, p.b.mr.addr(), 4096, ALL, 1, true)
            .unwrap();
    assert!(one(&env, &p.b.cq).is_ok());
    let other = side_on(env.b(), cq(env.b(), 16), FULL_ACCESS);
    let qp2 = make_qp(&p.b.pd, &other.cq, QpType::Rc, None, false);
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a2.qp, &qp2, &mw_params());
    let second = qp2
        .bind_mw(&mw, &p.b.mr, p.b.mr.addr() + 8192, 4096, ALL, 2, true)
        .unwrap();
    assert!(one(&env, &other.cq).is_ok());
    assert_ne!(first, second);
    let data = pattern(1, 16);
    let wc = write(&env, &p.a, 3, &data, remote(&p, 8192, second));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "type 1 windows belong to the PD"
    );
    assert_eq!(p.b.buf.to_vec(8192, 16).unwrap(), data);
    let wc = write(&env, &p.a, 4, &data, remote(&p, 0, first));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "the first key is dead");
}

fn type2_window_bound_to_one_qp_cannot_be_bound_on_another(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, ALL).is_ok());
    let bound = mw.rkey();
    let other = side_on(env.b(), cq(env.b(), 16), FULL_ACCESS);
    let qp2 = make_qp(&p.b.pd, &other.cq, QpType::Rc, None, false);
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a2.qp, &qp2, &mw_params());
    let b2 = mw.bind(&p.b.mr, p.b.mr.addr(), 64, ALL);
    qp2.post_send(&[SendWr::new(5, SendOp::BindMw { bind: b2 }).signaled()])
        .unwrap();
    let wc = one(&env, &other.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::MwBindErr));
    let data = pattern(2, 32);
    let wc = write(&env, &p.a, 6, &data, remote(&p, 0, bound));
    assert_eq!(wc.status, WcStatus::Success, "the first binding is intact");
    assert_eq!(p.b.buf.to_vec(0, 32).unwrap(), data);
}

fn type1_window_of_another_pd_is_rem_access(backend: Backend) {
    // A type-1 window bound in PD2 (through a QP of PD2) is refused on a responder QP of PD1.
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let pd2 = env.b().alloc_pd_blocking().unwrap();
    let cq2 = cq(env.b(), 16);
    let qp2 = make_qp(&pd2, &cq2, QpType::Rc, None, false);
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a2.qp, &qp2, &mw_params());
    let mr2 = pd2.reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS).unwrap();
    let mw = pd2.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey = qp2
        .bind_mw(&mw, &mr2, mr2.addr(), 4096, ALL, 1, true)
        .unwrap();
    assert!(one(&env, &cq2).is_ok());
    p.b.buf.store_u64(0, 9).unwrap();
    let remote = remote(&p, 0, rkey);
    let ops = [
        SendOp::RdmaWrite { remote },
        SendOp::RdmaRead { remote },
        SendOp::AtomicFetchAdd { remote, add: 1 },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let wc = remote_op(&env, &p, i as u64, op);
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{op:?} through PD1's QP");
        restate_pair(&env, &p, &mw_params());
    }
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 9);
}

fn bind_of_an_mr_of_another_pd_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let pd2 = env.b().alloc_pd_blocking().unwrap();
    let mr2 = pd2.reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS).unwrap();
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let wc = bind_wr(&env, &p.b, &mw, &mr2, 0, 4096, ALL);
        assert_eq!(wc.status, WcStatus::MwBindErr, "{t:?}");
        restate_pair(&env, &p, &mw_params());
    }
}

fn destroying_a_qp_ends_its_type2_windows_but_not_type1(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let other = side_on(env.b(), cq(env.b(), 16), FULL_ACCESS);
    let qp2 = make_qp(&p.b.pd, &other.cq, QpType::Rc, None, false);
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a2.qp, &qp2, &mw_params());
    let mw1 = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let k1 = qp2
        .bind_mw(&mw1, &p.b.mr, p.b.mr.addr(), 4096, ALL, 1, true)
        .unwrap();
    assert!(one(&env, &other.cq).is_ok());
    let mw2 = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let b2 = mw2.bind(&p.b.mr, p.b.mr.addr() + 4096, 4096, ALL);
    qp2.post_send(&[SendWr::new(2, SendOp::BindMw { bind: b2 }).signaled()])
        .unwrap();
    assert!(one(&env, &other.cq).is_ok());
    drop(a2);
    qp2.destroy()
        .expect("a QP with bound windows can be destroyed");
    // A new QP that may get the same number must not inherit the type-2 window.
    let qp3 = make_qp(&p.b.pd, &other.cq, QpType::Rc, None, false);
    let a3 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a3.qp, &qp3, &mw_params());
    let data = pattern(3, 16);
    let wc = write(&env, &a3, 3, &data, remote(&p, 4096, mw2.rkey()));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "the type-2 window died with its QP"
    );
    let wc = write(&env, &p.a, 4, &data, remote(&p, 0, k1));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "type 1 windows belong to the PD"
    );
    assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), data);
}

fn dereg_mr_with_a_bound_type2_window_is_refused(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mr =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..8192, FULL_ACCESS)
            .unwrap();
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &mr, 0, 4096, ALL).is_ok());
    let mr = match mr.dereg().map_err(|r| r.into_parts()) {
        Err((MrError::Busy { .. }, mr)) => mr,
        other => panic!("expected Busy, got {:?}", other),
    };
    let data = pattern(5, 32);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 0, mw.rkey()));
    assert_eq!(wc.status, WcStatus::Success, "the window keeps working");
    let wc = run(
        &env,
        &p.b,
        SendWr::new(2, SendOp::LocalInv { rkey: mw.rkey() }),
    );
    assert!(wc.is_ok());
    mr.dereg().expect("free once the window is invalidated");
}

fn unsignaled_window_operations_complete_only_on_error(backend: Backend) {
    // IBA 10.7.3.1: a successful unsignaled bind or invalidate leaves no completion; a failed
    // one completes anyway.
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let b = mw.bind(&p.b.mr, p.b.mr.addr(), 4096, ALL);
    let rkey = b.new_rkey;
    let inv = SendWr::new(2, SendOp::LocalInv { rkey });
    let sge = [p.b.sge(60_000, 8)];
    let follower = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote: p.a.remote(0),
        },
    )
    .sges(&sge)
    .signaled();
    p.b.qp
        .post_send(&[SendWr::new(1, SendOp::BindMw { bind: b }), inv, follower])
        .unwrap();
    let wcs = poll_exact(&env, &p.b.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::Success));
    let wc = write(&env, &p.a, 4, &[1; 8], remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "bound, then invalidated");
    restate_pair(&env, &p, &mw_params());
    // An unsignaled invalidate of a key that is no bound window completes with its error.
    p.b.qp
        .post_send(&[SendWr::new(
            5,
            SendOp::LocalInv {
                rkey: inc_rkey(rkey),
            },
        )])
        .unwrap();
    let wc = poll_one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::MwBindErr));
    restate_pair(&env, &p, &mw_params());
    // And an unsignaled bind that fails.
    let bad = mw.bind(&p.b.mr, p.b.mr.addr() + p.b.mr.len() as u64, 64, ALL);
    p.b.qp
        .post_send(&[SendWr::new(6, SendOp::BindMw { bind: bad })])
        .unwrap();
    let wc = poll_one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::MwBindErr));
}

fn type1_bind_posted_to_a_qp_in_err_is_flushed(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    p.b.qp
        .modify_blocking(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey =
        p.b.qp
            .bind_mw(&mw, &p.b.mr, p.b.mr.addr(), 4096, ALL, 7, true)
            .unwrap();
    let wc = one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushErr));
    restate_pair(&env, &p, &mw_params());
    let wc = write(&env, &p.a, 1, &[1; 8], remote(&p, 0, rkey));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "a flushed bind binds nothing"
    );
}

fn send_with_invalidate_of_a_type1_window_fails_the_receive(backend: Backend) {
    // Only a type-2 window may be invalidated remotely (IBA 10.6.7.2); class J otherwise.
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey =
        p.b.qp
            .bind_mw(&mw, &p.b.mr, p.b.mr.addr(), 4096, ALL, 1, true)
            .unwrap();
    assert!(one(&env, &p.b.cq).is_ok());
    p.b.post_recv(3, 8192, 256);
    let sge = [p.a.sge(0, 16)];
    let wc = run(
        &env,
        &p.a,
        SendWr::new(4, SendOp::SendWithInv { rkey }).sges(&sge),
    );
    assert_eq!(wc.status, WcStatus::Success);
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (3, WcStatus::RemInvReqErr));
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
}

fn send_with_invalidate_without_data_invalidates_and_reports_the_key(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, ALL).is_ok());
    let rkey = mw.rkey();
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 3,
            sges: &[],
        }])
        .unwrap();
    let wc = run(&env, &p.a, SendWr::new(4, SendOp::SendWithInv { rkey }));
    assert_eq!(wc.status, WcStatus::Success);
    let rwc = one(&env, &p.b.cq);
    check_wc(&rwc, 3, WcStatus::Success, WcOpcode::Recv);
    assert_eq!((rwc.byte_len, rwc.invalidated_rkey()), (0, Some(rkey)));
    let wc = write(&env, &p.a, 5, &[1; 8], remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    restate_pair(&env, &p, &mw_params());
    let wc = write(&env, &p.a, 6, &[2; 8], p.b.remote(0));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "the MR's own key is untouched"
    );
}

fn send_with_invalidate_without_a_receive_is_rnr_and_keeps_the_window(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..mw_params()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, ALL).is_ok());
    let rkey = mw.rkey();
    let wc = run(&env, &p.a, SendWr::new(4, SendOp::SendWithInv { rkey }));
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
    assert_eq!(queried_state(&p.b.qp), QpState::Rts);
    restate(&p.a.qp, p.b.qp.qp_num(), Env::gid(env.b()), &params);
    let data = pattern(6, 8);
    let wc = write(&env, &p.a, 5, &data, remote(&p, 0, rkey));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "the window was not invalidated"
    );
}

fn zero_based_binds_fail_with_mw_bind_err(backend: Backend) {
    // A type-1 window is never zero-based (IBA); type 2 could be, but no backend here has
    // zero-based addressing (QuirkId::NoZeroBasedAddressing), and says so.
    let env = Env::new(backend);
    assert!(has_quirk(
        env.b(),
        portverbs::hal::QuirkId::NoZeroBasedAddressing
    ));
    let p = mw_pair(&env);
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let wc = bind_wr(
            &env,
            &p.b,
            &mw,
            &p.b.mr,
            0,
            4096,
            ALL | AccessFlags::ZERO_BASED,
        );
        assert_eq!(wc.status, WcStatus::MwBindErr, "{t:?}");
        restate_pair(&env, &p, &mw_params());
    }
}

cases!(
    manual;
    atomics_work_through_windows_of_both_types,
    windows_enforce_each_remote_right,
    windows_refuse_access_before_their_start_and_binds_before_the_mr,
    zero_length_access_through_a_window_succeeds_anywhere,
    remote_atomic_window_needs_local_write_on_its_mr,
    type1_window_can_be_rebound_from_another_qp_of_its_pd,
    type2_window_bound_to_one_qp_cannot_be_bound_on_another,
    type1_window_of_another_pd_is_rem_access,
    bind_of_an_mr_of_another_pd_fails_with_mw_bind_err,
    destroying_a_qp_ends_its_type2_windows_but_not_type1,
    dereg_mr_with_a_bound_type2_window_is_refused,
    unsignaled_window_operations_complete_only_on_error,
    type1_bind_posted_to_a_qp_in_err_is_flushed,
    send_with_invalidate_of_a_type1_window_fails_the_receive,
    send_with_invalidate_without_data_invalidates_and_reports_the_key,
    send_with_invalidate_without_a_receive_is_rnr_and_keeps_the_window,
    zero_based_binds_fail_with_mw_bind_err,
);

//! Memory-window rules beyond the happy paths (IBA 10.6.7, 11.4; `ibv_bind_mw(3)`,
//! `ibv_alloc_mw(3)`; rdma-unit-test `mw_test`): what may bind a window, what may invalidate
//! it, and what each side sees when a SEND_WITH_INV names a key the responder may not
//! invalidate (IBA class J).

use portverbs::prelude::*;
use portverbs::verbs::{MwBind, PostError, PostErrorKind, inc_rkey};

use super::env::{Backend, Env};
use super::mw_util::*;
use super::obj_util::*;
use super::tx_util::*;
use super::util::*;

/// [`bind_wr`] with remote read and write.
fn bind2(env: &Env, side: &Side, mw: &Mw, mr: &Mr, offset: u64, len: u64) -> WorkCompletion {
    bind_wr(env, side, mw, mr, offset, len, RW)
}

fn type2_bind_with_zero_length_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind2(&env, &p.b, &mw, &p.b.mr, 0, 0);
    assert_eq!(
        (wc.wr_id, wc.status),
        (901, WcStatus::MwBindErr),
        "only a type-1 window is unbound by a zero-length bind"
    );
    assert_eq!(
        queried_state(&p.b.qp),
        QpState::Err,
        "a bind error is fatal"
    );
    restate_pair(&env, &p, &mw_params());
    // The window stayed unbound: the key the failed bind asked for opens nothing.
    let wc = write(&env, &p.a, 1, &[7; 8], remote(&p, 0, mw.rkey()));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    restate_pair(&env, &p, &mw_params());
    // And it can still be bound properly.
    assert!(bind2(&env, &p.b, &mw, &p.b.mr, 0, 64).is_ok());
    let wc = write(&env, &p.a, 2, &[8; 8], remote(&p, 0, mw.rkey()));
    assert_eq!(wc.status, WcStatus::Success);
}

fn type2_local_invalidate_on_another_qp_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let (qp2, _a2) = second_qp(&env, &p);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind2(&env, &p.b, &mw, &p.b.mr, 0, 4096).is_ok());
    let rkey = mw.rkey();
    qp2.post_send(&[SendWr::new(5, SendOp::LocalInv { rkey }).signaled()])
        .unwrap();
    let wc = one(&env, &p.b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        (5, WcStatus::MwBindErr, qp2.qp_num()),
        "a type-2 window belongs to the QP it is bound to"
    );
    assert_eq!(queried_state(&qp2), QpState::Err);
    let data = pattern(2, 64);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::Success, "the window is still bound");
    assert_eq!(p.b.buf.to_vec(0, 64).unwrap(), data);
    // Its own QP may invalidate it.
    let wc = run(&env, &p.b, SendWr::new(6, SendOp::LocalInv { rkey }));
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::Success));
}

fn bind_mw_refuses_a_type2_window(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let before = mw.rkey();
    let r =
        p.b.qp
            .bind_mw(&mw, &p.b.mr, p.b.mr.addr(), 4096, RW, 44, true);
    match r {
        Err(PostError {
            index: 0,
            wr_id: 44,
            kind: PostErrorKind::WrongWindowType { mw_type },
            ..
        }) => assert_eq!(mw_type, MwType::Type2),
        other => panic!("expected WrongWindowType, got {other:?}"),
    }
    assert_eq!(mw.rkey(), before, "a refused bind does not touch the key");
    assert!(env.poll(&p.b.cq, 0).is_empty(), "nothing was posted");
    assert_eq!(queried_state(&p.b.qp), QpState::Rts);
}

fn bind_and_local_invalidate_requests_with_a_payload_are_refused_at_post(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let before = mw.rkey();
    let sge = [p.b.sge(0, 64)];
    let bind = MwBind {
        new_rkey: inc_rkey(before),
        mw_type: MwType::Type2,
        mr_lkey: p.b.mr.lkey(),
        addr: p.b.mr.addr(),
        length: 4096,
        access: RW,
    };
    let requests = [
        SendWr::new(1, SendOp::BindMw { bind }).sges(&sge),
        SendWr::new(2, SendOp::BindMw { bind }).inline(b"bytes"),
        SendWr::new(3, SendOp::LocalInv { rkey: before }).sges(&sge),
    ];
    for wr in requests {
        match p.b.qp.post_send(&[wr.signaled()]) {
            Err(PostError {
                kind: PostErrorKind::PayloadNotAllowed { op },
                wr_id,
                ..
            }) => {
                assert_eq!(wr_id, wr.wr_id);
                assert_eq!(op, wr.op.name());
            }
            other => panic!("{:?}: expected PayloadNotAllowed, got {other:?}", wr.op),
        }
    }
    assert!(env.poll(&p.b.cq, 0).is_empty(), "nothing was posted");
    assert_eq!(mw.rkey(), before);
    let wc = write(&env, &p.a, 9, &[1; 8], remote(&p, 0, inc_rkey(before)));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "the window was not bound"
    );
}

/// SEND_WITH_INV of `rkey` from a to b with a receive posted: returns (sender's, receiver's)
/// completions.
fn send_with_inv(env: &Env, p: &Pair, rkey: u32) -> (WorkCompletion, WorkCompletion) {
    p.b.post_recv(3, 8192, 4096);
    p.a.buf.write(0, &pattern(1, 32)).unwrap();
    let sge = [p.a.sge(0, 32)];
    let wc = run(
        env,
        &p.a,
        SendWr::new(4, SendOp::SendWithInv { rkey }).sges(&sge),
    );
    (wc, one(env, &p.b.cq))
}

fn send_with_invalidate_of_a_window_of_another_qp_is_acked_and_fails_the_receive(backend: Backend) {
    // IBA class J (as rxe implements it): the message arrived, so the requester's SEND is
    // acknowledged and succeeds; the receive completes in error and the responder's QP goes
    // to ERR; no NAK, and the window stays bound.
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let (qp2, a2) = second_qp(&env, &p);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind2(&env, &p.b, &mw, &p.b.mr, 0, 4096).is_ok());
    let rkey = mw.rkey();
    // The window is bound to p.b.qp; the invalidation arrives on qp2.
    qp2.post_recv(&[RecvWr {
        wr_id: 3,
        sges: &[p.b.sge(8192, 4096)],
    }])
    .unwrap();
    a2.buf.write(0, &pattern(1, 32)).unwrap();
    let wc = run(
        &env,
        &a2,
        SendWr::new(4, SendOp::SendWithInv { rkey }).sges(&[a2.sge(0, 32)]),
    );
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success), "{wc:?}");
    let rwc = one(&env, &p.b.cq);
    assert_eq!(
        (rwc.wr_id, rwc.status, rwc.qp_num),
        (3, WcStatus::RemInvReqErr, qp2.qp_num())
    );
    assert_eq!(queried_state(&qp2), QpState::Err);
    assert_eq!(queried_state(&a2.qp), QpState::Rts, "no NAK reached a2");
    let data = pattern(5, 16);
    let wc = write(&env, &p.a, 5, &data, remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::Success, "the window is still bound");
    assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), data);
}

fn send_with_invalidate_of_a_key_that_is_no_window_is_acked_and_fails_the_receive(
    backend: Backend,
) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mr_key = p.b.mr.rkey().unwrap();
    let (wc, rwc) = send_with_inv(&env, &p, mr_key);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
    assert_eq!((rwc.wr_id, rwc.status), (3, WcStatus::RemInvReqErr));
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
    assert_eq!(queried_state(&p.a.qp), QpState::Rts);
    restate_pair(&env, &p, &mw_params());
    let wc = write(&env, &p.a, 5, &[3; 8], p.b.remote(0));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "the MR's key was not invalidated"
    );
}

fn type2_window_can_be_rebound_after_local_invalidate(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind2(&env, &p.b, &mw, &p.b.mr, 0, 4096).is_ok());
    let first = mw.rkey();
    let wc = run(&env, &p.b, SendWr::new(5, SendOp::LocalInv { rkey: first }));
    assert!(wc.is_ok());
    assert!(bind2(&env, &p.b, &mw, &p.b.mr, 8192, 4096).is_ok());
    let second = mw.rkey();
    assert_ne!(first, second);
    let data = pattern(6, 64);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 8192, second));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.to_vec(8192, 64).unwrap(), data);
    let wc = write(&env, &p.a, 2, &data, remote(&p, 0, first));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "the old key is dead");
}

fn local_invalidate_of_an_unbound_window_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = run(
        &env,
        &p.b,
        SendWr::new(5, SendOp::LocalInv { rkey: mw.rkey() }),
    );
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::MwBindErr));
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
}

fn bind_beyond_the_mr_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let len = p.b.mr.len() as u64;
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let bind = mw.bind(&p.b.mr, p.b.mr.addr() + len - 64, 128, RW);
        let wc = run(&env, &p.b, SendWr::new(7, SendOp::BindMw { bind }));
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::MwBindErr), "{t:?}");
        restate_pair(&env, &p, &mw_params());
    }
}

fn bind_with_remote_write_on_an_mr_without_local_write_fails(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mr =
        p.b.pd
            .reg_mr_blocking(
                &p.b.buf,
                0..4096,
                AccessFlags::MW_BIND | AccessFlags::REMOTE_READ,
            )
            .unwrap();
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let bind = mw.bind(&mr, mr.addr(), 4096, AccessFlags::REMOTE_WRITE);
    let wc = run(&env, &p.b, SendWr::new(8, SendOp::BindMw { bind }));
    assert_eq!(
        (wc.wr_id, wc.status),
        (8, WcStatus::MwBindErr),
        "remote write through a window needs LOCAL_WRITE on its MR (IBA 10.6.7.2.1)"
    );
    restate_pair(&env, &p, &mw_params());
    let mw1 = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let wc = run(
        &env,
        &p.b,
        SendWr::new(
            9,
            SendOp::BindMw {
                bind: mw1.bind(&mr, mr.addr(), 4096, AccessFlags::REMOTE_READ),
            },
        ),
    );
    assert_eq!(wc.status, WcStatus::Success, "read-only windows are fine");
}

fn bind_posted_to_a_qp_in_err_is_flushed(backend: Backend) {
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
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind2(&env, &p.b, &mw, &p.b.mr, 0, 4096);
    assert_eq!((wc.wr_id, wc.status), (901, WcStatus::WrFlushErr));
    restate_pair(&env, &p, &mw_params());
    let wc = write(&env, &p.a, 1, &[1; 8], remote(&p, 0, mw.rkey()));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "a flushed bind binds nothing"
    );
}

cases!(
    manual;
    type2_bind_with_zero_length_fails_with_mw_bind_err,
    type2_local_invalidate_on_another_qp_fails_with_mw_bind_err,
    bind_mw_refuses_a_type2_window,
    bind_and_local_invalidate_requests_with_a_payload_are_refused_at_post,
    send_with_invalidate_of_a_window_of_another_qp_is_acked_and_fails_the_receive,
    send_with_invalidate_of_a_key_that_is_no_window_is_acked_and_fails_the_receive,
    type2_window_can_be_rebound_after_local_invalidate,
    local_invalidate_of_an_unbound_window_fails_with_mw_bind_err,
    bind_beyond_the_mr_fails_with_mw_bind_err,
    bind_with_remote_write_on_an_mr_without_local_write_fails,
    bind_posted_to_a_qp_in_err_is_flushed,
);

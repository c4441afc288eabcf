//! Memory windows (pyverbs `test_mr` window cases, rdma-unit-test `mw_test`): type 1 and type 2
//! binds, invalidation by zero-length rebind, LOCAL_INV, SEND_WITH_INV and dealloc, rights of
//! the window and of the MR, and deregistering an MR with a bound window (IBA 10.6.7.2.6).

use portverbs::hal::QuirkId;
use portverbs::prelude::*;
use portverbs::verbs::{MrError, MwError};

use super::env::{Backend, Env};
use super::mw_util::*;
use super::obj_util::*;
use super::util::*;

fn alloc_mw_of_type_1_and_type_2(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let mw1 = pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let mw2 = pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert_eq!(mw1.mw_type(), MwType::Type1);
    assert_eq!(mw2.mw_type(), MwType::Type2);
    assert_ne!(mw1.rkey(), 0);
    assert_ne!(mw1.rkey(), mw2.rkey());
    assert_eq!(mw1.pd().pdn(), pd.pdn());
    assert_eq!(env.a().object_counts().mws, 2);
    assert_eq!(env.devs[0].resources().mws, 2);
    drop((mw1, mw2));
    assert_eq!(env.devs[0].resources().mws, 0);
}

fn alloc_mw_of_type_3_fails(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    for t in [0, 3, 255] {
        match pd.alloc_mw_raw_blocking(t) {
            Err(MwError::Unsupported { mw_type }) => assert_eq!(mw_type, t),
            other => panic!("type {t}: expected Unsupported, got {other:?}"),
        }
    }
    assert_eq!(env.devs[0].resources().mws, 0);
}

fn type1_bind_then_remote_write_lands_in_the_window(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey = bind_type1(&env, &p, &mw, 4096, 1024, RW);
    assert_ne!(Some(rkey), p.b.mr.rkey(), "the window has its own key");
    let data = pattern(5, 512);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 4096 + 256, rkey));
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(p.b.buf.to_vec(4096 + 256, 512).unwrap(), data);
}

fn type1_remote_write_beyond_the_window_fails(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey = bind_type1(&env, &p, &mw, 4096, 1024, RW);
    // Inside the MR, but past the window's end.
    let wc = write(
        &env,
        &p.a,
        1,
        &pattern(1, 64),
        remote(&p, 4096 + 1000, rkey),
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(4096 + 1000, 64).unwrap(), vec![0; 64]);
}

fn type1_rebind_with_zero_length_invalidates_the_window(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey = bind_type1(&env, &p, &mw, 0, 4096, RW);
    assert_eq!(
        write(&env, &p.a, 1, &[1; 8], remote(&p, 0, rkey)).status,
        WcStatus::Success
    );
    let unbound = bind_type1(&env, &p, &mw, 0, 0, RW);
    for key in [rkey, unbound] {
        let wc = write(&env, &p.a, 2, &[2; 8], remote(&p, 0, key));
        assert_eq!(wc.status, WcStatus::RemAccessErr, "key {key:#x}");
        restate_pair(&env, &p, &mw_params());
    }
    assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), vec![1; 8]);
}

fn type1_rebinds_give_distinct_rkeys_and_only_the_newest_works(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let first = mw.rkey();
    let k1 = bind_type1(&env, &p, &mw, 0, 4096, RW);
    let k2 = bind_type1(&env, &p, &mw, 0, 4096, RW);
    let k3 = bind_type1(&env, &p, &mw, 8192, 4096, RW);
    let keys = [first, k1, k2, k3];
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b, "rkeys {keys:x?}");
        }
    }
    let data = pattern(9, 64);
    assert_eq!(
        write(&env, &p.a, 1, &data, remote(&p, 8192, k3)).status,
        WcStatus::Success
    );
    assert_eq!(p.b.buf.to_vec(8192, 64).unwrap(), data);
    let wc = write(&env, &p.a, 2, &data, remote(&p, 0, k2));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "a superseded key no longer works"
    );
}

fn type2_bind_by_work_request_then_remote_write_works(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 8192, RW);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (901, WcStatus::Success, WcOpcode::BindMw)
    );
    let data = pattern(6, 1000);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 100, mw.rkey()));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.to_vec(100, 1000).unwrap(), data);
}

fn type2_local_invalidate_makes_remote_write_fail(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW).is_ok());
    let rkey = mw.rkey();
    let wc = run(&env, &p.b, SendWr::new(5, SendOp::LocalInv { rkey }));
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (5, WcStatus::Success, WcOpcode::LocalInv)
    );
    let wc = write(&env, &p.a, 1, &[7; 16], remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), vec![0; 16]);
}

fn type2_send_with_invalidate_makes_remote_write_fail(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW).is_ok());
    let rkey = mw.rkey();
    p.b.post_recv(3, 8192, 4096);
    p.a.buf.write(0, &pattern(1, 32)).unwrap();
    let sge = [p.a.sge(0, 32)];
    let wc = run(
        &env,
        &p.a,
        SendWr::new(4, SendOp::SendWithInv { rkey }).sges(&sge),
    );
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
    let rwc = one(&env, &p.b.cq);
    assert_eq!(
        (rwc.wr_id, rwc.status, rwc.byte_len),
        (3, WcStatus::Success, 32)
    );
    assert_eq!(rwc.invalidated_rkey(), Some(rkey));
    assert_eq!(rwc.imm(), None);
    let wc = write(&env, &p.a, 5, &[7; 16], remote(&p, 0, rkey));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
}

fn dealloc_of_a_bound_window_makes_remote_write_fail(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let rkey = match t {
            MwType::Type1 => bind_type1(&env, &p, &mw, 0, 4096, RW),
            MwType::Type2 => {
                assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW).is_ok());
                mw.rkey()
            }
        };
        drop(mw);
        assert_eq!(env.devs[1].resources().mws, 0);
        let wc = write(&env, &p.a, 1, &[7; 16], remote(&p, 0, rkey));
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{t:?}");
        restate_pair(&env, &p, &mw_params());
    }
    assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), vec![0; 16]);
}

fn window_without_remote_write_rejects_remote_write(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::Success);
    let wc = write(&env, &p.a, 1, &[7; 16], remote(&p, 0, mw.rkey()));
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), vec![0; 16]);
}

fn bind_on_an_mr_without_mw_bind_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = p.b.pd.reg_mr_blocking(&p.b.buf, 0..4096, access).unwrap();
    // Type 1 through bind_mw, unsignaled: a failed bind completes anyway (errors always do).
    let mw1 = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    p.b.qp
        .bind_mw(&mw1, &mr, mr.addr(), 4096, RW, 77, false)
        .unwrap();
    let wc = one(&env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::MwBindErr));
    restate_pair(&env, &p, &mw_params());
    let mw2 = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(&env, &p.b, &mw2, &mr, 0, 4096, RW);
    assert_eq!((wc.wr_id, wc.status), (901, WcStatus::MwBindErr));
}

fn bind_of_a_window_of_another_pd_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let mw = other_pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW);
    assert_eq!(
        wc.status,
        WcStatus::MwBindErr,
        "the window's PD differs from the QP's"
    );
}

fn type2_rebind_without_invalidation_fails_with_mw_bind_err(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW).is_ok());
    let bound = mw.rkey();
    let wc = bind_wr(&env, &p.b, &mw, &p.b.mr, 4096, 4096, RW);
    assert_eq!(
        wc.status,
        WcStatus::MwBindErr,
        "a bound type-2 window is not free"
    );
    // The bind error moved the QP to ERR; taking it through RESET ends the windows bound to
    // it (README, "Deviations"), so the old key is dead and the window is free again.
    restate_pair(&env, &p, &mw_params());
    let data = pattern(3, 32);
    let wc = write(&env, &p.a, 1, &data, remote(&p, 0, bound));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "RESET ended the binding");
    restate_pair(&env, &p, &mw_params());
    assert!(bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW).is_ok());
    let wc = write(&env, &p.a, 2, &data, remote(&p, 0, mw.rkey()));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.to_vec(0, 32).unwrap(), data);
}

fn windows_through_another_qp_of_the_same_pd_type1_works_type2_fails(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let (_qp2, a2) = second_qp(&env, &p); // the QP stays connected while a2 writes

    let mw1 = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let k1 = bind_type1(&env, &p, &mw1, 0, 4096, RW);
    let data = pattern(4, 64);
    let wc = write(&env, &a2, 1, &data, remote(&p, 0, k1));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "type 1 windows belong to the PD"
    );
    assert_eq!(p.b.buf.to_vec(0, 64).unwrap(), data);

    let mw2 = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    assert!(bind_wr(&env, &p.b, &mw2, &p.b.mr, 4096, 4096, RW).is_ok());
    let wc = write(&env, &a2, 2, &data, remote(&p, 4096, mw2.rkey()));
    assert_eq!(
        wc.status,
        WcStatus::RemAccessErr,
        "type 2 windows belong to their QP"
    );
    assert_eq!(p.b.buf.to_vec(4096, 64).unwrap(), vec![0; 64]);
    let wc = write(&env, &p.a, 3, &data, remote(&p, 4096, mw2.rkey()));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "through the QP it is bound to"
    );
}

fn dereg_mr_with_a_bound_window_is_refused_and_the_window_keeps_working(backend: Backend) {
    let env = Env::new(backend);
    let quirks = env.b().device().info().quirks;
    assert!(
        quirks
            .iter()
            .any(|q| q.id == QuirkId::DeregMrWithBoundMwRefused),
        "the soft device declares which IBA 10.6.7.2.6 behaviour it has"
    );
    let p = mw_pair(&env);
    let mr =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..1 << 16, FULL_ACCESS)
            .unwrap();
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let addr = mr.addr() + 2048;
    let rkey = p.b.qp.bind_mw(&mw, &mr, addr, 512, RW, 900, true).unwrap();
    assert!(one(&env, &p.b.cq).is_ok());
    let mr = match mr.dereg().map_err(|r| r.into_parts()) {
        Err((MrError::Busy { .. }, mr)) => mr,
        Err((e, _)) => panic!("expected Busy, got {e:?}"),
        Ok(()) => panic!("deregistered an MR with a bound window"),
    };
    let data = pattern(8, 512);
    let wc = write(&env, &p.a, 1, &data, RemoteAddr { addr, rkey });
    assert_eq!(wc.status, WcStatus::Success, "the window still works");
    assert_eq!(p.b.buf.to_vec(2048, 512).unwrap(), data);
    drop(mw);
    mr.dereg().unwrap();
}

cases!(
    manual;
    alloc_mw_of_type_1_and_type_2,
    alloc_mw_of_type_3_fails,
    type1_bind_then_remote_write_lands_in_the_window,
    type1_remote_write_beyond_the_window_fails,
    type1_rebind_with_zero_length_invalidates_the_window,
    type1_rebinds_give_distinct_rkeys_and_only_the_newest_works,
    type2_bind_by_work_request_then_remote_write_works,
    type2_local_invalidate_makes_remote_write_fail,
    type2_send_with_invalidate_makes_remote_write_fail,
    dealloc_of_a_bound_window_makes_remote_write_fail,
    window_without_remote_write_rejects_remote_write,
    bind_on_an_mr_without_mw_bind_fails_with_mw_bind_err,
    bind_of_a_window_of_another_pd_fails_with_mw_bind_err,
    type2_rebind_without_invalidation_fails_with_mw_bind_err,
    windows_through_another_qp_of_the_same_pd_type1_works_type2_fails,
    dereg_mr_with_a_bound_window_is_refused_and_the_window_keeps_working,
);

//! Protection domains (pyverbs `test_pd`, rdma-unit-test `pd_test`): allocation, the EBUSY rule
//! while objects use a PD, objects of one device used with another, and protection-domain
//! checks on the data path.

use portverbs::prelude::*;
use portverbs::verbs::{CqError, CreateQpError, MrError, PdError, Rereg};

use super::env::{Backend, Env};
use super::obj_util::*;
use super::util::*;

fn qp_init<'a>(cq: &'a Cq) -> QpInit<'a, AnyDevice> {
    QpInit {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        caps: CAPS,
        sq_sig_all: false,
        special: None,
    }
}

/// Deallocation must fail with Busy, hand the PD back, and leave it usable.
fn expect_busy(pd: Pd) -> Pd {
    let pdn = pd.pdn();
    match pd.dealloc().map_err(|r| r.into_parts()) {
        Err((PdError::Busy { pdn: n, users }, pd)) => {
            assert_eq!(n, pdn);
            assert!(users >= 1);
            assert_eq!(pd.pdn(), pdn, "the same PD is handed back");
            pd
        }
        Err((e, _)) => panic!("expected Busy, got {e:?}"),
        Ok(()) => panic!("dealloc of a PD in use succeeded"),
    }
}

fn alloc_pd_and_dealloc_pd(backend: Backend) {
    let env = Env::new(backend);
    let pd1 = env.a().alloc_pd_blocking().unwrap();
    let pd2 = env.a().alloc_pd_blocking().unwrap();
    assert_ne!(pd1.pdn(), pd2.pdn());
    assert_eq!(env.a().object_counts().pds, 2);
    assert_eq!(env.devs[0].resources().pds, 2);
    pd1.dealloc().unwrap();
    pd2.dealloc().unwrap();
    assert_eq!(env.a().object_counts().pds, 0);
    assert_eq!(env.devs[0].resources().pds, 0);
}

fn pd_alloc_dealloc_200_cycles(backend: Backend) {
    let env = Env::new(backend);
    for i in 0..200 {
        let pd = env.a().alloc_pd_blocking().unwrap();
        assert_eq!(env.a().object_counts().pds, 1, "cycle {i}");
        pd.dealloc().unwrap();
    }
    assert_eq!(env.devs[0].resources().pds, 0);
}

fn dealloc_pd_with_another_handle_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let other = pd.clone();
    let pd = expect_busy(pd);
    drop(other);
    pd.dealloc().unwrap();
}

fn dealloc_pd_with_live_mr_is_busy_and_the_pd_stays_usable(backend: Backend) {
    let env = Env::new(backend);
    let buf = env.a().alloc_buffer(4096).unwrap();
    let pd = env.a().alloc_pd_blocking().unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let pd = expect_busy(pd);
    // Handed back and usable: another registration works in it.
    let mr2 = pd
        .reg_mr_blocking(&buf, 0..64, AccessFlags::empty())
        .unwrap();
    assert_eq!(mr2.pd().pdn(), pd.pdn());
    drop(mr2);
    let pd = expect_busy(pd);
    drop(mr);
    pd.dealloc().unwrap();
    assert_eq!(env.devs[0].resources().pds, 0);
}

fn dealloc_pd_with_live_qp_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let qp = pd.create_qp_blocking(qp_init(&cq)).unwrap();
    let pd = expect_busy(pd);
    drop(qp);
    pd.dealloc().unwrap();
}

fn dealloc_pd_with_live_mw_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let mw = pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let pd = expect_busy(pd);
    drop(mw);
    pd.dealloc().unwrap();
}

fn dealloc_pd_with_live_ah_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let ah = pd
        .create_ah_blocking(AddressVector {
            dgid: Env::gid(env.b()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    let pd = expect_busy(pd);
    drop(ah);
    pd.dealloc().unwrap();
}

fn dealloc_pd_is_not_blocked_by_a_cq(backend: Backend) {
    // CQs belong to the device, not to a PD.
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let pd = env.a().alloc_pd_blocking().unwrap();
    pd.dealloc().unwrap();
    assert_eq!(env.a().object_counts().cqs, 1);
    cq.destroy().unwrap();
}

fn buffer_of_another_device_cannot_be_registered(backend: Backend) {
    let env = Env::new(backend);
    let buf_a = env.a().alloc_buffer(4096).unwrap();
    let pd_b = env.b().alloc_pd_blocking().unwrap();
    match pd_b.reg_mr_blocking(&buf_a, 0..4096, AccessFlags::LOCAL_WRITE) {
        Err(MrError::ForeignObject { what }) => assert_eq!(what, "buffer"),
        other => panic!("expected ForeignObject, got {other:?}"),
    }
    assert_eq!(env.b().object_counts().mrs, 0);
    assert_eq!(env.devs[1].resources().mrs, 0);
}

fn cq_of_another_device_cannot_serve_a_qp(backend: Backend) {
    let env = Env::new(backend);
    let cq_a = cq(env.a(), 16);
    let cq_b = cq(env.b(), 16);
    let pd_b = env.b().alloc_pd_blocking().unwrap();
    for (send_cq, recv_cq, expect) in [(&cq_a, &cq_b, "send CQ"), (&cq_b, &cq_a, "receive CQ")] {
        let r = pd_b.create_qp_blocking(QpInit {
            send_cq,
            recv_cq,
            ..qp_init(&cq_b)
        });
        match r {
            Err(CreateQpError::ForeignObject { what }) => assert_eq!(what, expect),
            other => panic!("expected ForeignObject({expect}), got {other:?}"),
        }
    }
    assert_eq!(env.b().object_counts().qps, 0);
    assert_eq!(env.devs[1].resources().qps, 0);
}

fn completion_channel_of_another_device_cannot_serve_a_cq(backend: Backend) {
    let env = Env::new(backend);
    let ch = env.a().create_comp_channel().unwrap();
    let r = env.b().create_cq_blocking(CqInit {
        entries: 16,
        comp_vector: 0,
        channel: Some(&ch),
    });
    assert!(matches!(r, Err(CqError::ForeignChannel)), "{r:?}");
    assert_eq!(env.b().object_counts().cqs, 0);
}

fn rereg_mr_to_a_pd_of_another_device_fails(backend: Backend) {
    let env = Env::new(backend);
    let buf = env.a().alloc_buffer(4096).unwrap();
    let pd_a = env.a().alloc_pd_blocking().unwrap();
    let pd_b = env.b().alloc_pd_blocking().unwrap();
    let mr = pd_a
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let r = mr.rereg_blocking(Rereg {
        pd: Some(&pd_b),
        ..Rereg::default()
    });
    match r {
        Err(MrError::ForeignObject { what }) => assert_eq!(what, "PD"),
        other => panic!("expected ForeignObject, got {other:?}"),
    }
    assert_eq!(mr.pd().pdn(), pd_a.pdn(), "the MR stays in its PD");
}

fn mr_of_another_pd_in_a_wqe_completes_with_local_protection_error(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let other_pd = env.a().alloc_pd_blocking().unwrap();
    let other_mr = other_pd
        .reg_mr_blocking(&p.a.buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_ne!(other_pd.pdn(), p.a.qp.pd().pdn());
    p.b.post_recv(1, 0, 4096);
    let sge = [other_mr.sge_at(0, 64)];
    let wc = run(&env, &p.a, SendWr::new(42, SendOp::Send).sges(&sge));
    assert_eq!(wc.wr_id, 42);
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_eq!(wc.qp_num, p.a.qp.qp_num());
    assert_eq!(p.a.qp.query_blocking().unwrap().qp_state, QpState::Err);
    assert!(
        env.try_poll(&p.b.cq).unwrap().is_empty(),
        "nothing reached the receiver"
    );
}

cases!(
    manual;
    alloc_pd_and_dealloc_pd,
    pd_alloc_dealloc_200_cycles,
    dealloc_pd_with_another_handle_is_busy,
    dealloc_pd_with_live_mr_is_busy_and_the_pd_stays_usable,
    dealloc_pd_with_live_qp_is_busy,
    dealloc_pd_with_live_mw_is_busy,
    dealloc_pd_with_live_ah_is_busy,
    dealloc_pd_is_not_blocked_by_a_cq,
    buffer_of_another_device_cannot_be_registered,
    cq_of_another_device_cannot_serve_a_qp,
    completion_channel_of_another_device_cannot_serve_a_cq,
    rereg_mr_to_a_pd_of_another_device_fails,
    mr_of_another_pd_in_a_wqe_completes_with_local_protection_error,
);

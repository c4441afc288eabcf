//! QP odds and ends: query after traffic, modify without a state change, objects of another
//! device, the PD a QP keeps busy, posting after RESET.

use portverbs::prelude::*;
use portverbs::verbs::{CreateQpError, ModifyQpError, PostErrorKind};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn query_after_traffic_returns_the_attributes_set(backend: Backend) {
    let env = Env::new(backend);
    let params = Params {
        timeout: 17,
        retry_cnt: 5,
        rnr_retry: 6,
        min_rnr_timer: 9,
        rd_atomic: 3,
        mtu: Mtu::Mtu2048,
        ..Params::default()
    };
    let p = Pair::with(&env, QpType::Rc, &params, FULL_ACCESS);
    p.b.post_recv(1, 0, 64);
    p.a.qp
        .post_send(&[SendWr::new(2, SendOp::Send)
            .sges(&[p.a.sge(0, 64)])
            .signaled()])
        .unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        2,
        WcStatus::Success,
        WcOpcode::Send,
    );
    check_wc(
        &poll_one(&env, &p.b.cq),
        1,
        WcStatus::Success,
        WcOpcode::Recv,
    );
    let q = p.a.qp.query_blocking().unwrap();
    assert_eq!(q.qp_state, QpState::Rts);
    assert_eq!(q.dest_qp_num, p.b.qp.qp_num());
    assert_eq!(q.path_mtu, Mtu::Mtu2048);
    assert_eq!(q.timeout, 17);
    assert_eq!(q.retry_cnt, 5);
    assert_eq!(q.rnr_retry, 6);
    assert_eq!(q.min_rnr_timer, 9);
    assert_eq!(q.max_rd_atomic, 3);
    assert_eq!(q.max_dest_rd_atomic, 3);
    assert_eq!(q.qp_access_flags, params.access);
    assert_eq!(q.port_num, 1);
    assert_eq!(q.ah_attr.dgid, Env::gid(env.b()));
    assert!(q.ah_attr.is_global);
    assert_eq!(q.cap, p.a.qp.caps());
}

fn dealloc_pd_with_live_qp_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let ctx = env.a();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq(ctx, 256);
    let qp = make_qp(&pd, &cq, QpType::Rc, None, false);
    let pdn = pd.pdn();
    let pd = match pd.dealloc().map_err(|r| r.into_parts()) {
        Err((portverbs::verbs::PdError::Busy { pdn: n, users }, pd)) => {
            assert_eq!(n, pdn);
            assert!(users >= 1);
            pd
        }
        other => panic!("expected Busy, got {:?}", other),
    };
    drop(qp);
    pd.dealloc().expect("free once the QP is gone");
}

fn modify_without_state_changes_attributes_in_place(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let attr = QpAttr {
        min_rnr_timer: 20,
        ..QpAttr::default()
    };
    p.a.qp
        .modify_blocking(&attr, QpAttrMask::MIN_RNR_TIMER)
        .unwrap();
    let q = p.a.qp.query_blocking().unwrap();
    assert_eq!((q.qp_state, q.min_rnr_timer), (QpState::Rts, 20));
    // Still usable.
    let wr = write_wr(1, &p.b, 0);
    p.a.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    // RTS → RTS does not allow PATH_MTU; the error names RTS → RTS (no STATE in the mask).
    match p.a.qp.modify_blocking(&attr, QpAttrMask::PATH_MTU) {
        Err(ModifyQpError::UnexpectedAttributes {
            from,
            to,
            unexpected,
            ..
        }) => {
            assert_eq!(unexpected, QpAttrMask::PATH_MTU);
            assert_eq!((from, to), (QpState::Rts, QpState::Rts));
        }
        other => panic!("expected UnexpectedAttributes, got {other:?}"),
    }
}

fn create_qp_with_objects_of_another_device_is_refused(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let other_cq = cq(env.b(), 256);
    let cq = cq(env.a(), 256);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let other_srq = other_pd
        .create_srq_blocking(SrqInit {
            max_wr: 4,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let cases: [(&Cq, &Cq, Option<&Srq>, &str); 3] = [
        (&other_cq, &cq, None, "send CQ"),
        (&cq, &other_cq, None, "receive CQ"),
        (&cq, &cq, Some(&other_srq), "SRQ"),
    ];
    for (send_cq, recv_cq, srq, name) in cases {
        let r = pd.create_qp_blocking(QpInit {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            srq,
            caps: CAPS,
            sq_sig_all: false,
            special: None,
        });
        match r {
            Err(CreateQpError::ForeignObject { what }) => assert_eq!(what, name),
            other => panic!("{name}: expected ForeignObject, got {other:?}"),
        }
    }
    assert_eq!(env.a().object_counts().qps, 0);
}

fn posting_after_reset_is_invalid_state(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.a.qp
        .modify_blocking(
            &QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let reset = PostErrorKind::InvalidState {
        state: QpState::Reset,
    };
    let sge = [p.a.sge(0, 8)];
    let e =
        p.a.qp
            .post_recv(&[RecvWr {
                wr_id: 1,
                sges: &sge,
            }])
            .unwrap_err();
    assert_eq!((e.index, e.kind), (0, reset.clone()));
    let e = p.a.qp.post_send(&[write_wr(2, &p.b, 0)]).unwrap_err();
    assert_eq!((e.index, e.kind), (0, reset));
    assert_eq!(env.poll(&p.a.cq, 0), []);
}

cases!(
    manual;
    query_after_traffic_returns_the_attributes_set,
    dealloc_pd_with_live_qp_is_busy,
    modify_without_state_changes_attributes_in_place,
    create_qp_with_objects_of_another_device_is_refused,
    posting_after_reset_is_invalid_state,
);

//! QP creation and the modify state machine: capacities, the pyverbs mask paths, invalid
//! transitions, missing/unexpected attributes, out-of-range values, query.

use portverbs::prelude::*;
use portverbs::verbs::{CreateQpError, ModifyQpError};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn lone(env: &Env, t: QpType) -> Side {
    Side::new(env.a(), t, CAPS, 4096, FULL_ACCESS)
}

fn create_qp_starts_in_reset_with_requested_caps(backend: Backend) {
    let env = Env::new(backend);
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let s = lone(&env, t);
        assert_eq!(s.qp.qp_type(), t);
        assert_eq!(s.qp.state(), QpState::Reset);
        let a = s.qp.query_blocking().unwrap();
        assert_eq!(a.qp_state, QpState::Reset, "{t:?}");
        assert!(a.cap.max_send_wr >= CAPS.max_send_wr, "{t:?} {:?}", a.cap);
        assert!(a.cap.max_recv_wr >= CAPS.max_recv_wr, "{t:?} {:?}", a.cap);
        assert!(a.cap.max_send_sge >= CAPS.max_send_sge, "{t:?} {:?}", a.cap);
        assert!(a.cap.max_recv_sge >= CAPS.max_recv_sge, "{t:?} {:?}", a.cap);
        assert!(
            a.cap.max_inline_data >= CAPS.max_inline_data,
            "{t:?} {:?}",
            a.cap
        );
        assert_eq!(a.cap, s.qp.caps());
    }
}

fn create_qp_beyond_device_limits_is_refused(backend: Backend) {
    let env = Env::new(backend);
    let ctx = env.a();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq(ctx, 256);
    let lim = ctx.attr().clone();
    let cases: [(&str, QpCaps, u32, u32); 5] = [
        (
            "max_send_wr",
            QpCaps {
                max_send_wr: u32::MAX,
                ..CAPS
            },
            u32::MAX,
            lim.max_qp_wr,
        ),
        (
            "max_recv_wr",
            QpCaps {
                max_recv_wr: u32::MAX,
                ..CAPS
            },
            u32::MAX,
            lim.max_qp_wr,
        ),
        (
            "max_send_sge",
            QpCaps {
                max_send_sge: lim.max_sge + 1,
                ..CAPS
            },
            lim.max_sge + 1,
            lim.max_sge,
        ),
        (
            "max_recv_sge",
            QpCaps {
                max_recv_sge: u32::from(u16::MAX),
                ..CAPS
            },
            u32::from(u16::MAX),
            lim.max_sge,
        ),
        (
            "max_inline_data",
            QpCaps {
                max_inline_data: lim.max_inline_data + 1,
                ..CAPS
            },
            lim.max_inline_data + 1,
            lim.max_inline_data,
        ),
    ];
    for (name, caps, req, max) in cases {
        for t in [QpType::Rc, QpType::Ud] {
            let r = pd.create_qp_blocking(QpInit {
                qp_type: t,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps,
                sq_sig_all: false,
                special: None,
            });
            match r {
                Err(CreateQpError::CapTooLarge {
                    what,
                    requested,
                    max: m,
                }) => {
                    assert_eq!((what, requested, m), (name, req, max));
                }
                other => panic!("{name} on {t:?}: expected CapTooLarge, got {other:?}"),
            }
        }
    }
    assert_eq!(ctx.object_counts().qps, 0);
}

fn pyverbs_mask_paths_reach_rts_for_every_transport(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let a = lone(&env, t);
        let b = Side::new(env.b(), t, CAPS, 4096, FULL_ACCESS);
        let mut pa = p;
        if t == QpType::Uc {
            pa.access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        }
        to_init(&a.qp, &pa);
        assert_eq!(a.qp.state(), QpState::Init);
        assert_eq!(queried_state(&a.qp), QpState::Init, "{t:?}");
        to_rtr(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &pa);
        assert_eq!(queried_state(&a.qp), QpState::Rtr, "{t:?}");
        rtr_to_rts(&a.qp, &pa);
        assert_eq!(queried_state(&a.qp), QpState::Rts, "{t:?}");
        let q = a.qp.query_blocking().unwrap();
        assert_eq!(q.port_num, 1);
        assert_eq!(q.pkey_index, 0);
        if t == QpType::Ud {
            assert_eq!(q.qkey, QKEY);
        } else {
            assert_eq!(q.dest_qp_num, b.qp.qp_num());
        }
        if t == QpType::Rc {
            // test_qp: granted max_rd_atomic / max_dest_rd_atomic ≥ requested.
            assert!(q.max_rd_atomic >= p.rd_atomic);
            assert!(q.max_dest_rd_atomic >= p.rd_atomic);
        }
        // Back to RESET and up again (test_qp's UD modify path).
        a.qp.modify_blocking(
            &QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
        assert_eq!(queried_state(&a.qp), QpState::Reset);
        to_init(&a.qp, &pa);
        assert_eq!(queried_state(&a.qp), QpState::Init);
    }
}

fn to_state(qp: &Qp, s: QpState) -> Result<(), ModifyQpError> {
    qp.modify_blocking(
        &QpAttr {
            qp_state: s,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
}

fn assert_invalid_transition(r: Result<(), ModifyQpError>, qpn: u32, from: QpState, to: QpState) {
    match r {
        Err(ModifyQpError::InvalidTransition {
            qpn: n,
            from: f,
            to: t,
            ..
        }) => assert_eq!((n, f, t), (qpn, from, to)),
        other => panic!("{from} => {to}: expected InvalidTransition, got {other:?}"),
    }
}

fn invalid_transitions_are_refused(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    let s = lone(&env, QpType::Rc);
    let qpn = s.qp.qp_num();
    let gid = Env::gid(env.b());
    // RESET → RTR with the full RTR mask.
    let r =
        s.qp.modify_blocking(&rtr_attr(5, gid, &p), rtr_mask(QpType::Rc));
    assert_invalid_transition(r, qpn, QpState::Reset, QpState::Rtr);
    // RESET → RTS.
    let r = s.qp.modify_blocking(&rts_attr(&p), rts_mask(QpType::Rc));
    assert_invalid_transition(r, qpn, QpState::Reset, QpState::Rts);
    assert_eq!(queried_state(&s.qp), QpState::Reset);
    to_init(&s.qp, &p);
    // INIT → RTS.
    let r = s.qp.modify_blocking(&rts_attr(&p), rts_mask(QpType::Rc));
    assert_invalid_transition(r, qpn, QpState::Init, QpState::Rts);
    assert_eq!(queried_state(&s.qp), QpState::Init);
    to_rtr(&s.qp, 5, gid, &p);
    // RTR → INIT.
    let r = s.qp.modify_blocking(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: p.access,
            ..QpAttr::default()
        },
        init_mask(QpType::Rc),
    );
    assert_invalid_transition(r, qpn, QpState::Rtr, QpState::Init);
    assert_eq!(queried_state(&s.qp), QpState::Rtr);
    // ERR → RTS.
    to_state(&s.qp, QpState::Err).unwrap();
    let r = s.qp.modify_blocking(&rts_attr(&p), rts_mask(QpType::Rc));
    assert_invalid_transition(r, qpn, QpState::Err, QpState::Rts);
    assert_eq!(queried_state(&s.qp), QpState::Err);
}

fn missing_required_attributes_are_named(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    let s = lone(&env, QpType::Rc);
    let qpn = s.qp.qp_num();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    match s
        .qp
        .modify_blocking(&init, init_mask(QpType::Rc) - QpAttrMask::ACCESS_FLAGS)
    {
        Err(ModifyQpError::MissingAttributes {
            qpn: n,
            from,
            to,
            missing,
        }) => {
            assert_eq!((n, from, to), (qpn, QpState::Reset, QpState::Init));
            assert_eq!(missing, QpAttrMask::ACCESS_FLAGS);
        }
        other => panic!("expected MissingAttributes, got {other:?}"),
    }
    to_init(&s.qp, &p);
    let rtr = rtr_attr(5, Env::gid(env.b()), &p);
    let mask = rtr_mask(QpType::Rc) - QpAttrMask::MAX_DEST_RD_ATOMIC;
    match s.qp.modify_blocking(&rtr, mask) {
        Err(ModifyQpError::MissingAttributes { missing, from, .. }) => {
            assert_eq!(from, QpState::Init);
            assert_eq!(missing, QpAttrMask::MAX_DEST_RD_ATOMIC);
        }
        other => panic!("expected MissingAttributes, got {other:?}"),
    }
    let mask = rtr_mask(QpType::Rc) - QpAttrMask::AV - QpAttrMask::MIN_RNR_TIMER;
    match s.qp.modify_blocking(&rtr, mask) {
        Err(ModifyQpError::MissingAttributes { missing, .. }) => {
            assert_eq!(missing, QpAttrMask::AV | QpAttrMask::MIN_RNR_TIMER);
        }
        other => panic!("expected MissingAttributes, got {other:?}"),
    }
    to_rtr(&s.qp, 5, Env::gid(env.b()), &p);
    match s
        .qp
        .modify_blocking(&rts_attr(&p), QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    {
        Err(ModifyQpError::MissingAttributes {
            missing, from, to, ..
        }) => {
            assert_eq!((from, to), (QpState::Rtr, QpState::Rts));
            assert_eq!(
                missing,
                QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC
            );
        }
        other => panic!("expected MissingAttributes, got {other:?}"),
    }
    assert_eq!(queried_state(&s.qp), QpState::Rtr);
}

fn unexpected_attributes_are_named(backend: Backend) {
    let env = Env::new(backend);
    let s = lone(&env, QpType::Ud);
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: QKEY,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    match s
        .qp
        .modify_blocking(&attr, init_mask(QpType::Ud) | QpAttrMask::ACCESS_FLAGS)
    {
        Err(ModifyQpError::UnexpectedAttributes {
            qpn,
            from,
            to,
            unexpected,
        }) => {
            assert_eq!(qpn, s.qp.qp_num());
            assert_eq!((from, to), (QpState::Reset, QpState::Init));
            assert_eq!(unexpected, QpAttrMask::ACCESS_FLAGS);
        }
        other => panic!("expected UnexpectedAttributes, got {other:?}"),
    }
    assert_eq!(queried_state(&s.qp), QpState::Reset);
    // RC RESET → INIT with a QKEY.
    let rc = lone(&env, QpType::Rc);
    match rc
        .qp
        .modify_blocking(&attr, init_mask(QpType::Rc) | QpAttrMask::QKEY)
    {
        Err(ModifyQpError::UnexpectedAttributes { unexpected, .. }) => {
            assert_eq!(unexpected, QpAttrMask::QKEY);
        }
        other => panic!("expected UnexpectedAttributes, got {other:?}"),
    }
}

fn assert_invalid_attribute(
    r: Result<(), ModifyQpError>,
    qpn: u32,
    what: &str,
    attribute: QpAttrMask,
) {
    match r {
        Err(ModifyQpError::InvalidAttribute { qpn: n, error }) => {
            assert_eq!(n, qpn, "{what}");
            assert_eq!(error.attribute(), attribute, "{what}: {error}");
        }
        other => panic!("{what}: expected InvalidAttribute, got {other:?}"),
    }
}

fn out_of_range_attribute_values_are_refused(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    let s = lone(&env, QpType::Rc);
    let qpn = s.qp.qp_num();
    let gid = Env::gid(env.b());
    for port in [0u8, 2] {
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: port,
            qp_access_flags: p.access,
            ..QpAttr::default()
        };
        let r = s.qp.modify_blocking(&attr, init_mask(QpType::Rc));
        assert_invalid_attribute(r, qpn, "port", QpAttrMask::PORT);
    }
    assert_eq!(queried_state(&s.qp), QpState::Reset);
    to_init(&s.qp, &p);
    let bad_rtr = [
        (
            "rq_psn 2^24",
            QpAttrMask::RQ_PSN,
            QpAttr {
                rq_psn: 1 << 24,
                ..rtr_attr(5, gid, &p)
            },
            rtr_mask(QpType::Rc),
        ),
        (
            "dest_qpn 2^24",
            QpAttrMask::DEST_QPN,
            QpAttr {
                dest_qp_num: 1 << 24,
                ..rtr_attr(5, gid, &p)
            },
            rtr_mask(QpType::Rc),
        ),
        (
            "RoCE AV without GRH",
            QpAttrMask::AV,
            QpAttr {
                ah_attr: AddressVector {
                    is_global: false,
                    port_num: 1,
                    dlid: 1,
                    ..AddressVector::default()
                },
                ..rtr_attr(5, gid, &p)
            },
            rtr_mask(QpType::Rc),
        ),
        (
            "AV port 2",
            QpAttrMask::AV,
            QpAttr {
                ah_attr: AddressVector {
                    port_num: 2,
                    ..rtr_attr(5, gid, &p).ah_attr
                },
                ..rtr_attr(5, gid, &p)
            },
            rtr_mask(QpType::Rc),
        ),
        (
            "ALT_PATH (QuirkId::NoAutomaticPathMigration)",
            QpAttrMask::ALT_PATH,
            rtr_attr(5, gid, &p),
            rtr_mask(QpType::Rc) | QpAttrMask::ALT_PATH,
        ),
    ];
    for (what, bad, attr, mask) in bad_rtr {
        assert_invalid_attribute(s.qp.modify_blocking(&attr, mask), qpn, what, bad);
        assert_eq!(queried_state(&s.qp), QpState::Init, "{what}");
    }
    to_rtr(&s.qp, 5, gid, &p);
    let bad_rts = [
        (
            "retry_cnt 8",
            QpAttrMask::RETRY_CNT,
            QpAttr {
                retry_cnt: 8,
                ..rts_attr(&p)
            },
        ),
        (
            "rnr_retry 8",
            QpAttrMask::RNR_RETRY,
            QpAttr {
                rnr_retry: 8,
                ..rts_attr(&p)
            },
        ),
        (
            "sq_psn 2^24",
            QpAttrMask::SQ_PSN,
            QpAttr {
                sq_psn: 1 << 24,
                ..rts_attr(&p)
            },
        ),
        (
            "max_rd_atomic above the device's",
            QpAttrMask::MAX_QP_RD_ATOMIC,
            QpAttr {
                max_rd_atomic: u8::MAX,
                ..rts_attr(&p)
            },
        ),
    ];
    for (what, bad, attr) in bad_rts {
        let r = s.qp.modify_blocking(&attr, rts_mask(QpType::Rc));
        assert_invalid_attribute(r, qpn, what, bad);
        assert_eq!(queried_state(&s.qp), QpState::Rtr, "{what}");
    }
    rtr_to_rts(&s.qp, &p);
    assert_eq!(queried_state(&s.qp), QpState::Rts);
}

fn reset_to_err_is_refused_as_linux_does(backend: Backend) {
    // Linux's transition table (ib_modify_qp_is_ok) has no RESET -> ERR: a QP that was never
    // initialised has nothing to flush.
    let env = Env::new(backend);
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let s = lone(&env, t);
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let r = s.qp.modify_blocking(&err, QpAttrMask::STATE);
        assert_invalid_transition(r, s.qp.qp_num(), QpState::Reset, QpState::Err);
        assert_eq!(queried_state(&s.qp), QpState::Reset, "{t}");
        // From INIT it is allowed, and ERR -> ERR too.
        to_init(&s.qp, &Params::default());
        s.qp.modify_blocking(&err, QpAttrMask::STATE).unwrap();
        s.qp.modify_blocking(&err, QpAttrMask::STATE).unwrap();
        assert_eq!(queried_state(&s.qp), QpState::Err);
    }
}

fn every_strict_subset_of_a_required_mask_is_refused(backend: Backend) {
    // rdma-unit-test ModifyBad*StateTransition: drop any one required attribute (every strict
    // subset misses at least one) and the modify fails, naming it, with the state unchanged.
    let env = Env::new(backend);
    let p = Params::default();
    let gid = Env::gid(env.b());
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let s = lone(&env, t);
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ..QpAttr::default()
        };
        let steps = [
            (init, init_mask(t), QpState::Reset),
            (rtr_attr(5, gid, &p), rtr_mask(t), QpState::Init),
            (rts_attr(&p), rts_mask(t), QpState::Rtr),
        ];
        for (attr, full, from) in steps {
            let required = full - QpAttrMask::STATE;
            for bit in required.iter() {
                match s.qp.modify_blocking(&attr, full - bit) {
                    Err(ModifyQpError::MissingAttributes { missing, .. }) => {
                        assert_eq!(missing, bit, "{t} {from}");
                    }
                    other => panic!("{t} {from} without {bit:?}: {other:?}"),
                }
                assert_eq!(queried_state(&s.qp), from);
            }
            s.qp.modify_blocking(&attr, full).unwrap();
        }
        // RTS -> RTR does not exist.
        let r = s.qp.modify_blocking(&rtr_attr(5, gid, &p), rtr_mask(t));
        assert_invalid_transition(r, s.qp.qp_num(), QpState::Rts, QpState::Rtr);
    }
}

fn qp_with_zero_send_wr_gets_what_the_device_grants(backend: Backend) {
    // rdma-unit-test QpTest.ZeroSendWr: max_send_wr = 0 is allowed; as ibv_create_qp(3) says,
    // the caps returned are at least those asked for, and the send queue takes exactly them.
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let c = cq(env.a(), 64);
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Ud,
            send_cq: &c,
            recv_cq: &c,
            srq: None,
            caps: QpCaps {
                max_send_wr: 0,
                ..CAPS
            },
            sq_sig_all: false,
            special: None,
        })
        .expect("max_send_wr = 0 is allowed");
    let granted = qp.caps().max_send_wr;
    assert!(granted < 64, "a small queue: {granted}");
    let p = Params::default();
    to_init(&qp, &p);
    to_rts(&qp, 0, Gid::default(), &p);
    let ah = pd
        .create_ah_blocking(AddressVector {
            dgid: Env::gid(env.b()),
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    let dest = portverbs::verbs::UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: 1,
        remote_qkey: QKEY,
    };
    let wrs: Vec<_> = (0..=u64::from(granted))
        .map(|i| SendWr::new(i, SendOp::Send).ud(dest))
        .collect();
    let e = qp.post_send(&wrs).unwrap_err();
    assert_eq!(
        e.index, granted as usize,
        "the queue takes exactly what it granted"
    );
    assert!(
        matches!(e.kind, portverbs::verbs::PostErrorKind::QueueFull { .. }),
        "{e:?}"
    );
}

cases!(
    manual;
    create_qp_starts_in_reset_with_requested_caps,
    create_qp_beyond_device_limits_is_refused,
    pyverbs_mask_paths_reach_rts_for_every_transport,
    invalid_transitions_are_refused,
    missing_required_attributes_are_named,
    unexpected_attributes_are_named,
    out_of_range_attribute_values_are_refused,
    reset_to_err_is_refused_as_linux_does,
    every_strict_subset_of_a_required_mask_is_refused,
    qp_with_zero_send_wr_gets_what_the_device_grants,
);

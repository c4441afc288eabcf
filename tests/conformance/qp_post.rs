//! Posting rules of a QP (state, queue depth, SGEs, inline, transport, destination) and what
//! the state machine does to posted work: flush in ERR, discard in RESET, SQD and back.

use portverbs::prelude::*;
use portverbs::verbs::{AsyncEventKind, EventElement, PostError, PostErrorKind, UdDest};

use portverbs::soft::LinkFaults;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn assert_post_err(r: Result<(), PostError>, index: usize, kind: PostErrorKind) {
    match r {
        Err(e) => {
            assert_eq!(e.index, index, "{e}");
            assert_eq!(e.kind, kind, "{e}");
        }
        Ok(()) => panic!("expected {kind:?} at {index}, the post succeeded"),
    }
}

fn send(wr_id: u64) -> SendWr<'static> {
    SendWr::new(wr_id, SendOp::Send).signaled()
}

fn post_send_before_rts_is_invalid_state(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    let s = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let wrs = [send(1), send(2)];
    assert_post_err(
        s.qp.post_send(&wrs),
        0,
        PostErrorKind::InvalidState {
            state: QpState::Reset,
        },
    );
    // post_recv in RESET: refused too.
    let sge = [s.sge(0, 64)];
    let recv = RecvWr {
        wr_id: 9,
        sges: &sge,
    };
    assert_post_err(
        s.qp.post_recv(&[recv]),
        0,
        PostErrorKind::InvalidState {
            state: QpState::Reset,
        },
    );
    to_init(&s.qp, &p);
    assert_post_err(
        s.qp.post_send(&wrs),
        0,
        PostErrorKind::InvalidState {
            state: QpState::Init,
        },
    );
    // Receives may be posted from INIT on.
    s.qp.post_recv(&[recv]).expect("post_recv in INIT");
    to_rtr(&s.qp, 5, Env::gid(env.b()), &p);
    assert_post_err(
        s.qp.post_send(&wrs),
        0,
        PostErrorKind::InvalidState {
            state: QpState::Rtr,
        },
    );
    assert_eq!(env.poll(&s.cq, 0).len(), 0, "nothing was executed");
}

fn send_queue_overflow_reports_the_first_rejected_request(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let depth = p.a.qp.caps().max_send_wr;
    let wrs: Vec<SendWr<'_>> = (0..=u64::from(depth))
        .map(|i| write_wr(i, &p.b, 8 * i).sges(&[]))
        .collect();
    let e = p.a.qp.post_send(&wrs).unwrap_err();
    assert_eq!(e.index, depth as usize);
    assert_eq!(e.wr_id, u64::from(depth));
    assert_eq!(e.kind, PostErrorKind::QueueFull { depth });
    let wcs = poll_exact(&env, &p.a.cq, depth as usize);
    for (i, wc) in wcs.iter().enumerate() {
        check_wc(wc, i as u64, WcStatus::Success, WcOpcode::RdmaWrite);
    }
    // The slots are free again.
    p.a.qp.post_send(&wrs[..1]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        0,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
}

fn recv_queue_overflow_reports_the_first_rejected_request(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let depth = p.b.qp.caps().max_recv_wr;
    let sges: Vec<[Sge; 1]> = (0..=depth)
        .map(|i| [p.b.sge(u64::from(i) * 16, 16)])
        .collect();
    let wrs: Vec<RecvWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr {
            wr_id: 100 + i as u64,
            sges: s,
        })
        .collect();
    let e = p.b.qp.post_recv(&wrs).unwrap_err();
    assert_eq!(e.index, depth as usize);
    assert_eq!(e.wr_id, 100 + u64::from(depth));
    assert_eq!(e.kind, PostErrorKind::QueueFull { depth });
    // The first `depth` were posted: a send consumes the first one.
    p.a.qp.post_send(&[send(1).sges(&[p.a.sge(0, 8)])]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::Send,
    );
    check_wc(
        &poll_one(&env, &p.b.cq),
        100,
        WcStatus::Success,
        WcOpcode::Recv,
    );
}

fn too_many_sges_and_too_much_inline_are_refused(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let caps = p.a.qp.caps();
    let many: Vec<Sge> = (0..=caps.max_send_sge)
        .map(|i| p.a.sge(u64::from(i) * 8, 8))
        .collect();
    let wrs = [send(1).sges(&many[..1]), send(2).sges(&many)];
    assert_post_err(
        p.a.qp.post_send(&wrs),
        1,
        PostErrorKind::TooManySges {
            given: many.len(),
            max: caps.max_send_sge,
        },
    );
    let rmany: Vec<Sge> = (0..=caps.max_recv_sge)
        .map(|i| p.b.sge(u64::from(i) * 8, 8))
        .collect();
    let recv = RecvWr {
        wr_id: 3,
        sges: &rmany,
    };
    assert_post_err(
        p.b.qp.post_recv(&[recv]),
        0,
        PostErrorKind::TooManySges {
            given: rmany.len(),
            max: caps.max_recv_sge,
        },
    );
    let big = vec![7u8; caps.max_inline_data as usize + 1];
    let remote = p.b.remote(0);
    assert_post_err(
        p.a.qp
            .post_send(&[SendWr::new(4, SendOp::RdmaWrite { remote }).inline(&big)]),
        0,
        PostErrorKind::InlineTooLarge {
            given: big.len(),
            max: caps.max_inline_data,
        },
    );
    // The request before the rejected one was posted (it finds no receive: flushed later or
    // RNR; only check that exactly one send was accepted by draining it with a receive).
    p.b.post_recv(5, 0, 64);
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 5, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 8);
}

fn operations_invalid_for_the_transport_are_refused(backend: Backend) {
    let env = Env::new(backend);
    let ud = Pair::new(&env, QpType::Ud);
    let uc = Pair::new(&env, QpType::Uc);
    let remote = RemoteAddr {
        addr: 0x1000,
        rkey: 1,
    };
    let ud_ops = [
        ("RDMA_WRITE", SendOp::RdmaWrite { remote }),
        ("RDMA_READ", SendOp::RdmaRead { remote }),
        (
            "ATOMIC_CMP_AND_SWP",
            SendOp::AtomicCmpSwp {
                remote,
                compare: 0,
                swap: 1,
            },
        ),
        (
            "ATOMIC_FETCH_AND_ADD",
            SendOp::AtomicFetchAdd { remote, add: 1 },
        ),
    ];
    for (name, op) in ud_ops {
        assert_post_err(
            ud.a.qp.post_send(&[SendWr::new(1, op).signaled()]),
            0,
            PostErrorKind::OpNotSupported {
                op: name,
                qp_type: QpType::Ud,
            },
        );
    }
    let uc_ops = [
        ("RDMA_READ", SendOp::RdmaRead { remote }),
        (
            "ATOMIC_CMP_AND_SWP",
            SendOp::AtomicCmpSwp {
                remote,
                compare: 0,
                swap: 1,
            },
        ),
        (
            "ATOMIC_FETCH_AND_ADD",
            SendOp::AtomicFetchAdd { remote, add: 1 },
        ),
    ];
    for (name, op) in uc_ops {
        assert_post_err(
            uc.a.qp
                .post_send(&[SendWr::new(1, op).sges(&[uc.a.sge(0, 8)])]),
            0,
            PostErrorKind::OpNotSupported {
                op: name,
                qp_type: QpType::Uc,
            },
        );
    }
    // A UD send without an address handle.
    let r = ud.a.qp.post_send(&[send(2).sges(&[ud.a.sge(0, 8)])]);
    match r {
        Err(e) => {
            assert_eq!(e.index, 0);
            assert!(matches!(e.kind, PostErrorKind::BadDestination(_)), "{e:?}");
        }
        Ok(()) => panic!("a UD send without an AH was accepted"),
    }
    // A connected send with a UD destination.
    let av = AddressVector {
        dgid: Env::gid(env.b()),
        is_global: true,
        port_num: 1,
        ..AddressVector::default()
    };
    let dest = UdDest {
        ah_pd: None,
        av: &av,
        remote_qpn: 5,
        remote_qkey: QKEY,
    };
    let r = uc.a.qp.post_send(&[send(3).ud(dest)]);
    match r {
        Err(e) => {
            assert_eq!(e.index, 0);
            assert!(matches!(e.kind, PostErrorKind::BadDestination(_)), "{e:?}");
        }
        Ok(()) => panic!("a UC send with a UD destination was accepted"),
    }
    assert_eq!(env.poll(&ud.a.cq, 0).len(), 0);
    assert_eq!(env.poll(&uc.a.cq, 0).len(), 0);
}

fn modify_to_err_flushes_every_posted_request_in_order(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    for i in 0..3 {
        p.a.post_recv(10 + i, i * 64, 64);
    }
    let sge = [p.a.sge(0, 8)];
    let wrs = [
        send(1).sges(&sge),
        SendWr::new(2, SendOp::Send).sges(&sge),
        SendWr::new(3, SendOp::Send).sges(&sge),
        send(4).sges(&sge),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.a.qp
        .modify_blocking(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let wcs = poll_exact(&env, &p.a.cq, 7);
    let sends: Vec<_> = wcs.iter().filter(|w| w.wr_id < 10).collect();
    let recvs: Vec<_> = wcs.iter().filter(|w| w.wr_id >= 10).collect();
    assert_eq!(
        sends.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "flushed sends, unsignaled included, in order"
    );
    assert_eq!(
        recvs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [10, 11, 12]
    );
    for w in &wcs {
        assert_eq!(w.status, WcStatus::WrFlushErr, "{w:?}");
        assert_eq!(w.qp_num, p.a.qp.qp_num());
    }
    // Posting in ERR completes at once with WR_FLUSH_ERR, on both queues.
    p.a.qp.post_send(&[send(5)]).unwrap();
    p.a.post_recv(13, 0, 64);
    let wcs = poll_exact(&env, &p.a.cq, 2);
    let mut ids: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    ids.sort_unstable_by_key(|w| w.0);
    assert_eq!(ids, [(5, WcStatus::WrFlushErr), (13, WcStatus::WrFlushErr)]);
}

fn reset_discards_outstanding_work_and_the_qp_can_be_reused(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    // Completions generated and not polled, plus requests still queued.
    p.a.qp
        .post_send(&[write_wr(1, &p.b, 0), write_wr(2, &p.b, 8)])
        .unwrap();
    env.settle();
    p.a.post_recv(20, 0, 64);
    p.a.qp.post_send(&[write_wr(3, &p.b, 16)]).unwrap();
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    p.a.qp.modify_blocking(&reset, QpAttrMask::STATE).unwrap();
    assert_eq!(queried_state(&p.a.qp), QpState::Reset);
    assert_eq!(env.poll(&p.a.cq, 0), [], "RESET discarded every completion");
    // Both ends start over (the peer's PSNs moved on).
    p.b.qp.modify_blocking(&reset, QpAttrMask::STATE).unwrap();
    connect(&p.a.qp, &p.b.qp, &Params::default());
    let data = pattern(9, 500);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(30, 1024, 1024);
    p.a.qp
        .post_send(&[send(4).sges(&[p.a.sge(0, 500)])])
        .unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        4,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 30, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 500);
    assert_eq!(p.b.buf.to_vec(1024, 500).unwrap(), data);
}

fn sqd_drains_with_an_event_and_rts_resumes(backend: Backend) {
    // A link delay keeps the write in flight while the QP enters SQD.
    let delay = LinkFaults {
        delay_ns: 20_000,
        ..LinkFaults::NONE
    };
    let env = Env::with_faults(backend, 1, delay);
    let p = Pair::new(&env, QpType::Rc);
    let qpn = p.a.qp.qp_num();
    // A 60 000-byte write (59 packets) that has started when the QP enters SQD.
    let sge = [p.a.sge(0, 60_000)];
    p.a.qp
        .post_send(&[write_wr(1, &p.b, 0).sges(&sge)])
        .unwrap();
    env.run_for(1);
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.a.qp
        .modify_blocking(&sqd, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    let early = drain_events(env.a());
    let q = p.a.qp.query_blocking().unwrap();
    assert_eq!(q.qp_state, QpState::Sqd);
    assert!(q.sq_draining, "the write is in flight");
    assert!(early.is_empty(), "not drained while in flight");
    // The message in progress completes; then the drained event arrives.
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    let evs = drain_events(env.a());
    assert_eq!(
        count_events(&evs, AsyncEventKind::SqDrained, EventElement::Qp(qpn)),
        1,
        "{evs:?}"
    );
    let q = p.a.qp.query_blocking().unwrap();
    assert_eq!(q.qp_state, QpState::Sqd);
    assert!(!q.sq_draining);
    // Requests posted in SQD wait for RTS.
    p.a.qp.post_send(&[write_wr(2, &p.b, 8)]).unwrap();
    assert_eq!(env.poll(&p.a.cq, 0), [], "SQD does not start new requests");
    p.a.qp
        .modify_blocking(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        2,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    assert_eq!(queried_state(&p.a.qp), QpState::Rts);
}

fn destroying_a_qp_leaves_other_completions_on_a_shared_cq(backend: Backend) {
    let env = Env::new(backend);
    let pa = Params::default();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let a2 = make_qp(&a.pd, &a.cq, QpType::Rc, None, false);
    let b1 = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let b2 = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a.qp, &b1.qp, &pa);
    connect(&a2, &b2.qp, &pa);
    a.qp.post_send(&[write_wr(1, &b1, 0), write_wr(2, &b1, 8)])
        .unwrap();
    a2.post_send(&[write_wr(3, &b2, 0), write_wr(4, &b2, 8)])
        .unwrap();
    env.settle();
    let Side { qp, .. } = a;
    // `qp` is moved out of the side; destroy it with its completions unpolled.
    qp.destroy().unwrap();
    let wcs = env.poll(&a.cq, 2);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.qp_num, w.status)).collect();
    let n2 = a2.qp_num();
    assert_eq!(
        got,
        [(3, n2, WcStatus::Success), (4, n2, WcStatus::Success)]
    );
    a2.post_send(&[write_wr(5, &b2, 16)]).unwrap();
    check_wc(
        &poll_one(&env, &a.cq),
        5,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
}

fn receive_posted_to_a_qp_in_err_is_flushed_without_any_send(backend: Backend) {
    // A receive posted once the QP is in ERR completes with WR_FLUSH_ERR by itself (mlx4 has
    // no receive doorbell: the HCA must notice it), as ib_drain_rq relies on.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.a.qp
        .modify_blocking(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert!(env.poll(&p.a.cq, 0).is_empty());
    for round in 0..3u64 {
        p.a.post_recv(20 + round, 0, 64);
        let wc = poll_one(&env, &p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num),
            (20 + round, WcStatus::WrFlushErr, p.a.qp.qp_num())
        );
    }
}

cases!(
    post_send_before_rts_is_invalid_state,
    send_queue_overflow_reports_the_first_rejected_request,
    recv_queue_overflow_reports_the_first_rejected_request,
    too_many_sges_and_too_much_inline_are_refused,
    operations_invalid_for_the_transport_are_refused,
    modify_to_err_flushes_every_posted_request_in_order,
    reset_discards_outstanding_work_and_the_qp_can_be_reused,
    sqd_drains_with_an_event_and_rts_resumes,
    destroying_a_qp_leaves_other_completions_on_a_shared_cq,
    receive_posted_to_a_qp_in_err_is_flushed_without_any_send,
);

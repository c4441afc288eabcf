//! Shared receive queues: traffic through an SRQ from two QPs, depth, the limit event, resize,
//! the rules of QPs attached to an SRQ, and the last-WQE-reached event.

use portverbs::hal::CommandError;
use portverbs::hal::caps::QuirkId;
use portverbs::prelude::*;
use portverbs::verbs::{AsyncEventKind, EventElement, PostErrorKind, SrqError};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

/// Device b: one PD, CQ, buffer and SRQ, with QPs attached to it.
struct SrqSide {
    pd: Pd,
    cq: Cq,
    srq: Srq,
    buf: Buffer,
    mr: Mr,
}

impl SrqSide {
    fn new(ctx: &Context, init: SrqInit) -> Self {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = cq(ctx, 256);
        let srq = pd.create_srq_blocking(init).unwrap();
        let buf = ctx.alloc_buffer(1 << 16).unwrap();
        let mr = pd.reg_mr_blocking(&buf, 0..1 << 16, FULL_ACCESS).unwrap();
        Self {
            pd,
            cq,
            srq,
            buf,
            mr,
        }
    }

    fn qp(&self) -> Qp {
        make_qp(&self.pd, &self.cq, QpType::Rc, Some(&self.srq), false)
    }

    /// Posts one 256-byte receive at slot `slot`; the wr_id encodes the slot.
    fn post(&self, slot: u64, seq: u64) {
        let sge = [self.mr.sge_at(slot * 256, 256)];
        self.srq
            .post_recv(&[RecvWr {
                wr_id: (slot << 32) | seq,
                sges: &sge,
            }])
            .unwrap();
    }
}

fn srq_init(max_wr: u32) -> SrqInit {
    SrqInit {
        max_wr,
        max_sge: 1,
        limit: 0,
    }
}

fn rc_traffic_through_an_srq_from_two_qps(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(16));
    let (b1, b2) = (b.qp(), b.qp());
    let a1 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a1.qp, &b1, &Params::default());
    connect(&a2.qp, &b2, &Params::default());
    for slot in 0..16 {
        b.post(slot, 0);
    }
    // 48 messages through 16 slots: every consumed slot is reposted.
    for seq in 0..48u64 {
        let (a, bqp) = if seq % 2 == 0 { (&a1, &b1) } else { (&a2, &b2) };
        let data = pattern(seq as u8, 100 + seq as usize);
        a.buf.write(0, &data).unwrap();
        a.qp.post_send(&[SendWr::new(seq, SendOp::Send)
            .sges(&[a.sge(0, data.len() as u32)])
            .signaled()])
            .unwrap();
        check_wc(
            &poll_one(&env, &a.cq),
            seq,
            WcStatus::Success,
            WcOpcode::Send,
        );
        let wc = poll_one(&env, &b.cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.qp_num, bqp.qp_num(), "the QP the message came in on");
        assert_eq!(wc.byte_len, data.len() as u32);
        let slot = wc.wr_id >> 32;
        let posted_seq = wc.wr_id & 0xffff_ffff;
        assert!(slot < 16, "{wc:?}");
        assert!(posted_seq <= seq, "{wc:?}");
        assert_eq!(b.buf.to_vec(slot as usize * 256, data.len()).unwrap(), data);
        b.post(slot, seq + 1);
    }
}

fn posting_more_than_the_srq_depth_is_queue_full(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(8));
    let depth = b.srq.depth();
    assert!(depth >= 8);
    let sges: Vec<[Sge; 1]> = (0..=depth)
        .map(|i| [b.mr.sge_at(u64::from(i) * 16, 16)])
        .collect();
    let wrs: Vec<RecvWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr {
            wr_id: i as u64,
            sges: s,
        })
        .collect();
    let e = b.srq.post_recv(&wrs).unwrap_err();
    assert_eq!(e.index, depth as usize);
    assert_eq!(e.wr_id, u64::from(depth));
    assert_eq!(e.qpn, b.srq.srqn());
    assert_eq!(e.kind, PostErrorKind::QueueFull { depth });
    // Too many SGEs.
    let two = [b.mr.sge_at(0, 8), b.mr.sge_at(8, 8)];
    let e = b
        .srq
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &two,
        }])
        .unwrap_err();
    assert_eq!(e.index, 0);
    assert_eq!(
        e.kind,
        PostErrorKind::TooManySges {
            given: 2,
            max: b.srq.max_sge()
        }
    );
}

fn srq_beyond_device_limits_is_refused(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let max = env.a().attr().max_srq_wr;
    match pd.create_srq_blocking(srq_init(max + 1)) {
        Err(SrqError::CapTooLarge {
            what,
            requested,
            max: m,
        }) => assert_eq!((what, requested, m), ("max_wr", max + 1, max)),
        other => panic!("expected CapTooLarge, got {other:?}"),
    }
    match pd.create_srq_blocking(SrqInit {
        limit: 11,
        ..srq_init(10)
    }) {
        Err(SrqError::LimitTooLarge { limit, size }) => assert_eq!((limit, size), (11, 10)),
        other => panic!("expected LimitTooLarge, got {other:?}"),
    }
}

fn srq_limit_event_fires_once_below_the_limit(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(10));
    let bq = b.qp();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a.qp, &bq, &Params::default());
    for slot in 0..10 {
        b.post(slot, 0);
    }
    b.srq.arm_limit_blocking(7).unwrap();
    assert_eq!(b.srq.limit(), 7);
    let srq_ev = EventElement::Srq(b.srq.srqn());
    let send = |i: u64| {
        a.qp.post_send(&[SendWr::new(i, SendOp::Send)
            .sges(&[a.sge(0, 16)])
            .signaled()])
            .unwrap();
        check_wc(&poll_one(&env, &a.cq), i, WcStatus::Success, WcOpcode::Send);
        let wc = poll_one(&env, &b.cq);
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        assert!(wc.wr_id >> 32 < 10, "{wc:?}");
    };
    for i in 0..3 {
        send(i);
    }
    // 7 left: not below the limit yet.
    let evs = drain_events(env.b());
    assert_eq!(
        count_events(&evs, AsyncEventKind::SrqLimitReached, srq_ev),
        0,
        "{evs:?}"
    );
    send(3);
    let mut evs = drain_events(env.b());
    assert_eq!(b.srq.limit(), 0, "the limit is disarmed once it fired");
    // More consumption raises nothing more.
    send(4);
    evs.extend(drain_events(env.b()));
    assert_eq!(
        count_events(&evs, AsyncEventKind::SrqLimitReached, srq_ev),
        1,
        "{evs:?}"
    );
}

fn srq_resize_is_refused_by_a_device_without_srq_resize(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(10));
    let quirks = env.b().device().info().quirks;
    let no_resize = quirks.iter().any(|q| q.id == QuirkId::NoSrqResize);
    let before = b.srq.depth();
    let r = b.srq.resize_blocking(20);
    if no_resize {
        assert!(
            matches!(r, Err(SrqError::Device(CommandError::Unsupported { .. }))),
            "{r:?}"
        );
        assert_eq!(b.srq.depth(), before);
    } else {
        r.unwrap();
    }
}

fn qp_with_srq_refuses_post_recv(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(4));
    let qp = b.qp();
    to_init(&qp, &Params::default());
    let sge = [b.mr.sge_at(0, 16)];
    let e = qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &sge,
        }])
        .unwrap_err();
    assert_eq!(e.index, 0);
    assert_eq!(e.kind, PostErrorKind::UsesSrq { srqn: b.srq.srqn() });
}

fn destroying_an_srq_in_use_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let SrqSide {
        pd,
        cq,
        srq,
        buf,
        mr,
    } = SrqSide::new(env.b(), srq_init(4));
    let qp = make_qp(&pd, &cq, QpType::Rc, Some(&srq), false);
    let srqn = srq.srqn();
    let srq = match srq.destroy().map_err(|r| r.into_parts()) {
        Err((SrqError::Busy { srqn: n, users }, srq)) => {
            assert_eq!(n, srqn);
            assert!(users >= 1);
            srq
        }
        other => panic!("expected Busy, got {:?}", other),
    };
    drop(qp);
    srq.destroy().expect("free once no QP uses it");
    drop((mr, buf, cq, pd));
}

fn qp_with_srq_to_err_reports_last_wqe_reached(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(4));
    let bq = b.qp();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&a.qp, &bq, &Params::default());
    b.post(0, 0);
    bq.modify_blocking(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    env.settle();
    let evs = drain_events(env.b());
    assert_eq!(
        count_events(
            &evs,
            AsyncEventKind::QpLastWqeReached,
            EventElement::Qp(bq.qp_num())
        ),
        1,
        "{evs:?}"
    );
    // The SRQ's receive is not flushed: it stays available to other QPs.
    assert_eq!(env.poll(&b.cq, 0), []);
}

/// An SRQ with its receive buffer in one PD (`srq_pd`) and an RC QP attached to it in another
/// (`qp_pd`), connected to a side on device a; each PD has an MR over `buf`.
struct CrossPd {
    srq_pd: Pd,
    qp_pd: Pd,
    cq: Cq,
    srq: Srq,
    qp: Qp,
    buf: Buffer,
    srq_mr: Mr,
    qp_mr: Mr,
    a: Side,
}

impl CrossPd {
    fn new(env: &Env) -> Self {
        let ctx = env.b();
        let srq_pd = ctx.alloc_pd_blocking().unwrap();
        let qp_pd = ctx.alloc_pd_blocking().unwrap();
        let cq = cq(ctx, 16);
        let srq = srq_pd.create_srq_blocking(srq_init(4)).unwrap();
        let qp = make_qp(&qp_pd, &cq, QpType::Rc, Some(&srq), false);
        let buf = ctx.alloc_buffer(4096).unwrap();
        let srq_mr = srq_pd
            .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let qp_mr = qp_pd
            .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
        connect(&a.qp, &qp, &Params::default());
        Self {
            srq_pd,
            qp_pd,
            cq,
            srq,
            qp,
            buf,
            srq_mr,
            qp_mr,
            a,
        }
    }

    /// Posts a 256-byte receive through `mr`, then sends `data` from a; returns the sender's
    /// and the receiver's completions.
    fn exchange(&self, env: &Env, mr: &Mr, data: &[u8]) -> (WorkCompletion, WorkCompletion) {
        self.srq
            .post_recv(&[RecvWr {
                wr_id: 7,
                sges: &[mr.sge_at(0, 256)],
            }])
            .unwrap();
        self.a.buf.write(0, data).unwrap();
        self.a
            .qp
            .post_send(&[SendWr::new(1, SendOp::Send)
                .sges(&[self.a.sge(0, data.len() as u32)])
                .signaled()])
            .unwrap();
        (poll_one(env, &self.a.cq), poll_one(env, &self.cq))
    }
}

fn srq_receive_is_checked_against_the_srqs_pd(backend: Backend) {
    // IBA 10.2.9: a receive taken from an SRQ belongs to the SRQ's protection domain, which
    // may differ from the receiving QP's.
    let env = Env::new(backend);
    let x = CrossPd::new(&env);
    assert_ne!(x.srq_pd.pdn(), x.qp_pd.pdn());
    let data = pattern(4, 200);
    let (wc, rwc) = x.exchange(&env, &x.srq_mr, &data);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Send);
    check_wc(&rwc, 7, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(rwc.byte_len, 200);
    assert_eq!(x.buf.to_vec(0, 200).unwrap(), data);
}

fn srq_receive_in_the_qps_pd_but_not_the_srqs_is_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let x = CrossPd::new(&env);
    let (wc, rwc) = x.exchange(&env, &x.qp_mr, &pattern(5, 64));
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemOpErr), "{wc:?}");
    assert_eq!(
        (rwc.wr_id, rwc.status),
        (7, WcStatus::LocProtErr),
        "{rwc:?}"
    );
    assert_eq!(x.buf.to_vec(0, 64).unwrap(), vec![0; 64], "nothing landed");
    assert_eq!(queried_state(&x.qp), QpState::Err);
}

fn srq_write_with_imm_targets_the_qps_pd_not_the_srqs(backend: Backend) {
    // rdma-unit-test PdSrqTest.QpSrqPdMismatchWriteWithImm: the receive a WRITE with immediate
    // consumes is checked in the SRQ's PD, the memory it writes in the QP's.
    let env = Env::new(backend);
    let x = CrossPd::new(&env);
    let target = x
        .qp_pd
        .reg_mr_blocking(
            &x.buf,
            1024..2048,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    x.srq
        .post_recv(&[RecvWr {
            wr_id: 7,
            sges: &[],
        }])
        .unwrap();
    let data = pattern(6, 48);
    x.a.buf.write(0, &data).unwrap();
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey().unwrap(),
    };
    let sge = [x.a.sge(0, 48)];
    x.a.qp
        .post_send(&[
            SendWr::new(1, SendOp::RdmaWriteWithImm { remote, imm: 0x55 })
                .sges(&sge)
                .signaled(),
        ])
        .unwrap();
    check_wc(
        &poll_one(&env, &x.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    let rwc = poll_one(&env, &x.cq);
    check_wc(&rwc, 7, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rwc.imm(), Some(0x55));
    assert_eq!(x.buf.to_vec(1024, 48).unwrap(), data);
}

fn empty_srq_gives_rnr_retry_exceeded_and_the_responder_stays_rts(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(4));
    let bq = b.qp();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let params = Params {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..Params::default()
    };
    connect(&a.qp, &bq, &params);
    let sge = [a.sge(0, 16)];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let wc = poll_one(&env, &a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!(queried_state(&bq), QpState::Rts);
    assert!(env.poll(&b.cq, 0).is_empty());
    // Reconnected, with a receive on the SRQ, the same message goes through.
    super::obj_util::restate(&a.qp, bq.qp_num(), Env::gid(env.b()), &params);
    b.post(0, 0);
    a.qp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    check_wc(&poll_one(&env, &a.cq), 2, WcStatus::Success, WcOpcode::Send);
    check_wc(&poll_one(&env, &b.cq), 0, WcStatus::Success, WcOpcode::Recv);
}

fn srq_receives_survive_one_of_its_qps_entering_err(backend: Backend) {
    // rdma-unit-test SrqTest.QpFlush: a QP attached to an SRQ going to ERR flushes nothing of
    // the SRQ; another QP of the SRQ consumes the receives.
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(4));
    let (b1, b2) = (b.qp(), b.qp());
    let a2 = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    to_init(&b1, &Params::default());
    connect(&a2.qp, &b2, &Params::default());
    b.post(0, 0);
    b.post(1, 0);
    b1.modify_blocking(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    assert!(env.poll(&b.cq, 0).is_empty(), "no flush of SRQ receives");
    let sge = [a2.sge(0, 16)];
    for id in [1, 2] {
        a2.qp
            .post_send(&[SendWr::new(id, SendOp::Send).sges(&sge).signaled()])
            .unwrap();
        check_wc(
            &poll_one(&env, &a2.cq),
            id,
            WcStatus::Success,
            WcOpcode::Send,
        );
        let wc = poll_one(&env, &b.cq);
        check_wc(&wc, wc.wr_id, WcStatus::Success, WcOpcode::Recv);
        assert_eq!(wc.qp_num, b2.qp_num());
    }
}

fn srq_limit_above_its_depth_is_refused_and_changes_nothing(backend: Backend) {
    let env = Env::new(backend);
    let b = SrqSide::new(env.b(), srq_init(8));
    b.srq.arm_limit_blocking(3).unwrap();
    let depth = b.srq.depth();
    assert!(b.srq.arm_limit_blocking(depth + 1).is_err());
    assert_eq!(b.srq.limit(), 3, "the armed limit stays");
}

cases!(
    manual;
    rc_traffic_through_an_srq_from_two_qps,
    posting_more_than_the_srq_depth_is_queue_full,
    srq_beyond_device_limits_is_refused,
    srq_limit_event_fires_once_below_the_limit,
    srq_resize_is_refused_by_a_device_without_srq_resize,
    qp_with_srq_refuses_post_recv,
    destroying_an_srq_in_use_is_busy,
    qp_with_srq_to_err_reports_last_wqe_reached,
    srq_receive_is_checked_against_the_srqs_pd,
    srq_receive_in_the_qps_pd_but_not_the_srqs_is_loc_prot,
    srq_write_with_imm_targets_the_qps_pd_not_the_srqs,
    empty_srq_gives_rnr_retry_exceeded_and_the_responder_stays_rts,
    srq_receives_survive_one_of_its_qps_entering_err,
    srq_limit_above_its_depth_is_refused_and_changes_nothing,
);

//! Completion queues (pyverbs `test_cq`, rdma-unit-test `cq_test`): sizes, completion vectors,
//! channels, resize with unpolled completions, overflow, destroy while in use, polling.

use portverbs::hal::CqeError;
use portverbs::prelude::*;
use portverbs::verbs::{AsyncEventKind, CqError, EventElement, PollError};

use super::env::{Backend, Env};
use super::obj_util::*;
use super::tx_util::{count_events, drain_events, queried_state};
use super::util::*;

fn poll_all(cq: &Cq) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

fn assert_writes_in_order(wcs: &[WorkCompletion], first: u64, n: u64, qpn: u32) {
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (first..first + n).collect::<Vec<_>>());
    for w in wcs {
        assert_eq!(
            (w.status, w.opcode, w.qp_num),
            (WcStatus::Success, WcOpcode::RdmaWrite, qpn)
        );
    }
}

fn create_cq_with_sizes_1_half_max_and_max(backend: Backend) {
    let env = Env::new(backend);
    let max = env.a().attr().max_cqe;
    for entries in [1, max / 2, max] {
        let cq = cq(env.a(), entries);
        assert!(
            cq.depth() >= entries,
            "asked {entries}, got depth {}",
            cq.depth()
        );
        cq.destroy().unwrap();
    }
    let live: Vec<Cq> = [1, 2, 3].iter().map(|&e| cq(env.a(), e)).collect();
    let mut nums: Vec<u32> = live.iter().map(Cq::cqn).collect();
    nums.sort_unstable();
    nums.dedup();
    assert_eq!(nums.len(), 3, "live CQs have distinct numbers");
    assert_eq!(env.a().object_counts().cqs, 3);
    drop(live);
    assert_eq!(env.devs[0].resources().cqs, 0);
}

fn create_cq_with_zero_or_more_than_max_cqe_fails(backend: Backend) {
    let env = Env::new(backend);
    let max = env.a().attr().max_cqe;
    for entries in [0, max + 1, u32::MAX] {
        let r = env.a().create_cq_blocking(CqInit {
            entries,
            ..CqInit::default()
        });
        match r {
            Err(CqError::BadSize { requested, max: m }) => {
                assert_eq!((requested, m), (entries, max))
            }
            other => panic!("{entries} entries: expected BadSize, got {other:?}"),
        }
    }
    assert_eq!(env.a().object_counts().cqs, 0);
}

fn create_cq_on_first_and_last_comp_vector_works_and_beyond_fails(backend: Backend) {
    let env = Env::new(backend);
    let count = env.a().attr().num_comp_vectors;
    for v in [0, count - 1] {
        let cq = env
            .a()
            .create_cq_blocking(CqInit {
                entries: 8,
                comp_vector: v,
                channel: None,
            })
            .unwrap_or_else(|e| panic!("vector {v}: {e}"));
        assert!(cq.depth() >= 8);
    }
    for v in [count, count + 1, u32::MAX] {
        let r = env.a().create_cq_blocking(CqInit {
            entries: 8,
            comp_vector: v,
            channel: None,
        });
        match r {
            Err(CqError::BadVector { vector, count: c }) => assert_eq!((vector, c), (v, count)),
            other => panic!("vector {v}: expected BadVector, got {other:?}"),
        }
    }
}

fn create_cq_with_a_completion_channel(backend: Backend) {
    let env = Env::new(backend);
    let ch = env.a().create_comp_channel().unwrap();
    assert_eq!(env.a().object_counts().channels, 1);
    let cqs: Vec<Cq> = (0..2).map(|_| channel_cq(env.a(), &ch, 32)).collect();
    assert_ne!(cqs[0].cqn(), cqs[1].cqn(), "one channel serves several CQs");
    assert!(
        cqs.iter()
            .all(|c| c.depth() >= 32 && c.unacked_events() == 0)
    );
    assert_eq!(ch.queued(), 0);
    // ibv_destroy_comp_channel: EBUSY while CQs report to it; the handle comes back.
    let (err, ch) = ch.destroy().unwrap_err().into_parts();
    assert!(
        matches!(err, CqError::ChannelInUse { users: 2, .. }),
        "{err:?}"
    );
    drop(cqs);
    ch.destroy().expect("no CQ reports to it any more");
    assert_eq!(env.a().object_counts().channels, 0);
}

fn resize_cq_up_and_down_keeps_unpolled_completions(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    post_writes(&p, 0, 5);
    env.settle();
    for entries in [16, 1024, 5] {
        p.a.cq.resize_blocking(entries).unwrap();
        assert!(
            p.a.cq.depth() >= entries,
            "resize to {entries}: depth {}",
            p.a.cq.depth()
        );
    }
    let wcs = poll_all(&p.a.cq);
    assert_writes_in_order(&wcs, 0, 5, p.a.qp.qp_num());
    // The resized CQ keeps working.
    post_writes(&p, 5, 3);
    assert_writes_in_order(&env.poll(&p.a.cq, 3), 5, 3, p.a.qp.qp_num());
}

fn resize_cq_below_the_unpolled_completions_fails(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    post_writes(&p, 0, 6);
    env.settle();
    let depth = p.a.cq.depth();
    let err =
        p.a.cq
            .resize_blocking(1)
            .expect_err("6 unpolled completions do not fit 1 entry");
    assert_eq!(p.a.cq.depth(), depth, "the CQ is unchanged");
    assert_writes_in_order(&poll_all(&p.a.cq), 0, 6, p.a.qp.qp_num());
    match err {
        CqError::ResizeBelowPending {
            cqn,
            pending,
            requested,
        } => assert_eq!((cqn, pending, requested), (p.a.cq.cqn(), 6, 1)),
        other => panic!("expected ResizeBelowPending, got {other:?}"),
    }
}

fn notify_request_survives_a_cq_resize(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let req = p.a.cq.notify(NotifyKind::Any);
    p.a.cq.resize_blocking(512).unwrap();
    env.settle();
    p.a.cq.process_events().unwrap();
    assert_eq!(req.try_result(), None);
    post_writes(&p, 0, 1);
    env.settle();
    p.a.cq.process_events().unwrap();
    assert_eq!(
        req.try_result(),
        Some(Ok(())),
        "the arming outlives the ring"
    );
    assert_writes_in_order(&poll_all(&p.a.cq), 0, 1, p.a.qp.qp_num());
}

fn resize_cq_to_zero_or_beyond_max_cqe_fails(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 8);
    let max = env.a().attr().max_cqe;
    for entries in [0, max + 1] {
        let r = cq.resize_blocking(entries);
        assert!(
            matches!(r, Err(CqError::BadSize { requested, .. }) if requested == entries),
            "{r:?}"
        );
    }
    assert!(cq.depth() >= 8);
}

fn cq_overflow_raises_cq_err_and_polling_reports_the_error(backend: Backend) {
    let env = Env::new(backend);
    let p = pair_on(&env, cq(env.a(), 4), cq(env.b(), 16));
    let depth = p.a.cq.depth();
    assert!(
        depth < CAPS.max_send_wr,
        "the send queue can overflow the CQ"
    );
    post_writes(&p, 0, u64::from(depth) + 1);
    env.settle();
    let mut events = Vec::new();
    while let Some(ev) = env.a().get_async_event().unwrap() {
        events.push(ev);
    }
    let cqn = p.a.cq.cqn();
    assert!(
        events
            .iter()
            .any(|e| e.kind == AsyncEventKind::CqErr && e.element == EventElement::Cq(cqn)),
        "expected IBV_EVENT_CQ_ERR on CQ {cqn:#x}, got {events:?}"
    );
    let mut wc = [WorkCompletion::default(); 32];
    let n = p.a.cq.poll(&mut wc).unwrap();
    assert_eq!(
        n, depth as usize,
        "the completions that fit are still delivered"
    );
    assert_writes_in_order(&wc[..n], 0, u64::from(depth), p.a.qp.qp_num());
    assert_eq!(
        p.a.cq.poll(&mut wc),
        Err(PollError::BadCompletion(CqeError::CqInError { cqn }))
    );
}

fn destroy_cq_used_by_a_qp_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let cqn = cq.cqn();
    let pd = env.a().alloc_pd_blocking().unwrap();
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: CAPS,
            sq_sig_all: false,
            special: None,
        })
        .unwrap();
    let cq = match cq.destroy().map_err(|r| r.into_parts()) {
        Err((CqError::Busy { cqn: n, users }, cq)) => {
            assert_eq!(n, cqn);
            assert!(users >= 1);
            cq
        }
        Err((e, _)) => panic!("expected Busy, got {e:?}"),
        Ok(()) => panic!("destroyed a CQ a QP uses"),
    };
    assert_eq!(env.devs[0].resources().cqs, 1);
    drop(qp);
    cq.destroy().unwrap();
    assert_eq!(env.devs[0].resources().cqs, 0);
}

fn poll_of_an_empty_cq_returns_zero(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let mut wc = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(cq.poll(&mut []).unwrap(), 0);
    let p = Pair::new(&env, QpType::Rc);
    post_writes(&p, 0, 1);
    assert_eq!(env.poll(&p.a.cq, 1).len(), 1);
    assert_eq!(p.a.cq.poll(&mut wc).unwrap(), 0, "drained");
    assert_eq!(p.a.cq.poll(&mut []).unwrap(), 0);
}

fn batch_poll_returns_completions_in_order(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    post_writes(&p, 100, 10);
    env.settle();
    let mut wc = [WorkCompletion::default(); 4];
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let n = p.a.cq.poll(&mut wc).unwrap();
        sizes.push(n);
        got.extend_from_slice(&wc[..n]);
        if n == 0 {
            break;
        }
    }
    assert_eq!(sizes, [4, 4, 2, 0]);
    assert_writes_in_order(&got, 100, 10, p.a.qp.qp_num());
}

fn cq_shared_by_two_qps_reports_each_qps_completions(backend: Backend) {
    let env = Env::new(backend);
    let shared = cq(env.a(), 64);
    let p1 = pair_on(&env, shared.clone(), cq(env.b(), 16));
    let p2 = pair_on(&env, shared.clone(), cq(env.b(), 16));
    post_writes(&p1, 10, 2);
    post_writes(&p2, 20, 2);
    let wcs = env.poll(&shared, 4);
    assert_eq!(wcs.len(), 4);
    for (p, first) in [(&p1, 10), (&p2, 20)] {
        let qpn = p.a.qp.qp_num();
        let mine: Vec<WorkCompletion> = wcs.iter().copied().filter(|w| w.qp_num == qpn).collect();
        assert_writes_in_order(&mine, first, 2, qpn);
    }
}

fn cq_overrun_moves_the_qps_that_lost_completions_to_err(backend: Backend) {
    // IBA 11.4.2.1: a QP whose completion the CQ could not take goes to ERR; a QP on the same
    // CQ that had nothing to complete is not touched.
    let env = Env::new(backend);
    let a_cq = cq(env.a(), 4);
    let p = pair_on(&env, a_cq.clone(), cq(env.b(), 16));
    let idle = side_on(env.a(), a_cq, FULL_ACCESS);
    to_init(&idle.qp, &Params::default());
    let depth = p.a.cq.depth();
    post_writes(&p, 0, u64::from(depth) + 1);
    env.settle();
    assert_eq!(
        queried_state(&p.a.qp),
        QpState::Err,
        "the sender lost a completion"
    );
    assert_eq!(queried_state(&idle.qp), QpState::Init);
    assert_eq!(
        queried_state(&p.b.qp),
        QpState::Rts,
        "the peer saw only writes"
    );
    let evs = drain_events(env.a());
    assert_eq!(
        count_events(&evs, AsyncEventKind::CqErr, EventElement::Cq(p.a.cq.cqn())),
        1,
        "{evs:?}"
    );
}

fn receive_cq_overrun_moves_the_receiving_qp_to_err(backend: Backend) {
    let env = Env::new(backend);
    let p = pair_on(&env, cq(env.a(), 64), cq(env.b(), 4));
    let depth = p.b.cq.depth();
    for i in 0..=u64::from(depth) {
        p.b.post_recv(100 + i, i * 64, 64);
    }
    let sge = [p.a.sge(0, 8)];
    let wrs: Vec<_> = (0..=u64::from(depth))
        .map(|i| SendWr::new(i, SendOp::Send).sges(&sge).signaled())
        .collect();
    p.a.qp.post_send(&wrs).unwrap();
    env.settle();
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
    let evs = drain_events(env.b());
    assert_eq!(
        count_events(&evs, AsyncEventKind::CqErr, EventElement::Cq(p.b.cq.cqn())),
        1,
        "{evs:?}"
    );
    let mut wc = [WorkCompletion::default(); 32];
    let n = p.b.cq.poll(&mut wc).unwrap();
    assert_eq!(n, depth as usize, "the completions that fit are delivered");
    for (i, w) in wc[..n].iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (100 + i as u64, WcStatus::Success));
    }
}

cases!(
    manual;
    create_cq_with_sizes_1_half_max_and_max,
    create_cq_with_zero_or_more_than_max_cqe_fails,
    create_cq_on_first_and_last_comp_vector_works_and_beyond_fails,
    create_cq_with_a_completion_channel,
    resize_cq_up_and_down_keeps_unpolled_completions,
    resize_cq_below_the_unpolled_completions_fails,
    notify_request_survives_a_cq_resize,
    resize_cq_to_zero_or_beyond_max_cqe_fails,
    cq_overflow_raises_cq_err_and_polling_reports_the_error,
    destroy_cq_used_by_a_qp_is_busy,
    poll_of_an_empty_cq_returns_zero,
    batch_poll_returns_completions_in_order,
    cq_shared_by_two_qps_reports_each_qps_completions,
    cq_overrun_moves_the_qps_that_lost_completions_to_err,
    receive_cq_overrun_moves_the_receiving_qp_to_err,
);

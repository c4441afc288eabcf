//! CQ notification (NetworkDirect-style, `verbs-core/src/notify.rs`) and completion channels
//! (pyverbs `test_cq_events`, rdma-unit-test `comp_channel_test`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use portverbs::prelude::*;
use portverbs::verbs::{AsyncEventKind, CqError, EventElement, NotifyError};

use super::env::{Backend, Env};
use super::obj_util::*;
use super::util::*;

/// Lets the fabric run and routes the events of `cq`'s event queue.
fn deliver(env: &Env, cq: &Cq) {
    env.settle();
    cq.process_events().unwrap();
}

/// A pair whose side-a CQ reports to a new completion channel.
fn channel_pair(env: &Env) -> (CompletionChannel, Pair) {
    let ch = env.a().create_comp_channel().unwrap();
    let a_cq = channel_cq(env.a(), &ch, 64);
    let p = pair_on(env, a_cq, cq(env.b(), 64));
    (ch, p)
}

/// SEND of 16 bytes from a to b (b posts the receive), with `flags`.
fn send_to_b(env: &Env, p: &Pair, wr_id: u64, flags: SendFlags) {
    p.b.post_recv(wr_id, 0, 4096);
    let sge = [p.a.sge(0, 16)];
    let wr = SendWr::new(wr_id, SendOp::Send).sges(&sge).flags(flags);
    assert!(run(env, &p.a, wr).is_ok());
}

fn notify_any_resolves_on_the_next_completion_not_before(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let req = p.a.cq.notify(NotifyKind::Any);
    assert_eq!(req.kind(), NotifyKind::Any);
    deliver(&env, &p.a.cq);
    assert_eq!(req.try_result(), None, "nothing happened yet");
    post_writes(&p, 0, 1);
    p.a.cq.process_events().unwrap();
    assert_eq!(req.try_result(), None, "the fabric has not run");
    deliver(&env, &p.a.cq);
    assert_eq!(req.try_result(), Some(Ok(())));
    // Once drained, a new request waits for the next completion again.
    assert_eq!(env.poll(&p.a.cq, 1).len(), 1);
    let again = p.a.cq.notify(NotifyKind::Any);
    deliver(&env, &p.a.cq);
    assert_eq!(again.try_result(), None);
    post_writes(&p, 1, 1);
    deliver(&env, &p.a.cq);
    assert_eq!(again.try_result(), Some(Ok(())));
}

fn two_pending_requests_both_complete_on_one_event(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let r1 = p.a.cq.notify(NotifyKind::Any);
    let r2 = p.a.cq.notify(NotifyKind::Any);
    post_writes(&p, 0, 1);
    deliver(&env, &p.a.cq);
    assert_eq!(r1.try_result(), Some(Ok(())));
    assert_eq!(r2.try_result(), Some(Ok(())));
}

fn notify_solicited_ignores_unsolicited_receives_and_fires_on_a_solicited_one(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let req = p.b.cq.notify(NotifyKind::Solicited);
    send_to_b(&env, &p, 1, SendFlags::empty());
    deliver(&env, &p.b.cq);
    assert_eq!(
        req.try_result(),
        None,
        "an unsolicited receive does not satisfy it"
    );
    send_to_b(&env, &p, 2, SendFlags::SOLICITED);
    deliver(&env, &p.b.cq);
    assert_eq!(req.try_result(), Some(Ok(())));
    let wcs = env.poll(&p.b.cq, 2);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2]);
}

fn notify_solicited_is_satisfied_by_an_error_completion(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let req = p.a.cq.notify(NotifyKind::Solicited);
    post_writes(&p, 0, 1);
    deliver(&env, &p.a.cq);
    assert_eq!(
        req.try_result(),
        None,
        "a successful send completion is not solicited"
    );
    let bad = [Sge {
        addr: p.a.mr.addr(),
        length: 16,
        lkey: p.a.mr.lkey() ^ 0x00ff_ff00,
    }];
    let wr = SendWr::new(9, SendOp::Send).sges(&bad).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    deliver(&env, &p.a.cq);
    assert_eq!(req.try_result(), Some(Ok(())));
    let wcs = env.poll(&p.a.cq, 2);
    assert_eq!(
        wcs.last().map(|w| (w.wr_id, w.status)),
        Some((9, WcStatus::LocProtErr))
    );
}

fn notify_any_after_solicited_upgrades_the_arming(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let sol = p.b.cq.notify(NotifyKind::Solicited);
    let any = p.b.cq.notify(NotifyKind::Any);
    send_to_b(&env, &p, 1, SendFlags::empty());
    deliver(&env, &p.b.cq);
    assert_eq!(any.try_result(), Some(Ok(())));
    assert_eq!(
        sol.try_result(),
        Some(Ok(())),
        "all pending requests complete on the event"
    );
}

fn notify_errors_ignores_completions_and_cq_overflow_fails_every_request(backend: Backend) {
    let env = Env::new(backend);
    let p = pair_on(&env, cq(env.a(), 4), cq(env.b(), 16));
    let cqn = p.a.cq.cqn();
    let errors = p.a.cq.notify(NotifyKind::Errors);
    let any = p.a.cq.notify(NotifyKind::Any);
    post_writes(&p, 0, 1);
    deliver(&env, &p.a.cq);
    env.a().process_events().unwrap();
    assert_eq!(any.try_result(), Some(Ok(())));
    assert_eq!(
        errors.try_result(),
        None,
        "a completion does not satisfy an Errors request"
    );
    let sol = p.a.cq.notify(NotifyKind::Solicited);
    // One completion is unpolled: `depth` more overflow the CQ.
    post_writes(&p, 1, u64::from(p.a.cq.depth()));
    deliver(&env, &p.a.cq);
    env.a().process_events().unwrap();
    assert!(env.a().has_queued_event(AsyncEventKind::CqErr));
    let failed = Some(Err(NotifyError::CqError { cqn }));
    assert_eq!(errors.try_result(), failed);
    assert_eq!(sol.try_result(), failed, "errors satisfy every request");
    assert_eq!(
        p.a.cq.notify(NotifyKind::Any).try_result(),
        failed,
        "the CQ stays in error"
    );
}

fn destroying_the_cq_cancels_pending_requests(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let cqn = cq.cqn();
    let reqs: Vec<_> = [NotifyKind::Any, NotifyKind::Solicited, NotifyKind::Errors]
        .into_iter()
        .map(|k| cq.notify(k))
        .collect();
    cq.destroy().unwrap();
    for r in &reqs {
        assert_eq!(
            r.try_result(),
            Some(Err(NotifyError::Cancelled { cqn })),
            "{:?}",
            r.kind()
        );
    }
}

fn device_fatal_completes_pending_requests_with_device_fatal(backend: Backend) {
    let env = Env::new(backend);
    let cq = cq(env.a(), 16);
    let any = cq.notify(NotifyKind::Any);
    let errors = cq.notify(NotifyKind::Errors);
    env.inject_device_fatal(0);
    env.settle();
    env.a().process_events().unwrap();
    assert!(env.a().is_fatal());
    assert_eq!(any.try_result(), Some(Err(NotifyError::DeviceFatal)));
    assert_eq!(errors.try_result(), Some(Err(NotifyError::DeviceFatal)));
    let later = cq.notify(NotifyKind::Any);
    assert_eq!(later.try_result(), Some(Err(NotifyError::DeviceFatal)));
    let ev = env
        .a()
        .get_async_event()
        .unwrap()
        .expect("IBV_EVENT_DEVICE_FATAL");
    assert_eq!(
        (ev.kind, ev.element),
        (AsyncEventKind::DeviceFatal, EventElement::Device)
    );
}

fn completion_present_before_the_request_still_fires_it(backend: Backend) {
    // The race of "poll until empty, then arm": a completion that arrives in between must not
    // be lost.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    post_writes(&p, 0, 1);
    env.settle();
    let req = p.a.cq.notify(NotifyKind::Any);
    deliver(&env, &p.a.cq);
    assert_eq!(req.try_result(), Some(Ok(())));
    assert_eq!(
        env.poll(&p.a.cq, 1).len(),
        1,
        "the completion is still there to poll"
    );
}

fn solicited_completion_present_before_the_request_still_fires_it(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    send_to_b(&env, &p, 1, SendFlags::SOLICITED);
    let req = p.b.cq.notify(NotifyKind::Solicited);
    deliver(&env, &p.b.cq);
    assert_eq!(req.try_result(), Some(Ok(())));
    assert_eq!(one(&env, &p.b.cq).wr_id, 1);
}

/// Counts its wake-ups.
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn notify_request_as_a_future_wakes_its_waker_on_the_event(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(counter.clone());
    let mut cx = TaskContext::from_waker(&waker);
    let mut req = p.a.cq.notify(NotifyKind::Any);
    assert_eq!(Pin::new(&mut req).poll(&mut cx), Poll::Pending);
    deliver(&env, &p.a.cq);
    assert_eq!(counter.0.load(Ordering::SeqCst), 0, "no event, no wake-up");
    post_writes(&p, 0, 1);
    deliver(&env, &p.a.cq);
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "woken once by the event"
    );
    assert_eq!(Pin::new(&mut req).poll(&mut cx), Poll::Ready(Ok(())));
}

fn unread_channel_event_is_not_counted_as_unacknowledged(backend: Backend) {
    // ibv_destroy_cq waits only for the events ibv_get_cq_event returned.
    let env = Env::new(backend);
    let (ch, p) = channel_pair(&env);
    p.a.cq.req_notify(false);
    post_writes(&p, 0, 1);
    env.settle();
    ch.process().unwrap();
    assert_eq!(ch.queued(), 1, "the event waits in the channel");
    assert_eq!(p.a.cq.unacked_events(), 0, "nothing was read yet");
    let ev = ch.get_cq_event().unwrap().expect("the queued event");
    assert_eq!(ev.cqn(), p.a.cq.cqn());
    assert_eq!(p.a.cq.unacked_events(), 1);
    ev.ack_events(1);
    assert_eq!(p.a.cq.unacked_events(), 0);
}

fn req_notify_delivers_one_channel_event_until_acknowledged(backend: Backend) {
    let env = Env::new(backend);
    let (ch, p) = channel_pair(&env);
    p.a.cq.req_notify(false);
    post_writes(&p, 0, 2);
    env.settle();
    let ev = ch.get_cq_event().unwrap().expect("a completion event");
    assert_eq!(ev.cqn(), p.a.cq.cqn());
    drop(ev);
    assert!(ch.get_cq_event().unwrap().is_none(), "one event per arming");
    assert_eq!(p.a.cq.unacked_events(), 1);
    assert_eq!(
        p.a.cq.unacked_events(),
        1,
        "reading the count does not acknowledge"
    );
    p.a.cq.ack_events(1);
    assert_eq!(p.a.cq.unacked_events(), 0);
    assert_eq!(env.poll(&p.a.cq, 2).len(), 2);
}

fn rc_traffic_driven_by_completion_events(backend: Backend) {
    // pyverbs test_cq_events: arm, wait for the event, acknowledge, poll, re-arm.
    let env = Env::new(backend);
    let ch = env.b().create_comp_channel().unwrap();
    let b_cq = channel_cq(env.b(), &ch, 16);
    let p = pair_on(&env, cq(env.a(), 16), b_cq);
    p.b.cq.req_notify(false);
    for i in 0..5u64 {
        let data = pattern(i as u8, 100);
        p.a.buf.write(0, &data).unwrap();
        send_to_b(&env, &p, i, SendFlags::empty());
        let ev = ch.get_cq_event().unwrap().expect("one event per message");
        assert_eq!(ev.cqn(), p.b.cq.cqn());
        ev.ack_events(1);
        let wc = one(&env, &p.b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, 16)
        );
        assert_eq!(p.b.buf.to_vec(0, 16).unwrap(), data[..16]);
        // Re-armed on an empty CQ: nothing fires until the next message.
        p.b.cq.req_notify(false);
        env.settle();
        assert!(
            ch.get_cq_event().unwrap().is_none(),
            "iteration {i}: no extra event"
        );
    }
    assert_eq!(p.b.cq.unacked_events(), 0);
}

fn destroy_cq_with_unacknowledged_events_fails(backend: Backend) {
    let env = Env::new(backend);
    let ch = env.a().create_comp_channel().unwrap();
    let a_cq = channel_cq(env.a(), &ch, 16);
    let cqn = a_cq.cqn();
    let p = pair_on(&env, a_cq, cq(env.b(), 16));
    p.a.cq.req_notify(false);
    post_writes(&p, 0, 1);
    env.settle();
    assert!(ch.get_cq_event().unwrap().is_some());
    let Pair { a, b } = p;
    let Side { qp, cq, .. } = a;
    drop((qp, b));
    let cq = match cq.destroy().map_err(|r| r.into_parts()) {
        Err((CqError::UnackedEvents { cqn: n, unacked }, cq)) => {
            assert_eq!((n, unacked), (cqn, 1));
            cq
        }
        Err((e, _)) => panic!("expected UnackedEvents, got {e:?}"),
        Ok(()) => panic!("destroyed a CQ with an unacknowledged event"),
    };
    cq.ack_events(1);
    cq.destroy().unwrap();
}

fn no_channel_event_without_req_notify(backend: Backend) {
    let env = Env::new(backend);
    let (ch, p) = channel_pair(&env);
    post_writes(&p, 0, 3);
    env.settle();
    assert!(ch.get_cq_event().unwrap().is_none(), "no spurious event");
    assert_eq!(ch.queued(), 0);
    assert_eq!(p.a.cq.unacked_events(), 0);
    assert_eq!(env.poll(&p.a.cq, 3).len(), 3);
}

fn req_notify_solicited_only_ignores_unsolicited_completions(backend: Backend) {
    let env = Env::new(backend);
    let ch = env.a().create_comp_channel().unwrap();
    let b_cq = cq(env.b(), 16);
    // Receives land on a's CQ: b sends to a.
    let a_cq = channel_cq(env.a(), &ch, 16);
    let p = pair_on(&env, a_cq, b_cq);
    let swapped = Pair { a: p.b, b: p.a };
    swapped.b.cq.req_notify(true);
    send_to_b(&env, &swapped, 1, SendFlags::empty());
    assert!(ch.get_cq_event().unwrap().is_none(), "unsolicited receive");
    send_to_b(&env, &swapped, 2, SendFlags::SOLICITED);
    let ev = ch.get_cq_event().unwrap().expect("solicited receive");
    assert_eq!(ev.cqn(), swapped.b.cq.cqn());
    ev.ack_events(1);
}

fn one_channel_multiplexes_events_of_several_cqs(backend: Backend) {
    let env = Env::new(backend);
    let ch = env.a().create_comp_channel().unwrap();
    let mk = || channel_cq(env.a(), &ch, 16);
    let p1 = pair_on(&env, mk(), cq(env.b(), 16));
    let p2 = pair_on(&env, mk(), cq(env.b(), 16));
    p1.a.cq.req_notify(false);
    p2.a.cq.req_notify(false);
    post_writes(&p2, 0, 1);
    env.settle();
    let ev = ch.get_cq_event().unwrap().expect("event of the second CQ");
    assert_eq!(ev.cqn(), p2.a.cq.cqn());
    assert!(ch.get_cq_event().unwrap().is_none());
    post_writes(&p1, 0, 1);
    env.settle();
    let ev1 = ch.get_cq_event().unwrap().expect("event of the first CQ");
    assert_eq!(ev1.cqn(), p1.a.cq.cqn());
    ev.ack_events(1);
    ev1.ack_events(1);
    assert_eq!((p1.a.cq.unacked_events(), p2.a.cq.unacked_events()), (0, 0));
}

cases!(
    manual;
    notify_any_resolves_on_the_next_completion_not_before,
    two_pending_requests_both_complete_on_one_event,
    notify_solicited_ignores_unsolicited_receives_and_fires_on_a_solicited_one,
    notify_solicited_is_satisfied_by_an_error_completion,
    notify_any_after_solicited_upgrades_the_arming,
    notify_errors_ignores_completions_and_cq_overflow_fails_every_request,
    destroying_the_cq_cancels_pending_requests,
    device_fatal_completes_pending_requests_with_device_fatal,
    completion_present_before_the_request_still_fires_it,
    solicited_completion_present_before_the_request_still_fires_it,
    notify_request_as_a_future_wakes_its_waker_on_the_event,
    unread_channel_event_is_not_counted_as_unacknowledged,
    req_notify_delivers_one_channel_event_until_acknowledged,
    rc_traffic_driven_by_completion_events,
    destroy_cq_with_unacknowledged_events_fails,
    no_channel_event_without_req_notify,
    req_notify_solicited_only_ignores_unsolicited_completions,
    one_channel_multiplexes_events_of_several_cqs,
);

//! Completion channels under epoll (level- and edge-triggered) and the blocking waits.

mod common;

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use common::{Dev, Net, PATIENCE, epoll_on, epoll_ready, poll_n, send};
use portverbs_hal::block_on;
use portverbs_verbs::{
    CompletionChannel, Cq, CqError, NotifyError, NotifyKind, Qp, SendFlags, WaitError, WcStatus,
};

#[test]
fn level_triggered_epoll_get_ack_destroy() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));
    let ep = epoll_on(chan.as_fd().unwrap(), false);

    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        0,
        "quiet before any event"
    );
    assert!(chan.get_cq_event().unwrap().is_none());
    cq_b.req_notify(false);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());

    assert_eq!(
        epoll_ready(&ep, PATIENCE),
        1,
        "the completion made the fd readable"
    );
    let got = chan.get_cq_event().unwrap().expect("an event");
    assert_eq!(got.cqn(), cq_b.cqn());
    assert!(
        chan.get_cq_event().unwrap().is_none(),
        "one arming, one event"
    );
    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        0,
        "nothing left: the fd is quiet"
    );
    let wc = poll_n(&cq_b, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    drop(got);

    // The destroy barrier of ibv_destroy_cq: not while the event is unacknowledged.
    qb.destroy().unwrap();
    assert_eq!(cq_b.unacked_events(), 1);
    let (err, cq_b) = cq_b.destroy().unwrap_err().into_parts();
    assert!(
        matches!(err, CqError::UnackedEvents { unacked: 1, .. }),
        "{err:?}"
    );
    cq_b.ack_events(1);
    assert_eq!(cq_b.unacked_events(), 0);
    cq_b.destroy().unwrap();
    qa.destroy().unwrap();
}

/// B's two CQs share one edge-triggered channel; each is armed and gets one receive
/// completion from its own connected QP pair.
struct TwoCqs {
    chan: CompletionChannel<Dev>,
    cq1: Cq<Dev>,
    cq2: Cq<Dev>,
    ep: OwnedFd,
    // Kept alive until the test ends.
    _rest: (Cq<Dev>, [Qp<Dev>; 4]),
}

impl TwoCqs {
    fn fire(net: &Net) -> Self {
        let chan = net.b.ctx.create_comp_channel().unwrap();
        let cq_a = net.a.cq(None);
        let (cq1, cq2) = (net.b.cq(Some(&chan)), net.b.cq(Some(&chan)));
        let (qa1, qa2) = (net.a.qp(&cq_a), net.a.qp(&cq_a));
        let (qb1, qb2) = (net.b.qp(&cq1), net.b.qp(&cq2));
        net.connect(&qa1, &qb1);
        net.connect(&qa2, &qb2);
        let ep = epoll_on(chan.as_fd().unwrap(), true);
        cq1.req_notify(false);
        cq2.req_notify(false);
        net.b.post_recv(&qb1, 1);
        net.b.post_recv(&qb2, 2);
        send(&qa1, 11, SendFlags::empty());
        send(&qa2, 12, SendFlags::empty());
        Self {
            chan,
            cq1,
            cq2,
            ep,
            _rest: (cq_a, [qa1, qa2, qb1, qb2]),
        }
    }
}

/// Two CQs on one channel fire before the application looks; an edge-triggered epoll that
/// reads one event per wakeup still gets both, because the fd is signalled again while an
/// event is left (stepped, so both events are certainly in before the first read).
#[test]
fn edge_triggered_epoll_one_event_per_wakeup_stepped() {
    let net = Net::stepped(3);
    let TwoCqs {
        chan,
        cq1,
        cq2,
        ep,
        _rest,
    } = TwoCqs::fire(&net);
    net.settle();

    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        1,
        "one edge for the interrupt"
    );
    let first = chan.get_cq_event().unwrap().expect("an event");
    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        1,
        "a new edge: an event is left"
    );
    let second = chan.get_cq_event().unwrap().expect("an event");
    assert!(chan.get_cq_event().unwrap().is_none());
    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        0,
        "no edge once all are read"
    );
    let seen: HashSet<u32> = [first.cqn(), second.cqn()].into();
    assert_eq!(seen, [cq1.cqn(), cq2.cqn()].into());
    first.ack_events(1);
    second.ack_events(1);
    assert_eq!((cq1.unacked_events(), cq2.unacked_events()), (0, 0));
}

/// The same with completions arriving from the engine thread at any moment.
#[test]
fn edge_triggered_epoll_two_cqs_threaded() {
    let net = Net::threaded();
    let TwoCqs {
        chan,
        cq1,
        cq2,
        ep,
        _rest,
    } = TwoCqs::fire(&net);

    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "events seen: {seen:?}");
        if epoll_ready(&ep, Duration::from_millis(200)) == 0 {
            continue;
        }
        // One read per wakeup: relies on the fd being signalled again for what is left.
        if let Some(cq) = chan.get_cq_event().unwrap() {
            cq.ack_events(1);
            seen.push(cq.cqn());
        }
    }
    seen.sort_unstable();
    let mut want = vec![cq1.cqn(), cq2.cqn()];
    want.sort_unstable();
    assert_eq!(seen, want, "each CQ's event exactly once");
    assert!(chan.get_cq_event().unwrap().is_none());
}

#[test]
fn blocking_wait_returns_the_cq_and_times_out_when_idle() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));

    let idle = chan.wait_cq_event(Some(Duration::from_millis(20)));
    assert!(matches!(idle, Err(WaitError::TimedOut)), "{idle:?}");
    cq_b.req_notify(false);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    let got = chan.wait_cq_event(Some(PATIENCE)).unwrap();
    assert_eq!(got.cqn(), cq_b.cqn());
    got.ack_events(1);
}

#[test]
fn wait_notify_completes_on_a_completion_and_times_out_otherwise() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));

    let mut idle = cq_b.notify(NotifyKind::Any);
    let r = cq_b.wait_notify(&mut idle, Some(Duration::from_millis(20)));
    assert!(matches!(r, Err(WaitError::TimedOut)), "{r:?}");
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    cq_b.wait_notify(&mut idle, Some(PATIENCE)).unwrap();
    assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 1);
    assert_eq!(
        cq_b.unacked_events(),
        0,
        "a notify request is no channel event"
    );
}

/// Two threads wait on requests of two CQs of one channel; whichever processes the event
/// queue completes both, and the other still wakes.
#[test]
fn wait_notify_from_two_threads_on_one_channel() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let cq_a = net.a.cq(None);
    let (cq1, cq2) = (net.b.cq(Some(&chan)), net.b.cq(Some(&chan)));
    let (qa1, qa2) = (net.a.qp(&cq_a), net.a.qp(&cq_a));
    let (qb1, qb2) = (net.b.qp(&cq1), net.b.qp(&cq2));
    net.connect(&qa1, &qb1);
    net.connect(&qa2, &qb2);
    net.b.post_recv(&qb1, 1);
    net.b.post_recv(&qb2, 2);

    let mut r1 = cq1.notify(NotifyKind::Any);
    let mut r2 = cq2.notify(NotifyKind::Any);
    std::thread::scope(|s| {
        let (cq1, cq2) = (&cq1, &cq2);
        let t1 = s.spawn(move || cq1.wait_notify(&mut r1, Some(PATIENCE)));
        let t2 = s.spawn(move || cq2.wait_notify(&mut r2, Some(PATIENCE)));
        send(&qa1, 11, SendFlags::empty());
        send(&qa2, 12, SendFlags::empty());
        t1.join().unwrap().unwrap();
        t2.join().unwrap().unwrap();
    });
}

/// Destroying a request's CQ resolves its future with `Cancelled`: the future holds no
/// reference to the CQ, so the destroy is not refused.
#[test]
fn notified_on_a_destroyed_cq_is_cancelled() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let cq = net.b.cq(Some(&chan));
    let cqn = cq.cqn();
    let notified = cq.notified(NotifyKind::Any);
    cq.destroy().expect("the future holds no CQ");
    let r = block_on(notified);
    assert!(
        matches!(r, Err(WaitError::Notify(NotifyError::Cancelled { cqn: n })) if n == cqn),
        "{r:?}"
    );
}

/// A CQ without a channel reports to its completion vector, whose EQ has an eventfd of its
/// own: readable on the event, then `Context::process_events` completes the notify request.
#[test]
fn completion_vector_fd_completes_notify_requests() {
    let net = Net::threaded();
    let (_cq_a, cq_b, qa, qb) = net.link(None);
    let sink = net.b.ctx.vector_sink(0).expect("vector 0's EQ exists");
    let ep = epoll_on(sink.as_fd().expect("an eventfd"), false);

    let req = cq_b.notify(NotifyKind::Any);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    assert_eq!(epoll_ready(&ep, PATIENCE), 1, "the vector's eventfd fired");
    sink.clear().unwrap();
    assert!(
        !req.is_complete(),
        "nothing completes before the EQ is processed"
    );
    net.b.ctx.process_events().unwrap();
    assert_eq!(req.try_result(), Some(Ok(())));
    assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 1);
}

//! The channel and event fds in tokio's reactor, and the CQ notify future (feature `tokio`).
#![cfg(feature = "tokio")]

mod common;

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{Net, PATIENCE, poll_n, send};
use portverbs_linux::{CompChannel, NotifyWaitError, TokioAsyncEvents, TokioCompChannel};
use portverbs_verbs::{
    AsyncEventKind, EventElement, NotifyError, NotifyKind, SendFlags, WorkCompletion,
};
use tokio::time::timeout;

/// Polls `fut` once: `Some(output)` when it is ready.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    poll_fn(|cx| match std::pin::Pin::new(&mut *fut).poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

#[tokio::test]
async fn async_fd_readiness_and_get_cq_event() {
    let net = Net::threaded();
    let chan = TokioCompChannel::new(CompChannel::new(&net.b.ctx).unwrap()).unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(chan.get_ref()));

    // The raw AsyncFd: readable, then try_io until an event comes out.
    cq_b.req_notify(false);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    let got = timeout(PATIENCE, async {
        loop {
            let mut guard = chan.async_fd().readable().await.unwrap();
            if let Ok(r) = guard.try_io(|fd| fd.get_ref().get_cq_event()) {
                break r.unwrap();
            }
        }
    })
    .await
    .expect("an event through AsyncFd");
    assert_eq!(got.cqn(), cq_b.cqn());
    got.ack_events(1);
    assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 1);

    // The async get-event of the wrapper, re-armed.
    cq_b.req_notify(false);
    net.b.post_recv(&qb, 2);
    send(&qa, 11, SendFlags::empty());
    let got = timeout(PATIENCE, chan.get_cq_event())
        .await
        .expect("a second event")
        .unwrap();
    assert_eq!(got.cqn(), cq_b.cqn());
    got.ack_events(1);
    assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 2);
    assert_eq!(cq_b.unacked_events(), 0);
}

#[tokio::test]
async fn notify_future_resolves_on_a_completion_from_the_engine() {
    let net = Net::threaded();
    let chan = TokioCompChannel::new(CompChannel::new(&net.b.ctx).unwrap()).unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(chan.get_ref()));

    net.b.post_recv(&qb, 1);
    let notified = tokio::spawn(chan.notify(&cq_b, NotifyKind::Any));
    send(&qa, 10, SendFlags::empty());
    timeout(PATIENCE, notified)
        .await
        .expect("the notification arrived")
        .unwrap()
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(
        cq_b.poll(&mut wc).unwrap(),
        1,
        "notified after the CQE landed"
    );
    assert_eq!(wc[0].wr_id, 1);
}

#[tokio::test]
async fn notify_future_on_a_destroyed_cq_is_cancelled() {
    let net = Net::threaded();
    let chan = TokioCompChannel::new(CompChannel::new(&net.b.ctx).unwrap()).unwrap();
    let cq = net.b.cq(Some(chan.get_ref()));
    let cqn = cq.cqn();
    let waiting = tokio::spawn(chan.notify(&cq, NotifyKind::Any));
    let before = tokio::spawn(chan.notify(&cq, NotifyKind::Solicited));
    tokio::task::yield_now().await;
    cq.destroy().expect("the futures hold no CQ");
    for fut in [waiting, before] {
        let r = timeout(PATIENCE, fut).await.expect("resolved").unwrap();
        assert!(
            matches!(r, Err(NotifyWaitError::Notify(NotifyError::Cancelled { cqn: n })) if n == cqn),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn solicited_notify_ignores_unsolicited_receives() {
    let net = Net::threaded();
    let chan = TokioCompChannel::new(CompChannel::new(&net.b.ctx).unwrap()).unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(chan.get_ref()));
    net.b.post_recv(&qb, 1);
    net.b.post_recv(&qb, 2);

    let mut notified = pin!(chan.notify(&cq_b, NotifyKind::Solicited));
    send(&qa, 10, SendFlags::empty());
    // Wait for the unsolicited receive to land, then let the future process whatever the
    // channel's event queue holds: it must still be pending.
    let deadline = Instant::now() + PATIENCE;
    let mut wc = [WorkCompletion::default(); 4];
    while cq_b.poll(&mut wc).unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the unsolicited receive never landed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(wc[0].wr_id, 1);
    chan.get_ref().process().unwrap();
    assert!(
        poll_once(&mut notified).await.is_none(),
        "an unsolicited receive does not satisfy a solicited request"
    );

    send(&qa, 11, SendFlags::SOLICITED);
    timeout(PATIENCE, notified)
        .await
        .expect("the solicited receive satisfies it")
        .unwrap();
    assert_eq!(poll_n(&cq_b, 1)[0].wr_id, 2);
}

#[tokio::test]
async fn async_events_through_tokio() {
    let Net {
        a,
        devs,
        b: _b,
        fabric: _fabric,
    } = Net::threaded();
    let events = TokioAsyncEvents::new(a.events).unwrap();
    devs[0].set_port_active(1, false);
    let ev = timeout(PATIENCE, events.get_event())
        .await
        .expect("the port event arrived")
        .unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(ev.element, EventElement::Port(1));
    devs[0].set_port_active(1, true);
    let ev = timeout(PATIENCE, events.get_event())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortActive);
    assert_eq!(ev.element, EventElement::Port(1));
}

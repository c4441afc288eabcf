//! Channels, notify requests and asynchronous events awaited in tokio (feature `tokio`): the
//! eventfds are in tokio's reactor, so these also hold for interrupts nobody raises in process.
#![cfg(feature = "tokio")]

mod common;

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{Net, PATIENCE, poll_n, send};
use portverbs_verbs::{
    AsyncEventKind, EventElement, NotifyError, NotifyKind, SendFlags, WaitError, WorkCompletion,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
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
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));

    // The application's own AsyncFd on the channel's fd: readable, then read until an event
    // comes out.
    let raw = chan
        .as_fd()
        .expect("an eventfd")
        .try_clone_to_owned()
        .unwrap();
    // SAFETY: the AsyncFd owns `raw`, a duplicate nobody else can close or replace.
    let afd = unsafe { AsyncFd::register_with_interest(raw, Interest::READABLE) }.unwrap();
    cq_b.req_notify(false);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    let got = timeout(PATIENCE, async {
        loop {
            let mut guard = afd.readable().await.unwrap();
            match chan.get_cq_event().unwrap() {
                Some(cq) => break cq,
                None => guard.clear_ready(),
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
    let got = timeout(PATIENCE, chan.next_cq_event())
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
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));

    net.b.post_recv(&qb, 1);
    let notified = tokio::spawn(cq_b.notified(NotifyKind::Any));
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
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let cq = net.b.cq(Some(&chan));
    let cqn = cq.cqn();
    let waiting = tokio::spawn(cq.notified(NotifyKind::Any));
    let before = tokio::spawn(cq.notified(NotifyKind::Solicited));
    tokio::task::yield_now().await;
    cq.destroy().expect("the futures hold no CQ");
    for fut in [waiting, before] {
        let r = timeout(PATIENCE, fut).await.expect("resolved").unwrap();
        assert!(
            matches!(r, Err(WaitError::Notify(NotifyError::Cancelled { cqn: n })) if n == cqn),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn solicited_notify_ignores_unsolicited_receives() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));
    net.b.post_recv(&qb, 1);
    net.b.post_recv(&qb, 2);

    let mut notified = pin!(cq_b.notified(NotifyKind::Solicited));
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
    chan.process().unwrap();
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
    let portverbs_test_support::verbs_net::Net {
        a,
        devs,
        b: _b,
        fabric: _fabric,
    } = Net::threaded().into_inner();
    devs[0].set_port_active(1, false);
    let ev = timeout(PATIENCE, a.ctx.next_async_event())
        .await
        .expect("the port event arrived")
        .unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(ev.element, EventElement::Port(1));
    devs[0].set_port_active(1, true);
    let ev = timeout(PATIENCE, a.ctx.next_async_event())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortActive);
    assert_eq!(ev.element, EventElement::Port(1));
}

/// The kernel signals an eventfd routed to an MSI-X vector without any code of ours running:
/// tasks awaiting the sink must be woken by tokio's reactor, every one of them.
#[tokio::test]
async fn a_signal_nobody_raised_in_process_wakes_every_awaiting_task() {
    use portverbs_hal::notify::InterruptSink;
    use portverbs_linux::{EventFd, EventFdSink};
    use std::sync::Arc;

    let fd = Arc::new(EventFd::new().unwrap());
    let sink = Arc::new(EventFdSink::new(fd.clone()));
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let sink = sink.clone();
            tokio::spawn(async move { poll_fn(|cx| sink.poll_raised(cx)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "nothing signalled yet"
    );
    fd.signal().unwrap(); // what the kernel's interrupt handler does
    for w in waiters {
        timeout(PATIENCE, w)
            .await
            .expect("woken by the reactor")
            .unwrap()
            .unwrap();
    }
}

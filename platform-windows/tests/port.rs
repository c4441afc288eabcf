//! A device associated with a completion port under one key; notify
//! requests and async operations complete to it with the caller's OVERLAPPED; the statuses
//! map to typed errors. Several CQs, one thread, many outstanding requests. Stepped fabric:
//! no thread exists besides the test's.
//!
//! Wine 8 deviation avoided (Microsoft Learn, "I/O Completion Ports"): the port is created
//! with concurrency 0, and nothing here depends on how many waiters a packet releases — one
//! thread dequeues everything — because Wine ignores the concurrency value.
#![cfg(windows)]

mod common;

use common::{KEY, Net, collect, drain, send, which};
use portverbs_verbs::{CqError, CqInit, NotifyKind, SendFlags, WorkCompletion};
use portverbs_windows::{Overlapped, RequestError, status};

#[test]
fn many_requests_on_several_cqs_complete_to_one_port_on_one_thread() {
    let net = Net::stepped(1);
    let port = net.port_for_b();
    let (cq1, cq2) = (net.b.cq(None), net.b.cq(None));
    let (qa1, qb1) = net.pair(&cq1);
    let (qa2, qb2) = net.pair(&cq2);
    let ovs: Vec<Overlapped> = (0..5).map(|_| Overlapped::new()).collect();
    let w = &net.b.platform;
    // Two "any" requests on cq1 (both complete at its next event), a solicited and an
    // errors-only one on cq2, and one more "any" on cq2 made after the solicited one.
    w.notify(&cq1, NotifyKind::Any, &ovs[0]).unwrap();
    w.notify(&cq1, NotifyKind::Any, &ovs[1]).unwrap();
    w.notify(&cq2, NotifyKind::Solicited, &ovs[2]).unwrap();
    w.notify(&cq2, NotifyKind::Errors, &ovs[3]).unwrap();
    assert_eq!(w.in_flight(), 4);
    assert!(matches!(
        w.notify(&cq1, NotifyKind::Any, &ovs[0]),
        Err(RequestError::InFlight)
    ));
    assert!(
        drain(&port, w).is_empty(),
        "nothing completes before an event"
    );

    net.b.post_recv(&qb1, 1);
    net.b.post_recv(&qb2, 2);
    send(&qa1, 10, SendFlags::empty());
    send(&qa2, 20, SendFlags::SOLICITED);
    net.settle();
    let got = collect(&port, w, 3);
    assert!(
        got.iter().all(|p| p.key == KEY),
        "one key per device: {got:?}"
    );
    let refs: Vec<&Overlapped> = ovs.iter().collect();
    assert_eq!(which(&got, &refs), [0, 1, 2]);
    for ov in &ovs[..3] {
        assert_eq!(ov.raw_status(), status::SUCCESS);
        assert_eq!(ov.result().unwrap().unwrap(), 0);
        assert_eq!(ov.get_overlapped_result(false).unwrap(), 0);
    }
    assert!(ovs[3].is_pending(), "errors-only waits on");
    assert!(matches!(
        ovs[3].get_overlapped_result(false),
        Err(RequestError::Incomplete)
    ));
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq1.poll(&mut wc).unwrap(), 1);
    assert_eq!(cq2.poll(&mut wc).unwrap(), 1);

    // Re-arm; an unsolicited receive on cq2 leaves a solicited request alone.
    w.notify(&cq2, NotifyKind::Solicited, &ovs[4]).unwrap();
    net.b.post_recv(&qb2, 3);
    send(&qa2, 21, SendFlags::empty());
    net.settle();
    assert!(drain(&port, w).is_empty(), "not solicited");
    assert_eq!(cq2.poll(&mut wc).unwrap(), 1);

    // Destroying cq2 completes both of its requests as cancelled.
    drop((qb2, qa2));
    cq2.destroy().unwrap();
    let got = collect(&port, w, 2);
    assert_eq!(which(&got, &refs), [3, 4]);
    for ov in &ovs[3..] {
        assert_eq!(ov.raw_status(), status::CANCELLED);
        assert!(matches!(ov.result(), Some(Err(RequestError::Cancelled))));
        assert!(matches!(
            ov.get_overlapped_result(false),
            Err(RequestError::Cancelled)
        ));
    }
    assert_eq!(w.in_flight(), 0);
    drop((qa1, qb1));
}

#[test]
fn a_device_has_one_association() {
    let net = Net::stepped(2);
    let _port = net.port_for_b();
    let other = std::sync::Arc::new(portverbs_windows::CompletionPort::new().unwrap());
    assert!(matches!(
        net.b.platform.associate(other, KEY + 1),
        Err(RequestError::AlreadyAssociated)
    ));
    assert_eq!(net.b.platform.key(), Some(KEY));
}

#[test]
fn async_verbs_complete_to_the_port_with_their_typed_result() {
    let net = Net::stepped(3);
    let port = net.port_for_b();
    let w = &net.b.platform;
    let (ok_ov, bad_ov) = (Overlapped::new(), Overlapped::new());
    let ctx = w.context().clone();
    let pd = w
        .start(&ok_ov, async move { ctx.alloc_pd().await })
        .unwrap();
    let ctx = w.context().clone();
    let bad = w
        .start(&bad_ov, async move {
            ctx.create_cq(CqInit {
                entries: 0,
                ..CqInit::default()
            })
            .await
            .map(drop)
        })
        .unwrap();
    let got = collect(&port, w, 2);
    assert_eq!(which(&got, &[&ok_ov, &bad_ov]), [0, 1]);
    assert!(pd.take().unwrap().is_ok(), "the PD is handed over");
    assert!(pd.take().is_none(), "once");
    assert_eq!(bad_ov.raw_status(), status::UNSUCCESSFUL);
    assert!(matches!(bad_ov.result(), Some(Err(RequestError::Failed))));
    assert!(matches!(
        bad.take(),
        Some(Err(CqError::BadSize { requested: 0, .. }))
    ));
}

/// A future that is pending until another thread (standing in for a device command that
/// finishes later) wakes it.
fn later(value: u32) -> impl std::future::Future<Output = Result<u32, std::io::Error>> + Send {
    let mut started = false;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::future::poll_fn(move |cx| {
        if done.load(std::sync::atomic::Ordering::Acquire) {
            return std::task::Poll::Ready(Ok(value));
        }
        if !started {
            started = true;
            let (waker, done) = (cx.waker().clone(), done.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                done.store(true, std::sync::atomic::Ordering::Release);
                waker.wake();
            });
        }
        std::task::Poll::Pending
    })
}

#[test]
fn a_pending_operation_is_polled_again_when_its_waker_rings_the_doorbell() {
    let net = Net::stepped(4);
    let port = net.port_for_b();
    let w = &net.b.platform;
    let (ov, cancelled) = (Overlapped::new(), Overlapped::new());
    let op = w.start(&ov, later(5)).unwrap();
    let gone = w.start(&cancelled, later(6)).unwrap();
    assert_eq!(w.in_flight(), 2);
    assert!(ov.is_pending());
    w.cancel(&cancelled).unwrap();
    let got = collect(&port, w, 2);
    assert_eq!(which(&got, &[&ov, &cancelled]), [0, 1]);
    assert_eq!(op.take().unwrap().unwrap(), 5);
    assert!(matches!(
        cancelled.result(),
        Some(Err(RequestError::Cancelled))
    ));
    assert!(gone.take().is_none(), "a cancelled operation has no result");
    assert_eq!(w.in_flight(), 0);
}

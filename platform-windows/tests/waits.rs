//! The other Windows ways to wait — an OVERLAPPED with an event (and
//! `GetOverlappedResult`), the low-bit event that never reaches the port, an APC to the
//! requesting thread — and cancellation, CQ destruction and device removal, each completing
//! a request exactly once with a typed status.
//!
//! Wine 8 deviation avoided: an event is never turned into a port packet by
//! `NtAssociateWaitCompletionPacket`, which Wine 8 lacks; the device's doorbell (an event and a
//! posted packet) does that job, and the event-only and APC tests wait on that event.
#![cfg(windows)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Net, PATIENCE, collect, drain, send, which};
use portverbs_verbs::{NotifyKind, SendFlags};
use portverbs_windows::{Event, Overlapped, RequestError, WaitOutcome, sleep_alertable, status};

#[test]
fn an_event_request_wakes_a_thread_in_get_overlapped_result() {
    let net = Net::stepped(11);
    let port = net.port_for_b();
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    let ov = Overlapped::with_event(Arc::new(Event::new().unwrap()));
    net.b.platform.notify(&cq, NotifyKind::Any, &ov).unwrap();
    // Another thread of the application blocks in Win32 GetOverlappedResult(.., TRUE); this
    // one runs the port loop.
    let waiter = {
        let ov = ov.clone();
        std::thread::spawn(move || ov.get_overlapped_result(true))
    };
    net.b.post_recv(&qb, 1);
    send(&qa, 1, SendFlags::empty());
    net.settle();
    let got = collect(&port, &net.b.platform, 1);
    assert_eq!(
        which(&got, &[&ov]),
        [0],
        "an event without the low bit: packet too"
    );
    assert_eq!(waiter.join().unwrap().unwrap(), 0);
    assert!(ov.event().unwrap().is_set().unwrap());
}

#[test]
fn a_low_bit_event_is_signalled_and_never_reaches_the_port() {
    let net = Net::stepped(12);
    let port = net.port_for_b();
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    let ev = Arc::new(Event::new().unwrap());
    let ov = Overlapped::event_only(ev.clone());
    assert!(ov.is_event_only());
    net.b.platform.notify(&cq, NotifyKind::Any, &ov).unwrap();
    net.b.post_recv(&qb, 1);
    send(&qa, 1, SendFlags::empty());
    net.settle();
    // Driven by the doorbell event, as a program that waits on events does.
    assert_eq!(net.b.platform.wait_for(&ov, Some(PATIENCE)).unwrap(), 0);
    assert_eq!(
        ev.wait(Some(Duration::ZERO)).unwrap(),
        WaitOutcome::Signalled
    );
    // The port saw the doorbell only.
    assert!(drain(&port, &net.b.platform).is_empty());
    assert_eq!(ov.raw_status(), status::SUCCESS);
}

#[test]
fn an_apc_runs_on_the_requesting_thread_at_its_alertable_wait() {
    let net = Net::stepped(13);
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    let ov = Overlapped::new();
    let seen = Arc::new(Mutex::new(None));
    {
        let seen = seen.clone();
        net.b
            .platform
            .notify_apc(&cq, NotifyKind::Any, &ov, move |r| {
                *seen.lock().unwrap() = Some((std::thread::current().id(), r.is_ok()));
            })
            .unwrap();
    }
    net.b.post_recv(&qb, 1);
    send(&qa, 1, SendFlags::empty());
    net.settle();
    net.b.platform.progress().unwrap();
    assert_eq!(
        ov.raw_status(),
        status::SUCCESS,
        "completed by the progress call"
    );
    assert!(seen.lock().unwrap().is_none(), "no alertable wait yet");
    assert!(sleep_alertable(Some(PATIENCE)), "the APC ended the sleep");
    assert_eq!(
        *seen.lock().unwrap(),
        Some((std::thread::current().id(), true))
    );
}

#[test]
fn an_alertable_wait_on_the_doorbell_runs_the_apc() {
    let net = Net::stepped(14);
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    let ov = Overlapped::new();
    let ran = Arc::new(Mutex::new(false));
    {
        let ran = ran.clone();
        net.b
            .platform
            .notify_apc(&cq, NotifyKind::Any, &ov, move |r| {
                *ran.lock().unwrap() = r.is_ok();
            })
            .unwrap();
    }
    net.b.post_recv(&qb, 1);
    send(&qa, 1, SendFlags::empty());
    net.settle();
    let mut outcomes = Vec::new();
    while !*ran.lock().unwrap() {
        outcomes.push(net.b.platform.wait(Some(PATIENCE), true).unwrap());
        assert!(outcomes.len() < 10, "{outcomes:?}");
    }
    assert_eq!(outcomes.last(), Some(&WaitOutcome::Alerted), "{outcomes:?}");
}

#[test]
fn cancel_completes_once_as_cancelled() {
    let net = Net::stepped(15);
    let port = net.port_for_b();
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    let ov = Overlapped::new();
    let w = &net.b.platform;
    w.notify(&cq, NotifyKind::Any, &ov).unwrap();
    w.cancel(&ov).unwrap();
    let got = collect(&port, w, 1);
    assert_eq!(which(&got, &[&ov]), [0]);
    assert!(matches!(ov.result(), Some(Err(RequestError::Cancelled))));
    assert!(matches!(
        ov.get_overlapped_result(false),
        Err(RequestError::Cancelled)
    ));
    assert!(matches!(w.cancel(&ov), Err(RequestError::NotFound)));
    // The CQ's event comes later and completes nothing a second time.
    net.b.post_recv(&qb, 1);
    send(&qa, 1, SendFlags::empty());
    net.settle();
    assert!(drain(&port, w).is_empty());
    assert_eq!(ov.raw_status(), status::CANCELLED);
}

#[test]
fn a_device_failure_completes_every_request_with_an_error() {
    let net = Net::stepped(16);
    let port = net.port_for_b();
    let (cq1, cq2) = (net.b.cq(None), net.b.cq(None));
    let ovs: Vec<Overlapped> = (0..3).map(|_| Overlapped::new()).collect();
    let w = &net.b.platform;
    w.notify(&cq1, NotifyKind::Any, &ovs[0]).unwrap();
    w.notify(&cq1, NotifyKind::Errors, &ovs[1]).unwrap();
    w.notify(&cq2, NotifyKind::Solicited, &ovs[2]).unwrap();
    net.devs[1].inject_fatal();
    net.settle();
    let got = collect(&port, w, 3);
    let refs: Vec<&Overlapped> = ovs.iter().collect();
    assert_eq!(which(&got, &refs), [0, 1, 2]);
    for ov in &ovs {
        assert_eq!(ov.raw_status(), status::DEVICE_REMOVED);
        assert!(matches!(
            ov.get_overlapped_result(false),
            Err(RequestError::DeviceRemoved)
        ));
    }
}

#[test]
fn removing_the_device_completes_what_is_in_flight_and_refuses_the_rest() {
    let net = Net::stepped(17);
    let port = net.port_for_b();
    let cq = net.b.cq(None);
    let (ev_ov, port_ov) = (
        Overlapped::with_event(Arc::new(Event::new().unwrap())),
        Overlapped::new(),
    );
    let w = &net.b.platform;
    w.notify(&cq, NotifyKind::Any, &ev_ov).unwrap();
    w.notify(&cq, NotifyKind::Errors, &port_ov).unwrap();
    w.remove_device();
    assert!(ev_ov.event().unwrap().is_set().unwrap());
    let got = collect(&port, w, 2);
    assert_eq!(which(&got, &[&ev_ov, &port_ov]), [0, 1]);
    assert!(matches!(
        ev_ov.result(),
        Some(Err(RequestError::DeviceRemoved))
    ));
    let later = Overlapped::new();
    assert!(matches!(
        w.notify(&cq, NotifyKind::Any, &later),
        Err(RequestError::DeviceRemoved)
    ));
    assert!(!later.is_pending(), "refused, never submitted");
    assert!(drain(&port, w).is_empty(), "and never announced");
}

#[test]
fn closing_the_device_cancels_its_requests() {
    let net = Net::stepped(18);
    let cq = net.b.cq(None);
    let ev = Arc::new(Event::new().unwrap());
    let ov = Overlapped::with_event(ev.clone());
    net.b.platform.notify(&cq, NotifyKind::Any, &ov).unwrap();
    let portverbs_test_support::verbs_net::Net { b, .. } = net.into_inner();
    drop(b);
    assert_eq!(ev.wait(Some(PATIENCE)).unwrap(), WaitOutcome::Signalled);
    assert!(matches!(ov.result(), Some(Err(RequestError::Cancelled))));
}

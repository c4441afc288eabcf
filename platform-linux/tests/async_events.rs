//! Asynchronous events through the context's eventfd.

mod common;

use std::time::Duration;

use common::{Net, PATIENCE, epoll_on, epoll_ready};
use portverbs_verbs::{AsyncEventKind, EventElement, WaitError};

#[test]
fn port_down_is_readable_through_the_fd() {
    let net = Net::threaded();
    let ctx = &net.a.ctx;
    let ep = epoll_on(ctx.async_fd().expect("an eventfd"), false);
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0);
    assert!(ctx.get_async_event().unwrap().is_none());

    net.devs[0].set_port_active(1, false);
    assert_eq!(
        epoll_ready(&ep, PATIENCE),
        1,
        "the event made the fd readable"
    );
    let ev = ctx.get_async_event().unwrap().expect("an event");
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(ev.element, EventElement::Port(1));
    assert!(ctx.get_async_event().unwrap().is_none());
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0, "quiet once read");
    assert!(
        net.b.ctx.get_async_event().unwrap().is_none(),
        "the other device saw nothing"
    );
}

/// Two events queued before the application looks, read one per edge-triggered wakeup.
#[test]
fn edge_triggered_reader_gets_every_event() {
    let net = Net::stepped(5);
    let ctx = &net.a.ctx;
    let ep = epoll_on(ctx.async_fd().expect("an eventfd"), true);
    net.devs[0].set_port_active(1, false);
    net.devs[0].set_port_active(1, true);

    assert_eq!(epoll_ready(&ep, Duration::ZERO), 1);
    assert_eq!(
        ctx.get_async_event().unwrap().unwrap().kind,
        AsyncEventKind::PortErr
    );
    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        1,
        "a new edge: an event is left"
    );
    assert_eq!(
        ctx.get_async_event().unwrap().unwrap().kind,
        AsyncEventKind::PortActive
    );
    assert!(ctx.get_async_event().unwrap().is_none());
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0);
}

#[test]
fn blocking_wait_for_an_event() {
    let net = Net::threaded();
    let r = net.a.ctx.wait_async_event(Some(Duration::from_millis(20)));
    assert!(matches!(r, Err(WaitError::TimedOut)), "{r:?}");
    std::thread::scope(|s| {
        s.spawn(|| net.devs[0].set_port_active(1, false));
        let ev = net.a.ctx.wait_async_event(Some(PATIENCE)).unwrap();
        assert_eq!(ev.kind, AsyncEventKind::PortErr);
    });
}

//! Asynchronous events through the context's eventfd.

mod common;

use std::io;
use std::time::Duration;

use common::{Net, PATIENCE, epoll_on, epoll_ready, is_would_block};
use portverbs_verbs::{AsyncEventKind, EventElement};

#[test]
fn port_down_is_readable_through_the_fd() {
    let net = Net::threaded();
    let events = &net.a.events;
    let ep = epoll_on(events, false);
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0);
    assert!(is_would_block(events.get_event()));

    net.devs[0].set_port_active(1, false);
    assert_eq!(
        epoll_ready(&ep, PATIENCE),
        1,
        "the event made the fd readable"
    );
    let ev = events.get_event().unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(ev.element, EventElement::Port(1));
    assert!(is_would_block(events.get_event()));
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0, "quiet once read");
    assert!(
        is_would_block(net.b.events.get_event()),
        "the other device saw nothing"
    );
}

/// Two events queued before the application looks, read one per edge-triggered wakeup.
#[test]
fn edge_triggered_reader_gets_every_event() {
    let net = Net::stepped(5);
    let events = &net.a.events;
    let ep = epoll_on(events, true);
    net.devs[0].set_port_active(1, false);
    net.devs[0].set_port_active(1, true);

    assert_eq!(epoll_ready(&ep, Duration::ZERO), 1);
    assert_eq!(events.get_event().unwrap().kind, AsyncEventKind::PortErr);
    assert_eq!(
        epoll_ready(&ep, Duration::ZERO),
        1,
        "a new edge: an event is left"
    );
    assert_eq!(events.get_event().unwrap().kind, AsyncEventKind::PortActive);
    assert!(is_would_block(events.get_event()));
    assert_eq!(epoll_ready(&ep, Duration::ZERO), 0);
}

#[test]
fn blocking_wait_for_an_event() {
    let net = Net::threaded();
    let err = net
        .a
        .events
        .wait(Some(Duration::from_millis(20)))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    std::thread::scope(|s| {
        s.spawn(|| net.devs[0].set_port_active(1, false));
        let ev = net.a.events.wait(Some(PATIENCE)).unwrap();
        assert_eq!(ev.kind, AsyncEventKind::PortErr);
    });
}

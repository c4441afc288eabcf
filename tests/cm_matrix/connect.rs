//! Connect, accept, reject and disconnect: data over the connected QPs, private data both
//! ways, the refusals a passive side makes (nobody listening, a request dropped, the family and
//! backlog checks), 200 connections on one listener, and a server that makes no calls.

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{ConnParam, Connector, Listener, ServiceError};
use portverbs::cm::wire::RejReason;
use portverbs::prelude::*;

use crate::cm_util::pair::{Backend, Pair};
use crate::cm_util::{self, Driver, T, ctx_of, param, reject_with_data, settle, side};

fn connect_send_disconnect(backend: Backend) {
    let p = Pair::new(backend);
    assert!(p.a.local_gid().is_ipv4_mapped());
    cm_util::connect_send_disconnect(&p.a, &p.b, 7471);
}

fn reject_carries_private_data(backend: Backend) {
    let p = Pair::new(backend);
    reject_with_data(&p.a, &p.b, 7472);
}

fn nobody_listening_is_invalid_service_id(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    // Nothing on b calls or waits: its device's progress thread runs its CM, which answers.
    assert!(b.served_by_device());
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(SocketAddr::new(b.local_ip(), 9))
        .unwrap();
    match conn.connect_blocking(&s.qp, &ConnParam::default()) {
        Err(ServiceError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejReason::InvalidServiceId)
        }
        other => panic!("{other:?}"),
    }
    drop(conn);
    settle(&[a, b]);
}

fn a_request_dropped_unanswered_is_rejected(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7473);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = thread::spawn(move || {
        drop(listener.get_request_blocking(T).unwrap());
        drop(listener);
    });
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let r = conn.connect_blocking(&s.qp, &ConnParam::default());
    assert!(
        matches!(
            r,
            Err(ServiceError::Rejected {
                reason: RejReason::ConsumerReject,
                ..
            })
        ),
        "{r:?}"
    );
    passive.join().unwrap();
    drop(conn);
    settle(&[a, b]);
}

/// 200 connections on one listener, made by eight threads at once.
fn two_hundred_connections_on_one_listener(backend: Backend) {
    const N: usize = 200;
    const THREADS: usize = 8;
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let before = [a.stats(), b.stats()];
    let dst = SocketAddr::new(b.local_ip(), 7475);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(N).unwrap();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let ctx = ctx_of(&b);
            let cq = ctx
                .create_cq_blocking(CqInit {
                    entries: 1024,
                    ..CqInit::default()
                })
                .unwrap();
            let mut held = Vec::new();
            for _ in 0..N {
                let s = side(&ctx, Some(&cq));
                let req = listener.get_request_blocking(T).unwrap();
                let n = req.private_data()[0];
                let conn = req.accept_blocking(&s.qp, &param(&[n])).unwrap();
                held.push((conn, s));
            }
            (held, listener)
        })
    };
    let actives: Vec<_> = (0..THREADS)
        .map(|t| {
            let a = a.clone();
            thread::spawn(move || {
                let ctx = ctx_of(&a);
                let mut held = Vec::new();
                for i in (t..N).step_by(THREADS) {
                    let s = side(&ctx, None);
                    let mut conn = Connector::new(&a).unwrap();
                    conn.resolve_blocking(dst).unwrap();
                    let tag = i as u8;
                    let rep = conn.connect_blocking(&s.qp, &param(&[tag])).unwrap();
                    assert_eq!(rep[0], tag);
                    held.push((conn, s));
                }
                held
            })
        })
        .collect();
    let mut active = Vec::new();
    for t in actives {
        active.extend(t.join().unwrap());
    }
    let (passive, listener) = passive.join().unwrap();
    assert_eq!((active.len(), passive.len()), (N, N));
    // Every MAD went out and came in without an error completion, and none was lost: no
    // retransmission and no duplicate. (Until the soft device copied a UD payload when the
    // packet left, a QP1 send slot reused after its completion but before the fabric
    // delivered the packet sent the next MAD's bytes in its place; in about one run in
    // fifteen a REQ or an RTU vanished that way and was recovered by the ~4 s retransmission.)
    for (d, was) in [a, b].into_iter().zip(before) {
        let now = d.stats();
        assert_eq!(
            (
                now.retransmits - was.retransmits,
                now.duplicates - was.duplicates,
                now.malformed - was.malformed,
                now.unmatched - was.unmatched
            ),
            (0, 0, 0, 0),
            "{now:?}"
        );
    }
    for d in [a, b] {
        let c = d.mad_counts();
        assert_eq!((c.recv_errors, c.send_errors), (0, 0), "{c:?}");
        // REQ + RTU one way, REP the other: 3 MADs per connection at least.
        assert!(c.sent + c.received >= 3 * N as u64, "{c:?}");
    }
    eprintln!(
        "200 connections on {backend:?}: a {:?} {:?}, b {:?} {:?}",
        a.stats(),
        a.mad_counts(),
        b.stats(),
        b.mad_counts()
    );
    assert_eq!(a.associated_qps(), N);
    assert_eq!(b.associated_qps(), N);
    assert!(active.iter().all(|(_, s)| s.qp.state() == QpState::Rts));
    assert!(passive.iter().all(|(_, s)| s.qp.state() == QpState::Rts));
    drop(active);
    drop(passive);
    drop(listener);
    settle(&[a, b]);
}

/// The passive side's checks (Linux `cma.c`'s) refuse with REJ 28 and no private data: a request
/// of the other IP family than the listener's bound address, and one beyond the backlog.
fn passive_checks_reject_with_reason_28(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let _driver = Driver::start(b);
    let connect = |port: u16| {
        let s = side(&ctx_of(a), None);
        let mut conn = Connector::new(a).unwrap();
        conn.resolve_blocking(SocketAddr::new(b.local_ip(), port))
            .unwrap();
        let r = conn.connect_blocking(&s.qp, &param(b"x"));
        (r, conn, s)
    };
    // Bound to the unspecified address of the other family than the device's.
    let other = if b.local_ip().is_ipv4() {
        IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED)
    };
    let mut wrong_family = Listener::bind(b, SocketAddr::new(other, 7476)).unwrap();
    wrong_family.listen(4).unwrap();
    let (r, ..) = connect(7476);
    match r {
        Err(ServiceError::Rejected {
            reason,
            private_data,
        }) => {
            assert_eq!(reason, RejReason::ConsumerReject);
            assert!(private_data.iter().all(|&b| b == 0), "{private_data:?}");
        }
        other => panic!("{other:?}"),
    }
    drop(wrong_family);
    // Backlog 1: the first request waits in the queue (its connect is still pending, so it
    // runs on a thread), the second is refused.
    let mut small = Listener::bind(b, SocketAddr::new(b.local_ip(), 7477)).unwrap();
    small.listen(1).unwrap();
    thread::scope(|scope| {
        let first = scope.spawn(|| connect(7477).0.map(|_| ()));
        let deadline = Instant::now() + Duration::from_secs(20);
        // The driver thread drives b; wait until the first request is queued.
        while b.live_endpoints() < 2 {
            assert!(Instant::now() < deadline);
            thread::sleep(Duration::from_millis(1));
        }
        let (second, ..) = connect(7477);
        assert!(
            matches!(
                second,
                Err(ServiceError::Rejected {
                    reason: RejReason::ConsumerReject,
                    ..
                })
            ),
            "{second:?}"
        );
        let req = small.get_request_blocking(T).unwrap();
        req.reject(b"later").unwrap();
        assert!(matches!(
            first.join().unwrap(),
            Err(ServiceError::Rejected { .. })
        ));
    });
    drop(small);
    settle(&[a, b]);
}

/// Auto progress: a server busy for 5 s, making no call, still rejects a REQ to a port
/// nobody listens on (reason 8) at once and keeps a waiting client from giving up, and the
/// client connects and disconnects with no delay beyond one retransmission (see
/// [`cm_util::busy_server`]): its device (the soft device's, the mlx4 driver's, the UDP
/// port's progress thread) answers for it.
fn a_server_making_no_calls_is_answered_for_by_its_device(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    assert!(a.served_by_device() && b.served_by_device());
    cm_util::busy_server(a, b, 7480, Duration::from_secs(5), cm_util::no_calls);
}

cm_cases!(
    connect_send_disconnect,
    reject_carries_private_data,
    nobody_listening_is_invalid_service_id,
    a_request_dropped_unanswered_is_rejected,
    two_hundred_connections_on_one_listener,
    passive_checks_reject_with_reason_28,
    a_server_making_no_calls_is_answered_for_by_its_device,
);

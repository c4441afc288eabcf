//! Endpoints and QPs that go away mid-connection, the async API, and a device that fails
//! under established connections.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{ConnParam, Connector, Listener, RdmaCmEvent, ServiceError};
use portverbs::prelude::*;

use crate::cm_util::pair::{Backend, Pair};
use crate::cm_util::{T, ctx_of, param, req_out, settle, side};

/// The active side gives up while its REQ is out (its connect future dropped, then the
/// endpoint): the passive accept sees REJECTED, both QPs end in ERR, nothing leaks.
fn active_destroyed_during_establishment(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7474);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let (s, conn) = req_out(a, dst);
    let req = listener.get_request_blocking(T).unwrap();
    drop(conn);
    // The move to ERR is a device command, which the device's progress thread may be
    // completing: dropping the endpoint starts it and does not wait.
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.qp.state() != QpState::Err {
        assert!(
            Instant::now() < deadline,
            "the QP stayed {:?}",
            s.qp.state()
        );
        a.progress().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let t = side(&ctx_of(b), None);
    let r = req.accept_blocking(&t.qp, &ConnParam::default());
    assert!(matches!(r, Err(ServiceError::Rejected { .. })), "{r:?}");
    assert_eq!(t.qp.state(), QpState::Err);
    drop(listener);
    settle(&[a, b]);
}

/// The async API on one thread: both sides' tasks on a current-thread runtime, each
/// awaiting its own device's QP1 notifications. (The devices are the test's own: with the
/// facade's `tokio` feature, a context's sinks belong to the runtime that first awaits them.)
fn async_connect_accept_disconnect(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7478);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let (sa, sb) = (side(&ctx_of(a), None), side(&ctx_of(b), None));
    // enable_all: with the facade's `tokio` feature the platform's sinks live in the reactor.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let passive = async {
        let req = listener.get_request().await.unwrap();
        assert_eq!(&req.private_data()[..2], b"hi");
        let conn = req.accept(&sb.qp, &param(b"yo")).await.unwrap();
        conn.notify_disconnect().await.unwrap();
        conn.disconnect_async(&sb.qp).await.unwrap();
        conn
    };
    let active = async {
        let mut conn = Connector::new(a).unwrap();
        conn.resolve(dst).await.unwrap();
        let rep = conn.connect(&sa.qp, &param(b"hi")).await.unwrap();
        assert_eq!(&rep[..2], b"yo");
        conn.disconnect_async(&sa.qp).await.unwrap();
        conn.notify_disconnect().await.unwrap();
        conn
    };
    let (pc, ac) = rt.block_on(async { tokio::join!(passive, active) });
    assert_eq!((sa.qp.state(), sb.qp.state()), (QpState::Err, QpState::Err));
    drop((pc, ac, listener));
    settle(&[a, b]);
}

/// Destroying a QP aborts its connection: the CM holds no strong
/// handle, so `Qp::destroy` succeeds; during setup the peer's accept sees REJECTED and the
/// endpoint CONNECT_ERROR; once connected the peer sees DISCONNECTED. Nothing leaks.
fn destroying_the_qp_aborts_the_connection(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7479);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();

    // During setup: REQ out, then the active QP is destroyed.
    let (s, conn) = req_out(a, dst);
    let req = listener.get_request_blocking(T).unwrap();
    s.qp.destroy().unwrap();
    a.progress().unwrap();
    assert_eq!(a.associated_qps(), 0);
    let mut saw_error = false;
    while let Ok(ev) = conn.next_event_blocking(Some(Duration::ZERO)) {
        saw_error |= matches!(ev, RdmaCmEvent::ConnectError { .. });
    }
    assert!(saw_error);
    let t = side(&ctx_of(b), None);
    let r = req.accept_blocking(&t.qp, &ConnParam::default());
    assert!(matches!(r, Err(ServiceError::Rejected { .. })), "{r:?}");
    drop(conn);

    // Connected: the passive QP is destroyed.
    let b2 = b.clone();
    let passive = thread::spawn(move || {
        let b = &b2;
        let s = side(&ctx_of(b), None);
        let req = listener.get_request_blocking(T).unwrap();
        let conn = req.accept_blocking(&s.qp, &ConnParam::default()).unwrap();
        s.qp.destroy().unwrap();
        assert_eq!(
            conn.next_event_blocking(T).unwrap(),
            RdmaCmEvent::Disconnected
        );
        drop(conn);
        drop(listener);
    });
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, &ConnParam::default()).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    conn.disconnect(&s.qp).unwrap();
    assert_eq!(s.qp.state(), QpState::Err);
    passive.join().unwrap();
    drop(conn);
    settle(&[a, b]);
}

/// A device failing under established connections: QP1 is flushed, every endpoint gets
/// DEVICE_REMOVAL, and waits return instead of hanging.
fn device_removal_reaches_every_endpoint(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7480);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            let req = listener.get_request_blocking(T).unwrap();
            let conn = req.accept_blocking(&s.qp, &ConnParam::default()).unwrap();
            (conn, s, listener)
        })
    };
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, &ConnParam::default()).unwrap();
    let held = passive.join().unwrap();
    while conn.next_event_blocking(Some(Duration::ZERO)).is_ok() {}
    p.inject_fatal(0);
    assert_eq!(
        conn.next_event_blocking(T).unwrap(),
        RdmaCmEvent::DeviceRemoval
    );
    assert!(matches!(
        conn.notify_disconnect_blocking(T),
        Err(ServiceError::Closed)
    ));
    drop(held);
}

cm_cases!(
    active_destroyed_during_establishment,
    async_connect_accept_disconnect,
    destroying_the_qp_aborts_the_connection,
    device_removal_reaches_every_endpoint,
);

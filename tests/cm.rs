//! The connection manager for applications: rdma_cm-style connect,
//! accept, reject and disconnect between two devices' QP1s, on the in-process fabric
//! (soft0 ↔ soft1) and between two UDP-bound devices (real sockets on loopback), with data
//! over the connected QPs, flushes on disconnect, endpoints destroyed mid-setup, and 200
//! connections on one listener.
#![cfg(target_os = "linux")]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context as TaskContext, Waker};
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, RdmaCmEvent, ServiceError};
use portverbs::cm::wire::RejReason;
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::{UdpDevice, udp_device};

mod cm_util;
use cm_util::{Dev, T, cm_dev, ctx_of, param, poll_one, post_recv, reject_with_data, settle, side};

/// soft0 and soft1 have one QP1 each for the whole process: the tests share them and take
/// turns.
fn soft() -> (MutexGuard<'static, ()>, &'static (Dev, Dev)) {
    static TURN: Mutex<()> = Mutex::new(());
    static DEVS: OnceLock<(Dev, Dev)> = OnceLock::new();
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let devs = DEVS.get_or_init(|| (cm_dev("soft0"), cm_dev("soft1")));
    (turn, devs)
}

fn udp_pair(ips: [&str; 2]) -> (UdpDevice, UdpDevice, Dev, Dev) {
    udp_pair_in(ips, portverbs::hal::Progress::Auto)
}

fn udp_pair_in(
    ips: [&str; 2],
    progress: portverbs::hal::Progress,
) -> (UdpDevice, UdpDevice, Dev, Dev) {
    let (da, a) = udp_cm("cm_udp_a", ips[0], progress);
    let (db, b) = udp_cm("cm_udp_b", ips[1], progress);
    (da, db, a, b)
}

/// A thread that drives a device's CM while it lives, as an application's calls would. The
/// devices here run their CM on their own progress thread as well; the cases hold on a device
/// without one (whose CM answers only when something calls) too.
struct Driver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Driver {
    fn start(dev: &Dev) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (dev, flag) = (dev.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                dev.progress().unwrap();
                thread::sleep(Duration::from_millis(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Connect with private data both ways, send a message, disconnect from the active side:
/// the active side's posted receive is flushed, both sides see DISCONNECTED, nothing leaks.
fn connect_send_disconnect(a: &Dev, b: &Dev, port: u16) {
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            let req = listener.get_request_blocking(T).unwrap();
            assert_eq!(req.remote_addr().ip(), a_ip_of(&req));
            assert_eq!(req.local_addr(), dst);
            assert_eq!(&req.private_data()[..5], b"hello");
            let conn = req.accept_blocking(&s.qp, &param(b"welcome")).unwrap();
            assert_eq!(s.qp.state(), QpState::Rts);
            // Posted after the CM took the QP out of RESET; the peer's send waits on RNR.
            post_recv(&s, 11);
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (11, WcStatus::Success));
            let mut got = [0u8; 4];
            s.mr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"ping");
            conn.notify_disconnect_blocking(T).unwrap();
            // The peer disconnected first: this answers its DREQ (DREP).
            conn.disconnect(&s.qp).unwrap();
            assert_eq!(s.qp.state(), QpState::Err);
            drop(conn);
            drop(listener);
        })
    };
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    assert_eq!(
        conn.next_event_blocking(T).unwrap(),
        RdmaCmEvent::AddrResolved
    );
    assert_eq!(
        conn.next_event_blocking(T).unwrap(),
        RdmaCmEvent::RouteResolved
    );
    let rep = conn.connect_blocking(&s.qp, &param(b"hello")).unwrap();
    assert_eq!(&rep[..7], b"welcome");
    assert_eq!(s.qp.state(), QpState::Rts);
    s.mr.write(0, b"ping").unwrap();
    let sge = [s.mr.sge(0, 4).unwrap()];
    s.qp.post_send(&[SendWr::new(5, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    post_recv(&s, 99);
    conn.disconnect(&s.qp).unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!((wc.wr_id, wc.status), (99, WcStatus::WrFlushErr));
    conn.notify_disconnect_blocking(T).unwrap();
    passive.join().unwrap();
    drop(conn);
    settle(&[a, b]);
}

fn a_ip_of<D: portverbs::hal::Device>(
    req: &portverbs::cm::service::ConnectionRequest<D>,
) -> IpAddr {
    req.remote_addr().ip()
}

#[test]
fn soft_connect_send_disconnect() {
    let (_turn, (a, b)) = soft();
    connect_send_disconnect(a, b, 7471);
}

#[test]
fn udp_connect_send_disconnect() {
    let (_da, _db, a, b) = udp_pair(["127.0.41.1", "127.0.41.2"]);
    assert!(a.local_gid().is_ipv4_mapped());
    connect_send_disconnect(&a, &b, 18515);
}

#[test]
fn reject_carries_private_data() {
    let (_turn, (a, b)) = soft();
    reject_with_data(a, b, 7472);
}

#[test]
fn nobody_listening_is_invalid_service_id() {
    let (_turn, (a, b)) = soft();
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

#[test]
fn a_request_dropped_unanswered_is_rejected() {
    let (_turn, (a, b)) = soft();
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

/// The active side gives up while its REQ is out (its connect future dropped, then the
/// endpoint): the passive accept sees REJECTED, both QPs end in ERR, nothing leaks.
#[test]
fn active_destroyed_during_establishment() {
    // Its own devices: with the facade's `tokio` feature, a context's sinks belong to the
    // runtime that first awaits them, and the shared soft0/soft1 outlive any one runtime.
    let (_da, _db, a, b) = udp_pair(["127.0.43.1", "127.0.43.2"]);
    let (a, b) = (&a, &b);
    let dst = SocketAddr::new(b.local_ip(), 7474);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let defaults = ConnParam::default();
    {
        let fut = conn.connect(&s.qp, &defaults);
        let mut fut = std::pin::pin!(fut);
        let mut cx = TaskContext::from_waker(Waker::noop());
        // One poll sends the REQ; nobody has answered yet.
        let first = fut.as_mut().poll(&mut cx);
        assert!(first.is_pending(), "{first:?}");
    }
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

/// 200 connections on one listener, made by eight threads at once.
#[test]
fn two_hundred_connections_on_one_listener() {
    const N: usize = 200;
    const THREADS: usize = 8;
    let (_turn, (a, b)) = soft();
    // The devices are shared with the other tests: count from here.
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
        "200 connections: a {:?} {:?}, b {:?} {:?}",
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
#[test]
fn passive_checks_reject_with_reason_28() {
    let (_turn, (a, b)) = soft();
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
    let first = thread::spawn(move || connect(7477).0.map(|_| ()));
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
    drop(small);
    settle(&[a, b]);
}

/// The async API on one thread: both sides' tasks on a current-thread runtime, each
/// awaiting its own device's QP1 notifications.
#[test]
fn async_connect_accept_disconnect() {
    // Its own devices: with the facade's `tokio` feature, a context's sinks belong to the
    // runtime that first awaits them, and the shared soft0/soft1 outlive any one runtime.
    let (_da, _db, a, b) = udp_pair(["127.0.43.3", "127.0.43.4"]);
    let (a, b) = (&a, &b);
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

/// CM timers fire in async code: the REQ of an async connect is lost on
/// the fabric; with a timer lent to the device ([`CmDevice::set_timer`]) the connect future
/// retransmits it by itself and connects, the application making no blocking call and
/// nothing else waking the task (the passive side is idle until the retransmitted REQ
/// arrives). Then the DREQ of a (non-blocking) `disconnect` is lost, and nothing the
/// application awaits waits on that device any more: the device's `run()` task, another
/// task, retransmits it on its timer. The timer is the facade's ready-made
/// [`portverbs::cm::TokioTimer`] (feature `tokio`, which CI's `--all-features` turns on).
#[cfg(feature = "tokio")]
#[test]
fn async_connect_retransmits_a_lost_req_on_its_own() {
    use portverbs::soft::{DeviceConfig, Fabric, LinkFaults, SoftDevice};
    let fabric = Fabric::threaded();
    let open = |ip: &str| {
        let ip: IpAddr = ip.parse().unwrap();
        let dev = SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip)).unwrap();
        let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).unwrap();
        CmDevice::open_blocking(&ctx, ip).unwrap()
    };
    let (a, b) = (open("10.77.0.1"), open("10.77.0.2"));
    for d in [&a, &b] {
        d.set_timer(std::sync::Arc::new(portverbs::cm::TokioTimer));
    }
    let dst = SocketAddr::new(b.local_ip(), 7479);
    let mut listener = Listener::bind(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let (sa, sb) = (side(&ctx_of(&a), None), side(&ctx_of(&b), None));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let drivers = [&a, &b].map(|d| {
        let d = d.clone();
        rt.spawn(async move { d.run().await })
    });
    let started = Instant::now();
    let accepted = std::cell::Cell::new(false);
    let passive = async {
        let req = listener.get_request().await.unwrap();
        let conn = req.accept(&sb.qp, &param(b"late")).await.unwrap();
        accepted.set(true);
        conn.notify_disconnect().await.unwrap();
        conn.disconnect_async(&sb.qp).await.unwrap();
        conn
    };
    let active = async {
        let mut conn = Connector::new(&a).unwrap();
        conn.resolve(dst).await.unwrap();
        // Everything a sends from now on is lost, until its REQ is gone.
        fabric.set_faults(LinkFaults::lossy(1.0));
        let hi = param(b"hi");
        let rep = {
            let mut connect = std::pin::pin!(conn.connect(&sa.qp, &hi));
            // One poll posts the REQ.
            let first =
                std::future::poll_fn(|cx| std::task::Poll::Ready(connect.as_mut().poll(cx))).await;
            assert!(first.is_pending(), "{first:?}");
            while fabric.stats().lost == 0 {
                tokio::task::yield_now().await;
            }
            fabric.set_faults(LinkFaults::NONE);
            connect.await.unwrap()
        };
        assert_eq!(&rep[..4], b"late");
        // The RTU must arrive first.
        while !accepted.get() {
            tokio::task::yield_now().await;
        }
        fabric.set_faults(LinkFaults::lossy(1.0));
        conn.disconnect(&sa.qp).unwrap();
        while fabric.stats().lost < 2 {
            tokio::task::yield_now().await;
        }
        fabric.set_faults(LinkFaults::NONE);
        // Nothing on this task waits on `a` any more: its driver task retransmits the DREQ.
        conn
    };
    let both = async { tokio::join!(passive, active) };
    let (pc, ac) = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), both).await })
        .expect("a lost MAD was never retransmitted");
    let took = started.elapsed();
    for d in drivers {
        d.abort();
    }
    assert_eq!(fabric.stats().lost, 2);
    assert_eq!(a.stats().retransmits, 2, "{:?}", a.stats());
    // Two retransmission intervals (about 4 s each), not the 20 s guard that would also
    // wake the task.
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!((sa.qp.state(), sb.qp.state()), (QpState::Err, QpState::Err));
    drop((pc, ac, listener));
    // TIMEWAIT ends in async code too: the devices' drivers are awaited, and only their CM
    // timers and QP1 notifications wake the task until both are empty.
    let started = Instant::now();
    rt.block_on(async {
        let (mut ra, mut rb) = (std::pin::pin!(a.run()), std::pin::pin!(b.run()));
        let idle = std::future::poll_fn(|cx| {
            for r in [ra.as_mut().poll(cx), rb.as_mut().poll(cx)] {
                if let std::task::Poll::Ready(r) = r {
                    panic!("a device's driver ended: {r:?}");
                }
            }
            if a.live_endpoints() + b.live_endpoints() == 0 {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        });
        tokio::time::timeout(Duration::from_secs(12), idle)
            .await
            .expect("TIMEWAIT never ended");
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    settle(&[&a, &b]);
}

/// Destroying a QP aborts its connection: the CM holds no strong
/// handle, so `Qp::destroy` succeeds; during setup the peer's accept sees REJECTED and the
/// endpoint CONNECT_ERROR; once connected the peer sees DISCONNECTED. Nothing leaks.
#[test]
fn destroying_the_qp_aborts_the_connection() {
    // Its own devices: with the facade's `tokio` feature, a context's sinks belong to the
    // runtime that first awaits them, and the shared soft0/soft1 outlive any one runtime.
    let (_da, _db, a, b) = udp_pair(["127.0.43.5", "127.0.43.6"]);
    let (a, b) = (&a, &b);
    let dst = SocketAddr::new(b.local_ip(), 7479);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();

    // During setup: REQ out, then the active QP is destroyed.
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let defaults = ConnParam::default();
    {
        let fut = conn.connect(&s.qp, &defaults);
        let mut fut = std::pin::pin!(fut);
        let mut cx = TaskContext::from_waker(Waker::noop());
        let first = fut.as_mut().poll(&mut cx);
        assert!(first.is_pending(), "{first:?}");
    }
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
#[test]
fn device_removal_reaches_every_endpoint() {
    let (da, _db, a, b) = udp_pair(["127.0.42.1", "127.0.42.2"]);
    let dst = SocketAddr::new(b.local_ip(), 7480);
    let mut listener = Listener::bind(&b, dst).unwrap();
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
    let s = side(&ctx_of(&a), None);
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, &ConnParam::default()).unwrap();
    let held = passive.join().unwrap();
    while conn.next_event_blocking(Some(Duration::ZERO)).is_ok() {}
    da.device().inject_fatal();
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

/// UD service resolution (SIDR, `RDMA_PS_UDP`): the active side learns the service's QPN and
/// Q_Key and sends it a datagram; a port nobody listens on is refused.
#[test]
fn sidr_resolves_a_ud_service() {
    use portverbs::cm::service::UdService;
    use portverbs::verbs::{ConnectOptions, SpecialQp};
    let (_turn, (a, b)) = soft();
    let dst = SocketAddr::new(b.local_ip(), 7481);
    let mut listener = Listener::bind_udp(b, dst).unwrap();
    listener.listen(4).unwrap();
    let qkey = 0x0123_4567;
    let ud = |ctx: &Context| {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 16,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq)).unwrap();
        qp.ready_ud_blocking(&ConnectOptions {
            qkey,
            ..ConnectOptions::default()
        })
        .unwrap();
        let mr = pd
            .reg_vec_blocking(vec![0u8; 1024], AccessFlags::LOCAL_WRITE)
            .unwrap();
        (pd, cq, qp, mr)
    };
    let (_bpd, bcq, bqp, bmr) = ud(&ctx_of(b));
    bqp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[bmr.sge(0, 512).unwrap()],
    }])
    .unwrap();
    let bqpn = bqp.qp_num();
    let passive = thread::spawn(move || {
        let req = listener.get_service_request_blocking(T).unwrap();
        req.reply(&bqp, qkey).unwrap();
        (listener, bqp)
    });
    let mut conn = Connector::new(a).unwrap();
    let svc: UdService = conn.resolve_service_blocking(dst).unwrap();
    assert_eq!((svc.qpn, svc.qkey), (bqpn, qkey));
    let (listener, _bqp) = passive.join().unwrap();

    let (apd, acq, aqp, amr) = ud(&ctx_of(a));
    // The address handle the resolution returns, as it is: hop limit 64.
    let ah = svc.create_ah_blocking(&apd).unwrap();
    assert_eq!(ah.av().hop_limit, 64);
    amr.write(0, b"datagram").unwrap();
    let sge = [amr.sge(0, 8).unwrap()];
    let dest = ah.dest(svc.qpn, svc.qkey);
    aqp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sge).ud(dest).signaled()])
        .unwrap();
    assert_eq!(poll_one(&acq).status, WcStatus::Success);
    let wc = poll_one(&bcq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 8));
    let mut got = [0u8; 8];
    bmr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    assert_ne!(SpecialQp::GSI_QPN, svc.qpn);

    // Nobody listens on this UDP port: the SIDR_REP refuses.
    let _driver = Driver::start(b);
    let mut other = Connector::new(a).unwrap();
    let r = other.resolve_service_blocking(SocketAddr::new(b.local_ip(), 9));
    assert!(matches!(r, Err(ServiceError::ServiceRejected(_))), "{r:?}");
    drop((conn, other, listener));
    settle(&[a, b]);
}

/// Auto progress: a server busy for 5 s, making no call, still rejects a REQ to a port
/// nobody listens on (reason 8) at once and keeps a waiting client from giving up, and the
/// client connects and disconnects with no delay beyond one retransmission (see
/// [`cm_util::busy_server`]).
#[test]
fn a_server_making_no_calls_is_answered_for_by_its_device() {
    let (_turn, (a, b)) = soft();
    assert!(a.served_by_device() && b.served_by_device());
    cm_util::busy_server(a, b, 7480, Duration::from_secs(5), cm_util::no_calls);
}

/// The same between two UDP-bound devices in auto progress, whose one progress thread each
/// receives from the socket and runs the CM.
#[test]
fn a_udp_server_making_no_calls_is_answered_for_by_its_progress_thread() {
    let (_da, _db, a, b) = udp_pair(["127.0.44.1", "127.0.44.2"]);
    assert!(a.served_by_device() && b.served_by_device());
    cm_util::busy_server(&a, &b, 7481, Duration::from_secs(5), cm_util::no_calls);
}

/// Manual progress: two UDP-bound devices with no thread of ours, each driven by its own
/// application thread. The server spends 5 s busy-polling its data CQ and calls nothing
/// else: that poll makes the whole device progress, its CM included, so the client is
/// rejected at once for a port nobody listens on, and connects and disconnects with no delay
/// beyond one retransmission.
#[test]
fn a_manual_server_busy_polling_its_data_cq_answers_through_that_poll() {
    let (_da, _db, a, b) = udp_pair_in(
        ["127.0.44.3", "127.0.44.4"],
        portverbs::hal::Progress::Manual,
    );
    assert!(a.served_by_device() && b.served_by_device());
    cm_util::busy_server(&a, &b, 7482, Duration::from_secs(5), cm_util::busy_polling);
}

/// A peer that never answers: a plain UDP socket on the RoCEv2 port of `ip`, counting the
/// datagrams (REQs) that reach it.
struct Silent(std::net::UdpSocket);

impl Silent {
    fn bind(ip: &str) -> Self {
        let sock = std::net::UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 4791)).unwrap();
        sock.set_nonblocking(true).unwrap();
        Self(sock)
    }

    /// The datagrams received so far (each read once).
    fn count(&self) -> usize {
        let mut buf = [0u8; 2048];
        std::iter::from_fn(|| self.0.recv(&mut buf).ok()).count()
    }
}

/// A UDP-bound device's CM in `progress` on `ip`.
fn udp_cm(name: &str, ip: &str, progress: portverbs::hal::Progress) -> (UdpDevice, Dev) {
    let ip: IpAddr = ip.parse().unwrap();
    let mut config = UdpConfig::new(ip);
    config.progress = progress;
    let dev = udp_device(name, config).unwrap();
    let ctx = portverbs::open(dev.any()).unwrap();
    let cm = CmDevice::open_blocking(&ctx, ip).unwrap();
    (dev, cm)
}

/// Short CM timers: 3 REQs, each waited for 2·256 + 1 ms.
fn short_budget() -> ConnParam {
    ConnParam {
        cm_response_timeout: 8,
        max_cm_retries: 2,
        ..ConnParam::default()
    }
}

/// An unanswered connect ends in Unreachable when its retry budget is spent — the REQ and
/// each retransmission sent, no sooner and not much later — and an application timeout
/// ends it sooner, before the first retransmission.
fn unanswered_connect_spends_its_budget(progress: portverbs::hal::Progress, ips: [&str; 3]) {
    let (_d, a) = udp_cm("cm_budget", ips[0], progress);
    let silent = Silent::bind(ips[1]);
    let s = side(&ctx_of(&a), None);
    let dst = SocketAddr::new(ips[1].parse().unwrap(), 7490);
    let param = short_budget();
    assert_eq!(param.connect_budget(), Duration::from_millis(3 * 513));
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let started = Instant::now();
    let r = conn.connect_blocking(&s.qp, &param);
    let took = started.elapsed();
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    assert_eq!(
        silent.count(),
        3,
        "the REQ and max_cm_retries retransmissions"
    );
    assert!(took >= param.connect_budget(), "gave up early: {took:?}");
    assert!(
        took < param.connect_budget() + Duration::from_secs(10),
        "{took:?}"
    );
    drop(conn);
    // The default budget (73.7 s) cut short by the application's timeout.
    let silent = Silent::bind(ips[2]);
    let s = side(&ctx_of(&a), None);
    let param = ConnParam {
        timeout: Some(Duration::from_millis(300)),
        ..ConnParam::default()
    };
    assert_eq!(
        ConnParam::default().connect_budget(),
        Duration::from_millis(73_728)
    );
    assert_eq!(param.connect_budget(), Duration::from_millis(300));
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(SocketAddr::new(ips[2].parse().unwrap(), 7490))
        .unwrap();
    let started = Instant::now();
    let r = conn.connect_blocking(&s.qp, &param);
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        silent.count(),
        1,
        "given up before the first retransmission (4.6 s)"
    );
    drop(conn);
    settle(&[&a]);
}

#[test]
fn an_unanswered_connect_spends_its_budget_in_auto_progress() {
    unanswered_connect_spends_its_budget(
        portverbs::hal::Progress::Auto,
        ["127.0.44.11", "127.0.44.12", "127.0.44.13"],
    );
}

#[test]
fn an_unanswered_connect_spends_its_budget_in_manual_progress() {
    unanswered_connect_spends_its_budget(
        portverbs::hal::Progress::Manual,
        ["127.0.44.14", "127.0.44.15", "127.0.44.16"],
    );
}

/// An application that only awaits, on a tokio runtime without a time driver and with no
/// CM timer lent: the REQ is still retransmitted and the connect still ends Unreachable when
/// the budget is spent — in auto progress the device's thread runs the CM's timers, in
/// manual the awaiting task's sink wakes it for them (a timerfd in the reactor).
fn awaited_connect_runs_its_timers(progress: portverbs::hal::Progress, ips: [&str; 2]) {
    let (_d, a) = udp_cm("cm_await", ips[0], progress);
    let silent = Silent::bind(ips[1]);
    let s = side(&ctx_of(&a), None);
    let dst = SocketAddr::new(ips[1].parse().unwrap(), 7491);
    let (tx, rx) = std::sync::mpsc::channel();
    let task = {
        let a = a.clone();
        thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .unwrap();
            let r = rt.block_on(async {
                let mut conn = Connector::new(&a).unwrap();
                conn.resolve(dst).await.unwrap();
                conn.connect(&s.qp, &short_budget()).await
            });
            tx.send(r.map(drop)).unwrap();
        })
    };
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the awaited connect never ended: its CM timers did not run");
    task.join().unwrap();
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    assert_eq!(
        silent.count(),
        3,
        "the REQ and max_cm_retries retransmissions"
    );
    settle(&[&a]);
}

#[test]
fn an_awaited_connect_runs_its_timers_without_a_cm_timer_in_auto_progress() {
    awaited_connect_runs_its_timers(
        portverbs::hal::Progress::Auto,
        ["127.0.44.17", "127.0.44.18"],
    );
}

#[test]
#[cfg_attr(
    not(feature = "tokio"),
    ignore = "needs feature tokio: a manual device's timers wake an awaiting task through a \
              timerfd in tokio's reactor (the README's test command enables every feature)"
)]
fn an_awaited_connect_runs_its_timers_without_a_cm_timer_in_manual_progress() {
    awaited_connect_runs_its_timers(
        portverbs::hal::Progress::Manual,
        ["127.0.44.19", "127.0.44.20"],
    );
}

//! The connection manager where the backend matters: two UDP-bound devices in manual
//! progress (no thread of ours; the application's own calls drive them), a connect to a plain
//! UDP socket that never answers (its retry budget, an application timeout, the timers of an
//! awaited connect), and MADs lost on a threaded in-process fabric (loss injected on the fabric)
//! that an async connect retransmits on its own. Connect, accept, reject and disconnect
//! themselves run on every backend in `cm_matrix.rs`.
#![cfg(target_os = "linux")]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use portverbs::UdpDevice;
use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, ServiceError};
use portverbs::prelude::*;

#[path = "util/cm/mod.rs"]
mod cm_util;
use cm_util::udp::{Silent, udp_cm};
use cm_util::{Dev, ctx_of, param, settle, side};

fn udp_pair_in(
    ips: [&str; 2],
    progress: portverbs::hal::Progress,
) -> (UdpDevice, UdpDevice, Dev, Dev) {
    let (da, a) = udp_cm("cm_udp_a", ips[0].parse().unwrap(), progress);
    let (db, b) = udp_cm("cm_udp_b", ips[1].parse().unwrap(), progress);
    (da, db, a, b)
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
    let (_d, a) = udp_cm("cm_budget", ips[0].parse().unwrap(), progress);
    let silent = Silent::bind(ips[1].parse().unwrap());
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
    let silent = Silent::bind(ips[2].parse().unwrap());
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
    let (_d, a) = udp_cm("cm_await", ips[0].parse().unwrap(), progress);
    let silent = Silent::bind(ips[1].parse().unwrap());
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

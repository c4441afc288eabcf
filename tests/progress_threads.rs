//! The threads each progress mode costs, counted in `/proc/self/task` (one test in this
//! binary, so that no other test's thread comes or goes meanwhile): a UDP-bound device in
//! auto progress adds exactly one thread — its progress thread, which receives, runs the
//! transport and the CM, and sends; in manual progress it adds none, over a run of CM
//! connection setup, data and teardown between two such devices in this process, each
//! driven by its own application thread.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
use portverbs::hal::Progress;
use portverbs::prelude::*;
use portverbs::udp_device;
use portverbs::udp_port::UdpConfig;

const T: Option<Duration> = Some(Duration::from_secs(20));

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (bounded) for the thread count to come to `n`: a thread that ends is gone from
/// the list a moment after it returns.
fn settle_to(n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while threads() != n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} threads, not {n}",
            threads()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

struct End {
    cm: CmDevice<AnyDevice>,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn end(cm: &CmDevice<AnyDevice>) -> End {
    let ctx = cm.context();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 64,
            ..CqInit::default()
        })
        .unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.caps.max_recv_wr = 64;
    let qp = pd.create_qp_blocking(init).unwrap();
    let mr = pd
        .reg_vec_blocking(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    End {
        cm: cm.clone(),
        cq,
        qp,
        mr,
    }
}

fn poll_one(cq: &Cq) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion");
        thread::yield_now();
    }
}

/// Two UDP-bound devices in `progress` mode with a CM each; the client (this thread, device
/// a) connects to the server (a thread of its own, device b), sends 64 messages, and
/// disconnects. `during(expected)` is checked while both application threads run: the count
/// must be `base + extra` where `extra` is what the devices cost.
fn run(progress: Progress, ips: [&str; 2], port: u16, extra: usize) {
    let base = threads();
    let dev = |name: &str, ip: &str| {
        let mut config = UdpConfig::new(ip.parse::<IpAddr>().unwrap());
        config.progress = progress;
        let d = udp_device(name, config).unwrap();
        assert_eq!(d.any().info().progress, progress);
        d
    };
    let (da, db) = (dev("thr_a", ips[0]), dev("thr_b", ips[1]));
    assert_eq!(threads(), base + extra, "{progress}: the devices made");
    let open = |d: &portverbs::UdpDevice, ip: &str| {
        let ctx = portverbs::open(d.any()).unwrap();
        CmDevice::open_blocking(&ctx, ip.parse().unwrap()).unwrap()
    };
    let (a, b) = (open(&da, ips[0]), open(&db, ips[1]));
    assert_eq!(
        threads(),
        base + extra,
        "{progress}: contexts and CMs opened"
    );
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let (counted_tx, counted) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let s = end(&b);
        let req = listener.get_request_blocking(T).unwrap();
        let conn = req.accept_blocking(&s.qp, &ConnParam::default()).unwrap();
        // Sends that arrive before their receive is posted are RNR-NAKed and retried.
        for i in 0..64 {
            s.qp.post_recv(&[RecvWr {
                wr_id: i,
                sges: &[s.mr.sge(0, 64).unwrap()],
            }])
            .unwrap();
        }
        for i in 0..64 {
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        counted.recv().unwrap();
        conn.notify_disconnect_blocking(T).unwrap();
        conn.disconnect(&s.qp).unwrap();
        drop(conn);
        drop(listener);
        s.cm.flush(Duration::from_secs(5)).unwrap();
    });
    let s = end(&a);
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, &ConnParam::default()).unwrap();
    for i in 0..64u64 {
        let sge = [s.mr.sge(0, 64).unwrap()];
        s.qp.post_send(&[SendWr::new(i, SendOp::Send).sges(&sge).signaled()])
            .unwrap();
        assert_eq!(poll_one(&s.cq).status, WcStatus::Success);
    }
    assert_eq!(
        threads(),
        base + extra + 1,
        "{progress}: during traffic, the server's application thread besides"
    );
    counted_tx.send(()).unwrap();
    conn.disconnect(&s.qp).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    server.join().unwrap();
    drop(conn);
    a.flush(Duration::from_secs(5)).unwrap();
    drop((s, a));
    settle_to(base + extra, "the server's thread joined");
    drop((da, db));
    settle_to(base, "every device dropped");
}

#[test]
fn auto_costs_one_thread_per_device_and_manual_none() {
    // The loopback addresses are this test's own (other binaries use others).
    run(Progress::Auto, ["127.0.61.1", "127.0.61.2"], 7611, 2);
    run(Progress::Manual, ["127.0.61.3", "127.0.61.4"], 7612, 0);
}

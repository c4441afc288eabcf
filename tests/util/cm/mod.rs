//! Set-up shared by the CM test files (`cm.rs`, `cm_matrix.rs`, `cm_mlx4.rs`,
//! `cm_semantics.rs`, and the hostile suite's `attacks/cm_liar.rs`): a device's
//! CM, an RC QP with its CQ and buffer, completions, a thread that drives a CM, the exchanges
//! several files run (connect–send–disconnect, a reject, a busy server), and waiting until
//! nothing is left. [`pair`]: two CM devices of one backend for the per-backend matrix;
//! [`udp`]: a UDP-bound device's CM and a peer that never answers.

#![allow(dead_code, unreachable_pub)]

#[cfg(target_os = "linux")]
pub mod pair;
#[cfg(target_os = "linux")]
pub mod udp;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, RdmaCmEvent, ServiceError};
use portverbs::cm::wire::RejReason;
use portverbs::prelude::*;

pub type Dev = CmDevice<AnyDevice>;
pub const T: Option<Duration> = Some(Duration::from_secs(20));

/// The CM of the embedded device `name`, on the IP of its first GID.
pub fn cm_dev(name: &str) -> Dev {
    let ctx = portverbs::open(portverbs::device(name).unwrap()).unwrap();
    let gid = ctx.gid_table_blocking(1).unwrap()[0].1.gid;
    CmDevice::open_blocking(&ctx, gid.to_ip()).unwrap()
}

/// An RC QP with its CQ and a registered buffer, on `dev`'s device.
pub struct Side {
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

pub fn side(ctx: &Context, cq: Option<&Cq>) -> Side {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq.cloned().unwrap_or_else(|| {
        ctx.create_cq_blocking(CqInit {
            entries: 64,
            ..CqInit::default()
        })
        .unwrap()
    });
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.caps.max_send_wr = 8;
    init.caps.max_recv_wr = 8;
    let qp = pd.create_qp_blocking(init).unwrap();
    let mr = pd
        .reg_vec_blocking(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    Side { cq, qp, mr }
}

pub fn ctx_of(dev: &Dev) -> Context {
    dev.context().clone()
}

pub fn poll_one(cq: &Cq) -> WorkCompletion {
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

pub fn post_recv(s: &Side, wr_id: u64) {
    s.qp.post_recv(&[RecvWr {
        wr_id,
        sges: &[s.mr.sge(0, 1024).unwrap()],
    }])
    .unwrap();
}

/// SENDs `data` from `s`'s buffer at `at` as `wr_id`, then takes completions until exactly
/// the `expect`ed work requests (the SEND and whatever receives are due) have succeeded.
pub fn send_and_collect(s: &Side, at: usize, data: &[u8], wr_id: u64, expect: &[u64]) {
    s.mr.write(at, data).unwrap();
    let sge = [s.mr.sge(at, data.len()).unwrap()];
    s.qp.post_send(&[SendWr::new(wr_id, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < expect.len() {
        let wc = poll_one(&s.cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        seen.push(wc.wr_id);
    }
    seen.sort_unstable();
    let mut want = expect.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want);
}

/// A connection request from `a` to `dst` left out: `a`'s REQ is sent (one poll of the
/// connect future) and nobody has answered. Returns the active side and its endpoint.
pub fn req_out(a: &Dev, dst: SocketAddr) -> (Side, Connector<AnyDevice>) {
    use std::future::Future;
    use std::task::{Context as TaskContext, Waker};
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
    (s, conn)
}

pub fn param(data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: data.to_vec(),
        ..ConnParam::default()
    }
}

/// Drives both devices until neither holds an endpoint (TIMEWAIT included).
pub fn settle(devs: &[&Dev]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while devs.iter().any(|d| d.live_endpoints() > 0) {
        for d in devs {
            d.progress().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "endpoints leaked: {:?}",
            devs.iter().map(|d| d.live_endpoints()).collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(2));
    }
    for d in devs {
        assert_eq!(d.associated_qps(), 0);
    }
}

/// [`settle`], and no QP1 completion failed on either device.
pub fn settle_clean(devs: &[&Dev]) {
    settle(devs);
    for d in devs {
        let c = d.mad_counts();
        assert_eq!((c.recv_errors, c.send_errors), (0, 0), "{c:?}");
    }
}

/// A thread that drives a device's CM while it lives, as an application's calls would. The
/// devices here run their CM on their own progress thread as well; the cases hold on a device
/// without one (whose CM answers only when something calls) too.
pub struct Driver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Driver {
    pub fn start(dev: &Dev) -> Self {
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

/// Connect from `a` to `b`'s `port` with private data both ways, a SEND each way over the
/// connected QPs, disconnect from the active side: the passive side sees who connected and
/// where, both sides see DISCONNECTED with their QPs in ERR, the active side's posted receive
/// is flushed, nothing leaks, no QP1 completion failed, and no MAD needed a retransmission.
pub fn connect_send_disconnect(a: &Dev, b: &Dev, port: u16) {
    let before = (a.stats().retransmits, b.stats().retransmits);
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let a_ip = a.local_ip();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(b.context(), None);
            let req = listener.get_request_blocking(T).unwrap();
            assert_eq!(req.remote_addr().ip(), a_ip);
            assert_eq!(req.local_addr(), dst);
            assert_eq!(&req.private_data()[..5], b"hello");
            let conn = req.accept_blocking(&s.qp, &param(b"welcome")).unwrap();
            assert_eq!(s.qp.state(), QpState::Rts);
            // Posted once the CM took the QP out of RESET; the peer's SEND waits on RNR.
            post_recv(&s, 11);
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (11, WcStatus::Success), "{wc:?}");
            let mut got = [0u8; 4];
            s.mr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"ping");
            s.mr.write(512, b"pong").unwrap();
            let sge = [s.mr.sge(512, 4).unwrap()];
            s.qp.post_send(&[SendWr::new(12, SendOp::Send).sges(&sge).signaled()])
                .unwrap();
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (12, WcStatus::Success), "{wc:?}");
            conn.notify_disconnect_blocking(T).unwrap();
            // The peer disconnected first: this answers its DREQ (DREP).
            conn.disconnect(&s.qp).unwrap();
            assert_eq!(s.qp.state(), QpState::Err);
            drop(conn);
            drop(listener);
        })
    };
    let s = side(a.context(), None);
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
    // Before the ping: the peer answers it with a pong.
    post_recv(&s, 21);
    send_and_collect(&s, 1024, b"ping", 5, &[5, 21]);
    let mut got = [0u8; 4];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"pong");
    post_recv(&s, 99);
    conn.disconnect(&s.qp).unwrap();
    let wc = poll_one(&s.cq);
    assert_eq!((wc.wr_id, wc.status), (99, WcStatus::WrFlushErr));
    conn.notify_disconnect_blocking(T).unwrap();
    passive.join().unwrap();
    drop(conn);
    settle_clean(&[a, b]);
    assert_eq!(
        (a.stats().retransmits, b.stats().retransmits),
        before,
        "a MAD was retransmitted"
    );
}

/// One side of an established connection: its QP with CQ and buffer, and its endpoint.
pub type End = (Side, Connector<AnyDevice>);

/// A connection from `a` to `b` on `port`: `b` accepts with `accept`, `a` connects with
/// `connect`. Returns (active side, passive side).
pub fn connect(a: &Dev, b: &Dev, port: u16, connect: &ConnParam, accept: ConnParam) -> (End, End) {
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            let req = listener.get_request_blocking(T).unwrap();
            let conn = req.accept_blocking(&s.qp, &accept).unwrap();
            (s, conn)
        })
    };
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, connect).unwrap();
    ((s, conn), passive.join().unwrap())
}

/// Disconnects both sides of [`connect`]'s connection and waits until nothing is left.
pub fn close(a: &Dev, b: &Dev, ends: (End, End)) {
    let ((sa, ca), (sb, cb)) = ends;
    ca.disconnect(&sa.qp).unwrap();
    cb.notify_disconnect_blocking(T).unwrap();
    cb.disconnect(&sb.qp).unwrap();
    ca.notify_disconnect_blocking(T).unwrap();
    drop((ca, cb));
    settle(&[a, b]);
}

/// The QP's attributes as the device reports them.
pub fn attr(s: &Side) -> QpAttr {
    s.qp.query_blocking().unwrap()
}

/// `b` listens on `port` and rejects with private data; `a` connects and sees REJECTED
/// (consumer reject) with that data, its QP left in ERR and free; then nothing is left.
pub fn reject_with_data(a: &Dev, b: &Dev, port: u16) {
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = thread::spawn(move || {
        let req = listener.get_request_blocking(T).unwrap();
        req.reject(b"go away").unwrap();
        drop(listener);
    });
    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    match conn.connect_blocking(&s.qp, &param(b"please")) {
        Err(ServiceError::Rejected {
            reason,
            private_data,
        }) => {
            assert_eq!(reason, RejReason::ConsumerReject);
            assert_eq!(&private_data[..7], b"go away");
        }
        other => panic!("{other:?}"),
    }
    // A rejected connection leaves its QP in ERR and free for another connection.
    assert_eq!(s.qp.state(), QpState::Err);
    passive.join().unwrap();
    drop(conn);
    settle(&[a, b]);
}

/// How a busy server spends its time until the client says it is done: in auto progress it
/// makes no call at all; in manual progress it busy-polls its data CQ (and nothing else).
pub type Busy = fn(&Side, &std::sync::mpsc::Receiver<()>);

/// A server that does not call the CM while it is busy. While it is busy the first time, the
/// client connects to a port nobody listens on — rejected at once with reason 8, invalid
/// service ID, with no REQ retransmitted (the retry budget running out would be
/// `Unreachable`) — and then to the listener, which the server accepts when it is done: at
/// most one REQ retransmission (the server's device answers the duplicate with an MRA, so
/// the client keeps waiting). While it is busy the second time, the client disconnects; the
/// server answers (DREP) when it is done: at most one DREQ retransmission. The client lets the
/// server be busy for `compute` each time.
pub fn busy_server(a: &Dev, b: &Dev, port: u16, compute: Duration, busy: Busy) {
    use std::sync::mpsc;
    let dst = SocketAddr::new(b.local_ip(), port);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(4).unwrap();
    let (go, go_rx) = mpsc::channel::<()>();
    let (busy_tx, busy_rx) = mpsc::channel::<()>();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            busy_tx.send(()).unwrap();
            busy(&s, &go_rx);
            let req = listener.get_request_blocking(T).unwrap();
            let conn = req.accept_blocking(&s.qp, &param(b"yes")).unwrap();
            busy_tx.send(()).unwrap();
            busy(&s, &go_rx);
            conn.notify_disconnect_blocking(T).unwrap();
            conn.disconnect(&s.qp).unwrap();
            drop(conn);
            drop(listener);
        })
    };
    let let_busy = |go: mpsc::Sender<()>| {
        thread::spawn(move || {
            thread::sleep(compute);
            go.send(()).unwrap();
        })
    };
    busy_rx.recv().unwrap();
    let start = a.stats().retransmits;
    let s0 = side(&ctx_of(a), None);
    let mut nobody = Connector::new(a).unwrap();
    nobody
        .resolve_blocking(SocketAddr::new(b.local_ip(), 9))
        .unwrap();
    let t = std::time::Instant::now();
    match nobody.connect_blocking(&s0.qp, &ConnParam::default()) {
        Err(ServiceError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejReason::InvalidServiceId)
        }
        other => panic!("a REQ to no listener: {other:?}"),
    }
    eprintln!(
        "REJ for a port nobody listens on, from a busy server: {:?}",
        t.elapsed()
    );
    assert_eq!(
        a.stats().retransmits,
        start,
        "rejected at the first REQ (after {:?}; client {:?} {:?}; server {:?} {:?})",
        t.elapsed(),
        a.stats(),
        a.mad_counts(),
        b.stats(),
        b.mad_counts()
    );
    drop(nobody);

    let s = side(&ctx_of(a), None);
    let mut conn = Connector::new(a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let timer = let_busy(go.clone());
    assert_eq!(
        &conn.connect_blocking(&s.qp, &param(b"1")).unwrap()[..3],
        b"yes"
    );
    let req_retransmits = a.stats().retransmits - start;
    assert!(
        req_retransmits <= 1,
        "{req_retransmits} REQ retransmissions"
    );
    timer.join().unwrap();

    busy_rx.recv().unwrap();
    let before = a.stats().retransmits;
    let timer = let_busy(go);
    conn.disconnect(&s.qp).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    let dreq_retransmits = a.stats().retransmits - before;
    assert!(
        dreq_retransmits <= 1,
        "{dreq_retransmits} DREQ retransmissions"
    );
    timer.join().unwrap();
    passive.join().unwrap();
    drop(conn);
    settle(&[a, b]);
}

/// [`Busy`] in auto progress: no call at all until the client is done.
pub fn no_calls(_s: &Side, go: &std::sync::mpsc::Receiver<()>) {
    go.recv().unwrap();
}

/// [`Busy`] in manual progress: polls the data CQ (and calls nothing else) until the client
/// is done.
pub fn busy_polling(s: &Side, go: &std::sync::mpsc::Receiver<()>) {
    let mut wc = [WorkCompletion::default(); 8];
    while go.try_recv().is_err() {
        let _ = s.cq.poll(&mut wc).unwrap();
    }
}

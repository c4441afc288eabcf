//! Set-up shared by the CM test files (`cm.rs`, `cm_mlx4.rs`, `cm_scale.rs`, and the hostile
//! suite's `attacks/cm_liar.rs`): a device's CM, an RC QP with its CQ and buffer,
//! completions, and waiting until nothing is left.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, ServiceError};
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

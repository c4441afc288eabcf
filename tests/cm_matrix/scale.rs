//! The connection manager under bursts: thousands of connects and disconnects started at
//! once through real QPs, with the CM's send window keeping every burst within the peer's 512
//! QP1 receives, so that nothing is dropped and nothing waits for a retransmission.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::CmId;
use portverbs::cm::service::{ConnParam, Connector, Listener};
use portverbs::prelude::*;

use crate::cm_util::Dev;
use crate::cm_util::pair::{Backend, Pair};

/// The burst: 2000 connections, or as many as the devices' QPs allow (the mlx4 driver's
/// resource profile holds fewer), but always more than the peer's 512 QP1 receives.
const CONNECTIONS: usize = 2000;

fn qps(dev: &Dev, n: usize) -> Vec<Qp> {
    let ctx = dev.context();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    (0..n)
        .map(|_| {
            let mut init = QpInit::new(QpType::Rc, &cq);
            init.caps.max_send_wr = 1;
            init.caps.max_recv_wr = 1;
            pd.create_qp_blocking(init).unwrap()
        })
        .collect()
}

/// Drives only `dev` for a while: whatever its burst puts on the wire meanwhile lands in
/// the peer's QP1 receive queue, which nobody empties.
fn drive_alone(dev: &Dev) {
    let end = Instant::now() + Duration::from_millis(100);
    while Instant::now() < end {
        dev.progress().unwrap();
        std::thread::yield_now();
    }
}

fn a_burst_of_connects_and_disconnects_needs_no_retransmission(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let max_qp = [a, b].map(|d| d.context().attr().max_qp as usize);
    let n = CONNECTIONS.min(max_qp[0] - 8).min(max_qp[1] - 8);
    assert!(n > 512, "{max_qp:?}");
    eprintln!("{backend:?}: a burst of {n} connections");
    let dst = SocketAddr::new(b.local_ip(), 7490);
    let mut listener = Listener::bind(b, dst).unwrap();
    listener.listen(n).unwrap();
    let (active_qps, mut passive_qps) = (qps(a, n), qps(b, n));
    let mut ready = Vec::new();
    a.take_ready(&mut ready);
    b.take_ready(&mut ready);

    let mut conns: Vec<Connector<AnyDevice>> = Vec::new();
    let mut index: HashMap<CmId, usize> = HashMap::new();
    for qp in &active_qps {
        let mut c = Connector::new(a).unwrap();
        c.resolve_blocking(dst).unwrap();
        c.connect_nowait(qp, &ConnParam::default()).unwrap();
        index.insert(c.cm_id(), conns.len());
        conns.push(c);
    }
    // 2000 REQs (or the devices' most) at once, and the listener's device not driven: without a send window the
    // REQs beyond its 512 receives would be dropped.
    drive_alone(a);
    assert!(
        a.mad_counts().paced > 0,
        "the window held REQs back: {:?}",
        a.mad_counts()
    );

    let mut accepted: Vec<(Connector<AnyDevice>, Qp)> = Vec::new();
    let mut passive_index: HashMap<CmId, usize> = HashMap::new();
    let mut up = vec![false; n];
    let (mut established, mut passive_up) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while established < n || passive_up < n {
        assert!(Instant::now() < deadline, "{established} / {passive_up} up");
        a.progress().unwrap();
        b.progress().unwrap();
        while let Some(req) = listener.try_get_request() {
            let qp = passive_qps.pop().expect("a QP per request");
            let c = req.accept_nowait(&qp, &ConnParam::default()).unwrap();
            passive_index.insert(c.cm_id(), accepted.len());
            accepted.push((c, qp));
        }
        a.take_ready(&mut ready);
        for id in ready.drain(..) {
            if let Some(&i) = index.get(&id) {
                if let Some(r) = conns[i].try_connected() {
                    r.unwrap();
                    established += 1;
                }
            }
        }
        b.take_ready(&mut ready);
        for id in ready.drain(..) {
            if let Some(&i) = passive_index.get(&id) {
                if !up[i] && accepted[i].0.try_connected().is_some() {
                    up[i] = true;
                    passive_up += 1;
                }
            }
        }
    }

    // Every DREQ at once, the passive device again left alone for a while.
    for (c, qp) in conns.iter().zip(&active_qps) {
        c.disconnect(qp).unwrap();
    }
    drive_alone(a);
    let (mut closed, mut answered) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while closed < n || answered < n {
        assert!(Instant::now() < deadline, "{closed} / {answered} down");
        a.progress().unwrap();
        b.progress().unwrap();
        b.take_ready(&mut ready);
        for id in ready.drain(..) {
            if let Some(&i) = passive_index.get(&id) {
                let (c, qp) = &accepted[i];
                if c.try_disconnected() {
                    c.disconnect(qp).unwrap();
                    answered += 1;
                }
            }
        }
        a.take_ready(&mut ready);
        for id in ready.drain(..) {
            if let Some(&i) = index.get(&id) {
                if conns[i].try_disconnected() {
                    closed += 1;
                }
            }
        }
    }
    assert!(a.flush(Duration::from_secs(5)).unwrap());
    assert!(b.flush(Duration::from_secs(5)).unwrap());

    // Nothing was lost on the way and nothing was sent twice.
    let (ma, mb) = (a.mad_counts(), b.mad_counts());
    assert_eq!(a.stats().retransmits, 0, "{:?}", a.stats());
    assert_eq!(b.stats().retransmits, 0, "{:?}", b.stats());
    assert_eq!(a.stats().duplicates + b.stats().duplicates, 0);
    // REQ, RTU, DREQ from the active side; REP, DREP from the passive side.
    assert_eq!(ma.sent, 3 * n as u64, "{ma:?}");
    assert_eq!(mb.sent, 2 * n as u64, "{mb:?}");
    assert_eq!((ma.received, mb.received), (mb.sent, ma.sent));
    assert_eq!(ma.recv_errors + mb.recv_errors, 0);
}

cm_cases!(a_burst_of_connects_and_disconnects_needs_no_retransmission);

//! The connection manager with one end or both ends on the emulated ConnectX-3:
//! connect, data over the connected QP, disconnect, and reject, between the embedded
//! fabric's `mlx4_0` / `mlx4_1` (the mlx4 driver over the emulated HCA) and `soft0`. The mlx4
//! side's CM MADs leave its QP1 as MLX-transport WQEs whose headers the driver builds.
//!
//! What a real ConnectX-3 RoCE port would need that the emulation does not check. The driver
//! sends QP1 MADs as MLX-service WQEs (`hw/mlx4/qp.c`: an MLX control segment, then inline the
//! header software built, then the MAD); it builds the InfiniBand form, LRH + GRH + BTH +
//! DETH, and the emulated HCA checks that header (LRH DLID and SL against the control
//! segment) and routes the datagram by destination GID. On an Ethernet port the inline header
//! is the Ethernet frame's instead (destination and source MAC, optional VLAN tag, then the
//! GRH for RoCE v1), so the driver would have to resolve the peer's MAC from its GID (the
//! neighbour table) and pick the port's source MAC and VLAN; none of that is implemented
//! here, and RoCE v2 (IP/UDP framing, the IPv4-mapped GIDs these tests use) is a ConnectX-3
//! Pro feature, not a plain ConnectX-3 one. The emulation also takes the GID table from its
//! configuration without an Ethernet interface owning the addresses, and does not compute the
//! ICRC. The CM above the device depends on none of these: it sees QP1 datagrams and a GID.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::thread;

use portverbs::cm::service::{Connector, Listener, RdmaCmEvent};
use portverbs::prelude::*;

mod cm_util;
use cm_util::{Dev, T, cm_dev, param, poll_one, post_recv, reject_with_data, settle, side};

/// [`settle`], and no QP1 completion failed on either device.
fn settle_clean(devs: &[&Dev]) {
    settle(devs);
    for d in devs {
        let c = d.mad_counts();
        assert_eq!((c.recv_errors, c.send_errors), (0, 0), "{c:?}");
    }
}

/// Connect with private data both ways, a SEND each way over the connected QPs, disconnect
/// from the active side: both sides see DISCONNECTED, the active side's posted receive is
/// flushed, nothing leaks, and no MAD needed a retransmission.
fn connect_send_disconnect(a: &Dev, b: &Dev, port: u16) {
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
    s.mr.write(1024, b"ping").unwrap();
    let sge = [s.mr.sge(1024, 4).unwrap()];
    s.qp.post_send(&[SendWr::new(5, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let wc = poll_one(&s.cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        seen.push(wc.wr_id);
    }
    seen.sort_unstable();
    assert_eq!(seen, [5, 21]);
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

/// The CM devices of the whole process: a device's QP1 can be created once, so the tests
/// share one set and take turns.
fn devices() -> (std::sync::MutexGuard<'static, ()>, &'static [Dev; 3]) {
    use std::sync::{Mutex, OnceLock, PoisonError};
    static TURN: Mutex<()> = Mutex::new(());
    static DEVS: OnceLock<[Dev; 3]> = OnceLock::new();
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let devs = DEVS.get_or_init(|| [cm_dev("mlx4_0"), cm_dev("mlx4_1"), cm_dev("soft0")]);
    (turn, devs)
}

#[test]
fn mlx4_active_soft_passive() {
    let (_turn, [m0, _, s0]) = devices();
    connect_send_disconnect(m0, s0, 7601);
}

#[test]
fn soft_active_mlx4_passive() {
    let (_turn, [m0, _, s0]) = devices();
    connect_send_disconnect(s0, m0, 7602);
}

#[test]
fn mlx4_to_mlx4() {
    let (_turn, [m0, m1, _]) = devices();
    connect_send_disconnect(m0, m1, 7603);
    connect_send_disconnect(m1, m0, 7604);
}

#[test]
fn mlx4_rejects_and_is_rejected() {
    let (_turn, [m0, m1, s0]) = devices();
    for (a, b, port) in [(s0, m0, 7605), (m0, s0, 7606), (m0, m1, 7607)] {
        reject_with_data(a, b, port);
        settle_clean(&[a, b]);
    }
}

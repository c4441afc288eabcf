//! The connection manager against a lying peer (DESIGN §3 decision 12: everything from the
//! wire is hostile). A node of the test's own on a private fabric ([`spoof::Spoofer`]) sends
//! crafted MADs to a device's QP1 under any source address, as a host that forges its IP
//! source can: MADs cut short, floods from thousands of addresses, requests with the longest
//! timers there are, and teardowns of other hosts' connections.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use portverbs::cm::service::{Connector, Listener};
use portverbs::prelude::*;
use portverbs::soft::Fabric;

mod cm_util;
#[path = "cm_util/spoof.rs"]
mod spoof;

use cm_util::{Dev, T, ctx_of, param, poll_one, post_recv, side};
use spoof::{Driver, Spoofer, cm_on, dreq, gid, pump_until_received, wait_until};

/// QP1's receive buffers (as many as Linux's MAD layer posts).
const RECV_SLOTS: u64 = 512;

/// A MAD shorter than 256 bytes is not parsed with what an earlier MAD left in the buffer:
/// host A's DREQs fill every one of QP1's receive buffers, then a stranger sends only a DREQ's
/// 24-byte header. Its datagram lands in a buffer that held A's DREQ; read whole, it was a
/// DREQ carrying A's communication IDs, and the DREP that answered it told the stranger the
/// IDs of A's connection. It is dropped and counted as malformed, and nothing answers it.
#[test]
fn a_short_mad_is_dropped_and_leaks_nothing() {
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.91.0.1");
    let liar = Spoofer::attach(&fabric, &["10.91.0.2", "10.91.0.3"]);
    let (a, stranger, v) = (gid("10.91.0.2"), gid("10.91.0.3"), victim.local_gid());
    const A_LOCAL: u32 = 0xA1A1_A1A1;
    const A_REMOTE: u32 = 0xB2B2_B2B2;
    for n in 0..RECV_SLOTS {
        liar.send(a, v, &dreq(n, A_LOCAL, A_REMOTE, 0x00AB_CDEF));
        if n % 128 == 127 {
            pump_until_received(&victim, n + 1);
        }
    }
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let to_a = liar.heard();
    assert_eq!(to_a.len(), RECV_SLOTS as usize, "a DREP answers each DREQ");
    assert!(to_a.iter().all(|h| h.to == a));
    let malformed = victim.stats().malformed;
    // The header alone, then a MAD cut after its first 200 bytes.
    let short = dreq(0x5555, 0x0101_0101, 0x0202_0202, 0x42);
    liar.send(stranger, v, &short[..24]);
    liar.send(stranger, v, &short[..200]);
    pump_until_received(&victim, RECV_SLOTS + 2);
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let heard = liar.heard();
    let leaks: Vec<_> = heard
        .iter()
        .filter(|h| {
            h.mad
                .windows(4)
                .any(|w| w == A_LOCAL.to_be_bytes() || w == A_REMOTE.to_be_bytes())
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "A's comm IDs reached the stranger: {leaks:?}"
    );
    assert!(heard.is_empty(), "nothing answers a short MAD: {heard:?}");
    assert_eq!(
        victim.stats().malformed,
        malformed + 2,
        "{:?}",
        victim.stats()
    );
}

/// A connection between `client` and `server` on a private fabric, both devices driven.
struct Live {
    server: Dev,
    client: Dev,
    s: cm_util::Side,
    c: cm_util::Side,
    s_conn: Connector<AnyDevice>,
    c_conn: Connector<AnyDevice>,
    _drivers: [Driver; 2],
}

fn live(fabric: &Fabric, net: u8, port: u16) -> Live {
    let server = cm_on(fabric, &format!("10.{net}.0.1"));
    let client = cm_on(fabric, &format!("10.{net}.0.2"));
    let dst = SocketAddr::new(server.local_ip(), port);
    let mut listener = Listener::bind(&server, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let server = server.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&server), None);
            let req = listener.get_request_blocking(T).unwrap();
            let conn = req.accept_blocking(&s.qp, &param(b"")).unwrap();
            (s, conn)
        })
    };
    let c = side(&ctx_of(&client), None);
    let mut c_conn = Connector::new(&client).unwrap();
    c_conn.resolve_blocking(dst).unwrap();
    c_conn.connect_blocking(&c.qp, &param(b"")).unwrap();
    let (s, s_conn) = passive.join().unwrap();
    let drivers = [Driver::start(&server), Driver::start(&client)];
    Live {
        server,
        client,
        s,
        c,
        s_conn,
        c_conn,
        _drivers: drivers,
    }
}

/// A SEND from the client reaches the server.
fn send_travels(l: &Live) {
    post_recv(&l.s, 77);
    l.c.mr.write(0, b"still").unwrap();
    let sge = [l.c.mr.sge(0, 5).unwrap()];
    l.c.qp
        .post_send(&[SendWr::new(78, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let wc = poll_one(&l.c.cq);
    assert_eq!((wc.wr_id, wc.status), (78, WcStatus::Success));
    let wc = poll_one(&l.s.cq);
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::Success));
}

/// A DREQ with the right communication IDs and QPN (which a stranger may have learnt) from
/// another address than the client's leaves the connection up: no DISCONNECTED, and a SEND
/// still travels.
#[test]
fn a_stranger_cannot_disconnect_a_live_connection() {
    let fabric = Fabric::threaded();
    let l = live(&fabric, 98, 7603);
    let liar = Spoofer::attach(&fabric, &["10.98.0.3"]);
    let before = l.server.mad_counts().received;
    let forged = dreq(
        9,
        l.c_conn.cm_id().comm_id(),
        l.s_conn.cm_id().comm_id(),
        l.s.qp.qp_num(),
    );
    liar.send(gid("10.98.0.3"), l.server.local_gid(), &forged);
    wait_until("the server heard the DREQ", || {
        l.server.mad_counts().received > before
    });
    l.server.progress().unwrap();
    assert!(!l.s_conn.try_disconnected());
    assert_eq!(l.s.qp.state(), QpState::Rts);
    send_travels(&l);
    assert!(liar.heard().is_empty(), "the stranger got no DREP");
    assert_eq!(l.server.stats().foreign_source, 1);
    let _ = &l.client;
}

/// The same DREQ from the client's own address (a stranger who forges that too, or the client
/// itself) does disconnect: the server hears DISCONNECTED, and when it disconnects its side
/// (a DREP to a client whose CM never sent a DREQ) the client hears DISCONNECTED too instead
/// of waiting forever.
#[test]
fn a_disconnect_in_the_peers_name_reaches_both_owners() {
    let fabric = Fabric::threaded();
    let l = live(&fabric, 99, 7604);
    let liar = Spoofer::attach(&fabric, &[]);
    let forged = dreq(
        9,
        l.c_conn.cm_id().comm_id(),
        l.s_conn.cm_id().comm_id(),
        l.s.qp.qp_num(),
    );
    liar.send(l.client.local_gid(), l.server.local_gid(), &forged);
    l.s_conn.notify_disconnect_blocking(T).unwrap();
    l.s_conn.disconnect(&l.s.qp).unwrap();
    l.c_conn.notify_disconnect_blocking(T).unwrap();
    assert_eq!(l.c.qp.state(), QpState::Err);
}

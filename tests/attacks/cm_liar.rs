//! The connection manager against a lying peer, on a private fabric: the attacker
//! ([`FabricAttacker`]) is a node of its own that sends crafted MADs to a device's QP1 under
//! any source address, as a host that forges its IP source can, and keeps what comes back to
//! the addresses it claims. MADs cut short, floods from thousands of addresses, requests with
//! the longest timers there are, and teardowns of other hosts' connections. These run on the
//! fabric alone (no sockets, no `/proc`), so on every platform the suite builds for; their
//! memory bound is the CM's own count of its tables ([`CmDevice::state_bytes`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, Connector, Listener, ServiceError};
use portverbs::cm::wire::{AttrId, CmMessage, RejReason};
use portverbs::hal::Gid;
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};

use super::attacker::FabricAttacker;
use super::cm_mads::{ForgedReq, ReqTimers, dreq};
use super::rss::turn;
use crate::cm_util::{self, Dev, T, ctx_of, param, poll_one, post_recv, side};

/// QP1's receive buffers (as many as Linux's MAD layer posts).
const RECV_SLOTS: u64 = 512;

/// A MAD shorter than 256 bytes is not parsed with what an earlier MAD left in the buffer:
/// host A's DREQs fill every one of QP1's receive buffers, then a stranger sends only a DREQ's
/// 24-byte header. Its datagram lands in a buffer that held A's DREQ; read whole, it was a
/// DREQ carrying A's communication IDs, and the DREP that answered it told the stranger the
/// IDs of A's connection. It is dropped and counted as malformed, and nothing answers it.
#[test]
fn a_short_mad_is_dropped_and_leaks_nothing() {
    let _turn = turn();
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.91.0.1");
    let (a, stranger, v) = (ip("10.91.0.2"), ip("10.91.0.3"), victim.local_ip());
    let liar = FabricAttacker::join(&fabric, &[a, stranger]);
    const A_LOCAL: u32 = 0xA1A1_A1A1;
    const A_REMOTE: u32 = 0xB2B2_B2B2;
    for n in 0..RECV_SLOTS {
        liar.send_mad(a, v, &dreq(n, A_LOCAL, A_REMOTE, 0x00AB_CDEF));
        if n % 128 == 127 {
            pump_until_received(&victim, n + 1);
        }
    }
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let mut to_a = Vec::new();
    wait_until("a DREP answered each DREQ", || {
        to_a.extend(liar.heard());
        to_a.len() >= RECV_SLOTS as usize
    });
    assert!(to_a.iter().all(|h| h.to == Gid::from_ip(a)));
    let malformed = victim.stats().malformed;
    // The header alone, then a MAD cut after its first 200 bytes; then a whole DREQ, whose
    // DREP comes back after anything the short ones brought.
    let short = dreq(0x5555, 0x0101_0101, 0x0202_0202, 0x42);
    liar.send_mad(stranger, v, &short[..24]);
    liar.send_mad(stranger, v, &short[..200]);
    liar.send_mad(stranger, v, &dreq(0x6666, 0x0303_0303, 0x0404_0404, 0x42));
    pump_until_received(&victim, RECV_SLOTS + 3);
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let mut heard = Vec::new();
    wait_until("the whole DREQ was answered", || {
        heard.extend(liar.heard());
        !heard.is_empty()
    });
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
    assert_eq!(heard.len(), 1, "nothing answers a short MAD: {heard:?}");
    let Some(CmMessage::Drep(d)) = heard[0].parsed().map(|m| m.msg) else {
        panic!("{heard:?}");
    };
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id),
        (0x0404_0404, 0x0303_0303)
    );
    assert_eq!(
        victim.stats().malformed,
        malformed + 2,
        "{:?}",
        victim.stats()
    );
}

/// Nothing the CM keeps grows with the number of strangers: 4096 DREQs and 4096 REQs, each
/// from an address of its own, leave at most the address-handle cache's 256 handles, at most
/// the listener's backlog of requests (the rest are refused), and CM tables of a bounded
/// size; once their senders have given up, the requests the backlog kept are withdrawn, and
/// connections the application gave up on leave TIMEWAIT: nothing but the listener is left.
#[test]
fn strangers_leave_no_state_behind() {
    let _turn = turn();
    const STRANGERS: u32 = 4096;
    const BACKLOG: usize = 8;
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.92.0.1");
    let liar = FabricAttacker::join(&fabric, &[]);
    let v = victim.local_ip();
    let ctx = ctx_of(&victim);
    let port = 7600;
    let mut listener = Listener::bind(&victim, SocketAddr::new(victim.local_ip(), port)).unwrap();
    listener.listen(BACKLOG).unwrap();
    let stranger = |k: u32| format!("10.{}.{}.{}", 93 + k / 65536, (k / 256) % 256, k % 256);
    let mut sent = 0;
    // DREQs for no connection, each answered with a DREP (as Linux answers them).
    for k in 0..STRANGERS {
        liar.send_mad(ip(&stranger(k)), v, &dreq(u64::from(k), k, !k, 0x42));
        sent += 1;
        if k % 128 == 127 {
            pump_until_received(&victim, sent);
        }
    }
    assert!(victim.flush(Duration::from_secs(20)).unwrap());
    assert!(
        ctx.object_counts().ahs <= 256,
        "address handles: {}",
        ctx.object_counts().ahs
    );
    // REQs with short timers: a sender that proposes them gives up within milliseconds.
    let short = ReqTimers {
        remote_cm_response_timeout: 8,
        local_cm_response_timeout: 8,
        local_ack_timeout: 8,
        max_cm_retries: 0,
    };
    let mut most = 0;
    for k in 0..STRANGERS {
        let src = stranger(k);
        let forged = ForgedReq {
            local: 0x7000_0000 | k,
            guid: 0x0200_0000_0000_0000 | u64::from(k),
            qpn: 0x100 + k,
            src: src.parse().unwrap(),
            dst: victim.local_ip(),
            port,
            timers: short,
        };
        liar.send_mad(ip(&src), v, &forged.mad(u64::from(k)));
        sent += 1;
        if k % 128 == 127 {
            pump_until_received(&victim, sent);
            most = most.max(victim.live_endpoints());
        }
    }
    assert!(victim.flush(Duration::from_secs(20)).unwrap());
    assert!(most <= 1 + BACKLOG, "{most} endpoints");
    assert!(
        ctx.object_counts().ahs <= 256,
        "address handles: {}",
        ctx.object_counts().ahs
    );
    assert_eq!(victim.address_handles(), 256);
    // What the CM holds after 8192 strangers: the address-handle cache at its 256 handles
    // (about 48 KiB), the agent's slab grown to a poll batch of requests (32) plus the
    // backlog (about 43 KiB for 64 slots) and its maps, and room for a send queue's worth of
    // answers (64 MADs, 17 KiB): about 125 KiB, whatever the number of strangers.
    let bytes = victim.state_bytes();
    assert!(bytes <= 160 * 1024, "{bytes} bytes of CM state");
    // The requests the backlog kept are withdrawn once their senders have given up.
    let driver = Driver::start(&victim);
    wait_until("the kept requests are withdrawn", || {
        victim.live_endpoints() == 1
    });
    assert!(listener.try_get_request().is_none());
    // Requests the application accepts and then gives up on (nobody answers the REP): each
    // sends its REJ, goes through TIMEWAIT (its path's ACK timeout, 8: 1 ms) and is freed.
    let patient = ReqTimers {
        remote_cm_response_timeout: 20,
        local_cm_response_timeout: 18,
        ..short
    };
    let mut accepted = Vec::new();
    for k in 0..BACKLOG as u32 {
        let src = stranger(k);
        let forged = ForgedReq {
            local: 0x7100_0000 | k,
            guid: 0x0300_0000_0000_0000 | u64::from(k),
            qpn: 0x200 + k,
            src: src.parse().unwrap(),
            dst: victim.local_ip(),
            port,
            timers: patient,
        };
        liar.send_mad(ip(&src), v, &forged.mad(u64::from(k)));
        let req = listener.get_request_blocking(T).unwrap();
        let s = side(&ctx, None);
        accepted.push((req.accept_nowait(&s.qp, &param(b"")).unwrap(), s));
    }
    assert_eq!(victim.live_endpoints(), 1 + BACKLOG);
    drop(accepted);
    wait_until("TIMEWAIT has ended", || victim.live_endpoints() == 1);
    drop(driver);
    assert_eq!(victim.associated_qps(), 0);
    drop(listener);
    assert_eq!(victim.live_endpoints(), 0);
}

/// A REQ proposing the longest timers there are (every timeout 31: 2^23 ms, 2.3 hours, by
/// Linux's rounding; 15 retries) holds nothing for hours: the request is withdrawn within
/// five minutes if nobody answers it, an accepted one retransmits its REP at most every
/// 2^15 ms, and its TIMEWAIT is as short. (The timers are read, not waited for.)
#[test]
fn a_request_with_the_longest_timers_is_clamped() {
    let _turn = turn();
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.96.0.1");
    let liar = FabricAttacker::join(&fabric, &[ip("10.96.0.9")]);
    let port = 7601;
    let mut listener = Listener::bind(&victim, SocketAddr::new(victim.local_ip(), port)).unwrap();
    listener.listen(4).unwrap();
    let forged = ForgedReq {
        local: 0x1234_5678,
        guid: 0x0200_0000_0000_0009,
        qpn: 0x99,
        src: "10.96.0.9".parse().unwrap(),
        dst: victim.local_ip(),
        port,
        timers: ReqTimers::LONGEST,
    };
    liar.send_mad(ip("10.96.0.9"), victim.local_ip(), &forged.mad(1));
    pump_until_received(&victim, 1);
    assert_eq!(victim.live_endpoints(), 2);
    // Unanswered, the request is withdrawn once its sender has given up: within the CM's
    // bound on any wait for a peer (five minutes) and the MRA it may have been sent.
    let withdrawn = victim.next_deadline().expect("a deadline for the request");
    assert!(withdrawn <= Instant::now() + Duration::from_secs(300 + 5));
    // Accepted, the REP is retransmitted every 2^15 ms at most.
    let req = listener.get_request_blocking(T).unwrap();
    let s = side(&ctx_of(&victim), None);
    let conn = req.accept_nowait(&s.qp, &param(b"")).unwrap();
    let rep = victim.next_deadline().expect("the REP's retransmission");
    assert!(rep <= Instant::now() + Duration::from_millis(1 << 15));
    // Given up on, the connection's TIMEWAIT is as short.
    drop(conn);
    let timewait = victim.next_deadline().expect("TIMEWAIT");
    assert!(timewait <= Instant::now() + Duration::from_millis(1 << 15));
    // The REP went to the forged address, then the REJ.
    let mut heard = Vec::new();
    wait_until("the REP and the REJ reached the liar", || {
        heard.extend(liar.heard().iter().filter_map(|h| h.parsed()));
        heard.len() >= 2
    });
    let attrs: Vec<_> = heard.iter().map(|m| m.msg.attr()).collect();
    assert_eq!(attrs, [AttrId::Rep, AttrId::Rej]);
}

/// A forged request does not keep the listener's backlog full for longer than its sender
/// would wait: while it is queued a legitimate client is refused (REJ 28: the backlog is
/// full), and once the forged sender has given up (its REQ proposes about 2 s) the request is
/// withdrawn and the client connects.
#[test]
fn a_forged_request_leaves_the_backlog_when_its_sender_gave_up() {
    let _turn = turn();
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.97.0.1");
    let client = cm_on(&fabric, "10.97.0.2");
    let liar = FabricAttacker::join(&fabric, &[]);
    let port = 7602;
    let dst = SocketAddr::new(victim.local_ip(), port);
    let mut listener = Listener::bind(&victim, dst).unwrap();
    listener.listen(1).unwrap();
    let _driver = Driver::start(&victim);
    let forged = ForgedReq {
        local: 0x0BAD_0001,
        guid: 0x0200_0000_0000_0666,
        qpn: 0x66,
        src: "10.97.0.66".parse().unwrap(),
        dst: victim.local_ip(),
        port,
        timers: ReqTimers {
            remote_cm_response_timeout: 19,
            local_cm_response_timeout: 19,
            local_ack_timeout: 8,
            max_cm_retries: 0,
        },
    };
    liar.send_mad(ip("10.97.0.66"), victim.local_ip(), &forged.mad(7));
    wait_until("the forged request is queued", || {
        victim.live_endpoints() == 2
    });
    let s = side(&ctx_of(&client), None);
    let mut conn = Connector::new(&client).unwrap();
    conn.resolve_blocking(dst).unwrap();
    match conn.connect_blocking(&s.qp, &param(b"me")) {
        Err(ServiceError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejReason::ConsumerReject)
        }
        other => panic!("{other:?}"),
    }
    drop(conn);
    wait_until("the forged request is withdrawn", || {
        victim.live_endpoints() == 1
    });
    let passive = {
        let victim = victim.clone();
        thread::spawn(move || {
            let req = listener.get_request_blocking(T).unwrap();
            assert_eq!(&req.private_data()[..2], b"me");
            let s = side(&ctx_of(&victim), None);
            let conn = req.accept_blocking(&s.qp, &param(b"")).unwrap();
            (conn, s, listener)
        })
    };
    let s = side(&ctx_of(&client), None);
    let mut conn = Connector::new(&client).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&s.qp, &param(b"me")).unwrap();
    let (pconn, _ps, _l) = passive.join().unwrap();
    drop((conn, pconn));
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
    let _turn = turn();
    let fabric = Fabric::threaded();
    let l = live(&fabric, 98, 7603);
    let liar = FabricAttacker::join(&fabric, &[ip("10.98.0.3")]);
    let before = l.server.mad_counts().received;
    let forged = dreq(
        9,
        l.c_conn.cm_id().comm_id(),
        l.s_conn.cm_id().comm_id(),
        l.s.qp.qp_num(),
    );
    liar.send_mad(ip("10.98.0.3"), l.server.local_ip(), &forged);
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
    let _turn = turn();
    let fabric = Fabric::threaded();
    let l = live(&fabric, 99, 7604);
    let liar = FabricAttacker::join(&fabric, &[]);
    let forged = dreq(
        9,
        l.c_conn.cm_id().comm_id(),
        l.s_conn.cm_id().comm_id(),
        l.s.qp.qp_num(),
    );
    liar.send_mad(l.client.local_ip(), l.server.local_ip(), &forged);
    l.s_conn.notify_disconnect_blocking(T).unwrap();
    l.s_conn.disconnect(&l.s.qp).unwrap();
    l.c_conn.notify_disconnect_blocking(T).unwrap();
    assert_eq!(l.c.qp.state(), QpState::Err);
}

/// An IP address.
fn ip(s: &str) -> IpAddr {
    s.parse().expect("an IP address")
}

/// The CM of a soft device of its own on `fabric`, at `ip`.
fn cm_on(fabric: &Fabric, at: &str) -> Dev {
    let dev = SoftDevice::attach(fabric, DeviceConfig::with_ip(ip(at))).expect("attach");
    let ctx = portverbs::open(AnyDevice::Soft(dev)).expect("open");
    CmDevice::open_blocking(&ctx, ip(at)).expect("the CM opens")
}

/// Drives `dev` until its QP1 has received `count` MADs in all.
fn pump_until_received(dev: &Dev, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.mad_counts().received < count {
        dev.progress().expect("progress");
        assert!(
            Instant::now() < deadline,
            "QP1 received {} of {count} MADs",
            dev.mad_counts().received
        );
        thread::yield_now();
    }
    dev.progress().expect("progress");
}

/// A thread that drives a device's CM while it lives, as an application's calls would. The
/// devices here run their CM on their own progress thread as well; the cases hold on a device
/// without one (whose CM answers only when something calls) too.
struct Driver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Driver {
    /// Starts driving `dev`.
    fn start(dev: &Dev) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (dev, flag) = (dev.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                dev.progress().expect("progress");
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
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits (at most 30 s, driving nothing itself) until `what` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

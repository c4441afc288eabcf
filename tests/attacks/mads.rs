//! Attacks on the connection manager: MADs are UD datagrams to QP1 with a Q_Key everybody
//! knows, so anyone who can reach the port can send them from any address. The suite holds
//! the CM to: a MAD is parsed within the bytes that arrived (IBTA 13.4: a MAD is 256 bytes;
//! anything shorter is malformed and answered by nobody); what a stranger can make it keep
//! (address handles, endpoints, queued requests) is bounded; a message that acts on a live
//! connection is taken only from that connection's peer.
//!
//! Each attack runs on an in-process fabric (the attacker a node of its own that claims
//! whatever source address it likes) and over UDP on loopback (raw sockets bound to as many
//! loopback addresses as the attack wants), against a server whose application drives its CM
//! from a thread, as `rping -s` does.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, FabricConfig, LinkFaults, Mode, SoftDevice};
use portverbs::udp_port::UdpConfig;

use super::attacker::{FabricAttacker, Forge, Forged, UdpAttacker, UdpImpostor};
use super::cm_mads::{ForgedReq, ReqTimers, dreq};
use super::rss::{Rss, turn};
use crate::cm_util::{self, Dev, Side, poll_one};

const PORT: u16 = 7471;

/// Where the CM attacks run.
#[derive(Debug, Clone, Copy)]
enum Net {
    /// Two soft devices and the attacker on a free-running in-process fabric.
    Fabric,
    /// Two UDP-bound soft devices on loopback, the attacker on raw sockets.
    Udp,
}

/// A server and a client CM, an attacker, and a thread that drives both CMs (the server's
/// application loop, and the client's between its calls).
struct Rig {
    server: Dev,
    client: Dev,
    server_ip: IpAddr,
    attacker: Attacker,
    stop: Arc<AtomicBool>,
    driver: Option<JoinHandle<()>>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

enum Attacker {
    Fabric(FabricAttacker),
    Udp(UdpAttacker),
}

impl Rig {
    /// `claims`: stranger addresses (by index) whose replies the attacker wants to see.
    fn new(net: Net, tag: u8, claims: &[u32]) -> Self {
        let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
        let (server_ip, client_ip, server_ctx, client_ctx, attacker) = match net {
            Net::Fabric => {
                let fabric = Fabric::new(FabricConfig {
                    mode: Mode::Threaded,
                    seed: u64::from(tag),
                    faults: LinkFaults::NONE,
                    capture: None,
                    bottleneck: None,
                });
                let ips: [IpAddr; 2] = [[10, 70, tag, 1].into(), [10, 70, tag, 2].into()];
                let ctxs: Vec<Context> = ips
                    .iter()
                    .map(|ip| {
                        let d = SoftDevice::attach(&fabric, DeviceConfig::with_ip(*ip)).unwrap();
                        portverbs::open(AnyDevice::Soft(d)).unwrap()
                    })
                    .collect();
                let claims: Vec<IpAddr> = claims
                    .iter()
                    .map(|&i| stranger_of(Net::Fabric, tag, i))
                    .collect();
                let attacker = Attacker::Fabric(FabricAttacker::join(&fabric, &claims));
                keep.push(Box::new(fabric));
                (ips[0], ips[1], ctxs[0].clone(), ctxs[1].clone(), attacker)
            }
            Net::Udp => {
                let ips: [IpAddr; 2] = [[127, 70, tag, 1].into(), [127, 70, tag, 2].into()];
                let devs: Vec<portverbs::UdpDevice> = ips
                    .iter()
                    .enumerate()
                    .map(|(i, ip)| {
                        portverbs::udp_device(&format!("hcm{tag}_{i}"), UdpConfig::new(*ip))
                            .unwrap()
                    })
                    .collect();
                let ctxs: Vec<Context> = devs
                    .iter()
                    .map(|d| portverbs::open(d.any()).unwrap())
                    .collect();
                for d in devs {
                    keep.push(Box::new(d));
                }
                let attacker = Attacker::Udp(UdpAttacker::new(portverbs_wire::ROCEV2_UDP_PORT));
                (ips[0], ips[1], ctxs[0].clone(), ctxs[1].clone(), attacker)
            }
        };
        let server = CmDevice::open_blocking(&server_ctx, server_ip).unwrap();
        let client = CmDevice::open_blocking(&client_ctx, client_ip).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let driver = {
            let (s, c, stop) = (server.clone(), client.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let _ = s.progress();
                    let _ = c.progress();
                    thread::sleep(Duration::from_millis(1));
                }
            })
        };
        Self {
            server,
            client,
            server_ip,
            attacker,
            stop,
            driver: Some(driver),
            _keep: keep,
        }
    }

    fn send(&self, pkts: &[Forged]) {
        match &self.attacker {
            Attacker::Fabric(f) => {
                for chunk in pkts.chunks(256) {
                    f.send(chunk);
                }
            }
            Attacker::Udp(u) => {
                u.send(pkts);
            }
        }
    }

    /// What the attacker saw come back to the addresses it claims (on UDP: listen with a
    /// [`UdpImpostor`] instead).
    fn replies_on_fabric(&self) -> u64 {
        match &self.attacker {
            Attacker::Fabric(f) => f.received(),
            Attacker::Udp(_) => 0,
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.driver.take() {
            let _ = t.join();
        }
    }
}

/// The `i`-th stranger address of rig `tag`: distinct for every `i`, none a device's.
fn stranger_of(net: Net, tag: u8, i: u32) -> IpAddr {
    let n = i + 3;
    let (hi, lo) = ((n >> 8) as u8, n as u8);
    match net {
        Net::Fabric => [10, 80 + tag, hi, lo].into(),
        Net::Udp => [127, 80 + tag, hi, lo].into(),
    }
}

/// A REQ for `port` on `dst` from `src`, as rdma_cm sends one (CMA header in the private
/// data), with both CM response timeouts `timeout` (5 bits each, 4.096 µs · 2^x), local ACK
/// timeout 18 and 15 retries.
fn req_mad(comm_id: u32, src: IpAddr, dst: IpAddr, port: u16, timeout: u8) -> [u8; 256] {
    ForgedReq::new(comm_id, src, dst, port)
        .timers(ReqTimers {
            remote_cm_response_timeout: timeout,
            local_cm_response_timeout: timeout,
            local_ack_timeout: 18,
            max_cm_retries: 15,
        })
        .mad(u64::from(comm_id))
}

/// Waits (driving nothing itself: the rig's thread does) until `cond` holds or 10 s passed;
/// returns whether it held.
fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// An RC QP, its CQ and a registered buffer on `dev`'s device.
fn side(dev: &Dev) -> Side {
    cm_util::side(dev.context(), None)
}

/// Point 3: MADs shorter than 256 bytes, of every CM attribute and of lengths from 0 up,
/// from a stranger, right after a full ring of QP1's receive buffers was filled by another
/// host's well-formed MADs. Each is malformed: parsed within the bytes that arrived, it is
/// dropped and counted, and nothing goes back to the stranger — before, the bytes beyond a
/// short MAD were the previous sender's, so a truncated REQ could become a valid one and a
/// DREP sent to the stranger could carry the other host's communication IDs.
fn short_mads_are_malformed_and_answer_nobody(net: Net) {
    let _turn = turn();
    let rig = Rig::new(net, 1, &[1]);
    let y = stranger_of(net, 1, 1);
    let x = stranger_of(net, 1, 2);
    let ear = match net {
        Net::Udp => Some(UdpImpostor::bind(y)),
        Net::Fabric => None,
    };
    let mut listener = Listener::bind(&rig.server, SocketAddr::new(rig.server_ip, PORT)).unwrap();
    listener.listen(8).unwrap();
    let rss = Rss::start();
    // Host X fills QP1's receive ring (512 buffers) with full, well-formed DREQs for
    // connections that do not exist (each answered, as unmatched, or dropped).
    let from_x = Forge::new(x, rig.server_ip);
    let full: Vec<Forged> = (0..600u32)
        .map(|i| from_x.mad(&dreq(u64::from(i), 0xA0A0_0000 + i, 0xB0B0_0000 + i, 0x77)))
        .collect();
    let before = rig.server.mad_counts().received;
    for (i, chunk) in full.chunks(100).enumerate() {
        rig.send(chunk);
        // Paced to what the ring takes; UDP may lose a few on the way (the port's queue to
        // its fabric is bounded), which only leaves a few slots with older bytes.
        let want = before + 90 * (i as u64 + 1);
        wait_for(|| rig.server.mad_counts().received >= want);
    }
    // The stranger: prefixes of a REQ for the listener, of a DREQ and of every other
    // attribute, from 0 bytes to 255.
    let from_y = Forge::new(y, rig.server_ip);
    let templates = [
        req_mad(0xC0C0_0001, y, rig.server_ip, PORT, 20),
        dreq(2, 0xC0C0_0002, 0xB0B0_0001, 0x77),
    ];
    let mut short = Vec::new();
    for t in &templates {
        for len in [0usize, 1, 23, 24, 25, 32, 64, 100, 128, 200, 232, 255] {
            short.push(from_y.mad(&t[..len]));
        }
    }
    let malformed = rig.server.stats().malformed;
    rig.send(&short);
    let counted = wait_for(|| rig.server.stats().malformed >= malformed + short.len() as u64);
    // Give replies, if any were sent, time to come back.
    thread::sleep(Duration::from_millis(200));
    let replies = match &ear {
        Some(e) => e.received.load(Ordering::Acquire),
        None => rig.replies_on_fabric(),
    };
    assert_eq!(replies, 0, "the CM answered a stranger's short MADs");
    assert!(
        counted,
        "{} short MADs, {} counted malformed",
        short.len(),
        rig.server.stats().malformed - malformed
    );
    assert!(
        listener.try_get_request().is_none(),
        "a truncated REQ became a connection request"
    );
    rss.check("short MADs after a full receive ring", 8.0);
}

/// Point 4: DREQs for connections that do not exist, each from a source address of its own.
/// The CM answers an unmatched DREQ with a DREP (IBTA 12.9.8.5, Linux's cm.c), so each one
/// makes it reach a new peer; the address handles it makes for them, and everything else it
/// keeps per peer, stay bounded, and nothing is left when the flood ends. The bound on RSS,
/// 16 MiB: the CM's bounded caches and QP1's rings are allocated already; what grows is
/// per-MAD bookkeeping that is given back.
fn a_dreq_flood_from_many_sources_leaves_bounded_state(net: Net) {
    let _turn = turn();
    let rig = Rig::new(net, 2, &[]);
    let sources = match net {
        Net::Fabric => 20_000u32,
        Net::Udp => 4_000,
    };
    let ctx = rig.server.context().clone();
    let ahs_before = ctx.object_counts().ahs;
    let rss = Rss::start();
    let before = rig.server.mad_counts().received;
    for batch in (0..sources).collect::<Vec<_>>().chunks(200) {
        let pkts: Vec<Forged> = batch
            .iter()
            .map(|&i| {
                Forge::new(stranger_of(net, 2, i + 256), rig.server_ip).mad(&dreq(
                    u64::from(i),
                    0xD000_0000 + i,
                    0xE000_0000 + i,
                    0x99,
                ))
            })
            .collect();
        rig.send(&pkts);
        if let Attacker::Udp(u) = &rig.attacker {
            u.close_all();
        }
        // Pace the flood to what QP1's 512 receive buffers take between two drives.
        let want = before + u64::from(batch[batch.len() - 1] + 1) * 9 / 10;
        wait_for(|| rig.server.mad_counts().received >= want);
    }
    wait_for(|| rig.server.mad_counts().received >= before + u64::from(sources) * 9 / 10);
    let ahs = ctx.object_counts().ahs - ahs_before;
    let live = rig.server.live_endpoints();
    let bytes = rig.server.state_bytes();
    println!(
        "{sources} DREQs: {} received, {ahs} address handles, {live} endpoints, {bytes} B of CM state",
        rig.server.mad_counts().received - before
    );
    assert!(ahs <= 1024, "{ahs} address handles for {sources} strangers");
    assert!(live <= 16, "{live} endpoints left after the flood");
    rss.check("DREQs from many sources", 16.0);
}

/// Point 5: a DREQ that names a live connection's communication IDs and QPN exactly (what a
/// stranger learns from a leak, or guesses), from an address that is not the connection's
/// peer, changes nothing: the connection stays up and carries a SEND. The same DREQ from the
/// peer is a disconnect, and both sides hear of it.
fn a_forged_dreq_for_a_live_connection_changes_nothing(net: Net) {
    let _turn = turn();
    let rig = Rig::new(net, 3, &[]);
    let dst = SocketAddr::new(rig.server_ip, PORT);
    let mut listener = Listener::bind(&rig.server, dst).unwrap();
    listener.listen(4).unwrap();
    let (s, c) = (side(&rig.server), side(&rig.client));
    let server = {
        let qp = s.qp.clone();
        thread::spawn(move || {
            let req = listener
                .get_request_blocking(Some(Duration::from_secs(20)))
                .unwrap();
            req.accept_blocking(&qp, &ConnParam::default()).unwrap()
        })
    };
    let mut conn = Connector::new(&rig.client).unwrap();
    conn.resolve_blocking(dst).unwrap();
    conn.connect_blocking(&c.qp, &ConnParam::default()).unwrap();
    let accepted = server.join().unwrap();
    let (client_id, server_id) = (conn.cm_id().comm_id(), accepted.cm_id().comm_id());
    // From a stranger, and from the client's IP with another CA: only the GID is checked
    // here, since the peer's address is all a RoCE port knows of it.
    let forged_dreq = dreq(1, client_id, server_id, s.qp.qp_num());
    let forged = [
        Forge::new(stranger_of(net, 3, 7), rig.server_ip).mad(&forged_dreq),
        Forge::new(stranger_of(net, 3, 8), rig.server_ip).mad(&forged_dreq),
    ];
    let before = rig.server.mad_counts().received;
    rig.send(&forged);
    assert!(wait_for(|| rig.server.mad_counts().received >= before + 2));
    thread::sleep(Duration::from_millis(50));
    assert!(
        !accepted.try_disconnected(),
        "a stranger's DREQ disconnected the server"
    );
    assert_eq!(s.qp.state(), QpState::Rts, "the server's QP left RTS");
    // The connection still carries data.
    s.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[s.mr.sge(0, 64).unwrap()],
    }])
    .unwrap();
    c.mr.write(0, b"still connected").unwrap();
    let sge = [c.mr.sge(0, 15).unwrap()];
    c.qp.post_send(&[SendWr::new(2, SendOp::Send)
        .sges(&sge)
        .flags(SendFlags::SIGNALED)])
        .unwrap();
    for cq in [&c.cq, &s.cq] {
        let wc = poll_one(cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let mut got = [0u8; 15];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still connected");
    // The real peer disconnects: the server hears it.
    conn.disconnect(&c.qp).unwrap();
    assert!(
        wait_for(|| accepted.try_disconnected()),
        "the peer's own DREQ did not reach the server"
    );
}

/// Points 4 and 5: REQs for the server's listener from many source addresses, each
/// proposing the longest CM response timeouts (31: 4.096 µs · 2^31, 2.4 hours per try) and
/// the most retries. The server's application takes every request and accepts it on a QP of
/// its own without waiting (as an event-driven rdma_cm server does), so the forged
/// connections wait for RTUs that never come; the CM answers each stranger (REP, or REJ when
/// the backlog is full), and what it keeps per stranger stays bounded. A real client that
/// connects in the middle of the flood is served. The bound on RSS, 40 MiB: the server
/// application's own QPs for the 600 requests it accepts (about 36 KiB each on the soft
/// device, 21 MiB) plus the CM's bounded caches.
fn a_req_flood_from_many_sources_leaves_room_for_real_clients(net: Net) {
    let _turn = turn();
    let rig = Rig::new(net, 4, &[]);
    let forged = 600u32;
    let dst = SocketAddr::new(rig.server_ip, PORT);
    let mut listener = Listener::bind(&rig.server, dst).unwrap();
    // A backlog that holds a burst: a full one answers REJ 28 (busy), as a TCP listener
    // drops SYNs, and a client that meets it is refused, not served.
    listener.listen(1024).unwrap();
    let ctx = rig.server.context().clone();
    let ahs_before = ctx.object_counts().ahs;
    let rss = Rss::start();
    // The server's application: every request accepted on a QP of its own, nobody waited for.
    let stop = Arc::new(AtomicBool::new(false));
    let app = {
        let (dev, stop) = (rig.server.clone(), stop.clone());
        thread::spawn(move || {
            let mut held = Vec::new();
            let mut established = 0usize;
            while !stop.load(Ordering::Acquire) {
                match listener.try_get_request() {
                    Some(req) => {
                        let s = side(&dev);
                        if let Ok(conn) = req.accept_nowait(&s.qp, &ConnParam::default()) {
                            held.push((conn, s));
                        }
                    }
                    None => thread::sleep(Duration::from_millis(1)),
                }
                held.retain(|(conn, _)| match conn.try_connected() {
                    Some(Ok(_)) => {
                        established += 1;
                        true
                    }
                    Some(Err(_)) => false,
                    None => true,
                });
            }
            (held.len(), established)
        })
    };
    let sources: Vec<u32> = (0..forged).collect();
    for (k, batch) in sources.chunks(50).enumerate() {
        let pkts: Vec<Forged> = batch
            .iter()
            .map(|&i| {
                let src = stranger_of(net, 4, i + 256);
                Forge::new(src, rig.server_ip).mad(&req_mad(
                    0xF000_0000 + i,
                    src,
                    rig.server_ip,
                    PORT,
                    31,
                ))
            })
            .collect();
        rig.send(&pkts);
        if let Attacker::Udp(u) = &rig.attacker {
            u.close_all();
        }
        if k == 3 {
            // A real client, in the middle of the flood.
            let c = side(&rig.client);
            let mut conn = Connector::new(&rig.client).unwrap();
            conn.resolve_blocking(dst).unwrap();
            conn.connect_blocking(&c.qp, &ConnParam::default())
                .expect("a real client is served during a REQ flood");
        }
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let (held, established) = app.join().unwrap();
    let ahs = ctx.object_counts().ahs - ahs_before;
    println!(
        "{forged} forged REQs: the application holds {held} connections ({established} \
         established), {ahs} address handles, {} B of CM state",
        rig.server.state_bytes()
    );
    assert!(ahs <= 512, "{ahs} address handles for {forged} strangers");
    rss.check("REQs from many sources", 40.0);
}

mod fabric {
    use super::Net;

    #[test]
    fn short_mads_are_malformed_and_answer_nobody() {
        super::short_mads_are_malformed_and_answer_nobody(Net::Fabric);
    }

    #[test]
    fn a_dreq_flood_from_many_sources_leaves_bounded_state() {
        super::a_dreq_flood_from_many_sources_leaves_bounded_state(Net::Fabric);
    }

    #[test]
    fn a_forged_dreq_for_a_live_connection_changes_nothing() {
        super::a_forged_dreq_for_a_live_connection_changes_nothing(Net::Fabric);
    }

    #[test]
    fn a_req_flood_from_many_sources_leaves_room_for_real_clients() {
        super::a_req_flood_from_many_sources_leaves_room_for_real_clients(Net::Fabric);
    }
}

mod udp {
    use super::Net;

    #[test]
    fn short_mads_are_malformed_and_answer_nobody() {
        super::short_mads_are_malformed_and_answer_nobody(Net::Udp);
    }

    #[test]
    fn a_dreq_flood_from_many_sources_leaves_bounded_state() {
        super::a_dreq_flood_from_many_sources_leaves_bounded_state(Net::Udp);
    }

    #[test]
    fn a_forged_dreq_for_a_live_connection_changes_nothing() {
        super::a_forged_dreq_for_a_live_connection_changes_nothing(Net::Udp);
    }

    #[test]
    fn a_req_flood_from_many_sources_leaves_room_for_real_clients() {
        super::a_req_flood_from_many_sources_leaves_room_for_real_clients(Net::Udp);
    }
}

//! The CM's connection semantics, as librdmacm and Linux's CM give them: the path MTU of the
//! ports, connection parameters checked against the device before anything is sent, remote
//! READ/atomic rights only with responder resources, `ConnParam::default()` as
//! `rdma_connect(id, NULL)` (the device's maximum depths), EADDRINUSE for a second bind,
//! receives posted before accept/connect, and the options TOS, ACK timeout, flow control
//! and SRQ on the QPs and on the wire.
//!
//! Each test has a fabric of its own (soft devices whose port MTU the test chooses), or
//! UDP-bound devices on loopback addresses of its own.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::Duration;

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, ServiceError};
use portverbs::cm::wire::{CmMessage, Mad, RejReason};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};

mod cm_util;
use cm_util::{Dev, Side, T, ctx_of, poll_one, post_recv, settle, side};

/// The CM of a soft device on `fabric` at `ip`, whose port's active MTU is `mtu`.
fn soft_cm(fabric: &Fabric, ip: &str, mtu: Mtu) -> Dev {
    let ip: IpAddr = ip.parse().unwrap();
    let mut config = DeviceConfig::with_ip(ip);
    config.ports[0].mtu = mtu;
    let dev = SoftDevice::attach(fabric, config).unwrap();
    let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).unwrap();
    CmDevice::open_blocking(&ctx, ip).unwrap()
}

/// Two soft devices' CMs on a fabric of their own, with these port MTUs.
fn pair(mtus: [Mtu; 2]) -> (Fabric, Dev, Dev) {
    let fabric = Fabric::threaded();
    let a = soft_cm(&fabric, "10.88.0.1", mtus[0]);
    let b = soft_cm(&fabric, "10.88.0.2", mtus[1]);
    (fabric, a, b)
}

/// A connection from `a` to `b` on `port`: `b` accepts with `accept`, `a` connects with
/// `connect`. Returns each side's QP with its connector.
fn connect(
    a: &Dev,
    b: &Dev,
    port: u16,
    connect: &ConnParam,
    accept: ConnParam,
) -> ((Side, Connector<AnyDevice>), (Side, Connector<AnyDevice>)) {
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

/// Disconnects both sides and waits until nothing is left.
fn close(a: &Dev, b: &Dev, ends: ((Side, Connector<AnyDevice>), (Side, Connector<AnyDevice>))) {
    let ((sa, ca), (sb, cb)) = ends;
    ca.disconnect(&sa.qp).unwrap();
    cb.notify_disconnect_blocking(T).unwrap();
    cb.disconnect(&sb.qp).unwrap();
    ca.notify_disconnect_blocking(T).unwrap();
    drop((ca, cb));
    settle(&[a, b]);
}

fn attr(s: &Side) -> QpAttr {
    s.qp.query_blocking().unwrap()
}

// ---- 1. path MTU ------------------------------------------------------------------------

#[test]
fn both_qps_get_the_4096_mtu_of_their_ports() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let ends = connect(&a, &b, 7601, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu4096);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu4096);
    close(&a, &b, ends);
}

#[test]
fn a_conn_param_mtu_is_used_and_cut_to_the_port() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let small = ConnParam {
        path_mtu: Some(Mtu::Mtu1024),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7602, &small, ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu1024);
    // The REQ said 1024: the passive side takes no more.
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu1024);
    close(&a, &b, ends);

    // Asking more than the port has gets the port's.
    let (_f, a, b) = pair([Mtu::Mtu2048, Mtu::Mtu2048]);
    let big = ConnParam {
        path_mtu: Some(Mtu::Mtu4096),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7603, &big, big.clone());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu2048);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    close(&a, &b, ends);
}

#[test]
fn the_passive_side_takes_the_smaller_of_the_req_mtu_and_its_port() {
    // a's port 4096, b's 2048.
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu2048]);
    assert_eq!((a.port_mtu(), b.port_mtu()), (Mtu::Mtu4096, Mtu::Mtu2048));
    // a connects: its REQ says 4096, b's QP gets its port's 2048.
    let ends = connect(&a, &b, 7604, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    // The REP carries no MTU: a keeps its port's (as Linux's CM does).
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu4096);
    close(&a, &b, ends);
    // b connects: both get 2048 (the REQ's, a's port allowing more).
    let ends = connect(&b, &a, 7605, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu2048);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    close(&b, &a, ends);
}

// ---- 2. parameters checked first; remote access ------------------------------------------

#[test]
fn depths_beyond_the_device_fail_connect_with_nothing_sent() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let dev = ctx_of(&a).query_device_blocking().unwrap();
    let dst = SocketAddr::new(b.local_ip(), 7606);
    let mut listener = Listener::bind(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let s = side(&ctx_of(&a), None);
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let over = |n: u32| u8::try_from(n + 1).unwrap();
    let cases = [
        (
            ConnParam {
                responder_resources: Some(over(dev.max_qp_rd_atom)),
                ..ConnParam::default()
            },
            "responder_resources",
            dev.max_qp_rd_atom,
        ),
        (
            ConnParam {
                initiator_depth: Some(over(dev.max_qp_init_rd_atom)),
                ..ConnParam::default()
            },
            "initiator_depth",
            dev.max_qp_init_rd_atom,
        ),
        (
            ConnParam {
                ack_timeout: Some(32),
                ..ConnParam::default()
            },
            "ack_timeout",
            31,
        ),
    ];
    let sent = a.mad_counts().sent;
    for (param, field, limit) in cases {
        match conn.connect_blocking(&s.qp, &param) {
            Err(ServiceError::InvalidParam { name, max, .. }) => {
                assert_eq!((name, max), (field, limit));
            }
            other => panic!("{field}: {other:?}"),
        }
        // Nothing left, and the QP is untouched.
        assert_eq!(a.mad_counts().sent, sent, "{field}");
        assert_eq!(s.qp.state(), QpState::Reset, "{field}");
    }
    // The peer saw no request.
    assert!(matches!(
        listener.get_request_blocking(Some(Duration::from_millis(200))),
        Err(ServiceError::TimedOut)
    ));
    // The device's maximum itself is fine.
    let max = ConnParam {
        responder_resources: Some(u8::try_from(dev.max_qp_rd_atom).unwrap()),
        ..ConnParam::default()
    };
    let passive = thread::spawn(move || {
        let s = side(&ctx_of(&b), None);
        let conn = listener
            .get_request_blocking(T)
            .unwrap()
            .accept_blocking(&s.qp, &ConnParam::default())
            .unwrap();
        conn.notify_disconnect_blocking(T).unwrap();
        conn.disconnect(&s.qp).unwrap();
        b
    });
    conn.connect_blocking(&s.qp, &max).unwrap();
    conn.disconnect(&s.qp).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    let b = passive.join().unwrap();
    drop(conn);
    settle(&[&a, &b]);
}

#[test]
fn depths_beyond_the_device_fail_accept_before_the_rep() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let max = ctx_of(&b).attr().max_qp_init_rd_atom;
    let dst = SocketAddr::new(b.local_ip(), 7607);
    let mut listener = Listener::bind(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let b = b.clone();
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            let req = listener.get_request_blocking(T).unwrap();
            let param = ConnParam {
                initiator_depth: Some(u8::try_from(max + 1).unwrap()),
                ..ConnParam::default()
            };
            let r = req.accept_blocking(&s.qp, &param);
            assert!(
                matches!(
                    r,
                    Err(ServiceError::InvalidParam {
                        name: "initiator_depth",
                        ..
                    })
                ),
                "{r:?}"
            );
            // No REP: the QP never left RESET.
            assert_eq!(s.qp.state(), QpState::Reset);
        })
    };
    let s = side(&ctx_of(&a), None);
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    // The request, dropped by the failed accept, is refused as any dropped request.
    match conn.connect_blocking(&s.qp, &ConnParam::default()) {
        Err(ServiceError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejReason::ConsumerReject)
        }
        other => panic!("{other:?}"),
    }
    passive.join().unwrap();
    drop(conn);
    settle(&[&a, &b]);
}

#[test]
fn default_depths_are_the_device_maximum_and_grant_read() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let dev = ctx_of(&a).attr().clone();
    let ends = connect(&a, &b, 7608, &ConnParam::default(), ConnParam::default());
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    for s in [&ends.0.0, &ends.1.0] {
        let q = attr(s);
        assert_eq!(u32::from(q.max_rd_atomic), dev.max_qp_init_rd_atom);
        assert_eq!(u32::from(q.max_dest_rd_atomic), dev.max_qp_rd_atom);
        assert!(
            q.qp_access_flags.contains(remote),
            "{:?}",
            q.qp_access_flags
        );
    }
    close(&a, &b, ends);
}

#[test]
fn no_responder_resources_no_remote_read_and_a_read_fails() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let accept = ConnParam {
        responder_resources: Some(0),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7609, &ConnParam::default(), accept);
    let ((sa, _), (sb, _)) = &ends;
    let q = attr(sb);
    assert_eq!(q.max_dest_rd_atomic, 0);
    assert_eq!(q.qp_access_flags, AccessFlags::REMOTE_WRITE);
    // The REP granted no responder resources: the active side's initiator depth is 0.
    assert_eq!(attr(sa).max_rd_atomic, 0);

    let target = sb
        .qp
        .pd()
        .reg_vec_blocking(
            vec![7u8; 64],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey().unwrap(),
    };
    let sge = [sa.mr.sge(0, 8).unwrap()];
    sa.qp
        .post_send(&[SendWr::new(1, SendOp::RdmaRead { remote })
            .sges(&sge)
            .signaled()])
        .unwrap();
    let wc = poll_one(&sa.cq);
    assert_eq!(wc.wr_id, 1);
    // Not a silent success: the READ completes in error without reaching the peer.
    assert_eq!(wc.status, WcStatus::LocQpOpErr, "{wc:?}");
    close(&a, &b, ends);
}

// ---- 3. EADDRINUSE ---------------------------------------------------------------------

#[test]
fn a_second_bind_to_a_port_is_address_in_use_until_the_first_goes() {
    let (_f, _a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let addr = SocketAddr::new(b.local_ip(), 7610);
    let first = Listener::bind(&b, addr).unwrap();
    match Listener::bind(&b, addr) {
        Err(ServiceError::AddressInUse(at)) => assert_eq!(at, addr),
        other => panic!("{other:?}"),
    }
    // The unspecified address is the same port of the same device.
    let any = SocketAddr::new("0.0.0.0".parse().unwrap(), 7610);
    match Listener::bind(&b, any) {
        Err(e @ ServiceError::AddressInUse(_)) => {
            assert!(e.to_string().contains("0.0.0.0:7610"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Another port, and the same port in the UDP port space, are free.
    let other = Listener::bind(&b, SocketAddr::new(b.local_ip(), 7611)).unwrap();
    let udp = Listener::bind_udp(&b, addr).unwrap();
    drop(first);
    let again = Listener::bind(&b, addr).unwrap();
    drop((other, udp, again));
}

// ---- 5. receives before accept/connect -----------------------------------------------

#[test]
fn receives_posted_before_accept_and_connect_take_the_first_sends() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let no_rnr_retry = ConnParam {
        rnr_retry_count: 0,
        ..ConnParam::default()
    };
    let dst = SocketAddr::new(b.local_ip(), 7612);
    let mut listener = Listener::bind(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let passive = {
        let (b, param) = (b.clone(), no_rnr_retry.clone());
        thread::spawn(move || {
            let s = side(&ctx_of(&b), None);
            let req = listener.get_request_blocking(T).unwrap();
            // A QP in RESET takes no receives; init_qp moves it to INIT.
            req.init_qp_blocking(&s.qp).unwrap();
            assert_eq!(s.qp.state(), QpState::Init);
            post_recv(&s, 21);
            let conn = req.accept_blocking(&s.qp, &param).unwrap();
            // The client's SEND, sent as soon as it connected, found the receive.
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (21, WcStatus::Success));
            let mut got = [0u8; 5];
            s.mr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"first");
            // And the server's, the client's.
            s.mr.write(0, b"back!").unwrap();
            let sge = [s.mr.sge(0, 5).unwrap()];
            s.qp.post_send(&[SendWr::new(22, SendOp::Send).sges(&sge).signaled()])
                .unwrap();
            let wc = poll_one(&s.cq);
            assert_eq!((wc.wr_id, wc.status), (22, WcStatus::Success));
            conn.notify_disconnect_blocking(T).unwrap();
            conn.disconnect(&s.qp).unwrap();
        })
    };
    let s = side(&ctx_of(&a), None);
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    // In RESET the QP refuses receives: the clear way is init_qp.
    assert!(
        s.qp.post_recv(&[RecvWr {
            wr_id: 0,
            sges: &[s.mr.sge(0, 8).unwrap()],
        }])
        .is_err()
    );
    conn.init_qp_blocking(&s.qp).unwrap();
    post_recv(&s, 11);
    conn.connect_blocking(&s.qp, &no_rnr_retry).unwrap();
    // No RNR retry: a SEND that found no receive would fail with RNR_RETRY_EXC_ERR.
    assert_eq!(attr(&s).rnr_retry, 0);
    s.mr.write(2048, b"first").unwrap();
    let sge = [s.mr.sge(2048, 5).unwrap()];
    s.qp.post_send(&[SendWr::new(12, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let wc = poll_one(&s.cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        seen.push(wc.wr_id);
    }
    seen.sort_unstable();
    assert_eq!(seen, [11, 12]);
    let mut got = [0u8; 5];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"back!");
    conn.disconnect(&s.qp).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    passive.join().unwrap();
    drop(conn);
    settle(&[&a, &b]);
}

#[test]
fn init_qp_refuses_a_second_qp_and_a_used_one() {
    let (_f, a, _b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let (s1, s2) = (side(&ctx_of(&a), None), side(&ctx_of(&a), None));
    let c1 = Connector::new(&a).unwrap();
    let c2 = Connector::new(&a).unwrap();
    c1.init_qp_blocking(&s1.qp).unwrap();
    // Again with the same QP: nothing changes.
    c1.init_qp_blocking(&s1.qp).unwrap();
    assert!(matches!(
        c1.init_qp_blocking(&s2.qp),
        Err(ServiceError::WrongQp(_))
    ));
    assert!(matches!(
        c2.init_qp_blocking(&s1.qp),
        Err(ServiceError::QpInUse(_))
    ));
    assert_eq!(a.associated_qps(), 1);
    drop((c1, c2));
    assert_eq!(a.associated_qps(), 0);
}

// ---- 10. options ------------------------------------------------------------------------

#[test]
fn tos_and_ack_timeout_reach_the_qps() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let client = ConnParam {
        tos: 0x60,
        ack_timeout: Some(10),
        ..ConnParam::default()
    };
    let server = ConnParam {
        ack_timeout: Some(20),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7613, &client, server);
    let (qa, qb) = (attr(&ends.0.0), attr(&ends.1.0));
    assert_eq!(qa.ah_attr.traffic_class, 0x60);
    assert_eq!(qb.ah_attr.traffic_class, 0x60);
    assert_eq!(qa.timeout, 10);
    assert_eq!(qb.timeout, 20);
    close(&a, &b, ends);
    // Without them: TOS 0, and the path's timeout (the same on both sides here).
    let ends = connect(&a, &b, 7614, &ConnParam::default(), ConnParam::default());
    let (qa, qb) = (attr(&ends.0.0), attr(&ends.1.0));
    assert_eq!((qa.ah_attr.traffic_class, qb.ah_attr.traffic_class), (0, 0));
    assert!(qa.timeout != 10 && qb.timeout != 20);
    close(&a, &b, ends);
}

/// A peer that never answers: a UDP socket on the RoCEv2 port of `ip`; its datagrams' MADs.
struct Silent(std::net::UdpSocket);

impl Silent {
    fn bind(ip: &str) -> Self {
        let sock = std::net::UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 4791)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Self(sock)
    }

    /// The next REQ that arrives (BTH and DETH in front of the MAD).
    fn req(&self) -> portverbs::cm::wire::Req {
        let mut buf = [0u8; 2048];
        loop {
            let n = self.0.recv(&mut buf).unwrap();
            let Some(bytes) = buf.get(20..276).filter(|_| n >= 276) else {
                continue;
            };
            if let Ok(Mad {
                msg: CmMessage::Req(r),
                ..
            }) = Mad::parse(bytes)
            {
                return r;
            }
        }
    }
}

#[test]
fn the_req_carries_flow_control_srq_tos_mtu_and_the_device_depths() {
    let (ip, peer) = ("127.0.197.1", "127.0.197.2");
    let silent = Silent::bind(peer);
    let mut config = portverbs::udp_port::UdpConfig::new(ip.parse().unwrap());
    config.progress = portverbs::hal::Progress::Auto;
    let dev = portverbs::udp_device("cm_semantics", config).unwrap();
    let ctx = portverbs::open(dev.any()).unwrap();
    let a = CmDevice::open_blocking(&ctx, ip.parse().unwrap()).unwrap();
    let port_mtu = ctx.query_port_blocking(1).unwrap().active_mtu;
    let dst = SocketAddr::new(peer.parse().unwrap(), 7615);
    let quick = ConnParam {
        timeout: Some(Duration::from_millis(100)),
        ..ConnParam::default()
    };

    // Defaults, on a QP with an SRQ.
    let pd = ctx.alloc_pd_blocking().unwrap();
    let srq = pd
        .create_srq_blocking(SrqInit {
            max_wr: 8,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.srq = Some(&srq);
    let qp = pd.create_qp_blocking(init).unwrap();
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let r = conn.connect_blocking(&qp, &quick);
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    let req = silent.req();
    assert!(req.srq);
    assert!(!req.end_to_end_flow_control);
    assert_eq!(req.primary.traffic_class, 0);
    assert_eq!(req.path_mtu, port_mtu as u8);
    let max = |n: u32| u8::try_from(n).unwrap_or(u8::MAX);
    assert_eq!(req.responder_resources, max(ctx.attr().max_qp_rd_atom));
    assert_eq!(req.initiator_depth, max(ctx.attr().max_qp_init_rd_atom));
    drop(conn);

    // Every option set, on a QP without an SRQ.
    let s = side(&ctx, None);
    let param = ConnParam {
        flow_control: true,
        tos: 0xb8,
        path_mtu: Some(Mtu::Mtu1024),
        responder_resources: Some(2),
        initiator_depth: Some(3),
        ..quick
    };
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let r = conn.connect_blocking(&s.qp, &param);
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    let req = silent.req();
    assert!(!req.srq);
    assert!(req.end_to_end_flow_control);
    assert_eq!(req.primary.traffic_class, 0xb8);
    assert_eq!(req.path_mtu, Mtu::Mtu1024 as u8);
    assert_eq!((req.responder_resources, req.initiator_depth), (2, 3));
    drop(conn);
    drop(dev);
}

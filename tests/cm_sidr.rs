//! UD services through the CM (SIDR, `RDMA_PS_UDP`) between two UDP-bound devices of this
//! process on two loopback addresses, each with its own progress thread, as librdmacm's
//! `udaddy` uses them: the client resolves the service, sends with nothing but the address
//! handle the resolution returned, and the server answers each datagram with an address
//! handle made from its completion. What the CM carries both ways (private data to rdma_cm's
//! limits, the requester's address, the Q_Key) and the hop limit each address handle puts on
//! the wire (read back from the GRH the receiver gets: loopback lowers no TTL).
#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::Duration;

use portverbs::cm::service::{
    CmDevice, Connector, Listener, RDMA_UDP_QKEY, ROUTE_HOP_LIMIT, ServiceError, UdParam,
};
use portverbs::cm::wire::SidrStatus;
use portverbs::hal::Progress;
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::verbs::{AhError, GRH_LEN, GrhError, REPLY_HOP_LIMIT, ReceivedGrh};
use portverbs::{AnyDevice, UdpDevice, udp_device};

mod mcast_util;

use mcast_util::{Ud, completions};

type Dev = CmDevice<AnyDevice>;

const T: Option<Duration> = Some(Duration::from_secs(20));
const PATIENCE: Duration = Duration::from_secs(20);

fn udp_cm(name: &str, ip: &str) -> (UdpDevice, Dev) {
    let ip: IpAddr = ip.parse().unwrap();
    let mut config = UdpConfig::new(ip);
    config.progress = Progress::Auto;
    let dev = udp_device(name, config).unwrap_or_else(|e| panic!("{name} on {ip}: {e}"));
    let ctx = portverbs::open(dev.any()).unwrap();
    let cm = CmDevice::open_blocking(&ctx, ip).unwrap();
    (dev, cm)
}

/// A UD QP as rdma_cm brings up a `RDMA_PS_UDP` id's QP (Q_Key 0x01234567), a receive posted.
fn ud(cm: &Dev) -> Ud {
    let u = mcast_util::ud(cm.context(), RDMA_UDP_QKEY);
    u.post_recv(0);
    u
}

/// Sends `payload` from `from` through `ah` to QP `qpn` with `qkey`, its own QPN as immediate
/// data (as udaddy does), and waits for the send's completion.
fn send(from: &Ud, ah: &AddressHandle, qpn: u32, qkey: u32, payload: &[u8]) {
    from.mr.write(0, payload).unwrap();
    let sge = [from.mr.sge(0, payload.len()).unwrap()];
    let imm = from.qp.qp_num();
    let wr = SendWr::new(1, SendOp::SendWithImm { imm })
        .sges(&sge)
        .ud(ah.dest(qpn, qkey))
        .signaled();
    from.qp.post_send(&[wr]).unwrap();
    let wc = completions(&from.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1, "send completion");
    assert_eq!(
        (wc[0].opcode, wc[0].status),
        (WcOpcode::Send, WcStatus::Success)
    );
}

/// The next datagram `on` receives: its completion, GRH area and payload. Posts the next
/// receive.
fn recv(on: &Ud) -> (WorkCompletion, [u8; GRH_LEN], Vec<u8>) {
    let wc = completions(&on.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1, "no datagram came");
    let wc = wc[0];
    assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
    let mut grh = [0u8; GRH_LEN];
    on.mr.read(0, &mut grh).unwrap();
    let mut payload = vec![0u8; wc.byte_len as usize - GRH_LEN];
    on.mr.read(GRH_LEN, &mut payload).unwrap();
    on.post_recv(0);
    (wc, grh, payload)
}

/// What the passive side learnt from the request.
struct Asked {
    remote: SocketAddr,
    local: SocketAddr,
    private_data: Vec<u8>,
}

/// What [`serve_one`]'s thread hands back: the listener and QP, the request, the reply's
/// outcome.
type Served = (Listener<AnyDevice>, Ud, Asked, Result<(), ServiceError>);

/// Serves one request on `listener` with `server`'s QP and `param`.
fn serve_one(
    listener: Listener<AnyDevice>,
    server: Ud,
    param: UdParam,
) -> thread::JoinHandle<Served> {
    thread::spawn(move || {
        let req = listener.get_service_request_blocking(T).unwrap();
        let asked = Asked {
            remote: req.remote_addr(),
            local: req.local_addr(),
            private_data: req.private_data().to_vec(),
        };
        let r = req.reply_with(&server.qp, &param);
        (listener, server, asked, r)
    })
}

/// udaddy's exchange: resolved through the CM with private data both ways, a datagram to the
/// service through the returned address handle alone, and the answer through the handle the
/// server made from the datagram's completion.
#[test]
fn a_resolved_service_is_reached_through_its_handle_and_answers_from_the_completion() {
    let (_da, a) = udp_cm("cm_sidr_a", "127.0.95.1");
    let (_db, b) = udp_cm("cm_sidr_b", "127.0.95.2");
    let (client, server) = (ud(&a), ud(&b));
    let server_qpn = server.qp.qp_num();
    let dst = SocketAddr::new(b.local_ip(), 7190);
    let mut listener = Listener::bind_udp(&b, dst).unwrap();
    listener.listen(4).unwrap();

    let answer: Vec<u8> = (0..136).map(|i| 0x80 | i as u8).collect();
    let passive = serve_one(
        listener,
        server,
        UdParam {
            private_data: answer.clone(),
            ..UdParam::default()
        },
    );
    let question: Vec<u8> = (0..180).map(|i| i as u8).collect();
    let mut conn = Connector::new(&a).unwrap();
    let svc = conn.resolve_service_with_blocking(dst, &question).unwrap();
    let (_listener, server, asked, replied) = passive.join().unwrap();
    replied.unwrap();

    // The passive side: who asked (the requester's bound address), at which address, what.
    assert_eq!(asked.remote, conn.local_addr());
    assert_eq!(asked.remote.ip(), a.local_ip());
    assert_eq!(asked.local, dst);
    assert_eq!(
        asked.private_data, question,
        "all 180 bytes after the CMA header"
    );

    // The active side: the service, the reply's private data, a ready address vector.
    assert_eq!((svc.qpn, svc.qkey), (server_qpn, RDMA_UDP_QKEY));
    assert_eq!(
        svc.qkey, 0x0123_4567,
        "UdParam's default Q_Key is rdma_cm's"
    );
    assert_eq!(svc.private_data, answer, "all 136 bytes of the SIDR_REP");
    assert_eq!(svc.gid, Gid::from_ip(b.local_ip()));
    assert!(svc.av.is_global);
    assert_eq!(svc.av.dgid, svc.gid);
    assert_eq!(svc.av.sgid_index, a.gid_index());
    assert_eq!((svc.av.hop_limit, ROUTE_HOP_LIMIT), (64, 64));
    assert_eq!(svc.av.traffic_class, 0);

    // A datagram through the returned handle alone reaches the service, with TTL 64.
    let ah = svc.create_ah_blocking(&client.pd).unwrap();
    assert_eq!(ah.av().hop_limit, 64);
    send(&client, &ah, svc.qpn, svc.qkey, b"ping");
    let (wc, grh, payload) = recv(&server);
    assert_eq!(payload, b"ping");
    assert_eq!(wc.imm(), Some(client.qp.qp_num()));
    assert_eq!(wc.src_qp, client.qp.qp_num());
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    let got = ReceivedGrh::parse(&grh).unwrap();
    assert!(got.ipv4);
    assert_eq!(got.hop_limit, 64, "the IP TTL the datagram left with");
    assert_eq!(got.sgid, Gid::from_ip(a.local_ip()));

    // The server answers the sender with a handle made from the completion.
    let back = portverbs::hal::block_on(server.pd.create_ah_from_wc(&wc, &grh, 1)).unwrap();
    assert_eq!(back.av().dgid, Gid::from_ip(a.local_ip()), "GIDs swapped");
    assert_eq!(back.av().sgid_index, b.gid_index());
    assert_eq!(back.av().hop_limit, REPLY_HOP_LIMIT);
    assert!(back.av().is_global);
    let av = b.context().init_ah_from_wc_blocking(1, &wc, &grh).unwrap();
    assert_eq!(
        &av,
        back.av(),
        "init_ah_from_wc gives what the handle holds"
    );
    send(&server, &back, wc.src_qp, RDMA_UDP_QKEY, b"pong");
    let (wc, grh, payload) = recv(&client);
    assert_eq!(payload, b"pong");
    assert_eq!(wc.src_qp, server_qpn);
    assert_eq!(ReceivedGrh::parse(&grh).unwrap().hop_limit, 255);
}

/// rdma_cm's limits: 180 bytes to the service, 136 back; one byte more is a typed error.
/// Too much to send leaves nothing on the wire; a reply with too much is not sent, and the
/// request is refused as a dropped one is.
#[test]
fn private_data_beyond_rdma_cms_limits_is_a_typed_error() {
    let (_da, a) = udp_cm("cm_sidr_c", "127.0.95.3");
    let (_db, b) = udp_cm("cm_sidr_d", "127.0.95.4");
    let dst = SocketAddr::new(b.local_ip(), 7191);
    let mut listener = Listener::bind_udp(&b, dst).unwrap();
    listener.listen(4).unwrap();
    let mut conn = Connector::new(&a).unwrap();
    let r = conn.resolve_service_with_blocking(dst, &[1; 181]);
    assert!(
        matches!(
            r,
            Err(ServiceError::PrivateDataTooLong { len: 181, max: 180 })
        ),
        "{r:?}"
    );

    let passive = serve_one(
        listener,
        ud(&b),
        UdParam {
            private_data: vec![2; 137],
            ..UdParam::default()
        },
    );
    let r = portverbs::hal::block_on(conn.resolve_service_with(dst, &[1; 180]));
    let (_listener, _server, asked, replied) = passive.join().unwrap();
    assert_eq!(asked.private_data, [1; 180]);
    assert!(
        matches!(
            replied,
            Err(ServiceError::PrivateDataTooLong { len: 137, max: 136 })
        ),
        "{replied:?}"
    );
    assert!(
        matches!(r, Err(ServiceError::ServiceRejected(SidrStatus::Rejected))),
        "{r:?}"
    );
}

/// A handle from a completion needs the GRH the datagram came with: a completion without
/// one, a GRH area cut short or not an IP header, and a GRH sent to a GID this port does not
/// have are each a typed error.
#[test]
fn create_ah_from_wc_refuses_a_missing_or_malformed_grh() {
    let (_da, a) = udp_cm("cm_sidr_e", "127.0.95.5");
    let u = ud(&a);
    let mut grh = [0u8; GRH_LEN];
    let h = &mut grh[20..];
    h[0] = 0x45;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&[127, 0, 95, 9]);
    h[16..20].copy_from_slice(&[127, 0, 95, 5]);
    let wc = WorkCompletion {
        opcode: WcOpcode::Recv,
        wc_flags: WcFlags::GRH,
        ..WorkCompletion::default()
    };
    let av = a.context().init_ah_from_wc_blocking(1, &wc, &grh).unwrap();
    assert_eq!(av.dgid, Gid::from_ip("127.0.95.9".parse().unwrap()));

    let none = WorkCompletion {
        wc_flags: WcFlags::empty(),
        ..wc
    };
    let r = u.pd.create_ah_from_wc_blocking(&none, &grh, 1);
    assert!(matches!(r, Err(AhError::NoGrh { port: 1 })), "{r:?}");
    let r = u.pd.create_ah_from_wc_blocking(&wc, &grh[..39], 1);
    assert!(
        matches!(r, Err(AhError::BadGrh(GrhError::Truncated(39)))),
        "{r:?}"
    );
    let r = u.pd.create_ah_from_wc_blocking(&wc, &[0; GRH_LEN], 1);
    assert!(
        matches!(r, Err(AhError::BadGrh(GrhError::NoIpHeader { .. }))),
        "{r:?}"
    );
    let mut elsewhere = grh;
    elsewhere[39] = 77; // sent to 127.0.95.77, not this device
    let r = u.pd.create_ah_from_wc_blocking(&wc, &elsewhere, 1);
    assert!(
        matches!(r, Err(AhError::NotLocalGid { port: 1, .. })),
        "{r:?}"
    );
    let mut group = grh;
    group[36..40].copy_from_slice(&[239, 1, 1, 1]);
    let r = u.pd.create_ah_from_wc_blocking(&wc, &group, 1);
    assert!(
        matches!(r, Err(AhError::MulticastDestination { .. })),
        "{r:?}"
    );
    let r = u.pd.create_ah_from_wc_blocking(&wc, &grh, 2);
    assert!(matches!(r, Err(AhError::NoSuchPort { port: 2 })), "{r:?}");
}

/// What a hop limit of 0 means on the UDP port: the hop limit travels as given, as Linux's
/// rxe writes it into the IP header (0 there, which no router forwards); a socket cannot send
/// TTL 0, so it leaves as 1, which no router forwards either. The CM's address vector and
/// one made from a completion carry a routable hop limit instead.
#[test]
fn a_hop_limit_of_zero_leaves_as_ttl_one() {
    let (_da, a) = udp_cm("cm_sidr_f", "127.0.95.6");
    let (_db, b) = udp_cm("cm_sidr_g", "127.0.95.7");
    let (from, to) = (ud(&a), ud(&b));
    let ah = from
        .pd
        .create_ah_blocking(AddressVector {
            dgid: Gid::from_ip(b.local_ip()),
            sgid_index: a.gid_index(),
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    assert_eq!(ah.av().hop_limit, 0);
    send(&from, &ah, to.qp.qp_num(), RDMA_UDP_QKEY, b"short-lived");
    let (_, grh, payload) = recv(&to);
    assert_eq!(payload, b"short-lived");
    assert_eq!(ReceivedGrh::parse(&grh).unwrap().hop_limit, 1);
}

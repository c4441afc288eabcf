//! UD services through the CM (SIDR, `RDMA_PS_UDP`), as librdmacm's `udaddy` uses them: the
//! client resolves the service and sends with nothing but the address handle the resolution
//! returned, the server answers with a handle made from the datagram's completion; what the
//! CM carries both ways (private data to rdma_cm's limits, the requester's address, the
//! Q_Key), and the typed refusals of a handle made from a completion.

use std::net::{IpAddr, SocketAddr};
use std::thread;

use portverbs::cm::service::{
    Connector, Listener, RDMA_UDP_QKEY, ROUTE_HOP_LIMIT, ServiceError, UdParam,
};
use portverbs::cm::wire::SidrStatus;
use portverbs::prelude::*;
use portverbs::verbs::{AhError, GRH_LEN, GrhError, REPLY_HOP_LIMIT, ReceivedGrh};

use crate::cm_util::pair::{Backend, Pair};
use crate::cm_util::{Driver, T, ctx_of, poll_one, settle};
use crate::sidr_util::{recv, send, serve_one, ud};

/// UD service resolution (SIDR, `RDMA_PS_UDP`): the active side learns the service's QPN and
/// Q_Key and sends it a datagram; a port nobody listens on is refused.
fn sidr_resolves_a_ud_service(backend: Backend) {
    use portverbs::cm::service::UdService;
    use portverbs::verbs::{ConnectOptions, SpecialQp};
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7481);
    let mut listener = Listener::bind_udp(b, dst).unwrap();
    listener.listen(4).unwrap();
    let qkey = 0x0123_4567;
    let ud = |ctx: &Context| {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 16,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq)).unwrap();
        qp.ready_ud_blocking(&ConnectOptions {
            qkey,
            ..ConnectOptions::default()
        })
        .unwrap();
        let mr = pd
            .reg_vec_blocking(vec![0u8; 1024], AccessFlags::LOCAL_WRITE)
            .unwrap();
        (pd, cq, qp, mr)
    };
    let (_bpd, bcq, bqp, bmr) = ud(&ctx_of(b));
    bqp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[bmr.sge(0, 512).unwrap()],
    }])
    .unwrap();
    let bqpn = bqp.qp_num();
    let passive = thread::spawn(move || {
        let req = listener.get_service_request_blocking(T).unwrap();
        req.reply(&bqp, qkey).unwrap();
        (listener, bqp)
    });
    let mut conn = Connector::new(a).unwrap();
    let svc: UdService = conn.resolve_service_blocking(dst).unwrap();
    assert_eq!((svc.qpn, svc.qkey), (bqpn, qkey));
    let (listener, _bqp) = passive.join().unwrap();

    let (apd, acq, aqp, amr) = ud(&ctx_of(a));
    // The address handle the resolution returns, as it is: hop limit 64.
    let ah = svc.create_ah_blocking(&apd).unwrap();
    assert_eq!(ah.av().hop_limit, 64);
    amr.write(0, b"datagram").unwrap();
    let sge = [amr.sge(0, 8).unwrap()];
    let dest = ah.dest(svc.qpn, svc.qkey);
    aqp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sge).ud(dest).signaled()])
        .unwrap();
    assert_eq!(poll_one(&acq).status, WcStatus::Success);
    let wc = poll_one(&bcq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 8));
    let mut got = [0u8; 8];
    bmr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    assert_ne!(SpecialQp::GSI_QPN, svc.qpn);

    // Nobody listens on this UDP port: the SIDR_REP refuses.
    let _driver = Driver::start(b);
    let mut other = Connector::new(a).unwrap();
    let r = other.resolve_service_blocking(SocketAddr::new(b.local_ip(), 9));
    assert!(matches!(r, Err(ServiceError::ServiceRejected(_))), "{r:?}");
    drop((conn, other, listener));
    settle(&[a, b]);
}

/// udaddy's exchange: resolved through the CM with private data both ways, a datagram to the
/// service through the returned address handle alone, and the answer through the handle the
/// server made from the datagram's completion.
fn a_resolved_service_is_reached_through_its_handle_and_answers_from_the_completion(
    backend: Backend,
) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let (client, server) = (ud(a), ud(b));
    let server_qpn = server.qp.qp_num();
    let dst = SocketAddr::new(b.local_ip(), 7190);
    let mut listener = Listener::bind_udp(b, dst).unwrap();
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
    let mut conn = Connector::new(a).unwrap();
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
fn private_data_beyond_rdma_cms_limits_is_a_typed_error(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let dst = SocketAddr::new(b.local_ip(), 7191);
    let mut listener = Listener::bind_udp(b, dst).unwrap();
    listener.listen(4).unwrap();
    let mut conn = Connector::new(a).unwrap();
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
        ud(b),
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
fn create_ah_from_wc_refuses_a_missing_or_malformed_grh(backend: Backend) {
    let p = Pair::new(backend);
    let a = &p.a;
    let u = ud(a);
    // A datagram to this device's address from another address of its network.
    let IpAddr::V4(local) = a.local_ip() else {
        panic!("the pairs' devices have IPv4 addresses")
    };
    let [n0, n1, n2, n3] = local.octets();
    let peer = [n0, n1, n2, n3 ^ 0x80];
    let mut grh = [0u8; GRH_LEN];
    let h = &mut grh[20..];
    h[0] = 0x45;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&peer);
    h[16..20].copy_from_slice(&local.octets());
    let wc = WorkCompletion {
        opcode: WcOpcode::Recv,
        wc_flags: WcFlags::GRH,
        ..WorkCompletion::default()
    };
    let av = a.context().init_ah_from_wc_blocking(1, &wc, &grh).unwrap();
    assert_eq!(av.dgid, Gid::from_ip(IpAddr::from(peer)));

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
    elsewhere[39] = n3 ^ 0x40; // sent to another address, not this device's
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

cm_cases!(
    sidr_resolves_a_ud_service,
    a_resolved_service_is_reached_through_its_handle_and_answers_from_the_completion,
    private_data_beyond_rdma_cms_limits_is_a_typed_error,
    create_ah_from_wc_refuses_a_missing_or_malformed_grh,
);

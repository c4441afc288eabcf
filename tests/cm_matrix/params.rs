//! Connection parameters as librdmacm and Linux's CM give them: checked against the device
//! before anything is sent, remote READ/atomic rights only with responder resources,
//! `ConnParam::default()` as `rdma_connect(id, NULL)` (the device's maximum depths), EADDRINUSE
//! for a second bind, receives posted before accept/connect, and TOS and ACK timeout on the
//! QPs.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use portverbs::cm::service::{ConnParam, Connector, Listener, ServiceError};
use portverbs::cm::wire::RejReason;
use portverbs::prelude::*;

use crate::cm_util::pair::{Backend, Pair};
use crate::cm_util::{
    T, attr, close, connect, ctx_of, poll_one, post_recv, send_and_collect, settle, side,
};

fn depths_beyond_the_device_fail_connect_with_nothing_sent(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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

fn depths_beyond_the_device_fail_accept_before_the_rep(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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

fn default_depths_are_the_device_maximum_and_grant_read(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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

fn no_responder_resources_no_remote_read_and_a_read_fails(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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
    // Not a silent success. The software device holds the READ back (initiator depth 0): it
    // completes in error without reaching the peer. The emulated ConnectX-3 sends it, and the
    // responder, which granted no remote read, refuses it.
    let expected = match backend {
        Backend::Soft | Backend::Udp => WcStatus::LocQpOpErr,
        Backend::Mlx4 => WcStatus::RemAccessErr,
    };
    assert_eq!(wc.status, expected, "{wc:?}");
    // Nothing of the peer's buffer was read.
    let mut got = [0u8; 8];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 8]);
    close(&a, &b, ends);
}

fn a_second_bind_to_a_port_is_address_in_use_until_the_first_goes(backend: Backend) {
    let p = Pair::new(backend);
    let b = p.b.clone();
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

fn receives_posted_before_accept_and_connect_take_the_first_sends(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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
    send_and_collect(&s, 2048, b"first", 12, &[11, 12]);
    let mut got = [0u8; 5];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"back!");
    conn.disconnect(&s.qp).unwrap();
    conn.notify_disconnect_blocking(T).unwrap();
    passive.join().unwrap();
    drop(conn);
    settle(&[&a, &b]);
}

fn init_qp_refuses_a_second_qp_and_a_used_one(backend: Backend) {
    let p = Pair::new(backend);
    let a = p.a.clone();
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

fn tos_and_ack_timeout_reach_the_qps(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (p.a.clone(), p.b.clone());
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

cm_cases!(
    depths_beyond_the_device_fail_connect_with_nothing_sent,
    depths_beyond_the_device_fail_accept_before_the_rep,
    default_depths_are_the_device_maximum_and_grant_read,
    no_responder_resources_no_remote_read_and_a_read_fails,
    a_second_bind_to_a_port_is_address_in_use_until_the_first_goes,
    receives_posted_before_accept_and_connect_take_the_first_sends,
    init_qp_refuses_a_second_qp_and_a_used_one,
    tos_and_ack_timeout_reach_the_qps,
);

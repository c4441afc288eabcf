//! Out-of-band connection with [`QpEndpoint`] and [`ConnectOptions`] (`Qp::connect_rc`,
//! `connect_uc`, `ready_ud`): the sequence `ibv_rc_pingpong` writes by hand, done by the library
//! with the masks of the transition table and rdma-core's usual values.

use portverbs::prelude::*;
use portverbs::verbs::{ConnectError, ConnectOptions, ModifyQpError, QpEndpoint, UdDest};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn lone(ctx: &Context, t: QpType) -> Side {
    Side::new(ctx, t, CAPS, 1 << 16, FULL_ACCESS)
}

fn endpoint_describes_the_qp_and_its_port(backend: Backend) {
    let env = Env::new(backend);
    let s = lone(env.a(), QpType::Rc);
    let opts = ConnectOptions {
        psn: 0x0123_4567,
        ..ConnectOptions::default()
    };
    let ep = s.qp.endpoint_blocking(&opts).unwrap();
    assert_eq!(ep.qpn, s.qp.qp_num());
    assert_eq!(ep.psn, 0x23_4567, "24 bits");
    assert_eq!(ep.gid, Env::gid(env.a()), "GID index 0 on a RoCE port");
    assert_eq!(ep.lid, 0, "no LID on Ethernet");
    let bad = ConnectOptions {
        gid_index: Some(200),
        ..ConnectOptions::default()
    };
    assert!(s.qp.endpoint_blocking(&bad).is_err());
}

fn connect_rc_with_defaults_carries_every_operation(backend: Backend) {
    let env = Env::new(backend);
    let a = lone(env.a(), QpType::Rc);
    let b = lone(env.b(), QpType::Rc);
    let (oa, ob) = (
        ConnectOptions {
            psn: 100,
            ..ConnectOptions::default()
        },
        ConnectOptions {
            psn: 200,
            ..ConnectOptions::default()
        },
    );
    let (ea, eb) = (
        a.qp.endpoint_blocking(&oa).unwrap(),
        b.qp.endpoint_blocking(&ob).unwrap(),
    );
    a.qp.connect_rc_blocking(&eb, &oa).unwrap();
    b.qp.connect_rc_blocking(&ea, &ob).unwrap();
    let attr = a.qp.query_blocking().unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!((attr.sq_psn, attr.rq_psn), (100, 200));
    assert_eq!(attr.dest_qp_num, b.qp.qp_num());
    assert_eq!(attr.timeout, 14);
    // SEND, WRITE, READ and an atomic with the default access.
    let data = pattern(4, 64);
    a.buf.write(0, &data).unwrap();
    b.post_recv(1, 0, 256);
    let sge = [a.sge(0, 64)];
    a.qp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    check_wc(&poll_one(&env, &a.cq), 2, WcStatus::Success, WcOpcode::Send);
    check_wc(&poll_one(&env, &b.cq), 1, WcStatus::Success, WcOpcode::Recv);
    let ops = [
        SendOp::RdmaWrite {
            remote: b.remote(4096),
        },
        SendOp::RdmaRead {
            remote: b.remote(0),
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        a.qp.post_send(&[SendWr::new(10 + i as u64, op).sges(&sge).signaled()])
            .unwrap();
        assert_eq!(poll_one(&env, &a.cq).status, WcStatus::Success, "{op:?}");
    }
    assert_eq!(b.buf.to_vec(4096, 64).unwrap(), data);
    let result = [a.sge(512, 8)];
    let faa = SendWr::new(
        20,
        SendOp::AtomicFetchAdd {
            remote: b.remote(8192),
            add: 3,
        },
    )
    .sges(&result)
    .signaled();
    a.qp.post_send(&[faa]).unwrap();
    assert_eq!(poll_one(&env, &a.cq).status, WcStatus::Success);
    assert_eq!(b.buf.load_u64(8192).unwrap(), 3);
}

fn connect_uc_and_ready_ud_reach_rts(backend: Backend) {
    let env = Env::new(backend);
    let opts = ConnectOptions::default();
    let a = lone(env.a(), QpType::Uc);
    let b = lone(env.b(), QpType::Uc);
    let (ea, eb) = (
        a.qp.endpoint_blocking(&opts).unwrap(),
        b.qp.endpoint_blocking(&opts).unwrap(),
    );
    a.qp.connect_uc_blocking(&eb, &opts).unwrap();
    b.qp.connect_uc_blocking(&ea, &opts).unwrap();
    let data = pattern(5, 32);
    a.buf.write(0, &data).unwrap();
    let sge = [a.sge(0, 32)];
    a.qp.post_send(&[SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: b.remote(0),
        },
    )
    .sges(&sge)
    .signaled()])
        .unwrap();
    assert_eq!(poll_one(&env, &a.cq).status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(0, 32).unwrap(), data);

    let u = lone(env.a(), QpType::Ud);
    let v = lone(env.b(), QpType::Ud);
    u.qp.ready_ud_blocking(&opts).unwrap();
    v.qp.ready_ud_blocking(&opts).unwrap();
    assert_eq!(queried_state(&v.qp), QpState::Rts);
    let ev = v.qp.endpoint_blocking(&opts).unwrap();
    let ah =
        u.pd.create_ah_blocking(opts.address_vector(&ev, Some(0)))
            .unwrap();
    v.post_recv(3, 0, 256);
    u.buf.write(0, &data).unwrap();
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: ev.qpn,
        remote_qkey: opts.qkey,
    };
    let usge = [u.sge(0, 32)];
    u.qp.post_send(&[SendWr::new(4, SendOp::Send).sges(&usge).ud(dest).signaled()])
        .unwrap();
    assert_eq!(poll_one(&env, &u.cq).status, WcStatus::Success);
    let rwc = poll_one(&env, &v.cq);
    check_wc(&rwc, 3, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(v.buf.to_vec(40, 32).unwrap(), data);
}

fn connect_calls_check_the_transport_and_the_state(backend: Backend) {
    let env = Env::new(backend);
    let opts = ConnectOptions::default();
    let ud = lone(env.a(), QpType::Ud);
    let rc = lone(env.a(), QpType::Rc);
    let peer = QpEndpoint {
        qpn: 0x12,
        ..QpEndpoint::default()
    };
    assert!(matches!(
        ud.qp.connect_rc_blocking(&peer, &opts),
        Err(ConnectError::WrongTransport {
            call: "connect_rc",
            wants: QpType::Rc,
            qp_type: QpType::Ud,
            ..
        })
    ));
    assert!(matches!(
        rc.qp.ready_ud_blocking(&opts),
        Err(ConnectError::WrongTransport { .. })
    ));
    assert_eq!(
        queried_state(&rc.qp),
        QpState::Reset,
        "nothing was modified"
    );
    rc.qp.connect_rc_blocking(&peer, &opts).unwrap();
    // A second connect starts from RTS: the table refuses RTS -> INIT.
    assert!(matches!(
        rc.qp.connect_rc_blocking(&peer, &opts),
        Err(ConnectError::Modify(ModifyQpError::InvalidTransition {
            from: QpState::Rts,
            to: QpState::Init,
            ..
        }))
    ));
}

cases!(
    manual;
    endpoint_describes_the_qp_and_its_port,
    connect_rc_with_defaults_carries_every_operation,
    connect_uc_and_ready_ud_reach_rts,
    connect_calls_check_the_transport_and_the_state,
);

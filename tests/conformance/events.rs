//! Asynchronous events: QP fatal, access errors seen by the responder, port state changes,
//! device fatal, communication established.

use portverbs::hal::CommandError;
use portverbs::prelude::*;
use portverbs::verbs::{AsyncEventKind, EventElement, PdError};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn qp_fatal_raises_an_event_and_flushes(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let qpn = p.a.qp.qp_num();
    p.a.post_recv(1, 0, 64);
    p.a.post_recv(2, 64, 64);
    env.inject_qp_fatal(0, qpn);
    env.settle();
    let evs = drain_events(env.a());
    assert_eq!(
        count_events(&evs, AsyncEventKind::QpFatal, EventElement::Qp(qpn)),
        1,
        "{evs:?}"
    );
    assert_eq!(queried_state(&p.a.qp), QpState::Err);
    let wcs = poll_exact(&env, &p.a.cq, 2);
    for (wc, id) in wcs.iter().zip([1, 2]) {
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr), "{wc:?}");
        assert_eq!(wc.qp_num, qpn);
    }
    assert_err_and_flushes(&env, &p.a);
    // The peer saw nothing.
    assert!(drain_events(env.b()).is_empty());
}

fn remote_access_violation_raises_access_error_at_the_responder(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let bad = RemoteAddr {
        rkey: p.b.mr.rkey().unwrap() ^ 0x5a00,
        ..p.b.remote(0)
    };
    p.a.qp
        .post_send(&[SendWr::new(7, SendOp::RdmaWrite { remote: bad })
            .sges(&[p.a.sge(0, 16)])
            .signaled()])
        .unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        7,
        WcStatus::RemAccessErr,
        WcOpcode::RdmaWrite,
    );
    let evs = drain_events(env.b());
    assert_eq!(
        count_events(
            &evs,
            AsyncEventKind::QpAccessErr,
            EventElement::Qp(p.b.qp.qp_num())
        ),
        1,
        "{evs:?}"
    );
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
    assert_err_and_flushes(&env, &p.a);
}

fn port_down_and_up_raise_port_events(backend: Backend) {
    let env = Env::new(backend);
    assert!(drain_events(env.a()).is_empty());
    env.set_port_active(0, 1, false);
    env.settle();
    let evs = drain_events(env.a());
    assert_eq!(
        evs.iter().map(|e| (e.kind, e.element)).collect::<Vec<_>>(),
        [(AsyncEventKind::PortErr, EventElement::Port(1))]
    );
    assert_eq!(
        env.a().query_port_blocking(1).unwrap().state,
        portverbs::verbs::PortState::Down
    );
    env.set_port_active(0, 1, true);
    env.settle();
    let evs = drain_events(env.a());
    assert_eq!(
        evs.iter().map(|e| (e.kind, e.element)).collect::<Vec<_>>(),
        [(AsyncEventKind::PortActive, EventElement::Port(1))]
    );
    assert_eq!(
        env.a().query_port_blocking(1).unwrap().state,
        portverbs::verbs::PortState::Active
    );
    assert!(
        drain_events(env.b()).is_empty(),
        "device b's port did not change"
    );
}

fn device_fatal_raises_an_event_and_later_commands_fail(backend: Backend) {
    let env = Env::new(backend);
    env.inject_device_fatal(0);
    env.settle();
    let evs = drain_events(env.a());
    assert_eq!(
        count_events(&evs, AsyncEventKind::DeviceFatal, EventElement::Device),
        1,
        "{evs:?}"
    );
    assert!(env.a().is_fatal());
    match env.a().alloc_pd_blocking() {
        Err(PdError::Device(CommandError::DeviceFatal)) => {}
        other => panic!("expected DeviceFatal, got {other:?}"),
    }
    // Device b is unaffected.
    let pd = env.b().alloc_pd_blocking().unwrap();
    drop(pd);
}

fn comm_est_when_the_first_packet_arrives_in_rtr(backend: Backend) {
    let env = Env::new(backend);
    let p = Params::default();
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let b = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    to_init(&a.qp, &p);
    to_init(&b.qp, &p);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &p);
    to_rtr(&b.qp, a.qp.qp_num(), Env::gid(env.a()), &p);
    env.settle();
    assert!(drain_events(env.b()).is_empty(), "no packet yet");
    b.post_recv(5, 0, 64);
    a.buf.write(0, b"hello").unwrap();
    a.qp.post_send(&[SendWr::new(6, SendOp::Send).sges(&[a.sge(0, 5)]).signaled()])
        .unwrap();
    check_wc(&poll_one(&env, &a.cq), 6, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &b.cq);
    check_wc(&wc, 5, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(b.buf.to_vec(0, 5).unwrap(), b"hello");
    let evs = drain_events(env.b());
    assert_eq!(
        evs.iter().map(|e| (e.kind, e.element)).collect::<Vec<_>>(),
        [(AsyncEventKind::CommEst, EventElement::Qp(b.qp.qp_num()))]
    );
    // Once in RTS, traffic raises no further COMM_EST.
    rtr_to_rts(&b.qp, &p);
    b.post_recv(7, 0, 64);
    a.qp.post_send(&[SendWr::new(8, SendOp::Send).sges(&[a.sge(0, 5)]).signaled()])
        .unwrap();
    check_wc(&poll_one(&env, &a.cq), 8, WcStatus::Success, WcOpcode::Send);
    check_wc(&poll_one(&env, &b.cq), 7, WcStatus::Success, WcOpcode::Recv);
    assert!(drain_events(env.b()).is_empty());
    assert!(drain_events(env.a()).is_empty(), "the requester gets none");
}

cases!(
    manual;
    qp_fatal_raises_an_event_and_flushes,
    remote_access_violation_raises_access_error_at_the_responder,
    port_down_and_up_raise_port_events,
    device_fatal_raises_an_event_and_later_commands_fail,
    comm_est_when_the_first_packet_arrives_in_rtr,
);

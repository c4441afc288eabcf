//! UC traffic: SEND and RDMA WRITE work; a lost message is simply missing (no retries).

use portverbs::prelude::*;
use portverbs::soft::LinkFaults;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn uc_send_and_write_deliver_data(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Uc);
    let data = pattern(20, 3000);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(1, 8192, 4096);
    let sge = [p.a.sge(0, 3000)];
    let wrs = [
        SendWr::new(2, SendOp::SendWithImm { imm: 0x77 })
            .sges(&sge)
            .signaled(),
        write_wr(3, &p.b, 20_000).sges(&sge),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    let wcs = poll_exact(&env, &p.a.cq, 2);
    check_wc(&wcs[0], 2, WcStatus::Success, WcOpcode::Send);
    check_wc(&wcs[1], 3, WcStatus::Success, WcOpcode::RdmaWrite);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!((wc.byte_len, wc.imm()), (3000, Some(0x77)));
    assert_eq!(wc.qp_num, p.b.qp.qp_num());
    assert_eq!(p.b.buf.to_vec(8192, 3000).unwrap(), data);
    assert_eq!(p.b.buf.to_vec(20_000, 3000).unwrap(), data);
}

fn uc_write_with_imm_consumes_a_receive(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Uc);
    let data = pattern(21, 1500);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(1, 0, 64);
    let remote = p.b.remote(4096);
    let sge = [p.a.sge(0, 1500)];
    let wr = SendWr::new(2, SendOp::RdmaWriteWithImm { remote, imm: 9 })
        .sges(&sge)
        .signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        2,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
    assert_eq!((wc.byte_len, wc.imm()), (1500, Some(9)));
    assert_eq!(p.b.buf.to_vec(4096, 1500).unwrap(), data);
}

fn uc_lost_message_is_missing_without_retries(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Uc);
    p.b.post_recv(10, 0, 256);
    p.b.post_recv(11, 256, 256);
    p.a.buf.write(0, b"first").unwrap();
    p.a.buf.write(8, b"second").unwrap();
    env.set_faults(LinkFaults {
        loss: 1.0,
        ..LinkFaults::NONE
    });
    let before = env.devs[0].engine_stats();
    let sge = [p.a.sge(0, 5)];
    let wr = SendWr::new(1, SendOp::Send).sges(&sge).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    // The sender completes once the message left.
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::Send,
    );
    assert_eq!(env.poll(&p.b.cq, 0), []);
    let after = env.devs[0].engine_stats();
    assert_eq!(
        after.retransmits, before.retransmits,
        "UC never retransmits"
    );
    assert_eq!(after.tx_packets - before.tx_packets, 1);
    env.set_faults(LinkFaults::NONE);
    let sge2 = [p.a.sge(8, 6)];
    let wr = SendWr::new(2, SendOp::Send).sges(&sge2).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        2,
        WcStatus::Success,
        WcOpcode::Send,
    );
    // The second message takes the first receive.
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 10, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 6);
    assert_eq!(p.b.buf.to_vec(0, 6).unwrap(), b"second");
    assert_eq!(queried_state(&p.a.qp), QpState::Rts);
    assert_eq!(queried_state(&p.b.qp), QpState::Rts);
}

cases!(
    manual;
    uc_send_and_write_deliver_data,
    uc_write_with_imm_consumes_a_receive,
    uc_lost_message_is_missing_without_retries,
);

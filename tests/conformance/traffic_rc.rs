//! RC traffic: every operation type, data checked byte for byte.

use portverbs::prelude::*;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn rc_send_with_imm_delivers_data_and_immediate(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(1, 3000);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(77, 8192, 4096);
    p.a.qp
        .post_send(&[SendWr::new(5, SendOp::SendWithImm { imm: 0xabcd })
            .sges(&[p.a.sge(0, 3000)])
            .signaled()])
        .unwrap();
    let sent = env.poll(&p.a.cq, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].wr_id, 5);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    let got = env.poll(&p.b.cq, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 77);
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].opcode, WcOpcode::Recv);
    assert_eq!(got[0].byte_len, 3000);
    assert_eq!(got[0].imm(), Some(0xabcd));
    assert_eq!(got[0].qp_num, p.b.qp.qp_num());
    assert_eq!(p.b.buf.to_vec(8192, 3000).unwrap(), data);
}

/// Posts one signaled request on `a` and checks its completion.
fn run_one(env: &Env, side: &Side, wr: SendWr<'_>, opcode: WcOpcode) -> WorkCompletion {
    let id = wr.wr_id;
    side.qp.post_send(&[wr]).unwrap();
    let wc = poll_one(env, &side.cq);
    check_wc(&wc, id, WcStatus::Success, opcode);
    assert_eq!(wc.qp_num, side.qp.qp_num());
    wc
}

fn rc_send_delivers_data(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(2, 700);
    p.a.buf.write(100, &data).unwrap();
    p.b.post_recv(40, 4096, 1024);
    let sge = [p.a.sge(100, 700)];
    let wr = SendWr::new(41, SendOp::Send).sges(&sge).signaled();
    run_one(&env, &p.a, wr, WcOpcode::Send);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 40, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 700);
    assert_eq!(wc.imm(), None);
    assert_eq!(wc.invalidated_rkey(), None);
    assert_eq!(wc.qp_num, p.b.qp.qp_num());
    assert_eq!(p.b.buf.to_vec(4096, 700).unwrap(), data);
}

fn rc_send_with_invalidate_invalidates_the_receivers_type2_window(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mw = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let bind = mw.bind(&p.b.mr, p.b.mr.addr(), 4096, access);
    let wr = SendWr::new(1, SendOp::BindMw { bind }).signaled();
    run_one(&env, &p.b, wr, WcOpcode::BindMw);
    let rkey = bind.new_rkey;
    // The window works.
    let remote = RemoteAddr {
        addr: p.b.mr.addr(),
        rkey,
    };
    p.a.buf.write(0, b"window").unwrap();
    let sge = [p.a.sge(0, 6)];
    let wr = SendWr::new(2, SendOp::RdmaWrite { remote })
        .sges(&sge)
        .signaled();
    run_one(&env, &p.a, wr, WcOpcode::RdmaWrite);
    assert_eq!(p.b.buf.to_vec(0, 6).unwrap(), b"window");
    // SEND_WITH_INV names it; the receiver's completion reports it.
    p.b.post_recv(3, 8192, 64);
    let sge2 = [p.a.sge(0, 6)];
    let wr = SendWr::new(4, SendOp::SendWithInv { rkey })
        .sges(&sge2)
        .signaled();
    run_one(&env, &p.a, wr, WcOpcode::Send);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.invalidated_rkey(), Some(rkey));
    assert_eq!(wc.byte_len, 6);
    // Access through the invalidated window fails.
    let sge3 = [p.a.sge(0, 6)];
    let wr = SendWr::new(5, SendOp::RdmaWrite { remote })
        .sges(&sge3)
        .signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        5,
        WcStatus::RemAccessErr,
        WcOpcode::RdmaWrite,
    );
}

fn rc_rdma_write_places_data_without_a_receive(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(3, 5000);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(9, 0, 64);
    let sge = [p.a.sge(0, 5000)];
    let wr = write_wr(1, &p.b, 10_000).sges(&sge);
    run_one(&env, &p.a, wr, WcOpcode::RdmaWrite);
    assert_eq!(p.b.buf.to_vec(10_000, 5000).unwrap(), data);
    assert_eq!(env.poll(&p.b.cq, 0), [], "a WRITE consumes no receive");
}

fn rc_write_with_imm_consumes_a_receive(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(4, 2500);
    p.a.buf.write(0, &data).unwrap();
    p.b.buf.fill(0, 64, 0xee).unwrap();
    p.b.post_recv(11, 0, 64);
    let remote = p.b.remote(20_000);
    let sge = [p.a.sge(0, 2500)];
    let wr = SendWr::new(
        12,
        SendOp::RdmaWriteWithImm {
            remote,
            imm: 0x1234_5678,
        },
    )
    .sges(&sge)
    .signaled();
    run_one(&env, &p.a, wr, WcOpcode::RdmaWrite);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 11, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.byte_len, 2500);
    assert_eq!(wc.imm(), Some(0x1234_5678));
    assert_eq!(p.b.buf.to_vec(20_000, 2500).unwrap(), data);
    assert_eq!(
        p.b.buf.to_vec(0, 64).unwrap(),
        [0xee; 64],
        "receive buffer untouched"
    );
}

fn rc_zero_length_operations_complete(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.post_recv(1, 0, 64);
    p.b.post_recv(2, 64, 64);
    run_one(&env, &p.a, write_wr(10, &p.b, 0), WcOpcode::RdmaWrite);
    let wr = SendWr::new(11, SendOp::Send).signaled();
    run_one(&env, &p.a, wr, WcOpcode::Send);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 0);
    let remote = p.b.remote(0);
    let wr = SendWr::new(12, SendOp::RdmaWriteWithImm { remote, imm: 5 }).signaled();
    run_one(&env, &p.a, wr, WcOpcode::RdmaWrite);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RecvRdmaWithImm);
    assert_eq!((wc.byte_len, wc.imm()), (0, Some(5)));
    let wr = SendWr::new(13, SendOp::RdmaRead { remote }).signaled();
    let wc = run_one(&env, &p.a, wr, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len, 0);
}

fn rc_rdma_read_spans_many_packets(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(5, 10_000);
    p.b.buf.write(30_000, &data).unwrap();
    let remote = p.b.remote(30_000);
    let sge = [p.a.sge(1000, 10_000)];
    let wr = SendWr::new(1, SendOp::RdmaRead { remote })
        .sges(&sge)
        .signaled();
    let wc = run_one(&env, &p.a, wr, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len, 10_000);
    assert_eq!(p.a.buf.to_vec(1000, 10_000).unwrap(), data);
}

fn rc_compare_and_swap_returns_the_original(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(64, 5).unwrap();
    let remote = p.b.remote(64);
    let cas = |id, compare, swap| {
        SendWr::new(
            id,
            SendOp::AtomicCmpSwp {
                remote,
                compare,
                swap,
            },
        )
        .signaled()
    };
    // Equal: swapped.
    let sge1 = [p.a.sge(8, 8)];
    let wc = run_one(&env, &p.a, cas(1, 5, 9).sges(&sge1), WcOpcode::CompSwap);
    assert_eq!(wc.byte_len, 8);
    assert_eq!(p.a.buf.load_u64(8).unwrap(), 5);
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 9);
    // Not equal: unchanged, the original still returned.
    let sge2 = [p.a.sge(16, 8)];
    run_one(&env, &p.a, cas(2, 5, 77).sges(&sge2), WcOpcode::CompSwap);
    assert_eq!(p.a.buf.load_u64(16).unwrap(), 9);
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 9);
}

fn rc_fetch_and_add_returns_the_original(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(128, 100).unwrap();
    let remote = p.b.remote(128);
    for (i, before) in [(1u64, 100u64), (2, 123)] {
        let sge = [p.a.sge(8 * i, 8)];
        let wr = SendWr::new(i, SendOp::AtomicFetchAdd { remote, add: 23 })
            .sges(&sge)
            .signaled();
        let wc = run_one(&env, &p.a, wr, WcOpcode::FetchAdd);
        assert_eq!(wc.byte_len, 8);
        assert_eq!(p.a.buf.load_u64(8 * i as usize).unwrap(), before);
    }
    assert_eq!(p.b.buf.load_u64(128).unwrap(), 146);
    // The addition wraps around.
    let sge2 = [p.a.sge(24, 8)];
    let wr = SendWr::new(
        3,
        SendOp::AtomicFetchAdd {
            remote,
            add: u64::MAX,
        },
    )
    .sges(&sge2)
    .signaled();
    run_one(&env, &p.a, wr, WcOpcode::FetchAdd);
    assert_eq!(p.b.buf.load_u64(128).unwrap(), 145);
}

fn rc_inline_send_and_write_copy_at_post_time(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let max = p.a.qp.caps().max_inline_data as usize;
    let mut data = pattern(6, max);
    p.b.post_recv(1, 0, 1024);
    let wr = SendWr::new(2, SendOp::Send).inline(&data).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    let remote = p.b.remote(2048);
    let wr = SendWr::new(3, SendOp::RdmaWrite { remote })
        .inline(&data[..10])
        .signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    let sent = data.clone();
    data.fill(0);
    let wcs = poll_exact(&env, &p.a.cq, 2);
    check_wc(&wcs[0], 2, WcStatus::Success, WcOpcode::Send);
    check_wc(&wcs[1], 3, WcStatus::Success, WcOpcode::RdmaWrite);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len as usize, max);
    assert_eq!(p.b.buf.to_vec(0, max).unwrap(), sent);
    assert_eq!(p.b.buf.to_vec(2048, 10).unwrap(), sent[..10]);
}

fn rc_multi_sge_gathers_and_scatters(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(7, 3000);
    p.a.buf.write(0, &data[..1000]).unwrap();
    p.a.buf.write(5000, &data[1000..1500]).unwrap();
    p.a.buf.write(9000, &data[1500..]).unwrap();
    let sg = [p.a.sge(0, 1000), p.a.sge(5000, 500), p.a.sge(9000, 1500)];
    let rsg = [p.b.sge(100, 700), p.b.sge(3000, 1300), p.b.sge(8000, 2000)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &rsg,
        }])
        .unwrap();
    let wr = SendWr::new(2, SendOp::Send).sges(&sg).signaled();
    run_one(&env, &p.a, wr, WcOpcode::Send);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 3000);
    assert_eq!(p.b.buf.to_vec(100, 700).unwrap(), data[..700]);
    assert_eq!(p.b.buf.to_vec(3000, 1300).unwrap(), data[700..2000]);
    assert_eq!(p.b.buf.to_vec(8000, 1000).unwrap(), data[2000..]);
}

cases!(
    manual;
    rc_send_with_imm_delivers_data_and_immediate,
    rc_send_delivers_data,
    rc_send_with_invalidate_invalidates_the_receivers_type2_window,
    rc_rdma_write_places_data_without_a_receive,
    rc_write_with_imm_consumes_a_receive,
    rc_zero_length_operations_complete,
    rc_rdma_read_spans_many_packets,
    rc_compare_and_swap_returns_the_original,
    rc_fetch_and_add_returns_the_original,
    rc_inline_send_and_write_copy_at_post_time,
    rc_multi_sge_gathers_and_scatters,
);

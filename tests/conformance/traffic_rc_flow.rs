//! RC traffic: signalling (unsignaled requests, sq_sig_all), fence, solicited events, message
//! sizes around the MTU and large writes, ordering of many messages.

use portverbs::prelude::*;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn rc_unsignaled_requests_are_retired_by_a_later_signaled_one(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let depth = u64::from(p.a.qp.caps().max_send_wr);
    // An unsignaled request alone produces no completion.
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: p.b.remote(0),
        },
    );
    p.a.qp.post_send(&[wr]).unwrap();
    assert_eq!(env.poll(&p.a.cq, 0), []);
    // Rounds of 9 unsignaled + 1 signaled, more requests in all than the queue holds.
    let rounds = depth / 10 * 3 + 1;
    for r in 0..rounds {
        let base = 100 + r * 10;
        p.a.buf.store_u64(0, base).unwrap();
        let sge = [p.a.sge(0, 8)];
        let wrs: Vec<SendWr<'_>> = (0..10)
            .map(|i| {
                let off = 8 * ((base + i) % 1024);
                let wr = SendWr::new(
                    base + i,
                    SendOp::RdmaWrite {
                        remote: p.b.remote(off),
                    },
                )
                .sges(&sge);
                if i == 9 { wr.signaled() } else { wr }
            })
            .collect();
        p.a.qp.post_send(&wrs).unwrap();
        let wc = poll_one(&env, &p.a.cq);
        check_wc(&wc, base + 9, WcStatus::Success, WcOpcode::RdmaWrite);
        for i in 0..10 {
            let off = 8 * ((base + i) % 1024) as usize;
            assert_eq!(p.b.buf.load_u64(off).unwrap(), base, "write {}", base + i);
        }
    }
}

fn rc_sq_sig_all_signals_every_request(backend: Backend) {
    let env = Env::new(backend);
    let ctx = env.a();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq(ctx, 256);
    let qp = make_qp(&pd, &cq, QpType::Rc, None, true);
    let b = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    connect(&qp, &b.qp, &Params::default());
    let wrs: Vec<SendWr<'_>> = (0..3)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote: b.remote(0),
                },
            )
        })
        .collect();
    qp.post_send(&wrs).unwrap();
    let wcs = poll_exact(&env, &cq, 3);
    for (i, wc) in wcs.iter().enumerate() {
        check_wc(wc, i as u64, WcStatus::Success, WcOpcode::RdmaWrite);
    }
}

fn rc_fenced_send_waits_for_a_prior_read(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(8, 8000);
    p.b.buf.write(40_000, &data).unwrap();
    p.a.buf.fill(0, 8000, 0).unwrap();
    p.b.post_recv(1, 0, 8192);
    let sge = [p.a.sge(0, 8000)];
    let read = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote: p.b.remote(40_000),
        },
    )
    .sges(&sge)
    .signaled();
    let sge2 = [p.a.sge(0, 8000)];
    let send = SendWr::new(3, SendOp::Send)
        .sges(&sge2)
        .flags(SendFlags::FENCE)
        .signaled();
    p.a.qp.post_send(&[read, send]).unwrap();
    let wcs = poll_exact(&env, &p.a.cq, 2);
    check_wc(&wcs[0], 2, WcStatus::Success, WcOpcode::RdmaRead);
    check_wc(&wcs[1], 3, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 8000);
    assert_eq!(
        p.b.buf.to_vec(0, 8000).unwrap(),
        data,
        "the fenced send carried what the read brought"
    );
}

fn rc_solicited_flag_wakes_a_solicited_only_notification(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let req = p.b.cq.notify(NotifyKind::Solicited);
    p.b.post_recv(1, 0, 64);
    p.b.post_recv(2, 64, 64);
    let sge = [p.a.sge(0, 4)];
    let plain = SendWr::new(10, SendOp::Send).sges(&sge).signaled();
    p.a.qp.post_send(&[plain]).unwrap();
    env.settle();
    p.b.cq.process_events().unwrap();
    assert!(
        !req.is_complete(),
        "an unsolicited receive does not satisfy it"
    );
    let sge2 = [p.a.sge(0, 4)];
    let solicited = SendWr::new(11, SendOp::Send)
        .sges(&sge2)
        .flags(SendFlags::SOLICITED)
        .signaled();
    p.a.qp.post_send(&[solicited]).unwrap();
    env.settle();
    p.b.cq.process_events().unwrap();
    assert_eq!(req.try_result(), Some(Ok(())));
    let wcs = poll_exact(&env, &p.b.cq, 2);
    check_wc(&wcs[0], 1, WcStatus::Success, WcOpcode::Recv);
    check_wc(&wcs[1], 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(poll_exact(&env, &p.a.cq, 2).len(), 2);
}

fn rc_messages_of_exactly_mtu_and_mtu_plus_one(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mtu = Params::default().mtu.bytes();
    let data = pattern(9, mtu as usize + 1);
    p.a.buf.write(0, &data).unwrap();
    for (i, len) in [(0u64, mtu), (1, mtu + 1)] {
        p.b.post_recv(i, 8192, 4096);
        let sge = [p.a.sge(0, len)];
        let wr = SendWr::new(10 + i, SendOp::Send).sges(&sge).signaled();
        p.a.qp.post_send(&[wr]).unwrap();
        check_wc(
            &poll_one(&env, &p.a.cq),
            10 + i,
            WcStatus::Success,
            WcOpcode::Send,
        );
        let wc = poll_one(&env, &p.b.cq);
        check_wc(&wc, i, WcStatus::Success, WcOpcode::Recv);
        assert_eq!(wc.byte_len, len);
        assert_eq!(
            p.b.buf.to_vec(8192, len as usize).unwrap(),
            data[..len as usize]
        );
        // The same sizes as RDMA WRITEs.
        let sge2 = [p.a.sge(0, len)];
        let wr = write_wr(20 + i, &p.b, 16_384).sges(&sge2);
        p.a.qp.post_send(&[wr]).unwrap();
        check_wc(
            &poll_one(&env, &p.a.cq),
            20 + i,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
        );
        assert_eq!(
            p.b.buf.to_vec(16_384, len as usize).unwrap(),
            data[..len as usize]
        );
    }
}

fn rc_one_mebibyte_write(backend: Backend) {
    let env = Env::new(backend);
    let len = 1 << 20;
    let p = pair_with_len(&env, QpType::Rc, len);
    let data = pattern(10, len);
    p.a.buf.write(0, &data).unwrap();
    let sge = [p.a.sge(0, len as u32)];
    let wr = write_wr(1, &p.b, 0).sges(&sge);
    p.a.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &p.a.cq),
        1,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
    );
    assert!(
        p.b.buf.to_vec(0, len).unwrap() == data,
        "1 MiB arrived intact"
    );
}

fn rc_many_messages_arrive_in_order(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    // 60 slots of 1056 bytes; lengths cross the 1024-byte MTU now and then.
    const SLOT: u64 = 1056;
    let per_round = 60u64;
    for round in 0..3u64 {
        let len = |i: u64| ((round * 977 + i * 131) % SLOT) as u32;
        let data = |i: u64| pattern((round * 100 + i) as u8, len(i) as usize);
        for i in 0..per_round {
            p.b.post_recv(round * 1000 + i, i * SLOT, SLOT as u32);
            p.a.buf.write((i * SLOT) as usize, &data(i)).unwrap();
        }
        let sges: Vec<[Sge; 1]> = (0..per_round)
            .map(|i| [p.a.sge(i * SLOT, len(i))])
            .collect();
        let wrs: Vec<SendWr<'_>> = sges
            .iter()
            .zip(0..)
            .map(|(s, i)| {
                SendWr::new(round * 1000 + i, SendOp::Send)
                    .sges(s)
                    .signaled()
            })
            .collect();
        p.a.qp.post_send(&wrs).unwrap();
        let sent = poll_exact(&env, &p.a.cq, per_round as usize);
        let got = poll_exact(&env, &p.b.cq, per_round as usize);
        for i in 0..per_round {
            let id = round * 1000 + i;
            check_wc(&sent[i as usize], id, WcStatus::Success, WcOpcode::Send);
            let wc = &got[i as usize];
            check_wc(wc, id, WcStatus::Success, WcOpcode::Recv);
            assert_eq!(wc.byte_len, len(i));
            let at = (i * SLOT) as usize;
            assert_eq!(p.b.buf.to_vec(at, len(i) as usize).unwrap(), data(i));
        }
    }
}

cases!(
    manual;
    rc_unsignaled_requests_are_retired_by_a_later_signaled_one,
    rc_sq_sig_all_signals_every_request,
    rc_fenced_send_waits_for_a_prior_read,
    rc_solicited_flag_wakes_a_solicited_only_notification,
    rc_messages_of_exactly_mtu_and_mtu_plus_one,
    rc_one_mebibyte_write,
    rc_many_messages_arrive_in_order,
);

//! UD traffic through address handles: the 40-byte GRH area (RoCEv2 over IPv4), Q_Key
//! checks, size limits, zero-length and immediate sends.

use portverbs::prelude::*;
use portverbs::verbs::{UdDest, WcFlags};

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

const GRH: u32 = 40;

struct Ud {
    p: Pair,
    ah: AddressHandle,
}

impl Ud {
    fn new(env: &Env) -> Self {
        let p = Pair::new(env, QpType::Ud);
        let ah =
            p.a.pd
                .create_ah_blocking(AddressVector {
                    dgid: Env::gid(env.b()),
                    is_global: true,
                    hop_limit: 64,
                    port_num: 1,
                    ..AddressVector::default()
                })
                .unwrap();
        Self { p, ah }
    }

    fn dest(&self, qkey: u32) -> UdDest<'_> {
        UdDest {
            ah_pd: None,
            av: self.ah.av(),
            remote_qpn: self.p.b.qp.qp_num(),
            remote_qkey: qkey,
        }
    }

    /// Sends `len` bytes from offset 0 of a's buffer with `op` to b.
    fn send(&self, env: &Env, wr_id: u64, op: SendOp, len: u32, qkey: u32) -> WorkCompletion {
        self.send_to(env, wr_id, op, len, self.dest(qkey))
    }

    /// Sends `len` bytes from offset 0 of a's buffer with `op` to `dest`; returns a's
    /// completion.
    fn send_to(
        &self,
        env: &Env,
        wr_id: u64,
        op: SendOp,
        len: u32,
        dest: UdDest<'_>,
    ) -> WorkCompletion {
        let sge = [self.p.a.sge(0, len)];
        let wr = SendWr::new(wr_id, op)
            .sges(if len == 0 { &[] } else { &sge })
            .ud(dest)
            .signaled();
        self.p.a.qp.post_send(&[wr]).unwrap();
        poll_one(env, &self.p.a.cq)
    }
}

fn ud_send_delivers_grh_area_and_source(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let data = pattern(30, 1000);
    u.p.a.buf.write(0, &data).unwrap();
    u.p.b.buf.fill(0, 2048, 0xcc).unwrap();
    u.p.b.post_recv(1, 0, 2048);
    let wc = u.send(&env, 2, SendOp::Send, 1000, QKEY);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 1000 + GRH);
    assert!(wc.wc_flags.contains(WcFlags::GRH), "{wc:?}");
    assert_eq!(wc.src_qp, u.p.a.qp.qp_num());
    assert_eq!(wc.qp_num, u.p.b.qp.qp_num());
    assert_eq!(wc.imm(), None);
    let grh = u.p.b.buf.to_vec(0, 40).unwrap();
    assert_eq!(grh[..20], [0; 20], "RoCEv2/IPv4: 20 reserved bytes first");
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45, "IPv4, 20-byte header");
    assert_eq!(ip[9], 17, "UDP");
    let octets = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => v4.octets(),
        std::net::IpAddr::V6(_) => panic!("the environments use IPv4 addresses"),
    };
    assert_eq!(
        ip[12..16],
        octets(env.ips[0]),
        "source address: the sender's IP"
    );
    assert_eq!(
        ip[16..20],
        octets(env.ips[1]),
        "destination address: the receiver's IP"
    );
    let mut sum = 0u32;
    for w in ip.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    assert_eq!(sum, 0xffff, "valid IPv4 header checksum");
    assert_eq!(u.p.b.buf.to_vec(40, 1000).unwrap(), data);
    assert_eq!(u.p.b.buf.to_vec(1040, 8).unwrap(), [0xcc; 8]);
}

fn ud_wrong_qkey_is_dropped_silently(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    u.p.b.post_recv(1, 0, 2048);
    let wc = u.send(&env, 2, SendOp::Send, 100, QKEY ^ 1);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    assert_eq!(env.poll(&u.p.b.cq, 0), [], "no completion at the receiver");
    // The receive is still there for a good datagram.
    let wc = u.send(&env, 3, SendOp::Send, 100, QKEY);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 100 + GRH);
}

fn ud_qkey_with_high_bit_uses_the_senders_qkey(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    u.p.b.post_recv(1, 0, 2048);
    // Bit 31 set: the sending QP's own Q_Key (QKEY, which the receiver has) is used.
    let wc = u.send(&env, 2, SendOp::Send, 10, 0x8000_0000);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 10 + GRH);
}

fn to_rts_from_sqe(qp: &Qp) {
    qp.modify_blocking(
        &QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Sqe,
            ..QpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::CUR_STATE,
    )
    .unwrap();
}

fn ud_send_larger_than_the_mtu_is_loc_len_and_the_qp_enters_sqe(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let mtu = env.a().query_port_blocking(1).unwrap().active_mtu.bytes();
    u.p.b.post_recv(1, 0, 8192);
    let wc = u.send(&env, 2, SendOp::Send, mtu + 1, QKEY);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocLenErr), "{wc:?}");
    assert_eq!(env.poll(&u.p.b.cq, 0), []);
    // A UD send error moves the QP to SQE (IBA 10.3.1); SQE → RTS recovers it.
    assert_eq!(queried_state(&u.p.a.qp), QpState::Sqe);
    to_rts_from_sqe(&u.p.a.qp);
    assert_eq!(queried_state(&u.p.a.qp), QpState::Rts);
    // Exactly one MTU is fine.
    let wc = u.send(&env, 3, SendOp::Send, mtu, QKEY);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, mtu + GRH);
}

fn ud_sends_posted_in_sqe_are_flushed_and_receives_still_work(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let mtu = env.a().query_port_blocking(1).unwrap().active_mtu.bytes();
    let wc = u.send(&env, 1, SendOp::Send, mtu + 1, QKEY);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocLenErr), "{wc:?}");
    assert_eq!(queried_state(&u.p.a.qp), QpState::Sqe);
    // The receive queue of a QP in SQE keeps working.
    let back =
        u.p.b
            .pd
            .create_ah_blocking(AddressVector {
                dgid: Env::gid(env.a()),
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AddressVector::default()
            })
            .unwrap();
    u.p.a.post_recv(5, 0, 256);
    let sge = [u.p.b.sge(0, 16)];
    let wr = SendWr::new(6, SendOp::Send)
        .sges(&sge)
        .ud(UdDest {
            ah_pd: None,
            av: back.av(),
            remote_qpn: u.p.a.qp.qp_num(),
            remote_qkey: QKEY,
        })
        .signaled();
    u.p.b.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &u.p.b.cq),
        6,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(&env, &u.p.a.cq);
    check_wc(&wc, 5, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 16 + GRH);
    // A send posted in SQE completes with WR_FLUSH_ERR.
    let wc = u.send(&env, 2, SendOp::Send, 8, QKEY);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr), "{wc:?}");
}

fn ud_zero_length_send_and_send_with_imm(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    u.p.b.post_recv(1, 0, 256);
    u.p.b.post_recv(2, 256, 256);
    let wc = u.send(&env, 3, SendOp::Send, 0, QKEY);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.byte_len, GRH);
    u.p.a.buf.write(0, b"imm!").unwrap();
    let wc = u.send(&env, 4, SendOp::SendWithImm { imm: 0xfeed }, 4, QKEY);
    check_wc(&wc, 4, WcStatus::Success, WcOpcode::Send);
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!((wc.byte_len, wc.imm()), (4 + GRH, Some(0xfeed)));
    assert_eq!(u.p.b.buf.to_vec(256 + 40, 4).unwrap(), b"imm!");
}

fn ud_message_larger_than_the_receive_is_dropped_and_the_receive_stays_posted(backend: Backend) {
    // IBA class D: a UD message that does not fit the receive at the head of the QP's receive
    // queue is dropped; the receive is not consumed (no completion, buffer untouched) and the
    // next message that fits lands in it.
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let dropped = env.devs[1].engine_stats().dropped;
    // Room for the payload but not for the GRH area in front of it.
    u.p.b.post_recv(1, 0, 100);
    u.p.a.buf.write(0, &pattern(1, 100)).unwrap();
    let wc = u.send(&env, 2, SendOp::Send, 100, QKEY);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    assert!(env.poll(&u.p.b.cq, 0).is_empty(), "no receive completes");
    assert_eq!(env.devs[1].engine_stats().dropped, dropped + 1);
    assert_eq!(u.p.b.buf.to_vec(0, 100).unwrap(), vec![0; 100], "untouched");
    // UD errors do not change the receiver's state.
    assert_eq!(queried_state(&u.p.b.qp), QpState::Rts);
    // The same receive takes the next message that fits.
    let data = pattern(9, 60);
    u.p.a.buf.write(0, &data).unwrap();
    let wc = u.send(&env, 4, SendOp::Send, 60, QKEY);
    check_wc(&wc, 4, WcStatus::Success, WcOpcode::Send);
    let rwc = poll_one(&env, &u.p.b.cq);
    check_wc(&rwc, 1, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(rwc.byte_len, GRH + 60);
    assert_eq!(u.p.b.buf.to_vec(GRH as usize, 60).unwrap(), data);
}

fn ud_message_larger_than_an_srq_receive_completes_it_with_loc_len(backend: Backend) {
    // IBA class E: a receive taken from an SRQ was consumed before its size was known, so it
    // completes with LOC_LEN_ERR; the QP stays in RTS and the next receive works.
    let env = Env::new(backend);
    let b_pd = env.b().alloc_pd_blocking().unwrap();
    let b_cq = cq(env.b(), 16);
    let srq = b_pd
        .create_srq_blocking(SrqInit {
            max_wr: 4,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let b_qp = make_qp(&b_pd, &b_cq, QpType::Ud, Some(&srq), false);
    let b_buf = env.b().alloc_buffer(4096).unwrap();
    let b_mr = b_pd
        .reg_mr_blocking(&b_buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let p = Params::default();
    to_init(&b_qp, &p);
    to_rts(&b_qp, 0, Gid::default(), &p);
    let a = Side::new(env.a(), QpType::Ud, CAPS, 4096, FULL_ACCESS);
    to_init(&a.qp, &p);
    to_rts(&a.qp, 0, Gid::default(), &p);
    let ah =
        a.pd.create_ah_blocking(AddressVector {
            dgid: Env::gid(env.b()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    for (id, len) in [(1u64, 100u32), (2, 1024)] {
        srq.post_recv(&[RecvWr {
            wr_id: id,
            sges: &[b_mr.sge_at(id * 1024, len)],
        }])
        .unwrap();
    }
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: b_qp.qp_num(),
        remote_qkey: QKEY,
    };
    for id in [10, 11] {
        a.qp.post_send(&[SendWr::new(id, SendOp::Send)
            .sges(&[a.sge(0, 100)])
            .ud(dest)
            .signaled()])
            .unwrap();
    }
    assert_eq!(poll_exact(&env, &a.cq, 2).len(), 2);
    let wcs = poll_exact(&env, &b_cq, 2);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::LocLenErr));
    check_wc(&wcs[1], 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wcs[1].byte_len, GRH + 100);
    assert_eq!(queried_state(&b_qp), QpState::Rts);
}

fn ud_traffic_driven_by_completion_events(backend: Backend) {
    // pyverbs test_cq_events, UD flavour: arm, get the channel event, acknowledge, poll.
    let env = Env::new(backend);
    let ch = env.b().create_comp_channel().unwrap();
    let b_cq = channel_cq(env.b(), &ch, 16);
    let b_pd = env.b().alloc_pd_blocking().unwrap();
    let b_qp = make_qp(&b_pd, &b_cq, QpType::Ud, None, false);
    let b_buf = env.b().alloc_buffer(4096).unwrap();
    let b_mr = b_pd
        .reg_mr_blocking(&b_buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let a = Side::new(env.a(), QpType::Ud, CAPS, 4096, FULL_ACCESS);
    let p = Params::default();
    connect(&a.qp, &b_qp, &p);
    let ah =
        a.pd.create_ah_blocking(AddressVector {
            dgid: Env::gid(env.b()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    for i in 0..3u64 {
        b_cq.req_notify(false);
        let rsge = [b_mr.sge_at(0, 256)];
        b_qp.post_recv(&[RecvWr {
            wr_id: i,
            sges: &rsge,
        }])
        .unwrap();
        let data = pattern(i as u8, 50);
        a.buf.write(0, &data).unwrap();
        let sge = [a.sge(0, 50)];
        let wr = SendWr::new(100 + i, SendOp::Send)
            .sges(&sge)
            .ud(UdDest {
                ah_pd: None,
                av: ah.av(),
                remote_qpn: b_qp.qp_num(),
                remote_qkey: QKEY,
            })
            .signaled();
        a.qp.post_send(&[wr]).unwrap();
        env.settle();
        let ev = ch.get_cq_event().unwrap().expect("a completion event");
        assert_eq!(ev.cqn(), b_cq.cqn());
        ev.ack_events(1);
        let wc = poll_one(&env, &b_cq);
        check_wc(&wc, i, WcStatus::Success, WcOpcode::Recv);
        assert_eq!(wc.byte_len, 50 + GRH);
        assert_eq!(b_buf.to_vec(40, 50).unwrap(), data);
        check_wc(
            &poll_one(&env, &a.cq),
            100 + i,
            WcStatus::Success,
            WcOpcode::Send,
        );
        assert!(ch.get_cq_event().unwrap().is_none(), "one event per arming");
    }
    assert_eq!(b_cq.unacked_events(), 0);
}

fn ud_send_with_no_receive_posted_is_dropped(backend: Backend) {
    // IBA class D: no receive, no delivery, no state change; the next message with a receive
    // posted lands normally.
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let wc = u.send(&env, 1, SendOp::Send, 32, QKEY);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Send);
    assert!(env.poll(&u.p.b.cq, 0).is_empty());
    assert_eq!(queried_state(&u.p.b.qp), QpState::Rts);
    u.p.b.post_recv(2, 0, 256);
    let wc = u.send(&env, 3, SendOp::Send, 48, QKEY);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Send);
    let rwc = poll_one(&env, &u.p.b.cq);
    check_wc(&rwc, 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(rwc.byte_len, GRH + 48, "the second message, not the first");
}

fn ud_send_to_a_qpn_that_does_not_exist_is_dropped(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    u.p.b.post_recv(1, 0, 256);
    let dest = UdDest {
        ah_pd: None,
        remote_qpn: 0x00ab_cdef,
        ..u.dest(QKEY)
    };
    let wc = u.send_to(&env, 2, SendOp::Send, 16, dest);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    assert!(
        env.poll(&u.p.b.cq, 0).is_empty(),
        "nothing arrives anywhere"
    );
}

fn ud_and_rc_qps_do_not_talk(backend: Backend) {
    let env = Env::new(backend);
    let u = Ud::new(&env);
    // A UD send to the number of an RC QP is dropped there.
    let rc = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let peer = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let params = Params {
        retry_cnt: 1,
        timeout: 8,
        ..Params::default()
    };
    connect(&peer.qp, &rc.qp, &params);
    rc.post_recv(1, 0, 256);
    let dest = UdDest {
        ah_pd: None,
        remote_qpn: rc.qp.qp_num(),
        ..u.dest(QKEY)
    };
    let wc = u.send_to(&env, 2, SendOp::Send, 16, dest);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    assert!(env.poll(&rc.cq, 0).is_empty());
    // An RC QP connected to the number of a UD QP gets no acknowledgement.
    let lone = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    to_init(&lone.qp, &params);
    to_rts(&lone.qp, u.p.b.qp.qp_num(), Env::gid(env.b()), &params);
    u.p.b.post_recv(3, 0, 256);
    let sge = [lone.sge(0, 16)];
    lone.qp
        .post_send(&[SendWr::new(4, SendOp::Send).sges(&sge).signaled()])
        .unwrap();
    let wc = poll_one(&env, &lone.cq);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RetryExcErr));
    assert!(env.poll(&u.p.b.cq, 0).is_empty(), "the UD QP took nothing");
}

fn ud_traffic_class_reaches_the_grh_area(backend: Backend) {
    // RoCEv2 over IPv4: the address handle's traffic class is the IPv4 TOS byte.
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let ah =
        u.p.a
            .pd
            .create_ah_blocking(AddressVector {
                dgid: Env::gid(env.b()),
                is_global: true,
                hop_limit: 64,
                traffic_class: 0xb8,
                port_num: 1,
                ..AddressVector::default()
            })
            .unwrap();
    u.p.b.post_recv(1, 0, 256);
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        ..u.dest(QKEY)
    };
    let wc = u.send_to(&env, 2, SendOp::Send, 8, dest);
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send);
    check_wc(
        &poll_one(&env, &u.p.b.cq),
        1,
        WcStatus::Success,
        WcOpcode::Recv,
    );
    let grh = u.p.b.buf.to_vec(0, GRH as usize).unwrap();
    assert_eq!(grh[20] >> 4, 4, "an IPv4 header after 20 reserved bytes");
    assert_eq!(grh[21], 0xb8, "TOS = traffic class");
}

fn ud_answer_through_an_address_handle_made_from_the_completion(backend: Backend) {
    // `ibv_create_ah_from_wc`: b answers a's datagram with a handle built from the
    // completion and the GRH area, knowing nothing else of a.
    let env = Env::new(backend);
    let u = Ud::new(&env);
    let ah =
        u.p.a
            .pd
            .create_ah_blocking(AddressVector {
                traffic_class: 0x28,
                ..*u.ah.av()
            })
            .unwrap();
    u.p.a.buf.write(0, b"question").unwrap();
    u.p.b.post_recv(1, 0, 256);
    u.p.a.post_recv(3, 512, 256);
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        ..u.dest(QKEY)
    };
    check_wc(
        &u.send_to(&env, 2, SendOp::Send, 8, dest),
        2,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(&env, &u.p.b.cq);
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Recv);
    let grh = u.p.b.buf.to_vec(0, GRH as usize).unwrap();
    let back = u.p.b.pd.create_ah_from_wc_blocking(&wc, &grh, 1).unwrap();
    let av = back.av();
    assert_eq!(av.dgid, Env::gid(env.a()), "the sender's GID");
    let sgid = env
        .b()
        .query_gid_blocking(1, u32::from(av.sgid_index))
        .unwrap();
    assert_eq!(
        sgid.gid,
        Env::gid(env.b()),
        "sent from the GID the datagram came to"
    );
    assert_eq!((av.traffic_class, av.hop_limit), (0x28, 255));
    assert!(av.is_global);
    assert_eq!(av.port_num, 1);

    u.p.b.buf.write(64, b"answer").unwrap();
    let sge = [u.p.b.sge(64, 6)];
    let wr = SendWr::new(4, SendOp::Send)
        .sges(&sge)
        .ud(back.dest(wc.src_qp, QKEY))
        .signaled();
    u.p.b.qp.post_send(&[wr]).unwrap();
    check_wc(
        &poll_one(&env, &u.p.b.cq),
        4,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(&env, &u.p.a.cq);
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.src_qp, u.p.b.qp.qp_num());
    assert_eq!(u.p.a.buf.to_vec(512 + 40, 6).unwrap(), b"answer");
}

cases!(
    manual;
    ud_answer_through_an_address_handle_made_from_the_completion,
    ud_send_delivers_grh_area_and_source,
    ud_wrong_qkey_is_dropped_silently,
    ud_qkey_with_high_bit_uses_the_senders_qkey,
    ud_send_larger_than_the_mtu_is_loc_len_and_the_qp_enters_sqe,
    ud_sends_posted_in_sqe_are_flushed_and_receives_still_work,
    ud_zero_length_send_and_send_with_imm,
    ud_traffic_driven_by_completion_events,
    ud_message_larger_than_the_receive_is_dropped_and_the_receive_stays_posted,
    ud_message_larger_than_an_srq_receive_completes_it_with_loc_len,
    ud_send_with_no_receive_posted_is_dropped,
    ud_send_to_a_qpn_that_does_not_exist_is_dropped,
    ud_and_rc_qps_do_not_talk,
    ud_traffic_class_reaches_the_grh_area,
);

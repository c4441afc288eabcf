//! Traffic between the model and a soft device on one stepped fabric, with WQEs written by hand
//! in the mlx4 format and CQEs/EQEs read by owner bit: RC and UD both ways, the 0x14 doorbell
//! and the BlueFlame path (as stores and as doorbell calls), stamping, CQ arming and overrun,
//! SRQs, memory windows.

mod util;

use std::sync::Arc;

use portverbs_hal::event::{CqErrorSyndrome, DeviceEvent};
use portverbs_hal::queue::{RecvQueue, SendQueue};
use portverbs_hal::types::{Gid, QpType};
use portverbs_hal::wc::{WcFlags, WcOpcode, WcStatus};
use portverbs_hal::wr::{RemoteAddr, SendOp, SendWr, Sge};
use portverbs_mlx4::PciFunction;
use portverbs_mlx4::layout::ctx::{mpt_flag, service};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::uar::{CQ_REQ_NOT, CQ_REQ_NOT_SOL, EQ_ARM, bf_page, cq_arm_word};
use portverbs_mlx4::layout::wqe::{INLINE_SEG, opcode as wop};
use portverbs_mlx4::layout::{keys, wqe};
use portverbs_soft::Fabric;
use util::*;

const SIGNALED: u32 = 0xc;
const ALL_ACCESS: u32 = mpt_flag::LOCAL_WRITE
    | mpt_flag::REMOTE_READ
    | mpt_flag::REMOTE_WRITE
    | mpt_flag::ATOMIC
    | mpt_flag::BIND_ENABLE;

fn gid(ip: &str) -> Gid {
    Gid::parse(ip).unwrap()
}

struct Rig {
    d: Dev,
    eq: Eq,
    cq: Cq,
    mr: Mr,
    sink: Arc<Counter>,
}

fn rig(fabric: &Fabric, ip: &str) -> Rig {
    let mut d = Dev::new(fabric, 1);
    d.bring_up();
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 1), 0);
    assert_eq!(d.set_gids(1, &[gid(ip)]), 0);
    let sink = Arc::new(Counter::default());
    d.func.route_interrupt(0, sink.clone()).unwrap();
    let eq = d.eq(4, 6, 0);
    d.map_all_events(&eq);
    let cq = d.cq(128, 6, eq.eqn);
    let mr = d.mr(16, 1 << 16, 1, ALL_ACCESS);
    Rig {
        d,
        eq,
        cq,
        mr,
        sink,
    }
}

fn raddr(addr: u64, rkey: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b
}

fn inline(data: &[u8]) -> Vec<u8> {
    let mut v = (INLINE_SEG | data.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(data);
    v
}

/// Posts the WQE at the SQ head through BlueFlame: counter and QPN overlaid in the control
/// segment, the WQE rounded up to 64 bytes copied into the UAR's BlueFlame register.
fn post_bf(d: &Dev, qp: &mut Qp, opcode: u8, segs: &[u8]) {
    let w = bf_block(qp, opcode, segs);
    d.bar2.write_wc(bf_page(256, UAR as usize), &w).unwrap();
}

/// Writes the WQE at the SQ head and returns its BlueFlame copy (counter and QPN overlaid).
fn bf_block(qp: &mut Qp, opcode: u8, segs: &[u8]) -> [u8; 64] {
    let c = qp.post_send(opcode, SIGNALED, 0, segs);
    let at = qp.sq_off + ((c & ((1 << qp.sq_log) - 1)) as usize) * (1 << qp.sq_shift);
    let mut w = [0u8; 64];
    qp.buf.read(at, &mut w).unwrap();
    let d0 = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) | ((c & 0xffff) << 8);
    w[..4].copy_from_slice(&d0.to_be_bytes());
    w[4..7].copy_from_slice(&(qp.qpn << 8).to_be_bytes()[..3]);
    qp.buf.write(at, &w[..8]).unwrap();
    w
}

#[test]
fn rc_between_the_model_and_a_soft_device() {
    let fabric = Fabric::stepped(1);
    let mut r = rig(&fabric, "10.0.0.1");
    let mut p = peer(&fabric, "10.0.0.2", QpType::Rc);
    let mut qp = r.d.qp_init(0x48, service::RC, &r.cq, 1, (6, 6), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 100);
    p.connect(0x48, gid("10.0.0.1"), 100);

    // Model → soft: a 3000-byte SEND (three packets at MTU 1024) through the 0x14 doorbell.
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    r.mr.buf.write(0, &payload).unwrap();
    let rq = p.qp.rq.as_mut().unwrap();
    rq.write_wqe(
        0,
        &[Sge {
            addr: p.addr,
            length: 4096,
            lkey: p.lkey,
        }],
    )
    .unwrap();
    rq.ring_doorbell(1);
    qp.post_send(wop::SEND, SIGNALED, 0, &data_seg(3000, r.mr.key, r.mr.addr));
    r.d.send_doorbell(0x48);
    fabric.run_until_idle().unwrap();
    let got = drain(&mut p.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wc.status, got[0].wc.byte_len),
        (WcStatus::Success, 3000)
    );
    let mut back = vec![0u8; 3000];
    p.buf.read(0, &mut back).unwrap();
    assert!(back == payload, "SEND data differs");
    let done = r.cq.ok();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].wqe.is_send && done[0].wc.status == WcStatus::Success);
    assert_eq!(
        (done[0].wc.opcode, done[0].wqe.index, done[0].wc.qp_num),
        (WcOpcode::Send, 0, 0x48)
    );

    // Soft → model: SEND_WITH_IMM into the model's RQ.
    qp.post_recv(4096, r.mr.key, r.mr.addr + 8192);
    p.buf.write(8192, b"from the soft device").unwrap();
    let sge = [Sge {
        addr: p.addr + 8192,
        length: 20,
        lkey: p.lkey,
    }];
    p.qp.sq
        .write_wqe(
            0,
            &SendWr::new(1, SendOp::SendWithImm { imm: 0xfeed }).sges(&sge),
            true,
        )
        .unwrap();
    p.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(!done[0].wqe.is_send);
    assert_eq!((done[0].wc.byte_len, done[0].wc.imm_data), (20, 0xfeed));
    assert!(done[0].wc.wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = [0u8; 20];
    r.mr.buf.read(8192, &mut got).unwrap();
    assert_eq!(&got, b"from the soft device");
    drain(&mut p.cq);

    // Model → soft: an 8-byte inline RDMA WRITE through BlueFlame (ds = ctrl + raddr + inline = 3).
    let mut segs = raddr(p.addr + 100, p.rkey).to_vec();
    segs.extend_from_slice(&inline(b"ABCDEFGH"));
    post_bf(&r.d, &mut qp, wop::RDMA_WRITE, &segs);
    fabric.run_until_idle().unwrap();
    let mut w = [0u8; 8];
    p.buf.read(100, &mut w).unwrap();
    assert_eq!(&w, b"ABCDEFGH");
    let done = r.cq.ok();
    assert_eq!(
        (done[0].wc.opcode, done[0].wqe.index),
        (WcOpcode::RdmaWrite, 1)
    );
    assert_eq!(r.d.model.counts().blueflame_writes, 1);

    // RDMA READ of the soft buffer, then a fetch-and-add on it, unsignaled WRITE between.
    let mut segs = raddr(p.addr, p.rkey).to_vec();
    segs.extend_from_slice(&data_seg(3000, r.mr.key, r.mr.addr + 16384));
    qp.post_send(wop::RDMA_READ, SIGNALED, 0, &segs);
    let mut segs = raddr(p.addr + 4000, p.rkey).to_vec();
    segs.extend_from_slice(&inline(b"xy"));
    qp.post_send(wop::RDMA_WRITE, 0, 0, &segs);
    p.buf.write(8000, &5u64.to_ne_bytes()).unwrap();
    let mut segs = raddr(p.addr + 8000, p.rkey).to_vec();
    segs.extend_from_slice(&7u64.to_be_bytes());
    segs.extend_from_slice(&0u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, r.mr.key, r.mr.addr + 32768));
    qp.post_send(wop::ATOMIC_FA, SIGNALED, 0, &segs);
    r.d.send_doorbell(0x48);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    assert_eq!(
        done.len(),
        2,
        "the unsignaled WRITE completes silently: {done:?}"
    );
    assert_eq!(
        (done[0].wc.opcode, done[0].wc.byte_len),
        (WcOpcode::RdmaRead, 3000)
    );
    assert_eq!(
        (done[1].wc.opcode, done[1].wqe.index),
        (WcOpcode::FetchAdd, 4)
    );
    let mut back = vec![0u8; 3000];
    r.mr.buf.read(16384, &mut back).unwrap();
    let mut expect = payload.clone();
    expect[100..108].copy_from_slice(b"ABCDEFGH");
    assert!(back == expect, "RDMA READ data differs");
    let mut orig = [0u8; 8];
    r.mr.buf.read(32768, &mut orig).unwrap();
    assert_eq!(u64::from_ne_bytes(orig), 5);
    p.buf.read(8000, &mut orig).unwrap();
    assert_eq!(u64::from_ne_bytes(orig), 12);

    // A protection error (bad lkey): error CQE, then the QP is in ERR and flushes.
    qp.post_send(wop::SEND, 0, 0, &data_seg(8, 0xbad00, r.mr.addr));
    qp.post_send(wop::SEND, 0, 0, &data_seg(8, r.mr.key, r.mr.addr));
    r.d.send_doorbell(0x48);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    assert_eq!(done.len(), 2, "{done:?}");
    assert_eq!(
        (done[0].wc.status, done[0].wqe.index),
        (WcStatus::LocProtErr, 5)
    );
    assert_eq!(
        (done[1].wc.status, done[1].wqe.index),
        (WcStatus::WrFlushErr, 6)
    );
    assert_eq!(r.d.cmd0(op::RST_QP, 2, 0, 0x48), 0);
}

#[test]
fn ud_both_ways() {
    let fabric = Fabric::stepped(2);
    let mut r = rig(&fabric, "10.0.1.1");
    let mut p = peer(&fabric, "10.0.1.2", QpType::Ud);
    let mut qp =
        r.d.qp_init(0x49, service::UD, &r.cq, 1, (4, 7), (4, 5), 0x1111);
    r.d.qp_rts(&qp, true, 0, Gid::ZERO, 0);
    p.connect(0, Gid::ZERO, 0);
    let rq = p.qp.rq.as_mut().unwrap();
    rq.write_wqe(
        0,
        &[Sge {
            addr: p.addr,
            length: 2048,
            lkey: p.lkey,
        }],
    )
    .unwrap();
    rq.ring_doorbell(1);
    // Datagram segment: address vector (port 1, GRH, dgid), dqpn, qkey.
    let mut dg = [0u8; 48];
    dg[0..4].copy_from_slice(&((1u32 << 24) | 1).to_be_bytes());
    dg[5] = 0x80;
    dg[11] = 64;
    dg[16..32].copy_from_slice(&p.gid.0);
    dg[32..36].copy_from_slice(&p.qp.qpn.to_be_bytes());
    dg[36..40].copy_from_slice(&0x1111u32.to_be_bytes());
    r.mr.buf.write(0, b"datagram!").unwrap();
    let mut segs = dg.to_vec();
    segs.extend_from_slice(&data_seg(9, r.mr.key, r.mr.addr));
    qp.post_send(wop::SEND, SIGNALED, 0, &segs);
    r.d.send_doorbell(0x49);
    fabric.run_until_idle().unwrap();
    let got = drain(&mut p.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].wc.byte_len, got[0].wc.src_qp), (40 + 9, 0x49));
    let mut b = [0u8; 9];
    p.buf.read(40, &mut b).unwrap();
    assert_eq!(&b, b"datagram!");
    assert_eq!(r.cq.ok().len(), 1);
    // Soft → model, received with the GRH area.
    qp.post_recv(256, r.mr.key, r.mr.addr + 4096);
    let av = portverbs_hal::attr::AddressVector {
        dgid: gid("10.0.1.1"),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..Default::default()
    };
    let wr =
        SendWr::new(2, SendOp::Send)
            .inline(b"pong")
            .signaled()
            .ud(portverbs_hal::wr::UdDest {
                ah_pd: None,
                av: &av,
                remote_qpn: 0x49,
                remote_qkey: 0x1111,
            });
    p.qp.sq.write_wqe(0, &wr, true).unwrap();
    p.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!((done[0].wc.byte_len, done[0].wc.src_qp), (44, p.qp.qpn));
    assert!(done[0].wc.wc_flags.contains(WcFlags::GRH));
    let mut b = [0u8; 4];
    r.mr.buf.read(4096 + 40, &mut b).unwrap();
    assert_eq!(&b, b"pong");
    // A wrong Q_Key is dropped silently.
    let wr = SendWr::new(3, SendOp::Send)
        .inline(b"x")
        .ud(portverbs_hal::wr::UdDest {
            ah_pd: None,
            av: &av,
            remote_qpn: 0x49,
            remote_qkey: 0x2222,
        });
    qp.post_recv(256, r.mr.key, r.mr.addr + 4096);
    p.qp.sq.write_wqe(1, &wr, true).unwrap();
    p.qp.sq.ring_doorbell(1, 2);
    fabric.run_until_idle().unwrap();
    assert!(r.cq.ok().is_empty());
}

#[test]
fn stamped_and_unowned_wqes_wait() {
    let fabric = Fabric::stepped(3);
    let mut r = rig(&fabric, "10.0.2.1");
    let mut p = peer(&fabric, "10.0.2.2", QpType::Rc);
    let mut qp = r.d.qp_init(0x4a, service::RC, &r.cq, 1, (4, 7), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x4a, gid("10.0.2.1"), 1);
    // A 5-segment WQE (ds = 6, 96 bytes) whose second 64-byte block still holds the stamp.
    let mut segs = Vec::new();
    for i in 0..5u64 {
        segs.extend_from_slice(&data_seg(4, r.mr.key, r.mr.addr + 4 * i));
    }
    let at = qp.sq_off;
    qp.post_send(wop::RDMA_WRITE, SIGNALED, 0, &{
        let mut s = raddr(p.addr, p.rkey).to_vec();
        s.extend_from_slice(&segs[..64]);
        s
    });
    qp.buf
        .write(at + 64, &0xffff_ffffu32.to_be_bytes())
        .unwrap();
    r.d.send_doorbell(0x4a);
    fabric.run_until_idle().unwrap();
    assert!(r.cq.ok().is_empty(), "a stamped block: not yet written");
    // Finish the WQE (the stamp is overwritten last) and ring again.
    qp.buf
        .write(at + 64, &data_seg(4, r.mr.key, r.mr.addr + 16))
        .unwrap();
    r.d.send_doorbell(0x4a);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.cq.ok().len(), 1);
    // A WQE whose owner bit is wrong for its pass is not executed either.
    let c = qp.sq_head;
    let slot = qp.sq_off + (c as usize % 16) * 128;
    qp.buf.write(slot + 16, &raddr(p.addr, p.rkey)).unwrap();
    qp.buf.write(slot + 32, &inline(b"zz")).unwrap();
    let mut ctrl = util::ctrl(wop::RDMA_WRITE, 3, c, 4, SIGNALED, 0);
    ctrl[0] |= 0x80;
    qp.buf.write(slot, &ctrl).unwrap();
    r.d.send_doorbell(0x4a);
    fabric.run_until_idle().unwrap();
    assert!(r.cq.ok().is_empty());
    assert_eq!(drain(&mut p.cq).len(), 0);
}

#[test]
fn cq_arming_fires_one_event_per_arm() {
    let fabric = Fabric::stepped(4);
    let mut r = rig(&fabric, "10.0.3.1");
    let mut p = peer(&fabric, "10.0.3.2", QpType::Rc);
    let mut qp = r.d.qp_init(0x4b, service::RC, &r.cq, 1, (4, 6), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x4b, gid("10.0.3.1"), 1);
    r.eq.poll();
    r.d.eq_doorbell(&r.eq, true);
    let irq0 = r.sink.get();
    let write = |qp: &mut Qp, p: &Peer, flags| {
        let mut s = raddr(p.addr, p.rkey).to_vec();
        s.extend_from_slice(&inline(b"1"));
        qp.post_send(wop::RDMA_WRITE, flags, 0, &s);
    };
    // Arm for any completion, then two completions: one event.
    r.d.arm_cq(&r.cq, CQ_REQ_NOT);
    write(&mut qp, &p, SIGNALED);
    write(&mut qp, &p, SIGNALED);
    r.d.send_doorbell(0x4b);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.eq.poll(), vec![DeviceEvent::Completion { cqn: 128 }]);
    assert_eq!(r.sink.get(), irq0 + 1);
    // Arming with CQEs already beyond the consumer index fires at once.
    r.d.eq_doorbell(&r.eq, true);
    r.d.arm_cq(&r.cq, CQ_REQ_NOT);
    assert_eq!(r.eq.poll(), vec![DeviceEvent::Completion { cqn: 128 }]);
    assert_eq!(r.sink.get(), irq0 + 2);
    assert_eq!(r.cq.ok().len(), 2);
    // Solicited-only arming ignores ordinary send completions...
    r.d.eq_doorbell(&r.eq, true);
    r.d.arm_cq(&r.cq, CQ_REQ_NOT_SOL);
    write(&mut qp, &p, SIGNALED);
    r.d.send_doorbell(0x4b);
    fabric.run_until_idle().unwrap();
    assert!(r.eq.poll().is_empty());
    assert_eq!(r.cq.ok().len(), 1);
    // ... but fires for a solicited receive.
    qp.post_recv(64, r.mr.key, r.mr.addr);
    let wr = SendWr::new(1, SendOp::Send)
        .inline(b"se")
        .flags(portverbs_hal::wr::SendFlags::SOLICITED);
    p.qp.sq.write_wqe(0, &wr, true).unwrap();
    p.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.eq.poll(), vec![DeviceEvent::Completion { cqn: 128 }]);
    // The same arm words through two 32-bit stores (dword 0 first).
    r.d.eq_doorbell(&r.eq, true);
    assert_eq!(r.cq.ok().len(), 1);
    let base = UAR as usize * 4096 + 0x20;
    r.d.bar2
        .write32(
            base,
            portverbs_mlx4::layout::uar::cq_arm_word(2, CQ_REQ_NOT, 128),
        )
        .unwrap();
    r.d.bar2.write32(base + 4, r.cq.ci).unwrap();
    write(&mut qp, &p, SIGNALED);
    r.d.send_doorbell(0x4b);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.eq.poll(), vec![DeviceEvent::Completion { cqn: 128 }]);
    // An arm doorbell from another UAR page is ignored and counted.
    let before = r.d.model.counts().ignored_doorbells;
    r.d.bar2
        .write64(
            9 * 4096 + 0x20,
            u64::from(portverbs_mlx4::layout::uar::cq_arm_word(1, CQ_REQ_NOT, 128)) << 32,
        )
        .unwrap();
    assert_eq!(r.d.model.counts().ignored_doorbells, before + 1);
}

#[test]
fn doorbell_calls_ring_what_the_stores_ring() {
    let fabric = Fabric::stepped(4);
    let mut r = rig(&fabric, "10.0.9.1");
    let p = peer(&fabric, "10.0.9.2", QpType::Rc);
    let mut qp = r.d.qp_init(0x4d, service::RC, &r.cq, 1, (4, 6), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x4d, gid("10.0.9.1"), 1);
    r.eq.poll();
    let calls =
        r.d.func
            .doorbells()
            .expect("the model takes doorbells as calls");
    let write = |qp: &mut Qp, p: &Peer| {
        let mut s = raddr(p.addr, p.rkey).to_vec();
        s.extend_from_slice(&inline(b"1"));
        qp.post_send(wop::RDMA_WRITE, SIGNALED, 0, &s);
    };
    let counts = |r: &Rig| {
        let c = r.d.model.counts();
        (c.send_doorbells, c.blueflame_writes)
    };
    let before = counts(&r);
    // The EQ and the CQ armed by calls, a send doorbell by a call: one completion, one event.
    calls.eq(r.eq.eqn / 4, r.eq.eqn % 4, EQ_ARM | (r.eq.ci & 0xff_ffff));
    let arm = cq_arm_word(1, CQ_REQ_NOT, r.cq.ci);
    r.cq.db.write(4, &arm.to_be_bytes()).unwrap();
    calls.arm_cq(UAR, cq_arm_word(1, CQ_REQ_NOT, r.cq.cqn), r.cq.ci);
    write(&mut qp, &p);
    calls.send(UAR, 0x4d);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.eq.poll(), vec![DeviceEvent::Completion { cqn: 128 }]);
    assert_eq!(r.cq.ok().len(), 1);
    assert_eq!(counts(&r), (before.0 + 1, before.1));
    // A page the model does not have (it has 256) and an EQ slot past 3 are dropped.
    write(&mut qp, &p);
    calls.send(256, 0x4d);
    calls.eq(r.eq.eqn / 4, 4, EQ_ARM);
    fabric.run_until_idle().unwrap();
    assert!(r.cq.ok().is_empty());
    assert_eq!(counts(&r), (before.0 + 1, before.1));
    calls.send(UAR, 0x4d);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.cq.ok().len(), 1);
    // BlueFlame by a call: the QP its control segment names is rung.
    let w = bf_block(&mut qp, wop::RDMA_WRITE, &{
        let mut s = raddr(p.addr + 8, p.rkey).to_vec();
        s.extend_from_slice(&inline(b"BF"));
        s
    });
    calls.blueflame(UAR, bf_page(256, UAR as usize), &w);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.cq.ok().len(), 1);
    let mut got = [0u8; 2];
    p.buf.read(8, &mut got).unwrap();
    assert_eq!(&got, b"BF");
    assert_eq!(counts(&r), (before.0 + 2, before.1 + 1));
    // After removal, calls vanish like stores.
    r.d.model.remove();
    calls.send(UAR, 0x4d);
    calls.blueflame(UAR, bf_page(256, UAR as usize), &w);
    assert_eq!(counts(&r), (before.0 + 2, before.1 + 1));
}

#[test]
fn cq_overrun_reports_cq_error_and_stops() {
    let fabric = Fabric::stepped(5);
    let mut r = rig(&fabric, "10.0.4.1");
    let p = peer(&fabric, "10.0.4.2", QpType::Rc);
    let mut small = r.d.cq(129, 2, r.eq.eqn);
    let mut qp = r.d.qp_init(0x4c, service::RC, &small, 1, (4, 6), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x4c, gid("10.0.4.1"), 1);
    r.eq.poll();
    for _ in 0..5 {
        let mut s = raddr(p.addr, p.rkey).to_vec();
        s.extend_from_slice(&inline(b"o"));
        qp.post_send(wop::RDMA_WRITE, SIGNALED, 0, &s);
    }
    r.d.send_doorbell(0x4c);
    fabric.run_until_idle().unwrap();
    assert_eq!(
        r.eq.poll(),
        vec![DeviceEvent::CqError {
            cqn: 129,
            syndrome: CqErrorSyndrome::Overrun
        }]
    );
    assert_eq!(
        small.ok().len(),
        4,
        "four entries written, then the CQ stopped"
    );
    let (_, out) = r.d.cmd_out(op::QUERY_CQ, 0, 129);
    assert_eq!(out[0] >> 4, 9, "status: overflow");
}

#[test]
fn srq_receives_follow_the_free_list_and_fire_the_limit() {
    let fabric = Fabric::stepped(6);
    let mut r = rig(&fabric, "10.0.5.1");
    let mut p = peer(&fabric, "10.0.5.2", QpType::Rc);
    // SRQ 64 with 8 WQEs of 32 bytes (next segment + one data segment).
    let srq_buf = r.d.alloc(8 * 32);
    let srq_db = r.d.alloc(4);
    let first = r.d.mtt(&srq_buf);
    let mut ctx = srq_ctx(3, 5, first, 1, &srq_db);
    ctx.limit_watermark = 2.into();
    use zerocopy::IntoBytes;
    assert_eq!(r.d.cmd_in(op::SW2HW_SRQ, 0, 64, ctx.as_bytes()), 0);
    // Free list 0 → 3 → 5 → …; post three WQEs along it.
    let order = [0u16, 3, 5, 1, 2, 4, 6, 7];
    for (i, &w) in order.iter().enumerate() {
        let next = order[(i + 1) % order.len()];
        srq_buf
            .write(usize::from(w) * 32 + 2, &next.to_be_bytes())
            .unwrap();
        srq_buf
            .write(
                usize::from(w) * 32 + 16,
                &data_seg(64, r.mr.key, r.mr.addr + 1024 * u64::from(w)),
            )
            .unwrap();
    }
    srq_db.write(0, &3u32.to_be_bytes()).unwrap();
    // A QP on the SRQ (no RQ of its own).
    let qp = {
        let qp = r.d.qp_init_srq(0x4d, &r.cq, 64);
        r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
        qp
    };
    p.connect(0x4d, gid("10.0.5.1"), 1);
    r.eq.poll();
    for i in 0..3u64 {
        let wr = SendWr::new(i, SendOp::Send).inline(b"srq");
        p.qp.sq.write_wqe(i as u32, &wr, true).unwrap();
    }
    p.qp.sq.ring_doorbell(0, 3);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    let idx: Vec<u16> = done.iter().map(|c| c.wqe.index).collect();
    assert_eq!(idx, vec![0, 3, 5], "the SRQ WQE index of each receive");
    let mut b = [0u8; 3];
    r.mr.buf.read(5 * 1024, &mut b).unwrap();
    assert_eq!(&b, b"srq");
    assert!(
        r.eq.poll().contains(&DeviceEvent::Srq {
            srqn: 64,
            kind: portverbs_hal::event::SrqEventKind::LimitReached
        }),
        "posted count fell below 2"
    );
    assert_eq!(r.d.cmd0(op::HW2SW_SRQ, 1, 0, 64), 6, "a QP is attached");
    assert_eq!(r.d.cmd0(op::RST_QP, 2, 0, qp.qpn), 0);
    assert_eq!(r.d.cmd0(op::HW2SW_SRQ, 1, 0, 64), 0);
}

#[test]
fn memory_window_bind_and_reg_bound() {
    let fabric = Fabric::stepped(7);
    let mut r = rig(&fabric, "10.0.6.1");
    let mut p = peer(&fabric, "10.0.6.2", QpType::Rc);
    let mut qp = r.d.qp_init(0x4e, service::RC, &r.cq, 1, (4, 6), (4, 5), 0);
    r.d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x4e, gid("10.0.6.1"), 1);
    // A type-2 window at MPT 0x30.
    let mw_key = keys::index_to_key(0x30);
    let mpt = portverbs_mlx4::layout::ctx::Mpt {
        flags: mpt_flag::STATUS_FREE.into(),
        qpn: mpt_flag::QP_BOUND.into(),
        key: keys::key_to_hw(mw_key).into(),
        pd_flags: (1 | mpt_flag::EN_INV).into(),
        ..Default::default()
    };
    use zerocopy::IntoBytes;
    assert_eq!(r.d.cmd_in(op::SW2HW_MPT, 0, 0x30, mpt.as_bytes()), 0);
    // BIND_MW: new key 0x3042 (tag 0x42) over 256 bytes of the MR, remote write.
    let mut bind = [0u8; 32];
    bind[0..4].copy_from_slice(&wqe::bind::REMOTE_WRITE.to_be_bytes());
    bind[4..8].copy_from_slice(&wqe::bind::TYPE_2.to_be_bytes());
    bind[8..12].copy_from_slice(&0x3042u32.to_be_bytes());
    bind[12..16].copy_from_slice(&r.mr.key.to_be_bytes());
    bind[16..24].copy_from_slice(&(r.mr.addr + 1024).to_be_bytes());
    bind[24..32].copy_from_slice(&256u64.to_be_bytes());
    qp.post_send(wop::BIND_MW, SIGNALED, 0, &bind);
    r.d.send_doorbell(0x4e);
    fabric.run_until_idle().unwrap();
    let done = r.cq.ok();
    assert_eq!(
        (done[0].wc.status, done[0].wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    // The soft device writes through the window.
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote: RemoteAddr {
                addr: r.mr.addr + 1024,
                rkey: 0x3042,
            },
        },
    )
    .inline(b"via window")
    .signaled();
    p.qp.sq.write_wqe(0, &wr, true).unwrap();
    p.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    assert_eq!(drain(&mut p.cq)[0].wc.status, WcStatus::Success);
    let mut b = [0u8; 10];
    r.mr.buf.read(1024, &mut b).unwrap();
    assert_eq!(&b, b"via window");
    let (_, out) = r.d.cmd_out(op::QUERY_MPT, 0, 0x30);
    assert_eq!(
        &out[8..12],
        &keys::key_to_hw(0x3042).to_be_bytes(),
        "current key"
    );
    // The MR has a bound window: HW2SW_MPT refuses with REG_BOUND.
    assert_eq!(r.d.cmd0(op::HW2SW_MPT, 1, 0, 16), 0x21);
    // LOCAL_INVAL the window, then both go.
    let mut inv = [0u8; 32];
    inv[8..12].copy_from_slice(&0x3042u32.to_be_bytes());
    qp.post_send(wop::LOCAL_INVAL, SIGNALED, 0, &inv);
    r.d.send_doorbell(0x4e);
    fabric.run_until_idle().unwrap();
    assert_eq!(r.cq.ok()[0].wc.opcode, WcOpcode::LocalInv);
    assert_eq!(r.d.cmd0(op::HW2SW_MPT, 1, 0, 16), 0);
    assert_eq!(r.d.cmd0(op::HW2SW_MPT, 1, 0, 0x30), 0);
}

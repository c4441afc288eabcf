//! Injected faults (command timeout, corrupt CQE, catastrophic error, surprise removal), the
//! reset, malformed WQEs, EQ overflow, CQ resize, a free-running fabric, and `counts()` back to
//! zero after a full teardown. None of these may panic or hang.

mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use portverbs_hal::error::CqeError;
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::mmio::MmioError;
use portverbs_hal::queue::SendQueue;
use portverbs_hal::types::{Gid, QpType};
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::{SendOp, SendWr, Sge};
use portverbs_mlx4::PciFunction;
use portverbs_mlx4::layout::ctx::{CqContext, mpt_flag, mtt_split, service};
use portverbs_mlx4::layout::hcr::{StatusWord, dword};
use portverbs_mlx4::layout::mailbox::QueryFw;
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::wqe::{INLINE_SEG, opcode as wop};
use portverbs_mlx4::layout::{cqe, eqe, read};
use portverbs_soft::Fabric;
use util::*;
use zerocopy::IntoBytes;

const SIGNALED: u32 = 0xc;

fn gid(ip: &str) -> Gid {
    Gid::parse(ip).unwrap()
}

struct Rig {
    d: Dev,
    eq: Eq,
    cq: Cq,
    mr: Mr,
    qp: Qp,
    p: Peer,
}

fn rig(fabric: &Fabric, n: u8) -> Rig {
    let mine = format!("10.1.{n}.1");
    let mut d = Dev::new(fabric, 1);
    d.bring_up();
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 1), 0);
    assert_eq!(d.set_gids(1, &[gid(&mine)]), 0);
    let eq = d.eq(4, 6, 0);
    d.map_all_events(&eq);
    let cq = d.cq(128, 6, eq.eqn);
    let mr = d.mr(
        16,
        1 << 16,
        1,
        mpt_flag::LOCAL_WRITE | mpt_flag::REMOTE_WRITE,
    );
    let p = peer(fabric, &format!("10.1.{n}.2"), QpType::Rc);
    let qp = d.qp_init(0x48, service::RC, &cq, 1, (4, 6), (4, 5), 0);
    d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x48, gid(&mine), 1);
    Rig {
        d,
        eq,
        cq,
        mr,
        qp,
        p,
    }
}

fn write_inline(r: &mut Rig, data: &[u8]) {
    let mut s = Vec::new();
    s.extend_from_slice(&r.p.addr.to_be_bytes());
    s.extend_from_slice(&r.p.rkey.to_be_bytes());
    s.extend_from_slice(&[0; 4]);
    s.extend_from_slice(&(INLINE_SEG | data.len() as u32).to_be_bytes());
    s.extend_from_slice(data);
    r.qp.post_send(wop::RDMA_WRITE, SIGNALED, 0, &s);
    r.d.send_doorbell(r.qp.qpn);
}

#[test]
fn command_timeout_latches_until_reset() {
    let fabric = Fabric::stepped(1);
    let mut d = Dev::new(&fabric, 1);
    d.reset();
    d.model.inject_command_timeout(true);
    d.post(op::QUERY_FW, 0, 0, 0, d.outbox.device_addr(), false, 0xffff);
    let w = StatusWord(d.hcr(dword::STATUS));
    assert!(w.go(), "go never clears");
    assert_eq!(w.opcode(), op::QUERY_FW);
    // The reset clears the stuck command and the injection.
    d.reset();
    assert_eq!(d.hcr(dword::STATUS), 0);
    d.run_fw();
    assert_eq!(d.model.counts().fw_pages, 64);
}

#[test]
fn a_corrupt_cqe_is_refused_by_the_decoder() {
    let fabric = Fabric::stepped(2);
    let mut r = rig(&fabric, 2);
    r.d.model.corrupt_next_cqe();
    write_inline(&mut r, b"one");
    write_inline(&mut r, b"two");
    fabric.run_until_idle().unwrap();
    let got = r.cq.poll();
    assert_eq!(got.len(), 2);
    assert!(
        matches!(got[0], Err(CqeError::BadOpcode { .. })),
        "{:?}",
        got[0]
    );
    assert_eq!(
        got[1].as_ref().unwrap().wqe.index,
        1,
        "the next one is fine"
    );
}

#[test]
fn catastrophic_error_flushes_and_fails_commands() {
    let fabric = Fabric::stepped(3);
    let mut r = rig(&fabric, 3);
    let (_, out) = r.d.cmd_out(op::QUERY_FW, 0, 0);
    let fw: QueryFw = read(&out).unwrap();
    let catas = fw.catas_offset.get() as usize;
    assert_eq!(r.d.bar0.read32(catas).unwrap(), 0, "healthy");
    r.qp.post_recv(64, r.mr.key, r.mr.addr);
    r.qp.post_recv(64, r.mr.key, r.mr.addr);
    r.eq.poll();
    r.d.model.catastrophic_error();
    assert_ne!(r.d.bar0.read32(catas).unwrap(), 0);
    assert!(r.eq.poll().contains(&DeviceEvent::DeviceFatal));
    let flushed = r.cq.ok();
    assert_eq!(flushed.len(), 2, "{flushed:?}");
    assert!(flushed.iter().all(|c| c.wc.status == WcStatus::WrFlushErr));
    assert_eq!(
        r.d.cmd0(op::NOP, 0, 0, 0x1f),
        0x01,
        "INTERNAL_ERR from now on"
    );
    assert_eq!(r.d.cmd0(op::RST_QP, 2, 0, 0x48), 0x01);
    // The reset brings the device back.
    r.d.bring_up();
    assert_eq!(r.d.bar0.read32(catas).unwrap(), 0);
    let c = r.d.model.counts();
    assert_eq!((c.qps, c.cqs, c.eqs, c.mpts, c.engine_qps), (0, 0, 0, 0, 0));
}

#[test]
fn surprise_removal() {
    let fabric = Fabric::stepped(4);
    let mut r = rig(&fabric, 4);
    r.qp.post_recv(64, r.mr.key, r.mr.addr);
    r.d.model.remove();
    assert_eq!(r.d.bar0.read32(0x80698), Err(MmioError::Removed));
    assert_eq!(r.d.bar2.read32(0x14), Err(MmioError::Removed));
    r.d.bar0.write32(0x80698, 0x00a0_0004).unwrap();
    r.d.bar2.write32(8 * 4096 + 0x14, 0x4800).unwrap();
    assert_eq!(r.d.func.config_read16(0).unwrap(), 0xffff);
    // The soft device's send reaches nothing: no CQE, no data written.
    let sge = [Sge {
        addr: r.p.addr,
        length: 8,
        lkey: r.p.lkey,
    }];
    r.p.qp
        .sq
        .write_wqe(0, &SendWr::new(1, SendOp::Send).sges(&sge), true)
        .unwrap();
    r.p.qp.sq.ring_doorbell(0, 1);
    let _ = fabric.run_for(10_000_000_000);
    assert!(r.cq.poll().is_empty(), "nothing written after removal");
    assert!(r.eq.poll().is_empty());
    let c = r.d.model.counts();
    assert_eq!((c.qps, c.cqs, c.eqs, c.mpts, c.icm_pages), (0, 0, 0, 0, 0));
    assert!(
        fabric
            .gids()
            .iter()
            .all(|(name, _, _)| name != r.d.model.name())
    );
    // Removal is permanent: a reset does nothing.
    r.d.bar0.write32(0xf0010, 1).unwrap();
    assert_eq!(r.d.bar0.read32(0), Err(MmioError::Removed));
}

#[test]
fn malformed_wqe_is_a_qp_catastrophic_error() {
    let fabric = Fabric::stepped(5);
    let mut r = rig(&fabric, 5);
    r.eq.poll();
    // FMR (fast registration) is not implemented: the QP fails with WQ_CATAS_ERROR.
    r.qp.post_send(wop::FMR, SIGNALED, 0, &[0u8; 48]);
    r.d.send_doorbell(0x48);
    fabric.run_until_idle().unwrap();
    assert!(r.eq.poll().contains(&DeviceEvent::Qp {
        qpn: 0x48,
        kind: QpEventKind::Fatal
    }));
    let done = r.cq.ok();
    assert!(done.iter().all(|c| c.wc.status == WcStatus::WrFlushErr));
    // An inline segment crossing a 64-byte boundary, on a fresh QP.
    let mut qp2 = r.d.qp_init(0x49, service::RC, &r.cq, 1, (4, 7), (4, 5), 0);
    r.d.qp_rts(&qp2, false, r.p.qp.qpn, r.p.gid, 1);
    let mut s = vec![0u8; 16];
    s.extend_from_slice(&(INLINE_SEG | 60).to_be_bytes());
    s.extend_from_slice(&[7u8; 60]);
    qp2.post_send(wop::RDMA_WRITE, SIGNALED, 0, &s);
    r.d.send_doorbell(0x49);
    fabric.run_until_idle().unwrap();
    assert!(r.eq.poll().contains(&DeviceEvent::Qp {
        qpn: 0x49,
        kind: QpEventKind::Fatal
    }));
}

#[test]
fn eq_overflow_drops_and_reports_elsewhere() {
    let fabric = Fabric::stepped(6);
    let mut d = Dev::new(&fabric, 1);
    d.bring_up();
    let mut big = d.eq(4, 6, 0);
    let mut small = d.eq(5, 1, 0);
    assert_eq!(d.cmd0(op::MAP_EQ, 0, 1 << eqe::event_type::CMD, 5), 0);
    assert_eq!(
        d.cmd0(op::MAP_EQ, 0, 1 << eqe::event_type::EQ_OVERFLOW, 4),
        0
    );
    for t in 0..3 {
        d.post(op::NOP, 0, 0, 0x1f, 0, true, t);
    }
    assert_eq!(small.poll().len(), 2, "two entries");
    assert_eq!(
        big.poll(),
        vec![DeviceEvent::Unknown {
            event_type: eqe::event_type::EQ_OVERFLOW,
            subtype: 0
        }]
    );
    assert_eq!(d.model.counts().eq_overflows, 1);
    // Consumed and re-armed: room again.
    d.eq_doorbell(&small, true);
    d.post(op::NOP, 0, 0, 0x1f, 0, true, 9);
    assert_eq!(small.poll().len(), 1);
}

#[test]
fn cq_resize_writes_a_resize_cqe_and_moves_unconsumed_ones() {
    let fabric = Fabric::stepped(7);
    let mut r = rig(&fabric, 7);
    write_inline(&mut r, b"a");
    write_inline(&mut r, b"b");
    fabric.run_until_idle().unwrap();
    let new = r.d.alloc(32 << 8);
    let first = r.d.mtt(&new);
    let (hi, lo) = mtt_split(first);
    let ctx = CqContext {
        logsize_usrpage: ((8 << 24) | UAR).into(),
        mtt_base_hi: hi,
        mtt_base_lo: lo.into(),
        ..CqContext::default()
    };
    assert_eq!(r.d.cmd_in(op::MODIFY_CQ, 0, 128, ctx.as_bytes()), 0);
    // Old buffer: the two CQEs, then the RESIZE CQE at counter 2.
    let mut e = [0u8; 32];
    r.cq.buf.read(2 * 32, &mut e).unwrap();
    assert_eq!(e[31] & 0x1f, cqe::OPCODE_RESIZE);
    // New buffer: copies one counter later, then new CQEs after the RESIZE one.
    let mut resized = Cq {
        cqn: 128,
        buf: new,
        log: 8,
        ci: 1,
        db: r.cq.db.clone(),
    };
    assert_eq!(resized.ok().len(), 2);
    resized.ci = 3;
    write_inline(&mut r, b"c");
    fabric.run_until_idle().unwrap();
    let done = resized.ok();
    assert_eq!((done.len(), done[0].wqe.index), (1, 2));
    // Moderation is accepted (and ignored).
    assert_eq!(r.d.cmd_in(op::MODIFY_CQ, 1, 128, ctx.as_bytes()), 0);
}

#[test]
fn threaded_fabric_runs_the_model_on_the_engine_thread() {
    let fabric = Fabric::threaded();
    let mut r = rig(&fabric, 8);
    write_inline(&mut r, b"threaded");
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        let done = r.cq.ok();
        if !done.is_empty() || Instant::now() > deadline {
            break done;
        }
        std::thread::yield_now();
    };
    assert_eq!(done.len(), 1);
    let mut b = [0u8; 8];
    r.p.buf.read(0, &mut b).unwrap();
    assert_eq!(&b, b"threaded");
}

#[test]
fn counts_return_to_zero_after_teardown() {
    let fabric = Fabric::stepped(9);
    let r = rig(&fabric, 9);
    let Rig {
        mut d,
        eq,
        cq,
        mr,
        qp,
        p,
    } = r;
    let sink = Arc::new(Counter::default());
    d.func.route_interrupt(1, sink).unwrap();
    let c = d.model.counts();
    assert!(!c.is_clear());
    assert_eq!((c.qps, c.engine_qps, c.engine_mrs), (1, 1, 1));
    assert_eq!(d.cmd0(op::CLOSE_PORT, 0, 0, 1), 0);
    assert_eq!(d.cmd0(op::RST_QP, 2, 0, qp.qpn), 0);
    assert_eq!(d.cmd0(op::HW2SW_MPT, 1, 0, mr.index), 0);
    assert_eq!(d.cmd0(op::HW2SW_CQ, 1, 0, cq.cqn), 0);
    assert_eq!(d.cmd0(op::MAP_EQ, 0, u64::MAX, eq.eqn | 1 << 31), 0);
    assert_eq!(d.cmd0(op::HW2SW_EQ, 1, 0, eq.eqn), 0);
    assert_eq!(d.cmd0(op::CLOSE_HCA, 0, 0, 0), 0);
    assert_eq!(d.cmd0(op::UNMAP_ICM, 0, 0, (ICM_BYTES / 4096) as u32), 0);
    assert_eq!(d.cmd0(op::UNMAP_ICM_AUX, 0, 0, 0), 0);
    assert_eq!(d.cmd0(op::UNMAP_FA, 0, 0, 0), 0);
    drop((eq, cq, mr, qp, p));
    d.fw = None;
    d.aux = None;
    d.icm = None;
    let Dev {
        model,
        inbox,
        outbox,
        ..
    } = d;
    drop((inbox, outbox));
    let c = model.counts();
    assert!(c.is_clear(), "{c:?}");
    assert!(c.commands > 20);
}

#[test]
fn reset_returns_to_power_on_state() {
    let fabric = Fabric::stepped(10);
    let mut r = rig(&fabric, 10);
    assert!(fabric.gids().iter().any(|(n, _, _)| n == r.d.model.name()));
    r.d.reset();
    let c = r.d.model.counts();
    assert_eq!(
        (
            c.qps,
            c.cqs,
            c.eqs,
            c.mpts,
            c.icm_pages,
            c.fw_pages,
            c.engine_qps
        ),
        (0, 0, 0, 0, 0, 0, 0)
    );
    assert!(fabric.gids().iter().all(|(n, _, _)| n != r.d.model.name()));
    assert_eq!(
        r.d.cmd0(op::QUERY_DEV_CAP, 0, 0, 0),
        0x04,
        "firmware off again"
    );
    // The old QP's doorbell is ignored without harm.
    r.d.send_doorbell(0x48);
    fabric.run_until_idle().unwrap();
    r.d.bring_up();
}

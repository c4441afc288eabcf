//! The GSI special QP on the model, driven by hand as a driver would: CONF_SPECIAL_QP, a QP of
//! service type MLX at the block's base + 2, MLX WQEs whose inline data is the LRH/GRH/BTH/DETH
//! header. A well-formed MAD reaches a soft device as a datagram from QP 1; a malformed one
//! completes in error (with the hardware QPN) and sends nothing; MLX anywhere else is refused.

mod util;

use portverbs_hal::queue::RecvQueue;
use portverbs_hal::types::{Gid, QpType, SpecialQp};
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::Sge;
use portverbs_mlx4::layout::ctx::{mpt_flag, service};
use portverbs_mlx4::layout::mlx::{MAX_HEADER, Route, UdHeader};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::wqe::{INLINE_SEG, opcode as wop};
use portverbs_soft::Fabric;
use util::*;

/// The special block: 8-aligned, just above the model's 64 reserved QPs.
const BASE: u32 = 0x40;
const GSI: u32 = BASE + 2;
const SIGNALED: u32 = 0xc;

fn gid(ip: &str) -> Gid {
    Gid::parse(ip).unwrap()
}

/// The header segments of an MLX WQE (after the control segment): the header in two inline
/// segments split at the 64-byte boundary, padding, then one data segment.
fn mlx_segs(h: &UdHeader, payload: u32, lkey: u32, addr: u64) -> Vec<u8> {
    let mut hdr = [0u8; MAX_HEADER];
    let n = h.encode(payload as usize, &mut hdr).unwrap();
    let mut v = (INLINE_SEG | 44).to_be_bytes().to_vec();
    v.extend_from_slice(&hdr[..44]);
    v.extend_from_slice(&(INLINE_SEG | (n as u32 - 44)).to_be_bytes());
    v.extend_from_slice(&hdr[44..n]);
    v.resize(80, 0);
    v.extend_from_slice(&data_seg(payload, lkey, addr));
    v
}

#[test]
fn mads_leave_the_gsi_qp_as_mlx_wqes_and_bad_ones_complete_in_error() {
    let fabric = Fabric::stepped(3);
    let mut d = Dev::new(&fabric, 1);
    d.bring_up();
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 1), 0);
    let me = gid("10.0.3.1");
    assert_eq!(d.set_gids(1, &[me]), 0);
    let eq = d.eq(4, 6, 0);
    d.map_all_events(&eq);
    let mut cq = d.cq(128, 6, eq.eqn);
    let mr = d.mr(16, 1 << 16, 1, mpt_flag::LOCAL_WRITE);

    // MLX before the special block exists, or outside it, is refused.
    let refused = |d: &mut Dev, qpn| {
        let mut mb = portverbs_mlx4::layout::ctx::QpMailbox::default();
        mb.ctx.flags = ((2 << 28) | (service::MLX << 16)).into();
        d.cmd_in(op::RST2INIT_QP, 0, qpn, zerocopy::IntoBytes::as_bytes(&mb))
    };
    assert_ne!(refused(&mut d, GSI), 0, "no CONF_SPECIAL_QP yet");
    assert_ne!(
        d.cmd0(op::CONF_SPECIAL_QP, 0, 0, BASE + 4),
        0,
        "not 8-aligned"
    );
    assert_ne!(
        d.cmd0(op::CONF_SPECIAL_QP, 0, 0, 8),
        0,
        "inside the reserved QPs"
    );
    assert_eq!(d.cmd0(op::CONF_SPECIAL_QP, 0, 0, BASE), 0);
    assert_ne!(refused(&mut d, 0x48), 0, "MLX on an ordinary QPN");

    let mut qp = d.qp_init(
        GSI,
        service::MLX,
        &cq,
        1,
        (4, 8),
        (4, 5),
        SpecialQp::GSI_QKEY,
    );
    d.qp_rts(&qp, true, 0, Gid::ZERO, 0);
    let mut p = peer(&fabric, "10.0.3.2", QpType::Ud);
    p.connect(0, Gid::ZERO, 0);
    let rq = p.qp.rq.as_mut().unwrap();
    let sge = Sge {
        addr: p.addr,
        length: 2048,
        lkey: p.lkey,
    };
    rq.write_wqe(0, &[sge]).unwrap();
    rq.write_wqe(1, &[sge]).unwrap();
    rq.ring_doorbell(2);

    let header = |src_qp| UdHeader {
        sl: 0,
        dlid: 0,
        slid: 0,
        grh: Some(Route {
            hop_limit: 64,
            sgid: me.0,
            dgid: p.gid.0,
            ..Route::default()
        }),
        solicited: false,
        pkey: 0xffff,
        dest_qp: p.qp.qpn,
        psn: 0,
        qkey: 0x1111,
        src_qp,
    };
    let mad: Vec<u8> = (0..=255u8).collect();
    mr.buf.write(0, &mad).unwrap();
    qp.post_send(
        wop::SEND,
        SIGNALED,
        0,
        &mlx_segs(&header(1), 256, mr.key, mr.addr),
    );
    d.send_doorbell(GSI);
    fabric.run_until_idle().unwrap();
    let got = drain(&mut p.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].wc.src_qp, got[0].wc.byte_len), (1, 40 + 256));
    let mut b = vec![0u8; 256];
    p.buf.read(40, &mut b).unwrap();
    assert_eq!(b, mad);
    let sent = cq.ok();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (sent[0].wc.qp_num, sent[0].wc.status),
        (GSI, WcStatus::Success)
    );

    // A header that claims another source QP: an error completion, nothing on the wire.
    qp.post_send(
        wop::SEND,
        SIGNALED,
        0,
        &mlx_segs(&header(5), 256, mr.key, mr.addr),
    );
    d.send_doorbell(GSI);
    fabric.run_until_idle().unwrap();
    assert!(drain(&mut p.cq).is_empty());
    let bad = cq.poll();
    assert_eq!(bad.len(), 1, "{bad:?}");
    let bad = bad[0].as_ref().unwrap();
    assert_eq!(bad.wc.qp_num, GSI);
    assert_ne!(bad.wc.status, WcStatus::Success);
}

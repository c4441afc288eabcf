//! The software device driven directly through the HAL, without verbs-core: two devices on a
//! stepped fabric exchange RC traffic.

use portverbs_hal::queue::{RecvQueue, SendQueue};
use portverbs_hal::types::QpType;
use portverbs_hal::wc::{WcOpcode, WcStatus};
use portverbs_hal::wr::{RemoteAddr, SendOp, SendWr, Sge};
use portverbs_soft::Fabric;
use portverbs_test_support::{HalPeer, RtsParams, drain};

fn node(fabric: &Fabric, ip: &str) -> HalPeer {
    HalPeer::new(fabric, ip, QpType::Rc)
}

fn connect(a: &HalPeer, b: &HalPeer) {
    a.to_rts(&RtsParams {
        min_rnr_timer: 12,
        ..RtsParams::new(b.qp.qpn, b.gid, 100)
    });
}

#[test]
fn rc_send_and_rdma_write_between_two_soft_devices() {
    let fabric = Fabric::stepped(1);
    let mut a = node(&fabric, "10.0.0.1");
    let mut b = node(&fabric, "10.0.0.2");
    connect(&a, &b);
    connect(&b, &a);

    // B posts a receive; A sends 3000 bytes (3 packets at MTU 1024).
    let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    a.buf.write(0, &payload).unwrap();
    let rq = b.qp.rq.as_mut().unwrap();
    rq.write_wqe(
        0,
        &[Sge {
            addr: b.addr + 4096,
            length: 4096,
            lkey: b.lkey,
        }],
    )
    .unwrap();
    rq.ring_doorbell(1);
    let sge = [Sge {
        addr: a.addr,
        length: 3000,
        lkey: a.lkey,
    }];
    a.qp.sq
        .write_wqe(
            0,
            &SendWr::new(7, SendOp::SendWithImm { imm: 0x1234 }).sges(&sge),
            true,
        )
        .unwrap();
    // And an RDMA WRITE of 8 inline bytes to B's buffer at offset 100.
    let wr = SendWr::new(
        8,
        SendOp::RdmaWrite {
            remote: RemoteAddr {
                addr: b.addr + 100,
                rkey: b.rkey,
            },
        },
    )
    .inline(b"ABCDEFGH");
    a.qp.sq.write_wqe(1, &wr, true).unwrap();
    a.qp.sq.ring_doorbell(0, 2);
    fabric.run_until_idle().unwrap();

    let sent = drain(&mut a.cq);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(
        sent.iter()
            .all(|c| c.wc.status == WcStatus::Success && c.wqe.is_send),
        "{sent:?}"
    );
    assert_eq!(sent[0].wqe.index, 0);
    assert_eq!(sent[1].wc.opcode, WcOpcode::RdmaWrite);
    let got = drain(&mut b.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].wc.status, WcStatus::Success);
    assert_eq!(got[0].wc.byte_len, 3000);
    assert_eq!(got[0].wc.imm_data, 0x1234);
    let mut back = vec![0u8; 3000];
    b.buf.read(4096, &mut back).unwrap();
    assert_eq!(back, payload);
    let mut w = [0u8; 8];
    b.buf.read(100, &mut w).unwrap();
    assert_eq!(&w, b"ABCDEFGH");

    // RDMA READ back those 3000 bytes from B into A at offset 8192.
    let sge = [Sge {
        addr: a.addr + 8192,
        length: 3000,
        lkey: a.lkey,
    }];
    let wr = SendWr::new(
        9,
        SendOp::RdmaRead {
            remote: RemoteAddr {
                addr: b.addr + 4096,
                rkey: b.rkey,
            },
        },
    )
    .sges(&sge);
    a.qp.sq.write_wqe(2, &wr, true).unwrap();
    a.qp.sq.ring_doorbell(2, 3);
    fabric.run_until_idle().unwrap();
    let done = drain(&mut a.cq);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].wc.status, WcStatus::Success);
    assert_eq!(done[0].wc.opcode, WcOpcode::RdmaRead);
    assert_eq!(done[0].wc.byte_len, 3000);
    let mut back = vec![0u8; 3000];
    a.buf.read(8192, &mut back).unwrap();
    assert_eq!(back, payload);
    assert_eq!(b.dev.engine_stats().retransmits, 0);
}

//! The software device driven directly through the HAL, without verbs-core: two devices on a
//! stepped fabric exchange RC traffic.

use std::sync::Arc;

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::device::{CqParams, EqKind, EqParams, MrParams, QpCreateParams};
use portverbs_hal::notify::NullSink;
use portverbs_hal::queue::{CompletionQueue, RecvQueue, SendQueue};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpState, QpType};
use portverbs_hal::wc::{Cqe, WcOpcode, WcStatus};
use portverbs_hal::wr::{RemoteAddr, SendOp, SendWr, Sge};
use portverbs_hal::{BlockingDevice, Device, DmaMemory, QpResources};
use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};

struct Node {
    dev: SoftDevice,
    cq: portverbs_soft::SoftCq,
    qp: QpResources<portverbs_soft::SoftSq, portverbs_soft::SoftRq>,
    buf: Arc<dyn DmaMemory>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    gid: Gid,
}

fn node(fabric: &Fabric, ip: &str) -> Node {
    let dev = SoftDevice::attach(fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap();
    let eq = dev
        .create_eq_blocking(
            EqParams {
                entries: 64,
                kind: EqKind::Async,
            },
            Arc::new(NullSink),
        )
        .unwrap();
    let pd = dev.alloc_pd_blocking().unwrap();
    let cq = dev
        .create_cq_blocking(CqParams {
            entries: 64,
            eqn: eq.eqn(),
        })
        .unwrap();
    std::mem::forget(eq);
    let qp = dev
        .create_qp_blocking(QpCreateParams {
            pd,
            qp_type: QpType::Rc,
            send_cqn: cq.cqn(),
            recv_cqn: cq.cqn(),
            srqn: None,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
        })
        .unwrap();
    let buf = dev.alloc_dma(1 << 16).unwrap();
    let keys = dev
        .register_mr_blocking(MrParams {
            pd,
            region: buf.clone(),
            offset: 0,
            length: 1 << 16,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        })
        .unwrap();
    Node {
        dev,
        cq,
        qp,
        buf,
        lkey: keys.lkey,
        rkey: keys.rkey,
        addr: keys.addr,
        gid: Gid::parse(ip).unwrap(),
    }
}

fn connect(a: &Node, b: &Node) {
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        port_num: 1,
        ..QpAttr::default()
    };
    a.dev
        .modify_qp_blocking(
            a.qp.qpn,
            init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: b.qp.qpn,
        rq_psn: 100,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ah_attr: AddressVector {
            dgid: b.gid,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    };
    a.dev
        .modify_qp_blocking(
            a.qp.qpn,
            rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 100,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    a.dev
        .modify_qp_blocking(
            a.qp.qpn,
            rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
}

fn poll(cq: &mut dyn CompletionQueue) -> Vec<Cqe> {
    let mut v = Vec::new();
    while let Some(c) = cq.poll_one().unwrap() {
        v.push(c);
    }
    cq.publish_ci();
    v
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
    a.qp.sq.ring_doorbell(2);
    fabric.run_until_idle().unwrap();

    let sent = poll(&mut a.cq);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(
        sent.iter()
            .all(|c| c.status == WcStatus::Success && c.is_send),
        "{sent:?}"
    );
    assert_eq!(sent[0].wqe_index, 0);
    assert_eq!(sent[1].opcode, WcOpcode::RdmaWrite);
    let got = poll(&mut b.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].byte_len, 3000);
    assert_eq!(got[0].imm, 0x1234);
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
    a.qp.sq.ring_doorbell(3);
    fabric.run_until_idle().unwrap();
    let done = poll(&mut a.cq);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].status, WcStatus::Success);
    assert_eq!(done[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(done[0].byte_len, 3000);
    let mut back = vec![0u8; 3000];
    a.buf.read(8192, &mut back).unwrap();
    assert_eq!(back, payload);
    assert_eq!(b.dev.engine_stats().retransmits, 0);
}

//! `Cq::event_queue`: the handle a platform layer keeps to process the event queue of a CQ it
//! has requests on, without keeping the CQ alive (the Windows layer's hook).

use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs_verbs::{
    AccessFlags, ConnectOptions, Context, ContextOptions, Cq, CqInit, NotifyError, NotifyKind,
    QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr,
};

fn cq(ctx: &Context<SoftDevice>) -> Cq<SoftDevice> {
    ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })
    .unwrap()
}

#[test]
fn processing_the_queue_completes_requests_and_does_not_pin_the_cq() {
    let fabric = Fabric::stepped(5);
    let open = |ip: &str| {
        let dev = SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap();
        Context::open_blocking(dev, ContextOptions::default()).unwrap()
    };
    let (a, b) = (open("10.0.0.1"), open("10.0.0.2"));
    let (pd_a, pd_b) = (
        a.alloc_pd_blocking().unwrap(),
        b.alloc_pd_blocking().unwrap(),
    );
    let (cq_a, cq_b) = (cq(&a), cq(&b));
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = |pd: &portverbs_verbs::Pd<SoftDevice>, cq| {
        pd.create_qp_blocking(QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps,
            sq_sig_all: false,
            special: None,
        })
        .unwrap()
    };
    let (qa, qb) = (qp(&pd_a, &cq_a), qp(&pd_b, &cq_b));
    let opts = ConnectOptions::default();
    let (ea, eb) = (
        qa.endpoint_blocking(&opts).unwrap(),
        qb.endpoint_blocking(&opts).unwrap(),
    );
    qa.connect_rc_blocking(&eb, &opts).unwrap();
    qb.connect_rc_blocking(&ea, &opts).unwrap();
    let mr = pd_b
        .reg_vec_blocking(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[mr.sge(0, 64).unwrap()],
    }])
    .unwrap();

    let eq = cq_b.event_queue();
    assert_eq!(eq.eqn(), cq_b.eqn());
    let req = cq_b.notify(NotifyKind::Any);
    qa.post_send(&[SendWr::new(1, SendOp::Send)
        .inline(b"eq")
        .flags(SendFlags::empty())])
        .unwrap();
    fabric.run_until_idle().unwrap();
    assert!(!req.is_complete(), "nobody processed the queue yet");
    assert!(eq.process().unwrap() >= 1);
    assert_eq!(req.try_result(), Some(Ok(())));

    // The handle keeps the queue, not the CQ: destroying the CQ is not refused, and its
    // pending request completes as cancelled.
    let pending = cq_b.notify(NotifyKind::Errors);
    drop(qb);
    let cqn = cq_b.cqn();
    cq_b.destroy().unwrap();
    assert_eq!(
        pending.try_result(),
        Some(Err(NotifyError::Cancelled { cqn }))
    );
    assert_eq!(
        eq.process().unwrap(),
        0,
        "the queue still works, and is empty"
    );
}

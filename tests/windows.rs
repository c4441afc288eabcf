//! On Windows the facade opens devices with `portverbs-windows`' sinks: the blocking calls of
//! the portable API (`wait_cq_event`, as `portverbs pingpong -e` makes) sleep on an event
//! queue's completion port.
#![cfg(windows)]

use std::time::Duration;

use portverbs::prelude::*;
use portverbs::verbs::WaitError;
use portverbs::windows::port_sleeps;

#[test]
fn a_channel_wait_sleeps_on_a_completion_port() -> Result<(), Box<dyn std::error::Error>> {
    let open = |name| portverbs::open(portverbs::device(name).expect("embedded device"));
    let (ctx_a, ctx_b) = (open("soft0")?, open("soft1")?);
    let chan = ctx_b.create_comp_channel()?;
    let before = port_sleeps();
    let idle = chan.wait_cq_event(Some(Duration::from_millis(5)));
    assert!(matches!(idle, Err(WaitError::TimedOut)), "{idle:?}");
    assert!(port_sleeps() > before, "the wait slept on the port");

    let opts = ConnectOptions::default();
    let cq_a = ctx_a.create_cq_blocking(CqInit {
        entries: 8,
        ..CqInit::default()
    })?;
    let cq_b = ctx_b.create_cq_blocking(CqInit {
        entries: 8,
        channel: Some(&chan),
        ..CqInit::default()
    })?;
    let (pd_a, pd_b) = (ctx_a.alloc_pd_blocking()?, ctx_b.alloc_pd_blocking()?);
    let qp_a = pd_a.create_qp_blocking(QpInit::new(QpType::Rc, &cq_a))?;
    let qp_b = pd_b.create_qp_blocking(QpInit::new(QpType::Rc, &cq_b))?;
    let (ep_a, ep_b) = (
        qp_a.endpoint_blocking(&opts)?,
        qp_b.endpoint_blocking(&opts)?,
    );
    qp_a.connect_rc_blocking(&ep_b, &opts)?;
    qp_b.connect_rc_blocking(&ep_a, &opts)?;
    let mr = pd_b.reg_vec_blocking(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let sges = [mr.sge(0, 64)?];
    qp_b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &sges,
    }])?;
    cq_b.req_notify(false);
    qp_a.post_send(&[SendWr::new(1, SendOp::Send).inline(b"iocp")])?;
    let got = chan.wait_cq_event(Some(Duration::from_secs(20)))?;
    assert_eq!(got.cqn(), cq_b.cqn());
    got.ack_events(1);
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(cq_b.poll(&mut wc)?, 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    Ok(())
}

/// README's "Windows: waiting the Windows way", with the traffic that completes it.
#[test]
fn the_readme_example_runs() -> Result<(), Box<dyn std::error::Error>> {
    use portverbs::windows::{CompletionPort, Overlapped};
    use std::sync::Arc;

    let win = portverbs::windows::open(portverbs::device("soft1").unwrap())?;
    let cq = win.context().create_cq_blocking(CqInit {
        entries: 64,
        ..CqInit::default()
    })?;
    let port = Arc::new(CompletionPort::new()?);
    win.associate(port.clone(), 0x5057)?;
    let ov = Overlapped::new();
    win.notify(&cq, NotifyKind::Any, &ov)?;

    // A peer on soft0 sends one message to a QP on `cq`.
    let ctx_a = portverbs::open(portverbs::device("soft0").unwrap())?;
    let cq_a = ctx_a.create_cq_blocking(CqInit {
        entries: 8,
        ..CqInit::default()
    })?;
    let (pd_a, pd_b) = (
        ctx_a.alloc_pd_blocking()?,
        win.context().alloc_pd_blocking()?,
    );
    let qp_a = pd_a.create_qp_blocking(QpInit::new(QpType::Rc, &cq_a))?;
    let qp_b = pd_b.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
    let opts = ConnectOptions::default();
    let (ep_a, ep_b) = (
        qp_a.endpoint_blocking(&opts)?,
        qp_b.endpoint_blocking(&opts)?,
    );
    qp_a.connect_rc_blocking(&ep_b, &opts)?;
    qp_b.connect_rc_blocking(&ep_a, &opts)?;
    let mr = pd_b.reg_vec_blocking(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let sges = [mr.sge(0, 64)?];
    qp_b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &sges,
    }])?;
    qp_a.post_send(&[SendWr::new(1, SendOp::Send).inline(b"iocp")])?;

    loop {
        let packet = port.get(None)?.expect("no timeout");
        if win.dispatch(&packet)? {
            continue;
        }
        if ov.is(&packet) {
            ov.result().expect("done")?;
            break;
        }
    }
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut wc)?, 1);

    // Rust async: the task sleeps on a port, its waker is a packet.
    qp_b.post_recv(&[RecvWr {
        wr_id: 2,
        sges: &sges,
    }])?;
    let (notified, _) = portverbs::windows::block_on_port(async {
        let n = cq.notified(NotifyKind::Any);
        qp_a.post_send(&[SendWr::new(2, SendOp::Send).inline(b"async")])?;
        n.await.map_err(Box::<dyn std::error::Error>::from)
    })?;
    notified?;
    Ok(())
}

//! On Windows the facade opens devices with `portverbs-windows`' sinks: the blocking calls of
//! the portable API (`wait_cq_event`, as `portverbs pingpong -e` makes) sleep on an event
//! queue's completion port.
#![cfg(windows)]

use std::time::Duration;

use portverbs::prelude::*;
use portverbs::verbs::WaitError;
use portverbs::windows::port_sleeps;

/// RC QPs on a's and b's CQs, connected to each other, with a 64-byte receive (wr 1) posted
/// on b's. Returns both QPs and the receive's MR.
fn receiving_pair(
    a: (&Pd, &Cq),
    b: (&Pd, &Cq),
) -> Result<(Qp, Qp, Mr), Box<dyn std::error::Error>> {
    let opts = ConnectOptions::default();
    let qp_a = a.0.create_qp_blocking(QpInit::new(QpType::Rc, a.1))?;
    let qp_b = b.0.create_qp_blocking(QpInit::new(QpType::Rc, b.1))?;
    let (ep_a, ep_b) = (
        qp_a.endpoint_blocking(&opts)?,
        qp_b.endpoint_blocking(&opts)?,
    );
    qp_a.connect_rc_blocking(&ep_b, &opts)?;
    qp_b.connect_rc_blocking(&ep_a, &opts)?;
    let mr =
        b.0.reg_vec_blocking(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
    let sges = [mr.sge(0, 64)?];
    qp_b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &sges,
    }])?;
    Ok((qp_a, qp_b, mr))
}

/// An RC QP in RESET on its own 8-entry CQ (the CM takes it from there).
fn rc_qp(ctx: &Context) -> Result<Qp, Box<dyn std::error::Error>> {
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 8,
        ..CqInit::default()
    })?;
    let pd = ctx.alloc_pd_blocking()?;
    Ok(pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?)
}

#[test]
fn a_channel_wait_sleeps_on_a_completion_port() -> Result<(), Box<dyn std::error::Error>> {
    let open = |name| portverbs::open(portverbs::device(name).expect("embedded device"));
    let (ctx_a, ctx_b) = (open("soft0")?, open("soft1")?);
    let chan = ctx_b.create_comp_channel()?;
    let before = port_sleeps();
    let idle = chan.wait_cq_event(Some(Duration::from_millis(5)));
    assert!(matches!(idle, Err(WaitError::TimedOut)), "{idle:?}");
    assert!(port_sleeps() > before, "the wait slept on the port");

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
    let (qp_a, _qp_b, _mr) = receiving_pair((&pd_a, &cq_a), (&pd_b, &cq_b))?;
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
    let (qp_a, qp_b, mr) = receiving_pair((&pd_a, &cq_a), (&pd_b, &cq))?;
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
        sges: &[mr.sge(0, 64)?],
    }])?;
    let (notified, _) = portverbs::windows::block_on_port(async {
        let n = cq.notified(NotifyKind::Any);
        qp_a.post_send(&[SendWr::new(2, SendOp::Send).inline(b"async")])?;
        n.await.map_err(Box::<dyn std::error::Error>::from)
    })?;
    notified?;
    Ok(())
}

/// The connection manager's calls as OVERLAPPED requests, as NetworkDirect's
/// `IND2Connector` makes them. On soft1 an accept (get the request, accept on a QP) and on
/// soft0 a connect (resolve, connect) are started with `Completions::start`; one thread
/// sleeps on one completion port, hands the devices' doorbells back to them, and sees both
/// OVERLAPPEDs complete; then a disconnect and the peer's notify-disconnect the same way.
#[test]
fn cm_connect_accept_and_disconnect_complete_overlapped_requests()
-> Result<(), Box<dyn std::error::Error>> {
    use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
    use portverbs::windows::{CompletionPort, Overlapped};
    use std::sync::Arc;

    let (a, b) = (
        portverbs::windows::open(portverbs::device("soft0").unwrap())?,
        portverbs::windows::open(portverbs::device("soft1").unwrap())?,
    );
    let port = Arc::new(CompletionPort::new()?);
    a.associate(port.clone(), 0xa)?;
    b.associate(port.clone(), 0xb)?;
    let ip = |ctx: &Context| -> Result<_, Box<dyn std::error::Error>> {
        Ok(ctx.gid_table_blocking(1)?[0].1.gid.to_ip())
    };
    let cm_a = CmDevice::open_blocking(a.context(), ip(a.context())?)?;
    let cm_b = CmDevice::open_blocking(b.context(), ip(b.context())?)?;
    let (qp_a, qp_b) = (rc_qp(a.context())?, rc_qp(b.context())?);
    let dst = std::net::SocketAddr::new(cm_b.local_ip(), 7471);
    let mut listener = Listener::bind(&cm_b, dst)?;
    listener.listen(1)?;

    let (ov_accept, ov_connect) = (Overlapped::new(), Overlapped::new());
    let qb = qp_b.clone();
    let accept = b.start(&ov_accept, async move {
        let req = listener.get_request().await?;
        let data = req.private_data().to_vec();
        let conn = req
            .accept(
                &qb,
                &ConnParam {
                    private_data: b"welcome".to_vec(),
                    ..ConnParam::default()
                },
            )
            .await?;
        Ok::<_, portverbs::cm::service::ServiceError>((listener, conn, data))
    })?;
    let (cma, qa) = (cm_a.clone(), qp_a.clone());
    let connect = a.start(&ov_connect, async move {
        let mut conn = Connector::new(&cma)?;
        conn.resolve(dst).await?;
        let reply = conn
            .connect(
                &qa,
                &ConnParam {
                    private_data: b"hello".to_vec(),
                    ..ConnParam::default()
                },
            )
            .await?;
        Ok::<_, portverbs::cm::service::ServiceError>((conn, reply))
    })?;
    // One thread, one port: doorbells go back to their device, requests complete.
    let wait = |ovs: &[&Overlapped]| -> Result<(), Box<dyn std::error::Error>> {
        let mut left: Vec<&Overlapped> = ovs.to_vec();
        while !left.is_empty() {
            let packet = port
                .get(Some(Duration::from_secs(20)))?
                .ok_or("no completion within 20 s")?;
            if a.dispatch(&packet)? || b.dispatch(&packet)? {
                continue;
            }
            left.retain(|ov| !ov.is(&packet));
        }
        Ok(())
    };
    wait(&[&ov_accept, &ov_connect])?;
    let (_listener, passive, request_data) = accept.take().ok_or("accept finished")??;
    let (active, reply) = connect.take().ok_or("connect finished")??;
    // Private data comes in the MAD's whole area, zero-padded, as rdma_cm hands it over.
    assert!(request_data.starts_with(b"hello\0"), "{request_data:?}");
    assert!(reply.starts_with(b"welcome\0"), "{reply:?}");
    assert_eq!(qp_a.state(), QpState::Rts);

    // Disconnect on soft0; the peer's notify-disconnect completes as an OVERLAPPED request.
    let ov_notify = Overlapped::new();
    let notify = b.start(&ov_notify, async move {
        passive.notify_disconnect().await?;
        Ok::<_, portverbs::cm::service::ServiceError>(passive)
    })?;
    active.disconnect(&qp_a)?;
    wait(&[&ov_notify])?;
    let passive = notify.take().ok_or("notify finished")??;
    assert_eq!(qp_a.state(), QpState::Err, "disconnect moved the QP to ERR");
    let _ = passive.disconnect(&qp_b);
    assert!(cm_a.flush(Duration::from_secs(5))? && cm_b.flush(Duration::from_secs(5))?);
    Ok(())
}

/// CM retransmissions on the port loop alone (no thread runs the timers): the REQ of a connect
/// run as an OVERLAPPED request is lost on a private fabric. With the facade's `PortTimer`
/// lent to the CM devices, the application does nothing but its port loop — a wait whose
/// timeout is `Completions::next_timeout`, doorbells to `dispatch`, a timeout to `progress`
/// — no blocking CM call and no other traffic, and the connect still completes after one
/// retransmission interval.
#[test]
fn a_lost_req_is_retransmitted_while_the_application_only_runs_its_port_loop()
-> Result<(), Box<dyn std::error::Error>> {
    use portverbs::cm::PortTimer;
    use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, ServiceError};
    use portverbs::soft::{DeviceConfig, Fabric, LinkFaults, SoftDevice};
    use portverbs::windows::{CompletionPort, Overlapped, Packet};
    use std::sync::Arc;
    use std::time::Instant;

    let fabric = Fabric::threaded();
    let open = |ip: &str| -> Result<_, Box<dyn std::error::Error>> {
        let ip: std::net::IpAddr = ip.parse()?;
        let dev = SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip))?;
        let win = portverbs::windows::open(portverbs::AnyDevice::Soft(dev))?;
        let cm = CmDevice::open_blocking(win.context(), ip)?;
        cm.set_timer(Arc::new(PortTimer));
        Ok((win, cm))
    };
    let ((a, cm_a), (b, cm_b)) = (open("10.78.0.1")?, open("10.78.0.2")?);
    let port = Arc::new(CompletionPort::new()?);
    a.associate(port.clone(), 0xa)?;
    b.associate(port.clone(), 0xb)?;
    let (qp_a, qp_b) = (rc_qp(a.context())?, rc_qp(b.context())?);
    let dst = std::net::SocketAddr::new(cm_b.local_ip(), 7472);
    let mut listener = Listener::bind(&cm_b, dst)?;
    listener.listen(1)?;

    // The application's whole loop: wait no longer than the next timer, hand doorbells back,
    // make progress when the wait timed out (a timer is due). Returns the time spent.
    let run_until = |ovs: &[&Overlapped]| -> Result<Duration, Box<dyn std::error::Error>> {
        let (start, mut left) = (Instant::now(), ovs.to_vec());
        while !left.is_empty() {
            if start.elapsed() > Duration::from_secs(30) {
                return Err("no completion within 30 s".into());
            }
            let packet: Option<Packet> = port.get(a.next_timeout())?;
            let Some(packet) = packet else {
                a.progress()?;
                b.progress()?;
                continue;
            };
            if a.dispatch(&packet)? || b.dispatch(&packet)? {
                continue;
            }
            left.retain(|ov| !ov.is(&packet));
        }
        Ok(start.elapsed())
    };

    let ov_resolve = Overlapped::new();
    let resolve = a.start(&ov_resolve, {
        let cm_a = cm_a.clone();
        async move {
            let mut conn = Connector::new(&cm_a)?;
            conn.resolve(dst).await?;
            Ok::<_, ServiceError>(conn)
        }
    })?;
    run_until(&[&ov_resolve])?;
    let mut conn = resolve.take().ok_or("resolve finished")??;

    let (ov_accept, ov_connect) = (Overlapped::new(), Overlapped::new());
    let qb = qp_b.clone();
    let accept = b.start(&ov_accept, async move {
        let req = listener.get_request().await?;
        let conn = req.accept(&qb, &ConnParam::default()).await?;
        Ok::<_, ServiceError>((listener, conn))
    })?;
    // Everything soft0 sends from now on is lost; starting the request polls it once, which
    // sends the REQ.
    fabric.set_faults(LinkFaults::lossy(1.0));
    let qa = qp_a.clone();
    let connect = a.start(&ov_connect, async move {
        let reply = conn
            .connect(
                &qa,
                &ConnParam {
                    private_data: b"again".to_vec(),
                    ..ConnParam::default()
                },
            )
            .await?;
        Ok::<_, ServiceError>((conn, reply))
    })?;
    let lost_by = Instant::now() + Duration::from_secs(5);
    while fabric.stats().lost == 0 {
        assert!(Instant::now() < lost_by, "the REQ never reached the fabric");
        std::thread::sleep(Duration::from_millis(1));
    }
    fabric.set_faults(LinkFaults::NONE);
    assert!(ov_connect.is_pending() && ov_accept.is_pending());
    assert!(
        a.next_timeout().is_some(),
        "the REQ's retransmission is armed"
    );

    let took = run_until(&[&ov_accept, &ov_connect])?;
    let (_listener, passive) = accept.take().ok_or("accept finished")??;
    let (active, _reply) = connect.take().ok_or("connect finished")??;
    assert_eq!(fabric.stats().lost, 1);
    assert_eq!(cm_a.stats().retransmits, 1, "{:?}", cm_a.stats());
    assert_eq!(qp_a.state(), QpState::Rts);
    // One retransmission interval, not the loop's 30 s guard.
    assert!(took < Duration::from_secs(15), "{took:?}");
    eprintln!("connected {took:?} after the REQ was lost");

    active.disconnect(&qp_a)?;
    let _ = passive.disconnect(&qp_b);
    assert!(cm_a.flush(Duration::from_secs(5))? && cm_b.flush(Duration::from_secs(5))?);
    Ok(())
}

//! QP transitions that never block the CM, on a device whose commands take time: the mlx4 driver in
//! event mode over the emulated ConnectX-3, where a MODIFY_QP completes only when the HCA's
//! command-completion event arrives. The CM starts each QP transition and goes on with its
//! message processing; the agent's later outputs (the REP after RTR, the RTU after RTS,
//! ESTABLISHED) wait behind the transition, and connect, accept and disconnect still end
//! with the QP in RTS or ERR.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener, RdmaCmEvent};
use portverbs::mlx4::{CommandMode, Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn mlx4(fabric: &Fabric, ip: IpAddr) -> (Mlx4Model, Context) {
    let (model, function) = Mlx4Model::attach(fabric, ModelConfig::default()).unwrap();
    let mut config = Mlx4Config::new("mlx4_cm", vec![vec![Gid::from_ip(ip)]]);
    config.command_mode = CommandMode::Events;
    let dev = Mlx4Device::open(function, config).unwrap();
    let ctx = portverbs::open(AnyDevice::Mlx4(dev)).unwrap();
    (model, ctx)
}

fn rc_qp(ctx: &Context) -> Qp {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap()
}

#[test]
fn transitions_on_an_event_mode_mlx4_do_not_block_the_cm() {
    let fabric = Fabric::threaded();
    let (mlx4_ip, soft_ip): (IpAddr, IpAddr) =
        ("10.8.0.2".parse().unwrap(), "10.8.0.1".parse().unwrap());
    let (model, mctx) = mlx4(&fabric, mlx4_ip);
    let soft = SoftDevice::attach(&fabric, DeviceConfig::with_ip(soft_ip)).unwrap();
    let sctx = portverbs::open(AnyDevice::Soft(soft)).unwrap();
    let m = CmDevice::open_blocking(&mctx, mlx4_ip).unwrap();
    let s = CmDevice::open_blocking(&sctx, soft_ip).unwrap();
    // From here the HCA's firmware is slow: a thread plays its command-completion events
    // 2 ms late.
    model.hold_command_events(true);
    let stop = Arc::new(AtomicBool::new(false));
    let firmware = {
        let (model, stop) = (model.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(2));
                model.release_command_events();
            }
        })
    };

    // The mlx4 side listens; the soft side connects.
    let dst = SocketAddr::new(mlx4_ip, 7471);
    let mut listener = Listener::bind(&m, dst).unwrap();
    listener.listen(1).unwrap();
    let passive = {
        let mctx = mctx.clone();
        thread::spawn(move || {
            let qp = rc_qp(&mctx);
            let req = listener.get_request_blocking(T).unwrap();
            let conn = req.accept_blocking(&qp, &ConnParam::default()).unwrap();
            assert_eq!(
                qp.state(),
                QpState::Rts,
                "accept returns with the QP in RTS"
            );
            conn.notify_disconnect_blocking(T).unwrap();
            conn.disconnect(&qp).unwrap();
            assert_eq!(qp.state(), QpState::Err);
        })
    };
    let qp = rc_qp(&sctx);
    let mut conn = Connector::new(&s).unwrap();
    conn.resolve_blocking(dst).unwrap();
    assert_eq!(
        conn.next_event_blocking(T).unwrap(),
        RdmaCmEvent::AddrResolved
    );
    assert_eq!(
        conn.next_event_blocking(T).unwrap(),
        RdmaCmEvent::RouteResolved
    );
    conn.connect_blocking(&qp, &ConnParam::default()).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    conn.disconnect(&qp).unwrap();
    assert_eq!(qp.state(), QpState::Err, "disconnect flushes");
    passive.join().unwrap();
    stop.store(true, Ordering::Release);
    firmware.join().unwrap();
    // Teardown's commands complete at once again.
    model.hold_command_events(false);
    model.release_command_events();
    assert!(
        m.mad_counts().deferred_transitions >= 2,
        "the mlx4 side's RTR and RTS waited for their command events: {:?}",
        m.mad_counts()
    );
}

//! Set-up shared by the facade's mlx4 tests: an emulated HCA with the driver and a verbs
//! context on it, a CQ, and a UD QP in RTS with an address handle nobody answers.
// Each test crate that includes this module uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use portverbs::mlx4::{CommandMode, Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::Fabric;
use portverbs::verbs::{ConnectOptions, ContextOptions, UdDest};

/// Command timeout of the driver in these tests.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(200);

/// An emulated HCA on `fabric`, the driver on it (configured by `tune` after the defaults of
/// these tests) and a context.
pub(crate) fn open(
    fabric: &Fabric,
    mode: CommandMode,
    tune: impl FnOnce(&mut Mlx4Config),
) -> (Mlx4Model, Mlx4Device, Context) {
    let (model, function) = Mlx4Model::attach(fabric, ModelConfig::default()).unwrap();
    let mut config = Mlx4Config::new(
        "mlx4_test",
        vec![vec![Gid::from_ip("10.9.0.1".parse().unwrap())]],
    );
    config.command_mode = mode;
    config.command_timeout = TIMEOUT;
    tune(&mut config);
    let dev = Mlx4Device::open(function, config).unwrap();
    let ctx =
        Context::open_blocking(AnyDevice::Mlx4(dev.clone()), ContextOptions::default()).unwrap();
    (model, dev, ctx)
}

/// A CQ of 16 entries.
pub(crate) fn cq(ctx: &Context) -> Cq {
    ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })
    .unwrap()
}

/// A UD QP on `cq` (both directions) taken to RTS, offering 220 bytes of inline data.
pub(crate) fn ud_qp(pd: &Pd, cq: &Cq, max_send_wr: u32) -> Qp {
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 220,
            },
            sq_sig_all: false,
            special: None,
        })
        .unwrap();
    qp.ready_ud_blocking(&ConnectOptions {
        qkey: 7,
        ..ConnectOptions::default()
    })
    .unwrap();
    qp
}

/// An address handle for 10.9.0.2, which nobody has: each datagram sent there is lost, but
/// its send completes.
pub(crate) fn lost_ah(pd: &Pd) -> AddressHandle {
    pd.create_ah_blocking(AddressVector {
        dgid: Gid::from_ip("10.9.0.2".parse().unwrap()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    })
    .unwrap()
}

/// QP 2 with Q_Key 7 behind `ah`.
pub(crate) fn dest(ah: &AddressHandle) -> UdDest<'_> {
    UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: 2,
        remote_qkey: 7,
    }
}

//! Shared set-up of the benchmarks: a connected RC pair on a soft fabric.

#![allow(dead_code, unreachable_pub)]

use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric};
use portverbs::verbs::{ConnectOptions, ContextOptions};

pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub buf: Buffer,
    pub mr: Mr,
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub fabric: Fabric,
    pub devs: Vec<AnyDevice>,
    /// The emulated HCAs behind mlx4 devices (kept alive with the pair).
    pub models: Vec<portverbs::mlx4_model::Mlx4Model>,
}

fn side(dev: &AnyDevice, buf_len: usize, depth: u32) -> Side {
    let ctx = Context::open_blocking(dev.clone(), ContextOptions::default()).expect("open");
    let pd = ctx.alloc_pd_blocking().expect("pd");
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: depth.max(64),
            ..CqInit::default()
        })
        .expect("cq");
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: false,
            special: None,
        })
        .expect("qp");
    let buf = ctx.alloc_buffer(buf_len).expect("buffer");
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_mr_blocking(&buf, 0..buf_len, access).expect("mr");
    Side {
        ctx,
        pd,
        cq,
        qp,
        buf,
        mr,
    }
}

/// The connection the benches use: 4 KiB MTU and 16 outstanding READs/atomics each way (the
/// library's defaults otherwise).
fn options() -> ConnectOptions {
    ConnectOptions {
        mtu: Some(Mtu::Mtu4096),
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..ConnectOptions::default()
    }
}

/// Two devices on a new fabric (stepped or threaded), with a connected RC pair.
pub fn pair(fabric: Fabric, buf_len: usize, depth: u32) -> Pair {
    let devs: Vec<AnyDevice> = ["10.0.0.1", "10.0.0.2"]
        .iter()
        .map(|ip| {
            AnyDevice::Soft(
                portverbs::soft::SoftDevice::attach(
                    &fabric,
                    DeviceConfig::with_ip(ip.parse().expect("ip")),
                )
                .expect("device"),
            )
        })
        .collect();
    connected(fabric, devs, Vec::new(), buf_len, depth)
}

/// Two emulated ConnectX-3s driven by the mlx4 driver on `fabric`, with a connected RC pair.
pub fn pair_mlx4(fabric: Fabric, buf_len: usize, depth: u32) -> Pair {
    let mut devs = Vec::new();
    let mut models = Vec::new();
    for (i, ip) in ["10.0.0.3", "10.0.0.4"].iter().enumerate() {
        let (model, dev) =
            portverbs::emulated_mlx4(&fabric, &format!("mlx4_{i}"), ip.parse().expect("ip"))
                .expect("mlx4 model");
        models.push(model);
        devs.push(AnyDevice::Mlx4(dev));
    }
    connected(fabric, devs, models, buf_len, depth)
}

pub fn connected(
    fabric: Fabric,
    devs: Vec<AnyDevice>,
    models: Vec<portverbs::mlx4_model::Mlx4Model>,
    buf_len: usize,
    depth: u32,
) -> Pair {
    let a = side(&devs[0], buf_len, depth);
    let b = side(&devs[1], buf_len, depth);
    let opts = options();
    let ea = a.qp.endpoint_blocking(&opts).expect("endpoint");
    let eb = b.qp.endpoint_blocking(&opts).expect("endpoint");
    a.qp.connect_rc_blocking(&eb, &opts).expect("connect");
    b.qp.connect_rc_blocking(&ea, &opts).expect("connect");
    Pair {
        a,
        b,
        fabric,
        devs,
        models,
    }
}

//! Shared set-up of the benchmarks: a connected RC pair on a soft fabric.

#![allow(dead_code, unreachable_pub)]

use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric};
use portverbs::verbs::ContextOptions;

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

fn connect(qp: &Qp, remote_qpn: u32, gid: Gid, mtu: Mtu) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    qp.modify_blocking(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .expect("init");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: remote_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ah_attr: AddressVector {
            dgid: gid,
            is_global: true,
            hop_limit: 1,
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    };
    qp.modify_blocking(
        &rtr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .expect("rtr");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    qp.modify_blocking(
        &rts,
        QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .expect("rts");
}

/// Two devices on a new fabric (stepped or threaded), with a connected RC pair.
pub fn pair(fabric: Fabric, buf_len: usize, depth: u32) -> Pair {
    let devs: Vec<AnyDevice> = ["10.0.0.1", "10.0.0.2"]
        .iter()
        .map(|ip| {
            AnyDevice::Soft(
                fabric
                    .add_device(DeviceConfig::with_ip(ip.parse().expect("ip")))
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
    let ga = a.ctx.query_gid_blocking(1, 0).expect("gid").gid;
    let gb = b.ctx.query_gid_blocking(1, 0).expect("gid").gid;
    connect(&a.qp, b.qp.qp_num(), gb, Mtu::Mtu4096);
    connect(&b.qp, a.qp.qp_num(), ga, Mtu::Mtu4096);
    Pair {
        a,
        b,
        fabric,
        devs,
        models,
    }
}

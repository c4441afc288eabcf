//! QP1 across backends: an mlx4 driver over the emulated ConnectX-3 and a soft device on one
//! fabric exchange MADs between their GSI QPs. The mlx4 side's MADs leave as MLX-transport WQEs
//! whose LRH/GRH/BTH/DETH the driver built and the emulated HCA checked; the soft side sees an
//! ordinary datagram from QP 1, and what it answers lands in the mlx4 QP1's receive queue.

use portverbs::mlx4::{Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs::verbs::{ConnectOptions, ContextOptions, SpecialQp, UdDest};

const MAD: usize = 256;
const GRH: usize = 40;

struct Gsi {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: Buffer,
    mr: Mr,
    gid: Gid,
}

fn gsi(dev: AnyDevice, gid: Gid) -> Gsi {
    let ctx = Context::open_blocking(dev, ContextOptions::default()).unwrap();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::gsi(&cq)).unwrap();
    assert_eq!(qp.qp_num(), 1);
    qp.ready_ud_blocking(&ConnectOptions::default()).unwrap();
    let buf = ctx.alloc_buffer(4096).unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    Gsi {
        pd,
        cq,
        qp,
        buf,
        mr,
        gid,
    }
}

fn poll(fabric: &Fabric, cq: &Cq) -> WorkCompletion {
    for _ in 0..100 {
        fabric.run_until_idle().unwrap();
        let mut wc = [WorkCompletion::default()];
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
    }
    panic!("no completion");
}

fn mad_across(fabric: &Fabric, from: &Gsi, to: &Gsi, seed: u8) {
    to.qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sges: &[to.mr.sge(0, GRH + MAD).unwrap()],
        }])
        .unwrap();
    let data: Vec<u8> = (0..MAD)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect();
    from.buf.write(1024, &data).unwrap();
    let ah = from
        .pd
        .create_ah_blocking(AddressVector {
            dgid: to.gid,
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    let dest = UdDest {
        av: ah.av(),
        remote_qpn: SpecialQp::GSI_QPN,
        remote_qkey: SpecialQp::GSI_QKEY,
    };
    let sge = [from.mr.sge(1024, MAD).unwrap()];
    from.qp
        .post_send(&[SendWr::new(3, SendOp::Send).sges(&sge).ud(dest).signaled()])
        .unwrap();
    let sent = poll(fabric, &from.cq);
    assert_eq!(
        (sent.wr_id, sent.status),
        (3, WcStatus::Success),
        "{sent:?}"
    );
    assert_eq!(
        sent.qp_num, 1,
        "the sender's completion names QP1: {sent:?}"
    );
    let got = poll(fabric, &to.cq);
    assert_eq!((got.wr_id, got.status), (7, WcStatus::Success), "{got:?}");
    assert_eq!((got.qp_num, got.src_qp), (1, 1), "{got:?}");
    assert_eq!(got.byte_len as usize, GRH + MAD);
    assert!(got.wc_flags.contains(WcFlags::GRH), "{got:?}");
    assert_eq!(to.buf.to_vec(GRH, MAD).unwrap(), data);
    // Both GIDs are IPv4-mapped (RoCEv2): the GRH area holds the IPv4 header in its last 20
    // bytes, whose source address (bytes 32..36) is the sender's.
    assert_eq!(to.buf.to_vec(32, 4).unwrap(), from.gid.0[12..]);
}

#[test]
fn mads_travel_between_an_mlx4_qp1_and_a_soft_qp1() {
    let fabric = Fabric::stepped(1);
    let soft_gid = Gid::from_ip("10.9.0.1".parse().unwrap());
    let mlx4_gid = Gid::from_ip("10.9.0.2".parse().unwrap());
    let soft =
        SoftDevice::attach(&fabric, DeviceConfig::with_ip("10.9.0.1".parse().unwrap())).unwrap();
    let (_model, function) = Mlx4Model::attach(&fabric, ModelConfig::default()).unwrap();
    let mlx4 =
        Mlx4Device::open(function, Mlx4Config::new("mlx4_gsi", vec![vec![mlx4_gid]])).unwrap();
    let s = gsi(AnyDevice::Soft(soft), soft_gid);
    let m = gsi(AnyDevice::Mlx4(mlx4), mlx4_gid);
    mad_across(&fabric, &m, &s, 1);
    mad_across(&fabric, &s, &m, 2);
    mad_across(&fabric, &m, &s, 3);
}

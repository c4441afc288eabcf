//! QP1 across backends: an mlx4 driver over the emulated ConnectX-3 and a soft device on one
//! fabric exchange MADs between their GSI QPs. The mlx4 side's MADs leave as MLX-transport WQEs
//! whose LRH/GRH/BTH/DETH the driver built and the emulated HCA checked; the soft side sees an
//! ordinary datagram from QP 1, and what it answers lands in the mlx4 QP1's receive queue.
//!
//! Not a per-backend case (it needs both backends on one fabric), so a plain test beside the
//! cases, using the GSI cases' helpers.

use portverbs::mlx4::{Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs::verbs::ContextOptions;

use super::gsi::{GRH, Gsi, MAD, gsi, mad, post_mad};

/// QP1 of `dev`, ready.
fn ready_gsi(dev: AnyDevice) -> Gsi {
    let ctx = Context::open_blocking(dev, ContextOptions::default()).unwrap();
    let g = gsi(&ctx).unwrap();
    assert_eq!(g.qp.qp_num(), 1);
    g.qp.ready_ud_blocking(&ConnectOptions::default()).unwrap();
    g
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

fn mad_across(fabric: &Fabric, from: (&Gsi, Gid), to: (&Gsi, Gid), seed: u8) {
    let data = mad(seed);
    let _ah = post_mad(from.0, to.0, to.1, &data);
    let sent = poll(fabric, &from.0.cq);
    assert_eq!(
        (sent.wr_id, sent.status),
        (3, WcStatus::Success),
        "{sent:?}"
    );
    assert_eq!(
        sent.qp_num, 1,
        "the sender's completion names QP1: {sent:?}"
    );
    let got = poll(fabric, &to.0.cq);
    assert_eq!((got.wr_id, got.status), (7, WcStatus::Success), "{got:?}");
    assert_eq!((got.qp_num, got.src_qp), (1, 1), "{got:?}");
    assert_eq!(got.byte_len as usize, GRH as usize + MAD);
    assert!(got.wc_flags.contains(WcFlags::GRH), "{got:?}");
    assert_eq!(to.0.buf.to_vec(GRH as usize, MAD).unwrap(), data);
    // Both GIDs are IPv4-mapped (RoCEv2): the GRH area holds the IPv4 header in its last 20
    // bytes, whose source address (bytes 32..36) is the sender's.
    assert_eq!(to.0.buf.to_vec(32, 4).unwrap(), from.1.0[12..]);
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
    let s = (&ready_gsi(AnyDevice::Soft(soft)), soft_gid);
    let m = (&ready_gsi(AnyDevice::Mlx4(mlx4)), mlx4_gid);
    mad_across(&fabric, m, s, 1);
    mad_across(&fabric, s, m, 2);
    mad_across(&fabric, m, s, 3);
}

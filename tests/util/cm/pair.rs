//! Two CM devices of one backend that belong to one test alone, for the per-backend matrix of
//! `tests/cm_matrix.rs`: two soft devices on a fabric of their own, two emulated ConnectX-3s
//! (the mlx4 driver over the model) on a fabric of their own, or two UDP-bound software
//! devices in auto progress whose packets cross the kernel between two loopback addresses.
//!
//! Tests run on parallel threads, and other test binaries that bind UDP ports on loopback
//! addresses may run at the same time: every UDP pair takes addresses of its own from
//! 127.51.0.0/16, a range no other test binary of this repository uses.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use portverbs::UdpDevice;
use portverbs::cm::service::CmDevice;
use portverbs::mlx4_model::Mlx4Model;
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};

use super::Dev;
use super::udp::udp_cm;

/// Which backend a CM case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Two software devices on a threaded in-process fabric.
    Soft,
    /// Two emulated ConnectX-3s under the mlx4 driver, on a threaded in-process fabric.
    Mlx4,
    /// Two UDP-bound software devices in auto progress, on two loopback addresses.
    Udp,
}

/// The second octet of every loopback address the UDP pairs take. Only `cm_matrix.rs` makes
/// pairs, so the range is that binary's alone.
const LOOPBACK_NET: u8 = 51;

/// Two loopback addresses no other pair of this process has.
fn loopback_pair() -> [IpAddr; 2] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let n = n % 25_000;
    let (x, y) = ((n % 250 + 1) as u8, (n / 250 * 2) as u8);
    [1u8, 2].map(|h| IpAddr::from([127, LOOPBACK_NET, x, y + h]))
}

/// What keeps a device alive under its CM, and reaches it for fault injection.
#[derive(Debug)]
enum Hw {
    Soft(SoftDevice),
    Mlx4 {
        model: Mlx4Model,
        _dev: portverbs::mlx4::Mlx4Device,
    },
    Udp(UdpDevice),
}

/// Two CM devices, `a` and `b`, of one backend.
#[derive(Debug)]
pub struct Pair {
    pub backend: Backend,
    pub a: Dev,
    pub b: Dev,
    hw: [Hw; 2],
    _fabric: Option<Fabric>,
}

impl Pair {
    pub fn new(backend: Backend) -> Self {
        match backend {
            Backend::Soft => {
                let fabric = Fabric::threaded();
                let ips: [IpAddr; 2] = [[10, 51, 0, 1].into(), [10, 51, 0, 2].into()];
                let devs =
                    ips.map(|ip| SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip)).unwrap());
                let [a, b] = [0, 1].map(|i| cm(AnyDevice::Soft(devs[i].clone()), ips[i]));
                Self {
                    backend,
                    a,
                    b,
                    hw: devs.map(Hw::Soft),
                    _fabric: Some(fabric),
                }
            }
            Backend::Mlx4 => {
                let fabric = Fabric::threaded();
                let ips: [IpAddr; 2] = [[10, 51, 0, 3].into(), [10, 51, 0, 4].into()];
                let [(ma, da), (mb, db)] = [0, 1].map(|i| {
                    portverbs::emulated_mlx4(&fabric, &format!("mlx4_cm{i}"), ips[i])
                        .expect("the emulated HCA comes up")
                });
                let (a, b) = (
                    cm(AnyDevice::Mlx4(da.clone()), ips[0]),
                    cm(AnyDevice::Mlx4(db.clone()), ips[1]),
                );
                Self {
                    backend,
                    a,
                    b,
                    hw: [
                        Hw::Mlx4 {
                            model: ma,
                            _dev: da,
                        },
                        Hw::Mlx4 {
                            model: mb,
                            _dev: db,
                        },
                    ],
                    _fabric: Some(fabric),
                }
            }
            Backend::Udp => {
                let ips = loopback_pair();
                let [(da, a), (db, b)] = [0, 1].map(|i| {
                    udp_cm(
                        &format!("cm_udp{i}"),
                        ips[i],
                        portverbs::hal::Progress::Auto,
                    )
                });
                Self {
                    backend,
                    a,
                    b,
                    hw: [Hw::Udp(da), Hw::Udp(db)],
                    _fabric: None,
                }
            }
        }
    }

    /// Fails device `i` (0: `a`, 1: `b`) as a fatal hardware error would: the soft device's
    /// fatal event, the emulated HCA's catastrophic error.
    pub fn inject_fatal(&self, i: usize) {
        match &self.hw[i] {
            Hw::Soft(d) => d.inject_fatal(),
            Hw::Udp(d) => d.device().inject_fatal(),
            Hw::Mlx4 { model, .. } => model.catastrophic_error(),
        }
    }
}

/// The CM of `dev`, opened on `ip`.
fn cm(dev: AnyDevice, ip: IpAddr) -> Dev {
    let ctx = portverbs::open(dev).unwrap();
    CmDevice::open_blocking(&ctx, ip).unwrap()
}

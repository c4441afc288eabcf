//! # Portverbs
//!
//! A userspace RDMA stack in Rust that applications link directly, on Linux and on Windows.
//! This facade is where an application starts: list devices, open one, and use the verbs of
//! [`portverbs_verbs`] through the type aliases below, whatever the backend.
//!
//! ```
//! use portverbs::prelude::*;
//!
//! let dev = portverbs::devices().into_iter().next().expect("the embedded fabric has devices");
//! let ctx = portverbs::open(dev).unwrap();
//! let pd = ctx.alloc_pd_blocking().unwrap();
//! let buf = ctx.alloc_buffer(4096).unwrap();
//! let mr = pd.reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE).unwrap();
//! assert!(mr.rkey().is_none(), "no remote access was asked for");
//! ```
//!
//! Backends:
//! * **soft** — the software RDMA device ([`portverbs_soft`]). [`devices`] lists the devices of
//!   an embedded in-process fabric (two devices, `soft0` at 10.0.0.1 and `soft1` at 10.0.0.2,
//!   driven by an engine thread); build your own [`portverbs_soft::Fabric`] for other topologies
//!   or for deterministic stepped tests.
//! * **mlx4** — the mlx4 driver ([`portverbs_mlx4`]). On the embedded fabric it drives two
//!   emulated ConnectX-3s ([`portverbs_mlx4_model`]), `mlx4_0` at 10.0.0.3 and `mlx4_1` at
//!   10.0.0.4; on Linux, functions bound to vfio-pci are listed too.
//!
//! Completion delivery through the OS (eventfd/epoll on Linux) is in `portverbs-linux`, which
//! this crate re-exports as [`linux`] on Linux.

mod any;
mod any_queue;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

pub use any::AnyDevice;
pub use any_queue::{AnyCq, AnyRq, AnySq, AnySrq};
pub use portverbs_hal as hal;
pub use portverbs_mlx4 as mlx4;
pub use portverbs_mlx4_model as mlx4_model;
pub use portverbs_soft as soft;
pub use portverbs_verbs as verbs;

#[cfg(target_os = "linux")]
pub use portverbs_linux as linux;

use portverbs_soft::{DeviceConfig, Fabric};
use portverbs_verbs::{ContextOptions, OpenError};

/// An opened device.
pub type Context = portverbs_verbs::Context<AnyDevice>;
/// A protection domain.
pub type Pd = portverbs_verbs::Pd<AnyDevice>;
/// A memory region.
pub type Mr = portverbs_verbs::Mr<AnyDevice>;
/// A memory window.
pub type Mw = portverbs_verbs::Mw<AnyDevice>;
/// A completion queue.
pub type Cq = portverbs_verbs::Cq<AnyDevice>;
/// A queue pair.
pub type Qp = portverbs_verbs::Qp<AnyDevice>;
/// A shared receive queue.
pub type Srq = portverbs_verbs::Srq<AnyDevice>;
/// An address handle.
pub type AddressHandle = portverbs_verbs::AddressHandle<AnyDevice>;
/// A completion channel.
pub type CompletionChannel = portverbs_verbs::CompletionChannel<AnyDevice>;

/// Everything an application usually needs.
pub mod prelude {
    pub use crate::{
        AddressHandle, AnyDevice, CompletionChannel, Context, Cq, Mr, Mw, Pd, Qp, Srq,
    };
    pub use portverbs_hal::{BlockingDevice, Device};
    pub use portverbs_verbs::{
        AccessFlags, AddressVector, Buffer, CqInit, Gid, Mtu, MwType, NotifyKind, QpAttr,
        QpAttrMask, QpCaps, QpInit, QpState, QpType, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr,
        Sge, SrqInit, WcOpcode, WcStatus, WorkCompletion,
    };
}

/// The addresses of the embedded fabric's devices.
pub const EMBEDDED_ADDRS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
];

/// The addresses of the embedded fabric's emulated mlx4 HCAs.
pub const EMBEDDED_MLX4_ADDRS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 4)),
];

struct Embedded {
    fabric: Fabric,
    devices: Vec<AnyDevice>,
    models: Vec<portverbs_mlx4_model::Mlx4Model>,
}

/// Puts an emulated ConnectX-3 on `fabric` and brings it up with the mlx4 driver, with `ip`
/// as its port's GID.
///
/// # Errors
/// The model could not be attached or the driver could not open it (the message says which).
pub fn emulated_mlx4(
    fabric: &Fabric,
    name: &str,
    ip: IpAddr,
) -> Result<(portverbs_mlx4_model::Mlx4Model, portverbs_mlx4::Mlx4Device), String> {
    let (model, function) = portverbs_mlx4_model::Mlx4Model::attach(
        fabric,
        portverbs_mlx4_model::ModelConfig {
            name: Some(format!("{name}_model")),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let config =
        portverbs_mlx4::Mlx4Config::new(name, vec![vec![portverbs_hal::types::Gid::from_ip(ip)]]);
    let dev = portverbs_mlx4::Mlx4Device::open(function, config).map_err(|e| e.to_string())?;
    Ok((model, dev))
}

fn embedded() -> &'static Embedded {
    static EMBEDDED: OnceLock<Embedded> = OnceLock::new();
    EMBEDDED.get_or_init(|| {
        let fabric = Fabric::threaded();
        let mut devices: Vec<AnyDevice> = EMBEDDED_ADDRS
            .iter()
            .filter_map(|ip| fabric.add_device(DeviceConfig::with_ip(*ip)).ok())
            .map(AnyDevice::Soft)
            .collect();
        let mut models = Vec::new();
        for (i, ip) in EMBEDDED_MLX4_ADDRS.iter().enumerate() {
            match emulated_mlx4(&fabric, &format!("mlx4_{i}"), *ip) {
                Ok((model, dev)) => {
                    models.push(model);
                    devices.push(AnyDevice::Mlx4(dev));
                }
                Err(e) => eprintln!("portverbs: the emulated mlx4_{i} did not come up: {e}"),
            }
        }
        Embedded {
            fabric,
            devices,
            models,
        }
    })
}

/// The emulated mlx4 HCAs of the embedded fabric (for fault injection and counters).
pub fn embedded_mlx4_models() -> &'static [portverbs_mlx4_model::Mlx4Model] {
    &embedded().models
}

/// The embedded in-process fabric (free-running; created on first use).
pub fn embedded_fabric() -> &'static Fabric {
    &embedded().fabric
}

/// Every device available to this process (`ibv_get_device_list`): the devices of the
/// embedded fabric, then (Linux) every mlx4-class function bound to vfio-pci.
pub fn devices() -> Vec<AnyDevice> {
    let mut v: Vec<AnyDevice> = embedded().devices.clone();
    v.extend(hardware().iter().cloned());
    v
}

/// VFIO-bound mlx4 functions, opened once per process. `PORTVERBS_NO_VFIO=1` skips the scan;
/// `PORTVERBS_MLX4_IP=<address>` gives port 1 its RoCE GID (a userspace driver has no netdev
/// to take it from).
fn hardware() -> &'static [AnyDevice] {
    static HW: OnceLock<Vec<AnyDevice>> = OnceLock::new();
    HW.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            if std::env::var_os("PORTVERBS_NO_VFIO").is_some() {
                return Vec::new();
            }
            let gids: Vec<Vec<portverbs_hal::types::Gid>> = std::env::var("PORTVERBS_MLX4_IP")
                .ok()
                .and_then(|s| s.parse::<IpAddr>().ok())
                .map(|ip| vec![vec![portverbs_hal::types::Gid::from_ip(ip)]])
                .unwrap_or_default();
            portverbs_mlx4::vfio::scan()
                .into_iter()
                .enumerate()
                .filter_map(|(i, addr)| {
                    let config =
                        portverbs_mlx4::Mlx4Config::new(format!("mlx4_vfio{i}"), gids.clone());
                    match portverbs_mlx4::Mlx4Device::open_vfio(&addr, config) {
                        Ok(d) => Some(AnyDevice::Mlx4(d)),
                        Err(e) => {
                            eprintln!("portverbs: skipping {addr}: {e}");
                            None
                        }
                    }
                })
                .collect()
        }
        #[cfg(not(target_os = "linux"))]
        {
            Vec::new()
        }
    })
}

/// The device with this name.
pub fn device(name: &str) -> Option<AnyDevice> {
    devices()
        .into_iter()
        .find(|d| portverbs_hal::Device::info(d).name == name)
}

/// Opens a device with polling sinks (completions are found by polling, events by
/// [`portverbs_verbs::Context::process_events`]). On Linux, `portverbs::linux` opens it with
/// eventfd-backed event queues instead.
///
/// # Errors
/// A device command failed.
pub fn open(dev: impl Into<AnyDevice>) -> Result<Context, OpenError> {
    Context::open_blocking(dev.into(), ContextOptions::default())
}

//! The devices this process can open: the embedded in-process fabric (two software devices
//! and two emulated ConnectX-3s under the mlx4 driver) and, on Linux, mlx4 functions bound to
//! vfio-pci.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};

use crate::AnyDevice;
#[cfg(target_os = "linux")]
use crate::env::hardware_env;

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
/// as its port's GID. For topologies of your own, next to software devices:
///
/// ```
/// use portverbs::prelude::*;
/// use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};
///
/// let fabric = Fabric::threaded();
/// let soft = SoftDevice::attach(&fabric, DeviceConfig::with_ip("10.1.0.1".parse().unwrap())).unwrap();
/// let (_model, hca) = portverbs::emulated_mlx4(&fabric, "mlx4_t", "10.1.0.2".parse().unwrap())
///     .expect("the emulated HCA comes up");
/// let (a, b) = (portverbs::open(soft).unwrap(), portverbs::open(hca).unwrap());
/// assert_eq!((a.device().info().driver, b.device().info().driver), ("soft", "mlx4"));
/// ```
///
/// The model must outlive the device: it is the hardware.
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
            .filter_map(|ip| SoftDevice::attach(&fabric, DeviceConfig::with_ip(*ip)).ok())
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
///
/// ```
/// use portverbs::prelude::*;
///
/// let names: Vec<String> = portverbs::devices().iter().map(|d| d.info().name.clone()).collect();
/// assert_eq!(names[..4], ["soft0", "soft1", "mlx4_0", "mlx4_1"]);
/// ```
pub fn devices() -> Vec<AnyDevice> {
    let mut v: Vec<AnyDevice> = embedded().devices.clone();
    v.extend(hardware().iter().cloned());
    v
}

/// The device with this name (`ibv_devices` prints the names), as [`devices`] lists it.
pub fn device(name: &str) -> Option<AnyDevice> {
    devices()
        .into_iter()
        .find(|d| portverbs_hal::Device::info(d).name == name)
}

/// VFIO-bound mlx4 functions, opened once per process, as [`hardware_env`] asks: no scan with
/// `PORTVERBS_NO_VFIO=1`, port 1's RoCE GID from `PORTVERBS_MLX4_IP`. A malformed variable
/// means no scan ([`hardware_env`] says why).
fn hardware() -> &'static [AnyDevice] {
    static HW: OnceLock<Vec<AnyDevice>> = OnceLock::new();
    HW.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            let env = match hardware_env() {
                Ok(env) if env.vfio_scan => env,
                _ => return Vec::new(),
            };
            let gids: Vec<Vec<portverbs_hal::types::Gid>> = env
                .mlx4_ip
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

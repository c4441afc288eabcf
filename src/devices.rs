//! The devices this process can open: the embedded in-process fabric (two software devices
//! and two emulated ConnectX-3s under the mlx4 driver), the UDP-bound software devices
//! `PORTVERBS_UDP` asks for (Linux and Windows) and, on Linux, mlx4 functions bound to
//! vfio-pci.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use portverbs_soft::{DeviceConfig, Fabric, FabricConfig, SoftDevice};

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

pub(crate) struct Embedded {
    fabric: Fabric,
    pub(crate) devices: Vec<AnyDevice>,
    models: Vec<portverbs_mlx4_model::Mlx4Model>,
    pub(crate) skipped: Vec<SkippedDevice>,
}

/// Why [`emulated_mlx4`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmulatedMlx4Error {
    /// The model could not be attached to the fabric.
    #[error("attaching the emulated HCA: {0}")]
    Attach(#[source] portverbs_mlx4_model::ModelError),
    /// The mlx4 driver could not bring the model up.
    #[error("opening the emulated HCA: {0}")]
    Open(#[source] portverbs_mlx4::OpenError),
}

/// Why a device is missing from [`devices`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkipReason {
    /// An emulated HCA of the embedded fabric did not come up.
    #[error(transparent)]
    Emulated(#[from] EmulatedMlx4Error),
    /// A function bound to vfio-pci could not be opened.
    #[error(transparent)]
    Vfio(#[from] portverbs_mlx4::OpenError),
    /// A device `PORTVERBS_UDP` asked for could not be made.
    #[cfg(any(target_os = "linux", windows))]
    #[error(transparent)]
    Udp(#[from] crate::UdpDeviceError),
}

/// A device [`devices`] would have listed but could not open. The library prints nothing;
/// [`device`] and [`device_by_addr`](crate::device_by_addr) answer
/// [`DeviceError::Unavailable`] with it, and the CLI's `portverbs devices` shows these.
#[derive(Debug)]
#[non_exhaustive]
pub struct SkippedDevice {
    /// The name it would have had (`mlx4_1`, `udp0`), or its PCI address.
    pub name: String,
    /// The address it would have had, where known (the embedded and UDP-bound devices).
    pub addr: Option<IpAddr>,
    /// Why it is missing.
    pub reason: SkipReason,
}

impl SkippedDevice {
    /// What to do about it, where the reason is a common mistake: a `PORTVERBS_UDP` address
    /// whose UDP port 4791 another process holds (one address serves one process), or one
    /// that is not this host's. Empty otherwise.
    pub fn hint(&self) -> &'static str {
        #[cfg(any(target_os = "linux", windows))]
        if let SkipReason::Udp(crate::UdpDeviceError::Port(portverbs_udp::UdpError::Bind {
            source,
            ..
        })) = &self.reason
        {
            return match source.kind() {
                std::io::ErrorKind::AddrInUse => {
                    " (another process holds UDP port 4791 on this address: one address serves \
                     one process, so give each process its own address in PORTVERBS_UDP)"
                }
                std::io::ErrorKind::AddrNotAvailable => {
                    " (the address is not one of this host's: PORTVERBS_UDP takes addresses of \
                     local interfaces, e.g. 127.0.0.1)"
                }
                _ => "",
            };
        }
        ""
    }
}

/// The devices that could not be opened, in the order [`devices`] tries them (the embedded
/// ones, the UDP-bound ones of `PORTVERBS_UDP`, then the VFIO-bound functions). Like
/// [`devices`], this starts every kind of device.
pub fn skipped_devices() -> Vec<&'static SkippedDevice> {
    let mut v: Vec<&'static SkippedDevice> = embedded().skipped.iter().collect();
    #[cfg(any(target_os = "linux", windows))]
    v.extend(crate::udp::env_slots().iter().filter_map(|s| s.get().err()));
    v.extend(hardware().1.iter());
    v
}

/// Why [`device`] or [`device_by_addr`](crate::device_by_addr) found no device to open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// No device has this name.
    #[error(
        "IB device '{name}' wasn't found (the embedded devices are soft0, soft1, mlx4_0 and \
         mlx4_1; PORTVERBS_UDP=<ip>[,<ip>…] adds udp0, udp1 …)"
    )]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// No device has this address.
    #[error(
        "no device has address {addr} (the embedded devices have 10.0.0.1 to 10.0.0.4; to \
         bind a software device to an address of this host, list it in PORTVERBS_UDP)"
    )]
    NoAddress {
        /// The address asked for.
        addr: IpAddr,
    },
    /// The device exists in the configuration but could not be opened: a `PORTVERBS_UDP`
    /// address that would not bind (not this host's, or UDP port 4791 on it held by another
    /// process), an emulated HCA or a VFIO function that did not come up.
    #[error("{} could not be opened: {}{}", .0.name, .0.reason, .0.hint())]
    Unavailable(&'static SkippedDevice),
}

/// The names of the embedded fabric's devices, in the order [`devices`] lists them.
const EMBEDDED_NAMES: [&str; 4] = ["soft0", "soft1", "mlx4_0", "mlx4_1"];

/// Whether the embedded fabric has been started (by [`devices`], or by asking for one of its
/// devices). For tests of what starts what.
#[doc(hidden)]
pub fn embedded_fabric_started() -> bool {
    EMBEDDED.get().is_some()
}

/// Whether the VFIO scan has run (by [`devices`], or by asking for a device that is not
/// embedded nor UDP-bound). For tests of what starts what.
#[doc(hidden)]
pub fn vfio_scanned() -> bool {
    HW.get().is_some()
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
/// [`EmulatedMlx4Error`]: the model could not be attached, or the driver could not open it.
pub fn emulated_mlx4(
    fabric: &Fabric,
    name: &str,
    ip: IpAddr,
) -> Result<(portverbs_mlx4_model::Mlx4Model, portverbs_mlx4::Mlx4Device), EmulatedMlx4Error> {
    let (model, function) = portverbs_mlx4_model::Mlx4Model::attach(
        fabric,
        portverbs_mlx4_model::ModelConfig {
            name: Some(format!("{name}_model")),
            ..Default::default()
        },
    )
    .map_err(EmulatedMlx4Error::Attach)?;
    let config =
        portverbs_mlx4::Mlx4Config::new(name, vec![vec![portverbs_hal::types::Gid::from_ip(ip)]]);
    let dev =
        portverbs_mlx4::Mlx4Device::open(function, config).map_err(EmulatedMlx4Error::Open)?;
    Ok((model, dev))
}

static EMBEDDED: OnceLock<Embedded> = OnceLock::new();

/// The embedded fabric and its devices, started on first use.
pub(crate) fn embedded() -> &'static Embedded {
    EMBEDDED.get_or_init(|| {
        // `PORTVERBS_PCAP`: capture from the first packet on.
        let fabric = Fabric::new(FabricConfig {
            capture: crate::env::capture_env(),
            ..FabricConfig::default()
        });
        if let Some(e) = fabric.capture_error() {
            tracing::warn!(error = %e, "PORTVERBS_PCAP: no packet capture");
        }
        let mut devices: Vec<AnyDevice> = EMBEDDED_ADDRS
            .iter()
            .filter_map(|ip| SoftDevice::attach(&fabric, DeviceConfig::with_ip(*ip)).ok())
            .map(AnyDevice::Soft)
            .collect();
        let mut models = Vec::new();
        let mut skipped = Vec::new();
        for (i, ip) in EMBEDDED_MLX4_ADDRS.iter().enumerate() {
            let name = format!("mlx4_{i}");
            match emulated_mlx4(&fabric, &name, *ip) {
                Ok((model, dev)) => {
                    models.push(model);
                    devices.push(AnyDevice::Mlx4(dev));
                }
                Err(e) => {
                    tracing::warn!(device = %name, error = %e, "the emulated HCA did not come up");
                    skipped.push(SkippedDevice {
                        name,
                        addr: Some(*ip),
                        reason: e.into(),
                    });
                }
            }
        }
        Embedded {
            fabric,
            devices,
            models,
            skipped,
        }
    })
}

/// The emulated mlx4 HCAs of the embedded fabric (for fault injection and counters).
pub fn embedded_mlx4_models() -> &'static [portverbs_mlx4_model::Mlx4Model] {
    &embedded().models
}

/// The embedded in-process fabric (free-running; created on first use). With
/// `PORTVERBS_PCAP=<path>` in the environment it captures every packet to that pcap file
/// ([`crate::capture_env`]); its [`capture_error`](Fabric::capture_error) tells why not when
/// the file could not be written, and [`stop_capture`](Fabric::stop_capture) ends it.
pub fn embedded_fabric() -> &'static Fabric {
    &embedded().fabric
}

/// Every device available to this process (`ibv_get_device_list`): the devices of the
/// embedded fabric, the UDP-bound ones of `PORTVERBS_UDP` (`udp0`, `udp1` …), then (Linux)
/// every mlx4-class function bound to vfio-pci. Listing starts them all; [`device`] and
/// [`device_by_addr`](crate::device_by_addr) start only the one asked for. Those that could
/// not be made are missing here, and [`skipped_devices`] says why.
///
/// ```
/// use portverbs::prelude::*;
///
/// let names: Vec<String> = portverbs::devices().iter().map(|d| d.info().name.clone()).collect();
/// assert_eq!(names[..4], ["soft0", "soft1", "mlx4_0", "mlx4_1"]);
/// ```
pub fn devices() -> Vec<AnyDevice> {
    let mut v: Vec<AnyDevice> = embedded().devices.clone();
    #[cfg(any(target_os = "linux", windows))]
    v.extend(
        crate::udp::env_slots()
            .iter()
            .filter_map(|s| s.get().ok())
            .map(crate::UdpDevice::any),
    );
    v.extend(hardware().0.iter().cloned());
    v
}

/// Whether `dev` is a VFIO-bound function (not an emulated HCA).
#[cfg(target_os = "linux")]
pub(crate) fn is_vfio(dev: &portverbs_mlx4::Mlx4Device) -> bool {
    let name = &portverbs_hal::Device::info(dev).name;
    // Before the scan no VFIO function was opened here; asking must not start it.
    HW.get().is_some_and(|(opened, _)| {
        opened
            .iter()
            .any(|d| &portverbs_hal::Device::info(d).name == name)
    })
}

/// The device with this name (`ibv_devices` prints the names), as [`devices`] lists it.
/// Starts only what that device needs: the embedded fabric for its four devices, the one
/// UDP port for a `udpN` of `PORTVERBS_UDP`, the VFIO scan for any other name.
///
/// ```
/// let dev = portverbs::device("soft1").expect("the embedded fabric has soft1");
/// assert_eq!(portverbs::hal::Device::info(&dev).name, "soft1");
/// let missing = portverbs::device("mlx5_0").unwrap_err();
/// assert!(matches!(missing, portverbs::DeviceError::NotFound { .. }));
/// ```
///
/// # Errors
/// [`DeviceError::NotFound`], or [`DeviceError::Unavailable`] with the reason the device
/// could not be made (a `PORTVERBS_UDP` address that would not bind …).
pub fn device(name: &str) -> Result<AnyDevice, DeviceError> {
    let not_found = || DeviceError::NotFound {
        name: name.to_string(),
    };
    if EMBEDDED_NAMES.contains(&name) {
        let e = embedded();
        return find(&e.devices, &e.skipped, name).unwrap_or_else(|| Err(not_found()));
    }
    #[cfg(any(target_os = "linux", windows))]
    if let Some(slot) = crate::udp::env_slots().iter().find(|s| s.name == name) {
        return slot
            .get()
            .map(crate::UdpDevice::any)
            .map_err(DeviceError::Unavailable);
    }
    // `udpN` is a name of `PORTVERBS_UDP`'s only: no VFIO function is named so.
    if name
        .strip_prefix("udp")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(not_found());
    }
    let (opened, skipped) = hardware();
    find(opened, skipped, name).unwrap_or_else(|| Err(not_found()))
}

/// The device named `name` among `devices`, else the reason it is among `skipped`.
fn find(
    devices: &[AnyDevice],
    skipped: &'static [SkippedDevice],
    name: &str,
) -> Option<Result<AnyDevice, DeviceError>> {
    let named = |d: &&AnyDevice| portverbs_hal::Device::info(*d).name == name;
    match devices.iter().find(named) {
        Some(d) => Some(Ok(d.clone())),
        None => skipped
            .iter()
            .find(|s| s.name == name)
            .map(|s| Err(DeviceError::Unavailable(s))),
    }
}

static HW: OnceLock<(Vec<AnyDevice>, Vec<SkippedDevice>)> = OnceLock::new();

/// VFIO-bound mlx4 functions, opened once per process, as [`hardware_env`] asks: no scan with
/// `PORTVERBS_NO_VFIO=1`, port 1's RoCE GID from `PORTVERBS_MLX4_IP`. A malformed variable
/// means no scan ([`hardware_env`] says why). Functions that would not open are kept apart,
/// with the reason ([`skipped_devices`]).
pub(crate) fn hardware() -> &'static (Vec<AnyDevice>, Vec<SkippedDevice>) {
    HW.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            scan_vfio()
        }
        #[cfg(not(target_os = "linux"))]
        {
            (Vec::new(), Vec::new())
        }
    })
}

#[cfg(target_os = "linux")]
fn scan_vfio() -> (Vec<AnyDevice>, Vec<SkippedDevice>) {
    let (mut opened, mut skipped) = (Vec::new(), Vec::new());
    let env = match hardware_env() {
        Ok(env) if env.vfio_scan => env,
        _ => return (opened, skipped),
    };
    let gids: Vec<Vec<portverbs_hal::types::Gid>> = env
        .mlx4_ip
        .map(|ip| vec![vec![portverbs_hal::types::Gid::from_ip(ip)]])
        .unwrap_or_default();
    for (i, addr) in portverbs_mlx4::vfio::scan().into_iter().enumerate() {
        let config = portverbs_mlx4::Mlx4Config::new(format!("mlx4_vfio{i}"), gids.clone());
        match portverbs_mlx4::Mlx4Device::open_vfio(&addr, config) {
            Ok(d) => opened.push(AnyDevice::Mlx4(d)),
            Err(e) => {
                tracing::warn!(%addr, error = %e, "skipping a VFIO-bound function");
                skipped.push(SkippedDevice {
                    name: addr,
                    addr: None,
                    reason: e.into(),
                });
            }
        }
    }
    (opened, skipped)
}

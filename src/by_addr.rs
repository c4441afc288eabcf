//! Devices by IP address, as `rdma_bind_addr` finds them: the device whose port 1 holds the
//! address's RoCEv2 GID ([`device_by_addr`] says where the addresses come from), opened, with
//! the CM on it if asked.

use std::net::IpAddr;

use portverbs_hal::types::Gid;
use portverbs_verbs::OpenError;

use crate::devices::{DeviceError, embedded, hardware};
use crate::{AnyDevice, Context, EMBEDDED_ADDRS, EMBEDDED_MLX4_ADDRS};

/// Why [`open_by_addr`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenByAddrError {
    /// No device has the address, or it could not be made.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The device was found but would not open.
    #[error("opening the device: {0}")]
    Open(#[from] OpenError),
    /// The CM could not be opened on it ([`cm_device_by_addr`]).
    #[error("opening the CM: {0}")]
    Cm(#[from] portverbs_cm_service::ServiceError),
}

/// The device that holds `ip` (port 1's GID table has its RoCEv2 GID), as [`crate::devices`]
/// lists it, as `rdma_bind_addr` finds a device. Searched in [`crate::devices`]' order, and
/// only what can hold the address is started:
/// * the embedded fabric's devices have fixed addresses ([`crate::EMBEDDED_ADDRS`],
///   [`crate::EMBEDDED_MLX4_ADDRS`]): the fabric starts only for one of those;
/// * each device of `PORTVERBS_UDP` has the address it binds: only that one is made;
/// * VFIO-bound functions have the GID `PORTVERBS_MLX4_IP` gives them: scanned, and their GID
///   tables read, only for that address.
///
/// Nothing is bound on demand, even for an address of this host: one address's UDP port 4791
/// serves one process, so which process binds it stays the application's choice — list the
/// address in `PORTVERBS_UDP`, or make the device with [`crate::udp_device`].
///
/// ```
/// let dev = portverbs::device_by_addr("10.0.0.2".parse().unwrap()).unwrap();
/// assert_eq!(portverbs::hal::Device::info(&dev).name, "soft1");
/// ```
///
/// # Errors
/// [`DeviceError::NoAddress`]; [`DeviceError::Unavailable`] when the device with that
/// address could not be made (a `PORTVERBS_UDP` address that would not bind …).
pub fn device_by_addr(ip: IpAddr) -> Result<AnyDevice, DeviceError> {
    if EMBEDDED_ADDRS.contains(&ip) || EMBEDDED_MLX4_ADDRS.contains(&ip) {
        let e = embedded();
        if let Some(s) = e.skipped.iter().find(|s| s.addr == Some(ip)) {
            return Err(DeviceError::Unavailable(s));
        }
        if let Some(d) = e.devices.iter().find(|d| holds(d, ip)) {
            return Ok(d.clone());
        }
    }
    #[cfg(any(target_os = "linux", windows))]
    if let Some(slot) = crate::udp::env_slots().iter().find(|s| s.ip == ip) {
        return slot
            .get()
            .map(crate::UdpDevice::any)
            .map_err(DeviceError::Unavailable);
    }
    if crate::hardware_env().is_ok_and(|env| env.mlx4_ip == Some(ip))
        && let Some(d) = hardware().0.iter().find(|d| holds(d, ip))
    {
        return Ok(d.clone());
    }
    Err(DeviceError::NoAddress { addr: ip })
}

/// Whether port 1 of `dev` holds `ip`'s GID (read from the opened device).
fn holds(dev: &AnyDevice, ip: IpAddr) -> bool {
    let gid = Gid::from_ip(ip);
    crate::open(dev.clone())
        .ok()
        .and_then(|ctx| ctx.gid_table_blocking(1).ok())
        .is_some_and(|t| t.iter().any(|(_, e)| e.gid == gid))
}

/// Opens the device that holds `ip` ([`device_by_addr`], then [`crate::open`]): what an
/// rdma_cm application gets from binding an address. Blocking; [`open_by_addr_async`] for
/// `async` code.
///
/// ```
/// let ctx = portverbs::open_by_addr("10.0.0.1".parse().unwrap()).unwrap();
/// assert_eq!(ctx.name(), "soft0");
/// let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
/// assert_eq!(ctx.port_ips_blocking(1).unwrap(), [ip]);
/// ```
///
/// # Errors
/// [`OpenByAddrError::Device`] (no device has the address, or it could not be made), or
/// [`OpenByAddrError::Open`].
pub fn open_by_addr(ip: IpAddr) -> Result<Context, OpenByAddrError> {
    Ok(crate::open(device_by_addr(ip)?)?)
}

/// `async` form of [`open_by_addr`]. Finding the device may start it (a thread, a socket),
/// which does not block.
///
/// # Errors
/// As [`open_by_addr`].
pub async fn open_by_addr_async(ip: IpAddr) -> Result<Context, OpenByAddrError> {
    let dev = device_by_addr(ip)?;
    Ok(Context::open(dev, crate::context_options()?).await?)
}

/// Opens the device that holds `ip` and the CM on it for that address: ready for
/// `Listener::bind(&dev, (ip, port).into())` or a `Connector` (see [`crate::cm`]).
///
/// ```
/// use portverbs::cm::Listener;
///
/// let ip = "10.0.0.2".parse().unwrap();
/// let cm = portverbs::cm_device_by_addr(ip).unwrap();
/// let _listener = Listener::bind(&cm, (ip, 7471).into()).unwrap();
/// assert_eq!(cm.context().name(), "soft1");
/// ```
///
/// # Errors
/// As [`open_by_addr`], or [`OpenByAddrError::Cm`].
pub fn cm_device_by_addr(
    ip: IpAddr,
) -> Result<portverbs_cm_service::CmDevice<AnyDevice>, OpenByAddrError> {
    let ctx = open_by_addr(ip)?;
    Ok(portverbs_cm_service::CmDevice::open_blocking(&ctx, ip)?)
}

/// `async` form of [`cm_device_by_addr`].
///
/// # Errors
/// As [`cm_device_by_addr`].
pub async fn cm_device_by_addr_async(
    ip: IpAddr,
) -> Result<portverbs_cm_service::CmDevice<AnyDevice>, OpenByAddrError> {
    let ctx = open_by_addr_async(ip).await?;
    Ok(portverbs_cm_service::CmDevice::open(&ctx, ip).await?)
}

//! Software devices on a real network: a soft device and a UDP port on a fabric of their
//! own, so that the device speaks RoCEv2 through the kernel's UDP sockets to other processes,
//! other hosts and Linux rxe. [`udp_device`] is the analogue of `rdma link add rxe0 type rxe
//! netdev eth0`; `PORTVERBS_UDP=<ip>[,<ip>…]` makes [`crate::devices`] list one per address
//! (`udp0`, `udp1` …).

use std::net::IpAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_hal::Progress;
use portverbs_soft::{
    DeviceConfig, Fabric, FabricConfig, FabricError, Mode, PortConfig, SoftDevice,
};
use portverbs_udp::{UdpConfig, UdpError, UdpPort};

use crate::{AnyDevice, SkippedDevice};

/// A software device bound to an IP address: the device and the UDP port that carries its
/// traffic. Keep it alive while the device is in use: dropping it takes the port down.
#[derive(Debug)]
pub struct UdpDevice {
    device: SoftDevice,
    port: UdpPort,
}

impl UdpDevice {
    /// The device (open it with [`crate::open`] or [`crate::Context::open_blocking`]).
    pub fn device(&self) -> &SoftDevice {
        &self.device
    }

    /// The port: its address, counters and packet capture.
    pub fn port(&self) -> &UdpPort {
        &self.port
    }

    /// The device as [`crate::devices`] lists it.
    pub fn any(&self) -> AnyDevice {
        AnyDevice::Soft(self.device.clone())
    }
}

/// Why [`udp_device`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpDeviceError {
    /// The UDP port could not be made (the address is not this host's, 4791 is taken …).
    #[error(transparent)]
    Port(#[from] UdpError),
    /// The device could not join its fabric.
    #[error("attaching the device: {0}")]
    Device(#[from] FabricError),
}

/// Makes a software device named `name` that owns `config.addr`: its GID is that address's
/// RoCEv2 GID, its port MTU the largest the interface carries (4096 on loopback), and a
/// [`UdpPort`] on `config.addr`:4791 carries its packets. Runs on a fabric of its own, in
/// the progress mode `config.progress` asks for: auto (the default) — one progress thread
/// that sleeps on the socket, receives, runs the transport, timers and the attached agents
/// (the CM), and sends; manual — no thread at all: posting sends on the caller's thread, and
/// every poll, wait, await or [`crate::Context::dispatch`] on the device receives and runs
/// the rest on the caller's thread.
///
/// ```no_run
/// use portverbs::prelude::*;
/// use portverbs_udp::UdpConfig;
///
/// let dev = portverbs::udp_device("udp0", UdpConfig::new("127.0.0.1".parse().unwrap()))?;
/// let ctx = Context::open_blocking(dev.any(), Default::default())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`UdpDeviceError`].
pub fn udp_device(name: &str, config: UdpConfig) -> Result<UdpDevice, UdpDeviceError> {
    let fabric = Fabric::new(FabricConfig {
        mode: Mode::of(config.progress),
        ..FabricConfig::default()
    });
    udp_device_on(&fabric, name, config)
}

/// [`udp_device`] on a fabric of the caller's (a stepped one, for tests that run several
/// such fabrics in lock-step). The device progresses as the fabric is driven
/// ([`portverbs_soft::Mode`]); `config.progress` is not read.
///
/// # Errors
/// [`UdpDeviceError`].
pub fn udp_device_on(
    fabric: &Fabric,
    name: &str,
    config: UdpConfig,
) -> Result<UdpDevice, UdpDeviceError> {
    let (addr, congestion) = (config.addr, config.congestion);
    let port = UdpPort::attach(fabric, config)?;
    let device = SoftDevice::attach(
        fabric,
        DeviceConfig {
            name: Some(name.to_string()),
            ports: vec![PortConfig {
                addrs: vec![addr],
                mtu: port.ib_mtu(),
            }],
            seed: None,
            congestion: Some(congestion),
        },
    )?;
    Ok(UdpDevice { device, port })
}

/// `PORTVERBS_UDP`: the addresses to bind software devices to (comma-separated IPv4 or IPv6
/// addresses), `None` when unset or empty.
///
/// # Errors
/// An entry that is not an IP address.
pub fn udp_env() -> Result<Vec<IpAddr>, crate::EnvError> {
    parse_udp_env(std::env::var("PORTVERBS_UDP").ok().as_deref())
}

fn parse_udp_env(value: Option<&str>) -> Result<Vec<IpAddr>, crate::EnvError> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| crate::EnvError::Udp {
                value: s.to_string(),
            })
        })
        .collect()
}

/// One address of `PORTVERBS_UDP`: the device it names, made the first time it is asked for.
pub(crate) struct EnvSlot {
    /// `udp0`, `udp1` …
    pub(crate) name: String,
    /// The address the device binds.
    pub(crate) ip: IpAddr,
    index: usize,
    made: OnceLock<Result<UdpDevice, Box<SkippedDevice>>>,
}

impl EnvSlot {
    /// The device, made (bound) now if it was not yet; the reason when it would not bind.
    pub(crate) fn get(&'static self) -> Result<&'static UdpDevice, &'static SkippedDevice> {
        self.made
            .get_or_init(|| {
                MADE.store(true, Ordering::Release);
                make_env_device(self.index, &self.name, self.ip)
            })
            .as_ref()
            .map_err(|s| &**s)
    }
}

/// The addresses of `PORTVERBS_UDP`, read once per process (none when it is malformed:
/// [`udp_env`] says why).
pub(crate) fn env_slots() -> &'static [EnvSlot] {
    static SLOTS: OnceLock<Vec<EnvSlot>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        udp_env()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(index, ip)| EnvSlot {
                name: format!("udp{index}"),
                ip,
                index,
                made: OnceLock::new(),
            })
            .collect()
    })
}

/// Whether a device of `PORTVERBS_UDP` was made (or tried) already.
static MADE: AtomicBool = AtomicBool::new(false);

/// The progress mode [`set_udp_progress`] chose.
static PROGRESS: OnceLock<Progress> = OnceLock::new();

/// Chooses the progress mode of the devices `PORTVERBS_UDP` makes, over
/// `PORTVERBS_PROGRESS` (the CLI's `--progress`). Call it before the first
/// [`crate::devices`] or [`crate::device`] of a UDP device: false when one of those devices
/// was made already, or a mode was chosen before (the first choice stays).
pub fn set_udp_progress(progress: Progress) -> bool {
    !MADE.load(Ordering::Acquire) && PROGRESS.set(progress).is_ok()
}

/// The progress mode the devices of `PORTVERBS_UDP` get: [`set_udp_progress`]'s choice,
/// else `PORTVERBS_PROGRESS` ([`crate::progress_env`]; auto when malformed), else auto.
pub fn udp_progress() -> Progress {
    PROGRESS
        .get()
        .copied()
        .or_else(|| crate::env::progress_env().ok().flatten())
        .unwrap_or_default()
}

/// Makes the device of the `i`th address of `PORTVERBS_UDP`, in the progress mode of
/// [`udp_progress`], with congestion control unless `PORTVERBS_CC=off` ([`crate::cc_env`]);
/// an address that will not bind (not this host's, port 4791 taken by another process) gives
/// the reason instead.
fn make_env_device(i: usize, name: &str, ip: IpAddr) -> Result<UdpDevice, Box<SkippedDevice>> {
    let mut config = UdpConfig::new(ip);
    config.progress = udp_progress();
    // PORTVERBS_CC: on unless it says off (a bad value is the CLI's to report).
    config.congestion.enabled = crate::env::cc_env().ok().flatten().unwrap_or(true);
    match udp_device(name, config) {
        Ok(d) => {
            if let Some(path) = crate::env::capture_env() {
                // One capture file per device: `<path>` for udp0, `<path>.udpN` else.
                let path = if i == 0 {
                    path
                } else {
                    path.with_extension(format!("udp{i}.pcap"))
                };
                if let Err(e) = d.port().start_capture(&path) {
                    tracing::warn!(device = %name, error = %e, "PORTVERBS_PCAP: no capture");
                }
            }
            Ok(d)
        }
        Err(e) => {
            tracing::warn!(device = %name, %ip, error = %e, "PORTVERBS_UDP: no device");
            Err(Box::new(SkippedDevice {
                name: name.to_string(),
                addr: Some(ip),
                reason: e.into(),
            }))
        }
    }
}

/// The UDP-bound device named `name` that `PORTVERBS_UDP` made (for its port's counters and
/// capture); made now if it was not yet. `None` when `PORTVERBS_UDP` has no such device or
/// it would not bind ([`crate::device`] says why).
pub fn env_udp_device(name: &str) -> Option<&'static UdpDevice> {
    env_slots()
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.get().ok())
}

/// Whether the device lives on a fabric of this process only (the embedded fabric, or one the
/// application made without an uplink): both ends of a connection must then run here. False
/// for UDP-bound devices and VFIO hardware, which other processes and hosts can reach.
pub fn in_process(dev: &AnyDevice) -> bool {
    match dev {
        AnyDevice::Soft(d) => !d.fabric().has_uplink(),
        #[cfg(target_os = "linux")]
        AnyDevice::Mlx4(d) => !crate::devices::is_vfio(d),
        // No VFIO on Windows: every mlx4 device is an emulated one of this process.
        #[cfg(windows)]
        AnyDevice::Mlx4(_) => true,
        // A backend added later says for itself; until then, assume other processes reach it.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_lists_addresses() {
        assert_eq!(parse_udp_env(None).unwrap(), Vec::<IpAddr>::new());
        assert_eq!(parse_udp_env(Some(" ")).unwrap(), Vec::<IpAddr>::new());
        assert_eq!(
            parse_udp_env(Some("127.0.0.1, ::1")).unwrap(),
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        let e = parse_udp_env(Some("127.0.0.1,eth0")).unwrap_err();
        assert!(e.to_string().contains("eth0"), "{e}");
    }
}

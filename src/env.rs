//! The `PORTVERBS_*` environment variables [`crate::devices`] follows — the VFIO scan's
//! ([`hardware_env`]), the UDP-bound devices' ([`udp_env`], [`progress_env`], [`cc_env`]) and
//! the embedded fabric's packet capture ([`capture_env`]) — and what became of the devices
//! they asked for ([`env_udp_device`], [`skipped_devices`]).

use std::ffi::OsStr;
use std::net::IpAddr;
use std::path::PathBuf;

use thiserror::Error;

/// What the environment asks of the VFIO scan ([`hardware_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardwareEnv {
    /// Scan for mlx4 functions bound to vfio-pci: true unless `PORTVERBS_NO_VFIO` is set to
    /// a true value (`1`, `true`, `yes`, `on`, any case).
    pub vfio_scan: bool,
    /// `PORTVERBS_MLX4_IP`: the address whose GID port 1 of those functions gets (a userspace
    /// driver has no netdev to take it from).
    pub mlx4_ip: Option<IpAddr>,
}

/// A malformed `PORTVERBS_*` environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EnvError {
    /// `PORTVERBS_NO_VFIO` is neither a true value nor a false one (`0`, `false`, `no`, `off`,
    /// empty).
    #[error(
        "PORTVERBS_NO_VFIO={value:?} is not a yes/no value: set it to 1, true or yes to skip \
         the VFIO scan, or to 0, false or no (or unset it) to scan"
    )]
    NoVfio {
        /// The value found.
        value: String,
    },
    /// An entry of `PORTVERBS_UDP` is not an IPv4 or IPv6 address.
    #[error(
        "PORTVERBS_UDP: {value:?} is not an IP address: set it to the addresses to bind \
         software devices to, separated by commas (e.g. 127.0.0.1,127.0.0.2), or unset it"
    )]
    Udp {
        /// The entry found.
        value: String,
    },
    /// `PORTVERBS_PROGRESS` is neither `manual` nor `auto`.
    #[error(
        "PORTVERBS_PROGRESS={value:?} is not a progress mode: set it to manual (the \
         application's calls drive the UDP-bound devices, no thread) or auto (one progress \
         thread per device, the default), or unset it"
    )]
    Progress {
        /// The value found.
        value: String,
    },
    /// `PORTVERBS_CC` is neither `on` nor `off`.
    #[error(
        "PORTVERBS_CC={value:?} is not a congestion-control setting: set it to on (a \
         congestion window per path, ECN, the default) or off (every RC QP keeps its whole \
         PSN window in flight), or unset it"
    )]
    Cc {
        /// The value found.
        value: String,
    },
    /// `PORTVERBS_MLX4_IP` is not an IPv4 or IPv6 address.
    #[error(
        "PORTVERBS_MLX4_IP={value:?} is not an IP address: set it to the IPv4 or IPv6 address \
         of the VFIO mlx4 port (e.g. 192.0.2.1), or unset it"
    )]
    Mlx4Ip {
        /// The value found.
        value: String,
    },
}

/// Reads `PORTVERBS_NO_VFIO` and `PORTVERBS_MLX4_IP`, the variables the VFIO scan of
/// [`crate::devices`] follows.
///
/// # Errors
/// A variable is set to something it cannot mean. [`crate::devices`] then lists no VFIO
/// function (it cannot fail); an application calls this to tell its user why:
///
/// ```
/// if let Err(e) = portverbs::hardware_env() {
///     eprintln!("no VFIO devices: {e}");
/// }
/// ```
pub fn hardware_env() -> Result<HardwareEnv, EnvError> {
    parse_hardware_env(
        std::env::var_os("PORTVERBS_NO_VFIO").as_deref(),
        std::env::var_os("PORTVERBS_MLX4_IP").as_deref(),
    )
}

/// [`hardware_env`] over the two values (`None` = unset). An empty value counts as unset.
fn parse_hardware_env(
    no_vfio: Option<&OsStr>,
    mlx4_ip: Option<&OsStr>,
) -> Result<HardwareEnv, EnvError> {
    let text = |v: &OsStr| v.to_string_lossy().into_owned();
    let skip = match no_vfio.map(text) {
        None => false,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "" | "0" | "false" | "no" | "off" => false,
            _ => return Err(EnvError::NoVfio { value: v }),
        },
    };
    let mlx4_ip = match mlx4_ip.map(text) {
        None => None,
        Some(v) if v.trim().is_empty() => None,
        Some(v) => Some(
            v.trim()
                .parse::<IpAddr>()
                .map_err(|_| EnvError::Mlx4Ip { value: v })?,
        ),
    };
    Ok(HardwareEnv {
        vfio_scan: !skip,
        mlx4_ip,
    })
}

/// `PORTVERBS_PROGRESS=manual|auto`: the progress mode of the devices `PORTVERBS_UDP` makes
/// (see the crate docs, "Progress"); `None` when unset or empty (auto then, unless
/// [`crate::set_udp_progress`] chose).
///
/// # Errors
/// A value that is neither `manual` nor `auto` (any case): [`crate::devices`] then makes
/// the devices in auto progress, and an application calls this to tell its user why.
pub fn progress_env() -> Result<Option<portverbs_hal::Progress>, EnvError> {
    parse_progress_env(std::env::var_os("PORTVERBS_PROGRESS").as_deref())
}

fn parse_progress_env(value: Option<&OsStr>) -> Result<Option<portverbs_hal::Progress>, EnvError> {
    let Some(v) = value.map(|v| v.to_string_lossy().into_owned()) else {
        return Ok(None);
    };
    if v.trim().is_empty() {
        return Ok(None);
    }
    portverbs_hal::Progress::parse(&v)
        .map(Some)
        .ok_or(EnvError::Progress { value: v })
}

/// `PORTVERBS_CC=off|on`: whether the devices `PORTVERBS_UDP` makes run congestion control
/// ([`crate::soft::CcConfig::enabled`]); `None` when unset or empty (on then).
///
/// # Errors
/// A value that is neither `on` nor `off` (any case): [`crate::devices`] then makes the
/// devices with congestion control on, and an application calls this to tell its user why.
pub fn cc_env() -> Result<Option<bool>, EnvError> {
    parse_cc_env(std::env::var_os("PORTVERBS_CC").as_deref())
}

fn parse_cc_env(value: Option<&OsStr>) -> Result<Option<bool>, EnvError> {
    let Some(v) = value.map(|v| v.to_string_lossy().into_owned()) else {
        return Ok(None);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        _ => Err(EnvError::Cc { value: v }),
    }
}

/// `PORTVERBS_PCAP=<path>`: the pcap file the embedded fabric ([`crate::embedded_fabric`])
/// writes every packet to, from its start (see [`crate::soft::Fabric::start_capture`] for what
/// is captured). `None` when unset or empty.
///
/// Any other value is a path, so this cannot fail; a file that cannot be created leaves the
/// fabric running without a capture, and says why:
///
/// ```
/// if let Some(e) = portverbs::embedded_fabric().capture_error() {
///     eprintln!("no capture: {e}");
/// }
/// ```
pub fn capture_env() -> Option<PathBuf> {
    parse_capture_env(std::env::var_os("PORTVERBS_PCAP").as_deref())
}

/// [`capture_env`] over the value (`None` = unset).
fn parse_capture_env(pcap: Option<&OsStr>) -> Option<PathBuf> {
    pcap.filter(|v| !v.is_empty()).map(PathBuf::from)
}

pub use crate::devices::{SkipReason, SkippedDevice, skipped_devices};
#[cfg(any(target_os = "linux", windows))]
pub use crate::udp::{env_udp_device, set_udp_progress, udp_env, udp_progress};
/// The progress mode of a UDP-bound device (`PORTVERBS_PROGRESS`, [`set_udp_progress`]).
pub use portverbs_hal::Progress;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn env(no_vfio: Option<&str>, ip: Option<&str>) -> Result<HardwareEnv, EnvError> {
        parse_hardware_env(no_vfio.map(OsStr::new), ip.map(OsStr::new))
    }

    #[test]
    fn no_vfio_takes_only_a_true_value_as_yes() {
        for v in ["1", "true", "YES", "on", " yes "] {
            assert!(
                !env(Some(v), None).unwrap().vfio_scan,
                "{v:?} skips the scan"
            );
        }
        for v in [
            None,
            Some("0"),
            Some("false"),
            Some("No"),
            Some("off"),
            Some(""),
        ] {
            assert!(env(v, None).unwrap().vfio_scan, "{v:?} keeps the scan");
        }
        let err = env(Some("maybe"), None).unwrap_err();
        assert_eq!(
            err,
            EnvError::NoVfio {
                value: "maybe".into()
            }
        );
        assert!(err.to_string().starts_with("PORTVERBS_NO_VFIO=\"maybe\""));
    }

    #[test]
    fn progress_is_manual_or_auto() {
        use portverbs_hal::Progress;
        let p = |v: Option<&str>| parse_progress_env(v.map(OsStr::new));
        assert_eq!(p(None).unwrap(), None);
        assert_eq!(p(Some(" ")).unwrap(), None);
        assert_eq!(p(Some("manual")).unwrap(), Some(Progress::Manual));
        assert_eq!(p(Some("AUTO")).unwrap(), Some(Progress::Auto));
        let err = p(Some("threaded")).unwrap_err();
        assert_eq!(
            err,
            EnvError::Progress {
                value: "threaded".into()
            }
        );
        assert!(
            err.to_string()
                .starts_with("PORTVERBS_PROGRESS=\"threaded\"")
        );
    }

    #[test]
    fn cc_is_on_or_off() {
        let p = |v: Option<&str>| parse_cc_env(v.map(OsStr::new));
        assert_eq!(p(None).unwrap(), None);
        assert_eq!(p(Some(" ")).unwrap(), None);
        assert_eq!(p(Some("on")).unwrap(), Some(true));
        assert_eq!(p(Some(" OFF ")).unwrap(), Some(false));
        let err = p(Some("dcqcn")).unwrap_err();
        assert_eq!(
            err,
            EnvError::Cc {
                value: "dcqcn".into()
            }
        );
        assert!(err.to_string().starts_with("PORTVERBS_CC=\"dcqcn\""));
    }

    #[test]
    fn pcap_is_a_path_unless_empty() {
        assert_eq!(parse_capture_env(None), None);
        assert_eq!(parse_capture_env(Some(OsStr::new(""))), None);
        assert_eq!(
            parse_capture_env(Some(OsStr::new("/tmp/a b.pcap"))),
            Some(PathBuf::from("/tmp/a b.pcap"))
        );
    }

    #[test]
    fn mlx4_ip_must_be_an_address() {
        assert_eq!(env(None, None).unwrap().mlx4_ip, None);
        assert_eq!(env(None, Some("")).unwrap().mlx4_ip, None);
        assert_eq!(
            env(None, Some("192.0.2.1")).unwrap().mlx4_ip,
            Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)))
        );
        assert!(env(None, Some("fe80::1")).unwrap().mlx4_ip.is_some());
        for bad in ["192.0.2", "not-an-ip", "10.0.0.1/24", "300.1.1.1"] {
            let err = env(None, Some(bad)).unwrap_err();
            assert_eq!(err, EnvError::Mlx4Ip { value: bad.into() });
            let text = err.to_string();
            assert!(
                text.starts_with("PORTVERBS_MLX4_IP=") && text.contains("is not an IP address"),
                "{text}"
            );
        }
        // A bad address is reported even when the scan is off.
        assert!(env(Some("1"), Some("x")).is_err());
    }
}

//! Finding PCI functions in sysfs: which are bound to vfio-pci, their ids and IOMMU groups.
//!
//! Reads `/sys/bus/pci/devices/<address>/{vendor,device,class}` and the `driver` and
//! `iommu_group` links. Nothing here needs privileges or opens a device, so `portverbs devices`
//! can list candidates (and say how to bind the ones that are not bound yet) for any user.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where the kernel lists PCI functions.
pub const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// The driver name VFIO needs.
pub const VFIO_PCI_DRIVER: &str = "vfio-pci";

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// `DDDD:BB:DD.F`.
    pub address: String,
    /// PCI vendor id (0x15b3 is Mellanox).
    pub vendor: u16,
    /// PCI device id.
    pub device: u16,
    /// Class code (base class, subclass, programming interface), e.g. 0x020700 for InfiniBand.
    pub class: u32,
    /// IOMMU group, `None` when the IOMMU is off.
    pub iommu_group: Option<u32>,
    /// Bound driver, `None` when unbound.
    pub driver: Option<String>,
}

impl PciFunction {
    /// True when vfio-pci drives the function, so [`crate::VfioDevice::open`] can open it.
    pub fn is_vfio_bound(&self) -> bool {
        self.driver.as_deref() == Some(VFIO_PCI_DRIVER)
    }
}

/// Functions bound to vfio-pci, optionally only those of one vendor, sorted by address.
/// Unreadable entries are skipped (a function can disappear while the directory is read).
pub fn scan(vendor: Option<u16>) -> Vec<PciFunction> {
    scan_at(Path::new(SYSFS_PCI_DEVICES), vendor)
        .into_iter()
        .filter(PciFunction::is_vfio_bound)
        .collect()
}

/// Every function, bound to vfio-pci or not, optionally only those of one vendor, sorted by
/// address: for telling the user which functions still need binding.
pub fn scan_all(vendor: Option<u16>) -> Vec<PciFunction> {
    scan_at(Path::new(SYSFS_PCI_DEVICES), vendor)
}

/// [`scan_all`] over another directory laid out like `/sys/bus/pci/devices` (tests, chroots).
pub fn scan_at(devices_dir: &Path, vendor: Option<u16>) -> Vec<PciFunction> {
    let Ok(entries) = fs::read_dir(devices_dir) else {
        return Vec::new();
    };
    let mut out: Vec<PciFunction> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let addr = parse_address(&name)?;
            match read_function(devices_dir, &addr) {
                Ok(f) => Some(f),
                Err(err) => {
                    tracing::debug!(%addr, %err, "skipping unreadable PCI function");
                    None
                }
            }
        })
        .filter(|f| vendor.is_none_or(|v| v == f.vendor))
        .collect();
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

/// Reads one function's ids, IOMMU group and driver from `devices_dir/<addr>`.
///
/// # Errors
/// The directory or its `vendor`/`device` files are missing or malformed.
pub fn read_function(devices_dir: &Path, addr: &str) -> io::Result<PciFunction> {
    let dir = devices_dir.join(addr);
    let vendor = read_hex(&dir.join("vendor"))?;
    let device = read_hex(&dir.join("device"))?;
    // Older or fake trees may lack `class`; it is informative only.
    let class = read_hex(&dir.join("class")).unwrap_or(0);
    Ok(PciFunction {
        address: addr.to_string(),
        vendor: u16::try_from(vendor).map_err(|_| invalid(&dir.join("vendor")))?,
        device: u16::try_from(device).map_err(|_| invalid(&dir.join("device")))?,
        class: u32::try_from(class).unwrap_or(0),
        iommu_group: link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok()),
        driver: link_name(&dir.join("driver")),
    })
}

/// Normalises a PCI address: `DDDD:BB:DD.F` or `BB:DD.F` (domain 0), hex digits in either case,
/// to the lowercase form sysfs uses. `None` if it is not one.
pub fn parse_address(addr: &str) -> Option<String> {
    let (head, func) = addr.rsplit_once('.')?;
    let mut parts: Vec<&str> = head.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0000");
    }
    let [domain, bus, dev] = parts[..] else {
        return None;
    };
    let hex = |s: &str, min: usize, max: usize| {
        (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if !hex(domain, 4, 8) || !hex(bus, 2, 2) || !hex(dev, 2, 2) || !hex(func, 1, 1) {
        return None;
    }
    let dev_n = u8::from_str_radix(dev, 16).ok()?;
    let func_n = u8::from_str_radix(func, 16).ok()?;
    if dev_n > 0x1f || func_n > 7 {
        return None;
    }
    Some(format!("{domain}:{bus}:{dev}.{func}").to_ascii_lowercase())
}

/// What [`check_function`] found out about a function before VFIO is involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// No such directory.
    Missing,
    /// Exists; driver and group as read.
    Found {
        driver: Option<String>,
        group: Option<u32>,
        path: PathBuf,
    },
}

/// Looks `addr` (already normalised) up under `devices_dir`.
pub(crate) fn check_function(devices_dir: &Path, addr: &str) -> Lookup {
    let path = devices_dir.join(addr);
    if !path.is_dir() {
        return Lookup::Missing;
    }
    Lookup::Found {
        driver: link_name(&path.join("driver")),
        group: link_name(&path.join("iommu_group")).and_then(|g| g.parse().ok()),
        path,
    }
}

fn read_hex(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(digits, 16).map_err(|_| invalid(path))
}

fn invalid(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} does not hold a hex number", path.display()),
    )
}

/// The last component of a symlink's target (`driver` → `.../drivers/vfio-pci`).
fn link_name(path: &Path) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    Some(target.file_name()?.to_str()?.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::fs::symlink;

    use vmm_sys_util::tempdir::TempDir;

    use super::*;

    /// A fake `/sys/bus/pci/devices` with the layout the kernel uses.
    pub(crate) struct FakeSysfs {
        pub(crate) dir: TempDir,
    }

    impl FakeSysfs {
        pub(crate) fn new() -> Self {
            let dir = TempDir::new_with_prefix("/tmp/portverbs-vfio-sysfs-").unwrap();
            fs::create_dir_all(dir.as_path().join("devices")).unwrap();
            Self { dir }
        }

        pub(crate) fn devices(&self) -> PathBuf {
            self.dir.as_path().join("devices")
        }

        pub(crate) fn add(
            &self,
            addr: &str,
            ids: (u16, u16, u32),
            group: Option<u32>,
            driver: Option<&str>,
        ) {
            let d = self.devices().join(addr);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("vendor"), format!("{:#06x}\n", ids.0)).unwrap();
            fs::write(d.join("device"), format!("{:#06x}\n", ids.1)).unwrap();
            fs::write(d.join("class"), format!("{:#08x}\n", ids.2)).unwrap();
            if let Some(g) = group {
                symlink(
                    format!("../../../kernel/iommu_groups/{g}"),
                    d.join("iommu_group"),
                )
                .unwrap();
            }
            if let Some(drv) = driver {
                symlink(format!("../../../bus/pci/drivers/{drv}"), d.join("driver")).unwrap();
            }
        }
    }

    fn tree() -> FakeSysfs {
        let s = FakeSysfs::new();
        s.add(
            "0000:00:1f.2",
            (0x8086, 0x2922, 0x010601),
            Some(3),
            Some("ahci"),
        );
        s.add(
            "0000:3b:00.0",
            (0x15b3, 0x1003, 0x028000),
            Some(12),
            Some("vfio-pci"),
        );
        s.add(
            "0000:3b:00.1",
            (0x15b3, 0x1004, 0x028000),
            Some(13),
            Some("mlx4_core"),
        );
        s.add("0000:5e:00.0", (0x15b3, 0x1007, 0x020700), Some(14), None);
        s.add(
            "0000:00:03.0",
            (0x1234, 0x11e8, 0x00ff00),
            Some(2),
            Some("vfio-pci"),
        );
        // Junk a scan must survive: a file that is not an address, a function without ids.
        fs::write(s.devices().join("not-an-address"), "x").unwrap();
        fs::create_dir_all(s.devices().join("0000:7f:00.0")).unwrap();
        s
    }

    #[test]
    fn lists_functions_with_ids_groups_and_drivers() {
        let s = tree();
        let all = scan_at(&s.devices(), None);
        let addrs: Vec<&str> = all.iter().map(|f| f.address.as_str()).collect();
        assert_eq!(
            addrs,
            [
                "0000:00:03.0",
                "0000:00:1f.2",
                "0000:3b:00.0",
                "0000:3b:00.1",
                "0000:5e:00.0"
            ]
        );
        let f = &all[2];
        assert_eq!((f.vendor, f.device, f.class), (0x15b3, 0x1003, 0x028000));
        assert_eq!(f.iommu_group, Some(12));
        assert_eq!(f.driver.as_deref(), Some("vfio-pci"));
        assert!(f.is_vfio_bound());
        assert_eq!(all[4].driver, None);
        assert!(!all[4].is_vfio_bound());
    }

    #[test]
    fn filters_by_vendor_and_by_binding() {
        let s = tree();
        let mellanox = scan_at(&s.devices(), Some(0x15b3));
        assert_eq!(mellanox.len(), 3);
        let bound: Vec<_> = mellanox.into_iter().filter(|f| f.is_vfio_bound()).collect();
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0].address, "0000:3b:00.0");
        assert!(scan_at(&s.devices(), Some(0xdead)).is_empty());
        assert!(scan_at(&s.devices().join("nope"), None).is_empty());
    }

    #[test]
    fn check_function_reports_driver_and_group() {
        let s = tree();
        assert_eq!(
            check_function(&s.devices(), "0000:99:00.0"),
            Lookup::Missing
        );
        let Lookup::Found { driver, group, .. } = check_function(&s.devices(), "0000:3b:00.1")
        else {
            panic!("present")
        };
        assert_eq!(driver.as_deref(), Some("mlx4_core"));
        assert_eq!(group, Some(13));
    }

    #[test]
    fn addresses_are_normalised_or_refused() {
        assert_eq!(
            parse_address("0000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(parse_address("01:00.1").as_deref(), Some("0000:01:00.1"));
        assert_eq!(
            parse_address("10000:01:00.0").as_deref(),
            Some("10000:01:00.0")
        );
        for bad in [
            "",
            "0000:01:00",
            "0000:01:20.0",
            "0000:01:00.8",
            "000:01:00.0",
            "0000:1:00.0",
            "0000:01:00.0.0",
            "zzzz:01:00.0",
            "0000:01:00.0\n",
            "../../etc:00:00.0",
        ] {
            assert_eq!(parse_address(bad), None, "{bad:?}");
        }
    }
}

//! Opening a PCI function through VFIO: container, group, device; and closing it again in the
//! right order.
//!
//! ## Open
//! 1. Normalise the address and look the function up in sysfs: it must exist, be bound to
//!    vfio-pci and have an IOMMU group. These checks come first because their errors can say
//!    exactly what to do, where the kernel would only answer `ENOENT` later.
//! 2. Open the container `/dev/vfio/vfio` (vfio-ioctls checks the API version and the type-1 v2
//!    IOMMU).
//! 3. Make the function's anchor (`anchor`): a private directory that tells vfio-ioctls the
//!    device name and IOMMU group the way sysfs does, but survives surprise removal. Then open
//!    `/dev/vfio/<group>`, check that the group is viable, attach it to the container, select
//!    the type-1 v2 IOMMU, get the device fd, and read region and IRQ information (vfio-ioctls
//!    `VfioDevice::new`, given the anchor instead of the sysfs entry).
//! 4. Read the device flags and the container's IOVA windows and page sizes (our own ioctls,
//!    `sys`), and set up the IOVA allocator.
//!
//! ## Close
//! Dropping the [`VfioDevice`] handle quiesces the function: every MSI/MSI-X route is removed
//! and Bus Master is cleared, so the device stops writing to memory. BARs ([`crate::VfioBar`])
//! and DMA regions ([`crate::VfioDma`]) keep the opened device alive: each unmaps itself when
//! dropped (a DMA region first from the IOMMU, then from the process). When the last of them is
//! gone, vfio-ioctls closes the device fd, detaches the group from the container and closes the
//! group, and then the container closes — the reverse of the open, which is the order the
//! kernel needs (a group still holding an open device cannot be detached). Last the anchor is
//! removed.
//!
//! Closing never panics on surprise removal (`echo 1 > /sys/bus/pci/devices/<addr>/remove`, or a
//! hot-unplug): the kernel waits for the device fd to be closed and then deletes the sysfs
//! entry, but vfio-ioctls reads the anchor, not sysfs, after closing the fd (see `anchor`).
//!
//! One process opens a group once: a second `open` of a function in an IOMMU group that is
//! already open fails with `EBUSY` from the kernel. Functions that share a group are not
//! supported (each mlx4 function sits in its own group behind an ACS-capable port).

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vfio_bindings::bindings::vfio::{VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX};
use vfio_ioctls::{VfioContainer, VfioOps};

use crate::anchor::{Anchor, Anchored};
use crate::error::{IrqKind, VfioError};
use crate::iova::{DEFAULT_FLOOR, IovaAllocator, IovaRange};
use crate::irq::IrqRoutes;
use crate::scan::{self, Lookup, SYSFS_PCI_DEVICES, VFIO_PCI_DRIVER};
use crate::sys::{self, DeviceInfo, IommuInfo};

/// One opened PCI function. Cheap to share (`Arc`); every method takes `&self`.
pub struct VfioDevice {
    pub(crate) inner: Arc<DeviceInner>,
    pub(crate) irqs: Mutex<IrqRoutes>,
}

/// What BARs and DMA regions keep alive: the device fd, its group and container, the IOVA
/// space.
pub(crate) struct DeviceInner {
    pub(crate) addr: String,
    pub(crate) group: u32,
    /// Declared before `container`: the device (and with it the group) must go first. Opened
    /// through its anchor, which goes with it.
    pub(crate) dev: Anchored<vfio_ioctls::VfioDevice>,
    pub(crate) container: Arc<VfioContainer>,
    pub(crate) info: DeviceInfo,
    pub(crate) iommu: IommuInfo,
    pub(crate) iova: Mutex<IovaAllocator>,
    /// File offset and size of the config-space region.
    pub(crate) config: (u64, u64),
}

impl fmt::Debug for DeviceInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceInner")
            .field("addr", &self.addr)
            .field("group", &self.group)
            .field("anchor", &self.dev.anchor().path())
            .field("info", &self.info)
            .field("iommu", &self.iommu)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for VfioDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VfioDevice")
            .field("addr", &self.inner.addr)
            .field("group", &self.inner.group)
            .finish_non_exhaustive()
    }
}

impl DeviceInner {
    /// The IOVA allocator, also after a panic elsewhere (its state is updated atomically with
    /// respect to panics: every method either completes or changes nothing).
    pub(crate) fn iova(&self) -> MutexGuard<'_, IovaAllocator> {
        self.iova.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl VfioDevice {
    /// Opens the function at `addr` (`"0000:01:00.0"`; `"01:00.0"` means domain 0). See the
    /// module documentation for the steps.
    ///
    /// # Errors
    /// Every step has its own [`VfioError`] variant, naming the address and what to do.
    pub fn open(addr: &str) -> Result<Arc<Self>, VfioError> {
        Self::open_at(Path::new(SYSFS_PCI_DEVICES), addr)
    }

    /// [`VfioDevice::open`] with another sysfs `devices` directory for the lookup (step 1).
    pub(crate) fn open_at(devices_dir: &Path, addr: &str) -> Result<Arc<Self>, VfioError> {
        let addr = scan::parse_address(addr).ok_or_else(|| VfioError::BadAddress {
            addr: addr.to_string(),
        })?;
        let (group, path) = match scan::check_function(devices_dir, &addr) {
            Lookup::Missing => return Err(VfioError::NoSuchDevice { addr }),
            Lookup::Found { driver, .. } if driver.as_deref() != Some(VFIO_PCI_DRIVER) => {
                return Err(VfioError::NotBoundToVfio { addr, driver });
            }
            Lookup::Found { group: None, .. } => return Err(VfioError::NoIommuGroup { addr }),
            Lookup::Found {
                group: Some(group),
                path,
                ..
            } => (group, path),
        };

        let container = VfioContainer::new(None).map_err(|e| VfioError::Container {
            addr: addr.clone(),
            source: e.into(),
        })?;
        let container = Arc::new(container);
        let anchor = Anchor::create(&path, group).map_err(|source| VfioError::Anchor {
            addr: addr.clone(),
            dir: std::env::temp_dir().display().to_string(),
            source,
        })?;
        let ops: Arc<dyn VfioOps> = container.clone();
        let dev = vfio_ioctls::VfioDevice::new(anchor.path(), ops, false)
            .map_err(|e| attach_error(&addr, group, e))?;
        let dev = Anchored::new(dev, anchor);

        let info = sys::device_info(sys::device_fd(&dev)).map_err(|source| VfioError::Query {
            addr: addr.clone(),
            what: "VFIO_DEVICE_GET_INFO",
            source,
        })?;
        let iommu = sys::iommu_info(&*container).map_err(|source| VfioError::Query {
            addr: addr.clone(),
            what: "VFIO_IOMMU_GET_INFO",
            source,
        })?;
        let windows = if iommu.ranges.is_empty() {
            // Kernels before 5.4 do not report windows; below the x86 MSI window is safe.
            tracing::warn!(%addr, "the kernel reports no IOVA windows; using 0..0xfee00000");
            vec![IovaRange {
                start: 0,
                last: 0xfedf_ffff,
            }]
        } else {
            iommu.ranges.clone()
        };
        let iova = IovaAllocator::new(&windows, iommu.min_page(), DEFAULT_FLOOR);
        let config = (
            dev.get_region_offset(VFIO_PCI_CONFIG_REGION_INDEX),
            dev.get_region_size(VFIO_PCI_CONFIG_REGION_INDEX),
        );
        tracing::debug!(
            %addr, group, flags = info.flags, regions = info.num_regions, irqs = info.num_irqs,
            pgsizes = iommu.pgsizes, windows = ?windows, "opened VFIO device"
        );
        Ok(Arc::new(Self {
            inner: Arc::new(DeviceInner {
                addr,
                group,
                dev,
                container,
                info,
                iommu,
                iova: Mutex::new(iova),
                config,
            }),
            irqs: Mutex::new(IrqRoutes::default()),
        }))
    }

    /// The PCI address, as sysfs writes it.
    pub fn address(&self) -> &str {
        &self.inner.addr
    }

    /// The IOMMU group.
    pub fn iommu_group(&self) -> u32 {
        self.inner.group
    }

    /// The windows of valid IOVAs the IOMMU reported (empty if the kernel reports none).
    pub fn iova_windows(&self) -> &[IovaRange] {
        &self.inner.iommu.ranges
    }

    /// Resets the function (`VFIO_DEVICE_RESET`: FLR, PM or bus reset, as the kernel chooses).
    /// A reset clears the command register: call [`VfioDevice::enable_bus_master`] again.
    ///
    /// # Errors
    /// [`VfioError::ResetUnsupported`] when VFIO offers no reset for the function (QEMU's `edu`,
    /// for one), [`VfioError::Reset`] when the reset failed.
    pub fn reset(&self) -> Result<(), VfioError> {
        if self.inner.info.flags & VFIO_DEVICE_FLAGS_RESET == 0 {
            return Err(VfioError::ResetUnsupported {
                addr: self.inner.addr.clone(),
            });
        }
        sys::reset(sys::device_fd(&self.inner.dev)).map_err(|source| VfioError::Reset {
            addr: self.inner.addr.clone(),
            source,
        })
    }

    /// True when [`VfioDevice::reset`] is supported.
    pub fn can_reset(&self) -> bool {
        self.inner.info.flags & VFIO_DEVICE_FLAGS_RESET != 0
    }
}

impl Drop for VfioDevice {
    fn drop(&mut self) {
        // Quiesce: no interrupt routes, no DMA. Nothing here may panic; failures are logged,
        // since there is no caller left to report them to.
        for kind in [IrqKind::Msix, IrqKind::Msi] {
            if let Err(err) = self.disable_irqs(kind) {
                tracing::warn!(addr = %self.inner.addr, %err, "teardown: disabling {kind}");
            }
        }
        if let Err(err) = self.disable_bus_master() {
            tracing::warn!(addr = %self.inner.addr, %err, "teardown: clearing Bus Master");
        }
    }
}

/// Maps what vfio-ioctls reports for step 3 to this crate's errors.
fn attach_error(addr: &str, group: u32, e: vfio_ioctls::VfioError) -> VfioError {
    use vfio_ioctls::VfioError as E;
    let addr = addr.to_string();
    let e = match e {
        E::OpenGroup(source, _) => {
            return VfioError::Group {
                addr,
                group,
                source,
            };
        }
        E::GroupViable => return VfioError::GroupNotViable { addr, group },
        E::InvalidPath => return VfioError::NoIommuGroup { addr },
        other => other,
    };
    let hint = match &e {
        E::ContainerSetIOMMU(errno) if errno.errno() == rustix::io::Errno::PERM.raw_os_error() => {
            "the type-1 IOMMU refused the group, which happens when the IOMMU has no interrupt \
             remapping: enable it (QEMU: -device intel-iommu,intremap=on), or load \
             vfio_iommu_type1 with allow_unsafe_interrupts=1 if you accept the risk"
        }
        E::GroupGetDeviceFD(_) => {
            "the group did not hand out the device; check that vfio-pci probed it (dmesg)"
        }
        _ => "check dmesg for the kernel's reason",
    };
    VfioError::Attach {
        addr,
        group,
        source: e.into(),
        hint,
    }
}

// Handles are shared between threads (`Arc`), as the HAL's objects are.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<VfioDevice>();
    send_sync::<crate::VfioBar>();
    send_sync::<crate::VfioDma>();
};

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::scan::tests::FakeSysfs;

    fn open_err(dir: &Path, addr: &str) -> VfioError {
        VfioDevice::open_at(dir, addr).expect_err("must not open")
    }

    #[test]
    fn a_missing_function_says_how_to_bind_it() {
        // No machine has PCI domain ffff populated.
        let e = VfioDevice::open("ffff:ff:1f.7").expect_err("no such function");
        assert!(matches!(e, VfioError::NoSuchDevice { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("PCI ffff:ff:1f.7: looking up the function"),
            "{msg}"
        );
        assert!(msg.contains("bind it to vfio-pci"), "{msg}");
        assert!(
            msg.contains("/sys/bus/pci/devices/ffff:ff:1f.7/driver_override"),
            "{msg}"
        );
    }

    #[test]
    fn sysfs_checks_come_before_any_vfio_call() {
        let s = FakeSysfs::new();
        s.add(
            "0000:01:00.0",
            (0x15b3, 0x1003, 0x028000),
            Some(4),
            Some("mlx4_core"),
        );
        s.add(
            "0000:02:00.0",
            (0x15b3, 0x1003, 0x028000),
            None,
            Some("vfio-pci"),
        );
        s.add("0000:03:00.0", (0x15b3, 0x1003, 0x028000), Some(5), None);
        let d = s.devices();

        assert!(matches!(
            open_err(&d, "1:0.0"),
            VfioError::BadAddress { .. }
        ));
        assert!(matches!(
            open_err(&d, "0000:09:00.0"),
            VfioError::NoSuchDevice { .. }
        ));
        match open_err(&d, "01:00.0") {
            VfioError::NotBoundToVfio { addr, driver } => {
                assert_eq!(addr, "0000:01:00.0", "the address is normalised");
                assert_eq!(driver.as_deref(), Some("mlx4_core"));
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(
            open_err(&d, "0000:02:00.0"),
            VfioError::NoIommuGroup { .. }
        ));
        assert!(matches!(
            open_err(&d, "0000:03:00.0"),
            VfioError::NotBoundToVfio { driver: None, .. }
        ));
    }

    #[test]
    fn attach_errors_get_remedies() {
        let e = attach_error(
            "0000:01:00.0",
            9,
            vfio_ioctls::VfioError::ContainerSetIOMMU(vmm_sys_util::errno::Error::new(
                rustix::io::Errno::PERM.raw_os_error(),
            )),
        );
        let msg = e.to_string();
        assert!(msg.contains("attaching IOMMU group 9"), "{msg}");
        assert!(msg.contains("allow_unsafe_interrupts=1"), "{msg}");
        assert!(matches!(
            attach_error("0000:01:00.0", 9, vfio_ioctls::VfioError::GroupViable),
            VfioError::GroupNotViable { group: 9, .. }
        ));
        let e = attach_error(
            "0000:01:00.0",
            9,
            vfio_ioctls::VfioError::OpenGroup(io::Error::from(io::ErrorKind::NotFound), "9".into()),
        );
        assert!(matches!(e, VfioError::Group { group: 9, .. }), "{e:?}");
        assert!(e.to_string().contains("bind it to vfio-pci"));
    }
}

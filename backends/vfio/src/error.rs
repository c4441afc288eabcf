//! The errors of this layer. Every one names the PCI function, the step that failed and, where
//! there is one, what the user can do about it — the message is meant to be read by the person
//! who runs the program, not only by its author.

use std::io;

use thiserror::Error;

/// Which of a device's interrupt kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IrqKind {
    /// PCI MSI (VFIO IRQ index 1).
    Msi,
    /// PCI MSI-X (VFIO IRQ index 2).
    Msix,
}

impl IrqKind {
    /// The VFIO IRQ index.
    pub fn index(self) -> u32 {
        match self {
            Self::Msi => vfio_bindings::bindings::vfio::VFIO_PCI_MSI_IRQ_INDEX,
            Self::Msix => vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX,
        }
    }

    /// The other kind (VFIO enables only one of them at a time).
    pub fn other(self) -> Self {
        match self {
            Self::Msi => Self::Msix,
            Self::Msix => Self::Msi,
        }
    }
}

impl std::fmt::Display for IrqKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Msi => "MSI",
            Self::Msix => "MSI-X",
        })
    }
}

/// An underlying error from vfio-ioctls, boxed so that its type stays out of this crate's API.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The commands that bind a function to vfio-pci (used in several messages).
pub(crate) fn bind_hint(addr: &str) -> String {
    format!(
        "bind it to vfio-pci with: modprobe vfio-pci; \
         echo vfio-pci > /sys/bus/pci/devices/{addr}/driver_override; \
         echo {addr} > /sys/bus/pci/devices/{addr}/driver/unbind (only if another driver has it); \
         echo {addr} > /sys/bus/pci/drivers_probe"
    )
}

/// A failure of the VFIO layer. `Display` gives `PCI <address>: <step>: <cause>; <remedy>`.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VfioError {
    /// The address is not of the form `DDDD:BB:DD.F` (or `BB:DD.F`).
    #[error(
        "PCI {addr}: parsing the address: not a PCI address; write it as lspci -D prints it, \
         e.g. 0000:01:00.0"
    )]
    BadAddress {
        /// The address as given.
        addr: String,
    },

    /// No such function in sysfs.
    #[error(
        "PCI {addr}: looking up the function: no /sys/bus/pci/devices/{addr}; check the address \
         with lspci -D, then {hint}",
        hint = bind_hint(addr)
    )]
    NoSuchDevice {
        /// The address.
        addr: String,
    },

    /// The function exists but vfio-pci does not drive it.
    #[error(
        "PCI {addr}: checking its driver: it is bound to {}, not vfio-pci; {hint}",
        driver.as_deref().unwrap_or("no driver"),
        hint = bind_hint(addr)
    )]
    NotBoundToVfio {
        /// The address.
        addr: String,
        /// The driver it is bound to, if any.
        driver: Option<String>,
    },

    /// The function has no IOMMU group: the IOMMU is off.
    #[error(
        "PCI {addr}: finding its IOMMU group: there is none, so the IOMMU is off; boot with \
         intel_iommu=on (or amd_iommu=on) and check dmesg for DMAR/AMD-Vi"
    )]
    NoIommuGroup {
        /// The address.
        addr: String,
    },

    /// A sysfs attribute could not be read.
    #[error("PCI {addr}: reading {path}: {source}")]
    Sysfs {
        /// The address.
        addr: String,
        /// The file or link.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The private directory that tells vfio-ioctls the function's name and IOMMU group (so
    /// that closing survives surprise removal) could not be made.
    #[error(
        "PCI {addr}: making the VFIO anchor directory in {dir}: {source}; set TMPDIR to a \
         directory this user can write (the anchor is a few bytes, removed when the device \
         closes)"
    )]
    Anchor {
        /// The address.
        addr: String,
        /// The directory the anchor was to be made in.
        dir: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// `/dev/vfio/vfio` could not be opened or lacks the type-1 IOMMU.
    #[error(
        "PCI {addr}: opening the VFIO container /dev/vfio/vfio: {source}; load the modules \
         (modprobe vfio-pci vfio_iommu_type1) and run as a user who may open /dev/vfio/vfio"
    )]
    Container {
        /// The address.
        addr: String,
        /// What vfio-ioctls reported.
        #[source]
        source: Cause,
    },

    /// The group file could not be opened.
    #[error(
        "PCI {addr}: opening /dev/vfio/{group}: {source}; {}",
        match source.kind() {
            io::ErrorKind::PermissionDenied => format!(
                "give this user access to /dev/vfio/{group} (chown, or a udev rule) or run as root"
            ),
            io::ErrorKind::NotFound => bind_hint(addr),
            _ if source.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => format!(
                "another process (or another open of a function of group {group}) holds it; \
                 close that first"
            ),
            _ => "check dmesg".to_string(),
        }
    )]
    Group {
        /// The address.
        addr: String,
        /// The IOMMU group.
        group: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Some function of the group is bound to a host driver.
    #[error(
        "PCI {addr}: checking that IOMMU group {group} is viable: it is not; every function in \
         /sys/kernel/iommu_groups/{group}/devices must be bound to vfio-pci (or have no driver) \
         — bind the others too"
    )]
    GroupNotViable {
        /// The address.
        addr: String,
        /// The IOMMU group.
        group: u32,
    },

    /// Attaching the group to the container, choosing the IOMMU, or getting the device fd.
    #[error("PCI {addr}: attaching IOMMU group {group} and opening the device: {source}; {hint}")]
    Attach {
        /// The address.
        addr: String,
        /// The IOMMU group.
        group: u32,
        /// What vfio-ioctls reported.
        #[source]
        source: Cause,
        /// What to try.
        hint: &'static str,
    },

    /// A raw VFIO query of the device or the IOMMU failed.
    #[error("PCI {addr}: {what}: {source}")]
    Query {
        /// The address.
        addr: String,
        /// The query (e.g. "VFIO_IOMMU_GET_INFO").
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A config-space access outside the config region or not naturally aligned.
    #[error(
        "PCI {addr}: config access of {width} bytes at {offset:#x}: outside the {size:#x}-byte \
         config space or not naturally aligned"
    )]
    ConfigRange {
        /// The address.
        addr: String,
        /// Offset.
        offset: u16,
        /// Width in bytes.
        width: u8,
        /// Size of the config region.
        size: u64,
    },

    /// A config-space read failed.
    #[error("PCI {addr}: reading {width} bytes of config space at {offset:#x}: {source}")]
    ConfigRead {
        /// The address.
        addr: String,
        /// Offset.
        offset: u16,
        /// Width in bytes.
        width: u8,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A config-space write failed.
    #[error("PCI {addr}: writing {width} bytes of config space at {offset:#x}: {source}")]
    ConfigWrite {
        /// The address.
        addr: String,
        /// Offset.
        offset: u16,
        /// Width in bytes.
        width: u8,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The BAR does not exist (index above 5, or size 0).
    #[error("PCI {addr}: mapping BAR{index}: the function has no such BAR")]
    NoSuchBar {
        /// The address.
        addr: String,
        /// The BAR index.
        index: u8,
    },

    /// mmap of a BAR area failed.
    #[error(
        "PCI {addr}: mapping BAR{index} bytes {offset:#x}..{end:#x}: {source}",
        end = offset + len
    )]
    BarMap {
        /// The address.
        addr: String,
        /// The BAR index.
        index: u8,
        /// Offset of the area in the BAR.
        offset: u64,
        /// Length of the area.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// No IOVA range is left for a DMA region.
    #[error(
        "PCI {addr}: allocating {len} bytes of IOVA space: the IOMMU windows are full; free DMA \
         regions first"
    )]
    IovaExhausted {
        /// The address.
        addr: String,
        /// Bytes asked for.
        len: u64,
    },

    /// The locked-memory limit does not leave room for the mapping.
    #[error(
        "PCI {addr}: pinning {len} bytes for DMA: RLIMIT_MEMLOCK is {limit} bytes and {locked} \
         are locked already; raise RLIMIT_MEMLOCK to at least {needed} bytes \
         (ulimit -l {kib} in the shell that starts the program, LimitMEMLOCK= in a systemd unit, \
         or a memlock line in /etc/security/limits.conf), or run with CAP_IPC_LOCK",
        needed = locked.saturating_add(*len),
        kib = locked.saturating_add(*len).div_ceil(1024)
    )]
    MemlockLimit {
        /// The address.
        addr: String,
        /// Bytes asked for.
        len: u64,
        /// The soft limit in bytes.
        limit: u64,
        /// Bytes the process had locked before (VmLck).
        locked: u64,
    },

    /// Anonymous memory for a DMA region could not be mapped.
    #[error("PCI {addr}: allocating {len} bytes of DMA memory: {source}")]
    DmaAlloc {
        /// The address.
        addr: String,
        /// Bytes asked for.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// `VFIO_IOMMU_MAP_DMA` failed.
    #[error("PCI {addr}: VFIO_IOMMU_MAP_DMA of {len:#x} bytes at IOVA {iova:#x}: {source}")]
    DmaMap {
        /// The address.
        addr: String,
        /// The IOVA.
        iova: u64,
        /// Bytes.
        len: u64,
        /// What vfio-ioctls reported.
        #[source]
        source: Cause,
    },

    /// `VFIO_IOMMU_UNMAP_DMA` failed.
    #[error("PCI {addr}: VFIO_IOMMU_UNMAP_DMA of {len:#x} bytes at IOVA {iova:#x}: {source}")]
    DmaUnmap {
        /// The address.
        addr: String,
        /// The IOVA.
        iova: u64,
        /// Bytes.
        len: u64,
        /// What vfio-ioctls reported.
        #[source]
        source: Cause,
    },

    /// The device has fewer vectors of that kind.
    #[error("PCI {addr}: routing {kind} vector {vector}: the function has {count} {kind} vectors")]
    NoSuchVector {
        /// The address.
        addr: String,
        /// MSI or MSI-X.
        kind: IrqKind,
        /// The vector asked for.
        vector: u32,
        /// How many the device has.
        count: u32,
    },

    /// The sink has no eventfd the kernel could signal.
    #[error(
        "PCI {addr}: routing {kind} vector {vector}: the interrupt sink has no eventfd; use \
         portverbs-linux's EventFdSink"
    )]
    NoEventFd {
        /// The address.
        addr: String,
        /// MSI or MSI-X.
        kind: IrqKind,
        /// The vector.
        vector: u32,
    },

    /// The other interrupt kind is enabled; VFIO runs one at a time.
    #[error(
        "PCI {addr}: routing {kind} vector {vector}: {active} is enabled and VFIO runs only one \
         of MSI and MSI-X; call disable_irqs({active:?}) first"
    )]
    IrqKindBusy {
        /// The address.
        addr: String,
        /// The kind asked for.
        kind: IrqKind,
        /// The vector asked for.
        vector: u32,
        /// The kind that is enabled.
        active: IrqKind,
    },

    /// `VFIO_DEVICE_SET_IRQS` failed.
    #[error(
        "PCI {addr}: VFIO_DEVICE_SET_IRQS for {kind} vectors {start}..{end}: {source}",
        end = start + count
    )]
    SetIrqs {
        /// The address.
        addr: String,
        /// MSI or MSI-X.
        kind: IrqKind,
        /// First vector.
        start: u32,
        /// Number of vectors.
        count: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The device offers no reset method to VFIO.
    #[error(
        "PCI {addr}: resetting the function: VFIO offers no reset for it (no FLR, PM or bus \
         reset); reinitialise it through its own registers instead"
    )]
    ResetUnsupported {
        /// The address.
        addr: String,
    },

    /// `VFIO_DEVICE_RESET` failed.
    #[error("PCI {addr}: VFIO_DEVICE_RESET: {source}")]
    Reset {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl VfioError {
    /// The PCI address the error is about.
    pub fn addr(&self) -> &str {
        match self {
            Self::BadAddress { addr }
            | Self::NoSuchDevice { addr }
            | Self::NotBoundToVfio { addr, .. }
            | Self::NoIommuGroup { addr }
            | Self::Sysfs { addr, .. }
            | Self::Anchor { addr, .. }
            | Self::Container { addr, .. }
            | Self::Group { addr, .. }
            | Self::GroupNotViable { addr, .. }
            | Self::Attach { addr, .. }
            | Self::Query { addr, .. }
            | Self::ConfigRange { addr, .. }
            | Self::ConfigRead { addr, .. }
            | Self::ConfigWrite { addr, .. }
            | Self::NoSuchBar { addr, .. }
            | Self::BarMap { addr, .. }
            | Self::IovaExhausted { addr, .. }
            | Self::MemlockLimit { addr, .. }
            | Self::DmaAlloc { addr, .. }
            | Self::DmaMap { addr, .. }
            | Self::DmaUnmap { addr, .. }
            | Self::NoSuchVector { addr, .. }
            | Self::NoEventFd { addr, .. }
            | Self::IrqKindBusy { addr, .. }
            | Self::SetIrqs { addr, .. }
            | Self::ResetUnsupported { addr }
            | Self::Reset { addr, .. } => addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0000:3b:00.0";

    #[test]
    fn not_found_names_the_address_and_how_to_bind() {
        let e = VfioError::NoSuchDevice { addr: A.into() };
        let msg = e.to_string();
        assert!(
            msg.starts_with("PCI 0000:3b:00.0: looking up the function"),
            "{msg}"
        );
        assert!(msg.contains("lspci -D"), "{msg}");
        assert!(
            msg.contains("echo vfio-pci > /sys/bus/pci/devices/0000:3b:00.0/driver_override"),
            "{msg}"
        );
        assert!(msg.contains("drivers_probe"), "{msg}");
        assert_eq!(e.addr(), A);
    }

    #[test]
    fn wrong_driver_says_which_and_how_to_rebind() {
        let msg = VfioError::NotBoundToVfio {
            addr: A.into(),
            driver: Some("mlx4_core".into()),
        }
        .to_string();
        assert!(msg.contains("bound to mlx4_core, not vfio-pci"), "{msg}");
        assert!(msg.contains("0000:3b:00.0/driver/unbind"), "{msg}");
        let msg = VfioError::NotBoundToVfio {
            addr: A.into(),
            driver: None,
        }
        .to_string();
        assert!(msg.contains("bound to no driver"), "{msg}");
    }

    #[test]
    fn memlock_gives_the_limit_to_set() {
        let e = VfioError::MemlockLimit {
            addr: A.into(),
            len: 1 << 20,
            limit: 64 << 10,
            locked: 8 << 10,
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("PCI 0000:3b:00.0: pinning 1048576 bytes"),
            "{msg}"
        );
        assert!(msg.contains("RLIMIT_MEMLOCK is 65536 bytes"), "{msg}");
        assert!(
            msg.contains("raise RLIMIT_MEMLOCK to at least 1056768 bytes"),
            "{msg}"
        );
        assert!(msg.contains("ulimit -l 1032"), "{msg}");
        assert!(msg.contains("CAP_IPC_LOCK"), "{msg}");
    }

    #[test]
    fn group_errors_depend_on_the_cause() {
        let busy = VfioError::Group {
            addr: A.into(),
            group: 7,
            source: io::Error::from_raw_os_error(16),
        }
        .to_string();
        assert!(busy.contains("opening /dev/vfio/7"), "{busy}");
        assert!(busy.contains("another process"), "{busy}");
        let denied = VfioError::Group {
            addr: A.into(),
            group: 7,
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        }
        .to_string();
        assert!(
            denied.contains("give this user access to /dev/vfio/7"),
            "{denied}"
        );
        let viable = VfioError::GroupNotViable {
            addr: A.into(),
            group: 7,
        }
        .to_string();
        assert!(
            viable.contains("/sys/kernel/iommu_groups/7/devices"),
            "{viable}"
        );
    }

    #[test]
    fn every_message_starts_with_the_address_and_a_step() {
        let errs = [
            VfioError::BadAddress { addr: A.into() },
            VfioError::NoIommuGroup { addr: A.into() },
            VfioError::ConfigRange {
                addr: A.into(),
                offset: 0xfff,
                width: 4,
                size: 256,
            },
            VfioError::NoSuchBar {
                addr: A.into(),
                index: 6,
            },
            VfioError::NoSuchVector {
                addr: A.into(),
                kind: IrqKind::Msix,
                vector: 9,
                count: 1,
            },
            VfioError::IrqKindBusy {
                addr: A.into(),
                kind: IrqKind::Msix,
                vector: 0,
                active: IrqKind::Msi,
            },
            VfioError::ResetUnsupported { addr: A.into() },
            VfioError::Anchor {
                addr: A.into(),
                dir: "/tmp".into(),
                source: io::Error::from(io::ErrorKind::PermissionDenied),
            },
            VfioError::SetIrqs {
                addr: A.into(),
                kind: IrqKind::Msi,
                start: 0,
                count: 2,
                source: io::Error::from_raw_os_error(22),
            },
        ];
        for e in errs {
            let msg = e.to_string();
            assert!(msg.starts_with("PCI 0000:3b:00.0: "), "{msg}");
            assert_eq!(e.addr(), A);
        }
    }
}

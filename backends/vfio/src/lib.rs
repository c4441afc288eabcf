//! # Portverbs VFIO: a PCI function driven from userspace (Linux)
//!
//! This layer opens one PCI function that is bound to the kernel's `vfio-pci` driver and gives
//! a hardware backend (mlx4) what it needs to drive it, in the HAL's own terms:
//!
//! | Need | Here | HAL type |
//! |---|---|---|
//! | open the function: container, group (viability), device | [`VfioDevice::open`] | – |
//! | config space, ids, Memory Space + Bus Master | [`VfioDevice::config_read32`] …, [`VfioDevice::enable_bus_master`] | – |
//! | registers in a BAR (sparse-mmap aware) | [`VfioDevice::bar`] / [`VfioDevice::map_bar`] | [`Mmio`](portverbs_hal::mmio::Mmio) |
//! | memory the device reads and writes, at an IOVA | [`VfioDevice::alloc_dma`] / [`VfioDevice::alloc_vfio_dma`] | [`DmaMemory`](portverbs_hal::dma::DmaMemory) |
//! | interrupts of an event queue | [`VfioDevice::route_msix`], [`VfioDevice::route_msi`] | [`InterruptSink`](portverbs_hal::notify::InterruptSink) |
//! | reset | [`VfioDevice::reset`] | – |
//! | which functions are there | [`scan()`], [`scan_all`] | – |
//!
//! Interrupts reach the application through the same path as a software device's: an MSI-X
//! vector is bound to the eventfd of platform-linux's `EventFdSink`, and the kernel's interrupt
//! handler signals it directly.
//!
//! ## What this layer must never do
//! * Make a Rust reference into a BAR or into DMA memory. The device changes them behind the
//!   compiler's back; every access is a volatile or atomic operation or a copy through a raw
//!   pointer. `unsafe` lives only in `sys` (ioctls), `bar` (MMIO) and `dma` (DMA memory), each
//!   block with its `SAFETY` argument.
//! * Spawn a thread or sleep. Interrupts are delivered by the
//!   kernel to eventfds; waiting is the application's business.
//! * Swallow an error. Every failure returns a [`VfioError`] that names the PCI address, the
//!   step that failed and what to do ("bind it to vfio-pci with …", "raise RLIMIT_MEMLOCK to
//!   …"); only teardown in `Drop`, which has no caller to report to, logs instead.
//! * Know about verbs or a particular device: it depends on `portverbs-hal` only.
//!
//! ## vfio-ioctls and the raw calls
//! [vfio-ioctls](https://crates.io/crates/vfio-ioctls) 0.10, built without its `kvm`/`mshv`
//! features, does the container, group and device work: opening `/dev/vfio/vfio` and checking
//! the API and the type-1 v2 IOMMU, opening the group and checking it is viable, attaching it,
//! getting the device fd, reading region information (sparse-mmap areas included) and IRQ
//! counts, `VFIO_IOMMU_MAP_DMA`/`UNMAP_DMA`, and the teardown order of device, group and
//! container. What it cannot do is done in `sys` with vfio-bindings and vmm-sys-util's ioctl
//! helpers:
//! * the IOVA windows and page sizes (`VFIO_IOMMU_GET_INFO` with its capability chain): not
//!   wrapped at all;
//! * routing one vector to a raw eventfd: its `enable_irq` always sets vectors `0..n`, wants
//!   vmm-sys-util `EventFd`s rather than the sink's fd, and drops the errno;
//! * reset and config-space or BAR `pread`/`pwrite` with errors: its `reset`, `region_read`
//!   and `region_write` return `()` and only log failures;
//! * the device flags (is reset supported?): kept private.
//!
//! BARs are mapped with memmap2's raw mappings and DMA memory is anonymous memmap2 memory, so
//! no `libc` calls are needed.
//!
//! ## Known limits
//! * One container per opened function: two functions never share an IOVA space, and
//!   functions that share an IOMMU group cannot be opened (the second open gets `EBUSY`).
//! * The IOVA allocator hands out the lowest free addresses but takes no DMA mask; a device
//!   with a narrow mask (edu: 28 bits) relies on the process keeping its DMA footprint small.
//! * Before Linux 6.5 the number of MSI-X vectors is fixed when MSI-X is first enabled; routing
//!   a higher vector re-enables MSI-X (see [`VfioDevice::route_msix`]).
//! * vfio-pci offers no write-combining BAR mapping, so BlueFlame copies are plain stores.
//! * The HAL's `MmioError` carries no OS error: a failing `pread`/`pwrite` fallback is logged
//!   with its errno and reported as `MmioError::Removed`.
//! * vfio-ioctls 0.10 `unwrap`s in its device `Drop` when the path it was opened with no longer
//!   names the IOMMU group, which for the function's sysfs entry happens on surprise removal.
//!   So it is opened with a private anchor directory instead (made at open in the temporary
//!   directory, `portverbs-vfio-anchor-XXXXXX/<address>/iommu_group`, removed at close; see
//!   `anchor`), and opening needs a writable temporary directory (`TMPDIR`, else `/tmp`).
//!   Should the anchor be deleted while the device is open and not be recreatable at close, the
//!   device fd, group and container are leaked with a warning instead of a panic.
//! * vfio-ioctls keeps region information by position, so a failed region query would shift
//!   later indices (never seen for BARs and config space, which come first).
//!
//! ## Testing
//! Unit tests (any Linux machine, no VFIO): the IOVA allocator, the `VFIO_IOMMU_GET_INFO`
//! parser, sparse-area selection, the locked-memory check, sysfs scanning and the open-time
//! checks against a fake sysfs tree, the anchor vfio-ioctls is opened with (made from a fake
//! sysfs entry that is then deleted; its repair, and the leak when it cannot be repaired), and
//! the error messages. `tests/vfio-guest/run.sh` runs this crate for real inside a QEMU guest
//! (TCG, emulated intel-iommu) against QEMU's `edu` and `nvme` devices: config space, BAR
//! mapping, DMA both ways through the IOMMU, DMA after unmap blocked, MSI and MSI-X to
//! eventfds, the locked-memory limit, reset and teardown, and last a surprise removal of edu
//! while it is open. Boot and test take about 8 s on a 2-core machine; the whole script about
//! 11 s warm.
//!
//! On targets other than Linux this crate is empty.
#![cfg_attr(target_os = "linux", deny(unsafe_code))]
#![warn(missing_docs)]

#[cfg(target_os = "linux")]
mod anchor;
#[cfg(target_os = "linux")]
mod bar;
#[cfg(target_os = "linux")]
pub mod config;
#[cfg(target_os = "linux")]
mod device;
#[cfg(target_os = "linux")]
mod dma;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
pub mod iova;
#[cfg(target_os = "linux")]
mod irq;
#[cfg(target_os = "linux")]
mod memlock;
#[cfg(target_os = "linux")]
mod scan;
#[cfg(target_os = "linux")]
mod sys;

#[cfg(target_os = "linux")]
pub use bar::VfioBar;
#[cfg(target_os = "linux")]
pub use device::VfioDevice;
#[cfg(target_os = "linux")]
pub use dma::VfioDma;
#[cfg(target_os = "linux")]
pub use error::{Cause, IrqKind, VfioError};
#[cfg(target_os = "linux")]
pub use scan::{
    PciFunction, SYSFS_PCI_DEVICES, VFIO_PCI_DRIVER, parse_address, read_function, scan, scan_all,
    scan_at,
};

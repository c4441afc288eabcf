//! The VFIO calls vfio-ioctls 0.10 does not offer in a usable form, made directly.
//!
//! * `VFIO_IOMMU_GET_INFO`: vfio-ioctls defines the number but has no call for it, and the IOVA
//!   allocator needs the valid ranges and page sizes.
//! * `VFIO_DEVICE_GET_INFO`: vfio-ioctls keeps the flags private, and `reset` needs the
//!   `VFIO_DEVICE_FLAGS_RESET` bit.
//! * `VFIO_DEVICE_SET_IRQS`: vfio-ioctls always sets vectors `0..n` from vmm-sys-util `EventFd`s
//!   and discards the errno; routing one vector to a sink's raw eventfd needs `start`/`count`.
//! * `VFIO_DEVICE_RESET`: vfio-ioctls' `reset` returns `()` and drops the error.
//! * `pread`/`pwrite` on the device fd: vfio-ioctls' `region_read`/`region_write` only log
//!   failures, and config space and BAR fallbacks must report them.
//!
//! This is one of the three modules of the crate allowed `unsafe` (with `bar` and `dma`).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::raw::{c_uint, c_ulong};

use vfio_bindings::bindings::vfio::{
    VFIO_BASE, VFIO_IOMMU_INFO_CAPS, VFIO_IOMMU_INFO_PGSIZES, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_TYPE,
    vfio_device_info, vfio_iommu_type1_info, vfio_irq_set,
};
use vmm_sys_util::ioctl::{
    _IOC_NONE, ioctl, ioctl_expr, ioctl_with_mut_ptr, ioctl_with_mut_ref, ioctl_with_ptr,
};

use crate::iova::IovaRange;

/// `_IO(VFIO_TYPE, VFIO_BASE + nr)`, as linux/vfio.h defines every VFIO ioctl.
const fn vfio_io(nr: c_uint) -> c_ulong {
    ioctl_expr(_IOC_NONE, VFIO_TYPE as c_uint, VFIO_BASE + nr, 0)
}

const VFIO_DEVICE_GET_INFO: c_ulong = vfio_io(7);
const VFIO_DEVICE_SET_IRQS: c_ulong = vfio_io(10);
const VFIO_DEVICE_RESET: c_ulong = vfio_io(11);
const VFIO_IOMMU_GET_INFO: c_ulong = vfio_io(12);

/// Converts an ioctl return value into a result with the errno.
fn check(ret: i32) -> io::Result<i32> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The device fd that `dev` owns, borrowed for as long as `dev` is.
pub(crate) fn device_fd(dev: &vfio_ioctls::VfioDevice) -> BorrowedFd<'_> {
    // SAFETY: `VfioDevice` owns its device fd (a `File`) and closes it only in its `Drop`; the
    // returned borrow cannot outlive `dev`, so the fd is open for the borrow's whole life.
    unsafe { BorrowedFd::borrow_raw(dev.as_raw_fd()) }
}

/// The answer of `VFIO_DEVICE_GET_INFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceInfo {
    pub(crate) flags: u32,
    pub(crate) num_regions: u32,
    pub(crate) num_irqs: u32,
}

/// `VFIO_DEVICE_GET_INFO`.
pub(crate) fn device_info(fd: BorrowedFd<'_>) -> io::Result<DeviceInfo> {
    let mut info = vfio_device_info {
        argsz: size_of::<vfio_device_info>() as u32,
        ..Default::default()
    };
    // SAFETY: the request takes a `struct vfio_device_info` whose `argsz` says how much of it
    // the kernel may fill; `info` is exactly that struct and lives across the call.
    check(unsafe { ioctl_with_mut_ref(&fd, VFIO_DEVICE_GET_INFO, &mut info) })?;
    Ok(DeviceInfo {
        flags: info.flags,
        num_regions: info.num_regions,
        num_irqs: info.num_irqs,
    })
}

/// What the type-1 IOMMU of a container offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IommuInfo {
    /// Bitmap of supported page sizes (0 if not reported).
    pub(crate) pgsizes: u64,
    /// Valid IOVA windows; empty when the kernel did not report them (before Linux 5.4).
    pub(crate) ranges: Vec<IovaRange>,
}

impl IommuInfo {
    /// The smallest IOMMU page size, 4 KiB when none was reported.
    pub(crate) fn min_page(&self) -> u64 {
        if self.pgsizes == 0 {
            4096
        } else {
            1 << self.pgsizes.trailing_zeros()
        }
    }
}

/// `VFIO_IOMMU_GET_INFO` on a container with its IOMMU set, capability chain included.
pub(crate) fn iommu_info(container: &impl AsRawFd) -> io::Result<IommuInfo> {
    let mut head = vfio_iommu_type1_info {
        argsz: size_of::<vfio_iommu_type1_info>() as u32,
        ..Default::default()
    };
    // SAFETY: the request takes a `struct vfio_iommu_type1_info` of `argsz` bytes, which
    // `head` is; when capabilities do not fit, the kernel only raises `argsz`.
    check(unsafe { ioctl_with_mut_ref(container, VFIO_IOMMU_GET_INFO, &mut head) })?;
    let want = head.argsz as usize;
    if head.flags & VFIO_IOMMU_INFO_CAPS == 0 || want <= size_of::<vfio_iommu_type1_info>() {
        return Ok(parse_iommu_info(&bytes_of_info(&head)));
    }
    // Second call with room for the capability chain; u64 words keep the buffer aligned for
    // the kernel's 8-byte fields.
    let mut buf = vec![0u64; want.div_ceil(8)];
    let a = head.argsz.to_ne_bytes();
    buf[0] = u64::from_ne_bytes([a[0], a[1], a[2], a[3], 0, 0, 0, 0]);
    // SAFETY: `buf` is `argsz` bytes or more, 8-byte aligned, and starts like the struct: its
    // first four bytes are `argsz`, the next four (flags) zero; the kernel writes at most
    // `argsz` bytes into it.
    check(unsafe { ioctl_with_mut_ptr(container, VFIO_IOMMU_GET_INFO, buf.as_mut_ptr()) })?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(parse_iommu_info(&bytes[..want.min(bytes.len())]))
}

fn bytes_of_info(info: &vfio_iommu_type1_info) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    v.extend_from_slice(&info.argsz.to_ne_bytes());
    v.extend_from_slice(&info.flags.to_ne_bytes());
    v.extend_from_slice(&info.iova_pgsizes.to_ne_bytes());
    v.extend_from_slice(&info.cap_offset.to_ne_bytes());
    v.extend_from_slice(&info.pad.to_ne_bytes());
    v
}

/// Parses a `vfio_iommu_type1_info` and its capability chain from the bytes the kernel filled.
/// Malformed chains end the walk; nothing panics.
pub(crate) fn parse_iommu_info(b: &[u8]) -> IommuInfo {
    let u32_at = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    let u64_at = |o: usize| {
        b.get(o..o + 8).map(|s| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_ne_bytes(a)
        })
    };
    let flags = u32_at(4).unwrap_or(0);
    let pgsizes = if flags & VFIO_IOMMU_INFO_PGSIZES != 0 {
        u64_at(8).unwrap_or(0)
    } else {
        0
    };
    let mut ranges = Vec::new();
    let mut off = if flags & VFIO_IOMMU_INFO_CAPS != 0 {
        u32_at(16).unwrap_or(0) as usize
    } else {
        0
    };
    // A chain ends at offset 0; each header is 8 bytes (id u16, version u16, next u32). Bound the
    // walk so that a looping chain cannot hang us.
    for _ in 0..64 {
        if off < size_of::<vfio_iommu_type1_info>() {
            break;
        }
        let (Some(idv), Some(next)) = (u32_at(off), u32_at(off + 4)) else {
            break;
        };
        let id = idv & 0xffff;
        if id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            let n = u32_at(off + 8).unwrap_or(0) as usize;
            for i in 0..n {
                let at = off + 16 + i * 16;
                match (u64_at(at), u64_at(at + 8)) {
                    (Some(start), Some(last)) => ranges.push(IovaRange { start, last }),
                    _ => break,
                }
            }
        }
        off = next as usize;
    }
    IommuInfo { pgsizes, ranges }
}

/// `VFIO_DEVICE_SET_IRQS` with `DATA_EVENTFD | ACTION_TRIGGER`: vector `start + i` signals
/// `fds[i]` (-1 leaves a vector without an eventfd). On an index that is not enabled yet, the
/// kernel enables `start + fds.len()` vectors.
pub(crate) fn set_irq_eventfds(
    fd: BorrowedFd<'_>,
    index: u32,
    start: u32,
    fds: &[i32],
) -> io::Result<()> {
    let count =
        u32::try_from(fds.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let header = size_of::<vfio_irq_set>();
    // The struct is five u32 fields followed by the u32 fds, so a u32 buffer has its layout and
    // alignment.
    let mut buf: Vec<u32> = Vec::with_capacity(header / 4 + fds.len());
    buf.extend_from_slice(&[
        (header + fds.len() * 4) as u32,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        index,
        start,
        count,
    ]);
    buf.extend(fds.iter().map(|&f| f as u32));
    // SAFETY: `buf` is a complete `struct vfio_irq_set` (argsz, flags, index, start, count)
    // followed by `count` 32-bit eventfds, `argsz` bytes in all, 4-byte aligned, alive across
    // the call; the kernel only reads it.
    check(unsafe { ioctl_with_ptr(&fd, VFIO_DEVICE_SET_IRQS, buf.as_ptr()) })?;
    Ok(())
}

/// `VFIO_DEVICE_SET_IRQS` with `DATA_NONE | ACTION_TRIGGER` and count 0: disables every vector
/// of the index.
pub(crate) fn disable_irq_index(fd: BorrowedFd<'_>, index: u32) -> io::Result<()> {
    let set = vfio_irq_set {
        argsz: size_of::<vfio_irq_set>() as u32,
        flags: VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        index,
        start: 0,
        count: 0,
        ..Default::default()
    };
    // SAFETY: a `struct vfio_irq_set` with no data, `argsz` bytes, alive across the call; the
    // kernel only reads it.
    check(unsafe { ioctl_with_ptr(&fd, VFIO_DEVICE_SET_IRQS, &set) })?;
    Ok(())
}

/// `VFIO_DEVICE_RESET`.
pub(crate) fn reset(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: the request takes no argument.
    check(unsafe { ioctl(&fd, VFIO_DEVICE_RESET) })?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset` of the device fd (a region's file offset).
pub(crate) fn pread_exact(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd, &mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Writes all of `buf` at `offset` of the device fd.
pub(crate) fn pwrite_all(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pwrite(fd, &buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_vfio_h() {
        // _IO(';', 100 + n): type 0x3b in bits 8..16, no direction, no size.
        assert_eq!(VFIO_DEVICE_GET_INFO, 0x3b6b);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(VFIO_DEVICE_RESET, 0x3b6f);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3b70);
    }

    /// Builds the reply the 6.1 kernel gives for an intel-iommu container in QEMU: page sizes,
    /// and an IOVA_RANGE capability with two windows, followed by a second capability.
    fn reply() -> Vec<u8> {
        let mut b = Vec::new();
        let total = 24 + 16 + 32 + 16;
        b.extend_from_slice(&(total as u32).to_ne_bytes());
        b.extend_from_slice(&(VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS).to_ne_bytes());
        b.extend_from_slice(&0x4020_1000u64.to_ne_bytes());
        b.extend_from_slice(&24u32.to_ne_bytes()); // cap_offset
        b.extend_from_slice(&0u32.to_ne_bytes());
        // IOVA_RANGE (id 1, version 1), next at 24 + 48.
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&72u32.to_ne_bytes());
        b.extend_from_slice(&2u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        for (s, e) in [(0u64, 0xfedf_ffffu64), (0xfef0_0000, 0xffff_ffff_ffff)] {
            b.extend_from_slice(&s.to_ne_bytes());
            b.extend_from_slice(&e.to_ne_bytes());
        }
        // Another capability (DMA_AVAIL, id 3): skipped.
        b.extend_from_slice(&3u16.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&65535u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        assert_eq!(b.len(), total);
        b
    }

    #[test]
    fn parses_page_sizes_and_iova_windows() {
        let info = parse_iommu_info(&reply());
        assert_eq!(info.pgsizes, 0x4020_1000);
        assert_eq!(info.min_page(), 4096);
        assert_eq!(
            info.ranges,
            [
                IovaRange {
                    start: 0,
                    last: 0xfedf_ffff
                },
                IovaRange {
                    start: 0xfef0_0000,
                    last: 0xffff_ffff_ffff
                }
            ]
        );
    }

    #[test]
    fn malformed_replies_do_not_panic() {
        let full = reply();
        for cut in 0..full.len() {
            let _ = parse_iommu_info(&full[..cut]);
        }
        // A chain that points at itself ends after a bounded walk.
        let mut looping = full.clone();
        looping[28..32].copy_from_slice(&24u32.to_ne_bytes());
        let info = parse_iommu_info(&looping);
        assert!(info.ranges.len() <= 2 * 64);
        // A range count far beyond the buffer.
        let mut huge = full;
        huge[32..36].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(parse_iommu_info(&huge).ranges.len(), 3);
        assert_eq!(parse_iommu_info(&[]).min_page(), 4096);
    }
}

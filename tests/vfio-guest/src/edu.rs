//! QEMU's `edu` teaching device (1234:11e8) through portverbs-vfio: config space, BAR0,
//! ident/liveness/factorial, MSI to a platform-linux eventfd, DMA both ways through the IOMMU,
//! and a DMA after unmap that must not land; last, after every other check of the run, a
//! surprise removal while the device is open.
//!
//! Register map (QEMU `docs/specs/edu.rst`): 0x00 ident, 0x04 liveness (returns the inverse),
//! 0x08 factorial, 0x20 status (bit 0 busy), 0x24 interrupt status, 0x60 raise, 0x64 ack,
//! 0x80 DMA source, 0x88 DMA destination, 0x90 DMA count, 0x98 DMA command (bit 0 start,
//! bit 1 device→RAM, bit 2 interrupt 0x100 when done). The DMA engine's own buffer is
//! 0x40000..0x41000 and it decodes 28-bit bus addresses.

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_linux::{EventFd, EventFdSink};
use portverbs_vfio::config::regs;
use portverbs_vfio::{IrqKind, SYSFS_PCI_DEVICES, VfioBar, VfioDevice, VfioDma, VfioError};

use crate::memlock;
use crate::report::{Outcome, Report};
use crate::wait::{self, Kmsg};

const IDENT: usize = 0x00;
const LIVENESS: usize = 0x04;
const FACTORIAL: usize = 0x08;
const STATUS: usize = 0x20;
const IRQ_STATUS: usize = 0x24;
const IRQ_RAISE: usize = 0x60;
const IRQ_ACK: usize = 0x64;
const DMA_SRC: usize = 0x80;
const DMA_DST: usize = 0x88;
const DMA_CNT: usize = 0x90;
const DMA_CMD: usize = 0x98;
const DMA_START: u64 = 1;
const DMA_TO_RAM: u64 = 2;
const DMA_IRQ: u64 = 4;
const DMA_DONE_IRQ: u32 = 0x100;
/// The engine's buffer inside the device.
const EDU_BUF: u64 = 0x4_0000;
const LEN: usize = 256;

/// Checks after `edu_open`, reported as not run when the open fails.
const AFTER_OPEN: &[&str] = &[
    "edu_config",
    "edu_bar",
    "edu_ident",
    "edu_liveness",
    "edu_factorial",
    "edu_msi_eventfd",
    "edu_dma_to_device",
    "edu_dma_from_device",
    "edu_dma_into_app_memory",
    "edu_dma_after_unmap_blocked",
    "edu_reset",
];

struct Edu {
    dev: Arc<VfioDevice>,
    bar: Arc<VfioBar>,
    efd: Arc<EventFd>,
}

pub(crate) fn run(r: &mut Report, addr: &str) {
    let Some((dev, efd)) = r.step("edu_open", || {
        let efd = Arc::new(EventFd::new()?);
        let dev = VfioDevice::open(addr)?;
        let windows: Vec<String> = dev.iova_windows().iter().map(|w| w.to_string()).collect();
        Ok((
            format!(
                "{} group {} iova windows [{}]",
                dev.address(),
                dev.iommu_group(),
                windows.join(", ")
            ),
            (dev, efd),
        ))
    }) else {
        r.skip(AFTER_OPEN, "edu_open failed");
        r.skip(
            &["edu_memlock_limit", "edu_teardown_reopen"],
            "edu_open failed",
        );
        return;
    };
    let group = dev.iommu_group();
    r.step("edu_config", || config(&dev));
    let Some(bar) = r.step("edu_bar", || bar(&dev)) else {
        r.skip(&AFTER_OPEN[2..], "edu_bar failed");
        drop(dev);
        r.step("edu_memlock_limit", || memlock::check(addr, group));
        r.step("edu_teardown_reopen", || reopen(addr));
        return;
    };
    let edu = Edu { dev, bar, efd };
    r.step("edu_ident", || ident(&edu));
    r.step("edu_liveness", || liveness(&edu));
    r.step("edu_factorial", || factorial(&edu));
    let msi = r.step("edu_msi_eventfd", || msi(&edu)).is_some();
    if msi {
        let src = r.step("edu_dma_to_device", || dma_to_device(&edu));
        match src {
            Some(src) => {
                r.step("edu_dma_from_device", || dma_from_device(&edu, &src));
                r.step("edu_dma_into_app_memory", || dma_into_app_memory(&edu));
            }
            None => r.skip(
                &["edu_dma_from_device", "edu_dma_into_app_memory"],
                "edu_dma_to_device failed",
            ),
        }
        r.step("edu_dma_after_unmap_blocked", || dma_after_unmap(&edu));
    } else {
        r.skip(
            &[
                "edu_dma_to_device",
                "edu_dma_from_device",
                "edu_dma_into_app_memory",
                "edu_dma_after_unmap_blocked",
            ],
            "edu_msi_eventfd failed (the DMA checks wait for its interrupt)",
        );
    }
    r.step("edu_reset", || reset(&edu.dev));
    // Everything of this open goes away here: routes, bus master, BAR, DMA, device, group.
    drop(edu);
    // Both need the group closed: the probe opens it in another process.
    r.step("edu_memlock_limit", || memlock::check(addr, group));
    r.step("edu_teardown_reopen", || reopen(addr));
}

fn config(dev: &VfioDevice) -> Outcome<()> {
    let (vendor, device) = dev.vendor_device()?;
    if (vendor, device) != (0x1234, 0x11e8) {
        return Err(format!("ids {vendor:04x}:{device:04x}, expected 1234:11e8").into());
    }
    let before = dev.config_read16(regs::COMMAND)?;
    dev.enable_bus_master()?;
    let after = dev.config_read16(regs::COMMAND)?;
    let want = regs::CMD_MEMORY | regs::CMD_BUS_MASTER;
    if after & want != want {
        return Err(
            format!("command {before:#06x} -> {after:#06x}: bits {want:#x} not set").into(),
        );
    }
    let msi = dev
        .find_capability(regs::CAP_ID_MSI)?
        .ok_or("no MSI capability")?;
    // Out-of-range config accesses are typed errors, not panics or silent zeroes.
    match dev.config_read32(0x1002) {
        Err(VfioError::ConfigRange { .. }) => {}
        other => return Err(format!("config read at 0x1002 gave {other:?}").into()),
    }
    match dev.config_read16(0x3) {
        Err(VfioError::ConfigRange { .. }) => {}
        other => return Err(format!("misaligned config read gave {other:?}").into()),
    }
    Ok((
        format!(
            "{vendor:04x}:{device:04x} command {before:#06x} -> {after:#06x}, MSI capability at \
             {msi:#x}"
        ),
        (),
    ))
}

fn bar(dev: &VfioDevice) -> Outcome<Arc<VfioBar>> {
    let bar = dev.map_bar(0)?;
    if bar.len() != 1 << 20 {
        return Err(format!("BAR0 is {:#x} bytes, expected 1 MiB", bar.len()).into());
    }
    if bar.mapped_areas() != [(0, 1 << 20)] {
        return Err(format!("BAR0 mapped as {:?}", bar.mapped_areas()).into());
    }
    for index in [1, 6] {
        match dev.bar(index) {
            Err(VfioError::NoSuchBar { .. }) => {}
            other => return Err(format!("BAR{index} gave {other:?}").into()),
        }
    }
    Ok((
        format!(
            "BAR0 {:#x} bytes mmapped whole; BAR1 and BAR6 are NoSuchBar",
            bar.len()
        ),
        bar,
    ))
}

fn ident(edu: &Edu) -> Outcome<()> {
    let le = edu.bar.read32_le(IDENT)?;
    // The HAL's trait reads big-endian: the same bytes, swapped.
    let be = Mmio::read32(&*edu.bar, IDENT)?;
    if le != 0x0100_00ed || be != le.swap_bytes() {
        return Err(format!("ident {le:#010x} (big-endian view {be:#010x})").into());
    }
    Ok((format!("{le:#010x}"), ()))
}

fn liveness(edu: &Edu) -> Outcome<()> {
    let v = 0x1234_5678;
    edu.bar.write32_le(LIVENESS, v)?;
    let back = edu.bar.read32_le(LIVENESS)?;
    if back != !v {
        return Err(format!("wrote {v:#x}, read {back:#x}, expected {:#x}", !v).into());
    }
    Ok((format!("wrote {v:#010x} read {back:#010x}"), ()))
}

fn factorial(edu: &Edu) -> Outcome<()> {
    edu.bar.write32_le(FACTORIAL, 10)?;
    let ((), took) = wait::until("factorial", || {
        Ok((edu.bar.read32_le(STATUS)? & 1 == 0).then_some(()))
    })?;
    let v = edu.bar.read32_le(FACTORIAL)?;
    if v != 3_628_800 {
        return Err(format!("10! read back as {v}").into());
    }
    Ok((format!("10! = {v} in {took:?}"), ()))
}

/// Acknowledges every pending edu interrupt; returns what was pending.
fn ack(edu: &Edu) -> Result<u32, Box<dyn std::error::Error>> {
    let status = edu.bar.read32_le(IRQ_STATUS)?;
    if status != 0 {
        edu.bar.write32_le(IRQ_ACK, status)?;
    }
    Ok(status)
}

fn msi(edu: &Edu) -> Outcome<()> {
    let sink: Arc<dyn InterruptSink> = Arc::new(EventFdSink::new(edu.efd.clone()));
    // edu has no MSI-X: a typed error, and nothing enabled.
    match edu.dev.route_msix(0, &sink) {
        Err(VfioError::NoSuchVector { count: 0, .. }) => {}
        other => return Err(format!("route_msix on edu gave {other:?}").into()),
    }
    edu.dev.route_msi(0, &sink)?;
    edu.efd.drain()?;
    ack(edu)?;
    edu.bar.write32_le(IRQ_RAISE, 0x1000)?;
    let (count, took) = wait::eventfd(&edu.efd, "MSI after raising 0x1000")?;
    let status = ack(edu)?;
    if status & 0x1000 == 0 {
        return Err(format!("eventfd fired but interrupt status is {status:#x}").into());
    }
    // A second interrupt, from the factorial unit (status bit 0x80: interrupt when done).
    edu.bar.write32_le(STATUS, 0x80)?;
    edu.bar.write32_le(FACTORIAL, 12)?;
    let (_, took2) = wait::eventfd(&edu.efd, "MSI after the factorial")?;
    let status2 = ack(edu)?;
    edu.bar.write32_le(STATUS, 0)?;
    let v = edu.bar.read32_le(FACTORIAL)?;
    if status2 & 1 == 0 || v != 479_001_600 {
        return Err(format!("factorial interrupt status {status2:#x}, 12! = {v}").into());
    }
    Ok((
        format!(
            "raise 0x1000 -> eventfd count {count} in {took:?}; factorial done -> eventfd in \
             {took2:?}, 12! = {v}"
        ),
        (),
    ))
}

/// Starts an edu DMA and waits for its completion interrupt; returns the time it took.
fn run_dma(
    edu: &Edu,
    src: u64,
    dst: u64,
    to_ram: bool,
) -> Result<Duration, Box<dyn std::error::Error>> {
    edu.efd.drain()?;
    edu.bar.write64_le(DMA_SRC, src)?;
    edu.bar.write64_le(DMA_DST, dst)?;
    edu.bar.write64_le(DMA_CNT, LEN as u64)?;
    let dir = if to_ram { DMA_TO_RAM } else { 0 };
    edu.bar.write64_le(DMA_CMD, DMA_START | DMA_IRQ | dir)?;
    let (_, took) = wait::eventfd(&edu.efd, "DMA completion MSI")?;
    let status = ack(edu)?;
    let cmd = edu.bar.read64_le(DMA_CMD)?;
    if status & DMA_DONE_IRQ == 0 || cmd & DMA_START != 0 {
        return Err(
            format!("after the MSI: interrupt status {status:#x}, command {cmd:#x}").into(),
        );
    }
    Ok(took)
}

fn pattern() -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(3))
        .collect()
}

fn dma_to_device(edu: &Edu) -> Outcome<Arc<VfioDma>> {
    let src = edu.dev.alloc_vfio_dma(4096)?;
    src.write(0, &pattern())?;
    let took = run_dma(edu, src.iova(), EDU_BUF, false)?;
    Ok((
        format!(
            "{LEN} bytes from IOVA {:#x} (host {:#x}) into edu {EDU_BUF:#x}, done MSI in {took:?}",
            src.iova(),
            src.host_addr()
        ),
        src,
    ))
}

fn dma_from_device(edu: &Edu, src: &VfioDma) -> Outcome<()> {
    let dst = edu.dev.alloc_vfio_dma(4096)?;
    if dst.iova() == src.iova() {
        return Err("two live regions share an IOVA".into());
    }
    let took = run_dma(edu, EDU_BUF, dst.iova(), true)?;
    let mut got = vec![0u8; LEN + 16];
    dst.read(0, &mut got)?;
    if got[..LEN] != pattern()[..] {
        let first = got.iter().zip(pattern()).position(|(a, b)| *a != b);
        return Err(format!("data differs from what was sent, first at byte {first:?}").into());
    }
    if got[LEN..].iter().any(|&b| b != 0) {
        return Err("the device wrote past the transfer".into());
    }
    Ok((
        format!(
            "{LEN} bytes from edu into IOVA {:#x} in {took:?}, equal to what was sent",
            dst.iova()
        ),
        (),
    ))
}

/// The application's own memory mapped through the IOMMU (`map_host`, what `Pd::reg_vec` does
/// on VFIO): a vector whose start is wherever the allocator put it, the DMA aimed `AT` bytes
/// in. The vector comes back (unmapped first) holding what edu's buffer holds (the pattern
/// `edu_dma_to_device` put there) and nothing written around it.
fn dma_into_app_memory(edu: &Edu) -> Outcome<()> {
    const AT: usize = 100;
    let vector = vec![0u8; AT + LEN + 100];
    let host_addr = vector.as_ptr() as usize;
    let mapped = edu
        .dev
        .map_host(vector.into())
        .map_err(|e| format!("map_host: {}", e.error))?;
    let iova = mapped.iova();
    let took = run_dma(edu, EDU_BUF, iova + AT as u64, true)?;
    let vector = mapped
        .into_host()
        .and_then(|m| m.into_vec())
        .ok_or("the vector did not come back")?;
    if vector[AT..AT + LEN] != pattern()[..] {
        return Err("the DMA did not land in the application's vector".into());
    }
    if vector[..AT]
        .iter()
        .chain(&vector[AT + LEN..])
        .any(|&b| b != 0)
    {
        return Err("bytes around the transfer changed".into());
    }
    Ok((
        format!(
            "{LEN} bytes from edu into a Vec at host {host_addr:#x} (page offset {:#x}) through \
             IOVA {iova:#x}+{AT} in {took:?}; the Vec came back with them",
            host_addr % 4096
        ),
        (),
    ))
}

fn dma_after_unmap(edu: &Edu) -> Outcome<()> {
    let mut kmsg = Kmsg::open();
    let gone = edu.dev.alloc_vfio_dma(4096)?;
    gone.fill(0, 4096, 0x5a)?;
    gone.unmap()?;
    if gone.is_mapped() {
        return Err("still mapped after unmap".into());
    }
    gone.unmap()?; // idempotent
    let took = run_dma(edu, EDU_BUF, gone.iova(), true)?;
    let mut got = vec![0u8; 4096];
    gone.read(0, &mut got)?;
    if let Some(at) = got.iter().position(|&b| b != 0x5a) {
        return Err(format!(
            "the device wrote to IOVA {:#x} after it was unmapped (byte {at} changed)",
            gone.iova()
        )
        .into());
    }
    // The IOMMU's fault report names the IOVA (it is not required: faults are rate-limited).
    let needle = format!("fault addr {:#x}", gone.iova());
    let fault = kmsg
        .seen(&["DMAR", &needle], Duration::from_secs(1))
        .map_or_else(
            || "no DMAR fault message seen".to_string(),
            |m| format!("kernel: {m}"),
        );
    Ok((
        format!(
            "edu's write to unmapped IOVA {:#x} did not land (completion in {took:?}); {fault}",
            gone.iova()
        ),
        (),
    ))
}

fn reset(dev: &VfioDevice) -> Outcome<()> {
    match dev.reset() {
        Err(e @ VfioError::ResetUnsupported { .. }) if !dev.can_reset() => {
            Ok((format!("no reset method, as expected for edu: {e}"), ()))
        }
        Ok(()) => {
            dev.enable_bus_master()?;
            Ok(("reset done".to_string(), ()))
        }
        Err(e) => Err(e.into()),
    }
}

/// After everything of an open was dropped, the group is free again: a second open works.
pub(crate) fn reopen(addr: &str) -> Outcome<()> {
    let dev = VfioDevice::open(addr)?;
    let ids = dev.vendor_device()?;
    drop(dev);
    Ok((
        format!(
            "opened {addr} again after teardown ({:04x}:{:04x}), closed",
            ids.0, ids.1
        ),
        (),
    ))
}

/// MSI must not be routable while MSI-X is enabled (used by the nvme checks).
pub(crate) fn expect_kind_busy(
    dev: &VfioDevice,
    sink: &Arc<dyn InterruptSink>,
) -> Result<(), String> {
    if dev.irq_count(IrqKind::Msi) == 0 {
        return Ok(());
    }
    match dev.route_msi(0, sink) {
        Err(VfioError::IrqKindBusy { .. }) => Ok(()),
        other => Err(format!("route_msi while MSI-X is on gave {other:?}")),
    }
}

/// How portverbs-vfio names the anchor directories it makes in the temporary directory (one per
/// open device, removed when it closes).
const ANCHOR_PREFIX: &str = "portverbs-vfio-anchor-";

/// The run's last check, since it removes edu from the guest: surprise removal while open.
pub(crate) fn surprise_removal(r: &mut Report, addr: &str) {
    r.step("edu_surprise_removal", || remove_while_open(addr));
}

/// Anchor directories in the temporary directory.
fn anchors() -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(std::env::temp_dir())? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(ANCHOR_PREFIX) {
            found.push(name);
        }
    }
    Ok(found)
}

/// Opens edu with a BAR, Bus Master, MSI and a DMA region live, asks the kernel to remove the
/// function from another thread (`echo 1 > .../remove` blocks until vfio-pci's device fd is
/// closed, then deletes the sysfs entry), and drops everything. vfio-ioctls reads the function's
/// IOMMU group again right after closing the fd, racing with that deletion; it reads
/// portverbs-vfio's anchor instead, so the drop must not panic, the removal must complete, the
/// sysfs entry must be gone and no anchor may be left behind.
///
/// The race is made one-sided: the removing thread runs at nice -20 and the dropping thread at
/// nice 19 (on Linux `setpriority(PRIO_PROCESS, 0, ..)` applies to the calling thread), so on
/// the guest's single CPU the woken removal finishes before the drop goes on. Opened with the
/// sysfs path, vfio-ioctls 0.10 panicked here.
fn remove_while_open(addr: &str) -> Outcome<()> {
    use rustix::process::setpriority_process;

    let sysfs = Path::new(SYSFS_PCI_DEVICES).join(addr);
    let left_before = anchors()?;
    let dev = VfioDevice::open(addr)?;
    let bar = dev.map_bar(0)?;
    dev.enable_bus_master()?;
    let efd = Arc::new(EventFd::new()?);
    let sink: Arc<dyn InterruptSink> = Arc::new(EventFdSink::new(efd));
    dev.route_msi(0, &sink)?;
    let dma = dev.alloc_vfio_dma(4096)?;
    let ident = bar.read32_le(IDENT)?;
    if anchors()?.len() != left_before.len() + 1 {
        return Err(format!(
            "expected one new {ANCHOR_PREFIX}* directory in {} while open, have {:?}",
            std::env::temp_dir().display(),
            anchors()?
        )
        .into());
    }

    let mut kmsg = Kmsg::open();
    let remove = sysfs.join("remove");
    let remover = {
        let remove = remove.clone();
        std::thread::spawn(move || {
            let raised = setpriority_process(None, -20);
            let t = Instant::now();
            (fs::write(&remove, "1"), t.elapsed(), raised)
        })
    };
    // vfio-pci asks userspace for the device back (no request eventfd here, so it only logs)
    // and waits; without the message, give the thread time to get that far.
    let asked = kmsg.seen(&[addr, "blocked until released"], Duration::from_secs(2));
    if asked.is_none() {
        std::thread::sleep(Duration::from_millis(500));
    }
    if remover.is_finished() {
        return Err(format!(
            "writing {} returned while the device was open",
            remove.display()
        )
        .into());
    }

    let lowered = setpriority_process(None, 19);
    let t_drop = Instant::now();
    let dropped = catch_unwind(AssertUnwindSafe(move || {
        drop(dma);
        drop(bar);
        drop(sink);
        drop(dev);
    }));
    let drop_took = t_drop.elapsed();
    // Back to normal for what follows (root may raise it again; nothing follows in the run).
    let _ = setpriority_process(None, 0);
    if let Err(payload) = dropped {
        let what = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        return Err(format!("dropping the device during its removal panicked: {what}").into());
    }
    let ((), waited) = wait::until("the removal to finish after the drop", || {
        Ok(remover.is_finished().then_some(()))
    })?;
    let (written, remove_took, raised) = remover
        .join()
        .map_err(|_| "the thread writing remove panicked")?;
    written.map_err(|e| format!("writing {}: {e}", remove.display()))?;
    // Without the priorities the check still runs, but the race may go either way.
    let race = match (raised, lowered) {
        (Ok(()), Ok(())) => "remover at nice -20, dropper at 19".to_string(),
        (r, l) => format!("priorities not set (remover {r:?}, dropper {l:?})"),
    };
    if sysfs.exists() {
        return Err(format!("{} still exists after the removal", sysfs.display()).into());
    }
    let left_after = anchors()?;
    if left_after != left_before {
        return Err(
            format!("anchors before {left_before:?}, after the drop {left_after:?}").into(),
        );
    }
    // The record's first line (its dictionary lines follow).
    let asked = asked.map_or_else(
        || "kernel request message not seen".to_string(),
        |m| format!("kernel: {}", m.lines().next().unwrap_or_default()),
    );
    Ok((
        format!(
            "ident {ident:#010x}; remove blocked while open ({asked}); {race}: drop took \
             {drop_took:?} without a panic, removal done {waited:?} later ({remove_took:?} in \
             all), {addr} gone from sysfs, anchor removed"
        ),
        (),
    ))
}

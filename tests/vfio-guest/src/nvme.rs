//! QEMU's `nvme` controller (1b36:0010) through portverbs-vfio: a queue-based device with
//! MSI-X, the shape of an RDMA HCA in miniature. The admin queues live in our DMA memory, an
//! Identify Controller command is posted with a doorbell, and its completion arrives as MSI-X
//! vector 0 on a platform-linux eventfd.
//!
//! Registers (NVM Express 1.4, §3.1): CAP 0x00 (64-bit), VS 0x08, CC 0x14, CSTS 0x1c, AQA 0x24,
//! ASQ 0x28, ACQ 0x30; doorbells from 0x1000 with a stride of `4 << CAP.DSTRD`. The admin
//! completion queue always interrupts on vector 0.

use std::sync::Arc;

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_linux::{EventFd, EventFdSink};
use portverbs_vfio::config::regs;
use portverbs_vfio::{IrqKind, VfioBar, VfioDevice, VfioDma, VfioError};

use crate::edu::{expect_kind_busy, reopen};
use crate::report::{Outcome, Report};
use crate::wait;

const CAP: usize = 0x00;
const VS: usize = 0x08;
const CC: usize = 0x14;
const CSTS: usize = 0x1c;
const AQA: usize = 0x24;
const ASQ: usize = 0x28;
const ACQ: usize = 0x30;
const DOORBELLS: usize = 0x1000;
/// Queue entries of both admin queues.
const DEPTH: u32 = 8;
/// CC: EN, 4 KiB pages (MPS 0), NVM command set, SQ entries 2^6, CQ entries 2^4.
const CC_ENABLE: u32 = 1 | (6 << 16) | (4 << 20);
const CID: u16 = 0x42;

/// Checks after `nvme_open`.
const AFTER_OPEN: &[&str] = &[
    "nvme_config",
    "nvme_bar",
    "nvme_msix_route",
    "nvme_enable",
    "nvme_identify_msix_eventfd",
    "nvme_identify_data",
    "nvme_reset",
];

struct Queues {
    sq: Arc<VfioDma>,
    cq: Arc<VfioDma>,
    data: Arc<VfioDma>,
    stride: usize,
}

pub(crate) fn run(r: &mut Report, addr: &str, serial: &str) {
    let Some((dev, efd)) = r.step("nvme_open", || {
        let efd = Arc::new(EventFd::new()?);
        let dev = VfioDevice::open(addr)?;
        Ok((
            format!("{} group {}", dev.address(), dev.iommu_group()),
            (dev, efd),
        ))
    }) else {
        r.skip(AFTER_OPEN, "nvme_open failed");
        r.skip(&["nvme_teardown_reopen"], "nvme_open failed");
        return;
    };
    r.step("nvme_config", || config(&dev));
    let bar = r.step("nvme_bar", || bar(&dev));
    let sink: Arc<dyn InterruptSink> = Arc::new(EventFdSink::new(efd.clone()));
    let routed = r.step("nvme_msix_route", || route(&dev, &sink)).is_some();
    let queues = match &bar {
        Some(bar) => r.step("nvme_enable", || enable(&dev, bar)),
        None => {
            r.skip(&["nvme_enable"], "nvme_bar failed");
            None
        }
    };
    match (&bar, &queues, routed) {
        (Some(bar), Some(q), true) => {
            let ok = r
                .step("nvme_identify_msix_eventfd", || identify(bar, q, &efd))
                .is_some();
            if ok {
                r.step("nvme_identify_data", || identify_data(q, serial));
            } else {
                r.skip(&["nvme_identify_data"], "no completion");
            }
        }
        _ => r.skip(
            &["nvme_identify_msix_eventfd", "nvme_identify_data"],
            "an earlier nvme check failed",
        ),
    }
    if let Some(bar) = &bar {
        // Stop the controller before its queues go away.
        let _ = bar.write32_le(CC, 0);
    }
    r.step("nvme_reset", || reset(&dev, bar.as_deref()));
    drop((queues, bar, sink, dev));
    r.step("nvme_teardown_reopen", || reopen(addr));
}

fn config(dev: &VfioDevice) -> Outcome<()> {
    let (vendor, device) = dev.vendor_device()?;
    if (vendor, device) != (0x1b36, 0x0010) {
        return Err(format!("ids {vendor:04x}:{device:04x}, expected 1b36:0010").into());
    }
    dev.enable_bus_master()?;
    let msix = dev
        .find_capability(regs::CAP_ID_MSIX)?
        .ok_or("no MSI-X capability")?;
    let vectors = dev.irq_count(IrqKind::Msix);
    if vectors == 0 {
        return Err("VFIO reports no MSI-X vectors".into());
    }
    Ok((
        format!("{vendor:04x}:{device:04x}, MSI-X capability at {msix:#x}, {vectors} vectors"),
        (),
    ))
}

fn bar(dev: &VfioDevice) -> Outcome<Arc<VfioBar>> {
    let bar = dev.map_bar(0)?;
    if bar.len() < 0x2000 {
        return Err(format!("BAR0 is only {:#x} bytes", bar.len()).into());
    }
    let cap = bar.read64_le(CAP)?;
    let vs = bar.read32_le(VS)?;
    let nvm_command_set = cap & (1 << 37) != 0;
    if vs >> 16 == 0 || !nvm_command_set {
        return Err(format!("CAP {cap:#018x} VS {vs:#010x}").into());
    }
    Ok((
        format!(
            "BAR0 {:#x} bytes, mmapped {:?}; CAP {cap:#018x} (MQES {}, DSTRD {}), VS {}.{}",
            bar.len(),
            bar.mapped_areas(),
            (cap & 0xffff) + 1,
            (cap >> 32) & 0xf,
            vs >> 16,
            (vs >> 8) & 0xff
        ),
        bar,
    ))
}

fn route(dev: &VfioDevice, sink: &Arc<dyn InterruptSink>) -> Outcome<()> {
    dev.route_msix(0, sink)?;
    // A vector beyond those enabled makes the layer re-enable MSI-X with more vectors; vector
    // 0 must keep its eventfd (the Identify completion below arrives there).
    let spare: Arc<dyn InterruptSink> = Arc::new(EventFdSink::new(Arc::new(EventFd::new()?)));
    dev.route_msix(1, &spare)?;
    // Routing an enabled vector again replaces its eventfd in place.
    dev.route_msix(0, sink)?;
    expect_kind_busy(dev, sink)?;
    let count = dev.irq_count(IrqKind::Msix);
    match dev.route_msix(count, sink) {
        Err(VfioError::NoSuchVector { .. }) => {}
        other => return Err(format!("routing vector {count} gave {other:?}").into()),
    }
    Ok((
        format!(
            "MSI-X vector 0 -> eventfd, vector 1 -> another (MSI-X re-enabled with 2 vectors, \
             vector 0 kept); vector {count} is NoSuchVector"
        ),
        (),
    ))
}

fn enable(dev: &VfioDevice, bar: &VfioBar) -> Outcome<Queues> {
    let cap = bar.read64_le(CAP)?;
    let stride = 4usize << ((cap >> 32) & 0xf);
    bar.write32_le(CC, 0)?;
    wait::until("CSTS.RDY = 0 after clearing CC.EN", || {
        Ok((bar.read32_le(CSTS)? & 1 == 0).then_some(()))
    })?;
    let sq = dev.alloc_vfio_dma(4096)?;
    let cq = dev.alloc_vfio_dma(4096)?;
    let data = dev.alloc_vfio_dma(4096)?;
    bar.write32_le(AQA, ((DEPTH - 1) << 16) | (DEPTH - 1))?;
    for (reg, region) in [(ASQ, &sq), (ACQ, &cq)] {
        bar.write32_le(reg, region.iova() as u32)?;
        bar.write32_le(reg + 4, (region.iova() >> 32) as u32)?;
    }
    bar.write32_le(CC, CC_ENABLE)?;
    let (csts, took) = wait::until("CSTS.RDY = 1 after setting CC.EN", || {
        let csts = bar.read32_le(CSTS)?;
        if csts & 2 != 0 {
            return Err(format!("controller fatal status, CSTS {csts:#x}").into());
        }
        Ok((csts & 1 != 0).then_some(csts))
    })?;
    Ok((
        format!(
            "admin SQ at IOVA {:#x}, CQ at {:#x}, {DEPTH} entries; CSTS {csts:#x} after {took:?}",
            sq.iova(),
            cq.iova()
        ),
        Queues {
            sq,
            cq,
            data,
            stride,
        },
    ))
}

fn identify(bar: &VfioBar, q: &Queues, efd: &EventFd) -> Outcome<()> {
    let mut sqe = [0u8; 64];
    // CDW0: opcode 0x06 (Identify), command id; PRP1 at bytes 24..32; CDW10 CNS = 1
    // (controller).
    sqe[0] = 0x06;
    sqe[2..4].copy_from_slice(&CID.to_le_bytes());
    sqe[24..32].copy_from_slice(&q.data.iova().to_le_bytes());
    sqe[40..44].copy_from_slice(&1u32.to_le_bytes());
    q.sq.write(0, &sqe)?;
    portverbs_hal::barrier::to_device();
    efd.drain()?;
    bar.write32_le(DOORBELLS, 1)?; // SQ 0 tail = 1
    let (count, took) = wait::eventfd(efd, "MSI-X vector 0 for the admin completion")?;
    let mut cqe = [0u8; 16];
    q.cq.read(0, &mut cqe)?;
    let dw3 = u32::from_le_bytes([cqe[12], cqe[13], cqe[14], cqe[15]]);
    let (cid, phase, status) = (dw3 as u16, (dw3 >> 16) & 1, dw3 >> 17);
    if cid != CID || phase != 1 || status != 0 {
        return Err(format!(
            "CQE cid {cid:#x} phase {phase} status {status:#x} (want cid {CID:#x}, phase 1, \
             status 0)"
        )
        .into());
    }
    bar.write32_le(DOORBELLS + q.stride, 1)?; // CQ 0 head = 1
    Ok((
        format!(
            "MSI-X vector 0 -> eventfd (count {count}) {took:?} after the doorbell; CQE cid \
             {cid:#x} phase 1 status 0"
        ),
        (),
    ))
}

fn identify_data(q: &Queues, serial: &str) -> Outcome<()> {
    let mut id = [0u8; 72];
    q.data.read(0, &mut id)?;
    let vid = u16::from_le_bytes([id[0], id[1]]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    let (sn, mn) = (text(&id[4..24]), text(&id[24..64]));
    if vid != 0x1b36 || sn != serial || !mn.starts_with("QEMU NVMe") {
        return Err(format!("VID {vid:#06x} SN {sn:?} MN {mn:?}").into());
    }
    Ok((
        format!(
            "Identify data by DMA into IOVA {:#x}: VID {vid:#06x} SN {sn:?} MN {mn:?}",
            q.data.iova()
        ),
        (),
    ))
}

fn reset(dev: &VfioDevice, bar: Option<&VfioBar>) -> Outcome<()> {
    if !dev.can_reset() {
        return match dev.reset() {
            Err(e @ VfioError::ResetUnsupported { .. }) => {
                Ok((format!("no reset method: {e}"), ()))
            }
            other => Err(format!("reset without a method gave {other:?}").into()),
        };
    }
    dev.reset()?;
    dev.enable_bus_master()?;
    let after = match bar {
        Some(bar) => format!(
            "; CC {:#x} CSTS {:#x} after",
            bar.read32_le(CC)?,
            bar.read32_le(CSTS)?
        ),
        None => String::new(),
    };
    Ok((format!("VFIO_DEVICE_RESET done{after}"), ()))
}

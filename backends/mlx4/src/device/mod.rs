//! The opened HCA: bring-up in Linux's order (`mlx4/main.c`), the object tables the driver keeps,
//! and teardown in reverse.

mod bringup;
mod commands;
mod cq;
mod eq;
mod eq_demux;
#[cfg(target_os = "linux")]
mod eq_waiter;
mod mcg;
mod objects;
mod pd_mr;
mod qp;
mod qp_ctx;
mod query;
mod srq;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use portverbs_hal::ObjectCounts;
use portverbs_hal::caps::{DeviceAttr, DeviceInfo};
use portverbs_hal::error::CommandError;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::rng::SplitMix64;
use portverbs_hal::types::Gid;

use crate::alloc::Numbers;
use crate::caps::{DevCaps, FwInfo, PortCaps};
use crate::cmd::CommandInterface;
use crate::doorbell::DbPages;
use crate::icm::{Donated, IcmLayout, Profile};
use crate::mtt::Mtts;
use crate::pci::PciFunction;
use crate::uar::Doorbells;

pub use bringup::OpenError;
use objects::Objects;

/// BlueFlame registers of the driver's UAR.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlueFlame {
    /// BAR2 offset of the BF page.
    pub(crate) page: usize,
    /// Bytes per register half.
    pub(crate) half: usize,
    /// Registers per page.
    pub(crate) regs: usize,
}

/// Object numbers in use.
#[derive(Debug)]
pub(crate) struct Nums {
    pub(crate) pd: Numbers,
    pub(crate) eq: Numbers,
    pub(crate) cq: Numbers,
    pub(crate) qp: Numbers,
    pub(crate) srq: Numbers,
    pub(crate) mpt: Numbers,
    /// Per MPT index: the tag byte of its last key; each use draws another from `rng`.
    pub(crate) mpt_tag: Vec<u8>,
    /// Where the search for the next QP number starts (random at first, then after the last
    /// one handed out).
    pub(crate) next_qpn: u32,
    /// The device's generator of key bytes (seeded from the OS unless the config pins it).
    pub(crate) rng: SplitMix64,
    /// Next BlueFlame register to hand out.
    pub(crate) bf_next: usize,
    /// The GSI QP exists (or is being created): there is one per device.
    pub(crate) gsi: bool,
}

/// Everything of an opened device.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pci: Arc<dyn PciFunction>,
    pub(crate) bar0: Arc<dyn Mmio>,
    /// Where the queues' doorbell handles come from.
    pub(crate) doorbells: Doorbells,
    pub(crate) hcr: CommandInterface,
    pub(crate) fw: FwInfo,
    pub(crate) caps: DevCaps,
    pub(crate) ports: Vec<PortCaps>,
    pub(crate) gids: Vec<Vec<Gid>>,
    pub(crate) profile: Profile,
    pub(crate) layout: IcmLayout,
    pub(crate) donated: Mutex<Donated>,
    pub(crate) info: DeviceInfo,
    pub(crate) attr: DeviceAttr,
    /// The driver's UAR page index.
    pub(crate) uar: u32,
    pub(crate) bf: Option<BlueFlame>,
    pub(crate) mtts: Mtts,
    pub(crate) dbs: DbPages,
    pub(crate) nums: Mutex<Nums>,
    pub(crate) objects: Mutex<Objects>,
    /// The driver's own EQ for command completions (event mode).
    pub(crate) cmd_eqn: Mutex<Option<u32>>,
    /// The asynchronous and completion EQs every context shares, and the event queues
    /// handed out on them (from the end of bring-up until close).
    pub(crate) demux: Mutex<Option<Arc<eq_demux::Demux>>>,
    /// The thread that fans the pool's interrupts out, on a function whose interrupts reach
    /// only eventfds (VFIO); stopped at close.
    #[cfg(target_os = "linux")]
    pub(crate) eq_waiter: Mutex<Option<Arc<eq_waiter::EqWaiter>>>,
    /// Catastrophic error or removal seen: commands and posts fail, polls drain.
    pub(crate) fatal: Arc<AtomicBool>,
    pub(crate) closed: AtomicBool,
    /// The driver's side of the multicast group table.
    pub(crate) mcg: Mutex<mcg::McgState>,
    /// A multicast table operation is running (they run one at a time).
    pub(crate) mcg_busy: AtomicBool,
}

impl Inner {
    pub(crate) fn nums(&self) -> MutexGuard<'_, Nums> {
        self.nums.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn check_alive(&self) -> Result<(), CommandError> {
        if self.fatal.load(Ordering::Acquire) {
            return Err(CommandError::DeviceFatal);
        }
        // The catastrophic-error buffer (Linux `mlx4/catas.c`): Linux polls it once a second; a
        // verbs command is a good moment too.
        if let Some(off) = self.fw.catas_offset {
            match self.bar0.read32(off) {
                Ok(0) => {}
                Ok(_) | Err(portverbs_hal::mmio::MmioError::Removed) => {
                    self.fatal.store(true, Ordering::Release);
                    return Err(CommandError::DeviceFatal);
                }
                Err(_) => {}
            }
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(CommandError::Removed);
        }
        Ok(())
    }

    /// Marks the device failed after a command said it is gone.
    pub(crate) fn note(&self, r: &Result<u64, CommandError>) {
        if matches!(r, Err(CommandError::Removed | CommandError::DeviceFatal)) {
            self.fatal.store(true, Ordering::Release);
        }
    }

    /// BAR2 offset of the driver UAR's page.
    /// The base of the special QPs' block of 8 QPNs (Linux `mlx4/qp.c`: the firmware's QPs rounded
    /// up to 8); the pool of ordinary QPs starts above it.
    pub(crate) fn special_qp_base(&self) -> u32 {
        self.caps.reserved_qps.next_multiple_of(8)
    }

    /// The hardware QPN of port 1's GSI QP: the block's base + 2 (Linux `mlx4/qp.c`).
    pub(crate) fn gsi_hw_qpn(&self) -> u32 {
        self.special_qp_base() + 2
    }
}

/// An opened mlx4 HCA: implements the HAL's [`portverbs_hal::Device`]. Cheap to clone; the
/// device is closed (CLOSE_HCA, ICM and firmware area given back) when the last clone goes.
#[derive(Debug, Clone)]
pub struct Mlx4Device(pub(crate) Arc<Inner>);

impl Mlx4Device {
    /// What the firmware reported.
    pub fn firmware(&self) -> FwInfo {
        self.0.fw
    }

    /// Device capabilities as reported by QUERY_DEV_CAP.
    pub fn dev_caps(&self) -> DevCaps {
        self.0.caps
    }

    /// The ICM profile in use.
    pub fn profile(&self) -> Profile {
        self.0.profile
    }

    /// The ports as QUERY_PORT described them at bring-up.
    pub fn port_caps(&self) -> &[PortCaps] {
        &self.0.ports
    }

    /// Where each context table sits in ICM.
    pub fn icm_layout(&self) -> &IcmLayout {
        &self.0.layout
    }

    /// The PCI function (address or model name).
    pub fn pci_name(&self) -> String {
        self.0.pci.name()
    }

    /// True after a catastrophic error or a removal was seen.
    pub fn is_fatal(&self) -> bool {
        self.0.fatal.load(Ordering::Acquire)
    }

    /// How many completion EQs the device's pool has (every context's CQs share them).
    pub fn completion_eqs(&self) -> usize {
        self.demux().map_or(0, |d| d.comp.len())
    }

    /// Objects applications created through this device and have not destroyed: the event
    /// queues are those handed out, not the driver's own command EQ and shared pool.
    pub fn live(&self) -> ObjectCounts {
        let eqs = self.demux().map_or(0, |d| d.count());
        let n = self.0.nums();
        let o = self.0.objects();
        ObjectCounts {
            pds: n.pd.in_use(),
            eqs,
            cqs: n.cq.in_use(),
            qps: n.qp.in_use(),
            srqs: n.srq.in_use(),
            mrs: o.mrs.len(),
            mws: o.mws.len(),
            ..ObjectCounts::default()
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        bringup::close(self);
    }
}

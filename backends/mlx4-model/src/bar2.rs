//! BAR2 of the model (Linux `include/linux/mlx4/doorbell.h`): 256 UAR pages of 4 KiB, then 256
//! BlueFlame pages.
//!
//! * UAR + 0x14, `qpn << 8`: send doorbell — a lock-free kick to the fabric (the engine thread
//!   or the next `step` reads the WQEs), carrying the UAR page so the QP's `usr_page` is checked.
//! * UAR + 0x20: CQ arm doorbell, one 64-bit write or two 32-bit writes (dword 0 first).
//! * UAR ⌊e/4⌋ + 0x800 + 8·(e mod 4): EQ doorbell of EQ e.
//! * A write-combined block into a BlueFlame page: a WQE whose control segment names its QP
//!   (dword 1 bits 31:8) — treated as a send doorbell for that QP (the WQE is also in memory,
//!   where the model reads it; the copy is not compared). 64-bit stores into BlueFlame pages
//!   are ignored: use `write_wc`.
//!
//! Reads return 0 (these registers are write-only); after removal they fail and writes vanish.
//!
//! The same doorbells are also served as calls ([`UarDoorbells`], which the model's
//! `PciFunction::doorbells` hands to the driver): the driver then names the page, QP, CQ word or
//! EQ slot and nothing is decoded. Stores to offsets stay served as above, for a driver that
//! makes them (and for tests that write offsets as a hostile driver would).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portverbs_fabric::NodeHandle;
use portverbs_hal::mmio::{Mmio, MmioError, check_access};
use portverbs_mlx4_layout::pci::UarDoorbells;
use portverbs_mlx4_layout::uar::{CQ_DOORBELL, EQ_DOORBELL, SEND_DOORBELL, UAR_PAGE};

use crate::caps::NUM_UARS;
use crate::hw::ModelNode;
use crate::shared::{Shared, Stats};

/// A latched CQ doorbell dword 0 (bit 32 marks it valid).
const LATCHED: u64 = 1 << 32;

/// The model's BAR2.
#[derive(Debug)]
pub(crate) struct Bar2 {
    shared: Arc<Shared>,
    handle: NodeHandle<ModelNode>,
    /// Per UAR page: dword 0 of a CQ doorbell written as two 32-bit stores.
    cq_latch: Vec<AtomicU64>,
}

impl Bar2 {
    pub(crate) fn new(shared: Arc<Shared>, handle: NodeHandle<ModelNode>) -> Self {
        Self {
            shared,
            handle,
            cq_latch: (0..NUM_UARS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A send doorbell of UAR page `page` (below `NUM_UARS`) for QP `qpn`.
    fn send_doorbell(&self, page: usize, qpn: u32) {
        Stats::bump(&self.shared.stats.send_doorbells);
        self.kick(page, qpn);
    }

    /// Hands the fabric QP `qpn` to look at, naming the UAR page it was rung through.
    fn kick(&self, page: usize, qpn: u32) {
        self.handle.kick(((page as u32) << 24) | (qpn & 0xff_ffff));
    }

    /// A BlueFlame copy of `block` through the BlueFlame page of UAR page `page` (below
    /// `NUM_UARS`): a send doorbell for the QP its control segment names.
    fn blueflame_copy(&self, page: usize, block: &[u8]) {
        if block.len() < 16 || block.len() % 8 != 0 {
            return;
        }
        Stats::bump(&self.shared.stats.blueflame_writes);
        let d1 = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
        self.kick(page, d1 >> 8);
    }

    /// The UAR page `page` as an index, when the model has it and is not removed.
    fn live_page(&self, page: u32) -> Option<usize> {
        let page = page as usize;
        (page < NUM_UARS && !self.shared.removed()).then_some(page)
    }

    fn cq_arm(&self, page: usize, dword0: u32, ci: u32) {
        let _ = self.handle.try_with(|ctx| {
            ctx.node.hw.cq_doorbell(page as u32, dword0, ci);
        });
    }

    fn eq_doorbell(&self, eqn: u32, value: u32) {
        let _ = self.handle.try_with(|ctx| {
            ctx.node.hw.eq_doorbell(eqn, value);
        });
    }

    /// EQ number of an EQ doorbell offset in UAR page `page`.
    fn eqn(page: usize, o: usize) -> Option<u32> {
        let k = o.checked_sub(EQ_DOORBELL)?;
        (k % 8 == 0 && k < 32).then(|| (page * 4 + k / 8) as u32)
    }
}

impl Mmio for Bar2 {
    fn len(&self) -> usize {
        2 * NUM_UARS * UAR_PAGE
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len())?;
        if self.shared.removed() {
            return Err(MmioError::Removed);
        }
        Ok(0)
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len())?;
        if self.shared.removed() {
            return Ok(());
        }
        let (page, o) = (offset / UAR_PAGE, offset % UAR_PAGE);
        if page >= NUM_UARS {
            return Ok(());
        }
        match o {
            SEND_DOORBELL => self.send_doorbell(page, value >> 8),
            CQ_DOORBELL => self.cq_latch[page].store(LATCHED | u64::from(value), Ordering::Release),
            o if o == CQ_DOORBELL + 4 => {
                let d0 = self.cq_latch[page].swap(0, Ordering::AcqRel);
                if d0 & LATCHED != 0 {
                    self.cq_arm(page, d0 as u32, value);
                } else {
                    Stats::bump(&self.shared.stats.ignored_doorbells);
                }
            }
            _ => {
                if let Some(eqn) = Self::eqn(page, o) {
                    self.eq_doorbell(eqn, value);
                }
            }
        }
        Ok(())
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        check_access(offset, 8, self.len())?;
        if self.shared.removed() {
            return Ok(());
        }
        let (page, o) = (offset / UAR_PAGE, offset % UAR_PAGE);
        if page >= NUM_UARS {
            return Ok(());
        }
        let (hi, lo) = ((value >> 32) as u32, value as u32);
        match o {
            CQ_DOORBELL => self.cq_arm(page, hi, lo),
            // The send doorbell dword is the low half of the 8-byte register at 0x10.
            0x10 => self.send_doorbell(page, lo >> 8),
            _ => {
                if let Some(eqn) = Self::eqn(page, o) {
                    self.eq_doorbell(eqn, hi);
                }
            }
        }
        Ok(())
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        check_access(offset, block.len().max(8), self.len())?;
        if block.len() % 8 != 0 {
            return Err(MmioError::Misaligned {
                offset: offset + block.len(),
                width: 8,
            });
        }
        if self.shared.removed() {
            return Ok(());
        }
        let page = offset / UAR_PAGE;
        if page >= NUM_UARS {
            self.blueflame_copy(page - NUM_UARS, block);
        }
        Ok(())
    }
}

impl UarDoorbells for Bar2 {
    fn send(&self, page: u32, qpn: u32) {
        if let Some(page) = self.live_page(page) {
            self.send_doorbell(page, qpn);
        }
    }

    fn arm_cq(&self, page: u32, dword0: u32, ci: u32) {
        if let Some(page) = self.live_page(page) {
            self.cq_arm(page, dword0, ci);
        }
    }

    fn eq(&self, page: u32, slot: u32, value: u32) {
        if let (Some(page), true) = (self.live_page(page), slot < 4) {
            self.eq_doorbell(page as u32 * 4 + slot, value);
        }
    }

    fn blueflame(&self, page: u32, _offset: usize, block: &[u8]) {
        // Which register half of the page the copy goes to does not matter to the model.
        if let Some(page) = self.live_page(page) {
            self.blueflame_copy(page, block);
        }
    }
}

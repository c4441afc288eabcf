//! The doorbells of one UAR page as a typed handle ([`Uar`]), made once when a queue is made and
//! rung by the queue with no BAR2 offset computed or decoded at the time of the doorbell.
//!
//! Which kind of handle a queue gets is chosen when the device is opened ([`Doorbells`]):
//!
//! * a real function whose BAR2 is mapped in one piece: [`MappedUar`], a volatile store to the
//!   page's register cell (`crate::regs`), statically dispatched;
//! * a function that takes doorbells as calls (the emulated HCA, through
//!   [`PciFunction::doorbells`](crate::pci::PciFunction::doorbells)): one call through the
//!   [`UarDoorbells`] trait object, naming the page. That call stays indirect because the
//!   driver does not know the model's type (it does not depend on the model), and making the
//!   device generic over its PCI function would spread a type parameter through every object;
//! * any other function: [`BarDoorbells`], the same [`UarDoorbells`] calls turned into stores
//!   at BAR2 offsets through its [`Mmio`] (a VFIO BAR2 mapped in pieces, a test's BAR).

use std::sync::Arc;

use portverbs_hal::mmio::Mmio;

use crate::layout::uar::{CQ_DOORBELL, EQ_DOORBELL, SEND_DOORBELL, UAR_PAGE};
use crate::pci::UarDoorbells;
use crate::regs::{MappedBar2, MappedUar};

/// The doorbells of one UAR page.
#[derive(Debug, Clone)]
pub(crate) enum Uar {
    /// A page of a mapped BAR2.
    Mapped(MappedUar),
    /// Page `page` of a function's doorbell calls.
    Calls {
        /// The function's doorbells.
        doorbells: Arc<dyn UarDoorbells>,
        /// The UAR page.
        page: u32,
    },
}

impl Uar {
    /// Page `page` of the BAR2 `bar`, rung by stores at its offsets (tests' queues).
    #[cfg(test)]
    pub(crate) fn over_bar(bar: Arc<dyn Mmio>, page: u32) -> Self {
        Self::Calls {
            doorbells: Arc::new(BarDoorbells(bar)),
            page,
        }
    }

    /// The send doorbell for hardware QP `qpn`.
    #[inline]
    pub(crate) fn send(&self, qpn: u32) {
        match self {
            Self::Mapped(m) => m.send(qpn),
            Self::Calls { doorbells, page } => doorbells.send(*page, qpn),
        }
    }

    /// The CQ doorbell: `dword0` (sequence number, command, CQN) and the consumer index.
    #[inline]
    pub(crate) fn arm_cq(&self, dword0: u32, ci: u32) {
        match self {
            Self::Mapped(m) => m.arm_cq(dword0, ci),
            Self::Calls { doorbells, page } => doorbells.arm_cq(*page, dword0, ci),
        }
    }

    /// The doorbell of the EQ in `slot` (eqn mod 4) of this page.
    #[inline]
    pub(crate) fn eq(&self, slot: u32, value: u32) {
        match self {
            Self::Mapped(m) => m.eq(slot, value),
            Self::Calls { doorbells, page } => doorbells.eq(*page, slot, value),
        }
    }

    /// A BlueFlame copy of `block` to the register half at BAR2 `offset` (in this page's
    /// BlueFlame page).
    #[inline]
    pub(crate) fn blueflame(&self, offset: usize, block: &[u8]) {
        match self {
            Self::Mapped(m) => m.blueflame(offset, block),
            Self::Calls { doorbells, page } => doorbells.blueflame(*page, offset, block),
        }
    }
}

/// Where a device's [`Uar`] handles come from, chosen at open.
#[derive(Debug)]
pub(crate) struct Doorbells {
    /// The mapped BAR2 of a real function.
    mapped: Option<Arc<MappedBar2>>,
    /// Calls for pages the mapping does not have (none on hardware): the function's own, or
    /// stores to BAR2.
    calls: Arc<dyn UarDoorbells>,
}

impl Doorbells {
    /// Handles on `mapped` when there is one; otherwise on the function's doorbell calls
    /// (`calls`, from [`PciFunction::doorbells`](crate::pci::PciFunction::doorbells)), or
    /// else stores to `bar2`.
    pub(crate) fn new(
        mapped: Option<Arc<MappedBar2>>,
        calls: Option<Arc<dyn UarDoorbells>>,
        bar2: Arc<dyn Mmio>,
    ) -> Self {
        Self {
            mapped,
            calls: calls.unwrap_or_else(|| Arc::new(BarDoorbells(bar2))),
        }
    }

    /// The doorbells of UAR page `page`.
    pub(crate) fn page(&self, page: u32) -> Uar {
        match self.mapped.as_ref().and_then(|m| m.page(page)) {
            Some(m) => Uar::Mapped(m),
            None => Uar::Calls {
                doorbells: self.calls.clone(),
                page,
            },
        }
    }
}

/// Doorbells as stores at BAR2 offsets (Linux `include/linux/mlx4/doorbell.h`). Access errors
/// are dropped: a doorbell has no answer, and a removed device is seen by the next command.
#[derive(Debug)]
pub(crate) struct BarDoorbells(pub(crate) Arc<dyn Mmio>);

impl BarDoorbells {
    fn at(page: u32, offset: usize) -> usize {
        page as usize * UAR_PAGE + offset
    }
}

impl UarDoorbells for BarDoorbells {
    fn send(&self, page: u32, qpn: u32) {
        let _ = self.0.write32(Self::at(page, SEND_DOORBELL), qpn << 8);
    }

    fn arm_cq(&self, page: u32, dword0: u32, ci: u32) {
        let v = (u64::from(dword0) << 32) | u64::from(ci);
        let _ = self.0.write64(Self::at(page, CQ_DOORBELL), v);
    }

    fn eq(&self, page: u32, slot: u32, value: u32) {
        let at = Self::at(page, EQ_DOORBELL + 8 * (slot as usize % 4));
        let _ = self.0.write32(at, value);
    }

    fn blueflame(&self, _page: u32, offset: usize, block: &[u8]) {
        let _ = self.0.write_wc(offset, block);
    }
}

#[cfg(test)]
mod tests {
    use portverbs_hal::mmio::MemRegisters;

    use super::*;
    use crate::layout::uar::{EQ_ARM, cq_arm_word, eq_doorbell};

    /// A BAR2 of four UAR pages then four BlueFlame pages.
    fn bar() -> Arc<MemRegisters> {
        Arc::new(MemRegisters::new(8 * UAR_PAGE))
    }

    #[test]
    fn bar_doorbells_store_at_the_offsets_of_their_page() {
        let regs = bar();
        let dbs = Doorbells::new(None, None, regs.clone());
        let uar = dbs.page(2);
        uar.send(0x421);
        uar.arm_cq(cq_arm_word(1, 2, 0x85), 0x10);
        let eq = dbs.page(5 / 4);
        eq.eq(5 % 4, EQ_ARM | 0x7);
        uar.blueflame(6 * UAR_PAGE + 0x100, &[0xab; 16]);
        assert_eq!(regs.read32(2 * UAR_PAGE + 0x14).unwrap(), 0x0004_2100);
        assert_eq!(regs.read32(2 * UAR_PAGE + 0x20).unwrap(), 0x1200_0085);
        assert_eq!(regs.read32(2 * UAR_PAGE + 0x24).unwrap(), 0x10);
        assert_eq!(regs.read32(eq_doorbell(5)).unwrap(), 0x8000_0007);
        let mut bf = [0u8; 16];
        regs.bytes(6 * UAR_PAGE + 0x100, &mut bf).unwrap();
        assert_eq!(bf, [0xab; 16]);
        for other in [0, 1, 3] {
            let at = other * UAR_PAGE;
            assert_eq!(regs.read32(at + 0x14).unwrap(), 0, "page {other}");
            assert_eq!(regs.read32(at + 0x20).unwrap(), 0, "page {other}");
        }
    }

    /// A function's doorbell calls, recorded.
    #[derive(Debug, Default)]
    struct Recorded(std::sync::Mutex<Vec<String>>);

    impl UarDoorbells for Recorded {
        fn send(&self, page: u32, qpn: u32) {
            self.0.lock().unwrap().push(format!("send {page} {qpn:#x}"));
        }
        fn arm_cq(&self, page: u32, dword0: u32, ci: u32) {
            let s = format!("cq {page} {dword0:#x} {ci:#x}");
            self.0.lock().unwrap().push(s);
        }
        fn eq(&self, page: u32, slot: u32, value: u32) {
            let s = format!("eq {page} {slot} {value:#x}");
            self.0.lock().unwrap().push(s);
        }
        fn blueflame(&self, page: u32, offset: usize, block: &[u8]) {
            let s = format!("bf {page} {offset:#x} {}", block.len());
            self.0.lock().unwrap().push(s);
        }
    }

    #[test]
    fn a_functions_calls_take_the_doorbells_and_the_bar_sees_nothing() {
        let regs = bar();
        let calls = Arc::new(Recorded::default());
        let dbs = Doorbells::new(None, Some(calls.clone()), regs.clone());
        let uar = dbs.page(1);
        uar.send(0x4b);
        uar.arm_cq(0x2100_0085, 3);
        uar.eq(2, EQ_ARM);
        uar.blueflame(5 * UAR_PAGE, &[0; 64]);
        assert_eq!(
            *calls.0.lock().unwrap(),
            [
                "send 1 0x4b",
                "cq 1 0x21000085 0x3",
                "eq 1 2 0x80000000",
                "bf 1 0x5000 64"
            ]
        );
        let mut all = vec![0u8; 8 * UAR_PAGE];
        regs.bytes(0, &mut all).unwrap();
        assert!(all.iter().all(|&b| b == 0), "nothing stored to BAR2");
    }
}

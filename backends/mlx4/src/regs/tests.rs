//! The typed blocks' layout, and their access against heap blocks standing in for BAR memory.

use core::mem::{offset_of, size_of};

use portverbs_hal::mmio::MemRegisters;

use super::*;
use crate::layout::hcr::OWNER_SEMAPHORE;
use crate::layout::uar::{EQ_ARM, eq_doorbell};

/// Page-aligned memory standing in for a BAR.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; UAR_PAGE]);

struct FakeBar {
    pages: Vec<Page>,
}

impl FakeBar {
    fn new(len: usize) -> Self {
        Self {
            pages: vec![Page([0; UAR_PAGE]); len / UAR_PAGE],
        }
    }

    fn base(&mut self) -> NonNull<u8> {
        NonNull::new(self.pages.as_mut_ptr().cast::<u8>()).unwrap()
    }

    /// The bytes at `offset`, read the way the device would see them.
    fn bytes<const N: usize>(&mut self, offset: usize) -> [u8; N] {
        assert!(offset + N <= self.pages.len() * UAR_PAGE);
        let p = self.base().as_ptr().wrapping_add(offset);
        // SAFETY: in bounds of the live allocation (asserted); a volatile copy of plain bytes.
        unsafe { p.cast::<[u8; N]>().read_volatile() }
    }
}

#[test]
fn block_layouts_match_the_facts() {
    assert_eq!(size_of::<HcrRegs>(), 7 * 4);
    assert_eq!(offset_of!(HcrRegs, in_param_hi), dword::IN_PARAM_HI);
    assert_eq!(offset_of!(HcrRegs, in_param_lo), dword::IN_PARAM_LO);
    assert_eq!(offset_of!(HcrRegs, in_modifier), dword::IN_MODIFIER);
    assert_eq!(offset_of!(HcrRegs, out_param_hi), dword::OUT_PARAM_HI);
    assert_eq!(offset_of!(HcrRegs, out_param_lo), dword::OUT_PARAM_LO);
    assert_eq!(offset_of!(HcrRegs, token), dword::TOKEN);
    assert_eq!(offset_of!(HcrRegs, status), dword::STATUS);
    assert_eq!(size_of::<ResetReg>(), 4);
    assert_eq!(size_of::<ClrInt>(), 8);
    assert_eq!(offset_of!(ClrInt, lo), 4);
    assert_eq!(size_of::<EqDoorbell>(), 8);
    assert_eq!(size_of::<UarPage>(), UAR_PAGE);
    assert_eq!(offset_of!(UarPage, send), SEND_DOORBELL);
    assert_eq!(offset_of!(UarPage, cq), CQ_DOORBELL);
    assert_eq!(offset_of!(UarPage, eq), EQ_DOORBELL);
    let eqn: u32 = 5;
    let slot = eqn as usize % 4;
    assert_eq!(
        offset_of!(UarPage, eq) + slot * size_of::<EqDoorbell>(),
        eq_doorbell(eqn) % UAR_PAGE
    );
}

#[test]
fn bar0_blocks_serve_the_hcr_and_reset_big_endian() {
    let mut mem = FakeBar::new(BAR0_MIN_LEN);
    let rest = Arc::new(MemRegisters::new(BAR0_MIN_LEN));
    // SAFETY: `mem` outlives `bar` (dropped first, declared later) and nothing else references it.
    let bar = unsafe { TypedBar0::new(rest.clone(), mem.base()) }.unwrap();
    bar.write32(HCR_BASE + dword::IN_MODIFIER, 0x0102_0304)
        .unwrap();
    bar.write32(HCR_BASE + dword::STATUS, 0x8080_0031).unwrap();
    assert_eq!(
        bar.read32(HCR_BASE + dword::IN_MODIFIER).unwrap(),
        0x0102_0304
    );
    assert_eq!(bar.read32(HCR_BASE + dword::STATUS).unwrap(), 0x8080_0031);
    bar.write32(RESET_REG, 1).unwrap();
    // Anything else goes to the BAR's own accessors.
    bar.write32(OWNER_SEMAPHORE, 7).unwrap();
    assert_eq!(bar.read32(OWNER_SEMAPHORE).unwrap(), 7);
    assert!(
        bar.write32(BAR0_MIN_LEN, 0).is_err(),
        "bounds still checked"
    );
    drop(bar);
    assert_eq!(mem.bytes::<4>(HCR_BASE + dword::IN_MODIFIER), [1, 2, 3, 4]);
    assert_eq!(
        mem.bytes::<4>(HCR_BASE + dword::STATUS),
        [0x80, 0x80, 0, 0x31]
    );
    assert_eq!(mem.bytes::<4>(RESET_REG), [0, 0, 0, 1]);
    assert_eq!(
        mem.bytes::<4>(OWNER_SEMAPHORE),
        [0; 4],
        "not a typed register"
    );
    assert_eq!(rest.read32(OWNER_SEMAPHORE).unwrap(), 7);
    assert_eq!(
        rest.read32(RESET_REG).unwrap(),
        0,
        "the reset went to the block"
    );
}

#[test]
fn bar0_blocks_refuse_a_short_or_misaligned_mapping() {
    let mut mem = FakeBar::new(BAR0_MIN_LEN);
    let base = mem.base();
    // SAFETY: the blocks are refused before any access.
    assert!(unsafe { Bar0Regs::new(base, BAR0_MIN_LEN - 4) }.is_none());
    let odd = NonNull::new(base.as_ptr().wrapping_add(4)).unwrap();
    // SAFETY: as above.
    assert!(unsafe { Bar0Regs::new(odd, BAR0_MIN_LEN - 8) }.is_none());
    // SAFETY: `mem` is live for the block's use below.
    let regs = unsafe { Bar0Regs::new(base, BAR0_MIN_LEN) }.unwrap();
    assert!(
        regs.clr_int(BAR0_MIN_LEN - 4).is_none(),
        "an 8-byte register past the end"
    );
    assert!(regs.clr_int(0xf00d8).is_some());
}

#[test]
fn mapped_uar_pages_ring_their_own_cells_big_endian() {
    let len = 8 * UAR_PAGE;
    let mut mem = FakeBar::new(len);
    let owner = Arc::new(MemRegisters::new(len));
    // SAFETY: `mem` outlives `bar` and its pages (dropped first) and nothing else references it.
    let bar = Arc::new(unsafe { MappedBar2::new(owner.clone(), mem.base()) }.unwrap());
    assert!(bar.page(8).is_none(), "a page past the BAR");
    let one = bar.page(1).unwrap();
    let two = bar.page(2).unwrap();
    one.send(0x421);
    two.arm_cq(0x1200_0085, 0x10);
    // EQ 5 is slot 1 of page 1.
    one.eq(5 % 4, EQ_ARM | 0x10);
    // A BlueFlame copy into page 1's BlueFlame page (page 4 + 1 here), at its second half.
    let wqe: Vec<u8> = (0..64).collect();
    one.blueflame(5 * UAR_PAGE + 0x100, &wqe);
    // Refused: not whole words, past the BAR's end.
    one.blueflame(5 * UAR_PAGE + 0x200, &[0xee; 12]);
    one.blueflame(len - 8, &[0xee; 16]);
    drop((one, two, bar));
    assert_eq!(mem.bytes::<4>(UAR_PAGE + SEND_DOORBELL), [0, 4, 0x21, 0]);
    assert_eq!(
        mem.bytes::<8>(2 * UAR_PAGE + CQ_DOORBELL),
        [0x12, 0, 0, 0x85, 0, 0, 0, 0x10]
    );
    assert_eq!(mem.bytes::<4>(eq_doorbell(5)), [0x80, 0, 0, 0x10]);
    assert_eq!(eq_doorbell(5), UAR_PAGE + 0x808);
    assert_eq!(mem.bytes::<64>(5 * UAR_PAGE + 0x100).to_vec(), wqe);
    assert_eq!(mem.bytes::<16>(5 * UAR_PAGE + 0x200), [0; 16]);
    assert_eq!(mem.bytes::<8>(len - 8), [0; 8]);
    // Each doorbell landed in its own page only.
    assert_eq!(mem.bytes::<4>(2 * UAR_PAGE + SEND_DOORBELL), [0; 4]);
    assert_eq!(mem.bytes::<8>(UAR_PAGE + CQ_DOORBELL), [0; 8]);
    assert_eq!(mem.bytes::<4>(2 * UAR_PAGE + 0x808), [0; 4]);
    // Nothing went through the owner's accessors.
    let mut all = vec![0u8; len];
    owner.bytes(0, &mut all).unwrap();
    assert!(all.iter().all(|&b| b == 0));
}

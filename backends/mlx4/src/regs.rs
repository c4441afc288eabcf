//! The register blocks of a real mlx4 function as typed `#[repr(C)]` structs of
//! `volatile_register` cells (Linux `mlx4/cmd.c`, `mlx4/reset.c`, `include/linux/mlx4/doorbell.h`):
//! the HCR, the reset register and the clear-interrupt register in BAR0, and the UAR doorbell page
//! in BAR2.
//!
//! `TypedBar0` puts the BAR0 blocks over a BAR's host mapping and serves the driver's [`Mmio`]
//! accesses to those registers through them (everything else, such as the ownership semaphore,
//! goes to the BAR's own accessors). BAR2 is not an [`Mmio`] detour: `MappedBar2` hands out
//! one `MappedUar` per UAR page, a typed doorbell handle the driver's queues keep and ring
//! with one volatile store to the page's cell (`send`, `arm_cq`, `eq`), or a run of 64-bit
//! stores for a BlueFlame copy; no offset is matched at the time of a doorbell. The VFIO path
//! ([`crate::vfio`]) wraps the BARs of a real function with them; the emulated HCA never sees
//! these types (it takes doorbells as calls, see the driver's `uar` module).
//!
//! # The `volatile-register` caveat, and why it is acceptable here
//!
//! `volatile_register::{RO, RW, WO}` are accessed through `&` references: reading a register
//! means making a `&HcrRegs` that points into device memory. Rust marks such references
//! `dereferenceable`, which allows the compiler to insert loads the program never asked for;
//! on memory-mapped I/O a spurious load is a device access. We accept that here because:
//!
//! * the mappings are uncached device memory (vfio-pci maps BARs uncached), mapped for the
//!   whole life of the BAR object that each block keeps alive, so a stray load can never fault;
//! * a load has no side effect on any register these blocks cover: the HCR dwords and the
//!   doorbells read back their value or zero, the reset and clear-interrupt registers ignore
//!   reads. The read-to-acquire ownership semaphore, the one mlx4 register a read changes, is
//!   deliberately *not* in any block and keeps its raw volatile accessor;
//! * a reference lives only for one register access inside this module, and the cells are
//!   `UnsafeCell`-based, so the compiler does not assume the device memory is immutable.
//!
//! The types, the references and every `unsafe` block stay in this module (the one place of the
//! driver besides `dma` that may use `unsafe`).
#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use portverbs_hal::mmio::{Mmio, MmioError, check_access};
use volatile_register::{RO, RW, WO};

use crate::layout::hcr::{BAR0_MIN_LEN, HCR_BASE, RESET_REG, dword};
use crate::layout::uar::{CQ_DOORBELL, EQ_DOORBELL, SEND_DOORBELL, UAR_PAGE};

/// The HCR: seven big-endian dwords at BAR0 + [`HCR_BASE`] (Linux `mlx4/cmd.c`).
#[repr(C)]
pub struct HcrRegs {
    /// in_param\[63:32\].
    pub in_param_hi: RW<u32>,
    /// in_param\[31:0\].
    pub in_param_lo: RW<u32>,
    /// in_modifier.
    pub in_modifier: RW<u32>,
    /// out_param\[63:32\].
    pub out_param_hi: RW<u32>,
    /// out_param\[31:0\].
    pub out_param_lo: RW<u32>,
    /// token << 16.
    pub token: RW<u32>,
    /// status / go / e / t / opmod / opcode.
    pub status: RW<u32>,
}

/// The reset register at BAR0 + [`RESET_REG`] (Linux `mlx4/reset.c`): write big-endian 1 to reset.
#[repr(C)]
pub struct ResetReg {
    /// The register.
    pub reset: WO<u32>,
}

/// The 8-byte big-endian clear-interrupt register at the BAR0 offset QUERY_FW reports
/// (`clr_int_base` of Linux `mlx4/fw.c`); only INTx needs it (this driver uses MSI-X).
#[repr(C)]
pub struct ClrInt {
    /// Bits 63:32.
    pub hi: WO<u32>,
    /// Bits 31:0.
    pub lo: WO<u32>,
}

/// One EQ's 8-byte doorbell in a UAR page.
#[repr(C)]
pub struct EqDoorbell {
    /// Consumer index and arm bit.
    pub ci: WO<u32>,
    _reserved: RO<u32>,
}

/// One 4 KiB UAR page of BAR2 (Linux `include/linux/mlx4/doorbell.h`): send doorbell, CQ doorbell,
/// the doorbells of four EQs.
#[repr(C)]
pub struct UarPage {
    _reserved0: [RO<u32>; SEND_DOORBELL / 4],
    /// Send doorbell (`qpn << 8`).
    pub send: WO<u32>,
    _reserved1: [RO<u32>; (CQ_DOORBELL - SEND_DOORBELL - 4) / 4],
    /// CQ doorbell (one big-endian 64-bit store).
    pub cq: WO<u64>,
    _reserved2: [RO<u32>; (EQ_DOORBELL - CQ_DOORBELL - 8) / 4],
    /// EQ doorbells of EQs 4p .. 4p + 3 of page p.
    pub eq: [EqDoorbell; 4],
    _reserved3: [RO<u32>; (UAR_PAGE - EQ_DOORBELL - 32) / 4],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<HcrRegs>() == 0x1c);
    assert!(offset_of!(HcrRegs, status) == dword::STATUS);
    assert!(size_of::<UarPage>() == UAR_PAGE);
    assert!(offset_of!(UarPage, send) == SEND_DOORBELL);
    assert!(offset_of!(UarPage, cq) == CQ_DOORBELL);
    assert!(offset_of!(UarPage, eq) == EQ_DOORBELL);
};

macro_rules! opaque_debug {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )*};
}
opaque_debug!(HcrRegs, ResetReg, ClrInt, EqDoorbell, UarPage);

/// A mapping the blocks sit on: its address (provenance exposed) and length.
#[derive(Debug, Clone, Copy)]
struct Window {
    addr: usize,
    len: usize,
}

impl Window {
    /// The block of type `T` at `offset`, if it fits and is aligned.
    fn block<T>(&self, offset: usize) -> Option<&T> {
        let end = offset.checked_add(size_of::<T>())?;
        let addr = self.addr.checked_add(offset)?;
        if end > self.len || addr % align_of::<T>() != 0 {
            return None;
        }
        let p = std::ptr::with_exposed_provenance::<T>(addr);
        // SAFETY: `Window`s are made only by the `unsafe` constructors below, whose callers
        // promise `addr..addr + len` is mapped, aligned and alive as long as the window's
        // owner; `offset..end` lies inside it and `p` is aligned for `T`. `T` is one of this
        // module's blocks of `volatile_register` cells (`UnsafeCell`s), so a shared reference
        // does not claim the memory is immutable; see the module's caveat on spurious loads.
        Some(unsafe { &*p })
    }
}

/// The typed blocks of BAR0.
#[derive(Debug)]
pub struct Bar0Regs(Window);

impl Bar0Regs {
    /// Blocks over a BAR0 mapping of `len` bytes at `base`; `None` when it is shorter than
    /// [`BAR0_MIN_LEN`] or not 8-byte aligned.
    ///
    /// # Safety
    /// `base..base + len` must be a mapping of an mlx4 BAR0 (or memory standing in for one),
    /// readable and writable, that stays mapped while the returned value lives, and that no
    /// Rust reference outside this module points into.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> Option<Self> {
        (len >= BAR0_MIN_LEN && base.as_ptr() as usize % 8 == 0).then(|| {
            Self(Window {
                addr: base.as_ptr().expose_provenance(),
                len,
            })
        })
    }

    /// The HCR.
    pub fn hcr(&self) -> &HcrRegs {
        self.0.block(HCR_BASE).unwrap_or_else(|| unreachable!())
    }

    /// The reset register.
    pub fn reset(&self) -> &ResetReg {
        self.0.block(RESET_REG).unwrap_or_else(|| unreachable!())
    }

    /// The clear-interrupt register at `offset` (QUERY_FW's `clr_int_base`), if it lies in
    /// the BAR.
    pub fn clr_int(&self, offset: usize) -> Option<&ClrInt> {
        self.0.block(offset)
    }

    /// The HCR dword at `offset` from [`HCR_BASE`].
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the VFIO binding (Linux)
    fn hcr_dword(&self, offset: usize) -> Option<&RW<u32>> {
        let h = self.hcr();
        Some(match offset {
            dword::IN_PARAM_HI => &h.in_param_hi,
            dword::IN_PARAM_LO => &h.in_param_lo,
            dword::IN_MODIFIER => &h.in_modifier,
            dword::OUT_PARAM_HI => &h.out_param_hi,
            dword::OUT_PARAM_LO => &h.out_param_lo,
            dword::TOKEN => &h.token,
            dword::STATUS => &h.status,
            _ => return None,
        })
    }
}

/// The typed UAR pages of BAR2.
#[derive(Debug)]
pub struct UarRegs(Window);

impl UarRegs {
    /// Blocks over a BAR2 mapping of `len` bytes at `base`; `None` when it is not page aligned.
    ///
    /// # Safety
    /// As [`Bar0Regs::new`], for an mlx4 BAR2.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> Option<Self> {
        (base.as_ptr() as usize % UAR_PAGE == 0).then(|| {
            Self(Window {
                addr: base.as_ptr().expose_provenance(),
                len,
            })
        })
    }

    /// UAR page `index`, if it lies in the BAR.
    pub fn page(&self, index: usize) -> Option<&UarPage> {
        self.0.block(index.checked_mul(UAR_PAGE)?)
    }
}

/// BAR0 with the HCR and the reset register served by [`Bar0Regs`]. Keeps the mapping alive.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the VFIO binding (Linux)
#[derive(Debug)]
pub(crate) struct TypedBar0 {
    regs: Bar0Regs,
    inner: Arc<dyn Mmio>,
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the VFIO binding (Linux)
impl TypedBar0 {
    /// # Safety
    /// As [`Bar0Regs::new`], with `inner` the owner of the mapping at `base` (kept alive here).
    pub(crate) unsafe fn new(inner: Arc<dyn Mmio>, base: NonNull<u8>) -> Option<Self> {
        // SAFETY: forwarded to our caller; `inner` owns the mapping and lives as long as `regs`.
        let regs = unsafe { Bar0Regs::new(base, inner.len()) }?;
        Some(Self { regs, inner })
    }

    fn hcr_offset(offset: usize) -> Option<usize> {
        offset.checked_sub(HCR_BASE).filter(|&o| o <= dword::STATUS)
    }
}

impl Mmio for TypedBar0 {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len())?;
        match Self::hcr_offset(offset).and_then(|o| self.regs.hcr_dword(o)) {
            Some(r) => Ok(u32::from_be(r.read())),
            None => self.inner.read32(offset),
        }
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len())?;
        if let Some(r) = Self::hcr_offset(offset).and_then(|o| self.regs.hcr_dword(o)) {
            // SAFETY: a volatile store to an HCR dword of the live mapping (`volatile_register`
            // marks stores unsafe because a register write can have any effect on the device;
            // posting commands through the HCR is what this driver does).
            unsafe { r.write(value.to_be()) };
            return Ok(());
        }
        if offset == RESET_REG {
            // SAFETY: a volatile store to the reset register of the live mapping; the caller
            // (bring-up, teardown) means to reset the HCA.
            unsafe { self.regs.reset().reset.write(value.to_be()) };
            return Ok(());
        }
        self.inner.write32(offset, value)
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        self.inner.write64(offset, value)
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        self.inner.write_wc(offset, block)
    }
}

/// BAR2 mapped in one piece: its UAR pages as [`UarRegs`], and the BAR's owner, kept alive
/// for as long as any [`MappedUar`] of it lives.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // made by the VFIO binding (Linux)
#[derive(Debug)]
pub(crate) struct MappedBar2 {
    regs: UarRegs,
    _owner: Arc<dyn Mmio>,
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // used by the VFIO binding (Linux)
impl MappedBar2 {
    /// # Safety
    /// As [`UarRegs::new`], with `owner` the owner of the mapping at `base` (kept alive here)
    /// and `owner.len()` its length.
    pub(crate) unsafe fn new(owner: Arc<dyn Mmio>, base: NonNull<u8>) -> Option<Self> {
        // SAFETY: forwarded to our caller; `owner` owns the mapping and lives as long as `regs`.
        let regs = unsafe { UarRegs::new(base, owner.len()) }?;
        Some(Self {
            regs,
            _owner: owner,
        })
    }

    /// The doorbells of UAR page `index`, if it lies in the BAR.
    pub(crate) fn page(self: &Arc<Self>, index: u32) -> Option<MappedUar> {
        let page = self.regs.page(index as usize)?;
        Some(MappedUar {
            page: std::ptr::from_ref(page).expose_provenance(),
            bar: self.clone(),
        })
    }
}

/// The doorbells of one UAR page of a [`MappedBar2`]: each one volatile store to its
/// [`UarPage`] cell, with no offset computed or matched at the time of the doorbell.
#[derive(Debug, Clone)]
pub(crate) struct MappedUar {
    /// Address of the page's [`UarPage`], checked (in the BAR, aligned) when it was made.
    page: usize,
    bar: Arc<MappedBar2>,
}

impl MappedUar {
    #[inline(always)]
    fn regs(&self) -> &UarPage {
        let p = std::ptr::with_exposed_provenance::<UarPage>(self.page);
        // SAFETY: `page` is the address of a `UarPage` block that `Window::block` checked to lie
        // inside the mapping, aligned; `bar` keeps the mapping's owner alive while `self` lives.
        // The same reasoning as `Window::block` (and the module's caveat) applies.
        unsafe { &*p }
    }

    /// The send doorbell: `qpn << 8`, big-endian.
    #[inline]
    pub(crate) fn send(&self, qpn: u32) {
        // SAFETY: a volatile store to the send doorbell of a live UAR page; ringing doorbells
        // is what the driver's queues do.
        unsafe { self.regs().send.write((qpn << 8).to_be()) };
    }

    /// The CQ doorbell: one big-endian 64-bit store of `dword0` then `ci` (as rdma-core's
    /// `mlx4_arm_cq`).
    #[inline]
    pub(crate) fn arm_cq(&self, dword0: u32, ci: u32) {
        let v = (u64::from(dword0) << 32) | u64::from(ci);
        // SAFETY: one volatile 64-bit store to the CQ doorbell of a live UAR page.
        unsafe { self.regs().cq.write(v.to_be()) };
    }

    /// The doorbell of the EQ in `slot` (taken mod 4) of this page, big-endian.
    #[inline]
    pub(crate) fn eq(&self, slot: u32, value: u32) {
        let r = &self.regs().eq[slot as usize % 4].ci;
        // SAFETY: a volatile store to an EQ doorbell of a live UAR page.
        unsafe { r.write(value.to_be()) };
    }

    /// Copies `block` (already in device byte order) to BAR2 `offset` as 64-bit volatile
    /// stores, then flushes them (BlueFlame; the mapping is uncached, see [`crate::vfio`]).
    /// Nothing is written when the block is not whole 8-byte words inside the BAR. Kept out
    /// of line: the copy loop costs more than the call, and inlined it crowds the send
    /// queue's doorbell path for every kind of function.
    #[inline(never)]
    pub(crate) fn blueflame(&self, offset: usize, block: &[u8]) {
        let w = self.bar.regs.0;
        if check_access(offset, block.len().max(8), w.len).is_err() || block.len() % 8 != 0 {
            return;
        }
        let base = w.addr + offset;
        for (i, chunk) in block.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let p = std::ptr::with_exposed_provenance_mut::<u64>(base + i * 8);
            // SAFETY: `offset..offset + len` lies inside the live mapping (checked above),
            // 8-byte aligned (`offset` is, and the mapping is page aligned); a volatile store
            // through a raw pointer makes no reference to device memory.
            unsafe { p.write_volatile(u64::from_ne_bytes(word)) };
        }
        portverbs_hal::barrier::wc_flush();
    }
}

/// A VFIO BAR of a real function as the driver's [`Mmio`]: BAR0 with its typed blocks when
/// the whole BAR is one mmapped area, the plain BAR otherwise (a sparse mapping, where some
/// registers are reached through the device fd, or BAR2, whose doorbells the driver rings
/// through [`MappedUar`]).
#[cfg(target_os = "linux")]
pub(crate) fn typed_vfio_bar(bar: Arc<portverbs_vfio::VfioBar>) -> Arc<dyn Mmio> {
    let index = bar.index();
    let Some(base) = bar.mapped_ptr(0, bar.len()) else {
        tracing::debug!(
            index,
            "BAR not mapped in one piece: no typed register blocks"
        );
        return bar;
    };
    let inner: Arc<dyn Mmio> = bar;
    let typed: Option<Arc<dyn Mmio>> = match index {
        // SAFETY: `base..base + len` is the BAR's live shared mapping, owned by `inner`, which
        // the typed BAR keeps; `VfioBar` itself only makes raw-pointer volatile accesses.
        0 => unsafe { TypedBar0::new(inner.clone(), base) }.map(|b| Arc::new(b) as _),
        _ => None,
    };
    typed.unwrap_or(inner)
}

/// The UAR pages of a VFIO BAR2 when the whole BAR is one mmapped area.
#[cfg(target_os = "linux")]
pub(crate) fn mapped_vfio_bar2(bar: &Arc<portverbs_vfio::VfioBar>) -> Option<Arc<MappedBar2>> {
    let base = bar.mapped_ptr(0, bar.len())?;
    // SAFETY: `base..base + len` is the BAR's live shared mapping, owned by `bar`, which the
    // value keeps; `VfioBar` itself only makes raw-pointer volatile accesses.
    unsafe { MappedBar2::new(bar.clone(), base) }.map(Arc::new)
}

#[cfg(test)]
mod tests;

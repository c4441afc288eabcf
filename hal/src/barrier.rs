//! Memory-ordering helpers for talking to devices, named after rdma-core's `udma_barrier.h`.
//!
//! | helper | use | x86-64 | AArch64 (here) |
//! |---|---|---|---|
//! | [`to_device`] | order writes to DMA memory (WQEs, doorbell records) before a doorbell or an ownership flip | compiler barrier (x86 stores are not reordered with stores, and UC MMIO stores are ordered after WB stores) | `dmb ish` via a release fence |
//! | [`from_device`] | order a read of an ownership bit before reads of the rest of the entry | compiler barrier (x86 loads are not reordered with loads) | `dmb ish` via an acquire fence |
//! | [`wc_flush`] | drain write-combining stores (BlueFlame) | `mfence` (orders WC stores as `sfence` does) | `dmb ish` via a sequentially consistent fence |
//!
//! These are written with `core::sync::atomic` fences because this crate forbids `unsafe`. On
//! AArch64 rdma-core uses the *outer-shareable* forms (`dmb oshst`/`dmb oshld`), which Rust's fences
//! do not emit; a backend that rings real device doorbells on AArch64 must issue those itself in
//! its `mmio` module. x86-64 is the architecture tested in CI.

use std::sync::atomic::{Ordering, compiler_fence, fence};

/// Makes every earlier store to DMA memory visible to the device before any later store
/// (doorbell, ownership bit) is.
#[inline(always)]
pub fn to_device() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::Release);
    }
}

/// Makes every later load from DMA memory happen after the earlier load (an ownership check).
#[inline(always)]
pub fn from_device() {
    if cfg!(target_arch = "x86_64") {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::Acquire);
    }
}

/// Drains write-combining buffers (after a BlueFlame copy).
#[inline(always)]
pub fn wc_flush() {
    fence(Ordering::SeqCst);
}

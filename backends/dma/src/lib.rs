//! # Portverbs DMA memory
//!
//! The memory a device reaches by DMA, seen from the host: the one place in the workspace where
//! DMA-visible bytes are read and written through raw pointers and atomics. The HAL defines the
//! safe contract ([`portverbs_hal::DmaMemory`]); this crate implements it and carries the
//! promise the safe trait cannot ([`HostMapped`]).
//!
//! * [`RawRegion`] — a base address and a length with bounds-checked raw copies and atomic
//!   loads, stores, compare-and-swap and fetch-and-add: the one implementation of DMA-region
//!   access, behind [`SoftDma`], the VFIO layer's regions and the emulated HCA's memory.
//! * [`SoftDma`] — zeroed, page-aligned heap memory or memory an application handed over, as
//!   the software device and the transport engine use it for rings and registered buffers.
//! * [`HostMapped`] — an `unsafe` marker: the region's host mapping may be accessed through raw
//!   pointers for as long as the region lives. Drivers that write rings without a bounds-checked
//!   trait call per access (mlx4) take such regions.
//!
//! ## What this crate must never do
//!
//! * make a Rust reference (`&[u8]`, `&mut T`) into a region (every access is a raw copy or an
//!   atomic; the device writes the same bytes concurrently);
//! * depend on another Portverbs crate than `hal`, or know a device's formats.
#![warn(missing_docs)]

mod raw;
mod soft;

use portverbs_hal::dma::DmaMemory;

pub use raw::RawRegion;
pub use soft::{DMA_ALIGN, SoftDma};

/// DMA memory whose host mapping may be read and written through raw pointers.
///
/// # Safety
/// For as long as the value lives, `host_addr()..host_addr() + len()` must be memory of this
/// process that is valid for reads and writes, never moves, is at least 8-byte aligned, and is
/// never covered by a Rust reference made elsewhere (other parties — the device, the region's
/// own [`DmaMemory`] methods — reach it only through raw pointers or atomics).
#[allow(unsafe_code)]
pub unsafe trait HostMapped: DmaMemory {}

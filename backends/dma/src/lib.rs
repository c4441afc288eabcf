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
//!   pointers for as long as the region lives. Rings ([`ring`]) are made of such regions.
//! * [`ring`] — the device rings of every backend: [`ring::Geometry`] (power-of-two entries,
//!   checked once when [`ring::Slots`] are made over a [`ring::Ring`]), per-entry access with no
//!   run-time bounds check at constant offsets ([`ring::Slot`]), and the ring's direction and
//!   the wrap-parity ownership rule as types ([`ring::Producer`], [`ring::Consumer`],
//!   [`ring::HostToDevice`], [`ring::DeviceToHost`]). Used by the mlx4 driver's queues and by
//!   both sides of the software device's queues; the backends encode and decode their entries
//!   in place through it.
//!
//! ## What this crate must never do
//!
//! * make a Rust reference (`&[u8]`, `&mut T`) into a region (every access is a raw copy or an
//!   atomic; the device writes the same bytes concurrently);
//! * depend on another Portverbs crate than `hal`, or know a device's formats (WQE, CQE and
//!   EQE layouts belong to the backends).
#![warn(missing_docs)]

mod raw;
pub mod ring;
mod soft;

use portverbs_hal::dma::DmaMemory;

pub use raw::RawRegion;
pub use soft::{DMA_ALIGN, SoftDma};

/// DMA memory whose host mapping may be read and written through raw pointers.
///
/// # Safety
/// For as long as the value lives, `host_addr()..host_addr() + len()` must be memory of this
/// process that is valid for reads and writes, never moves, and is never covered by a Rust
/// reference made elsewhere (other parties — the device, the region's own [`DmaMemory`]
/// methods — reach it only through raw pointers or atomics). Alignment is not promised: the
/// [`ring`] types check the addresses they need aligned.
#[allow(unsafe_code)]
pub unsafe trait HostMapped: DmaMemory {}

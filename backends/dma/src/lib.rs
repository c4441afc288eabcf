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
//!   [`ring::HostToDevice`], [`ring::DeviceToHost`]).
//! * [`queue`] — the one ring home: queue-level rings that pair the slots with their one
//!   counter and their one ownership rule — [`queue::WorkRing`] (host to device: owner bits by
//!   wrap parity, "not yet valid" initialisation) and [`queue::EventRing`] (device to host: the
//!   consumer counter, the owner-bit test given once per format, owner initialisation). Their
//!   users: the mlx4 driver's queues (SQ, RQ, SRQ, CQ, EQ), both sides of the software
//!   device's queues, and the emulated ConnectX-3 (`mlx4-model`), whose CQ and EQ writers and
//!   WQE reader take their arithmetic from [`ring::Geometry`] and its owner rule from here.
//!   The backends encode and decode their entries in place; no backend keeps ring masks or
//!   owner-bit tests of its own.
//!
//! ## What this crate must never do
//!
//! * make a Rust reference (`&[u8]`, `&mut T`) into a region (every access is a raw copy or an
//!   atomic; the device writes the same bytes concurrently);
//! * depend on another Portverbs crate than `hal`, or know a device's formats (WQE, CQE and
//!   EQE layouts belong to the backends).
#![warn(missing_docs)]

pub mod queue;
mod raw;
pub mod ring;
mod soft;

use portverbs_hal::dma::DmaMemory;

pub use raw::RawRegion;

/// The [`portverbs_hal::DmaMemory`] accessors of a region whose bytes a [`RawRegion`] field
/// reaches (`len`, `host_addr`, `read`, `write`, `fill`, `load_u64`, `store_u64`, `as_any`,
/// `into_any_arc`), for use inside the region's `impl DmaMemory` next to what differs (its
/// device address, how it gives host memory back):
///
/// ```text
/// impl DmaMemory for MyRegion {
///     portverbs_dma::raw_accessors!(raw);
///     fn device_addr(&self) -> u64 { self.iova }
/// }
/// ```
#[macro_export]
macro_rules! raw_accessors {
    ($field:ident) => {
        fn len(&self) -> usize {
            self.$field.len()
        }

        fn host_addr(&self) -> u64 {
            self.$field.base() as u64
        }

        #[inline]
        fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), $crate::__hal::DmaError> {
            self.$field.read(offset, dst)
        }

        #[inline]
        fn write(&self, offset: usize, src: &[u8]) -> Result<(), $crate::__hal::DmaError> {
            self.$field.write(offset, src)
        }

        fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), $crate::__hal::DmaError> {
            self.$field.fill(offset, len, byte)
        }

        fn load_u64(&self, offset: usize) -> Result<u64, $crate::__hal::DmaError> {
            self.$field.load_u64(offset)
        }

        fn store_u64(&self, offset: usize, value: u64) -> Result<(), $crate::__hal::DmaError> {
            self.$field.store_u64(offset, value)
        }

        fn as_any(&self) -> &dyn ::std::any::Any {
            self
        }

        fn into_any_arc(
            self: ::std::sync::Arc<Self>,
        ) -> ::std::sync::Arc<dyn ::std::any::Any + Send + Sync> {
            self
        }
    };
}

#[doc(hidden)]
pub use portverbs_hal::dma as __hal;
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

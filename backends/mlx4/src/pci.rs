//! The seam between the driver and the PCI function it drives.
//!
//! The driver reaches the HCA only through [`PciFunction`]: two mapped BARs (BAR0 = the HCR and
//! the reset registers, BAR2 = UAR doorbell pages followed by BlueFlame pages), DMA memory the
//! device can reach at a bus address (IOVA), config-space reads, interrupt routing (MSI-X
//! vector → the event queue's [`InterruptSink`](portverbs_hal::notify::InterruptSink)), and
//! optionally its doorbells as calls ([`UarDoorbells`], which the emulated HCA offers). Two
//! implementations exist: a VFIO-bound real function (Linux, [`crate::vfio`]) and the emulated
//! HCA (`portverbs-mlx4-model`), so the whole driver runs in every test.
//!
//! The seam is defined in `portverbs-mlx4-layout` (so that the emulated HCA implements it
//! without depending on the driver) and re-exported here under its old paths.

pub use portverbs_mlx4_layout::pci::{
    CONNECTX3, CONNECTX3_PRO, MELLANOX_VENDOR, PciError, PciFunction, UarDoorbells, is_mlx4_pf,
};

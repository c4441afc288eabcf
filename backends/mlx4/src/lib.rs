//! # Portverbs mlx4 backend — an mlx4-class HCA (ConnectX-3) driven from userspace
//!
//! This crate implements the HAL ([`portverbs_hal::Device`]) for an mlx4-style HCA reached
//! through its PCI BARs ([`PciFunction`]): the HCR firmware command interface in polling and
//! event mode ([`cmd`]), bring-up and teardown in Linux's order with ICM donated to the HCA
//! ([`Mlx4Device::open`]), EQs, CQs, QPs (RC, UC, UD) with a QP context per transition, the GSI
//! QP (QP1: the special QP CONF_SPECIAL_QP sets aside, whose sends are MLX-transport WQEs with a
//! header the driver builds), SRQs,
//! MPT/MTT memory registration with hardware-formed keys, memory windows, and the hot-path
//! queue objects with owner bits, stamping, spare WQEs, UAR doorbells and BlueFlame.
//!
//! [`layout`] is the hardware interface as data and [`pci`] the seam to the PCI function; both
//! live in `portverbs-mlx4-layout` (re-exported here under their old paths), which the emulated
//! HCA (`portverbs-mlx4-model`) shares without depending on this driver. A C test checks the
//! WQE/CQE layouts against rdma-core's `mlx4dv.h`.
//!
//! What this crate must never do: trust the device (every index, length and opcode read from a
//! CQE, EQE or outbox is checked; a bad one is a typed error), depend on `verbs-core`, or touch
//! memory except through the [`PciFunction`]'s BAR, doorbell and DMA objects. `unsafe` code is
//! denied everywhere but [`dma`] and [`regs`]: the driver's rings and doorbell records are the
//! workspace's ring types ([`portverbs_dma::ring`], raw access under [`HostMapped`]'s
//! promise), and [`dma`] adds only the raw writes that know the mlx4 WQE layout (inline
//! segments, stamps); [`regs`] holds the typed `volatile-register` blocks over a real
//! function's BAR mappings (HCR, reset, the UAR pages each queue rings through its doorbell
//! handle), with their caveat.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod alloc;
pub mod caps;
pub mod cmd;
mod cmd_wait;
mod config;
mod device;
pub mod dma;
mod doorbell;
pub mod icm;
pub use portverbs_mlx4_layout as layout;
mod mtt;
pub mod pci;
mod queues;
mod quirks;
pub mod regs;
mod uar;
#[cfg(target_os = "linux")]
pub mod vfio;

pub use cmd::CommandMode;
pub use config::Mlx4Config;
pub use device::{Mlx4Device, OpenError};
pub use dma::HostMapped;
pub use pci::{PciError, PciFunction};
/// What [`Mlx4Device::live`] returns.
pub use portverbs_hal::ObjectCounts;
pub use queues::{cq::Mlx4Cq, rq::Mlx4Rq, sq::Mlx4Sq, srq::Mlx4Srq};
pub use quirks::MLX4_QUIRKS;

//! # Portverbs software RDMA device
//!
//! A complete RDMA device in software, for tests and for machines without RDMA hardware. It
//! implements the HAL ([`portverbs_hal::Device`]) the way a hardware backend does: its queues are
//! rings in DMA memory in its own WQE/CQE/EQE formats ([`device::format`]), the host rings its own
//! doorbells, and a device-side engine consumes WQEs and produces CQEs and EQEs.
//!
//! Layers inside the crate:
//! * [`wire`] — IB transport headers and RoCEv2 frames (BTH and extension headers, ICRC), as
//!   checked views and representations;
//! * [`engine`] — the RC/UC/UD transport (requester, completer, responder), memory protection,
//!   timers; independent of any queue format, so the mlx4 model can reuse it;
//! * [`fabric`] — the in-process network of devices and ports, RoCEv2-style GID addressing,
//!   seeded faults, and the two ways of driving it (an engine thread on the real clock, or
//!   stepped on virtual time);
//! * [`device`] — the soft HCA: queue formats, doorbells, and the HAL command interface.
//!
//! What this crate must never do: depend on `verbs-core` or `cm-core` (backends sit *below* the
//! portable cores), or reach DMA memory except through [`dma`] (the `portverbs-dma` crate, where
//! the raw-pointer code lives; this crate has no `unsafe`). It may run a thread — it emulates hardware — but the stepped mode runs none.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod device;
pub use portverbs_dma as dma;
pub use portverbs_transport as engine;
pub mod fabric;
pub use portverbs_wire as wire;

pub use device::{ResourceCounts, SoftCq, SoftDevice, SoftRq, SoftSq, SoftSrq};
pub use dma::SoftDma;
pub use fabric::{
    DeviceConfig, Fabric, FabricConfig, FabricError, FabricStats, LinkFaults, Mode, PortConfig,
};

//! # Portverbs software RDMA device
//!
//! A complete RDMA device in software, for tests and for machines without RDMA hardware. It
//! implements the HAL ([`portverbs_hal::Device`]) the way a hardware backend does: its queues are
//! rings in DMA memory in its own WQE/CQE/EQE formats ([`device::format`]), the host rings its own
//! doorbells, and a device-side engine consumes WQEs and produces CQEs and EQEs.
//!
//! Where it sits (README.md, "Layout"): `portverbs-wire` (IB transport headers and RoCEv2 frames)
//! → `portverbs-transport` (the RC/UC/UD engine: requester, completer, responder, memory
//! protection, timers; sans-IO) → `portverbs-fabric` (the in-process network of nodes and
//! ports, seeded faults, the stepped and engine-thread modes) → this crate, the soft HCA:
//! queue formats ([`device::format`]), doorbells, and the HAL command interface. The soft
//! device is one [`portverbs_fabric::Node`] on a fabric, the emulated mlx4 HCA another; the
//! two crates share the layers below and do not depend on each other.
//!
//! A device joins a fabric with [`SoftDevice::attach`]. The fabric's public names
//! ([`Fabric`], [`FabricConfig`], [`Mode`], [`LinkFaults`] …) are re-exported here, so that
//! users of the soft device need no other crate.
//!
//! Progress: a device progresses as its fabric is driven, and says so in its
//! [`portverbs_hal::DeviceInfo::progress`] — auto on a free-running fabric (the fabric's one
//! engine thread runs the engine, and the agents attached through
//! [`portverbs_hal::Device::attach_agent`], such as the CM's), manual on a manual fabric
//! ([`Mode::Manual`]: a doorbell steps the fabric on the ringing thread, and
//! [`portverbs_hal::Device::dispatch`], which verbs-core calls from every poll and wait, steps
//! it, fires its timers and runs the agents on the caller's thread; the waits sleep on
//! [`portverbs_hal::Device::wait_source`], the input of the fabric's port). A stepped fabric's
//! devices report manual and dispatch nothing: the test's steps are their progress.
//!
//! What this crate must never do: depend on `verbs-core` or `cm-core` (backends sit *below* the
//! portable cores) or on another device crate (the mlx4 model); reach DMA memory except through
//! [`dma`] (the `portverbs-dma` crate, where the raw-pointer code lives; this crate has no
//! `unsafe`); run a thread of its own (the fabric's engine thread, if any, runs its engine).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod device;
pub use portverbs_dma as dma;
// The transport engine, under the name the device code uses.
use portverbs_transport as engine;

pub use device::{DeviceConfig, PortConfig, SoftCq, SoftDevice, SoftRq, SoftSq, SoftSrq};
pub use dma::SoftDma;
pub use portverbs_fabric::{
    Bottleneck, CaptureError, CaptureStats, EcnMarking, Fabric, FabricConfig, FabricError,
    FabricStats, LinkFaults, Mode,
};
pub use portverbs_hal::ObjectCounts;
pub use portverbs_transport::{CcConfig, CcStats, EngineStats};

//! # An emulated mlx4 HCA (ConnectX-3) behind the mlx4 PCI seam
//!
//! The model is a [`portverbs_mlx4_layout::PciFunction`] ([`ModelFunction`]) whose BARs and
//! DMA behave like the hardware's towards a driver (Linux's mlx4 drivers, rdma-core, iPXE):
//!
//! * **BAR0** — the HCR with the go/toggle/status protocol and event-mode completion EQEs, the
//!   reset register and semaphores, the catastrophic-error buffer; the firmware state machine
//!   (QUERY_FW → MAP_FA → RUN_FW → QUERY_DEV_CAP … → INIT_HCA), ICM mapped with MAP_ICM page
//!   lists, contexts written to and read back from ICM, MTTs resolved from ICM, the hardware's
//!   status codes for every refusal.
//! * **BAR2** — UAR pages (send doorbell, CQ arm, EQ doorbells) and BlueFlame pages.
//! * **DMA** — regions at bus addresses unlike their host addresses, behind the model's own
//!   IOMMU table; every device access goes through it.
//! * **Transport** — the shared engine (`portverbs-transport`), the model being one
//!   [`portverbs_fabric::Node`] on a [`portverbs_fabric::Fabric`]: an mlx4 model and soft
//!   devices exchange RC, UC and UD traffic and MADs between GSI QPs, stepped (virtual time,
//!   seeded faults) or free-running. The GSI special QP (CONF_SPECIAL_QP's base + 2) is QP 1 to
//!   the engine; its MLX WQEs' headers are checked and become the datagram's address. The
//!   model reads the driver's WQEs (owner bits, stamps, no producer index)
//!   and writes CQEs and EQEs in the mlx4 formats. It depends on the transport and the fabric,
//!   never on the soft device (the two only meet on a fabric).
//! * **Faults** — command timeout, a corrupt CQE, catastrophic error, surprise removal
//!   ([`Mlx4Model`]), and [`ModelCounts`] for leak checks.
//!
//! What this crate must never do: panic or index out of bounds on anything a driver writes
//! (registers, mailboxes, contexts, WQEs, doorbell records — bad input gets the hardware's
//! status code, a catastrophic QP/CQ error, or is ignored and counted); touch memory except
//! through its IOVA table; use `unsafe` (one exception: the driver's `HostMapped` promise for
//! the regions it hands out, in `iova`); redefine the hardware layouts (they are
//! `portverbs-mlx4-layout`'s, the same crate the driver uses); depend on the driver or on the
//! soft device (`portverbs-mlx4` and `portverbs-soft` are dev-dependencies only: the
//! integration tests drive the model with the driver and talk to soft peers); or know about
//! the driver's internals.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bar0;
mod bar2;
mod caps;
mod hw;
mod iova;
mod model;
mod shared;

pub use model::{Mlx4Model, ModelConfig, ModelCounts, ModelError, ModelFunction};

/// Bus address of the first DMA region the model hands out (regions never sit at their host
/// address).
pub const IOVA_BASE: u64 = iova::IOVA_BASE;

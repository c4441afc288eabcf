//! # Portverbs mlx4 layouts — the mlx4 (ConnectX-3) hardware interface as data
//!
//! This crate is what an mlx4 driver and an emulated mlx4 HCA must agree on, and nothing else:
//! register offsets ([`hcr`], [`uar`]), command opcodes and status codes ([`opcode`],
//! [`status`]), mailbox and context layouts ([`mailbox`], [`ctx`], [`av`], [`keys`]), WQE
//! segments, the special QPs' MLX headers (composed from `portverbs-wire`'s LRH/GRH/BTH/DETH),
//! CQEs and EQEs ([`wqe`], [`mlx`], [`cqe`], [`eqe`])
//! (as Linux's `drivers/net/ethernet/mellanox/mlx4/` — cited as `mlx4/<file>` — with
//! `include/linux/mlx4/`, `drivers/infiniband/hw/mlx4/` — cited as `hw/mlx4/<file>` — and
//! rdma-core's `providers/mlx4/` define them), and the PCI
//! seam ([`pci`]: the [`PciFunction`] trait a driver drives and an emulated or VFIO-bound
//! function implements, [`PciError`], the vendor/device IDs).
//!
//! Every layout is a `#[repr(C)]` struct of big-endian zerocopy fields, so it can be built in a
//! local buffer and copied into DMA memory, or read out of a local copy of device-written bytes,
//! without a Rust reference into memory the device may touch. Each struct carries compile-time
//! asserts of its size and field offsets, and its doc names the source it comes from; the WQE and
//! CQE layouts are also checked against rdma-core's `mlx4dv.h` by the driver's
//! `tests/mlx4dv_layout.rs`.
//!
//! Both the driver (`portverbs-mlx4`, which encodes contexts and WQEs and decodes
//! CQEs/EQEs/outboxes) and the emulated HCA (`portverbs-mlx4-model`, which does the reverse) use
//! these definitions, so the model depends on this crate and not on the driver.
//!
//! What this crate must never do: perform I/O or hold state (it is pure data and pure
//! functions: no MMIO, no DMA, no threads, no clocks); contain `unsafe` code; depend on the
//! driver, the model, `verbs-core` or a platform crate; or panic on its input — the decoders
//! treat every byte as hostile and return typed errors or `None`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod av;
pub mod cqe;
pub mod ctx;
pub mod eqe;
pub mod hcr;
pub mod keys;
pub mod mailbox;
pub mod mcg;
pub mod mlx;
pub mod opcode;
pub mod pci;
pub mod status;
pub mod uar;
pub mod wqe;

pub use pci::{PciError, PciFunction, UarDoorbells};

/// Asserts a struct's size and field offsets at compile time.
macro_rules! layout {
    ($ty:ty, $size:expr, { $($field:ident : $off:expr),* $(,)? }) => {
        const _: () = {
            assert!(::core::mem::size_of::<$ty>() == $size);
            $( assert!(::core::mem::offset_of!($ty, $field) == $off); )*
        };
    };
}
pub(crate) use layout;

/// Reads a zerocopy layout out of the front of `bytes` (a local copy), or `None` when too short.
pub fn read<T: zerocopy::FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(v, _)| v)
}

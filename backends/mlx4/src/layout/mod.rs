//! The mlx4 hardware interface as data: register offsets, command opcodes and status codes,
//! mailbox and context layouts, WQE segments, CQEs and EQEs (facts/mlx4-hardware.md).
//!
//! Every layout is a `#[repr(C)]` struct of big-endian zerocopy fields, so it can be built in a
//! local buffer and copied into DMA memory, or read out of a local copy of device-written bytes,
//! without a Rust reference into memory the device may touch. Each struct carries compile-time
//! asserts of its size and field offsets that cite the facts section they come from; the WQE and
//! CQE layouts are also checked against rdma-core's `mlx4dv.h` by `tests/mlx4dv_layout.rs`.
//!
//! Both the driver (which encodes contexts and WQEs and decodes CQEs/EQEs/outboxes) and the
//! emulated HCA (which does the reverse) use these definitions; the decoders treat their input as
//! hostile and never panic.

pub mod av;
pub mod cqe;
pub mod ctx;
pub mod eqe;
pub mod hcr;
pub mod keys;
pub mod mailbox;
pub mod opcode;
pub mod status;
pub mod uar;
pub mod wqe;

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

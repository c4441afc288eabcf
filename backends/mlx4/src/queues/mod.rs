//! The hot-path queue objects `verbs-core` drives: send queue (WQE encoding, stamping, doorbell
//! or BlueFlame), receive queue, SRQ (free list shared with the HCA), CQ (owner-bit polling,
//! set_ci record, arming) and EQ (owner-bit polling, EQ doorbell). They touch only their own
//! DMA memory, doorbell records and UAR registers: no lock, no allocation. Every ring is a
//! [`Slots`](portverbs_dma::ring::Slots) whose geometry the device code checked once when it
//! made the queue, so per-entry accesses at constant offsets have no run-time bounds check.

pub(crate) mod cq;
pub(crate) mod eq;
pub(crate) mod rq;
pub(crate) mod sq;
pub(crate) mod sq_mlx;
pub(crate) mod srq;

/// A queue buffer in DMA memory: `cnt` entries of `1 << shift` bytes from `base` (the
/// workspace's one ring geometry, [`portverbs_dma::ring::Geometry`]).
pub(crate) use portverbs_dma::ring::Geometry;

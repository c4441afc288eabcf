//! Portverbs software RDMA device (work in progress).
pub mod wire;

//! # Portverbs backend dispatch
//!
//! [`AnyDevice`] is one device type for every backend — the software device (in-process or
//! bound to a UDP port) and the mlx4 driver (over VFIO or the emulated ConnectX-3) — so that
//! an application chooses the backend at run time and never writes generic code; [`AnySq`],
//! [`AnyRq`], [`AnySrq`] and [`AnyCq`] are its hot-path queue objects, one enum per kind.
//!
//! This crate sits below verbs-core: verbs-core is generic over the HAL's `Device`, and the
//! facade instantiates it with `AnyDevice`, so a post goes verbs-core → this crate's
//! `#[inline]` match → the backend's queue, and never back up into the facade.
//!
//! What it must never do: decide anything. Every method is one `match` over the backends
//! that forwards the call unchanged; what a device does is the backend's, what is legal is
//! verbs-core's and the HAL's.

mod device;
mod queue;

pub use device::AnyDevice;
pub use queue::{AnyCq, AnyRq, AnySq, AnySrq};

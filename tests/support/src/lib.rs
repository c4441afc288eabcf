//! # Portverbs test support
//!
//! The set-up that the soft device's, the mlx4 model's and the fabric's tests share when they
//! drive a device through the HAL directly, without verbs-core: a soft-device peer with one
//! QP, CQ, event queue and registered buffer ([`HalPeer`]), the RESET → INIT → RTR → RTS
//! bring-up with the IBTA masks of each transport ([`to_rts`]), and draining a CQ ([`drain`]).
//!
//! For the platform crates' tests, which go through verbs-core with each OS's notification
//! layer: two soft devices with RC pairs ([`verbs_net`]). Other tests that go through
//! verbs-core use `tests/conformance`'s environment.
//!
//! What this crate must never do: be a dependency of anything but tests (it panics on every
//! failure, which is what a test wants and a library must not do).
#![warn(missing_docs)]
#![allow(clippy::missing_panics_doc)]

mod peer;
mod rts;
pub mod verbs_net;

pub use peer::{HalPeer, PEER_MR_LEN};
pub use rts::{RtsParams, to_rts};

use portverbs_hal::queue::CompletionQueue;
use portverbs_hal::wc::Cqe;

/// Polls `cq` until it is empty, then publishes the consumer index.
pub fn drain(cq: &mut dyn CompletionQueue) -> Vec<Cqe> {
    let mut v = Vec::new();
    while let Some(c) = cq.poll_one().expect("a CQE decodes") {
        v.push(c);
    }
    cq.publish_ci();
    v
}

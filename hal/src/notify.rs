//! How a device tells the host "look at this event queue": the interrupt contract.
//!
//! Each event queue is created with an [`InterruptSink`]. A hardware-emulating backend calls
//! [`InterruptSink::raise`] when it writes an EQE into an armed EQ; a VFIO backend instead binds
//! the EQ's MSI-X vector to the sink's eventfd in the kernel. Platform crates provide the sinks
//! (an eventfd on Linux, an event or completion port on Windows); [`NullSink`] is for callers that
//! poll.

use std::fmt::Debug;

/// Receives the interrupts of one event queue. Must be cheap and must not block: it may be called
/// from a device-emulation thread with internal locks held.
pub trait InterruptSink: Send + Sync + Debug {
    /// The device wrote at least one EQE while the EQ was armed.
    fn raise(&self);

    /// The Linux eventfd behind this sink, if any, so that a VFIO backend can route an MSI-X
    /// vector to it directly (`VFIO_DEVICE_SET_IRQS`).
    fn eventfd(&self) -> Option<i32> {
        None
    }
}

/// A sink that ignores interrupts; the application polls the event queue instead.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl InterruptSink for NullSink {
    fn raise(&self) {}
}
